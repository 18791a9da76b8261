//! The language runtimes (`crate::runtimes::Runtime`) driven through the
//! run: found before a target's allocators are hooked, attached after,
//! looked at again after an exec, kept current at each snapshot, their
//! notes at the end; what each says goes out as a notice. The stacks a
//! runtime's kernel program stored (`runtimes::StoredStacks`) are named
//! from the stack tables (`stack_table`) and merged into native stacks
//! here.
use anyhow::Result;

use super::{Collector, Event, live_pids};
use crate::{
    config::PythonOptions,
    model::{Frame, run::NoticedBy},
    runtimes::Runtimes,
};

impl Collector {
    /// `--python`, `--python-depth` and `--python-objects`, before
    /// targets are added.
    pub fn set_python(&mut self, options: PythonOptions) {
        self.runtimes = Runtimes::new(options);
    }

    fn notices(&mut self, notices: Vec<String>) {
        self.pace
            .queued
            .extend(notices.into_iter().map(Event::Notice));
    }

    /// Each runtime looks for itself in `pid`, before its allocator
    /// probes are attached.
    pub(super) fn detect_runtimes(&mut self, pid: u32) -> Result<()> {
        let mut notices = Vec::new();
        let found = self
            .runtimes
            .each()
            .into_iter()
            .try_for_each(|runtime| runtime.detect(pid, &mut self.probes, &mut notices));
        self.notices(notices);
        found
    }

    /// Each runtime found in `pid` hooks what it allocates with.
    pub(super) fn attach_runtimes(&mut self, pid: u32, noticed_by: NoticedBy) {
        let mut notices = Vec::new();
        for runtime in self.runtimes.each() {
            runtime.attach(pid, &mut self.probes, noticed_by, &mut notices);
        }
        self.notices(notices);
    }

    /// `pid` replaced its image.
    pub(super) fn runtimes_after_exec(&mut self, pid: u32, noticed_by: NoticedBy) {
        let mut notices = Vec::new();
        for runtime in self.runtimes.each() {
            runtime.after_exec(pid, &mut self.probes, noticed_by, &mut notices);
        }
        self.notices(notices);
    }

    /// At each snapshot, for the live targets.
    pub(super) fn tick_runtimes(&mut self) {
        let live = live_pids(&self.watching.processes);
        let mut notices = Vec::new();
        for runtime in self.runtimes.each() {
            runtime.tick(&live, &mut self.probes, &mut notices);
        }
        self.notices(notices);
    }

    /// At the end.
    pub(super) fn finish_runtimes(&mut self) {
        let mut notices = Vec::new();
        for runtime in self.runtimes.each() {
            runtime.finish(&mut self.probes, &mut notices);
        }
        self.notices(notices);
    }

    /// The runtimes' part of the attach line.
    pub fn runtimes_summary(&self) -> String {
        self.runtimes
            .each_ref()
            .iter()
            .filter_map(|runtime| runtime.summary())
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Lines to print after the attach line.
    pub fn runtimes_attach_notes(&self) -> Vec<String> {
        self.runtimes
            .each_ref()
            .iter()
            .flat_map(|runtime| runtime.attach_notes())
            .collect()
    }

    /// `frames` with the stored stack its tag frame names merged in.
    pub(super) fn merge_stored(&mut self, pid: u32, frames: Vec<Frame>) -> Vec<Frame> {
        let Collector {
            runtimes,
            probes,
            stacks,
            ..
        } = self;
        runtimes.merge_stored(pid, frames, |stored, id| {
            let mut maps = probes.stack_maps();
            // Those stored since the last call first (one of them may be
            // it), then it alone.
            stacks.table.resolve_new_stored(&mut maps, stored);
            if !stored.knows(pid, id) {
                stacks.table.resolve_stored(&mut maps, stored, pid, id);
            }
        })
    }
}
