//! The resident-growth mode's events (`--resident`): the user page faults
//! of the followed processes (`exceptions:page_fault_user`) and madvise
//! (advice that gives pages back), programs of
//! tracer-ebpf/src/mappings.rs that send their
//! events through the mapping calls' ring and filter on the mapping
//! calls' TARGETS: following a process is the mapping source's
//! `follow`. Nothing here traps an allocator call: with `--resident`
//! only the CUDA calls keep their uprobes (`Probes::attach_sites`).
use anyhow::{Context as _, Result, bail};
use aya::{Ebpf, programs::TracePoint};

use crate::attach::load::links::{TracepointLink, attach_tracepoint};

/// Loads and attaches the resident mode's programs.
pub(in crate::attach) fn attach(ebpf: &mut Ebpf) -> Result<Vec<TracepointLink>> {
    if crate::tracefs::event_id("exceptions", "page_fault_user").is_none() {
        bail!(
            "this kernel has no exceptions:page_fault_user tracepoint (x86-64 has it): \
             --resident cannot see page faults"
        );
    }
    let mut links = Vec::new();
    for (program_name, category, event) in [
        (
            tracer_ebpf::program::PAGE_FAULT,
            "exceptions",
            "page_fault_user",
        ),
        (
            tracer_ebpf::program::MADVISE_ENTER,
            "syscalls",
            "sys_enter_madvise",
        ),
        (
            tracer_ebpf::program::MAPPING_EXIT,
            "syscalls",
            "sys_exit_madvise",
        ),
    ] {
        let program: &mut TracePoint = ebpf
            .program_mut(program_name)
            .with_context(|| format!("eBPF object lacks program {program_name}"))?
            .try_into()
            .with_context(|| format!("eBPF program {program_name} is not a tracepoint"))?;
        if program.fd().is_err() {
            program
                .load()
                .with_context(|| format!("could not load eBPF program {program_name}"))?;
        }
        links.push(attach_tracepoint(ebpf, program_name, category, event)?);
    }
    Ok(links)
}
