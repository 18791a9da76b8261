//! What a run tells its report beside the model (`model::run::RunFacts`),
//! read from the collector in one go: the report is then built from it
//! alone, never calling back into the collector.
use std::collections::BTreeMap;

use super::Collector;
use crate::model::{
    MemoryStatus, Model, StackKey, quality,
    run::{LoaderPauses, RunFacts, StackFacts, Traced},
};

impl Collector {
    /// The run's facts as of now: the frames and CUDA functions of `keys`
    /// (the stacks a report may show), which of the model's stacks reach
    /// their thread's start, the probes, modes, hooked objects, what
    /// tracing cost and refused; `memory_status` the targets' RSS at the
    /// end (empty while tracing goes on).
    pub fn run_facts(
        &mut self,
        model: &Model,
        keys: impl IntoIterator<Item = StackKey>,
        memory_status: BTreeMap<u32, MemoryStatus>,
    ) -> RunFacts {
        let mut stacks = StackFacts::default();
        for key in keys {
            stacks.frames.insert(key, self.shared_frames(&key));
            if let Some(api) = self.api(&key) {
                stacks.apis.insert(key, api.to_owned());
            }
        }
        // The stacks the report's stack quality weighs.
        stacks.reaching_entry = model
            .latest_counters()
            .filter(|(key, counters)| quality::is_weighed(key, counters))
            .map(|(key, _)| key)
            .filter(|key| self.reaches_entry(key))
            .collect();
        let targets = self.targets();
        let pids: Vec<u32> = targets.iter().map(|target| target.pid).collect();
        let probes = self.probes();
        let traced = Traced {
            probes: probes.probe_reports(),
            sampling: probes.sampling_report(),
            unwinding: Some(probes.unwinding_report(&pids)),
            libraries: self.library_reports(),
            loader_pauses: self.loader_pauses(),
            unwinding_stopped: self.unwinding_stops(),
            cost: self.cost_since_attach(),
            refused_files: crate::target_files::refused(),
        };
        let memory_limits = targets
            .iter()
            .filter(|target| target.exited_after_s.is_none())
            .filter_map(|target| Some((target.pid, crate::procfs::memory_limit(target.pid)?)))
            .collect();
        RunFacts {
            targets,
            interval_ms: self.pace.schedule.interval.as_millis() as u64,
            memory_status,
            memory_limits,
            traced,
            stacks,
        }
    }

    /// The pauses at the loader gate so far.
    pub fn loader_pauses(&self) -> LoaderPauses {
        let (times, held) = self.probes().loader_pause_total();
        LoaderPauses {
            times: times as u64,
            held_ms: held.as_secs_f64() * 1e3,
        }
    }
}
