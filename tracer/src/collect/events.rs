//! The event loop: the timers and signals `Collector::next` waits on, and
//! what each one does (a snapshot, the libraries and mappings drained, the
//! targets' liveness, the stop).
use std::{
    sync::atomic::{AtomicI32, Ordering},
    time::Instant,
};

use anyhow::{Context as _, Result};
use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    time::{Interval, MissedTickBehavior, interval},
};

use super::{
    COPIES_DRAIN_EVERY, Collector, Event, LIVENESS_EVERY, MAPPING_DRAIN_EVERY, Schedule,
    StopReason, live_pids,
};
use crate::{attach::libraries, procfs};

/// The timers and signals `next` waits on, made on its first call (they
/// need the tokio runtime).
pub(super) struct Clock {
    snapshot: Interval,
    liveness: Interval,
    libraries: Interval,
    mappings: Interval,
    copies: Interval,
    interrupt: Signal,
    terminate: Signal,
    deadline: Option<Instant>,
}

impl Clock {
    fn start(schedule: &Schedule, attached_at: Instant) -> Result<Clock> {
        let timer = |every| {
            let mut timer = interval(every);
            timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
            timer
        };
        Ok(Clock {
            snapshot: timer(schedule.interval),
            liveness: timer(LIVENESS_EVERY),
            libraries: timer(libraries::DRAIN_EVERY),
            mappings: timer(MAPPING_DRAIN_EVERY),
            copies: timer(COPIES_DRAIN_EVERY),
            interrupt: signal(SignalKind::interrupt()).context("could not catch SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("could not catch SIGTERM")?,
            deadline: schedule.duration.map(|duration| attached_at + duration),
        })
    }
}

/// The SIGINT or SIGTERM that came before collection caught them (during
/// the attach); 0: none.
static EARLY_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn note_early_signal(signal: libc::c_int) {
    EARLY_SIGNAL.store(signal, Ordering::Relaxed);
}

/// Catches SIGINT and SIGTERM from now until collection starts (the
/// attach takes a while): they stop tracing once the probes are in
/// place, with a report, instead of killing tracer.
pub fn catch_signals_during_attach() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a handler that only stores to an
        // atomic (async-signal-safe).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = note_early_signal as *const () as usize;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

impl Collector {
    /// The next event; `Stopped` once collection is over, and again after.
    pub async fn next(&mut self) -> Result<Event> {
        if let Some(event) = self.pace.queued.pop_front() {
            return Ok(event);
        }
        if let Some(reason) = self.pace.stopped {
            return Ok(Event::Stopped(reason));
        }
        let mut clock = match self.pace.clock.take() {
            Some(clock) => clock,
            None => {
                let clock = Clock::start(&self.pace.schedule, self.pace.attached_at)?;
                // A Ctrl-C or SIGTERM that came during the attach stops
                // collection now, with a report.
                match EARLY_SIGNAL.swap(0, Ordering::Relaxed) {
                    libc::SIGINT => self.finish(StopReason::Interrupted)?,
                    libc::SIGTERM => self.finish(StopReason::Terminated)?,
                    _ => {}
                }
                if !self.pace.queued.is_empty() {
                    self.pace.clock = Some(clock);
                    return Ok(self.pace.queued.pop_front().expect("queued"));
                }
                clock
            }
        };
        let result = self.wait(&mut clock).await;
        self.pace.clock = Some(clock);
        result?;
        Ok(self.pace.queued.pop_front().expect("wait queues an event"))
    }

    /// Runs the timers until something is queued.
    async fn wait(&mut self, clock: &mut Clock) -> Result<()> {
        while self.pace.queued.is_empty() {
            let until_deadline = async {
                match clock.deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                    None => std::future::pending().await,
                }
            };
            let copying = self.probes.copies_any_stacks();
            tokio::select! {
                _ = clock.snapshot.tick() => {
                    for pid in live_pids(&self.watching.processes) {
                        self.stacks.symbols.refresh(pid);
                    }
                    self.tick_runtimes();
                    let snapshot = self.snapshot()?;
                    self.pace.queued.push_back(Event::Snapshot(snapshot));
                    if let Some(line) = self.stack_table_line() {
                        self.pace.queued.push_back(Event::Detail(line));
                    }
                }
                _ = clock.libraries.tick() => {
                    self.watch_libraries()?;
                    self.poll_spawned()?;
                }
                _ = clock.mappings.tick() => {
                    self.drain_mappings()?;
                    self.resolve_stored_stacks();
                }
                _ = clock.copies.tick(), if copying => {
                    self.start_copy_reader()?;
                    self.stacks.copied.drain();
                }
                _ = clock.liveness.tick() => {
                    self.watch_targets();
                    if self.watching.comms.is_none() && self.watching.processes.iter().all(|w| !w.is_alive()) {
                        self.finish(StopReason::TargetsExited)?;
                    }
                }
                _ = until_deadline => self.finish(StopReason::Duration)?,
                _ = clock.interrupt.recv() => self.finish(StopReason::Interrupted)?,
                _ = clock.terminate.recv() => self.finish(StopReason::Terminated)?,
            }
        }
        Ok(())
    }

    /// The final snapshot, after what was sent since the last drain (the
    /// libraries mapped since the last snapshot too, for the symbolizer),
    /// then `Stopped`.
    fn finish(&mut self, reason: StopReason) -> Result<()> {
        self.probes.settle_at_open();
        for note in self.probes.take_lacking_checks(true) {
            self.pace.queued.push_back(Event::Notice(note));
        }
        self.watch_libraries()?;
        self.resolve_stored_stacks();
        self.finish_runtimes();
        for pid in live_pids(&self.watching.processes) {
            self.stacks.symbols.refresh(pid);
        }
        let snapshot = self.snapshot()?;
        self.pace.queued.push_back(Event::Snapshot(snapshot));
        self.pace.stopped = Some(reason);
        Ok(())
    }
}

/// The runtime `Collector::next` runs on: one thread, timers and signals.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("could not start the tokio runtime")
}

/// Waits for SIGINT, SIGTERM or the exit of `pid`.
pub async fn wait_for_stop(pid: u32) -> Result<()> {
    let mut interrupt = signal(SignalKind::interrupt()).context("could not catch SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("could not catch SIGTERM")?;
    let mut liveness_timer = interval(LIVENESS_EVERY);
    loop {
        tokio::select! {
            _ = liveness_timer.tick() => {
                if !procfs::is_alive(pid) {
                    return Ok(());
                }
            }
            _ = interrupt.recv() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
        }
    }
}
