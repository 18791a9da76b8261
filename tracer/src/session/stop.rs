//! The end of a session: the commands tracer started are let go, passed
//! the stop signal or killed; the targets' RSS read; what the holds for
//! C++ unwinds cost said.
use std::{collections::BTreeMap, time::Duration};

use crate::{
    attach::spawn,
    collect::{Collector, StopReason},
    model::{MemoryStatus, Target},
    procfs,
};

/// Lets a spawned command run (nothing to do for --pid targets).
pub(super) fn resume(collector: &Collector) {
    for watched in collector.watched().iter().filter(|watched| watched.spawned) {
        spawn::resume(watched.target.pid);
    }
}

/// Kills the commands tracer started (when tracing cannot go on).
pub(super) fn kill_spawned(collector: &Collector) {
    for watched in collector.watched().iter().filter(|watched| watched.spawned) {
        spawn::kill(watched.target.pid);
    }
}

/// How long a spawned command may take to exit once told to stop.
const SPAWNED_EXIT_PATIENCE: Duration = Duration::from_secs(10);

/// Ends tracing (drops `collector`, removing every probe) and deals with
/// the commands tracer started that still run, saying so on stderr: they
/// are passed on the signal that stopped tracer (SIGINT for Ctrl-C,
/// SIGTERM for SIGTERM and --duration) and waited for, as `perf record`
/// does; with `--leave-running` they go on, untraced, and their PIDs are
/// named.
pub(super) fn end_spawned(collector: Collector, reason: StopReason, leave_running: bool) {
    let running: Vec<(u32, String)> = collector
        .watched()
        .iter()
        .filter(|watched| watched.spawned && watched.exit.is_none())
        .map(|watched| (watched.target.pid, watched.target.command.clone()))
        .collect();
    drop(collector);
    for (pid, command) in running {
        if let spawn::ChildState::Exited(status) = spawn::poll(pid) {
            eprintln!("tracer: PID {pid} ({command}) ended: {status}");
            continue;
        }
        if leave_running {
            spawn::resume(pid);
            eprintln!(
                "tracer: PID {pid} ({command}) left running, no longer traced \
                 (--leave-running); stop it with `kill {pid}`"
            );
            continue;
        }
        let signal = match reason {
            StopReason::Interrupted => libc::SIGINT,
            _ => libc::SIGTERM,
        };
        eprintln!(
            "tracer: sending {} to PID {pid} ({command}), which tracer started, and waiting \
             for it to exit (--leave-running leaves it running)",
            spawn::signal_name(signal)
        );
        let (status, killed) = spawn::stop_and_wait(pid, signal, SPAWNED_EXIT_PATIENCE);
        if killed {
            eprintln!(
                "tracer: PID {pid} did not exit within {} s: killed it (SIGKILL)",
                SPAWNED_EXIT_PATIENCE.as_secs()
            );
        } else {
            eprintln!("tracer: PID {pid} ended: {status}");
        }
    }
}

/// What the holds for unwinds through return-probed frames (`attach::
/// exceptions`) cost the targets, when there were any.
pub(super) fn exception_holds(collector: &Collector) -> Option<String> {
    let (holds, longest) = collector.probes().exceptions()?.holds();
    (holds > 0).then(|| {
        format!(
            "{holds} C++ unwinds through return-probed frames held their process while \
             return addresses were put back (longest {:.2} ms, bound {} ms)",
            longest.as_secs_f64() * 1e3,
            crate::attach::safety::exceptions::HOLD_BOUND.as_millis()
        )
    })
}

/// RSS and its parts of the targets still alive, read now.
pub(super) fn memory_status(targets: &[Target]) -> BTreeMap<u32, MemoryStatus> {
    targets
        .iter()
        .filter(|target| target.exited_after_s.is_none())
        .filter_map(|target| Some((target.pid, procfs::memory_status(target.pid)?)))
        .collect()
}
