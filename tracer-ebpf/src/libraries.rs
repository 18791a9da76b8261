//! Notices libraries a traced process loads after attach (dlopen), twice:
//! - at open: the `openat` tracepoints send the path of every shared
//!   object (`*.so`, `*.so.*`) a traced process opens to OPENED, waking
//!   userspace, which hooks the file while the loader is still reading its
//!   headers (uprobes are keyed by file, so they take effect at the
//!   mapping). Other files, and other processes, cost a hash lookup.
//! - late: a tracepoint on mmap sends one EVENTS message when a traced
//!   process maps a file with execute permission, and userspace looks the
//!   new object up (the fallback, a few milliseconds after the mapping).
//!
//! EVENTS (`events.rs`) also carries the other rare events: exec, and CUDA
//! context destructions (`gpu.rs`).
use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user_str_bytes},
    macros::{map, tracepoint},
    maps::{HashMap, LruHashMap, RingBuf},
    programs::TracePointContext,
};
use tracer_ebpf::{Event, OPENED_PATH_BYTES, OpenedFile, event, mmap_format, openat_format, stat};

use crate::{
    counters::count,
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

/// Field offsets of `syscalls:sys_enter_openat` and `sys_exit_openat`.
#[unsafe(no_mangle)]
static OPENAT_FILENAME_OFFSET: Global<u32> = Global::new(openat_format::FILENAME_OFFSET);
#[unsafe(no_mangle)]
static OPENAT_RET_OFFSET: Global<u32> = Global::new(openat_format::RET_OFFSET);

/// Per thread (pid_tgid) of a traced process: the path argument of its
/// `openat` between entry and exit.
#[map]
static OPENING: LruHashMap<u64, u64> = LruHashMap::with_max_entries(4096, 0);

/// Shared objects opened by traced processes, for userspace at once.
#[map]
static OPENED: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

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

#[tracepoint]
pub fn open_enter(ctx: TracePointContext) -> u32 {
    let thread = bpf_get_current_pid_tgid();
    let tgid = (thread >> 32) as u32;
    if unsafe { TRACED_TGIDS.get(&tgid) }.is_none() {
        return 0;
    }
    let filename: u64 = unsafe { ctx.read_at(OPENAT_FILENAME_OFFSET.load() as usize) }.unwrap_or(0);
    let _ = OPENING.insert(&thread, &filename, 0);
    0
}

/// Sends the path a traced thread opened, if the open succeeded and names
/// a shared object. The path is read here, after the kernel read it, so
/// its page is present.
#[tracepoint]
pub fn open_exit(ctx: TracePointContext) -> u32 {
    let thread = bpf_get_current_pid_tgid();
    let Some(&filename) = (unsafe { OPENING.get(&thread) }) else {
        return 0;
    };
    let _ = OPENING.remove(&thread);
    let fd: i64 = unsafe { ctx.read_at(OPENAT_RET_OFFSET.load() as usize) }.unwrap_or(-1);
    if fd < 0 {
        return 0;
    }
    let Some(mut entry) = OPENED.reserve::<OpenedFile>(0) else {
        count(stat::DROP_OPENED_FULL);
        return 0;
    };
    let opened = entry.as_mut_ptr();
    // SAFETY: `opened` points at the reserved entry, written before use.
    let path = unsafe { &mut (*opened).path };
    let read = unsafe { bpf_probe_read_user_str_bytes(filename as *const u8, path) }.is_ok();
    if !read || !names_shared_object(path) {
        entry.discard(0);
        return 0;
    }
    unsafe {
        (*opened).tgid = (thread >> 32) as u32;
        (*opened).fd = fd as u32;
        (*opened).timestamp_ns = bpf_ktime_get_ns();
    }
    count(stat::LIBRARY_OPENS);
    entry.submit(0);
    0
}

/// Whether a NUL-terminated path holds `.so` followed by its end or a dot
/// (`libcudart.so`, `libcudart.so.12`).
#[inline(always)]
fn names_shared_object(path: &[u8; OPENED_PATH_BYTES]) -> bool {
    let mut at = 0;
    while at + 3 < OPENED_PATH_BYTES {
        if path[at] == 0 {
            return false;
        }
        if path[at] == b'.'
            && path[at + 1] == b's'
            && path[at + 2] == b'o'
            && (path[at + 3] == 0 || path[at + 3] == b'.')
        {
            return true;
        }
        at += 1;
    }
    false
}
