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

/// Seconds each life of the restarting target soaks before it is killed.
const LIFE_S: u64 = 10;

/// `cargo xtask soak --restarting`: tracer as a daemon (`--comm`,
/// `--listen`, no `--duration`) on a service that is killed and started
/// again every LIFE_S seconds, with a scrape of /metrics every second and
/// of /debug/pprof/heap every 10 s. Checks every life's leak in /metrics
/// against the fixture's count, samples tracer's RSS, CPU and open file
/// descriptors, and ends it with SIGTERM.
pub fn soak_restarting(root: &Path, duration_s: u64) -> Result<()> {
    use std::io::{BufRead as _, BufReader};
    let directory = std::env::temp_dir().join(format!("tracer-soak-rst-{}", std::process::id()));
    std::fs::create_dir_all(&directory)?;
    let name = "soakrestart";
    let service = directory.join(name);
    std::fs::copy(root.join("target/fixtures/leaky"), &service)?;
    let mut command = Command::new(root.join("target/release/tracer"));
    command
        .args([
            "record",
            "--comm",
            name,
            "--listen",
            "127.0.0.1:0",
            "--top",
            "10",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut tracer_process = KillOnDrop(command.spawn().context("could not start the tracer")?);
    let tracer_pid = tracer_process.0.id();
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stderr = tracer_process.0.stderr.take().context("tracer stderr")?;
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let wait_line = |needle: &str| -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(line) = lines.recv_timeout(Duration::from_secs(1))
                && line.contains(needle)
            {
                return Ok(line);
            }
        }
        bail!("the tracer did not print {needle:?}")
    };
    let serving = wait_line("tracer: serving")?;
    let address = serving
        .rsplit("http://")
        .next()
        .context("no address")?
        .to_owned();
    wait_line("tracer: attached")?;

    let scraping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let scraper = {
        let (address, scraping) = (address.clone(), std::sync::Arc::clone(&scraping));
        thread::spawn(move || {
            let mut failures = 0u64;
            let mut scrapes = 0u64;
            while scraping.load(std::sync::atomic::Ordering::Relaxed) {
                let path = if scrapes % 10 == 9 {
                    "/debug/pprof/heap"
                } else {
                    "/metrics"
                };
                if http_get(&address, path).is_err() {
                    failures += 1;
                }
                scrapes += 1;
                thread::sleep(Duration::from_secs(1));
            }
            (scrapes, failures)
        })
    };
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut last_ticks = cpu_ticks(tracer_pid).unwrap_or(0);
    let mut last_at = Instant::now();
    let mut lives = 0;
    let mut exact = 0;
    let mut mismatches = Vec::new();
    while started.elapsed() < Duration::from_secs(duration_s) {
        let mut fixture = FixtureProcess::start(&service, false)?;
        wait_line(&format!("tracing PID {}", fixture.pid))?;
        let answer = fixture.command(&format!("soak {LIFE_S} {PAIRS_PER_S}"))?;
        let leaked: i64 = answer
            .split_whitespace()
            .find_map(|field| field.strip_prefix("bytes="))
            .and_then(|bytes| bytes.parse().ok())
            .context("the fixture did not say what it leaked")?;
        thread::sleep(Duration::from_millis(1500));
        let metrics = http_get(&address, "/metrics")?;
        let served: i64 = metrics
            .lines()
            .filter(|line| {
                line.starts_with("tracer_stack_live_bytes{")
                    && line.contains(&format!("pid=\"{}\"", fixture.pid))
                    && line.contains("site=\"leak_here")
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<i64>().ok())
            .sum();
        lives += 1;
        if served == leaked {
            exact += 1;
        } else {
            mismatches.push((fixture.pid, leaked, served));
        }
        drop(fixture); // killed: the service crashes and comes back
        if last_at.elapsed() >= SAMPLE_EVERY || samples.is_empty() {
            let ticks = cpu_ticks(tracer_pid).context("the tracer exited")?;
            samples.push((
                started.elapsed().as_secs_f64(),
                rss_kib(tracer_pid).unwrap_or(0) as f64 / 1024.0,
                (ticks - last_ticks) as f64 / 100.0 / last_at.elapsed().as_secs_f64() * 100.0,
                std::fs::read_dir(format!("/proc/{tracer_pid}/fd"))
                    .map(|entries| entries.count())
                    .unwrap_or(0),
            ));
            last_ticks = ticks;
            last_at = Instant::now();
        }
    }
    scraping.store(false, std::sync::atomic::Ordering::Relaxed);
    let (scrapes, failures) = scraper
        .join()
        .map_err(|_| anyhow::anyhow!("the scraper panicked"))?;
    // SAFETY: signals our own child.
    unsafe { libc::kill(tracer_pid as i32, libc::SIGTERM) };
    let status = tracer_process.0.wait()?;
    let _ = std::fs::remove_dir_all(&directory);

    println!(
        "tracer soak, restarting target: {duration_s} s, a life every {LIFE_S} s \
         ({PAIRS_PER_S} malloc/free pairs/s, one 1337 B leak per 100 ms), \
         /metrics every 1 s, /debug/pprof/heap every 10 s"
    );
    println!();
    println!("| elapsed | tracer RSS | tracer CPU (% of one core) | open fds |");
    println!("|---:|---:|---:|---:|");
    for (elapsed_s, rss_mib, cpu, fds) in &samples {
        println!("| {elapsed_s:.0} s | {rss_mib:.1} MiB | {cpu:.2} % | {fds} |");
    }
    println!();
    println!(
        "lives: {lives}, leak exact in /metrics: {exact}; mismatches (pid, leaked, served): {mismatches:?}"
    );
    println!("scrapes: {scrapes}, failed: {failures}; tracer exit on SIGTERM: {status}");
    if !status.success() || exact != lives || failures > 0 {
        bail!("the restarting soak failed");
    }
    Ok(())
}

/// GET `path` from `address`; the body.
fn http_get(address: &str, path: &str) -> Result<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response).into_owned();
    if !text.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", text.lines().next().unwrap_or(""));
    }
    Ok(text
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_owned())
}
