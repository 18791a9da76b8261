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

use std::collections::{BTreeMap, HashMap};

use tracer_ebpf::{STAT_NAMES, StatClass};

/// A memory kind. Kinds are kept apart everywhere and never summed together.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// malloc-family heap memory.
    Heap,
}

impl Kind {
    /// The kind of a `tracer_ebpf::kind` value, `None` for one this build
    /// does not know.
    pub fn from_raw(raw: u32) -> Option<Kind> {
        match raw {
            tracer_ebpf::kind::HEAP => Some(Kind::Heap),
            _ => None,
        }
    }

    /// The name used in reports; the same as its serialized form.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Heap => "heap",
        }
    }
}

/// One call stack of one process, for one memory kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey {
    pub pid: u32,
    /// Id in the kernel's STACKS map, or `tracer_ebpf::NO_STACK`.
    pub stack_id: u32,
    pub kind: Kind,
}

/// Counters of one stack at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// Bytes allocated since attach and not yet freed. Signed: the kernel
    /// keeps two's-complement sums.
    pub live_bytes: i64,
    pub live_allocs: i64,
    /// Everything allocated since attach, freed or not.
    pub alloc_bytes_total: u64,
    pub alloc_count_total: u64,
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
}

/// One symbolized frame (filled by symbolize).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Frame {
    pub address: u64,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Path of the mapped object the address belongs to.
    pub module: Option<String>,
}

/// A traced process.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Target {
    pub pid: u32,
    pub command: String,
    /// Seconds after attach at which the process exited, if it did.
    pub exited_after_s: Option<f64>,
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
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
#[derive(Clone, Debug)]
pub struct Model {
    stacks: HashMap<StackKey, StackState>,
    time: TimeMoments,
    window_s: f64,
    snapshot_count: usize,
    stats: Vec<u64>,
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
            // The attach point: every stack holds 0 bytes at 0 s.
            time: TimeMoments {
                count: 1,
                mean_s: 0.0,
                m2_s2: 0.0,
            },
            window_s: 0.0,
            snapshot_count: 0,
            stats: Vec::new(),
        }
    }

    /// Adds the next snapshot; snapshots arrive in time order. A stack
    /// missing from it keeps its last counters.
    pub fn push(&mut self, snapshot: Snapshot) {
        let Snapshot {
            elapsed_s,
            stacks,
            stats,
        } = snapshot;
        // A stack seen for the first time held 0 bytes at every earlier time,
        // which is exactly what a default fit (mean 0, co-moment 0) says.
        for (key, counters) in stacks {
            self.stacks.entry(key).or_default().latest = counters;
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

        self.window_s = elapsed_s;
        self.snapshot_count += 1;
        self.stats = stats;
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

    /// The `count` stacks holding the most live bytes; ties go to the faster
    /// growing stack, then to the smaller key. Stacks holding nothing are left
    /// out.
    pub fn top_stacks(&self, count: usize) -> Vec<StackSummary> {
        let mut summaries: Vec<StackSummary> = self
            .stacks
            .iter()
            .filter(|(_, state)| state.latest.live_bytes > 0)
            .map(|(key, state)| StackSummary {
                key: *key,
                latest: state.latest,
                growth_bytes_per_s: self.growth_of(state),
            })
            .collect();
        summaries.sort_by(|a, b| {
            b.latest
                .live_bytes
                .cmp(&a.latest.live_bytes)
                .then(b.growth_bytes_per_s.total_cmp(&a.growth_bytes_per_s))
                .then(a.key.cmp(&b.key))
        });
        summaries.truncate(count);
        summaries
    }

    /// Least-squares slope of the stack's live bytes over the whole window:
    /// from the attach point (0 s, 0 bytes) through every snapshot, with 0
    /// bytes before the stack first appeared. 0 for an unknown stack or a
    /// window with fewer than two distinct times.
    pub fn growth_bytes_per_s(&self, key: &StackKey) -> f64 {
        self.stacks
            .get(key)
            .map_or(0.0, |state| self.growth_of(state))
    }

    fn growth_of(&self, state: &StackState) -> f64 {
        if self.time.m2_s2 > 0.0 {
            state.fit.co_moment_bytes_s / self.time.m2_s2
        } else {
            0.0
        }
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
mod tests {
    use super::*;
    use tracer_ebpf::stat;

    fn heap(pid: u32, stack_id: u32) -> StackKey {
        StackKey {
            pid,
            stack_id,
            kind: Kind::Heap,
        }
    }

    fn live(live_bytes: i64) -> Counters {
        Counters {
            live_bytes,
            live_allocs: 1,
            alloc_bytes_total: live_bytes.max(0) as u64,
            alloc_count_total: 1,
        }
    }

    fn snapshot(elapsed_s: f64, stacks: &[(StackKey, Counters)]) -> Snapshot {
        Snapshot {
            elapsed_s,
            stacks: stacks.to_vec(),
            stats: vec![0; stat::COUNT as usize],
        }
    }

    /// Slope computed the slow, obviously right way (two passes over every
    /// point, attach point included) to check the running fit against.
    fn two_pass_slope(points: &[(f64, f64)]) -> f64 {
        let count = points.len() as f64;
        let mean_s = points.iter().map(|p| p.0).sum::<f64>() / count;
        let mean_bytes = points.iter().map(|p| p.1).sum::<f64>() / count;
        let co_moment: f64 = points
            .iter()
            .map(|p| (p.0 - mean_s) * (p.1 - mean_bytes))
            .sum();
        let m2: f64 = points.iter().map(|p| (p.0 - mean_s).powi(2)).sum();
        co_moment / m2
    }

    #[test]
    fn kind_round_trips_and_serializes_as_its_name() {
        assert_eq!(Kind::from_raw(tracer_ebpf::kind::HEAP), Some(Kind::Heap));
        assert_eq!(Kind::from_raw(999), None);
        assert_eq!(Kind::Heap.as_str(), "heap");
        assert_eq!(serde_json::to_value(Kind::Heap).unwrap(), "heap");
    }

    #[test]
    fn empty_model() {
        let model = Model::new();
        assert_eq!(model.window_s(), 0.0);
        assert_eq!(model.snapshot_count(), 0);
        assert!(model.stats().is_empty());
        assert!(model.drops().is_empty());
        assert!(model.events().iter().all(|&(_, count)| count == 0));
        assert!(model.totals().is_empty());
        assert!(model.top_stacks(10).is_empty());
        assert_eq!(model.growth_bytes_per_s(&heap(1, 1)), 0.0);
    }

    #[test]
    fn linear_ramp_grows_at_its_rate() {
        let key = heap(1, 7);
        let mut model = Model::new();
        for second in 1..=10 {
            model.push(snapshot(second as f64, &[(key, live(100 * second))]));
        }
        assert!((model.growth_bytes_per_s(&key) - 100.0).abs() < 1e-9);
        assert_eq!(model.window_s(), 10.0);
        assert_eq!(model.snapshot_count(), 10);
    }

    #[test]
    fn huge_plateau_has_growth_near_zero() {
        let key = heap(1, 7);
        let live_bytes = 1_i64 << 50;
        let mut model = Model::new();
        let mut points = vec![(0.0, 0.0)];
        for step in 1..=10_000 {
            let elapsed_s = step as f64 * 0.5;
            model.push(snapshot(elapsed_s, &[(key, live(live_bytes))]));
            points.push((elapsed_s, live_bytes as f64));
        }
        let growth = model.growth_bytes_per_s(&key);
        let expected = two_pass_slope(&points);
        assert!(
            (growth - expected).abs() <= expected.abs() * 1e-9,
            "{growth} vs {expected}"
        );
        // Only the attach point tilts the fit, and less with every snapshot.
        assert!(growth < live_bytes as f64 * 1e-6, "{growth}");
        assert!(growth >= 0.0);
    }

    #[test]
    fn ramp_then_plateau_slows_down() {
        let key = heap(1, 7);
        let mut model = Model::new();
        for second in 1..=10 {
            model.push(snapshot(second as f64, &[(key, live(1000 * second))]));
        }
        let while_ramping = model.growth_bytes_per_s(&key);
        for second in 11..=200 {
            model.push(snapshot(second as f64, &[(key, live(10_000))]));
        }
        let after_plateau = model.growth_bytes_per_s(&key);
        assert!((while_ramping - 1000.0).abs() < 1e-6);
        assert!(after_plateau < while_ramping / 20.0, "{after_plateau}");
    }

    #[test]
    fn stack_appearing_midway_counts_zero_before() {
        let early = heap(1, 1);
        let late = heap(1, 2);
        let mut model = Model::new();
        let mut points = vec![(0.0, 0.0)];
        for second in 1..=10 {
            let mut stacks = vec![(early, live(50))];
            let late_bytes = if second > 5 { 200 * (second - 5) } else { 0 };
            if second > 5 {
                stacks.push((late, live(late_bytes)));
            }
            model.push(snapshot(second as f64, &stacks));
            points.push((second as f64, late_bytes as f64));
        }
        let growth = model.growth_bytes_per_s(&late);
        assert!((growth - two_pass_slope(&points)).abs() < 1e-9, "{growth}");
        assert!(growth > 0.0);
        assert_eq!(model.series(&late).unwrap().points()[0].0, 6.0);
    }

    #[test]
    fn fewer_than_two_distinct_times_means_no_growth() {
        let key = heap(1, 1);
        let mut model = Model::new();
        model.push(snapshot(0.0, &[(key, live(4096))]));
        model.push(snapshot(0.0, &[(key, live(8192))]));
        assert_eq!(model.growth_bytes_per_s(&key), 0.0);
    }

    #[test]
    fn absent_stack_keeps_its_counters() {
        let kept = heap(1, 1);
        let other = heap(1, 2);
        let mut model = Model::new();
        model.push(snapshot(1.0, &[(kept, live(300)), (other, live(10))]));
        model.push(snapshot(2.0, &[(other, live(20))]));
        model.push(snapshot(3.0, &[(other, live(30))]));
        let series = model.series(&kept).unwrap();
        assert_eq!(series.latest(), live(300));
        assert_eq!(series.points().last().unwrap().0, 3.0);
        assert_eq!(model.totals()[&Kind::Heap].live_bytes, 330);
    }

    #[test]
    fn identical_runs_keep_their_ends_only() {
        let key = heap(1, 1);
        let mut model = Model::new();
        for (elapsed_s, live_bytes) in [(1.0, 10), (2.0, 20), (3.0, 20), (4.0, 20), (5.0, 20)] {
            model.push(snapshot(elapsed_s, &[(key, live(live_bytes))]));
        }
        model.push(snapshot(6.0, &[(key, live(5))]));
        let series = model.series(&key).unwrap();
        let times: Vec<f64> = series.points().iter().map(|p| p.0).collect();
        assert_eq!(times, [1.0, 2.0, 5.0, 6.0]);
        assert_eq!(series.latest(), live(5));
    }

    #[test]
    fn top_stacks_rank_by_live_bytes_then_growth_then_key() {
        let big = heap(1, 1);
        let growing_tie = heap(2, 5);
        let flat_tie = heap(1, 9);
        let same_as_flat = heap(1, 8);
        let freed = heap(1, 3);
        let negative = heap(1, 4);
        let mut model = Model::new();
        for (elapsed_s, growing_bytes) in [(1.0, 100), (2.0, 300), (3.0, 500)] {
            model.push(snapshot(
                elapsed_s,
                &[
                    (big, live(1000)),
                    (growing_tie, live(growing_bytes)),
                    (flat_tie, live(500)),
                    (same_as_flat, live(500)),
                    (freed, live(if elapsed_s < 3.0 { 40 } else { 0 })),
                    (negative, live(-64)),
                ],
            ));
        }
        let keys: Vec<StackKey> = model.top_stacks(10).iter().map(|s| s.key).collect();
        assert_eq!(keys, [big, growing_tie, same_as_flat, flat_tie]);
        let top_two: Vec<StackKey> = model.top_stacks(2).iter().map(|s| s.key).collect();
        assert_eq!(top_two, [big, growing_tie]);
        let first = &model.top_stacks(1)[0];
        assert_eq!(first.latest, live(1000));
        assert_eq!(first.growth_bytes_per_s, model.growth_bytes_per_s(&big));
    }

    #[test]
    fn totals_per_kind_and_per_pid() {
        let counters = |live_bytes, live_allocs| Counters {
            live_bytes,
            live_allocs,
            ..Counters::default()
        };
        let totals = |live_bytes, live_allocs| Totals {
            live_bytes,
            live_allocs,
        };
        let mut model = Model::new();
        let stacks = [
            (heap(1, 1), counters(100, 2)),
            (heap(1, 2), counters(50, 1)),
        ];
        model.push(snapshot(
            1.0,
            &[stacks[0], stacks[1], (heap(2, 1), counters(1000, 10))],
        ));
        assert_eq!(
            model.totals(),
            BTreeMap::from([(Kind::Heap, totals(1150, 13))])
        );
        assert_eq!(model.totals_for_pid(1)[&Kind::Heap], totals(150, 3));
        assert_eq!(model.totals_for_pid(2)[&Kind::Heap], totals(1000, 10));
        assert!(model.totals_for_pid(3).is_empty());
    }

    #[test]
    fn drops_list_only_nonzero_drop_counters_and_events_list_all() {
        let mut stats = vec![0; stat::COUNT as usize];
        stats[stat::ALLOCS as usize] = 10;
        stats[stat::FREES_UNKNOWN as usize] = 3;
        stats[stat::DROP_STACK_ERROR as usize] = 2;
        stats[stat::DROP_LIVE_FULL as usize] = 5;
        let mut model = Model::new();
        model.push(Snapshot {
            elapsed_s: 1.0,
            stacks: Vec::new(),
            stats,
        });
        assert_eq!(model.drops(), [("live_map_full", 5), ("stack_error", 2)]);
        let events = model.events();
        assert_eq!(events.len(), 7);
        assert_eq!(events[0], ("allocs", 10));
        assert!(events.contains(&("frees_unknown", 3)));
        assert!(events.contains(&("failed_allocs", 0)));
        assert_eq!(model.stats()[stat::ALLOCS as usize], 10);
    }
}
