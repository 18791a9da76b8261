//! Where each CPython version keeps what tracer reads, in bytes, for
//! x86-64 release builds: tables for 3.9, 3.10, 3.11 and 3.12, and 3.13's
//! read from the `_Py_DebugOffsets` at the start of its `_PyRuntime`. 3.9
//! is from the v3.9.2 headers, each offset found again with ctypes in
//! Debian 11's python3.9 (3.9.2; tests/dist.rs traces it). 3.10 is
//! from the v3.10.13 headers (Include/internal/pycore_runtime.h,
//! pycore_interp.h, Include/cpython/pystate.h, frameobject.h, code.h) and
//! checked on pyenv's 3.10.13 (each offset found again in a live process
//! with ctypes: `tests` below hold the bytes). 3.11 is from
//! the v3.11.2 headers (Include/internal/pycore_runtime.h, pycore_interp.h, pycore_frame.h,
//! Include/cpython/pystate.h, code.h, unicodeobject.h) and checked against
//! Debian's python3.11 (3.12: v3.12.1, checked on pyenv's 3.12.1) at attach (the version, then a thread state whose
//! `native_thread_id` is one of the process's threads).
use tracer_ebpf::PythonOffsets;

/// One version's offsets.
///
/// Wide: CPython's struct offsets for one version, one field per offset the
/// walk reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionLayout {
    /// (major, minor) this layout is for.
    pub version: (u8, u8),
    /// `_PyRuntimeState.interpreters.head`.
    pub runtime_interpreters: u64,
    /// `PyInterpreterState.next`, `.threads.head`.
    pub interpreter_next: u64,
    pub interpreter_threads: u64,
    /// `PyThreadState.next`, `.native_thread_id` (3.10: `.thread_id`).
    pub thread_next: u64,
    pub thread_native_id: u64,
    /// The thread id field is `pthread_self()` (3.10's `thread_id`), not
    /// the kernel's thread id: the thread id is read from the thread's
    /// glibc `struct pthread` it points to.
    pub thread_id_is_pthread: bool,
    /// What the kernel walks.
    pub frames: PythonOffsets,
    /// `PyCodeObject` fields.
    pub code_filename: u64,
    pub code_name: u64,
    /// `co_qualname`, where there is one (3.11+).
    pub code_qualname: Option<u64>,
    pub code_first_line: u64,
    pub code_line_table: u64,
    /// Bytes of code object read to find all of the above.
    pub code_header: usize,
    /// `PyASCIIObject` size: where the characters of a compact ASCII
    /// string start; `PyCompactUnicodeObject` size, for other compact
    /// strings; the `state` bit field's offset.
    pub ascii_data: u64,
    pub compact_data: u64,
    pub unicode_state: u64,
    /// `PyBytesObject.ob_sval`.
    pub bytes_data: u64,
    /// Entry frames are the C stack's shim frames below the first frame
    /// an evaluation runs (3.12+), not flagged Python frames (3.11).
    pub entry_is_shim: bool,
}

/// CPython 3.9 (Debian 11's): 3.10's layout but for `f_lasti`, at 104
/// (`PyFrameObject` has `f_stacktop` where 3.10 has `f_stackdepth`) and
/// counted in bytes, and the line table, `co_lnotab` in 3.10's place
/// (`lines::line_3_9`).
pub const PYTHON_3_9: VersionLayout = VersionLayout {
    version: (3, 9),
    frames: PythonOffsets {
        frame_instruction: 104,
        ..PYTHON_3_10.frames
    },
    ..PYTHON_3_10
};

/// CPython 3.10 (v3.10.13 headers; every offset found in pyenv's 3.10.13
/// with ctypes). Frames are `PyFrameObject`s, each run by its own native
/// `_PyEval_EvalFrameDefault` call: every frame is an entry frame.
pub const PYTHON_3_10: VersionLayout = VersionLayout {
    version: (3, 10),
    // _PyRuntimeState: 4 ints, _finalizing, then interpreters.mutex, .head.
    runtime_interpreters: 32,
    // PyInterpreterState.next, .tstate_head.
    interpreter_next: 0,
    interpreter_threads: 8,
    // PyThreadState.next, .thread_id (pthread_self()).
    thread_next: 8,
    thread_native_id: 176,
    thread_id_is_pthread: true,
    frames: PythonOffsets {
        // PyThreadState.frame, the current PyFrameObject.
        thread_frame: 24,
        frame_indirect: 0,
        current_frame: 0,
        // PyFrameObject.f_code, .f_back, .f_lasti (an int, in code units).
        frame_code: 32,
        frame_previous: 24,
        frame_instruction: 96,
        // The top byte of ob_type (a user pointer: always 0), inverted:
        // every frame is an entry frame.
        frame_entry: 15,
        entry_xor: 0,
        entry_invert: 1,
        code_instructions: 0,
        instruction_index: 1,
        ..THREAD_SEARCH_UNSET
    },
    // PyCodeObject: co_filename, co_name, co_firstlineno, co_linetable.
    code_filename: 104,
    code_name: 112,
    code_qualname: None,
    code_first_line: 40,
    code_line_table: 120,
    code_header: 128,
    ascii_data: 48,
    compact_data: 72,
    unicode_state: 32,
    bytes_data: 32,
    entry_is_shim: false,
};

/// CPython 3.11 (3.11.0 to 3.11.x: the layout did not move in 3.11's
/// releases for the fields read here).
pub const PYTHON_3_11: VersionLayout = VersionLayout {
    version: (3, 11),
    runtime_interpreters: 40,
    interpreter_next: 0,
    interpreter_threads: 16,
    thread_next: 8,
    thread_native_id: 160,
    thread_id_is_pthread: false,
    frames: PythonOffsets {
        // PyThreadState.cframe -> _PyCFrame.current_frame.
        thread_frame: 56,
        frame_indirect: 1,
        current_frame: 8,
        // _PyInterpreterFrame.f_code, .previous, .prev_instr, .is_entry.
        frame_code: 32,
        frame_previous: 48,
        frame_instruction: 56,
        frame_entry: 68,
        entry_xor: 0,
        entry_invert: 0,
        // PyCodeObject.co_code_adaptive.
        code_instructions: 184,
        instruction_index: 0,
        ..THREAD_SEARCH_UNSET
    },
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_first_line: 72,
    code_line_table: 136,
    code_header: 192,
    ascii_data: 48,
    compact_data: 72,
    unicode_state: 32,
    bytes_data: 32,
    entry_is_shim: false,
};

/// CPython 3.12 (v3.12.1 headers; checked live on pyenv's 3.12.1).
pub const PYTHON_3_12: VersionLayout = VersionLayout {
    version: (3, 12),
    runtime_interpreters: 40,
    interpreter_next: 0,
    interpreter_threads: 72,
    thread_next: 8,
    thread_native_id: 144,
    thread_id_is_pthread: false,
    frames: PythonOffsets {
        // PyThreadState.cframe -> _PyCFrame.current_frame.
        thread_frame: 56,
        frame_indirect: 1,
        current_frame: 0,
        // _PyInterpreterFrame.f_code, .previous, .prev_instr, and .owner:
        // FRAME_OWNED_BY_CSTACK (3) marks the shim below an entry frame.
        frame_code: 0,
        frame_previous: 8,
        frame_instruction: 56,
        frame_entry: 70,
        entry_xor: 3,
        entry_invert: 1,
        // PyCodeObject.co_code_adaptive.
        code_instructions: 192,
        instruction_index: 0,
        ..THREAD_SEARCH_UNSET
    },
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_first_line: 68,
    code_line_table: 136,
    code_header: 200,
    ascii_data: 40,
    compact_data: 56,
    unicode_state: 32,
    bytes_data: 32,
    entry_is_shim: true,
};

/// The thread-search fields of `PythonOffsets`, filled per process by
/// `Interpreter::kernel_offsets`.
const THREAD_SEARCH_UNSET: PythonOffsets = PythonOffsets {
    thread_frame: 0,
    frame_indirect: 0,
    current_frame: 0,
    frame_code: 0,
    frame_previous: 0,
    frame_instruction: 0,
    frame_entry: 0,
    entry_xor: 0,
    entry_invert: 0,
    code_instructions: 0,
    instruction_index: 0,
    interpreter_threads: 0,
    thread_next: 0,
    thread_id: 0,
    thread_id_is_pthread: 0,
    pthread_tid: 0,
    interpreters: 0,
};

/// The layout of a version tracer ships a table for.
pub fn for_version(major: u8, minor: u8) -> Option<VersionLayout> {
    [PYTHON_3_9, PYTHON_3_10, PYTHON_3_11, PYTHON_3_12]
        .into_iter()
        .find(|layout| layout.version == (major, minor))
}

/// `_Py_DebugOffsets`' cookie: the first bytes of `_PyRuntime` in 3.13+.
pub const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";
/// Bytes of 3.13's `_Py_DebugOffsets` (73 words, from the v3.13.0
/// Include/internal/pycore_runtime.h).
pub const DEBUG_OFFSETS_3_13_BYTES: usize = 73 * 8;
/// The largest size or field offset of a runtime, interpreter, thread
/// state, frame or code object a `_Py_DebugOffsets` may give (3.13's
/// largest is under 300 KiB).
pub const MAX_STRUCT_OFFSET: u64 = 1 << 20;
/// The largest offset in a string or bytes object's header (3.13: 40).
pub const MAX_OBJECT_HEADER_BYTES: u64 = 256;

/// 3.13's layout, every offset read from the `_Py_DebugOffsets` that
/// starts `_PyRuntime` (`bytes`, at least `DEBUG_OFFSETS_3_13_BYTES`):
/// the words of its runtime, interpreter, thread, frame, code, bytes and
/// unicode sections. None without the cookie, with a frame field beyond
/// the kernel's window, or with a word past its cap: MAX_STRUCT_OFFSET for
/// the sizes and field offsets of the runtime, interpreters, thread
/// states, frames and code objects, and MAX_OBJECT_HEADER_BYTES for the
/// string and bytes objects' headers, whose offsets size the read of
/// every name.
pub fn from_debug_offsets_3_13(bytes: &[u8]) -> Option<VersionLayout> {
    if bytes.len() < DEBUG_OFFSETS_3_13_BYTES || &bytes[..8] != DEBUG_COOKIE {
        return None;
    }
    let word = |index: usize| {
        u64::from_ne_bytes(bytes[index * 8..index * 8 + 8].try_into().expect("8 bytes"))
    };
    // Word 1 is the version; every other is a size or an offset.
    if (2..DEBUG_OFFSETS_3_13_BYTES / 8).any(|index| word(index) > MAX_STRUCT_OFFSET)
        || [66, 68, 70]
            .iter()
            .any(|&index| word(index) > MAX_OBJECT_HEADER_BYTES)
    {
        return None;
    }
    let small = |index: usize| u32::try_from(word(index)).ok();
    let frames = PythonOffsets {
        // PyThreadState.current_frame, read directly.
        thread_frame: small(23)?,
        frame_indirect: 0,
        current_frame: 0,
        // _PyInterpreterFrame.f_executable, .previous, .instr_ptr, .owner
        // (FRAME_OWNED_BY_CSTACK, 3, marks the shim below an entry frame).
        frame_code: small(30)?,
        frame_previous: small(29)?,
        frame_instruction: small(31)?,
        frame_entry: small(33)?,
        entry_xor: 3,
        entry_invert: 1,
        code_instructions: small(43)?,
        instruction_index: 0,
        ..THREAD_SEARCH_UNSET
    };
    let in_window = [
        frames.frame_code,
        frames.frame_previous,
        frames.frame_instruction,
    ]
    .iter()
    .all(|&offset| offset % 8 == 0 && offset as usize + 8 <= tracer_ebpf::FRAME_WINDOW)
        && (frames.frame_entry as usize) < tracer_ebpf::FRAME_WINDOW;
    if !in_window {
        return None;
    }
    let code_fields = [word(35), word(36), word(37), word(38), word(39)];
    let ascii_data = word(70);
    Some(VersionLayout {
        version: (3, 13),
        runtime_interpreters: word(5),
        interpreter_next: word(8),
        interpreter_threads: word(9),
        thread_next: word(21),
        thread_native_id: word(25),
        thread_id_is_pthread: false,
        frames,
        code_filename: word(35),
        code_name: word(36),
        code_qualname: Some(word(37)),
        code_first_line: word(39),
        code_line_table: word(38),
        code_header: (code_fields.iter().max()? + 8).min(4096) as usize,
        ascii_data,
        // PyCompactUnicodeObject: PyASCIIObject, utf8_length, utf8.
        compact_data: ascii_data + 16,
        unicode_state: word(68),
        bytes_data: word(66),
        entry_is_shim: true,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn frame_fields_fit_the_kernel_window() {
        for layout in [PYTHON_3_10, PYTHON_3_11, PYTHON_3_12] {
            check_window(layout.frames);
        }
    }

    fn check_window(frames: PythonOffsets) {
        for offset in [
            frames.frame_code,
            frames.frame_previous,
            frames.frame_instruction,
        ] {
            assert!(offset as usize + 8 <= tracer_ebpf::FRAME_WINDOW);
            assert_eq!(offset % 8, 0, "pointers are read as aligned words");
        }
        assert!((frames.frame_entry as usize) < tracer_ebpf::FRAME_WINDOW);
    }

    /// The first 73 words of `_PyRuntime` in pyenv's CPython 3.13.0 (built
    /// from python.org sources on this machine), read with ctypes.
    pub(crate) const DEBUG_OFFSETS_3_13_0: [u64; 73] = [
        0x7970677562656478,
        0x30d00f0,
        0x0,
        283320,
        608,
        632,
        194968,
        7272,
        7264,
        7344,
        7400,
        7656,
        7640,
        7648,
        16,
        7752,
        0,
        7768,
        7760,
        304,
        0,
        8,
        16,
        72,
        152,
        160,
        232,
        32,
        80,
        8,
        0,
        56,
        72,
        70,
        208,
        112,
        120,
        128,
        136,
        68,
        52,
        96,
        104,
        200,
        16,
        8,
        416,
        24,
        88,
        168,
        32,
        24,
        16,
        40,
        24,
        16,
        48,
        32,
        40,
        24,
        16,
        32,
        16,
        24,
        40,
        16,
        32,
        64,
        32,
        16,
        40,
        240,
        200,
    ];

    #[test]
    fn reads_3_13_layout_from_its_debug_offsets() {
        let bytes: Vec<u8> = DEBUG_OFFSETS_3_13_0
            .iter()
            .flat_map(|word| word.to_ne_bytes())
            .collect();
        let layout = from_debug_offsets_3_13(&bytes).expect("a 3.13 layout");
        assert_eq!(
            (
                layout.runtime_interpreters,
                layout.interpreter_threads,
                layout.thread_next,
                layout.thread_native_id
            ),
            (632, 7344, 8, 160),
            "as KERNEL-NOTES measured"
        );
        let frames = layout.frames;
        assert_eq!(
            (
                frames.thread_frame,
                frames.frame_indirect,
                frames.frame_code,
                frames.frame_previous,
                frames.frame_instruction,
                frames.frame_entry,
                frames.code_instructions
            ),
            (72, 0, 0, 8, 56, 70, 200)
        );
        assert_eq!(
            (
                layout.code_filename,
                layout.code_name,
                layout.code_qualname,
                layout.code_line_table,
                layout.code_first_line
            ),
            (112, 120, Some(128), 136, 68)
        );
        assert_eq!((layout.ascii_data, layout.compact_data), (40, 56));
        check_window(frames);
        let mut damaged = bytes.clone();
        damaged[0] = b'X';
        assert_eq!(from_debug_offsets_3_13(&damaged), None, "no cookie");
    }

    #[test]
    fn debug_offsets_past_their_caps_are_refused() {
        // The string header (it sizes every name's read), an interpreter's
        // thread list, a thread state's id: each a terabyte.
        for index in [70, 68, 66, 9, 25] {
            let mut words = DEBUG_OFFSETS_3_13_0;
            words[index] = 1 << 40;
            let bytes: Vec<u8> = words.iter().flat_map(|word| word.to_ne_bytes()).collect();
            assert_eq!(from_debug_offsets_3_13(&bytes), None, "word {index}");
        }
        // A string header of 4 KiB is no CPython's either.
        let mut words = DEBUG_OFFSETS_3_13_0;
        words[70] = 4096;
        let bytes: Vec<u8> = words.iter().flat_map(|word| word.to_ne_bytes()).collect();
        assert_eq!(from_debug_offsets_3_13(&bytes), None);
    }

    #[test]
    fn knows_3_9_3_10_3_11_and_3_12() {
        assert_eq!(for_version(3, 9), Some(PYTHON_3_9));
        assert_eq!(for_version(3, 10), Some(PYTHON_3_10));
        assert_eq!(for_version(3, 11), Some(PYTHON_3_11));
        assert_eq!(for_version(3, 12), Some(PYTHON_3_12));
        assert_eq!(for_version(3, 8), None);
    }
}
