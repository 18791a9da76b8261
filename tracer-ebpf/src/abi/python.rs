//! Python frames: what userspace tells the kernel about each CPython
//! process (where its frames are, `PythonOffsets`) and thread (its
//! `PyThreadState`), and the Python stacks the kernel walks at each
//! recorded allocation (`PythonStack`, kept in PYTHON_STACKS by id).
//!
//! A stack whose allocation ran Python code carries its Python stack's id
//! as one extra frame, `PYTHON_FRAME_TAG | id`: the last return address of
//! a frame-pointer stack (so two Python callers of the same native path
//! are two stacks), and `StackCopy::python_stack` of a copied one.
//! Userspace replaces it by the Python frames, merged with the native ones.

/// Most Python frames one stack keeps (`--python-depth` up to this).
pub const MAX_PYTHON_FRAMES: usize = 128;

/// Marks a stack's frame that is not a return address but the id of its
/// Python stack in the low 32 bits. User addresses stay below 2^47.
pub const PYTHON_FRAME_TAG: u64 = 0xfe00_0000_0000_0000;

/// The Python stack id in a stack's frame, when it is one.
pub const fn python_stack_of_frame(frame: u64) -> Option<u32> {
    if frame & 0xffff_ffff_0000_0000 == PYTHON_FRAME_TAG {
        Some(frame as u32)
    } else {
        None
    }
}

/// Indices of PYTHON_ON.
pub mod python_setting {
    /// 1: some target runs Python; look threads up.
    pub const ON: u32 = 0;
    /// `--python-depth`.
    pub const DEPTH: u32 = 1;
    pub const COUNT: u32 = 2;
}

/// One Python frame as the kernel packs it: the code object's address
/// (bits 0-46), whether the frame is an entry frame (bit 47: the first
/// Python frame a native `_PyEval_EvalFrameDefault` call runs), and the
/// offset of its last instruction in code units (bits 48-63, saturated).
pub mod python_frame {
    pub const ADDRESS_MASK: u64 = (1 << 47) - 1;
    pub const ENTRY: u64 = 1 << 47;
    pub const OFFSET_SHIFT: u32 = 48;
    pub const MAX_OFFSET: u64 = 0xffff;
}

/// The Python frames of one stack, innermost first, packed as
/// `python_frame` says: a value of PYTHON_STACKS.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonStack {
    pub frames: [u64; MAX_PYTHON_FRAMES],
    /// How many of `frames` are the stack's.
    pub count: u32,
    /// 1 when the stack had more frames than `--python-depth`.
    pub truncated: u32,
    /// The process whose frames these are.
    pub tgid: u32,
    pub pad: u32,
}

impl PythonStack {
    /// FNV-1a over the process, the frames (past `count` not) and their
    /// count, and whether the stack was cut: its key in PYTHON_STACK_IDS.
    #[inline(always)]
    pub fn hash(&self, tgid: u32) -> u64 {
        let mut hash = crate::FNV_OFFSET_BASIS ^ ((tgid as u64) << 32 | self.count as u64);
        hash = (hash ^ self.truncated as u64).wrapping_mul(crate::FNV_PRIME);
        for index in 0..MAX_PYTHON_FRAMES {
            if index as u32 >= self.count {
                break;
            }
            hash = (hash ^ self.frames[index]).wrapping_mul(crate::FNV_PRIME);
        }
        hash
    }
}

impl Default for PythonStack {
    fn default() -> Self {
        PythonStack {
            frames: [0; MAX_PYTHON_FRAMES],
            count: 0,
            truncated: 0,
            tgid: 0,
            pad: 0,
        }
    }
}

/// Where one CPython version keeps a thread's frames (byte offsets), a
/// value of PYTHON_OFFSETS by process id.
///
/// Wide: the CPython offsets the kernel's Python walk reads, one per field
/// (one layout for both sides).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonOffsets {
    /// `PyThreadState` -> the current frame, or (`frame_indirect` = 1) the
    /// structure whose field at `current_frame` is it (3.11-3.12 `cframe`;
    /// 3.10: `frame`, a `PyFrameObject`).
    pub thread_frame: u32,
    pub frame_indirect: u32,
    pub current_frame: u32,
    /// Frame fields, each below `FRAME_WINDOW` bytes: the code object, the
    /// previous frame, the last instruction (pointer), and the byte that
    /// marks an entry frame: the frame is packed with `python_frame::ENTRY`
    /// when `(byte ^ entry_xor != 0) ^ entry_invert` (3.11: `is_entry`, 0,
    /// 0; 3.12: `owner`, 3, 1: the frame owned by the C stack that
    /// `_PyEval_EvalFrameDefault` puts below the first frame it runs).
    pub frame_code: u32,
    pub frame_previous: u32,
    pub frame_instruction: u32,
    pub frame_entry: u32,
    pub entry_xor: u32,
    pub entry_invert: u32,
    /// Code object -> its first instruction (`co_code_adaptive`).
    pub code_instructions: u32,
    /// 1: the frame's instruction field is not a pointer but the index of
    /// its last instruction in code units, an `int` (3.10's `f_lasti`).
    pub instruction_index: u32,
    /// What the kernel follows to find the thread state of a thread that
    /// userspace has not read yet (a thread that just started):
    /// `PyInterpreterState.threads.head`, `PyThreadState.next`, the thread
    /// id field (`native_thread_id`; 3.10: `thread_id`, `pthread_self()`,
    /// when `thread_id_is_pthread` is 1, whose `struct pthread` keeps the
    /// kernel's thread id at `pthread_tid`).
    pub interpreter_threads: u32,
    pub thread_next: u32,
    pub thread_id: u32,
    pub thread_id_is_pthread: u32,
    pub pthread_tid: u32,
    /// Where the process's `_PyRuntime.interpreters.head` is (0: none).
    pub interpreters: u64,
}

/// A thread of a Python process whose thread state the kernel did not
/// find (a value of PYTHON_MISSED by thread id): when it last looked
/// (`bpf_ktime_get_ns`), and how many allocations got native frames only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonThreadMiss {
    pub searched_at: u64,
    pub allocations: u64,
}

/// Most thread states the kernel looks through for an unknown thread.
pub const MAX_SEARCHED_THREADS: usize = 64;

/// Nanoseconds a thread that was not found waits before the kernel looks
/// for its thread state again (a native thread of a Python process, or a
/// thread whose state is not bound yet).
pub const THREAD_SEARCH_PAUSE_NS: u64 = 1_000_000;

/// Bytes of each frame read at once: every field of `PythonOffsets` that
/// names a frame field is below it.
pub const FRAME_WINDOW: usize = 128;

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(frames: &[u64], truncated: u32) -> PythonStack {
        let mut stack = PythonStack::default();
        stack.frames[..frames.len()].copy_from_slice(frames);
        stack.count = frames.len() as u32;
        stack.truncated = truncated;
        stack
    }

    #[test]
    fn python_stacks_differ_by_process_frames_and_cut_not_past_their_count() {
        let base = stack(&[0x10, 0x20], 0).hash(1000);
        assert_ne!(stack(&[0x10, 0x20], 0).hash(1001), base, "another process");
        assert_ne!(stack(&[0x20, 0x10], 0).hash(1000), base);
        assert_ne!(stack(&[0x10, 0x20], 1).hash(1000), base, "cut");
        assert_ne!(stack(&[0x10], 0).hash(1000), base);
        let mut stale = stack(&[0x10, 0x20], 0);
        stale.frames[2] = 0x30;
        stale.tgid = 77;
        assert_eq!(stale.hash(1000), base, "the argument names the process");
        let by_hand = crate::FNV_OFFSET_BASIS ^ (1000 << 32 | 1);
        let by_hand = by_hand.wrapping_mul(crate::FNV_PRIME);
        let by_hand = (by_hand ^ 0x10).wrapping_mul(crate::FNV_PRIME);
        assert_eq!(stack(&[0x10], 0).hash(1000), by_hand);
    }

    #[test]
    fn a_frame_is_a_python_stack_only_under_its_tag() {
        assert_eq!(python_stack_of_frame(PYTHON_FRAME_TAG | 42), Some(42));
        assert_eq!(python_stack_of_frame(PYTHON_FRAME_TAG), Some(0));
        assert_eq!(python_stack_of_frame(0x7fff_1234_5678), None);
        assert_eq!(python_stack_of_frame(PYTHON_FRAME_TAG | 1 << 32), None);
    }
}
