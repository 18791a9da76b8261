//! `tracer record` against tests/fixtures/mappings: mmap, munmap, mremap
//! and brk counted exactly, once, in the right kind.

use crate::harness;

use harness::{Live, field, frames_contain, record_while_tables_ready, stack_live};

const KIB: i64 = 1024;

#[test]
fn anonymous_mappings_exact_with_partial_unmaps_and_churn() {
    let session = record_while_tables_ready("mappings", &["anon 12", "partial 7", "churn 20"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "bytes"), 12 * 256 * KIB);
    assert_eq!(
        report.live_with("mmap-anon", "leak_anon_mapping"),
        Live::blocks(12, 256 * KIB),
        "\n{report}"
    );
    assert_eq!(
        report.live_with("mmap-anon", "map_then_unmap_head"),
        Live::blocks(7, 256 * KIB),
        "\n{report}"
    );
    for function in [
        "churn_unmap_middle",
        "churn_unmap_head",
        "churn_unmap_tail",
        "churn_mremap",
    ] {
        assert_eq!(
            report.live_with("mmap-anon", function),
            Live::default(),
            "{function} unmaps everything it maps:\n{report}"
        );
    }
    let held = Live::blocks(19, 256 * KIB);
    assert_eq!(report.total("mmap-anon"), held, "\n{report}");
    let rss = report.int("/targets/0/memory/rss_bytes");
    let anon = report.int("/targets/0/memory/rss_anon_bytes");
    let file = report.int("/targets/0/memory/rss_file_bytes");
    assert!(
        anon > 0 && file > 0 && anon + file <= rss,
        "{}",
        report.json
    );
    let traced = report.int("/targets/0/memory/traced_bytes");
    assert_eq!(traced, held.bytes, "{}", report.json);
    assert_eq!(report.int("/targets/0/memory/gap_bytes"), rss - traced);
}

#[test]
fn malloc_mapped_blocks_count_once_as_heap() {
    let session = record_while_tables_ready("mappings", &["malloc_big 10"]);
    let report = &session.report;
    let big = Live::blocks(10, 512 * KIB);
    assert_eq!(report.heap_live_with("malloc_big_block"), big, "\n{report}");
    assert_eq!(report.total("heap"), big, "\n{report}");
    assert_eq!(
        report.total("mmap-anon"),
        Live::default(),
        "glibc's mmap inside malloc counted again:\n{report}"
    );
}

#[test]
fn raw_mmap_syscall_is_seen() {
    let session = record_while_tables_ready("mappings", &["raw 9"]);
    let report = &session.report;
    let raw = Live::blocks(9, 64 * KIB);
    assert_eq!(
        report.live_with("mmap-anon", "raw_syscall_mapping"),
        raw,
        "\n{report}"
    );
    assert_eq!(report.total("mmap-anon"), raw, "\n{report}");
}

/// brk goes through the same program as mmap (told apart by the system
/// call's number): each kind must come out right.
#[test]
fn program_break_moved_outside_malloc_is_heap_brk() {
    let session = record_while_tables_ready("mappings", &["brk 6", "raw 2"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "bytes"), 6 * 64 * KIB);
    assert_eq!(
        report.live_with("heap-brk", "grow_break").bytes,
        6 * 64 * KIB,
        "\n{report}"
    );
    assert_eq!(report.total("heap-brk").bytes, 6 * 64 * KIB, "\n{report}");
    let raw = Live::blocks(2, 64 * KIB);
    assert_eq!(report.total("mmap-anon"), raw, "\n{report}");
}

#[test]
fn file_mappings_name_their_file() {
    let session = record_while_tables_ready("mappings", &["file 5"]);
    let report = &session.report;
    let answer = &session.answers[0];
    let path = answer
        .split_whitespace()
        .find_map(|word| word.strip_prefix("path="))
        .expect("the fixture names its file");
    let stacks = report.stacks_with("mmap-file", "map_data_file");
    assert_eq!(stacks.len(), 1, "\n{report}");
    let mapped = Live::blocks(5, 64 * KIB);
    assert_eq!(stack_live(stacks[0]), mapped, "\n{report}");
    assert_eq!(report.total("mmap-file"), mapped, "\n{report}");
    assert_eq!(stacks[0]["frames"][0]["file"], path, "{}", stacks[0]);
    assert!(
        report.stacks_with("mmap-anon", "map_data_file").is_empty(),
        "\n{report}"
    );
    assert!(
        session.output.stdout.contains(path),
        "the text report does not name {path}: {}",
        session.output
    );
}

/// Thread stacks and glibc's per-thread arenas are address space, not the
/// leak: the 16 KiB-per-step mapping leak tops the report and is flagged.
#[test]
fn threads_reservations_do_not_outrank_a_small_mmap_leak() {
    let session = record_while_tables_ready("mappings", &["threads 4 25 100"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "bytes"), 4 * 25 * 16 * KIB);
    let top = report.stacks().first().expect("the report has no stacks");
    assert!(
        frames_contain(top, "thread_mapping_leak") && top["kind"] == "mmap-anon",
        "the leak is not the top stack:\n{report}"
    );
    assert_eq!(
        stack_live(top),
        Live {
            bytes: 4 * 25 * 16 * KIB,
            allocs: 4 * 25
        },
        "\n{report}"
    );
    let leaks = report.json["suspected_leaks"]
        .as_array()
        .expect("suspected_leaks");
    assert!(
        leaks
            .iter()
            .any(|stack| frames_contain(stack, "thread_mapping_leak")),
        "the leak is not flagged:\n{}",
        report.json["suspected_leaks"]
    );
    // Each thread's stack and its guard page, as the fixture's threads
    // report them (each at least glibc's 16 KiB PTHREAD_STACK_MIN).
    let stack_bytes = field(&session.answers[0], "stack_bytes");
    assert!(stack_bytes >= 4 * 16 * KIB, "{}", session.answers[0]);
    assert_eq!(
        report.int("/totals/mmap-reserved/live_bytes"),
        stack_bytes,
        "four thread stacks are reserved address space:\n{}",
        report.json["totals"]
    );
}
