//! The allocator functions, once for every layer: `attach` hooks each by
//! the shape of its call, and reports trim their frames off the top of a
//! stack so the first frame shown is the caller.
//!
//! C++'s `operator new` is hooked itself, not only the malloc it calls:
//! libstdc++ has no frame pointers, so a stack taken when malloc returns
//! into it loses the caller of `new`; taken when `new` returns, the stack
//! starts at that caller.

/// How an allocator function is called: which arguments give the size,
/// and where the block comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllocatorCall {
    /// `malloc(size)`, `valloc(size)`, every `operator new`.
    Malloc,
    /// `calloc(count, size)`.
    Calloc,
    /// `realloc(old, size)`.
    Realloc,
    /// `reallocarray(old, count, size)`.
    ReallocArray,
    /// `free(pointer)`.
    Free,
    /// `posix_memalign(&out, alignment, size)`.
    PosixMemalign,
    /// `aligned_alloc(alignment, size)`, `memalign(alignment, size)`.
    Aligned,
    /// `pvalloc(size)`: rounded up to whole pages.
    Pvalloc,
}

/// An allocator function by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocator {
    pub name: &'static str,
    pub call: AllocatorCall,
}

const fn allocator(name: &'static str, call: AllocatorCall) -> Allocator {
    Allocator { name, call }
}

/// Every allocator function tracer hooks, in whichever object defines it.
pub const ALLOCATORS: [Allocator; 18] = [
    allocator("malloc", AllocatorCall::Malloc),
    allocator("calloc", AllocatorCall::Calloc),
    allocator("realloc", AllocatorCall::Realloc),
    allocator("reallocarray", AllocatorCall::ReallocArray),
    allocator("free", AllocatorCall::Free),
    allocator("posix_memalign", AllocatorCall::PosixMemalign),
    allocator("aligned_alloc", AllocatorCall::Aligned),
    allocator("memalign", AllocatorCall::Aligned),
    allocator("valloc", AllocatorCall::Malloc),
    allocator("pvalloc", AllocatorCall::Pvalloc),
    allocator("_Znwm", AllocatorCall::Malloc),
    allocator("_Znam", AllocatorCall::Malloc),
    allocator("_ZnwmRKSt9nothrow_t", AllocatorCall::Malloc),
    allocator("_ZnamRKSt9nothrow_t", AllocatorCall::Malloc),
    allocator("_ZnwmSt11align_val_t", AllocatorCall::Malloc),
    allocator("_ZnamSt11align_val_t", AllocatorCall::Malloc),
    allocator("_ZnwmSt11align_val_tRKSt9nothrow_t", AllocatorCall::Malloc),
    allocator("_ZnamSt11align_val_tRKSt9nothrow_t", AllocatorCall::Malloc),
];

/// What a target may call besides the C functions: `operator delete`
/// (libstdc++'s passes on to `free`, but jemalloc's sized one does not),
/// and the own entry points of jemalloc, tcmalloc and mimalloc, which
/// programs call directly (Rust's tikv-jemallocator: `_rjem_sdallocx`;
/// redis built with its jemalloc: `je_malloc`). A function that only
/// passes its call on to another hooked one gets no probe of its own
/// (`forwards_to_hooked`); a block that passes through several hooked
/// layers is counted once (the kernel's per-thread depth).
pub const OWN_API_ALLOCATORS: [Allocator; 79] = [
    // operator delete, all variants (the pointer comes first).
    allocator("_ZdlPv", AllocatorCall::Free),
    allocator("_ZdaPv", AllocatorCall::Free),
    allocator("_ZdlPvm", AllocatorCall::Free),
    allocator("_ZdaPvm", AllocatorCall::Free),
    allocator("_ZdlPvRKSt9nothrow_t", AllocatorCall::Free),
    allocator("_ZdaPvRKSt9nothrow_t", AllocatorCall::Free),
    allocator("_ZdlPvSt11align_val_t", AllocatorCall::Free),
    allocator("_ZdaPvSt11align_val_t", AllocatorCall::Free),
    allocator("_ZdlPvmSt11align_val_t", AllocatorCall::Free),
    allocator("_ZdaPvmSt11align_val_t", AllocatorCall::Free),
    allocator("_ZdlPvSt11align_val_tRKSt9nothrow_t", AllocatorCall::Free),
    allocator("_ZdaPvSt11align_val_tRKSt9nothrow_t", AllocatorCall::Free),
    // jemalloc: its own API, plain and with the prefixes of static builds.
    allocator("mallocx", AllocatorCall::Malloc),
    allocator("rallocx", AllocatorCall::Realloc),
    allocator("dallocx", AllocatorCall::Free),
    allocator("sdallocx", AllocatorCall::Free),
    allocator("je_malloc", AllocatorCall::Malloc),
    allocator("je_calloc", AllocatorCall::Calloc),
    allocator("je_realloc", AllocatorCall::Realloc),
    allocator("je_free", AllocatorCall::Free),
    allocator("je_posix_memalign", AllocatorCall::PosixMemalign),
    allocator("je_aligned_alloc", AllocatorCall::Aligned),
    allocator("je_mallocx", AllocatorCall::Malloc),
    allocator("je_rallocx", AllocatorCall::Realloc),
    allocator("je_dallocx", AllocatorCall::Free),
    allocator("je_sdallocx", AllocatorCall::Free),
    allocator("_rjem_malloc", AllocatorCall::Malloc),
    allocator("_rjem_calloc", AllocatorCall::Calloc),
    allocator("_rjem_realloc", AllocatorCall::Realloc),
    allocator("_rjem_free", AllocatorCall::Free),
    allocator("_rjem_posix_memalign", AllocatorCall::PosixMemalign),
    allocator("_rjem_aligned_alloc", AllocatorCall::Aligned),
    allocator("_rjem_mallocx", AllocatorCall::Malloc),
    allocator("_rjem_rallocx", AllocatorCall::Realloc),
    allocator("_rjem_dallocx", AllocatorCall::Free),
    allocator("_rjem_sdallocx", AllocatorCall::Free),
    // tcmalloc: its own names (aliases in a shared tcmalloc, hooked once).
    allocator("tc_malloc", AllocatorCall::Malloc),
    allocator("tc_malloc_skip_new_handler", AllocatorCall::Malloc),
    allocator("tc_calloc", AllocatorCall::Calloc),
    allocator("tc_realloc", AllocatorCall::Realloc),
    allocator("tc_free", AllocatorCall::Free),
    allocator("tc_free_sized", AllocatorCall::Free),
    allocator("tc_memalign", AllocatorCall::Aligned),
    allocator("tc_posix_memalign", AllocatorCall::PosixMemalign),
    allocator("tc_valloc", AllocatorCall::Malloc),
    allocator("tc_pvalloc", AllocatorCall::Pvalloc),
    allocator("tc_new", AllocatorCall::Malloc),
    allocator("tc_newarray", AllocatorCall::Malloc),
    allocator("tc_new_nothrow", AllocatorCall::Malloc),
    allocator("tc_newarray_nothrow", AllocatorCall::Malloc),
    allocator("tc_delete", AllocatorCall::Free),
    allocator("tc_deletearray", AllocatorCall::Free),
    allocator("tc_delete_sized", AllocatorCall::Free),
    allocator("tc_deletearray_sized", AllocatorCall::Free),
    // mimalloc: its own API (mi_heap_* and the *_at variants are not hooked).
    allocator("mi_malloc", AllocatorCall::Malloc),
    allocator("mi_zalloc", AllocatorCall::Malloc),
    allocator("mi_calloc", AllocatorCall::Calloc),
    allocator("mi_mallocn", AllocatorCall::Calloc),
    allocator("mi_realloc", AllocatorCall::Realloc),
    allocator("mi_reallocn", AllocatorCall::ReallocArray),
    allocator("mi_reallocarray", AllocatorCall::ReallocArray),
    allocator("mi_free", AllocatorCall::Free),
    allocator("mi_free_size", AllocatorCall::Free),
    allocator("mi_free_aligned", AllocatorCall::Free),
    allocator("mi_free_size_aligned", AllocatorCall::Free),
    allocator("mi_malloc_aligned", AllocatorCall::Malloc),
    allocator("mi_zalloc_aligned", AllocatorCall::Malloc),
    allocator("mi_calloc_aligned", AllocatorCall::Calloc),
    allocator("mi_realloc_aligned", AllocatorCall::Realloc),
    allocator("mi_aligned_alloc", AllocatorCall::Aligned),
    allocator("mi_posix_memalign", AllocatorCall::PosixMemalign),
    allocator("mi_memalign", AllocatorCall::Aligned),
    allocator("mi_valloc", AllocatorCall::Malloc),
    allocator("mi_pvalloc", AllocatorCall::Pvalloc),
    allocator("mi_new", AllocatorCall::Malloc),
    allocator("mi_new_nothrow", AllocatorCall::Malloc),
    allocator("mi_new_aligned", AllocatorCall::Malloc),
    allocator("mi_new_aligned_nothrow", AllocatorCall::Malloc),
    allocator("mi_new_n", AllocatorCall::Calloc),
];

/// CPython's allocator functions, hooked in the interpreter with
/// `--python-objects` only (their blocks are kind python-object). The
/// PyMem_ ones use pymalloc too (CPython 3.6+) unless PYTHONMALLOC says
/// otherwise; then they pass the call on to malloc, nested, so a block is
/// still counted once. `PyMem_Raw*` are plain malloc: not hooked.
pub const PYTHON_OBJECT_ALLOCATORS: [Allocator; 8] = [
    allocator("PyObject_Malloc", AllocatorCall::Malloc),
    allocator("PyObject_Calloc", AllocatorCall::Calloc),
    allocator("PyObject_Realloc", AllocatorCall::Realloc),
    allocator("PyObject_Free", AllocatorCall::Free),
    allocator("PyMem_Malloc", AllocatorCall::Malloc),
    allocator("PyMem_Calloc", AllocatorCall::Calloc),
    allocator("PyMem_Realloc", AllocatorCall::Realloc),
    allocator("PyMem_Free", AllocatorCall::Free),
];

/// Every allocator function: the C and C++ ones, then the allocators' own.
pub fn all_allocators() -> impl Iterator<Item = &'static Allocator> {
    ALLOCATORS.iter().chain(&OWN_API_ALLOCATORS)
}

/// Whether a symbolized function name is one of [`all_allocators`]: as
/// exported, with glibc's internal `__libc_` / `__GI_` prefixes, or
/// demangled (`operator new(unsigned long)`, any `operator new`).
pub fn is_allocator_function(function: &str) -> bool {
    if function.starts_with("operator new")
        || function.starts_with("_Znw")
        || function.starts_with("_Zna")
        || is_std_allocator_allocate(function)
    {
        return true;
    }
    // glibc's internal aliases stack both prefixes: `__GI___libc_malloc`.
    let name = function.strip_prefix("__GI_").unwrap_or(function);
    let name = name.strip_prefix("__libc_").unwrap_or(name);
    all_allocators()
        .chain(&PYTHON_OBJECT_ALLOCATORS)
        .any(|allocator| allocator.name == name)
}

/// The C++ standard library's allocator classes, whose `allocate` only
/// calls operator new: a container's blocks are labelled at the container
/// code that asked, not at `std::__new_allocator<...>::allocate`.
const STD_ALLOCATOR_CLASSES: [&str; 5] = [
    "std::__new_allocator<",
    "__gnu_cxx::new_allocator<",
    "std::allocator<",
    "std::allocator_traits<",
    "__gnu_cxx::__alloc_traits<",
];

fn is_std_allocator_allocate(function: &str) -> bool {
    STD_ALLOCATOR_CLASSES
        .iter()
        .any(|class| function.starts_with(class))
        && (function.contains(">::allocate(") || function.ends_with(">::allocate"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hooked_name_is_trimmed_and_look_alikes_are_not() {
        for allocator in all_allocators() {
            assert!(is_allocator_function(allocator.name), "{}", allocator.name);
        }
        for name in [
            "__GI___libc_malloc",
            "__libc_calloc",
            "operator new[](unsigned long)",
            "PyObject_Malloc",
            "PyMem_Realloc",
            "std::__new_allocator<std::__detail::_Hash_node<std::pair<std::string const, int>, true> >::allocate(unsigned long, void const*)",
            "__gnu_cxx::new_allocator<int>::allocate",
            "std::allocator_traits<std::allocator<int> >::allocate(std::allocator<int>&, unsigned long)",
        ] {
            assert!(is_allocator_function(name), "{name}");
        }
        for name in [
            "malloc_trim",
            "my_malloc",
            "freelist_pop",
            "operator delete(void*)",
            "std::__new_allocator<int>::deallocate(int*, unsigned long)",
            "std::vector<int, std::allocator<int> >::_M_realloc_insert",
        ] {
            assert!(!is_allocator_function(name), "{name}");
        }
    }
}
