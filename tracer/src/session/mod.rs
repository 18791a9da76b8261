//! A tracing session, what the verbs that trace (`record`, `top`) hold:
//! it checks, loads and attaches the probes on the targets of a `Config`
//! (`start`), runs the one event loop, folding each snapshot into the
//! model and into the recording (`-o`), tells the verb each step with a
//! view of the run (`Live`), and ends with the report (`stop`, `holders`).
//! Only the session holds the collector: a verb sees the model, the
//! targets and self-contained reports, never the collector itself.
mod holders;
mod live;
mod start;
mod stop;

pub use holders::{PendingHolders, finish_holders};
pub use live::Live;

use std::path::Path;

use anyhow::Result;

use crate::{
    collect::{Collector, Event, StopReason},
    config::Config,
    model::{MemoryStatus, Model, StackKey},
    recording::{self, Metadata},
    report::{Report, ReportInput, ReportView},
    symbolize::FINAL_WAIT_FOR_SYMBOLS,
};

/// Probes in place on the targets, the model their snapshots are folded
/// into, and the recording they are written to.
pub struct Session {
    collector: Collector,
    model: Model,
    /// `-o FILE`: written as the snapshots come.
    recording: Option<recording::Writer>,
    config: Config,
}

/// What the event loop tells the verb.
pub enum Step {
    /// A snapshot was folded into the model (and the recording).
    Snapshot,
    /// A line for stderr (after `tracer: `): a target exited, exec'ed or
    /// forked, a library was hooked, a CUDA context torn down; with `-v`,
    /// the details.
    Said(String),
}

/// What a session ends with: the report and the model it was built from.
pub struct Ended {
    pub report: Report,
    pub model: Model,
}

impl Session {
    /// Checks privileges, kernel and targets, loads the eBPF programs and
    /// attaches them. A spawned command is left stopped (its libraries
    /// mapped, none of their constructors run) until `resume`.
    pub fn attach(config: &Config) -> Result<Session> {
        Ok(Session {
            collector: start::attach(config)?,
            model: Model::new(),
            recording: None,
            config: config.clone(),
        })
    }

    /// Writes the recording (`-o`) to `path` from now on, starting with the
    /// metadata of the trace whose probes are now in place.
    pub fn record_to(&mut self, path: &Path) -> Result<()> {
        let collector = &self.collector;
        let probes = collector.probes();
        let targets = collector.targets();
        let pids: Vec<u32> = targets.iter().map(|target| target.pid).collect();
        let metadata = Metadata::for_this_host(
            collector.attached_at(),
            self.config.schedule.interval.as_millis() as u64,
            targets,
            probes.probe_reports(),
            probes.sampling_report(),
        );
        let mut writer = recording::Writer::create(path, metadata)?;
        writer.append_unwinding(&probes.unwinding_report(&pids))?;
        writer.append_libraries(&collector.library_reports())?;
        self.recording = Some(writer);
        Ok(())
    }

    /// Lets a spawned command run (nothing to do for --pid targets).
    pub fn resume(&self) {
        stop::resume(&self.collector);
    }

    /// Kills the commands tracer started (when tracing cannot go on).
    pub fn kill_spawned(&self) {
        stop::kill_spawned(&self.collector);
    }

    /// The event loop: takes the collector's events until it stops, each
    /// snapshot folded into the model and the recording, the stacks the
    /// model folded away forgotten, and tells `on` each step with a view
    /// of the run.
    pub fn run(
        &mut self,
        mut on: impl FnMut(Step, &mut Live<'_>) -> Result<()>,
    ) -> Result<StopReason> {
        let runtime = crate::collect::runtime()?;
        runtime.block_on(async {
            loop {
                let event = self.collector.next().await?;
                let step = match self.fold(event)? {
                    Folded::Step(step) => step,
                    Folded::Nothing => continue,
                    Folded::Stopped(reason) => {
                        if self.config.verbose
                            && let Some(summary) = self.collector.probes().unwind_tables_summary()
                        {
                            on(Step::Said(summary), &mut self.live())?;
                        }
                        return Ok(reason);
                    }
                };
                on(step, &mut self.live())?;
            }
        })
    }

    /// Folds an event into the model and the recording; what the verb is
    /// to be told of it.
    fn fold(&mut self, event: Event) -> Result<Folded> {
        let said = |line: String| Ok(Folded::Step(Step::Said(line)));
        match event {
            Event::Snapshot(snapshot) => {
                let collector = &mut self.collector;
                if let Some(writer) = self.recording.as_mut() {
                    writer.append_snapshot(&snapshot, &mut |key| {
                        (collector.frames(key), collector.api(key).map(str::to_owned))
                    })?;
                }
                self.model.push(snapshot);
                let folded = self.model.take_folded();
                self.collector.forget_stacks(&folded);
                if let Some(writer) = self.recording.as_mut() {
                    writer.forget(&folded);
                }
                Ok(Folded::Step(Step::Snapshot))
            }
            Event::TargetExited { pid, after_s } => {
                if let Some(writer) = self.recording.as_mut() {
                    writer.append_exit(pid, after_s)?;
                }
                if self.collector.forgets_exited() {
                    self.model.forget(pid);
                }
                said(format!("PID {pid} exited after {after_s:.1} s"))
            }
            Event::LibrariesHooked(libraries) => {
                if let Some(writer) = self.recording.as_mut() {
                    writer.append_libraries(&libraries)?;
                }
                Ok(Folded::Nothing)
            }
            Event::ContextDestroyed { pid, after_s } => said(format!(
                "PID {pid} destroyed or reset a CUDA context after {after_s:.1} s"
            )),
            Event::ChildFollowed {
                pid,
                command,
                after_s,
            } => said(format!(
                "following child PID {pid} ({command}) after {after_s:.1} s"
            )),
            Event::Notice(line) => said(line),
            Event::Detail(line) if self.config.verbose => said(line),
            Event::Detail(_) => Ok(Folded::Nothing),
            Event::Exec {
                pid,
                executable,
                after_s,
            } => said(format!(
                "PID {pid} exec'ed {executable} after {after_s:.1} s: what the old image \
                 held is gone, the new image is traced"
            )),
            Event::Stopped(reason) => Ok(Folded::Stopped(reason)),
        }
    }

    fn live(&mut self) -> Live<'_> {
        Live::new(&mut self.collector, &self.model, &self.config)
    }

    /// Ends the session with its report: the recording finished (the
    /// targets' RSS and the loader pauses in it), the last symbols waited
    /// for (`FINAL_WAIT_FOR_SYMBOLS`, or a second Ctrl-C), the holders
    /// scanned (`--holders`), then every probe removed and the commands
    /// tracer started dealt with (`stop::end_spawned`).
    pub fn finish(mut self, reason: StopReason, holders: bool) -> Result<Ended> {
        // From here on a Ctrl-C cuts the last symbolization short.
        crate::symbolize::skip_final_wait_on_signals();
        if reason != StopReason::TargetsExited {
            eprintln!(
                "tracer: stopping ({reason:?}) after {:.1} s",
                self.model.window_s()
            );
        }
        if let Some(line) = stop::exception_holds(&self.collector) {
            eprintln!("tracer: {line}");
        }
        let memory_status = stop::memory_status(&self.collector.targets());
        if let Some(mut writer) = self.recording.take() {
            for (&pid, &status) in &memory_status {
                writer.append_memory_status(pid, status)?;
            }
            writer.append_loader_pauses(self.collector.loader_pauses())?;
            let path = writer.path().to_owned();
            writer.finish()?;
            eprintln!("tracer: wrote {}", path.display());
        }
        self.collector.settle_symbols(FINAL_WAIT_FOR_SYMBOLS);
        let mut report = build_report(
            &mut self.collector,
            &self.model,
            memory_status,
            &self.config,
        );
        let unanswered = self.collector.unanswered_symbols();
        if unanswered > 0 {
            eprintln!(
                "tracer: {unanswered} addresses were still being symbolized when the last \
                 wait ended ({} s at most after tracing stopped, or a second Ctrl-C): their \
                 frames show module and offset (`tracer report` of a recording names them \
                 again)",
                FINAL_WAIT_FOR_SYMBOLS.as_secs()
            );
        }
        if holders {
            holders::add_holders(&mut self.collector, &mut report, &self.config);
        }
        stop::end_spawned(self.collector, reason, self.config.leave_running);
        Ok(Ended {
            report,
            model: self.model,
        })
    }

    /// Ends the session without a report (`top`): every probe removed, the
    /// commands tracer started dealt with.
    pub fn end(self, reason: StopReason) {
        stop::end_spawned(self.collector, reason, self.config.leave_running);
    }
}

/// An event folded: a step to tell, nothing to tell, or the end.
enum Folded {
    Step(Step),
    Nothing,
    Stopped(StopReason),
}

/// The report of what `collector` saw, folded into `model`: the stacks it
/// shows (top stacks by live bytes and suspected leaks) with their frames;
/// `memory_status` holds the RSS of the targets alive at the end (empty
/// while tracing goes on).
fn build_report(
    collector: &mut Collector,
    model: &Model,
    memory_status: std::collections::BTreeMap<u32, MemoryStatus>,
    config: &Config,
) -> Report {
    let show = &config.show;
    let run = collector.run_facts(model, stacks_to_merge(model, show.top), memory_status);
    Report::build(ReportInput {
        model,
        run,
        view: ReportView {
            top: show.top,
            wrappers: &show.wrappers,
            layout: show.layout,
            at_s: None,
        },
    })
}

/// Stacks are merged with every stack of equal frames (`model::merge`)
/// while there are at most this many; beyond, only among the stacks that
/// could be shown, so that a target with 10^5 stacks still gets its report
/// in seconds.
const MERGE_ALL_UP_TO: usize = 20_000;

/// The stacks to symbolize for a report or a `top` screen showing `top`
/// stacks: every stack while there are at most [`MERGE_ALL_UP_TO`], else
/// the ones that could be shown (the most live bytes, the fastest growth,
/// the suspected leaks, several times `top` of each).
pub fn stacks_to_merge(model: &Model, top: usize) -> Vec<StackKey> {
    let all: Vec<StackKey> = model.latest_counters().map(|(key, _)| key).collect();
    if all.len() <= MERGE_ALL_UP_TO {
        return all;
    }
    let shown = top.saturating_mul(4);
    let mut keys: Vec<StackKey> = model
        .top_stacks(shown)
        .into_iter()
        .chain(model.fastest_growing(shown))
        .map(|summary| summary.key)
        .chain(model.suspected_leaks(top).into_iter().map(|(key, _)| key))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}
