//! How stacks are named and merged, on the wrappers fixture: a stack is
//! named by its first frame past the allocator and the allocation wrappers
//! (built-in ones and `--wrapper`), in the text headings and the JSON
//! `site`; and stacks with the same frames (a copied stack and the
//! frame-pointer walk a full copy ring fell back to) are one stack with the
//! exact total.

use crate::harness;

use harness::{Fixture, Record, Report, Traced, field, stack_int};
use serde_json::Value;

/// The heap stacks whose site is `function`.
fn stacks_named<'a>(report: &'a Report, function: &str) -> Vec<&'a Value> {
    report
        .stacks()
        .iter()
        .filter(|stack| stack["kind"] == "heap" && stack["site"]["function"] == function)
        .collect()
}

/// The one heap stack named `function`, checked to hold `bytes`.
fn only_stack_named<'a>(traced: &'a Traced, function: &str, bytes: i64) -> &'a Value {
    let stacks = stacks_named(&traced.report, function);
    assert_eq!(
        stacks.len(),
        1,
        "one stack named {function}:\n{}\n{}",
        traced.report,
        traced.output
    );
    assert_eq!(
        stack_int(stacks[0], "live_bytes"),
        bytes,
        "{function}: {}",
        stacks[0]
    );
    stacks[0]
}

fn trace_leaks(wrapper_args: &[&str]) -> (Traced, String) {
    let mut fixture = Fixture::start("wrappers", &[]);
    // No periodic snapshot in the test's time: the report is the final
    // one, taken at SIGINT after the fixture answered.
    let trace = Record::pid(fixture.pid)
        .interval("60s")
        .args(wrapper_args)
        .attach();
    let answer = fixture.cmd("leak 40");
    (trace.stop(), answer)
}

#[test]
fn labels_name_the_callers_past_the_wrappers() {
    let (traced, answer) = trace_leaks(&["--wrapper", "my_xmalloc.*"]);
    let header = only_stack_named(&traced, "read_header", field(&answer, "header_bytes"));
    assert_eq!(header["site"]["via"], "xmalloc", "built in: {header}");
    for (caller, key) in [
        ("load_config", "config_bytes"),
        ("parse_record", "record_bytes"),
    ] {
        let stack = only_stack_named(&traced, caller, field(&answer, key));
        let site = &stack["site"];
        assert_eq!(site["via"], "my_xmalloc", "{site}");
        let label = site["label"].as_str().expect("a label");
        assert!(
            label.starts_with(&format!("{caller} (wrappers.c:"))
                && label.ends_with(" via my_xmalloc"),
            "{label}"
        );
        // The stack keeps every frame; only its name skips the wrappers.
        let functions: Vec<&str> = stack["frames"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|frame| frame["function"].as_str())
            .collect();
        assert_eq!(functions[..3], ["my_xmalloc_impl", "my_xmalloc", caller]);
        assert!(
            traced
                .output
                .stdout
                .lines()
                .any(|line| line.starts_with('#') && line.ends_with(label)),
            "a text heading names {caller}:\n{}",
            traced.output
        );
    }
}

#[test]
fn without_wrapper_the_programs_own_wrapper_names_its_stacks() {
    let (traced, answer) = trace_leaks(&[]);
    only_stack_named(&traced, "read_header", field(&answer, "header_bytes"));
    let inner: Vec<&Value> = stacks_named(&traced.report, "my_xmalloc_impl");
    assert_eq!(inner.len(), 2, "{}", traced.report);
    let live: i64 = inner
        .iter()
        .map(|stack| stack_int(stack, "live_bytes"))
        .sum();
    assert_eq!(
        live,
        field(&answer, "config_bytes") + field(&answer, "record_bytes")
    );
    assert!(stacks_named(&traced.report, "load_config").is_empty());
}

#[test]
fn copies_that_fell_back_to_frame_pointers_merge_into_their_site() {
    let mut fixture = Fixture::start("wrappers", &[]);
    // A 1 MiB ring of 16 KiB copies fills within one drain at this rate:
    // many copies fall back to a frame-pointer walk of the same stack.
    let trace = Record::pid(fixture.pid)
        .interval("60s")
        .args([
            "--unwind",
            "copy",
            "--stack-ring-mib",
            "1",
            "--wrapper",
            "my_xmalloc.*",
        ])
        .attach();
    // The answer comes after the last allocation: the copies that
    // filled the ring are drained at SIGINT, in the only snapshot after
    // attach.
    let answer = fixture.cmd("burst 60000");
    let traced = trace.stop();
    let fell_back = traced
        .report
        .int_if_present("/drops/stack_copy_ring_full")
        .unwrap_or(0);
    assert!(fell_back > 0, "no copy fell back: {}", traced.output);
    let mut merged = 0;
    for (function, key) in [("burst_a", "a_bytes"), ("burst_b", "b_bytes")] {
        let stack = only_stack_named(&traced, function, field(&answer, key));
        merged += stack["merged_stack_ids"].as_array().map_or(0, Vec::len);
    }
    assert!(merged > 0, "nothing was merged:\n{}", traced.report);
}
