//! `cargo xtask fuzz --seconds N`: builds the fuzz targets of `fuzz/`
//! (cargo-fuzz: libFuzzer, on nightly, with AddressSanitizer, optimized
//! as the release binary is: arithmetic wraps as it does there, so a
//! crash is what a user would meet) and runs each for N seconds over its seeds
//! (`fuzz/corpus/TARGET`, real inputs) and its regression inputs
//! (`fuzz/regressions/TARGET`, every crash found, fixed); what a run
//! finds is kept in `target/fuzz/corpus/TARGET`, a crashing input in
//! `target/fuzz/artifacts/TARGET/`. Ends with `fuzz: T targets, R runs,
//! C crashes` and fails on any crash (a panic, a hang of 10 s, 2 GiB of
//! memory).
//!
//! Why cargo-fuzz: libFuzzer's coverage-guided mutation with the
//! comparisons it traces finds the magic values and lengths parsers check
//! (an ELF header, a CRC-guarded record, an arena's self pointer), and
//! cargo-fuzz is the Rust project's maintained harness for it
//! (rust-fuzz).
use std::path::Path;
use std::process::Stdio;

use anyhow::{Context as _, Result, bail};

use crate::shell::{self, Shell, find_on_path};

/// The cargo-fuzz release installed when missing.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Every fuzz target (fuzz/Cargo.toml).
pub const TARGETS: [&str; 8] = [
    "recording",
    "unwind_rows",
    "elf_object",
    "perf_map",
    "procfs",
    "python_threads",
    "glibc_heap",
    "holders_graph",
];

/// Seconds one input may take before it counts as a hang.
const TIMEOUT_S: u64 = 10;
/// Memory a target may use before it counts as a crash.
const RSS_LIMIT_MB: u64 = 2048;

pub fn fuzz(shell: &Shell, root: &Path, seconds: u64, only: Option<&str>) -> Result<()> {
    let targets: Vec<&str> = match only {
        Some(name) if TARGETS.contains(&name) => vec![name],
        Some(name) => bail!("no fuzz target {name}; the targets: {}", TARGETS.join(", ")),
        None => TARGETS.to_vec(),
    };
    ensure_cargo_fuzz(shell)?;
    let fuzz_dir = root.join("fuzz");
    let mut build = shell.cmd("cargo");
    build
        .current_dir(&fuzz_dir)
        .args(["+nightly", "fuzz", "build", "--release"]);
    if let [target] = targets[..] {
        build.arg(target);
    }
    shell.run(&mut build)?;
    if shell.is_dry_run() {
        return Ok(());
    }
    let bin_dir = fuzz_dir.join("target/x86_64-unknown-linux-gnu/release");
    let (mut runs, mut crashes) = (0u64, 0u64);
    for target in &targets {
        let found = run_target(root, &bin_dir, target, seconds)?;
        runs += found.runs;
        if found.crashed {
            crashes += 1;
        }
    }
    println!(
        "fuzz: {} targets, {runs} runs, {crashes} crashes",
        targets.len()
    );
    if crashes > 0 {
        bail!("{crashes} fuzz targets crashed (inputs under target/fuzz/artifacts/)");
    }
    Ok(())
}

/// What one target's run did.
struct Found {
    runs: u64,
    crashed: bool,
}

/// Runs `target` for `seconds` over its seeds and regressions.
fn run_target(root: &Path, bin_dir: &Path, target: &str, seconds: u64) -> Result<Found> {
    let corpus = root.join("target/fuzz/corpus").join(target);
    let artifacts = root.join("target/fuzz/artifacts").join(target);
    for dir in [&corpus, &artifacts] {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("could not create {}", dir.display()))?;
    }
    let mut command = std::process::Command::new(bin_dir.join(target));
    command.arg(&corpus);
    for dir in ["fuzz/corpus", "fuzz/regressions"] {
        let dir = root.join(dir).join(target);
        if dir.is_dir() {
            command.arg(dir);
        }
    }
    command
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={TIMEOUT_S}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1")
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    let line = shell::display(&command);
    eprintln!("$ {line}");
    let output = command
        .output()
        .with_context(|| format!("could not start `{line}` (was it built?)"))?;
    let log = String::from_utf8_lossy(&output.stderr);
    let runs = log
        .lines()
        .find_map(|line| line.strip_prefix("stat::number_of_executed_units:"))
        .and_then(|runs| runs.trim().parse().ok())
        .unwrap_or(0);
    let crashed = !output.status.success();
    if crashed {
        // The whole log: the crash, its stack and the input's name.
        eprintln!("{log}");
    }
    eprintln!(
        "xtask: fuzz {target}: {runs} runs in {seconds} s{}",
        if crashed { ", CRASHED" } else { "" }
    );
    Ok(Found { runs, crashed })
}

/// cargo-fuzz, installed with cargo when missing (it builds in about a
/// minute).
fn ensure_cargo_fuzz(shell: &Shell) -> Result<()> {
    if let Some(path) = find_on_path("cargo-fuzz") {
        eprintln!("xtask: cargo-fuzz: present at {}", path.display());
        return Ok(());
    }
    shell.run(shell.cmd("cargo").args([
        "install",
        "cargo-fuzz",
        "--locked",
        "--version",
        CARGO_FUZZ_VERSION,
    ]))
}
