//! `--comm` and `--comm-regex`: which processes match by command name, the
//! ones running at attach (a /proc scan) and those started later (the
//! kernel's exec announcements, `Probes::take_started`).
use regex::RegexSet;

use crate::config::CommTargets;

/// The command names to follow, compiled.
#[derive(Debug)]
pub struct CommWatch {
    /// Exact names, cut to the 15 bytes the kernel keeps.
    names: Vec<String>,
    patterns: RegexSet,
    pub max_targets: usize,
    /// PIDs left alone because of --max-targets (noticed once each).
    pub refused: std::collections::HashSet<u32>,
}

impl CommWatch {
    pub fn new(targets: &CommTargets) -> anyhow::Result<CommWatch> {
        Ok(CommWatch {
            names: targets
                .names
                .iter()
                .map(|name| kernel_comm(name).to_owned())
                .collect(),
            patterns: RegexSet::new(&targets.patterns)?,
            max_targets: targets.max_targets,
            refused: Default::default(),
        })
    }

    /// Whether a process with command name `comm` is to be traced.
    pub fn matches(&self, comm: &str) -> bool {
        self.names.iter().any(|name| name == comm) || self.patterns.is_match(comm)
    }

    /// The processes running now whose command name matches, oldest
    /// first: user processes only (kernel threads map no executable), and
    /// never tracer itself.
    pub fn running(&self) -> Vec<u32> {
        let own = std::process::id();
        let mut pids: Vec<u32> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != own && is_user_process(pid))
            .filter(|&pid| comm(pid).is_some_and(|comm| self.matches(&comm)))
            .collect();
        pids.sort_unstable();
        pids
    }
}

/// `/proc/PID/comm`, if the process still exists.
pub fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|comm| comm.trim_end_matches('\n').to_owned())
}

/// A process with an executable (kernel threads have none) that is the
/// leader of its thread group.
pub fn is_user_process(pid: u32) -> bool {
    crate::procfs::tgid(pid) == Some(pid) && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok()
}

/// `name` as the kernel keeps a command name: its first 15 bytes (cut on
/// a character boundary).
fn kernel_comm(name: &str) -> &str {
    let mut end = name.len().min(15);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(names: &[&str], patterns: &[&str]) -> CommWatch {
        CommWatch::new(&CommTargets {
            names: names.iter().map(|name| (*name).to_owned()).collect(),
            patterns: patterns.iter().map(|name| (*name).to_owned()).collect(),
            max_targets: 8,
        })
        .expect("valid patterns")
    }

    #[test]
    fn names_match_whole_and_cut_to_15_bytes() {
        let watch = watch(&["redis-server", "a-very-long-service-name"], &[]);
        assert!(watch.matches("redis-server"));
        assert!(!watch.matches("redis"));
        assert!(!watch.matches("redis-server2"));
        assert!(watch.matches("a-very-long-ser"));
    }

    #[test]
    fn patterns_match_anywhere_unless_anchored() {
        let watch = watch(&[], &["^python3", "worker$"]);
        assert!(watch.matches("python3.11"));
        assert!(watch.matches("gunicorn-worker"));
        assert!(!watch.matches("ipython3"));
    }

    #[test]
    fn finds_a_running_process_by_name_but_never_tracer_itself() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let found = watch(&["sleep"], &[]).running();
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&child.id()), "{found:?}");
        let own = comm(std::process::id()).expect("own comm");
        assert!(!watch(&[&own], &[]).running().contains(&std::process::id()));
    }
}
