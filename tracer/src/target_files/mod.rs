//! The one way tracer opens a file a target names: a file it maps, its perf
//! map, its debug files, its loader cache, the libraries it could load.
//!
//! tracer runs as root and the target controls these names: a FIFO named
//! `x.so` would block the opening thread forever, an absolute symbolic
//! link inside a container's root would make root open a host file, and a
//! `/dev/zero` perf map would never end. So:
//!
//! - A mapped object is opened through `/proc/PID/map_files/START-END`: the
//!   inode actually mapped, whatever its path names now (`open_mapped`).
//! - Every other path is opened with `openat2(RESOLVE_IN_ROOT |
//!   RESOLVE_NO_MAGICLINKS)` relative to the target's `/proc/PID/root`,
//!   with `O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC`: `..` and absolute links
//!   stay inside the target's root, and no open waits (`open_in_root`).
//! - Either way the file is kept only when `fstat` says it is a regular
//!   file; anything else is refused, and each refusal is counted by reason
//!   (`refused`), shown in the report's warnings.
//! - Reads are bounded (`read_bounded`); long-lived maps of target files
//!   are guarded against a truncation (`sigbus`).
use std::{
    collections::BTreeMap,
    ffi::CString,
    fs::File,
    io::Read as _,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use crate::procfs::Mapping;

pub mod ld_cache;
pub mod sigbus;

/// Why a file the target names was not opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A FIFO, socket, device or directory where a regular file belongs.
    NotRegular,
    /// A symbolic link (or a magic link) where the file itself belongs.
    Link,
    /// A name with `/` or `..` where a plain file name belongs, or a build
    /// id that is not hex.
    BadName,
    /// Larger than the cap stated for what it is.
    TooLarge,
}

impl Refusal {
    const ALL: [Refusal; 4] = [
        Refusal::NotRegular,
        Refusal::Link,
        Refusal::BadName,
        Refusal::TooLarge,
    ];

    /// A short name, for counters (`refused_files`).
    pub fn name(self) -> &'static str {
        match self {
            Refusal::NotRegular => "not_regular",
            Refusal::Link => "symbolic_link",
            Refusal::BadName => "bad_name",
            Refusal::TooLarge => "too_large",
        }
    }
}

/// Refusals so far, by `Refusal as usize`: files are opened from several
/// threads (collect loop, at-open thread, symbolizer), counted once here.
static REFUSED: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// Counts one refusal.
pub fn refuse(reason: Refusal) {
    REFUSED[reason as usize].fetch_add(1, Ordering::Relaxed);
}

/// The refusals so far that are not zero, by name (with the reads a
/// truncated file cut short: `truncated_while_read`).
pub fn refused() -> BTreeMap<String, u64> {
    Refusal::ALL
        .iter()
        .map(|&reason| {
            (
                reason.name().to_owned(),
                REFUSED[reason as usize].load(Ordering::Relaxed),
            )
        })
        .chain([("truncated_while_read".to_owned(), sigbus::faults())])
        .filter(|&(_, count)| count > 0)
        .collect()
}

/// Why an open did not give a file: the file was refused (counted), or
/// it is absent or unreadable (not counted: debug files are looked for in
/// many places, and processes come and go).
#[derive(Debug)]
pub enum OpenError {
    Refused(Refusal),
    Io(std::io::Error),
}

impl From<std::io::Error> for OpenError {
    fn from(error: std::io::Error) -> Self {
        OpenError::Io(error)
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Refused(reason) => write!(f, "refused ({})", reason.name()),
            OpenError::Io(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for OpenError {}

fn refused_with(reason: Refusal) -> OpenError {
    refuse(reason);
    OpenError::Refused(reason)
}

/// Whose root a path is resolved in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Root {
    /// A target's (`/proc/PID/root`).
    Target(u32),
    /// tracer's own (`--debug-dir`, a recording symbolized later).
    Host,
}

/// Opens `path` (as the target `pid` sees it) inside the target's root:
/// a regular file, never waiting, never leaving the root; a link as the
/// last component is refused.
pub fn open_in_root(pid: u32, path: &Path) -> Result<File, OpenError> {
    open_in(Root::Target(pid), path, false)
}

/// Opens `path` inside `root`, its links (the last component's too)
/// resolved inside that root: for debug files, which distributions
/// install as links (`.build-id/ab/cdef.debug`).
pub fn open_following_links(root: Root, path: &Path) -> Result<File, OpenError> {
    open_in(root, path, true)
}

fn open_in(root: Root, path: &Path, follow_last: bool) -> Result<File, OpenError> {
    let root = open_root(root)?;
    // O_PATH first: nothing is opened for reading (a FIFO or a device
    // never sees tracer) until fstat says it is a regular file.
    let no_follow = if follow_last { 0 } else { libc::O_NOFOLLOW };
    let found =
        openat2(&root, path, libc::O_PATH | no_follow | libc::O_CLOEXEC).map_err(|error| {
            match error.raw_os_error() {
                // RESOLVE_NO_MAGICLINKS on a /proc link.
                Some(libc::ELOOP) => refused_with(Refusal::Link),
                _ => OpenError::Io(error),
            }
        })?;
    check_regular(&File::from(found.try_clone()?).metadata()?)?;
    reopen(&format!("/proc/self/fd/{}", found.as_raw_fd()))
}

/// Opens the file `mapping` of `pid` maps: the inode mapped, through
/// `/proc/PID/map_files` (root only; a path replaced since the mapping
/// is not followed), or by its path inside the target's root when
/// `map_files` cannot be read (a mapping gone since).
pub fn open_mapped(pid: u32, mapping: &Mapping) -> Result<File, OpenError> {
    open_mapped_at(pid, mapping.start..mapping.end, &mapping.path)
}

/// Opens the file mapped at exactly `range` in `pid`, which the target
/// names `path` (see `open_mapped`).
pub fn open_mapped_at(
    pid: u32,
    range: std::ops::Range<u64>,
    path: &Path,
) -> Result<File, OpenError> {
    let entry = format!("/proc/{pid}/map_files/{:x}-{:x}", range.start, range.end);
    // stat follows the entry to the inode mapped: checked before it is
    // opened (a mapped device is never opened by tracer).
    match std::fs::metadata(&entry) {
        Ok(metadata) => {
            check_regular(&metadata)?;
            reopen(&entry)
        }
        Err(_) => open_in_root(pid, path),
    }
}

/// Opens the mapping among `maps` of `pid` that maps `path`, or `path`
/// inside the target's root when none does.
pub fn open_named(pid: u32, path: &Path, maps: &[Mapping]) -> Result<File, OpenError> {
    match maps.iter().find(|mapping| mapping.path == path) {
        Some(mapping) => open_mapped(pid, mapping),
        None => open_in_root(pid, path),
    }
}

/// The path inside the target's root that `path` leads to, its symbolic
/// links resolved inside that root (an absolute link names a path of the
/// target, not of the host). Nothing is opened for reading.
pub fn resolve_in_root(pid: u32, path: &Path) -> Option<PathBuf> {
    let root = open_root(Root::Target(pid)).ok()?;
    let fd = openat2(&root, path, libc::O_PATH | libc::O_CLOEXEC).ok()?;
    let found = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    let root_path = std::fs::read_link(format!("/proc/{pid}/root")).ok()?;
    let inside = found.strip_prefix(&root_path).ok()?;
    Some(Path::new("/").join(inside))
}

/// The names in the directory `dir` of `pid` (inside its root; a FIFO or
/// a link where the directory belongs lists nothing).
pub fn list_dir(pid: u32, dir: &Path) -> Vec<std::ffi::OsString> {
    let Ok(root) = open_root(Root::Target(pid)) else {
        return Vec::new();
    };
    let Ok(fd) = openat2(
        &root,
        dir,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK | libc::O_CLOEXEC,
    ) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| entry.file_name())
        .take(MAX_DIR_ENTRIES)
        .collect()
}

/// The most names read from one directory of a target.
pub const MAX_DIR_ENTRIES: usize = 65_536;

/// A file name from the target (a `.gnu_debuglink` name) that may be
/// joined to a directory: no `/`, not `.` or `..`, not empty, no NUL.
pub fn plain_file_name(name: &str) -> bool {
    let plain = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0');
    if !plain {
        refuse(Refusal::BadName);
    }
    plain
}

/// Reads at most `cap` bytes of `file` from its current position.
pub fn read_bounded(file: &mut File, cap: u64) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::new();
    file.take(cap).read_to_end(&mut data)?;
    Ok(data)
}

/// Opens `path` inside the target's root and reads it whole, if it is
/// at most `cap` bytes (refused as too large otherwise).
pub fn read_in_root(pid: u32, path: &Path, cap: u64) -> Result<Vec<u8>, OpenError> {
    let mut file = open_in_root(pid, path)?;
    if file.metadata()?.len() > cap {
        return Err(refused_with(Refusal::TooLarge));
    }
    Ok(read_bounded(&mut file, cap)?)
}

/// Refuses what is not a regular file.
fn check_regular(metadata: &std::fs::Metadata) -> Result<(), OpenError> {
    let file_type = metadata.file_type();
    if file_type.is_file() {
        Ok(())
    } else if file_type.is_symlink() {
        Err(refused_with(Refusal::Link))
    } else {
        Err(refused_with(Refusal::NotRegular))
    }
}

/// Opens for reading a /proc link to a file already checked regular.
fn reopen(link: &str) -> Result<File, OpenError> {
    let link = CString::new(link).expect("no NUL in a /proc path");
    // SAFETY: a NUL-ended path; the descriptor returned is owned below.
    let fd = unsafe {
        libc::open(
            link.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    // The same inode as checked, unless it was replaced in between.
    check_regular(&file.metadata()?)?;
    Ok(file)
}

/// A root directory, held open for the `openat2` that follows.
fn open_root(root: Root) -> std::io::Result<OwnedFd> {
    let root = match root {
        Root::Target(pid) => format!("/proc/{pid}/root"),
        Root::Host => "/".to_owned(),
    };
    let root = CString::new(root).expect("no NUL in a root");
    // SAFETY: a NUL-ended path; the descriptor returned is owned below.
    let fd = unsafe {
        libc::open(
            root.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat2(root, path, flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`.
fn openat2(root: &OwnedFd, path: &Path, flags: i32) -> std::io::Result<OwnedFd> {
    let relative = path.strip_prefix("/").unwrap_or(path);
    let relative = if relative.as_os_str().is_empty() {
        Path::new(".")
    } else {
        relative
    };
    let name = CString::new(relative.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain integers.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: a valid directory descriptor, a NUL-ended path and an
    // open_how of the size given; the descriptor returned is owned below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            name.as_ptr(),
            &raw const how,
            size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Raises tracer's own limit of open files to its hard limit: it keeps a
/// descriptor per traced object (`symbolize`), and a target that maps
/// many must not make `/proc` reads fail (a live target would look gone).
pub fn raise_open_file_limit() {
    // SAFETY: rlimit is plain integers, filled by the kernel.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid rlimit to fill, then to set.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[cfg(test)]
mod tests;
