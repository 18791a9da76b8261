//! `--follow-forks`: the kernel announces the new tasks of followed
//! processes (tracer-ebpf/src/forks.rs) in the FORKS queue, and collect
//! attaches to the children.
use anyhow::{Context as _, Result};
use aya::{
    maps::{HashMap, MapData, Queue},
    programs::TracePoint,
};

use crate::attach::{Probes, load::links::attach_tracepoint, load::load_error};
use crate::{
    error::{ExitCode, fatal},
    tracefs,
};

/// The program that announces new tasks of followed processes
/// (tracer-ebpf/src/forks.rs).
pub(in crate::attach) const FORK_PROGRAM: &str = tracer_ebpf::program::PROCESS_FORK;

impl Probes {
    /// Starts announcing the children of followed processes (`follow`):
    /// attaches the sched_process_fork tracepoint.
    pub fn watch_forks(&mut self) -> Result<()> {
        if tracefs::event_field_offset("sched", "sched_process_fork", "child_pid").is_none() {
            return Err(fatal(
                ExitCode::KernelUnsupported,
                "this kernel's sched:sched_process_fork tracepoint has no child_pid field: \
                 --follow-forks cannot work here",
            ));
        }
        let program: &mut TracePoint = self
            .ebpf
            .program_mut(FORK_PROGRAM)
            .with_context(|| format!("eBPF object lacks program {FORK_PROGRAM}"))?
            .try_into()
            .with_context(|| format!("eBPF program {FORK_PROGRAM} is not a tracepoint"))?;
        program
            .load()
            .map_err(|error| load_error(error.into()))
            .with_context(|| format!("could not load eBPF program {FORK_PROGRAM}"))?;
        let link = attach_tracepoint(&mut self.ebpf, FORK_PROGRAM, "sched", "sched_process_fork")?;
        self.links.tracepoints.push(link);
        Ok(())
    }

    /// Announces the children of `pid` from now on (see `watch_forks`).
    pub fn follow(&mut self, pid: u32) -> Result<()> {
        let mut followed: HashMap<&mut MapData, u32, u32> = HashMap::try_from(
            self.ebpf
                .map_mut(tracer_ebpf::map::FOLLOWED)
                .context("eBPF object lacks FOLLOWED")?,
        )?;
        followed
            .insert(pid, 1, 0)
            .with_context(|| format!("could not follow the children of PID {pid}"))
    }

    /// New tasks of followed processes since the last call: processes and
    /// threads alike.
    pub fn take_forks(&mut self) -> Vec<u32> {
        let Some(map) = self.ebpf.map_mut(tracer_ebpf::map::FORKS) else {
            return Vec::new();
        };
        let Ok(mut forks) = Queue::<&mut MapData, u32>::try_from(map) else {
            return Vec::new();
        };
        std::iter::from_fn(|| forks.pop(0).ok()).collect()
    }
}

/// The program that announces processes started with a watched name
/// (`--comm`, tracer-ebpf/src/forks.rs).
pub(in crate::attach) const COMM_EXEC_PROGRAM: &str = tracer_ebpf::program::COMM_EXEC;

impl Probes {
    /// Starts announcing the processes that exec an image named one of
    /// `names` (their `comm`, at most 15 bytes), or every exec when
    /// `every_exec` (for a pattern userspace matches): attaches the
    /// sched_process_exec tracepoint.
    pub fn watch_execs(&mut self, names: &[String], every_exec: bool) -> Result<()> {
        {
            let mut comm_names: HashMap<&mut MapData, [u8; 16], u8> = HashMap::try_from(
                self.ebpf
                    .map_mut(tracer_ebpf::map::COMM_NAMES)
                    .context("eBPF object lacks COMM_NAMES")?,
            )?;
            let keys = names
                .iter()
                .map(|name| comm_key(name))
                .chain(every_exec.then_some([0; 16]));
            for key in keys {
                comm_names
                    .insert(key, 1, 0)
                    .context("could not watch for command names")?;
            }
        }
        let program: &mut TracePoint = self
            .ebpf
            .program_mut(COMM_EXEC_PROGRAM)
            .with_context(|| format!("eBPF object lacks program {COMM_EXEC_PROGRAM}"))?
            .try_into()
            .with_context(|| format!("eBPF program {COMM_EXEC_PROGRAM} is not a tracepoint"))?;
        program
            .load()
            .map_err(|error| load_error(error.into()))
            .with_context(|| format!("could not load eBPF program {COMM_EXEC_PROGRAM}"))?;
        let link = attach_tracepoint(
            &mut self.ebpf,
            COMM_EXEC_PROGRAM,
            "sched",
            "sched_process_exec",
        )?;
        self.links.tracepoints.push(link);
        Ok(())
    }

    /// Processes that exec'd a watched name since the last call.
    pub fn take_started(&mut self) -> Vec<u32> {
        let Some(map) = self.ebpf.map_mut(tracer_ebpf::map::STARTED) else {
            return Vec::new();
        };
        let Ok(mut started) = Queue::<&mut MapData, u32>::try_from(map) else {
            return Vec::new();
        };
        std::iter::from_fn(|| started.pop(0).ok()).collect()
    }
}

/// A command name as the kernel keeps it: at most 15 bytes, NUL-padded.
fn comm_key(name: &str) -> [u8; 16] {
    let mut key = [0; 16];
    for (slot, byte) in key.iter_mut().zip(name.bytes().take(15)) {
        *slot = byte;
    }
    key
}
