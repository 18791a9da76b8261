//! The traced processes as collect follows them: how each one's exit is
//! noticed.
use crate::{attach::spawn::ExitStatus, model::Target, procfs};

/// A traced process and how to notice its exit.
pub struct Watched {
    pub target: Target,
    /// Started by tracer: reaped with waitpid, not just looked up.
    pub spawned: bool,
    /// Spawned, with the gate on its loader: it stops whenever the loader
    /// mapped new objects, until tracer hooks them and resumes it.
    pub gated: bool,
    /// How a spawned process ended, once reaped.
    pub exit: Option<ExitStatus>,
    /// The CPU seconds it had used when it began to be traced: snapshots
    /// count from there.
    pub cpu_at_start_s: f64,
    /// The process itself (a pidfd): its exit is seen even when its PID
    /// was taken by another process before the next look, and what is read
    /// of /proc/PID from then on is dropped.
    identity: procfs::Identity,
}

impl Watched {
    /// A process traced from now on.
    pub fn new(pid: u32, spawned: bool) -> Watched {
        let identity = procfs::Identity::follow(pid);
        Watched {
            target: Target::new(pid, procfs::command_line(pid)),
            spawned,
            gated: false,
            exit: None,
            cpu_at_start_s: procfs::cpu_time_s(pid).unwrap_or(0.0),
            identity,
        }
    }

    /// CPU seconds used since it began to be traced; None once gone (the
    /// read is checked against its pidfd: `procfs::Identity`).
    pub fn cpu_since_start_s(&self) -> Option<f64> {
        let now_s = procfs::cpu_time_s(self.target.pid)?;
        Some((now_s - self.cpu_at_start_s).max(0.0))
    }

    pub fn is_alive(&self) -> bool {
        self.target.exited_after_s.is_none()
    }

    /// Whether the process has exited. A spawned one is reaped by
    /// `Collector::poll_spawned`, which sees its stops at the gate too.
    pub(super) fn has_exited(&self) -> bool {
        if self.spawned {
            self.exit.is_some()
        } else if let Some(exited) = self.identity.exited() {
            exited
        } else {
            !procfs::is_alive(self.target.pid)
        }
    }
}

/// The PIDs of the targets that have not exited.
pub fn live_pids(watched: &[Watched]) -> Vec<u32> {
    watched
        .iter()
        .filter(|watched| watched.is_alive())
        .map(|watched| watched.target.pid)
        .collect()
}
