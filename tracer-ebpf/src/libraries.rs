//! Notices libraries a traced process loads after attach (dlopen): a
//! tracepoint on mmap sends one EVENTS message when a traced process maps a
//! file with execute permission, and userspace looks the new object up.
//! EVENTS (`events.rs`) also carries the other rare events: exec, and CUDA
//! context destructions (`gpu.rs`).
use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use tracer_ebpf::{Event, event, mmap_format};

use crate::{
    events::send_event,
    live::{EXEC_TIME, end_context_epoch},
};

const PROT_EXEC: u64 = 4;

/// The processes traced, by tgid (the value is unused).
#[map]
static TRACED_TGIDS: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// Field offsets of `syscalls:sys_enter_mmap`, read from tracefs at load.
#[unsafe(no_mangle)]
static MMAP_PROT_OFFSET: Global<u32> = Global::new(mmap_format::PROT_OFFSET);
#[unsafe(no_mangle)]
static MMAP_FD_OFFSET: Global<u32> = Global::new(mmap_format::FD_OFFSET);

/// A traced process replaced its image (execve): its old blocks are gone.
#[tracepoint]
pub fn process_exec(_ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if unsafe { TRACED_TGIDS.get(&tgid) }.is_none() {
        return 0;
    }
    let now_ns = unsafe { bpf_ktime_get_ns() };
    let _ = EXEC_TIME.insert(&tgid, &now_ns, 0);
    // The image's CUDA contexts are gone with it.
    let context_epoch = end_context_epoch(tgid);
    send_event(&Event {
        what: event::EXEC,
        tgid,
        timestamp_ns: now_ns,
        context_epoch,
        pad: 0,
    });
    0
}

#[tracepoint]
pub fn exec_mapped(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if unsafe { TRACED_TGIDS.get(&tgid) }.is_none() {
        return 0;
    }
    let prot: u64 = unsafe { ctx.read_at(MMAP_PROT_OFFSET.load() as usize) }.unwrap_or(0);
    let fd: u64 = unsafe { ctx.read_at(MMAP_FD_OFFSET.load() as usize) }.unwrap_or(u64::MAX);
    if prot & PROT_EXEC == 0 || (fd as i32) < 0 {
        return 0;
    }
    send_event(&Event {
        what: event::EXEC_MAPPED,
        tgid,
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        ..Event::default()
    });
    0
}
