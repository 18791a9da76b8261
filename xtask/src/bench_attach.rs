//! The benchmark's attach section: how long `tracer record --pid` takes
//! from its start to "attached" (every probe in place), and to exit after
//! SIGINT, on three targets: a small C program (bench.c: glibc only), a
//! Python process and a Python process with Debian's torch imported. Each
//! run is a fresh target and a fresh tracer; the table shows medians.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::bench_runs::{Attached, median};
use crate::fixture_process::KillOnDrop;

/// A target of the section: its name and command line. Each prints one
/// line once it is ready, then waits on stdin.
struct Target {
    name: &'static str,
    command: Vec<String>,
}

fn targets(root: &Path) -> Vec<Target> {
    let python = |name, import: &str| Target {
        name,
        command: [
            "/usr/bin/python3",
            "-c",
            &format!("{import}import sys; print('ready', flush=True); sys.stdin.read()"),
        ]
        .map(str::to_owned)
        .to_vec(),
    };
    vec![
        Target {
            name: "small C program (bench.c)",
            command: vec![root.join("target/fixtures/bench").display().to_string()],
        },
        python("Python 3.11", ""),
        python("Python 3.11 with torch imported", "import torch; "),
    ]
}

/// One run: seconds from tracer's start to "attached", and from SIGINT to
/// its exit.
fn run(root: &Path, target: &Target) -> Result<(f64, f64)> {
    let mut child = KillOnDrop(
        Command::new(&target.command[0])
            .args(&target.command[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("could not start {}", target.command[0]))?,
    );
    let stdout = child.0.stdout.take().context("target stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if !line.starts_with("ready") {
        bail!("{} did not start: {line:?}", target.name);
    }
    let json =
        std::env::temp_dir().join(format!("tracer-bench-attach-{}.json", std::process::id()));
    let args: Vec<String> = ["record", "--pid", &child.0.id().to_string(), "--json"]
        .map(str::to_owned)
        .into_iter()
        .chain([json.display().to_string()])
        .collect();
    let started = Instant::now();
    let attached = Attached::start(root, &args)?;
    let attach_s = started.elapsed().as_secs_f64();
    let stopping = Instant::now();
    attached.stop()?;
    let exit_s = stopping.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&json);
    Ok((attach_s, exit_s))
}

/// The section's table (markdown) and figures.
pub struct AttachSection {
    pub table: String,
    pub json: Value,
}

pub fn bench_attach(root: &Path, reps: usize) -> Result<AttachSection> {
    let targets = targets(root);
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); targets.len()];
    for rep in 0..reps {
        for (index, target) in targets.iter().enumerate() {
            let (attach_s, exit_s) = run(root, target)?;
            eprintln!(
                "bench: run {}/{reps} attach {:<34} {attach_s:.3} s, exit {exit_s:.3} s",
                rep + 1,
                target.name
            );
            runs[index].push((attach_s, exit_s));
        }
    }
    let mut table = format!(
        "\nattach: `tracer record --pid` from its start to \"attached\", and from SIGINT to \
         its exit, a fresh target and tracer per run, median of {reps}\n\n\
         | target | start to attached | exit after SIGINT |\n|---|---:|---:|\n"
    );
    let mut figures = Vec::new();
    for (target, runs) in targets.iter().zip(&runs) {
        let attach: Vec<f64> = runs.iter().map(|run| run.0).collect();
        let exit: Vec<f64> = runs.iter().map(|run| run.1).collect();
        table.push_str(&format!(
            "| {} | {:.2} s | {:.2} s |\n",
            target.name,
            median(&attach),
            median(&exit)
        ));
        figures.push(json!({
            "target": target.name,
            "attach_s_median": median(&attach),
            "attach_s_runs": attach,
            "exit_after_sigint_s_median": median(&exit),
            "exit_after_sigint_s_runs": exit,
        }));
    }
    Ok(AttachSection {
        table,
        json: Value::Array(figures),
    })
}
