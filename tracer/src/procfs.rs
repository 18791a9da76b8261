//! What /proc tells about a target: its mapped files, its command line and
//! whether it is still alive. Shared by attach (where to put probes) and
//! symbolize (which file and offset an address belongs to).
mod limits;

pub use limits::memory_limit;
use std::{fs, path::PathBuf};

use anyhow::{Context as _, Result};

pub use crate::model::MemoryStatus;

/// One line of /proc/PID/maps that maps a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub executable: bool,
    /// The path as the target sees it (inside its mount namespace).
    pub path: PathBuf,
}

impl Mapping {
    pub fn contains(&self, address: u64) -> bool {
        (self.start..self.end).contains(&address)
    }

    /// The offset in the file of `address`, which must be inside.
    pub fn file_offset_of(&self, address: u64) -> u64 {
        address - self.start + self.file_offset
    }
}

/// Parses /proc/PID/maps, keeping file-backed mappings only.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_maps_line).collect()
}

fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let permissions = fields.next()?;
    let offset = fields.next()?;
    let _device = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next()?.trim_start();
    if inode == "0" || !path.starts_with('/') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        executable: permissions.as_bytes().get(2) == Some(&b'x'),
        path: PathBuf::from(path.strip_suffix(" (deleted)").unwrap_or(path)),
    })
}

/// The address ranges of every executable mapping of a live process, file
/// backed or not (JIT code, the vDSO); empty once it is gone.
pub fn executable_ranges(pid: u32) -> Vec<(u64, u64)> {
    let text = read_confirmed(pid, || fs::read_to_string(format!("/proc/{pid}/maps")).ok())
        .unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (range, rest) = line.split_once(' ')?;
            if rest.as_bytes().get(2) != Some(&b'x') {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
            ))
        })
        .collect()
}

/// The file-backed mappings of a live process.
pub fn read_maps(pid: u32) -> Result<Vec<Mapping>> {
    let path = format!("/proc/{pid}/maps");
    let text = fs::read_to_string(&path).with_context(|| format!("could not read {path}"))?;
    let Some(text) = confirmed(pid, text) else {
        anyhow::bail!("PID {pid} exited: {path} is not its own any more");
    };
    Ok(parse_maps(&text))
}

/// The command line, arguments joined by spaces ("[comm]" for a kernel
/// thread).
pub fn command_line(pid: u32) -> String {
    let arguments = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let joined = arguments
        .split(|byte| *byte == 0)
        .filter(|argument| !argument.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ");
    if joined.is_empty() {
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        format!("[{}]", comm.trim())
    } else {
        joined
    }
}

/// This machine's host name, for recordings ("unknown" if unreadable).
pub fn host_name() -> String {
    kernel_setting("hostname")
}

/// The running kernel's release and build, e.g. "6.18.0 #1 SMP ...".
pub fn kernel_description() -> String {
    format!(
        "{} {}",
        kernel_setting("osrelease"),
        kernel_setting("version")
    )
}

fn kernel_setting(name: &str) -> String {
    fs::read_to_string(format!("/proc/sys/kernel/{name}"))
        .map_or_else(|_| "unknown".to_owned(), |text| text.trim().to_owned())
}

/// Process state letter from /proc/PID/stat ('R', 'S', 'Z', ...), or None
/// when the process is gone.
pub fn state(pid: u32) -> Option<char> {
    let stat = read_confirmed(pid, || fs::read_to_string(format!("/proc/{pid}/stat")).ok())?;
    stat_state(&stat)
}

/// The state letter of a /proc/PID/stat line.
pub fn stat_state(stat: &str) -> Option<char> {
    // The command name is in parentheses and may contain spaces.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.trim_start().chars().next()
}

/// CPU time the process has used, user and system (utime + stime from
/// /proc/PID/stat, its exited threads included), in ns; None when it is
/// gone. The kernel counts it in clock ticks (10 ms at the usual 100 Hz).
pub fn cpu_time_ns(pid: u32) -> Option<u64> {
    let stat = read_confirmed(pid, || fs::read_to_string(format!("/proc/{pid}/stat")).ok())?;
    // SAFETY: sysconf has no preconditions.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    stat_cpu_time_ns(&stat, u64::try_from(ticks_per_s).ok()?)
}

/// utime + stime of a /proc/PID/stat line, in ns, at `ticks_per_s`.
pub fn stat_cpu_time_ns(stat: &str, ticks_per_s: u64) -> Option<u64> {
    // After the command name: state is field 3, utime 14 and stime 15.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks_per_s = Some(ticks_per_s).filter(|&ticks| ticks > 0)?;
    Some((utime + stime) * (1_000_000_000 / ticks_per_s))
}

/// [`cpu_time_ns`] in seconds.
pub fn cpu_time_s(pid: u32) -> Option<f64> {
    cpu_time_ns(pid).map(|ns| ns as f64 / 1e9)
}

/// Resident set size (VmRSS) in bytes, None when the process is gone or
/// has no memory (a zombie, a kernel thread).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    memory_status(pid).map(|status| status.rss_bytes)
}

/// VmRSS and its parts from /proc/PID/status, None when the process is
/// gone or has no memory.
pub fn memory_status(pid: u32) -> Option<MemoryStatus> {
    let status = read_confirmed(pid, || {
        fs::read_to_string(format!("/proc/{pid}/status")).ok()
    })?;
    status_memory(&status)
}

/// The value of a `Name:   123 kB` line of a /proc text (status, meminfo),
/// in KiB.
pub(crate) fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

/// VmRSS and its parts in the text of /proc/PID/status.
pub fn status_memory(status: &str) -> Option<MemoryStatus> {
    let bytes = |name: &str| kib_field(status, name).map(|kib| kib * 1024);
    Some(MemoryStatus {
        rss_bytes: bytes("VmRSS")?,
        rss_anon_bytes: bytes("RssAnon").unwrap_or(0),
        rss_file_bytes: bytes("RssFile").unwrap_or(0),
        rss_shmem_bytes: bytes("RssShmem").unwrap_or(0),
    })
}

/// The end of the `[heap]` mapping: the program break, page-aligned. None
/// before the first brk growth or when the process is gone.
pub fn program_break(pid: u32) -> Option<u64> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let heap = maps.lines().find(|line| line.ends_with("[heap]"))?;
    let end = heap.split_whitespace().next()?.split_once('-')?.1;
    u64::from_str_radix(end, 16).ok()
}

/// The PID `pid` has in its own (innermost) PID namespace, from the
/// `NSpid:` line of /proc/PID/status: what the process itself sees.
pub fn namespace_pid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_namespace_pid(&status)
}

/// The innermost PID of the `NSpid:` line of /proc/PID/status text.
pub fn status_namespace_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The process (thread group) a task belongs to, from /proc/TID/status.
pub fn tgid(task: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{task}/status")).ok()?;
    status_tgid(&status)
}

/// The `Tgid:` of /proc/TID/status text.
pub fn status_tgid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

/// The processes tracer follows, each by a pidfd of its own and its start
/// time: what is read of /proc/PID for one of them that has exited is
/// dropped unless the PID still names it (a zombie), since it may name
/// another process by then (read, then checked: the process the check
/// finds was there for the read too). Filled by [`Identity::follow`].
static FOLLOWED: std::sync::Mutex<Vec<(u32, std::sync::Weak<Followed>)>> =
    std::sync::Mutex::new(Vec::new());

struct Followed {
    pidfd: std::os::fd::OwnedFd,
    /// Its start time (/proc/PID/stat field 22, clock ticks after boot).
    start_ticks: Option<u64>,
}

/// A followed process's pidfd, for as long as its holder keeps it; its
/// PID's reads are checked against it (see `FOLLOWED`).
pub struct Identity {
    pid: u32,
    followed: Option<std::sync::Arc<Followed>>,
}

impl Identity {
    /// Follows the process that is `pid` now.
    pub fn follow(pid: u32) -> Identity {
        let followed = pidfd(pid).map(|pidfd| {
            std::sync::Arc::new(Followed {
                pidfd,
                start_ticks: start_ticks(pid),
            })
        });
        if let Some(followed) = &followed {
            let mut all = FOLLOWED.lock().unwrap_or_else(|poison| poison.into_inner());
            all.retain(|(known, weak)| *known != pid && weak.strong_count() > 0);
            all.push((pid, std::sync::Arc::downgrade(followed)));
        }
        Identity { pid, followed }
    }

    /// Whether the process has exited (a zombie included), even where its
    /// PID names another process now; None without a pidfd.
    pub fn exited(&self) -> Option<bool> {
        self.followed
            .as_deref()
            .map(|followed| pidfd_exited(&followed.pidfd))
    }
}

impl Drop for Identity {
    fn drop(&mut self) {
        if let Some(followed) = self.followed.take() {
            let mut all = FOLLOWED.lock().unwrap_or_else(|poison| poison.into_inner());
            all.retain(|(known, weak)| {
                !(*known == self.pid
                    && std::ptr::eq(weak.as_ptr(), std::sync::Arc::as_ptr(&followed)))
            });
        }
    }
}

/// What `read` read of process `pid` (its /proc files, its memory), or
/// None when `pid` is a followed process that exited and whose PID names
/// another process now: the read may have been that one's. Checked after
/// the read: a PID is free for reuse only once its process is reaped, so
/// a process the check still finds was there for the whole read.
pub fn read_confirmed<T>(pid: u32, read: impl FnOnce() -> Option<T>) -> Option<T> {
    let value = read()?;
    confirmed(pid, value)
}

/// `value`, just read of process `pid`, unless `pid` no longer names the
/// followed process (see [`read_confirmed`]).
pub fn confirmed<T>(pid: u32, value: T) -> Option<T> {
    (!followed_and_gone(pid)).then_some(value)
}

/// Whether `pid` is a followed process that has exited and whose PID no
/// longer names it: what was just read of /proc/PID is another process's.
fn followed_and_gone(pid: u32) -> bool {
    let followed = {
        let all = FOLLOWED.lock().unwrap_or_else(|poison| poison.into_inner());
        all.iter()
            .find(|(known, _)| *known == pid)
            .and_then(|(_, weak)| weak.upgrade())
    };
    followed.is_some_and(|followed| {
        pidfd_exited(&followed.pidfd) && start_ticks(pid) != followed.start_ticks
    })
}

/// When the process `pid` started (/proc/PID/stat field 22), in clock
/// ticks after boot.
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_start_ticks(&stat)
}

/// The start time (field 22) of a /proc/PID/stat line, in clock ticks.
pub fn stat_start_ticks(stat: &str) -> Option<u64> {
    // After the command name: state is field 3, starttime 22.
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// A pidfd of the process `pid` (pidfd_open): it names that process, not
/// whichever later takes its PID. None when the process is gone or the
/// kernel has no pidfds (before 5.3).
pub fn pidfd(pid: u32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd as _;
    // SAFETY: pidfd_open takes a PID and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative result is a new fd that nothing else owns.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the process behind `pidfd` has exited (a zombie included):
/// its pidfd turns readable then, even once its PID names another process.
pub fn pidfd_exited(pidfd: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut poll = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, no wait.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

/// True while the process exists and is not a zombie.
pub fn is_alive(pid: u32) -> bool {
    matches!(state(pid), Some(state) if state != 'Z' && state != 'X')
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of the kernel's timestamps
/// (`bpf_ktime_get_ns`), so a kernel record's age can be told.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec; CLOCK_MONOTONIC always
    // exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Niceness of tracer's background threads (unwind tables, the
/// frame-pointer check): their work can wait, the target's cannot. Right
/// after attach to torch they read hundreds of MiB of unwind information.
const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread's priority to [`BACKGROUND_NICE`] (Linux
/// keeps a niceness per thread); a refusal leaves it as it was.
pub fn lower_this_threads_priority() {
    // SAFETY: plain syscalls on the calling thread.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_file_mappings_only() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 123 /usr/bin/leaky
55d0c0a01000-55d0c0a02000 r-xp 00001000 08:01 123 /usr/bin/leaky
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 
7f1000000000-7f1000100000 r-xp 00026000 08:01 456 /lib/x86_64-linux-gnu/libc.so.6
7f2000000000-7f2000001000 r-xp 00000000 08:01 789 /tmp/lib with space.so (deleted)
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 4);
        assert!(!maps[0].executable);
        assert!(maps[1].executable);
        assert_eq!(maps[2].file_offset, 0x26000);
        assert_eq!(maps[2].file_offset_of(0x7f1000000010), 0x26010);
        assert_eq!(maps[3].path, PathBuf::from("/tmp/lib with space.so"));
    }

    #[test]
    fn rss_of_own_process() {
        assert!(rss_bytes(std::process::id()).is_some_and(|rss| rss > 1 << 20));
        let status = memory_status(std::process::id()).expect("own status");
        assert!(status.rss_anon_bytes > 0 && status.rss_file_bytes > 0);
        assert!(status.rss_anon_bytes + status.rss_file_bytes <= status.rss_bytes);
        assert_eq!(rss_bytes(u32::MAX - 1), None);
    }

    #[test]
    fn cpu_time_of_own_process_grows_with_work() {
        // Spins until the kernel counts 0.1 s more; the bound only
        // catches a clock that never moves (a busy machine is slower).
        let before = cpu_time_s(std::process::id()).expect("own CPU time");
        let started = std::time::Instant::now();
        let mut spin = 0_u64;
        let mut after = before;
        while after - before < 0.1 && started.elapsed() < std::time::Duration::from_secs(30) {
            spin = std::hint::black_box(spin.wrapping_add(1));
            if spin.is_multiple_of(1_000_000) {
                after = cpu_time_s(std::process::id()).expect("own CPU time");
            }
        }
        assert!(after - before >= 0.1, "{before} -> {after}");
        assert_eq!(cpu_time_s(u32::MAX - 1), None);
    }

    #[test]
    fn own_process_is_alive() {
        assert!(is_alive(std::process::id()));
        assert!(!is_alive(u32::MAX - 1));
    }

    #[test]
    fn reads_of_a_followed_process_are_kept_only_while_its_pid_names_it() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep starts");
        let pid = child.id();
        let identity = Identity::follow(pid);
        assert_eq!(read_confirmed(pid, || Some(7)), Some(7), "it lives");
        assert!(state(pid).is_some());
        child.kill().expect("kill");
        // A zombie still holds its PID: what is read is still its own.
        assert_eq!(confirmed(pid, 8), Some(8), "a zombie");
        child.wait().expect("reaped");
        // Reaped: the PID is free, and whatever reads it now (nothing,
        // or a newcomer) is not the followed process.
        assert_eq!(identity.exited(), Some(true));
        assert_eq!(read_confirmed(pid, || Some(9)), None, "reaped");
        assert_eq!(state(pid), None);
        assert!(read_maps(pid).is_err());
        drop(identity);
        // No longer followed: reads are not checked.
        assert_eq!(confirmed(pid, 10), Some(10));
    }
}
