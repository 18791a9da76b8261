//! Python frames in every stack (issue 16), read by the kernel from a
//! running Debian python3.11 with numpy (installed by `cargo xtask
//! setup`). The fixture (tests/fixtures/python) leaks numpy buffers from
//! one function reached from two Python callers, and churns buffers it
//! frees; it prints its ground truth. File names and line numbers are
//! taken from the fixture's source, by its marker comments.

use crate::harness;

use std::process::Command;

use harness::{
    Fixture, Live, PYTHON, Record, Report, field, frame_lines, python_frames,
    python_line as marked_line, require_root, stack_live, start_python, sum_live, workspace_root,
};
use serde_json::Value;

/// The numpy fixture (tests/fixtures/python/leaky_numpy.py).
const NUMPY_SCRIPT: &str = "leaky_numpy.py";

/// The line of threading.py's Thread.run that calls the thread's target,
/// in the stdlib of [`PYTHON`]: the file asked of the interpreter itself,
/// the line found in its source, not in a report.
fn thread_run_line() -> i64 {
    let output = Command::new(PYTHON)
        .args(["-c", "import threading; print(threading.__file__)"])
        .output()
        .expect("python3.11 runs");
    let path = String::from_utf8(output.stdout).expect("a UTF-8 path");
    harness::marked_line(
        std::path::Path::new(path.trim()),
        "self._target(*self._args, **self._kwargs)",
    )
}

/// The heap stacks through `caller`. The interpreter reaches numpy's
/// allocation through different native paths (a call site specialized
/// after its first runs goes round `PyObject_Vectorcall`): the report
/// must still show one Python path as one stack.
fn stacks_through<'a>(report: &'a Report, caller: &str) -> Vec<&'a Value> {
    let stacks = heap_stacks_with_python_frame(report, |(function, _, _)| function == caller);
    assert!(
        !stacks.is_empty(),
        "no heap stack through {caller}:\n{report}"
    );
    stacks
}

/// Debian's python3.11 has no frame pointers: `--unwind auto` copies its
/// stacks (the DWARF path).
#[test]
fn numpy_leak_is_named_by_its_python_function_callers_and_lines() {
    numpy_leak_named(&[]);
}

/// The kernel's frame-pointer walk stops early in python3.11, but the
/// Python frames are all there.
#[test]
fn numpy_leak_is_named_with_frame_pointer_stacks_too() {
    numpy_leak_named(&["--unwind", "fp"]);
}

fn numpy_leak_named(extra_args: &[&str]) {
    require_root();
    let mut fixture = start_python(NUMPY_SCRIPT, &[]);
    // Only the 1 MiB data buffers (numpy's dimension blocks are 16 B).
    let trace = Record::pid(fixture.pid)
        .args(["--min-size", "65536"])
        .args(extra_args)
        .attach();
    let answer = fixture.cmd("leak 3");
    let traced = trace.stop();
    let (report, output) = (&traced.report, &traced.output);
    assert!(
        output.stderr.contains("Python frames on (PID") && output.stderr.contains("CPython 3.11"),
        "the attach line says Python frames are on:\n{output}"
    );

    for (caller, call_marker, serve_marker, bytes_key, allocs_key) in [
        ("caller_a", "# CALL-A", "# SERVE-A", "a_bytes", "a_allocs"),
        ("caller_b", "# CALL-B", "# SERVE-B", "b_bytes", "b_allocs"),
    ] {
        let stacks = stacks_through(report, caller);
        assert_eq!(
            stacks.len(),
            1,
            "one stack through {caller}, whatever native path the interpreter took\n{report}"
        );
        let live = sum_live(&stacks);
        assert_eq!(
            live,
            Live::answered(&answer, bytes_key, allocs_key),
            "{caller}'s buffers, exactly: {answer}\n{report}"
        );
        for stack in stacks {
            assert_named(stack, caller, call_marker, serve_marker, report);
        }
    }
    // Whole Python stacks count as reaching their start (`<module>`), even
    // where the native frames below stop early (--unwind fp).
    let share = report.json["targets"][0]["stack_quality"]["share_reaching_entry"]
        .as_f64()
        .unwrap_or_else(|| panic!("no stack quality in the report:\n{report}"));
    assert!(
        share > 0.99,
        "{extra_args:?}: {share} of the bytes reach their start\n{report}"
    );
    // The churned buffers are all freed: no stack through `churn` holds
    // anything (stacks without live bytes are not listed).
    assert_eq!(
        report.heap_live_with("churn"),
        Live::default(),
        "churn frees everything\n{report}"
    );
}

/// The Python frames of a buffer stack through `caller`, with the files
/// and lines of the fixture's markers, below numpy's own frames.
fn assert_named(
    stack: &Value,
    caller: &str,
    call_marker: &str,
    serve_marker: &str,
    report: &Report,
) {
    let buffers = "buffers.py";
    let main = "leaky_numpy.py";
    let leak_line = marked_line("pyleak/buffers.py", "# LEAK-SITE");
    let python = python_frames(stack);
    let expected = [
        ("leak_buffer", buffers, leak_line),
        (caller, main, marked_line(main, call_marker)),
        ("serve", main, marked_line(main, serve_marker)),
        ("<module>", main, marked_line(main, "# MODULE")),
    ];
    let position = python
        .iter()
        .position(|(function, _, _)| function == "leak_buffer")
        .unwrap_or_else(|| panic!("no leak_buffer frame: {python:?}\n{report}"));
    let found: Vec<(&str, &str, i64)> = python[position..]
        .iter()
        .map(|(function, file, line)| (function.as_str(), file.as_str(), *line))
        .collect();
    assert_eq!(
        found, expected,
        "Python frames of {caller}'s stack\n{report}"
    );
    // The stack is named by the program's own line, past numpy's C and
    // numpy's own Python (issue 17: labels skip what only passes the
    // allocation on).
    let site = &stack["site"];
    assert_eq!(
        (&site["function"], &site["line"], &site["via"]),
        (
            &Value::from("leak_buffer"),
            &Value::from(leak_line),
            &Value::from("ones")
        ),
        "{site}\n{report}"
    );
    // Listed one per stack, the callers' stacks are told apart by the
    // frame where their paths part (issue 36).
    let label = format!("leak_buffer (buffers.py:{leak_line}) via ones");
    let expected = match site["through"].as_str() {
        Some(through) => format!("{label} through {through}"),
        None => label,
    };
    assert_eq!(site["label"], expected, "{site}");
    // numpy's own Python (`ones`) runs inside leak_buffer, and the
    // native frames of numpy's C code are kept, innermost.
    let all = frame_lines(stack);
    assert_eq!(all[0].3, "native", "numpy's C code first: {all:?}");
    assert!(
        python
            .first()
            .is_some_and(|(function, file, _)| function == "ones" && file == "numeric.py"),
        "numpy.ones named: {python:?}"
    );
    assert!(
        !all.iter()
            .any(|(function, ..)| function == "_PyEval_EvalFrameDefault"),
        "evaluation frames replaced by Python frames: {all:?}"
    );
}

#[test]
fn python_off_keeps_native_frames_and_a_native_process_says_no_cpython() {
    require_root();
    let mut fixture = start_python(NUMPY_SCRIPT, &[]);
    // Only the 1 MiB data buffers: the leak's, whose bytes the fixture
    // answers.
    let trace = Record::pid(fixture.pid)
        .args(["--python", "off", "--min-size", "65536"])
        .attach();
    let answer = fixture.cmd("leak 1");
    let traced = trace.stop();
    let report = &traced.report;
    assert!(
        traced
            .output
            .stderr
            .contains("Python frames off (--python off)"),
        "{}",
        traced.output
    );
    let heap: Vec<&Value> = report
        .stacks()
        .iter()
        .filter(|stack| stack["kind"] == "heap")
        .collect();
    assert_eq!(
        sum_live(&heap),
        Live::answered(&answer, "a_bytes", "a_allocs")
            + Live::answered(&answer, "b_bytes", "b_allocs"),
        "the leak's buffers, exactly, on native stacks: {answer}\n{report}"
    );
    assert!(
        report
            .stacks()
            .iter()
            .all(|stack| python_frames(stack).is_empty()),
        "no Python frames with --python off\n{report}"
    );

    let leaky = Fixture::start("leaky", &[]);
    let traced = Record::pid(leaky.pid).attach().stop();
    assert!(
        traced
            .output
            .stderr
            .contains("no CPython found: native frames only"),
        "{}",
        traced.output
    );
}

/// The heap stacks with a Python frame `function` in `file` (a file name).
fn stacks_with_python<'a>(report: &'a Report, function: &str, file: &str) -> Vec<&'a Value> {
    heap_stacks_with_python_frame(report, |(name, in_file, _)| {
        name == function && in_file == file
    })
}

/// The heap stacks with a Python frame (function, file name, line) that
/// `matches`.
fn heap_stacks_with_python_frame(
    report: &Report,
    matches: impl Fn(&(String, String, i64)) -> bool,
) -> Vec<&Value> {
    report
        .stacks()
        .iter()
        .filter(|stack| stack["kind"] == "heap" && python_frames(stack).iter().any(&matches))
        .collect()
}

/// Four Python threads leak at once through a method, a generator, a
/// lambda and a function of a module imported after attach: each site's
/// bytes exactly, named with its qualified name, file and line, below the
/// thread's own function.
#[test]
fn python_threads_methods_generators_lambdas_and_late_modules() {
    require_root();
    let mut fixture = start_python(NUMPY_SCRIPT, &[]);
    // The threads exist before attach; tracer reads their thread states
    // when it attaches (threads started later are found at the next
    // --interval).
    let started = fixture.cmd("threads 4");
    assert_eq!(started, "threads started=4");
    let mut trace = Record::pid(fixture.pid)
        .args(["--min-size", "65536", "-v"])
        .attach();
    // One stack per site for all four threads: once the tables are in.
    trace.wait_tables_ready();
    let answer = fixture.cmd("tleak 2");
    let traced = trace.stop();
    let report = &traced.report;
    let main = "leaky_numpy.py";
    for (function, file, site_marker, worker_marker, bytes_key) in [
        (
            "Keeper.keep",
            "shapes.py",
            "# METHOD-SITE",
            "# WORKER-METHOD",
            "method_bytes",
        ),
        (
            "make_buffers",
            "shapes.py",
            "# GENERATOR-SITE",
            "# WORKER-GENERATOR",
            "generator_bytes",
        ),
        (
            "<lambda>",
            "shapes.py",
            "# LAMBDA-SITE",
            "# WORKER-LAMBDA",
            "lambda_bytes",
        ),
        (
            "leak_late",
            "late.py",
            "# LATE-SITE",
            "# WORKER-LATE",
            "late_bytes",
        ),
    ] {
        let stacks = stacks_with_python(report, function, file);
        assert_eq!(
            stacks.len(),
            1,
            "one stack through {function} for all 4 threads\n{report}"
        );
        let bytes: i64 = stacks.iter().map(|stack| stack_live(stack).bytes).sum();
        assert_eq!(
            bytes,
            field(&answer, bytes_key),
            "{function}: the 4 threads' buffers, exactly: {answer}\n{report}"
        );
        let site_line = marked_line(&format!("pyleak/{file}"), site_marker);
        let worker_line = marked_line(main, worker_marker);
        for stack in stacks {
            let python = python_frames(stack);
            let at = python
                .iter()
                .position(|(name, _, _)| name == function)
                .expect("the site's frame");
            let found: Vec<(&str, &str, i64)> = python[at..]
                .iter()
                .take(3)
                .map(|(name, file, line)| (name.as_str(), file.as_str(), *line))
                .collect();
            assert_eq!(
                found,
                [
                    (function, file, site_line),
                    ("worker", main, worker_line),
                    ("Thread.run", "threading.py", thread_run_line()),
                ],
                "{function}'s Python frames\n{report}"
            );
            assert!(
                python.first().is_some_and(|(name, _, _)| name == "ones"),
                "numpy.ones innermost: {python:?}"
            );
        }
    }
}

/// The line in embedded.py (the script tests/fixtures/embed_python.c
/// compiles under that name) that holds `marker`.
fn embedded_line(marker: &str) -> i64 {
    let source = std::fs::read_to_string(workspace_root().join("tests/fixtures/embed_python.c"))
        .expect("fixture source");
    let lines: Vec<&str> = source.lines().collect();
    let first = lines
        .iter()
        .position(|line| line.contains(r#""kept = []\n""#))
        .expect("the script's first line");
    let marked = lines[first..]
        .iter()
        .position(|line| line.contains(marker))
        .unwrap_or_else(|| panic!("no {marker} in embed_python.c's script"));
    marked as i64 + 1
}

/// A C program that dlopen()s libpython3.11 after attach: tracer finds the
/// interpreter when it is mapped, and the leak's stack holds both
/// languages: the Python function and its caller, then the C function
/// that ran the script and main.
#[test]
fn embedded_interpreter_loaded_after_attach_gets_python_frames_in_c_stacks() {
    require_root();
    let mut fixture = Fixture::start("embed_python", &[]);
    let mut trace = Record::pid(fixture.pid)
        .args(["--min-size", "65536", "-v"])
        .attach();
    assert_eq!(fixture.cmd("start"), "started");
    trace.tracer.wait_stderr(
        "Python frames on from now (CPython 3.11",
        std::time::Duration::from_secs(20),
    );
    // libpython has no frame pointers: the C callers below its frames are
    // walked through its unwind table, built in the background after the
    // dlopen (a stack taken before ends in the pending marker instead).
    trace.tracer.wait_stderr(
        "unwind table libpython3.11",
        std::time::Duration::from_secs(60),
    );
    let answer = fixture.cmd("leak 3");
    let traced = trace.stop();
    let report = &traced.report;
    let stacks = stacks_with_python(report, "leak_embedded", "embedded.py");
    let live = sum_live(&stacks);
    assert_eq!(
        live,
        Live::answered(&answer, "bytes", "count"),
        "the embedded leak, exactly: {answer}\n{report}"
    );
    for stack in stacks {
        let all = frame_lines(stack);
        let names: Vec<&str> = all.iter().map(|(name, ..)| name.as_str()).collect();
        let at = |name: &str| {
            names
                .iter()
                .position(|found| *found == name)
                .unwrap_or_else(|| panic!("no {name} in {names:?}\n{report}"))
        };
        let (site, run, module) = (at("leak_embedded"), at("run"), at("<module>"));
        let (c_caller, main) = (at("c_calls_python"), at("main"));
        assert!(
            site < run && run < module && module < c_caller && c_caller < main,
            "Python frames inside the C caller, innermost first: {names:?}"
        );
        assert_eq!(
            (all[site].1.as_str(), all[site].2, all[run].2),
            (
                "embedded.py",
                embedded_line("# EMBED-SITE"),
                embedded_line("# EMBED-CALL")
            ),
            "{all:?}"
        );
        assert_eq!(all[c_caller].3, "native");
        assert_eq!(all[site].3, "python");
    }
}

/// `--follow-forks`: a multiprocessing child (forked, as DataLoader
/// workers are) gets Python frames too, with its leak's exact bytes.
#[test]
fn forked_multiprocessing_child_gets_python_frames() {
    require_root();
    let mut fixture = start_python(NUMPY_SCRIPT, &[]);
    let mut trace = Record::pid(fixture.pid)
        .args(["--min-size", "65536", "--follow-forks"])
        .attach();
    let child = field(&fixture.cmd("fork 2"), "pid");
    // The child leaks once tracer follows it, Python frames on.
    trace.tracer.wait_stderr(
        &format!("following child PID {child} "),
        std::time::Duration::from_secs(30),
    );
    let answer = fixture.cmd("child leak");
    assert_eq!(field(&answer, "pid"), child, "{answer}");
    let traced = trace.stop();
    let report = &traced.report;
    let stacks: Vec<&Value> = stacks_with_python(report, "child_leak", "leaky_numpy.py")
        .into_iter()
        .filter(|stack| stack["pid"].as_i64() == Some(child))
        .collect();
    let live = sum_live(&stacks);
    assert_eq!(
        live,
        Live::answered(&answer, "bytes", "allocs"),
        "the child's leak, exactly: {answer}\n{report}"
    );
    let line = marked_line("leaky_numpy.py", "# CHILD-LEAK");
    for stack in stacks {
        let python = python_frames(stack);
        let at = python
            .iter()
            .position(|(name, _, _)| name == "child_leak")
            .expect("child_leak");
        assert_eq!(python[at].2, line, "{python:?}");
        assert_eq!(python[at - 1].0, "leak_buffer", "{python:?}");
    }
}

/// Threads started after attach that allocate at once (before tracer's
/// next read of the thread states, every --interval): the kernel finds
/// their thread state in the interpreter's list at their first
/// allocation, so their leak is named too, with its exact bytes.
#[test]
fn threads_started_after_attach_get_python_frames_at_their_first_allocation() {
    require_root();
    let mut fixture = start_python("leaky_bytes.py", &[]);
    let trace = Record::pid(fixture.pid)
        .args(["--min-size", "65536"])
        .interval("10s")
        .attach();
    fixture.cmd("thread 2");
    let answer = fixture.cmd("thread 3");
    let traced = trace.stop();
    let report = &traced.report;
    let stacks = stacks_with_python(report, "thread_leak", "leaky_bytes.py");
    assert_eq!(
        stacks.len(),
        1,
        "the two threads' leak is one stack\n{report}"
    );
    assert_eq!(
        stack_live(stacks[0]),
        Live::answered(&answer, "bytes", "allocs"),
        "both threads' buffers, exactly: {answer}\n{report}"
    );
    let python = python_frames(stacks[0]);
    assert_eq!(
        python[..2]
            .iter()
            .map(|(name, file, line)| (name.as_str(), file.as_str(), *line))
            .collect::<Vec<_>>(),
        [
            (
                "thread_leak",
                "leaky_bytes.py",
                marked_line("leaky_bytes.py", "# THREAD-SITE")
            ),
            ("Thread.run", "threading.py", thread_run_line()),
        ],
        "{report}"
    );
}

/// The kernel knows the interpreter and its threads before the first
/// allocator probe is in place: a thread allocating while tracer attaches
/// gets Python frames from its first recorded allocation on, none native
/// only (they were while the thread states were read after the probes).
#[test]
fn allocations_right_after_attach_have_python_frames() {
    /// Drips the test waits for once tracer attached.
    const DRIPS_AFTER_ATTACH: i64 = 20;
    require_root();
    let mut fixture = start_python(NUMPY_SCRIPT, &[]);
    fixture.cmd("drip on");
    let trace = Record::pid(fixture.pid)
        .args(["--min-size", "65536"])
        .attach();
    // The drips after this answer fell after attach: all of them recorded.
    let mark = fixture.cmd(&format!("drip more {DRIPS_AFTER_ATTACH}"));
    let before = field(&mark, "before");
    assert!(
        field(&mark, "now") >= before + DRIPS_AFTER_ATTACH,
        "the dripper went on: {mark}"
    );
    let answer = fixture.cmd("drip off");
    let traced = trace.stop();
    let report = &traced.report;
    let drip_line = marked_line("leaky_numpy.py", "# DRIP-SITE");
    let heap: Vec<&Value> = report
        .stacks()
        .iter()
        .filter(|stack| stack["kind"] == "heap")
        .collect();
    assert!(!heap.is_empty(), "no drip recorded: {answer}\n{report}");
    for stack in &heap {
        assert!(
            python_frames(stack).contains(&(
                "dripper".to_owned(),
                "leaky_numpy.py".to_owned(),
                drip_line
            )),
            "a stack without the dripper's Python frame: {stack}\n{report}"
        );
    }
    // Every recorded buffer is a whole drip buffer.
    let live = sum_live(&heap);
    assert_eq!(live.bytes, live.allocs * 80_000, "{report}");
    let dripped = field(&answer, "allocs");
    assert!(
        dripped - before <= live.allocs && live.allocs <= dripped,
        "every drip after {mark:?} recorded, no more than dripped: {live:?} for {answer}\n{report}"
    );
}
