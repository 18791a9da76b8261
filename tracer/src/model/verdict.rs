//! Is a stack leaking? The verdict on two shapes of growth.
//!
//! Steady growth (`leak::assess`): a straight line until the end. Most
//! leaks are not that: a leak per request or per iteration grows in steps,
//! flat in between, and a user who stops between two steps sees a flat
//! end. So the second shape is step growth, read from the counters: the
//! stack allocated in several separate bursts (intervals in which it
//! allocated, separated by intervals in which it did not), and after each
//! burst its live bytes stayed above where they stood after the one
//! before, until the end (its low-water mark ratchets up). Churn that
//! frees back after each burst, and a cache that is cleared, fall back
//! below an earlier step and are not suspected; a one-time step or two
//! are not "several".

pub use super::leak::{LeakShape, StepGrowth};
use super::{
    Counters, Model, StackKey,
    leak::{self, Growth},
};

/// A stack that grew in fewer separate steps than this is not suspected
/// of step growth: loading a model or two is not a leak.
pub const MIN_STEPS: usize = 3;
/// A step smaller than this share of the stack's largest step is noise
/// (a small allocation in a burst), not counted.
const MIN_STEP_SHARE: f64 = 0.1;

/// A stack that grew in at least this share of the intervals grew
/// steadily, whatever its bursts.
const STEADY_GROWING_FRACTION: f64 = 0.5;

/// The verdict on a stack's counters at every snapshot, in time order,
/// the attach point (0 s, all zero) first.
pub fn judge(points: &[(f64, Counters)]) -> Growth {
    let live: Vec<(f64, i64)> = points
        .iter()
        .map(|&(time_s, counters)| (time_s, counters.live_bytes))
        .collect();
    let mut growth = leak::assess(&live);
    let snapshots = points.len().saturating_sub(1);
    if snapshots >= leak::MIN_SNAPSHOTS {
        growth.steps = steps(points);
    }
    // Steps that take most of the intervals are a steady leak in bursts,
    // and said so; a staircase the line fits too is said as steps.
    let mostly_growing = growth.growing_fraction >= STEADY_GROWING_FRACTION;
    growth.shape = match (growth.suspected_leak, growth.steps.is_some()) {
        (true, false) => Some(LeakShape::Steady),
        (true, true) if mostly_growing => Some(LeakShape::Steady),
        (_, true) => Some(LeakShape::Steps),
        (false, false) => None,
    };
    growth.suspected_leak = growth.shape.is_some();
    growth
}

/// The step evidence of a series, `None` when it did not grow in at least
/// [`MIN_STEPS`] separate steps that all stayed live.
fn steps(points: &[(f64, Counters)]) -> Option<StepGrowth> {
    let last = points.last()?.1;
    if last.live_bytes <= 0 {
        return None;
    }
    // A burst: a run of intervals in which the stack allocated (its total
    // rose, or its live bytes did where totals are not kept).
    let allocated = |pair: &[(f64, Counters)]| {
        let (before, after) = (pair[0].1, pair[1].1);
        after.alloc_count_total > before.alloc_count_total
            || after.alloc_bytes_total > before.alloc_bytes_total
            || after.live_bytes > before.live_bytes
    };
    let flags: Vec<bool> = points.windows(2).map(allocated).collect();
    // Each burst as the index of its first interval and one past its last.
    let mut bursts: Vec<(usize, usize)> = Vec::new();
    for (index, &allocating) in flags.iter().enumerate() {
        match bursts.last_mut() {
            Some((_, end)) if allocating && *end == index => *end = index + 1,
            _ if allocating => bursts.push((index, index + 1)),
            _ => {}
        }
    }
    if bursts.len() < MIN_STEPS {
        return None;
    }
    // The low-water mark after each burst: the fewest live bytes from its
    // end until the next burst begins (the end of the series for the last).
    let floor_between = |from: usize, to: usize| {
        points[from..=to]
            .iter()
            .map(|&(_, counters)| counters.live_bytes)
            .min()
            .unwrap_or(0)
    };
    let mut floor = floor_between(0, bursts[0].0);
    let mut rises: Vec<i64> = Vec::with_capacity(bursts.len());
    for (index, &(_, end)) in bursts.iter().enumerate() {
        let next_start = bursts
            .get(index + 1)
            .map_or(points.len() - 1, |&(start, _)| start);
        let after = floor_between(end, next_start);
        if after < floor {
            // Fell back below an earlier step: churn, or a cache cleared.
            return None;
        }
        rises.push(after - floor);
        floor = after;
    }
    let largest = rises.iter().copied().max().unwrap_or(0);
    let counted: Vec<i64> = rises
        .into_iter()
        .filter(|&rise| rise > 0 && rise as f64 >= MIN_STEP_SHARE * largest as f64)
        .collect();
    if counted.len() < MIN_STEPS {
        return None;
    }
    Some(StepGrowth {
        count: counted.len(),
        typical_step_bytes: counted.iter().sum::<i64>() / counted.len() as i64,
        live_allocs: last.live_allocs,
        alloc_count_total: last.alloc_count_total,
        none_freed: last.live_allocs as u64 == last.alloc_count_total
            && last.live_bytes as u64 == last.alloc_bytes_total,
    })
}

impl Model {
    /// A stack's counters at every snapshot, the attach point (0 s, all
    /// zero) first and zero before the stack appeared.
    pub fn counters_at_every_snapshot(&self, key: &StackKey) -> Vec<(f64, Counters)> {
        let points = self.series(key).map_or(&[][..], super::Series::points);
        let mut next = 0;
        let mut current = Counters::default();
        let mut dense = Vec::with_capacity(self.times_s.len() + 1);
        dense.push((0.0, Counters::default()));
        for &time_s in &self.times_s {
            while next < points.len() && points[next].0 <= time_s {
                current = points[next].1;
                next += 1;
            }
            dense.push((time_s, current));
        }
        dense
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counters of a stack that allocated `allocated` blocks of `block`
    /// bytes and holds `live` of them.
    fn blocks(allocated: i64, live: i64, block: i64) -> Counters {
        Counters {
            live_bytes: live * block,
            live_allocs: live,
            alloc_bytes_total: (allocated * block) as u64,
            alloc_count_total: allocated as u64,
        }
    }

    /// 40 snapshots every 0.5 s (a 20 s trace), attach point first;
    /// `at(t)` gives (blocks allocated so far, blocks live).
    fn series(at: impl Fn(f64) -> (i64, i64), block: i64) -> Vec<(f64, Counters)> {
        std::iter::once((0.0, Counters::default()))
            .chain((1..=40).map(|i| {
                let t = i as f64 * 0.5;
                let (allocated, live) = at(t);
                (t, blocks(allocated, live, block))
            }))
            .collect()
    }

    const MIB: i64 = 1 << 20;

    /// Four exports of 62 blocks each, 1.5 s of work then 1.5 s of pause,
    /// nothing freed; stopped in the long pause after the fourth.
    fn staircase(t: f64) -> (i64, i64) {
        let period_s = 3.0;
        let done = (t / period_s).floor().min(4.0);
        let into = t - done * period_s;
        let current = if done < 4.0 {
            ((into / 1.5).min(1.0) * 62.0) as i64
        } else {
            0
        };
        let allocated = done as i64 * 62 + current;
        (allocated, allocated)
    }

    #[test]
    fn staircase_is_step_growth_though_the_end_is_flat() {
        let growth = judge(&series(staircase, 1_486_000));
        assert!(growth.suspected_leak, "{growth:?}");
        assert_eq!(growth.shape, Some(LeakShape::Steps));
        let steps = growth.steps.expect("steps");
        assert_eq!(steps.count, 4);
        assert_eq!(steps.typical_step_bytes, 62 * 1_486_000);
        assert!(steps.none_freed);
        assert_eq!((steps.live_allocs, steps.alloc_count_total), (248, 248));
        // The steady rule alone would miss it: the second half is flat.
        let live: Vec<(f64, i64)> = series(staircase, 1_486_000)
            .iter()
            .map(|&(t, c)| (t, c.live_bytes))
            .collect();
        assert!(!leak::assess(&live).suspected_leak);
    }

    #[test]
    fn staircase_with_temporaries_freed_is_step_growth() {
        // Each export also makes 40 temporary blocks, freed before its end.
        let growth = judge(&series(
            |t| {
                let (kept, _) = staircase(t);
                let exports = (kept + 61) / 62;
                (kept + exports * 40, kept)
            },
            MIB,
        ));
        assert_eq!(growth.shape, Some(LeakShape::Steps), "{growth:?}");
        assert!(!growth.steps.unwrap().none_freed);
    }

    #[test]
    fn steady_ramp_keeps_the_steady_verdict() {
        let growth = judge(&series(|t| ((t * 10.0) as i64, (t * 10.0) as i64), 4096));
        assert_eq!(growth.shape, Some(LeakShape::Steady), "{growth:?}");
        assert!(growth.steps.is_none(), "one long burst is not steps");
    }

    #[test]
    fn sawtooth_churn_is_not_a_leak() {
        // Fills for 3 s in bursts of 1 s with pauses, frees all, repeats.
        let growth = judge(&series(
            |t| {
                let cycle = (t / 4.0).floor() as i64;
                let into = t % 4.0;
                let filled = ((into.min(3.0)) as i64) * 10;
                (cycle * 30 + filled, if into < 3.5 { filled } else { 0 })
            },
            MIB,
        ));
        assert!(!growth.suspected_leak, "{growth:?}");
    }

    #[test]
    fn cache_grown_in_steps_then_cleared_is_not_a_leak() {
        // Five fills of 10 entries with pauses, cleared at 15 s, then idle.
        let growth = judge(&series(
            |t| {
                let filled = (((t / 3.0).floor() as i64 + 1).min(5)) * 10;
                (filled, if t >= 15.0 { 0 } else { filled })
            },
            MIB,
        ));
        assert!(!growth.suspected_leak, "{growth:?}");
        // Cleared but for one entry: still fell back below its steps.
        let growth = judge(&series(
            |t| {
                let filled = (((t / 3.0).floor() as i64 + 1).min(5)) * 10;
                (filled, if t >= 15.0 { 1 } else { filled })
            },
            MIB,
        ));
        assert!(!growth.suspected_leak, "{growth:?}");
    }

    #[test]
    fn one_or_two_steps_are_not_several() {
        for steps_at in [&[5.0][..], &[5.0, 12.0]] {
            let growth = judge(&series(
                |t| {
                    let done = steps_at.iter().filter(|&&at| t >= at).count() as i64;
                    (done * 50, done * 50)
                },
                MIB,
            ));
            assert!(!growth.suspected_leak, "{steps_at:?}: {growth:?}");
        }
    }

    #[test]
    fn small_allocations_between_steps_do_not_count_as_steps() {
        // Two big steps and three tiny ones: two steps, not five.
        let growth = judge(&series(
            |t| {
                let big = [2.0, 10.0].iter().filter(|&&at| t >= at).count() as i64 * 1000;
                let small = [5.0, 7.0, 14.0].iter().filter(|&&at| t >= at).count() as i64;
                (big + small, big + small)
            },
            MIB,
        ));
        assert!(!growth.suspected_leak, "{growth:?}");
    }

    #[test]
    fn dense_counters_fill_every_snapshot() {
        use crate::model::{Snapshot, fixtures::heap_key};
        let key = heap_key(1, 1);
        let mut model = Model::new();
        model.push(Snapshot {
            elapsed_s: 1.0,
            ..Snapshot::default()
        });
        for (elapsed_s, allocated) in [(2.0, 1), (3.0, 1), (4.0, 1), (5.0, 3)] {
            model.push(Snapshot {
                elapsed_s,
                stacks: vec![(key, blocks(allocated, allocated, 8))],
                ..Snapshot::default()
            });
        }
        let dense = model.counters_at_every_snapshot(&key);
        let allocs: Vec<(f64, u64)> = dense
            .iter()
            .map(|&(t, c)| (t, c.alloc_count_total))
            .collect();
        assert_eq!(
            allocs,
            [(0.0, 0), (1.0, 0), (2.0, 1), (3.0, 1), (4.0, 1), (5.0, 3)]
        );
    }
}
