//! Tracer's own count of its programs' runs (PROGRAM_RUNS), kept by the
//! programs themselves rather than by the kernel's run-time stats: those
//! (BPF_ENABLE_STATS, `kernel.bpf_stats_enabled`) are host-wide, and
//! while they are on every eBPF program on the host, other tools' and the
//! network's included, pays two clock reads a run and has its counters
//! moved. Each counted program adds one to its per-CPU `runs` every run,
//! and times one run in [`TIMED_EVERY`] on each CPU (`bpf_ktime_get_ns`
//! at its start and end): exact hits, and a sampled time per run.

/// One in this many runs of a program on a CPU is timed.
pub const TIMED_EVERY: u64 = 16;

/// One program's runs on one CPU (a PROGRAM_RUNS value).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramRuns {
    /// Every run.
    pub runs: u64,
    /// The runs that were timed.
    pub timed_runs: u64,
    /// Their time, in total.
    pub timed_ns: u64,
    /// When the timed run under way on this CPU started; 0 when none is.
    pub started_ns: u64,
}

/// The counted programs' ids: a PROGRAM_RUNS index each. The floor
/// programs are not counted: they must stay empty (`tracer floor`, and the
/// trap measurement at start).
pub mod counted {
    id_table! {
        /// Each counted program's name (its function's), by id.
        COUNTED_NAMES: [&str] {
            MALLOC_ENTER => "malloc_enter",
            MALLOC_SESSION => "malloc_session",
            CALLOC_ENTER => "calloc_enter",
            CALLOC_SESSION => "calloc_session",
            ALIGNED_ENTER => "aligned_enter",
            ALIGNED_SESSION => "aligned_session",
            PVALLOC_ENTER => "pvalloc_enter",
            PVALLOC_SESSION => "pvalloc_session",
            POSIX_MEMALIGN_ENTER => "posix_memalign_enter",
            POSIX_MEMALIGN_SESSION => "posix_memalign_session",
            REALLOC_ENTER => "realloc_enter",
            REALLOC_SESSION => "realloc_session",
            REALLOCARRAY_ENTER => "reallocarray_enter",
            REALLOCARRAY_SESSION => "reallocarray_session",
            PYOBJECT_MALLOC_ENTER => "pyobject_malloc_enter",
            PYOBJECT_MALLOC_SESSION => "pyobject_malloc_session",
            PYOBJECT_CALLOC_ENTER => "pyobject_calloc_enter",
            PYOBJECT_CALLOC_SESSION => "pyobject_calloc_session",
            PYOBJECT_REALLOC_ENTER => "pyobject_realloc_enter",
            PYOBJECT_REALLOC_SESSION => "pyobject_realloc_session",
            FREE_ENTER => "free_enter",
            ALLOC_RETURN => "alloc_return",
            SPAWN_GATE => "spawn_gate",
            LOADER_GATE => "loader_gate",
            UNWIND_START => "unwind_start",
            GPU_ALLOC_ENTER => "gpu_alloc_enter",
            GPU_PITCH_ENTER => "gpu_pitch_enter",
            GPU_CREATE_ENTER => "gpu_create_enter",
            GPU_FREE_ENTER => "gpu_free_enter",
            GPU_RELEASE_ENTER => "gpu_release_enter",
            GPU_MAP_ENTER => "gpu_map_enter",
            GPU_UNMAP_ENTER => "gpu_unmap_enter",
            GPU_CONTEXT_ENTER => "gpu_context_enter",
            GPU_RETURN => "gpu_return",
            TENSOR_MALLOC_RETURN => "tensor_malloc_return",
            TENSOR_FREE_ENTER => "tensor_free_enter",
            PROCESS_EXEC => "process_exec",
            EXEC_MAPPED => "exec_mapped",
            OPEN_ENTER => "open_enter",
            OPEN_EXIT => "open_exit",
            PROCESS_FORK => "process_fork",
            COMM_EXEC => "comm_exec",
            SIGNAL_DELIVER => "signal_deliver",
            SIGNAL_RETURN => "signal_return",
            MMAP_ENTER => "mmap_enter",
            MUNMAP_ENTER => "munmap_enter",
            MREMAP_ENTER => "mremap_enter",
            MPROTECT_ENTER => "mprotect_enter",
            MAPPING_EXIT => "mapping_exit",
            PROCESS_EXIT => "process_exit",
            MADVISE_ENTER => "madvise_enter",
            PAGE_FAULT => "page_fault",
        }
    }

    /// The id of the program named `name`; a name that is not in the
    /// table fails the build where the id is a constant.
    pub const fn id_of(name: &str) -> u32 {
        let mut id = 0;
        while id < COUNTED_NAMES.len() {
            if same(COUNTED_NAMES[id].as_bytes(), name.as_bytes()) {
                return id as u32;
            }
            id += 1;
        }
        panic!("a counted program without an id in COUNTED_NAMES")
    }

    const fn same(a: &[u8], b: &[u8]) -> bool {
        if a.len() != b.len() {
            return false;
        }
        let mut index = 0;
        while index < a.len() {
            if a[index] != b[index] {
                return false;
            }
            index += 1;
        }
        true
    }
}
