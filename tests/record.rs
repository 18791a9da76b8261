//! `tracer record` against tests/fixtures/leaky, whose live bytes per
//! function are known exactly: every figure in the report must match them.

use crate::harness;

use std::ffi::OsStr;

use harness::{
    Allocated, CHURN_ALLOCS_PER_ROUND, CHURN_KEEP_BYTES, Fixture, LEAK_SIZE_BYTES, Live,
    PREALLOC_COUNT, PREALLOC_SIZE_BYTES, Record, Report, THREAD_LEAK_SIZE_BYTES, Traced,
    churn_held, field, fixture, json_path, record_while, stack_allocated, stack_int,
    stdout_pipe_buffer, thread_dtvs,
};

/// The one heap stack of `function`: what it allocated over the run.
fn allocated_in(report: &Report, function: &str) -> Allocated {
    let stacks = report.heap_stacks_with(function);
    assert_eq!(stacks.len(), 1, "one heap stack in {function}:\n{report}");
    stack_allocated(stacks[0])
}

#[test]
fn leak_exact() {
    let session = record_while("leaky", &["leak 50"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "bytes"), 50 * LEAK_SIZE_BYTES);

    let top = report.stacks().first().expect("the report has no stacks");
    assert!(
        harness::frames_contain(top, "leak_here"),
        "leak_here is not the top stack:\n{report}"
    );
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live::blocks(50, LEAK_SIZE_BYTES),
        "\n{report}"
    );
    assert_eq!(
        allocated_in(report, "leak_here"),
        Allocated {
            bytes: 50 * LEAK_SIZE_BYTES,
            count: 50
        }
    );
    // Nothing else was allocated after attach.
    assert_eq!(
        report.total("heap"),
        Live::blocks(50, LEAK_SIZE_BYTES),
        "\n{report}"
    );
    assert_eq!(report.int("/events/allocs"), 50, "{}", report.json);
    assert!(
        session.output.stdout.contains("leak_here"),
        "the text report does not name leak_here: {}",
        session.output
    );
    for function in ["malloc", "free"] {
        let probe = report
            .json
            .get("probes")
            .and_then(serde_json::Value::as_array)
            .and_then(|probes| probes.iter().find(|probe| probe["symbol"] == function))
            .unwrap_or_else(|| panic!("no {function} probe in the report:\n{}", report.json));
        assert_eq!(probe["single_stepped"], false, "{probe}");
        assert!(
            probe["reason"]
                .as_str()
                .is_some_and(|reason| !reason.is_empty()),
            "{probe}"
        );
    }
}

#[test]
fn churn_exact() {
    let session = record_while("leaky", &["churn 20"]);
    let report = &session.report;
    let answer = &session.answers[0];

    assert_eq!(
        report.int("/events/allocs"),
        20 * CHURN_ALLOCS_PER_ROUND,
        "every allocator call counted once:\n{}",
        report.json
    );
    assert_eq!(
        report.heap_live_with("churn_keep"),
        Live {
            bytes: field(answer, "churn_keep"),
            allocs: 20
        },
        "\n{report}"
    );
    assert_eq!(
        allocated_in(report, "churn_keep"),
        Allocated {
            bytes: 20 * CHURN_KEEP_BYTES,
            count: 20
        }
    );
    // Match `churn_memalign` exactly: `churn_memalign_legacy` contains it.
    let memalign_bytes: i64 = report
        .heap_stacks_with("churn_memalign")
        .into_iter()
        .filter(|stack| !harness::frames_contain(stack, "churn_memalign_legacy"))
        .map(|stack| stack_int(stack, "live_bytes"))
        .sum();
    assert_eq!(
        memalign_bytes,
        field(answer, "churn_memalign"),
        "\n{report}"
    );

    harness::assert_churn_frees_everything(report);
    // Freed to zero, not gone negative (the report lists neither).
    assert_eq!(report.total("heap"), churn_held(answer), "\n{report}");
}

#[test]
fn threads_exact() {
    let session = record_while("leaky", &["threads 4 500"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "count"), 2000);
    assert_eq!(
        report.heap_live_with("thread_leak"),
        Live::blocks(4 * 500, THREAD_LEAK_SIZE_BYTES),
        "\n{report}"
    );
    assert_eq!(
        allocated_in(report, "thread_leak"),
        Allocated {
            bytes: 4 * 500 * THREAD_LEAK_SIZE_BYTES,
            count: 2000
        }
    );
    let dtvs = thread_dtvs(report, 4);
    assert_eq!(
        report.total("heap"),
        Live::blocks(4 * 500, THREAD_LEAK_SIZE_BYTES) + dtvs,
        "\n{report}"
    );
}

#[test]
fn realloc_chain() {
    let session = record_while("leaky", &["realloc_chain"]);
    let report = &session.report;
    let final_bytes = field(&session.answers[0], "final_bytes");
    assert_eq!(
        report.heap_live_with("grow_buffer"),
        Live {
            bytes: final_bytes,
            allocs: 1
        },
        "only grow_buffer's last block is live:\n{report}"
    );
    assert_eq!(
        report.heap_live_with("realloc_edge"),
        Live::default(),
        "realloc(p, 0) frees p:\n{report}"
    );
    assert_eq!(
        report.total("heap"),
        Live {
            bytes: final_bytes,
            allocs: 1
        },
        "\n{report}"
    );
}

#[test]
fn frees_before_attach_are_ignored() {
    let session = record_while("leaky", &["free_pre"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "count"), PREALLOC_COUNT);
    assert_eq!(
        report.int("/events/frees_unknown"),
        PREALLOC_COUNT,
        "frees of blocks allocated before attach are not counted as unknown:\n{}",
        report.json
    );
    assert_eq!(report.int("/events/allocs"), 0, "{}", report.json);
    // Ignored, not subtracted from some stack.
    assert!(report.stacks().is_empty(), "\n{report}");
    assert_eq!(report.total("heap"), Live::default(), "{}", report.json);
}

#[test]
fn spawn_mode_exact() {
    let Traced { report, .. } =
        Record::command(&fixture("leaky"), &["--auto-count", "30", "--then-exit"])
            .start()
            .wait_exit();
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live::blocks(30, LEAK_SIZE_BYTES),
        "\n{report}"
    );
    let prealloc = Live::blocks(PREALLOC_COUNT, PREALLOC_SIZE_BYTES);
    assert_eq!(
        report.heap_live_with("prealloc_blocks"),
        prealloc,
        "\n{report}"
    );
    // Traced from its start, so stdout's buffer (glibc allocates it on the
    // first printf) is live too.
    let stdout_buffer = stdout_pipe_buffer();
    assert_eq!(
        report.heap_live_with("_IO_file_doallocate"),
        stdout_buffer,
        "\n{report}"
    );
    assert_eq!(
        report.total("heap"),
        Live::blocks(30, LEAK_SIZE_BYTES) + prealloc + stdout_buffer,
        "\n{report}"
    );
    assert!(
        report
            .json
            .pointer("/targets/0/exited_after_s")
            .is_some_and(serde_json::Value::is_number),
        "the target's exit is not in the report:\n{}",
        report.json
    );
}

/// A static executable carries malloc itself: the tracer must find it there.
#[test]
fn static_binary_leak_exact() {
    let session = record_while("leaky_static", &["leak 50"]);
    let report = &session.report;
    let leak = Live::blocks(50, LEAK_SIZE_BYTES);
    assert_eq!(report.heap_live_with("leak_here"), leak, "\n{report}");
    assert_eq!(report.total("heap"), leak, "\n{report}");
}

/// Leaks made after a `--pid` attach add up across commands, while the
/// fixture runs on.
#[test]
fn leaks_accumulate_across_commands() {
    let mut leaky = Fixture::start("leaky", &[]);
    let recording = json_path("accumulate").with_extension("tracer");
    let mut trace = Record::pid(leaky.pid)
        .args([OsStr::new("-o"), recording.as_os_str()])
        .attach();
    let mut churn = String::new();
    for _ in 0..3 {
        leaky.cmd("leak 40");
        churn = leaky.cmd("churn 5");
        // Each round in a snapshot of its own: the report is the last
        // one's counters, not the first's nor their sum.
        trace.wait_next_snapshot(&recording);
    }
    let Traced { report, .. } = trace.stop();
    let _ = std::fs::remove_file(&recording);
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live::blocks(120, LEAK_SIZE_BYTES),
        "\n{report}"
    );
    // churn's answer counts what all three rounds hold.
    let held = churn_held(&churn);
    assert_eq!(
        report.total("heap"),
        Live::blocks(120, LEAK_SIZE_BYTES) + held,
        "\n{report}"
    );
}

/// The check every traced report passes: a stack that went negative is
/// not listed, and must still show in the totals.
#[test]
#[should_panic(expected = "not the sum of the listed and unlisted stacks")]
fn a_stack_gone_negative_is_caught_by_the_totals() {
    let report = Report {
        json: serde_json::json!({
            "targets": [{"pid": 7, "totals": {"heap": {"live_bytes": 900, "live_allocs": 2}}}],
            "totals": {"heap": {"live_bytes": 900, "live_allocs": 2}},
            "stacks": [{"pid": 7, "kind": "heap", "live_bytes": 1000, "live_allocs": 3}],
        }),
    };
    report.assert_totals_are_the_listed_stacks(0);
}

/// A list cut by `--top` is checked too: the stacks it leaves out are
/// summed in `unlisted`, and a report that lost one is caught.
#[test]
#[should_panic(expected = "not the sum of the listed and unlisted stacks")]
fn a_cut_list_that_lost_a_stack_is_caught_by_the_totals() {
    let stack = |live_bytes| serde_json::json!({"pid": 7, "kind": "heap", "live_bytes": live_bytes, "live_allocs": 1});
    let totals = serde_json::json!({"heap": {"live_bytes": 600, "live_allocs": 3}});
    let mut report = Report {
        json: serde_json::json!({
            "targets": [{"pid": 7, "totals": totals}],
            "totals": totals,
            "stacks": [stack(300)],
            "unlisted": [{"pid": 7, "kind": "heap", "stacks": 2, "live_bytes": 300, "live_allocs": 2}],
        }),
    };
    report.assert_totals_are_the_listed_stacks(1);
    report.json["unlisted"][0]["live_bytes"] = 200.into();
    report.assert_totals_are_the_listed_stacks(1);
}
