use std::{ffi::CString, path::Path};

use super::*;

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("tracer-target-files-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn mkfifo(path: &Path) {
    let name = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-ended path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
}

/// A FIFO is refused at once (no writer: a plain open would wait forever).
#[test]
fn a_fifo_is_refused_without_waiting() {
    let dir = scratch("fifo");
    let fifo = dir.join("x.so");
    mkfifo(&fifo);
    let before = REFUSED[Refusal::NotRegular as usize].load(Ordering::Relaxed);
    let opened = open_in_root(std::process::id(), &fifo);
    assert!(
        matches!(opened, Err(OpenError::Refused(Refusal::NotRegular))),
        "{opened:?}"
    );
    assert!(REFUSED[Refusal::NotRegular as usize].load(Ordering::Relaxed) > before);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A link as the last component is refused; a regular file opens.
#[test]
fn a_link_is_refused_and_a_regular_file_opens() {
    let dir = scratch("link");
    let file = dir.join("lib.so");
    std::fs::write(&file, b"data").unwrap();
    let link = dir.join("link.so");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let pid = std::process::id();
    assert!(open_in_root(pid, &file).is_ok());
    assert!(matches!(
        open_in_root(pid, &link),
        Err(OpenError::Refused(Refusal::Link))
    ));
    assert!(matches!(
        open_in_root(pid, Path::new("/dev/zero")),
        Err(OpenError::Refused(Refusal::NotRegular))
    ));
    assert_eq!(
        resolve_in_root(pid, &link),
        Some(PathBuf::from("/dev/zero"))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads stop at their cap, and a file over it is refused whole.
#[test]
fn reads_are_capped() {
    let dir = scratch("cap");
    let file = dir.join("big");
    std::fs::write(&file, vec![7u8; 4096]).unwrap();
    let pid = std::process::id();
    assert!(matches!(
        read_in_root(pid, &file, 100),
        Err(OpenError::Refused(Refusal::TooLarge))
    ));
    assert_eq!(read_in_root(pid, &file, 4096).unwrap().len(), 4096);
    let mut zero = File::open("/dev/zero").unwrap();
    assert_eq!(read_bounded(&mut zero, 1000).unwrap().len(), 1000);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn names_with_a_slash_or_dots_are_not_plain() {
    assert!(plain_file_name("libc.so.6.debug"));
    for name in ["", ".", "..", "/dev/watchdog", "../../etc/shadow", "a/b"] {
        assert!(!plain_file_name(name), "{name}");
    }
}

/// A page of a mapped file cut off by a truncation reads as zeros.
#[test]
fn a_truncated_map_reads_zeros() {
    sigbus::install();
    let dir = scratch("truncated");
    let path = dir.join("lib.so");
    std::fs::write(&path, vec![1u8; 3 * 4096]).unwrap();
    let file = File::open(&path).unwrap();
    // SAFETY: the test truncates the file on purpose: the guard is tested.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    assert_eq!(map[4096 * 2], 1);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    let before = sigbus::faults();
    assert_eq!(map[4096 * 2 + 1], 0);
    assert!(sigbus::faults() > before);
    drop(map);
    let _ = std::fs::remove_dir_all(&dir);
}
