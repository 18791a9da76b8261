//! The Collector: a source of events (`Collector::next`), like py-spy's
//! Sampler. Every interval it snapshots the kernel's per-stack totals and
//! counters; it watches the targets (exits, execs, forks), hooks the
//! libraries they load, drains the mapping calls and stack copies, and
//! stops on --duration, Ctrl-C, SIGTERM or when every target has exited.
//! What to do with each event (a recording, a status line, a screen, a
//! plot) is the verb's business.
//!
//! It owns what collection builds per process: the stacks unwound from
//! copies (`copied`), the mapping ledger (`mappings`), and the symbolized
//! frames of every stack shown so far, read and symbolized once.
//!
//! Reading BY_STACK costs one syscall pair per stack, never per allocation,
//! so tracer's own cost does not grow with the target's allocation rate.
mod comms;
mod contexts;
mod copied;
mod copy_reader;
mod cost;
mod counters;
mod events;
mod facts;
mod follow;
mod frames;
mod huge_pages;
mod kernel_stacks;
mod live;
mod mappings;
mod runtimes;
mod stack_table;
mod targets;

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::{
    attach::{
        Probes, Rings,
        spawn::{self, ChildState},
    },
    model::{Snapshot, StackKey, Target, run::LibraryReport},
    procfs,
    symbolize::Symbols,
};
pub use comms::CommWatch;
use copied::CopiedStacks;
pub use events::{catch_signals_during_attach, runtime, wait_for_stop};
use kernel_stacks::KernelStacks;
pub use live::LiveBlocks;
use mappings::MappingTracker;
use stack_table::StackTable;
pub use targets::{Watched, live_pids};

/// Exited targets kept in the list (`--comm`) for the report's targets.
const MAX_EXITED_KEPT: usize = 64;
/// How often targets are checked for exit.
const LIVENESS_EVERY: Duration = Duration::from_millis(100);
/// How often the mapping events are drained: often enough that the 1 MiB
/// ring buffer holds a burst (~12 k calls) between two drains.
const MAPPING_DRAIN_EVERY: Duration = Duration::from_millis(20);
/// How often the stack copies unwound by their reader thread are applied
/// (`--unwind copy`); the thread itself empties the ring every 5 ms, and
/// at once when a quarter of it is full.
pub const COPIES_DRAIN_EVERY: Duration = Duration::from_millis(5);

/// Why collection stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Duration,
    Interrupted,
    Terminated,
    TargetsExited,
}

/// What the collector saw.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The counters of every stack now. The last one comes right before
    /// `Stopped`.
    Snapshot(Snapshot),
    /// A target exited.
    TargetExited { pid: u32, after_s: f64 },
    /// A target replaced its image (execve): what the old one held is gone.
    Exec {
        pid: u32,
        /// The new image's executable.
        executable: String,
        after_s: f64,
    },
    /// A target destroyed or reset a CUDA context, releasing what it owned.
    ContextDestroyed { pid: u32, after_s: f64 },
    /// Objects hooked after attach (libraries mapped later).
    LibrariesHooked(Vec<LibraryReport>),
    /// A child of a followed target is traced from now on.
    ChildFollowed {
        pid: u32,
        command: String,
        after_s: f64,
    },
    /// A line worth showing on stderr: a library hooked, a warning.
    Notice(String),
    /// A line for `-v`: an unwind table built.
    Detail(String),
    /// Collection is over: nothing follows.
    Stopped(StopReason),
}

pub use crate::config::Schedule;

/// Probes in place on the targets, and what collection builds from them:
/// the processes watched, what is known of their stacks, the mappings and
/// Python state read alongside, the pace of the event loop and the cost.
pub struct Collector {
    probes: Probes,
    watching: Watching,
    stacks: Stacks,
    mappings: MappingTracker,
    /// The language runtimes (`crate::runtimes`): Python frames
    /// (`--python`).
    runtimes: crate::runtimes::Runtimes,
    pace: Pace,
    /// What tracer costs the targets.
    cost: cost::CostMeter,
    /// `--resident`: the largest sampling shift of page faults so far.
    fault_sample_shift_max: u32,
}

/// The processes traced.
struct Watching {
    processes: Vec<Watched>,
    /// `--comm`: the command names followed; processes that exit are then
    /// forgotten, and collection goes on while none is alive.
    comms: Option<CommWatch>,
}

/// What is known of the stacks: their ids in the kernel's tables and
/// those tables' eviction, the copies unwound here, and their symbolized
/// frames.
struct Stacks {
    kernel: KernelStacks,
    /// What the kernel's stack tables hold, and their eviction.
    table: StackTable,
    /// BY_STACK as the last snapshot read it, for its eviction round.
    by_stack: Vec<(tracer_ebpf::ByStackKey, tracer_ebpf::StackTotals)>,
    copied: CopiedStacks,
    symbols: Symbols,
    /// The frames of the stacks symbolized so far, each distinct frame
    /// kept once (`frames::Interned`): a stack costs 8 bytes a frame.
    frames: frames::Interned,
    /// The CUDA function that made each GPU stack's memory.
    apis: HashMap<StackKey, &'static str>,
    /// Whether each outermost return address seen is a thread's start, by
    /// process: stacks share them, and there may be 10^5 stacks.
    thread_entries: HashMap<(u32, u64), bool>,
}

/// When the event loop snapshots and stops, and the events it has yet to
/// hand out.
struct Pace {
    schedule: Schedule,
    /// When every probe was in place: time zero of every series.
    attached_at: Instant,
    clock: Option<events::Clock>,
    queued: VecDeque<Event>,
    stopped: Option<StopReason>,
}

impl Collector {
    /// A collector of what `probes` will see; targets are added with
    /// `add_target`, and time starts at `start`.
    pub fn new(probes: Probes, rings: Rings, schedule: Schedule) -> Result<Collector> {
        crate::runtimes::register();
        let mut copied = CopiedStacks::new(
            rings.stack_copies,
            [rings.copy_frees, rings.copy_frees_made],
        );
        if probes.copies_any_stacks() {
            copied.activate()?;
        }
        let table = StackTable::new(probes.stack_capacity());
        let resident = probes.resident_pages().is_some();
        Ok(Collector {
            probes,
            watching: Watching {
                processes: Vec::new(),
                comms: None,
            },
            stacks: Stacks {
                kernel: KernelStacks::default(),
                table,
                by_stack: Vec::new(),
                copied,
                symbols: Symbols::new(crate::runtimes::jit_names()),
                frames: frames::Interned::default(),
                apis: HashMap::new(),
                thread_entries: HashMap::new(),
            },
            mappings: MappingTracker::new(rings.mapping_events, resident),
            runtimes: crate::runtimes::Runtimes::new(crate::config::PythonOptions::default()),
            pace: Pace {
                schedule,
                attached_at: Instant::now(),
                clock: None,
                queued: VecDeque::new(),
                stopped: None,
            },
            cost: cost::CostMeter::default(),
            fault_sample_shift_max: 0,
        })
    }

    /// Directories searched for separate debug files before
    /// /usr/lib/debug (`--debug-dir`); set before the first target.
    pub fn set_debug_dirs(&mut self, debug_dirs: Vec<std::path::PathBuf>) {
        self.stacks.symbols.set_debug_dirs(debug_dirs);
    }

    /// Puts the probes in place on `pid` (started by tracer if `spawned`)
    /// and follows its mapping calls from now on.
    pub fn add_target(&mut self, pid: u32, spawned: bool) -> Result<()> {
        self.trace(pid)?;
        if !spawned {
            self.probes.hold_at_loader(pid)?;
        }
        if self.pace.schedule.follow_forks {
            self.probes.follow(pid)?;
        }
        self.watching.processes.push(Watched::new(pid, spawned));
        Ok(())
    }

    fn trace(&mut self, pid: u32) -> Result<()> {
        let finding = std::time::Instant::now();
        self.detect_runtimes(pid)?;
        self.probes.add_python_time(finding.elapsed());
        self.probes.attach_functions(pid)?;
        self.probes.follow_events(pid)?;
        self.mappings.start(pid);
        self.stacks.symbols.refresh(pid);
        self.attach_runtimes(pid, crate::model::run::NoticedBy::Attach);
        Ok(())
    }

    /// `--comm`: announces the processes started from now on with a
    /// matching name (attached by the liveness timer) and returns those
    /// running now, for `add_target`.
    pub fn watch_comms(&mut self, targets: &crate::config::CommTargets) -> Result<Vec<u32>> {
        let watch = CommWatch::new(targets)?;
        self.probes
            .watch_execs(&targets.names, !targets.patterns.is_empty())?;
        let running = watch.running();
        self.watching.comms = Some(watch);
        Ok(running)
    }

    /// Whether processes that exit are forgotten (`--comm`): their stacks
    /// leave the snapshots, and the model should drop them too.
    pub fn forgets_exited(&self) -> bool {
        self.watching.comms.is_some()
    }

    /// Marks the end of the initial attach: time zero of the window.
    pub fn start(&mut self) -> Instant {
        self.pace.attached_at = Instant::now();
        self.probes.mark_attached(self.pace.attached_at);
        // A STATS read that fails now fails the first snapshot, which says so.
        let stats = self.probes.maps().stats().unwrap_or_default();
        self.observe_cost(stats);
        self.pace.attached_at
    }

    pub fn attached_at(&self) -> Instant {
        self.pace.attached_at
    }

    pub fn probes(&self) -> &Probes {
        &self.probes
    }

    pub fn probes_mut(&mut self) -> &mut Probes {
        &mut self.probes
    }

    pub fn watched(&self) -> &[Watched] {
        &self.watching.processes
    }

    pub fn targets(&self) -> Vec<Target> {
        self.watching
            .processes
            .iter()
            .map(|w| w.target.clone())
            .collect()
    }

    fn elapsed_s(&self) -> f64 {
        self.pace.attached_at.elapsed().as_secs_f64()
    }

    /// Hooks the libraries mapped since the last call, then marks the
    /// execs and CUDA context destructions the watch saw.
    fn watch_libraries(&mut self) -> Result<()> {
        let hooked_before = self.probes.library_reports().len();
        for note in self
            .probes
            .watch_libraries(&live_pids(&self.watching.processes))
        {
            self.pace.queued.push_back(Event::Notice(note));
        }
        for detail in self.probes.poll_unwind_tables()? {
            self.pace.queued.push_back(Event::Detail(detail));
        }
        for note in self.probes.take_lacking_checks(false) {
            self.pace.queued.push_back(Event::Notice(note));
        }
        let hooked = self.probes.library_reports();
        if hooked.len() > hooked_before {
            self.pace
                .queued
                .push_back(Event::LibrariesHooked(hooked[hooked_before..].to_vec()));
        }
        let after_s = self.elapsed_s();
        for pid in self.probes.take_execs() {
            let executable = self.mark_exec(pid, after_s);
            self.probes.remap_unwinding(pid)?;
            self.stacks.symbols.refresh(pid);
            self.runtimes_after_exec(pid, crate::model::run::NoticedBy::MmapEvent);
            self.pace.queued.push_back(Event::Exec {
                pid,
                executable,
                after_s,
            });
        }
        for destroyed in self.probes.take_context_destroys() {
            let Some(watched) = self
                .watching
                .processes
                .iter_mut()
                .position(|watched| watched.target.pid == destroyed.tgid)
            else {
                continue;
            };
            // With the blocks of copied stacks, every copy sent before the
            // destruction drained first.
            let entries = self.epoch_entries()?;
            let marked = contexts::mark_destroyed(
                &entries,
                &destroyed,
                self.pace.attached_at,
                &mut self.watching.processes[watched].target,
            );
            self.pace.queued.push_back(Event::ContextDestroyed {
                pid: destroyed.tgid,
                after_s: marked.after_s,
            });
        }
        Ok(())
    }

    /// Marks the spawned target `pid` as stopped by the loader gate
    /// whenever its loader mapped new objects (see `attach::spawn`).
    pub fn gate(&mut self, pid: u32) {
        if let Some(watched) = self
            .watching
            .processes
            .iter_mut()
            .find(|w| w.target.pid == pid)
        {
            watched.gated = true;
        }
    }

    /// The spawned targets: those the loader gate stopped get the objects
    /// just mapped hooked, before any of their constructors run, and go
    /// on; those that exited are reaped (their exit is noted by
    /// `watch_targets`).
    fn poll_spawned(&mut self) -> Result<()> {
        for index in 0..self.watching.processes.len() {
            let watched = &mut self.watching.processes[index];
            if !watched.spawned || watched.exit.is_some() {
                continue;
            }
            let pid = watched.target.pid;
            match spawn::poll(pid) {
                ChildState::Exited(status) => watched.exit = Some(status),
                ChildState::Stopped(libc::SIGSTOP) if watched.gated => {
                    // An exec since the last drain is marked first, and the
                    // copies taken before the new objects are unwound first.
                    self.watch_libraries()?;
                    self.stacks.copied.remap(pid);
                    // The mapping calls made so far are applied; the break
                    // is read again (a new image starts a new one).
                    self.drain_mappings()?;
                    self.mappings.start(pid);
                    let hooked_before = self.probes.library_reports().len();
                    for note in self.probes.hook_mapped_now(pid) {
                        self.pace.queued.push_back(Event::Notice(note));
                    }
                    let hooked = self.probes.library_reports();
                    if hooked.len() > hooked_before {
                        self.pace
                            .queued
                            .push_back(Event::LibrariesHooked(hooked[hooked_before..].to_vec()));
                    }
                    self.stacks.symbols.refresh(pid);
                    self.runtimes_after_exec(pid, crate::model::run::NoticedBy::LoaderStop);
                    spawn::resume(pid);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Notes that `pid` replaced its image: marks the boundary in its
    /// target. What the old image held is gone already: the kernel zeroed
    /// the live totals of its stacks at the exec, before the new image ran,
    /// and ignores frees of its blocks; the copied stacks' blocks go when
    /// the exec's record is read from their ring, after the old image's
    /// last. Returns the new image's executable.
    fn mark_exec(&mut self, pid: u32, after_s: f64) -> String {
        if let Some(watched) = self
            .watching
            .processes
            .iter_mut()
            .find(|w| w.target.pid == pid)
        {
            watched.target.execs_after_s.push(after_s);
            watched.target.command = procfs::command_line(pid);
        }
        std::fs::read_link(format!("/proc/{pid}/exe")).map_or_else(
            |_| "a new image".to_owned(),
            |path| path.display().to_string(),
        )
    }

    fn notice(&mut self, line: String) {
        self.pace.queued.push_back(Event::Notice(line));
    }

    /// The objects hooked so far, as the report lists them.
    pub fn library_reports(&self) -> Vec<LibraryReport> {
        self.probes.library_reports()
    }
}
