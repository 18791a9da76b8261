//! `tracer record` against tests/fixtures/leaky, whose live bytes per
//! function are known exactly: every figure in the report must match them.

#[allow(dead_code, reason = "other test files use the rest of the harness")]
mod harness;

use std::ffi::OsStr;

use harness::{
    ATTACH_TIMEOUT, EXIT_TIMEOUT, Fixture, Live, Report, Tracer, field, fixture, json_path,
    record_while, require_root, stack_int,
};

/// `malloc` size in leaky.c's `leak_here`.
const LEAK_SIZE_BYTES: i64 = 1337;
/// `malloc` size in leaky.c's `thread_leak`.
const THREAD_LEAK_SIZE_BYTES: i64 = 2048;

/// Allocator calls that return a block in one `churn` round of leaky.c:
/// three in churn_realloc, one in each of the other seven functions.
const CHURN_ALLOCS_PER_ROUND: i64 = 10;

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
        Live {
            bytes: 50 * LEAK_SIZE_BYTES,
            allocs: 50
        },
        "\n{report}"
    );
    assert!(report.int("/totals/heap/live_bytes") >= 50 * LEAK_SIZE_BYTES);
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
    let keep = report.heap_live_with("churn_keep");
    assert_eq!(keep.bytes, field(answer, "churn_keep"), "\n{report}");
    assert_eq!(keep.allocs, 20, "\n{report}");
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

    for function in harness::CHURN_FREED {
        assert_eq!(
            report.heap_live_with(function),
            Live::default(),
            "{function} frees everything it allocates:\n{report}"
        );
    }
}

#[test]
fn threads_exact() {
    let session = record_while("leaky", &["threads 4 500"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "count"), 2000);
    assert_eq!(
        report.heap_live_with("thread_leak"),
        Live {
            bytes: 4 * 500 * THREAD_LEAK_SIZE_BYTES,
            allocs: 2000
        },
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
}

#[test]
fn frees_before_attach_are_ignored() {
    let session = record_while("leaky", &["free_pre"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "count"), 100);
    assert!(
        report.int("/events/frees_unknown") >= 100,
        "frees of blocks allocated before attach are not counted as unknown:\n{}",
        report.json
    );
    for stack in report.stacks() {
        assert!(
            stack_int(stack, "live_bytes") >= 0,
            "negative live bytes: {stack}"
        );
        assert!(
            stack_int(stack, "live_allocs") >= 0,
            "negative live blocks: {stack}"
        );
    }
    let heap_live_bytes = report.int_if_present("/totals/heap/live_bytes");
    assert!(heap_live_bytes.unwrap_or(0) >= 0, "{}", report.json);
}

#[test]
fn spawn_mode_exact() {
    require_root();
    let json = json_path("spawn");
    let leaky = fixture("leaky");
    let tracer = Tracer::start([
        OsStr::new("record"),
        OsStr::new("--top"),
        OsStr::new("100"),
        OsStr::new("--json"),
        json.as_os_str(),
        OsStr::new("--"),
        leaky.as_os_str(),
        OsStr::new("--auto-count"),
        OsStr::new("30"),
        OsStr::new("--then-exit"),
    ]);
    let output = tracer.wait_exit(EXIT_TIMEOUT);
    output.assert_success();
    let report = Report::read(&json);
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live {
            bytes: 30 * LEAK_SIZE_BYTES,
            allocs: 30
        },
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
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live {
            bytes: 50 * LEAK_SIZE_BYTES,
            allocs: 50
        },
        "\n{report}"
    );
}

/// Leaks made after a `--pid` attach add up across commands, while the
/// fixture runs on.
#[test]
fn leaks_accumulate_across_commands() {
    require_root();
    let mut leaky = Fixture::start("leaky", &[]);
    let json = json_path("accumulate");
    let pid = leaky.pid.to_string();
    let mut tracer = Tracer::start([
        OsStr::new("record"),
        OsStr::new("--pid"),
        OsStr::new(&pid),
        OsStr::new("--interval"),
        OsStr::new("200ms"),
        OsStr::new("--json"),
        json.as_os_str(),
    ]);
    tracer.wait_attached(ATTACH_TIMEOUT);
    for _ in 0..3 {
        leaky.cmd("leak 40");
        leaky.cmd("churn 5");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let output = tracer.stop();
    output.assert_success();
    let report = Report::read(&json);
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live {
            bytes: 120 * LEAK_SIZE_BYTES,
            allocs: 120
        },
        "\n{report}"
    );
}
