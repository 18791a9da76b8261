//! The line protocol of tests/fixtures: a fixture prints `ready pid=N`,
//! then answers each command line with one line (`error ...` when it
//! rejects it), and exits after `quit` (answered `bye`). std only, errors
//! as text: the test harness (`fixture.rs`) panics on them, and `cargo
//! xtask` (bench, demo) includes this file (`#[path]` in
//! xtask/src/main.rs) and adds context.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// How long a fixture may take to answer one command.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// A running fixture, killed when dropped.
pub struct FixtureClient {
    child: Child,
    stdin: ChildStdin,
    /// Its stdout, line by line, read by a thread of its own: a fixture
    /// that stops answering fails a read after [`ANSWER_TIMEOUT`] instead
    /// of hanging it.
    lines: Receiver<String>,
    pub pid: u32,
}

impl FixtureClient {
    /// Starts `command` with its stdin and stdout piped; returns it with
    /// its first line, whatever it is.
    pub fn spawn(mut command: Command) -> Result<(FixtureClient, String), String> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|error| format!("could not start {command:?}: {error}"))?;
        let stdin = child.stdin.take().ok_or("no piped stdin")?;
        let stdout = child.stdout.take().ok_or("no piped stdout")?;
        let (line, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for read in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.send(read).is_err() {
                    break;
                }
            }
        });
        let mut client = FixtureClient {
            pid: child.id(),
            child,
            stdin,
            lines,
        };
        let first = client.next_line("its first line")?;
        Ok((client, first))
    }

    /// Starts `command` and checks its `ready pid=N` line.
    pub fn start(command: Command) -> Result<FixtureClient, String> {
        let program = format!("{command:?}");
        let (client, ready) = FixtureClient::spawn(command)?;
        if ready != format!("ready pid={}", client.pid) {
            return Err(format!(
                "{program} printed {ready:?} instead of `ready pid={}`",
                client.pid
            ));
        }
        Ok(client)
    }

    /// Sends one command line and returns the answer; an `error` answer
    /// is an error.
    pub fn send(&mut self, line: &str) -> Result<String, String> {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .map_err(|error| format!("could not send {line:?} to the fixture: {error}"))?;
        let answer = self.next_line(&format!("{line:?}"))?;
        if answer.starts_with("error") {
            return Err(format!("the fixture rejected {line:?}: {answer}"));
        }
        Ok(answer)
    }

    /// The fixture's next line (`what` it is, for the error).
    pub fn next_line(&mut self, what: &str) -> Result<String, String> {
        self.lines
            .recv_timeout(ANSWER_TIMEOUT)
            .map_err(|error| format!("the fixture did not answer {what}: {error}"))
    }

    /// Sends `quit` and returns its answer (`bye` from every fixture of
    /// tests/fixtures) and how the fixture exited, waiting `timeout` at
    /// most.
    pub fn quit(mut self, timeout: Duration) -> Result<(String, ExitStatus), String> {
        let bye = self.send("quit")?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .map_err(|error| format!("the fixture's status: {error}"))?
            {
                return Ok((bye, status));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the fixture did not exit within {} s of quit",
                    timeout.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for FixtureClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
