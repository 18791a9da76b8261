//! Attaching and detaching: the probes of one program in one file go in
//! one uprobe_multi link, so tracer starts and stops promptly however many
//! functions it hooks.

#[allow(dead_code, reason = "other test files use the rest of the harness")]
mod harness;

use std::time::{Duration, Instant};

use harness::{Fixture, Report, json_path, record_attached, require_root};

/// What the benchmark measures apart: here only a loose bound, for a
/// loaded CI machine (perf-event uprobes took 8 s for 74 probes).
const EXIT_BOUND: Duration = Duration::from_secs(1);

/// The number in tracer's "attached N probes" line.
fn probes_attached(stderr: &str) -> usize {
    stderr
        .lines()
        .find_map(|line| line.strip_prefix("tracer: attached "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no 'attached N probes' line in:\n{stderr}"))
}

#[test]
fn exits_within_a_second_of_sigint_with_70_probes_in_place() {
    require_root();
    // glibc and libstdc++ in three processes: 102 probes.
    let first = Fixture::start("kernel_cache", &[]);
    let others = [
        Fixture::start("kernel_cache", &[]),
        Fixture::start("kernel_cache", &[]),
    ];
    let json = json_path("attach-exit");
    let [second, third] = others.each_ref().map(|fixture| fixture.pid.to_string());
    let tracer = record_attached(first.pid, &json, &["--pid", &second, "--pid", &third, "-v"]);
    let asked_at = Instant::now();
    let output = tracer.stop();
    let took = asked_at.elapsed();
    output.assert_success();
    let probes = probes_attached(&output.stderr);
    assert!(probes >= 70, "only {probes} probes: {output}");
    let links: usize = output
        .stderr
        .lines()
        .find_map(|line| line.strip_prefix("tracer: uprobes attached in "))
        .and_then(|rest| rest.strip_suffix(" uprobe_multi links"))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("not attached with uprobe_multi links: {output}"));
    // One link per program, file and process, each holding every probe
    // of that program there: glibc's malloc_enter covers malloc and
    // valloc, libstdc++'s every operator new.
    let report = Report::read_checked(&json);
    let functions = report.json["probes"].as_array().expect("probes").len();
    assert!(
        links > 0 && links < functions,
        "{links} links for {functions} functions hooked: {output}"
    );
    assert!(
        took < EXIT_BOUND,
        "tracer took {took:?} to exit after SIGINT with {probes} probes"
    );
    let targets = report.json["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 3, "{report}");
}
