//! The Python row of `cargo xtask bench`: what tracer adds per allocation
//! of a Python program, with and without Python frames, at Python depth
//! 10 and 50, and with `--python-objects`.
//!
//! The workload (tests/fixtures/python/bench_allocs.py) runs inside
//! Debian's libpython3.11 (tests/fixtures/embed_script.c): N iterations
//! of `bytes(1000)` at the bottom of D nested Python calls, one allocation
//! and its free each. Heap modes see it as calloc/free, `--python-objects`
//! as PyObject_Calloc/PyObject_Free with the calloc and free nested inside
//! (one block either way). libpython3.11 has no frame pointers, so every
//! tracer mode copies stacks for DWARF unwinding (`--unwind auto`), as a
//! user's run does. Each run is a fresh process; modes alternate; the
//! table shows medians.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::bench_runs::{Attached, answer_field, median};
use crate::fixture_process::FixtureProcess;

const LIBPYTHON: &str = "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0";
const DEPTHS: [u32; 2] = [10, 50];

/// How the Python workload is traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum PythonMode {
    Baseline,
    /// Native frames only.
    Off,
    /// Python frames (the default, `--python auto`).
    Frames,
    /// Python frames and CPython's allocator hooked.
    Objects,
}

const MODES: [PythonMode; 4] = [
    PythonMode::Baseline,
    PythonMode::Off,
    PythonMode::Frames,
    PythonMode::Objects,
];

impl PythonMode {
    fn name(self) -> &'static str {
        match self {
            PythonMode::Baseline => "no tracer",
            PythonMode::Off => "tracer --python off",
            PythonMode::Frames => "tracer (Python frames)",
            PythonMode::Objects => "tracer --python-objects",
        }
    }

    /// `tracer record` arguments beyond the target's; None: no tracer.
    fn extra_args(self) -> Option<&'static [&'static str]> {
        match self {
            PythonMode::Baseline => None,
            PythonMode::Off => Some(&["--python", "off"]),
            PythonMode::Frames => Some(&[]),
            PythonMode::Objects => Some(&["--python-objects"]),
        }
    }
}

/// The Python row: its table (markdown) and its JSON.
pub(crate) struct PythonRow {
    pub table: String,
    pub json: Value,
}

pub(crate) fn bench_python(root: &Path, short: bool) -> Result<PythonRow> {
    if !Path::new(LIBPYTHON).exists() {
        bail!("{LIBPYTHON} is missing: run `cargo xtask setup`");
    }
    let reps = if short { 1 } else { 3 };
    let iterations: u64 = if short { 20_000 } else { 100_000 };
    let mut samples: BTreeMap<(u32, PythonMode), Vec<f64>> = BTreeMap::new();
    for rep in 0..reps {
        for depth in DEPTHS {
            for mode in MODES {
                let ns = measure(root, depth, mode, iterations)?;
                eprintln!(
                    "bench: run {}/{reps} Python depth {depth:<3} {:<28} {ns:>10.1} ns/alloc",
                    rep + 1,
                    mode.name()
                );
                samples.entry((depth, mode)).or_default().push(ns);
            }
        }
    }
    let medians: BTreeMap<(u32, PythonMode), f64> = samples
        .iter()
        .map(|(key, values)| (*key, median(values)))
        .collect();
    let mut table = format!(
        "\nPython: `bytes(1000)` at Python depth D in Debian's libpython3.11 (walked through unwind tables, \
         --unwind auto), {iterations} allocations per run, median of {reps} alternating runs\n\n\
         | Python depth | mode | ns/alloc | added ns | x no tracer | added / --python off's |\n\
         |---:|---|---:|---:|---:|---:|\n"
    );
    let mut results = Vec::new();
    for depth in DEPTHS {
        let base = medians[&(depth, PythonMode::Baseline)];
        let added = |mode: PythonMode| medians[&(depth, mode)] - base;
        for mode in MODES {
            let ns = medians[&(depth, mode)];
            let versus_off = match mode {
                PythonMode::Baseline | PythonMode::Off => String::new(),
                _ => format!("{:.2}", added(mode) / added(PythonMode::Off)),
            };
            table.push_str(&format!(
                "| {depth} | {} | {ns:.0} | {:.0} | {:.1} | {versus_off} |\n",
                mode.name(),
                added(mode),
                ns / base,
            ));
            results.push(json!({
                "python_depth": depth,
                "mode": mode.name(),
                "ns_per_alloc_median": ns,
                "ns_per_alloc_runs": samples[&(depth, mode)],
                "added_ns_per_alloc": added(mode),
            }));
        }
    }
    Ok(PythonRow {
        table,
        json: json!({
            "workload": "bytes(1000) in Debian's libpython3.11",
            "allocations_per_run": iterations,
            "runs_per_mode": reps,
            "results": results,
        }),
    })
}

/// One run: a fresh embedded interpreter, the tracer attached (unless
/// the baseline), ns per allocation. A warm-up run first, so the
/// interpreter's specialization is done before the measured one.
fn measure(root: &Path, depth: u32, mode: PythonMode, iterations: u64) -> Result<f64> {
    let launcher = root.join("target/fixtures/embed_script");
    let script = root.join("tests/fixtures/python/bench_allocs.py");
    let mut fixture = FixtureProcess::start_with_args(&launcher, &[&script], false, &[])?;
    let json_path =
        std::env::temp_dir().join(format!("tracer-bench-python-{}.json", std::process::id()));
    let attached = match mode.extra_args() {
        Some(extra) => {
            let mut args: Vec<String> = vec![
                "record".to_owned(),
                "--pid".to_owned(),
                fixture.pid.to_string(),
                "--json".to_owned(),
                json_path.display().to_string(),
            ];
            args.extend(extra.iter().map(|arg| (*arg).to_owned()));
            Some(Attached::start(root, &args)?)
        }
        None => None,
    };
    fixture.command(&format!("run {depth} 1000"))?;
    let answer = fixture.command(&format!("run {depth} {iterations}"))?;
    let ns = answer_field(&answer, "ns_per_alloc")?;
    if let Some(attached) = attached {
        attached.stop()?;
        let text = std::fs::read_to_string(&json_path)
            .with_context(|| format!("could not read {}", json_path.display()))?;
        let _ = std::fs::remove_file(&json_path);
        let report: Value = serde_json::from_str(&text).context("the tracer's JSON")?;
        check_mode(&report, mode, iterations)?;
    }
    fixture.quit()?;
    Ok(ns)
}

/// Fails unless the run measured what its mode says, from the report's
/// counters (stacks whose blocks were all freed are not listed): every
/// allocation recorded, a Python stack walked for each exactly when
/// Python frames are on, and with `--python-objects` the calloc nested
/// inside each PyObject_Calloc (the block counted once, as the object).
fn check_mode(report: &Value, mode: PythonMode, iterations: u64) -> Result<()> {
    let event = |name: &str| {
        report
            .pointer(&format!("/events/{name}"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let (allocs, python_stacks, nested) = (
        event("allocs"),
        event("python_stacks"),
        event("nested_calls"),
    );
    let passed = allocs >= iterations
        && match mode {
            PythonMode::Baseline => true,
            PythonMode::Off => python_stacks == 0,
            PythonMode::Frames => python_stacks >= iterations,
            PythonMode::Objects => python_stacks >= iterations && nested >= iterations,
        };
    if !passed {
        bail!(
            "{}: the report counts {allocs} allocations, {python_stacks} Python stacks and \
             {nested} nested calls for {iterations} allocations made",
            mode.name()
        );
    }
    Ok(())
}
