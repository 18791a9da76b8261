//! The integration tests' harness: start a fixture, run the real tracer
//! binary (real eBPF, so as root) against it, and read its report, so that
//! each test reads like a user session.

use std::ffi::OsStr;
use std::fmt;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

mod record;
pub mod redis;
mod torch;
mod totals;
mod truths;

#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use record::{Record, Trace, Traced};
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use torch::{TORCH_SCRIPT, start_torch_models, torch_script};
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use totals::{Allocated, stack_allocated, stack_live, sum_live};
#[allow(unused_imports, reason = "each test file uses some of the harness")]
pub use truths::*;

/// How long the tracer may take to load and attach its probes.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the tracer may take to write its report and exit.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a fixture may take to answer one command.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

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

/// The value of `key=value` in a fixture's answer line.
pub fn field(answer: &str, key: &str) -> i64 {
    answer
        .split_whitespace()
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no integer `{key}=` in fixture answer {answer:?}"))
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

/// A running fixture that speaks the line protocol of tests/fixtures/leaky.c.
pub struct Fixture {
    child: Child,
    stdin: ChildStdin,
    stdout_lines: Receiver<String>,
    pub pid: u32,
}

impl Fixture {
    /// Starts `target/fixtures/<name>` and waits for its `ready pid=N` line.
    pub fn start(name: &str, args: &[&str]) -> Self {
        Self::start_with_env(name, args, &[])
    }

    /// [`Fixture::start`] with more environment variables (`LD_PRELOAD`).
    pub fn start_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(fixture(name));
        command.args(args).envs(env.iter().copied());
        Self::start_command(command)
    }

    /// Starts a command that runs a fixture (an interpreter and its script)
    /// and waits for its `ready pid=N` line.
    pub fn start_command(command: Command) -> Self {
        let program = format!("{command:?}");
        let (fixture, ready) = Self::spawn(command);
        assert_eq!(
            ready,
            format!("ready pid={}", fixture.pid),
            "{program} started oddly"
        );
        fixture
    }

    /// Starts a command that runs a fixture (e.g. in other namespaces) and
    /// returns it with its first line.
    pub fn spawn(mut command: Command) -> (Self, String) {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("could not start {command:?}: {error}"));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (line_tx, stdout_lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut fixture = Self {
            pid: child.id(),
            child,
            stdin,
            stdout_lines,
        };
        let ready = fixture.read_answer("(start)");
        (fixture, ready)
    }

    /// Sends one command line and returns the fixture's one-line answer.
    pub fn cmd(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|error| panic!("could not send {line:?} to the fixture: {error}"));
        self.read_answer(line)
    }

    /// Waits for the fixture's next line, one it prints by itself (`what`
    /// it says, for the failure message), not as an answer.
    pub fn next_line(&mut self, what: &str) -> String {
        self.read_answer(what)
    }

    fn read_answer(&mut self, line: &str) -> String {
        let answer = self
            .stdout_lines
            .recv_timeout(ANSWER_TIMEOUT)
            .unwrap_or_else(|error| panic!("the fixture did not answer {line:?}: {error}"));
        assert!(
            !answer.starts_with("error"),
            "the fixture rejected {line:?}: {answer}"
        );
        answer
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts the way every bad input must end: exit code `expected_code` and
/// one stderr line starting with `tracer: error:`, no panic; returns it.
#[track_caller]
pub fn assert_one_line_error(output: &TracerOutput, expected_code: i32) -> &str {
    assert_eq!(
        output.status.code(),
        Some(expected_code),
        "wrong exit code: {output}"
    );
    let lines: Vec<&str> = output.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "stderr is not one line: {output}");
    assert!(
        lines[0].starts_with("tracer: error:"),
        "unexpected stderr: {output}"
    );
    let stderr = output.stderr.to_lowercase();
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "the tracer panicked: {output}"
    );
    lines[0]
}

/// What a finished tracer left behind.
pub struct TracerOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for TracerOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tracer {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

impl TracerOutput {
    pub fn assert_success(&self) {
        assert!(self.status.success(), "the tracer failed: {self}");
    }
}

/// The real tracer binary, running; stdout and stderr are collected on
/// threads so it never blocks on a full pipe.
pub struct Tracer {
    child: Option<Child>,
    stderr_lines: Arc<Mutex<Vec<String>>>,
    stderr_reader: Option<JoinHandle<()>>,
    stdout_text: Arc<Mutex<String>>,
    stdout_reader: Option<JoinHandle<()>>,
}

/// One of the tracer's output streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

impl Tracer {
    /// Starts `tracer <args>`.
    pub fn start<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tracer"));
        command.args(args);
        Self::spawn(command)
    }

    /// Starts a command that runs the tracer (e.g. under `setpriv`).
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("could not start {command:?}: {error}"));
        let stderr = child.stderr.take().expect("piped stderr");
        let mut stdout = child.stdout.take().expect("piped stdout");
        let stderr_lines = Arc::new(Mutex::new(Vec::new()));
        let stderr_reader = {
            let stderr_lines = Arc::clone(&stderr_lines);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    stderr_lines.lock().expect("stderr lock").push(line);
                }
            })
        };
        let stdout_text = Arc::new(Mutex::new(String::new()));
        let stdout_reader = {
            let stdout_text = Arc::clone(&stdout_text);
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(read @ 1..) = stdout.read(&mut chunk) {
                    let text = String::from_utf8_lossy(&chunk[..read]);
                    stdout_text.lock().expect("stdout lock").push_str(&text);
                }
            })
        };
        Self {
            child: Some(child),
            stderr_lines,
            stderr_reader: Some(stderr_reader),
            stdout_text,
            stdout_reader: Some(stdout_reader),
        }
    }

    /// Waits for the `tracer: attached` line on stderr; fails with all of
    /// stderr if the tracer exits first or `timeout` passes.
    pub fn wait_attached(&mut self, timeout: Duration) {
        self.wait_stderr("tracer: attached", timeout);
    }

    /// Waits for a stderr line containing `needle`; fails with all of
    /// stderr if the tracer exits first or `timeout` passes.
    pub fn wait_stderr(&mut self, needle: &str, timeout: Duration) {
        self.wait_for(Stream::Stderr, needle, timeout);
    }

    /// Waits until stdout (the tracer's, and a spawned command's) contains
    /// `needle`; fails like `wait_stderr`.
    pub fn wait_stdout(&mut self, needle: &str, timeout: Duration) {
        self.wait_for(Stream::Stdout, needle, timeout);
    }

    fn wait_for(&mut self, stream: Stream, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let found = if stream == Stream::Stdout {
                self.stdout_text
                    .lock()
                    .expect("stdout lock")
                    .contains(needle)
            } else {
                self.stderr_lines
                    .lock()
                    .expect("stderr lock")
                    .iter()
                    .any(|line| line.contains(needle))
            };
            if found {
                return;
            }
            let exited = self.child_mut().try_wait().expect("try_wait on the tracer");
            if let Some(status) = exited {
                panic!(
                    "the tracer exited ({status}) before {needle:?} on {stream:?}: {}",
                    self.finish(status)
                );
            }
            if Instant::now() > deadline {
                self.kill_and_fail(&format!(
                    "print {needle:?} on {stream:?} within {:.1} s",
                    timeout.as_secs_f64()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The stderr lines printed so far that contain `needle`.
    pub fn stderr_lines_with(&self, needle: &str) -> Vec<String> {
        self.stderr_lines
            .lock()
            .expect("stderr lock")
            .iter()
            .filter(|line| line.contains(needle))
            .cloned()
            .collect()
    }

    /// Sends SIGINT (the tracer takes a final snapshot and writes its
    /// reports) and waits for it to exit.
    pub fn stop(self) -> TracerOutput {
        self.stop_with(libc::SIGINT)
    }

    /// Sends `signal` (SIGKILL: no chance to clean up) and waits for the
    /// tracer to exit.
    pub fn stop_with(mut self, signal: libc::c_int) -> TracerOutput {
        let pid = libc::pid_t::try_from(self.child_mut().id()).expect("pid fits pid_t");
        // SAFETY: kill has no memory preconditions; `pid` is our own child,
        // which has not been waited for, so the pid is not reused.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "could not send signal {signal} to the tracer");
        self.wait_exit(EXIT_TIMEOUT)
    }

    /// Waits for the tracer to exit by itself; kills it and fails after
    /// `timeout`.
    pub fn wait_exit(mut self, timeout: Duration) -> TracerOutput {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child_mut().try_wait().expect("try_wait on the tracer") {
                return self.finish(status);
            }
            if Instant::now() > deadline {
                self.kill_and_fail(&format!("exit within {} s", timeout.as_secs()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The tracer's PID, while it runs.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the tracer is running").id()
    }

    fn child_mut(&mut self) -> &mut Child {
        self.child.as_mut().expect("the tracer is running")
    }

    /// Kills the tracer, which did not `what` in time, and fails with
    /// everything it printed.
    fn kill_and_fail(&mut self, what: &str) -> ! {
        let _ = self.child_mut().kill();
        let status = self.child_mut().wait().expect("wait for the tracer");
        panic!("the tracer did not {what}: {}", self.finish(status));
    }

    /// Collects stdout and stderr after the tracer exited with `status`.
    fn finish(&mut self, status: ExitStatus) -> TracerOutput {
        self.child = None;
        if let Some(reader) = self.stderr_reader.take() {
            let _ = reader.join();
        }
        if let Some(reader) = self.stdout_reader.take() {
            let _ = reader.join();
        }
        let stdout = self.stdout_text.lock().expect("stdout lock").clone();
        let stderr = self.stderr_lines.lock().expect("stderr lock").join("\n");
        TracerOutput {
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Live bytes and blocks summed over some stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    pub bytes: i64,
    pub allocs: i64,
}

impl Live {
    /// `count` blocks of `size_bytes` each.
    pub fn blocks(count: i64, size_bytes: i64) -> Self {
        Self {
            bytes: count * size_bytes,
            allocs: count,
        }
    }
}

impl Live {
    /// What a fixture's answer says it holds: its `bytes_key=` bytes in
    /// `allocs_key=` blocks.
    pub fn answered(answer: &str, bytes_key: &str, allocs_key: &str) -> Self {
        Self {
            bytes: field(answer, bytes_key),
            allocs: field(answer, allocs_key),
        }
    }
}

impl std::ops::Add for Live {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            bytes: self.bytes + other.bytes,
            allocs: self.allocs + other.allocs,
        }
    }
}

/// A parsed `--json` report.
pub struct Report {
    pub json: Value,
}

impl Report {
    /// Reads and removes the report file.
    pub fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|error| panic!("could not read report {}: {error}", path.display()));
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|error| panic!("report {} is not JSON: {error}", path.display()));
        let _ = std::fs::remove_file(path);
        Self { json }
    }

    /// Reads and removes the report of a `tracer record` run started with
    /// every stack (`--top 0`, as [`record_attached`] does), and checks
    /// that its totals are its stacks.
    pub fn read_checked(path: &Path) -> Self {
        let report = Self::read(path);
        report.assert_totals_are_the_listed_stacks(0);
        report
    }

    /// The integer at a JSON pointer such as `/totals/heap/live_bytes`.
    pub fn int(&self, pointer: &str) -> i64 {
        self.json
            .pointer(pointer)
            .and_then(Value::as_i64)
            .unwrap_or_else(|| panic!("no integer at {pointer} in the report:\n{}", self.json))
    }

    /// Like [`Report::int`], but `None` where the report leaves the field
    /// out (a memory kind with no allocations has no totals).
    pub fn int_if_present(&self, pointer: &str) -> Option<i64> {
        let value = self.json.pointer(pointer)?;
        Some(value.as_i64().unwrap_or_else(|| {
            panic!(
                "{pointer} is not a sane integer in the report:\n{}",
                self.json
            )
        }))
    }

    pub fn stacks(&self) -> &[Value] {
        self.json
            .get("stacks")
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("no `stacks` array in the report:\n{}", self.json))
    }

    /// The heap stacks with a frame whose function name contains `function`
    /// (names may carry suffixes such as `.constprop.0`).
    pub fn heap_stacks_with(&self, function: &str) -> Vec<&Value> {
        self.stacks()
            .iter()
            .filter(|stack| is_heap(stack) && frames_contain(stack, function))
            .collect()
    }

    /// Live bytes and blocks over the heap stacks containing `function`.
    pub fn heap_live_with(&self, function: &str) -> Live {
        self.live_with("heap", function)
    }

    /// The stacks of memory kind `kind` (as the report names it) with a
    /// frame whose function name contains `function`.
    pub fn stacks_with(&self, kind: &str, function: &str) -> Vec<&Value> {
        self.stacks()
            .iter()
            .filter(|stack| stack["kind"] == kind && frames_contain(stack, function))
            .collect()
    }

    /// Live bytes and blocks over the stacks of `kind` containing
    /// `function`.
    pub fn live_with(&self, kind: &str, function: &str) -> Live {
        sum_live(&self.stacks_with(kind, function))
    }
}

/// One line per stack (rank, kind, live bytes/blocks, functions) for
/// assertion messages.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for stack in self.stacks() {
            let functions: Vec<&str> = frames(stack)
                .iter()
                .map(|frame| frame.get("function").and_then(Value::as_str).unwrap_or("?"))
                .collect();
            writeln!(
                f,
                "#{} {} live_bytes={} live_allocs={} [{}]",
                stack.get("rank").unwrap_or(&Value::Null),
                stack.get("kind").unwrap_or(&Value::Null),
                stack.get("live_bytes").unwrap_or(&Value::Null),
                stack.get("live_allocs").unwrap_or(&Value::Null),
                functions.join(" < ")
            )?;
        }
        Ok(())
    }
}

fn is_heap(stack: &Value) -> bool {
    stack
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|kind| kind.eq_ignore_ascii_case("heap"))
}

fn frames(stack: &Value) -> &[Value] {
    stack
        .get("frames")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

pub fn frames_contain(stack: &Value, function: &str) -> bool {
    frames(stack).iter().any(|frame| {
        frame
            .get("function")
            .and_then(Value::as_str)
            .is_some_and(|name| name.contains(function))
    })
}

/// An integer field of a stack; a negative count shows up as a failure here
/// whether the tracer writes it signed or wrapped around as unsigned.
pub fn stack_int(stack: &Value, key: &str) -> i64 {
    stack
        .get(key)
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("stack has no sane integer `{key}`: {stack}"))
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

/// [`record_with`] on a fixture already started.
pub fn record_in(mut fixture: Fixture, extra_args: &[&str], commands: &[&str]) -> Session {
    require_root();
    let trace = Record::pid(fixture.pid).args(extra_args).attach();
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

/// (function, file name, line, language) of each frame of a stack,
/// innermost first; `?`, an empty name and -1 where a frame has none.
pub fn frame_lines(stack: &Value) -> Vec<(String, String, i64, String)> {
    stack["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|frame| {
            let file = frame["file"].as_str().unwrap_or("");
            let name = Path::new(file)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            (
                frame["function"].as_str().unwrap_or("?").to_owned(),
                name,
                frame["line"].as_i64().unwrap_or(-1),
                frame["language"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect()
}

/// (function, file name, line) of each Python frame of a stack, innermost
/// first.
pub fn python_frames(stack: &Value) -> Vec<(String, String, i64)> {
    frame_lines(stack)
        .into_iter()
        .filter(|(_, _, _, language)| language == "python")
        .map(|(function, file, line, _)| (function, file, line))
        .collect()
}

/// The function names of a stack's frames, innermost first.
pub fn function_names(stack: &Value) -> Vec<String> {
    stack["frames"]
        .as_array()
        .map(|frames| {
            frames
                .iter()
                .map(|frame| frame["function"].as_str().unwrap_or("?").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Position of the first frame whose function contains `function`.
fn position(names: &[String], function: &str) -> Option<usize> {
    names.iter().position(|name| name.contains(function))
}

/// Asserts that `functions` appear in this order, innermost first.
pub fn assert_in_order(stack: &Value, functions: &[&str], report: &Report) {
    let names = function_names(stack);
    let positions: Vec<Option<usize>> = functions
        .iter()
        .map(|function| position(&names, function))
        .collect();
    assert!(
        positions.iter().all(Option::is_some) && positions.windows(2).all(|pair| pair[0] < pair[1]),
        "expected {functions:?} innermost first in {names:?}\n{report}"
    );
}

/// The processes whose stacks the report says were unwound with DWARF.
pub fn dwarf_pids(report: &Report) -> Vec<i64> {
    report.json["unwinding"]["dwarf"]
        .as_array()
        .unwrap_or_else(|| panic!("no unwinding.dwarf in the report:\n{}", report.json))
        .iter()
        .map(|process| process["pid"].as_i64().expect("a pid"))
        .collect()
}

/// The trimmed `<text>` contents of the SVG tracer wrote at `path` (the
/// plot's titles and legend), the file removed once read.
pub fn take_svg_texts(path: &Path) -> Vec<String> {
    let svg = std::fs::read_to_string(path).expect("the SVG was written");
    let _ = std::fs::remove_file(path);
    let document = roxmltree::Document::parse(&svg).expect("the SVG is XML");
    document
        .descendants()
        .filter(|node| node.has_tag_name("text"))
        .filter_map(|node| node.text().map(|text| text.trim().to_owned()))
        .collect()
}
