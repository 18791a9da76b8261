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

/// Whether a symbolized function name is one of [`ALLOCATORS`]: as
/// exported, with glibc's internal `__libc_` / `__GI_` prefixes, or
/// demangled (`operator new(unsigned long)`, any `operator new`).
pub fn is_allocator_function(function: &str) -> bool {
    if function.starts_with("operator new")
        || function.starts_with("_Znw")
        || function.starts_with("_Zna")
    {
        return true;
    }
    // glibc's internal aliases stack both prefixes: `__GI___libc_malloc`.
    let name = function.strip_prefix("__GI_").unwrap_or(function);
    let name = name.strip_prefix("__libc_").unwrap_or(name);
    ALLOCATORS.iter().any(|allocator| allocator.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hooked_name_is_trimmed_and_look_alikes_are_not() {
        for allocator in ALLOCATORS {
            assert!(is_allocator_function(allocator.name), "{}", allocator.name);
        }
        for name in [
            "__GI___libc_malloc",
            "__libc_calloc",
            "operator new[](unsigned long)",
        ] {
            assert!(is_allocator_function(name), "{name}");
        }
        for name in [
            "malloc_trim",
            "my_malloc",
            "freelist_pop",
            "operator delete(void*)",
        ] {
            assert!(!is_allocator_function(name), "{name}");
        }
    }
}
