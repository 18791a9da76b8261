//! A running fixture program: started, sent line commands, read back its
//! one-line answers (the protocol of tests/fixtures/leaky.c).

use std::process::{Child, Command};

use super::{fixture, fixture_client::FixtureClient};

/// A running fixture that speaks the line protocol of tests/fixtures/leaky.c
/// (`fixture_client`); every protocol error fails the test.
pub struct Fixture {
    client: FixtureClient,
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
        let client = FixtureClient::start(command).unwrap_or_else(|error| panic!("{error}"));
        Self {
            pid: client.pid,
            client,
        }
    }

    /// Starts a command that runs a fixture (e.g. in other namespaces) and
    /// returns it with its first line.
    pub fn spawn(command: Command) -> (Self, String) {
        let (client, first) =
            FixtureClient::spawn(command).unwrap_or_else(|error| panic!("{error}"));
        (
            Self {
                pid: client.pid,
                client,
            },
            first,
        )
    }

    /// Sends one command line and returns the fixture's one-line answer.
    pub fn cmd(&mut self, line: &str) -> String {
        self.client
            .send(line)
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// Sends `quit`, expects `bye`, and returns how the fixture exited
    /// (within [`super::EXIT_TIMEOUT`]).
    pub fn quit(self) -> std::process::ExitStatus {
        let (bye, status) = self
            .client
            .quit(super::EXIT_TIMEOUT)
            .unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(bye, "bye");
        status
    }

    /// Waits for the fixture's next line, one it prints by itself (`what`
    /// it says, for the failure message), not as an answer.
    pub fn next_line(&mut self, what: &str) -> String {
        let line = self
            .client
            .next_line(&format!("{what:?}"))
            .unwrap_or_else(|error| panic!("{error}"));
        assert!(
            !line.starts_with("error"),
            "the fixture rejected {what:?}: {line}"
        );
        line
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
