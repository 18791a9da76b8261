//! Attaching and detaching: the probes of one program in one file go in
//! one uprobe_multi link, so tracer starts and stops promptly however many
//! functions it hooks.

use crate::harness;

use std::time::{Duration, Instant};

use harness::{
    Fixture, Report, TracerOutput, assert_took_under, json_path, record_attached, require_root,
};

/// What the benchmark measures apart (goal 0.5 s): here only a generous
/// bound, for a loaded CI machine (1.16 s was seen beside a busy process),
/// that still catches perf-event uprobes (8 s for 74 probes).
const EXIT_BOUND: Duration = Duration::from_secs(4);

/// The mapping tracepoints every session has: enter and exit of mmap,
/// munmap, mremap, brk and mprotect, and sched_process_exit (a target's
/// end drops its PID from their filters).
const MAPPING_TRACEPOINTS: usize = 11;

/// The number in tracer's "attached N probes" line.
fn probes_attached(stderr: &str) -> usize {
    stderr
        .lines()
        .find_map(|line| line.strip_prefix("tracer: attached "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no 'attached N probes' line in:\n{stderr}"))
}

/// The figures of "tracer: attached N probes" and "uprobes attached in L
/// uprobe_multi links" (`-v`).
fn links_attached(output: &TracerOutput) -> usize {
    output
        .stderr
        .lines()
        .find_map(|line| line.strip_prefix("tracer: uprobes attached in "))
        .and_then(|rest| rest.strip_suffix(" uprobe_multi links"))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("not attached with uprobe_multi links: {output}"))
}

/// Attaches to `pids` with `-v`, stops at once; (probes, links) and the
/// outputs of the run, and the time from SIGINT to exit.
fn attach_to(pids: &[u32]) -> (usize, usize, TracerOutput, Report, Duration) {
    let json = json_path("attach-exit");
    let others: Vec<String> = pids[1..]
        .iter()
        .flat_map(|pid| ["--pid".to_owned(), pid.to_string()])
        .collect();
    let mut args: Vec<&str> = others.iter().map(String::as_str).collect();
    args.push("-v");
    let tracer = record_attached(pids[0], &json, &args);
    let asked_at = Instant::now();
    let output = tracer.stop();
    let took = asked_at.elapsed();
    output.assert_success();
    let report = Report::read_checked(&json);
    (
        probes_attached(&output.stderr),
        links_attached(&output),
        output,
        report,
        took,
    )
}

#[test]
fn exits_promptly_after_sigint_with_50_probes_in_place() {
    require_root();
    // glibc in three processes (libstdc++'s operators only pass on what
    // glibc's functions return, so they get none): 58 probes.
    let fixtures = [
        Fixture::start("kernel_cache", &[]),
        Fixture::start("kernel_cache", &[]),
        Fixture::start("kernel_cache", &[]),
    ];
    let pids = fixtures.each_ref().map(|fixture| fixture.pid);
    // The same program three times: each process adds the same probes
    // and links as the first, no more (a probe or link made twice, or
    // one shared, shows here); what one process alone has beyond that is
    // the mapping tracepoints, shared by all.
    let (one_probes, one_links, ..) = attach_to(&pids[..1]);
    let (two_probes, two_links, ..) = attach_to(&pids[..2]);
    let (probes, links, output, report, took) = attach_to(&pids);
    let per_process = two_probes - one_probes;
    assert_eq!(
        (probes, links, two_links),
        (one_probes + 2 * per_process, 3 * one_links, 2 * one_links),
        "probes and links of 3 processes are not 3 times one's \
         ({one_probes} probes and {one_links} links for one, {two_probes} for two): {output}"
    );
    assert!(
        per_process > 0 && per_process < one_probes,
        "{per_process} probes per process, {one_probes} for one: {output}"
    );
    // Each process: every hooked function's entry probe, a return probe on
    // each but free and the C++ unwinder's entry points (libgcc_s's
    // `_Unwind_*`, probed so that an exception through a return-probed
    // frame can be repaired), and the loader gate (`_dl_debug_state`, which holds a
    // dlopen until its library is hooked); once for all: the 11 mapping
    // tracepoints (MAPPING_TRACEPOINTS).
    let hooked = report.json["probes"].as_array().expect("probes");
    let per_pid = |pid: u32| {
        let functions = hooked
            .iter()
            .filter(|probe| probe["pid"].as_u64() == Some(u64::from(pid)));
        let probes: usize = functions
            .map(|probe| {
                let symbol = probe["symbol"].as_str().unwrap_or_default();
                if symbol == "free" || symbol.starts_with("_Unwind_") {
                    1
                } else {
                    2
                }
            })
            .sum();
        probes + 1
    };
    let expected: usize = pids.iter().map(|&pid| per_pid(pid)).sum::<usize>() + MAPPING_TRACEPOINTS;
    assert_eq!(
        (probes, per_process),
        (expected, per_pid(pids[0])),
        "probes of 3 processes, and per process: {output}"
    );
    assert!(probes >= 50, "only {probes} probes: {output}");
    // One link per program, file and process, each holding every probe
    // of that program there: glibc's malloc_enter covers malloc and
    // valloc.
    assert!(
        links > 0 && links < probes,
        "{links} links for {probes} probes: {output}"
    );
    assert_took_under(
        &format!("exiting after SIGINT with {probes} probes"),
        took,
        EXIT_BOUND,
        &output,
    );
    let targets = report.json["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 3, "{report}");
}
