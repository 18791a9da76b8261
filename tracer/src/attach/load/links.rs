//! The links that hold tracer's programs in place, and their release.
//!
//! Releasing a link costs the kernel a grace period: ~0.05 s for a
//! uprobe_multi link and ~0.2 s for a perf-event tracepoint on a loaded VM.
//! One after another, the twenty-odd links of a run took seconds after
//! Ctrl-C; released from threads of their own, the grace periods overlap
//! and the whole set goes in about the time of one.
use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    programs::{TracePoint, trace_point::TracePointLinkId},
};

use crate::attach::Probes;

/// A tracepoint program attached to an event.
pub(in crate::attach) struct TracepointLink {
    program: &'static str,
    id: TracePointLinkId,
    /// The event's tracefs id.
    pub event_id: Option<u64>,
}

/// The tracepoint program `program` of the object.
fn tracepoint_mut<'a>(ebpf: &'a mut Ebpf, program: &str) -> Result<&'a mut TracePoint> {
    ebpf.program_mut(program)
        .with_context(|| format!("eBPF object lacks program {program}"))?
        .try_into()
        .with_context(|| format!("eBPF program {program} is not a tracepoint"))
}

/// Loads the tracepoint program `program` unless it is loaded, and
/// attaches it to `category:event`.
pub(in crate::attach) fn load_and_attach_tracepoint(
    ebpf: &mut Ebpf,
    program: &'static str,
    category: &str,
    event: &str,
) -> Result<TracepointLink> {
    let tracepoint = tracepoint_mut(ebpf, program)?;
    if tracepoint.fd().is_err() {
        tracepoint
            .load()
            .with_context(|| format!("could not load eBPF program {program}"))?;
    }
    attach_tracepoint(ebpf, program, category, event)
}

/// Attaches the (loaded) tracepoint program `program` to `category:event`.
pub(in crate::attach) fn attach_tracepoint(
    ebpf: &mut Ebpf,
    program: &'static str,
    category: &str,
    event: &str,
) -> Result<TracepointLink> {
    let tracepoint = tracepoint_mut(ebpf, program)?;
    let id = tracepoint
        .attach(category, event)
        .with_context(|| format!("could not attach {program} to tracepoint {category}:{event}"))?;
    let event_id = crate::tracefs::event_id(category, event);
    Ok(TracepointLink {
        program,
        id,
        event_id,
    })
}

/// Drops every link at once, each on a thread of its own.
fn release_together(links: Vec<Box<dyn Send>>) {
    std::thread::scope(|scope| {
        for link in links {
            scope.spawn(move || drop(link));
        }
    });
}

impl Drop for Probes {
    fn drop(&mut self) {
        let mut links: Vec<Box<dyn Send>> = Vec::new();
        for TracepointLink { program, id, .. } in self.links.tracepoints.drain(..) {
            let tracepoint: Option<&mut TracePoint> = self
                .ebpf
                .program_mut(program)
                .and_then(|program| program.try_into().ok());
            if let Some(link) = tracepoint.and_then(|tracepoint| tracepoint.take_link(id).ok()) {
                links.push(Box::new(link));
            }
        }
        for (_, program, id) in self.links.perf.drain(..) {
            if let Ok(link) = crate::attach::program(&mut self.ebpf, program)
                .and_then(|uprobe| uprobe.take_link(id).map_err(Into::into))
            {
                links.push(Box::new(link));
            }
        }
        for raw in [&mut self.links.multi, &mut self.links.session]
            .into_iter()
            .flatten()
        {
            links.extend(
                raw.take_links()
                    .into_iter()
                    .map(|link| Box::new(link) as Box<dyn Send>),
            );
        }
        release_together(links);
    }
}

impl Probes {
    /// Detaches the uprobes of `pid`, which exited (`--comm`): its links
    /// are closed on a thread of their own, since closing each one waits
    /// for a grace period and collection must not.
    pub(in crate::attach) fn release_links_of(&mut self, pid: u32) {
        let mut links: Vec<Box<dyn Send>> = Vec::new();
        let (of_pid, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.links.perf)
            .into_iter()
            .partition(|(link_pid, _, _)| *link_pid == pid);
        self.links.perf = others;
        for (_, program, id) in of_pid {
            if let Ok(link) = crate::attach::program(&mut self.ebpf, program)
                .and_then(|uprobe| uprobe.take_link(id).map_err(Into::into))
            {
                links.push(Box::new(link));
            }
        }
        for raw in [&mut self.links.multi, &mut self.links.session]
            .into_iter()
            .flatten()
        {
            links.extend(
                raw.take_links_of(pid)
                    .into_iter()
                    .map(|link| Box::new(link) as Box<dyn Send>),
            );
        }
        if !links.is_empty() {
            std::thread::spawn(move || release_together(links));
        }
    }
}
