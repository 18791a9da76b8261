//! Loads the eBPF programs and attaches them to the target processes: one
//! uprobe (and one uretprobe where the result is needed) per allocator
//! function, in whichever mapped object defines it, scoped to the target's
//! PID so other processes pay nothing. Libraries mapped later (dlopen) are
//! noticed and hooked by `libraries`.
//!
//! The mapping system calls (mmap, munmap, mremap, brk, mprotect) are
//! followed by tracepoints (`mappings`), filtered in the kernel to the
//! targets.
//!
//! When calls may go unrecorded (sampling, size filters) and the kernel
//! has uprobe sessions, the entry and return programs of a function are one
//! session program (`session`), so an unrecorded call skips its return.
//!
//! Long: Probes and its parts, and the first attach's sequence; the
//! event-source seam (issue 46) splits it by source.
pub mod cost;
pub mod kernel_maps;
pub mod libraries;
pub mod load;
mod reports;
pub mod safety;
pub mod sites;
pub mod sources;
pub mod spawn;
pub mod unwinding;

use std::{num::NonZeroU32, time::Instant};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};

pub use crate::config::MapSizes;
use crate::config::{FloorSites, Sampling};
pub use crate::model::run::ReturnProbes;
use crate::{
    config::Unwinding,
    error::{ExitCode, fatal},
    procfs,
    unwind::UnwindMode,
};
pub use kernel_maps::KernelMaps;
pub use kernel_maps::stacks::StackMaps;
use libraries::{HookedLibrary, LibraryWatch, NoticedBy};
use load::links::TracepointLink;
pub use load::preflight::{KernelFeatures, check_kernel, check_privileges, check_target};
use load::raw::RawPrograms;
pub use load::{AttachTimes, Rings};
use load::{load_error, program};
use sites::forwarding::Forwarding;
pub use sites::symbols::HookSite;
use sites::symbols::{FoundSites, Unprobed};

/// The benchmark's empty programs.
const FLOOR_ENTRY_PROGRAM: &str = tracer_ebpf::program::FLOOR_ENTER;
const FLOOR_RETURN_PROGRAM: &str = tracer_ebpf::program::FLOOR_RETURN;

/// How the uprobes are attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeLinks {
    /// One uprobe_multi link per program and file: attached and released
    /// at once.
    Multi,
    /// One perf-event uprobe per probe (the reason uprobe_multi links
    /// could not be had): each costs ~110 ms to release on a VM.
    PerProbe(String),
}

/// Probes of one program in one file, attached together.
struct Batch<'a> {
    program: &'static str,
    site: &'a HookSite,
    /// (file offset, attach cookie) of each probe.
    points: Vec<(u64, u64)>,
}

/// Adds a probe of `program` at `offset` of `site`'s file to its batch.
fn add_to_batch<'a>(
    batches: &mut Vec<Batch<'a>>,
    program: &'static str,
    site: &'a HookSite,
    offset: u64,
    cookie: u64,
) {
    match batches
        .iter_mut()
        .find(|batch| batch.program == program && batch.site.file == site.file)
    {
        Some(batch) => batch.points.push((offset, cookie)),
        None => batches.push(Batch {
            program,
            site,
            points: vec![(offset, cookie)],
        }),
    }
}

/// When a batch is attached: return probes first, so that a call whose
/// entry is seen always has its return seen too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Return,
    /// Session programs: entry and return in one.
    Session,
    Entry,
}

/// The batches of `sites` in the order they are attached; a function
/// whose entry program `in_session` covers gets one session batch.
fn batches<'a>(
    sites: &'a [HookSite],
    in_session: impl Fn(&str) -> bool,
) -> Vec<(Stage, Batch<'a>)> {
    let mut returns = Vec::new();
    let mut sessions = Vec::new();
    let mut entries = Vec::new();
    for site in sites {
        let function = &site.function;
        if let Some(entry_program) = function.entry_program
            && in_session(entry_program)
        {
            add_to_batch(
                &mut sessions,
                entry_program,
                site,
                site.offset,
                function.cookie,
            );
            continue;
        }
        if let Some(return_program) = function.return_program {
            add_to_batch(&mut returns, return_program, site, site.offset, 0);
        }
        if let Some(entry_program) = function.entry_program {
            add_to_batch(
                &mut entries,
                entry_program,
                site,
                site.offset,
                function.cookie,
            );
        }
    }
    let staged = |stage, batches: Vec<Batch<'a>>| batches.into_iter().map(move |b| (stage, b));
    staged(Stage::Return, returns)
        .chain(staged(Stage::Session, sessions))
        .chain(staged(Stage::Entry, entries))
        .collect()
}

/// A hook that is in place: where, and in which process.
#[derive(Clone, Debug)]
pub struct AttachedHook {
    pub pid: u32,
    pub site: HookSite,
}

/// The loaded eBPF object, its programs and maps, and everything attached
/// from it: the hooks and the links that hold them, the modes they were
/// loaded for, the unwinding state, what attaching cost, the loader gate
/// and the exception fixer.
pub struct Probes {
    ebpf: Ebpf,
    hooked: Hooked,
    modes: Modes,
    unwind: UnwindState,
    links: Links,
    watch: LibraryWatch,
    measured: Measured,
    gate: LoaderGate,
    /// Puts back the return addresses of frames an exception unwinds
    /// through (`exceptions`); none where the kernel's layout is unknown.
    exceptions: Option<safety::exceptions::ExceptionFixer>,
    /// Outlives tracer (`watchdog.rs`): dropped last.
    _watchdog: Option<safety::watchdog::Watchdog>,
}

/// What was hooked.
#[derive(Default)]
struct Hooked {
    hooks: Vec<AttachedHook>,
    /// Hooked functions found but not probed: they pass their calls on
    /// to another hooked function (`forwarding`), by process.
    unprobed: Vec<(u32, Unprobed)>,
    /// The objects hooks were put in, and when.
    libraries: Vec<HookedLibrary>,
}

/// What the programs were loaded for.
struct Modes {
    return_probes: ReturnProbes,
    /// What is recorded.
    sampling: Sampling,
    /// How stacks are taken.
    unwinding: Unwinding,
}

/// How each process's stacks are unwound, and the kernel's tables.
#[derive(Default)]
struct UnwindState {
    /// `--unwind auto`: the processes whose stacks are copied and unwound
    /// here, and the objects without frame pointers that made it so.
    copying_stacks_of: Vec<(u32, Vec<String>)>,
    /// `--unwind auto`, `dwarf`: the processes whose stacks the kernel
    /// walks through unwind tables, and their objects without frame
    /// pointers (glibc's aside).
    walking_tables_of: Vec<(u32, Vec<String>)>,
    /// The checks for objects without frame pointers still running, by
    /// process (`take_lacking_checks`).
    lacking_checks: Vec<(u32, std::thread::JoinHandle<Vec<String>>)>,
    /// Processes whose check had not finished at stop (walked through
    /// tables, their objects without frame pointers not named).
    lacking_unnamed: Vec<u32>,
    /// `--unwind auto`, `dwarf`: the kernel's unwind tables.
    kernel: Option<unwinding::tables::KernelUnwinding>,
}

/// The links that hold the probes.
struct Links {
    /// How the uprobes are attached.
    how: ProbeLinks,
    /// Perf-event uprobes, where uprobe_multi links are not to be had.
    perf: Vec<(u32, &'static str, UProbeLinkId)>,
    /// Every tracepoint attached (signals, library watch, mapping calls,
    /// forks).
    tracepoints: Vec<TracepointLink>,
    /// The mapping system calls' tracepoints among them.
    mapping_tracepoints: usize,
    /// Every uprobe program, for uprobe_multi links (Linux 6.6+).
    multi: Option<RawPrograms>,
    /// The session programs, when calls may go unrecorded (Linux 6.13+).
    session: Option<RawPrograms>,
}

/// What attaching and probing cost.
struct Measured {
    /// Where the attach time went.
    times: AttachTimes,
    /// What a trap costs here (`measure_traps`).
    traps: cost::traps::TrapMeasurement,
}

/// The loader gate: whether a process whose dlopen() completes before its
/// new libraries are hooked is held there (`--no-loader-pause`: not), and
/// each time one was: which, how long.
struct LoaderGate {
    pause: bool,
    pauses: Vec<(u32, std::time::Duration)>,
}

impl Probes {
    /// Which functions that pass their calls on go without a probe: with
    /// frame-pointer walks, only those that tail-jump (`forwarding`).
    fn forwarding(&self) -> Forwarding {
        Forwarding::for_unwinding(self.modes.unwinding.mode)
    }

    /// Attaches the allocator and CUDA probes to every object `pid` maps
    /// that defines such functions, and watches it for libraries mapped
    /// later.
    pub fn attach_allocators(&mut self, pid: u32) -> Result<usize> {
        let reading = Instant::now();
        let forwarding = self.forwarding();
        let (maps, found) = allocator_sites(pid, forwarding)?;
        let ahead = libraries::ahead::candidates(pid, &maps);
        let ahead_found = if ahead.is_empty() {
            FoundSites::default()
        } else {
            sites::symbols::hook_sites_in(pid, &ahead, forwarding)?
        };
        let (sites, ahead_sites) = (found.sites, ahead_found.sites);
        self.hooked.unprobed.extend(
            found
                .unprobed
                .into_iter()
                .chain(ahead_found.unprobed)
                .map(|unprobed| (pid, unprobed)),
        );
        self.measured.times.symbols += reading.elapsed();
        if !sites
            .iter()
            .any(|site| site.function.name == "malloc" || site.function.name == "free")
        {
            // A Go program, or a static one with its own allocator: what it
            // maps is still followed (Go's heap arenas are mmap'd).
            eprintln!(
                "tracer: note: PID {pid} ({}) maps no object that defines malloc or free \
                 (a Go program, or a static binary with its own allocator): only its \
                 mappings (mmap, munmap, brk) are traced",
                procfs::command_line(pid)
            );
        }
        let choosing = Instant::now();
        self.choose_unwinding(pid, &maps)?;
        self.measured.times.unwinding += choosing.elapsed();
        self.follow_go_stack_switch(pid, &maps)?;
        let before = self.probe_count();
        self.watch.trace(pid, &maps)?;
        // Functions that can throw wait for the unwinder (`held_back`):
        // said once per process.
        let mut notes = self.attach_sites(pid, &sites, NoticedBy::Attach)?;
        // The CUDA and allocator libraries `pid` could load but has not
        // mapped, so that their first call after a dlopen is seen.
        notes.extend(self.attach_sites(pid, &ahead_sites, NoticedBy::Ahead)?);
        for note in notes {
            eprintln!("tracer: {note}");
        }
        Ok(self.probe_count() - before)
    }

    /// Puts the loader gate on `pid` (a running process, not one tracer
    /// spawned, which has its own gate): its dlopen()s do not return
    /// before the libraries they opened are hooked (within a bound). Not
    /// for a static executable, nor without at-open hooks or with
    /// `--no-loader-pause`.
    pub fn hold_at_loader(&mut self, pid: u32) -> Result<()> {
        if !self.gate.pause || !self.hooks_at_open() {
            return Ok(());
        }
        let Some(gate) = spawn::running_loader_gate(pid) else {
            return Ok(());
        };
        if gate.cookie == 0 {
            return Ok(());
        }
        let multi = self
            .links
            .multi
            .as_mut()
            .expect("at-open hooks have uprobe_multi");
        multi
            .attach(
                tracer_ebpf::program::LOADER_GATE,
                &gate.file,
                &[(gate.offset, gate.cookie)],
                pid,
            )
            .map_err(|error| attach_error(error, pid))
    }

    /// The pauses at the loader gate: how many, and their time in all.
    pub fn loader_pause_total(&self) -> (usize, std::time::Duration) {
        (
            self.gate.pauses.len(),
            self.gate.pauses.iter().map(|(_, held)| *held).sum(),
        )
    }

    /// A Go program that calls C (cgo): tells the kernel how its
    /// asmcgocall switches stacks, so that a copy of a C stack holds the
    /// goroutine's too (used only when its stacks are copied).
    fn follow_go_stack_switch(&mut self, pid: u32, maps: &[procfs::Mapping]) -> Result<()> {
        let Some(switch) = crate::unwind::stack_switch(pid, maps) else {
            return Ok(());
        };
        let mut switches: aya::maps::HashMap<_, u32, tracer_ebpf::GoStackSwitch> =
            aya::maps::HashMap::try_from(
                self.ebpf
                    .map_mut(tracer_ebpf::map::GO_STACK_SWITCHES)
                    .context("eBPF object lacks GO_STACK_SWITCHES")?,
            )?;
        switches
            .insert(pid, switch, 0)
            .with_context(|| format!("could not set the Go stack switch of PID {pid}"))
    }

    /// `--unwind auto`: copies the stacks of `pid` from now on when one of
    /// its objects in `lacking` has no frame pointers (none: nothing to do).
    pub(crate) fn start_copying(&mut self, pid: u32, lacking: Vec<String>) -> Result<()> {
        if lacking.is_empty() || self.copies_stacks_of(pid) {
            return Ok(());
        }
        let mut copy_stacks_of: aya::maps::HashMap<_, u32, u32> = aya::maps::HashMap::try_from(
            self.ebpf
                .map_mut(tracer_ebpf::map::COPY_STACKS_OF)
                .context("eBPF object lacks COPY_STACKS_OF")?,
        )?;
        copy_stacks_of
            .insert(pid, 1, 0)
            .with_context(|| format!("could not ask for the stacks of PID {pid} to be copied"))?;
        self.unwind.copying_stacks_of.push((pid, lacking));
        Ok(())
    }

    /// Whether the stacks of `pid` are copied and unwound with DWARF.
    pub fn copies_stacks_of(&self, pid: u32) -> bool {
        match self.modes.unwinding.mode {
            UnwindMode::FramePointers => false,
            UnwindMode::Copy => true,
            UnwindMode::Dwarf | UnwindMode::Auto => self
                .unwind
                .copying_stacks_of
                .iter()
                .any(|(copied, _)| *copied == pid),
        }
    }

    /// Attaches the probes of `sites`, as `attach_claimed` does. A file
    /// already hooked for `pid` (at open, ahead) is left as it is: a
    /// second probe on it would count every call twice. A function that
    /// can throw waits for `pid`'s unwinder (`held_back`); a batch that
    /// probes the unwinder attaches what waited, after its own. Returns
    /// lines for stderr.
    pub fn attach_sites(
        &mut self,
        pid: u32,
        sites: &[HookSite],
        noticed_by: NoticedBy,
    ) -> Result<Vec<String>> {
        let claimed = self.watch.files.claim_sites(pid, sites);
        let admitted = self.watch.throwing.admit(pid, claimed);
        if let Err(error) = self.attach_claimed(pid, &admitted.now, noticed_by) {
            self.watch.throwing.undo(pid, &admitted);
            return Err(error);
        }
        let mut notes: Vec<String> = admitted.warning.iter().cloned().collect();
        if !admitted.released.is_empty() {
            match self.attach_claimed(pid, &admitted.released, noticed_by) {
                Ok(()) => notes.push(safety::held_back::released_note(pid, &admitted.released)),
                Err(error) => {
                    self.watch.throwing.hold_again(pid, &admitted.released);
                    notes.push(format!(
                        "warning: PID {pid}: the functions that waited for the unwinder \
                         could not be probed: {error:#}"
                    ));
                }
            }
        }
        Ok(notes)
    }

    /// Attaches the probes of `sites`, whose files are claimed for `pid`,
    /// return probes first, so that a call whose entry is seen always has
    /// its return seen too. With uprobe sessions, a session program is
    /// both.
    fn attach_claimed(
        &mut self,
        pid: u32,
        sites: &[HookSite],
        noticed_by: NoticedBy,
    ) -> Result<()> {
        if sites.is_empty() {
            return Ok(());
        }
        let session = self.links.session.as_ref();
        let ordered = batches(sites, |program| {
            session.is_some_and(|session| session.covers(program))
        });
        let waiting = Instant::now();
        // Verified together (the CUDA programs, when CUDA first appears).
        for (stage, batch) in &ordered {
            let programs = match stage {
                Stage::Session => self.links.session.as_ref(),
                _ => self.links.multi.as_ref(),
            };
            if let Some(programs) = programs {
                programs.prefetch(&[batch.program]);
            }
        }
        for (stage, batch) in &ordered {
            let programs = match stage {
                Stage::Session => self.links.session.as_ref(),
                _ => self.links.multi.as_ref(),
            };
            if let Some(programs) = programs {
                programs.ready(batch.program).map_err(load_error)?;
            }
        }
        let linking = Instant::now();
        self.measured.times.verifier_wait += linking - waiting;
        for (stage, batch) in &ordered {
            if *stage == Stage::Session {
                let session = self.links.session.as_mut().expect("sessions are loaded");
                session
                    .attach(batch.program, &batch.site.file, &batch.points, pid)
                    .map_err(|error| attach_error(error, pid))?;
            } else {
                self.attach_batch(batch, pid)?;
            }
        }
        self.measured.times.links += linking.elapsed();
        self.add_hooks(pid, sites, noticed_by, Instant::now());
        Ok(())
    }

    /// Records the hooks of `sites`, in place since `hooked_at`: a
    /// library hooked already (functions that waited for the unwinder)
    /// gets the new functions in its entry.
    fn add_hooks(
        &mut self,
        pid: u32,
        sites: &[HookSite],
        noticed_by: NoticedBy,
        hooked_at: Instant,
    ) {
        self.hooked
            .hooks
            .extend(sites.iter().map(|site| AttachedHook {
                pid,
                site: site.without_descriptor(),
            }));
        for mut library in HookedLibrary::from_sites(pid, sites, noticed_by) {
            match self
                .hooked
                .libraries
                .iter_mut()
                .find(|hooked| hooked.pid == pid && hooked.path == library.path)
            {
                Some(hooked) => hooked.functions.append(&mut library.functions),
                None => {
                    library.hooked_at = hooked_at;
                    self.hooked.libraries.push(library);
                }
            }
        }
    }

    /// The benchmark's floor: the empty `floor_enter` on every allocator
    /// function, and `floor_return` where tracer puts a return probe
    /// (unless `with_return` is false), at `sites`, attached as tracer's
    /// own probes are.
    pub fn attach_floor(&mut self, pid: u32, sites: FloorSites, with_return: bool) -> Result<()> {
        // Where other tools probe: every function's entry. Where tracer
        // probes: its own sites, none in functions that pass their calls on.
        let forwarding = match sites {
            FloorSites::FunctionEntry => Forwarding::TailJumpsOnly,
            FloorSites::Chosen => Forwarding::TailJumpsAndCalls,
        };
        let found = allocator_sites(pid, forwarding)?.1.sites;
        let offset = |site: &HookSite| match sites {
            FloorSites::FunctionEntry => site.function_offset,
            FloorSites::Chosen => site.offset,
        };
        let mut returns = Vec::new();
        let mut entries = Vec::new();
        for site in &found {
            if with_return && site.function.return_program.is_some() {
                add_to_batch(&mut returns, FLOOR_RETURN_PROGRAM, site, offset(site), 0);
            }
            if site.function.entry_program.is_some() {
                add_to_batch(&mut entries, FLOOR_ENTRY_PROGRAM, site, offset(site), 0);
            }
        }
        for batch in returns.iter().chain(&entries) {
            self.attach_batch(batch, pid)?;
        }
        for site in &found {
            let emulated = match sites {
                FloorSites::FunctionEntry => site.offset == site.function_offset && site.emulated,
                FloorSites::Chosen => site.emulated,
            };
            self.hooked.hooks.push(AttachedHook {
                pid,
                site: HookSite {
                    offset: offset(site),
                    emulated,
                    ..site.without_descriptor()
                },
            });
        }
        Ok(())
    }

    /// Attaches the probes of one batch: one uprobe_multi link, else one
    /// perf-event uprobe each.
    fn attach_batch(&mut self, batch: &Batch<'_>, pid: u32) -> Result<()> {
        let site = batch.site;
        if let Some(multi) = self.links.multi.as_mut() {
            return multi
                .attach(batch.program, &site.file, &batch.points, pid)
                .map_err(|error| attach_error(error, pid));
        }
        let scope = UProbeScope::OneProcess(nonzero_pid(pid)?);
        let attach_path = site.file.attach_path()?;
        let program: &mut UProbe = program(&mut self.ebpf, batch.program)?;
        for &(offset, cookie) in &batch.points {
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie: Some(cookie).filter(|&cookie| cookie != 0),
            };
            let link = program
                .attach(point, &attach_path, scope)
                .map_err(|error| {
                    attach_error(
                        anyhow::Error::new(error).context(format!(
                            "could not attach {} at offset {offset:#x} of {} (by its descriptor, {})",
                            batch.program,
                            site.path.display(),
                            attach_path.display()
                        )),
                        pid,
                    )
                })?;
            self.links.perf.push((pid, batch.program, link));
        }
        Ok(())
    }

    /// Follows `pid`'s mapping calls from now on (from its current program
    /// break on).
    pub fn trace_mappings(&mut self, pid: u32) -> Result<()> {
        sources::mappings::add_target(&mut self.ebpf, pid)
    }

    /// Number of uprobes, uretprobes, uprobe sessions and tracepoints in
    /// place.
    pub fn probe_count(&self) -> usize {
        self.links.perf.len()
            + self.links.mapping_tracepoints
            + [&self.links.multi, &self.links.session]
                .into_iter()
                .flatten()
                .map(RawPrograms::probe_count)
                .sum::<usize>()
    }

    /// Number of uprobe_multi and session links in place.
    pub fn multi_link_count(&self) -> usize {
        [&self.links.multi, &self.links.session]
            .into_iter()
            .flatten()
            .map(RawPrograms::link_count)
            .sum()
    }
}

/// The mappings of `pid` and the allocator functions in them, with their
/// probe sites.
fn allocator_sites(pid: u32, forwarding: Forwarding) -> Result<(Vec<procfs::Mapping>, FoundSites)> {
    let maps = procfs::read_maps(pid)
        .map_err(|error| fatal(ExitCode::NoTarget, format!("PID {pid}: {error:#}")))?;
    let sites = sites::symbols::find_hook_sites(pid, &maps, forwarding)?;
    // An exiting process has no mappings left: not a target without an
    // allocator.
    if maps.is_empty() || !procfs::is_alive(pid) {
        return Err(fatal(
            ExitCode::NoTarget,
            format!("PID {pid} exited during attach"),
        ));
    }
    Ok((maps, sites))
}

/// An attach failure, or the target's exit when that is what caused it.
fn attach_error(error: anyhow::Error, pid: u32) -> anyhow::Error {
    if procfs::is_alive(pid) {
        error
    } else {
        fatal(
            ExitCode::NoTarget,
            format!("PID {pid} exited during attach"),
        )
    }
}

pub fn nonzero_pid(pid: u32) -> Result<NonZeroU32> {
    NonZeroU32::new(pid).ok_or_else(|| fatal(ExitCode::NoTarget, "PID 0 is not a process"))
}
