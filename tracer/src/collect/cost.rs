//! The cost meter: at attach and at every snapshot it reads what the
//! kernel counted of tracer's programs and the targets' CPU time, so that
//! the status line can say what tracer cost them lately and the report
//! what it cost them over the whole window (`model::cost`).
use std::time::Instant;

use super::{Collector, live_pids};
use crate::{
    model::cost::{Cost, CostInputs, Counts, CpuLedger},
    procfs,
};

/// The kernel's counters and the targets' CPU time at one moment.
#[derive(Clone, Debug)]
struct Reading {
    at: Instant,
    counts: Counts,
    cpu: CpuLedger,
}

/// Readings to estimate from.
#[derive(Default)]
pub(super) struct CostMeter {
    /// At attach.
    first: Option<Reading>,
    /// At the last snapshot.
    latest: Option<Reading>,
    /// At the last `cost_lately`.
    mark: Option<Reading>,
    /// Every target's CPU time, first and latest.
    cpu: CpuLedger,
}

impl Collector {
    /// Reads the programs' counts and the live targets' CPU time now;
    /// `stats` are the STATS counters just read.
    pub(super) fn observe_cost(&mut self, stats: Vec<u64>) {
        for pid in live_pids(&self.watching.processes) {
            if let Some(cpu_ns) = procfs::cpu_time_ns(pid) {
                self.cost.cpu.observe(pid, cpu_ns);
            }
        }
        let reading = Reading {
            at: Instant::now(),
            counts: Counts {
                programs: self.probes.program_counts(),
                stats,
            },
            cpu: self.cost.cpu.clone(),
        };
        if self.cost.first.is_none() {
            self.cost.first = Some(reading.clone());
            self.cost.mark = Some(reading.clone());
        }
        self.cost.latest = Some(reading);
    }

    /// What tracer cost its targets since the last call (since attach for
    /// the first): the status line's. None before two readings.
    pub fn cost_lately(&mut self) -> Option<Cost> {
        let latest = self.cost.latest.clone()?;
        let mark = self.cost.mark.replace(latest.clone())?;
        Some(self.estimate(&mark, &latest, false))
    }

    /// What tracer cost its targets from attach to the last snapshot: the
    /// report's (waiting for the trap measurement if it still runs).
    pub fn cost_since_attach(&self) -> Option<Cost> {
        let (first, latest) = (self.cost.first.as_ref()?, self.cost.latest.as_ref()?);
        Some(self.estimate(first, latest, true))
    }

    fn estimate(&self, from: &Reading, to: &Reading, wait: bool) -> Cost {
        let counts = to.counts.since(&from.counts);
        let (target_cpu_ns, pids) = to.cpu.used_since(&from.cpu);
        Cost::estimate(&CostInputs {
            counts: &counts,
            accounting: &self.probes.program_accounting(),
            traps: self.probes.trap_costs(wait),
            sessions: self.probes.skips_returns(),
            target_cpu_ns,
            pids,
            window_s: (to.at - from.at).as_secs_f64(),
        })
    }
}
