//! `--follow-forks`: children of traced processes (PyTorch DataLoader
//! workers, pre-forked servers) are announced to userspace, which attaches
//! the same probes to them. uprobes are scoped to one process and are not
//! inherited, so without this a child costs nothing and is not traced.
use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, tracepoint},
    maps::{HashMap, Queue},
    programs::TracePointContext,
};
use tracer_ebpf::{counted, stat};

use crate::{counters::count, runs::counted_run};

/// Processes whose children are followed.
#[map]
pub(crate) static FOLLOWED: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);

/// New tasks of followed processes (processes and threads alike: userspace
/// tells them apart), waiting to be attached.
#[map]
static FORKS: Queue<u32> = Queue::with_max_entries(8192, 0);

/// Offset of `child_pid` in the sched_process_fork record, read from its
/// tracefs format at start-up.
#[unsafe(no_mangle)]
static FORK_CHILD_PID_OFFSET: Global<u32> = Global::new(20);

#[tracepoint]
pub fn process_fork(ctx: TracePointContext) -> u32 {
    counted_run(counted::PROCESS_FORK, || {
        // The forking task is the current one.
        let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
        if FOLLOWED.get_ptr(&parent).is_none() {
            return 0;
        }
        let Ok(child) = (unsafe { ctx.read_at::<u32>(FORK_CHILD_PID_OFFSET.load() as usize) })
        else {
            return 0;
        };
        if FORKS.push(child, 0).is_err() {
            count(stat::DROP_FORK_QUEUE_FULL);
        }
        0
    })
}

/// `--comm`: the command names (`comm`, NUL-padded) whose new processes are
/// announced; the all-zero name announces every exec (`--comm-regex`, which
/// userspace matches).
#[map]
static COMM_NAMES: HashMap<[u8; 16], u8> = HashMap::with_max_entries(256, 0);

/// Processes that exec'd an image with a watched name, waiting to be
/// attached (userspace checks the name again).
#[map]
static STARTED: Queue<u32> = Queue::with_max_entries(8192, 0);

/// Every exec on the host, while `--comm` watches for names: announces
/// the process when its new name is watched. At this tracepoint the task
/// already bears the new image's name.
#[tracepoint]
pub fn comm_exec(_ctx: TracePointContext) -> u32 {
    counted_run(counted::COMM_EXEC, || {
        let Ok(comm) = bpf_get_current_comm() else {
            return 0;
        };
        let watched = unsafe { COMM_NAMES.get(&comm) }.is_some()
            || unsafe { COMM_NAMES.get(&[0u8; 16]) }.is_some();
        if !watched {
            return 0;
        }
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        if STARTED.push(tgid, 0).is_err() {
            count(stat::DROP_EXEC_QUEUE_FULL);
        }
        0
    })
}
