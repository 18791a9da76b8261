//! Stacks: the frame-pointer stacks the kernel keeps (STACKS), copied
//! stacks (`--unwind copy`) with their references in place of STACKS ids,
//! and the records of the STACK_COPIES ring buffer.

/// Most return addresses a frame-pointer stack keeps (the kernel's own
/// limit for `bpf_get_stack`, PERF_MAX_STACK_DEPTH).
pub const MAX_STACK_FRAMES: usize = 127;

/// The return addresses of one frame-pointer stack, innermost first, the
/// rest zero: a value of STACKS, keyed by the stack's id.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackFrames {
    pub frames: [u64; MAX_STACK_FRAMES],
    /// How many of `frames` are the stack's.
    pub count: u64,
}

/// FNV-1a's 64-bit offset basis and prime, for the stack tables' keys.
pub const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl StackFrames {
    /// FNV-1a over the stack's return addresses (one word at a time) and
    /// their count: its key in STACK_IDS. Frames past `count` do not count.
    #[inline(always)]
    pub fn hash(&self) -> u64 {
        let mut hash = FNV_OFFSET_BASIS ^ self.count;
        for index in 0..MAX_STACK_FRAMES {
            if index as u64 >= self.count {
                break;
            }
            hash = (hash ^ self.frames[index]).wrapping_mul(FNV_PRIME);
        }
        hash
    }
}

impl Default for StackFrames {
    fn default() -> Self {
        StackFrames {
            frames: [0; MAX_STACK_FRAMES],
            count: 0,
        }
    }
}

/// A stack id with these top bits set is not a STACKS id but a reference
/// to a stack copied into the STACK_COPIES ring buffer (`--unwind copy`):
/// userspace unwinds it and keeps the totals of such blocks itself, from
/// the copy and free records of that ring.
pub const COPIED_STACK: u32 = 1 << 30;
/// The bits of a copied-stack reference that tell copies apart.
pub const COPIED_STACK_MASK: u32 = COPIED_STACK - 1;

/// Whether `stack_id` refers to a copied stack (not [`crate::NO_STACK`]).
pub const fn is_copied_stack(stack_id: u32) -> bool {
    stack_id & !COPIED_STACK_MASK == COPIED_STACK
}

/// Record types of the STACK_COPIES ring buffer. Records are read in the
/// order they were reserved, so a block's copy always comes before its free.
/// A free or restore that finds the ring full goes to the COPY_FREES map
/// instead (never lost while that map has room: it holds as many entries
/// as LIVE), where userspace finds it at its next drain.
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
    /// [`super::StackFree`] (`stack_ref` 0): the process replaced its
    /// image (exec). Every record of the old image came before it; no free
    /// of the old image's blocks comes after it.
    pub const EXEC: u32 = 5;
}

/// Largest number of stack pages one copy holds (`--stack-bytes` up to
/// 64 KiB, from the start of the stack pointer's page).
pub const MAX_STACK_PAGES: u32 = 16;
pub const STACK_PAGE_BYTES: u64 = 4096;

/// A new block with its user stack copied at the allocator's return: the
/// registers the unwinder starts from and the stack pages from the one the
/// stack pointer is in, upwards. The pages follow this header.
///
/// Wide: the ring record of a copied stack (one layout for both sides).
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
    /// The PYTHON_STACKS id of the Python stack the call ran, 0 for none
    /// (ids start at 1).
    pub python_stack: u32,
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
    /// A Go program's C code called through cgo runs on the thread's
    /// system stack; its Go callers are on the goroutine's stack. When the
    /// copy holds the frame where `runtime.asmcgocall` switched stacks
    /// ([`GoStackSwitch`]): the address of that frame's return address in
    /// the copy, and the goroutine's stack pointer before the switch.
    /// `goroutine_length` bytes of the goroutine's stack from there follow
    /// the `length` bytes of the copy. All 0 otherwise.
    pub switch_at: u64,
    pub goroutine_sp: u64,
    pub goroutine_length: u64,
}

/// Most bytes of a goroutine's stack a copy holds (from its stack pointer
/// at the switch, up to the stack's top).
pub const MAX_GOROUTINE_BYTES: u64 = 8 << 10;

/// How `runtime.asmcgocall` of a Go program (amd64) leaves the goroutine's
/// stack for the system stack (g0) before it calls C, read by userspace
/// from its code: a value of GO_STACK_SWITCHES, by process.
///
/// On the system stack, just above the return address of its call into
/// C, it keeps the goroutine (its `g`) and the depth of the goroutine's
/// stack pointer below the stack's top (`g.stack.hi`), "since the stack
/// might be copied during a callback"; on return it computes the stack
/// pointer back from them. So does the kernel, to copy the goroutine's
/// stack too.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoStackSwitch {
    /// The return address of asmcgocall's call into C on the system stack.
    pub return_address: u64,
    /// Where the goroutine's `g` and its stack depth are kept, in bytes
    /// from the call's CFA (the stack pointer after it returns).
    pub g_slot: u32,
    pub depth_slot: u32,
    /// Offset of `stack.hi` in the runtime's `g`.
    pub stack_hi: u32,
    pub pad: u32,
}

/// Largest slot offset a [`GoStackSwitch`] may name (the kernel masks it).
pub const MAX_GO_SLOT: u32 = 0xf8;

/// Key of COPY_FREES: a copied-stack block, by its process and the
/// reference its LIVE entry carries.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CopyRef {
    pub tgid: u32,
    pub stack_ref: u32,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(frames: &[u64]) -> StackFrames {
        let mut stack = StackFrames::default();
        stack.frames[..frames.len()].copy_from_slice(frames);
        stack.count = frames.len() as u64;
        stack
    }

    #[test]
    fn the_hash_is_fnv_1a_over_the_frames_and_their_count() {
        assert_eq!(stack(&[]).hash(), FNV_OFFSET_BASIS);
        // Forged return addresses collide at will (the top bit of two
        // frames flipped): why the kernel compares frames on a hit.
        let top = 1 << 63;
        assert_eq!(
            stack(&[0x401000 ^ top, 0x402000 ^ top]).hash(),
            stack(&[0x401000, 0x402000]).hash()
        );
        let by_hand = ((FNV_OFFSET_BASIS ^ 2) ^ 0x1000).wrapping_mul(FNV_PRIME);
        let by_hand = (by_hand ^ 0x2000).wrapping_mul(FNV_PRIME);
        assert_eq!(stack(&[0x1000, 0x2000]).hash(), by_hand);
    }

    #[test]
    fn stacks_differ_by_order_count_and_frames_not_by_what_lies_past_them() {
        let base = stack(&[0x401000, 0x402000, 0x403000]).hash();
        assert_ne!(stack(&[0x402000, 0x401000, 0x403000]).hash(), base);
        assert_ne!(stack(&[0x401000, 0x402000]).hash(), base);
        assert_ne!(stack(&[0x401000, 0x402000, 0x403000, 0]).hash(), base);
        assert_ne!(stack(&[0x401000, 0x402000, 0x403001]).hash(), base);
        let mut stale = stack(&[0x401000, 0x402000, 0x403000]);
        stale.frames[3] = 0xdead;
        stale.frames[MAX_STACK_FRAMES - 1] = 0xbeef;
        assert_eq!(stale.hash(), base);
        let full = stack(&[7; MAX_STACK_FRAMES]);
        assert_ne!(full.hash(), stack(&[7; MAX_STACK_FRAMES - 1]).hash());
    }

    #[test]
    fn copied_stack_references_are_told_from_stack_ids() {
        assert!(is_copied_stack(COPIED_STACK));
        assert!(is_copied_stack(COPIED_STACK | COPIED_STACK_MASK));
        assert!(!is_copied_stack(0));
        assert!(!is_copied_stack(COPIED_STACK_MASK));
        assert!(!is_copied_stack(crate::NO_STACK));
        assert!(!is_copied_stack(COPIED_STACK << 1 | 5));
    }
}
