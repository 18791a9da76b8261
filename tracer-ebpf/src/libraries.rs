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
//! - at the loader's gate: `loader_gate`, a uprobe on ld.so's
//!   `_dl_debug_state` (which the loader calls once a dlopen's objects are
//!   all mapped, before any of their constructors runs), stops the process
//!   (SIGSTOP) while userspace has not looked at every shared object it
//!   opened (LOADS_OPENED against LOADS_DONE); userspace lets it go on
//!   (SIGCONT) once the objects are hooked, within a bound. A dlopen of a
//!   library that needs hooking then never returns before its hooks are
//!   in place.
//!
//! EVENTS (`events.rs`) also carries the other rare events: exec, and CUDA
//! context destructions (`gpu.rs`).
use aya_ebpf::{
    EbpfContext as _, Global,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
        bpf_probe_read_user_str_bytes, bpf_send_signal,
    },
    macros::{map, tracepoint, uprobe},
    maps::{HashMap, LruHashMap, RingBuf},
    programs::{ProbeContext, TracePointContext},
};
use tracer_ebpf::{OpenedFile, RareEvent, counted, event, mmap_format, openat_format, stat};

use crate::{
    counters::{atomic_add, count},
    events::send_event,
    live::{end_context_epoch, replace_image},
    runs::counted_run,
};

const PROT_EXEC: u64 = 4;

/// The processes traced, by tgid (the value is unused).
#[map]
pub(crate) static TRACED_TGIDS: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

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

/// Per traced process: shared objects sent to OPENED so far.
#[map]
static LOADS_OPENED: HashMap<u32, u64> = HashMap::with_max_entries(1024, 0);

/// Per traced process: how many of them userspace has looked at (and
/// hooked where they needed it); written by userspace only.
#[map]
static LOADS_DONE: HashMap<u32, u64> = HashMap::with_max_entries(1024, 0);

/// Processes the gate stopped, with when (`bpf_ktime_get_ns`), for
/// userspace to let go on.
#[map]
static LOADER_HELD: HashMap<u32, u64> = HashMap::with_max_entries(1024, 0);

const SIGSTOP: u32 = 19;
/// `r_debug.r_state` when the list of objects is complete.
const RT_CONSISTENT: i32 = 0;

/// Whether userspace has looked at every shared object `tgid` opened.
#[inline(always)]
fn loads_looked_at(tgid: u32) -> bool {
    let opened = unsafe { LOADS_OPENED.get(&tgid) }.copied().unwrap_or(0);
    let done = unsafe { LOADS_DONE.get(&tgid) }.copied().unwrap_or(0);
    done >= opened
}

/// On `_dl_debug_state`, scoped to one traced process; the attach cookie
/// is the distance from the probe to `_r_debug.r_state`. Marks the process
/// held before the last check, which userspace makes in the other order
/// (done, then held): one of the two sees the other's write.
#[uprobe]
pub fn loader_gate(ctx: ProbeContext) -> u32 {
    counted_run(counted::LOADER_GATE, || {
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
        // SAFETY: `regs` is the probed task's saved registers.
        let ip = unsafe { (*ctx.regs).rip };
        let state_address = ip.wrapping_add(cookie) as *const i32;
        match unsafe { bpf_probe_read_user(state_address) } {
            Ok(RT_CONSISTENT) => {}
            _ => return 0,
        }
        if loads_looked_at(tgid) {
            return 0;
        }
        let now = unsafe { bpf_ktime_get_ns() };
        if LOADER_HELD.insert(&tgid, &now, 0).is_err() {
            return 0;
        }
        if loads_looked_at(tgid) {
            let _ = LOADER_HELD.remove(&tgid);
            return 0;
        }
        unsafe {
            bpf_send_signal(SIGSTOP);
        }
        0
    })
}

/// One more shared object opened by `tgid`, for the gate.
#[inline(always)]
fn count_opened(tgid: u32) {
    if let Some(opened) = LOADS_OPENED.get_ptr_mut(&tgid) {
        atomic_add(opened, 1);
    } else if LOADS_OPENED.insert(&tgid, &1, BPF_NOEXIST as u64).is_err()
        && let Some(opened) = LOADS_OPENED.get_ptr_mut(&tgid)
    {
        // Another thread of the process made the entry first.
        atomic_add(opened, 1);
    }
}

/// A traced process replaced its image (execve): its old blocks are gone.
/// Runs before the new image's first instruction.
#[tracepoint]
pub fn process_exec(_ctx: TracePointContext) -> u32 {
    counted_run(counted::PROCESS_EXEC, || {
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        if unsafe { TRACED_TGIDS.get(&tgid) }.is_none() {
            return 0;
        }
        let now_ns = unsafe { bpf_ktime_get_ns() };
        replace_image(tgid, now_ns);
        // The image's CUDA contexts are gone with it.
        let context_epoch = end_context_epoch(tgid);
        send_event(&RareEvent {
            what: event::EXEC,
            tgid,
            timestamp_ns: now_ns,
            context_epoch,
            pad: 0,
        });
        0
    })
}

#[tracepoint]
pub fn exec_mapped(ctx: TracePointContext) -> u32 {
    counted_run(counted::EXEC_MAPPED, || {
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        if unsafe { TRACED_TGIDS.get(&tgid) }.is_none() {
            return 0;
        }
        let prot: u64 = unsafe { ctx.read_at(MMAP_PROT_OFFSET.load() as usize) }.unwrap_or(0);
        let fd: u64 = unsafe { ctx.read_at(MMAP_FD_OFFSET.load() as usize) }.unwrap_or(u64::MAX);
        if prot & PROT_EXEC == 0 || (fd as i32) < 0 {
            return 0;
        }
        send_event(&RareEvent {
            what: event::EXEC_MAPPED,
            tgid,
            timestamp_ns: unsafe { bpf_ktime_get_ns() },
            ..RareEvent::default()
        });
        0
    })
}

#[tracepoint]
pub fn open_enter(ctx: TracePointContext) -> u32 {
    counted_run(counted::OPEN_ENTER, || {
        let thread = bpf_get_current_pid_tgid();
        let tgid = (thread >> 32) as u32;
        if unsafe { TRACED_TGIDS.get(&tgid) }.is_none() {
            return 0;
        }
        let filename: u64 =
            unsafe { ctx.read_at(OPENAT_FILENAME_OFFSET.load() as usize) }.unwrap_or(0);
        let _ = OPENING.insert(&thread, &filename, 0);
        0
    })
}

/// Sends the path a traced thread opened, if the open succeeded and names
/// a shared object. The path is read here, after the kernel read it, so
/// its page is present.
#[tracepoint]
pub fn open_exit(ctx: TracePointContext) -> u32 {
    counted_run(counted::OPEN_EXIT, || {
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
        if !read || !tracer_ebpf::names_shared_object(path) {
            entry.discard(0);
            return 0;
        }
        unsafe {
            (*opened).tgid = (thread >> 32) as u32;
            (*opened).fd = fd as u32;
            (*opened).timestamp_ns = bpf_ktime_get_ns();
        }
        count(stat::LIBRARY_OPENS);
        // Counted before it is sent: userspace's count never runs ahead.
        count_opened((thread >> 32) as u32);
        entry.submit(0);
        0
    })
}
