//! The report: what a trace found, built once from the model and the
//! symbolized stacks, then written by one small file per format (`text`,
//! `json`, `folded`, `pprof`, `flamegraph`). Building it apart from the
//! formats keeps every format showing the same numbers, whether the report
//! comes from a live run or from a recording, and lets a new format touch
//! one file.

use std::collections::BTreeMap;
use std::path::Path;

pub use crate::model::run::{
    DwarfProcess, LibraryReport, ProbeReport, SamplingReport, UnwindingReport,
};
use crate::model::{
    ContextDestroyed, Frame, Growth, Kind, MemoryStatus, Model, StackKey, Target, Totals,
    allocators,
};

pub mod file;
pub mod flamegraph;
pub mod folded;
pub mod json;
pub mod pprof;
pub mod svg;
pub mod text;

/// Everything a report shows, in the shape of its JSON form.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub tracer_version: String,
    /// Seconds from attach to the last snapshot.
    pub window_s: f64,
    pub interval_ms: u64,
    pub snapshots: usize,
    pub targets: Vec<TargetReport>,
    /// Live memory at the end, by kind name, summed over every traced process.
    pub totals: BTreeMap<String, Totals>,
    /// Drop counters that are not zero, by name.
    pub drops: BTreeMap<String, u64>,
    /// Every event counter, by name.
    pub events: BTreeMap<String, u64>,
    pub probes: Vec<ProbeReport>,
    pub sampling: SamplingReport,
    /// How stacks were walked; null for recordings made before tracer
    /// could unwind with DWARF.
    pub unwinding: Option<UnwindingReport>,
    /// The objects that were hooked, and when.
    pub libraries: Vec<LibraryReport>,
    /// The top stacks by live bytes, rank 1 first.
    pub stacks: Vec<StackReport>,
    /// Stacks that grew steadily until the end, fastest first (rank 1 is
    /// shown as L1).
    pub suspected_leaks: Vec<StackReport>,
}

/// A traced process and its live memory at the end, by kind name.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TargetReport {
    #[serde(flatten)]
    pub target: Target,
    /// The CUDA contexts it destroyed or reset, with what each released.
    pub gpu_contexts_destroyed: Vec<ContextDestroyed>,
    pub totals: BTreeMap<String, Totals>,
    /// Traced memory next to RSS at the end; null when no RSS is known (the
    /// target exited before the first snapshot).
    pub memory: Option<MemoryReconciliation>,
}

/// A target's traced live bytes next to its resident memory.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MemoryReconciliation {
    /// VmRSS at the end of a live run, else at the target's last snapshot.
    pub rss_bytes: u64,
    /// RssAnon, RssFile and RssShmem at the end of a live run (null in a
    /// report from a recording, which keeps VmRSS only).
    pub rss_anon_bytes: Option<u64>,
    pub rss_file_bytes: Option<u64>,
    pub rss_shmem_bytes: Option<u64>,
    /// Live bytes of every memory kind (reserved address space left out).
    pub traced_bytes: i64,
    /// `rss_bytes - traced_bytes`: memory from before attach, code, stacks,
    /// allocator overhead; negative when traced memory is not resident yet
    /// (mapped but never touched).
    pub gap_bytes: i64,
}

impl MemoryReconciliation {
    fn new(model: &Model, pid: u32, status: Option<&MemoryStatus>) -> Option<Self> {
        let rss_bytes = match status {
            Some(status) => status.rss_bytes,
            None => model.rss_series().get(&pid)?.last()?.1,
        };
        let traced_bytes: i64 = model
            .totals_for_pid(pid)
            .iter()
            .filter(|(kind, _)| kind.is_memory())
            .map(|(_, totals)| totals.live_bytes)
            .sum();
        Some(MemoryReconciliation {
            rss_bytes,
            rss_anon_bytes: status.map(|status| status.rss_anon_bytes),
            rss_file_bytes: status.map(|status| status.rss_file_bytes),
            rss_shmem_bytes: status.map(|status| status.rss_shmem_bytes),
            traced_bytes,
            gap_bytes: rss_bytes as i64 - traced_bytes,
        })
    }
}

/// One ranked stack.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StackReport {
    /// 1-based.
    pub rank: usize,
    pub pid: u32,
    pub kind: Kind,
    /// The CUDA function that made a GPU stack's memory (`cudaMalloc`,
    /// `cuMemAlloc_v2`, ...); absent for heap stacks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
    pub stack_id: u32,
    pub live_bytes: i64,
    pub live_allocs: i64,
    pub alloc_bytes_total: u64,
    pub alloc_count_total: u64,
    pub growth_bytes_per_s: f64,
    /// Whether the growth is steady enough to suspect a leak.
    pub suspected_leak: bool,
    /// The evidence for or against.
    pub growth: Growth,
    /// `[elapsed_s, live_bytes]` at attach and at every snapshot.
    pub series: Vec<(f64, i64)>,
    /// Innermost first, allocator frames already trimmed.
    pub frames: Vec<Frame>,
}

/// What a report is built from.
pub struct ReportInput<'a> {
    pub model: &'a Model,
    pub targets: &'a [Target],
    pub probes: Vec<ProbeReport>,
    pub sampling: SamplingReport,
    pub unwinding: Option<UnwindingReport>,
    pub libraries: Vec<LibraryReport>,
    pub interval_ms: u64,
    /// How many stacks to rank.
    pub top: usize,
    /// The raw symbolized frames of a stack, innermost first.
    pub frames: &'a dyn Fn(&StackKey) -> Vec<Frame>,
    /// The CUDA function that made a stack's memory, if any.
    pub api: &'a dyn Fn(&StackKey) -> Option<String>,
    /// RSS and its parts of the targets still alive, read at the end.
    pub memory_status: BTreeMap<u32, MemoryStatus>,
}

impl Report {
    pub fn build(input: ReportInput<'_>) -> Report {
        let model = input.model;
        let targets = input
            .targets
            .iter()
            .map(|target| TargetReport {
                target: target.clone(),
                gpu_contexts_destroyed: target.gpu_contexts_destroyed.clone(),
                totals: by_kind_name(model.totals_for_pid(target.pid)),
                memory: MemoryReconciliation::new(
                    model,
                    target.pid,
                    input.memory_status.get(&target.pid),
                ),
            })
            .collect();
        let stacks = model
            .top_stacks(input.top)
            .into_iter()
            .enumerate()
            .map(|(index, summary)| stack_report(&input, index + 1, summary.key))
            .collect();
        let suspected_leaks = model
            .suspected_leaks(input.top)
            .into_iter()
            .enumerate()
            .map(|(index, (key, _))| stack_report(&input, index + 1, key))
            .collect();
        Report {
            tracer_version: env!("CARGO_PKG_VERSION").to_owned(),
            window_s: model.window_s(),
            interval_ms: input.interval_ms,
            snapshots: model.snapshot_count(),
            targets,
            totals: by_kind_name(model.totals()),
            drops: by_name(model.drops()),
            events: by_name(model.events()),
            probes: input.probes,
            sampling: input.sampling,
            unwinding: input.unwinding,
            libraries: input.libraries,
            stacks,
            suspected_leaks,
        }
    }
}

fn stack_report(input: &ReportInput<'_>, rank: usize, key: StackKey) -> StackReport {
    let model = input.model;
    let latest = model
        .series(&key)
        .map(|series| series.latest())
        .unwrap_or_default();
    let growth = model.growth(&key);
    StackReport {
        rank,
        pid: key.pid,
        kind: key.kind,
        api: (input.api)(&key),
        stack_id: key.stack_id.to_raw(),
        live_bytes: latest.live_bytes,
        live_allocs: latest.live_allocs,
        alloc_bytes_total: latest.alloc_bytes_total,
        alloc_count_total: latest.alloc_count_total,
        growth_bytes_per_s: growth.rate_bytes_per_s,
        suspected_leak: growth.suspected_leak,
        growth,
        series: model.live_bytes_at_every_snapshot(&key),
        frames: trim_allocator_frames((input.frames)(&key)),
    }
}

fn by_kind_name(totals: BTreeMap<Kind, Totals>) -> BTreeMap<String, Totals> {
    totals
        .into_iter()
        .map(|(kind, totals)| (kind.as_str().to_owned(), totals))
        .collect()
}

fn by_name(counters: Vec<(&'static str, u64)>) -> BTreeMap<String, u64> {
    counters
        .into_iter()
        .map(|(name, count)| (name.to_owned(), count))
        .collect()
}

/// Allocator libraries whose every frame is noise at the top of a stack.
const ALLOCATOR_LIBRARIES: [&str; 3] = ["libjemalloc", "libtcmalloc", "libmimalloc"];

/// The live totals of every kind, one "heap 1.2 MiB live in 300 allocs"
/// phrase each, for status lines.
pub fn live_totals(model: &Model) -> Vec<String> {
    model
        .totals()
        .iter()
        .map(|(kind, totals)| {
            format!(
                "{} {} live in {} allocs",
                kind.as_str(),
                human_bytes(totals.live_bytes as f64),
                totals.live_allocs
            )
        })
        .collect()
}

/// Drops leading allocator frames so the first frame shown is the caller:
/// frames whose function is one of malloc calloc realloc reallocarray free
/// posix_memalign aligned_alloc memalign valloc pvalloc, their `__libc_` /
/// `__GI_` prefixed forms, `operator new` / `operator new[]` (demangled or
/// `_Znwm` / `_Znam`-style mangled), or whose module file name starts with
/// libjemalloc, libtcmalloc or libmimalloc. Never trims every frame: if all
/// match, the last one is kept.
pub fn trim_allocator_frames(mut frames: Vec<Frame>) -> Vec<Frame> {
    let leading = frames
        .iter()
        .take_while(|frame| is_allocator_frame(frame))
        .count()
        .min(frames.len().saturating_sub(1));
    frames.drain(..leading);
    frames
}

fn is_allocator_frame(frame: &Frame) -> bool {
    let in_allocator_library = frame.module.as_deref().is_some_and(|module| {
        let file_name = Path::new(module)
            .file_name()
            .map_or_else(|| module.into(), |name| name.to_string_lossy());
        ALLOCATOR_LIBRARIES
            .iter()
            .any(|library| file_name.starts_with(library))
    });
    in_allocator_library
        || frame
            .function
            .as_deref()
            .is_some_and(allocators::is_allocator_function)
}

/// Human units: 1536 -> "1.5 KiB", 512 -> "512 B", then MiB, GiB and TiB.
/// Negative values keep the sign.
pub fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let sign = if bytes < 0.0 { "-" } else { "" };
    let magnitude = bytes.abs();
    // Thresholds sit where the rounded figure would read 1024 of a unit.
    if magnitude < 1023.5 {
        return format!("{sign}{magnitude:.0} B");
    }
    let mut scaled = magnitude / 1024.0;
    let mut unit = 0;
    while scaled >= 1023.95 && unit + 1 < UNITS.len() {
        scaled /= 1024.0;
        unit += 1;
    }
    format!("{sign}{scaled:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Counters, Snapshot, StackId, run::NoticedBy};

    fn frame(function: &str, module: &str) -> Frame {
        Frame {
            address: 0x1000,
            function: Some(function.to_owned()),
            file: None,
            line: None,
            module: Some(module.to_owned()),
            build_id: Some("0123abcd".to_owned()),
            file_offset: Some(0x1000),
        }
    }

    fn functions(frames: &[Frame]) -> Vec<&str> {
        frames
            .iter()
            .map(|f| f.function.as_deref().unwrap_or("?"))
            .collect()
    }

    const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";
    const APP: &str = "/opt/app/bin/server";

    #[test]
    fn trims_libc_allocator_frames() {
        let frames = vec![
            frame("__GI___libc_malloc", LIBC),
            frame("__libc_calloc", LIBC),
            frame("load_model", APP),
            frame("malloc", APP),
            frame("main", APP),
        ];
        assert_eq!(
            functions(&trim_allocator_frames(frames)),
            ["load_model", "malloc", "main"]
        );
    }

    #[test]
    fn trims_operator_new_in_both_spellings() {
        let libstdcxx = "/usr/lib/libstdc++.so.6";
        let frames = vec![
            frame("operator new[](unsigned long)", libstdcxx),
            frame("_Znwm", libstdcxx),
            frame("_ZnamSt11align_val_t", libstdcxx),
            frame("operator new(unsigned long)", libstdcxx),
            frame("Cache::insert", APP),
        ];
        assert_eq!(functions(&trim_allocator_frames(frames)), ["Cache::insert"]);
    }

    #[test]
    fn trims_allocator_libraries_by_file_name() {
        let frames = vec![
            frame("je_malloc_default", "/usr/lib/libjemalloc.so.2"),
            frame("tc_newarray", "libtcmalloc_minimal.so.4"),
            Frame {
                address: 0x42,
                module: Some("/opt/lib/libmimalloc.so.2".to_owned()),
                ..Frame::default()
            },
            frame("alloc_buffer", "/opt/lib/libjemalloc_user.so"),
        ];
        let trimmed = trim_allocator_frames(frames);
        assert_eq!(trimmed.len(), 1);
        assert_eq!(trimmed[0].function.as_deref(), Some("alloc_buffer"));
    }

    #[test]
    fn keeps_frames_that_only_look_like_allocators() {
        let frames = vec![
            frame("malloc_trim", LIBC),
            frame("my_malloc", APP),
            frame("freelist_pop", APP),
        ];
        assert_eq!(trim_allocator_frames(frames.clone()), frames);
    }

    #[test]
    fn never_trims_every_frame() {
        let frames = vec![frame("__libc_malloc", LIBC), frame("malloc", LIBC)];
        assert_eq!(functions(&trim_allocator_frames(frames)), ["malloc"]);
        assert!(trim_allocator_frames(Vec::new()).is_empty());
    }

    #[test]
    fn human_bytes_picks_a_readable_unit() {
        assert_eq!(human_bytes(0.0), "0 B");
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1023.0), "1023 B");
        assert_eq!(human_bytes(1024.0), "1.0 KiB");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
        assert_eq!(human_bytes(1048575.0), "1.0 MiB");
        assert_eq!(human_bytes(3.0 * 1024.0 * 1024.0), "3.0 MiB");
        assert_eq!(human_bytes(5.5 * 1024.0 * 1024.0 * 1024.0), "5.5 GiB");
        assert_eq!(human_bytes(2.0 * 1024f64.powi(4)), "2.0 TiB");
        assert_eq!(human_bytes(2048.0 * 1024f64.powi(4)), "2048.0 TiB");
        assert_eq!(human_bytes(-1536.0), "-1.5 KiB");
        assert_eq!(human_bytes(-12.0), "-12 B");
        assert_eq!(human_bytes(33.3), "33 B");
    }

    fn key(pid: u32, stack_id: u32) -> StackKey {
        StackKey {
            pid,
            stack_id: StackId::Kernel(stack_id),
            kind: Kind::Heap,
        }
    }

    fn counters(live_bytes: i64) -> Counters {
        Counters {
            live_bytes,
            live_allocs: live_bytes / 64,
            alloc_bytes_total: 2 * live_bytes as u64,
            alloc_count_total: 2 * (live_bytes / 64) as u64,
        }
    }

    /// Two processes; pid 10 leaks 64 KiB/s on stack 1.
    pub(super) fn sample_model() -> Model {
        let mut model = Model::new();
        for second in 1..=4_i64 {
            let mut stats = vec![0; tracer_ebpf::stat::COUNT as usize];
            stats[tracer_ebpf::stat::FREES_UNKNOWN as usize] = 7;
            stats[tracer_ebpf::stat::DROP_STACK_COLLISION as usize] = 3;
            model.push(Snapshot {
                elapsed_s: second as f64,
                stacks: vec![
                    (key(10, 1), counters(65536 * second)),
                    (key(10, 2), counters(4096)),
                    (key(20, 1), counters(8192)),
                    (key(20, 3), counters(0)),
                ],
                stats,
                ..Snapshot::default()
            });
        }
        model
    }

    pub(super) fn sample_frames(key: &StackKey) -> Vec<Frame> {
        vec![
            frame("malloc", LIBC),
            Frame {
                address: 0x401234,
                function: Some(format!("grow_{}", key.stack_id)),
                file: Some("leak.c".to_owned()),
                line: Some(12),
                module: Some(APP.to_owned()),
                build_id: Some("0123abcd".to_owned()),
                file_offset: Some(0x1234),
            },
            frame("main", APP),
        ]
    }

    pub(super) fn sample_report(top: usize) -> Report {
        let model = sample_model();
        let targets = [
            Target {
                pid: 10,
                command: "./leak --fast".to_owned(),
                exited_after_s: None,
                followed_after_s: None,
                execs_after_s: Vec::new(),
                gpu_contexts_destroyed: Vec::new(),
            },
            Target {
                pid: 20,
                command: "python3 export.py".to_owned(),
                exited_after_s: Some(3.2),
                followed_after_s: None,
                execs_after_s: Vec::new(),
                gpu_contexts_destroyed: Vec::new(),
            },
        ];
        Report::build(ReportInput {
            model: &model,
            targets: &targets,
            probes: vec![ProbeReport {
                pid: 10,
                module: LIBC.to_owned(),
                symbol: "malloc".to_owned(),
                offset: 0xa5120,
                offset_in_function: 0,
                single_stepped: false,
                reason: "entry instruction `push %r12` is emulated".to_owned(),
            }],
            sampling: SamplingReport::exact(),
            unwinding: None,
            libraries: vec![
                LibraryReport {
                    pid: 10,
                    path: LIBC.to_owned(),
                    hooked_after_s: 0.0,
                    noticed_by: NoticedBy::Attach,
                    functions: vec!["malloc".to_owned(), "free".to_owned()],
                },
                LibraryReport {
                    pid: 10,
                    path: "/opt/venv/nvidia/cuda_runtime/lib/libcudart.so.12".to_owned(),
                    hooked_after_s: 2.5,
                    noticed_by: NoticedBy::MmapEvent,
                    functions: vec!["cudaMalloc".to_owned(), "cudaFree".to_owned()],
                },
            ],
            interval_ms: 1000,
            top,
            frames: &sample_frames,
            api: &|_| None,
            memory_status: BTreeMap::from([(
                10,
                MemoryStatus {
                    rss_bytes: 1 << 20,
                    rss_anon_bytes: 768 << 10,
                    rss_file_bytes: 256 << 10,
                    rss_shmem_bytes: 0,
                },
            )]),
        })
    }

    #[test]
    fn build_ranks_the_top_stacks_with_trimmed_frames() {
        let report = sample_report(2);
        assert_eq!(report.stacks.len(), 2);
        let first = &report.stacks[0];
        assert_eq!((first.rank, first.pid, first.stack_id), (1, 10, 1));
        assert_eq!(first.kind, Kind::Heap);
        assert_eq!(first.live_bytes, 4 * 65536);
        assert_eq!(first.live_allocs, 4 * 1024);
        assert_eq!(first.alloc_bytes_total, 8 * 65536);
        assert!((first.growth_bytes_per_s - 65536.0).abs() < 1e-6);
        assert_eq!(functions(&first.frames), ["grow_1", "main"]);
        let second = &report.stacks[1];
        assert_eq!((second.rank, second.pid, second.stack_id), (2, 20, 1));
        assert_eq!(
            sample_report(10).stacks.len(),
            3,
            "the empty stack is left out"
        );
    }

    #[test]
    fn build_sums_totals_per_target_and_overall() {
        let report = sample_report(5);
        assert_eq!(report.window_s, 4.0);
        assert_eq!(report.snapshots, 4);
        assert_eq!(report.interval_ms, 1000);
        assert_eq!(report.totals["heap"].live_bytes, 4 * 65536 + 4096 + 8192);
        assert_eq!(
            report.targets[0].totals["heap"].live_bytes,
            4 * 65536 + 4096
        );
        assert_eq!(report.targets[1].totals["heap"].live_allocs, 128);
        let memory = report.targets[0].memory.as_ref().expect("pid 10's RSS");
        assert_eq!(memory.rss_bytes, 1 << 20);
        assert_eq!(memory.rss_anon_bytes, Some(768 << 10));
        assert_eq!(memory.traced_bytes, 4 * 65536 + 4096);
        assert_eq!(memory.gap_bytes, (1 << 20) - 4 * 65536 - 4096);
        assert_eq!(report.targets[1].memory, None, "no RSS known for pid 20");
        assert_eq!(report.drops.len(), 1);
        assert_eq!(report.drops["stack_map_collision"], 3);
        assert_eq!(report.events["frees_unknown"], 7);
        assert_eq!(report.events["allocs"], 0);
        assert_eq!(report.probes.len(), 1);
    }
}
