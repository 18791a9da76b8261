//! Python frames, read from the kernel at each recorded allocation of a
//! thread whose CPython thread state userspace found (`tracer::python`).
//!
//! The walk follows the interpreter's frame chain from the thread state
//! (`PythonOffsets` per process: 3.10's `PyFrameObject`s by `f_back`,
//! 3.11+'s interpreter frames by `previous`), and packs
//! each frame as (code object, entry flag, instruction offset). Each
//! distinct Python stack gets an id (PYTHON_STACKS), and the stack
//! code (`stacks.rs`) makes it part of the stack's identity: the last
//! frame of a frame-pointer stack, `StackCopy::python_stack` of a copy.
//!
//! Processes without Python cost one array lookup per allocation
//! (PYTHON_ON stays 0 until userspace finds an interpreter).
use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, generated::bpf_probe_read_user},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, Queue},
};
use tracer_ebpf::{
    FRAME_WINDOW, MAX_PYTHON_FRAMES, MAX_SEARCHED_THREADS, PythonOffsets, PythonStack,
    PythonThreadMiss, THREAD_SEARCH_PAUSE_NS, python_frame, python_setting, stat,
};

use crate::counters::{count, fetch_add};

/// Set by userspace once it found an interpreter in some target:
/// `python_setting::ON` is 1, `python_setting::DEPTH` the most Python
/// frames walked per stack (`--python-depth`).
#[map]
static PYTHON_ON: Array<u32> = Array::with_max_entries(python_setting::COUNT, 0);

/// The `PyThreadState` of each Python thread, by thread id. Entries made on
/// use, as in PYTHON_STACK_IDS: no attach pays for a table a target without
/// CPython never fills.
#[map]
static PYTHON_THREADS: HashMap<u32, u64> = HashMap::with_max_entries(1 << 16, BPF_F_NO_PREALLOC);

/// Where each Python process's frames are, by process id.
#[map]
static PYTHON_OFFSETS: HashMap<u32, PythonOffsets> = HashMap::with_max_entries(4096, 0);

/// Most Python stacks held at once, set by userspace (the tables'
/// size): ids are 1 to it.
#[unsafe(no_mangle)]
static MAX_PYTHON_STACKS: aya_ebpf::Global<u32> = aya_ebpf::Global::new(1 << 17);

/// The frames of each Python stack, by id (from 1). Bounded like STACKS
/// (`stacks.rs`): userspace evicts a Python stack no stack it holds
/// names any more, by the same protocol (its hash unlinked from
/// PYTHON_STACK_IDS first, its entry deleted and its id given back
/// through PYTHON_FREE_IDS a grace period later).
#[map]
static PYTHON_STACKS: HashMap<u32, PythonStack> =
    HashMap::with_max_entries(1 << 17, BPF_F_NO_PREALLOC);

/// The id of each Python stack, by a hash of its frames and process.
#[map]
static PYTHON_STACK_IDS: HashMap<u64, u32> = HashMap::with_max_entries(1 << 17, BPF_F_NO_PREALLOC);

/// The number of Python stack ids never handed out before that were.
#[map]
static PYTHON_NEXT_ID: Array<u64> = Array::with_max_entries(1, 0);

/// Ids of evicted Python stacks, given back by userspace, handed out
/// again before new ones (first in, first out). Sized by userspace to
/// hold every id.
#[map]
static PYTHON_FREE_IDS: Queue<u32> = Queue::with_max_entries(1 << 17, 0);

/// The id of each Python stack stored, for userspace to name it at once
/// (its code objects may be gone later). Sized to hold every id; one
/// that does not fit is named when a stack with it is read.
#[map]
static PYTHON_NEW_IDS: Queue<u32> = Queue::with_max_entries(1 << 17, 0);

/// Bytes of the frame chain's memory copied at once. CPython 3.11+ keeps
/// the frames of a thread side by side in its data stack (each caller
/// below its callee), so one read brings many frames: a window ends where
/// the frame that did not fit the last one ends, and reaches down this
/// many bytes (or to the start of that frame's page, where the memory
/// below is not mapped). 3.10's frames are heap objects: a read for most.
const WINDOW_BYTES: u64 = 4096;
const WINDOW_WORDS: usize = WINDOW_BYTES as usize / 8;

/// Per CPU: the stack being walked, and the window of frame memory: its
/// words from user address `start`, `bytes` of them valid.
#[repr(C)]
struct Scratch {
    stack: PythonStack,
    start: u64,
    bytes: u64,
    window: [u64; WINDOW_WORDS],
}

#[map]
static PYTHON_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// The Python stack the current thread runs, as its PYTHON_STACKS id;
/// None for a thread without Python frames (or not a Python thread).
#[inline(always)]
pub(crate) fn current_stack() -> Option<u32> {
    match tracer_python_stack() {
        NO_PYTHON_STACK => None,
        id => Some(id as u32),
    }
}

/// What `tracer_python_stack` returns for no Python stack.
const NO_PYTHON_STACK: i64 = -1;

/// [`current_stack`]'s walk, as a global function: the kernel verifies
/// it once per program, not once for each path of the program that
/// reaches it (a program taking stacks in several places verified the
/// unrolled walk that many times). The id, or `NO_PYTHON_STACK`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn tracer_python_stack() -> i64 {
    match walk_current() {
        Some(id) => id as i64,
        None => NO_PYTHON_STACK,
    }
}

#[inline(always)]
fn walk_current() -> Option<u32> {
    if PYTHON_ON.get(python_setting::ON).copied().unwrap_or(0) == 0 {
        return None;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let offsets = unsafe { PYTHON_OFFSETS.get(&((pid_tgid >> 32) as u32)) }?;
    let tid = pid_tgid as u32;
    let thread_state = match unsafe { PYTHON_THREADS.get(&tid) } {
        Some(&thread_state) => thread_state,
        None => match search(offsets, tid) {
            Some(thread_state) => thread_state,
            None => {
                count(stat::PYTHON_THREAD_UNKNOWN);
                return None;
            }
        },
    };
    walk(offsets, thread_state, (pid_tgid >> 32) as u32)
}

/// Threads of Python processes the kernel looked for and did not find,
/// with when (`bpf_ktime_get_ns`) and how many of their allocations got
/// native frames only: userspace reads them for the report.
#[map]
static PYTHON_MISSED: LruHashMap<u32, PythonThreadMiss> = LruHashMap::with_max_entries(4096, 0);

/// The thread state of `tid`, looked for in its interpreter's thread list
/// (a thread started since userspace last read it); stored in
/// PYTHON_THREADS when found. A thread not found is not looked for again
/// for THREAD_SEARCH_PAUSE_NS.
#[inline(never)]
fn search(offsets: &PythonOffsets, tid: u32) -> Option<u64> {
    let now = unsafe { bpf_ktime_get_ns() };
    let missed = unsafe { PYTHON_MISSED.get(&tid) }.copied();
    if let Some(miss) = missed
        && now.wrapping_sub(miss.searched_at) < THREAD_SEARCH_PAUSE_NS
    {
        let _ = PYTHON_MISSED.insert(
            &tid,
            &PythonThreadMiss {
                searched_at: miss.searched_at,
                allocations: miss.allocations + 1,
            },
            0,
        );
        return None;
    }
    let found = find_thread(offsets, tid);
    match found {
        Some(thread_state) => {
            let _ = PYTHON_THREADS.insert(&tid, &thread_state, 0);
            count(stat::PYTHON_THREAD_FOUND);
        }
        None => {
            let allocations = missed.map_or(0, |miss| miss.allocations) + 1;
            let _ = PYTHON_MISSED.insert(
                &tid,
                &PythonThreadMiss {
                    searched_at: now,
                    allocations,
                },
                0,
            );
        }
    }
    found
}

/// The thread state whose thread id is `tid` in the thread list of the
/// process's first interpreter (at most MAX_SEARCHED_THREADS).
#[inline(never)]
fn find_thread(offsets: &PythonOffsets, tid: u32) -> Option<u64> {
    if offsets.interpreters == 0 {
        return None;
    }
    let interpreter = read_u64(offsets.interpreters)?;
    if interpreter == 0 {
        return None;
    }
    let mut thread = read_u64(interpreter + offsets.interpreter_threads as u64)?;
    // All ones when the id field is pthread_self().
    let pthread = 0u64.wrapping_sub(offsets.thread_id_is_pthread as u64 & 1);
    for _ in 0..MAX_SEARCHED_THREADS {
        if thread == 0 {
            break;
        }
        let id = read_u64(thread + offsets.thread_id as u64).unwrap_or(0);
        // A failed read (not a pthread pointer) reads 0.
        let from_pthread =
            read_u32((id & pthread).wrapping_add(offsets.pthread_tid as u64)).unwrap_or(0) as u64;
        let id = (from_pthread & pthread) | (id & !pthread);
        if id != 0 && id == tid as u64 {
            return Some(thread);
        }
        thread = read_u64(thread + offsets.thread_next as u64).unwrap_or(0);
    }
    None
}

#[inline(never)]
fn walk(offsets: &PythonOffsets, thread_state: u64, tgid: u32) -> Option<u32> {
    let mut frame = read_u64(thread_state + offsets.thread_frame as u64)?;
    if offsets.frame_indirect != 0 {
        if frame == 0 {
            return None;
        }
        frame = read_u64(frame + offsets.current_frame as u64)?;
    }
    let scratch = PYTHON_SCRATCH.get_ptr_mut(0)?;
    let scratch = unsafe { &mut *scratch };
    let depth = PYTHON_ON.get(python_setting::DEPTH).copied().unwrap_or(0);
    // The frames changed since the last walk.
    scratch.start = 0;
    scratch.bytes = 0;
    // One branch in the loop body (its end), so that the verifier's walk
    // of it stays linear: a frame that cannot be read reads as zeros,
    // whose previous frame (0) ends the walk, and past --python-depth the
    // next frame is masked to 0.
    let mut count_frames = 0u32;
    let mut beyond = 0u64;
    for index in 0..MAX_PYTHON_FRAMES {
        if frame == 0 {
            break;
        }
        // The frame's first word in the window, and all ones when it is
        // there (else 0: its fields read as 0).
        let at = tracer_python_window(frame);
        let valid = !((at >> 63) as u64);
        let base = at as u64;
        let window = &scratch.window;
        let code = word(window, base, offsets.frame_code) & valid;
        let instruction = word(window, base, offsets.frame_instruction) & valid;
        let entry_byte =
            (byte(window, base, offsets.frame_entry) & valid) ^ offsets.entry_xor as u64;
        let entry = (((entry_byte & 0xff) + 0xff) >> 8) ^ (offsets.entry_invert as u64 & 1);
        beyond = word(window, base, offsets.frame_previous) & valid;
        // All ones while index + 1 < depth.
        let more = (((index as u64 + 1).wrapping_sub(depth as u64)) as i64 >> 63) as u64;
        frame = beyond & more;
        // Code units since the first instruction (an offset past 64 Ki
        // units, or before the first, wraps: such a frame has no line):
        // from the instruction pointer, or (3.10) the `int` index of the
        // last instruction, whose -1 (not started) wraps too.
        let from_pointer = instruction.wrapping_sub(code + offsets.code_instructions as u64) >> 1;
        let is_index = 0u64.wrapping_sub(offsets.instruction_index as u64 & 1);
        let units = ((instruction & 0xffff_ffff & is_index) | (from_pointer & !is_index))
            & python_frame::MAX_OFFSET;
        scratch.stack.frames[index & (MAX_PYTHON_FRAMES - 1)] = (code & python_frame::ADDRESS_MASK)
            | (entry << 47)
            | (units << python_frame::OFFSET_SHIFT);
        count_frames = index as u32 + 1;
    }
    if count_frames == 0 {
        return None;
    }
    let truncated = (frame == 0 && beyond != 0) as u32;
    if truncated != 0 {
        count(stat::PYTHON_TRUNCATED);
    }
    scratch.stack.count = count_frames;
    scratch.stack.truncated = truncated;
    scratch.stack.tgid = tgid;
    count(stat::PYTHON_STACKS);
    let hash = scratch.stack.hash(tgid);
    if let Some(&id) = unsafe { PYTHON_STACK_IDS.get(&hash) } {
        return Some(id);
    }
    store(hash, &scratch.stack)
}

/// Hands a new Python stack an id, stores its frames and tells userspace.
/// An id taken but not used goes back to PYTHON_FREE_IDS.
#[inline(never)]
fn store(hash: u64, stack: &PythonStack) -> Option<u32> {
    let Some(id) = new_id() else {
        count(stat::DROP_PYTHON_STACK);
        return None;
    };
    if PYTHON_STACKS
        .insert(&id, stack, BPF_NOEXIST as u64)
        .is_err()
    {
        give_back(id);
        count(stat::DROP_PYTHON_STACK);
        return None;
    }
    if PYTHON_STACK_IDS
        .insert(&hash, &id, BPF_NOEXIST as u64)
        .is_ok()
    {
        let _ = PYTHON_NEW_IDS.push(id, 0);
        return Some(id);
    }
    // Another CPU stored the same stack first: use its id.
    let _ = PYTHON_STACKS.remove(&id);
    give_back(id);
    match unsafe { PYTHON_STACK_IDS.get(&hash) } {
        Some(&first) => Some(first),
        None => {
            count(stat::DROP_PYTHON_STACK);
            None
        }
    }
}

/// An id for a new Python stack: one given back, else one never used;
/// None when every id is held.
#[inline(always)]
fn new_id() -> Option<u32> {
    if let Ok(Some(id)) = PYTHON_FREE_IDS.pop() {
        return Some(id);
    }
    let next = PYTHON_NEXT_ID.get_ptr_mut(0)?;
    let id = fetch_add(next, 1);
    (id < MAX_PYTHON_STACKS.load() as u64).then_some(id as u32 + 1)
}

/// Returns an id taken by `new_id` and not used.
#[inline(always)]
fn give_back(id: u32) {
    // The queue holds every id: it has room.
    let _ = PYTHON_FREE_IDS.push(id, 0);
}

#[inline(always)]
fn read_u32(address: u64) -> Option<u32> {
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(address as *const u32) }.ok()
}

#[inline(always)]
fn read_u64(address: u64) -> Option<u64> {
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(address as *const u64) }.ok()
}

/// Makes the window hold the `FRAME_WINDOW` bytes of the frame at `frame`
/// (read in when it does not) and returns the index of its first word
/// there; -1 when they cannot be read. A global function: verified once,
/// not once per frame of the walk's loop.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn tracer_python_window(frame: u64) -> i64 {
    let Some(scratch) = PYTHON_SCRATCH.get_ptr_mut(0) else {
        return -1;
    };
    let scratch = unsafe { &mut *scratch };
    if frame & 7 != 0 {
        return -1;
    }
    let end = frame.wrapping_add(FRAME_WINDOW as u64);
    let offset = frame.wrapping_sub(scratch.start);
    if scratch.start != 0
        && frame >= scratch.start
        && offset.wrapping_add(FRAME_WINDOW as u64) <= scratch.bytes
    {
        return (offset / 8) as i64;
    }
    let words = scratch.window.as_mut_ptr();
    let mut start = end.wrapping_sub(WINDOW_BYTES);
    let mut bytes = WINDOW_BYTES;
    let mut read = unsafe { bpf_probe_read_user(words.cast(), bytes as u32, start as *const _) };
    if read != 0 {
        // From the start of the frame's page only.
        start = frame & !4095;
        bytes = end.wrapping_sub(start);
        if bytes > WINDOW_BYTES || bytes < FRAME_WINDOW as u64 {
            scratch.start = 0;
            return -1;
        }
        read = unsafe { bpf_probe_read_user(words.cast(), bytes as u32, start as *const _) };
    }
    if read != 0 {
        scratch.start = 0;
        return -1;
    }
    scratch.start = start;
    scratch.bytes = bytes;
    (frame.wrapping_sub(start) / 8) as i64
}

/// The 8-byte field at byte `offset` (8-aligned) of the frame whose first
/// word is `base` in the window.
#[inline(always)]
fn word(window: &[u64; WINDOW_WORDS], base: u64, offset: u32) -> u64 {
    window[(base as usize + offset as usize / 8) & (WINDOW_WORDS - 1)]
}

/// The byte at `offset` of the frame whose first word is `base` in the
/// window.
#[inline(always)]
fn byte(window: &[u64; WINDOW_WORDS], base: u64, offset: u32) -> u64 {
    let word = window[(base as usize + offset as usize / 8) & (WINDOW_WORDS - 1)];
    (word >> ((offset % 8) * 8)) & 0xff
}
