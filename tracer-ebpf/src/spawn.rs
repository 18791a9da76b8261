//! Spawn mode: stops a freshly exec'ed child where userspace must put its
//! hooks before the child goes on.
//!
//! On a dynamically linked command the gate is on the dynamic loader's
//! `_dl_debug_state`, the function ld.so calls for debuggers around every
//! change of its list of objects. The attach cookie is the distance from
//! that function to `_r_debug.r_state`; the gate stops the child only when
//! the state is RT_CONSISTENT, i.e. once the startup objects (or a dlopen's)
//! are all mapped and before any of their constructors ran. With a zero
//! cookie (a static executable, gate on its entry point) it always stops.
use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_attach_cookie, bpf_probe_read_user, bpf_send_signal},
    macros::uprobe,
    programs::ProbeContext,
};
use tracer_ebpf::counted;

use crate::runs::counted_run;

const SIGSTOP: u32 = 19;
/// `r_debug.r_state` when the list of objects is complete.
const RT_CONSISTENT: i32 = 0;

/// Scoped to the child's PID.
#[uprobe]
pub fn spawn_gate(ctx: ProbeContext) -> u32 {
    counted_run(counted::SPAWN_GATE, || {
        let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
        if cookie != 0 {
            let regs = ctx.regs;
            // SAFETY: `regs` is the probed task's saved registers.
            let ip = unsafe { (*regs).rip };
            let state_address = ip.wrapping_add(cookie) as *const i32;
            // SAFETY: a user-space read the helper checks.
            match unsafe { bpf_probe_read_user(state_address) } {
                Ok(RT_CONSISTENT) => {}
                _ => return 0,
            }
        }
        unsafe {
            bpf_send_signal(SIGSTOP);
        }
        0
    })
}
