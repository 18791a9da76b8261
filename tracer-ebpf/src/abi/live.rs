//! The live set: the LIVE and BY_STACK maps' keys and values, and the
//! memory kinds they keep apart.

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
    /// Python objects from CPython's own allocator (`--python-objects`):
    /// blocks returned by `PyObject_Malloc` & co and `PyMem_Malloc` & co,
    /// most of them carved out of pymalloc's arenas. A block that such a
    /// call takes from malloc (over 512 bytes) is counted here once, not
    /// as heap; the arenas mapped inside such a call are not mmap-anon.
    pub const PYTHON_OBJECT: u32 = 8;
    /// Blocks of PyTorch's CUDA caching allocator handed out to tensors
    /// (`libc10_cuda.so`'s `DeviceCachingAllocator::malloc` to `free`):
    /// carved out of the gpu-device segments it allocated, so their bytes
    /// are part of gpu-device, never added to it.
    pub const GPU_TENSOR: u32 = 9;
    /// Pages resident since a fault (`--resident`): each charged to the
    /// stack that first touched it, until it is unmapped or given back
    /// (madvise). Counted by userspace from the fault events; no allocator
    /// call is traced in that mode.
    pub const RESIDENT: u32 = 10;
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
pub struct ByStackKey {
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
