//! A running test fixture that speaks the line protocol of tests/fixtures
//! (`ready pid=N`, then one answer line per command), for `demo` and
//! `bench`.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::shell;

/// A child process that is killed when this value is dropped early.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The running fixture and its command line protocol.
pub struct FixtureProcess {
    child: KillOnDrop,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
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
        command
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if echo {
            eprintln!("$ {} &", shell::display(&command));
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("could not start {}", path.display()))?;
        let stdin = child.stdin.take().context("fixture stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("fixture stdout")?);
        let name = path.file_name().map_or_else(
            || "fixture".to_owned(),
            |n| n.to_string_lossy().into_owned(),
        );
        let mut fixture = Self {
            child: KillOnDrop(child),
            stdin,
            stdout,
            name,
            echo,
            pid: 0,
        };
        let ready = fixture.read_line()?;
        fixture.pid = ready
            .strip_prefix("ready pid=")
            .and_then(|pid| pid.parse().ok())
            .ok_or_else(|| {
                anyhow!(
                    "{} printed {ready:?} instead of `ready pid=N`",
                    fixture.name
                )
            })?;
        Ok(fixture)
    }

    /// Sends one command and returns the answer line.
    pub fn command(&mut self, line: &str) -> Result<String> {
        writeln!(self.stdin, "{line}")
            .with_context(|| format!("could not write to {}", self.name))?;
        self.stdin
            .flush()
            .with_context(|| format!("could not write to {}", self.name))?;
        let answer = self.read_line()?;
        if self.echo {
            eprintln!("{}: {line} -> {answer}", self.name);
        }
        if answer.starts_with("error") {
            bail!("{} rejected {line:?}: {answer}", self.name);
        }
        Ok(answer)
    }

    fn read_line(&mut self) -> Result<String> {
        let mut line = String::new();
        if self
            .stdout
            .read_line(&mut line)
            .with_context(|| format!("could not read from {}", self.name))?
            == 0
        {
            bail!("{} exited unexpectedly", self.name);
        }
        Ok(line.trim_end().to_owned())
    }

    /// Sends `quit` and waits for a clean exit.
    pub fn quit(mut self) -> Result<()> {
        self.command("quit")?;
        let status = self
            .child
            .0
            .wait()
            .with_context(|| format!("could not wait for {}", self.name))?;
        if !status.success() {
            bail!("{} exited with {status}", self.name);
        }
        Ok(())
    }
}
