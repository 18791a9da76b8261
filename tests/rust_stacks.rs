//! Right stacks by default on real binaries (issue 14): a Rust release
//! build (tests/fixtures/rust_leak: lld, unwind tables, std with frame
//! pointers and the crate without), its `panic = "abort"` twin, a C
//! executable without frame pointers linking a static library with them
//! (tests/fixtures/mixed), and a stack through assembly without unwind
//! information (tests/fixtures/nocfi.c). Every fixture says what it leaked.

use crate::harness;

use harness::{
    Live, Report, assert_in_order, dwarf_pids, field, frames_contain, function_names, record_with,
    stack_live,
};
use serde_json::Value;

/// rust_leak's `leak K`: from_first calls each site K times, from_second 2K.
const RUST_LEAK_ROUNDS: i64 = 40;
const RUST_THREADS: i64 = 4;
const RUST_THREAD_ROUNDS: i64 = 30;
const TOKIO_WORKERS: i64 = 4;
const TOKIO_ROUNDS: i64 = 25;

/// The one heap stack through `function`; it must hold `holds`.
fn only_heap_stack<'a>(report: &'a Report, function: &str, holds: Live) -> &'a Value {
    let stacks = report.heap_stacks_with(function);
    assert_eq!(stacks.len(), 1, "one stack through {function}:\n{report}");
    assert_eq!(stack_live(stacks[0]), holds, "{function}:\n{report}");
    stacks[0]
}

/// The heap stacks that have a frame containing each of `functions`.
fn heap_stacks_with_all<'a>(report: &'a Report, functions: &[&str]) -> Vec<&'a Value> {
    report
        .stacks()
        .iter()
        .filter(|stack| {
            stack["kind"] == "heap"
                && functions
                    .iter()
                    .all(|function| frames_contain(stack, function))
        })
        .collect()
}

/// Fails on a stack that unwinding could not finish (and so may end in
/// junk below the frames that matter).
fn assert_not_stopped(stack: &Value, report: &Report) {
    let names = function_names(stack);
    assert!(
        !names
            .iter()
            .any(|name| name.starts_with("[unwinding stopped") || name.starts_with("[truncated")),
        "stack ends early: {names:?}\n{report}"
    );
}

/// The stack reaches the program's `main` through Rust's runtime start.
fn assert_reaches_main(stack: &Value, report: &Report) {
    let names = function_names(stack);
    let lang_start = names
        .iter()
        .position(|name| name.starts_with("std::rt::lang_start"))
        .unwrap_or_else(|| panic!("no std::rt::lang_start in {names:?}\n{report}"));
    assert!(
        names[lang_start..].iter().any(|name| name == "main"),
        "no main after std::rt::lang_start in {names:?}\n{report}"
    );
}

/// The stack reaches the start of its thread (glibc's start_thread, then
/// the clone3 system call).
fn assert_reaches_thread_start(stack: &Value, report: &Report) {
    let names = function_names(stack);
    assert!(
        names.last().is_some_and(|name| name == "clone3")
            && names.iter().any(|name| name == "start_thread"),
        "does not reach the thread's start: {names:?}\n{report}"
    );
}

/// The whole check of one rust_leak build, traced with default options.
fn rust_release_build_has_right_stacks(fixture: &str) {
    // Once every table is in: a thread's stack walked before glibc's is
    // ready stops at start_thread (a loaded machine builds it late).
    let session = harness::record_with_tables_ready(
        fixture,
        &[],
        &[
            &format!("leak {RUST_LEAK_ROUNDS}"),
            &format!("threads {RUST_THREADS} {RUST_THREAD_ROUNDS}"),
            &format!("tokio {TOKIO_WORKERS} {TOKIO_ROUNDS}"),
        ],
    );
    let report = &session.report;
    let [leaked, threads, tasks] = &session.answers[..] else {
        panic!("three answers: {:?}", session.answers);
    };
    // Every byte allocated after attach has a stack that reaches main or
    // its thread's start (tokio's and std's threads included).
    assert!(
        share_reaching_entry(report) > 0.99,
        "stack quality: {}\n{report}",
        report.json["targets"][0]["stack_quality"]
    );
    assert!(
        !session.output.stdout.contains("have stacks reaching"),
        "{}",
        session.output
    );
    assert!(
        session
            .output
            .stderr
            .contains(&format!("no frame pointers in {fixture}")),
        "auto did not unwind the Rust executable with DWARF: {}",
        session.output
    );
    assert_eq!(dwarf_pids(report).len(), 1, "{}", report.json["unwinding"]);

    let callers = [
        ("from_first", field(leaked, "first")),
        ("from_second", field(leaked, "second")),
    ];
    assert_eq!(
        callers.map(|(_, count)| count),
        [RUST_LEAK_ROUNDS, 2 * RUST_LEAK_ROUNDS]
    );
    // Each site by a frame only its own allocation has: `remember`'s
    // value comes from vec![], its map's table from hashbrown.
    let sites = [
        (&["leak_vec"][..], field(leaked, "vec_bytes")),
        (&["leak_box"][..], field(leaked, "box_bytes")),
        (&["leak_string"][..], field(leaked, "string_bytes")),
        (
            &["rust_leak::remember", "alloc::vec::from_elem"][..],
            field(leaked, "map_value_bytes"),
        ),
    ];
    let mut site_bytes = 0;
    for (site, bytes) in sites {
        for (caller, count) in callers {
            let stacks = heap_stacks_with_all(report, &[site, &[caller]].concat());
            assert_eq!(stacks.len(), 1, "{site:?} from {caller}:\n{report}");
            let stack = stacks[0];
            assert_eq!(
                stack_live(stack),
                Live {
                    bytes: bytes * count,
                    allocs: count
                },
                "{site:?} from {caller}:\n{report}"
            );
            assert_in_order(stack, &[site[0], caller, "rust_leak::main"], report);
            assert_not_stopped(stack, report);
            assert_reaches_main(stack, report);
            site_bytes += bytes * count;
        }
    }
    assert_eq!(site_bytes, field(leaked, "bytes"));

    let thread_stacks = report.heap_stacks_with("rust_leak::thread_leak");
    assert_eq!(thread_stacks.len(), 1, "\n{report}");
    assert_eq!(
        stack_live(thread_stacks[0]),
        Live {
            bytes: field(threads, "bytes"),
            allocs: RUST_THREADS * RUST_THREAD_ROUNDS
        },
        "\n{report}"
    );
    assert_in_order(
        thread_stacks[0],
        &["rust_leak::thread_leak", "rust_leak::thread_body"],
        report,
    );
    assert_not_stopped(thread_stacks[0], report);
    assert_reaches_thread_start(thread_stacks[0], report);

    // A task's first poll and its later ones run through different
    // scheduler paths: one stack each, all on worker threads.
    let task_stacks = report.heap_stacks_with("rust_leak::task_leak");
    assert_eq!(
        report.heap_live_with("rust_leak::task_leak"),
        Live {
            bytes: field(tasks, "bytes"),
            allocs: TOKIO_WORKERS * TOKIO_ROUNDS
        },
        "\n{report}"
    );
    for stack in &task_stacks {
        assert_in_order(
            stack,
            &[
                "rust_leak::task_leak",
                "rust_leak::task_body",
                "tokio::runtime::scheduler::multi_thread::worker",
            ],
            report,
        );
        assert_not_stopped(stack, report);
        assert_reaches_thread_start(stack, report);
    }

    // No stack of the whole run, the standard library's and tokio's own
    // allocations included, ends in a frame that unwinding had to give up.
    for stack in report.stacks() {
        assert_not_stopped(stack, report);
    }
    report.assert_no_drops();
}

#[test]
fn rust_release_build_leaks_are_one_stack_per_caller_reaching_main() {
    rust_release_build_has_right_stacks("rust_leak");
}

#[test]
fn rust_release_build_with_panic_abort_too() {
    rust_release_build_has_right_stacks("rust_leak_abort");
}

#[test]
fn c_executable_linking_a_frame_pointer_library_is_unwound_with_dwarf() {
    // Once every table is in: glibc's frames walked before its table is
    // ready end in the pending marker.
    let session = harness::record_with_tables_ready("mixed_fp", &[], &["leak 300"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "blocks"), 300);
    assert_eq!(
        report.json["unwinding"]["dwarf"][0]["objects_without_frame_pointers"],
        serde_json::json!(["mixed_fp"]),
        "{}",
        report.json["unwinding"]
    );
    let stacks = [only_heap_stack(
        report,
        "fp_alloc_filled",
        Live {
            bytes: field(&session.answers[0], "bytes"),
            allocs: 300,
        },
    )];
    assert_in_order(
        stacks[0],
        &[
            "fp_alloc_filled",
            "fp_keep",
            "leak_middle",
            "leak_outer",
            "main",
            "__libc_start_main",
        ],
        report,
    );
    assert_not_stopped(stacks[0], report);
}

#[test]
fn stack_walked_in_the_kernel_through_code_without_unwind_information_is_one_stack() {
    // nocfi_alloc has no unwind information and junk in rbp: the kernel's
    // walk tries its frame pointer, finds no frame there, and stops,
    // counted: both callers' blocks are one stack.
    let session = record_with("nocfi", &[], &["leak 150"]);
    let report = &session.report;
    let stacks = [only_heap_stack(
        report,
        "nocfi_alloc",
        Live {
            bytes: field(&session.answers[0], "bytes"),
            allocs: 300,
        },
    )];
    assert_eq!(function_names(stacks[0]).len(), 1, "\n{report}");
    let stopped = report.int("/events/unwind_stop_invalid_step")
        + report.int("/events/unwind_stop_read_fault");
    assert!(stopped >= 299, "{}", report.json["events"]);
    assert_eq!(report.int("/events/stack_copies"), 0);
}

#[test]
fn stack_through_code_without_unwind_information_ends_in_one_marked_stack() {
    let session = record_with("nocfi", &["--unwind", "copy"], &["leak 150"]);
    let report = &session.report;
    let answer = &session.answers[0];
    // Both callers' blocks: their frames are beyond what can be known.
    let stacks = [only_heap_stack(
        report,
        "nocfi_alloc",
        Live {
            bytes: field(answer, "bytes"),
            allocs: 300,
        },
    )];
    assert_eq!(
        function_names(stacks[0]),
        [
            "nocfi_alloc",
            "[unwinding stopped: no unwind information for the code]"
        ],
        "\n{report}"
    );
    // The broken stack holds nearly all that was allocated: the report
    // says the stacks cannot be trusted, and why.
    let share = share_reaching_entry(report);
    assert!(share < 0.9, "stack quality {share}\n{report}");
    assert!(
        session.output.stdout.contains(&format!(
            "WARNING: PID {}: only {:.0} % of allocated bytes have stacks reaching main",
            report.json["targets"][0]["pid"],
            share * 100.0
        )),
        "{}",
        session.output
    );
    assert_eq!(
        report.json["unwinding_stopped"]["no_unwind_info"], 300,
        "one stopped copy per block\n{report}"
    );
}

/// The share of the first target's allocated bytes whose stacks reach
/// main or their thread's start.
fn share_reaching_entry(report: &Report) -> f64 {
    report.json["targets"][0]["stack_quality"]["share_reaching_entry"]
        .as_f64()
        .unwrap_or_else(|| panic!("no stack quality in the report:\n{report}"))
}

/// `--unwind fp` on code without frame pointers: the walk reads junk as
/// return addresses. Each stack is cut where its addresses leave the
/// target's code and marked, so each leak site is one stack again (both
/// callers in it: the walk cannot tell them apart), and the report warns
/// that stacks are cut short.
#[test]
fn frame_pointer_walk_of_a_rust_release_build_ends_in_a_marker_not_junk() {
    let session = record_with(
        "rust_leak",
        &["--unwind", "fp"],
        &[&format!("leak {RUST_LEAK_ROUNDS}")],
    );
    let report = &session.report;
    let leaked = &session.answers[0];
    let count = field(leaked, "first") + field(leaked, "second");
    for (site, bytes) in [
        ("leak_vec", field(leaked, "vec_bytes")),
        ("leak_box", field(leaked, "box_bytes")),
        ("leak_string", field(leaked, "string_bytes")),
    ] {
        let stacks = report.heap_stacks_with(site);
        assert_eq!(stacks.len(), 1, "{site} in one stack:\n{report}");
        assert_eq!(
            stack_live(stacks[0]),
            Live {
                bytes: bytes * count,
                allocs: count
            },
            "{site}:\n{report}"
        );
        let names = function_names(stacks[0]);
        assert_eq!(
            names.last().map(String::as_str),
            Some("[unwinding stopped: return address outside the target's code]"),
            "{site}: {names:?}\n{report}"
        );
        assert!(
            names[..names.len() - 1]
                .iter()
                .all(|name| !name.starts_with("0x") && name != "?"),
            "{site}: junk frames {names:?}\n{report}"
        );
    }
    assert!(
        report.int("/unwinding_stopped/frame_pointers_outside_code") >= 3,
        "\n{report}"
    );
    assert!(share_reaching_entry(report) < 0.9, "\n{report}");
    assert!(
        session.output.stdout.starts_with("WARNING: PID "),
        "{}",
        session.output
    );
}
