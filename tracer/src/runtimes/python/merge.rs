//! One stack out of native and Python frames, innermost first: each
//! native `_PyEval_EvalFrameDefault` frame stands for the Python frames it
//! was running, from the innermost not yet placed up to the next entry
//! frame (the first frame that call ran); every other native frame (C
//! extensions such as numpy, the interpreter's own C code) stays.
use std::borrow::Borrow;

use crate::model::{Frame, Language};

/// The native function that runs Python frames.
const EVAL_FUNCTION: &str = "_PyEval_EvalFrameDefault";

/// Merges `python` (innermost first, each with its entry flag) into
/// `native`. Python frames left when no evaluation frame remains (native
/// unwinding stopped early) go before the native stack's end marker.
pub fn merge<F: Borrow<Frame>>(
    native: Vec<Frame>,
    python: &[(F, bool)],
    truncated: bool,
) -> Vec<Frame> {
    let mut groups = Vec::new();
    let mut group = Vec::new();
    for (frame, entry) in python {
        group.push(frame.borrow().clone());
        if *entry {
            groups.push(std::mem::take(&mut group));
        }
    }
    if !group.is_empty() {
        groups.push(group);
    }
    if truncated && let Some(last) = groups.last_mut() {
        last.push(Frame {
            function: Some(super::TRUNCATED_FRAME.to_owned()),
            language: Language::Python,
            ..Frame::default()
        });
    }
    let mut groups = groups.into_iter();
    let mut merged = Vec::with_capacity(native.len() + python.len());
    let mut end_markers = Vec::new();
    for frame in native {
        if frame.function.as_deref() == Some(EVAL_FUNCTION)
            && let Some(group) = groups.next()
        {
            merged.extend(group);
        } else if is_end_marker(&frame) {
            end_markers.push(frame);
        } else {
            merged.push(frame);
        }
    }
    merged.extend(groups.flatten());
    merged.extend(end_markers);
    merged
}

/// `[unwinding stopped: ...]`, `[truncated: ...]`.
fn is_end_marker(frame: &Frame) -> bool {
    frame.address == 0
        && frame.language == Language::Native
        && frame
            .function
            .as_deref()
            .is_some_and(|name| name.starts_with('['))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(name: &str) -> Frame {
        Frame {
            address: 0x1000,
            function: Some(name.to_owned()),
            ..Frame::default()
        }
    }

    fn python(name: &str, entry: bool) -> (Frame, bool) {
        (
            Frame {
                function: Some(name.to_owned()),
                language: Language::Python,
                ..Frame::default()
            },
            entry,
        )
    }

    fn names(frames: &[Frame]) -> Vec<&str> {
        frames
            .iter()
            .map(|frame| frame.function.as_deref().unwrap_or("?"))
            .collect()
    }

    #[test]
    fn each_evaluation_frame_becomes_the_python_frames_it_ran() {
        let stack = vec![
            native("PyDataMem_UserNEW"),
            native("array_new"),
            native(EVAL_FUNCTION),
            native("PyObject_Call"),
            native("callback_trampoline"),
            native(EVAL_FUNCTION),
            native("PyEval_EvalCode"),
            native("main"),
        ];
        let python = [
            python("leak", false),
            python("caller", true),
            python("on_event", false),
            python("<module>", true),
        ];
        assert_eq!(
            names(&merge(stack, &python, false)),
            [
                "PyDataMem_UserNEW",
                "array_new",
                "leak",
                "caller",
                "PyObject_Call",
                "callback_trampoline",
                "on_event",
                "<module>",
                "PyEval_EvalCode",
                "main"
            ]
        );
    }

    #[test]
    fn python_frames_left_over_go_before_the_end_marker() {
        let marker = Frame {
            function: Some("[unwinding stopped: x]".to_owned()),
            ..Frame::default()
        };
        let stack = vec![native("array_new"), marker];
        let python = [python("leak", false), python("<module>", true)];
        assert_eq!(
            names(&merge(stack, &python, true)),
            [
                "array_new",
                "leak",
                "<module>",
                super::super::TRUNCATED_FRAME,
                "[unwinding stopped: x]"
            ]
        );
    }
}
