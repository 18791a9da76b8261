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
//! Python with torch, and the holders section (`bench_holders`): what
//! `record --holders` costs per GiB of target memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::bench_runs::{Attached, MODES, Mode, THREADS, Workload, answer_field, measure, median};
use crate::fixture_process::FixtureProcess;
use crate::shell::is_root;

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

/// Extra runs of exact mode and the naive floor when `--short` finds them
/// within a tenth of each other.
const CLOSE_CALL_REPS: usize = 4;

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
    if short {
        // Three runs decide the check only when the two modes are apart: on
        // a ratio within a tenth, four more alternating runs of both, and
        // the check takes the median of all seven (a fixed number, so a
        // close call is measured better, not retried until it passes).
        for workload in workloads {
            let exact = median(&samples[&(workload, Mode::Exact)]);
            let naive = median(&samples[&(workload, Mode::NaiveFloor)]);
            if exact < 0.9 * naive {
                continue;
            }
            eprintln!(
                "bench: {}: exact {exact:.0} vs naive floor {naive:.0} ns/pair is a close call: {CLOSE_CALL_REPS} more runs of each",
                workload.name()
            );
            for rep in 0..CLOSE_CALL_REPS {
                for mode in [Mode::Exact, Mode::NaiveFloor] {
                    let (ns, _) = measure(root, mode, workload, short)?;
                    eprintln!(
                        "bench: extra run {}/{CLOSE_CALL_REPS} {:<30} {:<28} {ns:>10.1} ns/pair",
                        rep + 1,
                        workload.name(),
                        mode.name()
                    );
                    samples.entry((workload, mode)).or_default().push(ns);
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
    let holders = crate::bench_holders::bench_holders(root, short)?;
    table.push_str(&holders.table);
    let exceptions = crate::bench_exceptions::bench_exceptions(root, reps)?;
    table.push_str(&exceptions.table);
    let real = if short {
        Value::Null
    } else {
        let real = crate::bench_real::bench_real(root, reps)?;
        table.push_str(&real.table);
        real.json
    };
    let ml = if short {
        None
    } else {
        crate::bench_ml::bench_ml(root, reps.min(3))?
    };
    if let Some(ml) = &ml {
        table.push_str(&ml.table);
    }
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
        "holders": holders.json,
        "exceptions": exceptions.json,
        "results": results,
        "tracer_cpu": cpu,
        "python": python.json,
        "torch": torch.json,
        "ml": ml.map(|ml| ml.json),
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

/// `cargo xtask bench --ml`: the real ML rows alone (`bench_ml`), written
/// to target/bench/bench-ml.json; BENCH_ML_REPS alternating runs of each
/// mode (3 unless set: one takes about 5 minutes here).
pub fn bench_ml_only(root: &Path) -> Result<()> {
    if !is_root() {
        bail!("the benchmark loads eBPF programs: run it as root");
    }
    let reps = std::env::var("BENCH_ML_REPS")
        .ok()
        .and_then(|reps| reps.parse().ok())
        .filter(|&reps| reps > 0)
        .unwrap_or(3);
    let Some(ml) = crate::bench_ml::bench_ml(root, reps)? else {
        bail!("no ML venv under target/ml: run `cargo xtask setup --ml` first");
    };
    print!("{}", ml.table);
    let path = root.join("target/bench/bench-ml.json");
    std::fs::create_dir_all(path.parent().expect("a directory"))?;
    let document = json!({
        "date": date(),
        "machine": machine(),
        "ml": ml.json,
        "table": ml.table,
    });
    std::fs::write(&path, serde_json::to_string_pretty(&document)? + "\n")
        .with_context(|| format!("could not write {}", path.display()))?;
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

/// `cargo xtask bench --exceptions`: the exceptions row alone
/// (`bench_exceptions`), printed.
pub fn bench_exceptions_only(root: &Path) -> Result<()> {
    if !is_root() {
        bail!("the benchmark attaches uprobes: run it as root");
    }
    let exceptions = crate::bench_exceptions::bench_exceptions(root, 5)?;
    print!("{}", exceptions.table);
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
