//! The malloc family's per-thread state: the call in progress between
//! entry and return, and what a signal handler sets aside.

use crate::LiveAlloc;

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
///
/// Wide: the per-thread state of one allocator call and of sampling, one
/// map value that each program reads in one lookup.
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
    /// The thread's last free (or operator delete): its stack pointer at
    /// entry and the return address there, as for `unrecorded_sp`. free
    /// has no return probe; a mapping the thread makes while that word is
    /// still in place below it (glibc making a thread's arena inside its
    /// first free) is the allocator's. 0: none.
    pub free_sp: u64,
    pub free_return: u64,
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
    /// The `kind` the new block counts for: heap, or python-object for
    /// CPython's allocator functions (`--python-objects`).
    pub kind: u32,
    pub pad: u32,
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

/// Whether a return address is the uprobe trampoline's, which the kernel
/// writes over the return address of a probed call (a uprobe session
/// whose entry skipped the return included, on Linux 6.18): the page
/// at the top of the user address space, with 47- or 56-bit addresses.
#[inline(always)]
pub const fn is_uprobe_trampoline(address: u64) -> bool {
    address >> 12 == 0x7_ffff_fffe || address >> 12 == 0xfff_ffff_fffe
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trampoline_is_the_top_page_of_either_address_space() {
        for (address, is_trampoline) in [
            (0x7fff_ffff_e000, true),
            (0x7fff_ffff_efff, true),
            (0x7fff_ffff_dfff, false),
            (0x7fff_ffff_f000, false),
            (0x00ff_ffff_ffff_e123, true),
            (0x00ff_ffff_ffff_f000, false),
            (0x5555_5555_e000, false),
        ] {
            assert_eq!(
                is_uprobe_trampoline(address),
                is_trampoline,
                "0x{address:x}"
            );
        }
    }
}
