//! The names userspace finds the object's maps, programs and load-time
//! globals by. The eBPF side names them by its statics and functions (aya's
//! macros take no constant), so a test in `tracer` checks every name here
//! against the built object: a rename on either side fails it.

/// One `&str` constant per name, and `ALL`, every name of the list.
macro_rules! names {
    ($($name:ident = $value:literal,)*) => {
        $(pub const $name: &str = $value;)*
        /// Every name of this list.
        pub const ALL: &[&str] = &[$($name),*];
    };
}

/// Maps userspace reads, fills, resizes or takes.
pub mod map {
    names! {
        LIVE = "LIVE",
        BY_STACK = "BY_STACK",
        STACKS = "STACKS",
        STACK_IDS = "STACK_IDS",
        STACK_FREE_IDS = "STACK_FREE_IDS",
        STATS = "STATS",
        PROGRAM_RUNS = "PROGRAM_RUNS",
        STACK_API = "STACK_API",
        VMM_HANDLES = "VMM_HANDLES",
        VMM_MAPPINGS = "VMM_MAPPINGS",
        CONTEXT_EPOCH = "CONTEXT_EPOCH",
        EXEC_TIME = "EXEC_TIME",
        COPY_STACKS_OF = "COPY_STACKS_OF",
        GO_STACK_SWITCHES = "GO_STACK_SWITCHES",
        STACK_COPIES = "STACK_COPIES",
        COPY_FREES = "COPY_FREES",
        COPY_FREES_MADE = "COPY_FREES_MADE",
        EVENTS = "EVENTS",
        TRACED_TGIDS = "TRACED_TGIDS",
        OPENED = "OPENED",
        TARGETS = "TARGETS",
        MAPPING_EVENTS = "MAPPING_EVENTS",
        FOLLOWED = "FOLLOWED",
        FORKS = "FORKS",
        COMM_NAMES = "COMM_NAMES",
        STARTED = "STARTED",
        PYTHON_THREADS = "PYTHON_THREADS",
        PYTHON_OFFSETS = "PYTHON_OFFSETS",
        PYTHON_STACKS = "PYTHON_STACKS",
        PYTHON_ON = "PYTHON_ON",
        PYTHON_STACK_IDS = "PYTHON_STACK_IDS",
        PYTHON_FREE_IDS = "PYTHON_FREE_IDS",
        PYTHON_NEW_IDS = "PYTHON_NEW_IDS",
        PENDING = "PENDING",
        SIGNAL_SAVED = "SIGNAL_SAVED",
        MAPPING_PENDING = "MAPPING_PENDING",
        PYTHON_MISSED = "PYTHON_MISSED",
        UNWIND_ROWS = "UNWIND_ROWS",
        UNWIND_TABLES = "UNWIND_TABLES",
        UNWIND_MAPPINGS = "UNWIND_MAPPINGS",
        LOADS_OPENED = "LOADS_OPENED",
        LOADS_DONE = "LOADS_DONE",
        LOADER_HELD = "LOADER_HELD",
        EXCEPTION_UNWINDS = "EXCEPTION_UNWINDS",
        EXCEPTION_HELD = "EXCEPTION_HELD",
    }
}

/// Programs userspace loads and attaches. The uprobe session programs are
/// found by their `_session` suffix instead.
pub mod program {
    names! {
        MALLOC_ENTER = "malloc_enter",
        CALLOC_ENTER = "calloc_enter",
        REALLOC_ENTER = "realloc_enter",
        REALLOCARRAY_ENTER = "reallocarray_enter",
        POSIX_MEMALIGN_ENTER = "posix_memalign_enter",
        ALIGNED_ENTER = "aligned_enter",
        PVALLOC_ENTER = "pvalloc_enter",
        FREE_ENTER = "free_enter",
        PYOBJECT_MALLOC_ENTER = "pyobject_malloc_enter",
        PYOBJECT_CALLOC_ENTER = "pyobject_calloc_enter",
        PYOBJECT_REALLOC_ENTER = "pyobject_realloc_enter",
        ALLOC_RETURN = "alloc_return",
        FLOOR_ENTER = "floor_enter",
        FLOOR_RETURN = "floor_return",
        SPAWN_GATE = "spawn_gate",
        LOADER_GATE = "loader_gate",
        UNWIND_START = "unwind_start",
        GPU_ALLOC_ENTER = "gpu_alloc_enter",
        GPU_PITCH_ENTER = "gpu_pitch_enter",
        GPU_CREATE_ENTER = "gpu_create_enter",
        GPU_FREE_ENTER = "gpu_free_enter",
        GPU_RELEASE_ENTER = "gpu_release_enter",
        GPU_MAP_ENTER = "gpu_map_enter",
        GPU_UNMAP_ENTER = "gpu_unmap_enter",
        GPU_CONTEXT_ENTER = "gpu_context_enter",
        GPU_RETURN = "gpu_return",
        TENSOR_MALLOC_RETURN = "tensor_malloc_return",
        TENSOR_FREE_ENTER = "tensor_free_enter",
        PROCESS_EXEC = "process_exec",
        EXEC_MAPPED = "exec_mapped",
        OPEN_ENTER = "open_enter",
        OPEN_EXIT = "open_exit",
        PROCESS_FORK = "process_fork",
        COMM_EXEC = "comm_exec",
        SIGNAL_DELIVER = "signal_deliver",
        SIGNAL_RETURN = "signal_return",
        MMAP_ENTER = "mmap_enter",
        MUNMAP_ENTER = "munmap_enter",
        MREMAP_ENTER = "mremap_enter",
        MPROTECT_ENTER = "mprotect_enter",
        MAPPING_EXIT = "mapping_exit",
        PROCESS_EXIT = "process_exit",
        MADVISE_ENTER = "madvise_enter",
        PAGE_FAULT = "page_fault",
    }
}

/// Read-only globals userspace sets at load time (`override_global`).
pub mod global {
    names! {
        MAX_STACKS = "MAX_STACKS",
        MAX_PYTHON_STACKS = "MAX_PYTHON_STACKS",
        SAMPLE_BYTES = "SAMPLE_BYTES",
        SAMPLE_SEED = "SAMPLE_SEED",
        SAMPLE_SKIP_CHANCE = "SAMPLE_SKIP_CHANCE",
        MIN_SIZE_BYTES = "MIN_SIZE_BYTES",
        MAX_SIZE_BYTES = "MAX_SIZE_BYTES",
        STACK_COPY_MODE = "STACK_COPY_MODE",
        STACK_PAGES = "STACK_PAGES",
        MMAP_PROT_OFFSET = "MMAP_PROT_OFFSET",
        MMAP_FD_OFFSET = "MMAP_FD_OFFSET",
        OPENAT_FILENAME_OFFSET = "OPENAT_FILENAME_OFFSET",
        OPENAT_RET_OFFSET = "OPENAT_RET_OFFSET",
        SYSCALL_FIELD_OFFSETS = "SYSCALL_FIELD_OFFSETS",
        FORK_CHILD_PID_OFFSET = "FORK_CHILD_PID_OFFSET",
        EXIT_GROUP_DEAD_OFFSET = "EXIT_GROUP_DEAD_OFFSET",
        GO_STACK_SEARCH = "GO_STACK_SEARCH",
        UNWIND_TABLES_ON = "UNWIND_TABLES_ON",
        RETURN_INSTANCE_OFFSETS = "RETURN_INSTANCE_OFFSETS",
    }
}
