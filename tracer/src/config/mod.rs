//! What a run is asked to do, as the rest of tracer is given it: the
//! configs `cli` parses the command line into, and that `session`,
//! `collect`, `serve`, `record`, `top` and `analyze` read. Below all of
//! them, the stages' option types included (`options`: `Sampling`,
//! `Unwinding`, `PythonMode`, `ReportLayout`, ...): it names only
//! `model`.
mod listen;
mod options;

use std::{ffi::OsString, path::PathBuf, time::Duration};

use crate::model::{Kind, Wrappers};

pub use listen::parse_listen;
pub use options::{
    FloorSites, FoldedValue, GroupBy, MapSizes, NativeFrames, Probing, PythonMode, PythonOptions,
    ReportLayout, Sampling, Schedule, Show, Unwinding,
};

/// Stacks drawn in the growth plot unless `--plot-stacks` says otherwise.
pub const DEFAULT_PLOT_STACKS: usize = 8;

/// What to trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    Pids(Vec<u32>),
    Spawn(Vec<OsString>),
    /// Every process with a matching command name, now and later.
    Comms(CommTargets),
}

/// `--comm`, `--comm-regex` and `--max-targets`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommTargets {
    /// Exact command names (compared on their first 15 bytes, as the
    /// kernel keeps them).
    pub names: Vec<String>,
    /// Regular expressions, checked to compile.
    pub patterns: Vec<String>,
    pub max_targets: usize,
}

/// Everything a tracing run needs (`record` and `top`), from the command
/// line.
#[derive(Clone, Debug)]
pub struct Config {
    pub targets: Targets,
    pub schedule: Schedule,
    /// The kernel tables' sizes (`--max-live-allocs`, `--max-stacks`,
    /// `--ring-buffer-kib`).
    pub map_sizes: MapSizes,
    pub probing: Probing,
    pub show: Show,
    /// Where to serve metrics and profiles (`--listen`).
    pub listen: Option<std::net::SocketAddr>,
    pub verbose: bool,
    /// A spawned command goes on, untraced, when tracing stops (else it is
    /// passed the stop signal and waited for).
    pub leave_running: bool,
}

/// `tracer record`: a run, and the files it writes.
#[derive(Clone, Debug)]
pub struct RecordConfig {
    pub trace: Config,
    pub json_path: Option<PathBuf>,
    pub svg_path: Option<PathBuf>,
    pub svg_every: Duration,
    /// Stacks drawn in the growth plot.
    pub plot_stacks: usize,
    pub recording_path: Option<PathBuf>,
    /// The text report goes here (else stdout, or stderr for a spawned
    /// command).
    pub text_path: Option<PathBuf>,
    /// `--holders`: scan the targets for who holds the listed stacks.
    pub holders: bool,
}

/// `tracer floor`: what the benchmark wants measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FloorConfig {
    pub pid: u32,
    pub sites: FloorSites,
    pub with_return: bool,
}

/// The formats of `tracer report`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// The report a live run prints.
    Text,
    /// The report a live run writes with --json.
    Json,
    /// One `outer;...;inner value` line per stack (flamegraph.pl, inferno).
    Folded,
    /// gzip-compressed profile.proto, for `go tool pprof`.
    Pprof,
    /// An interactive SVG flame graph.
    Flamegraph,
    /// The growth plot a live run writes with --svg.
    Svg,
}

/// Everything `tracer report` needs, from the command line.
///
/// Wide: one field per flag of `tracer report`.
#[derive(Clone, Debug)]
pub struct ReportConfig {
    pub recording_path: PathBuf,
    pub format: ReportFormat,
    pub top: Option<usize>,
    pub kind: Option<Kind>,
    pub pid: Option<u32>,
    pub from_s: Option<f64>,
    pub to_s: Option<f64>,
    /// The moment to rank and judge at (`--at`), in seconds since attach.
    pub at_s: Option<f64>,
    pub value: FoldedValue,
    pub output_path: Option<PathBuf>,
    /// Stacks drawn in the growth plot.
    pub plot_stacks: usize,
    /// What stacks are named past (`--wrapper` and the built-in list).
    pub wrappers: Wrappers,
    /// `--group-by`, `--native`.
    pub layout: ReportLayout,
    /// Frames without a symbol are looked up in debug files here
    /// (`--debug-dir`).
    pub debug_dirs: Vec<PathBuf>,
}
