//! The benchmark's floors (`tracer floor`): empty programs, to measure
//! what a probe hit costs by itself at a given site.
use aya_ebpf::{
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};

#[uprobe]
pub fn floor_enter(_ctx: ProbeContext) -> u32 {
    0
}

#[uretprobe]
pub fn floor_return(_ctx: RetProbeContext) -> u32 {
    0
}
