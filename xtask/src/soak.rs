//! `cargo xtask soak`: a long run at a steady allocation rate with a steady
//! leak (not in CI: 10 minutes by default). Samples the tracer's RSS and CPU
//! time while it runs and checks at the end that the report is still exact.
//! Prints a table of the samples; the figures go in the closing notes.
use std::{
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::fixture_process::{FixtureProcess, KillOnDrop};

/// malloc/free pairs per second of the soak's churn.
const PAIRS_PER_S: u64 = 20_000;
/// How often the tracer's RSS and CPU time are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(30);

pub fn soak(root: &Path, duration_s: u64) -> Result<()> {
    let tracer = root.join("target/release/tracer");
    let mut fixture = FixtureProcess::start(&root.join("target/fixtures/leaky"), true)?;
    let json = std::env::temp_dir().join(format!("tracer-soak-{}.json", std::process::id()));
    let mut command = Command::new(&tracer);
    command
        .args(["record", "--pid", &fixture.pid.to_string(), "--json"])
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut tracer_process = KillOnDrop(command.spawn().context("could not start the tracer")?);
    let tracer_pid = tracer_process.0.id();
    thread::sleep(Duration::from_secs(3));
    let soak_line = format!("soak {duration_s} {PAIRS_PER_S}");
    // The fixture answers when the soak is over; sample meanwhile.
    let sampler = thread::spawn(move || sample(tracer_pid, duration_s));
    let answer = fixture.command(&soak_line)?;
    let samples = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("the sampler panicked"))?;
    // SAFETY: signals our own child.
    unsafe { libc::kill(tracer_pid as i32, libc::SIGINT) };
    let status = tracer_process
        .0
        .wait()
        .context("could not wait for the tracer")?;
    if !status.success() {
        bail!("the tracer failed: {status}");
    }
    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&json).with_context(|| format!("could not read {}", json.display()))?,
    )?;
    let _ = std::fs::remove_file(&json);
    fixture.quit()?;

    println!(
        "tracer soak: {duration_s} s, {PAIRS_PER_S} malloc/free pairs/s, one 1337 B leak per 100 ms"
    );
    println!();
    println!("| elapsed | tracer RSS | tracer CPU (% of one core, since the last sample) |");
    println!("|---:|---:|---:|");
    for sample in &samples {
        println!(
            "| {:.0} s | {:.1} MiB | {:.2} % |",
            sample.elapsed_s, sample.rss_mib, sample.cpu_percent
        );
    }
    let truth = answer
        .split_whitespace()
        .find_map(|field| field.strip_prefix("bytes="))
        .and_then(|bytes| bytes.parse::<i64>().ok())
        .context("the fixture did not say what it leaked")?;
    let traced: i64 = report["stacks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|stack| {
            stack["frames"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|frame| {
                    frame["function"]
                        .as_str()
                        .is_some_and(|f| f.contains("leak_here"))
                })
        })
        .filter_map(|stack| stack["live_bytes"].as_i64())
        .sum();
    println!();
    println!("leak_here: fixture leaked {truth} B, tracer reports {traced} B");
    let drops = &report["drops"];
    println!("drops: {drops}");
    if traced != truth {
        bail!("the report is not exact after the soak: {traced} B traced, {truth} B leaked");
    }
    let first = samples.first().map_or(0.0, |s| s.rss_mib);
    let last = samples.last().map_or(0.0, |s| s.rss_mib);
    println!("tracer RSS: {first:.1} MiB after 30 s, {last:.1} MiB at the end");
    Ok(())
}

struct Sample {
    elapsed_s: f64,
    rss_mib: f64,
    cpu_percent: f64,
}

/// RSS and CPU share of `pid` every SAMPLE_EVERY for `duration_s`.
fn sample(pid: u32, duration_s: u64) -> Vec<Sample> {
    let started = Instant::now();
    let ticks_per_s = 100.0;
    let mut last_cpu_ticks = cpu_ticks(pid).unwrap_or(0);
    let mut last_at = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(duration_s) {
        thread::sleep(SAMPLE_EVERY.min(Duration::from_secs(duration_s)));
        let (Some(rss_kib), Some(ticks)) = (rss_kib(pid), cpu_ticks(pid)) else {
            break;
        };
        let interval_s = last_at.elapsed().as_secs_f64();
        samples.push(Sample {
            elapsed_s: started.elapsed().as_secs_f64(),
            rss_mib: rss_kib as f64 / 1024.0,
            cpu_percent: (ticks - last_cpu_ticks) as f64 / ticks_per_s / interval_s * 100.0,
        });
        last_cpu_ticks = ticks;
        last_at = Instant::now();
    }
    samples
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}
