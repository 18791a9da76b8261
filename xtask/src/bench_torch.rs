//! The torch section of `cargo xtask bench`: tracer on a real ML workload,
//! Debian's python3-torch 1.13 on CPU (tests/fixtures/python/torch_models.py:
//! each model built, traced with torch.fx, run and saved, its parameters
//! and their numpy copies held). Each run is a fresh interpreter that
//! builds one model first (torch loaded, as a service would be), then the
//! measured models, bare or with `tracer record` attached at its default
//! options. Reported: seconds per model, tracer's CPU (share of one core
//! while the models are built), its peak RSS (VmHWM, the mapped rings
//! counted twice: README "tracer's own memory"), drops, truncated Python
//! stacks, and the time tracer adds per recorded allocation. Medians of
//! alternating runs.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::bench_runs::{Attached, median};
use crate::fixture_process::FixtureProcess;

const PYTHON: &str = "/usr/bin/python3";
const TORCH: &str = "/usr/lib/python3/dist-packages/torch/__init__.py";

/// One traced or bare run.
struct Run {
    seconds_per_model: f64,
    traced: Option<Traced>,
}

/// What tracer cost in one run.
struct Traced {
    cpu_share: f64,
    peak_rss_bytes: u64,
    allocs: u64,
    drops: u64,
    python_truncated: u64,
}

/// The torch section: its table (markdown) and its JSON.
pub(crate) struct TorchRow {
    pub table: String,
    pub json: Value,
}

pub(crate) fn bench_torch(root: &Path, short: bool) -> Result<TorchRow> {
    if !Path::new(TORCH).exists() {
        bail!("Debian's python3-torch is missing ({TORCH}): run `cargo xtask setup`");
    }
    let reps = if short { 1 } else { 3 };
    let models = if short { 4 } else { 12 };
    let mut bare = Vec::new();
    let mut traced = Vec::new();
    for rep in 0..reps {
        for with_tracer in [false, true] {
            let run = measure(root, models, with_tracer)?;
            eprintln!(
                "bench: run {}/{reps} torch {:<10} {:>8.3} s/model",
                rep + 1,
                if with_tracer { "tracer" } else { "no tracer" },
                run.seconds_per_model
            );
            if with_tracer {
                traced.push(run);
            } else {
                bare.push(run);
            }
        }
    }
    let seconds = |runs: &[Run]| {
        median(
            &runs
                .iter()
                .map(|run| run.seconds_per_model)
                .collect::<Vec<_>>(),
        )
    };
    let of_traced = |field: fn(&Traced) -> f64| {
        median(
            &traced
                .iter()
                .filter_map(|run| run.traced.as_ref().map(field))
                .collect::<Vec<_>>(),
        )
    };
    let (bare_s, traced_s) = (seconds(&bare), seconds(&traced));
    let allocs_per_model = of_traced(|traced| traced.allocs as f64) / models as f64;
    let added_ns_per_alloc = (traced_s - bare_s) * 1e9 / allocs_per_model.max(1.0);
    let cpu_share = of_traced(|traced| traced.cpu_share);
    let peak_rss_mib = of_traced(|traced| traced.peak_rss_bytes as f64) / f64::from(1 << 20);
    let drops = of_traced(|traced| traced.drops as f64);
    let truncated = of_traced(|traced| traced.python_truncated as f64);
    let table = format!(
        "\ntorch: Debian's python3-torch 1.13 (CPU), {models} models built, fx-traced, run and \
         saved per run after one before attach (tests/fixtures/python/torch_models.py), tracer \
         at default options, median of {reps} alternating runs\n\n\
         | s/model bare | s/model traced | x bare | allocations/model | added ns/alloc | tracer CPU (share of a core) | tracer peak RSS (VmHWM) | dropped | Python stacks truncated |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n\
         | {bare_s:.3} | {traced_s:.3} | {:.2} | {allocs_per_model:.0} | {added_ns_per_alloc:.0} | {:.0} % | {peak_rss_mib:.0} MiB | {drops:.0} | {truncated:.0} |\n",
        traced_s / bare_s,
        cpu_share * 100.0,
    );
    Ok(TorchRow {
        table,
        json: json!({
            "workload": "tests/fixtures/python/torch_models.py on Debian's python3-torch 1.13",
            "models_per_run": models,
            "runs_per_mode": reps,
            "seconds_per_model_bare": bare_s,
            "seconds_per_model_traced": traced_s,
            "allocations_per_model": allocs_per_model,
            "added_ns_per_alloc": added_ns_per_alloc,
            "tracer_cpu_share_of_a_core": cpu_share,
            "tracer_peak_rss_bytes": peak_rss_mib * f64::from(1 << 20),
            "dropped": drops,
            "python_stacks_truncated": truncated,
        }),
    })
}

fn measure(root: &Path, models: u32, with_tracer: bool) -> Result<Run> {
    let script = root.join("tests/fixtures/python/torch_models.py");
    let mut fixture =
        FixtureProcess::start_with_args(Path::new(PYTHON), &[script.as_path()], false, &[])?;
    fixture.command("build 1")?;
    let json_path =
        std::env::temp_dir().join(format!("tracer-bench-torch-{}.json", std::process::id()));
    let attached = if with_tracer {
        let args = [
            "record".to_owned(),
            "--pid".to_owned(),
            fixture.pid.to_string(),
            "--json".to_owned(),
            json_path.display().to_string(),
        ];
        Some(Attached::start(root, &args)?)
    } else {
        None
    };
    let cpu_before = attached
        .as_ref()
        .map(|tracer| cpu_ticks(tracer.pid()))
        .transpose()?;
    let started = Instant::now();
    fixture.command(&format!("build {models}"))?;
    let elapsed_s = started.elapsed().as_secs_f64();
    let traced = match attached {
        Some(tracer) => {
            let cpu_s =
                (cpu_ticks(tracer.pid())? - cpu_before.unwrap_or(0)) as f64 / clock_ticks_per_s();
            let peak_rss_bytes = peak_rss_bytes(tracer.pid())?;
            tracer.stop()?;
            let text = std::fs::read_to_string(&json_path)
                .with_context(|| format!("could not read {}", json_path.display()))?;
            let _ = std::fs::remove_file(&json_path);
            let report: Value = serde_json::from_str(&text).context("the tracer's JSON")?;
            let event = |name: &str| {
                report
                    .pointer(&format!("/events/{name}"))
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
            };
            let drops = report["drops"]
                .as_object()
                .map_or(0, |drops| drops.values().filter_map(Value::as_u64).sum());
            Some(Traced {
                cpu_share: cpu_s / elapsed_s,
                peak_rss_bytes,
                allocs: event("allocs"),
                drops,
                python_truncated: event("python_stacks_truncated"),
            })
        }
        None => None,
    };
    fixture.quit()?;
    Ok(Run {
        seconds_per_model: elapsed_s / f64::from(models),
        traced,
    })
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
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

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// VmHWM of `pid`, in bytes.
fn peak_rss_bytes(pid: u32) -> Result<u64> {
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
