//! The mapping system calls' events (MAPPING_EVENTS) and the tracepoint
//! fields they are read from.

/// TARGETS values: how a process is followed.
pub mod target {
    /// Its mapping calls, with the stacks of those that add mappings.
    pub const MAPPINGS: u32 = 1;
    /// `--resident`: its page faults, with their stacks, and its mapping
    /// calls without stacks (what they take back is all that counts).
    pub const RESIDENT: u32 = 2;
    /// With RESIDENT: bits 8..14 hold a sampling shift s: the faults of one
    /// page in 2^s are sent (chosen by the page's address, so all of a
    /// page's faults or none), each standing for 2^s pages.
    pub const SAMPLE_SHIFT_BIT: u32 = 8;
    pub const MAX_SAMPLE_SHIFT: u32 = 6;

    /// Whether the page at `address` is sampled at shift `shift`: a
    /// multiplicative hash of its page number (Fibonacci hashing), whose
    /// top `shift` bits are zero for one page in 2^shift.
    pub const fn page_sampled(address: u64, shift: u32) -> bool {
        if shift == 0 {
            return true;
        }
        ((address >> 12).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - shift)) == 0
    }
}

/// The madvise advice `--resident` follows (`MappingEvent::prot` of a
/// MADVISE event): the kernel sends only these, userspace acts on them.
pub mod advice {
    /// After these a range's pages are no longer resident (or may be
    /// dropped at any time): DONTNEED, FREE, REMOVE, PAGEOUT,
    /// DONTNEED_LOCKED.
    pub const GIVES_BACK: [u64; 5] = [4, 8, 9, 21, 24];
    /// Asks for transparent huge pages in the range, and takes it back.
    pub const HUGEPAGE: u64 = 14;
    pub const NOHUGEPAGE: u64 = 15;

    /// Whether the kernel sends a madvise call with `advice`. Allocators
    /// call madvise often with other advice (WILLNEED, ...).
    pub const fn is_followed(advice: u64) -> bool {
        if advice == HUGEPAGE || advice == NOHUGEPAGE {
            return true;
        }
        let mut index = 0;
        while index < GIVES_BACK.len() {
            if GIVES_BACK[index] == advice {
                return true;
            }
            index += 1;
        }
        false
    }
}

/// The mapping system calls, as `MappingEvent::call`.
pub mod mapping_call {
    pub const MMAP: u32 = 1;
    pub const MUNMAP: u32 = 2;
    pub const MREMAP: u32 = 3;
    pub const BRK: u32 = 4;
    pub const MPROTECT: u32 = 5;
    /// madvise (`--resident`): advice that gives pages back or asks for
    /// huge pages (`MappingEvent::prot` holds the advice).
    pub const MADVISE: u32 = 6;
    /// A user page fault (`--resident`): `address` is the faulting
    /// address, `length` 4 KiB, `prot` 1 for a write fault, `new_length`
    /// the sampling shift it was sent at (it stands for 2^shift pages);
    /// sent at the fault, with its stack.
    pub const FAULT: u32 = 7;
}

/// Byte offsets of the tracepoint fields the mapping programs read, from
/// `/sys/kernel/tracing/events/syscalls/*/format` (set at load time).
///
/// Wide: the tracepoints' field offsets read from tracefs, one per field the
/// programs read.
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
    pub madvise_start: u64,
    pub madvise_len: u64,
    pub madvise_behavior: u64,
    /// `address` and `error_code` of `exceptions:page_fault_user`.
    pub fault_address: u64,
    pub fault_error_code: u64,
    /// `ret` of every `sys_exit_*` tracepoint (one offset for all: userspace
    /// checks that they agree).
    pub exit_ret: u64,
    /// `__syscall_nr` of `sys_enter_mmap` and `sys_enter_brk` (userspace
    /// checks that they agree): one program follows both calls.
    pub syscall_nr: u64,
    /// brk's system call number on this architecture.
    pub brk_syscall: u64,
}

/// One successful mapping call of a target, sent to userspace through the
/// MAPPING_EVENTS ring buffer (without waking it: userspace drains it on a
/// timer). The arguments are the syscall's, as it was entered.
///
/// Wide: the record the mapping programs write to their ring for userspace
/// (one layout for both sides).
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

#[cfg(test)]
mod tests {
    use super::advice;

    #[test]
    fn the_kernel_sends_the_advice_userspace_acts_on_and_no_other() {
        for followed in [4, 8, 9, 21, 24, 14, 15] {
            assert!(advice::is_followed(followed), "{followed}");
        }
        for ignored in [0, 1, 2, 3, 10, 12, 20, 22, 25] {
            assert!(!advice::is_followed(ignored), "{ignored}");
        }
    }
}
