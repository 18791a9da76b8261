//! Spawn mode: stops a freshly exec'ed child at its entry point, after the
//! dynamic loader mapped its libraries, so userspace can attach before the
//! program's first allocation.
use aya_ebpf::{helpers::bpf_send_signal, macros::uprobe, programs::ProbeContext};

const SIGSTOP: u32 = 19;

/// Scoped to the child's PID.
#[uprobe]
pub fn spawn_gate(_ctx: ProbeContext) -> u32 {
    unsafe {
        bpf_send_signal(SIGSTOP);
    }
    0
}
