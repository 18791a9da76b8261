//! A stack's frames as the text report shows them, innermost first. A
//! stack with Python frames shows the Python frames and the native frames
//! nearest the allocation, as py-spy does; the native frames past those
//! (CPython's `_PyEval_*`, vectorcall helpers, `Py_RunMain`, and the C
//! between two Python frames) are folded into one line per run with their
//! count, and a run of one Python frame calling itself into one line with
//! its depth. `--native all` shows every frame.

use crate::model::module_offset;
use crate::model::{Frame, Language, merge::is_interpreter};
use crate::output::{NativeFrames, StackReport};

/// What one line shows.
#[derive(Debug, PartialEq)]
enum Shown<'a> {
    /// A frame, and how many times in a row it appears (recursion).
    Frame(&'a Frame, usize),
    /// Native frames left out, and the objects they are in.
    Folded(usize, Vec<String>),
}

pub fn render_frames(stack: &StackReport, native: NativeFrames, lines: &mut Vec<String>) {
    if stack.frames.is_empty() {
        lines.push("      (stack not recorded)".to_owned());
    }
    for shown in shown_frames(&stack.frames, native) {
        lines.push(match shown {
            Shown::Frame(frame, 1) => format!("      {}", describe_frame(frame)),
            Shown::Frame(frame, times) => {
                format!("      {}  × {times} (recursion)", describe_frame(frame))
            }
            Shown::Folded(count, modules) => format!(
                "      [{count} native frame{}{}{}]",
                if count == 1 { "" } else { "s" },
                if modules.is_empty() { "" } else { ": " },
                modules.join(", ")
            ),
        });
    }
}

/// The lines of `frames` (innermost first).
fn shown_frames(frames: &[Frame], native: NativeFrames) -> Vec<Shown<'_>> {
    let python = |frame: &Frame| frame.language == Language::Python;
    let innermost = frames.iter().position(python);
    let Some(innermost) = innermost.filter(|_| native == NativeFrames::Nearest) else {
        return frames.iter().map(|frame| Shown::Frame(frame, 1)).collect();
    };
    // The native code the innermost Python frame called (a C extension,
    // torch's C++; or the interpreter's own allocation, its innermost
    // frame), and everything it called.
    let called = frames[..innermost]
        .iter()
        .rposition(|frame| !is_interpreter(frame))
        .unwrap_or(0);
    let mut shown: Vec<Shown<'_>> = Vec::new();
    for (index, frame) in frames.iter().enumerate() {
        let kept = index <= called || python(frame) || is_marker(frame);
        match shown.last_mut() {
            Some(Shown::Frame(last, times)) if kept && python(frame) && same_place(last, frame) => {
                *times += 1;
            }
            Some(Shown::Folded(count, modules)) if !kept => {
                *count += 1;
                add_module(modules, frame);
            }
            _ if kept => shown.push(Shown::Frame(frame, 1)),
            _ => {
                let mut modules = Vec::new();
                add_module(&mut modules, frame);
                shown.push(Shown::Folded(1, modules));
            }
        }
    }
    shown
}

/// Whether two Python frames are one function at one line.
fn same_place(a: &Frame, b: &Frame) -> bool {
    (&a.function, &a.file, a.line) == (&b.function, &b.file, b.line)
}

/// A frame that only says where a walk stopped (no address, no object).
fn is_marker(frame: &Frame) -> bool {
    frame.address == 0 && frame.module.is_none() && frame.file.is_none()
}

fn add_module(modules: &mut Vec<String>, frame: &Frame) {
    let Some(module) = frame.module.as_deref() else {
        return;
    };
    let name = std::path::Path::new(module).file_name().map_or_else(
        || module.to_owned(),
        |name| name.to_string_lossy().into_owned(),
    );
    if !modules.contains(&name) {
        modules.push(name);
    }
}

/// `function (file:line)` when the source is known, otherwise the function
/// and where it is in its object (`libfoo.so+0x1a2b`, see
/// `model::module_offset`).
fn describe_frame(frame: &Frame) -> String {
    let location = match (&frame.file, frame.line) {
        (Some(file), Some(line)) => format!("({file}:{line})"),
        (Some(file), None) => format!("({file})"),
        (None, _) => module_offset(frame),
    };
    match &frame.function {
        // A marker frame (the stack ends here) has no address.
        Some(function) if is_marker(frame) => function.clone(),
        Some(function) => format!("{function} {location}"),
        None => location,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_frames_with_what_is_known() {
        let with = |function: Option<&str>, file: Option<&str>, line, module: Option<&str>| Frame {
            address: 0x7f00_1234,
            function: function.map(str::to_owned),
            file: file.map(str::to_owned),
            line,
            module: module.map(str::to_owned),
            offset: module.map(|_| 0x1234),
            ..Frame::default()
        };
        let module = Some("/usr/lib/libfoo.so.1");
        assert_eq!(
            describe_frame(&with(Some("f"), Some("src/f.c"), Some(3), module)),
            "f (src/f.c:3)"
        );
        assert_eq!(
            describe_frame(&with(Some("f"), Some("src/f.c"), None, None)),
            "f (src/f.c)"
        );
        assert_eq!(
            describe_frame(&with(Some("f"), None, None, module)),
            "f libfoo.so.1+0x1234"
        );
        assert_eq!(
            describe_frame(&with(None, None, None, module)),
            "libfoo.so.1+0x1234"
        );
        assert_eq!(describe_frame(&with(None, None, None, None)), "0x7f001234");
        let marker = Frame {
            function: Some("[unwinding stopped: outside code]".to_owned()),
            ..Frame::default()
        };
        assert_eq!(describe_frame(&marker), "[unwinding stopped: outside code]");
    }

    fn native(function: &str, module: &str) -> Frame {
        Frame {
            address: 0x1000,
            function: Some(function.to_owned()),
            module: Some(module.to_owned()),
            offset: Some(0x1000),
            ..Frame::default()
        }
    }

    fn python(function: &str, line: u32) -> Frame {
        Frame {
            function: Some(function.to_owned()),
            file: Some("app.py".to_owned()),
            line: Some(line),
            language: Language::Python,
            ..Frame::default()
        }
    }

    /// numpy's C under the program's Python, recursion, the interpreter's
    /// own C between and below the Python frames.
    fn python_stack() -> Vec<Frame> {
        let py = "/usr/bin/python3.11";
        vec![
            native("array_new", "/usr/lib/numpy/_multiarray_umath.so"),
            native(
                "PyArray_NewFromDescr",
                "/usr/lib/numpy/_multiarray_umath.so",
            ),
            native("_PyObject_MakeTpCall", py),
            native("_PyEval_EvalFrameDefault", py),
            python("track", 58),
            native("_PyEval_EvalFrameDefault", py),
            native("_PyFunction_Vectorcall", py),
            native("do_call_core", py),
            python("nested", 114),
            python("nested", 114),
            python("nested", 114),
            python("<module>", 174),
            native("PyEval_EvalCode", py),
            native("Py_RunMain", py),
            native("__libc_start_main", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
            native("_start", py),
        ]
    }

    fn lines(native: NativeFrames) -> Vec<String> {
        let stack = StackReport {
            frames: python_stack(),
            ..crate::report::fixtures::sample_report(1).stacks[0].clone()
        };
        let mut lines = Vec::new();
        render_frames(&stack, native, &mut lines);
        lines.iter().map(|line| line.trim().to_owned()).collect()
    }

    #[test]
    fn python_stacks_fold_the_interpreter_and_recursion_with_their_counts() {
        assert_eq!(
            lines(NativeFrames::Nearest),
            [
                "array_new _multiarray_umath.so+0x1000",
                "PyArray_NewFromDescr _multiarray_umath.so+0x1000",
                "[2 native frames: python3.11]",
                "track (app.py:58)",
                "[3 native frames: python3.11]",
                "nested (app.py:114)  × 3 (recursion)",
                "<module> (app.py:174)",
                "[4 native frames: python3.11, libc.so.6]",
            ]
        );
    }

    #[test]
    fn native_all_shows_every_frame() {
        let all = lines(NativeFrames::All);
        assert_eq!(all.len(), python_stack().len(), "{all:#?}");
        assert_eq!(all[3], "_PyEval_EvalFrameDefault python3.11+0x1000");
        assert_eq!(all[9], "nested (app.py:114)");
    }

    #[test]
    fn native_stacks_are_shown_whole() {
        let frames = vec![native("leak", "/app"), native("main", "/app")];
        assert_eq!(shown_frames(&frames, NativeFrames::Nearest).len(), 2);
    }
}
