//! PyTorch's CUDA caching allocator (`libc10_cuda.so`): the blocks it
//! hands to tensors, the gpu-tensor kind. The allocator calls cudaMalloc
//! rarely (segments, counted as gpu-device by `gpu.rs`) and carves tensor
//! blocks out of them; a tensor that leaks leaks a block, which a
//! segment-level count cannot name. `DeviceCachingAllocator::malloc`
//! returns the block (its return is probed: %rax), `free` takes it
//! (its entry: %rsi); each reads the block's size and device address from
//! the `Block` (`tracer_ebpf::caching_allocator`). Both run outside any
//! CUDA call of `gpu.rs` and touch none of its state, so the cudaMalloc of
//! a segment made inside `malloc` is counted as the gpu-device it is.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_ebpf::{
    LiveAlloc,
    caching_allocator::{self as layout, ADDRESS_TAG},
    counted, kind, stat,
};

use crate::{
    args::arg,
    counters::count,
    live::{context_epoch, put_live, take_live},
    runs::counted_run,
};

/// Words of a `Block` read at once, from `Block::size` on.
const WINDOW_WORDS: usize = 5;
const ADDRESS_WORD: usize = ((layout::BLOCK_ADDRESS - layout::BLOCK_SIZE) / 8) as usize;
const ALLOCATED_WORD: usize = ((layout::BLOCK_ALLOCATED - layout::BLOCK_SIZE) / 8) as usize;
const _: () = assert!(ADDRESS_WORD < WINDOW_WORDS && ALLOCATED_WORD < WINDOW_WORDS);
const _: () = assert!(
    layout::BLOCK_ALLOCATED.is_multiple_of(8),
    "`allocated` is a word's low byte"
);

/// A block handed to a tensor: (size, device address), or None (counted)
/// when it cannot be read or does not look like one.
#[inline(always)]
fn handed_out(block: u64) -> Option<(u64, u64)> {
    let words =
        unsafe { bpf_probe_read_user((block + layout::BLOCK_SIZE) as *const [u64; WINDOW_WORDS]) };
    let Ok(words) = words else {
        count(stat::DROP_GPU_TENSOR_BLOCK_UNREADABLE);
        return None;
    };
    let (size, address) = (words[0], words[ADDRESS_WORD]);
    if !layout::is_handed_out(size, address, words[ALLOCATED_WORD] as u8) {
        count(stat::DROP_GPU_TENSOR_BLOCK_UNREADABLE);
        return None;
    }
    Some((size, address))
}

/// `DeviceCachingAllocator::malloc` returned the `Block *` in %rax.
#[uretprobe]
pub fn tensor_malloc_return(ctx: RetProbeContext) -> u32 {
    counted_run(counted::TENSOR_MALLOC_RETURN, || {
        let block: u64 = ctx.ret();
        if block == 0 {
            return 0;
        }
        let Some((size, address)) = handed_out(block) else {
            return 0;
        };
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        // Tensor memory goes with the CUDA context, as its segment does.
        let context_epoch = context_epoch(tgid);
        let live = LiveAlloc {
            size,
            stack_id: crate::stacks::capture(
                &ctx,
                0,
                size,
                kind::GPU_TENSOR,
                u32::MAX,
                context_epoch,
            ),
            kind: kind::GPU_TENSOR,
            timestamp_ns: unsafe { bpf_ktime_get_ns() },
            context_epoch,
            pad: 0,
        };
        put_live(tgid, address | ADDRESS_TAG, &live, true);
        count(stat::GPU_TENSOR_ALLOCS);
        0
    })
}

/// `DeviceCachingAllocator::free(this, Block *)`.
#[uprobe]
pub fn tensor_free_enter(ctx: ProbeContext) -> u32 {
    counted_run(counted::TENSOR_FREE_ENTER, || {
        let Some((_, address)) = handed_out(arg(&ctx, 1)) else {
            return 0;
        };
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        if take_live(tgid, address | ADDRESS_TAG).is_some() {
            count(stat::GPU_TENSOR_FREES);
        } else {
            count(stat::GPU_TENSOR_FREES_UNKNOWN);
        }
        0
    })
}
