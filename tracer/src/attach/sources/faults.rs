//! The resident-growth mode's events (`--resident`): the user page faults
//! of the followed processes (`exceptions:page_fault_user`) and madvise
//! (advice that gives pages back), programs of
//! tracer-ebpf/src/mappings.rs that send their
//! events through the mapping calls' ring and filter on the mapping
//! calls' TARGETS: following a process is the mapping source's
//! `follow`. Nothing here traps an allocator call: with `--resident`
//! only the CUDA calls keep their uprobes (`Probes::attach_sites`).
use anyhow::{Context as _, Result, bail};
use aya::Ebpf;

use crate::attach::load::links::{TracepointLink, load_and_attach_tracepoint};

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
        links.push(load_and_attach_tracepoint(
            ebpf,
            program_name,
            category,
            event,
        )?);
    }
    Ok(links)
}

/// Follows the page faults of `pid` at sampling shift `shift`, and its
/// mapping calls without their stacks (only what they give back counts).
pub(in crate::attach) fn follow(ebpf: &mut Ebpf, pid: u32, shift: u32) -> Result<()> {
    super::mappings::set_target(ebpf, pid, how(shift))
}

/// Every process followed for its faults follows them at `shift` now.
pub(in crate::attach) fn set_sample_shift(ebpf: &mut Ebpf, shift: u32) -> Result<()> {
    let mut targets: aya::maps::HashMap<_, u32, u32> = aya::maps::HashMap::try_from(
        ebpf.map_mut(tracer_ebpf::map::TARGETS)
            .context("eBPF object lacks TARGETS")?,
    )?;
    let followed: Vec<u32> = targets
        .iter()
        .filter_map(Result::ok)
        .filter(|(_, value)| value & tracer_ebpf::target::RESIDENT != 0)
        .map(|(pid, _)| pid)
        .collect();
    for pid in followed {
        // A process gone meanwhile is fine.
        let _ = targets.insert(pid, how(shift), 0);
    }
    Ok(())
}

fn how(shift: u32) -> u32 {
    tracer_ebpf::target::MAPPINGS
        | tracer_ebpf::target::RESIDENT
        | (shift.min(tracer_ebpf::target::MAX_SAMPLE_SHIFT)
            << tracer_ebpf::target::SAMPLE_SHIFT_BIT)
}
