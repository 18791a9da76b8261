//! The arguments of a probed function call, as the entry programs read them.
use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_attach_cookie, bpf_probe_read_kernel},
    programs::ProbeContext,
};
use tracer_ebpf::argument_register;

/// Argument `index` of the call entered now (0 when it cannot be read).
#[inline(always)]
pub(crate) fn arg(ctx: &ProbeContext, index: usize) -> u64 {
    ctx.arg::<u64>(index).unwrap_or(0)
}

/// Argument `index` of a malloc-family call: from the register the attach
/// cookie names when the probe sits after the function moved it
/// (`tracer_ebpf::argument_register`), else from its own. The moved
/// register is read with a helper: the verifier allows only constant
/// offsets into the context.
#[inline(always)]
pub(crate) fn call_arg(ctx: &ProbeContext, index: usize) -> u64 {
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let register = ((cookie >> (8 * index)) & 0xff) as usize;
    if register == 0 || register > argument_register::RDI as usize {
        return arg(ctx, index);
    }
    let word = unsafe { (ctx.regs as *const u64).add(register - 1) };
    unsafe { bpf_probe_read_kernel(word) }.unwrap_or(0)
}
