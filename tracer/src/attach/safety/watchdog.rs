//! The watchdog: a process that outlives tracer to do two things tracer
//! cannot do once it is gone.
//!
//! - The loader gate and exception holds: it lets go on (SIGCONT) the
//!   processes the gate holds (LOADER_HELD) or an unwind holds
//!   (EXCEPTION_HELD, `exceptions.rs`) once tracer is gone, so that a
//!   tracer killed with SIGKILL while it holds a process does not leave it
//!   stopped.
//! - Tracepoint teardown: the kernel, when the last perf event of a
//!   tracepoint closes, waits for two grace periods under a lock every
//!   tracepoint shares (perf_trace_event_unreg), ~40 ms each on a loaded
//!   VM, one after another: 0.6 s of tracer's exit for its 14
//!   tracepoints. The watchdog holds one disabled perf event (no program,
//!   no buffer, never added to the event's list) on each, so tracer's own
//!   are never the last: tracer detaches its programs at once, and the
//!   watchdog's exit pays for the teardown, after tracer's.
//!
//! It is tracer's own executable, started with `WATCHDOG_ENV` set to the
//! number of those perf events: it holds the read end of a pipe (its
//! stdin; tracer keeps the write end until it exits, however it exits),
//! LOADER_HELD (fd 3), EXCEPTION_HELD (fd 4) and the perf events (fd 5
//! on), and no program and no link, so it keeps no probe in place. At the
//! pipe's end it resumes every process in either map, and again until
//! tracer is gone and for a while after (the links go with the rest of
//! tracer's descriptors, after the pipe: seconds later on a busy machine,
//! while a process can still be held), then exits.
use std::{
    os::fd::{AsRawFd, BorrowedFd, FromRawFd as _, OwnedFd},
    process::{Child, ChildStdin, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

/// Set (to anything) in the watchdog's environment.
pub const WATCHDOG_ENV: &str = "TRACER_LOADER_WATCHDOG";

/// LOADER_HELD's descriptor in the watchdog (u32 keys: a tgid).
const HELD_FD: i32 = 3;
/// EXCEPTION_HELD's (u64 keys: a pid_tgid).
const EXCEPTION_HELD_FD: i32 = 4;

/// How long after tracer's end the watchdog keeps resuming held
/// processes, and how often it looks.
const DRAIN_FOR: Duration = Duration::from_millis(500);
/// The longest the watchdog waits for tracer's end after the pipe's
/// (tracer goes on after dropping its probes: it writes its report).
const DRAIN_AT_MOST: Duration = Duration::from_secs(30);
const DRAIN_EVERY: Duration = Duration::from_millis(10);

/// The watchdog, while tracer runs: dropping it (or tracer's end) closes
/// the pipe.
pub struct Watchdog {
    _pipe: ChildStdin,
    _child: Child,
}

impl Watchdog {
    /// Starts the watchdog on `held` (LOADER_HELD) and `exception_held`
    /// (EXCEPTION_HELD), with a perf event on each tracepoint of `events`
    /// (tracefs ids).
    pub fn start(held: OwnedFd, exception_held: OwnedFd, events: &[u64]) -> Result<Watchdog> {
        let perf_events: Vec<OwnedFd> =
            events.iter().filter_map(|&id| disabled_event(id)).collect();
        let mut fds: Vec<i32> = vec![held.as_raw_fd(), exception_held.as_raw_fd()];
        fds.extend(perf_events.iter().map(AsRawFd::as_raw_fd));
        let mut command = Command::new("/proc/self/exe");
        command
            .env(WATCHDOG_ENV, perf_events.len().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2). Each
        // descriptor is first moved above the targets (so that no dup2
        // overwrites one still to be moved), then put at HELD_FD + i, not
        // close-on-exec: the watchdog inherits them there.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                let floor = HELD_FD + fds.len() as i32;
                for fd in fds.iter_mut() {
                    *fd = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, floor);
                    if *fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                for (index, fd) in fds.iter().enumerate() {
                    if libc::dup2(*fd, HELD_FD + index as i32) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .context("could not start tracer's watchdog")?;
        let pipe = child.stdin.take().context("the watchdog's stdin")?;
        Ok(Watchdog {
            _pipe: pipe,
            _child: child,
        })
    }
}

/// `struct perf_event_attr` as of its first version (64 bytes).
#[repr(C)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    /// Bit 0: disabled.
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

/// A disabled counting perf event on the tracepoint `id`, on CPU 0 (as
/// aya opens tracer's own).
fn disabled_event(id: u64) -> Option<OwnedFd> {
    const PERF_TYPE_TRACEPOINT: u32 = 2;
    const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
    let attr = PerfEventAttr {
        kind: PERF_TYPE_TRACEPOINT,
        size: size_of::<PerfEventAttr>() as u32,
        config: id,
        sample_period: 0,
        sample_type: 0,
        read_format: 0,
        flags: 1,
        wakeup_events: 0,
        bp_type: 0,
        config1: 0,
    };
    // SAFETY: perf_event_open reads `attr`, a valid first-version attr.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &raw const attr,
            -1 as libc::pid_t,
            0 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    // SAFETY: a descriptor perf_event_open just returned, owned here.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The watchdog process (`main` when `WATCHDOG_ENV` is set): waits for
/// the end of its stdin, then resumes the held processes.
pub fn run() -> ! {
    // SAFETY: plain signal dispositions. A Ctrl-C for tracer's process
    // group is tracer's to handle; the watchdog outlives it.
    unsafe {
        for signal in [libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGPIPE] {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    // Tracer, whose end the drain waits for: its links go with its
    // descriptors, after the pipe's end, and a busy machine takes its
    // time (seconds) to close them.
    // SAFETY: plain system calls on this process's parent.
    let tracer = unsafe {
        let parent = libc::getppid();
        if parent > 1 {
            libc::syscall(libc::SYS_pidfd_open, parent, 0) as i32
        } else {
            -1
        }
    };
    let mut byte = [0u8; 64];
    loop {
        // SAFETY: reads into a local buffer.
        let read = unsafe { libc::read(0, byte.as_mut_ptr().cast(), byte.len()) };
        if read == 0
            || (read < 0
                && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted)
        {
            break;
        }
    }
    // Until tracer is gone (at most DRAIN_AT_MOST), then DRAIN_FOR more.
    let started = Instant::now();
    let mut until = started + DRAIN_FOR;
    loop {
        resume_held();
        let now = Instant::now();
        if is_alive(tracer) && now < started + DRAIN_AT_MOST {
            until = now + DRAIN_FOR;
        }
        if now >= until {
            break;
        }
        std::thread::sleep(DRAIN_EVERY);
    }
    std::process::exit(0)
}

/// Whether the process of `pidfd` has not exited yet (false without one).
fn is_alive(pidfd: i32) -> bool {
    if pidfd < 0 {
        return false;
    }
    let mut poll = libc::pollfd {
        fd: pidfd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polls one valid pollfd without waiting.
    unsafe { libc::poll(&mut poll, 1, 0) == 0 }
}

/// Resumes every process in LOADER_HELD and EXCEPTION_HELD, and takes it
/// out.
fn resume_held() {
    // SAFETY: HELD_FD is LOADER_HELD (u32 keys), inherited from tracer.
    let held = unsafe { BorrowedFd::borrow_raw(HELD_FD) };
    while let Some(pid) = first_key::<u32>(held) {
        // SAFETY: a plain signal; a process that is gone gets nothing.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        if !delete(held, pid) {
            break;
        }
    }
    // SAFETY: EXCEPTION_HELD (u64 keys), inherited from tracer.
    let held = unsafe { BorrowedFd::borrow_raw(EXCEPTION_HELD_FD) };
    while let Some(thread) = first_key::<u64>(held) {
        // SAFETY: as above, to the thread's process.
        unsafe { libc::kill((thread >> 32) as i32, libc::SIGCONT) };
        if !delete(held, thread) {
            break;
        }
    }
}

/// `union bpf_attr` for the map element commands.
#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    next_key: u64,
    flags: u64,
}

fn map_command(command: libc::c_long, attr: &MapElemAttr) -> bool {
    // SAFETY: `attr` is a valid bpf_attr prefix for `command`, whose
    // pointers point at live locals of the caller.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *const MapElemAttr,
            size_of::<MapElemAttr>(),
        ) == 0
    }
}

/// BPF_MAP_GET_NEXT_KEY from no key: the map's first key.
fn first_key<K: Default>(map: BorrowedFd<'_>) -> Option<K> {
    let mut next = K::default();
    let attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        pad: 0,
        key: 0,
        next_key: (&raw mut next) as u64,
        flags: 0,
    };
    map_command(4, &attr).then_some(next)
}

/// BPF_MAP_DELETE_ELEM.
fn delete<K>(map: BorrowedFd<'_>, key: K) -> bool {
    let attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        pad: 0,
        key: (&raw const key) as u64,
        next_key: 0,
        flags: 0,
    };
    map_command(3, &attr)
}
