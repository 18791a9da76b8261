//! A parsed `--json` report and the stacks in it: live bytes and blocks
//! summed by function, frames read in order, and the SVG's texts.

use std::fmt;
use std::path::Path;

use serde_json::Value;

use super::{field, sum_live};

/// Live bytes and blocks summed over some stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    pub bytes: i64,
    pub allocs: i64,
}

impl Live {
    /// `count` blocks of `size_bytes` each.
    pub fn blocks(count: i64, size_bytes: i64) -> Self {
        Self {
            bytes: count * size_bytes,
            allocs: count,
        }
    }
}

impl Live {
    /// What a fixture's answer says it holds: its `bytes_key=` bytes in
    /// `allocs_key=` blocks.
    pub fn answered(answer: &str, bytes_key: &str, allocs_key: &str) -> Self {
        Self {
            bytes: field(answer, bytes_key),
            allocs: field(answer, allocs_key),
        }
    }
}

impl std::ops::Add for Live {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            bytes: self.bytes + other.bytes,
            allocs: self.allocs + other.allocs,
        }
    }
}

/// A parsed `--json` report.
pub struct Report {
    pub json: Value,
}

impl Report {
    /// Reads and removes the report file.
    pub fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|error| panic!("could not read report {}: {error}", path.display()));
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|error| panic!("report {} is not JSON: {error}", path.display()));
        let _ = std::fs::remove_file(path);
        Self { json }
    }

    /// Reads and removes the report of a `tracer record` run started with
    /// every stack (`--top 0`, as [`record_attached`] does), and checks
    /// that its totals are its stacks.
    pub fn read_checked(path: &Path) -> Self {
        let report = Self::read(path);
        report.assert_totals_are_the_listed_stacks(0);
        report
    }

    /// The integer at a JSON pointer such as `/totals/heap/live_bytes`.
    pub fn int(&self, pointer: &str) -> i64 {
        self.json
            .pointer(pointer)
            .and_then(Value::as_i64)
            .unwrap_or_else(|| panic!("no integer at {pointer} in the report:\n{}", self.json))
    }

    /// Like [`Report::int`], but `None` where the report leaves the field
    /// out (a memory kind with no allocations has no totals).
    pub fn int_if_present(&self, pointer: &str) -> Option<i64> {
        let value = self.json.pointer(pointer)?;
        Some(value.as_i64().unwrap_or_else(|| {
            panic!(
                "{pointer} is not a sane integer in the report:\n{}",
                self.json
            )
        }))
    }

    /// No C++ unwind through a return-probed frame was let go unrepaired
    /// (`exception_restore_lost`, left out of the report when 0).
    pub fn assert_no_exception_restore_lost(&self) {
        assert_eq!(
            self.int_if_present("/drops/exception_restore_lost")
                .unwrap_or(0),
            0,
            "{}",
            self.json
        );
    }

    pub fn stacks(&self) -> &[Value] {
        self.json
            .get("stacks")
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("no `stacks` array in the report:\n{}", self.json))
    }

    /// The heap stacks with a frame whose function name contains `function`
    /// (names may carry suffixes such as `.constprop.0`).
    pub fn heap_stacks_with(&self, function: &str) -> Vec<&Value> {
        self.stacks()
            .iter()
            .filter(|stack| is_heap(stack) && frames_contain(stack, function))
            .collect()
    }

    /// Live bytes and blocks over the heap stacks containing `function`.
    pub fn heap_live_with(&self, function: &str) -> Live {
        self.live_with("heap", function)
    }

    /// The stacks of memory kind `kind` (as the report names it) with a
    /// frame whose function name contains `function`.
    pub fn stacks_with(&self, kind: &str, function: &str) -> Vec<&Value> {
        self.stacks()
            .iter()
            .filter(|stack| stack["kind"] == kind && frames_contain(stack, function))
            .collect()
    }

    /// Live bytes and blocks over the stacks of `kind` containing
    /// `function`.
    pub fn live_with(&self, kind: &str, function: &str) -> Live {
        sum_live(&self.stacks_with(kind, function))
    }
}

/// One line per stack (rank, kind, live bytes/blocks, functions) for
/// assertion messages.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for stack in self.stacks() {
            let functions: Vec<&str> = frames(stack)
                .iter()
                .map(|frame| frame.get("function").and_then(Value::as_str).unwrap_or("?"))
                .collect();
            writeln!(
                f,
                "#{} {} live_bytes={} live_allocs={} [{}]",
                stack.get("rank").unwrap_or(&Value::Null),
                stack.get("kind").unwrap_or(&Value::Null),
                stack.get("live_bytes").unwrap_or(&Value::Null),
                stack.get("live_allocs").unwrap_or(&Value::Null),
                functions.join(" < ")
            )?;
        }
        Ok(())
    }
}

fn is_heap(stack: &Value) -> bool {
    stack
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|kind| kind.eq_ignore_ascii_case("heap"))
}

fn frames(stack: &Value) -> &[Value] {
    stack
        .get("frames")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

pub fn frames_contain(stack: &Value, function: &str) -> bool {
    frames(stack).iter().any(|frame| {
        frame
            .get("function")
            .and_then(Value::as_str)
            .is_some_and(|name| name.contains(function))
    })
}

/// An integer field of a stack; a negative count shows up as a failure here
/// whether the tracer writes it signed or wrapped around as unsigned.
pub fn stack_int(stack: &Value, key: &str) -> i64 {
    stack
        .get(key)
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("stack has no sane integer `{key}`: {stack}"))
}

/// (function, file name, line, language) of each frame of a stack,
/// innermost first; `?`, an empty name and -1 where a frame has none.
pub fn frame_lines(stack: &Value) -> Vec<(String, String, i64, String)> {
    stack["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|frame| {
            let file = frame["file"].as_str().unwrap_or("");
            let name = Path::new(file)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            (
                frame["function"].as_str().unwrap_or("?").to_owned(),
                name,
                frame["line"].as_i64().unwrap_or(-1),
                frame["language"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect()
}

/// (function, file name, line) of each Python frame of a stack, innermost
/// first.
pub fn python_frames(stack: &Value) -> Vec<(String, String, i64)> {
    frame_lines(stack)
        .into_iter()
        .filter(|(_, _, _, language)| language == "python")
        .map(|(function, file, line, _)| (function, file, line))
        .collect()
}

/// The function names of a stack's frames, innermost first.
pub fn function_names(stack: &Value) -> Vec<String> {
    stack["frames"]
        .as_array()
        .map(|frames| {
            frames
                .iter()
                .map(|frame| frame["function"].as_str().unwrap_or("?").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Position of the first frame whose function contains `function`.
fn position(names: &[String], function: &str) -> Option<usize> {
    names.iter().position(|name| name.contains(function))
}

/// Asserts that `functions` appear in this order, innermost first.
pub fn assert_in_order(stack: &Value, functions: &[&str], report: &Report) {
    let names = function_names(stack);
    let positions: Vec<Option<usize>> = functions
        .iter()
        .map(|function| position(&names, function))
        .collect();
    assert!(
        positions.iter().all(Option::is_some) && positions.windows(2).all(|pair| pair[0] < pair[1]),
        "expected {functions:?} innermost first in {names:?}\n{report}"
    );
}

/// The processes whose stacks the report says were unwound with DWARF.
pub fn dwarf_pids(report: &Report) -> Vec<i64> {
    report.json["unwinding"]["dwarf"]
        .as_array()
        .unwrap_or_else(|| panic!("no unwinding.dwarf in the report:\n{}", report.json))
        .iter()
        .map(|process| process["pid"].as_i64().expect("a pid"))
        .collect()
}

/// The trimmed `<text>` contents of the SVG tracer wrote at `path` (the
/// plot's titles and legend), the file removed once read.
pub fn take_svg_texts(path: &Path) -> Vec<String> {
    let svg = std::fs::read_to_string(path).expect("the SVG was written");
    let _ = std::fs::remove_file(path);
    let document = roxmltree::Document::parse(&svg).expect("the SVG is XML");
    document
        .descendants()
        .filter(|node| node.has_tag_name("text"))
        .filter_map(|node| node.text().map(|text| text.trim().to_owned()))
        .collect()
}
