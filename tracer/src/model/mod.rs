//! Folds the snapshots that `collect` reads from the kernel into per-stack
//! time series, and answers what the report needs: totals per kind, the
//! growth rate of each stack and the ranking of the stacks that hold the most
//! memory.
//!
//! Pure data, no I/O and no aya, so every rule here (what a missing stack
//! means, where the growth window starts) is unit-tested with synthetic
//! snapshots. It stays cheap with thousands of stacks times thousands of
//! snapshots: each push costs one step per known stack, and the growth fit is
//! kept as running sums instead of being recomputed from the points.

pub mod activity;
pub mod allocators;
pub mod cost;
#[cfg(test)]
pub mod fixtures;
mod fold;
pub mod labels;
pub mod leak;
pub mod mappings;
pub mod merge;
pub mod peak;
pub mod quality;
pub mod ranges;
pub mod ranking;
pub mod reachability;
pub mod resident;
pub mod run;
pub mod site;
mod sum;
pub mod verdict;
mod wrappers;

use std::collections::{BTreeMap, HashMap};

pub use fold::{FoldedStacks, Retired};
pub use leak::Growth;
pub use run::{ContextDestroyed, MemoryStatus, Target};
pub use site::{Site, frame_label, module_offset, site, trim_allocator_frames};
pub use wrappers::Wrappers;

use tracer_ebpf::{STAT_NAMES, StatClass};

/// A memory kind. Kinds are kept apart everywhere and never summed together.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// malloc-family heap memory.
    Heap,
    /// CUDA device memory (including VMM physical memory).
    GpuDevice,
    /// CUDA managed (unified) memory.
    GpuManaged,
    /// Page-locked host memory allocated through CUDA.
    GpuHostPinned,
    /// Anonymous mappings made outside any allocator call.
    MmapAnon,
    /// File-backed mappings made outside any allocator call.
    MmapFile,
    /// Program break growth outside any allocator call.
    HeapBrk,
    /// Reserved address space (PROT_NONE, thread stacks): not memory, so
    /// never ranked with the kinds that are.
    MmapReserved,
    /// Blocks of CPython's own allocator (`--python-objects`): Python
    /// objects, most of them in pymalloc's arenas.
    PythonObject,
    /// Blocks PyTorch's CUDA caching allocator handed to tensors: inside
    /// its gpu-device segments, so part of gpu-device, never added to it.
    GpuTensor,
    /// Pages made resident by a fault, charged to the stack that first
    /// touched them (`--resident`, `resident`).
    Resident,
}

impl Kind {
    /// The kind of a `tracer_ebpf::kind` value, `None` for one this build
    /// does not know.
    pub fn from_raw(raw: u32) -> Option<Kind> {
        match raw {
            tracer_ebpf::kind::HEAP => Some(Kind::Heap),
            tracer_ebpf::kind::GPU_DEVICE => Some(Kind::GpuDevice),
            tracer_ebpf::kind::GPU_MANAGED => Some(Kind::GpuManaged),
            tracer_ebpf::kind::GPU_HOST_PINNED => Some(Kind::GpuHostPinned),
            tracer_ebpf::kind::MMAP_ANON => Some(Kind::MmapAnon),
            tracer_ebpf::kind::MMAP_FILE => Some(Kind::MmapFile),
            tracer_ebpf::kind::HEAP_BRK => Some(Kind::HeapBrk),
            tracer_ebpf::kind::MMAP_RESERVED => Some(Kind::MmapReserved),
            tracer_ebpf::kind::PYTHON_OBJECT => Some(Kind::PythonObject),
            tracer_ebpf::kind::GPU_TENSOR => Some(Kind::GpuTensor),
            tracer_ebpf::kind::RESIDENT => Some(Kind::Resident),
            _ => None,
        }
    }

    /// The `tracer_ebpf::kind` value of the kind.
    pub fn to_raw(self) -> u32 {
        match self {
            Kind::Heap => tracer_ebpf::kind::HEAP,
            Kind::GpuDevice => tracer_ebpf::kind::GPU_DEVICE,
            Kind::GpuManaged => tracer_ebpf::kind::GPU_MANAGED,
            Kind::GpuHostPinned => tracer_ebpf::kind::GPU_HOST_PINNED,
            Kind::MmapAnon => tracer_ebpf::kind::MMAP_ANON,
            Kind::MmapFile => tracer_ebpf::kind::MMAP_FILE,
            Kind::HeapBrk => tracer_ebpf::kind::HEAP_BRK,
            Kind::MmapReserved => tracer_ebpf::kind::MMAP_RESERVED,
            Kind::PythonObject => tracer_ebpf::kind::PYTHON_OBJECT,
            Kind::GpuTensor => tracer_ebpf::kind::GPU_TENSOR,
            Kind::Resident => tracer_ebpf::kind::RESIDENT,
        }
    }

    /// The name used in reports; the same as its serialized form.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Heap => "heap",
            Kind::GpuDevice => "gpu-device",
            Kind::GpuManaged => "gpu-managed",
            Kind::GpuHostPinned => "gpu-host-pinned",
            Kind::MmapAnon => "mmap-anon",
            Kind::MmapFile => "mmap-file",
            Kind::HeapBrk => "heap-brk",
            Kind::MmapReserved => "mmap-reserved",
            Kind::PythonObject => "python-object",
            Kind::GpuTensor => "gpu-tensor",
            Kind::Resident => "resident",
        }
    }

    /// Whether the kind is memory (ranked, plotted, suspected of leaking)
    /// rather than address space.
    pub fn is_memory(self) -> bool {
        self != Kind::MmapReserved
    }

    /// Whether the kind's bytes are a part of another kind's (gpu-tensor
    /// blocks of gpu-device segments): ranked and plotted on their own,
    /// left out of every sum over kinds, which would count them twice.
    pub fn is_part_of_another(self) -> bool {
        self == Kind::GpuTensor
    }

    /// The kind named `name` (as `as_str` spells it), `None` for a name this
    /// build does not know.
    pub fn from_name(name: &str) -> Option<Kind> {
        // Every kind has a raw value below 64: the ABI numbers them densely.
        (0..64)
            .filter_map(Kind::from_raw)
            .find(|kind| kind.as_str() == name)
    }
}

/// One call stack of one process, for one memory kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey {
    pub pid: u32,
    pub stack_id: StackId,
    pub kind: Kind,
}

/// A stack, by where its frames are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StackId {
    /// An id in the kernel's STACKS map: walked by frame pointers.
    Kernel(u32),
    /// A stack copied by the kernel and unwound in userspace
    /// (`--unwind copy`), numbered by collect.
    Copied(u32),
    /// The stack of a mapping call (its code and, for a file mapping, the
    /// file), numbered by collect.
    Mapping(u32),
    /// The kernel could not store the stack (the reason is counted).
    Lost,
}

impl StackId {
    /// Raw numbers of mapping stacks start here; the kernel's are below.
    const MAPPING_BASE: u32 = 1 << 31;
    /// Raw numbers of copied stacks start here.
    const COPIED_BASE: u32 = 0xc000_0000;

    /// The number that reports and recordings carry: the kernel's ids as
    /// they are, mapping stacks from 2^31, copied stacks from 0xC000_0000,
    /// a lost stack as `tracer_ebpf::NO_STACK`.
    pub fn to_raw(self) -> u32 {
        match self {
            StackId::Kernel(id) => id,
            StackId::Mapping(index) => Self::MAPPING_BASE + index,
            StackId::Copied(index) => Self::COPIED_BASE + index,
            StackId::Lost => tracer_ebpf::NO_STACK,
        }
    }

    /// The stack a raw number (see `to_raw`) stands for.
    pub fn from_raw(raw: u32) -> StackId {
        match raw {
            tracer_ebpf::NO_STACK => StackId::Lost,
            raw if raw >= Self::COPIED_BASE => StackId::Copied(raw - Self::COPIED_BASE),
            raw if raw >= Self::MAPPING_BASE => StackId::Mapping(raw - Self::MAPPING_BASE),
            raw => StackId::Kernel(raw),
        }
    }
}

/// Written as the number reports carry (`to_raw`).
impl std::fmt::Display for StackId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_raw())
    }
}

/// Counters of one stack at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Bytes allocated since attach and not yet freed. Signed: the kernel
    /// keeps two's-complement sums.
    pub live_bytes: i64,
    pub live_allocs: i64,
    /// Everything allocated since attach, freed or not.
    pub alloc_bytes_total: u64,
    pub alloc_count_total: u64,
}

impl Counters {
    /// Both stacks' counters together (two's-complement sums, as the
    /// kernel keeps them).
    pub fn plus(self, other: Counters) -> Counters {
        Counters {
            live_bytes: self.live_bytes.wrapping_add(other.live_bytes),
            live_allocs: self.live_allocs.wrapping_add(other.live_allocs),
            alloc_bytes_total: self.alloc_bytes_total.wrapping_add(other.alloc_bytes_total),
            alloc_count_total: self.alloc_count_total.wrapping_add(other.alloc_count_total),
        }
    }
}

/// What collect reads from the kernel at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Seconds since attach.
    pub elapsed_s: f64,
    /// Every stack the kernel knows, cumulative since attach.
    pub stacks: Vec<(StackKey, Counters)>,
    /// STATS by index (`tracer_ebpf::stat`), summed over CPUs, cumulative.
    pub stats: Vec<u64>,
    /// Resident set size of each live target, in bytes.
    pub rss_bytes: Vec<(u32, u64)>,
    /// Stacks that hold nothing and will never count again, after their
    /// last counters in `stacks` (`fold`).
    pub retired: Vec<Retired>,
    /// CPU time (user and system) each live target used since it was
    /// attached, in seconds: how much work it did (`activity`).
    pub cpu_s: Vec<(u32, f64)>,
}

/// One symbolized frame (filled by symbolize).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Frame {
    pub address: u64,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Path of the mapped object the address belongs to.
    pub module: Option<String>,
    /// GNU build id of `module`, in hex: names the exact binary, so the
    /// frame can be symbolized again elsewhere.
    pub build_id: Option<String>,
    /// Offset in `module`'s file of the return address.
    pub file_offset: Option<u64>,
    /// The return address as `module`'s ELF virtual address: what `nm`,
    /// `addr2line -e MODULE` and gdb take (the file offset plus the
    /// difference its load segment has between the two).
    pub offset: Option<u64>,
    /// Native code, or a Python function (`file`/`line` then name its
    /// source; no module, address 0).
    pub language: Language,
}

/// What a frame runs.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    #[default]
    Native,
    Python,
}

impl Frame {
    /// `file:line` with the file's name only, when both are known: short
    /// enough for a legend or a table cell.
    pub fn short_location(&self) -> Option<String> {
        let (file, line) = (self.file.as_deref()?, self.line?);
        let name = std::path::Path::new(file)
            .file_name()
            .map_or_else(|| file.into(), |name| name.to_string_lossy());
        Some(format!("{name}:{line}"))
    }
}

/// The counters of one stack over time, from the snapshot where it first
/// appeared to the latest one.
///
/// Runs of identical counters keep only their first and last point: drawn as
/// a line, the series is the same as with one point per snapshot, and a quiet
/// stack costs two points however long the trace runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    points: Vec<(f64, Counters)>,
}

impl Series {
    /// `(elapsed_s, counters)` in time order.
    pub fn points(&self) -> &[(f64, Counters)] {
        &self.points
    }

    /// The counters at the latest snapshot.
    pub fn latest(&self) -> Counters {
        self.points
            .last()
            .map_or_else(Counters::default, |&(_, counters)| counters)
    }

    fn record(&mut self, elapsed_s: f64, counters: Counters) {
        if let [.., (_, before_last), (last_s, last)] = self.points.as_mut_slice()
            && *before_last == counters
            && *last == counters
        {
            *last_s = elapsed_s;
            return;
        }
        self.points.push((elapsed_s, counters));
    }
}

/// Live memory of one kind, summed over stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Totals {
    pub live_bytes: i64,
    pub live_allocs: i64,
}

/// One stack of the ranking.
#[derive(Clone, Debug, PartialEq)]
pub struct StackSummary {
    pub key: StackKey,
    pub latest: Counters,
    pub growth_bytes_per_s: f64,
}

/// Running mean and second moment of the snapshot times, the implicit attach
/// point (0 s) included. Shared by every stack: they all have a value at
/// every time.
#[derive(Clone, Copy, Debug)]
struct TimeMoments {
    count: u64,
    mean_s: f64,
    /// Sum of squared deviations from the mean (s²).
    m2_s2: f64,
}

/// Running least-squares state of one stack's live bytes against time
/// (Welford's online co-moment, which stays exact for huge constant values
/// where the textbook sums would cancel).
#[derive(Clone, Copy, Debug, Default)]
struct LiveBytesFit {
    mean_live_bytes: f64,
    /// Sum of (t - mean t) * (live bytes - mean live bytes), in byte-seconds.
    co_moment_bytes_s: f64,
}

#[derive(Clone, Debug, Default)]
struct StackState {
    latest: Counters,
    series: Series,
    fit: LiveBytesFit,
}

/// Everything known about the traced processes, built from the snapshots.
///
/// Wide: one run's folded series (per stack, per kind, per process: RSS, CPU
/// time, allocation calls), its clock and counters and the stacks folded away,
/// all pushed together per snapshot.
#[derive(Clone, Debug)]
pub struct Model {
    stacks: HashMap<StackKey, StackState>,
    /// Time of every snapshot.
    times_s: Vec<f64>,
    /// Live bytes per (process, kind) at every snapshot.
    kind_totals: BTreeMap<(u32, Kind), Vec<(f64, i64)>>,
    /// RSS of each process at the snapshots where it was alive.
    rss_bytes: BTreeMap<u32, Vec<(f64, u64)>>,
    /// CPU seconds since attach of each process, at the snapshots where
    /// it was alive.
    cpu_s: BTreeMap<u32, Vec<(f64, f64)>>,
    /// Allocation calls each process made since attach (every stack and
    /// kind), at every snapshot from the one where it first appeared.
    process_allocs: BTreeMap<u32, Vec<(f64, u64)>>,
    time: TimeMoments,
    window_s: f64,
    snapshot_count: usize,
    stats: Vec<u64>,
    /// Stacks retired and not folded yet, with whether each reaches its
    /// thread's start.
    retiring: HashMap<StackKey, bool>,
    /// The stacks folded, summed by process and kind.
    folded: BTreeMap<(u32, Kind), FoldedStacks>,
    /// The stacks folded since `take_folded`.
    folded_keys: Vec<StackKey>,
}

impl Default for Model {
    fn default() -> Self {
        Self::new()
    }
}

impl Model {
    pub fn new() -> Self {
        Model {
            stacks: HashMap::new(),
            times_s: Vec::new(),
            kind_totals: BTreeMap::new(),
            rss_bytes: BTreeMap::new(),
            cpu_s: BTreeMap::new(),
            process_allocs: BTreeMap::new(),
            // The attach point: every stack holds 0 bytes at 0 s.
            time: TimeMoments {
                count: 1,
                mean_s: 0.0,
                m2_s2: 0.0,
            },
            window_s: 0.0,
            snapshot_count: 0,
            stats: Vec::new(),
            retiring: HashMap::new(),
            folded: BTreeMap::new(),
            folded_keys: Vec::new(),
        }
    }

    /// Adds the next snapshot; snapshots arrive in time order. A stack
    /// missing from it keeps its last counters; a stack retired in it may
    /// be folded (`fold`).
    pub fn push(&mut self, snapshot: Snapshot) {
        let Snapshot {
            elapsed_s,
            stacks,
            stats,
            rss_bytes,
            retired,
            cpu_s,
        } = snapshot;
        // A stack seen for the first time held 0 bytes at every earlier time,
        // which is exactly what a default fit (mean 0, co-moment 0) says.
        for (key, counters) in stacks {
            self.stacks.entry(key).or_default().latest = counters;
            if !self.retiring.is_empty() {
                // Retired before and seen again: held again.
                self.retiring.remove(&key);
            }
        }

        self.time.count += 1;
        let count = self.time.count as f64;
        let time_deviation_s = elapsed_s - self.time.mean_s;
        self.time.mean_s += time_deviation_s / count;
        self.time.m2_s2 += time_deviation_s * (elapsed_s - self.time.mean_s);

        for state in self.stacks.values_mut() {
            state.series.record(elapsed_s, state.latest);
            let fit = &mut state.fit;
            let live_bytes = state.latest.live_bytes as f64;
            fit.mean_live_bytes += (live_bytes - fit.mean_live_bytes) / count;
            fit.co_moment_bytes_s += time_deviation_s * (live_bytes - fit.mean_live_bytes);
        }

        let mut totals: BTreeMap<(u32, Kind), i64> = BTreeMap::new();
        let mut allocs: BTreeMap<u32, u64> = BTreeMap::new();
        for (key, state) in &self.stacks {
            *totals.entry((key.pid, key.kind)).or_default() += state.latest.live_bytes;
            let calls = allocs.entry(key.pid).or_default();
            *calls = calls.wrapping_add(state.latest.alloc_count_total);
        }
        // The calls of stacks folded away still count: a process's calls
        // never fall (its work would read as none while stacks retire).
        for ((pid, _), folded) in &self.folded {
            let calls = allocs.entry(*pid).or_default();
            *calls = calls.wrapping_add(folded.counters.alloc_count_total);
        }
        for (pid, calls) in allocs {
            self.process_allocs
                .entry(pid)
                .or_default()
                .push((elapsed_s, calls));
        }
        for (pid_kind, live_bytes) in totals {
            self.kind_totals
                .entry(pid_kind)
                .or_default()
                .push((elapsed_s, live_bytes));
        }
        for (pid, rss) in rss_bytes {
            self.rss_bytes
                .entry(pid)
                .or_default()
                .push((elapsed_s, rss));
        }
        for (pid, cpu_s) in cpu_s {
            self.cpu_s.entry(pid).or_default().push((elapsed_s, cpu_s));
        }

        self.times_s.push(elapsed_s);
        self.window_s = elapsed_s;
        self.snapshot_count += 1;
        self.stats = stats;
        self.retire(retired);
    }

    /// Forgets everything about `pid` (a process that exited, followed by
    /// name with --comm): its stacks, totals and RSS, so a restarting
    /// service does not grow the model.
    pub fn forget(&mut self, pid: u32) {
        self.stacks.retain(|key, _| key.pid != pid);
        self.retiring.retain(|key, _| key.pid != pid);
        self.folded.retain(|(folded_pid, _), _| *folded_pid != pid);
        self.kind_totals
            .retain(|(total_pid, _), _| *total_pid != pid);
        self.rss_bytes.remove(&pid);
        self.cpu_s.remove(&pid);
        self.process_allocs.remove(&pid);
    }

    /// Live bytes per (process, kind) over time, one point per snapshot
    /// from the one where the kind first appeared.
    pub fn kind_totals_series(&self) -> &BTreeMap<(u32, Kind), Vec<(f64, i64)>> {
        &self.kind_totals
    }

    /// RSS per process over time.
    pub fn rss_series(&self) -> &BTreeMap<u32, Vec<(f64, u64)>> {
        &self.rss_bytes
    }

    /// A stack's live bytes at every snapshot, the attach point (0 s, 0
    /// bytes) first and 0 before the stack appeared.
    pub fn live_bytes_at_every_snapshot(&self, key: &StackKey) -> Vec<(f64, i64)> {
        let points = self.series(key).map_or(&[][..], Series::points);
        let mut next = 0;
        let mut current = 0;
        let mut dense = Vec::with_capacity(self.times_s.len() + 1);
        dense.push((0.0, 0));
        for &time_s in &self.times_s {
            // Series points are a subset of the snapshot times; a merged
            // run keeps the value of its first point.
            while next < points.len() && points[next].0 <= time_s {
                current = points[next].1.live_bytes;
                next += 1;
            }
            dense.push((time_s, current));
        }
        dense
    }

    /// Seconds from attach to the latest snapshot (0 if none).
    pub fn window_s(&self) -> f64 {
        self.window_s
    }

    pub fn snapshot_count(&self) -> usize {
        self.snapshot_count
    }

    /// The latest STATS, by `tracer_ebpf::stat` index (empty if none).
    pub fn stats(&self) -> &[u64] {
        &self.stats
    }

    /// Drop counters that are not zero, in index order.
    pub fn drops(&self) -> Vec<(&'static str, u64)> {
        self.stats_of_class(StatClass::Drop)
            .filter(|&(_, count)| count > 0)
            .collect()
    }

    /// Every event counter, zeros included, in index order.
    pub fn events(&self) -> Vec<(&'static str, u64)> {
        self.stats_of_class(StatClass::Event).collect()
    }

    fn stats_of_class(&self, class: StatClass) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        STAT_NAMES
            .into_iter()
            .enumerate()
            .filter(move |&(_, (_, entry_class))| entry_class == class)
            .map(|(index, (name, _))| (name, self.stats.get(index).copied().unwrap_or(0)))
    }

    /// Latest live memory per kind, summed over all processes.
    pub fn totals(&self) -> BTreeMap<Kind, Totals> {
        sum_by_kind(self.stacks.iter())
    }

    /// Latest live memory per kind of one process.
    pub fn totals_for_pid(&self, pid: u32) -> BTreeMap<Kind, Totals> {
        sum_by_kind(self.stacks.iter().filter(|(key, _)| key.pid == pid))
    }

    pub fn series(&self, key: &StackKey) -> Option<&Series> {
        self.stacks.get(key).map(|state| &state.series)
    }

    /// Every stack seen, with its counters at the latest snapshot.
    pub fn latest_counters(&self) -> impl Iterator<Item = (StackKey, Counters)> + '_ {
        self.stacks.iter().map(|(key, state)| (*key, state.latest))
    }
}

fn sum_by_kind<'a>(
    stacks: impl Iterator<Item = (&'a StackKey, &'a StackState)>,
) -> BTreeMap<Kind, Totals> {
    let mut totals: BTreeMap<Kind, Totals> = BTreeMap::new();
    for (key, state) in stacks {
        let kind_totals = totals.entry(key.kind).or_default();
        kind_totals.live_bytes += state.latest.live_bytes;
        kind_totals.live_allocs += state.latest.live_allocs;
    }
    totals
}

#[cfg(test)]
mod tests;
