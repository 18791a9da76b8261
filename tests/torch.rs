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

#[allow(dead_code, reason = "other test files use the rest of the harness")]
mod harness;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use harness::{
    Fixture, Live, Record, Report, field, python_frames, require_root, stack_live, sum_live,
    workspace_root,
};
use serde_json::Value;

const PYTHON: &str = "/usr/bin/python3";
const TORCH: &str = "/usr/lib/python3/dist-packages/torch/__init__.py";
const SCRIPT: &str = "torch_models.py";

/// What one session left: the fixture's answer to `build 3` and the
/// tracer's report.
struct Session {
    answer: String,
    report: Report,
}

fn script() -> PathBuf {
    workspace_root().join("tests/fixtures/python").join(SCRIPT)
}

fn marked_line(marker: &str) -> i64 {
    harness::marked_line(&script(), marker)
}

/// The session every test of this file checks (run once, on first use).
fn session() -> &'static Session {
    static SESSION: OnceLock<Session> = OnceLock::new();
    SESSION.get_or_init(|| {
        require_root();
        assert!(
            std::path::Path::new(TORCH).exists(),
            "Debian's python3-torch is missing ({TORCH}): run `cargo xtask setup`"
        );
        let mut command = Command::new(PYTHON);
        command.arg(script());
        let mut fixture = Fixture::start_command(command);
        // Mid-run: torch is loaded and one model is held before attach.
        fixture.cmd("build 1");
        let trace = Record::pid(fixture.pid).top(1000).attach();
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

/// Whether a stack passes through the fixture's `function` at `marker`'s line.
fn through(stack: &Value, function: &str, marker: &str) -> bool {
    let line = marked_line(marker);
    python_frames(stack)
        .iter()
        .any(|(name, file, at)| name == function && file == SCRIPT && *at == line)
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
        Live {
            bytes: field(answer, "params_bytes"),
            allocs: field(answer, "params_allocs"),
        },
        "the parameters' storage held by the registry, exactly: {answer}\n{report}"
    );
    let copies = copy_stacks(report);
    assert_eq!(
        sum_live(&copies),
        Live {
            bytes: field(answer, "copies_bytes"),
            allocs: field(answer, "copies_allocs"),
        },
        "the numpy copies held by the registry, exactly: {answer}\n{report}"
    );
}

#[test]
fn torch_workload_drops_nothing_at_default_options() {
    session().report.assert_no_drops();
}
