//! The real tracer binary, running: its stdout and stderr collected while
//! it runs, waited for, stopped by a signal, and what it left behind.

use std::ffi::OsStr;
use std::fmt;
use std::io::{BufRead as _, BufReader, Read as _};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::EXIT_TIMEOUT;

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
    /// Starts `tracer <args>`: this build's binary, or the one
    /// `TRACER_TEST_BINARY` names (to run the tests against another build,
    /// e.g. the one before a change).
    pub fn start<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let binary = std::env::var_os("TRACER_TEST_BINARY")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_tracer").into());
        let mut command = Command::new(binary);
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

    /// Waits until `-v` (which the tracer must have been started with)
    /// says every unwind table is in the kernel: stacks taken before are
    /// walked by frame pointers and end in a marker, which a test of
    /// stacks' content must not race.
    pub fn wait_tables_ready(&mut self) {
        self.wait_stderr("every table ready", Duration::from_secs(60));
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
        self.signal(signal);
        self.wait_exit(EXIT_TIMEOUT)
    }

    /// Sends `signal` without waiting (several tracers stopped at once).
    pub fn signal(&mut self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child_mut().id()).expect("pid fits pid_t");
        // SAFETY: kill has no memory preconditions; `pid` is our own child,
        // which has not been waited for, so the pid is not reused.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "could not send signal {signal} to the tracer");
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
            if std::thread::panicking() {
                // The test failed while tracer ran: what it said so far.
                let lines = self.stderr_lines.lock().map(|l| l.join("\n"));
                eprintln!("tracer's stderr so far:\n{}", lines.unwrap_or_default());
            }
        }
    }
}
