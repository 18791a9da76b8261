//! `cargo xtask bench`: what tracer costs the process it traces, side by
//! side with what any uprobe tool would pay, in one run.
//!
//! The workloads are tests/fixtures/bench.c (2 threads of malloc/free pairs
//! of random sizes 16..4096 B, and a calloc/realloc/posix_memalign mix).
//! Each runs without tracer, under `tracer record` in exact and sampling
//! mode, and under the floors: empty eBPF programs (`tracer floor`) at the
//! function entries (where every other uprobe tool probes: the *naive
//! floor*), at the sites tracer chooses (*site floor*), and at those sites
//! without return probes (*site entry floor*: what a sampled call that
//! skips its return can cost at least). The runs alternate, each in a fresh
//! fixture process; the table shows medians. The same workloads built
//! without frame pointers (`bench_nofp`) run without tracer, with the
//! default `--unwind auto` (the kernel walks them through unwind tables)
//! and with `--unwind copy` (a stack copy per block, unwound in
//! userspace): what each adds is compared with what frame-pointer stacks
//! add to the frame-pointer build. Then tracer's own CPU time and
//! peak RSS while the fixture allocates at fixed rates.
//!
//! `--short` (CI, also run at the end of `cargo xtask test`) fails when
//! exact mode is slower than the naive floor or when malloc's or free's
//! probe is single-stepped. Both add a Python row (`bench_python`): a
//! Python program's allocations with and without Python frames and with
//! `--python-objects`, and a torch section (`bench_torch`): tracer on
//! Debian's python3-torch building models. The full run adds Debian's
//! redis-server and the other allocators Debian ships (`bench_real`).
//! Both end with the attach section (`bench_attach`): start to
//! "attached" and exit after SIGINT on a small C program, Python and
//! Python with torch.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::fixture_process::{FixtureProcess, KillOnDrop};
use crate::shell::is_root;

const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
const THREADS: u32 = 2;
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
}

const MODES: [Mode; 9] = [
    Mode::Baseline,
    Mode::Exact,
    Mode::Sampled,
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
        }
    }

    /// Arguments of the tracer for a target PID; None: no tracer.
    fn tracer_args(self, pid: u32, json: &Path) -> Option<Vec<String>> {
        let pid = pid.to_string();
        let record = |extra: &[&str]| {
            let mut args: Vec<String> = ["record", "--pid", &pid, "--json"]
                .map(str::to_owned)
                .to_vec();
            args.push(json.display().to_string());
            args.extend(extra.iter().map(|arg| (*arg).to_owned()));
            args
        };
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
        }
    }

    /// Pairs per thread: enough for a stable time, few where each pair
    /// traps (the naive floor single-steps free).
    fn pairs_per_thread(self, short: bool) -> u64 {
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
    fn fixture(self) -> &'static str {
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

    fn name(self) -> &'static str {
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
}

/// One measured run: ns per pair, and the report of a `tracer record`.
fn measure(
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

/// tracer's CPU and peak RSS while the fixture makes `pairs_per_s`
/// malloc/free pairs per second for `seconds`.
fn measure_tracer_cpu(root: &Path, mode: Mode, pairs_per_s: u64, seconds: u64) -> Result<Value> {
    let mut fixture =
        FixtureProcess::start(&root.join("target/fixtures").join(mode.fixture()), false)?;
    let json_path =
        std::env::temp_dir().join(format!("tracer-bench-cpu-{}.json", std::process::id()));
    let mut args = mode
        .tracer_args(fixture.pid, &json_path)
        .expect("the mode runs the tracer");
    if let Some(at) = args.iter().position(|arg| arg == "--stack-ring-mib") {
        // At a fixed rate the default ring keeps up: tracer's memory as a
        // user runs it.
        args.drain(at..at + 2);
    }
    let attached = Attached::start(root, &args)?;
    let cpu_before_s = cpu_seconds(attached.pid())?;
    let started = Instant::now();
    let answer = fixture.command(&format!("rate {pairs_per_s} {seconds}"))?;
    let wall_s = started.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds(attached.pid())? - cpu_before_s;
    let peak_rss_kib = peak_rss_kib(attached.pid())?;
    attached.stop()?;
    let _ = std::fs::remove_file(&json_path);
    fixture.quit()?;
    let pairs = answer_field(&answer, "pairs")?;
    Ok(json!({
        "mode": mode.name(),
        "target_allocs_per_s": pairs_per_s,
        "achieved_allocs_per_s": (pairs / wall_s).round() as u64,
        "tracer_cpu_percent_of_one_core": 100.0 * cpu_s / wall_s,
        "tracer_peak_rss_kib": peak_rss_kib,
    }))
}

/// User + system CPU seconds of a process so far.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may contain spaces), from field 3.
    let after = stat.rsplit_once(')').context("odd /proc/PID/stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / ticks_per_s)
}

fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in /proc/PID/status")
}

/// The machine, for the table's heading.
pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .map(|name| name.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} x {cpu}, Linux {}", kernel.trim())
}

pub fn bench(root: &Path, short: bool) -> Result<()> {
    if !is_root() {
        bail!("the benchmark loads eBPF programs: run it as root");
    }
    let reps = if short { 3 } else { 5 };
    let workloads = [Workload::Pairs, Workload::Mixed];
    let mut samples: BTreeMap<(Workload, Mode), Vec<f64>> = BTreeMap::new();
    let mut exact_report = None;
    let mut dwarf_ring_full = 0;
    let mut auto_copies = 0;
    for rep in 0..reps {
        for workload in workloads {
            for mode in MODES {
                let (ns, report) = measure(root, mode, workload, short)?;
                eprintln!(
                    "bench: run {}/{reps} {:<30} {:<28} {ns:>10.1} ns/pair",
                    rep + 1,
                    workload.name(),
                    mode.name()
                );
                samples.entry((workload, mode)).or_default().push(ns);
                if mode == Mode::CopyNoFp
                    && let Some(report) = &report
                {
                    dwarf_ring_full += report
                        .pointer("/drops/stack_copy_ring_full")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                }
                if mode == Mode::AutoNoFp
                    && let Some(report) = &report
                {
                    auto_copies += report
                        .pointer("/events/stack_copies")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                }
                if mode == Mode::Exact && report.is_some() {
                    exact_report = report;
                }
            }
        }
    }
    let medians: BTreeMap<(Workload, Mode), f64> = samples
        .iter()
        .map(|(key, values)| (*key, median(values)))
        .collect();
    let rates: &[(Mode, u64, u64)] = if short {
        &[
            (Mode::Exact, 100_000, 1),
            (Mode::AutoNoFp, 100_000, 1),
            (Mode::CopyNoFp, 10_000, 1),
        ]
    } else {
        &[
            (Mode::Exact, 10_000, 5),
            (Mode::Exact, 100_000, 5),
            (Mode::Exact, 1_000_000, 5),
            (Mode::AutoNoFp, 100_000, 5),
            (Mode::AutoNoFp, 1_000_000, 5),
            (Mode::CopyNoFp, 2_000, 5),
            (Mode::CopyNoFp, 10_000, 5),
        ]
    };
    let cpu: Vec<Value> = rates
        .iter()
        .map(|&(mode, rate, seconds)| measure_tracer_cpu(root, mode, rate, seconds))
        .collect::<Result<_>>()?;
    let probes = exact_report
        .as_ref()
        .and_then(|report| report.get("probes"))
        .cloned()
        .unwrap_or(Value::Null);

    let mut table = render_table(&medians, &cpu, reps, short);
    let python = crate::bench_python::bench_python(root, short)?;
    table.push_str(&python.table);
    let torch = crate::bench_torch::bench_torch(root, short)?;
    table.push_str(&torch.table);
    let attach = crate::bench_attach::bench_attach(root, reps)?;
    table.push_str(&attach.table);
    let real = if short {
        Value::Null
    } else {
        let real = crate::bench_real::bench_real(root, reps)?;
        table.push_str(&real.table);
        real.json
    };
    print!("{table}");
    let mut checks = checks(&medians, &probes);
    checks.push((
        "every copy-mode copy was unwound".to_owned(),
        dwarf_ring_full == 0,
        format!("{dwarf_ring_full} copies fell back to frame pointers (ring full)"),
    ));
    checks.push((
        "auto walks code without frame pointers in the kernel".to_owned(),
        auto_copies == 0,
        format!("{auto_copies} stacks copied"),
    ));
    let mut results = Vec::new();
    for ((workload, mode), median_ns) in &medians {
        results.push(json!({
            "workload": workload.name(),
            "mode": mode.name(),
            "ns_per_pair_median": median_ns,
            "ns_per_pair_runs": samples[&(*workload, *mode)],
            "pairs_per_thread": mode.pairs_per_thread(short),
        }));
    }
    let document = json!({
        "date": date(),
        "machine": machine(),
        "short": short,
        "threads": THREADS,
        "runs_per_mode": reps,
        "attach": attach.json,
        "results": results,
        "tracer_cpu": cpu,
        "python": python.json,
        "torch": torch.json,
        "real_allocators_and_redis": real,
        "probes": probes,
        "checks": checks.iter().map(|(name, passed, detail)| json!({"name": name, "passed": passed, "detail": detail})).collect::<Vec<_>>(),
        "table": table,
    });
    let path = bench_json_path(root, short);
    std::fs::create_dir_all(path.parent().expect("a directory"))?;
    std::fs::write(&path, serde_json::to_string_pretty(&document)? + "\n")
        .with_context(|| format!("could not write {}", path.display()))?;
    eprintln!("bench: wrote {}", path.display());
    for (name, passed, detail) in &checks {
        eprintln!(
            "bench: {} {name}: {detail}",
            if *passed { "ok  " } else { "FAIL" }
        );
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|(_, passed, _)| !passed)
        .map(|(name, _, _)| name.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("benchmark checks failed: {}", failed.join(", "));
    }
    Ok(())
}

fn bench_json_path(root: &Path, short: bool) -> PathBuf {
    root.join("target/bench").join(if short {
        "bench-short.json"
    } else {
        "bench.json"
    })
}

pub(crate) fn date() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .map_or_else(String::new, |date| date.trim().to_owned())
}

/// What CI fails on: (name, passed, detail).
fn checks(
    medians: &BTreeMap<(Workload, Mode), f64>,
    probes: &Value,
) -> Vec<(String, bool, String)> {
    let mut checks = Vec::new();
    for workload in [Workload::Pairs, Workload::Mixed] {
        let exact = medians[&(workload, Mode::Exact)];
        let naive = medians[&(workload, Mode::NaiveFloor)];
        checks.push((
            format!("exact mode beats the naive floor ({})", workload.name()),
            exact < naive,
            format!("{exact:.0} ns/pair vs {naive:.0} ns/pair"),
        ));
    }
    for function in ["malloc", "free"] {
        let probe = probes.as_array().and_then(|probes| {
            probes
                .iter()
                .find(|probe| probe.get("symbol").and_then(Value::as_str) == Some(function))
        });
        let (passed, detail) = match probe {
            Some(probe) => (
                probe.get("single_stepped") == Some(&Value::Bool(false)),
                probe
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_owned(),
            ),
            None => (false, "no probe in the report".to_owned()),
        };
        checks.push((
            format!("{function} is probed at an emulated site"),
            passed,
            detail,
        ));
    }
    checks
}

/// The run without tracer a mode is compared with: the same build.
fn baseline_of(mode: Mode) -> Mode {
    match mode.fixture() {
        "bench_nofp" => Mode::BaselineNoFp,
        _ => Mode::Baseline,
    }
}

/// What a mode adds per pair to the run without tracer of its build.
fn added_ns(medians: &BTreeMap<(Workload, Mode), f64>, workload: Workload, mode: Mode) -> f64 {
    medians[&(workload, mode)] - medians[&(workload, baseline_of(mode))]
}

fn render_table(
    medians: &BTreeMap<(Workload, Mode), f64>,
    cpu: &[Value],
    reps: usize,
    short: bool,
) -> String {
    let mut out = format!(
        "tracer benchmark{}, {} on {}: {THREADS} threads, median of {reps} alternating runs\n\n",
        if short { " (short)" } else { "" },
        date(),
        machine()
    );
    out.push_str("| workload | mode | ns/pair | added ns | x no tracer | added / naive floor's | added / site floor's | added / site entry floor's |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|\n");
    for workload in [Workload::Pairs, Workload::Mixed] {
        let added = |mode: Mode| added_ns(medians, workload, mode);
        for mode in MODES {
            let base = medians[&(workload, baseline_of(mode))];
            let ns = medians[&(workload, mode)];
            let ratio = |floor: Mode| {
                if mode == baseline_of(mode) {
                    "".to_owned()
                } else {
                    format!("{:.2}", added(mode) / added(floor))
                }
            };
            out.push_str(&format!(
                "| {} | {} | {ns:.0} | {:.0} | {:.1} | {} | {} | {} |\n",
                workload.name(),
                mode.name(),
                added(mode),
                ns / base,
                ratio(Mode::NaiveFloor),
                ratio(Mode::SiteFloor),
                ratio(Mode::SiteEntryFloor),
            ));
        }
    }
    for workload in [Workload::Pairs, Workload::Mixed] {
        let added = |mode: Mode| added_ns(medians, workload, mode);
        out.push_str(&format!(
            "\n{}: on code without frame pointers, auto (the kernel's walk through unwind \
             tables) adds {:.0} ns per call pair, {:.2}x what frame pointers add on code with \
             them; --unwind copy adds {:.0} ns, {:.2}x",
            workload.name(),
            added(Mode::AutoNoFp),
            added(Mode::AutoNoFp) / added(Mode::Exact),
            added(Mode::CopyNoFp),
            added(Mode::CopyNoFp) / added(Mode::Exact),
        ));
    }
    out.push('\n');
    out.push_str(
        "\n| mode | allocs/s asked | allocs/s done | tracer CPU (% of one core) | tracer peak RSS |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|\n");
    for row in cpu {
        out.push_str(&format!(
            "| {} | {} | {} | {:.2} | {} MiB |\n",
            row["mode"].as_str().unwrap_or("?"),
            row["target_allocs_per_s"],
            row["achieved_allocs_per_s"],
            row["tracer_cpu_percent_of_one_core"]
                .as_f64()
                .unwrap_or(f64::NAN),
            row["tracer_peak_rss_kib"].as_u64().unwrap_or(0) / 1024,
        ));
    }
    out
}
