//! The arguments of a probed function call, as the entry programs read them.
use aya_ebpf::programs::ProbeContext;

/// Argument `index` of the call entered now (0 when it cannot be read).
#[inline(always)]
pub(crate) fn arg(ctx: &ProbeContext, index: usize) -> u64 {
    ctx.arg::<u64>(index).unwrap_or(0)
}
