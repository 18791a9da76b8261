//! A running test fixture that speaks the line protocol of tests/fixtures
//! (`ready pid=N`, then one answer line per command), for `demo` and
//! `bench`: the test harness's own client (tests/harness/fixture_client.rs).

use std::path::Path;
use std::process::{Child, Command};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::{
    fixture_client::{ANSWER_TIMEOUT, FixtureClient},
    shell,
};

/// A child process that is killed when this value is dropped early.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The running fixture and its command line protocol (the test
/// harness's client, `fixture_client`), with anyhow errors and, with
/// `echo`, every command and answer on stderr.
pub struct FixtureProcess {
    client: FixtureClient,
    name: String,
    /// Print every command and answer on stderr.
    echo: bool,
    pub pid: u32,
}

impl FixtureProcess {
    /// Starts the fixture at `path` and waits for its `ready pid=N` line.
    pub fn start(path: &Path, echo: bool) -> Result<Self> {
        Self::start_with_env(path, echo, &[])
    }

    /// [`FixtureProcess::start`] with more environment variables
    /// (`LD_PRELOAD`).
    pub fn start_with_env(path: &Path, echo: bool, env: &[(&str, &str)]) -> Result<Self> {
        Self::start_with_args(path, &[], echo, env)
    }

    /// [`FixtureProcess::start_with_env`] with arguments (a script for
    /// `embed_script`).
    pub fn start_with_args(
        path: &Path,
        args: &[&Path],
        echo: bool,
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let mut command = Command::new(path);
        command.args(args).envs(env.iter().copied());
        if echo {
            eprintln!("$ {} &", shell::display(&command));
        }
        let name = path.file_name().map_or_else(
            || "fixture".to_owned(),
            |n| n.to_string_lossy().into_owned(),
        );
        let client = FixtureClient::start(command)
            .map_err(|error| anyhow!("{name}: {error}"))
            .with_context(|| format!("could not start {}", path.display()))?;
        Ok(Self {
            pid: client.pid,
            client,
            name,
            echo,
        })
    }

    /// Sends one command and returns the answer line.
    pub fn command(&mut self, line: &str) -> Result<String> {
        let answer = self
            .client
            .send(line)
            .map_err(|error| anyhow!("{}: {error}", self.name))?;
        if self.echo {
            eprintln!("{}: {line} -> {answer}", self.name);
        }
        Ok(answer)
    }

    /// Sends `quit` and waits for a clean exit.
    pub fn quit(self) -> Result<()> {
        let (_, status) = self
            .client
            .quit(ANSWER_TIMEOUT)
            .map_err(|error| anyhow!("{}: {error}", self.name))?;
        if !status.success() {
            bail!("{} exited with {status}", self.name);
        }
        Ok(())
    }
}
