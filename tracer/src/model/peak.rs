//! The moment a report judges the stacks at. Usually the end of the
//! window; but a target that exits while traced, or frees most of what it
//! held in its last seconds, has given back what leaked in its teardown
//! (CPython frees its objects at exit): judged at the end, every leak
//! looks freed. Those are judged at their peak, the high-water mark of the
//! traced live bytes (memray's), as they stood before the teardown; the
//! end state is kept beside it. `tracer report --at TIME` asks for another
//! moment.

use super::{Model, Snapshot, StackKey, Target};

/// An exited target whose traced live bytes at the end are below this
/// share of its peak gave back memory in its teardown.
const EXITED_KEPT_SHARE: f64 = 0.9;
/// A live target whose traced live bytes at the end are at most this
/// share of its peak, reached in its last seconds, is tearing down.
const TORN_DOWN_KEPT_SHARE: f64 = 0.5;
/// "Its last seconds": at least this long, or this share of the window.
const LAST_SECONDS_S: f64 = 3.0;
const LAST_SHARE_OF_WINDOW: f64 = 0.1;
/// The peak is the last snapshot within this share of the maximum: the
/// moment just before the teardown, not the first touch of a plateau.
pub(super) const PEAK_SHARE: f64 = 0.99;
/// The plateau a teardown falls from holds at least this share of the
/// peak (the peak itself may be a burst of temporaries before it).
const PLATEAU_SHARE: f64 = 0.75;

/// Why a report is judged at a moment other than the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum JudgedWhy {
    /// A target exited while traced, after freeing some of its memory.
    Exited,
    /// The targets freed most of their memory in the last seconds.
    TornDown,
    /// The user asked (`--at`).
    Asked,
}

/// The moment the stacks are ranked and judged at.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Judgement {
    pub at_s: f64,
    pub why: JudgedWhy,
    /// Traced live bytes of every memory kind then, and at the end.
    pub live_bytes: i64,
    pub end_live_bytes: i64,
}

/// The moment to judge `model` at: `asked_at_s` when given, the peak when
/// the targets exited or tore down, `None` for the end.
pub fn judgement(model: &Model, targets: &[Target], asked_at_s: Option<f64>) -> Option<Judgement> {
    let series = model.traced_live_series();
    let &(end_s, end_live_bytes) = series.last()?;
    if let Some(asked_s) = asked_at_s {
        let &(at_s, live_bytes) = series
            .iter()
            .rev()
            .find(|&&(time_s, _)| time_s <= asked_s)
            .unwrap_or(&series[0]);
        return Some(Judgement {
            at_s,
            why: JudgedWhy::Asked,
            live_bytes,
            end_live_bytes,
        });
    }
    let max_bytes = series.iter().map(|&(_, bytes)| bytes).max()?;
    if max_bytes <= 0 {
        return None;
    }
    let &(at_s, live_bytes) = before_the_fall(&series, max_bytes)?;
    let exited = targets.iter().any(|target| target.exited_after_s.is_some());
    let last_seconds_s = LAST_SECONDS_S.max(LAST_SHARE_OF_WINDOW * end_s);
    let why = if exited && (end_live_bytes as f64) < EXITED_KEPT_SHARE * live_bytes as f64 {
        JudgedWhy::Exited
    } else if (end_live_bytes as f64) <= TORN_DOWN_KEPT_SHARE * live_bytes as f64
        && at_s >= end_s - last_seconds_s
    {
        JudgedWhy::TornDown
    } else {
        return None;
    };
    Some(Judgement {
        at_s,
        why,
        live_bytes,
        end_live_bytes,
    })
}

/// The moment just before the final fall of `series`: the first point of
/// the strictly falling run that ends it, when it held most of the peak
/// (a teardown from a plateau); else the last point within [`PEAK_SHARE`]
/// of the peak `max_bytes`.
fn before_the_fall(series: &[(f64, i64)], max_bytes: i64) -> Option<&(f64, i64)> {
    let mut start = series.len().checked_sub(1)?;
    // Past the flat end after the fall (a target that exited stays put).
    while start > 0 && series[start - 1].1 == series[start].1 {
        start -= 1;
    }
    while start > 0 && series[start - 1].1 > series[start].1 {
        start -= 1;
    }
    if series[start].1 as f64 >= PLATEAU_SHARE * max_bytes as f64 {
        return Some(&series[start]);
    }
    series
        .iter()
        .rev()
        .find(|&&(_, bytes)| bytes as f64 >= PEAK_SHARE * max_bytes as f64)
}

impl Model {
    /// Live bytes of every memory kind (reserved address space and kinds
    /// that are part of another left out), summed over the traced
    /// processes, at every snapshot.
    pub fn traced_live_series(&self) -> Vec<(f64, i64)> {
        let mut sums: Vec<(f64, i64)> = self.times_s.iter().map(|&time_s| (time_s, 0)).collect();
        for ((_, kind), points) in &self.kind_totals {
            if !kind.is_memory() || kind.is_part_of_another() {
                continue;
            }
            // A kind's totals start at the snapshot where it appeared and
            // have a point at every snapshot after.
            let offset = sums.len().saturating_sub(points.len());
            for (sum, &(_, bytes)) in sums[offset..].iter_mut().zip(points) {
                sum.1 += bytes;
            }
        }
        sums
    }

    /// The model as it stood at `at_s`: the snapshots up to then, replayed
    /// with their RSS and CPU readings (the latest drop and event counters are kept: they are not kept per
    /// snapshot).
    pub fn as_of(&self, at_s: f64) -> Model {
        let mut keys: Vec<&StackKey> = self.stacks.keys().collect();
        keys.sort_unstable();
        // Per stack: its series points and the next one to take.
        let mut cursors: Vec<(&StackKey, usize)> = keys.into_iter().map(|key| (key, 0)).collect();
        let mut rss_cursors: Vec<(u32, usize)> =
            self.rss_bytes.keys().map(|&pid| (pid, 0)).collect();
        let mut cpu_cursors: Vec<(u32, usize)> = self.cpu_s.keys().map(|&pid| (pid, 0)).collect();
        let mut model = Model::new();
        for &time_s in self.times_s.iter().take_while(|&&time_s| time_s <= at_s) {
            let mut stacks = Vec::new();
            for (key, next) in &mut cursors {
                let points = self.stacks[*key].series.points();
                while *next < points.len() && points[*next].0 <= time_s {
                    *next += 1;
                }
                if *next > 0 {
                    stacks.push((**key, points[*next - 1].1));
                }
            }
            let mut rss_bytes = Vec::new();
            for (pid, next) in &mut rss_cursors {
                let points = &self.rss_bytes[pid];
                if let Some(&(rss_s, rss)) = points.get(*next)
                    && rss_s <= time_s
                {
                    rss_bytes.push((*pid, rss));
                    *next += 1;
                }
            }
            let mut cpu_s = Vec::new();
            for (pid, next) in &mut cpu_cursors {
                let points = &self.cpu_s[pid];
                if let Some(&(cpu_at_s, cpu)) = points.get(*next)
                    && cpu_at_s <= time_s
                {
                    cpu_s.push((*pid, cpu));
                    *next += 1;
                }
            }
            model.push(Snapshot {
                elapsed_s: time_s,
                stacks,
                stats: self.stats.clone(),
                rss_bytes,
                retired: Vec::new(),
                cpu_s,
            });
        }
        model
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Counters, Kind, fixtures::heap_key, leak::Shape};

    const MIB: i64 = 1 << 20;

    fn held(live_blocks: i64, allocated: i64) -> Counters {
        Counters {
            live_bytes: live_blocks * MIB,
            live_allocs: live_blocks,
            alloc_bytes_total: (allocated * MIB) as u64,
            alloc_count_total: allocated as u64,
        }
    }

    /// A target that leaks 90 blocks per iteration, four iterations of 2 s
    /// each with 2 s pauses, plus 10 blocks of steady state; then in its
    /// last 2 s it frees almost everything (CPython's teardown).
    fn grow_then_teardown() -> Model {
        let leak = heap_key(7, 1);
        let other = heap_key(7, 2);
        let mut model = Model::new();
        for step in 1..=40 {
            let t = f64::from(step) * 0.5;
            let exports = ((t / 4.0).floor() as i64 + i64::from(t % 4.0 >= 2.0)).min(4);
            let (leaked, kept) = if t >= 18.5 {
                (0, 1)
            } else {
                (exports * 90, 10)
            };
            model.push(Snapshot {
                elapsed_s: t,
                stacks: vec![(leak, held(leaked, exports * 90)), (other, held(kept, 10))],
                ..Snapshot::default()
            });
        }
        model
    }

    fn exited_target(after_s: f64) -> Target {
        Target {
            exited_after_s: Some(after_s),
            ..Target::new(7, "python3 repro.py".to_owned())
        }
    }

    #[test]
    fn a_target_that_exits_is_judged_at_its_peak() {
        let model = grow_then_teardown();
        let judged = judgement(&model, &[exited_target(20.2)], None).expect("a judgement");
        assert_eq!(judged.why, JudgedWhy::Exited);
        assert_eq!(judged.at_s, 18.0);
        assert_eq!(judged.live_bytes, 370 * MIB);
        assert_eq!(judged.end_live_bytes, MIB);
        let at_peak = model.as_of(judged.at_s);
        assert_eq!(at_peak.window_s(), 18.0);
        assert_eq!(at_peak.totals()[&Kind::Heap].live_bytes, 370 * MIB);
        let growth = at_peak.growth(&heap_key(7, 1));
        assert_eq!(growth.shape, Some(Shape::Steps), "{growth:?}");
        assert_eq!(growth.steps.map(|steps| steps.count), Some(4));
        assert!(!at_peak.growth(&heap_key(7, 2)).suspected_leak);
        // At the end, the teardown freed it all: nothing to suspect.
        assert!(!model.growth(&heap_key(7, 1)).suspected_leak);
    }

    #[test]
    fn a_live_target_tearing_down_is_judged_at_its_peak() {
        let model = grow_then_teardown();
        let target = Target::new(7, "python3 repro.py".to_owned());
        let judged = judgement(&model, &[target], None).expect("a judgement");
        assert_eq!(judged.why, JudgedWhy::TornDown);
        assert_eq!(judged.at_s, 18.0);
    }

    #[test]
    fn a_cache_cleared_long_before_the_end_is_judged_at_the_end() {
        let cache = heap_key(7, 1);
        let mut model = Model::new();
        for step in 1..=40 {
            let t = f64::from(step) * 0.5;
            let filled = ((t / 2.0).floor() as i64).min(5) * 10;
            let live = if t >= 12.0 { 0 } else { filled };
            model.push(Snapshot {
                elapsed_s: t,
                stacks: vec![(cache, held(live, filled))],
                ..Snapshot::default()
            });
        }
        let target = Target::new(7, "cache".to_owned());
        assert_eq!(judgement(&model, &[target], None), None);
        assert!(!model.growth(&cache).suspected_leak);
    }

    #[test]
    fn asked_moment_is_the_last_snapshot_before_it() {
        let model = grow_then_teardown();
        let target = Target::new(7, "python3 repro.py".to_owned());
        let judged = judgement(&model, &[target], Some(9.8)).expect("asked");
        assert_eq!((judged.why, judged.at_s), (JudgedWhy::Asked, 9.5));
        assert_eq!(judged.live_bytes, (180 + 10) * MIB);
    }

    #[test]
    fn the_model_as_of_a_moment_replays_its_snapshots() {
        let model = grow_then_teardown();
        let at = model.as_of(10.0);
        assert_eq!(at.snapshot_count(), 20);
        assert_eq!(
            at.live_bytes_at_every_snapshot(&heap_key(7, 1)),
            model.live_bytes_at_every_snapshot(&heap_key(7, 1))[..=20]
        );
        assert_eq!(at.traced_live_series(), model.traced_live_series()[..20]);
    }
}
