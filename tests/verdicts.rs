//! Leak verdicts on how leaks really grow, against tests/fixtures/steps:
//! a leak in steps with pauses (stopped during a pause: flagged, with the
//! step wording and the exact bytes), a cache grown in fills then cleared
//! (not flagged), and a target that frees most of what it leaked in its
//! teardown and exits while traced (flagged at its peak, and said so).

use crate::harness;

use std::time::Duration;

use harness::{Fixture, Record, Traced, field, frames_contain, json_path};
use serde_json::Value;

/// Long enough for several quiet snapshots between two steps.
const PAUSE: Duration = Duration::from_millis(1500);
const STEPS: i64 = 4;

fn leaks_with<'a>(report: &'a harness::Report, function: &str) -> Vec<&'a Value> {
    report.json["suspected_leaks"]
        .as_array()
        .unwrap_or_else(|| panic!("no suspected_leaks: {}", report.json))
        .iter()
        .filter(|stack| frames_contain(stack, function))
        .collect()
}

/// Runs `STEPS` steps with a pause after each; returns the last answer.
fn leak_in_steps(fixture: &mut Fixture) -> String {
    let mut answer = String::new();
    for _ in 0..STEPS {
        answer = fixture.cmd("step");
        std::thread::sleep(PAUSE);
    }
    answer
}

#[test]
fn steps_stopped_during_a_pause_are_a_suspected_leak() {
    let mut fixture = Fixture::start("steps", &[]);
    let trace = Record::pid(fixture.pid).interval("250ms").attach();
    let answer = leak_in_steps(&mut fixture);
    std::thread::sleep(PAUSE);
    let Traced { output, report } = trace.stop();
    let (leaked_bytes, leaked_blocks) = (
        field(&answer, "leaked_bytes"),
        field(&answer, "leaked_blocks"),
    );
    let leaks = leaks_with(&report, "leak_step");
    assert_eq!(leaks.len(), 1, "{output}");
    let leak = leaks[0];
    assert_eq!(leak["live_bytes"], leaked_bytes, "{leak:#}");
    assert_eq!(leak["live_allocs"], leaked_blocks, "{leak:#}");
    assert_eq!(leak["growth"]["shape"], "steps", "{:#}", leak["growth"]);
    assert_eq!(leak["growth"]["steps"]["count"], STEPS);
    assert_eq!(leak["growth"]["steps"]["none_freed"], true);
    let evidence = format!(
        "    rose in {STEPS} steps of ~{:.1} MiB, none freed ({leaked_blocks} of \
         {leaked_blocks} blocks since attach still live)",
        leaked_bytes as f64 / STEPS as f64 / f64::from(1 << 20)
    );
    assert!(
        output.stdout.lines().any(|line| line == evidence),
        "no {evidence:?} in:\n{output}"
    );
    assert!(
        leaks_with(&report, "step_scratch").is_empty(),
        "temporaries freed in each step are no leak:\n{output}"
    );
    assert!(
        report.json["judged_at"].is_null(),
        "{}",
        report.json["judged_at"]
    );
}

#[test]
fn a_cache_grown_in_fills_then_cleared_is_not_flagged() {
    let mut fixture = Fixture::start("steps", &[]);
    let trace = Record::pid(fixture.pid).interval("250ms").attach();
    for _ in 0..STEPS {
        assert!(fixture.cmd("fill").starts_with("filled"));
        std::thread::sleep(PAUSE);
    }
    assert_eq!(fixture.cmd("clear"), "cleared");
    std::thread::sleep(Duration::from_secs(4));
    let Traced { output, report } = trace.stop();
    assert!(leaks_with(&report, "cache_fill").is_empty(), "{output}");
    assert!(output.stdout.contains("suspected leaks: none"), "{output}");
    assert!(
        report.json["judged_at"].is_null(),
        "{}",
        report.json["judged_at"]
    );
}

#[test]
fn a_target_that_exits_after_its_teardown_is_judged_at_its_peak() {
    let mut fixture = Fixture::start("steps", &[]);
    let svg = json_path("verdict_teardown").with_extension("svg");
    let trace = Record::pid(fixture.pid)
        .interval("250ms")
        .args(["--svg", svg.to_str().unwrap()])
        .attach();
    let answer = leak_in_steps(&mut fixture);
    let leaked_bytes = field(&answer, "leaked_bytes");
    let bye = fixture.cmd("teardown");
    assert_eq!(field(&bye, "kept_bytes"), leaked_bytes);
    let Traced { output, report } = trace.wait_exit();

    let judged = &report.json["judged_at"];
    assert_eq!(judged["why"], "exited", "{output}");
    let judged_bytes = judged["live_bytes"].as_i64().unwrap();
    assert!(
        (leaked_bytes..leaked_bytes + (1 << 20)).contains(&judged_bytes),
        "the leak and a little else at the peak: {judged}\n{output}"
    );
    let end_bytes = judged["end_live_bytes"].as_i64().unwrap();
    assert!(
        ((1 << 20)..(2 << 20)).contains(&end_bytes),
        "one block kept: {judged}"
    );
    let leaks = leaks_with(&report, "leak_step");
    assert_eq!(leaks.len(), 1, "{output}");
    let leak = leaks[0];
    assert_eq!(leak["ranked_live_bytes"], leaked_bytes, "{leak:#}");
    assert_eq!(leak["peak_live_bytes"], leaked_bytes, "{leak:#}");
    assert_eq!(
        leak["live_bytes"],
        1 << 20,
        "the end state is kept: {leak:#}"
    );
    assert_eq!(leak["growth"]["shape"], "steps");
    let at_s = judged["at_s"].as_f64().unwrap();
    assert!(
        leak["peak_at_s"].as_f64().unwrap() <= at_s,
        "it reached its peak before the moment judged: {leak:#}"
    );
    let first = format!("PID {} exited after ", fixture.pid);
    let sentence = format!(
        "; ranked at its peak, {:.1} MiB live at {at_s:.1} s (",
        judged_bytes as f64 / f64::from(1 << 20)
    );
    let line = output.header_line(&first);
    assert!(line.contains(&sentence), "{line:?} lacks {sentence:?}");

    let legend = harness::take_svg_texts(&svg);
    assert!(
        legend
            .iter()
            .any(|text| text.starts_with("L1 ") && text.contains("leak_step")),
        "the stack judged at the peak is plotted: {legend:?}"
    );
}

#[test]
fn a_recording_of_a_teardown_is_judged_at_its_peak_and_at_another_moment_when_asked() {
    let mut fixture = Fixture::start("steps", &[]);
    let recording = json_path("verdict_recording").with_extension("tracer");
    let trace = Record::pid(fixture.pid)
        .interval("250ms")
        .args(["-o", recording.to_str().unwrap()])
        .attach();
    leak_in_steps(&mut fixture);
    fixture.cmd("teardown");
    let Traced { output, .. } = trace.wait_exit();
    let live_first = output.stdout.lines().next().unwrap_or_default().to_owned();
    let report = |extra: &[&str]| {
        let mut args = vec!["report", recording.to_str().unwrap()];
        args.extend_from_slice(extra);
        let output = harness::Tracer::start(args).wait_exit(Duration::from_secs(60));
        output.assert_success();
        output.stdout
    };
    let replayed = report(&[]);
    let asked = report(&["--at", "3s"]);
    let _ = std::fs::remove_file(&recording);
    assert!(
        live_first.starts_with(&format!("PID {} exited after ", fixture.pid)),
        "{output}"
    );
    assert_eq!(
        replayed.lines().next(),
        Some(live_first.as_str()),
        "{replayed}"
    );
    assert!(
        replayed.contains("rose in 4 steps of ~20.0 MiB"),
        "{replayed}"
    );
    let first = asked.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("ranked and judged at the moment asked (--at), ")
            && (first.contains(" live at 2.") || first.contains(" live at 3.0 s")),
        "{asked}"
    );
    assert!(
        !asked.contains("rose in 4 steps"),
        "two steps by 3 s: {asked}"
    );
}

/// `tracer top` ranks a target that tore down and exited at its peak, as
/// the report does: its last table says so and shows the leak as it
/// stood then, flagged.
#[test]
fn top_ranks_a_target_that_exited_at_its_peak() {
    harness::require_root();
    let mut fixture = Fixture::start("steps", &[]);
    let pid = fixture.pid.to_string();
    let mut tracer = harness::Tracer::start(["top", "--pid", &pid, "--interval", "250ms"]);
    tracer.wait_attached(harness::ATTACH_TIMEOUT);
    let answer = leak_in_steps(&mut fixture);
    let leaked_bytes = field(&answer, "leaked_bytes");
    fixture.cmd("teardown");
    let output = tracer.wait_exit(Duration::from_secs(30));
    output.assert_success();
    let last_table = output.last_top_table();
    assert!(
        last_table.contains("\nranked at the peak, "),
        "{last_table}"
    );
    let row = last_table
        .lines()
        .find(|line| line.contains("leak_step"))
        .unwrap_or_else(|| panic!("no leak_step row: {last_table}"));
    let peak = format!("{:.1} MiB", leaked_bytes as f64 / f64::from(1 << 20));
    assert!(
        row.contains(&peak) && row.contains(" yes "),
        "{row:?} lacks {peak} and yes"
    );
}
