//! The evidence about a stack's growth over the window: the fit of its
//! live bytes against wall-clock time (`assess`), and the types that carry
//! the verdict (`verdict` decides it) and its evidence into every report.
//!
//! The fit alone cannot tell a leak from a cache: a cache that filled and
//! a leak whose target went idle both end flat. It stays as evidence (how
//! fast, how straight), read by the plot and the scripts.

/// Evidence about one stack's growth over the window, and the verdict.
///
/// Wide: the JSON report's `growth` object (a verdict's evidence), one field
/// per key.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Growth {
    /// Least-squares slope of live bytes over the whole window.
    pub rate_bytes_per_s: f64,
    /// How much of the variation the straight line explains (0..1).
    pub r_squared: f64,
    /// Fraction of intervals in which live bytes did not shrink.
    pub non_shrinking_fraction: f64,
    /// Fraction of intervals in which live bytes grew.
    pub growing_fraction: f64,
    /// Least-squares slope over the second half of the window.
    pub late_rate_bytes_per_s: f64,
    /// Live bytes at the first and the last snapshot.
    pub first_live_bytes: i64,
    pub last_live_bytes: i64,
    /// Last minus the value at attach (0: nothing before attach is seen).
    pub net_growth_bytes: i64,
    /// The verdict is [`Verdict::Leak`].
    pub suspected_leak: bool,
    pub verdict: Verdict,
    /// How sure the verdict is (docs/reading-reports.md says what each
    /// level means); null when there is nothing to judge.
    pub confidence: Option<Confidence>,
    /// How it grew, or why it is not a leak; null when nothing to judge.
    pub shape: Option<Shape>,
    /// What it kept, rise by rise; null when it holds nothing.
    pub steps: Option<StepGrowth>,
    /// The target's work while it grew and since; null when it holds
    /// nothing.
    pub work: Option<WorkEvidence>,
    /// For a site whose sum is not a leak but some of whose stacks are:
    /// those stacks (the verdict and evidence are theirs).
    pub leaking_part: Option<LeakingPart>,
    /// For a stack of a leaking site that reads otherwise on its own (it
    /// stopped when the path beneath the site changed): the site's rises
    /// it grew at (its verdict is the site's, its evidence its own).
    pub site_share: Option<SiteShare>,
}

/// The rises of a leaking site a stack of it grew at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SiteShare {
    pub rises: usize,
    pub of_site_rises: usize,
}

/// What the verdict says about a stack or a site.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// It holds nothing at the moment judged.
    #[default]
    Empty,
    /// It grew with the target's work and kept what it grew by.
    Leak,
    /// It grew, but too few times, or stopped too recently, to tell.
    TooEarly,
    /// It stopped growing while the work went on, or gave back what it
    /// held.
    NotLeak,
}

impl Verdict {
    /// The words reports use: `leak`, `too early to tell`, `not a leak`.
    pub fn words(self) -> &'static str {
        match self {
            Verdict::Empty => "nothing held",
            Verdict::Leak => "leak",
            Verdict::TooEarly => "too early to tell",
            Verdict::NotLeak => "not a leak",
        }
    }
}

/// How sure a verdict is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Confidence {
    Low,
    Medium,
    High,
}

impl Confidence {
    pub fn as_str(self) -> &'static str {
        match self {
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        }
    }
}

/// How a stack grew (a leak, or one too early to tell), or why it is not
/// a leak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// Grew in one run of intervals, or in most of them.
    Steady,
    /// Grew in separate steps, flat in between.
    Steps,
    /// Grew, then stayed flat while the target went on working.
    Bounded,
    /// Gave back at least as much as it holds now, once or more.
    Churn,
}

/// What a stack kept, rise by rise: the bytes it held from each moment on
/// (the least it held at any later snapshot) rose in `increments`
/// intervals, grouped in `count` steps.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct StepGrowth {
    /// Runs of intervals in which what it kept rose, separated by
    /// intervals in which it did not: the steps a person sees.
    pub count: usize,
    /// Intervals in which what it kept rose.
    pub increments: usize,
    /// The mean rise of a step, in bytes.
    pub typical_step_bytes: i64,
    /// Blocks live at the moment judged, and allocated since attach.
    pub live_allocs: i64,
    pub alloc_count_total: u64,
    /// No block allocated since attach was freed.
    pub none_freed: bool,
    /// The most it held, and how much it once gave back from a peak.
    pub peak_live_bytes: i64,
    pub given_back_bytes: i64,
    /// Times it fell by at least what it holds at the moment judged.
    pub falls: usize,
}

/// The target's work over a part of the window, on each clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Work {
    /// CPU seconds of the process; null where not read.
    pub cpu_s: Option<f64>,
    /// Allocation calls of the process.
    pub allocs: u64,
    /// Allocation calls of the stack (or site) itself.
    pub site_allocs: u64,
}

/// The clock a verdict rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Clock {
    /// The process's CPU time.
    Cpu,
    /// The process's allocation calls.
    Allocs,
    /// The stack's own allocation calls.
    SiteAllocs,
}

/// How the growth tracks the target's work: the work from the start of
/// its first increment to the end of its last, the work since, and the
/// most work between two increments.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct WorkEvidence {
    pub while_growing: Work,
    pub since_last_increment: Work,
    pub largest_gap: Work,
    /// Seconds from the start of its first increment to the end of its
    /// last, and from then to the moment judged.
    pub growing_s: f64,
    pub since_s: f64,
    /// The clock on which the work went on without growth (not a leak),
    /// or that stayed idle the longest since (too early); null for a leak.
    pub decided_by: Option<Clock>,
}

/// The stacks of a site that leak when the site's sum does not.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct LeakingPart {
    pub stacks: usize,
    pub of_stacks: usize,
    /// What they hold at the moment judged.
    pub live_bytes: i64,
    /// The one of them holding the most (its frames are the entry's).
    pub stack_id: u32,
}

/// Fewer snapshots than this give no verdict: too short to tell a leak
/// from a burst.
pub const MIN_SNAPSHOTS: usize = 5;

/// The wall-clock fit of a series sampled at every snapshot, in time
/// order, the attach point (0 s, 0 bytes) first; no verdict yet.
pub fn assess(points: &[(f64, i64)]) -> Growth {
    let first_live_bytes = points.get(1).map_or(0, |&(_, bytes)| bytes);
    let last_live_bytes = points.last().map_or(0, |&(_, bytes)| bytes);
    let net_growth_bytes = last_live_bytes - points.first().map_or(0, |&(_, bytes)| bytes);
    let (rate_bytes_per_s, r_squared) = fit(points);
    let intervals = points.len().saturating_sub(1);
    let count_intervals = |test: fn(i64, i64) -> bool| {
        points
            .windows(2)
            .filter(|pair| test(pair[0].1, pair[1].1))
            .count()
    };
    let fraction = |count: usize| {
        if intervals == 0 {
            0.0
        } else {
            count as f64 / intervals as f64
        }
    };
    let non_shrinking_fraction = fraction(count_intervals(|before, after| after >= before));
    let growing_fraction = fraction(count_intervals(|before, after| after > before));
    let half_s = points.last().map_or(0.0, |&(t, _)| t) / 2.0;
    let late: Vec<(f64, i64)> = points
        .iter()
        .copied()
        .filter(|&(t, _)| t >= half_s)
        .collect();
    let (late_rate_bytes_per_s, _) = fit(&late);
    Growth {
        rate_bytes_per_s,
        r_squared,
        non_shrinking_fraction,
        growing_fraction,
        late_rate_bytes_per_s,
        first_live_bytes,
        last_live_bytes,
        net_growth_bytes,
        suspected_leak: false,
        verdict: Verdict::Empty,
        confidence: None,
        shape: None,
        steps: None,
        work: None,
        leaking_part: None,
        site_share: None,
    }
}

/// Least-squares slope and R² of bytes against time. A flat series has
/// slope 0 and R² 0 (a line explains nothing there).
fn fit(points: &[(f64, i64)]) -> (f64, f64) {
    if points.len() < 2 {
        return (0.0, 0.0);
    }
    let count = points.len() as f64;
    let mean_s = points.iter().map(|&(t, _)| t).sum::<f64>() / count;
    let mean_bytes = points.iter().map(|&(_, b)| b as f64).sum::<f64>() / count;
    let mut co_moment = 0.0;
    let mut time_m2 = 0.0;
    let mut bytes_m2 = 0.0;
    for &(t, bytes) in points {
        let dt = t - mean_s;
        let db = bytes as f64 - mean_bytes;
        co_moment += dt * db;
        time_m2 += dt * dt;
        bytes_m2 += db * db;
    }
    if time_m2 <= 0.0 {
        return (0.0, 0.0);
    }
    let slope = co_moment / time_m2;
    let r_squared = if bytes_m2 > 0.0 {
        (co_moment * co_moment / (time_m2 * bytes_m2)).clamp(0.0, 1.0)
    } else {
        0.0
    };
    (slope, r_squared)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 40 snapshots every 0.5 s (a 20 s trace), attach point first.
    fn series(live_bytes_at: impl Fn(f64) -> i64) -> Vec<(f64, i64)> {
        std::iter::once((0.0, 0))
            .chain((1..=40).map(|i| {
                let t = i as f64 * 0.5;
                (t, live_bytes_at(t))
            }))
            .collect()
    }

    #[test]
    fn a_ramp_fits_a_straight_line() {
        let growth = assess(&series(|t| (t * 10_000.0) as i64));
        assert!((growth.rate_bytes_per_s - 10_000.0).abs() < 1.0);
        assert!((growth.late_rate_bytes_per_s - 10_000.0).abs() < 1.0);
        assert!(growth.r_squared > 0.99);
        assert_eq!(growth.non_shrinking_fraction, 1.0);
        assert_eq!(growth.growing_fraction, 1.0);
        assert_eq!(growth.first_live_bytes, 5_000);
        assert_eq!(growth.last_live_bytes, 200_000);
        assert_eq!(growth.net_growth_bytes, 200_000);
        assert_eq!(growth.verdict, Verdict::Empty, "assess gives no verdict");
    }

    #[test]
    fn a_sawtooth_fits_badly_and_shrinks() {
        let growth = assess(&series(|t| ((t % 3.5) * 1_000_000.0) as i64));
        assert!(growth.r_squared < 0.5, "{growth:?}");
        assert!(growth.non_shrinking_fraction < 1.0);
    }

    #[test]
    fn a_cache_that_filled_is_flat_late() {
        let growth = assess(&series(|t| ((t.min(6.0)) * 100_000.0) as i64));
        assert!(growth.late_rate_bytes_per_s.abs() < 1.0);
        assert!(growth.rate_bytes_per_s > 0.0);
    }

    #[test]
    fn a_flat_series_has_no_slope() {
        let growth = assess(&series(|_| 0));
        assert_eq!((growth.rate_bytes_per_s, growth.r_squared), (0.0, 0.0));
        let short = [(0.0, 0), (1.0, 100), (2.0, 200), (3.0, 300)];
        assert!((assess(&short).rate_bytes_per_s - 100.0).abs() < 1e-9);
        assert_eq!(assess(&[]).rate_bytes_per_s, 0.0);
    }
}
