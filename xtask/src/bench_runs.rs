//! The measured runs every bench section shares: how a run is traced
//! (`Mode`), the C workloads (`Workload`), a tracer attached to a fixture
//! (`Attached`), one timed run (`measure`) and the median of several.
//! The sections (`bench`, `bench_python`, `bench_real`, `bench_torch`,
//! `bench_ml`, `bench_attach`) use it and not each other.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::fixture_process::{FixtureProcess, KillOnDrop};

const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
pub(crate) const THREADS: u32 = 2;
/// `--sample-bytes` of the sampling mode (the target setting).
const SAMPLE_BYTES: u64 = 524_288;

/// How a measurement run is traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Mode {
    Baseline,
    Exact,
    Sampled,
    /// The workloads built without frame pointers, without tracer.
    BaselineNoFp,
    /// The same under the default `--unwind auto`: the kernel walks them
    /// through unwind tables.
    AutoNoFp,
    /// The same with every stack copied and unwound in userspace
    /// (`--unwind copy`).
    CopyNoFp,
    /// Frame pointers whatever the target maps (`--unwind fp`): what the
    /// probes cost with an allocator library that has none (`bench_real`).
    FramePointers,
    NaiveFloor,
    SiteFloor,
    SiteEntryFloor,
    /// `--resident`: page faults, no allocator probe.
    Resident,
}

pub(crate) const MODES: [Mode; 10] = [
    Mode::Baseline,
    Mode::Exact,
    Mode::Sampled,
    Mode::Resident,
    Mode::BaselineNoFp,
    Mode::AutoNoFp,
    Mode::CopyNoFp,
    Mode::NaiveFloor,
    Mode::SiteFloor,
    Mode::SiteEntryFloor,
];

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Baseline => "no tracer",
            Mode::Exact => "tracer exact",
            Mode::Sampled => "tracer --sample-bytes 524288",
            Mode::BaselineNoFp => "no tracer, no frame pointers",
            Mode::AutoNoFp => "tracer (auto), no frame pointers",
            Mode::CopyNoFp => "tracer --unwind copy, no frame pointers",
            Mode::FramePointers => "tracer --unwind fp",
            Mode::NaiveFloor => "naive floor (entries)",
            Mode::SiteFloor => "site floor",
            Mode::SiteEntryFloor => "site floor, entry only",
            Mode::Resident => "tracer --resident",
        }
    }

    /// Arguments of the tracer for a target PID; None: no tracer.
    pub(crate) fn tracer_args(self, pid: u32, json: &Path) -> Option<Vec<String>> {
        let pid = pid.to_string();
        let record = |extra: &[&str]| record_args(&pid, json, extra);
        let floor = |sites: &str, extra: &[&str]| {
            let mut args: Vec<String> = ["floor", "--pid", &pid, "--sites", sites]
                .map(str::to_owned)
                .to_vec();
            args.extend(extra.iter().map(|arg| (*arg).to_owned()));
            args
        };
        match self {
            Mode::Baseline | Mode::BaselineNoFp => None,
            Mode::Exact | Mode::AutoNoFp => Some(record(&[])),
            Mode::Sampled => Some(record(&["--sample-bytes", &SAMPLE_BYTES.to_string()])),
            // A ring that holds every copy of the run: each one is unwound,
            // none falls back to frame pointers (checked).
            Mode::CopyNoFp => Some(record(&["--unwind", "copy", "--stack-ring-mib", "256"])),
            Mode::FramePointers => Some(record(&["--unwind", "fp"])),
            Mode::NaiveFloor => Some(floor("entry", &[])),
            Mode::SiteFloor => Some(floor("chosen", &[])),
            Mode::SiteEntryFloor => Some(floor("chosen", &["--entry-only"])),
            Mode::Resident => Some(record(&["--resident"])),
        }
    }

    /// Pairs per thread: enough for a stable time, few where each pair
    /// traps (the naive floor single-steps free).
    pub(crate) fn pairs_per_thread(self, short: bool) -> u64 {
        let full = match self {
            Mode::Baseline | Mode::BaselineNoFp => 1_000_000,
            Mode::NaiveFloor => 20_000,
            // 16 KiB copied per block: 2 x 5 000 fit the ring.
            Mode::CopyNoFp => 5_000,
            _ => 100_000,
        };
        if short { full / 5 } else { full }
    }

    /// The fixture the mode runs.
    pub(crate) fn fixture(self) -> &'static str {
        match self {
            Mode::BaselineNoFp | Mode::AutoNoFp | Mode::CopyNoFp => "bench_nofp",
            _ => "bench",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Workload {
    Pairs,
    Mixed,
}

impl Workload {
    fn command(self, pairs_per_thread: u64) -> String {
        match self {
            Workload::Pairs => format!("pairs {THREADS} {pairs_per_thread}"),
            // Two blocks per round.
            Workload::Mixed => format!("mixed {THREADS} {}", pairs_per_thread / 2),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Pairs => "malloc/free",
            Workload::Mixed => "calloc/realloc/posix_memalign",
        }
    }
}

/// A tracer (or floor) attached to a fixture.
pub(crate) struct Attached {
    child: KillOnDrop,
}

impl Attached {
    pub(crate) fn start(root: &Path, args: &[String]) -> Result<Self> {
        let mut child = Command::new(root.join("target/release/tracer"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("could not start target/release/tracer")?;
        let stderr = child.stderr.take().context("tracer stderr")?;
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let reader_lines = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                reader_lines.lock().expect("stderr lock").push(line);
            }
        });
        let mut attached = Attached {
            child: KillOnDrop(child),
        };
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        loop {
            if lines
                .lock()
                .expect("stderr lock")
                .iter()
                .any(|l| l.starts_with("tracer: attached"))
            {
                return Ok(attached);
            }
            if attached.child.0.try_wait()?.is_some() || Instant::now() > deadline {
                bail!(
                    "`tracer {}` did not attach:\n{}",
                    args.join(" "),
                    lines.lock().expect("stderr lock").join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// SIGINT, then wait: the tracer writes its report.
    pub(crate) fn stop(mut self) -> Result<()> {
        // SAFETY: signals our own child, which has not been reaped.
        unsafe { libc::kill(self.pid() as i32, libc::SIGINT) };
        let status = self
            .child
            .0
            .wait()
            .context("could not wait for the tracer")?;
        if !status.success() {
            bail!("the tracer failed: {status}");
        }
        Ok(())
    }

    /// SIGINT, then wait4: the tracer writes its report; returns its peak
    /// RSS (ru_maxrss, KiB), which covers what it did after the signal.
    pub(crate) fn stop_peak_rss_kib(self) -> Result<u64> {
        let pid = self.pid() as i32;
        // SAFETY: signals our own child, which has not been reaped.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value to be overwritten.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waits for our own child; both pointers are valid.
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        // Reaped here: there is nothing left for KillOnDrop to kill.
        std::mem::forget(self);
        if reaped != pid {
            bail!(
                "could not wait for the tracer: {}",
                std::io::Error::last_os_error()
            );
        }
        if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            bail!("the tracer failed: wait status {status}");
        }
        Ok(usage.ru_maxrss as u64)
    }
}

/// One measured run: ns per pair, and the report of a `tracer record`.
pub(crate) fn measure(
    root: &Path,
    mode: Mode,
    workload: Workload,
    short: bool,
) -> Result<(f64, Option<Value>)> {
    measure_preloaded(root, mode, workload, short, None)
}

/// [`measure`] with an allocator library in the fixture's `LD_PRELOAD`.
pub(crate) fn measure_preloaded(
    root: &Path,
    mode: Mode,
    workload: Workload,
    short: bool,
    preload: Option<&str>,
) -> Result<(f64, Option<Value>)> {
    let env: Vec<(&str, &str)> = preload
        .map(|library| ("LD_PRELOAD", library))
        .into_iter()
        .collect();
    let fixture_path = root.join("target/fixtures").join(mode.fixture());
    let mut fixture = FixtureProcess::start_with_env(&fixture_path, false, &env)?;
    let json_path = std::env::temp_dir().join(format!("tracer-bench-{}.json", std::process::id()));
    let attached = match mode.tracer_args(fixture.pid, &json_path) {
        Some(args) => Some(Attached::start(root, &args)?),
        None => None,
    };
    let answer = fixture.command(&workload.command(mode.pairs_per_thread(short)))?;
    let ns_per_pair = answer_field(&answer, "ns_per_pair")?;
    let mut report = None;
    if let Some(attached) = attached {
        attached.stop()?;
        if matches!(
            mode,
            Mode::Exact | Mode::Sampled | Mode::AutoNoFp | Mode::CopyNoFp
        ) {
            let text = std::fs::read_to_string(&json_path)
                .with_context(|| format!("could not read {}", json_path.display()))?;
            let _ = std::fs::remove_file(&json_path);
            report = Some(serde_json::from_str(&text).context("the tracer's JSON")?);
        }
    }
    fixture.quit()?;
    Ok((ns_per_pair, report))
}

pub(crate) fn answer_field(answer: &str, key: &str) -> Result<f64> {
    answer
        .split_whitespace()
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
        .with_context(|| format!("no `{key}=` in {answer:?}"))
}

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    }
}

/// `tracer record --pid PID --json JSON EXTRA...`: the arguments of a
/// traced run of the benchmarks.
pub(crate) fn record_args(pid: &str, json: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["record", "--pid", pid, "--json"]
        .map(str::to_owned)
        .to_vec();
    args.push(json.display().to_string());
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    args
}

/// utime + stime of `pid`, in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("could not read /proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |index: usize| -> Result<u64> {
        fields
            .get(index)
            .and_then(|value| value.parse().ok())
            .with_context(|| format!("no field {index} in /proc/{pid}/stat"))
    };
    // utime and stime: fields 14 and 15 of proc_pid_stat(5), the first
    // after the name being field 3.
    Ok(field(11)? + field(12)?)
}

pub(crate) fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// VmHWM of `pid`, in bytes.
pub(crate) fn peak_rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("could not read /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<u64>().ok())
        .map(|kib| kib << 10)
        .with_context(|| format!("no VmHWM in /proc/{pid}/status"))
}

/// `kernel.bpf_stats_enabled`: each program's run time and count.
pub(crate) fn set_bpf_stats(on: bool) -> Result<()> {
    std::fs::write(
        "/proc/sys/kernel/bpf_stats_enabled",
        if on { "1\n" } else { "0\n" },
    )
    .context("could not write /proc/sys/kernel/bpf_stats_enabled")
}

/// (name, runs, ns per run) of every eBPF program that ran, from bpftool.
pub(crate) fn program_stats() -> Result<Vec<(String, u64, f64)>> {
    let output = std::process::Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()
        .context("could not run bpftool (cargo xtask setup installs it)")?;
    if !output.status.success() {
        bail!("bpftool prog show failed: {}", output.status);
    }
    let programs: Value = serde_json::from_slice(&output.stdout).context("bpftool's JSON")?;
    let mut stats: Vec<(String, u64, f64)> = programs
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|program| {
            let runs = program.get("run_cnt")?.as_u64()?;
            let ns = program.get("run_time_ns")?.as_u64()?;
            let name = program.get("name")?.as_str()?.to_owned();
            (runs > 0).then(|| (name, runs, ns as f64 / runs as f64))
        })
        .collect();
    stats.sort_by(|a, b| (b.1 as f64 * b.2).total_cmp(&(a.1 as f64 * a.2)));
    Ok(stats)
}
