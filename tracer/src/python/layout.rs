//! Where each CPython version keeps what tracer reads, in bytes, for
//! x86-64 release builds. 3.11 is from the v3.11.2 headers
//! (Include/internal/pycore_runtime.h, pycore_interp.h, pycore_frame.h,
//! Include/cpython/pystate.h, code.h, unicodeobject.h) and checked against
//! Debian's python3.11 (3.12: v3.12.1, checked on pyenv's 3.12.1) at attach (the version, then a thread state whose
//! `native_thread_id` is one of the process's threads).
use tracer_ebpf::PythonOffsets;

/// One version's offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// (major, minor) this layout is for.
    pub version: (u8, u8),
    /// `_PyRuntimeState.interpreters.head`.
    pub runtime_interpreters: u64,
    /// `PyInterpreterState.next`, `.threads.head`.
    pub interpreter_next: u64,
    pub interpreter_threads: u64,
    /// `PyThreadState.next`, `.native_thread_id`.
    pub thread_next: u64,
    pub thread_native_id: u64,
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

/// CPython 3.11 (3.11.0 to 3.11.x: the layout did not move in 3.11's
/// releases for the fields read here).
pub const PYTHON_3_11: Layout = Layout {
    version: (3, 11),
    runtime_interpreters: 40,
    interpreter_next: 0,
    interpreter_threads: 16,
    thread_next: 8,
    thread_native_id: 160,
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
pub const PYTHON_3_12: Layout = Layout {
    version: (3, 12),
    runtime_interpreters: 40,
    interpreter_next: 0,
    interpreter_threads: 72,
    thread_next: 8,
    thread_native_id: 144,
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

/// The layout of a version tracer knows.
pub fn for_version(major: u8, minor: u8) -> Option<&'static Layout> {
    [&PYTHON_3_11, &PYTHON_3_12]
        .into_iter()
        .find(|layout| layout.version == (major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_fields_fit_the_kernel_window() {
        for layout in [PYTHON_3_11, PYTHON_3_12] {
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

    #[test]
    fn knows_3_11_and_3_12() {
        assert_eq!(for_version(3, 11), Some(&PYTHON_3_11));
        assert_eq!(for_version(3, 12), Some(&PYTHON_3_12));
        assert_eq!(for_version(3, 9), None);
    }
}
