//! A real ML workload (issue 25): Debian's python3-torch 1.13 (CPU,
//! installed by `cargo xtask setup`) builds, runs and serializes
//! `torch.nn` models, and keeps each model's parameters and their numpy
//! copies alive through a registry (tests/fixtures/python/torch_models.py,
//! the pattern of iree-turbine issue 281). tracer attaches mid-run with its
//! default options, the fixture builds three more models, and tracer stops
//! while the fixture waits for its next command. One such session is
//! shared by the tests of this file; each checks one promise against the
//! fixture's printed truth.
//!
//! torch 1.13's CPU allocator asks `posix_memalign(64, numel *
//! element_size)` for each parameter's storage (c10::alloc_cpu; checked
//! with gdb on Debian's libc10.so.1.13), numpy `malloc(nbytes)` for each
//! copy: the fixture prints those sums.

use crate::harness;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use harness::{
    Live, Record, Report, TORCH_SCRIPT, assert_took_under, frame_lines, python_frames, stack_live,
    start_torch_models, sum_live, torch_script,
};
use serde_json::Value;

/// tracer's stated bound on its own peak resident memory for this
/// workload (the README's "Memory" paragraph, `tracer record --help`).
const RSS_BOUND_BYTES: u64 = 256 << 20;

/// What one session left: the fixture's answer to `build 3` and the
/// tracer's report.
struct Session {
    answer: String,
    report: Report,
}

fn marked_line(marker: &str) -> i64 {
    harness::marked_line(&torch_script(), marker)
}

/// The session every test of this file checks (run once, on first use).
fn session() -> &'static Session {
    static SESSION: OnceLock<Session> = OnceLock::new();
    SESSION.get_or_init(|| {
        // Mid-run: torch is loaded and one model is held before attach.
        let mut fixture = start_torch_models();
        let mut trace = Record::pid(fixture.pid).top(1000).args(["-v"]).attach();
        // Stacks taken before an object's unwind table is in the kernel
        // are walked by frame pointers and end in a marker (the test
        // `stacks_taken_before_their_table_was_ready_...`): the workload
        // starts once `-v` says every table is there.
        trace.wait_tables_ready();
        let answer = fixture.cmd("build 3");
        // Two snapshots after the last model (200 ms apart).
        std::thread::sleep(std::time::Duration::from_millis(500));
        let traced = trace.stop();
        Session {
            answer,
            report: traced.report,
        }
    })
}

/// VmHWM of `pid`, in bytes, while it is a running tracer (None once it
/// exited: a zombie has no memory left to show, and its PID may be reused).
fn peak_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    if status.lines().next() != Some("Name:\ttracer") {
        return None;
    }
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<u64>().ok())
        .map(|kib| kib << 10)
}

/// Reads `pid`'s VmHWM every 10 ms until it exits, on a thread: the last
/// value read is its peak through the end of the run, report included
/// (VmHWM only grows).
fn watch_peak_rss(pid: u32) -> std::thread::JoinHandle<u64> {
    let first = peak_rss_bytes(pid)
        .unwrap_or_else(|| panic!("no VmHWM in /proc/{pid}/status of the tracer"));
    std::thread::spawn(move || {
        let mut peak = first;
        while let Some(now) = peak_rss_bytes(pid) {
            peak = peak.max(now);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        peak
    })
}

/// Whether a stack passes through the fixture's `function` at `marker`'s line.
fn through(stack: &Value, function: &str, marker: &str) -> bool {
    let line = marked_line(marker);
    python_frames(stack)
        .iter()
        .any(|(name, file, at)| name == function && file == TORCH_SCRIPT && *at == line)
}

/// The heap stacks of the parameters' storage: torch's CPU allocator
/// (c10::alloc_cpu innermost) under the fixture's build line.
fn parameter_stacks(report: &Report) -> Vec<&Value> {
    report
        .stacks()
        .iter()
        .filter(|stack| {
            stack["kind"] == "heap"
                && stack["frames"][0]["function"]
                    .as_str()
                    .is_some_and(|function| function.starts_with("c10::alloc_cpu"))
                && through(stack, "iteration", "# PARAMS-SITE")
        })
        .collect()
}

/// The heap stacks of the numpy copies' data under the fixture's copy
/// line. numpy (its C code has no symbols in Debian's build) also
/// allocates each array's 16-32-byte dimension block there, on a stack of
/// its own; every copied buffer is at least 1 KiB (the fixture's widths).
fn copy_stacks(report: &Report) -> Vec<&Value> {
    report
        .stacks()
        .iter()
        .filter(|stack| {
            let live = stack_live(stack);
            stack["kind"] == "heap"
                && through(stack, "Tracker.track", "# COPY-SITE")
                && live.bytes >= 1024 * live.allocs
        })
        .collect()
}

#[test]
fn torch_parameters_and_numpy_copies_are_exact_per_site() {
    let session = session();
    let (report, answer) = (&session.report, &session.answer);
    let parameters = parameter_stacks(report);
    assert!(
        !parameters.is_empty(),
        "no stack of torch's allocator under the build line\n{report}"
    );
    assert_eq!(
        sum_live(&parameters),
        Live::answered(answer, "params_bytes", "params_allocs"),
        "the parameters' storage held by the registry, exactly: {answer}\n{report}"
    );
    let copies = copy_stacks(report);
    assert_eq!(
        sum_live(&copies),
        Live::answered(answer, "copies_bytes", "copies_allocs"),
        "the numpy copies held by the registry, exactly: {answer}\n{report}"
    );
}

/// Every parameter stack is whole: torch's C++ (libtorch_cpu) below the
/// fixture's Python frames, down to the interpreter's `<module>` and,
/// natively, to the program's start.
#[test]
fn torch_stacks_go_through_libtorch_cpu_to_the_program_start() {
    let report = &session().report;
    let parameters = parameter_stacks(report);
    assert!(!parameters.is_empty(), "no parameter stack\n{report}");
    for stack in parameters {
        let frames = frame_lines(stack);
        let modules: Vec<&str> = stack["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .filter_map(|frame| frame["module"].as_str())
            .collect();
        assert!(
            modules
                .iter()
                .any(|module| module.contains("libtorch_cpu.so")),
            "no libtorch_cpu frame: {frames:?}"
        );
        let python = python_frames(stack);
        assert_eq!(
            python
                .last()
                .map(|(function, file, _)| (function.as_str(), file.as_str())),
            Some(("<module>", TORCH_SCRIPT)),
            "the Python frames reach the script's <module>: {python:?}"
        );
        let outermost = &frames.last().expect("a frame").0;
        assert!(
            [
                "_start",
                "__libc_start_call_main",
                "__libc_start_main",
                "main"
            ]
            .contains(&outermost.as_str()),
            "the native frames reach the program's start, not {outermost:?}: {frames:?}"
        );
    }
    let share = report.json["targets"][0]["stack_quality"]["share_reaching_entry"]
        .as_f64()
        .unwrap_or_else(|| panic!("no stack quality in the report:\n{report}"));
    assert!(
        share >= 0.95,
        "{share} of the bytes have stacks reaching their start\n{report}"
    );
}

/// The fixture's stacks are over 100 Python frames deep (its `nested`
/// chain): none may be cut, in the kernel's count or in a stack.
#[test]
fn no_python_stack_of_the_torch_workload_is_truncated() {
    let report = &session().report;
    assert!(
        report.int("/events/python_stacks") > 0,
        "no Python stack walked\n{report}"
    );
    assert_eq!(
        report.int("/events/python_stacks_truncated"),
        0,
        "Python stacks cut at --python-depth\n{report}"
    );
    let deepest = report
        .stacks()
        .iter()
        .map(|stack| python_frames(stack).len())
        .max()
        .unwrap_or(0);
    assert!(
        deepest > 100,
        "the fixture's stacks are over 100 Python frames deep, the deepest has {deepest}\n{report}"
    );
    for stack in report.stacks() {
        assert!(
            !frame_lines(stack)
                .iter()
                .any(|(function, ..)| function.starts_with("[python: truncated")),
            "a truncated Python stack\n{report}"
        );
    }
}

#[test]
fn torch_workload_drops_nothing_at_default_options() {
    session().report.assert_no_drops();
}

/// tracer's peak RSS (VmHWM) stays under its stated bound through the
/// whole run, the report included: attached with default options while
/// the fixture builds 40 models (~5 600 distinct stacks of ~150 frames,
/// what 20 s of `--loop 0 --pause-ms 300` makes), read from /proc until
/// the tracer exits. On the copy path (`--unwind copy`) the 64 MiB
/// stack-copy ring alone is 128 MiB of it (mapped twice); the kernel's
/// walk through unwind tables maps no ring. Symbolizing every stack for
/// the report once took 150 MiB more than the frames it kept (each stack's
/// interned frames held their `Vec<Frame>`'s buffer) and merging them
/// 70 MiB of prefix maps: VmHWM 257-361 MiB at the end of such a run.
#[test]
fn tracer_peak_rss_on_the_torch_workload_stays_under_its_bound() {
    let mut fixture = start_torch_models();
    let mut trace = Record::pid(fixture.pid).args(["-v"]).attach();
    trace.wait_tables_ready();
    let peak = watch_peak_rss(trace.tracer.pid());
    let answers: Vec<String> = (0..4).map(|_| fixture.cmd("build 10")).collect();
    trace.stop();
    let peak = peak.join().expect("the VmHWM reader");
    assert!(
        peak <= RSS_BOUND_BYTES,
        "tracer's VmHWM {} MiB (through its report) is over its bound of {} MiB: {answers:?}",
        peak >> 20,
        RSS_BOUND_BYTES >> 20
    );
}

/// The frame the report ends a stack in when the kernel walked it by
/// frame pointers because an object's unwind table was still being built
/// (tracer/src/collect/frames.rs).
const TABLE_PENDING_MARKER: &str = "[unwind table pending: walked by frame pointers]";

/// Stacks taken before an object's unwind table is in the kernel are
/// walked by frame pointers: each ends in the pending marker, and they are
/// counted (the walks in `events.unwind_table_pending`, the distinct
/// stacks in `unwinding_stopped.table_pending`). Here the fixture builds a
/// model right after attach, while libtorch_cpu's table (1.4 M rows, built
/// in 0.2-1 s after ~300 others) is still pending.
#[test]
fn stacks_taken_before_their_table_was_ready_end_in_a_marker_and_are_counted() {
    let mut fixture = start_torch_models();
    let trace = Record::pid(fixture.pid).top(1000).attach();
    let answer = fixture.cmd("build 1");
    let report = trace.stop().report;
    let walks = report.int("/events/unwind_table_pending");
    assert!(
        walks > 0,
        "no stack taken while a table was pending (the build after attach: {answer})\n{report}"
    );
    let marked: Vec<&Value> = report
        .stacks()
        .iter()
        .filter(|stack| {
            frame_lines(stack)
                .iter()
                .any(|(function, ..)| function == TABLE_PENDING_MARKER)
        })
        .collect();
    assert!(
        !marked.is_empty(),
        "{walks} walks with a pending table, but no stack ends in {TABLE_PENDING_MARKER:?}\n{report}"
    );
    for stack in &marked {
        let frames = frame_lines(stack);
        assert_eq!(
            frames.last().map(|(function, ..)| function.as_str()),
            Some(TABLE_PENDING_MARKER),
            "the marker is the outermost frame: {frames:?}"
        );
    }
    let distinct = report.int("/unwinding_stopped/table_pending");
    assert!(
        distinct as usize >= marked.len() && distinct <= walks,
        "{distinct} distinct pending stacks counted, {} shown with the marker, {walks} walks\n{report}",
        marked.len()
    );
}

/// Ctrl-C right after attach: the check that names the objects without
/// frame pointers (seconds over torch's ~300 objects, on a thread of its
/// own after "attached") is waited for at most a quarter of a second, so
/// tracer still exits at once (the bench's exit row: 2.7 s when the stop
/// waited for it), and the report still says the process was walked
/// through unwind tables.
#[test]
fn ctrl_c_right_after_attach_to_torch_does_not_wait_for_the_frame_pointer_check() {
    let mut fixture = start_torch_models();
    let trace = Record::pid(fixture.pid).attach();
    let started = Instant::now();
    let traced = trace.stop();
    assert_took_under(
        "exiting (report included) after SIGINT right after attach to torch",
        started.elapsed(),
        Duration::from_secs(2),
        &traced.output,
    );
    let dwarf = traced.report.json["unwinding"]["dwarf"]
        .as_array()
        .expect("unwinding.dwarf");
    assert_eq!(dwarf.len(), 1, "{}", traced.report.json["unwinding"]);
    assert_eq!(
        dwarf[0]["pid"], fixture.pid,
        "{}",
        traced.report.json["unwinding"]
    );
    fixture.cmd("quit");
}
