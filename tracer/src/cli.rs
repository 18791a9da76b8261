//! The command line: verbs and flags (clap), turned into one `Config` that
//! the rest of tracer is given. Usage errors become one line, exit code 2.
use std::{ffi::OsString, path::PathBuf, time::Duration};

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::{
    attach::{FloorSites, Sampling},
    error::{ExitCode, fatal},
    model::Kind,
    output::folded::FoldedValue,
    unwind::{UnwindMode, Unwinding},
};
use tracer_ebpf::sampling::MAX_SAMPLE_BYTES;

const ABOUT: &str =
    "Find the call stacks that hold growing memory in a running process, with eBPF.";

const LONG_ABOUT: &str = "\
Find the call stacks that hold growing memory in a running process, with eBPF.

tracer attaches uprobes to the allocator functions (malloc, calloc, realloc, \
reallocarray, free, posix_memalign, aligned_alloc, memalign, valloc, pvalloc) \
of a process that is already running, keeps the outstanding bytes of every \
call stack in the kernel, and reports the stacks that hold the most memory \
and how fast it grows. The target is never restarted, stopped or written to.

GPU memory is followed at the CUDA driver and runtime allocation functions \
(libcuda, libcudart, also when loaded later with dlopen) in kinds \
gpu-device, gpu-managed and gpu-host-pinned, each counted once although the \
runtime calls the driver. A CUDA context destroyed or reset (cuCtxDestroy_v2, \
cuDevicePrimaryCtxReset_v2, cudaDeviceReset) releases the GPU memory that any \
context of the process owned before it (not stream-ordered or cuMemCreate \
memory); the report says what it released.

Memory that never passes through malloc is followed at the system calls \
(tracepoints on mmap, munmap, mremap, brk and mprotect, so raw syscalls are \
seen too), in kinds of its own: mmap-anon, mmap-file (with the file's name as \
the innermost frame) and heap-brk. Counted once: a mapping made while the \
thread is inside a traced allocator call (glibc's malloc mapping a large block \
or growing an arena) is the allocator's, counted as heap under the caller of \
malloc, never again as mmap. Reserved address space (PROT_NONE ranges, thread \
stacks made with MAP_STACK) is reported apart as mmap-reserved and never \
ranked: stacks rank by what they made usable. The report sets each target's \
traced live bytes next to its RSS (RssAnon, RssFile) and shows the gap.";

const EXIT_CODES: &str = "\
Exit codes:
  0  report written
  1  unexpected failure
  2  bad command line
  3  target not found, a kernel thread, a zombie, or exited during attach
  4  not root (tracer needs root, or CAP_BPF and CAP_PERFMON)
  5  kernel without BTF or uprobe support
  6  no allocator function (malloc/free) found in the target
  7  the command after -- could not be started
  8  an output file cannot be written (missing or read-only directory)
  9  recording file missing, truncated before its metadata, corrupt, or from a newer tracer";

#[derive(Debug, Parser)]
#[command(name = "tracer", version, about = ABOUT, long_about = LONG_ABOUT, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Verb,
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// Trace allocations of running processes (--pid) or of a command
    /// (after --), then print the stacks that hold memory.
    #[command(after_help = EXIT_CODES)]
    Record(RecordArgs),
    /// Show a live table of the stacks growing fastest, refreshed every
    /// interval, like `top`; q or Ctrl-C quits.
    #[command(after_help = EXIT_CODES)]
    Top(TopArgs),
    /// Report on a recording made with `tracer record -o FILE`: the same
    /// views as a live run, and folded stacks, pprof and flame graphs.
    #[command(after_help = EXIT_CODES)]
    Report(ReportArgs),
    /// Benchmark floor (`cargo xtask bench`): empty eBPF programs on the
    /// allocator functions of --pid until SIGINT, SIGTERM or its exit.
    #[command(hide = true)]
    Floor(FloorArgs),
    /// Draw the growth plot of a recording (`tracer record -o FILE`), as
    /// the live run's --svg does.
    #[command(after_help = EXIT_CODES)]
    Plot(PlotArgs),
}

#[derive(Debug, Args)]
struct PlotArgs {
    /// The recording (`tracer record -o FILE`).
    #[arg(value_name = "FILE")]
    recording: PathBuf,

    /// The SVG file to write.
    #[arg(short, long = "output", value_name = "PATH")]
    output: PathBuf,

    /// Only stacks of this memory kind (e.g. heap).
    #[arg(long, value_name = "KIND", value_parser = parse_kind)]
    kind: Option<Kind>,

    /// Only this traced process.
    #[arg(short, long, value_name = "PID")]
    pid: Option<u32>,

    /// Start the plot at this time since attach (e.g. 30s).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    from: Option<Duration>,

    /// End the plot at this time since attach (e.g. 2m).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    to: Option<Duration>,

    /// Number of stacks drawn.
    #[arg(long, value_name = "N", default_value_t = crate::output::svg::DEFAULT_STACK_LINES)]
    plot_stacks: usize,
}

const SAMPLING_HELP: &str = "\
Sample allocations by bytes, like tcmalloc and heapprofd: a block of s bytes \
is recorded with probability p(s) = 1 - exp(-s/N) (a Poisson process with one \
point per N bytes; the decision is made in the entry probe, and with uprobe \
sessions an unrecorded call skips its return probe) and counts for s/p(s) \
bytes, so the live bytes of a stack are estimated without bias: \
L^ = sum over its sampled live blocks of s/p(s). Variance: \
Var(L^) = sum over its live blocks of s^2 (1-p(s))/p(s) <= N * L, so the \
standard deviation is at most sqrt(N * L): with N = 512 KiB, a stack holding \
1 GiB is within +-2.2 % (3 standard deviations). live_allocs then counts \
sampled blocks. Default: every allocation is recorded (exact mode).";

const UNWIND_HELP: &str = "\
How call stacks are walked. fp: frame pointers, walked in the kernel at \
every allocation (cheapest; stacks through code built without frame \
pointers lose frames or show wrong callers). dwarf: the probe copies the top \
of the user stack (--stack-bytes) and tracer unwinds it from .eh_frame: \
right stacks through any code, at a cost per recorded allocation (about \
4-5 us more than fp in the target, about 2 us of tracer's CPU to unwind; \
see the README's Performance section); for targets making more than \
~50 000 allocations per second, combine it with --sample-bytes or \
--min-size, or copies beyond the ring buffer fall back to frame pointers \
(counted as stack_copy_ring_full). auto: dwarf for each process whose \
executable or libraries (glibc's own objects aside) lack frame pointers, \
decided per object at attach and for every library mapped later; fp for \
the others.";

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum UnwindArg {
    Fp,
    Dwarf,
    Auto,
}

#[derive(Debug, Args)]
struct FloorArgs {
    #[arg(short, long = "pid", value_name = "PID")]
    pid: u32,
    /// Function entries (where other uprobe tools probe) or the sites
    /// tracer chooses.
    #[arg(long, value_enum)]
    sites: FloorSitesArg,
    /// Only entry programs, no return probes.
    #[arg(long)]
    entry_only: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum FloorSitesArg {
    Entry,
    Chosen,
}

/// What to trace, shared by every verb that traces.
#[derive(Debug, Args)]
struct TargetArgs {
    /// Process to trace; repeat to trace several.
    #[arg(short, long = "pid", value_name = "PID", conflicts_with = "command")]
    pids: Vec<u32>,

    /// Stop after this long (e.g. 30s, 5m, 500ms); default: until Ctrl-C or
    /// until every target has exited.
    #[arg(short, long, value_name = "DURATION", value_parser = parse_duration)]
    duration: Option<Duration>,

    /// How often to snapshot the per-stack totals.
    #[arg(short, long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval)]
    interval: Duration,

    /// Number of stacks in the report (and in each section of it).
    #[arg(long, value_name = "N", default_value_t = 10)]
    top: usize,

    /// Capacity of the in-kernel table of live allocations (about 100 bytes
    /// of kernel memory each); allocations beyond it are counted as dropped.
    #[arg(long = "max-live", value_name = "N", default_value_t = 1 << 20)]
    max_live_allocs: u32,

    /// Capacity of the in-kernel table of distinct call stacks (about 1 KiB
    /// each); stacks beyond it are counted as dropped.
    #[arg(long, value_name = "N", default_value_t = 1 << 14)]
    max_stacks: u32,

    /// Size of the ring buffer that carries mmap/munmap/mremap/brk calls to
    /// tracer, in KiB (a power of two, at least 4); calls beyond it between
    /// two drains (every 20 ms) are counted as dropped.
    #[arg(long, value_name = "KIB", default_value_t = 1024, value_parser = parse_ring_kib)]
    ring_buffer_kib: u32,

    /// Sampling period in bytes (at most 128 MiB).
    #[arg(long, value_name = "N", long_help = SAMPLING_HELP)]
    sample_bytes: Option<u64>,

    /// Seed of the sampling decisions, for reproducible runs (default:
    /// random).
    #[arg(long, value_name = "N", requires = "sample_bytes")]
    sample_seed: Option<u64>,

    /// Record only blocks of at least this many bytes (checked in the
    /// entry probe).
    #[arg(long, value_name = "BYTES")]
    min_size: Option<u64>,

    /// Record only blocks of at most this many bytes (checked in the entry
    /// probe).
    #[arg(long, value_name = "BYTES")]
    max_size: Option<u64>,

    /// How stacks are walked: fp, dwarf or auto.
    #[arg(long, value_enum, value_name = "MODE", default_value = "auto", long_help = UNWIND_HELP)]
    unwind: UnwindArg,

    /// With dwarf unwinding: bytes of stack copied at each allocation, from
    /// the start of the stack pointer's page (4096..=65536, rounded up to
    /// whole pages); deeper stacks are reported truncated, still
    /// attributed to their inner frames.
    #[arg(long, value_name = "BYTES", default_value_t = Unwinding::DEFAULT_STACK_BYTES)]
    stack_bytes: u32,

    /// With dwarf unwinding: size of the ring buffer of stack copies, in
    /// MiB (a power of two); copies beyond it between two drains (every
    /// 5 ms) fall back to frame pointers and are counted.
    #[arg(long, value_name = "MIB", default_value_t = 16)]
    stack_ring_mib: u32,

    /// Print where each probe went and why.
    #[arg(short, long)]
    verbose: bool,

    /// Also trace the child processes the targets fork from now on (as
    /// PyTorch DataLoader workers are), from the moment each is seen;
    /// without it children are not traced and cost nothing.
    #[arg(long)]
    follow_forks: bool,

    /// Command to start and trace from its first allocation.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct TopArgs {
    #[command(flatten)]
    targets: TargetArgs,
}

#[derive(Debug, Args)]
struct RecordArgs {
    #[command(flatten)]
    targets: TargetArgs,

    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,

    /// Write the growth plot (SVG) to this file at the end, and rewrite it
    /// every --svg-every while tracing. Several targets share one plot.
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,

    /// Also record the trace to this file, snapshot by snapshot, for
    /// `tracer report` later or elsewhere.
    #[arg(short, long = "output", value_name = "FILE")]
    output: Option<PathBuf>,

    /// How often to rewrite the SVG while tracing.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    svg_every: Duration,

    /// Number of stacks drawn in the growth plot.
    #[arg(long, value_name = "N", default_value_t = crate::output::svg::DEFAULT_STACK_LINES)]
    plot_stacks: usize,
}

/// What to trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    Pids(Vec<u32>),
    Spawn(Vec<OsString>),
}

/// Everything a run needs, from the command line.
#[derive(Clone, Debug)]
pub struct Config {
    pub targets: Targets,
    pub duration: Option<Duration>,
    pub interval: Duration,
    pub top: usize,
    pub json_path: Option<PathBuf>,
    pub svg_path: Option<PathBuf>,
    pub svg_every: Duration,
    pub plot_stacks: usize,
    pub recording_path: Option<PathBuf>,
    pub max_live_allocs: u32,
    pub max_stacks: u32,
    pub ring_buffer_kib: u32,
    pub sampling: Sampling,
    pub unwinding: Unwinding,
    pub verbose: bool,
    pub follow_forks: bool,
}

/// `tracer floor`: what the benchmark wants measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FloorConfig {
    pub pid: u32,
    pub sites: FloorSites,
    pub with_return: bool,
}

/// What the user asked for: a run, a report on a recording, or text to
/// print (help, version).
pub enum Parsed {
    Record(Config),
    Top(Config),
    Report(ReportConfig),
    Floor(FloorConfig),
    Print(String),
}

/// Parses the arguments. Help and version are returned as text; usage
/// errors become a one-line error with exit code 2.
pub fn parse(arguments: impl IntoIterator<Item = OsString>) -> Result<Parsed> {
    let cli = match Cli::try_parse_from(arguments) {
        Ok(cli) => cli,
        Err(error) => {
            use clap::error::ErrorKind;
            return match error.kind() {
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    Ok(Parsed::Print(error.render().to_string()))
                }
                _ => Err(fatal(ExitCode::Usage, usage_line(&error))),
            };
        }
    };
    match cli.command {
        Verb::Record(args) => {
            let mut config = config_of(args.targets)?;
            config.json_path = args.json;
            config.svg_path = args.svg;
            config.svg_every = args.svg_every;
            config.plot_stacks = args.plot_stacks;
            config.recording_path = args.output;
            Ok(Parsed::Record(config))
        }
        Verb::Top(args) => Ok(Parsed::Top(config_of(args.targets)?)),
        Verb::Report(args) => report_config(args).map(Parsed::Report),
        Verb::Plot(args) => report_config(ReportArgs {
            recording: args.recording,
            format: ReportFormat::Svg,
            top: None,
            kind: args.kind,
            pid: args.pid,
            from: args.from,
            to: args.to,
            value: FoldedValue::LiveBytes,
            output: Some(args.output),
        })
        .map(|config| {
            Parsed::Report(ReportConfig {
                plot_stacks: args.plot_stacks,
                ..config
            })
        }),
        Verb::Floor(args) => Ok(Parsed::Floor(FloorConfig {
            pid: args.pid,
            sites: match args.sites {
                FloorSitesArg::Entry => FloorSites::FunctionEntry,
                FloorSitesArg::Chosen => FloorSites::Chosen,
            },
            with_return: !args.entry_only,
        })),
    }
}

fn config_of(args: TargetArgs) -> Result<Config> {
    let targets = match (args.pids.is_empty(), args.command.is_empty()) {
        (false, true) => {
            let mut pids = args.pids;
            pids.sort_unstable();
            pids.dedup();
            Targets::Pids(pids)
        }
        (true, false) => Targets::Spawn(args.command),
        (true, true) => {
            return Err(fatal(
                ExitCode::Usage,
                "nothing to trace: give --pid PID or a command after -- (see tracer --help)",
            ));
        }
        (false, false) => unreachable!("clap rejects --pid with a command"),
    };
    if args.max_live_allocs == 0 || args.max_stacks == 0 {
        return Err(fatal(
            ExitCode::Usage,
            "--max-live and --max-stacks must be at least 1",
        ));
    }
    let sampling = Sampling {
        sample_bytes: args.sample_bytes.unwrap_or(0),
        sample_seed: args.sample_seed.unwrap_or(0),
        min_size_bytes: args.min_size.unwrap_or(0),
        max_size_bytes: args.max_size.unwrap_or(u64::MAX),
    };
    if args
        .sample_bytes
        .is_some_and(|bytes| bytes == 0 || bytes > MAX_SAMPLE_BYTES)
    {
        return Err(fatal(
            ExitCode::Usage,
            format!("--sample-bytes must be 1..={MAX_SAMPLE_BYTES}"),
        ));
    }
    if !(4096..=Unwinding::MAX_STACK_BYTES).contains(&args.stack_bytes) {
        return Err(fatal(
            ExitCode::Usage,
            format!(
                "--stack-bytes must be 4096..={}",
                Unwinding::MAX_STACK_BYTES
            ),
        ));
    }
    if !args.stack_ring_mib.is_power_of_two() || args.stack_ring_mib > 1024 {
        return Err(fatal(
            ExitCode::Usage,
            "--stack-ring-mib must be a power of two, at most 1024",
        ));
    }
    let unwinding = Unwinding {
        mode: match args.unwind {
            UnwindArg::Fp => UnwindMode::FramePointers,
            UnwindArg::Dwarf => UnwindMode::Dwarf,
            UnwindArg::Auto => UnwindMode::Auto,
        },
        stack_bytes: args.stack_bytes,
        ring_bytes: args.stack_ring_mib << 20,
    };
    if sampling.min_size_bytes > sampling.max_size_bytes {
        return Err(fatal(
            ExitCode::Usage,
            "--min-size is larger than --max-size: nothing would be recorded",
        ));
    }
    Ok(Config {
        targets,
        duration: args.duration,
        interval: args.interval,
        top: args.top,
        json_path: None,
        svg_path: None,
        svg_every: Duration::from_secs(10),
        plot_stacks: crate::output::svg::DEFAULT_STACK_LINES,
        recording_path: None,
        max_live_allocs: args.max_live_allocs,
        max_stacks: args.max_stacks,
        ring_buffer_kib: args.ring_buffer_kib,
        sampling,
        unwinding,
        verbose: args.verbose,
        follow_forks: args.follow_forks,
    })
}

/// clap's message, reduced to its first line, with where to get help.
fn usage_line(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let first = rendered.lines().next().unwrap_or("invalid arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    format!("{first} (see tracer --help)")
}

/// Parses "30s", "500ms", "2m", "1h", "1.5s" or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (examples: 30s, 500ms, 5m)"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "unknown unit '{unit}' in '{text}' (use ms, s, m or h)"
            ));
        }
    };
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(format!("'{text}' must be more than zero"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn parse_ring_kib(text: &str) -> Result<u32, String> {
    let kib: u32 = text
        .parse()
        .map_err(|_| format!("'{text}' is not a number of KiB"))?;
    if kib < 4 || !kib.is_power_of_two() || kib > 1 << 20 {
        return Err(format!("'{text}' must be a power of two from 4 to 1048576"));
    }
    Ok(kib)
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if interval < Duration::from_millis(10) {
        return Err(format!(
            "'{text}' is too short: the interval must be at least 10ms"
        ));
    }
    Ok(interval)
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// The recording (`tracer record -o FILE`).
    #[arg(value_name = "FILE")]
    recording: PathBuf,

    /// What to write.
    #[arg(short, long, value_enum, default_value_t = ReportFormat::Text)]
    format: ReportFormat,

    /// Number of stacks; default 10 for text and json, every stack for the
    /// other formats.
    #[arg(long, value_name = "N")]
    top: Option<usize>,

    /// Only stacks of this memory kind (e.g. heap).
    #[arg(long, value_name = "KIND", value_parser = parse_kind)]
    kind: Option<Kind>,

    /// Only this traced process.
    #[arg(short, long, value_name = "PID")]
    pid: Option<u32>,

    /// Count only what happened after this time since attach (e.g. 30s):
    /// as if tracing had started then.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    from: Option<Duration>,

    /// Leave out what happened after this time since attach (e.g. 2m).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    to: Option<Duration>,

    /// The value of each stack in folded stacks and flame graphs.
    #[arg(long, value_enum, default_value_t = FoldedValue::LiveBytes)]
    value: FoldedValue,

    /// Write to this file instead of standard output.
    #[arg(short, long = "output", value_name = "PATH")]
    output: Option<PathBuf>,
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
#[derive(Clone, Debug)]
pub struct ReportConfig {
    pub recording_path: PathBuf,
    pub format: ReportFormat,
    pub top: Option<usize>,
    pub kind: Option<Kind>,
    pub pid: Option<u32>,
    pub from_s: Option<f64>,
    pub to_s: Option<f64>,
    pub value: FoldedValue,
    pub output_path: Option<PathBuf>,
    /// Stacks drawn in the growth plot.
    pub plot_stacks: usize,
}

fn report_config(args: ReportArgs) -> Result<ReportConfig> {
    if let (Some(from), Some(to)) = (args.from, args.to)
        && from >= to
    {
        return Err(fatal(
            ExitCode::Usage,
            format!(
                "--from {:.3}s is not before --to {:.3}s",
                from.as_secs_f64(),
                to.as_secs_f64()
            ),
        ));
    }
    Ok(ReportConfig {
        recording_path: args.recording,
        format: args.format,
        top: args.top,
        kind: args.kind,
        pid: args.pid,
        from_s: args.from.map(|from| from.as_secs_f64()),
        to_s: args.to.map(|to| to.as_secs_f64()),
        value: args.value,
        output_path: args.output,
        plot_stacks: crate::output::svg::DEFAULT_STACK_LINES,
    })
}

/// A time since attach: a duration, zero included.
fn parse_time(text: &str) -> Result<Duration, String> {
    if text
        .trim()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic())
        == "0"
    {
        return Ok(Duration::ZERO);
    }
    parse_duration(text)
}

fn parse_kind(name: &str) -> Result<Kind, String> {
    Kind::from_name(name).ok_or_else(|| format!("unknown memory kind '{name}' (e.g. heap)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(arguments: &[&str]) -> Result<Parsed> {
        parse(
            ["tracer", "record"]
                .iter()
                .chain(arguments)
                .map(OsString::from),
        )
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_interval("1ms").is_err());
    }

    #[test]
    fn pids_and_command() {
        let Ok(Parsed::Record(config)) =
            record(&["--pid", "2", "-p", "1", "-p", "2", "--top", "3"])
        else {
            panic!("expected a config");
        };
        assert_eq!(config.targets, Targets::Pids(vec![1, 2]));
        assert_eq!(config.top, 3);
        assert_eq!(config.interval, Duration::from_secs(1));
        assert_eq!(config.sampling, Sampling::EXACT);
        let Ok(Parsed::Record(config)) = record(&["--", "./prog", "--flag"]) else {
            panic!("expected a config");
        };
        assert_eq!(
            config.targets,
            Targets::Spawn(vec!["./prog".into(), "--flag".into()])
        );
    }

    #[test]
    fn sampling_and_size_filters() {
        let Ok(Parsed::Record(config)) = record(&[
            "-p",
            "1",
            "--sample-bytes",
            "524288",
            "--sample-seed",
            "7",
            "--min-size",
            "16",
            "--max-size",
            "4096",
        ]) else {
            panic!("expected a config");
        };
        assert_eq!(
            config.sampling,
            Sampling {
                sample_bytes: 524288,
                sample_seed: 7,
                min_size_bytes: 16,
                max_size_bytes: 4096,
            }
        );
        assert!(config.sampling.skips_calls());
        let Ok(Parsed::Floor(floor)) = parse(
            [
                "tracer",
                "floor",
                "--pid",
                "3",
                "--sites",
                "chosen",
                "--entry-only",
            ]
            .iter()
            .map(OsString::from),
        ) else {
            panic!("expected a floor config");
        };
        assert_eq!(
            floor,
            FloorConfig {
                pid: 3,
                sites: FloorSites::Chosen,
                with_return: false
            }
        );
    }

    #[test]
    fn usage_errors_are_one_line_with_code_2() {
        for arguments in [
            &["--pid", "1", "--", "prog"][..],
            &[],
            &["--pid", "x"],
            &["--interval", "0s", "-p", "1"],
            &["-p", "1", "--sample-bytes", "0"],
            &["-p", "1", "--sample-bytes", "268435456"],
            &["-p", "1", "--min-size", "10", "--max-size", "9"],
            &["-p", "1", "--sample-seed", "1"],
        ] {
            let error = record(arguments).err().expect("an error");
            assert_eq!(
                crate::error::exit_code(&error),
                ExitCode::Usage,
                "{arguments:?}"
            );
            assert!(!error.to_string().contains('\n'), "{error}");
        }
    }

    fn report(arguments: &[&str]) -> Result<Parsed> {
        parse(
            ["tracer", "report"]
                .iter()
                .chain(arguments)
                .map(OsString::from),
        )
    }

    #[test]
    fn report_flags() {
        let Ok(Parsed::Report(config)) = report(&[
            "t.tracer", "--format", "folded", "--value", "growth", "--kind", "heap", "-p", "7",
            "--from", "0", "--to", "1m", "-o", "out.txt",
        ]) else {
            panic!("expected a report config");
        };
        assert_eq!(config.recording_path, PathBuf::from("t.tracer"));
        assert_eq!(config.format, ReportFormat::Folded);
        assert_eq!(config.value, FoldedValue::Growth);
        assert_eq!(config.kind, Some(Kind::Heap));
        assert_eq!(
            (config.pid, config.from_s, config.to_s),
            (Some(7), Some(0.0), Some(60.0))
        );
        assert_eq!(config.top, None);
        assert_eq!(config.output_path, Some(PathBuf::from("out.txt")));
        for arguments in [
            &["t.tracer", "--from", "2s", "--to", "1s"][..],
            &["t.tracer", "--kind", "lunar"],
            &["t.tracer", "--format", "xml"],
            &[],
        ] {
            let error = report(arguments).err().expect("an error");
            assert_eq!(
                crate::error::exit_code(&error),
                ExitCode::Usage,
                "{arguments:?}"
            );
        }
    }
}
