//! One entry per site (issue 26, must-have 4): tests/fixtures/stack_tree
//! allocates at one line (`tree_leaf`) through 2^DEPTH call paths, each a
//! stack of its own. The text report, the SVG legend, `tracer top` and
//! `tracer report` list the site once, with the sum of its stacks and
//! their count; the JSON keeps the stacks and adds the groups;
//! `--group-by stack` lists every stack.

use crate::harness;

use std::time::Duration;

use harness::{
    ATTACH_TIMEOUT, Fixture, Record, Traced, Tracer, field, frames_contain, json_path, require_root,
};
use serde_json::Value;

const DEPTH: u32 = 3;
const PATHS: i64 = 1 << DEPTH;
const GROWS: i64 = 3;
/// Long enough for several quiet snapshots between two grows.
const PAUSE: Duration = Duration::from_millis(1500);

/// The JSON entries of `list` allocated at `tree_leaf`.
fn at_tree_leaf<'a>(report: &'a harness::Report, list: &str) -> Vec<&'a Value> {
    report.json[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list}: {}", report.json))
        .iter()
        .filter(|entry| entry["site"]["function"] == "tree_leaf")
        .collect()
}

/// Headings of the text report (`#3  ...`, `L1  ...`) naming `tree_leaf`.
fn headings(text: &str, mark: char) -> Vec<&str> {
    text.lines()
        .filter(|line| line.starts_with(mark) && line.contains("  tree_leaf (stack_tree.c:"))
        .collect()
}

#[test]
fn the_stacks_of_one_site_are_one_entry_with_their_sum_and_count() {
    let mut tree = Fixture::start("stack_tree", &[]);
    let svg = json_path("sites").with_extension("svg");
    let recording = json_path("sites").with_extension("tracer");
    let trace = Record::pid(tree.pid)
        .interval("250ms")
        .args(["--svg", svg.to_str().unwrap()])
        .args(["-o", recording.to_str().unwrap()])
        .attach();
    let mut leaked_bytes = 0;
    for _ in 0..GROWS {
        let answer = tree.cmd(&format!("grow {DEPTH}"));
        assert_eq!(field(&answer, "stacks"), PATHS, "{answer}");
        leaked_bytes += field(&answer, "bytes");
        std::thread::sleep(PAUSE);
    }
    let Traced { output, report } = trace.stop();

    // JSON: the stacks kept, and one group holding them all.
    let stacks: Vec<&Value> = report
        .heap_stacks_with("tree_leaf")
        .into_iter()
        .filter(|stack| frames_contain(stack, "main"))
        .collect();
    assert_eq!(stacks.len() as i64, PATHS, "\n{report}");
    let groups = at_tree_leaf(&report, "groups");
    assert_eq!(groups.len(), 1, "{:#}", report.json["groups"]);
    let group = groups[0];
    assert_eq!(group["stack_count"], PATHS, "{group:#}");
    assert_eq!(group["live_bytes"], leaked_bytes, "{group:#}");
    assert_eq!(group["live_allocs"], GROWS * PATHS, "{group:#}");
    // A stack may have had more than one id in the kernel (walked before
    // and after its unwind table was in, or evicted and seen again),
    // joined by its frames.
    let ids = group["stack_ids"].as_array().unwrap().len() as i64;
    assert!(ids >= PATHS, "{ids} ids for {PATHS} stacks: {group:#}");
    let leaks = at_tree_leaf(&report, "suspected_leak_groups");
    assert_eq!(leaks.len(), 1, "{output}");
    assert_eq!(leaks[0]["stack_count"], PATHS);
    assert_eq!(leaks[0]["live_bytes"], leaked_bytes);
    assert_eq!(
        leaks[0]["growth"]["steps"]["count"], GROWS,
        "{:#}",
        leaks[0]
    );

    // Text: one heading per list, with the count.
    let count = format!("  ({PATHS} stacks)");
    for mark in ['#', 'L'] {
        let lines = headings(&output.stdout, mark);
        assert_eq!(lines.len(), 1, "{mark}: {lines:?}\n{output}");
        assert!(lines[0].ends_with(&count), "{lines:?}");
    }

    // The SVG legend: the site's line, with the count in its detail.
    let legend = harness::take_svg_texts(&svg);
    let at = legend
        .iter()
        .position(|text| text.starts_with("L1 ") && text.contains(" tree_leaf (stack_tree.c:"))
        .unwrap_or_else(|| panic!("no L1 tree_leaf in the legend: {legend:?}"));
    assert!(
        legend[at + 1].starts_with(&format!("{PATHS} stacks, ")),
        "{legend:?}"
    );

    // `tracer report` of the recording: the site once, or every stack.
    let report_text = |extra: &[&str]| {
        let mut args = vec!["report", recording.to_str().unwrap()];
        args.extend_from_slice(extra);
        let output = Tracer::start(args).wait_exit(Duration::from_secs(30));
        output.assert_success();
        output.stdout
    };
    assert_eq!(headings(&report_text(&[]), '#').len(), 1);
    let by_stack = report_text(&["--group-by", "stack"]);
    assert_eq!(headings(&by_stack, '#').len() as i64, PATHS, "{by_stack}");
    assert!(!by_stack.contains(&count), "{by_stack}");
    let _ = std::fs::remove_file(&recording);
}

/// The rows of `tracer top`'s last table that name `tree_leaf`.
fn top_rows(group_by: &str) -> Vec<String> {
    require_root();
    let mut tree = Fixture::start("stack_tree", &[]);
    let pid = tree.pid.to_string();
    let mut tracer = Tracer::start([
        "top",
        "--pid",
        &pid,
        "--interval",
        "250ms",
        "--duration",
        "3s",
        "--group-by",
        group_by,
    ]);
    tracer.wait_attached(ATTACH_TIMEOUT);
    tree.cmd(&format!("grow {DEPTH}"));
    let output = tracer.wait_exit(Duration::from_secs(30));
    output.assert_success();
    let last_table = output.last_top_table();
    last_table
        .lines()
        .filter(|line| line.contains("tree_leaf (stack_tree.c:"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn top_shows_one_row_per_site_or_per_stack() {
    let rows = top_rows("site");
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert!(
        rows[0].ends_with(&format!("  ({PATHS} stacks)")),
        "{rows:?}"
    );
    assert!(
        rows[0].contains(&format!(" {PATHS}  ")),
        "the site's {PATHS} blocks: {rows:?}"
    );
    assert_eq!(top_rows("stack").len() as i64, PATHS);
}
