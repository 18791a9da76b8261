//! The integration tests' harness: start a fixture, run the real tracer
//! binary (real eBPF, so as root) against it, and read its report, so that
//! each test reads like a user session.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod cuda;
mod fixture;
mod fixture_client;
mod http;
mod python;
mod record;
pub mod redis;
mod report;
mod rhythms;
mod top;
mod torch;
mod totals;
mod tracer;
mod truths;

#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use cuda::*;
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use fixture::{Fixture, KillOnDrop, field};
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use http::{
    connect_from, http_get, http_get_from, listen_address, serve_leaky, stack_samples,
    wait_for_samples,
};
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use python::*;
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use record::{Record, Trace, Traced};
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use report::{
    Live, Report, assert_in_order, dwarf_pids, frame_lines, frames_contain, function_names,
    python_frames, stack_int, take_svg_texts,
};
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use rhythms::{INTERVALS, Rhythms, Said, Seen, said, top_flags};
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use torch::{TORCH_SCRIPT, start_torch_models, torch_script};
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use totals::{Allocated, stack_allocated, stack_live, sum_live};
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use tracer::{Tracer, TracerOutput, assert_one_line_error};
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use truths::*;

/// How long the tracer may take to load and attach its probes.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the tracer may take to write its report and exit.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Fails unless `took` is under `bound`, naming both: a wall-clock bound
/// in a test is a generous one that a busy CI machine meets (performance
/// figures belong to `cargo xtask bench`), so a failure says by how much.
#[track_caller]
pub fn assert_took_under(what: &str, took: Duration, bound: Duration, context: &dyn fmt::Display) {
    assert!(
        took < bound,
        "{what} took {:.2} s, over the test's generous bound of {:.1} s \
         (a machine this busy, or a regression: see `cargo xtask bench`): {context}",
        took.as_secs_f64(),
        bound.as_secs_f64()
    );
}

/// Fails the test loudly unless it runs as root: these tests load eBPF
/// programs, and a silent skip would hide that nothing was tested.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "\n\n*** these tests load eBPF programs and must run as root \
         (euid is {euid}); run `sudo cargo xtask test` ***\n\n"
    );
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tracer lives inside the workspace")
        .to_path_buf()
}

/// `target/fixtures/<name>`, compiled by `cargo xtask setup`.
pub fn fixture(name: &str) -> PathBuf {
    let path = workspace_root().join("target/fixtures").join(name);
    assert!(
        path.is_file(),
        "fixture {} is missing: run `cargo xtask setup` first",
        path.display()
    );
    path
}

/// A fresh path for a JSON report in the temporary directory.
pub fn json_path(test_name: &str) -> PathBuf {
    static NEXT_ID: AtomicUsize = AtomicUsize::new(0);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "tracer-test-{}-{test_name}-{id}.json",
        std::process::id()
    ))
}

/// The functions of leaky.c's `churn` whose blocks are all freed again.
pub const CHURN_FREED: &[&str] = &[
    "churn_malloc",
    "churn_calloc",
    "churn_realloc",
    "churn_aligned",
    "churn_valloc",
    "churn_memalign_legacy",
];

/// Asserts that every churn function of leaky holds nothing at the end:
/// what it allocated, it freed.
pub fn assert_churn_frees_everything(report: &Report) {
    for function in CHURN_FREED {
        assert_eq!(
            report.heap_live_with(function),
            Live::default(),
            "{function} frees everything it allocates:\n{report}"
        );
    }
}

/// The line (from 1) of `path` that holds `marker`: tests name a fixture's
/// lines by marker comments, not by numbers.
pub fn marked_line(path: &Path, marker: &str) -> i64 {
    let source =
        std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let index = source
        .lines()
        .position(|line| line.contains(marker))
        .unwrap_or_else(|| panic!("no {marker} in {}", path.display()));
    index as i64 + 1
}

/// One traced session against a fixture: its answers and the tracer's
/// outputs.
pub struct Session {
    pub answers: Vec<String>,
    pub output: TracerOutput,
    pub report: Report,
}

/// Starts fixture `name`, attaches `tracer record --pid` to it, sends
/// `commands` once attached, stops the tracer with SIGINT and reads its
/// JSON report.
pub fn record_while(name: &str, commands: &[&str]) -> Session {
    record_with(name, &[], commands)
}

/// `tracer record --pid PID` every 200 ms with every stack and a
/// JSON report at `json`, plus `extra_args`; returns once attached.
pub fn record_attached(pid: u32, json: &Path, extra_args: &[&str]) -> Tracer {
    Record::pid(pid)
        .json_at(json)
        .args(extra_args)
        .attach()
        .tracer
}

/// [`record_while`] with more `tracer record` arguments.
pub fn record_with(name: &str, extra_args: &[&str], commands: &[&str]) -> Session {
    require_root();
    record_in(Fixture::start(name, &[]), extra_args, commands)
}

/// [`record_while`], but the commands are sent once `-v` says every unwind
/// table is in the kernel: a stack through glibc (no frame pointers) taken
/// while its table is pending loses its frames there, which a test of the
/// frames must not race (a loaded machine builds the tables late).
pub fn record_while_tables_ready(name: &str, commands: &[&str]) -> Session {
    record_with_tables_ready(name, &[], commands)
}

/// [`record_while_tables_ready`] with tracer's `extra_args`.
pub fn record_with_tables_ready(name: &str, extra_args: &[&str], commands: &[&str]) -> Session {
    require_root();
    record_in_tables_ready(Fixture::start(name, &[]), extra_args, commands)
}

/// [`record_with_tables_ready`] on a fixture already started.
pub fn record_in_tables_ready(
    mut fixture: Fixture,
    extra_args: &[&str],
    commands: &[&str],
) -> Session {
    require_root();
    let mut trace = Record::pid(fixture.pid)
        .args(["-v"])
        .args(extra_args.iter().copied())
        .attach();
    trace.wait_tables_ready();
    session(&mut fixture, trace, commands)
}

/// [`record_with`] on a fixture already started.
pub fn record_in(mut fixture: Fixture, extra_args: &[&str], commands: &[&str]) -> Session {
    require_root();
    let trace = Record::pid(fixture.pid).args(extra_args).attach();
    session(&mut fixture, trace, commands)
}

/// Sends `commands` to `fixture` traced by `trace`, then stops the tracer.
fn session(fixture: &mut Fixture, trace: Trace, commands: &[&str]) -> Session {
    let answers = commands
        .iter()
        .map(|command| fixture.cmd(command))
        .collect();
    let Traced { output, report } = trace.stop();
    Session {
        answers,
        output,
        report,
    }
}
