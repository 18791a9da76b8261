//! A traced process's end, seen in the kernel: its PID leaves the
//! per-process filters of the tracepoints at once, so a process that takes
//! the PID before userspace looks again (every tick) is neither followed,
//! nor counted, nor taken for an exec of the target. (Its uprobes are
//! bound to the process itself and end with it.)
use aya_ebpf::{
    Global, helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use tracer_ebpf::counted;

use crate::{
    forks::FOLLOWED, libraries::TRACED_TGIDS, mappings::TARGETS, runs::counted_run,
    stacks::COPY_STACKS_OF,
};

/// Offset of `group_dead` in the sched_process_exit record, read from its
/// tracefs format at start-up; 0 where the kernel has no such field (then
/// nothing is done here, and the exit is seen at the next tick).
#[unsafe(no_mangle)]
static EXIT_GROUP_DEAD_OFFSET: Global<u32> = Global::new(0);

/// Every task's exit on the host; acts on the last thread of a traced
/// process (`group_dead`).
#[tracepoint]
pub fn process_exit(ctx: TracePointContext) -> u32 {
    counted_run(counted::PROCESS_EXIT, || {
        let offset = EXIT_GROUP_DEAD_OFFSET.load();
        if offset == 0 {
            return 0;
        }
        let Ok(group_dead) = (unsafe { ctx.read_at::<u8>(offset as usize) }) else {
            return 0;
        };
        if group_dead == 0 {
            return 0;
        }
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        if unsafe { TRACED_TGIDS.get(&tgid) }.is_none() && unsafe { TARGETS.get(&tgid) }.is_none() {
            return 0;
        }
        let _ = TARGETS.remove(&tgid);
        let _ = TRACED_TGIDS.remove(&tgid);
        let _ = FOLLOWED.remove(&tgid);
        let _ = COPY_STACKS_OF.remove(&tgid);
        0
    })
}
