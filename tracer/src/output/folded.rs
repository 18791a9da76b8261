//! The report as folded stacks: one `outer;...;inner value` line per stack,
//! the input of flamegraph.pl, inferno and speedscope.
//!
//! A report that holds more than one memory kind starts each line with the
//! kind's name as a root frame, so kinds stay apart in the flame graph
//! instead of being summed.

use std::collections::BTreeSet;

use super::{Report, StackReport};
use crate::{config::FoldedValue, model::Frame};

/// One line per stack whose value is above zero, in the report's order.
pub fn render(report: &Report, value: FoldedValue) -> String {
    lines(report, value).map(|line| line + "\n").collect()
}

/// The folded lines, without line ends.
pub fn lines(report: &Report, value: FoldedValue) -> impl Iterator<Item = String> + '_ {
    let kinds: BTreeSet<&str> = report.stacks.iter().map(|s| s.kind.as_str()).collect();
    let kind_root = kinds.len() > 1;
    report.stacks.iter().filter_map(move |stack| {
        let count = value_of(stack, value);
        if count <= 0 {
            return None;
        }
        let mut names: Vec<String> = Vec::with_capacity(stack.frames.len() + 1);
        if kind_root {
            names.push(stack.kind.as_str().to_owned());
        }
        names.extend(stack.frames.iter().rev().map(frame_name));
        if names.is_empty() {
            names.push("[unknown stack]".to_owned());
        }
        Some(format!("{} {count}", names.join(";")))
    })
}

fn value_of(stack: &StackReport, value: FoldedValue) -> i64 {
    match value {
        FoldedValue::LiveBytes => stack.live_bytes,
        FoldedValue::LiveAllocs => stack.live_allocs,
        FoldedValue::AllocBytes => i64::try_from(stack.alloc_bytes_total).unwrap_or(i64::MAX),
        FoldedValue::Growth => stack.growth_bytes_per_s.round() as i64,
    }
}

/// The function's name, or `module+0xoffset` when it is unknown (see
/// `model::module_offset`). The format's separators (`;`, and newlines)
/// never appear inside a name.
pub fn frame_name(frame: &Frame) -> String {
    let name = match &frame.function {
        Some(function) => function.clone(),
        None => crate::model::module_offset(frame),
    };
    name.replace([';', '\n', '\r'], ":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;
    use crate::report::fixtures::sample_report;

    #[test]
    fn outermost_first_with_the_chosen_value() {
        let report = sample_report(10);
        let text = render(&report, FoldedValue::LiveBytes);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], format!("main;grow_1 {}", 4 * 65536));
        assert_eq!(lines.len(), 3);
        let growth = render(&report, FoldedValue::Growth);
        assert_eq!(growth.lines().next(), Some("main;grow_1 65536"));
        let allocs = render(&report, FoldedValue::LiveAllocs);
        assert_eq!(allocs.lines().next(), Some("main;grow_1 4096"));
        let alloc_bytes = render(&report, FoldedValue::AllocBytes);
        assert_eq!(alloc_bytes.lines().next(), Some("main;grow_1 524288"));
    }

    #[test]
    fn kinds_become_roots_only_when_mixed() {
        let mut report = sample_report(10);
        report.stacks[1].kind = Kind::GpuDevice;
        let text = render(&report, FoldedValue::LiveBytes);
        assert!(text.starts_with("heap;main;grow_1 "), "{text}");
        assert!(text.contains("\ngpu-device;main;grow_1 8192\n"), "{text}");
    }

    #[test]
    fn names_never_carry_separators() {
        let frame = Frame {
            address: 0xbeef,
            function: Some("f<a;b>".to_owned()),
            ..Frame::default()
        };
        assert_eq!(frame_name(&frame), "f<a:b>");
        let unknown = Frame {
            address: 0xbeef,
            module: Some("/usr/lib/libx.so".to_owned()),
            offset: Some(0x1beef),
            ..Frame::default()
        };
        assert_eq!(frame_name(&unknown), "libx.so+0x1beef");
        assert_eq!(frame_name(&Frame::default()), "0x0");
    }
}
