//! The real ML rows of `cargo xtask bench`, run when `cargo xtask setup
//! --ml` made their venvs (`venvs`), or alone with `cargo xtask bench --ml`:
//!
//! - tensorflow-cpu's load loop (tests/fixtures/python/ml/tf_load_loop.py:
//!   `tf.saved_model.load` of a 20-variable module, `del`, `gc.collect()`),
//! - the S1 export loop on PyPI torch + transformers + iree-turbine with
//!   iree-turbine issue 281's leak put back
//!   (tests/fixtures/python/ml/s1_export_loop.py --bug).
//!
//! Each run is a fresh interpreter that loads its framework first (as a
//! service would have), then runs the measured iterations bare, under
//! `tracer floor --sites chosen` (empty programs at tracer's sites: what
//! any uprobe tool pays there), under `tracer record` at default options
//! and with `--sample-bytes 524288`, alternating. Reported: seconds per
//! iteration, its ratios to bare and to what the floor adds, tracer's CPU
//! (share of one core) and peak RSS (VmHWM), allocations, the share of
//! allocator calls that ran inside another (traps paid twice), drops,
//! suspected leaks, and each eBPF program's run time per run
//! (`kernel.bpf_stats_enabled`, on for the traced runs only).

use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

use crate::bench_runs::{
    Attached, clock_ticks_per_s, cpu_ticks, median, peak_rss_bytes, program_stats, set_bpf_stats,
};
use crate::fixture_process::FixtureProcess;
use crate::venvs::{self, Venv};

/// How a run is traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Bare,
    SiteFloor,
    Default,
    Sampled,
    Resident,
}

const MODES: [Mode; 5] = [
    Mode::Bare,
    Mode::SiteFloor,
    Mode::Default,
    Mode::Sampled,
    Mode::Resident,
];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Bare => "no tracer",
            Mode::SiteFloor => "site floor (tracer floor --sites chosen)",
            Mode::Default => "tracer (default)",
            Mode::Sampled => "tracer --sample-bytes 524288",
            Mode::Resident => "tracer --resident",
        }
    }

    fn tracer_args(self, pid: u32, json: &Path) -> Option<Vec<String>> {
        let pid = pid.to_string();
        let record = |extra: &[&str]| crate::bench_runs::record_args(&pid, json, extra);
        match self {
            Mode::Bare => None,
            Mode::SiteFloor => Some(
                ["floor", "--pid", &pid, "--sites", "chosen"]
                    .map(str::to_owned)
                    .to_vec(),
            ),
            Mode::Default => Some(record(&[])),
            Mode::Sampled => Some(record(&["--sample-bytes", "524288"])),
            Mode::Resident => Some(record(&["--resident"])),
        }
    }
}

/// One workload: its venv, script and command.
struct Workload {
    name: &'static str,
    venv: &'static Venv,
    script: &'static str,
    args: &'static [&'static str],
    /// The command that runs `iterations`, answered by `... seconds=S`.
    command: &'static str,
    iterations: u32,
}

const WORKLOADS: [Workload; 2] = [
    Workload {
        name: "tensorflow-cpu 2.21 load loop",
        venv: &venvs::ML_TF,
        script: "tests/fixtures/python/ml/tf_load_loop.py",
        args: &[],
        command: "load",
        iterations: 10,
    },
    Workload {
        name: "S1 export loop (PyPI torch 2.15 + iree-turbine 3.9, leak put back)",
        venv: &venvs::ML_TORCH,
        script: "tests/fixtures/python/ml/s1_export_loop.py",
        args: &["--bug"],
        command: "export",
        iterations: 3,
    },
];

/// What one run measured.
struct Run {
    seconds_per_iteration: f64,
    traced: Option<Traced>,
}

struct Traced {
    cpu_share: f64,
    peak_rss_bytes: u64,
    report: Option<Value>,
    /// (program, runs, ns per run)
    programs: Vec<(String, u64, f64)>,
}

/// The section: its table (markdown) and its JSON; None when no venv is
/// ready.
pub(crate) struct MlRows {
    pub table: String,
    pub json: Value,
}

pub(crate) fn bench_ml(root: &Path, reps: usize) -> Result<Option<MlRows>> {
    let ready: Vec<&Workload> = WORKLOADS
        .iter()
        .filter(|workload| workload.venv.is_ready(root))
        .collect();
    if ready.is_empty() {
        eprintln!("bench: no ML venv under target/ml (`cargo xtask setup --ml`): ML rows left out");
        return Ok(None);
    }
    let mut table = String::new();
    let mut rows = Vec::new();
    for workload in ready {
        let mut runs: Vec<(Mode, Run)> = Vec::new();
        for rep in 0..reps {
            for mode in MODES {
                let run = measure(root, workload, mode)?;
                eprintln!(
                    "bench: run {}/{reps} {} {:<42} {:>8.2} s/iteration",
                    rep + 1,
                    workload.command,
                    mode.name(),
                    run.seconds_per_iteration
                );
                runs.push((mode, run));
            }
        }
        let (section, json) = render(workload, &runs, reps);
        table.push_str(&section);
        rows.push(json);
    }
    Ok(Some(MlRows {
        table,
        json: Value::Array(rows),
    }))
}

fn measure(root: &Path, workload: &Workload, mode: Mode) -> Result<Run> {
    let script = root.join(workload.script);
    let mut args = vec![script.as_path()];
    args.extend(workload.args.iter().map(Path::new));
    let mut fixture =
        FixtureProcess::start_with_args(&workload.venv.python(root), &args, false, &[])?;
    let json_path =
        std::env::temp_dir().join(format!("tracer-bench-ml-{}.json", std::process::id()));
    let attached = match mode.tracer_args(fixture.pid, &json_path) {
        Some(args) => Some(Attached::start(root, &args)?),
        None => None,
    };
    let stats = attached.is_some() && mode != Mode::SiteFloor;
    if stats {
        set_bpf_stats(true)?;
    }
    let cpu_before = attached
        .as_ref()
        .map(|tracer| cpu_ticks(tracer.pid()))
        .transpose()?;
    let started = Instant::now();
    let answer = fixture.command(&format!("{} {}", workload.command, workload.iterations));
    let elapsed_s = started.elapsed().as_secs_f64();
    let programs = if stats {
        program_stats()
    } else {
        Ok(Vec::new())
    };
    if stats {
        set_bpf_stats(false)?;
    }
    answer?;
    let traced = match attached {
        Some(tracer) => {
            let cpu_s =
                (cpu_ticks(tracer.pid())? - cpu_before.unwrap_or(0)) as f64 / clock_ticks_per_s();
            let peak_rss_bytes = peak_rss_bytes(tracer.pid())?;
            tracer.stop()?;
            let report = if mode == Mode::SiteFloor {
                None
            } else {
                let text = std::fs::read_to_string(&json_path)
                    .with_context(|| format!("could not read {}", json_path.display()))?;
                let _ = std::fs::remove_file(&json_path);
                Some(serde_json::from_str(&text).context("the tracer's JSON")?)
            };
            Some(Traced {
                cpu_share: cpu_s / elapsed_s,
                peak_rss_bytes,
                report,
                programs: programs?,
            })
        }
        None => None,
    };
    fixture.quit()?;
    Ok(Run {
        seconds_per_iteration: elapsed_s / f64::from(workload.iterations),
        traced,
    })
}

/// The first suspected leak of a report: its kind, live bytes, growth per
/// second and innermost named frames (`resident 310 MiB +20.1 MiB/s:
/// create_tensor_global < ...`).
fn first_leak_words(report: &Value) -> String {
    let Some(leak) = report["suspected_leaks"]
        .as_array()
        .and_then(|leaks| leaks.first())
    else {
        return "none".to_owned();
    };
    let mib = |bytes: f64| bytes / f64::from(1 << 20);
    let functions: Vec<&str> = leak["frames"]
        .as_array()
        .map(|frames| {
            frames
                .iter()
                .filter_map(|frame| frame["function"].as_str())
                .take(3)
                .collect()
        })
        .unwrap_or_default();
    format!(
        "{} {:.0} MiB +{:.1} MiB/s: {}",
        leak["kind"].as_str().unwrap_or("?"),
        mib(leak["live_bytes"].as_f64().unwrap_or(0.0)),
        mib(leak["growth_bytes_per_s"].as_f64().unwrap_or(0.0)),
        functions.join(" < ")
    )
}

/// The median, NaN for no values: the modes without a tracer (bare) or
/// a report (site floor) have none.
fn median_or_nan(values: &[f64]) -> f64 {
    if values.is_empty() {
        f64::NAN
    } else {
        median(values)
    }
}

fn render(workload: &Workload, runs: &[(Mode, Run)], reps: usize) -> (String, Value) {
    let of = |mode: Mode| {
        runs.iter()
            .filter(move |(m, _)| *m == mode)
            .map(|(_, run)| run)
    };
    let seconds = |mode: Mode| {
        median(
            &of(mode)
                .map(|run| run.seconds_per_iteration)
                .collect::<Vec<_>>(),
        )
    };
    let traced = |mode: Mode, field: &dyn Fn(&Traced) -> f64| {
        median_or_nan(
            &of(mode)
                .filter_map(|run| run.traced.as_ref().map(field))
                .collect::<Vec<_>>(),
        )
    };
    let event = |report: &Value, name: &str| {
        report
            .pointer(&format!("/events/{name}"))
            .and_then(Value::as_u64)
            .unwrap_or(0) as f64
    };
    let bare = seconds(Mode::Bare);
    let floor_added = seconds(Mode::SiteFloor) - bare;
    let mut out = format!(
        "\n{}: {} iterations per run after one before attach, median of {reps} alternating runs\n\n\
         | mode | s/iteration | x bare | added / site floor's | tracer CPU (share of a core) | tracer peak RSS | allocations | nested calls | page faults | dropped | suspected leaks | first suspected leak |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        workload.name, workload.iterations
    );
    let mut json_modes = Vec::new();
    for mode in MODES {
        let s = seconds(mode);
        let added = s - bare;
        let traced_row = mode != Mode::Bare;
        let reported = |field: &dyn Fn(&Value) -> f64| {
            median_or_nan(
                &of(mode)
                    .filter_map(|run| run.traced.as_ref()?.report.as_ref().map(field))
                    .collect::<Vec<_>>(),
            )
        };
        let allocs = reported(&|report| event(report, "allocs"));
        let nested = reported(&|report| event(report, "nested_calls"));
        let drops = reported(&|report| {
            report["drops"].as_object().map_or(0.0, |drops| {
                drops.values().filter_map(Value::as_u64).sum::<u64>() as f64
            })
        });
        let leaks = reported(&|report| {
            report["suspected_leaks"]
                .as_array()
                .map_or(0.0, |leaks| leaks.len() as f64)
        });
        let faults = reported(&|report| event(report, "page_faults"));
        let first_leak = of(mode)
            .next_back()
            .and_then(|run| run.traced.as_ref()?.report.as_ref())
            .map(first_leak_words)
            .unwrap_or_default();
        let has_report = matches!(mode, Mode::Default | Mode::Sampled | Mode::Resident);
        let cpu = traced(mode, &|traced| traced.cpu_share);
        let rss_mib = traced(mode, &|traced| traced.peak_rss_bytes as f64) / f64::from(1 << 20);
        let cell = |value: f64, text: String| {
            if traced_row && value.is_finite() {
                text
            } else {
                String::new()
            }
        };
        out.push_str(&format!(
            "| {} | {s:.2} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            mode.name(),
            s / bare,
            if mode == Mode::Bare {
                String::new()
            } else {
                format!("{:.2}", added / floor_added)
            },
            cell(cpu, format!("{:.0} %", cpu * 100.0)),
            cell(rss_mib, format!("{rss_mib:.0} MiB")),
            if has_report {
                format!("{allocs:.0}")
            } else {
                String::new()
            },
            if has_report {
                format!("{:.2} %", 100.0 * nested / (allocs + nested).max(1.0))
            } else {
                String::new()
            },
            if has_report {
                format!("{faults:.0}")
            } else {
                String::new()
            },
            if has_report {
                format!("{drops:.0}")
            } else {
                String::new()
            },
            if has_report {
                format!("{leaks:.0}")
            } else {
                String::new()
            },
            first_leak,
        ));
        let programs: Vec<Value> = of(mode)
            .next_back()
            .and_then(|run| run.traced.as_ref())
            .map(|traced| {
                traced
                    .programs
                    .iter()
                    .map(
                        |(name, runs, ns)| json!({"program": name, "runs": runs, "ns_per_run": ns}),
                    )
                    .collect()
            })
            .unwrap_or_default();
        json_modes.push(json!({
            "mode": mode.name(),
            "seconds_per_iteration": s,
            "seconds_per_iteration_runs": of(mode).map(|run| run.seconds_per_iteration).collect::<Vec<_>>(),
            "x_bare": s / bare,
            "added_over_site_floor_added": (mode != Mode::Bare).then_some(added / floor_added),
            "tracer_cpu_share_of_a_core": traced_row.then_some(cpu),
            "tracer_peak_rss_bytes": traced_row.then_some(rss_mib * f64::from(1 << 20)),
            "allocations": has_report.then_some(allocs),
            "nested_calls": has_report.then_some(nested),
            "page_faults": has_report.then_some(faults),
            "first_suspected_leak": has_report.then_some(&first_leak),
            "dropped": has_report.then_some(drops),
            "suspected_leaks": has_report.then_some(leaks),
            "programs": programs,
        }));
    }
    for mode in [Mode::Default, Mode::Sampled, Mode::Resident] {
        if let Some(traced) = of(mode).next_back().and_then(|run| run.traced.as_ref()) {
            let programs: Vec<String> = traced
                .programs
                .iter()
                .take(4)
                .map(|(name, runs, ns)| format!("{name} {ns:.0} ns x {runs}"))
                .collect();
            out.push_str(&format!(
                "\n{}: eBPF run time per program (last run): {}",
                mode.name(),
                programs.join(", ")
            ));
        }
    }
    out.push('\n');
    (
        out,
        json!({
            "workload": workload.name,
            "script": workload.script,
            "iterations_per_run": workload.iterations,
            "runs_per_mode": reps,
            "modes": json_modes,
        }),
    )
}
