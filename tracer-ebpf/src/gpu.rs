//! The CUDA probes: driver (`libcuda.so.1`) and runtime (`libcudart`)
//! allocation entry points, in whichever object exports them.
//!
//! Every CUDA call returns 0 on success and hands its result back through
//! an out-parameter, so the entry stashes the arguments in GPU_PENDING and
//! the one return program reads the out-parameters only when the call
//! returned 0. The attach cookie says which API a probe is on and which
//! kind of memory it hands out, so one entry program serves every function
//! of one call shape.
//!
//! Layers are kept apart: only the outermost CUDA call on a thread counts,
//! so the cuMemAlloc that cudaMalloc makes moves a depth counter and is not
//! counted again. GPU_PENDING is not the malloc family's PENDING, so a
//! malloc inside a CUDA call (or around one) is counted as the heap it is.
//!
//! Virtual memory management (cuMemCreate/cuMemMap/cuMemUnmap/cuMemRelease)
//! counts physical memory: it is allocated by cuMemCreate and freed when
//! its handle is released *and* its last mapping is unmapped.
//!
//! Destroying or resetting a CUDA context (cuCtxDestroy_v2,
//! cuDevicePrimaryCtxReset_v2, cudaDeviceReset) releases the memory the
//! context owns without a free. Blocks carry the process's context epoch,
//! and a successful destruction ends it: blocks of older epochs are gone
//! (their frees are ignored, a new block at their address replaces them
//! silently), and since each epoch is summed apart in BY_STACK, what the
//! ended epoch held stays there, frozen, for userspace to read. Which
//! context a block belongs to is not followed (the runtime switches
//! contexts through the driver's internal entry points): any destruction
//! ends the epoch of every context of the process.
use aya_ebpf::{
    EbpfContext as _,
    bindings::{BPF_ANY, BPF_F_NO_PREALLOC},
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
    },
    macros::{map, uprobe, uretprobe},
    maps::HashMap,
    programs::{ProbeContext, RetProbeContext},
};
use tracer_ebpf::{
    ByStackKey, GpuPending, LiveAlloc, LiveKey, RareEvent, VmmHandle, counted, event, gpu_api,
    gpu_call, stat,
};

use crate::{
    args::arg,
    counters::{atomic_add, count, fetch_add},
    events::send_event,
    gpu_pending::GPU_PENDING,
    live::{
        add_to_stack, context_epoch, end_context_epoch, put_live, remove_from_stack, stack_key,
        take_live,
    },
    runs::counted_run,
};

/// Physical memory of cuMemCreate, by (tgid, handle). This map and the two
/// below make entries on use (no preallocation): their calls are rare, and
/// preallocated they cost every attach, also without CUDA, some 25 ms.
#[map]
static VMM_HANDLES: HashMap<LiveKey, VmmHandle> =
    HashMap::with_max_entries(1 << 16, BPF_F_NO_PREALLOC);

/// Mappings of physical memory, by (tgid, device address): the handle.
#[map]
static VMM_MAPPINGS: HashMap<LiveKey, u64> = HashMap::with_max_entries(1 << 16, BPF_F_NO_PREALLOC);

/// The `gpu_api` id of the call that made each GPU stack's memory.
#[map]
static STACK_API: HashMap<ByStackKey, u32> = HashMap::with_max_entries(1 << 14, BPF_F_NO_PREALLOC);

/// Starts a CUDA call unless one is already in progress on this thread.
#[inline(always)]
fn enter(ctx: &ProbeContext, call: GpuPending) -> u32 {
    let thread = bpf_get_current_pid_tgid();
    if let Some(pending) = GPU_PENDING.get_ptr_mut(&thread)
        && unsafe { (*pending).depth } > 0
    {
        unsafe { (*pending).depth += 1 };
        count(stat::GPU_NESTED_CALLS);
        return 0;
    }
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let pending = GpuPending {
        depth: 1,
        kind: (cookie >> 32) as u32,
        api: cookie as u32,
        ..call
    };
    if GPU_PENDING
        .insert(&thread, &pending, BPF_ANY as u64)
        .is_err()
    {
        count(stat::DROP_PENDING_FULL);
    }
    0
}

fn call(call: u32, pointer: u64, size: u64) -> GpuPending {
    GpuPending {
        call,
        pointer,
        size,
        ..GpuPending::default()
    }
}

/// `(void **out, size_t size, ...)`: cudaMalloc, cuMemAlloc_v2, the
/// managed, pinned host and async variants.
#[uprobe]
pub fn gpu_alloc_enter(ctx: ProbeContext) -> u32 {
    counted_run(counted::GPU_ALLOC_ENTER, || {
        enter(&ctx, call(gpu_call::ALLOC, arg(&ctx, 0), arg(&ctx, 1)))
    })
}

/// `(void **out, size_t *pitch, size_t width, size_t height, ...)`.
#[uprobe]
pub fn gpu_pitch_enter(ctx: ProbeContext) -> u32 {
    counted_run(counted::GPU_PITCH_ENTER, || {
        let pitch_pointer = arg(&ctx, 1);
        let rows = arg(&ctx, 3);
        enter(
            &ctx,
            GpuPending {
                pitch_pointer,
                ..call(gpu_call::PITCH, arg(&ctx, 0), rows)
            },
        )
    })
}

/// `cuMemCreate(handle *out, size_t size, const prop *, u64 flags)`.
#[uprobe]
pub fn gpu_create_enter(ctx: ProbeContext) -> u32 {
    counted_run(counted::GPU_CREATE_ENTER, || {
        enter(&ctx, call(gpu_call::CREATE, arg(&ctx, 0), arg(&ctx, 1)))
    })
}

/// `(void *address, ...)`: cudaFree, cuMemFree_v2, host and async frees.
#[uprobe]
pub fn gpu_free_enter(ctx: ProbeContext) -> u32 {
    counted_run(counted::GPU_FREE_ENTER, || {
        enter(&ctx, call(gpu_call::FREE, arg(&ctx, 0), 0))
    })
}

/// `cuMemRelease(handle)`.
#[uprobe]
pub fn gpu_release_enter(ctx: ProbeContext) -> u32 {
    counted_run(counted::GPU_RELEASE_ENTER, || {
        let handle = arg(&ctx, 0);
        enter(
            &ctx,
            GpuPending {
                handle,
                ..call(gpu_call::RELEASE, 0, 0)
            },
        )
    })
}

/// `cuMemMap(address, size, offset, handle, flags)`.
#[uprobe]
pub fn gpu_map_enter(ctx: ProbeContext) -> u32 {
    counted_run(counted::GPU_MAP_ENTER, || {
        let handle = arg(&ctx, 3);
        enter(
            &ctx,
            GpuPending {
                handle,
                ..call(gpu_call::MAP, arg(&ctx, 0), 0)
            },
        )
    })
}

/// `cuMemUnmap(address, size)`.
#[uprobe]
pub fn gpu_unmap_enter(ctx: ProbeContext) -> u32 {
    counted_run(counted::GPU_UNMAP_ENTER, || {
        enter(&ctx, call(gpu_call::UNMAP, arg(&ctx, 0), 0))
    })
}

/// `cuCtxDestroy_v2(context)`, `cuDevicePrimaryCtxReset_v2(device)`,
/// `cudaDeviceReset()`: which context does not matter (see above).
#[uprobe]
pub fn gpu_context_enter(ctx: ProbeContext) -> u32 {
    counted_run(counted::GPU_CONTEXT_ENTER, || {
        enter(&ctx, call(gpu_call::DESTROY_CONTEXT, 0, 0))
    })
}

/// One return probe for every CUDA function: what to do is in the pending
/// call, and nothing happens unless the call returned 0.
#[uretprobe]
pub fn gpu_return(ctx: RetProbeContext) -> u32 {
    counted_run(counted::GPU_RETURN, || {
        let thread = bpf_get_current_pid_tgid();
        let Some(pending) = GPU_PENDING.get_ptr_mut(&thread) else {
            return 0;
        };
        let pending = unsafe { &mut *pending };
        if pending.depth == 0 {
            // The call started before the probes were attached.
            return 0;
        }
        pending.depth -= 1;
        if pending.depth > 0 {
            return 0;
        }
        let result: u64 = ctx.ret();
        if result as u32 != 0 {
            count(stat::GPU_FAILED_CALLS);
            return 0;
        }
        let tgid = (thread >> 32) as u32;
        let pending = *pending;
        // One stack capture for every call that makes memory: each inlined
        // copy of it costs the verifier as much as the rest of the program.
        let made = match pending.call {
            gpu_call::ALLOC | gpu_call::CREATE => {
                read_out(pending.pointer).map(|value| (value, pending.size))
            }
            gpu_call::PITCH => match (read_out(pending.pointer), read_out(pending.pitch_pointer)) {
                (Some(address), Some(pitch)) => Some((address, pitch.wrapping_mul(pending.size))),
                _ => None,
            },
            _ => None,
        };
        if let Some((value, size)) = made {
            let block = new_block(&ctx, &pending, size);
            if pending.call == gpu_call::CREATE {
                created(tgid, &pending, value, block);
            } else {
                allocated(tgid, &pending, value, &block);
            }
            return 0;
        }
        match pending.call {
            gpu_call::FREE => freed(tgid, pending.pointer),
            gpu_call::RELEASE => drop_holder(tgid, pending.handle),
            gpu_call::MAP => mapped(tgid, pending.pointer, pending.handle),
            gpu_call::UNMAP => unmapped(tgid, pending.pointer),
            gpu_call::DESTROY_CONTEXT => {
                count(stat::GPU_CONTEXT_DESTROYS);
                let context_epoch = end_context_epoch(tgid);
                if context_epoch != 0 {
                    send_event(&RareEvent {
                        what: event::GPU_CONTEXT_DESTROYED,
                        tgid,
                        timestamp_ns: unsafe { bpf_ktime_get_ns() },
                        context_epoch,
                        pad: 0,
                    });
                }
            }
            _ => {}
        }
        0
    })
}

#[inline(always)]
fn read_out(pointer: u64) -> Option<u64> {
    match unsafe { bpf_probe_read_user(pointer as *const u64) } {
        Ok(value) => Some(value),
        Err(_) => {
            count(stat::DROP_READ_OUT_PARAM);
            None
        }
    }
}

#[inline(always)]
fn new_block(ctx: &RetProbeContext, pending: &GpuPending, size: u64) -> LiveAlloc {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let context_epoch = if gpu_api::owned_by_context(pending.api) {
        context_epoch(tgid)
    } else {
        0
    };
    LiveAlloc {
        size,
        stack_id: crate::stacks::capture(ctx, 0, size, pending.kind, pending.api, context_epoch),
        kind: pending.kind,
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        context_epoch,
        pad: 0,
    }
}

/// Remembers which API made a stack's memory (a stack is one call site).
#[inline(always)]
fn note_api(tgid: u32, block: &LiveAlloc, api: u32) {
    if tracer_ebpf::is_copied_stack(block.stack_id) {
        // The stack's copy record names the API.
        return;
    }
    let _ = STACK_API.insert(&stack_key(tgid, block), &api, BPF_ANY as u64);
}

#[inline(always)]
fn allocated(tgid: u32, pending: &GpuPending, address: u64, block: &LiveAlloc) {
    put_live(tgid, address, block, true);
    note_api(tgid, block, pending.api);
    count(stat::GPU_ALLOCS);
}

#[inline(always)]
fn freed(tgid: u32, address: u64) {
    if address == 0 {
        count(stat::FREES_NULL);
    } else if take_live(tgid, address).is_some() {
        count(stat::GPU_FREES);
    } else {
        count(stat::GPU_FREES_UNKNOWN);
    }
}

#[inline(always)]
fn vmm_key(tgid: u32, value: u64) -> LiveKey {
    LiveKey {
        tgid,
        pad: 0,
        address: value,
    }
}

#[inline(always)]
fn created(tgid: u32, pending: &GpuPending, handle: u64, block: LiveAlloc) {
    let key = vmm_key(tgid, handle);
    if let Some(stale) = VMM_HANDLES.get_ptr(&key) {
        // The handle's release was not seen: retire it before reuse.
        let stale = unsafe { (*stale).block };
        remove_from_stack(tgid, &stale);
    }
    let value = VmmHandle { block, holders: 1 };
    if VMM_HANDLES.insert(&key, &value, BPF_ANY as u64).is_err() {
        count(stat::DROP_LIVE_FULL);
        if tracer_ebpf::is_copied_stack(block.stack_id) {
            // Userspace counted the copy as live: take it off again.
            crate::stacks::send_free(
                tgid,
                block.stack_id,
                block.size,
                tracer_ebpf::stack_record::FREE,
            );
        }
        return;
    }
    add_to_stack(tgid, &block, true);
    note_api(tgid, &block, pending.api);
    count(stat::GPU_ALLOCS);
}

/// A mapping holds the physical memory of a known handle until unmapped.
#[inline(always)]
fn mapped(tgid: u32, address: u64, handle: u64) {
    let Some(known) = VMM_HANDLES.get_ptr_mut(&vmm_key(tgid, handle)) else {
        // Made before attach: not counted, so its mappings are not either.
        return;
    };
    if VMM_MAPPINGS
        .insert(&vmm_key(tgid, address), &handle, BPF_ANY as u64)
        .is_err()
    {
        count(stat::DROP_LIVE_FULL);
        return;
    }
    atomic_add(unsafe { &raw mut (*known).holders }, 1);
}

#[inline(always)]
fn unmapped(tgid: u32, address: u64) {
    let key = vmm_key(tgid, address);
    let Some(&handle) = (unsafe { VMM_MAPPINGS.get(&key) }) else {
        count(stat::GPU_FREES_UNKNOWN);
        return;
    };
    let _ = VMM_MAPPINGS.remove(&key);
    drop_holder(tgid, handle);
}

/// A release or an unmap: the physical memory is freed with its last
/// holder.
#[inline(always)]
fn drop_holder(tgid: u32, handle: u64) {
    let key = vmm_key(tgid, handle);
    let Some(known) = VMM_HANDLES.get_ptr_mut(&key) else {
        count(stat::GPU_FREES_UNKNOWN);
        return;
    };
    if fetch_add(unsafe { &raw mut (*known).holders }, u64::MAX) != 1 {
        return;
    }
    let block = unsafe { (*known).block };
    let _ = VMM_HANDLES.remove(&key);
    remove_from_stack(tgid, &block);
    count(stat::GPU_FREES);
}
