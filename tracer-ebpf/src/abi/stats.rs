//! The STATS counters: one table of ids, names and classes.

/// Whether a STATS entry is an event count or a drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatClass {
    Event,
    Drop,
}

/// Indices into the per-CPU STATS array. Events count what happened; drops
/// count what could not be recorded (reported in the report's first lines).
pub mod stat {
    use super::StatClass::{self, Drop, Event};

    id_table! {
        /// Names of the STATS entries, by index, as shown in reports.
        STAT_NAMES: [(&str, StatClass)] {
            ALLOCS => ("allocs", Event),
            FREES => ("frees", Event),
            FAILED_ALLOCS => ("failed_allocs", Event),
            NESTED_CALLS => ("nested_calls", Event),
            FREES_UNKNOWN => ("frees_unknown", Event),
            FREES_NULL => ("frees_null", Event),
            DROP_LIVE_FULL => ("live_map_full", Drop),
            DROP_BY_STACK_FULL => ("by_stack_map_full", Drop),
            DROP_STACK_TABLE_FULL => ("stack_table_full", Drop),
            DROP_STACK_ERROR => ("stack_error", Drop),
            DROP_PENDING_FULL => ("pending_map_full", Drop),
            DROP_READ_OUT_PARAM => ("out_param_unreadable", Drop),
            /// Allocations not recorded: outside --min-size/--max-size or not
            /// sampled.
            NOT_RECORDED => ("allocs_not_recorded", Event),
            /// CUDA allocations (device, managed, pinned host, VMM physical).
            GPU_ALLOCS => ("gpu_allocs", Event),
            GPU_FREES => ("gpu_frees", Event),
            /// CUDA calls that returned an error: nothing allocated or freed.
            GPU_FAILED_CALLS => ("gpu_failed_calls", Event),
            /// CUDA calls made inside another one on the same thread (the driver
            /// under the runtime): not counted again.
            GPU_NESTED_CALLS => ("gpu_nested_calls", Event),
            /// Frees, unmaps and releases of GPU memory allocated before attach.
            GPU_FREES_UNKNOWN => ("gpu_frees_unknown", Event),
            /// New executable mappings whose event did not fit in EVENTS (the
            /// /proc/PID/maps poll still finds them, later).
            DROP_EVENTS_FULL => ("events_ring_full", Drop),
            /// New processes of followed targets that could not be announced.
            DROP_FORK_QUEUE_FULL => ("fork_queue_full", Drop),
            /// Successful mmap, munmap, mremap, brk and mprotect calls of a target.
            MAPPING_CALLS => ("mapping_calls", Event),
            /// Mapping events lost: the MAPPING_EVENTS ring buffer was full.
            DROP_MAPPING_EVENTS => ("mapping_events_lost", Drop),
            /// Mapping calls not followed: too many threads in a mapping call.
            DROP_MAPPING_PENDING_FULL => ("mapping_pending_full", Drop),
            /// Successful CUDA context destructions and resets (cuCtxDestroy_v2,
            /// cuDevicePrimaryCtxReset_v2, cudaDeviceReset).
            GPU_CONTEXT_DESTROYS => ("gpu_context_destroys", Event),
            /// Context destructions not recorded: no room for the process in the
            /// context epoch table (its released blocks stay live in the report).
            DROP_CONTEXT_EPOCH_FULL => ("context_epoch_table_full", Drop),
            /// Allocations whose user stack was copied for unwinding in userspace
            /// (`--unwind copy`).
            STACK_COPIES => ("stack_copies", Event),
            /// Stack copies that did not fit in the STACK_COPIES ring buffer: the
            /// block is still counted, with its frame-pointer stack.
            DROP_STACK_COPY_RING_FULL => ("stack_copy_ring_full", Drop),
            /// Frees of copied-stack blocks that fit neither in the ring buffer nor
            /// in COPY_FREES: userspace keeps counting those blocks as live.
            DROP_STACK_FREE_LOST => ("stack_free_lost", Drop),
            /// Frees (and restores) of copied-stack blocks that found the ring
            /// buffer full and went to the COPY_FREES map instead: not lost.
            STACK_FREES_DEFERRED => ("stack_frees_deferred", Event),
            /// Bytes of the blocks whose frees were lost (`stack_free_lost`):
            /// live bytes may be too high by up to this much.
            STACK_FREE_LOST_BYTES => ("stack_free_lost_bytes", Event),
            /// Processes started with a --comm name that could not be announced.
            DROP_EXEC_QUEUE_FULL => ("exec_queue_full", Drop),
            /// Allocations whose stack carries Python frames (`--python`).
            PYTHON_STACKS => ("python_stacks", Event),
            /// Allocations of a Python process on a thread whose thread state
            /// tracer did not know yet: native frames only.
            PYTHON_THREAD_UNKNOWN => ("python_thread_unknown", Event),
            /// Threads whose thread state the kernel found in their
            /// interpreter's list at their first allocation (threads started
            /// since userspace last read the list).
            PYTHON_THREAD_FOUND => ("python_threads_found_by_kernel", Event),
            /// Python stacks deeper than --python-depth: outer frames cut.
            PYTHON_TRUNCATED => ("python_stacks_truncated", Event),
            /// Python stacks not stored (table full or a read failed): the
            /// allocation keeps its native frames only.
            DROP_PYTHON_STACK => ("python_stack_lost", Drop),
            /// Shared objects a target opened, sent to be hooked at open.
            LIBRARY_OPENS => ("library_opens", Event),
            /// Shared objects opened whose message did not fit in OPENED: they
            /// are hooked when their mapping is noticed (late).
            DROP_OPENED_FULL => ("opened_ring_full", Drop),
            /// Stacks walked in the kernel through unwind tables (`--unwind
            /// auto`, `dwarf`): per frame, the table of its object or its frame
            /// pointer.
            UNWIND_STACKS => ("unwind_stacks", Event),
            /// Walks stopped at a signal frame (its rule is not in the tables).
            UNWIND_STOP_SIGNAL => ("unwind_stop_signal_frame", Event),
            /// Walks stopped at a rule the kernel cannot follow (a DWARF
            /// expression, a register other than rsp and rbp).
            UNWIND_STOP_UNSUPPORTED => ("unwind_stop_unsupported_rule", Event),
            /// Walks through a return address outside every file-backed
            /// executable mapping of the process (JIT or anonymous code), walked
            /// on by its frame pointer.
            UNWIND_OUTSIDE_MAPPINGS => ("unwind_outside_mappings", Event),
            /// Walks stopped at a stack word that could not be read.
            UNWIND_STOP_READ_FAULT => ("unwind_stop_read_fault", Event),
            /// Walks stopped at a step that did not move up the stack (a frame
            /// pointer that is not one).
            UNWIND_STOP_INVALID => ("unwind_stop_invalid_step", Event),
            /// Walks that reached the most frames a stack keeps: outer frames
            /// cut.
            UNWIND_STOP_DEPTH => ("unwind_stop_depth", Event),
            /// Walks that went through an object whose table was not built
            /// yet (its frames walked by frame pointers).
            UNWIND_TABLE_PENDING => ("unwind_table_pending", Event),
            /// Walks through a mapping past the most a process's table lists
            /// (walked by frame pointers).
            UNWIND_MAPPINGS_FULL => ("unwind_mappings_full", Event),
            /// Frees of blocks an image allocated before its process replaced
            /// it (exec): the new image allocated that address again without
            /// being seen, or freed a stale pointer. Ignored: the old image's
            /// totals were zeroed at the exec.
            FREES_OF_REPLACED_IMAGE => ("frees_of_replaced_image", Event),
            /// Execs of a process whose stacks are copied that found the
            /// STACK_COPIES ring full: its copied-stack blocks of the old image
            /// stay live in the report.
            DROP_EXEC_MARK_LOST => ("exec_mark_lost", Drop),
            /// Blocks PyTorch's CUDA caching allocator handed out (gpu-tensor).
            GPU_TENSOR_ALLOCS => ("gpu_tensor_allocs", Event),
            GPU_TENSOR_FREES => ("gpu_tensor_frees", Event),
            /// Frees of caching-allocator blocks handed out before attach.
            GPU_TENSOR_FREES_UNKNOWN => ("gpu_tensor_frees_unknown", Event),
            /// Caching-allocator blocks not counted: the block could not be
            /// read, or did not look like the `Block` tracer knows (another
            /// PyTorch layout).
            DROP_GPU_TENSOR_BLOCK_UNREADABLE => ("gpu_tensor_block_unreadable", Drop),
            /// Stacks evicted from STACKS: they held nothing, their totals
            /// were in tracer's model, and the table was over half full.
            /// Counted by userspace, which evicts them (the kernel never
            /// adds to it).
            STACKS_EVICTED => ("stacks_evicted", Event),
            /// Python stacks evicted from PYTHON_STACKS: no stack held
            /// named them any more. Counted by userspace, as above.
            PYTHON_STACKS_EVICTED => ("python_stacks_evicted", Event),
            /// Stacks whose hash was another stack's (forged return
            /// addresses, or a 64-bit collision): their frames differ from
            /// the stored stack's, so the block counts as NO_STACK rather
            /// than as the other stack.
            DROP_STACK_COLLISION => ("stack_collision_lost", Drop),
            /// Exceptions (and forced unwinds) that started in a traced
            /// process: entries of `_Unwind_RaiseException`,
            /// `_Unwind_Resume_or_Rethrow` and `_Unwind_ForcedUnwind`.
            EXCEPTION_UNWINDS => ("exception_unwinds", Event),
            /// Return addresses put back over the uprobe trampoline before
            /// an unwinder read them (`exceptions.rs`). Counted by
            /// userspace, which writes them.
            EXCEPTION_RETURNS_RESTORED => ("exception_returns_restored", Event),
            /// Unwinds through return-probed frames whose return addresses
            /// could not all be put back (no room to tell userspace, a walk
            /// cut, a write refused, a hold over its bound): the target may
            /// have been terminated by its unwinder.
            DROP_EXCEPTION_RESTORE_LOST => ("exception_restore_lost", Drop),
            /// Allocator calls in progress when an unwind started: their
            /// return never comes; nothing of them is counted.
            CALLS_LEFT_BY_EXCEPTION => ("calls_left_by_exception", Event),
            /// User page faults of a target (`--resident`): each sent to
            /// userspace with its stack, which charges the page to it on
            /// its first touch.
            PAGE_FAULTS => ("page_faults", Event),
            /// Write faults that a transparent huge page served (`--resident`):
            /// 2 MiB charged at once. Counted by userspace, which reads the
            /// page's flags (/proc/kpageflags).
            HUGE_PAGE_FAULTS => ("huge_page_faults", Event),
            /// Page faults not sent: the MAPPING_EVENTS ring buffer was full
            /// (their pages are not charged).
            DROP_FAULT_EVENTS => ("fault_events_lost", Drop),
            /// The largest sampling shift of page faults so far
            /// (`--resident`): one page in 2^shift was followed where
            /// faults came fast. Set by userspace.
            FAULT_SAMPLE_SHIFT => ("fault_sample_shift", Event),
        }
    }
}

pub use stat::STAT_NAMES;

#[cfg(test)]
mod tests {
    use super::stat::*;
    use super::*;

    #[test]
    fn each_stat_id_indexes_its_own_name() {
        assert_eq!(STAT_NAMES.len(), COUNT as usize);
        for (id, name) in [
            (ALLOCS, "allocs"),
            (FREES, "frees"),
            (NOT_RECORDED, "allocs_not_recorded"),
            (DROP_STACK_COPY_RING_FULL, "stack_copy_ring_full"),
            (STACK_FREES_DEFERRED, "stack_frees_deferred"),
            (UNWIND_MAPPINGS_FULL, "unwind_mappings_full"),
            (FREES_OF_REPLACED_IMAGE, "frees_of_replaced_image"),
            (DROP_EXEC_MARK_LOST, "exec_mark_lost"),
            (PYTHON_STACKS_EVICTED, "python_stacks_evicted"),
            (DROP_STACK_COLLISION, "stack_collision_lost"),
        ] {
            assert_eq!(STAT_NAMES[id as usize].0, name);
        }
        // Ids are appended: a recording keeps its counters by index.
        assert_eq!(FAULT_SAMPLE_SHIFT, COUNT - 1, "the last id");
    }

    #[test]
    fn stat_names_are_distinct_and_drops_are_named_as_drops() {
        let names: std::collections::HashSet<&str> =
            STAT_NAMES.iter().map(|(name, _)| *name).collect();
        assert_eq!(names.len(), STAT_NAMES.len(), "a name used twice");
        for (name, class) in STAT_NAMES {
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
            // Every drop says what filled up or failed.
            if class == StatClass::Drop {
                assert!(
                    ["full", "lost", "error", "unreadable"]
                        .iter()
                        .any(|word| name.ends_with(word)),
                    "{name} is a drop"
                );
            }
        }
    }
}
