//! Is a stack leaking? The evidence, from its live bytes over the window.
//!
//! A snapshot of live bytes cannot tell a leak from a cache: what tells them
//! apart is the shape over time. A leak grows steadily until the end: a
//! straight-line fit explains most of it (R²), few intervals shrink, many
//! grow, and the second half of the window still grows. A sawtooth (fill,
//! then release) shrinks in some intervals and fits a line badly; a bounded
//! cache stops growing (its second half is flat); a one-time step grows in
//! a single interval. Growth in steps is judged apart (`verdict`).

/// Evidence about one stack's growth over the window.
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
    /// The verdict: steady growth until the end of the window, or step
    /// growth (`verdict`).
    pub suspected_leak: bool,
    /// Which shape made it a suspected leak; null when it is not one.
    pub shape: Option<LeakShape>,
    /// The evidence of step growth; null when it did not grow in steps.
    pub steps: Option<StepGrowth>,
}

/// What rose in steps: the evidence for the step verdict.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct StepGrowth {
    /// Separate bursts whose bytes stayed live (steps counted).
    pub count: usize,
    /// The mean rise of a counted step, in bytes.
    pub typical_step_bytes: i64,
    /// Blocks live at the moment judged, and allocated since attach.
    pub live_allocs: i64,
    pub alloc_count_total: u64,
    /// No block allocated since attach was freed.
    pub none_freed: bool,
}

/// Which shape made a stack a suspected leak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LeakShape {
    /// A straight line until the end.
    Steady,
    /// Several separate steps, none given back.
    Steps,
}

/// Fewer snapshots than this give no verdict: too short to tell a leak
/// from a burst.
pub const MIN_SNAPSHOTS: usize = 5;
/// A leak's growth is close to a straight line.
pub const MIN_R_SQUARED: f64 = 0.8;
/// A leak rarely shrinks (frees of its own blocks are rare).
pub const MIN_NON_SHRINKING_FRACTION: f64 = 0.8;
/// A leak grows in many intervals, not in one step.
pub const MIN_GROWING_FRACTION: f64 = 0.25;
/// A leak still grows in the second half of the window, at least at this
/// share of its overall rate (a cache that filled and stopped does not).
pub const MIN_LATE_RATE_SHARE: f64 = 0.5;

/// Weighs the evidence of a series sampled at every snapshot, in time
/// order, the attach point (0 s, 0 bytes) first.
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
    let snapshots = points.len().saturating_sub(1);
    let suspected_leak = snapshots >= MIN_SNAPSHOTS
        && net_growth_bytes > 0
        && rate_bytes_per_s > 0.0
        && r_squared >= MIN_R_SQUARED
        && non_shrinking_fraction >= MIN_NON_SHRINKING_FRACTION
        && growing_fraction >= MIN_GROWING_FRACTION
        && late_rate_bytes_per_s >= MIN_LATE_RATE_SHARE * rate_bytes_per_s;
    Growth {
        rate_bytes_per_s,
        r_squared,
        non_shrinking_fraction,
        growing_fraction,
        late_rate_bytes_per_s,
        first_live_bytes,
        last_live_bytes,
        net_growth_bytes,
        suspected_leak,
        shape: None,
        steps: None,
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
    fn steady_leak_is_suspected() {
        let growth = assess(&series(|t| (t * 10_000.0) as i64));
        assert!(growth.suspected_leak, "{growth:?}");
        assert!((growth.rate_bytes_per_s - 10_000.0).abs() < 1.0);
        assert!(growth.r_squared > 0.99);
        assert_eq!(growth.non_shrinking_fraction, 1.0);
        assert_eq!(growth.first_live_bytes, 5_000);
        assert_eq!(growth.last_live_bytes, 200_000);
        assert_eq!(growth.net_growth_bytes, 200_000);
    }

    #[test]
    fn leak_in_bursts_every_other_interval_is_suspected() {
        let growth = assess(&series(|t| (t.floor() as i64) * 4096));
        assert!(growth.suspected_leak, "{growth:?}");
    }

    #[test]
    fn leak_with_churn_noise_is_suspected() {
        // A leak of 1 KiB/s plus a working set that goes up and down by
        // 300 B: shrinks in a few intervals only.
        let growth = assess(&series(|t| {
            let step = (t * 2.0) as i64;
            (t * 1024.0) as i64 + if step % 7 == 0 { 0 } else { 300 }
        }));
        assert!(growth.suspected_leak, "{growth:?}");
    }

    #[test]
    fn sawtooth_is_not_a_leak() {
        // Fills for 3 s, frees everything, repeats.
        let growth = assess(&series(|t| ((t % 3.5) * 1_000_000.0) as i64));
        assert!(!growth.suspected_leak, "{growth:?}");
    }

    #[test]
    fn bounded_cache_is_not_a_leak() {
        // Grows to its cap within 6 s, then replaces entries.
        let growth = assess(&series(|t| ((t.min(6.0)) * 100_000.0) as i64));
        assert!(!growth.suspected_leak, "{growth:?}");
        assert!(growth.late_rate_bytes_per_s.abs() < 1.0);
    }

    #[test]
    fn one_time_step_is_not_a_leak() {
        for step_s in [0.5, 5.0, 12.0, 19.0] {
            let growth = assess(&series(|t| if t >= step_s { 50 << 20 } else { 0 }));
            assert!(!growth.suspected_leak, "step at {step_s} s: {growth:?}");
        }
    }

    #[test]
    fn flat_and_shrinking_are_not_leaks() {
        assert!(!assess(&series(|_| 4096)).suspected_leak);
        assert!(!assess(&series(|t| 1_000_000 - (t * 1000.0) as i64)).suspected_leak);
        assert!(!assess(&series(|_| 0)).suspected_leak);
    }

    #[test]
    fn too_few_snapshots_give_no_verdict() {
        let short = [(0.0, 0), (1.0, 100), (2.0, 200), (3.0, 300)];
        let growth = assess(&short);
        assert!(!growth.suspected_leak);
        assert!((growth.rate_bytes_per_s - 100.0).abs() < 1e-9);
        assert!(!assess(&[]).suspected_leak);
    }
}
