//! What tracer adds to its targets' CPU time, estimated while it runs: an
//! engineer who attaches to a production service must know what the
//! probes cost it, and be told when that is too much.
//!
//! Every probe hit runs in the target's own thread: a breakpoint trap (or
//! a return trap), then one of tracer's programs. The hits and the
//! programs' time come from the programs themselves (each counts its runs
//! and times one in `TIMED_EVERY` on each CPU: the kernel's run-time stats
//! would be on for every program on the host, not only tracer's); the
//! traps' from a measurement on this machine at start (`TrapCosts`). The
//! targets' CPU time (utime + stime) includes both, so the share is
//! `added / (target CPU - added)`: how much more CPU the same work takes
//! traced than untraced.
//!
//! Pure arithmetic on counters read elsewhere, so every rule here is
//! unit-tested.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tracer_ebpf::{TIMED_EVERY, stat};

/// Above this share tracer warns, and names `--sample-bytes`.
pub const HIGH_SHARE: f64 = 0.20;

/// The least CPU time a share is told from (the targets' own, without
/// what tracer added), and the least added time that is more than noise
/// when there is no share: the kernel counts CPU time in clock ticks
/// (10 ms at the usual 100 Hz), so ten ticks make a share good to 10 %.
pub const MEASURABLE_NS: u64 = 100_000_000;

/// What each run of a program costs the target besides the program itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramTrap {
    /// A uprobe: one breakpoint trap a run.
    Entry(Sites),
    /// A uretprobe: the return trap (and the return address taken over at
    /// the entry).
    Return,
    /// A uprobe session program: an entry trap every call, and a return
    /// trap for each call whose entry did not skip it.
    Session(Sites),
    /// A tracepoint: no trap, and it runs in whichever process makes the
    /// call, targets or not: not counted in the targets' share.
    Tracepoint,
}

/// Whether the kernel emulates the instructions an entry program is
/// attached at, or single-steps them (~35 times dearer on a VM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sites {
    Emulated,
    SingleStepped,
    /// Some of each: the runs are counted at the emulated cost, so the
    /// estimate is a lower bound.
    Mixed,
}

impl Sites {
    /// The sites of a program attached at `emulated` sites and
    /// `single_stepped` ones.
    pub fn of(emulated: usize, single_stepped: usize) -> Sites {
        match (emulated, single_stepped) {
            (_, 0) => Sites::Emulated,
            (0, _) => Sites::SingleStepped,
            _ => Sites::Mixed,
        }
    }
}

/// One program's runs, as it counts them itself (`tracer_ebpf::ProgramRuns`,
/// summed over CPUs): every run, and the time of a sample of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Runs {
    pub runs: u64,
    /// The runs that were timed, and their time.
    pub timed_runs: u64,
    pub timed_ns: u64,
}

impl Runs {
    /// The time of all the runs, scaled from the timed ones (0 when none
    /// was timed: fewer runs than one a CPU in `TIMED_EVERY`).
    pub fn run_time_ns(&self) -> u64 {
        if self.timed_runs == 0 {
            return 0;
        }
        (u128::from(self.timed_ns) * u128::from(self.runs) / u128::from(self.timed_runs)) as u64
    }
}

/// What a trap costs on this machine, measured at start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrapCosts {
    /// A uprobe hit at an emulated instruction, the program aside.
    pub entry_ns: f64,
    /// What a return probe adds to a call that has an entry probe.
    pub return_ns: f64,
    /// A uprobe hit at an instruction the kernel must single-step.
    pub single_stepped_ns: f64,
    /// How they were measured.
    pub how: String,
}

/// The kernel-side counters at one moment, cumulative since load.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    /// By program name: how its runs trap, and how many there were.
    pub programs: BTreeMap<String, (ProgramTrap, Runs)>,
    /// STATS by index, summed over CPUs.
    pub stats: Vec<u64>,
}

impl Counts {
    /// What happened between `earlier` and `self`: a program keeps the
    /// trap it has now (a library hooked later may have made it
    /// single-stepped somewhere).
    pub fn since(&self, earlier: &Counts) -> Counts {
        let programs = self
            .programs
            .iter()
            .map(|(name, &(trap, runs))| {
                let before = earlier
                    .programs
                    .get(name)
                    .map(|&(_, runs)| runs)
                    .unwrap_or_default();
                let delta = Runs {
                    runs: runs.runs.saturating_sub(before.runs),
                    timed_runs: runs.timed_runs.saturating_sub(before.timed_runs),
                    timed_ns: runs.timed_ns.saturating_sub(before.timed_ns),
                };
                (name.clone(), (trap, delta))
            })
            .collect();
        let stats = self
            .stats
            .iter()
            .enumerate()
            .map(|(index, &count)| {
                count.saturating_sub(earlier.stats.get(index).copied().unwrap_or(0))
            })
            .collect();
        Counts { programs, stats }
    }

    fn stat(&self, index: u32) -> u64 {
        self.stats.get(index as usize).copied().unwrap_or(0)
    }

    /// Runs of the programs `trap` takes.
    fn runs_of(&self, trap: impl Fn(ProgramTrap) -> bool) -> u64 {
        self.programs
            .values()
            .filter(|(of, _)| trap(*of))
            .map(|(_, runs)| runs.runs)
            .sum()
    }
}

/// The targets' CPU time (utime + stime), by process: the first and the
/// latest reading of each. A process that exited keeps its last one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuLedger {
    first: BTreeMap<u32, u64>,
    latest: BTreeMap<u32, u64>,
}

impl CpuLedger {
    /// Notes that `pid` has used `cpu_ns` so far.
    pub fn observe(&mut self, pid: u32, cpu_ns: u64) {
        self.first.entry(pid).or_insert(cpu_ns);
        self.latest.insert(pid, cpu_ns);
    }

    /// CPU time used since `mark` (an earlier copy of this ledger: a
    /// process it did not know yet counts from its first reading), and the
    /// processes that used some.
    pub fn used_since(&self, mark: &CpuLedger) -> (u64, Vec<u32>) {
        let mut used = 0;
        let mut pids = Vec::new();
        for (&pid, &latest) in &self.latest {
            let from = mark
                .latest
                .get(&pid)
                .or_else(|| self.first.get(&pid))
                .copied()
                .unwrap_or(latest);
            let used_by_pid = latest.saturating_sub(from);
            used += used_by_pid;
            if used_by_pid > 0 {
                pids.push(pid);
            }
        }
        (used, pids)
    }
}

/// How the programs' time and the probe hits were known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgramAccounting {
    /// Each program counted its runs and timed a sample of them.
    Counted,
    /// Their counts could not be read (why): hits are estimated from
    /// tracer's event counters, and the programs' time is unknown.
    Unavailable(String),
}

/// Everything an estimate is made of, over one window.
pub struct CostInputs<'a> {
    /// What the kernel counted in the window.
    pub counts: &'a Counts,
    pub accounting: &'a ProgramAccounting,
    /// The traps' cost, or why it is not known.
    pub traps: Result<&'a TrapCosts, &'a str>,
    /// Whether calls that are not recorded skip their return (sessions).
    pub sessions: bool,
    /// The targets' CPU time in the window, and which targets.
    pub target_cpu_ns: u64,
    pub pids: Vec<u32>,
    pub window_s: f64,
}

/// What tracer added to its targets over a window, as the report and the
/// status line give it.
///
/// Wide: the JSON report's `cost` object, one field per key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// The traced processes the estimate is for (together: the programs
    /// are shared).
    pub pids: Vec<u32>,
    pub window_s: f64,
    /// Added time over the targets' CPU time without it: 0.38 means their
    /// work took 38 % more CPU traced. Null when it cannot be told (the
    /// targets used no CPU, or less than the estimate of what was added).
    pub share: Option<f64>,
    /// Entry and return traps of tracer's uprobes in the targets.
    pub probe_hits: u64,
    /// Added time per hit: trap and program.
    pub ns_per_hit: f64,
    /// Run time of tracer's uprobe programs (timed by the programs on a
    /// sample of their runs); null when it could not be read.
    pub program_ns: Option<u64>,
    /// Time in traps: hits by kind times their measured cost.
    pub trap_ns: u64,
    pub added_ns: u64,
    /// utime + stime of the targets in the window (it includes the
    /// added time: the traps and programs run in the target's threads).
    pub target_cpu_ns: u64,
    /// What a trap costs here, and how that was measured; null when it
    /// could not be.
    pub trap_ns_measured: Option<TrapCosts>,
    /// How the probe hits and program time were known.
    pub accounting: String,
    /// Run time of tracer's tracepoint programs (mapping calls, signals,
    /// opens), in every process that made such a call: not in the share.
    pub tracepoint_ns: Option<u64>,
    /// Why the estimate is a lower bound, when it is one.
    pub lower_bound: Option<String>,
}

impl Cost {
    /// Whether tracer costs more than [`HIGH_SHARE`]: also when the
    /// estimate is a measurable amount and no less than all the CPU the
    /// targets used (no share then: their own work was lost in it).
    pub fn is_high(&self) -> bool {
        match self.share {
            Some(share) => share > HIGH_SHARE,
            None => self.added_ns >= MEASURABLE_NS,
        }
    }

    /// The estimate over one window.
    pub fn estimate(inputs: &CostInputs<'_>) -> Cost {
        let counts = inputs.counts;
        let mut lower_bound = Vec::new();
        let (hits, program_ns, tracepoint_ns, accounting) = match inputs.accounting {
            ProgramAccounting::Counted => {
                let (hits, mixed) = Hits::from_runs(counts);
                if mixed {
                    lower_bound.push(
                        "some hits were at single-stepped sites, counted at the emulated cost"
                            .to_owned(),
                    );
                }
                let run_time = |traced: bool| -> u64 {
                    counts
                        .programs
                        .values()
                        .filter(|(trap, _)| (*trap != ProgramTrap::Tracepoint) == traced)
                        .map(|(_, runs)| runs.run_time_ns())
                        .sum()
                };
                (
                    hits,
                    Some(run_time(true)),
                    Some(run_time(false)),
                    format!(
                        "probe hits counted by tracer's programs themselves, their run time \
                         timed on one run in {TIMED_EVERY} on each CPU (no host-wide \
                         run-time stats)"
                    ),
                )
            }
            ProgramAccounting::Unavailable(why) => {
                lower_bound.push(format!("the programs' run time is unknown ({why})"));
                (
                    Hits::from_events(counts, inputs.sessions),
                    None,
                    None,
                    format!(
                        "probe hits estimated from tracer's event counters; the programs' \
                         own counts could not be read ({why})"
                    ),
                )
            }
        };
        let trap_ns = match inputs.traps {
            Ok(traps) => hits.trap_ns(traps),
            Err(why) => {
                lower_bound.push(format!("the traps' cost is unknown ({why})"));
                0
            }
        };
        let added_ns = trap_ns + program_ns.unwrap_or(0);
        let probe_hits = hits.total();
        let share = (inputs.target_cpu_ns >= added_ns + MEASURABLE_NS)
            .then(|| added_ns as f64 / (inputs.target_cpu_ns - added_ns) as f64);
        Cost {
            pids: inputs.pids.clone(),
            window_s: inputs.window_s,
            share,
            probe_hits,
            ns_per_hit: if probe_hits == 0 {
                0.0
            } else {
                added_ns as f64 / probe_hits as f64
            },
            program_ns,
            trap_ns,
            added_ns,
            target_cpu_ns: inputs.target_cpu_ns,
            trap_ns_measured: inputs.traps.ok().cloned(),
            accounting,
            tracepoint_ns,
            lower_bound: (!lower_bound.is_empty()).then(|| lower_bound.join("; ")),
        }
    }
}

/// Probe hits by what their trap costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Hits {
    emulated_entries: u64,
    single_stepped_entries: u64,
    returns: u64,
}

impl Hits {
    fn total(self) -> u64 {
        self.emulated_entries + self.single_stepped_entries + self.returns
    }

    /// The hits the programs counted, and whether some were at programs
    /// with both emulated and single-stepped sites. A session program
    /// runs at the entry of every call and again at the return of each
    /// call it records (ALLOCS, FAILED_ALLOCS, less those a uretprobe
    /// returned from): its runs are split so, pro rata between programs.
    fn from_runs(counts: &Counts) -> (Hits, bool) {
        use ProgramTrap::{Entry, Return, Session};
        let returns = counts.runs_of(|trap| trap == Return);
        let session_runs = counts.runs_of(|trap| matches!(trap, Session(_)));
        let session_returns = (counts.stat(stat::ALLOCS) + counts.stat(stat::FAILED_ALLOCS))
            .saturating_sub(returns)
            .min(session_runs / 2);
        let mut hits = Hits {
            returns: returns + session_returns,
            ..Hits::default()
        };
        let mut mixed = false;
        for &(trap, runs) in counts.programs.values() {
            let (entries, sites) = match trap {
                Entry(sites) => (runs.runs, sites),
                Session(sites) => {
                    let returned = (session_returns as u128 * runs.runs as u128
                        / session_runs.max(1) as u128) as u64;
                    (runs.runs - returned.min(runs.runs), sites)
                }
                _ => continue,
            };
            match sites {
                Sites::SingleStepped => hits.single_stepped_entries += entries,
                Sites::Emulated | Sites::Mixed => hits.emulated_entries += entries,
            }
            mixed |= sites == Sites::Mixed && entries > 0;
        }
        (hits, mixed)
    }

    fn trap_ns(self, traps: &TrapCosts) -> u64 {
        (self.emulated_entries as f64 * traps.entry_ns
            + self.single_stepped_entries as f64 * traps.single_stepped_ns
            + self.returns as f64 * traps.return_ns)
            .round() as u64
    }

    /// Without the programs' run counts: every allocator and CUDA call
    /// tracer counted had an entry hit, and a return hit unless it was a
    /// free or (with sessions) not recorded. Frees of a realloc count
    /// twice, calls the programs did not count (a full table) not at all.
    fn from_events(counts: &Counts, sessions: bool) -> Hits {
        let returned = counts.stat(stat::ALLOCS)
            + counts.stat(stat::FAILED_ALLOCS)
            + counts.stat(stat::NESTED_CALLS)
            + counts.stat(stat::GPU_ALLOCS)
            + counts.stat(stat::GPU_FAILED_CALLS)
            + counts.stat(stat::GPU_NESTED_CALLS);
        let not_recorded = counts.stat(stat::NOT_RECORDED);
        let frees = counts.stat(stat::FREES)
            + counts.stat(stat::FREES_UNKNOWN)
            + counts.stat(stat::FREES_NULL)
            + counts.stat(stat::GPU_FREES)
            + counts.stat(stat::GPU_FREES_UNKNOWN);
        Hits {
            emulated_entries: returned + not_recorded + frees,
            single_stepped_entries: 0,
            returns: returned + if sessions { 0 } else { not_recorded },
        }
    }
}

#[cfg(test)]
#[path = "cost_tests.rs"]
mod tests;
