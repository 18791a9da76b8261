//! Following the targets: exits, the children the followed ones fork, the
//! processes started with a `--comm` name, and forgetting those that exit.
use super::{Collector, Event, MAX_EXITED_KEPT, Watched, comms};
use crate::procfs;

impl Collector {
    /// Notes the targets that exited, and follows the children the
    /// followed ones forked.
    pub(super) fn watch_targets(&mut self) {
        let after_s = self.elapsed_s();
        if self.pace.schedule.follow_forks {
            self.follow_children(after_s);
        }
        if self.watching.comms.is_some() {
            self.follow_started(after_s);
        }
        let mut exited = Vec::new();
        for watched in self.watching.processes.iter_mut().filter(|w| w.is_alive()) {
            if watched.has_exited() {
                watched.target.exited_after_s = Some(after_s);
                exited.push(watched.target.pid);
                self.pace.queued.push_back(Event::TargetExited {
                    pid: watched.target.pid,
                    after_s,
                });
            }
        }
        if self.watching.comms.is_some() {
            for pid in exited {
                self.forget(pid);
            }
        }
    }

    /// Drops what collection keeps of a process that exited, in the
    /// kernel and here (`--comm`: processes come and go for as long as
    /// tracer runs, and memory must stay flat). Its entry in `watched`
    /// stays, without its stacks.
    pub(super) fn forget(&mut self, pid: u32) {
        self.probes.forget(pid);
        self.stacks.symbols.forget(pid);
        self.stacks.copied.forget(pid);
        self.stacks.frames.forget(pid);
        self.stacks.kernel.forget_process(pid);
        self.stacks.apis.retain(|key, _| key.pid != pid);
        self.stacks
            .thread_entries
            .retain(|(entry_pid, _), _| *entry_pid != pid);
        // Exited targets beyond the last few are dropped: a restarting
        // service would otherwise grow the list forever.
        let exited = self
            .watching
            .processes
            .iter()
            .filter(|w| !w.is_alive())
            .count();
        if exited > MAX_EXITED_KEPT {
            let mut to_drop = exited - MAX_EXITED_KEPT;
            self.watching.processes.retain(|watched| {
                if to_drop > 0 && !watched.is_alive() {
                    to_drop -= 1;
                    return false;
                }
                true
            });
        }
    }

    /// `--comm`: attaches to the processes started with a matching name
    /// since the last call, up to --max-targets alive at once.
    pub(super) fn follow_started(&mut self, after_s: f64) {
        let mut started = self.probes.take_started();
        started.sort_unstable();
        started.dedup();
        for pid in started {
            let Some(watch) = &self.watching.comms else {
                return;
            };
            let alive = self
                .watching
                .processes
                .iter()
                .filter(|w| w.is_alive())
                .count();
            let name = comms::comm(pid);
            let wanted = name.as_deref().is_some_and(|name| watch.matches(name))
                && comms::is_user_process(pid)
                && pid != std::process::id()
                && !self
                    .watching
                    .processes
                    .iter()
                    .any(|w| w.is_alive() && w.target.pid == pid);
            if !wanted {
                continue;
            }
            if alive >= watch.max_targets {
                let max = watch.max_targets;
                if self
                    .watching
                    .comms
                    .as_mut()
                    .is_some_and(|watch| watch.refused.insert(pid))
                {
                    self.notice(format!(
                        "not tracing PID {pid} ({}): --max-targets {max} processes traced already",
                        name.unwrap_or_default()
                    ));
                }
                continue;
            }
            if let Err(error) = self.add_target(pid, false) {
                if procfs::is_alive(pid) {
                    self.notice(format!("warning: could not trace PID {pid}: {error:#}"));
                }
                continue;
            }
            let command = self
                .watching
                .processes
                .last()
                .map(|w| w.target.command.clone())
                .unwrap_or_default();
            self.notice(format!(
                "tracing PID {pid} ({command}), started after {after_s:.1} s with a --comm name"
            ));
        }
    }

    /// Attaches to the processes the followed targets forked since the
    /// last call, and follows their children in turn. New threads are
    /// announced too and skipped here; a child that exits before the
    /// probes are in place is skipped.
    pub(super) fn follow_children(&mut self, after_s: f64) {
        for child in self.probes.take_forks() {
            let is_process = procfs::tgid(child) == Some(child);
            if !is_process
                || self
                    .watching
                    .processes
                    .iter()
                    .any(|w| w.target.pid == child)
            {
                continue;
            }
            if let Err(error) = self.probes.attach_functions(child) {
                if procfs::is_alive(child) {
                    self.notice(format!(
                        "warning: could not follow child PID {child}: {error:#}"
                    ));
                }
                continue;
            }
            if let Err(error) = self.detect_runtimes(child) {
                self.notice(format!(
                    "warning: child PID {child}: no Python frames: {error:#}"
                ));
            }
            self.attach_runtimes(child, crate::model::run::NoticedBy::Attach);
            if let Err(error) = self.probes.follow_events(child) {
                self.notice(format!(
                    "warning: mappings of child PID {child} not followed: {error:#}"
                ));
            } else {
                self.mappings.start(child);
            }
            if self.probes.follow(child).is_err() {
                self.notice(format!(
                    "warning: the children of PID {child} will not be followed"
                ));
            }
            self.stacks.symbols.refresh(child);
            let mut watched = Watched::new(child, false);
            watched.target.followed_after_s = Some(after_s);
            self.pace.queued.push_back(Event::ChildFollowed {
                pid: child,
                command: watched.target.command.clone(),
                after_s,
            });
            self.watching.processes.push(watched);
        }
    }
}
