//! The ABI shared by the eBPF programs (`src/main.rs`) and userspace
//! (`tracer`): map keys and values, counter indices and the probe kinds.
//!
//! Every type is `#[repr(C)]`, made of plain integers and has no padding
//! holes, so the kernel and userspace agree on its bytes.
#![no_std]

/// Memory kinds. Kept apart in every map and report, never double counted.
pub mod kind {
    /// malloc-family heap memory.
    pub const HEAP: u32 = 0;
    /// Anonymous mappings (private or shared) made outside any allocator
    /// call, usable (readable or writable).
    pub const MMAP_ANON: u32 = 1;
    /// CUDA device memory: cudaMalloc, cuMemAlloc, pitch and async
    /// allocations, and the physical memory of cuMemCreate.
    pub const GPU_DEVICE: u32 = 2;
    /// CUDA managed (unified) memory: cudaMallocManaged, cuMemAllocManaged.
    pub const GPU_MANAGED: u32 = 3;
    /// Page-locked host memory: cudaMallocHost, cudaHostAlloc,
    /// cuMemAllocHost, cuMemHostAlloc.
    pub const GPU_HOST_PINNED: u32 = 4;
    /// File-backed mappings made outside any allocator call.
    pub const MMAP_FILE: u32 = 5;
    /// Growth of the program break (brk) outside any allocator call.
    pub const HEAP_BRK: u32 = 6;
    /// Address space reserved, not memory: PROT_NONE mappings and thread
    /// stacks (MAP_STACK), which the kernel backs only when touched.
    pub const MMAP_RESERVED: u32 = 7;
}

/// Key of the LIVE map: one outstanding allocation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LiveKey {
    pub tgid: u32,
    pub pad: u32,
    pub address: u64,
}

/// Value of the LIVE map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveAlloc {
    pub size: u64,
    pub stack_id: u32,
    pub kind: u32,
    pub timestamp_ns: u64,
    /// Memory a CUDA context owns: the process's context epoch when it was
    /// allocated (see [`FIRST_CONTEXT_EPOCH`]); 0 for memory no context
    /// owns (heap, mappings, stream-ordered and VMM GPU memory).
    pub context_epoch: u32,
    pub pad: u32,
}

/// The CUDA context epoch of a process before any context was destroyed.
/// Every successful context destruction or reset (and every exec) ends the
/// epoch: the context-owned GPU blocks of older epochs are gone, without
/// frees. The kernel sums each epoch's blocks apart in BY_STACK, so
/// userspace reads what an ended epoch held, exactly, at any later time.
pub const FIRST_CONTEXT_EPOCH: u32 = 1;

/// Key of the BY_STACK map: the live memory of one call stack, one kind.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey {
    pub tgid: u32,
    /// Id in the STACKS map, or [`NO_STACK`] when the stack could not be
    /// stored (the reason is counted in STATS).
    pub stack_id: u32,
    pub kind: u32,
    /// The blocks' `LiveAlloc::context_epoch`: 0, or the CUDA context
    /// epoch whose context-owned blocks this entry sums.
    pub context_epoch: u32,
}

/// Stack id used when `bpf_get_stackid` failed.
pub const NO_STACK: u32 = u32::MAX;

/// A stack id with these top bits set is not a STACKS id but a reference
/// to a stack copied into the STACK_COPIES ring buffer (`--unwind dwarf`):
/// userspace unwinds it and keeps the totals of such blocks itself, from
/// the copy and free records of that ring.
pub const COPIED_STACK: u32 = 1 << 30;
/// The bits of a copied-stack reference that tell copies apart.
pub const COPIED_STACK_MASK: u32 = COPIED_STACK - 1;

/// Whether `stack_id` refers to a copied stack (not [`NO_STACK`]).
pub const fn is_copied_stack(stack_id: u32) -> bool {
    stack_id & !COPIED_STACK_MASK == COPIED_STACK
}

/// Record types of the STACK_COPIES ring buffer. Records are read in the
/// order they were reserved, so a block's copy always comes before its free.
pub mod stack_record {
    /// [`super::StackCopy`] followed by `length` bytes of user stack.
    pub const COPY: u32 = 1;
    /// [`super::StackFree`]: the block of a copy was freed.
    pub const FREE: u32 = 2;
    /// [`super::StackFree`]: a failed realloc gave its old block back.
    pub const RESTORE: u32 = 3;
    /// [`super::StackCopy`] of a mapping call (mmap, brk) at its entry: a
    /// stack only, for the MappingEvent that carries its reference; the
    /// mapping itself is followed from MAPPING_EVENTS.
    pub const MAPPING_COPY: u32 = 4;
}

/// Largest number of stack pages one copy holds (`--stack-bytes` up to
/// 64 KiB, from the start of the stack pointer's page).
pub const MAX_STACK_PAGES: u32 = 16;
pub const STACK_PAGE_BYTES: u64 = 4096;

/// A new block with its user stack copied at the allocator's return: the
/// registers the unwinder starts from and the stack pages from the one the
/// stack pointer is in, upwards. The pages follow this header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackCopy {
    /// `stack_record::COPY`.
    pub record: u32,
    pub tgid: u32,
    /// The reference the block's LIVE entry carries ([`COPIED_STACK`] set).
    pub stack_ref: u32,
    pub kind: u32,
    /// The CUDA function (`gpu_api`), or `u32::MAX` for the malloc family.
    pub api: u32,
    /// 1 when the copy stopped at an unreadable page: the stack's top is in
    /// the copy, so nothing of the stack is missing.
    pub reached_top: u32,
    /// The block's `LiveAlloc::context_epoch`.
    pub context_epoch: u32,
    pub pad: u32,
    /// What the block counts for (its size, or its sampling weight).
    pub size: u64,
    /// Instruction pointer (the return address into the caller), stack
    /// pointer and frame pointer at the allocator's return.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Address of the first copied byte (the start of the stack pointer's
    /// page) and how many bytes follow the header (whole pages).
    pub base: u64,
    pub length: u64,
}

/// A copied-stack block that left the live set.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackFree {
    /// `stack_record::FREE` or `stack_record::RESTORE`.
    pub record: u32,
    pub tgid: u32,
    pub stack_ref: u32,
    pub pad: u32,
}

/// Value of the BY_STACK map. Updated with atomic adds in the probes; the
/// live fields are two's-complement sums (frees add the negated size).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackTotals {
    pub live_bytes: u64,
    pub live_allocs: u64,
    pub alloc_bytes: u64,
    pub alloc_count: u64,
}

/// What the return probe must do with a pending call.
pub mod call {
    /// The result is the new block (malloc, calloc, memalign, valloc...).
    pub const RETURNS_POINTER: u32 = 1;
    /// realloc and reallocarray: free of `pointer`, then a new block.
    pub const REALLOC: u32 = 2;
    /// posix_memalign: the block is written to the out-parameter `pointer`
    /// when the call returns 0.
    pub const OUT_PARAMETER: u32 = 3;
}

/// Per thread: the outermost allocator call in progress, carried from its
/// entry probe to its return probe, and the thread's sampling state. Calls
/// nested inside it (an allocator calling another exported allocator
/// function) only move `depth`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    /// Requested size in bytes.
    pub size: u64,
    /// realloc: the old block; posix_memalign: the out-parameter.
    pub pointer: u64,
    /// What the new block counts for in the live totals: its size in exact
    /// mode, its sampling weight in sampling mode, 0 when it is not recorded
    /// (filtered out or not sampled; a realloc still frees its old block).
    pub recorded_bytes: u64,
    /// xorshift64* state of the thread's sampling decisions (never 0).
    pub random_state: u64,
    /// The call's return address, read at entry when the thread's stacks
    /// are copied (0 otherwise): at a uprobe session's return the
    /// registers may still hold the uprobe trampoline's address.
    pub return_address: u64,
    /// An outermost call that was not recorded (not sampled, filtered
    /// out) and skipped its return: its stack pointer at entry and the
    /// return address there. Calls made inside it (operator new's malloc)
    /// are not recorded either, instead of getting a second chance; it is
    /// known to have returned once that word changed or the stack pointer
    /// is no longer below it. 0: none.
    pub unrecorded_sp: u64,
    pub unrecorded_return: u64,
    /// realloc: what the old block held, removed at entry and restored if
    /// the call fails.
    pub old: LiveAlloc,
    pub call: u32,
    /// Allocator calls in progress on this thread, the outermost included.
    pub depth: u32,
    /// realloc: 1 when `old` holds a block that was known.
    pub old_known: u32,
    /// Signal handlers running on this thread whose interrupted allocator
    /// state is set aside (see `signals.rs`).
    pub signal_level: u32,
}

/// Key of the set-aside allocator state of a thread interrupted by a
/// signal handler.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SignalLevel {
    pub thread: u64,
    pub level: u32,
    pub pad: u32,
}

/// Sampling by bytes: a block of `s` bytes is recorded with probability
/// `1 - exp(-s / N)` (N = `--sample-bytes`), the chance that a Poisson
/// process with one point per N bytes puts a point in it, and then counts
/// for `s / (1 - exp(-s / N))` bytes. The kernel reads `exp(-x)` from a
/// table set at load time, in steps of 1/[`SAMPLE_STEPS_PER_PERIOD`] of N,
/// interpolated linearly; it records with exactly the probability it
/// weights by, so the estimate stays unbiased.
pub mod sampling {
    /// Table steps per sampling period N.
    pub const SAMPLE_STEPS_PER_PERIOD: u64 = 64;
    /// Blocks of this many periods or more are always recorded.
    pub const SAMPLE_TABLE_PERIODS: u64 = 16;
    /// Entries of the skip-chance table (one more than the steps, for the
    /// interpolation's upper end).
    pub const SAMPLE_TABLE_LEN: usize =
        (SAMPLE_STEPS_PER_PERIOD * SAMPLE_TABLE_PERIODS) as usize + 1;
    /// Probabilities are fixed point, 1.0 = 2^32 (one random u32 draw).
    pub const PROBABILITY_ONE: u64 = 1 << 32;
    /// The largest sampling period: keeps `size << 32` within 63 bits for
    /// every size below `SAMPLE_TABLE_PERIODS` periods.
    pub const MAX_SAMPLE_BYTES: u64 = 1 << 27;
}

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

/// The CUDA entry points tracer hooks, by the id a GPU stack carries in
/// the STACK_API map; [`GPU_API_NAMES`] names them.
pub mod gpu_api {
    pub const CUDA_MALLOC: u32 = 0;
    pub const CUDA_MALLOC_MANAGED: u32 = 1;
    pub const CUDA_MALLOC_HOST: u32 = 2;
    pub const CUDA_HOST_ALLOC: u32 = 3;
    pub const CUDA_MALLOC_PITCH: u32 = 4;
    pub const CUDA_MALLOC_ASYNC: u32 = 5;
    pub const CUDA_MALLOC_FROM_POOL_ASYNC: u32 = 6;
    pub const CUDA_FREE: u32 = 7;
    pub const CUDA_FREE_HOST: u32 = 8;
    pub const CUDA_FREE_ASYNC: u32 = 9;
    pub const CU_MEM_ALLOC: u32 = 10;
    pub const CU_MEM_ALLOC_PITCH: u32 = 11;
    pub const CU_MEM_ALLOC_MANAGED: u32 = 12;
    pub const CU_MEM_ALLOC_HOST: u32 = 13;
    pub const CU_MEM_HOST_ALLOC: u32 = 14;
    pub const CU_MEM_ALLOC_ASYNC: u32 = 15;
    pub const CU_MEM_ALLOC_FROM_POOL_ASYNC: u32 = 16;
    pub const CU_MEM_FREE: u32 = 17;
    pub const CU_MEM_FREE_HOST: u32 = 18;
    pub const CU_MEM_FREE_ASYNC: u32 = 19;
    pub const CU_MEM_CREATE: u32 = 20;
    pub const CU_MEM_RELEASE: u32 = 21;
    pub const CU_MEM_MAP: u32 = 22;
    pub const CU_MEM_UNMAP: u32 = 23;
    pub const CU_CTX_DESTROY: u32 = 24;
    pub const CU_DEVICE_PRIMARY_CTX_RESET: u32 = 25;
    pub const CUDA_DEVICE_RESET: u32 = 26;
    pub const COUNT: u32 = 27;

    /// Whether the memory an allocation API hands out belongs to a CUDA
    /// context, and goes with it when the context is destroyed or reset.
    /// Stream-ordered allocations (pools) and cuMemCreate's physical memory
    /// do not: "cuCtxDestroy() will not destroy memory allocations by
    /// cuMemCreate(), cuMemAllocAsync() and cuMemAllocFromPoolAsync()"
    /// (CUDA driver API).
    pub const fn owned_by_context(api: u32) -> bool {
        !matches!(
            api,
            CUDA_MALLOC_ASYNC
                | CUDA_MALLOC_FROM_POOL_ASYNC
                | CU_MEM_ALLOC_ASYNC
                | CU_MEM_ALLOC_FROM_POOL_ASYNC
                | CU_MEM_CREATE
        )
    }
}

/// The exported symbol of each `gpu_api` id, by index.
pub const GPU_API_NAMES: [&str; gpu_api::COUNT as usize] = [
    "cudaMalloc",
    "cudaMallocManaged",
    "cudaMallocHost",
    "cudaHostAlloc",
    "cudaMallocPitch",
    "cudaMallocAsync",
    "cudaMallocFromPoolAsync",
    "cudaFree",
    "cudaFreeHost",
    "cudaFreeAsync",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemAllocHost_v2",
    "cuMemHostAlloc",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemFree_v2",
    "cuMemFreeHost",
    "cuMemFreeAsync",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuCtxDestroy_v2",
    "cuDevicePrimaryCtxReset_v2",
    "cudaDeviceReset",
];

/// The attach cookie of a malloc-family probe placed after the function
/// copied an argument into another register and reused its own (mimalloc's
/// `malloc`: `mov %rdi,%rsi`, then the heap into `%rdi`): byte `i` names
/// the register that holds argument `i` there, as 1 + its index in the
/// x86-64 `struct pt_regs`; 0: its own register.
pub mod argument_register {
    pub const R15: u64 = 1;
    pub const R14: u64 = 2;
    pub const R13: u64 = 3;
    pub const R12: u64 = 4;
    pub const RBP: u64 = 5;
    pub const RBX: u64 = 6;
    pub const R11: u64 = 7;
    pub const R10: u64 = 8;
    pub const R9: u64 = 9;
    pub const R8: u64 = 10;
    pub const RAX: u64 = 11;
    pub const RCX: u64 = 12;
    pub const RDX: u64 = 13;
    pub const RSI: u64 = 14;
    pub const RDI: u64 = 15;
}

/// The attach cookie of a CUDA probe: which API it is on and, for an
/// allocation, which kind of memory it hands out.
pub const fn gpu_cookie(api: u32, kind: u32) -> u64 {
    (kind as u64) << 32 | api as u64
}

/// What the CUDA return probe must do with a pending call.
pub mod gpu_call {
    /// The address is written to the out-parameter `pointer`; `size` bytes.
    pub const ALLOC: u32 = 1;
    /// cuMemAllocPitch/cudaMallocPitch: `size` rows of the pitch written to
    /// the out-parameter `pitch_pointer`.
    pub const PITCH: u32 = 2;
    /// cuMemCreate: the handle of `size` physical bytes is written to the
    /// out-parameter `pointer`.
    pub const CREATE: u32 = 3;
    /// Frees the block at address `pointer`.
    pub const FREE: u32 = 4;
    /// cuMemRelease of handle `handle`.
    pub const RELEASE: u32 = 5;
    /// cuMemMap of handle `handle` at address `pointer`.
    pub const MAP: u32 = 6;
    /// cuMemUnmap of the mapping at address `pointer`.
    pub const UNMAP: u32 = 7;
    /// Destroys or resets a CUDA context: the context epoch ends.
    pub const DESTROY_CONTEXT: u32 = 8;
}

/// Per thread: the outermost CUDA call in progress, from its entry probe to
/// its return probe. Kept apart from [`Pending`] so that a malloc inside a
/// CUDA call (or a CUDA call inside a malloc hook) never touches it; calls
/// nested in it (the driver under the runtime) only move `depth`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuPending {
    /// Out-parameter (ALLOC, PITCH, CREATE) or address (FREE, MAP, UNMAP).
    pub pointer: u64,
    /// Requested bytes; PITCH: the number of rows.
    pub size: u64,
    /// PITCH: where the pitch in bytes is written.
    pub pitch_pointer: u64,
    /// RELEASE, MAP: the physical memory handle.
    pub handle: u64,
    /// A `gpu_call` value.
    pub call: u32,
    /// CUDA calls in progress on this thread, the outermost included.
    pub depth: u32,
    pub kind: u32,
    /// A `gpu_api` id.
    pub api: u32,
}

/// Value of the VMM_HANDLES map: physical memory made by cuMemCreate. It
/// stays allocated while its handle is unreleased or any mapping of it
/// remains, so `holders` counts both; the memory is freed when it drops
/// to zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmmHandle {
    pub block: LiveAlloc,
    pub holders: u64,
}

/// Rare events for userspace, in the EVENTS ring buffer.
pub mod event {
    /// A traced process mapped a file with execute permission (a library
    /// being loaded): its symbols must be looked up.
    pub const EXEC_MAPPED: u32 = 1;
    /// A traced process replaced its image (execve).
    pub const EXEC: u32 = 2;
    /// A traced process destroyed or reset a CUDA context.
    pub const GPU_CONTEXT_DESTROYED: u32 = 3;
}

/// One message in the EVENTS ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// An `event` value.
    pub what: u32,
    pub tgid: u32,
    pub timestamp_ns: u64,
    /// EXEC and GPU_CONTEXT_DESTROYED: the CUDA context epoch that ended.
    pub context_epoch: u32,
    pub pad: u32,
}

/// Byte offsets of the `sys_enter_mmap` tracepoint fields the EXEC_MAPPED
/// watcher reads, from tracefs at start-up (defaults: Linux 6.x).
pub mod mmap_format {
    pub const PROT_OFFSET: u32 = 32;
    pub const FD_OFFSET: u32 = 48;
}

/// The mapping system calls, as `MappingEvent::call`.
pub mod mapping_call {
    pub const MMAP: u32 = 1;
    pub const MUNMAP: u32 = 2;
    pub const MREMAP: u32 = 3;
    pub const BRK: u32 = 4;
    pub const MPROTECT: u32 = 5;
}

/// Byte offsets of the tracepoint fields the mapping programs read, from
/// `/sys/kernel/tracing/events/syscalls/*/format` (set at load time).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallFieldOffsets {
    pub mmap_addr: u64,
    pub mmap_len: u64,
    pub mmap_prot: u64,
    pub mmap_flags: u64,
    pub mmap_fd: u64,
    pub munmap_addr: u64,
    pub munmap_len: u64,
    pub mremap_addr: u64,
    pub mremap_old_len: u64,
    pub mremap_new_len: u64,
    pub mprotect_start: u64,
    pub mprotect_len: u64,
    pub mprotect_prot: u64,
    /// `ret` of every `sys_exit_*` tracepoint (one offset for all: userspace
    /// checks that they agree).
    pub exit_ret: u64,
}

/// One successful mapping call of a target, sent to userspace through the
/// MAPPING_EVENTS ring buffer (without waking it: userspace drains it on a
/// timer). The arguments are the syscall's, as it was entered.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappingEvent {
    pub tgid: u32,
    /// `mapping_call`.
    pub call: u32,
    /// mmap, munmap, mprotect, mremap: the `addr` argument; brk: unused.
    pub address: u64,
    /// mmap, munmap, mprotect: `len`; mremap: `old_len`.
    pub length: u64,
    /// mremap: `new_len`.
    pub new_length: u64,
    /// mmap, mprotect: `prot`.
    pub prot: u64,
    /// mmap: `flags`.
    pub flags: u64,
    /// mmap: `fd` (as the kernel got it, so -1 is `u64::MAX`).
    pub fd: u64,
    /// The syscall's result: mmap and mremap the mapping's address, brk the
    /// new program break.
    pub result: u64,
    /// The word at the user stack pointer when the call was entered: the
    /// return address into the caller when a leaf wrapper (glibc's mmap,
    /// munmap, syscall) made the call, which the frame-pointer walk misses.
    pub caller_address: u64,
    /// User stack at entry (`NO_STACK` when not stored).
    pub stack_id: u32,
    /// 1 when the thread was inside a traced allocator call: the mapping is
    /// the allocator's, already counted as heap.
    pub in_allocator: u32,
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    unsafe impl aya::Pod for LiveKey {}
    unsafe impl aya::Pod for LiveAlloc {}
    unsafe impl aya::Pod for StackKey {}
    unsafe impl aya::Pod for StackTotals {}
    unsafe impl aya::Pod for Pending {}
    unsafe impl aya::Pod for GpuPending {}
    unsafe impl aya::Pod for VmmHandle {}
    unsafe impl aya::Pod for Event {}
    unsafe impl aya::Pod for SyscallFieldOffsets {}
    unsafe impl aya::Pod for MappingEvent {}
    unsafe impl aya::Pod for StackCopy {}
    unsafe impl aya::Pod for StackFree {}
}
