//! The traced processes as collect follows them: how each one's exit is
//! noticed.
use crate::{attach::spawn, model::Target, procfs};

/// A traced process and how to notice its exit.
pub struct Watched {
    pub target: Target,
    /// Started by tracer: reaped with waitpid, not just looked up.
    pub spawned: bool,
}

impl Watched {
    /// A process traced from now on.
    pub fn new(pid: u32, spawned: bool) -> Watched {
        Watched {
            target: Target::new(pid, procfs::command_line(pid)),
            spawned,
        }
    }

    pub fn is_alive(&self) -> bool {
        self.target.exited_after_s.is_none()
    }

    pub(super) fn has_exited(&self) -> bool {
        if self.spawned {
            spawn::reap_if_exited(self.target.pid)
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
