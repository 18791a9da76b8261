//! The mapping tracepoints: where their fields are (read from tracefs, never
//! hard-coded), loading and attaching the programs of
//! `tracer-ebpf/src/mappings.rs`, and the TARGETS filter that keeps them to
//! the traced processes: the mapping calls' `Source`.
use anyhow::{Context as _, Result, anyhow};
use aya::{Ebpf, maps::HashMap};
use tracer_ebpf::SyscallFieldOffsets;

use super::{Source, remove_entries};
use crate::attach::load::links::{TracepointLink, load_and_attach_tracepoint};
use crate::tracefs;

/// The programs and the `syscalls` tracepoints they go on.
const TRACEPOINTS: [(&str, &str); 10] = [
    (tracer_ebpf::program::MMAP_ENTER, "sys_enter_mmap"),
    (tracer_ebpf::program::MUNMAP_ENTER, "sys_enter_munmap"),
    (tracer_ebpf::program::MREMAP_ENTER, "sys_enter_mremap"),
    // One program for mmap and brk (`__syscall_nr` tells them apart).
    (tracer_ebpf::program::MMAP_ENTER, "sys_enter_brk"),
    (tracer_ebpf::program::MPROTECT_ENTER, "sys_enter_mprotect"),
    (tracer_ebpf::program::MAPPING_EXIT, "sys_exit_mmap"),
    (tracer_ebpf::program::MAPPING_EXIT, "sys_exit_munmap"),
    (tracer_ebpf::program::MAPPING_EXIT, "sys_exit_mremap"),
    (tracer_ebpf::program::MAPPING_EXIT, "sys_exit_brk"),
    (tracer_ebpf::program::MAPPING_EXIT, "sys_exit_mprotect"),
];

/// Whether a program of the object is a mapping tracepoint program.
pub fn is_mapping_program(name: &str) -> bool {
    TRACEPOINTS.iter().any(|(program, _)| *program == name)
}

/// The field offsets the mapping programs read, from tracefs.
pub fn read_field_offsets() -> Result<SyscallFieldOffsets> {
    let field = |event: &str, name: &str| -> Result<u64> {
        tracefs::required_field_offset("syscalls", event, name).map(u64::from)
    };
    let exit_ret = field("sys_exit_mmap", "ret")?;
    for (_, event) in TRACEPOINTS
        .iter()
        .filter(|(_, e)| e.starts_with("sys_exit"))
    {
        if field(event, "ret")? != exit_ret {
            return Err(anyhow!(
                "the syscall exit tracepoints disagree on where `ret` is"
            ));
        }
    }
    let syscall_nr = field("sys_enter_mmap", "__syscall_nr")?;
    if field("sys_enter_brk", "__syscall_nr")? != syscall_nr {
        return Err(anyhow!(
            "sys_enter_mmap and sys_enter_brk disagree on where `__syscall_nr` is"
        ));
    }
    Ok(SyscallFieldOffsets {
        mmap_addr: field("sys_enter_mmap", "addr")?,
        mmap_len: field("sys_enter_mmap", "len")?,
        mmap_prot: field("sys_enter_mmap", "prot")?,
        mmap_flags: field("sys_enter_mmap", "flags")?,
        mmap_fd: field("sys_enter_mmap", "fd")?,
        munmap_addr: field("sys_enter_munmap", "addr")?,
        munmap_len: field("sys_enter_munmap", "len")?,
        mremap_addr: field("sys_enter_mremap", "addr")?,
        mremap_old_len: field("sys_enter_mremap", "old_len")?,
        mremap_new_len: field("sys_enter_mremap", "new_len")?,
        mprotect_start: field("sys_enter_mprotect", "start")?,
        mprotect_len: field("sys_enter_mprotect", "len")?,
        mprotect_prot: field("sys_enter_mprotect", "prot")?,
        madvise_start: field("sys_enter_madvise", "start")?,
        madvise_len: field("sys_enter_madvise", "len_in")
            .or_else(|_| field("sys_enter_madvise", "len"))?,
        madvise_behavior: field("sys_enter_madvise", "behavior")?,
        // Read only with --resident (`faults`), which checks the event.
        fault_address: crate::tracefs::event_field_offset(
            "exceptions",
            "page_fault_user",
            "address",
        )
        .map_or(0, u64::from),
        fault_error_code: crate::tracefs::event_field_offset(
            "exceptions",
            "page_fault_user",
            "error_code",
        )
        .map_or(0, u64::from),
        exit_ret,
        syscall_nr,
        brk_syscall: libc::SYS_brk as u64,
    })
}

/// Loads the mapping programs and attaches them to their tracepoints;
/// they do nothing until a process is added to TARGETS.
pub(in crate::attach) fn attach_tracepoints(ebpf: &mut Ebpf) -> Result<Vec<TracepointLink>> {
    let mut links = Vec::new();
    for (program_name, event) in TRACEPOINTS {
        links.push(load_and_attach_tracepoint(
            ebpf,
            program_name,
            "syscalls",
            event,
        )?);
    }
    links.push(load_and_attach_tracepoint(
        ebpf,
        tracer_ebpf::program::PROCESS_EXIT,
        "sched",
        "sched_process_exit",
    )?);
    Ok(links)
}

/// The mapping calls.
pub struct MappingCalls;

impl Source for MappingCalls {
    fn name(&self) -> &'static str {
        "mapping calls"
    }

    /// From its current program break on (`collect::mappings`).
    fn follow(&self, ebpf: &mut Ebpf, pid: u32) -> Result<()> {
        add_target(ebpf, pid)
    }

    fn forget(&self, ebpf: &mut Ebpf, pid: u32) {
        remove_entries::<u32, u32>(ebpf, tracer_ebpf::map::TARGETS, |key| *key == pid);
    }
}

/// Makes the mapping programs follow `pid`.
fn add_target(ebpf: &mut Ebpf, pid: u32) -> Result<()> {
    set_target(ebpf, pid, tracer_ebpf::target::MAPPINGS)
}

/// Sets how the mapping programs follow `pid` (`tracer_ebpf::target`).
pub(in crate::attach) fn set_target(ebpf: &mut Ebpf, pid: u32, how: u32) -> Result<()> {
    let mut targets: HashMap<_, u32, u32> = HashMap::try_from(
        ebpf.map_mut(tracer_ebpf::map::TARGETS)
            .context("eBPF object lacks TARGETS")?,
    )?;
    targets
        .insert(pid, how, 0)
        .with_context(|| format!("could not add PID {pid} to the mapping targets"))
}
