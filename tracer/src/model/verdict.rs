//! Is a stack leaking? The verdict, judged against the target's own work
//! rather than against the snapshot rhythm.
//!
//! What a stack kept is read from its live bytes: from each snapshot on,
//! the least it held at any later one (temporaries freed later do not
//! count). That rose in some intervals (its increments), in runs separated
//! by intervals without a rise (its steps). Then:
//!
//! - a stack that once gave back at least as much as it surely holds
//!   now (what it kept before the last interval, and at least half what
//!   it holds: a sawtooth, a cache that was cleared, churn) is not a leak;
//! - a stack that stopped growing while the target went on working, for
//!   at least as much work as all its growth took (a warm-up, a cache at
//!   its capacity, a pool at its high-water mark), is not a leak: work
//!   is CPU time, allocation calls of the process, or the stack's own
//!   allocation calls (`activity`);
//! - a stack that grew in fewer than [`MIN_INCREMENTS`] increments, or
//!   whose window is shorter than `leak::MIN_SNAPSHOTS`, is too early to
//!   tell;
//! - a stack whose last increment came within about one gap of work
//!   between its increments (still growing, or the target idle since) is
//!   a leak: it grew at every burst of work and kept what it grew by;
//! - otherwise (flat for longer than between its increments, but not yet
//!   for as long as its growth took) it is too early to tell.
//!
//! Idle time does not count: a leak whose target went idle after its last
//! step looks, against the wall clock, like a cache that filled; against
//! the work it does not.

use std::collections::HashMap;

use super::{
    Counters, Model, StackKey,
    activity::Activity,
    leak::{
        self, Clock, Confidence, Growth, LeakingPart, Shape, StepGrowth, Verdict, Work,
        WorkEvidence,
    },
};

/// A stack that grew in fewer intervals than this is too early to tell:
/// loading a model or two is not a leak.
pub const MIN_INCREMENTS: usize = 3;
/// A rise smaller than this share of the stack's mean rise is noise (a
/// small allocation between its bursts), not an increment.
const MIN_STEP_SHARE: f64 = 0.1;
/// A stack that grew in at least this share of the intervals grew
/// steadily, whatever its steps.
const STEADY_GROWING_FRACTION: f64 = 0.5;
/// CPU time below this says nothing (the kernel counts in 10 ms ticks).
const MIN_CPU_S: f64 = 0.1;
/// The work since the last increment is "recent" up to this many times
/// the most work between two increments...
const RECENT_GAPS: f64 = 1.5;
/// ... plus this share of an increment's mean work (a background thread,
/// the kernel's tick rounding).
const RECENT_SLACK_SHARE: f64 = 0.25;
/// Work after the growth that goes on below this share of the rate it
/// went on at while growing is background (a timer), not work going on.
const MIN_RATE_SHARE: f64 = 0.2;
/// A leak that grew in this many separate steps, or is still growing
/// after this many increments, is sure (high confidence).
const SURE_STEPS: usize = 3;
const SURE_INCREMENTS: usize = 5;
/// Not a leak, surely, once flat through this many times the work its
/// growth took, or after giving back this many times.
const SURE_WORK_SHARE: f64 = 2.0;
const SURE_FALLS: usize = 2;

/// The verdict on a stack's counters at every snapshot, in time order,
/// the attach point (0 s, all zero) first, against its process's work at
/// the same snapshots.
pub fn judge(points: &[(f64, Counters)], activity: &Activity) -> Growth {
    judge_with_increments(points, activity).0
}

/// [`judge`], with the intervals in which what the stack kept rose
/// materially (its increments; none where there is nothing to judge).
fn judge_with_increments(points: &[(f64, Counters)], activity: &Activity) -> (Growth, Vec<usize>) {
    let live: Vec<(f64, i64)> = points
        .iter()
        .map(|&(time_s, counters)| (time_s, counters.live_bytes))
        .collect();
    let mut growth = leak::assess(&live);
    let Some(&(_, last)) = points.last() else {
        return (growth, Vec::new());
    };
    let snapshots = points.len() - 1;
    if last.live_bytes <= 0 || snapshots == 0 {
        return (growth, Vec::new());
    }
    let rises = Rises::of(points);
    let (Some(&first), Some(&last_increment)) = (rises.increments.first(), rises.increments.last())
    else {
        return (growth, Vec::new());
    };
    growth.steps = Some(rises.evidence(last));
    let clocks = Clocks::new(points, activity);
    let (start, end) = (first - 1, last_increment);
    let work = clocks.evidence(start, end, snapshots, &rises.increments);
    let increments = rises.increments.len();
    let mostly_growing = growth.growing_fraction >= STEADY_GROWING_FRACTION;
    let grew_as = if rises.steps >= 2 && !mostly_growing {
        Shape::Steps
    } else {
        Shape::Steady
    };
    let worked_on = clocks.worked_on(start, end, snapshots);
    let not_recent = clocks.not_recent(start, end, snapshots, &rises.increments);
    let (verdict, shape, confidence, decided_by) = if rises.falls > 0 {
        let sure = rises.falls >= SURE_FALLS;
        (Verdict::NotLeak, Shape::Churn, sure, None)
    } else if let Some((clock, share)) = worked_on {
        let sure = share >= SURE_WORK_SHARE;
        (Verdict::NotLeak, Shape::Bounded, sure, Some(clock))
    } else if snapshots < leak::MIN_SNAPSHOTS || increments < MIN_INCREMENTS {
        (Verdict::TooEarly, grew_as, false, None)
    } else if not_recent.is_some() {
        (Verdict::TooEarly, grew_as, false, not_recent)
    } else {
        // Its last rise in the last interval or the one before (a final
        // snapshot taken just after it stopped).
        let still_growing = end + 1 >= snapshots && increments >= SURE_INCREMENTS;
        let sure = rises.steps >= SURE_STEPS || still_growing;
        (Verdict::Leak, grew_as, sure, None)
    };
    growth.verdict = verdict;
    growth.suspected_leak = verdict == Verdict::Leak;
    growth.shape = Some(shape);
    growth.confidence = Some(match (verdict, confidence) {
        (Verdict::TooEarly, _) => Confidence::Low,
        (_, true) => Confidence::High,
        (_, false) => Confidence::Medium,
    });
    growth.work = Some(WorkEvidence { decided_by, ..work });
    (growth, rises.increments)
}

impl Growth {
    /// For a verdict too early to tell: how many more increments would
    /// make it a leak (too few so far), or how many increments' worth of
    /// work without growth would make it not one (flat, but not yet for as
    /// long as its growth took). None for other verdicts, and for a window
    /// of too few snapshots.
    pub fn more_to_decide(&self) -> Option<usize> {
        if self.verdict != Verdict::TooEarly {
            return None;
        }
        let steps = self.steps?;
        if steps.increments < MIN_INCREMENTS {
            return Some(MIN_INCREMENTS - steps.increments);
        }
        let work = self.work?;
        let (during, since) = match work.decided_by? {
            Clock::Cpu => (work.while_growing.cpu_s?, work.since_last_increment.cpu_s?),
            Clock::Allocs => (
                work.while_growing.allocs as f64,
                work.since_last_increment.allocs as f64,
            ),
            Clock::SiteAllocs => (
                work.while_growing.site_allocs as f64,
                work.since_last_increment.site_allocs as f64,
            ),
        };
        let per_increment = during / steps.increments as f64;
        Some(((during - since) / per_increment).ceil().max(1.0) as usize)
    }
}

/// What a series kept, and what it gave back.
struct Rises {
    /// The intervals (1 = from the attach point to the first snapshot) in
    /// which what it kept rose materially.
    increments: Vec<usize>,
    /// Runs of consecutive increments.
    steps: usize,
    /// The bytes it kept from the attach point to the end.
    kept_bytes: i64,
    peak_live_bytes: i64,
    /// The most it fell from a peak, and how many times it fell by at
    /// least what it surely holds at the end.
    given_back_bytes: i64,
    falls: usize,
}

impl Rises {
    fn of(points: &[(f64, Counters)]) -> Rises {
        let live: Vec<i64> = points.iter().map(|(_, c)| c.live_bytes).collect();
        let end_bytes = *live.last().expect("a series");
        // What it kept from each snapshot on: the least it held later.
        let mut kept = live.clone();
        for index in (0..kept.len() - 1).rev() {
            kept[index] = kept[index].min(kept[index + 1]);
        }
        let rise = |index: usize| kept[index] - kept[index - 1];
        let rising: Vec<i64> = (1..kept.len()).map(rise).filter(|&b| b > 0).collect();
        let mean = rising.iter().sum::<i64>() as f64 / rising.len().max(1) as f64;
        // The steps: runs of consecutive increments, (first, last).
        let mut steps: Vec<(usize, usize)> = Vec::new();
        for index in (1..kept.len()).filter(|&index| {
            let bytes = rise(index);
            bytes > 0 && bytes as f64 >= MIN_STEP_SHARE * mean
        }) {
            match steps.last_mut() {
                Some((_, end)) if *end + 1 == index => *end = index,
                _ => steps.push((index, index)),
            }
        }
        drop_one_block_in_flight(&mut steps, &kept, points);
        let increments: Vec<usize> = steps.iter().flat_map(|&(first, end)| first..=end).collect();
        let steps = steps.len();
        // Falls from the highest point since the last fall, by what it
        // surely holds: what it kept before the last interval (the rise in
        // it has nothing after to confirm it: a sawtooth sampled in a
        // fill), and at least half what it holds now.
        let confirmed = kept[kept.len().saturating_sub(2)].max(end_bytes / 2).max(1);
        let (mut peak, mut highest, mut given_back, mut falls) = (0, 0, 0, 0);
        for &bytes in &live {
            peak = peak.max(bytes);
            highest = highest.max(bytes);
            given_back = given_back.max(highest - bytes);
            if peak - bytes >= confirmed {
                falls += 1;
                peak = bytes;
            }
        }
        Rises {
            increments,
            steps,
            kept_bytes: end_bytes - kept[0],
            peak_live_bytes: highest,
            given_back_bytes: given_back,
            falls,
        }
    }

    fn evidence(&self, last: Counters) -> StepGrowth {
        StepGrowth {
            count: self.steps,
            increments: self.increments.len(),
            typical_step_bytes: self.kept_bytes / self.steps.max(1) as i64,
            live_allocs: last.live_allocs,
            alloc_count_total: last.alloc_count_total,
            none_freed: last.live_allocs as u64 == last.alloc_count_total
                && last.live_bytes as u64 == last.alloc_bytes_total,
            peak_live_bytes: self.peak_live_bytes,
            given_back_bytes: self.given_back_bytes,
            falls: self.falls,
        }
    }
}

/// Drops from `steps` (runs of increments, (first, last)) a step of at
/// most one block (the stack's mean block at the end), when it is the only
/// such step beside larger ones: a snapshot that caught the stack between
/// a free and the malloc that replaces it (a cache evicting, then
/// inserting) read it a block short, and what it kept rises by that block
/// after the snapshot. Rises of one block that repeat are steps (a leak of
/// one block per request). `kept` is what it kept from each snapshot on.
fn drop_one_block_in_flight(
    steps: &mut Vec<(usize, usize)>,
    kept: &[i64],
    points: &[(f64, Counters)],
) {
    let Some(&(_, last)) = points.last() else {
        return;
    };
    if last.live_allocs <= 0 || steps.len() < 2 {
        return;
    }
    let block = last.live_bytes / last.live_allocs;
    let is_one_block = |&(first, end): &(usize, usize)| kept[end] - kept[first - 1] <= block;
    if let [one] = steps
        .iter()
        .filter(|step| is_one_block(step))
        .collect::<Vec<_>>()[..]
    {
        let one = *one;
        steps.retain(|step| *step != one);
    }
}

/// The clocks of the target's work at every snapshot, cumulative.
struct Clocks {
    times_s: Vec<f64>,
    cpu_s: Option<Vec<f64>>,
    allocs: Vec<f64>,
    site_allocs: Vec<f64>,
}

impl Clocks {
    fn new(points: &[(f64, Counters)], activity: &Activity) -> Clocks {
        let dense = |values: &[f64]| (values.len() == points.len()).then(|| values.to_vec());
        let site_allocs: Vec<f64> = points
            .iter()
            .map(|(_, counters)| counters.alloc_count_total as f64)
            .collect();
        let allocs: Vec<f64> = activity.process_allocs.iter().map(|&n| n as f64).collect();
        Clocks {
            times_s: points.iter().map(|&(time_s, _)| time_s).collect(),
            cpu_s: activity.cpu_s.as_deref().and_then(dense),
            // A stack's process made at least the stack's own calls.
            allocs: dense(&allocs).unwrap_or_else(|| site_allocs.clone()),
            site_allocs,
        }
    }

    /// Each clock with its values and the least work it can tell.
    fn each(&self) -> impl Iterator<Item = (Clock, &[f64], f64)> {
        self.cpu_s
            .as_deref()
            .map(|cpu_s| (Clock::Cpu, cpu_s, MIN_CPU_S))
            .into_iter()
            .chain([
                (Clock::Allocs, self.allocs.as_slice(), 1.0),
                (Clock::SiteAllocs, self.site_allocs.as_slice(), 1.0),
            ])
    }

    fn work(&self, from: usize, to: usize) -> Work {
        let since = |values: &[f64]| (values[to] - values[from]).max(0.0);
        Work {
            cpu_s: self.cpu_s.as_deref().map(since),
            allocs: since(&self.allocs) as u64,
            site_allocs: since(&self.site_allocs) as u64,
        }
    }

    /// The work while the stack grew (snapshot `start` to `end`), since,
    /// and the most between two increments.
    fn evidence(&self, start: usize, end: usize, now: usize, increments: &[usize]) -> WorkEvidence {
        let mut largest_gap = Work::default();
        for pair in increments.windows(2) {
            let gap = self.work(pair[0], pair[1]);
            largest_gap.cpu_s = gap
                .cpu_s
                .map(|cpu| cpu.max(largest_gap.cpu_s.unwrap_or(0.0)));
            largest_gap.allocs = largest_gap.allocs.max(gap.allocs);
            largest_gap.site_allocs = largest_gap.site_allocs.max(gap.site_allocs);
        }
        WorkEvidence {
            while_growing: self.work(start, end),
            since_last_increment: self.work(end, now),
            largest_gap,
            growing_s: self.times_s[end] - self.times_s[start],
            since_s: self.times_s[now] - self.times_s[end],
            decided_by: None,
        }
    }

    /// The clock on which the target went on working, since the stack's
    /// last increment (`end`), for at least as much work as its growth
    /// took (from `start`) and at a comparable rate; with that work's
    /// share of the growth's.
    fn worked_on(&self, start: usize, end: usize, now: usize) -> Option<(Clock, f64)> {
        let growing_s = self.times_s[end] - self.times_s[start];
        let since_s = self.times_s[now] - self.times_s[end];
        self.each()
            .filter_map(|(clock, values, least)| {
                let during = values[end] - values[start];
                let since = values[now] - values[end];
                let comparable_rate = since_s > 0.0
                    && growing_s > 0.0
                    && since / since_s >= MIN_RATE_SHARE * during / growing_s;
                (during >= least && since >= least && since >= during && comparable_rate)
                    .then_some((clock, since / during))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The clock on which the work since the last increment is more than
    /// about one gap between increments (the growth may have stopped);
    /// None when every clock says it is recent.
    fn not_recent(
        &self,
        start: usize,
        end: usize,
        now: usize,
        increments: &[usize],
    ) -> Option<Clock> {
        self.each()
            .filter_map(|(clock, values, least)| {
                let during = values[end] - values[start];
                if during < least {
                    return None;
                }
                let gap = increments
                    .windows(2)
                    .map(|pair| values[pair[1]] - values[pair[0]])
                    .fold(0.0, f64::max);
                let slack = RECENT_SLACK_SHARE * during / increments.len() as f64;
                let since = values[now] - values[end];
                let allowed = RECENT_GAPS * gap + slack.max(least);
                (since > allowed).then_some((clock, since / allowed))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(clock, _)| clock)
    }
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

    /// The verdict on a site made of `members` (stacks of one process):
    /// their sum judged as one; where the sum is not a leak but some of
    /// its stacks are (a leaking call path beside one that churns), the
    /// verdict of those stacks, with `leaking_part` saying which share.
    pub fn site_growth(&self, members: &[StackKey], activity: &Activity) -> Growth {
        let dense: Vec<Vec<(f64, Counters)>> = members
            .iter()
            .map(|member| self.counters_at_every_snapshot(member))
            .collect();
        let summed = judge(&sum(dense.iter()), activity);
        if members.len() < 2 || summed.verdict == Verdict::Leak {
            return summed;
        }
        let leaking: Vec<(&StackKey, &Vec<(f64, Counters)>)> = members
            .iter()
            .zip(&dense)
            .filter(|(_, points)| judge(points, activity).verdict == Verdict::Leak)
            .collect();
        let held = |points: &Vec<(f64, Counters)>| points.last().map_or(0, |(_, c)| c.live_bytes);
        let Some(&(largest_key, largest)) = leaking
            .iter()
            .max_by_key(|(key, points)| (held(points), std::cmp::Reverse(**key)))
        else {
            return summed;
        };
        let part = sum(leaking.iter().map(|(_, points)| *points));
        let mut growth = judge(&part, activity);
        if growth.verdict != Verdict::Leak {
            // Leaking stacks whose sum is not a leak: judged by the largest.
            growth = judge(largest, activity);
        }
        growth.leaking_part = Some(LeakingPart {
            stacks: leaking.len(),
            of_stacks: members.len(),
            live_bytes: held(&part),
            stack_id: largest_key.stack_id.to_raw(),
        });
        growth
    }

    /// The work of each process among `keys`, read once.
    pub fn activities(&self, keys: impl Iterator<Item = StackKey>) -> HashMap<u32, Activity> {
        let mut activities = HashMap::new();
        for key in keys {
            activities
                .entry(key.pid)
                .or_insert_with(|| self.activity(key.pid));
        }
        activities
    }
}

/// The counters of several dense series, summed at each snapshot.
fn sum<'a>(series: impl Iterator<Item = &'a Vec<(f64, Counters)>>) -> Vec<(f64, Counters)> {
    let mut total: Vec<(f64, Counters)> = Vec::new();
    for points in series {
        if total.is_empty() {
            total.clone_from(points);
            continue;
        }
        for (sum, (_, counters)) in total.iter_mut().zip(points) {
            sum.1 = sum.1.plus(*counters);
        }
    }
    total
}

mod carried;
#[cfg(test)]
mod tests;
