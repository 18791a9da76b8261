//! Libraries hooked at open: a library a target dlopens after attach, and
//! that no rule of `ahead` found, is hooked while the loader is still
//! reading it. The `openat` tracepoints send the path of every shared
//! object a traced process opens (tracer-ebpf/src/libraries.rs) and wake
//! this module's thread, which reads the file inside the target's root
//! (`target_files`),
//! looks up its allocator and CUDA functions and attaches them by file,
//! scoped to the process. Uprobes are keyed by file, so probes attached
//! before the loader maps the file, or after but before the first call,
//! see every call.
//!
//! Without the loader gate (`--no-loader-pause`) it is a race against the
//! target: the loader
//! maps the file, relocates it and runs its constructors, then `dlopen`
//! returns and the caller may allocate at once (~340 µs after the openat
//! for a small library, measured). The thread does nothing else, runs
//! under SCHED_FIFO (`raise_priority`), and makes each probe set in one
//! uprobe_multi link. What it
//! attaches goes to the collect loop (`Probes::watch_libraries`) to be
//! reported; a library it missed is hooked late, when its mapping is
//! noticed.
//!
//! With the loader gate (the default), the race cannot be lost: the
//! kernel's `loader_gate` stops a process whose dlopen completes while
//! this thread has not looked at every shared object it opened, and the
//! thread lets it go on (SIGCONT) as soon as it has, or after
//! `PAUSE_BOUND` at the most: a keeper thread of its own enforces the
//! bound, so a hooking thread that is slow, stuck or gone (a panic) never
//! holds a process longer, and lets every held process go when tracer
//! stops (the watchdog does when tracer is killed). Every file is opened
//! without waiting (`target_files`: a FIFO named `x.so` is refused, not
//! read). Each pause is reported. The late hook leaves
//! a process's files to this thread while it is behind on what the
//! process opened (`LookedAt`): had it claimed one first, this thread
//! would pass over the file and let the process go on before the late
//! hook's probes were in place.
//!
//! Long: the at-open thread: its loop, the loader gate it shares, and the hook
//! of each opened object.
use std::{
    collections::{HashMap, HashSet},
    fs,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::maps::{HashMap as KernelHashMap, MapData, RingBuf};
use tracer_ebpf::OpenedFile;

use crate::attach::{
    HookSite,
    libraries::ahead,
    load::raw::{LinkKind, Linker},
    safety::held_back::ThrowingReturns,
    sites::forwarding::Forwarding,
    sites::symbols::{SiteFile, Unprobed, hook_sites_in_file},
    sources::uprobes::{Stage, batches},
};
use crate::{procfs, target_files};

/// How long the thread sleeps between checks that it should stop.
const STOP_CHECK: Duration = Duration::from_millis(100);
/// How long the last report waits for a hook in progress.
const SETTLE_AT_MOST: Duration = Duration::from_millis(200);
/// How long tracer's end waits for the hooking thread before leaving it.
const JOIN_AT_MOST: Duration = Duration::from_millis(300);
/// The longest a process is held at the loader gate. The first CUDA
/// library of a run waits there for the verifier to pass tracer's CUDA
/// programs: 0.1-0.2 s on a quiet 2-core VM (`loader_pauses`), 2-3x that
/// on a busy one; at 200 ms, a CI machine let a process go before its
/// hooks were in place (its first cudaMalloc calls missed).
pub const PAUSE_BOUND: Duration = Duration::from_secs(1);
/// How often a held process is checked against the bound.
const BOUND_CHECK: Duration = Duration::from_millis(10);

/// The files hooked (or found to hold nothing to hook) per process, by
/// device and inode: uprobes are keyed by file, so a file gets its probes
/// once per process, by whichever way came first (attach, ahead, at open,
/// late). Shared by the collect loop and the at-open thread.
#[derive(Clone, Debug, Default)]
pub struct HookedFiles(Arc<Mutex<HashSet<(u32, u64, u64)>>>);

impl HookedFiles {
    /// Claims `file` (opened by tracer: its device and inode, never a path
    /// looked up again) for `pid`: false when it was claimed before.
    pub fn claim(&self, pid: u32, file: &SiteFile) -> bool {
        self.lock().insert((pid, file.device, file.inode))
    }

    /// Gives up the claim of `pid` on `file` (its probes failed).
    fn release(&self, pid: u32, file: &SiteFile) {
        self.lock().remove(&(pid, file.device, file.inode));
    }

    /// The sites among `sites` whose file this call claimed for `pid`.
    pub fn claim_sites(&self, pid: u32, sites: &[HookSite]) -> Vec<HookSite> {
        let mut claimed: HashMap<(u64, u64), bool> = HashMap::new();
        sites
            .iter()
            .filter(|site| {
                *claimed
                    .entry((site.file.device, site.file.inode))
                    .or_insert_with(|| self.claim(pid, &site.file))
            })
            .cloned()
            .collect()
    }

    /// Forgets the files of `pid`, which exited.
    pub fn forget(&self, pid: u32) {
        self.lock()
            .retain(|&(claimed_pid, _, _)| claimed_pid != pid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(u32, u64, u64)>> {
        // A panic elsewhere leaves the set as it was: still usable.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A library hooked at open, for the collect loop to report.
pub struct OpenedHook {
    pub pid: u32,
    /// The file as the target sees it.
    pub path: PathBuf,
    /// Its sites probed (those that can throw only once the process's
    /// unwinder is probed: `held_back`).
    pub sites: Vec<HookSite>,
    /// Sites of other files of the process that waited for its unwinder,
    /// which this file brought: probed after `sites`.
    pub released: Vec<HookSite>,
    /// Its hooked functions that need no probe (`forwarding`).
    pub unprobed: Vec<Unprobed>,
    /// The links made, which `RawPrograms` each belongs to, and their
    /// probe counts.
    pub links: Vec<(LinkKind, OwnedFd, usize)>,
    pub hooked_at: Instant,
    /// From the return of the target's `openat` to the last link made.
    pub after_open: Duration,
}

/// What the at-open thread did with one opened file.
pub enum AtOpenNews {
    Hooked(OpenedHook),
    /// The probes could not be attached: the file is left to the late hook.
    Failed {
        pid: u32,
        path: PathBuf,
        error: String,
    },
    /// A line for stderr.
    Note(String),
    /// A process the loader gate held was let go on, after `held`; by the
    /// bound (its libraries were not all looked at by then) or not.
    Paused {
        pid: u32,
        held: Duration,
        by_bound: bool,
    },
}

/// How many of the shared objects each process opened the at-open thread
/// has looked at (and hooked where they needed it), in the order OPENED
/// gave them. Shared with the collect loop, whose late hook waits for the
/// thread (`LibraryWatch::behind_at_open`).
#[derive(Clone, Debug, Default)]
pub struct LookedAt(Arc<Mutex<HashMap<u32, u64>>>);

impl LookedAt {
    /// The count for `pid`.
    pub fn of(&self, pid: u32) -> u64 {
        self.lock().get(&pid).copied().unwrap_or(0)
    }

    /// One more for `pid`: the new count.
    fn add(&self, pid: u32) -> u64 {
        let mut counts = self.lock();
        let count = counts.entry(pid).or_insert(0);
        *count += 1;
        *count
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, u64>> {
        // A panic elsewhere leaves the counts as they were: still usable.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The userspace side of the loader gate: how many opened shared objects
/// of each process this thread has looked at (LOADS_DONE), and the
/// processes the gate stopped (LOADER_HELD).
pub struct LoaderGate {
    pub done: KernelHashMap<MapData, u32, u64>,
    pub held: KernelHashMap<MapData, u32, u64>,
    looked_at: LookedAt,
}

impl LoaderGate {
    pub fn new(
        done: KernelHashMap<MapData, u32, u64>,
        held: KernelHashMap<MapData, u32, u64>,
        looked_at: LookedAt,
    ) -> LoaderGate {
        LoaderGate {
            done,
            held,
            looked_at,
        }
    }

    /// One more shared object of `pid` looked at (and hooked if it needed
    /// it); lets `pid` go on if the gate holds it. Done, then held: the
    /// gate writes in the other order.
    fn looked_at(&mut self, pid: u32, news: &mpsc::Sender<AtOpenNews>) {
        let count = self.looked_at.add(pid);
        let _ = self.done.insert(pid, count, 0);
        if let Ok(since_ns) = self.held.get(&pid, 0) {
            self.release(pid, since_ns, false, news);
        }
    }

    /// Lets go on every held process held for longer than the bound.
    fn release_overdue(&mut self, news: &mpsc::Sender<AtOpenNews>) {
        let now_ns = procfs::monotonic_ns();
        let overdue: Vec<(u32, u64)> = self
            .held
            .iter()
            .filter_map(Result::ok)
            .filter(|&(_, since_ns)| {
                now_ns.saturating_sub(since_ns) >= PAUSE_BOUND.as_nanos() as u64
            })
            .collect();
        for (pid, since_ns) in overdue {
            self.release(pid, since_ns, true, news);
        }
    }

    fn release(
        &mut self,
        pid: u32,
        since_ns: u64,
        by_bound: bool,
        news: &mpsc::Sender<AtOpenNews>,
    ) {
        let _ = self.held.remove(&pid);
        // SAFETY: a plain signal; a process that is gone gets nothing.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        let _ = news.send(AtOpenNews::Paused {
            pid,
            held: Duration::from_nanos(procfs::monotonic_ns().saturating_sub(since_ns)),
            by_bound,
        });
    }

    /// Lets go on every process still held (tracer stops).
    fn release_all(&mut self, news: &mpsc::Sender<AtOpenNews>) {
        let held: Vec<(u32, u64)> = self.held.iter().filter_map(Result::ok).collect();
        for (pid, since_ns) in held {
            self.release(pid, since_ns, false, news);
        }
    }
}

/// The gate, shared by the hooking thread (which lets a process go once
/// its files are looked at) and the keeper (which enforces the bound).
type SharedGate = Arc<Mutex<LoaderGate>>;

fn lock_gate(gate: &SharedGate) -> std::sync::MutexGuard<'_, LoaderGate> {
    // A panic of the hooking thread leaves the gate usable: the keeper
    // must still let every process go.
    gate.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The keeper: every `BOUND_CHECK`, lets go on the processes held longer
/// than `PAUSE_BOUND`; at the stop, every process held.
fn keep(gate: &SharedGate, stop: &AtomicBool, news: &mpsc::Sender<AtOpenNews>) {
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(BOUND_CHECK);
        lock_gate(gate).release_overdue(news);
    }
    lock_gate(gate).release_all(news);
}

/// The at-open thread, and what it sends.
pub struct AtOpen {
    news: mpsc::Receiver<AtOpenNews>,
    stop: Arc<AtomicBool>,
    /// Set while the thread hooks what it was woken for.
    busy: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The gate's keeper, when the gate is on.
    keeper: Option<JoinHandle<()>>,
}

impl AtOpen {
    /// Starts the thread on the OPENED ring buffer; it attaches with
    /// `multi` (and `session` for the functions it covers).
    pub fn start(
        opened: RingBuf<MapData>,
        multi: Linker,
        session: Option<Linker>,
        files: HookedFiles,
        throwing: ThrowingReturns,
        gate: Option<LoaderGate>,
        forwarding: Forwarding,
    ) -> Result<AtOpen> {
        let (sender, news) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let gate = gate.map(|gate| Arc::new(Mutex::new(gate)));
        let keeper = match &gate {
            Some(gate) => {
                let (gate, stop, news) = (Arc::clone(gate), Arc::clone(&stop), sender.clone());
                Some(
                    std::thread::Builder::new()
                        .name("tracer-gate-keeper".to_owned())
                        .spawn(move || keep(&gate, &stop, &news))
                        .context("could not start the loader gate's keeper")?,
                )
            }
            None => None,
        };
        let hooker = Hooker {
            multi,
            session,
            files,
            throwing,
            forwarding,
            news: sender,
        };
        let busy = Arc::new(AtomicBool::new(false));
        let (thread_stop, thread_busy) = (Arc::clone(&stop), Arc::clone(&busy));
        let thread = std::thread::Builder::new()
            .name("tracer-at-open".to_owned())
            .spawn(move || hooker.run(opened, gate, &thread_stop, &thread_busy))
            .context("could not start the at-open thread")?;
        Ok(AtOpen {
            news,
            stop,
            busy,
            thread: Some(thread),
            keeper,
        })
    }

    /// Waits (a little) for a hook in progress, so that the last report
    /// lists what was opened just before tracer stopped.
    pub fn settle(&self) {
        let deadline = Instant::now() + SETTLE_AT_MOST;
        while self.busy.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// What the thread did since the last call.
    pub fn take(&self) -> Vec<AtOpenNews> {
        self.news.try_iter().collect()
    }
}

impl Drop for AtOpen {
    /// Stops both threads: the keeper lets every held process go first.
    /// A hooking thread still inside the kernel after `JOIN_AT_MOST` is
    /// left to end with tracer's process: tracer's exit never waits on it.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
        if let Some(thread) = self.thread.take() {
            let deadline = Instant::now() + JOIN_AT_MOST;
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

/// The at-open thread's state.
struct Hooker {
    multi: Linker,
    session: Option<Linker>,
    files: HookedFiles,
    /// Which processes have their unwinder probed, shared with the
    /// collect loop's hooks.
    throwing: ThrowingReturns,
    /// Which functions that pass their calls on go without a probe.
    forwarding: Forwarding,
    news: mpsc::Sender<AtOpenNews>,
}

impl Hooker {
    fn run(
        self,
        mut opened: RingBuf<MapData>,
        gate: Option<SharedGate>,
        stop: &AtomicBool,
        busy: &AtomicBool,
    ) {
        if let Err(error) = raise_priority() {
            let _ = self.news.send(AtOpenNews::Note(format!(
                "note: libraries opened later are hooked at normal priority \
                 (SCHED_FIFO refused: {error}): on a busy machine their first calls may be missed"
            )));
        }
        let fd = opened.as_fd().as_raw_fd();
        let timeout_ms = STOP_CHECK.as_millis() as i32;
        while !stop.load(Ordering::Relaxed) {
            let mut ready = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; an error or a timeout only loops.
            unsafe { libc::poll(&mut ready, 1, timeout_ms) };
            busy.store(true, Ordering::Release);
            while let Some(item) = opened.next() {
                if item.len() < size_of::<OpenedFile>() {
                    continue;
                }
                // SAFETY: the kernel wrote an `OpenedFile` (plain data) there.
                let file: OpenedFile = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                drop(item);
                self.hook(&file);
                if let Some(gate) = &gate {
                    lock_gate(gate).looked_at(file.tgid, &self.news);
                }
            }
            busy.store(false, Ordering::Release);
        }
    }

    /// Hooks the file a target opened, unless it is hooked already or
    /// holds no function to hook.
    fn hook(&self, file: &OpenedFile) {
        let pid = file.tgid;
        let Some(path) = opened_path(pid, &file.path) else {
            return;
        };
        // Opened once: read, claimed and probed as this one inode.
        let Some(opened) = target_files::open_in_root(pid, &path)
            .ok()
            .and_then(|file| SiteFile::of(file, &path).ok())
        else {
            return;
        };
        if !self.files.claim(pid, &opened) {
            return;
        }
        let found = match hook_sites_in_file(pid, &path, &opened, self.forwarding) {
            Ok(found) if !found.sites.is_empty() => found,
            // Not an ELF file, or one without allocator or CUDA functions:
            // claimed all the same, so that it is not read again.
            _ => return,
        };
        let mut admitted = self.throwing.admit(pid, found.sites);
        let news = match self.attach(pid, &admitted.now) {
            Ok(mut links) => {
                if let Some(warning) = admitted.warning.take() {
                    let _ = self.news.send(AtOpenNews::Note(warning));
                }
                // The unwinder's probes are in: what waited for it goes in.
                match self.attach(pid, &admitted.released) {
                    Ok(released_links) => links.extend(released_links),
                    Err(error) => {
                        self.throwing.hold_again(pid, &admitted.released);
                        admitted.released.clear();
                        let _ = self.news.send(AtOpenNews::Note(format!(
                            "warning: PID {pid}: the functions that waited for the unwinder \
                             could not be probed: {error:#}"
                        )));
                    }
                }
                AtOpenNews::Hooked(OpenedHook {
                    pid,
                    path,
                    // The links hold the files: their descriptors are let go.
                    sites: admitted
                        .now
                        .iter()
                        .map(HookSite::without_descriptor)
                        .collect(),
                    released: admitted
                        .released
                        .iter()
                        .map(HookSite::without_descriptor)
                        .collect(),
                    unprobed: found.unprobed,
                    links,
                    hooked_at: Instant::now(),
                    after_open: Duration::from_nanos(
                        procfs::monotonic_ns().saturating_sub(file.timestamp_ns),
                    ),
                })
            }
            Err(error) => {
                self.throwing.undo(pid, &admitted);
                self.files.release(pid, &opened);
                AtOpenNews::Failed {
                    pid,
                    path,
                    error: format!("{error:#}"),
                }
            }
        };
        // The collect loop is gone only when tracer stops.
        let _ = self.news.send(news);
    }

    /// Attaches the probes of `sites` (one file), returns first; on an
    /// error the links made so far are dropped, which detaches them.
    fn attach(&self, pid: u32, sites: &[HookSite]) -> Result<Vec<(LinkKind, OwnedFd, usize)>> {
        let session = self.session.as_ref();
        let mut links = Vec::new();
        let ordered = batches(sites, |program| {
            session.is_some_and(|session| session.covers(program))
        });
        // The programs not verified yet (CUDA's, the first time) are
        // verified together while the loader gate holds the process.
        for (stage, batch) in &ordered {
            match (stage, session) {
                (Stage::Session, Some(session)) => session.prefetch(&[batch.program]),
                _ => self.multi.prefetch(&[batch.program]),
            }
        }
        for (stage, batch) in ordered {
            let linker = match (stage, session) {
                (Stage::Session, Some(session)) => session,
                _ => &self.multi,
            };
            let link = linker.link(batch.program, &batch.site.file, &batch.points, pid)?;
            links.push((linker.kind, link, batch.points.len()));
        }
        Ok(links)
    }
}

/// Runs the calling thread under SCHED_FIFO (lowest priority): woken by
/// an open, it runs at once instead of queueing behind the machine's other
/// work (the target's own threads included), for the fraction of a
/// millisecond hooking takes. The target is not stopped: its threads on
/// other CPUs go on, and one that shares the CPU waits as it would for any
/// other task. The system call itself: musl's `sched_setscheduler` (the
/// static build, `cargo xtask dist`) fails with ENOSYS by design.
fn raise_priority() -> std::io::Result<()> {
    // SAFETY: sched_param is plain integers; musl's has more fields than
    // glibc's, all zero here.
    let mut parameters: libc::sched_param = unsafe { std::mem::zeroed() };
    parameters.sched_priority = 1;
    // SAFETY: pid 0 is the calling thread; `parameters` is valid.
    let status = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            0,
            libc::SCHED_FIFO,
            &raw const parameters,
        )
    };
    if status != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The file a target opened, as it sees it (symbolic links resolved, a
/// relative path taken from its working directory), from the NUL-ended
/// path of an `OpenedFile`.
fn opened_path(pid: u32, bytes: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt as _;
    let length = bytes.iter().position(|&byte| byte == 0)?;
    let path = Path::new(std::ffi::OsStr::from_bytes(&bytes[..length]));
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        fs::read_link(format!("/proc/{pid}/cwd")).ok()?.join(path)
    };
    ahead::resolve(pid, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_claimed_once_per_process() {
        let open =
            |path: &str| SiteFile::of(fs::File::open(path).unwrap(), Path::new(path)).unwrap();
        let files = HookedFiles::default();
        let libc = open("/lib/x86_64-linux-gnu/libc.so.6");
        assert!(files.claim(1, &libc));
        assert!(!files.claim(1, &libc), "the same process");
        // The same inode opened through another path.
        assert!(!files.claim(1, &open("/usr/lib/x86_64-linux-gnu/libc.so.6")));
        assert!(files.claim(2, &libc), "another process");
        files.forget(1);
        assert!(files.claim(1, &libc));
        // Another inode.
        assert!(files.claim(1, &open("/bin/sh")));
    }

    #[test]
    fn opened_paths_are_resolved_as_the_target_sees_them() {
        let pid = std::process::id();
        let mut bytes = [0u8; 64];
        let name = b"/usr/lib/x86_64-linux-gnu/libc.so.6";
        bytes[..name.len()].copy_from_slice(name);
        let resolved = opened_path(pid, &bytes).expect("libc resolves");
        assert!(resolved.is_absolute());
        assert!(!resolved.starts_with("/proc"), "{}", resolved.display());
        assert_eq!(opened_path(pid, &[b'x'; 8]), None, "no NUL: cut");
    }
}
