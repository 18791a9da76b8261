//! The report: everything a trace found, built once from the model and
//! what the run tells beside it (`model::run::RunFacts`, from a live run
//! or a recording alike), in the shape of its JSON form. `output` writes
//! it in each format; the verbs ask for it.
use std::collections::{BTreeMap, HashMap};

mod drops;
mod groups;

pub use groups::{Entry, SiteGroup, by_site_label, stacks_of_sites};

pub mod evidence;
#[cfg(test)]
pub(crate) mod fixtures;
mod units;

pub use units::{human_bytes, live_totals};

use crate::model::{
    ContextDestroyed, Frame, Growth, Kind, MemoryStatus, Model, Site, StackKey, StackSummary,
    Target, Totals,
    cost::Cost,
    labels,
    leak::{Confidence, Verdict},
    merge,
    peak::{self, Judgement},
    quality::{StackQuality, stack_quality},
    ranking::sort_leaks,
    reachability::{HoldersScan, Reachability},
    run::{LibraryReport, LoaderPauses, ProbeReport, RunFacts, SamplingReport, UnwindingReport},
    site, trim_allocator_frames,
};
use crate::{config::ReportLayout, model::Wrappers};
use evidence::evidence_line;

/// Everything a report shows, in the shape of its JSON form.
///
/// Wide: the JSON report, one field per key.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub tracer_version: String,
    /// Seconds from attach to the last snapshot.
    pub window_s: f64,
    /// The moment the stacks are ranked and judged at when it is not the
    /// end (a target that exited or tore down: its peak; `--at`); null
    /// for the end. Live bytes, totals and series stay the end state.
    pub judged_at: Option<Judgement>,
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
    /// What tracer added to the targets' CPU time over the window, and how
    /// that was estimated; null in a report read from a recording.
    pub cost: Option<Cost>,
    /// How stacks were walked; null for recordings made before tracer
    /// could unwind with DWARF.
    pub unwinding: Option<UnwindingReport>,
    /// The objects that were hooked, when, and how.
    pub libraries: Vec<LibraryEntry>,
    /// How often a process was held at the loader gate, and how long.
    pub loader_pauses: LoaderPauses,
    /// Stack copies whose unwinding stopped before the thread's start, by
    /// reason (their stacks end in a marker frame).
    pub unwinding_stopped: BTreeMap<String, u64>,
    /// Files a target named that tracer refused to open or read past a
    /// truncation, by reason (`target_files`); empty when none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub refused_files: BTreeMap<String, u64>,
    /// The top stacks by live bytes, rank 1 first.
    pub stacks: Vec<StackReport>,
    /// The stacks holding memory that `--top` left out of `stacks`, summed
    /// by process and kind: with `stacks`, they add up to the totals.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unlisted: Vec<Unlisted>,
    /// Stacks judged leaks (as of `judged_at`), fastest first (rank 1 is
    /// shown as L1).
    pub suspected_leaks: Vec<StackReport>,
    /// What each `--holders` scan read and cost, one per process scanned.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holders_scans: Vec<HoldersScan>,
    /// The stacks that share a site, summed: ranked and judged as
    /// `stacks` are, one entry per site.
    pub groups: Vec<SiteGroup>,
    /// The site groups judged leaks, fastest first.
    pub suspected_leak_groups: Vec<SiteGroup>,
    /// How the formats lay the stacks out (`--group-by`, `--native`).
    #[serde(skip)]
    pub layout: ReportLayout,
}

/// The stacks of one process and kind that hold memory but are not listed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Unlisted {
    pub pid: u32,
    pub kind: Kind,
    pub stacks: u64,
    pub live_bytes: i64,
    pub live_allocs: i64,
}

/// A hooked object and how its hooks got there.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LibraryEntry {
    #[serde(flatten)]
    pub library: LibraryReport,
    /// `NoticedBy::hooked`: attach, ahead, at-open, late or loader-stop.
    pub hooked: &'static str,
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
    /// How much of what it allocated has stacks that reach its thread's
    /// start; null when it allocated nothing.
    pub stack_quality: Option<StackQuality>,
    /// Its memory limit and when its suspected leaks reach it; null for a
    /// target gone at the end, and in a report from a recording.
    pub memory_limit: Option<LimitReport>,
}

/// A target's memory limit (its cgroup's, else the host's), and when the
/// growth of its suspected leaks in host memory reaches it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LimitReport {
    #[serde(flatten)]
    pub limit: crate::model::run::MemoryLimit,
    /// The growth of its suspected leaks (host memory kinds: GPU memory
    /// does not count against it), bytes a second.
    pub growth_bytes_per_s: f64,
    /// Seconds until the limit at that growth; null when nothing grows.
    pub reached_in_s: Option<f64>,
}

impl LimitReport {
    /// `limit` of `pid`, with the growth of its suspected `leaks` in host
    /// memory.
    pub fn of(
        pid: u32,
        limit: crate::model::run::MemoryLimit,
        leaks: &[(StackKey, crate::model::leak::Growth)],
    ) -> LimitReport {
        let growth = leaks
            .iter()
            .filter(|(key, _)| key.pid == pid && counts_against_host_limit(key.kind))
            .map(|(_, growth)| growth.rate_bytes_per_s.max(0.0))
            .sum();
        LimitReport::new(limit, growth)
    }

    fn new(limit: crate::model::run::MemoryLimit, growth_bytes_per_s: f64) -> LimitReport {
        let reached_in_s = (growth_bytes_per_s > 0.0).then(|| {
            limit.limit_bytes.saturating_sub(limit.used_bytes) as f64 / growth_bytes_per_s
        });
        LimitReport {
            limit,
            growth_bytes_per_s,
            reached_in_s,
        }
    }
}

/// Whether a kind's bytes count against a process's memory limit (host
/// memory, not the GPU's).
fn counts_against_host_limit(kind: crate::model::Kind) -> bool {
    use crate::model::Kind;
    kind.is_memory()
        && !kind.is_part_of_another()
        && !matches!(kind, Kind::GpuDevice | Kind::GpuManaged)
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
    /// Live bytes of every memory kind (reserved address space and
    /// gpu-tensor, a part of gpu-device, left out).
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
            .filter(|(kind, _)| kind.is_memory() && !kind.is_part_of_another())
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
///
/// Wide: the JSON report's stack entry, one field per key.
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
    /// Live bytes at the moment the report ranks at (`judged_at`, else
    /// the end).
    pub ranked_live_bytes: i64,
    /// The most live bytes the stack held, and when.
    pub peak_live_bytes: i64,
    pub peak_at_s: f64,
    /// Whether it is judged a leak (`verdict` is `leak`).
    pub suspected_leak: bool,
    /// `leak`, `too-early`, `not-leak`, or `empty` (holds nothing).
    pub verdict: Verdict,
    /// How sure the verdict is; null for `empty`.
    pub confidence: Option<Confidence>,
    /// The verdict's evidence in one line, as the text report says it.
    pub evidence: String,
    /// The evidence for or against, in figures.
    pub growth: Growth,
    /// `[elapsed_s, live_bytes]` at attach and at every snapshot.
    pub series: Vec<(f64, i64)>,
    /// Innermost first, allocator frames already trimmed.
    pub frames: Vec<Frame>,
    /// The frame the stack is named by: the first outside the allocator
    /// and the allocation wrappers; null for a stack not recorded.
    pub site: Option<Site>,
    /// Other stacks with the same frames, merged into this one (their
    /// counters and series are included above).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub merged_stack_ids: Vec<u32>,
    /// Who holds its blocks (`record --holders`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reachability: Option<Reachability>,
}

/// What a report is built from: the model, what the run tells beside it
/// (self-contained, from a live run or a recording alike) and how to show
/// it.
pub struct ReportInput<'a> {
    pub model: &'a Model,
    pub run: RunFacts,
    pub view: ReportView<'a>,
}

/// How a report is to show a run: the options of the verb that asks.
#[derive(Clone, Copy, Debug)]
pub struct ReportView<'a> {
    /// How many stacks to rank.
    pub top: usize,
    /// What stacks are named past (`site`).
    pub wrappers: &'a Wrappers,
    /// `--group-by`, `--native`.
    pub layout: ReportLayout,
    /// The moment to judge at (`--at`); `None` lets the report choose
    /// (`model::peak`).
    pub at_s: Option<f64>,
}

impl Report {
    pub fn build(input: ReportInput<'_>) -> Report {
        let stacks = &input.run.stacks;
        let quality = stack_quality(input.model, |key| stacks.reaching_entry.contains(key));
        let (merged, canonical) =
            merge::by_frames(input.model, |key| trim_allocator_frames(stacks.frames(key)));
        let model = merged.as_ref().unwrap_or(input.model);
        let judged_at = peak::judgement(input.model, &input.run.targets, input.view.at_s);
        let judged_model = judged_at.map(|judged| {
            let as_of = input.model.as_of(judged.at_s);
            match &merged {
                Some(_) => as_of.merged(|key| canonical.get(key).copied().unwrap_or(*key)),
                None => as_of,
            }
        });
        let judged = judged_model.as_ref().unwrap_or(model);
        let plain = Views {
            model,
            judged,
            sites: None,
            carried: None,
        };
        let site_map = groups::SiteMap::of(&input, plain);
        // A stack of a leaking site that reads otherwise alone carries the
        // site's verdict (`Model::carried_verdicts`).
        let carried = site_map
            .as_ref()
            .map(|sites| judged.carried_verdicts(&sites.members_of))
            .unwrap_or_default();
        let views = Views {
            carried: Some(&carried),
            ..plain
        };
        let mut leaks = judged.suspected_leaks_among(judged.latest_counters().map(|(key, _)| key));
        leaks.extend(carried.iter().map(|(key, growth)| (*key, *growth)));
        let targets = input
            .run
            .targets
            .iter()
            .map(|target| TargetReport {
                target: target.clone(),
                gpu_contexts_destroyed: target.gpu_contexts_destroyed.clone(),
                totals: by_kind_name(model.totals_for_pid(target.pid)),
                memory: MemoryReconciliation::new(
                    model,
                    target.pid,
                    input.run.memory_status.get(&target.pid),
                ),
                stack_quality: quality.get(&target.pid).copied(),
                memory_limit: input
                    .run
                    .memory_limits
                    .get(&target.pid)
                    .map(|limit| LimitReport::of(target.pid, limit.clone(), &leaks)),
            })
            .collect();
        sort_leaks(&mut leaks);
        leaks.truncate(input.view.top);
        let mut listed = ranked_lists(&input, views, &canonical, judged_model.is_some(), leaks);
        let left_out: Vec<StackSummary> = model
            .top_stacks(usize::MAX)
            .into_iter()
            .filter(|summary| !listed.keys.contains(&summary.key))
            .collect();
        let unlisted = unlisted(&left_out);
        let (mut groups, mut suspected_leak_groups) = groups::site_groups(
            &input,
            plain,
            &canonical,
            judged_model.is_some(),
            site_map.as_ref(),
        );
        distinguish_labels(
            listed
                .stacks
                .iter_mut()
                .chain(listed.suspected_leaks.iter_mut()),
        );
        distinguish_labels(
            groups
                .iter_mut()
                .chain(suspected_leak_groups.iter_mut())
                .map(|group| &mut group.sum),
        );
        let traced = input.run.traced;
        Report {
            tracer_version: env!("CARGO_PKG_VERSION").to_owned(),
            window_s: model.window_s(),
            judged_at,
            interval_ms: input.run.interval_ms,
            snapshots: model.snapshot_count(),
            targets,
            totals: by_kind_name(model.totals()),
            drops: by_name(model.drops()),
            events: by_name(model.events()),
            probes: traced.probes,
            sampling: traced.sampling,
            cost: traced.cost,
            unwinding: traced.unwinding,
            loader_pauses: traced.loader_pauses,
            libraries: traced
                .libraries
                .into_iter()
                .map(|library| LibraryEntry {
                    hooked: library.noticed_by.hooked(),
                    library,
                })
                .collect(),
            unwinding_stopped: traced.unwinding_stopped,
            refused_files: traced.refused_files,
            stacks: listed.stacks,
            unlisted,
            suspected_leaks: listed.suspected_leaks,
            groups,
            suspected_leak_groups,
            layout: input.view.layout,
            holders_scans: Vec::new(),
        }
    }
}

/// The stacks of a model as a report lists them.
struct Listed {
    stacks: Vec<StackReport>,
    suspected_leaks: Vec<StackReport>,
    /// The stacks listed in `stacks`.
    keys: std::collections::HashSet<StackKey>,
}

/// The top stacks of `views` ranked at the moment judged; then, when that
/// is not the end (`judged_elsewhere`), the stacks holding the most at the
/// end that it left out, so the end state is listed too. And the suspected
/// leaks `leaks` (fastest first).
fn ranked_lists(
    input: &ReportInput<'_>,
    views: Views<'_>,
    canonical: &BTreeMap<StackKey, StackKey>,
    judged_elsewhere: bool,
    leaks: Vec<(StackKey, Growth)>,
) -> Listed {
    let mut ranked: Vec<StackKey> = views
        .judged
        .top_stacks(input.view.top)
        .into_iter()
        .map(|summary| summary.key)
        .collect();
    let mut keys: std::collections::HashSet<StackKey> = ranked.iter().copied().collect();
    if judged_elsewhere {
        for summary in views.model.top_stacks(input.view.top) {
            if keys.insert(summary.key) {
                ranked.push(summary.key);
            }
        }
    }
    let merged = merged_ids(canonical);
    let stacks = ranked
        .into_iter()
        .enumerate()
        .map(|(index, key)| stack_report(input, views, &merged, index + 1, key))
        .collect();
    let suspected_leaks = leaks
        .into_iter()
        .enumerate()
        .map(|(index, (key, _))| stack_report(input, views, &merged, index + 1, key))
        .collect();
    Listed {
        stacks,
        suspected_leaks,
        keys,
    }
}

/// Grows the labels of the entries that would read the same by the frame
/// that tells each apart (`labels`); an entry in two lists (ranked and
/// suspected) reads the same in both.
fn distinguish_labels<'a>(entries: impl Iterator<Item = &'a mut StackReport>) {
    let mut entries: Vec<&mut StackReport> = entries.collect();
    let identity = |stack: &StackReport| (stack.pid, stack.kind, stack.stack_id);
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<usize> = (0..entries.len())
        .filter(|&index| seen.insert(identity(entries[index])))
        .collect();
    let labelled: Vec<(&str, &[Frame])> = unique
        .iter()
        .map(|&index| {
            let stack = &*entries[index];
            let label = stack.site.as_ref().map_or("", |site| site.label.as_str());
            (label, stack.frames.as_slice())
        })
        .collect();
    let through: HashMap<(u32, Kind, u32), String> = labels::distinguishing_frames(&labelled)
        .into_iter()
        .zip(&unique)
        .filter_map(|(through, &index)| Some((identity(entries[index]), through?)))
        .collect();
    for entry in &mut entries {
        let id = identity(entry);
        let Some(frame) = through.get(&id) else {
            continue;
        };
        if let Some(site) = &mut entry.site {
            site.label = labels::grown(&site.label, frame);
            site.through = Some(frame.clone());
        }
    }
}

/// The stacks left out, summed by process and kind.
fn unlisted(left_out: &[StackSummary]) -> Vec<Unlisted> {
    let mut sums: BTreeMap<(u32, Kind), Unlisted> = BTreeMap::new();
    for summary in left_out {
        let (pid, kind) = (summary.key.pid, summary.key.kind);
        let sum = sums.entry((pid, kind)).or_insert(Unlisted {
            pid,
            kind,
            stacks: 0,
            live_bytes: 0,
            live_allocs: 0,
        });
        sum.stacks += 1;
        sum.live_bytes += summary.latest.live_bytes;
        sum.live_allocs += summary.latest.live_allocs;
    }
    sums.into_values().collect()
}

/// The merged model at the end, and as of the moment judged (the same
/// when that is the end); for site groups, the stacks of each.
#[derive(Clone, Copy)]
struct Views<'a> {
    model: &'a Model,
    judged: &'a Model,
    sites: Option<Sites<'a>>,
    /// The verdicts stacks of leaking sites carry (`Model::carried_verdicts`).
    carried: Option<&'a HashMap<StackKey, Growth>>,
}

/// The stacks each site group of a model is made of.
#[derive(Clone, Copy)]
struct Sites<'a> {
    /// The judged model by stack (merged for equal frames only).
    stacks: &'a Model,
    /// Each group's key to its stacks' keys in `stacks`.
    members: &'a HashMap<StackKey, Vec<StackKey>>,
}

impl Views<'_> {
    /// The verdict on `key` as of the moment judged: a site group's from
    /// its stacks (`Model::site_growth`), a stack's own otherwise.
    fn growth(&self, key: &StackKey) -> Growth {
        match self
            .sites
            .and_then(|sites| Some((sites.stacks, sites.members.get(key)?)))
        {
            Some((stacks, members)) => stacks.site_growth(members, &stacks.activity(key.pid)),
            None => match self.carried.and_then(|carried| carried.get(key)) {
                Some(carried) => *carried,
                None => self.judged.growth(key),
            },
        }
    }
}

/// The ids of the stacks merged into each stack (`canonical` maps every
/// stack to the one it was merged into), in key order.
fn merged_ids(canonical: &BTreeMap<StackKey, StackKey>) -> HashMap<StackKey, Vec<u32>> {
    let mut merged: HashMap<StackKey, Vec<u32>> = HashMap::new();
    for (other, into) in canonical {
        if other != into {
            merged
                .entry(*into)
                .or_default()
                .push(other.stack_id.to_raw());
        }
    }
    merged
}

/// The report of stack `key` of the merged models; `merged` holds the
/// ids of the stacks merged into each.
fn stack_report(
    input: &ReportInput<'_>,
    views: Views<'_>,
    merged: &HashMap<StackKey, Vec<u32>>,
    rank: usize,
    key: StackKey,
) -> StackReport {
    let Views { model, judged, .. } = views;
    let latest = model
        .series(&key)
        .map(|series| series.latest())
        .unwrap_or_default();
    let ranked = judged
        .series(&key)
        .map(|series| series.latest())
        .unwrap_or_default();
    let growth = views.growth(&key);
    let series = model.live_bytes_at_every_snapshot(&key);
    let (peak_at_s, peak_live_bytes) =
        series.iter().copied().fold(
            (0.0, 0),
            |peak, point| if point.1 > peak.1 { point } else { peak },
        );
    let frames = trim_allocator_frames(input.run.stacks.frames(&key));
    let site = site(&frames, input.view.wrappers);
    StackReport {
        rank,
        pid: key.pid,
        kind: key.kind,
        api: input.run.stacks.apis.get(&key).cloned(),
        stack_id: key.stack_id.to_raw(),
        live_bytes: latest.live_bytes,
        live_allocs: latest.live_allocs,
        alloc_bytes_total: latest.alloc_bytes_total,
        alloc_count_total: latest.alloc_count_total,
        growth_bytes_per_s: growth.rate_bytes_per_s,
        ranked_live_bytes: ranked.live_bytes,
        peak_live_bytes,
        peak_at_s,
        suspected_leak: growth.suspected_leak,
        verdict: growth.verdict,
        confidence: growth.confidence,
        evidence: evidence_line(&growth, evidence::Units::of(key.kind)),
        growth,
        series,
        frames,
        site,
        merged_stack_ids: merged.get(&key).cloned().unwrap_or_default(),
        reachability: None,
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

#[cfg(test)]
mod tests {
    use super::fixtures::sample_report;
    use super::*;
    use crate::model::site::tests::functions;

    /// `import torch` traced from its start: over 100 000 stacks holding
    /// memory, most under one program line. `--top 0` lists them all;
    /// building that report once scanned every stack for each listed one
    /// (merged ids, labels), minutes at this size (the time bound only
    /// catches that, with both cores busy).
    #[test]
    fn every_stack_of_a_hundred_thousand_is_listed_in_bounded_time() {
        use crate::model::{
            Snapshot,
            fixtures::{counters, heap_key, python_frame},
        };
        const PATHS: u32 = 50_000;
        let mut model = Model::new();
        for second in 1..=3_i64 {
            model.push(Snapshot {
                elapsed_s: second as f64,
                // Stacks `n` and `n + PATHS` have equal frames: merged.
                stacks: (0..2 * PATHS)
                    .map(|id| (heap_key(10, id), counters(64 * second)))
                    .collect(),
                ..Snapshot::default()
            });
        }
        let frames = |key: &StackKey| {
            let path = key.stack_id.to_raw() % PATHS;
            vec![
                python_frame("load", "late.py", 5),
                python_frame(&format!("module_{}", path % 7), "m.py", path),
                python_frame("<module>", "late.py", 9),
            ]
        };
        let started = std::time::Instant::now();
        let report = super::fixtures::report_of(&model, usize::MAX, &frames);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(report.stacks.len(), PATHS as usize);
        for stack in &report.stacks {
            assert_eq!(stack.merged_stack_ids, [stack.stack_id + PATHS]);
            let site = stack.site.as_ref().expect("a site");
            let path = stack.stack_id % PATHS;
            assert_eq!(
                site.through.as_deref(),
                Some(format!("module_{} (m.py:{path})", path % 7).as_str()),
                "{}",
                site.label
            );
        }
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
        assert_eq!(report.drops["stack_table_full"], 3);
        assert_eq!(report.events["frees_unknown"], 7);
        assert_eq!(report.events["allocs"], 0);
        assert_eq!(report.probes.len(), 1);
    }
}
