//! The kernel's stack table holds what is live, not every stack ever
//! seen: a program that makes more distinct short-lived stacks than the
//! table holds (`--max-stacks`, default 2^17) loses none of them, its
//! leaks stay exact, and tracer's own stacks stay bounded by the table too
//! (collect::stack_table has the eviction protocol).
//! tests/fixtures/stack_tree.c walks its paths one by one: `churn` frees
//! each block at once, `keep` keeps them, `leak` grows three leak sites.

use crate::harness;

use std::time::{Duration, Instant};

use harness::{Fixture, Live, Record, Trace, Traced, field};

/// `--max-stacks` at its default.
const TABLE_STACKS: i64 = 1 << 17;

/// The figures of the tracer's last `-v` "stack table:" line printed
/// after the first `seen` ones: ids held and stacks named.
fn table_line_after(trace: &Trace, seen: usize) -> Option<(i64, i64)> {
    let lines = trace.tracer.stderr_lines_with("stack table:");
    let line = lines.get(seen..)?.last()?;
    let number_before = |marker: &str| -> i64 {
        let head = &line[..line
            .find(marker)
            .unwrap_or_else(|| panic!("{marker:?} in {line}"))];
        let word = head.split_whitespace().last().expect("a number");
        word.trim_start_matches('(').parse().expect("a number")
    };
    Some((number_before(" of "), number_before(" stacks named")))
}

/// Waits until the tracer says, after what the target did so far, that
/// the table holds at most `most` ids: it evicted the stacks that hold
/// nothing (the test goes on at its pace, however loaded the machine).
fn wait_evicted_down_to(trace: &Trace, most: i64) {
    let seen = trace.tracer.stderr_lines_with("stack table:").len();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if table_line_after(trace, seen).is_some_and(|(held, _)| held <= most) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the stack table never went down to {most} ids: {:?}",
            trace.tracer.stderr_lines_with("stack table:")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_hundred_thousand_short_lived_stacks_none_lost_and_the_leaks_exact() {
    const DEPTH: u32 = 18;
    const BATCH: i64 = 25_000;
    const BATCHES: i64 = 8;
    let mut tree = Fixture::start("stack_tree", &[]);
    let trace = Record::pid(tree.pid).args(["-v"]).attach();
    let mut leaked = String::new();
    for batch in 0..BATCHES {
        let answer = tree.cmd(&format!("churn {DEPTH} {} {BATCH}", batch * BATCH));
        assert_eq!(field(&answer, "stacks"), BATCH, "{answer}");
        leaked = tree.cmd("leak");
        // Over half full, the table evicts down to half: room for the
        // next batch whatever the machine's load.
        wait_evicted_down_to(&trace, TABLE_STACKS / 2 + 4096);
    }
    // The first paths, evicted long ago, walked again: their blocks kept
    // under new ids, counted under the same stacks.
    let kept = tree.cmd(&format!("keep {DEPTH} 0 100"));
    wait_evicted_down_to(&trace, TABLE_STACKS / 2 + 4096);
    let (_, named) = table_line_after(&trace, 0).expect("a stack table line");
    let Traced { output, report } = trace.stop();
    assert_eq!(
        report.json["drops"],
        serde_json::json!({}),
        "no stack lost to the table: {output}"
    );
    let distinct = BATCH * BATCHES;
    assert!(
        report.int("/events/stacks_evicted") >= distinct - TABLE_STACKS,
        "{}",
        report.json["events"]
    );
    // tracer's own stacks are bounded by the table too: the names of the
    // stacks evicted and folded were forgotten.
    assert!(named <= TABLE_STACKS, "{named} stacks named: {output}");
    let leak_calls = BATCHES;
    for (site, key) in [
        ("leak_small", "small"),
        ("leak_medium", "medium"),
        ("leak_large", "large"),
    ] {
        assert_eq!(
            report.heap_live_with(site),
            Live {
                bytes: field(&leaked, key),
                allocs: leak_calls,
            },
            "{site}\n{report}"
        );
    }
    let kept = Live::answered(&kept, "bytes", "blocks");
    assert_eq!(report.heap_live_with("tree_leaf"), kept, "\n{report}");
    assert_eq!(
        report.total("heap"),
        Live::answered(&leaked, "bytes", "blocks") + kept,
        "\n{report}"
    );
}
