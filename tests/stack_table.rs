//! The kernel's table of frame-pointer stacks: distinct stacks never
//! collide below its capacity, however many a program has (large C++ and
//! Rust services have tens of thousands), and each keeps exact totals.
//! tests/fixtures/stack_tree.c makes 2^DEPTH distinct stacks of one block
//! each (tests/stack_eviction.rs: more distinct stacks than it holds).

use crate::harness;

use std::time::{Duration, Instant};

use harness::{
    Fixture, Live, Record, Traced, assert_took_under, field, frames_contain, stack_live,
};

/// What the tree's leaves hold, from its answer to `grow`.
fn grown(answer: &str) -> Live {
    Live::answered(answer, "bytes", "blocks")
}

/// Grows a tree of 2^`depth` distinct stacks under a tracer and checks
/// that no stack was lost and each holds its one block; returns how long
/// the tracer took to report and exit after Ctrl-C.
fn distinct_stacks_are_kept_apart(depth: u32) -> Duration {
    let mut tree = Fixture::start("stack_tree", &[]);
    let trace = Record::pid(tree.pid).top(20).attach();
    let answer = tree.cmd(&format!("grow {depth}"));
    assert_eq!(field(&answer, "stacks"), 1 << depth, "{answer}");
    let asked_at = Instant::now();
    let Traced { output, report } = trace.stop();
    let took = asked_at.elapsed();
    assert_eq!(
        report.json["drops"],
        serde_json::json!({}),
        "no stack lost to the table: {output}"
    );
    // Far from full: the report does not tell the user to raise it (its
    // one warning may be what tracing this allocation storm costs).
    let warnings = output
        .stdout
        .lines()
        .filter(|line| line.contains("WARNING") && !line.contains("tracer costs"));
    assert!(
        !output.stdout.contains("raise --max-stacks") && warnings.count() == 0,
        "{output}"
    );
    assert_eq!(report.total("heap"), grown(&answer), "\n{report}");
    let stacks = report.heap_stacks_with("tree_leaf");
    assert_eq!(stacks.len(), 20, "\n{report}");
    for stack in stacks {
        // Its own stack: one leaf, one block, the whole path to main.
        assert_eq!(
            stack_live(stack),
            Live {
                bytes: grown(&answer).bytes >> depth,
                allocs: 1
            },
            "\n{report}"
        );
        assert!(frames_contain(stack, "main"), "\n{report}");
    }
    took
}

#[test]
fn sixteen_thousand_distinct_stacks() {
    distinct_stacks_are_kept_apart(14);
}

/// A generous bound for a loaded CI machine (both cores busy beside it):
/// 1.2-1.4 s measured alone on a 2-vCPU VM (the goal is 2 s, measured by
/// the bench); reading or symbolizing every stack one by one takes
/// several times more.
const EXIT_BOUND: Duration = Duration::from_secs(8);

#[test]
fn a_hundred_thousand_distinct_stacks_then_a_prompt_exit() {
    let took = distinct_stacks_are_kept_apart(17);
    assert_took_under(
        "reporting 131 072 stacks and exiting after Ctrl-C",
        took,
        EXIT_BOUND,
        &"(stack_tree grow 17)",
    );
}
