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

use crate::bench_runs::{
    Attached, clock_ticks_per_s, cpu_ticks, median, peak_rss_bytes, program_stats, set_bpf_stats,
};
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
    /// (eBPF program, runs, ns per run) while the models were built.
    programs: Vec<(String, u64, f64)>,
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
    // The programs of the last traced run, by their share of the run time.
    let programs = traced
        .last()
        .and_then(|run| run.traced.as_ref())
        .map(|traced| traced.programs.clone())
        .unwrap_or_default();
    let per_alloc = |name: &str| {
        programs
            .iter()
            .find(|(program, _, _)| program == name)
            .map_or(0.0, |(_, runs, ns)| {
                *runs as f64 * ns / (allocs_per_model * models as f64).max(1.0)
            })
    };
    let table = format!(
        "{table}
eBPF run time per program (last traced run, `kernel.bpf_stats_enabled`): {}; \
         per allocation: alloc_return {:.0} ns, malloc entries {:.0} ns, free {:.0} ns\n",
        programs
            .iter()
            .take(5)
            .map(|(name, runs, ns)| format!("{name} {ns:.0} ns x {runs}"))
            .collect::<Vec<_>>()
            .join(", "),
        per_alloc("alloc_return"),
        per_alloc("malloc_enter") + per_alloc("calloc_enter") + per_alloc("posix_memalign_enter"),
        per_alloc("free_enter"),
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
            "programs": programs
                .iter()
                .map(|(name, runs, ns)| json!({"program": name, "runs": runs, "ns_per_run": ns}))
                .collect::<Vec<_>>(),
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
    if attached.is_some() {
        set_bpf_stats(true)?;
    }
    let started = Instant::now();
    let built = fixture.command(&format!("build {models}"));
    let elapsed_s = started.elapsed().as_secs_f64();
    let programs = if attached.is_some() {
        let programs = program_stats();
        set_bpf_stats(false)?;
        programs?
    } else {
        Vec::new()
    };
    built?;
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
                programs,
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
