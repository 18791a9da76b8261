//! One run of a fixture traced at three snapshot rhythms at once: `tracer
//! record` every 250 ms, 1 s and 5 s (each with its JSON report, SVG plot,
//! recording and `--listen` metrics) and `tracer top` every 1 s; then what
//! each output says of a site (tests/shapes.rs). The same target seen at
//! three rhythms must get one verdict.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::{
    ATTACH_TIMEOUT, EXIT_TIMEOUT, Record, Report, Trace, Traced, Tracer, http_get, json_path,
    listen_address, take_svg_texts,
};

/// The snapshot intervals every shape is judged at.
pub const INTERVALS: [&str; 3] = ["250ms", "1s", "5s"];
/// `tracer top`'s interval.
const TOP_INTERVAL: &str = "1s";

/// The tracers of one run.
pub struct Rhythms {
    traces: Vec<Rhythm>,
    top: Tracer,
}

struct Rhythm {
    interval: &'static str,
    trace: Trace,
    svg: PathBuf,
    recording: PathBuf,
    address: String,
}

/// What one `tracer record` run left, and `tracer report` of its
/// recording.
pub struct Seen {
    pub interval: &'static str,
    pub traced: Traced,
    /// The SVG's texts (titles and legend).
    pub legend: Vec<String>,
    /// `tracer report RECORDING --format json`.
    pub replayed: Report,
    /// /metrics read just before the tracer stopped; None when the target
    /// had exited (the server shows live targets only).
    pub metrics: Option<String>,
}

impl Rhythms {
    /// Starts the tracers on `pid` (with `extra_args` each) and waits
    /// until all are attached.
    pub fn attach(pid: u32, extra_args: &[&str]) -> Rhythms {
        let traces = INTERVALS
            .iter()
            .map(|&interval| {
                let name = format!("rhythm_{}", interval);
                let svg = json_path(&name).with_extension("svg");
                let recording = json_path(&name).with_extension("tracer");
                let trace = Record::pid(pid)
                    .interval(interval)
                    .args(["--svg", svg.to_str().unwrap()])
                    .args(["-o", recording.to_str().unwrap()])
                    .args(["--listen", "0"])
                    .args(extra_args)
                    .start();
                (interval, trace, svg, recording)
            })
            .collect::<Vec<_>>();
        let pid_arg = pid.to_string();
        let mut top_args = vec!["top", "--pid", &pid_arg, "--interval", TOP_INTERVAL];
        top_args.extend_from_slice(extra_args);
        let mut top = Tracer::start(top_args);
        let traces = traces
            .into_iter()
            .map(|(interval, mut trace, svg, recording)| {
                trace.tracer.wait_attached(ATTACH_TIMEOUT);
                let address = listen_address(&mut trace.tracer);
                Rhythm {
                    interval,
                    trace,
                    svg,
                    recording,
                    address,
                }
            })
            .collect();
        top.wait_attached(ATTACH_TIMEOUT);
        Rhythms { traces, top }
    }

    /// Waits until each `tracer record` (started with `-v`) has printed
    /// `needle` (`tracer top` prints no `-v` lines: its tables, built
    /// alongside, are taken to be ready by then).
    pub fn wait_stderr(&mut self, needle: &str, timeout: Duration) {
        for rhythm in &mut self.traces {
            rhythm.trace.tracer.wait_stderr(needle, timeout);
        }
    }

    /// Reads each server's metrics, then stops every tracer at once
    /// (SIGINT), so their windows end together.
    pub fn stop(mut self) -> (Vec<Seen>, String) {
        let metrics: Vec<Option<String>> = self
            .traces
            .iter()
            .map(|rhythm| {
                let (status, body) = http_get(&rhythm.address, "/metrics");
                assert_eq!(status, 200, "/metrics of the {} run", rhythm.interval);
                Some(String::from_utf8_lossy(&body).into_owned())
            })
            .collect();
        for rhythm in &mut self.traces {
            rhythm.trace.tracer.signal(libc::SIGINT);
        }
        let top = self.top.stop();
        Self::finish(self.traces, metrics, top, Trace::wait_exit)
    }

    /// Waits for every tracer to end with the target.
    pub fn wait_exit(self) -> (Vec<Seen>, String) {
        let metrics = vec![None; self.traces.len()];
        let top = self.top.wait_exit(EXIT_TIMEOUT);
        Self::finish(self.traces, metrics, top, Trace::wait_exit)
    }

    fn finish(
        traces: Vec<Rhythm>,
        metrics: Vec<Option<String>>,
        top: super::TracerOutput,
        end: fn(Trace) -> Traced,
    ) -> (Vec<Seen>, String) {
        top.assert_success();
        let seen = traces
            .into_iter()
            .zip(metrics)
            .map(|(rhythm, metrics)| {
                let traced = end(rhythm.trace);
                let replayed = replay(&rhythm.recording);
                Seen {
                    interval: rhythm.interval,
                    traced,
                    legend: take_svg_texts(&rhythm.svg),
                    replayed,
                    metrics,
                }
            })
            .collect();
        (seen, top.last_top_table().to_owned())
    }
}

/// `tracer report RECORDING --format json`, the recording removed.
fn replay(recording: &std::path::Path) -> Report {
    let json = recording.with_extension("replayed.json");
    let output = Tracer::start([
        "report",
        recording.to_str().unwrap(),
        "--format",
        "json",
        "--top",
        "0",
        "-o",
        json.to_str().unwrap(),
    ])
    .wait_exit(Duration::from_secs(60));
    output.assert_success();
    let _ = std::fs::remove_file(recording);
    Report::read(&json)
}

/// What every output says of the site groups a predicate picks.
#[derive(Clone, Debug)]
pub struct Said {
    pub interval: &'static str,
    /// JSON: each picked group's verdict (`verdict`, or from
    /// `suspected_leak` where a tracer wrote none), its confidence and
    /// evidence, and its live bytes as ranked.
    pub groups: Vec<(String, String, String, i64)>,
    /// The text report lists the site among its suspected leaks.
    pub text_leak: bool,
    /// The SVG legend marks the site's line a suspected leak.
    pub legend_leak: bool,
    /// `tracer report` of the recording: the verdicts, as in `groups`.
    pub replayed: Vec<String>,
    /// `tracer_stack_suspected_leak` is 1 for one of the site's stacks;
    /// None when no metrics were read.
    pub metrics_leak: Option<bool>,
}

impl Said {
    /// The one verdict JSON gives the site: `absent` when no group holds
    /// bytes, `mixed` when its groups disagree.
    pub fn verdict(&self) -> String {
        let mut verdicts: Vec<&str> = self.groups.iter().map(|(v, ..)| v.as_str()).collect();
        verdicts.dedup();
        match verdicts.as_slice() {
            [] => "absent".to_owned(),
            [one] => (*one).to_owned(),
            _ => "mixed".to_owned(),
        }
    }
}

/// Reads what `seen` says of the groups `picks` selects, named in text,
/// the legend and metrics by `function`.
pub fn said(seen: &Seen, function: &str, picks: &dyn Fn(&Value) -> bool) -> Said {
    let of = |report: &Report| -> Vec<(String, String, String, i64)> {
        report.json["groups"]
            .as_array()
            .unwrap_or_else(|| panic!("no groups in {}", report.json))
            .iter()
            .filter(|group| picks(group))
            .map(|group| {
                let verdict = group["verdict"].as_str().map_or_else(
                    || {
                        if group["suspected_leak"] == true {
                            "leak".to_owned()
                        } else {
                            "not-leak".to_owned()
                        }
                    },
                    str::to_owned,
                );
                (
                    verdict,
                    group["confidence"].as_str().unwrap_or("-").to_owned(),
                    group["evidence"].as_str().unwrap_or("-").to_owned(),
                    group["ranked_live_bytes"].as_i64().unwrap_or(0),
                )
            })
            .collect()
    };
    let stdout = &seen.traced.output.stdout;
    let text_leak = stdout.lines().any(|line| {
        line.starts_with('L')
            && line[1..].starts_with(|c: char| c.is_ascii_digit())
            && line.contains(function)
    });
    let legend_leak = seen.legend.iter().any(|text| {
        text.starts_with('L') && text.split(' ').skip(1).any(|word| word.contains(function))
    });
    let metrics_leak = seen.metrics.as_ref().map(|metrics| {
        metrics
            .lines()
            .filter(|line| line.starts_with("tracer_stack_suspected_leak{"))
            .filter(|line| line.contains(&format!("site=\"{function}")) || line.contains(function))
            .any(|line| line.ends_with(" 1"))
    });
    Said {
        interval: seen.interval,
        groups: of(&seen.traced.report),
        text_leak,
        legend_leak,
        replayed: of(&seen.replayed).into_iter().map(|(v, ..)| v).collect(),
        metrics_leak,
    }
}

/// Whether `tracer top`'s last table flags the site's row (LEAK? `yes`).
pub fn top_flags(table: &str, function: &str) -> Option<bool> {
    let row = table.lines().find(|line| line.contains(function))?;
    Some(row.split_whitespace().any(|word| word == "yes"))
}
