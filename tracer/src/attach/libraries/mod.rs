//! Libraries a target maps after attach (PyTorch and others dlopen the CUDA
//! libraries long after start): noticed through the eBPF `exec_mapped`
//! tracepoint program, which sends an event when a traced process maps a
//! file with execute permission, with a ~1 Hz poll of /proc/PID/maps as a
//! backup. New executable files are looked up for allocator and CUDA
//! functions and hooked, well within a second.
//!
//! The same ring buffer carries the other rare events, exec and CUDA
//! context destruction, which the collect loop takes from here.
//!
//! Events are sent without waking tracer (BPF_RB_NO_WAKEUP), so the
//! collect loop drains them on a short timer; a few milliseconds of
//! settling lets ld.so finish mapping the object (it does so in several
//! mmap calls) before its mappings are read.
//!
//! Long: the watch of libraries mapped later: its kernel side, execs, rescans
//! and the late hook.
pub mod ahead;
pub mod at_open;
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap as KernelHashMap, MapData, RingBuf},
};
use tracer_ebpf::{RareEvent, event};

use crate::attach::{
    HookSite, Probes,
    libraries::at_open::{AtOpen, AtOpenNews, HookedFiles, LoaderGate, LookedAt, OpenedHook},
    load::links::{TracepointLink, attach_tracepoint},
    load::raw::{LinkKind, Linker},
    safety::held_back::{ThrowingReturns, released_note},
    sites::forwarding::Forwarding,
    sites::symbols::{executable_paths, hook_sites_in},
};
pub use crate::model::run::NoticedBy;
use crate::{
    model::run::LibraryReport,
    procfs::{self, Mapping},
};

/// How often the collect loop should call [`Probes::watch_libraries`].
pub const DRAIN_EVERY: Duration = Duration::from_millis(20);
/// Wait after an mmap event before reading the process's mappings.
const SETTLE: Duration = Duration::from_millis(30);
/// Backup poll of every target's mappings.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// How soon a late hook that waits for the at-open thread looks again.
const BEHIND_RETRY: Duration = Duration::from_millis(2);
/// How long a late hook waits for the at-open thread at the most: it
/// hooks a library in about a millisecond, the first CUDA library of a
/// run once the CUDA programs are verified (0.1-0.3 s, more on a busy
/// machine).
const BEHIND_AT_MOST: Duration = Duration::from_secs(5);

/// An object with hooks in one process.
#[derive(Clone, Debug, PartialEq)]
pub struct HookedLibrary {
    pub pid: u32,
    /// The file as the target sees it.
    pub path: PathBuf,
    /// The functions hooked in it.
    pub functions: Vec<&'static str>,
    pub hooked_at: Instant,
    pub noticed_by: NoticedBy,
}

impl HookedLibrary {
    /// One entry per file among `sites`, hooked now.
    pub fn from_sites(pid: u32, sites: &[HookSite], noticed_by: NoticedBy) -> Vec<HookedLibrary> {
        let mut by_path: BTreeMap<&PathBuf, Vec<&'static str>> = BTreeMap::new();
        for site in sites {
            by_path
                .entry(&site.path)
                .or_default()
                .push(site.function.name);
        }
        let hooked_at = Instant::now();
        by_path
            .into_iter()
            .map(|(path, functions)| HookedLibrary {
                pid,
                path: path.clone(),
                functions,
                hooked_at,
                noticed_by,
            })
            .collect()
    }
}

/// The kernel side of the watch (tracepoint, event ring, traced tgids) and
/// what userspace has already looked at.
pub struct LibraryWatch {
    kernel: KernelWatch,
    /// Executable files already looked up, per process.
    seen: HashSet<(u32, PathBuf)>,
    /// Processes whose mappings are to be read, from when, and why.
    rescans: HashMap<u32, (Instant, NoticedBy)>,
    noticed: Noticed,
    next_poll: Instant,
    /// When every initial probe was in place: time zero of the report.
    attached_at: Option<Instant>,
    /// The files hooked per process, by inode, whichever way.
    pub(in crate::attach) files: HookedFiles,
    /// Per process: whether its unwinder is probed, and the functions
    /// that can throw waiting for it.
    pub(in crate::attach) throwing: ThrowingReturns,
    open: OpenWatch,
    /// LOADER_HELD, until the watchdog takes it.
    pub(in crate::attach) loader_held: Option<std::os::fd::OwnedFd>,
}

/// The watch's maps: the ring of mmaps of executable files and execs
/// (EVENTS), and the processes watched (TRACED_TGIDS).
struct KernelWatch {
    events: RingBuf<MapData>,
    traced_tgids: KernelHashMap<MapData, u32, u32>,
}

/// What the watch noticed and has yet to hand out.
#[derive(Default)]
struct Noticed {
    /// Processes that replaced their image since the last `take_execs`.
    execs: Vec<u32>,
    /// CUDA contexts destroyed since the last `take_context_destroys`.
    context_destroys: Vec<RareEvent>,
}

/// Hooking at open (with uprobe_multi links): its thread, and how far it
/// got per process.
struct OpenWatch {
    /// The thread that hooks libraries at open.
    thread: Option<AtOpen>,
    /// Per process: the shared objects it opened (LOADS_OPENED), and how
    /// many of them the at-open thread has looked at.
    loads: KernelHashMap<MapData, u32, u64>,
    looked_at: LookedAt,
    /// Per process: since when its late hook waits for the at-open thread.
    behind_since: HashMap<u32, Instant>,
}

impl LibraryWatch {
    /// Stops watching `pid`, which exited (see `Probes::forget`).
    pub fn forget(&mut self, pid: u32) {
        let _ = self.kernel.traced_tgids.remove(&pid);
        self.seen.retain(|(seen_pid, _)| *seen_pid != pid);
        self.files.forget(pid);
        self.throwing.forget(pid);
        self.rescans.remove(&pid);
        self.open.behind_since.remove(&pid);
    }

    /// Attaches the mmap and exec tracepoints (adding their links to
    /// `links`) and takes the watch's maps out of `ebpf`. With `linkers`
    /// (uprobe_multi, and sessions if loaded), libraries are also hooked
    /// at open, by a thread of their own. Functions that can throw get
    /// their return probes only where the kernel's return instances can
    /// be walked (`walkable`).
    pub(in crate::attach) fn start(
        ebpf: &mut Ebpf,
        links: &mut Vec<TracepointLink>,
        linkers: Option<(Linker, Option<Linker>)>,
        forwarding: Forwarding,
        walkable: bool,
    ) -> Result<LibraryWatch> {
        links.push(attach_tracepoint(
            ebpf,
            tracer_ebpf::program::EXEC_MAPPED,
            "syscalls",
            "sys_enter_mmap",
        )?);
        links.push(attach_tracepoint(
            ebpf,
            tracer_ebpf::program::PROCESS_EXEC,
            "sched",
            "sched_process_exec",
        )?);
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("eBPF object lacks map {name}"))
        };
        let events = RingBuf::try_from(take(tracer_ebpf::map::EVENTS)?)?;
        let traced_tgids = KernelHashMap::try_from(take(tracer_ebpf::map::TRACED_TGIDS)?)?;
        let opened = RingBuf::try_from(take(tracer_ebpf::map::OPENED)?)?;
        let loads_opened = KernelHashMap::try_from(take(tracer_ebpf::map::LOADS_OPENED)?)?;
        let looked_at = LookedAt::default();
        let gate = LoaderGate::new(
            KernelHashMap::try_from(take(tracer_ebpf::map::LOADS_DONE)?)?,
            KernelHashMap::try_from(take(tracer_ebpf::map::LOADER_HELD)?)?,
            looked_at.clone(),
        );
        let files = HookedFiles::default();
        let throwing = ThrowingReturns::new(walkable);
        // For the watchdog (`Probes::load`).
        let loader_held = {
            use aya::maps::IterableMap as _;
            use std::os::fd::AsFd as _;
            gate.held.map().fd().as_fd().try_clone_to_owned()?
        };
        let at_open = match linkers {
            Some((multi, session)) => {
                for (program, event) in [
                    (tracer_ebpf::program::OPEN_ENTER, "sys_enter_openat"),
                    (tracer_ebpf::program::OPEN_EXIT, "sys_exit_openat"),
                ] {
                    links.push(attach_tracepoint(ebpf, program, "syscalls", event)?);
                }
                Some(AtOpen::start(
                    opened,
                    multi,
                    session,
                    files.clone(),
                    throwing.clone(),
                    Some(gate),
                    forwarding,
                )?)
            }
            None => None,
        };
        Ok(LibraryWatch {
            kernel: KernelWatch {
                events,
                traced_tgids,
            },
            seen: HashSet::new(),
            rescans: HashMap::new(),
            noticed: Noticed::default(),
            next_poll: Instant::now() + POLL_EVERY,
            attached_at: None,
            files,
            throwing,
            open: OpenWatch {
                thread: at_open,
                loads: loads_opened,
                looked_at,
                behind_since: HashMap::new(),
            },
            loader_held: Some(loader_held),
        })
    }

    /// Whether the late hook of `pid` is to wait for the at-open thread,
    /// which has not looked at every shared object `pid` opened: read
    /// after its mappings, so that each object mapped there and opened
    /// since attach is counted (its `openat` returned before its mmap).
    /// The at-open thread then hooks it (and the loader gate holds the
    /// process until it has): a late hook that claimed the file first
    /// would leave the process to run on before its probes are in place.
    /// After `BEHIND_AT_MOST`, it goes ahead, with a line in `notes`.
    fn behind_at_open(&mut self, pid: u32, notes: &mut Vec<String>) -> bool {
        if self.open.thread.is_none() {
            return false;
        }
        let opened = self.open.loads.get(&pid, 0).unwrap_or(0);
        if self.open.looked_at.of(pid) >= opened {
            self.open.behind_since.remove(&pid);
            return false;
        }
        let since = *self
            .open
            .behind_since
            .entry(pid)
            .or_insert_with(Instant::now);
        if since.elapsed() >= BEHIND_AT_MOST {
            self.open.behind_since.remove(&pid);
            notes.push(format!(
                "warning: PID {pid}: the at-open thread is {} ms behind the libraries it \
                 opened: those it maps are hooked as their mappings are noticed",
                since.elapsed().as_millis()
            ));
            return false;
        }
        true
    }

    /// Watches `pid`, whose executable files in `maps` are looked up already.
    pub fn trace(&mut self, pid: u32, maps: &[Mapping]) -> Result<()> {
        self.kernel
            .traced_tgids
            .insert(pid, 0, 0)
            .with_context(|| format!("could not watch PID {pid} for new libraries"))?;
        self.seen
            .extend(executable_paths(maps).into_iter().map(|path| (pid, path)));
        Ok(())
    }

    /// Reads the pending events; returns the processes whose mappings are
    /// due to be read now.
    fn due(&mut self, pids: &[u32]) -> Vec<(u32, NoticedBy)> {
        let now = Instant::now();
        while let Some(item) = self.kernel.events.next() {
            if item.len() < size_of::<RareEvent>() {
                continue;
            }
            // SAFETY: the kernel wrote an `RareEvent` (plain integers) there.
            let message: RareEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            if message.what == event::EXEC && pids.contains(&message.tgid) {
                self.noticed.execs.push(message.tgid);
                // Probes stay on the files already hooked (they are keyed by
                // file and process, and the process survives exec); the new
                // image's other files are looked up.
                self.rescans
                    .insert(message.tgid, (now + SETTLE, NoticedBy::MmapEvent));
            }
            if message.what == event::GPU_CONTEXT_DESTROYED {
                // Also of a target that exited since: its report says it.
                self.noticed.context_destroys.push(message);
            }
            if message.what == event::EXEC_MAPPED && pids.contains(&message.tgid) {
                self.rescans
                    .entry(message.tgid)
                    .or_insert((now + SETTLE, NoticedBy::MmapEvent));
            }
        }
        if now >= self.next_poll {
            self.next_poll = now + POLL_EVERY;
            for &pid in pids {
                self.rescans
                    .entry(pid)
                    .or_insert((now, NoticedBy::MapsPoll));
            }
        }
        let due: Vec<(u32, NoticedBy)> = self
            .rescans
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(&pid, &(_, noticed_by))| (pid, noticed_by))
            .collect();
        for (pid, _) in &due {
            self.rescans.remove(pid);
        }
        due
    }
}

impl Probes {
    /// The processes that replaced their image (execve) since the last
    /// call, as seen by the last `watch_libraries`. One whose new image
    /// no longer maps the unwinder probed before is no longer counted as
    /// probed.
    pub fn take_execs(&mut self) -> Vec<u32> {
        let execs = std::mem::take(&mut self.watch.noticed.execs);
        for &pid in &execs {
            let mapped: Vec<PathBuf> = procfs::read_maps(pid)
                .map(|maps| maps.into_iter().map(|mapping| mapping.path).collect())
                .unwrap_or_default();
            self.watch.throwing.after_exec(pid, &mapped);
        }
        execs
    }

    /// The CUDA context destructions (events with the process, the
    /// kernel's time and the context epoch that ended) since the last call,
    /// as seen by the last `watch_libraries`.
    pub fn take_context_destroys(&mut self) -> Vec<RareEvent> {
        std::mem::take(&mut self.watch.noticed.context_destroys)
    }

    /// Marks the end of the initial attach: libraries hooked later are
    /// reported with their delay after it.
    pub fn mark_attached(&mut self, attached_at: Instant) {
        self.watch.attached_at = Some(attached_at);
    }

    /// The hooked objects as the report lists them.
    pub fn library_reports(&self) -> Vec<LibraryReport> {
        self.hooked
            .libraries
            .iter()
            .map(|library| LibraryReport {
                pid: library.pid,
                path: library.path.display().to_string(),
                hooked_after_s: self.watch.attached_at.map_or(0.0, |attached_at| {
                    library
                        .hooked_at
                        .saturating_duration_since(attached_at)
                        .as_secs_f64()
                }),
                noticed_by: library.noticed_by,
                functions: library.functions.iter().map(|&f| f.to_owned()).collect(),
            })
            .collect()
    }

    /// Hooks the libraries the live targets `pids` mapped since the last
    /// call. Call every [`DRAIN_EVERY`]. Returns lines for stderr: what was
    /// hooked, and the libraries that could not be (tracing goes on).
    pub fn watch_libraries(&mut self, pids: &[u32]) -> Vec<String> {
        let mut notes = Vec::new();
        let news = self
            .watch
            .open
            .thread
            .as_ref()
            .map(AtOpen::take)
            .unwrap_or_default();
        for news in news {
            match news {
                AtOpenNews::Hooked(hooked) => notes.extend(self.adopt_opened(hooked)),
                AtOpenNews::Failed { pid, path, error } => notes.push(format!(
                    "warning: PID {pid}: could not hook {} at open ({error}): it is hooked \
                     when its mapping is noticed",
                    path.display()
                )),
                AtOpenNews::Note(note) => notes.push(note),
                AtOpenNews::Paused {
                    pid,
                    held,
                    by_bound,
                } => {
                    self.gate.pauses.push((pid, held));
                    if by_bound {
                        notes.push(format!(
                            "warning: PID {pid} was let go on at the loader gate after {} ms \
                             (the bound) before the libraries it opened were all hooked: \
                             their first calls may be missed",
                            held.as_millis()
                        ));
                    }
                }
            }
        }
        for (pid, noticed_by) in self.watch.due(pids) {
            if let Err(error) = self.hook_new_libraries(pid, noticed_by, &mut notes) {
                notes.push(format!("warning: PID {pid}: {error:#}"));
            }
        }
        notes
    }

    /// Hooks the objects `pid` maps that are not hooked yet, now (a
    /// spawned command stopped by the loader gate). Returns lines for
    /// stderr, as `watch_libraries` does.
    pub fn hook_mapped_now(&mut self, pid: u32) -> Vec<String> {
        let mut notes = Vec::new();
        // A file the at-open thread claimed may still be getting its
        // probes: they are in place before the command goes on.
        while self.watch.behind_at_open(pid, &mut notes) {
            std::thread::sleep(BEHIND_RETRY);
        }
        if let Err(error) = self.hook_new_libraries(pid, NoticedBy::LoaderStop, &mut notes) {
            notes.push(format!("warning: PID {pid}: {error:#}"));
        }
        notes
    }

    /// Waits (at most 200 ms) for the libraries being hooked at open, so
    /// that the last `watch_libraries` reports them.
    pub fn settle_at_open(&self) {
        if let Some(at_open) = &self.watch.open.thread {
            at_open.settle();
        }
    }

    /// Whether libraries are hooked at open (and a process can be held at
    /// the loader gate until they are).
    pub fn hooks_at_open(&self) -> bool {
        self.watch.open.thread.is_some()
    }

    /// Takes in the probes the at-open thread attached; returns the lines
    /// for stderr.
    fn adopt_opened(&mut self, hooked: OpenedHook) -> Vec<String> {
        let OpenedHook {
            pid,
            path,
            sites,
            released,
            unprobed,
            links,
            hooked_at,
            after_open,
        } = hooked;
        self.hooked
            .unprobed
            .extend(unprobed.into_iter().map(|unprobed| (pid, unprobed)));
        for (kind, link, probe_count) in links {
            let programs = match kind {
                LinkKind::Multi => self.links.multi.as_mut(),
                LinkKind::Session => self.links.session.as_mut(),
            };
            // The at-open thread only runs with the programs it links.
            programs
                .expect("the at-open thread links loaded programs")
                .adopt(pid, link, probe_count);
        }
        self.add_hooks(pid, &sites, NoticedBy::AtOpen, hooked_at);
        self.add_hooks(pid, &released, NoticedBy::AtOpen, hooked_at);
        let mut notes = Vec::new();
        // A file whose every function waits for the unwinder: said by the
        // warning.
        if !sites.is_empty() {
            notes.push(format!(
                "hooked {} functions in {} (PID {pid}, at open: {} µs after its openat \
                 returned)",
                sites.len(),
                path.display(),
                after_open.as_micros()
            ));
        }
        if !released.is_empty() {
            notes.push(released_note(pid, &released));
        }
        notes
    }

    fn hook_new_libraries(
        &mut self,
        pid: u32,
        noticed_by: NoticedBy,
        notes: &mut Vec<String>,
    ) -> Result<()> {
        // A process that is gone has nothing more to hook.
        let Ok(maps) = procfs::read_maps(pid) else {
            return Ok(());
        };
        // A process tracer stopped (spawn mode) waits for this hook; others
        // leave what they opened to the at-open thread.
        if noticed_by != NoticedBy::LoaderStop && self.watch.behind_at_open(pid, notes) {
            self.watch
                .rescans
                .insert(pid, (Instant::now() + BEHIND_RETRY, noticed_by));
            return Ok(());
        }
        let new_paths: Vec<PathBuf> = executable_paths(&maps)
            .into_iter()
            .filter(|path| self.watch.seen.insert((pid, path.clone())))
            .collect();
        if new_paths.is_empty() {
            return Ok(());
        }
        if self.walks_tables_of(pid) {
            let lacking = crate::unwind::frame_pointers::objects_lacking(
                pid,
                maps.iter()
                    .filter(|mapping| new_paths.contains(&mapping.path)),
            );
            if !lacking.is_empty() {
                notes.push(format!(
                    "PID {pid} mapped {} without frame pointers: its frames are walked \
                     through unwind tables (--unwind auto)",
                    lacking.join(", ")
                ));
                self.name_lacking(pid, lacking);
            }
            self.refresh_unwinding(pid, &maps)?;
        } else if self.modes.unwinding.uses_tables() && !self.copies_stacks_of(pid) {
            let lacking = crate::unwind::frame_pointers::objects_lacking(
                pid,
                maps.iter()
                    .filter(|mapping| new_paths.contains(&mapping.path)),
            );
            if !lacking.is_empty() {
                notes.push(format!(
                    "PID {pid} mapped {} without frame pointers: its stacks are copied \
                     and unwound with DWARF from now on (--unwind auto)",
                    lacking.join(", ")
                ));
                self.start_copying(pid, lacking)?;
            }
        }
        let found = hook_sites_in(pid, &new_paths, self.forwarding())?;
        for unprobed in found.unprobed {
            notes.push(format!(
                "{} in {} (PID {pid}): {}",
                unprobed.name,
                unprobed.path.display(),
                unprobed.why
            ));
            self.hooked.unprobed.push((pid, unprobed));
        }
        let before = self.hooked.libraries.len();
        let held_back = self.attach_sites(pid, &found.sites, noticed_by)?;
        notes.extend(held_back);
        for library in &self.hooked.libraries[before..] {
            notes.push(format!(
                "hooked {} functions in {} (PID {pid}, mapped after attach, noticed by {})",
                library.functions.len(),
                library.path.display(),
                noticed_by.as_str()
            ));
        }
        Ok(())
    }
}
