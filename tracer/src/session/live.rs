//! What a verb sees of a running session at each step: the model, the
//! targets, reports as of now, the recent cost, a stack's frames, and what
//! a holders scan needs. Every value it hands out is the verb's own.
use crate::{
    collect::Collector,
    config::Config,
    model::{Frame, Model, StackKey, Target, cost::Cost, run::SamplingReport},
    report::Report,
};

use super::{PendingHolders, build_report, holders};

/// A view of the session between two events.
pub struct Live<'a> {
    collector: &'a mut Collector,
    model: &'a Model,
    config: &'a Config,
}

impl<'a> Live<'a> {
    pub(super) fn new(collector: &'a mut Collector, model: &'a Model, config: &'a Config) -> Self {
        Live {
            collector,
            model,
            config,
        }
    }

    /// Every snapshot so far, folded.
    pub fn model(&self) -> &'a Model {
        self.model
    }

    /// The processes traced, with their exits.
    pub fn targets(&self) -> Vec<Target> {
        self.collector.targets()
    }

    /// The report as of the last snapshot (no RSS: tracing goes on).
    pub fn report(&mut self) -> Report {
        build_report(self.collector, self.model, Default::default(), self.config)
    }

    /// What the holders scan of `report`'s processes needs, read now; the
    /// scan itself (`finish_holders`) can then run on another thread.
    pub fn prepare_holders(&mut self, report: &mut Report) -> PendingHolders {
        holders::prepare_holders(self.collector, report, self.config)
    }

    /// What tracer cost the targets since the last time this was asked.
    pub fn cost_lately(&mut self) -> Option<Cost> {
        self.collector.cost_lately()
    }

    /// How allocations are recorded: all, or a sample.
    pub fn sampling(&self) -> SamplingReport {
        self.collector.probes().sampling_report()
    }

    /// The symbolized frames of a stack, innermost first.
    pub fn frames(&mut self, key: &StackKey) -> Vec<Frame> {
        self.collector.frames(key)
    }
}
