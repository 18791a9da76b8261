//! Hostile files: a target that plants FIFOs, links to host files, a
//! `/dev/zero` perf map or a truncated library where tracer (root) reads
//! its files. Each test starts the `hostile` fixture, attaches the real
//! tracer with real eBPF mid-run, and checks that tracer neither hangs,
//! nor opens a file outside the target's root, nor dies, while the leaks
//! it traces stay exact.

use crate::harness;

use std::{
    ffi::CString,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use harness::{Fixture, Live, Record, Report, Traced, field, require_root};

/// hostile.c's block size.
const BLOCK_BYTES: i64 = 1000;

/// A fresh directory in the temporary directory.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracer-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn mkfifo(path: &Path) {
    let name = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-ended path.
    assert_eq!(
        unsafe { libc::mkfifo(name.as_ptr(), 0o600) },
        0,
        "mkfifo {}",
        path.display()
    );
}

/// Watches a FIFO for a reader: whoever opens it for reading (tracer,
/// here) is seen when the watcher's non-blocking open for writing
/// succeeds, which also lets that reader go on.
struct ReaderWatch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<bool>,
}

impl ReaderWatch {
    fn start(fifo: &Path) -> Self {
        let name = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut seen = false;
            while !thread_stop.load(Ordering::Relaxed) {
                // SAFETY: a NUL-ended path; the descriptor is closed at once.
                let fd = unsafe { libc::open(name.as_ptr(), libc::O_WRONLY | libc::O_NONBLOCK) };
                if fd >= 0 {
                    seen = true;
                    // SAFETY: our own descriptor.
                    unsafe { libc::close(fd) };
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        });
        Self { stop, thread }
    }

    /// Whether a reader ever opened the FIFO.
    fn reader_seen(self) -> bool {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// A copy of the fixture library at `path`.
fn copy_library(path: &Path) {
    std::fs::copy(harness::fixture("hostile_lib"), path).unwrap();
}

/// The count of `reason` in the report's `refused_files`.
/// The hostile fixture with a copy of the test library (in a scratch
/// directory named `name`) loaded: the directory, the library's path, the
/// fixture.
fn hostile_with_library(name: &str) -> (PathBuf, PathBuf, Fixture) {
    let dir = scratch(name);
    let library = dir.join("libt.so");
    copy_library(&library);
    let mut hostile = Fixture::start("hostile", &[]);
    assert_eq!(
        hostile.cmd(&format!("load {}", library.display())),
        "loaded"
    );
    (dir, library, hostile)
}

fn refused(report: &Report, reason: &str) -> i64 {
    report
        .int_if_present(&format!("/refused_files/{reason}"))
        .unwrap_or(0)
}

/// The blocks `hostile` leaked from `function`, as the report has them.
fn leaked_from(report: &Report, function: &str) -> Live {
    report.heap_live_with(function)
}

/// A `hostile` fixture whose root is a tmpfs that only its own mount
/// namespace sees (the host's /usr bound in; `pivot_root`, as a container
/// runtime does): a root of its own. `/proc/PID/root/...` reaches its
/// files from the host.
fn start_chrooted(name: &str, library: bool) -> (Fixture, PathBuf) {
    let root = scratch(name);
    let mut unshare = Command::new("unshare");
    unshare
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            r#"set -e; mount -t tmpfs none "$1"; cd "$1"
               mkdir usr tmp etc old proc; mount --rbind /usr usr
               ln -s usr/lib lib; ln -s usr/lib64 lib64; ln -s usr/bin bin
               cp "$2" hostile; [ "$3" = none ] || cp "$3" libt.so
               pivot_root . old; cd /; mount -t proc proc /proc
               umount -l /old; rmdir /old; umount /proc
               exec /hostile"#,
        )
        .arg("sh")
        .arg(&root)
        .arg(harness::fixture("hostile"))
        .arg(if library {
            harness::fixture("hostile_lib")
        } else {
            PathBuf::from("none")
        });
    let fixture = Fixture::start_command(unshare);
    assert!(
        !root.join("hostile").exists(),
        "the fixture's root is invisible from the host"
    );
    (fixture, root)
}

/// In the target's root, from the host.
fn in_root(pid: u32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{path}"))
}

/// The target still runs and its leaks are counted exactly after attach.
fn assert_traced_exactly(fixture: &mut Fixture, trace: harness::Trace) -> Traced {
    assert_eq!(field(&fixture.cmd("leak 7"), "count"), 7);
    let traced = trace.stop();
    assert_eq!(
        leaked_from(&traced.report, "hostile_leak"),
        Live::blocks(7, BLOCK_BYTES),
        "\n{}",
        traced.report
    );
    traced
}

#[test]
fn a_fifo_in_place_of_a_mapped_library_is_never_opened() {
    require_root();
    let (dir, library, mut hostile) = hostile_with_library("fifo-library");
    std::fs::remove_file(&library).unwrap();
    mkfifo(&library);
    let watch = ReaderWatch::start(&library);
    let trace = Record::pid(hostile.pid).attach();
    let Traced { report, .. } = assert_traced_exactly(&mut hostile, trace);
    assert!(!watch.reader_seen(), "tracer opened the FIFO");
    assert!(refused(&report, "not_regular") >= 1, "\n{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_absolute_link_swapped_in_after_mapping_never_reaches_the_host() {
    require_root();
    let host_dir = scratch("host-fifo");
    let host_fifo = host_dir.join("fifo.so");
    mkfifo(&host_fifo);
    let (mut hostile, root) = start_chrooted("swapped-link", true);
    assert_eq!(hostile.cmd("load /libt.so"), "loaded");
    // The target's /libt.so becomes an absolute link to a path that only
    // the host has: resolved in the target's root it names nothing.
    let planted = in_root(hostile.pid, "/libt.so");
    std::fs::remove_file(&planted).unwrap();
    std::os::unix::fs::symlink(&host_fifo, &planted).unwrap();
    let watch = ReaderWatch::start(&host_fifo);
    let trace = Record::pid(hostile.pid).attach();
    let Traced { report, .. } = assert_traced_exactly(&mut hostile, trace);
    assert!(!watch.reader_seen(), "tracer opened the host's FIFO");
    assert!(refused(&report, "symbolic_link") >= 1, "\n{report}");
    drop(hostile);
    let _ = std::fs::remove_dir_all(&host_dir);
    let _ = std::fs::remove_dir(&root);
}

/// jemalloc, which `hostile` runs as its allocator in the test below.
const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

/// The target's allocator library is replaced on disk after it was mapped
/// (a file of the same bytes renamed over its path, as a swap between
/// tracer's read and its attach would leave it): the probes must go in the
/// inode tracer read and the target runs, which no path names any more,
/// not in the file the path names now. Attached by the target's path, no
/// call the target makes is seen.
#[test]
fn a_library_replaced_after_mapping_is_probed_in_the_inode_it_runs() {
    require_root();
    assert!(
        Path::new(JEMALLOC).is_file(),
        "{JEMALLOC} (cargo xtask setup)"
    );
    let dir = scratch("replaced-allocator");
    let library = dir.join("libjemalloc.so.2");
    std::fs::copy(JEMALLOC, &library).unwrap();
    let mut hostile =
        Fixture::start_with_env("hostile", &[], &[("LD_PRELOAD", library.to_str().unwrap())]);
    let replacement = dir.join("replacement.so");
    std::fs::copy(JEMALLOC, &replacement).unwrap();
    std::fs::rename(&replacement, &library).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", hostile.pid)).unwrap();
    assert!(
        maps.contains(&format!("{} (deleted)", library.display())),
        "the target runs the replaced inode:\n{maps}"
    );
    let trace = Record::pid(hostile.pid).attach();
    assert_traced_exactly(&mut hostile, trace);
    drop(hostile);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `.gnu_debuglink` section naming `name` (its CRC is not checked
/// before the file is opened).
fn debuglink_section(name: &Path) -> Vec<u8> {
    let mut section = name.as_os_str().as_bytes().to_vec();
    section.push(0);
    while !section.len().is_multiple_of(4) {
        section.push(0);
    }
    section.extend([0u8; 4]);
    section
}

#[test]
fn a_debuglink_naming_a_host_path_is_never_opened() {
    require_root();
    let dir = scratch("debuglink");
    let fifo = dir.join("watchdog");
    mkfifo(&fifo);
    let section = dir.join("debuglink.bin");
    std::fs::write(&section, debuglink_section(&fifo)).unwrap();
    let added = dir.join("added.so");
    let library = dir.join("libt.so");
    // Added, then 4-byte aligned (its CRC is read as an aligned word).
    for args in [
        vec![
            "--add-section".to_owned(),
            format!(".gnu_debuglink={}", section.display()),
            harness::fixture("hostile_lib").display().to_string(),
            added.display().to_string(),
        ],
        vec![
            "--set-section-alignment".to_owned(),
            ".gnu_debuglink=4".to_owned(),
            added.display().to_string(),
            library.display().to_string(),
        ],
    ] {
        let status = Command::new("objcopy")
            .args(&args)
            .status()
            .expect("objcopy runs");
        assert!(status.success(), "objcopy {args:?}");
    }
    let mut hostile = Fixture::start("hostile", &[]);
    assert_eq!(
        hostile.cmd(&format!("load {}", library.display())),
        "loaded"
    );
    let watch = ReaderWatch::start(&fifo);
    let trace = Record::pid(hostile.pid).attach();
    assert_eq!(field(&hostile.cmd("lib_a 3"), "count"), 3);
    let Traced { report, .. } = assert_traced_exactly(&mut hostile, trace);
    assert!(!watch.reader_seen(), "tracer opened the debug link's path");
    assert_eq!(
        leaked_from(&report, "lib_leak_a"),
        Live::blocks(3, BLOCK_BYTES),
        "\n{report}"
    );
    assert!(refused(&report, "bad_name") >= 1, "\n{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_fifo_as_the_perf_map_is_never_opened() {
    require_root();
    let mut hostile = Fixture::start("hostile", &[]);
    let perf_map = PathBuf::from(format!("/tmp/perf-{}.map", hostile.pid));
    let _ = std::fs::remove_file(&perf_map);
    mkfifo(&perf_map);
    let watch = ReaderWatch::start(&perf_map);
    let trace = Record::pid(hostile.pid).attach();
    let Traced { report, .. } = assert_traced_exactly(&mut hostile, trace);
    let _ = std::fs::remove_file(&perf_map);
    assert!(!watch.reader_seen(), "tracer opened the FIFO perf map");
    assert!(refused(&report, "not_regular") >= 1, "\n{report}");
}

/// Peak resident memory of a process, from /proc/PID/status (VmHWM).
fn peak_rss_bytes(pid: u32) -> i64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .expect("VmHWM");
    let kib: i64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[test]
fn a_perf_map_linked_to_dev_zero_keeps_tracer_small() {
    require_root();
    let mut hostile = Fixture::start("hostile", &[]);
    let perf_map = PathBuf::from(format!("/tmp/perf-{}.map", hostile.pid));
    let _ = std::fs::remove_file(&perf_map);
    std::os::unix::fs::symlink("/dev/zero", &perf_map).unwrap();
    let recording = harness::json_path("dev-zero").with_extension("trace");
    let mut trace = Record::pid(hostile.pid)
        .args([std::ffi::OsStr::new("-o"), recording.as_os_str()])
        .attach();
    // Two snapshots: the perf map was looked at after attach at least
    // twice (it is refreshed with every snapshot).
    trace.wait_next_snapshot(&recording);
    trace.wait_next_snapshot(&recording);
    let peak = peak_rss_bytes(trace.tracer.pid());
    let Traced { report, .. } = assert_traced_exactly(&mut hostile, trace);
    let _ = std::fs::remove_file(&perf_map);
    let _ = std::fs::remove_file(&recording);
    assert!(peak < 512 << 20, "tracer peaked at {peak} bytes");
    assert!(refused(&report, "symbolic_link") >= 1, "\n{report}");
}

#[test]
fn a_fifo_as_the_targets_loader_cache_is_never_opened() {
    require_root();
    let (mut hostile, root) = start_chrooted("fifo-ld-cache", false);
    // Planted once the target runs: its own loader read no cache at start.
    let cache = in_root(hostile.pid, "/etc/ld.so.cache");
    mkfifo(&cache);
    let watch = ReaderWatch::start(&cache);
    let trace = Record::pid(hostile.pid).attach();
    let Traced { report, .. } = assert_traced_exactly(&mut hostile, trace);
    assert!(
        !watch.reader_seen(),
        "tracer (or a program it ran) opened the FIFO"
    );
    assert!(refused(&report, "not_regular") >= 1, "\n{report}");
    drop(hostile);
    let _ = std::fs::remove_dir(&root);
}

#[test]
fn a_library_truncated_while_traced_does_not_kill_tracer() {
    require_root();
    let (dir, library, mut hostile) = hostile_with_library("truncated");
    let recording = harness::json_path("truncated").with_extension("trace");
    // Stacks copied and unwound in tracer from the library's .eh_frame,
    // which tracer maps for as long as the library is mapped.
    let mut trace = Record::pid(hostile.pid)
        .args([std::ffi::OsStr::new("-o"), recording.as_os_str()])
        .args(["--unwind", "copy"])
        .attach();
    // A stack in the library, unwound while tracing: tracer's map of the
    // file is in use.
    assert_eq!(field(&hostile.cmd("lib_a 4"), "count"), 4);
    trace.wait_next_snapshot(&recording);
    trace.wait_next_snapshot(&recording);
    // Another stack in it, then the file cut to nothing: unwinding it
    // reads pages of the map that no longer have a file behind them.
    let cut = format!("lib_b_cut 5 {}", library.display());
    assert_eq!(field(&hostile.cmd(&cut), "count"), 5);
    trace.wait_next_snapshot(&recording);
    trace.wait_next_snapshot(&recording);
    let Traced { report, .. } = assert_traced_exactly(&mut hostile, trace);
    let _ = std::fs::remove_file(&recording);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        leaked_from(&report, "lib_leak_a"),
        Live::blocks(4, BLOCK_BYTES),
        "\n{report}"
    );
    assert_eq!(
        report.total("heap"),
        Live::blocks(7 + 4 + 5, BLOCK_BYTES),
        "\n{report}"
    );
    assert!(refused(&report, "truncated_while_read") >= 1, "\n{report}");
}

#[test]
fn a_fifo_opened_as_a_library_holds_no_dlopen_and_ctrl_c_ends_tracer_within_1_s() {
    require_root();
    let dir = scratch("fifo-at-open");
    let fifo = dir.join("x.so");
    mkfifo(&fifo);
    let library = dir.join("libt.so");
    copy_library(&library);
    let mut hostile = Fixture::start("hostile", &[]);
    let trace = Record::pid(hostile.pid).attach();
    // The loader's openat of a FIFO named like a library, then a dlopen:
    // the at-open thread looks at the FIFO first, the gate holds the
    // dlopen until it has looked at both (or the bound).
    assert_eq!(hostile.cmd(&format!("open {}", fifo.display())), "opened");
    let started = Instant::now();
    assert_eq!(
        hostile.cmd(&format!("load {}", library.display())),
        "loaded"
    );
    let dlopen = started.elapsed();
    assert_eq!(field(&hostile.cmd("leak 7"), "count"), 7);
    let report = trace.interrupt_within(Duration::from_secs(1));
    harness::assert_took_under("the dlopen", dlopen, Duration::from_secs(5), &report);
    assert_eq!(
        leaked_from(&report, "hostile_leak"),
        Live::blocks(7, BLOCK_BYTES),
        "\n{report}"
    );
    assert!(refused(&report, "not_regular") >= 1, "\n{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
