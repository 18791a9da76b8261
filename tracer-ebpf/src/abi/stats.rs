//! The STATS counters: ids, names and classes.

/// Indices into the per-CPU STATS array. Events count what happened; drops
/// count what could not be recorded (reported in the report's first lines).
pub mod stat {
    pub const ALLOCS: u32 = 0;
    pub const FREES: u32 = 1;
    pub const FAILED_ALLOCS: u32 = 2;
    pub const NESTED_CALLS: u32 = 3;
    pub const FREES_UNKNOWN: u32 = 4;
    pub const FREES_NULL: u32 = 5;
    pub const DROP_LIVE_FULL: u32 = 6;
    pub const DROP_BY_STACK_FULL: u32 = 7;
    pub const DROP_STACK_COLLISION: u32 = 8;
    pub const DROP_STACK_ERROR: u32 = 9;
    pub const DROP_PENDING_FULL: u32 = 10;
    pub const DROP_READ_OUT_PARAM: u32 = 11;
    /// Allocations not recorded: outside --min-size/--max-size or not
    /// sampled.
    pub const NOT_RECORDED: u32 = 12;
    /// CUDA allocations (device, managed, pinned host, VMM physical).
    pub const GPU_ALLOCS: u32 = 13;
    pub const GPU_FREES: u32 = 14;
    /// CUDA calls that returned an error: nothing allocated or freed.
    pub const GPU_FAILED_CALLS: u32 = 15;
    /// CUDA calls made inside another one on the same thread (the driver
    /// under the runtime): not counted again.
    pub const GPU_NESTED_CALLS: u32 = 16;
    /// Frees, unmaps and releases of GPU memory allocated before attach.
    pub const GPU_FREES_UNKNOWN: u32 = 17;
    /// New executable mappings whose event did not fit in EVENTS (the
    /// /proc/PID/maps poll still finds them, later).
    pub const DROP_EVENTS_FULL: u32 = 18;
    /// New processes of followed targets that could not be announced.
    pub const DROP_FORK_QUEUE_FULL: u32 = 19;
    /// Successful mmap, munmap, mremap, brk and mprotect calls of a target.
    pub const MAPPING_CALLS: u32 = 20;
    /// Mapping events lost: the MAPPING_EVENTS ring buffer was full.
    pub const DROP_MAPPING_EVENTS: u32 = 21;
    /// Mapping calls not followed: too many threads in a mapping call.
    pub const DROP_MAPPING_PENDING_FULL: u32 = 22;
    /// Successful CUDA context destructions and resets (cuCtxDestroy_v2,
    /// cuDevicePrimaryCtxReset_v2, cudaDeviceReset).
    pub const GPU_CONTEXT_DESTROYS: u32 = 23;
    /// Context destructions not recorded: no room for the process in the
    /// context epoch table (its released blocks stay live in the report).
    pub const DROP_CONTEXT_EPOCH_FULL: u32 = 24;
    /// Allocations whose user stack was copied for unwinding in userspace
    /// (`--unwind dwarf`).
    pub const STACK_COPIES: u32 = 25;
    /// Stack copies that did not fit in the STACK_COPIES ring buffer: the
    /// block is still counted, with its frame-pointer stack.
    pub const DROP_STACK_COPY_RING_FULL: u32 = 26;
    /// Frees of copied-stack blocks that did not fit in the ring buffer:
    /// userspace keeps counting those blocks as live.
    pub const DROP_STACK_FREE_LOST: u32 = 27;
    pub const COUNT: u32 = 28;
}

/// Whether a STATS entry is an event count or a drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatClass {
    Event,
    Drop,
}

/// Names of the STATS entries, by index, as shown in reports.
pub const STAT_NAMES: [(&str, StatClass); stat::COUNT as usize] = [
    ("allocs", StatClass::Event),
    ("frees", StatClass::Event),
    ("failed_allocs", StatClass::Event),
    ("nested_calls", StatClass::Event),
    ("frees_unknown", StatClass::Event),
    ("frees_null", StatClass::Event),
    ("live_map_full", StatClass::Drop),
    ("by_stack_map_full", StatClass::Drop),
    ("stack_map_collision", StatClass::Drop),
    ("stack_error", StatClass::Drop),
    ("pending_map_full", StatClass::Drop),
    ("out_param_unreadable", StatClass::Drop),
    ("allocs_not_recorded", StatClass::Event),
    ("gpu_allocs", StatClass::Event),
    ("gpu_frees", StatClass::Event),
    ("gpu_failed_calls", StatClass::Event),
    ("gpu_nested_calls", StatClass::Event),
    ("gpu_frees_unknown", StatClass::Event),
    ("events_ring_full", StatClass::Drop),
    ("fork_queue_full", StatClass::Drop),
    ("mapping_calls", StatClass::Event),
    ("mapping_events_lost", StatClass::Drop),
    ("mapping_pending_full", StatClass::Drop),
    ("gpu_context_destroys", StatClass::Event),
    ("context_epoch_table_full", StatClass::Drop),
    ("stack_copies", StatClass::Event),
    ("stack_copy_ring_full", StatClass::Drop),
    ("stack_free_lost", StatClass::Drop),
];
