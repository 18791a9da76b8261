//! Loads the eBPF programs and attaches them to the target processes,
//! scoped to each target's PID so other processes pay nothing. `Probes`
//! holds the loaded object and everything attached from it; its work is
//! in a folder per concern:
//!
//! - `sources/`: the event sources (allocator calls, CUDA calls, mapping
//!   calls) behind `sources::Source`, and the uprobe sources' attach
//!   (`sources/uprobes.rs`: one uprobe, and one uretprobe where the result
//!   is needed, per function in whichever mapped object defines it);
//! - `sites/`: which functions, found where, probed at which instruction;
//! - `load/`: the eBPF object, its tables and configuration, raw bpf(2)
//!   calls aya lacks, the links and their release, the preflight checks;
//! - `libraries/`: libraries mapped later (dlopen), hooked at open or
//!   ahead of their mapping;
//! - `unwinding/`: how each target's stacks are walked, and the kernel's
//!   unwind tables;
//! - `safety/`: C++ exceptions through return probes, the return probes
//!   held back until the unwinder is probed, the watchdog;
//! - `cost/`: what the programs cost the targets; `kernel_maps/`: the
//!   reads of the kernel's tables snapshots make; `spawn`: starting a
//!   command at its loader's gate; `reports`: the probes as a report
//!   describes them.
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

use std::num::NonZeroU32;

use anyhow::{Context as _, Result};
use aya::{Ebpf, programs::uprobe::UProbeLinkId};

pub use crate::config::MapSizes;
use crate::config::Sampling;
pub use crate::model::run::ReturnProbes;
use crate::{
    config::Unwinding,
    error::{ExitCode, fatal},
    procfs,
    unwind::UnwindMode,
};
pub use kernel_maps::KernelMaps;
pub use kernel_maps::stacks::StackMaps;
use libraries::{HookedLibrary, LibraryWatch};
use load::links::TracepointLink;
pub use load::preflight::{KernelFeatures, check_kernel, check_privileges, check_target};
use load::program;
use load::raw::RawPrograms;
pub use load::{AttachTimes, Rings};
use sites::forwarding::Forwarding;
pub use sites::symbols::HookSite;
use sites::symbols::Unprobed;
use sources::remove_entries;

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
    /// `--resident`: pages charged at their first fault; no allocator
    /// call is probed (`Probes::trace_resident_pages`).
    resident: Option<ResidentPages>,
}

/// How the resident mode follows the faults (huge pages are
/// `collect::huge_pages`').
#[derive(Clone, Copy, Debug)]
pub struct ResidentPages {
    /// Faults of one page in 2^shift are followed (`collect` sets it).
    pub sample_shift: u32,
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

    /// `--resident`: follows the user page faults and madvise calls of
    /// every process the mapping calls follow (`sources::faults`), and
    /// from now on puts no probe on an allocator function, only on the
    /// CUDA calls. Before the first process is attached.
    pub fn trace_resident_pages(&mut self) -> Result<ResidentPages> {
        let links = sources::faults::attach(&mut self.ebpf)?;
        self.links.mapping_tracepoints += links.len();
        self.links.tracepoints.extend(links);
        let resident = ResidentPages { sample_shift: 0 };
        self.modes.resident = Some(resident);
        Ok(resident)
    }

    /// `--resident`: follows the faults of one page in 2^`shift` from now
    /// on (each stands for 2^shift pages: `model::resident`).
    pub fn set_fault_sample_shift(&mut self, shift: u32) -> Result<()> {
        let Some(resident) = &mut self.modes.resident else {
            return Ok(());
        };
        resident.sample_shift = shift.min(tracer_ebpf::target::MAX_SAMPLE_SHIFT);
        sources::faults::set_sample_shift(&mut self.ebpf, resident.sample_shift)
    }

    /// What `--resident` sees, when it is on.
    pub fn resident_pages(&self) -> Option<ResidentPages> {
        self.modes.resident
    }

    /// Starts the sources of the kernel's events (`Source::follow`: the
    /// mapping calls' tracepoints) on `pid`, after its uprobes.
    pub fn follow_events(&mut self, pid: u32) -> Result<()> {
        for source in sources::SOURCES {
            source
                .follow(&mut self.ebpf, pid)
                .with_context(|| format!("{} of PID {pid}", source.name()))?;
        }
        if let Some(resident) = self.modes.resident {
            sources::faults::follow(&mut self.ebpf, pid, resident.sample_shift)
                .with_context(|| format!("page faults of PID {pid}"))?;
        }
        Ok(())
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

impl Probes {
    /// Forgets a traced process that exited (`--comm`, where processes
    /// come and go for as long as tracer runs): removes its entries from
    /// the kernel's per-process tables, each source's (`Source::forget`)
    /// and the live set's (its live blocks and per-stack totals), so they
    /// neither fill up nor are read again. Best effort: an entry already
    /// gone is fine.
    pub fn forget(&mut self, pid: u32) {
        self.watch.forget(pid);
        self.release_links_of(pid);
        self.hooked.hooks.retain(|hook| hook.pid != pid);
        self.hooked.libraries.retain(|library| library.pid != pid);
        self.unwind
            .copying_stacks_of
            .retain(|(copied, _)| *copied != pid);
        self.unwind
            .walking_tables_of
            .retain(|(walked, _)| *walked != pid);
        self.forget_unwinding(pid);
        for source in sources::SOURCES {
            source.forget(&mut self.ebpf, pid);
        }
        let ebpf = &mut self.ebpf;
        for name in [tracer_ebpf::map::FOLLOWED, tracer_ebpf::map::COPY_STACKS_OF] {
            remove_entries::<u32, u32>(ebpf, name, |key| *key == pid);
        }
        remove_entries::<u32, tracer_ebpf::GoStackSwitch>(
            ebpf,
            tracer_ebpf::map::GO_STACK_SWITCHES,
            |key| *key == pid,
        );
        remove_entries::<tracer_ebpf::LiveKey, tracer_ebpf::LiveAlloc>(
            ebpf,
            tracer_ebpf::map::LIVE,
            |key| key.tgid == pid,
        );
        remove_entries::<tracer_ebpf::ByStackKey, tracer_ebpf::StackTotals>(
            ebpf,
            tracer_ebpf::map::BY_STACK,
            |key| key.tgid == pid,
        );
    }
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
