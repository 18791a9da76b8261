//! A running fixture program: started, sent line commands, read back its
//! one-line answers (the protocol of tests/fixtures/leaky.c).

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use super::fixture;

/// How long a fixture may take to answer one command.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

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

    /// Sends `quit`, expects `bye`, and returns how the fixture exited
    /// (within [`super::EXIT_TIMEOUT`]).
    pub fn quit(mut self) -> std::process::ExitStatus {
        assert_eq!(self.cmd("quit"), "bye");
        let deadline = std::time::Instant::now() + super::EXIT_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("the fixture's status") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the fixture did not exit after quit"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
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

/// A process killed (SIGKILL) when dropped: a child of the test, then
/// also waited for, or a fixture's own child, which the fixture waits for.
pub struct KillOnDrop {
    pub pid: u32,
    child: Option<Child>,
}

impl KillOnDrop {
    /// A child this test started.
    pub fn child(child: Child) -> Self {
        Self {
            pid: child.id(),
            child: Some(child),
        }
    }

    /// A process that is not our child (one a fixture started), by PID; it
    /// must wait to be killed, so that its PID is not reused before.
    pub fn pid(pid: u32) -> Self {
        Self { pid, child: None }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        match self.child.as_mut() {
            Some(child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            // SAFETY: kill has no memory preconditions; the process waits
            // until killed, so the PID is still its own.
            None => unsafe {
                libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
            },
        }
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
