//! The benchmark's sections on real allocators and a real server (full run
//! only, not `--short`): Debian's redis-server, which links jemalloc,
//! driven by `redis-benchmark -t set,get -P 16` with no tracer, tracer
//! default, `--sample-bytes 524288`, `--unwind fp` and the naive floor
//! (empty programs at the function entries), each run on a fresh server on
//! a free loopback port, the modes alternating; with the time tracer takes
//! to exit after SIGINT. Then bench.c's malloc/free pairs under
//! `LD_PRELOAD` of jemalloc, tcmalloc and mimalloc next to glibc: what
//! tracer's probes add per pair with each allocator (`--unwind fp`: the
//! Debian allocators have no frame pointers, and `auto` would copy every
//! stack for them, not for glibc).

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::bench_runs::{Attached, Mode, Workload, measure_preloaded, median};
use crate::fixture_process::KillOnDrop;

/// Requests of each of SET and GET per run (the issue measured 200 000;
/// the naive floor single-steps jemalloc's free, ~16 µs a call).
const REDIS_REQUESTS: u64 = 50_000;
/// `--sample-bytes` of the sampled mode.
const SAMPLE_BYTES: &str = "524288";

/// How a redis run is traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum RedisMode {
    NoTracer,
    Default,
    Sampled,
    FramePointers,
    NaiveFloor,
    Resident,
}

const REDIS_MODES: [RedisMode; 6] = [
    RedisMode::NoTracer,
    RedisMode::Default,
    RedisMode::Sampled,
    RedisMode::Resident,
    RedisMode::FramePointers,
    RedisMode::NaiveFloor,
];

impl RedisMode {
    fn name(self) -> &'static str {
        match self {
            RedisMode::NoTracer => "no tracer",
            RedisMode::Default => "tracer (default)",
            RedisMode::Sampled => "tracer --sample-bytes 524288",
            RedisMode::FramePointers => "tracer --unwind fp",
            RedisMode::NaiveFloor => "naive floor (entries)",
            RedisMode::Resident => "tracer --resident",
        }
    }

    fn tracer_args(self, pid: u32, json: &Path) -> Option<Vec<String>> {
        let pid = pid.to_string();
        let json = json.display().to_string();
        let record = |extra: &[&str]| {
            ["record", "--pid", &pid, "--json", &json]
                .iter()
                .chain(extra)
                .map(|arg| (*arg).to_owned())
                .collect()
        };
        match self {
            RedisMode::NoTracer => None,
            RedisMode::Default => Some(record(&[])),
            RedisMode::Sampled => Some(record(&["--sample-bytes", SAMPLE_BYTES])),
            RedisMode::FramePointers => Some(record(&["--unwind", "fp"])),
            RedisMode::Resident => Some(record(&["--resident"])),
            RedisMode::NaiveFloor => Some(
                ["floor", "--pid", &pid, "--sites", "entry"]
                    .map(str::to_owned)
                    .to_vec(),
            ),
        }
    }
}

/// A fresh redis-server on a free loopback port, without persistence.
struct RedisServer {
    child: KillOnDrop,
    port: u16,
}

impl RedisServer {
    fn start() -> Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .context("no free loopback port")?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .context("could not start redis-server (installed by `cargo xtask setup`)")?;
        let server = RedisServer {
            child: KillOnDrop(child),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("redis-server did not listen on port {port}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }
}

/// One redis run: requests per second of SET and GET, and for a tracer
/// how long it took to exit after SIGINT and how many probes it had.
struct RedisRun {
    set_per_s: f64,
    get_per_s: f64,
    exit_s: Option<f64>,
    probes: Option<usize>,
}

fn redis_run(root: &Path, mode: RedisMode) -> Result<RedisRun> {
    let server = RedisServer::start()?;
    let json_path =
        std::env::temp_dir().join(format!("tracer-bench-redis-{}.json", std::process::id()));
    let attached = mode
        .tracer_args(server.child.0.id(), &json_path)
        .map(|args| Attached::start(root, &args))
        .transpose()?;
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
        .args([
            "-t",
            "set,get",
            "-P",
            "16",
            "-n",
            &REDIS_REQUESTS.to_string(),
        ])
        .arg("--csv")
        .stderr(Stdio::null())
        .output()
        .context("could not run redis-benchmark (installed by `cargo xtask setup`)")?;
    let csv = String::from_utf8_lossy(&output.stdout);
    let rate = |test: &str| -> Result<f64> {
        csv.lines()
            .find_map(|line| {
                let mut fields = line.split(',').map(|field| field.trim_matches('"'));
                (fields.next() == Some(test)).then(|| fields.next()?.parse().ok())?
            })
            .with_context(|| format!("no {test} line in redis-benchmark's output:\n{csv}"))
    };
    let (set_per_s, get_per_s) = (rate("SET")?, rate("GET")?);
    let (exit_s, probes) = match attached {
        Some(attached) => {
            let stopping = Instant::now();
            attached.stop()?;
            let exit_s = stopping.elapsed().as_secs_f64();
            let probes = std::fs::read_to_string(&json_path)
                .ok()
                .and_then(|text| serde_json::from_str::<Value>(&text).ok())
                .and_then(|report| report["probes"].as_array().map(Vec::len));
            let _ = std::fs::remove_file(&json_path);
            (Some(exit_s), probes)
        }
        None => (None, None),
    };
    Ok(RedisRun {
        set_per_s,
        get_per_s,
        exit_s,
        probes,
    })
}

/// The allocators of the churn section: name and library (None: glibc).
const ALLOCATORS: [(&str, Option<&str>); 4] = [
    ("glibc 2.36", None),
    (
        "jemalloc 5.3",
        Some("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
    ),
    (
        "tcmalloc 2.10",
        Some("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
    ),
    (
        "mimalloc 2.0",
        Some("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"),
    ),
];

/// The two sections' tables (markdown) and their figures.
pub struct RealSections {
    pub table: String,
    pub json: Value,
}

pub fn bench_real(root: &Path, reps: usize) -> Result<RealSections> {
    let mut redis: BTreeMap<RedisMode, Vec<RedisRun>> = BTreeMap::new();
    let mut churn: BTreeMap<(usize, Mode), Vec<f64>> = BTreeMap::new();
    for rep in 0..reps {
        for mode in REDIS_MODES {
            let run = redis_run(root, mode)?;
            eprintln!(
                "bench: run {}/{reps} redis {:<30} SET {:>10.0}/s GET {:>10.0}/s{}",
                rep + 1,
                mode.name(),
                run.set_per_s,
                run.get_per_s,
                run.exit_s
                    .map_or_else(String::new, |s| format!(", exit {s:.2} s"))
            );
            redis.entry(mode).or_default().push(run);
        }
        for (index, (name, library)) in ALLOCATORS.iter().enumerate() {
            for mode in [Mode::Baseline, Mode::FramePointers] {
                let (ns, _) = measure_preloaded(root, mode, Workload::Pairs, false, *library)?;
                eprintln!(
                    "bench: run {}/{reps} malloc/free on {name:<14} {:<28} {ns:>10.1} ns/pair",
                    rep + 1,
                    mode.name()
                );
                churn.entry((index, mode)).or_default().push(ns);
            }
        }
    }
    Ok(render(&redis, &churn, reps))
}

fn render(
    redis: &BTreeMap<RedisMode, Vec<RedisRun>>,
    churn: &BTreeMap<(usize, Mode), Vec<f64>>,
    reps: usize,
) -> RealSections {
    let figure = |mode: RedisMode, of: fn(&RedisRun) -> Option<f64>| {
        let values: Vec<f64> = redis[&mode].iter().filter_map(of).collect();
        (!values.is_empty()).then(|| median(&values))
    };
    let set = |mode| figure(mode, |run| Some(run.set_per_s)).unwrap_or(f64::NAN);
    let get = |mode| figure(mode, |run| Some(run.get_per_s)).unwrap_or(f64::NAN);
    let mut table = format!(
        "\nredis-server 7.0 (jemalloc), redis-benchmark -t set,get -P 16 -n {REDIS_REQUESTS}, \
         a fresh server per run, median of {reps} alternating runs\n\n\
         | mode | SET/s | GET/s | SET x no tracer | SET / naive floor's | GET / naive floor's | probes | exit after SIGINT |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    let mut redis_json = Vec::new();
    for mode in REDIS_MODES {
        let exit_s = figure(mode, |run| run.exit_s);
        let probes = figure(mode, |run| run.probes.map(|probes| probes as f64));
        table.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.3} | {:.1} | {:.1} | {} | {} |\n",
            mode.name(),
            set(mode),
            get(mode),
            set(mode) / set(RedisMode::NoTracer),
            set(mode) / set(RedisMode::NaiveFloor),
            get(mode) / get(RedisMode::NaiveFloor),
            probes.map_or_else(String::new, |probes| format!("{probes:.0}")),
            exit_s.map_or_else(String::new, |s| format!("{s:.2} s")),
        ));
        redis_json.push(json!({
            "mode": mode.name(),
            "set_per_s_median": set(mode),
            "get_per_s_median": get(mode),
            "set_per_s_runs": redis[&mode].iter().map(|run| run.set_per_s).collect::<Vec<_>>(),
            "get_per_s_runs": redis[&mode].iter().map(|run| run.get_per_s).collect::<Vec<_>>(),
            "exit_after_sigint_s_median": exit_s,
            "probes": probes,
        }));
    }
    let added = |index: usize| {
        median(&churn[&(index, Mode::FramePointers)]) - median(&churn[&(index, Mode::Baseline)])
    };
    table.push_str(&format!(
        "\nmalloc/free pairs (bench.c, 2 threads) under LD_PRELOAD of each allocator, \
         median of {reps} alternating runs\n\n\
         | allocator | no tracer ns/pair | tracer --unwind fp ns/pair | added ns | added / glibc's |\n\
         |---|---:|---:|---:|---:|\n"
    ));
    let mut churn_json = Vec::new();
    for (index, (name, library)) in ALLOCATORS.iter().enumerate() {
        let base = median(&churn[&(index, Mode::Baseline)]);
        let traced = median(&churn[&(index, Mode::FramePointers)]);
        table.push_str(&format!(
            "| {name} | {base:.0} | {traced:.0} | {:.0} | {:.2} |\n",
            added(index),
            added(index) / added(0)
        ));
        churn_json.push(json!({
            "allocator": name,
            "library": library,
            "ns_per_pair_no_tracer": base,
            "ns_per_pair_tracer": traced,
            "added_ns": added(index),
            "added_over_glibc": added(index) / added(0),
        }));
    }
    RealSections {
        table,
        json: json!({ "redis": redis_json, "allocators": churn_json }),
    }
}
