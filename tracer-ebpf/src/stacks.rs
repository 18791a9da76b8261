//! Where a new block's stack comes from: the kernel's frame-pointer walk
//! (STACKS), or, for processes whose stacks are copied (`--unwind copy`,
//! or `auto` for a Go program that calls C), a copy of the top of the
//! user stack that userspace unwinds from `.eh_frame`
//! (`copy.rs`).

mod copy;

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_NO_PREALLOC, BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task_btf, bpf_probe_read_kernel,
        bpf_task_pt_regs, generated::bpf_get_stack,
    },
    macros::map,
    maps::{Array, HashMap, Queue},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_ebpf::{
    MAX_STACK_FRAMES, NO_STACK, PYTHON_FRAME_TAG, StackFrames, stack_record, stat,
    unwind_walk::Registers,
};

use crate::{
    counters::{count, fetch_add},
    scratch::scratch,
};
use copy::copy_stack;
pub(crate) use copy::{send_exec, send_free};

/// 0: every stack is walked by frame pointers; 1: every stack is copied;
/// 2: stacks of the processes in COPY_STACKS_OF are copied.
#[unsafe(no_mangle)]
static STACK_COPY_MODE: aya_ebpf::Global<u32> = aya_ebpf::Global::new(0);

/// Most distinct stacks held at once (`--max-stacks`), set by userspace:
/// ids are below it.
#[unsafe(no_mangle)]
static MAX_STACKS: aya_ebpf::Global<u32> = aya_ebpf::Global::new(1 << 17);

/// The frames of each stack, by id. Entries are made on first use (no
/// preallocation): a table sized for many stacks costs kernel memory only
/// for the stacks held.
///
/// The table holds what is live plus a working set, not every stack ever
/// seen: userspace evicts stacks that hold nothing (`tracer`'s
/// `collect::stack_table` has the protocol). It unlinks a stack's hash
/// from STACK_IDS first, so that no new walk finds its id; a grace period
/// later, once BY_STACK shows that the id still holds nothing, it deletes
/// the id's entries here and in BY_STACK and gives the id back through
/// STACK_FREE_IDS. An id in use is never overwritten, so a live block's
/// stack never changes; a stack walked again after its eviction gets an
/// id anew, and userspace joins the two by their frames.
#[map]
static STACKS: HashMap<u32, StackFrames> = HashMap::with_max_entries(1 << 17, BPF_F_NO_PREALLOC);

/// Ids of evicted stacks, given back by userspace, handed out again
/// before new ones (first in, first out: an id comes back as late as it
/// can). Sized by userspace to hold every id.
#[map]
static STACK_FREE_IDS: Queue<u32> = Queue::with_max_entries(1 << 17, 0);

/// The id of each distinct stack, by a 64-bit hash of its frames. Unlike
/// the kernel's stack-trace map, which refuses a stack whose bucket holds
/// another, distinct stacks never collide below capacity (a 64-bit hash
/// collision is ~1e-10 likely with 10^5 stacks). The hash is no secret,
/// and a target chooses its return addresses: a hit is checked against
/// the frames in STACKS (`same_stack`), so no stack is counted as another. Entries are made on use:
/// a new stack is rare beside the lookups, and preallocating them cost
/// 10-20 ms of every attach.
#[map]
static STACK_IDS: HashMap<u64, u32> = HashMap::with_max_entries(1 << 17, BPF_F_NO_PREALLOC);

/// The next stack id never handed out.
#[map]
static NEXT_STACK_ID: Array<u64> = Array::with_max_entries(1, 0);

/// Processes whose stacks are copied (`--unwind auto`), set by userspace.
#[map]
pub(crate) static COPY_STACKS_OF: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);

/// The stack of a block made by the call returning now, for its LIVE
/// entry: a STACKS id, a copied-stack reference, or `NO_STACK`.
#[inline(always)]
pub(crate) fn capture(
    ctx: &RetProbeContext,
    return_address: u64,
    size: u64,
    kind: u32,
    api: u32,
    context_epoch: u32,
) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let copies = copies_stacks_of(tgid);
    let python = crate::python::current_stack();
    if copies {
        let regs = unsafe { &*ctx.regs };
        let block = Block {
            record: stack_record::COPY,
            tgid,
            size,
            kind,
            api,
            context_epoch,
            python: python.unwrap_or(0),
        };
        // The return address read at entry, when there is one: the
        // instruction pointer a uprobe session's return program sees can
        // be the uprobe trampoline's.
        let ip = if return_address != 0 {
            return_address
        } else {
            regs.rip
        };
        if let Some(stack_ref) = copy_stack(&block, ip, regs.rsp, regs.rbp) {
            return stack_ref;
        }
    }
    let regs = unsafe { &*ctx.regs };
    let start = Registers {
        ip: if return_address != 0 {
            return_address
        } else {
            regs.rip
        },
        sp: regs.rsp,
        bp: regs.rbp,
    };
    walk_stack(ctx, tgid, python, Some(start))
}

/// The return address of the call entered now (the word at the stack
/// pointer: tracer's entry sites never move it) when the stacks of the
/// current process are copied; 0 otherwise.
#[inline(always)]
pub(crate) fn return_address_at_entry(ctx: &ProbeContext) -> u64 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !copies_stacks_of(tgid) && !crate::unwind::walks(tgid) {
        return 0;
    }
    let sp = unsafe { (*ctx.regs).rsp };
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(sp as *const u64) }.unwrap_or(0)
}

/// Whether the stacks of `tgid` are copied.
#[inline(always)]
fn copies_stacks_of(tgid: u32) -> bool {
    match STACK_COPY_MODE.load() {
        0 => false,
        1 => true,
        _ => unsafe { COPY_STACKS_OF.get(&tgid) }.is_some(),
    }
}

/// At a system call of `tgid` (the mapping tracepoints): a copy of the
/// user stack where the call was made, as a `stack_record::MAPPING_COPY`;
/// None when this process's stacks are walked by frame pointers or the
/// ring is full.
#[inline(always)]
pub(crate) fn copy_at_syscall(tgid: u32) -> Option<u32> {
    if !copies_stacks_of(tgid) {
        return None;
    }
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u64;
    let read = |index: usize| unsafe { bpf_probe_read_kernel(regs.add(index)) }.ok();
    let (ip, sp, bp) = (
        read(PT_REGS_IP_INDEX)?,
        read(PT_REGS_SP_INDEX)?,
        read(PT_REGS_BP_INDEX)?,
    );
    let call = Block {
        record: stack_record::MAPPING_COPY,
        tgid,
        size: 0,
        kind: 0,
        api: u32::MAX,
        context_epoch: 0,
        python: crate::python::current_stack().unwrap_or(0),
    };
    copy_stack(&call, ip, sp, bp)
}

/// At a system call of `tgid` (the mapping tracepoints), or at a page
/// fault (`at_fault`): the id of its user stack walked through the unwind
/// tables from the registers where the call was made or the fault taken;
/// None when the process has none.
///
/// A walk looks up each frame's row one byte before its address (a
/// return address, or the address after a system call instruction); a
/// faulting instruction restarts, so its own row applies: the walk starts
/// one byte after it (its first frame then names the faulting instruction
/// as a return address one past it would).
#[inline(always)]
pub(crate) fn walk_at_syscall(ctx: &impl EbpfContext, tgid: u32, at_fault: bool) -> Option<u32> {
    if !crate::unwind::walks(tgid) {
        return None;
    }
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u64;
    let read = |index: usize| unsafe { bpf_probe_read_kernel(regs.add(index)) }.ok();
    let ip = read(PT_REGS_IP_INDEX)?;
    let start = Registers {
        ip: if at_fault { ip.wrapping_add(1) } else { ip },
        sp: read(PT_REGS_SP_INDEX)?,
        bp: read(PT_REGS_BP_INDEX)?,
    };
    Some(walk_stack(
        ctx,
        tgid,
        crate::python::current_stack(),
        Some(start),
    ))
}

/// Indices of rbp, rip and rsp in the kernel's `struct pt_regs` (x86-64,
/// the ptrace register layout).
const PT_REGS_BP_INDEX: usize = 4;
const PT_REGS_IP_INDEX: usize = 16;
pub(crate) const PT_REGS_SP_INDEX: usize = 19;

/// What a copy record says besides the stack.
#[repr(C)]
pub struct Block {
    record: u32,
    tgid: u32,
    size: u64,
    kind: u32,
    api: u32,
    context_epoch: u32,
    /// The Python stack's id (`python.rs`), 0 for none.
    python: u32,
}

/// The kernel's frame-pointer walk of the user stack: the id of that
/// stack in STACKS, stored on its first walk.
#[inline(always)]
pub(crate) fn walk_frame_pointers(ctx: &impl EbpfContext) -> u32 {
    walk_stack(ctx, 0, crate::python::current_stack(), None)
}

/// The id of the user stack: walked from `start` through the unwind
/// tables of `tgid` (`unwind.rs`) when it has them, by frame pointers
/// otherwise, with the current Python stack (`python.rs`) walked already:
/// its id becomes the stack's last frame.
#[inline(always)]
fn walk_stack(
    ctx: &impl EbpfContext,
    tgid: u32,
    python: Option<u32>,
    start: Option<Registers>,
) -> u32 {
    let Some(scratch) = scratch() else {
        count(stat::DROP_STACK_ERROR);
        return NO_STACK;
    };
    // Python frames (python.rs): their stack's id is the last frame.
    let room = if python.is_some() {
        MAX_STACK_FRAMES - 1
    } else {
        MAX_STACK_FRAMES
    };
    let walked = start.is_some_and(|start| {
        crate::unwind::tracer_unwind_walk(tgid, start.ip, start.sp, start.bp, room as u64) != 0
    });
    if !walked {
        // Masked so the verifier sees the size bounded by the scratch value.
        let size = (room * 8) as u32 & (size_of::<StackFrames>() as u32 - 1);
        let bytes =
            unsafe { bpf_get_stack(ctx.as_ptr(), scratch.cast(), size, BPF_F_USER_STACK as u64) };
        if bytes <= 0 {
            count(stat::DROP_STACK_ERROR);
            return NO_STACK;
        }
        let stack = unsafe { &mut *scratch };
        stack.count = (bytes as u64 / 8).min(room as u64);
    }
    tracer_store_stack(python.map_or(-1, i64::from))
}

/// The id of the stack in the scratch, with the Python stack `python`
/// (-1 for none) as its last frame: looked up, or stored. A global
/// function, verified once per program (see `tracer_unwind_walk`).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn tracer_store_stack(python: i64) -> u32 {
    let Some(scratch) = scratch() else {
        count(stat::DROP_STACK_ERROR);
        return NO_STACK;
    };
    let stack = unsafe { &mut *scratch };
    if python >= 0 {
        let id = python as u32;
        let index = stack.count as usize;
        if index < MAX_STACK_FRAMES {
            stack.frames[index] = PYTHON_FRAME_TAG | id as u64;
            stack.count += 1;
        }
    }
    let hash = stack.hash();
    if let Some(&id) = unsafe { STACK_IDS.get(&hash) } {
        return same_stack(id, stack);
    }
    store_stack(hash, stack)
}

/// `id` if its stored frames are `stack`'s; else NO_STACK, counted: the
/// hash is unkeyed, so a target could forge return addresses whose hash
/// is another stack's and have its blocks counted there.
#[inline(always)]
fn same_stack(id: u32, stack: &StackFrames) -> u32 {
    let Some(stored) = (unsafe { STACKS.get(&id) }) else {
        count(stat::DROP_STACK_COLLISION);
        return NO_STACK;
    };
    if stored.count != stack.count {
        count(stat::DROP_STACK_COLLISION);
        return NO_STACK;
    }
    for index in 0..MAX_STACK_FRAMES {
        if index as u64 >= stack.count {
            break;
        }
        if stored.frames[index] != stack.frames[index] {
            count(stat::DROP_STACK_COLLISION);
            return NO_STACK;
        }
    }
    id
}

/// Hands a new stack an id and stores its frames. An id taken but not
/// used (the table refused the entry, or another CPU stored the same
/// stack first) goes back to STACK_FREE_IDS: no id is lost.
#[inline(never)]
fn store_stack(hash: u64, stack: &StackFrames) -> u32 {
    let Some(id) = new_stack_id() else {
        count(stat::DROP_STACK_TABLE_FULL);
        return NO_STACK;
    };
    if STACKS.insert(&id, stack, BPF_NOEXIST as u64).is_err() {
        give_back(id);
        count(stat::DROP_STACK_ERROR);
        return NO_STACK;
    }
    if STACK_IDS.insert(&hash, &id, BPF_NOEXIST as u64).is_ok() {
        return id;
    }
    // Another CPU stored the same stack first: use its id.
    let _ = STACKS.remove(&id);
    give_back(id);
    match unsafe { STACK_IDS.get(&hash) } {
        Some(&first) => same_stack(first, stack),
        None => {
            count(stat::DROP_STACK_TABLE_FULL);
            NO_STACK
        }
    }
}

/// An id for a new stack: one given back, else one never used; None when
/// every id below MAX_STACKS is held.
#[inline(always)]
fn new_stack_id() -> Option<u32> {
    if let Ok(Some(id)) = STACK_FREE_IDS.pop() {
        return Some(id);
    }
    let next = NEXT_STACK_ID.get_ptr_mut(0)?;
    let id = fetch_add(next, 1);
    (id < MAX_STACKS.load() as u64).then_some(id as u32)
}

/// Returns an id taken by `new_stack_id` and not used.
#[inline(always)]
fn give_back(id: u32) {
    // The queue holds every id: it has room.
    let _ = STACK_FREE_IDS.push(id, 0);
}
