//! C++ exceptions through return-probed frames: the one write tracer
//! makes into a target.
//!
//! A return probe (uretprobe or uprobe session) makes the kernel replace
//! the probed call's return address, on the target's stack, with the
//! address of its uprobe trampoline. An exception that unwinds through
//! that frame makes the unwinder look the trampoline up, find no unwind
//! information, and call `std::terminate`: a C++ program that catches
//! `std::bad_alloc` (or PyTorch's `c10::OutOfMemoryError`) is killed.
//!
//! The unwinder's entry points (`UNWINDER_START`) get an entry probe of
//! their own (tracer-ebpf's `exceptions.rs`): when a thread starts an
//! unwind while return probes of its frames are pending, the kernel side
//! stops the process before the unwinder's first instruction and sends
//! the stack words that hold the trampoline, with the return addresses
//! they held. This module's thread writes each original address back
//! through /proc/PID/mem (only into a word that still holds the
//! trampoline) and lets the process go on (SIGCONT): the unwinder then
//! sees the stack as the program made it. The kernel drops the return
//! instances left behind at the next trampoline hit, as after a longjmp:
//! those calls are not counted (they never returned).
//!
//! What the target could notice: it is stopped until the write is done
//! and every thread has stopped (well under a millisecond, longer while
//! a thread sleeps uninterruptibly; `HOLD_BOUND` at the most, then it
//! goes on and what was not repaired is counted); its parent may see the
//! stop in `waitpid(WUNTRACED)`. Its memory holds exactly what it held
//! before the probe fired. A call still in progress below the frame that
//! catches the exception returns to its caller directly, without its
//! return probe: that call is not counted (`calls_left_by_exception`).
//!
//! Where the walk is impossible (a kernel whose BTF lacks the fields) or
//! the unwinder is not probed in a process, the functions that can throw
//! get no return probe (`THROWING`), with a warning: `held_back` keeps
//! them until a library hooked later brings the unwinder.
use std::{
    collections::{HashMap, HashSet},
    fs::OpenOptions,
    os::{
        fd::{AsFd as _, AsRawFd as _},
        unix::fs::FileExt as _,
    },
    path::Path,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result};
use aya::maps::{HashMap as KernelHashMap, MapData, RingBuf};
use tracer_ebpf::{ExceptionUnwind, program};

use crate::attach::sites::function::HookedFunction;
use crate::procfs;

/// The longest a process is held for an unwind: then it goes on, its
/// return addresses perhaps not all put back (counted as lost).
pub const HOLD_BOUND: Duration = Duration::from_millis(300);
/// How often held processes are checked against the bound.
const BOUND_CHECK: Duration = Duration::from_millis(10);
/// How often the repairing thread looks whether tracer stops.
const STOP_CHECK: Duration = Duration::from_millis(100);
/// How often a held process's threads are looked at while some have not
/// stopped yet (the ring buffer wakes the thread earlier).
const SETTLE_CHECK: Duration = Duration::from_micros(100);
/// How long tracer's end waits for these threads.
const JOIN_AT_MOST: Duration = Duration::from_millis(200);

/// The unwinder's entry points (libgcc_s, or any object that carries its
/// own unwinder): every C++ throw, rethrow and forced unwind (thread
/// cancellation) starts in one of them.
pub const UNWINDER_START: [HookedFunction; 3] = [
    unwinder("_Unwind_RaiseException"),
    unwinder("_Unwind_Resume_or_Rethrow"),
    unwinder("_Unwind_ForcedUnwind"),
];

const fn unwinder(name: &'static str) -> HookedFunction {
    HookedFunction {
        name,
        entry_program: Some(program::UNWIND_START),
        return_program: None,
        cookie: 0,
    }
}

/// Whether `name` is one of the unwinder's entry points.
pub fn is_unwinder_start(name: &str) -> bool {
    UNWINDER_START.iter().any(|function| function.name == name)
}

/// The return-probed functions that can throw: they get their return
/// probe only in a process whose unwinder is probed (`held_back`).
pub const THROWING: &[&str] = &[
    "_Znwm",
    "_Znam",
    "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t",
    "tc_new",
    "tc_newarray",
];

/// What the threads did, for the report's counters.
#[derive(Default)]
struct FixCounts {
    restored: AtomicU64,
    lost: AtomicU64,
    holds: AtomicU64,
    held_ns_max: AtomicU64,
}

/// EXCEPTION_HELD and the counters, shared by the thread that repairs
/// and the one that keeps the bound. The map is locked only around map
/// operations, never across a write into a target: a write that blocks
/// (a hostile target's stack behind userfaultfd) cannot keep the bound
/// from letting its process go.
struct Holds {
    held: Mutex<KernelHashMap<MapData, u64, u64>>,
    counts: FixCounts,
}

impl Holds {
    fn held(&self) -> MutexGuard<'_, KernelHashMap<MapData, u64, u64>> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// When `thread` was held; None when it is not (let go already).
    fn since_ns(&self, thread: u64) -> Option<u64> {
        self.held().get(&thread, 0).ok()
    }

    /// Takes `thread` out of EXCEPTION_HELD and resumes its process unless
    /// another of its threads is still held. Only a process the eBPF side
    /// stopped is resumed, and only by whoever takes it out.
    fn release(&self, thread: u64, since_ns: u64) {
        let tgid = (thread >> 32) as u32;
        {
            let mut held = self.held();
            if held.remove(&thread).is_err() {
                return;
            }
            let still_held: HashSet<u32> = held
                .keys()
                .filter_map(Result::ok)
                .map(|other| (other >> 32) as u32)
                .collect();
            if !still_held.contains(&tgid) {
                // SAFETY: a plain signal; a process that is gone gets nothing.
                unsafe { libc::kill(tgid as i32, libc::SIGCONT) };
            }
        }
        let held_ns = procfs::monotonic_ns().saturating_sub(since_ns);
        self.counts.holds.fetch_add(1, Ordering::Relaxed);
        self.counts
            .held_ns_max
            .fetch_max(held_ns, Ordering::Relaxed);
    }

    /// Takes `thread` out of EXCEPTION_HELD once its unwind is repaired;
    /// its process goes on later (`resume_if_free`).
    fn finish(&self, thread: u64, since_ns: u64) {
        if self.held().remove(&thread).is_err() {
            return;
        }
        let held_ns = procfs::monotonic_ns().saturating_sub(since_ns);
        self.counts.holds.fetch_add(1, Ordering::Relaxed);
        self.counts
            .held_ns_max
            .fetch_max(held_ns, Ordering::Relaxed);
    }

    /// Resumes `tgid` unless one of its threads is still held; the hold,
    /// which began at `since_ns`, counts for the longest.
    fn resume_if_free(&self, tgid: u32, since_ns: u64) {
        let held = self.held();
        if held
            .keys()
            .filter_map(Result::ok)
            .all(|thread| (thread >> 32) as u32 != tgid)
        {
            // SAFETY: a plain signal; a process that is gone gets nothing.
            unsafe { libc::kill(tgid as i32, libc::SIGCONT) };
            let held_ns = procfs::monotonic_ns().saturating_sub(since_ns);
            self.counts
                .held_ns_max
                .fetch_max(held_ns, Ordering::Relaxed);
        }
    }

    /// Lets go on every process held longer than `bound` (all with a zero
    /// bound), each counted as lost.
    fn release_overdue(&self, bound: Duration) {
        let now_ns = procfs::monotonic_ns();
        let overdue: Vec<(u64, u64)> = self
            .held()
            .iter()
            .filter_map(Result::ok)
            .filter(|&(_, since_ns)| now_ns.saturating_sub(since_ns) >= bound.as_nanos() as u64)
            .collect();
        for (thread, since_ns) in overdue {
            if self.since_ns(thread).is_some() {
                self.counts.lost.fetch_add(1, Ordering::Relaxed);
            }
            self.release(thread, since_ns);
        }
    }
}

/// The threads that put return addresses back and keep the bound.
pub struct ExceptionFixer {
    stop: Arc<AtomicBool>,
    holds: Arc<Holds>,
    threads: Vec<JoinHandle<()>>,
}

impl ExceptionFixer {
    /// Starts the threads on EXCEPTION_UNWINDS and EXCEPTION_HELD.
    pub fn start(
        unwinds: RingBuf<MapData>,
        held: KernelHashMap<MapData, u64, u64>,
    ) -> Result<ExceptionFixer> {
        let stop = Arc::new(AtomicBool::new(false));
        let holds = Arc::new(Holds {
            held: Mutex::new(held),
            counts: FixCounts::default(),
        });
        let (repair_stop, repair_holds) = (Arc::clone(&stop), Arc::clone(&holds));
        let repairer = std::thread::Builder::new()
            .name("tracer-unwinds".to_owned())
            .spawn(move || repair_unwinds(unwinds, &repair_holds, &repair_stop))
            .context("could not start the exception thread")?;
        let (bound_stop, bound_holds) = (Arc::clone(&stop), Arc::clone(&holds));
        let bound = std::thread::Builder::new()
            .name("tracer-unwind-bound".to_owned())
            .spawn(move || {
                while !bound_stop.load(Ordering::Relaxed) {
                    std::thread::sleep(BOUND_CHECK);
                    bound_holds.release_overdue(HOLD_BOUND);
                }
            })
            .context("could not start the exception bound thread")?;
        Ok(ExceptionFixer {
            stop,
            holds,
            threads: vec![repairer, bound],
        })
    }

    /// Return addresses put back, and unwinds not (fully) repaired.
    pub fn counts(&self) -> (u64, u64) {
        let counts = &self.holds.counts;
        (
            counts.restored.load(Ordering::Relaxed),
            counts.lost.load(Ordering::Relaxed),
        )
    }

    /// Holds made, and the longest.
    pub fn holds(&self) -> (u64, Duration) {
        let counts = &self.holds.counts;
        (
            counts.holds.load(Ordering::Relaxed),
            Duration::from_nanos(counts.held_ns_max.load(Ordering::Relaxed)),
        )
    }
}

impl Drop for ExceptionFixer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Tracer stops: nothing stays held. A thread stuck in a write into
        // a target is not waited for past `JOIN_AT_MOST` (it ends with
        // tracer's process).
        self.holds.release_overdue(Duration::ZERO);
        let deadline = std::time::Instant::now() + JOIN_AT_MOST;
        for thread in self.threads.drain(..) {
            while !thread.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
        self.holds.release_overdue(Duration::ZERO);
    }
}

/// The repairing thread: every unwind sent, its return addresses put back,
/// and its process resumed once that cannot cancel a stop still needed.
///
/// SIGCONT cancels every stop still pending in the process, and the
/// process goes on as a whole. So a process is resumed only once every
/// one of its threads was seen stopped (then none can be inside
/// `unwind_start`, and every unwind it sent is in the ring buffer), the
/// ring buffer was read after that look, and every unwind read for it is
/// repaired. A thread that does not stop within `HOLD_BOUND` (asleep
/// uninterruptibly: a disk read, a vfork) does not keep the process held
/// longer; see `give_up`.
fn repair_unwinds(mut unwinds: RingBuf<MapData>, holds: &Holds, stop: &AtomicBool) {
    let fd = unwinds.as_fd().as_raw_fd();
    // Unwinds read whose thread has not stopped yet.
    let mut queued: Vec<ExceptionUnwind> = Vec::new();
    // Processes held, with when their first hold since the last resume began.
    let mut waiting: HashMap<u32, u64> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        wait_readable(
            fd,
            if waiting.is_empty() {
                STOP_CHECK
            } else {
                SETTLE_CHECK
            },
        );
        // Looked at before the ring buffer is read: a process whose every
        // thread is stopped now has sent all its unwinds by then.
        let looked: HashMap<u32, Threads> = waiting
            .keys()
            .map(|&tgid| (tgid, threads_of(tgid)))
            .collect();
        while let Some(item) = unwinds.next() {
            if item.len() < size_of::<ExceptionUnwind>() {
                continue;
            }
            // SAFETY: the kernel wrote an `ExceptionUnwind` (plain data).
            let unwind: ExceptionUnwind = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            drop(item);
            waiting
                .entry(tgid_of(&unwind))
                .or_insert(unwind.held_since_ns);
            queued.push(unwind);
        }
        queued.retain(|unwind| !try_repair(holds, unwind));
        let now_ns = procfs::monotonic_ns();
        waiting.retain(|&tgid, &mut since_ns| {
            let unrepaired = queued.iter().any(|unwind| tgid_of(unwind) == tgid);
            if !unrepaired && looked.get(&tgid) == Some(&Threads::Stopped) {
                holds.resume_if_free(tgid, since_ns);
                return false;
            }
            if now_ns.saturating_sub(since_ns) < HOLD_BOUND.as_nanos() as u64 {
                return true;
            }
            give_up(holds, tgid, since_ns, &mut queued);
            false
        });
    }
}

/// `tgid` was held for `HOLD_BOUND` and some thread of it has not stopped:
/// it goes on. Its unwinds whose thread never stopped are counted lost,
/// unrepaired (their stack may have changed since: nothing is written).
/// A thread that sleeps uninterruptibly meanwhile is no risk: an eBPF
/// program never sleeps, so it is not between sending its stop and
/// sending its unwind, and a stop it sends later comes after this
/// SIGCONT. One still running (starved of CPU for the whole bound) might
/// be: that counts as one more lost.
fn give_up(holds: &Holds, tgid: u32, since_ns: u64, queued: &mut Vec<ExceptionUnwind>) {
    queued.retain(|unwind| {
        if tgid_of(unwind) != tgid {
            return true;
        }
        if let Some(since_ns) = holds.since_ns(unwind.thread) {
            holds.counts.lost.fetch_add(1, Ordering::Relaxed);
            holds.finish(unwind.thread, since_ns);
        }
        false
    });
    if threads_of(tgid) == Threads::Running {
        holds.counts.lost.fetch_add(1, Ordering::Relaxed);
    }
    holds.resume_if_free(tgid, since_ns);
}

fn tgid_of(unwind: &ExceptionUnwind) -> u32 {
    (unwind.thread >> 32) as u32
}

/// Waits up to `timeout` for `fd` to be readable.
fn wait_readable(fd: i32, timeout: Duration) {
    let mut ready = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: one valid pollfd and timespec; an error or a timeout only
    // loops.
    unsafe { libc::ppoll(&mut ready, 1, &timeout, std::ptr::null()) };
}

/// Puts back the return addresses of one unwind once its thread is
/// stopped; true when done with it (repaired, or nothing more to do),
/// false while its thread has not stopped yet. A thread no longer held
/// (let go by the bound) is not written to: it runs.
fn try_repair(holds: &Holds, unwind: &ExceptionUnwind) -> bool {
    let Some(since_ns) = holds.since_ns(unwind.thread) else {
        return true;
    };
    let tgid = tgid_of(unwind);
    // Written only into a thread that is stopped: the stop its probe sent
    // to it is taken on its way back to user space, before the unwinder
    // runs.
    match thread_state(tgid, unwind.thread as u32) {
        Some('T' | 't') => {}
        Some(_) => return false,
        None => {
            holds.counts.lost.fetch_add(1, Ordering::Relaxed);
            holds.finish(unwind.thread, since_ns);
            return true;
        }
    }
    let mut complete = unwind.cut == 0;
    match OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{tgid}/mem"))
    {
        Ok(memory) => {
            for slot in unwind.slots.iter().take(unwind.count as usize) {
                if slot.stack == 0 {
                    continue;
                }
                let mut word = [0u8; 8];
                let holds_trampoline = memory.read_exact_at(&mut word, slot.stack).is_ok()
                    && tracer_ebpf::is_uprobe_trampoline(u64::from_ne_bytes(word));
                // Put back already when not (a chained instance shares
                // its word with the one before).
                if !holds_trampoline {
                    continue;
                }
                if memory
                    .write_all_at(&slot.original.to_ne_bytes(), slot.stack)
                    .is_ok()
                {
                    holds.counts.restored.fetch_add(1, Ordering::Relaxed);
                } else {
                    complete = false;
                }
            }
        }
        Err(_) => complete = false,
    }
    if !complete {
        holds.counts.lost.fetch_add(1, Ordering::Relaxed);
    }
    holds.finish(unwind.thread, since_ns);
    true
}

/// What a process's threads are doing, from /proc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Threads {
    /// Every thread stopped (T, or t under a debugger) or exiting, or the
    /// process gone.
    Stopped,
    /// Some thread running or ready to run (R): it may be inside
    /// `unwind_start`.
    Running,
    /// None running, some not stopped (asleep: S, D, I).
    Asleep,
}

/// What the threads of `tgid` are doing now.
fn threads_of(tgid: u32) -> Threads {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{tgid}/task")) else {
        return Threads::Stopped;
    };
    let mut threads = Threads::Stopped;
    for task in tasks.filter_map(Result::ok) {
        match task_state(&task.path().join("stat")) {
            Some('R') => return Threads::Running,
            Some('T' | 't' | 'Z' | 'X') | None => {}
            Some(_) => threads = Threads::Asleep,
        }
    }
    threads
}

/// The state letter of thread `tid` of `tgid`; None when it is gone.
fn thread_state(tgid: u32, tid: u32) -> Option<char> {
    task_state(Path::new(&format!("/proc/{tgid}/task/{tid}/stat")))
}

/// The state letter in a /proc stat file (after the parenthesized name,
/// which may itself hold parentheses); None when it cannot be read.
fn task_state(stat: &Path) -> Option<char> {
    let stat = std::fs::read_to_string(stat).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.trim_start().chars().next()
}
