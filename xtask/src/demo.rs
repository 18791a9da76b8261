//! `cargo xtask demo`: the tracer attached to a running leaky fixture.
//!
//! Starts `target/fixtures/leaky`, attaches `tracer record --pid` to it, and
//! once the tracer says it is attached, makes the fixture leak 1337-byte
//! blocks in `leak_here` (and churn memory it frees), so the report shows
//! `leak_here` on top.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::fixture_process::{FixtureProcess, KillOnDrop};
use crate::shell::{self, is_root};

const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// Rounds of leaking and churning, spread over the 5 s trace so the leak
/// keeps growing until the end (and is flagged as a suspected leak).
const LEAK_ROUNDS: usize = 18;
const PAUSE_BETWEEN_ROUNDS: Duration = Duration::from_millis(250);

pub fn demo(root: &Path) -> Result<()> {
    let mut leaky = FixtureProcess::start(&root.join("target/fixtures/leaky"), true)?;
    let pid = leaky.pid;

    let tracer_path = root.join("target/release/tracer");
    let mut command = if is_root() {
        Command::new(&tracer_path)
    } else {
        let mut sudo = Command::new("sudo");
        sudo.arg(&tracer_path);
        sudo
    };
    command
        .args([
            "record",
            "--pid",
            &pid.to_string(),
            "--duration",
            "5s",
            "--interval",
            "250ms",
            "--top",
            "5",
        ])
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    let line = shell::display(&command);
    eprintln!("$ {line}");
    let mut tracer = KillOnDrop(
        command
            .spawn()
            .with_context(|| format!("could not start `{line}`"))?,
    );

    let stderr = tracer.0.stderr.take().context("tracer stderr")?;
    let (attached_tx, attached_rx) = mpsc::channel();
    let stderr_forwarder = std::thread::spawn(move || {
        for stderr_line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{stderr_line}");
            if stderr_line.starts_with("tracer: attached") {
                let _ = attached_tx.send(());
            }
        }
    });
    if attached_rx.recv_timeout(ATTACH_TIMEOUT).is_err() {
        bail!(
            "`{line}` did not print `tracer: attached` within {} s",
            ATTACH_TIMEOUT.as_secs()
        );
    }

    for _ in 0..LEAK_ROUNDS {
        leaky.command("leak 50")?;
        leaky.command("churn 25")?;
        std::thread::sleep(PAUSE_BETWEEN_ROUNDS);
    }

    let status = tracer
        .0
        .wait()
        .with_context(|| format!("could not wait for `{line}`"))?;
    let _ = stderr_forwarder.join();
    if !status.success() {
        bail!("`{line}` failed: {status}");
    }
    leaky.quit()
}
