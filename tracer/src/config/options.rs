//! The option types of the stages, as a run is asked for them (`cli`
//! parses the command line into them, `config` carries them, each stage
//! reads its own): what the probes record (`Sampling`), how stacks are
//! taken (`Unwinding`), Python frames (`PythonMode`), how a report lays
//! its stacks out (`ReportLayout`), the folded output's value
//! (`FoldedValue`) and the benchmark floor's sites (`FloorSites`). Here,
//! below the stages, so that `config` names none of them.
use crate::model::run::UnwindMode;
use tracer_ebpf::STACK_PAGE_BYTES;

/// What the probes record: every allocation or a sample, of which sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampling {
    /// Sampling period in bytes (`--sample-bytes`); 0: every allocation.
    pub sample_bytes: u64,
    /// Seed of the sampling decisions; 0: a random one per thread.
    pub sample_seed: u64,
    /// Blocks smaller than this are not recorded.
    pub min_size_bytes: u64,
    /// Blocks larger than this are not recorded.
    pub max_size_bytes: u64,
}

impl Sampling {
    /// Every allocation of every size.
    pub const EXACT: Sampling = Sampling {
        sample_bytes: 0,
        sample_seed: 0,
        min_size_bytes: 0,
        max_size_bytes: u64::MAX,
    };

    /// Whether some calls are not recorded, so may skip their return.
    pub fn skips_calls(&self) -> bool {
        self.sample_bytes != 0 || self.min_size_bytes != 0 || self.max_size_bytes != u64::MAX
    }
}

/// Where the benchmark's empty floor programs go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorSites {
    /// The function entry, where other uprobe tools probe.
    FunctionEntry,
    /// The sites tracer chooses (`prologue`).
    Chosen,
}

/// How stacks are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unwinding {
    pub mode: UnwindMode,
    /// Bytes of stack copied at each allocation, from the start of the
    /// stack pointer's page (`--stack-bytes`, whole pages).
    pub stack_bytes: u32,
    /// Size of the ring buffer of stack copies.
    pub ring_bytes: u32,
    /// Kernel memory for the rows of every unwind table (8 bytes a row).
    pub table_bytes: u32,
}

impl Unwinding {
    pub const DEFAULT_STACK_BYTES: u32 = 16 << 10;
    /// The ring of stack copies, in MiB: about 4 000 copies of 16 KiB, so
    /// that bursts of ordinary programs (Node.js, Python) fit while the
    /// reader thread catches up on a busy machine (16 MiB lost copies
    /// there). Kernel memory, mapped into tracer only once a process's
    /// stacks are copied.
    pub const DEFAULT_RING_MIB: u32 = 64;
    pub const MAX_STACK_BYTES: u32 = 64 << 10;
    /// Room for 8 M rows: a process that imported torch (Debian's 1.13)
    /// maps some 300 objects with about 5.6 M rows, libtorch_cpu's 1.4 M.
    pub const DEFAULT_TABLE_MIB: u32 = 64;
    pub const MAX_TABLE_MIB: u32 = 256;
    pub const DEFAULT: Unwinding = Unwinding {
        mode: UnwindMode::Auto,
        stack_bytes: Self::DEFAULT_STACK_BYTES,
        ring_bytes: Self::DEFAULT_RING_MIB << 20,
        table_bytes: Self::DEFAULT_TABLE_MIB << 20,
    };
    /// Frame pointers only (benchmarks, `tracer floor`).
    pub const FRAME_POINTERS: Unwinding = Unwinding {
        mode: UnwindMode::FramePointers,
        ..Self::DEFAULT
    };

    /// Pages per copy.
    pub fn stack_pages(&self) -> u32 {
        (self.stack_bytes as u64).div_ceil(STACK_PAGE_BYTES) as u32
    }

    /// The kernel's STACK_COPY_MODE.
    pub fn copy_mode(&self) -> u32 {
        match self.mode {
            UnwindMode::FramePointers => 0,
            UnwindMode::Copy => 1,
            UnwindMode::Dwarf | UnwindMode::Auto => 2,
        }
    }

    /// Rows UNWIND_ROWS holds.
    pub fn table_rows(&self) -> u32 {
        self.table_bytes / size_of::<tracer_ebpf::UnwindRow>() as u32
    }

    /// Whether the kernel walks stacks through unwind tables.
    pub fn uses_tables(&self) -> bool {
        matches!(self.mode, UnwindMode::Dwarf | UnwindMode::Auto)
    }
}

/// `--python`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PythonMode {
    /// Python frames for every target running a CPython tracer knows.
    #[default]
    Auto,
    /// Like auto, and an interpreter tracer cannot read is an error.
    On,
    /// Native frames only.
    Off,
}

/// What the report lists as one entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupBy {
    /// The stacks that share a site label (the same function and line,
    /// reached by several call paths), summed into one entry.
    #[default]
    Site,
    /// Every stack on its own.
    Stack,
}

/// Which native frames a stack with Python frames shows in the text
/// report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NativeFrames {
    /// The native frames nearest the allocation, below the innermost
    /// Python frame; the interpreter's own frames, and the native frames
    /// between and below the Python frames, folded into one line each
    /// with their count (as do runs of one Python frame calling itself).
    #[default]
    Nearest,
    /// Every frame.
    All,
}

/// `--group-by` and `--native`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReportLayout {
    pub group_by: GroupBy,
    pub native: NativeFrames,
}

/// What each line's value counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum FoldedValue {
    /// Bytes allocated and not freed at the end of the window.
    #[default]
    LiveBytes,
    /// Blocks allocated and not freed at the end of the window.
    LiveAllocs,
    /// Bytes allocated in the window, freed or not.
    AllocBytes,
    /// Growth of the live bytes over the window, in bytes per second.
    Growth,
}

/// How big the kernel tables are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// Outstanding blocks (LIVE).
    pub live_allocs: u32,
    /// Distinct frame-pointer stacks (STACKS; BY_STACK holds four times
    /// as many per-stack totals: one stack may hold several kinds in
    /// several processes). Both tables take kernel memory only for the
    /// entries used.
    pub stacks: u32,
    /// Bytes of the ring buffer of mapping calls (a power of two, whole
    /// pages).
    pub mapping_ring_bytes: u32,
}

impl MapSizes {
    /// The defaults of `tracer record`.
    pub const DEFAULT: MapSizes = MapSizes {
        live_allocs: 1 << 20,
        stacks: 1 << 17,
        mapping_ring_bytes: 1 << 20,
    };
}

/// When to snapshot and when to stop (`--interval`, `--duration`), and
/// whether the children the targets fork are traced (`--follow-forks`).
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub interval: std::time::Duration,
    pub duration: Option<std::time::Duration>,
    pub follow_forks: bool,
}

/// `--python`, `--python-depth`, `--python-objects` (CPython's allocator
/// hooked, blocks of kind python-object).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonOptions {
    pub mode: PythonMode,
    pub depth: u32,
    pub objects: bool,
}

/// What is probed and how stacks are read.
#[derive(Clone, Debug)]
pub struct Probing {
    pub sampling: Sampling,
    pub unwinding: Unwinding,
    /// Processes may be held at the loader gate (`--no-loader-pause`: not).
    pub loader_pause: bool,
    /// `--resident`: resident pages from page faults, no allocator probe.
    pub resident: bool,
    /// Separate debug files are searched here first (`--debug-dir`).
    pub debug_dirs: Vec<std::path::PathBuf>,
    pub python: PythonOptions,
}

/// How the stacks are shown: how many (`--top`), named past what
/// (`--wrapper` and the built-in list), laid out how (`--group-by`,
/// `--native`).
#[derive(Clone, Debug)]
pub struct Show {
    /// Stacks in the report (and in each section of it).
    pub top: usize,
    pub wrappers: crate::model::Wrappers,
    pub layout: ReportLayout,
}
