//! The eBPF programs, one file per concern. Programs: `malloc.rs` (the
//! malloc family), `gpu.rs` (CUDA), `tensors.rs` (PyTorch's CUDA caching
//! allocator), `mappings.rs` (the mapping system
//! calls), `libraries.rs` (libraries loaded later, exec), `forks.rs`,
//! `signals.rs`, `exceptions.rs` (unwinds through return-probed
//! frames), `spawn.rs` and the benchmark's `floor.rs`. What they
//! share, below them: the live set and its per-stack totals (`live.rs`),
//! where a block's stack comes from (`stacks.rs`) and the walk
//! through unwind tables (`unwind.rs`), which allocations are
//! recorded (`sampling.rs`), rare events for userspace (`events.rs`), the
//! per-thread allocator call (`pending.rs`) and CUDA call
//! (`gpu_pending.rs`), the per-CPU stack scratch (`scratch.rs`), Python
//! frames (`python.rs`), call arguments (`args.rs`),
//! and at the bottom each program's own count of its runs (`runs.rs`), the
//! STATS counters and atomic adds (`counters.rs`).
//! No program module imports another, but for `exits.rs`, the one
//! dispatcher that clears every family's per-process maps when a process
//! exits; and there are no cycles.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("tracer-ebpf holds eBPF programs; tracer/build.rs builds it for the bpf target");
}

#[cfg(target_arch = "bpf")]
mod args;
#[cfg(target_arch = "bpf")]
mod counters;
#[cfg(target_arch = "bpf")]
mod events;
#[cfg(target_arch = "bpf")]
mod exceptions;
#[cfg(target_arch = "bpf")]
mod exits;
#[cfg(target_arch = "bpf")]
mod floor;
#[cfg(target_arch = "bpf")]
mod forks;
#[cfg(target_arch = "bpf")]
mod gpu;
#[cfg(target_arch = "bpf")]
mod gpu_pending;
#[cfg(target_arch = "bpf")]
mod libraries;
#[cfg(target_arch = "bpf")]
mod live;
#[cfg(target_arch = "bpf")]
mod malloc;
#[cfg(target_arch = "bpf")]
mod mappings;
#[cfg(target_arch = "bpf")]
mod pending;
#[cfg(target_arch = "bpf")]
mod python;
#[cfg(target_arch = "bpf")]
mod runs;
#[cfg(target_arch = "bpf")]
mod sampling;
#[cfg(target_arch = "bpf")]
mod scratch;
#[cfg(target_arch = "bpf")]
mod signals;
#[cfg(target_arch = "bpf")]
mod spawn;
#[cfg(target_arch = "bpf")]
mod stacks;
#[cfg(target_arch = "bpf")]
mod tensors;
#[cfg(target_arch = "bpf")]
mod unwind;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
