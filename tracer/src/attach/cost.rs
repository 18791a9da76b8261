//! What tracer's programs cost the targets, as the kernel counts it: each
//! program's runs and run time, and what each run traps.
//!
//! The kernel counts `run_cnt` and `run_time_ns` of every program only
//! while run-time stats are on. Tracer turns them on with BPF_ENABLE_STATS,
//! whose descriptor keeps them on while it is open: they go off again when
//! tracer exits, even killed (unlike the global `kernel.bpf_stats_enabled`
//! sysctl, which a killed tracer would leave on). Without CAP_SYS_ADMIN
//! (CAP_BPF and CAP_PERFMON only) the kernel refuses, and the estimate says
//! so (`model::cost::ProgramAccounting`).
//!
//! Each run of an entry program is a breakpoint trap, emulated or
//! single-stepped as its sites are (`prologue`); each run of a return
//! program a return trap; a session program's both. What a trap costs is
//! measured at start (`trap_cost`).

use std::{collections::BTreeMap, os::fd::OwnedFd};

use aya::programs::{ProbeKind, Program};

use super::{Probes, raw::RawPrograms, trap_cost::TrapMeasurement};
use crate::model::cost::{ProgramAccounting, ProgramTrap, Runs, Sites, TrapCosts};

/// The kernel's run-time accounting of programs, on while this lives.
pub(super) struct RunStats(Result<OwnedFd, String>);

impl RunStats {
    /// Turns run-time stats on (or says why the kernel would not).
    pub(super) fn enable() -> RunStats {
        RunStats(
            aya::sys::enable_stats(aya::sys::Stats::RunTime)
                .map_err(|error| format!("BPF_ENABLE_STATS refused: {error}")),
        )
    }
}

/// The programs that measure the traps, not the targets' cost.
const FLOOR_PROGRAMS: [&str; 2] = [
    tracer_ebpf::program::FLOOR_ENTER,
    tracer_ebpf::program::FLOOR_RETURN,
];

impl Probes {
    /// Whether the kernel counts the programs' runs and run time.
    pub fn program_accounting(&self) -> ProgramAccounting {
        match &self.run_stats.0 {
            Ok(_) => ProgramAccounting::RunStats,
            Err(why) => ProgramAccounting::Unavailable(why.clone()),
        }
    }

    /// What a trap costs here; unless `wait`, a measurement still under
    /// way is not waited for.
    pub fn trap_costs(&self, wait: bool) -> Result<&TrapCosts, &str> {
        self.trap_measurement.costs(wait)
    }

    /// Starts measuring what a trap costs here, on a thread of its own
    /// (with the floor programs, linked apart: not without uprobe_multi).
    pub fn measure_traps(&mut self) {
        self.trap_measurement = match self.multi.as_ref().map(RawPrograms::linker) {
            Some(Ok(linker)) => TrapMeasurement::start(linker),
            Some(Err(error)) => TrapMeasurement::unavailable(format!("{error:#}")),
            None => TrapMeasurement::unavailable(
                "not measured without uprobe_multi links (Linux < 6.6)".to_owned(),
            ),
        };
    }

    /// Whether calls that are not recorded skip their return probe.
    pub fn skips_returns(&self) -> bool {
        self.session.is_some()
    }

    /// Each loaded program's runs so far, by its name, and what its runs
    /// trap (the floor programs that measure traps left out).
    pub fn program_counts(&self) -> BTreeMap<String, (ProgramTrap, Runs)> {
        let sites = |entry_program: &str| {
            let (emulated, single_stepped) = self
                .hooks
                .iter()
                .filter(|hook| hook.site.function.entry_program == Some(entry_program))
                .fold((0, 0), |(emulated, stepped), hook| {
                    if hook.site.emulated {
                        (emulated + 1, stepped)
                    } else {
                        (emulated, stepped + 1)
                    }
                });
            Sites::of(emulated, single_stepped)
        };
        let mut counts = BTreeMap::new();
        for (name, program) in self.ebpf.programs() {
            let trap = match program {
                Program::UProbe(uprobe) if matches!(uprobe.kind(), ProbeKind::Return) => {
                    ProgramTrap::Return
                }
                Program::UProbe(_) => ProgramTrap::Entry(sites(name)),
                Program::TracePoint(_) => ProgramTrap::Tracepoint,
                _ => continue,
            };
            let Ok(info) = program.info() else {
                continue;
            };
            let runs = Runs {
                runs: info.run_count(),
                run_time_ns: info.run_time().as_nanos() as u64,
            };
            counts.insert(name.to_owned(), (trap, runs));
        }
        for (raw, in_session) in [(&self.multi, false), (&self.session, true)] {
            let Some(raw) = raw else { continue };
            for program in raw.runs() {
                let trap = match (in_session, program.is_return) {
                    (true, _) => ProgramTrap::Session(sites(program.key)),
                    (false, true) => ProgramTrap::Return,
                    (false, false) => ProgramTrap::Entry(sites(program.key)),
                };
                counts.insert(program.name.to_owned(), (trap, program.runs));
            }
        }
        for floor in FLOOR_PROGRAMS {
            counts.remove(floor);
        }
        counts
    }
}
