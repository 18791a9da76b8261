//! What tracer's programs cost the targets: each program's runs and run
//! time, as the programs count them themselves (PROGRAM_RUNS: every run,
//! and the time of one in `TIMED_EVERY` on each CPU), and what each run
//! traps.
//!
//! Not the kernel's run-time stats (BPF_ENABLE_STATS or the
//! `kernel.bpf_stats_enabled` sysctl): those are on for every eBPF program
//! on the host at once, and would cost other tools' and the network's
//! programs two clock reads a run and move their counters while tracer
//! runs. Tracer changes nothing there.
//!
//! Each run of an entry program is a breakpoint trap, emulated or
//! single-stepped as its sites are (`prologue`); each run of a return
//! program a return trap; a session program's both. What a trap costs is
//! measured at start (`trap_cost`).
pub(in crate::attach) mod traps;

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use aya::{
    maps::{MapData, PerCpuArray},
    programs::{ProbeKind, Program},
};
use tracer_ebpf::{ProgramRuns, counted};

use crate::attach::{Probes, cost::traps::TrapMeasurement, load::raw::RawPrograms};
use crate::model::cost::{ProgramAccounting, ProgramTrap, Runs, Sites, TrapCosts};

impl Probes {
    /// Whether the programs' own counts of their runs can be read.
    pub fn program_accounting(&self) -> ProgramAccounting {
        match self.program_runs() {
            Ok(_) => ProgramAccounting::Counted,
            Err(error) => ProgramAccounting::Unavailable(format!("{error:#}")),
        }
    }

    /// Each counted program's runs so far, by id, summed over CPUs.
    fn program_runs(&self) -> Result<Vec<Runs>> {
        let counters: PerCpuArray<&MapData, ProgramRuns> = PerCpuArray::try_from(
            self.ebpf
                .map(tracer_ebpf::map::PROGRAM_RUNS)
                .context("eBPF object lacks PROGRAM_RUNS")?,
        )?;
        (0..counted::COUNT)
            .map(|id| {
                let per_cpu = counters
                    .get(&id, 0)
                    .context("could not read PROGRAM_RUNS")?;
                Ok(per_cpu.iter().fold(Runs::default(), |sum, cpu| Runs {
                    runs: sum.runs + cpu.runs,
                    timed_runs: sum.timed_runs + cpu.timed_runs,
                    timed_ns: sum.timed_ns + cpu.timed_ns,
                }))
            })
            .collect()
    }

    /// What a trap costs here; unless `wait`, a measurement still under
    /// way is not waited for.
    pub fn trap_costs(&self, wait: bool) -> Result<&TrapCosts, &str> {
        self.measured.traps.costs(wait)
    }

    /// Starts measuring what a trap costs here, on a thread of its own
    /// (with the floor programs, linked apart: not without uprobe_multi).
    pub fn measure_traps(&mut self) {
        self.measured.traps = match self.links.multi.as_ref().map(RawPrograms::linker) {
            Some(Ok(linker)) => TrapMeasurement::start(linker),
            Some(Err(error)) => TrapMeasurement::unavailable(format!("{error:#}")),
            None => TrapMeasurement::unavailable(
                "not measured without uprobe_multi links (Linux < 6.6)".to_owned(),
            ),
        };
    }

    /// Whether calls that are not recorded skip their return probe.
    pub fn skips_returns(&self) -> bool {
        self.links.session.is_some()
    }

    /// Each loaded program's runs so far, by its name, and what its runs
    /// trap (the floor programs, which are not counted, left out).
    pub fn program_counts(&self) -> BTreeMap<String, (ProgramTrap, Runs)> {
        let sites = |entry_program: &str| {
            let (emulated, single_stepped) = self
                .hooked
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
        let mut traps = BTreeMap::new();
        for (name, program) in self.ebpf.programs() {
            let trap = match program {
                Program::UProbe(uprobe) if matches!(uprobe.kind(), ProbeKind::Return) => {
                    ProgramTrap::Return
                }
                Program::UProbe(_) => ProgramTrap::Entry(sites(name)),
                Program::TracePoint(_) => ProgramTrap::Tracepoint,
                _ => continue,
            };
            if program.fd().is_ok() {
                traps.insert(name.to_owned(), trap);
            }
        }
        for (raw, in_session) in [(&self.links.multi, false), (&self.links.session, true)] {
            let Some(raw) = raw else { continue };
            for program in raw.loaded() {
                let trap = match (in_session, program.is_return) {
                    (true, _) => ProgramTrap::Session(sites(program.key)),
                    (false, true) => ProgramTrap::Return,
                    (false, false) => ProgramTrap::Entry(sites(program.key)),
                };
                traps.insert(program.name.to_owned(), trap);
            }
        }
        let Ok(runs) = self.program_runs() else {
            return BTreeMap::new();
        };
        traps
            .into_iter()
            .filter_map(|(name, trap)| {
                let id = counted::COUNTED_NAMES
                    .iter()
                    .position(|counted| *counted == name)?;
                Some((name, (trap, runs[id])))
            })
            .collect()
    }
}
