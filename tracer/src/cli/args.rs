//! The verbs and flags as clap sees them, and their checks and conversion
//! into the configs of `config` (`convert`).
//!
//! Long: the clap definition of every verb's flags (a field per flag) and
//! their checks.
mod convert;

use std::{ffi::OsString, path::PathBuf, time::Duration};

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use self::convert::{config_of, report_config};
use super::{
    Parsed,
    generate::{GenerateArgs, generate},
    help::{
        ABOUT, COMM_HELP, EXIT_CODES, LISTEN_HELP, LONG_ABOUT, RESIDENT_HELP, SAMPLING_HELP,
        UNWIND_HELP,
    },
    values::{parse_duration, parse_interval, parse_kind, parse_ring_kib, parse_time},
};
use crate::{
    config::{
        CommTargets, DEFAULT_PLOT_STACKS, FloorConfig, FloorSites, FoldedValue, GroupBy,
        NativeFrames, PythonMode, RecordConfig, ReportConfig, ReportFormat, ReportLayout,
        Unwinding, parse_listen,
    },
    error::{ExitCode, fatal},
    model::{Kind, Wrappers},
};

#[derive(Debug, Parser)]
#[command(name = "tracer", version, about = ABOUT, long_about = LONG_ABOUT, after_help = EXIT_CODES)]
pub(super) struct Cli {
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
    /// Write tracer's man pages or its bash, zsh or fish completions.
    Generate(GenerateArgs),
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
    /// other formats; 0: every stack.
    #[arg(long, value_name = "N")]
    top: Option<usize>,

    #[command(flatten)]
    filter: FilterArgs,

    #[command(flatten)]
    labels: LabelArgs,

    /// The value of each stack in folded stacks and flame graphs.
    #[arg(long, value_enum, default_value_t = FoldedValue::LiveBytes)]
    value: FoldedValue,

    /// Write to this file instead of standard output.
    #[arg(short, long = "output", value_name = "PATH")]
    output: Option<PathBuf>,
}

/// The part of a recording to use, shared by `report` and `plot`.
#[derive(Debug, Args)]
struct FilterArgs {
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

    /// Rank and judge the stacks as they stood at this time since attach
    /// (e.g. 90s); the end state is kept beside it. By default: the end,
    /// or the peak of a target that exited or tore down.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    at: Option<Duration>,
}

#[derive(Debug, Args)]
struct PlotArgs {
    /// The recording (`tracer record -o FILE`).
    #[arg(value_name = "FILE")]
    recording: PathBuf,

    /// The SVG file to write.
    #[arg(short, long = "output", value_name = "PATH")]
    output: PathBuf,

    #[command(flatten)]
    filter: FilterArgs,

    /// Number of stacks drawn.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PLOT_STACKS)]
    plot_stacks: usize,

    #[command(flatten)]
    labels: LabelArgs,
}

// ---- How stacks are named and symbolized (issue 17): shared by every
// verb that shows stacks.

#[derive(Debug, Args)]
struct LabelArgs {
    /// A function of the program's that only passes allocations on (a
    /// regular expression matched against whole function names, e.g.
    /// 'my_alloc.*'); repeat for several. A stack is named by its first
    /// frame past the allocator and the wrappers; common ones (zmalloc,
    /// g_malloc, xmalloc, PyMem_Malloc, std::allocator, av_malloc,
    /// OPENSSL_malloc, ...) are built in.
    #[arg(long = "wrapper", value_name = "REGEX")]
    wrappers: Vec<String>,

    /// A directory of separate debug files (as /usr/lib/debug: its
    /// .build-id/ab/cdef....debug, or files named by .gnu_debuglink),
    /// searched before /usr/lib/debug; repeat for several. With `tracer
    /// report`, frames the recording has no symbol for are looked up there
    /// by build id.
    #[arg(long = "debug-dir", value_name = "DIR")]
    debug_dirs: Vec<PathBuf>,

    /// One entry per site (the stacks that allocate at the same function
    /// and line, summed, with their count) or per stack.
    #[arg(long, value_enum, value_name = "HOW", default_value_t = GroupBy::Site)]
    group_by: GroupBy,

    /// The native frames of stacks with Python frames: those nearest the
    /// allocation (the interpreter's own folded into one line with their
    /// count), or all of them.
    #[arg(long, value_enum, value_name = "WHICH", default_value_t = NativeFrames::Nearest)]
    native: NativeFrames,
}

impl LabelArgs {
    fn layout(&self) -> ReportLayout {
        ReportLayout {
            group_by: self.group_by,
            native: self.native,
        }
    }

    fn wrappers(&self) -> Result<Wrappers> {
        Wrappers::new(&self.wrappers).map_err(|error| {
            fatal(
                ExitCode::Usage,
                format!("--wrapper is not a regular expression: {error}"),
            )
        })
    }
}

// ---- end of the labels block.

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum UnwindArg {
    Fp,
    Dwarf,
    Auto,
    Copy,
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
///
/// Wide: one field per command-line flag of the verbs that trace (clap derives
/// the parser from it).
#[derive(Debug, Args)]
struct TargetArgs {
    #[command(flatten)]
    labels: LabelArgs,

    /// Process to trace; repeat to trace several.
    #[arg(short, long = "pid", value_name = "PID", conflicts_with = "command")]
    pids: Vec<u32>,

    /// Stop after this long (e.g. 30s, 5m, 500ms); default: until Ctrl-C or
    /// until every target has exited. Once stopped, the report waits at
    /// most 10 s for symbols still being read (a big debug file), or
    /// until a second Ctrl-C: frames not named by then show their module
    /// and offset, and stderr says how many.
    #[arg(short, long, value_name = "DURATION", value_parser = parse_duration)]
    duration: Option<Duration>,

    /// How often to snapshot the per-stack totals.
    #[arg(short, long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval)]
    interval: Duration,

    /// Number of stacks in the report (and in each section of it); 0:
    /// every stack.
    #[arg(long, value_name = "N", default_value_t = 10)]
    top: usize,

    /// Capacity of the in-kernel table of live allocations (about 100 bytes
    /// of kernel memory each); allocations beyond it are counted as dropped.
    #[arg(long = "max-live", value_name = "N", default_value_t = 1 << 20)]
    max_live_allocs: u32,

    /// Capacity of the in-kernel table of distinct frame-pointer call
    /// stacks; stacks beyond it are counted as dropped (stack_table_full).
    /// Distinct stacks never collide below it. Kernel memory: about 80 B
    /// per entry up front (10 MiB at the default), then about 1.2 KiB for
    /// each stack seen (100 000 stacks: ~120 MiB). tracer's own memory
    /// also grows with distinct stacks, and only with them: under 256 MiB
    /// peak RSS on a torch process (README: "tracer's own memory").
    #[arg(long, value_name = "N", default_value_t = 1 << 17)]
    max_stacks: u32,

    /// Size of the ring buffer that carries mmap/munmap/mremap/brk calls to
    /// tracer, in KiB (a power of two, at least 4); calls beyond it between
    /// two drains (every 20 ms) are counted as dropped.
    #[arg(long, value_name = "KIB", default_value_t = 1024, value_parser = parse_ring_kib)]
    ring_buffer_kib: u32,

    /// Count resident pages instead of allocations: no allocator call is
    /// trapped, cheap enough to stay attached (see the long help: what it
    /// sees and misses).
    #[arg(
        long,
        long_help = RESIDENT_HELP,
        conflicts_with_all = ["sample_bytes", "min_size", "max_size", "python_objects"]
    )]
    resident: bool,

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

    /// How stacks are walked: auto, dwarf, fp or copy.
    #[arg(long, value_enum, value_name = "MODE", default_value = "auto", long_help = UNWIND_HELP)]
    unwind: UnwindArg,

    /// With --unwind copy: bytes of stack copied at each allocation, from
    /// the start of the stack pointer's page (4096..=65536, rounded up to
    /// whole pages); deeper stacks are reported truncated, still
    /// attributed to their inner frames.
    #[arg(long, value_name = "BYTES", default_value_t = Unwinding::DEFAULT_STACK_BYTES)]
    stack_bytes: u32,

    /// With --unwind copy: size of the ring buffer of stack copies, in
    /// MiB (a power of two); a thread of tracer empties it every 5 ms, and
    /// at once when a quarter is full; copies that find it full fall back
    /// to frame pointers and are counted. Mapped into tracer (twice: its
    /// RSS counts 2 x MIB) once some process's stacks are copied.
    #[arg(long, value_name = "MIB", default_value_t = Unwinding::DEFAULT_RING_MIB)]
    stack_ring_mib: u32,

    /// With --unwind auto or dwarf: kernel memory for the rows of the unwind
    /// tables, in MiB (8 bytes a row, 1..=256); objects whose table does
    /// not fit are walked by frame pointers, and -v says which.
    #[arg(long, value_name = "MIB", default_value_t = Unwinding::DEFAULT_TABLE_MIB)]
    unwind_table_mib: u32,

    /// Python frames in every stack of a CPython target: auto, on or off.
    #[arg(long, value_enum, value_name = "MODE", default_value = "auto", long_help = PYTHON_HELP)]
    python: PythonMode,

    /// Most Python frames kept per stack (1..=128); deeper Python stacks
    /// keep their innermost frames and are marked truncated (torch's
    /// stacks are often 70-110 frames deep).
    #[arg(long, value_name = "N", default_value_t = 128)]
    python_depth: u32,

    /// Also count Python objects from CPython's own allocator (pymalloc),
    /// as kind python-object (see the long help: its cost, and the
    /// builds where it sees few objects).
    #[arg(long, long_help = PYTHON_OBJECTS_HELP)]
    python_objects: bool,

    /// Print where each probe went and why.
    #[arg(short, long)]
    verbose: bool,

    /// Also trace the child processes the targets fork from now on (as
    /// PyTorch DataLoader workers are), from the moment each is seen;
    /// without it children are not traced and cost nothing.
    #[arg(long)]
    follow_forks: bool,

    /// Never hold a traced process at its dynamic loader: by default a
    /// dlopen() whose libraries tracer has not hooked yet (they were not
    /// foreseen: none of the target's RUNPATH, LD_LIBRARY_PATH or loader
    /// cache holds them) returns only once they are, a pause of a few
    /// milliseconds (0.1-0.2 s for the first CUDA library: tracer's CUDA
    /// programs are verified then; 1 s at the most, enforced by a thread
    /// of its own even if hooking stalls) counted in the report. Without
    /// it, their first calls can be missed.
    #[arg(long)]
    no_loader_pause: bool,

    // --- Spawned commands (`-- COMMAND`) ---
    /// When tracing stops (--duration, Ctrl-C, SIGTERM) leave the command
    /// tracer started running, untraced, and print its PID; by default it
    /// is sent SIGINT (Ctrl-C) or SIGTERM (SIGTERM, --duration) and waited
    /// for, as `perf record` does.
    #[arg(long)]
    leave_running: bool,

    /// Command to start and trace from its start: tracing begins before
    /// the dynamic loader runs any library constructor, follows the
    /// command through exec (a `#!` script runs through its interpreter)
    /// and hooks each library dlopen maps before its constructors run. The
    /// text report goes to stderr (or --text FILE), so the command's
    /// stdout is its own.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,

    #[command(flatten)]
    fleet: FleetArgs,
}

/// `--python`'s long help.
const PYTHON_HELP: &str = "Python frames in every stack of a CPython target (3.9 to 3.13, as a \
    `python3.X` executable or a `libpython3.X.so`): each native _PyEval_EvalFrameDefault frame \
    is replaced by the Python functions it ran, with their file and line, read by the kernel \
    at each recorded allocation from the thread's interpreter frames (one read per Python \
    frame, up to --python-depth). auto: on for each target where tracer finds a CPython it \
    knows, nothing added for the others; on: also an error when no such CPython is found; \
    off: native frames only.";

/// `--python-objects`' long help.
const PYTHON_OBJECTS_HELP: &str = "Also count Python objects: hooks PyObject_Malloc, \
    PyObject_Calloc, PyObject_Realloc, PyObject_Free and the PyMem_ ones in the interpreter (the \
    python3.X executable or libpython3.X.so), so a leak of many small objects (a list of dicts \
    that grows), which pymalloc serves from its own arenas, is named by its Python line. Their \
    blocks are kind python-object; a block such a call takes from malloc (over 512 bytes) or an \
    arena it maps counts once, as a python-object, never again as heap or mmap-anon. Off by \
    default: every object allocation and free of the target then runs a probe. Cost (`cargo \
    xtask bench`, Python row, a 2-vCPU VM, DWARF stack copies): 11.8 us per object allocated \
    and freed at Python depth 10 (15.3 us at depth 50), against 0.1 us untraced, 10.0 us with \
    Python frames alone for a block that reaches malloc, and nothing for the small objects \
    that never do; --sample-bytes 524288 halves it (about 6 us: the probes still trap). Builds \
    that inline pymalloc into its callers (LTO: Debian's /usr/bin/python3.11, the python.org \
    Docker images) call these functions for few objects: tracer says so at attach; start such \
    a program with PYTHONMALLOC=malloc instead (every object is then a heap block, named \
    without this option). Not with --python off.";

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
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PLOT_STACKS)]
    plot_stacks: usize,

    /// At the end, scan the target for who holds each listed stack's
    /// blocks: unreachable bytes (possibly lost apart), holders, path to a
    /// root (Python objects on it named by type, C++ objects by their
    /// vtable's class). Reads the writable mappings, blocked threads' stacks and
    /// registers with process_vm_readv; never stops, writes or signals the
    /// target. Conservative (an integer that looks like a pointer holds a
    /// block); memory allocated before attach is read as glibc's malloc
    /// and CPython's pymalloc see it (their objects, at most 4 Mi, become
    /// untraced blocks, counted by type in the "before attach" census;
    /// free chunks hold nothing), else it is an untraced holder named by
    /// its mapping; the target runs on, so it is a best-effort snapshot
    /// (read twice: the report counts the blocks the rescan classes
    /// otherwise). Cost (`cargo xtask bench`), per GiB read in 500 k
    /// blocks: 1.2 s reading LIVE, 1.6 s a pass (two passes), 74 MiB of
    /// tracer memory (about 150 bytes per traced block).
    #[arg(long, conflicts_with = "resident")]
    holders: bool,

    // --- Spawned commands: where the report goes ---
    /// Write the text report to this file instead of stdout (stderr when
    /// tracer started the command, whose stdout is its own).
    #[arg(long, value_name = "PATH")]
    text: Option<PathBuf>,
}

impl Cli {
    /// What the parsed command line asks for.
    pub(super) fn into_parsed(self) -> Result<Parsed> {
        let cli = self;
        match cli.command {
            Verb::Record(args) => Ok(Parsed::Record(RecordConfig {
                trace: config_of(args.targets)?,
                json_path: args.json,
                svg_path: args.svg,
                svg_every: args.svg_every,
                plot_stacks: args.plot_stacks,
                recording_path: args.output,
                text_path: args.text,
                holders: args.holders,
            })),
            Verb::Top(args) => Ok(Parsed::Top(config_of(args.targets)?)),
            Verb::Report(args) => report_config(args).map(Parsed::Report),
            Verb::Plot(args) => report_config(ReportArgs {
                recording: args.recording,
                format: ReportFormat::Svg,
                top: None,
                filter: args.filter,
                labels: args.labels,
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
            Verb::Generate(args) => {
                generate(&args, <Cli as clap::CommandFactory>::command()).map(Parsed::Print)
            }
        }
    }
}

// ---- Fleet: serving what tracer knows to Prometheus and pprof scrapers
// (issue 18). Kept apart from the flags above.

/// The flags that plug tracer into fleet-wide collection.
#[derive(Debug, Args)]
struct FleetArgs {
    /// Serve /metrics (Prometheus), /debug/pprof/heap, /debug/pprof/growth
    /// and /healthz over HTTP while tracing.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen, long_help = LISTEN_HELP)]
    listen: Option<std::net::SocketAddr>,

    /// Trace every process whose command name is NAME, running now or
    /// started later; repeat for several names.
    #[arg(long = "comm", value_name = "NAME", conflicts_with_all = ["pids", "command"], long_help = COMM_HELP)]
    comms: Vec<String>,

    /// Like --comm, for every command name the regular expression RE
    /// matches (Rust regex syntax, unanchored: write ^name$ for a whole
    /// name); repeatable.
    #[arg(long = "comm-regex", value_name = "RE", conflicts_with_all = ["pids", "command"])]
    comm_regexes: Vec<String>,

    /// With --comm or --comm-regex: the most processes traced at once;
    /// processes found beyond it are left alone (a notice says so).
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_targets: usize,
}

/// The processes --comm and --comm-regex ask for, checked.
fn comm_targets(fleet: &FleetArgs) -> Result<Option<CommTargets>> {
    if fleet.comms.is_empty() && fleet.comm_regexes.is_empty() {
        return Ok(None);
    }
    for name in &fleet.comms {
        if name.is_empty() || name.contains('/') {
            return Err(fatal(
                ExitCode::Usage,
                format!("--comm '{name}': a command name, without '/' (e.g. redis-server)"),
            ));
        }
    }
    for pattern in &fleet.comm_regexes {
        if let Err(error) = regex::Regex::new(pattern) {
            let first = error.to_string();
            let first = first.lines().last().unwrap_or("invalid").trim();
            let first = first.strip_prefix("error: ").unwrap_or(first).to_owned();
            return Err(fatal(
                ExitCode::Usage,
                format!("--comm-regex '{pattern}' is not a regular expression: {first}"),
            ));
        }
    }
    if fleet.max_targets == 0 {
        return Err(fatal(ExitCode::Usage, "--max-targets must be at least 1"));
    }
    Ok(Some(CommTargets {
        names: fleet.comms.clone(),
        patterns: fleet.comm_regexes.clone(),
        max_targets: fleet.max_targets,
    }))
}
