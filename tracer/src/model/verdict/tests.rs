//! The verdict on synthetic series of every shape of the table in
//! docs/reading-reports.md, each with the work its target did.
use super::*;
use crate::model::{Snapshot, fixtures::heap_key, leak::SiteShare};

const MIB: i64 = 1 << 20;

/// One snapshot of a made-up trace: the stack's blocks allocated so far
/// and live now, and the process's other allocation calls and CPU
/// seconds so far.
#[derive(Clone, Copy, Default)]
struct At {
    allocated: i64,
    live: i64,
    other_allocs: u64,
    cpu_s: f64,
}

/// 40 snapshots every 0.5 s (a 20 s trace), attach point first, of a
/// stack of 1 MiB blocks; `at(t)` says what stood at `t`.
fn trace(at: impl Fn(f64) -> At) -> (Vec<(f64, Counters)>, Activity) {
    let mut points = vec![(0.0, Counters::default())];
    let mut activity = Activity {
        cpu_s: Some(vec![0.0]),
        process_allocs: vec![0],
    };
    for i in 1..=40 {
        let t = f64::from(i) * 0.5;
        let now = at(t);
        points.push((t, blocks(now.allocated, now.live)));
        activity.cpu_s.as_mut().unwrap().push(now.cpu_s);
        activity
            .process_allocs
            .push(now.allocated as u64 + now.other_allocs);
    }
    (points, activity)
}

fn blocks(allocated: i64, live: i64) -> Counters {
    Counters {
        live_bytes: live * MIB,
        live_allocs: live,
        alloc_bytes_total: (allocated * MIB) as u64,
        alloc_count_total: allocated as u64,
    }
}

fn verdict_of(at: impl Fn(f64) -> At) -> Growth {
    let (points, activity) = trace(at);
    judge(&points, &activity)
}

/// Six increments of 16 blocks, one in each of the first six intervals,
/// each with 0.4 s of CPU and 1000 other calls; nothing freed. Then
/// `after(t)`: (other calls, CPU seconds) added since 3 s.
fn six_increments_then(after: impl Fn(f64) -> (u64, f64)) -> impl Fn(f64) -> At {
    move |t| {
        let done = ((t * 2.0).round() as i64).clamp(0, 6);
        let (calls, cpu_s) = if t > 3.0 { after(t - 3.0) } else { (0, 0.0) };
        At {
            allocated: done * 16,
            live: done * 16,
            other_allocs: done as u64 * 1000 + calls,
            cpu_s: done as f64 * 0.4 + cpu_s,
        }
    }
}

#[test]
fn a_steady_ramp_with_steady_work_is_a_sure_leak() {
    let growth = verdict_of(|t| At {
        allocated: (t * 4.0) as i64,
        live: (t * 4.0) as i64,
        other_allocs: (t * 100.0) as u64,
        cpu_s: t * 0.5,
    });
    assert_eq!(growth.verdict, Verdict::Leak, "{growth:?}");
    assert!(growth.suspected_leak);
    assert_eq!(growth.shape, Some(Shape::Steady));
    assert_eq!(growth.confidence, Some(Confidence::High));
    assert!(growth.steps.unwrap().none_freed);
}

#[test]
fn increments_in_consecutive_intervals_then_idle_are_a_leak() {
    // The torch loop of issue 36: flat for 17 s, but the target did no
    // work in them.
    let growth = verdict_of(six_increments_then(|_| (0, 0.0)));
    assert_eq!(growth.verdict, Verdict::Leak, "{growth:?}");
    assert_eq!(
        growth.confidence,
        Some(Confidence::Medium),
        "one run then idle"
    );
    let work = growth.work.unwrap();
    assert_eq!(work.since_last_increment.allocs, 0);
    assert_eq!(work.while_growing.site_allocs, 96);
    assert!((work.since_s - 17.0).abs() < 1e-9, "{work:?}");
    // The wall clock alone says it stopped: the old rule missed it.
    assert!(growth.late_rate_bytes_per_s.abs() < 1.0);
}

#[test]
fn a_background_timer_does_not_make_an_idle_target_busy() {
    // 2 calls and 10 ms of CPU a second after the growth: background.
    let growth = verdict_of(six_increments_then(|t| ((t * 2.0) as u64, t * 0.01)));
    assert_eq!(growth.verdict, Verdict::Leak, "{growth:?}");
}

#[test]
fn a_warm_up_then_serving_is_not_a_leak() {
    // The same increments, then as much work as the loading took, and more.
    let growth = verdict_of(six_increments_then(|t| ((t * 1000.0) as u64, t * 0.5)));
    assert_eq!(growth.verdict, Verdict::NotLeak, "{growth:?}");
    assert_eq!(growth.shape, Some(Shape::Bounded));
    assert_eq!(growth.confidence, Some(Confidence::High));
    assert!(growth.work.unwrap().decided_by.is_some());
}

#[test]
fn a_warm_up_served_briefly_is_too_early_to_tell() {
    // Serving for 17 s at a low rate: more than between increments, less
    // than the loading took.
    let growth = verdict_of(six_increments_then(|t| ((t * 150.0) as u64, t * 0.1)));
    assert_eq!(growth.verdict, Verdict::TooEarly, "{growth:?}");
    assert_eq!(growth.confidence, Some(Confidence::Low));
    let more = growth.more_to_decide().expect("more work would decide");
    assert!((1..=6).contains(&more), "{more}");
}

#[test]
fn steps_with_idle_pauses_are_a_sure_leak() {
    // Four exports of 62 blocks, 1.5 s of work then 1.5 s idle.
    let growth = verdict_of(|t| {
        let period_s = 3.0;
        let done = (t / period_s).floor().min(4.0);
        let into = t - done * period_s;
        let current = if done < 4.0 {
            ((into / 1.5).min(1.0) * 62.0) as i64
        } else {
            0
        };
        let kept = done as i64 * 62 + current;
        At {
            allocated: kept,
            live: kept,
            ..At::default()
        }
    });
    assert_eq!(growth.verdict, Verdict::Leak, "{growth:?}");
    assert_eq!(growth.shape, Some(Shape::Steps));
    assert_eq!(growth.confidence, Some(Confidence::High));
    let steps = growth.steps.unwrap();
    assert_eq!((steps.count, steps.typical_step_bytes), (4, 62 * MIB));
    assert!(steps.none_freed);
}

#[test]
fn a_cache_at_capacity_that_evicts_is_not_a_leak() {
    // Inserts 4 entries a second, 30 at most; evicts the oldest after.
    let growth = verdict_of(|t| {
        let inserted = (t * 4.0) as i64;
        At {
            allocated: inserted,
            live: inserted.min(30),
            ..At::default()
        }
    });
    assert_eq!(growth.verdict, Verdict::NotLeak, "{growth:?}");
    assert_eq!(growth.shape, Some(Shape::Bounded));
    assert!(!growth.steps.unwrap().none_freed);
}

#[test]
fn a_pool_reusing_its_blocks_is_not_a_leak_by_cpu_time() {
    // Grows to 40 blocks by 6 s, then reuses them: no allocation call,
    // but the same CPU as before.
    let growth = verdict_of(|t| {
        let blocks = ((t / 6.0).min(1.0) * 40.0) as i64;
        At {
            allocated: blocks,
            live: blocks,
            other_allocs: 0,
            cpu_s: t * 0.2,
        }
    });
    assert_eq!(growth.verdict, Verdict::NotLeak, "{growth:?}");
    assert_eq!(growth.work.unwrap().decided_by, Some(Clock::Cpu));
    // Without CPU times, it reads as a leak whose target went idle.
    let (points, mut activity) = trace(|t| {
        let blocks = ((t / 6.0).min(1.0) * 40.0) as i64;
        At {
            allocated: blocks,
            live: blocks,
            ..At::default()
        }
    });
    activity.cpu_s = None;
    assert_eq!(judge(&points, &activity).verdict, Verdict::Leak);
}

#[test]
fn a_sawtooth_is_churn() {
    // Fills for 3 s, frees all, repeats; stopped in a fill.
    let growth = verdict_of(|t| {
        let cycle = ((t + 1.0) / 4.0).floor() as i64;
        let into = (t + 1.0) % 4.0;
        let filled = ((into.min(3.0)) * 10.0) as i64;
        At {
            allocated: cycle * 30 + filled,
            live: if into < 3.5 { filled } else { 0 },
            cpu_s: t * 0.1,
            ..At::default()
        }
    });
    assert_eq!(growth.verdict, Verdict::NotLeak, "{growth:?}");
    assert_eq!(growth.shape, Some(Shape::Churn));
    assert_eq!(growth.confidence, Some(Confidence::High));
}

#[test]
fn a_sawtooth_sampled_coarsely_and_stopped_high_in_a_fill_is_churn() {
    // Fills a block a second for 8 s, frees all, waits 2 s; snapshots
    // every 2.5 s, never at the bottom, the last at 8 of the 8 blocks
    // (what it holds at the end is more than it ever fell by).
    let mut points = vec![(0.0, Counters::default())];
    let mut activity = Activity {
        cpu_s: Some(vec![0.0]),
        process_allocs: vec![0],
    };
    for i in 1..=16 {
        let t = f64::from(i) * 2.5 - 2.25;
        let into = t % 10.0;
        let live = into.floor() as i64 + 1;
        let allocated = (t / 10.0).floor() as i64 * 8 + live;
        points.push((t, blocks(allocated, live)));
        activity.cpu_s.as_mut().unwrap().push(t * 0.1);
        activity.process_allocs.push(allocated as u64);
    }
    assert_eq!(points.last().unwrap().1.live_allocs, 8);
    let growth = judge(&points, &activity);
    assert_eq!(growth.verdict, Verdict::NotLeak, "{growth:?}");
    assert_eq!(growth.shape, Some(Shape::Churn));
}

#[test]
fn a_cache_cleared_but_for_one_entry_is_churn() {
    let growth = verdict_of(|t| {
        let filled = (((t / 3.0).floor() as i64 + 1).min(5)) * 10;
        At {
            allocated: filled,
            live: if t >= 15.0 { 1 } else { filled },
            ..At::default()
        }
    });
    assert_eq!(growth.verdict, Verdict::NotLeak, "{growth:?}");
    assert_eq!(growth.shape, Some(Shape::Churn));
    assert_eq!(growth.confidence, Some(Confidence::Medium));
}

#[test]
fn one_or_two_steps_are_too_early_to_tell() {
    for (steps_at, more) in [(&[5.0][..], 2), (&[5.0, 12.0], 1)] {
        let growth = verdict_of(|t| {
            let done = steps_at.iter().filter(|&&at| t >= at).count() as i64;
            At {
                allocated: done * 50,
                live: done * 50,
                ..At::default()
            }
        });
        assert_eq!(
            growth.verdict,
            Verdict::TooEarly,
            "{steps_at:?}: {growth:?}"
        );
        assert_eq!(growth.more_to_decide(), Some(more));
    }
}

#[test]
fn one_step_then_work_is_not_a_leak() {
    let growth = verdict_of(|t| At {
        allocated: if t >= 2.0 { 100 } else { 0 },
        live: if t >= 2.0 { 100 } else { 0 },
        other_allocs: (t * 50.0) as u64,
        cpu_s: t * 0.3,
    });
    assert_eq!(growth.verdict, Verdict::NotLeak, "{growth:?}");
}

#[test]
fn small_allocations_between_steps_are_not_increments() {
    // Two big steps and three tiny ones: two increments, not five.
    let growth = verdict_of(|t| {
        let big = [2.0, 10.0].iter().filter(|&&at| t >= at).count() as i64 * 1000;
        let small = [5.0, 7.0, 14.0].iter().filter(|&&at| t >= at).count() as i64;
        At {
            allocated: big + small,
            live: big + small,
            ..At::default()
        }
    });
    assert_eq!(growth.verdict, Verdict::TooEarly, "{growth:?}");
    assert_eq!(growth.steps.unwrap().increments, 2);
}

#[test]
fn too_few_snapshots_are_too_early_whatever_the_growth() {
    let points: Vec<(f64, Counters)> = (0..4)
        .map(|i| (f64::from(i), blocks(i64::from(i), i64::from(i))))
        .collect();
    let activity = Activity {
        cpu_s: None,
        process_allocs: vec![0, 1, 2, 3],
    };
    let growth = judge(&points, &activity);
    assert_eq!(growth.verdict, Verdict::TooEarly, "{growth:?}");
    assert_eq!(judge(&[], &activity).verdict, Verdict::Empty);
}

#[test]
fn a_site_with_a_leaking_stack_beside_churn_is_a_leak_for_its_part() {
    let (leak, churn) = (heap_key(1, 1), heap_key(1, 2));
    let mut model = Model::new();
    for i in 1..=40 {
        let t = f64::from(i) * 0.5;
        // The churn holds up to 300 blocks and frees them every 3 s; the
        // leak keeps one block per snapshot.
        let held = (i % 6) * 60;
        model.push(Snapshot {
            elapsed_s: t,
            stacks: vec![
                (leak, blocks(i64::from(i), i64::from(i))),
                (churn, blocks(i64::from(i) * 60, i64::from(held))),
            ],
            cpu_s: vec![(1, t * 0.5)],
            ..Snapshot::default()
        });
    }
    let activity = model.activity(1);
    let summed = judge(
        &model.merged(|_| leak).counters_at_every_snapshot(&leak),
        &activity,
    );
    assert_eq!(
        summed.verdict,
        Verdict::NotLeak,
        "the sum alone: {summed:?}"
    );
    let growth = model.site_growth(&[leak, churn], &activity);
    assert_eq!(growth.verdict, Verdict::Leak, "{growth:?}");
    assert_eq!(
        growth.leaking_part,
        Some(LeakingPart {
            stacks: 1,
            of_stacks: 2,
            live_bytes: 40 * MIB,
            stack_id: 1,
        })
    );
    assert_eq!(
        model.site_growth(&[churn], &activity).verdict,
        Verdict::NotLeak
    );
    // The sum is no leak: the churning stack carries nothing.
    let sites = HashMap::from([(leak, vec![leak, churn])]);
    assert!(model.carried_verdicts(&sites).is_empty());
}

#[test]
fn stacks_that_take_turns_at_a_leaking_site_carry_its_verdict() {
    // One site, two paths beneath it: the first keeps a block per
    // snapshot for 6 s, then the second does, to the end.
    let (first, second) = (heap_key(1, 1), heap_key(1, 2));
    let mut model = Model::new();
    for i in 1..=40 {
        let t = f64::from(i) * 0.5;
        let (a, b) = (i64::from(i).min(12), (i64::from(i) - 12).max(0));
        model.push(Snapshot {
            elapsed_s: t,
            stacks: vec![(first, blocks(a, a)), (second, blocks(b, b))],
            cpu_s: vec![(1, t * 0.5)],
            ..Snapshot::default()
        });
    }
    let activity = model.activity(1);
    let alone = model.growth(&first);
    assert_eq!(
        alone.verdict,
        Verdict::NotLeak,
        "the first path alone: flat while the target (the second path) worked: {alone:?}"
    );
    let site = model.site_growth(&[first, second], &activity);
    assert_eq!(site.verdict, Verdict::Leak, "{site:?}");
    let sites = HashMap::from([(second, vec![first, second])]);
    let carried = model.carried_verdicts(&sites);
    assert_eq!(
        carried.len(),
        1,
        "the second path leaks on its own: {carried:?}"
    );
    let growth = carried[&first];
    assert_eq!(growth.verdict, Verdict::Leak);
    assert!(growth.suspected_leak);
    assert_eq!(growth.confidence, site.confidence);
    assert_eq!(
        growth.site_share,
        Some(SiteShare {
            rises: 12,
            of_site_rises: 40
        })
    );
    assert_eq!(growth.steps, alone.steps, "its own evidence");
    assert_eq!(growth.work.unwrap().decided_by, None);
}

#[test]
fn dense_counters_fill_every_snapshot() {
    let key = heap_key(1, 1);
    let mut model = Model::new();
    model.push(Snapshot {
        elapsed_s: 1.0,
        ..Snapshot::default()
    });
    for (elapsed_s, allocated) in [(2.0, 1), (3.0, 1), (4.0, 1), (5.0, 3)] {
        model.push(Snapshot {
            elapsed_s,
            stacks: vec![(key, blocks(allocated, allocated))],
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

/// A warm-up of `warm_steps` rises of `warm_blocks` blocks, one every
/// 0.5 s, then from `from_s` on a step of `step_blocks` every 2 s, work
/// going on throughout: the series at `t` seconds.
fn warm_up_then_steps(
    t: f64,
    warm_steps: i64,
    warm_blocks: i64,
    from_s: f64,
    step_blocks: i64,
) -> At {
    let warm = ((t * 2.0).round() as i64).clamp(0, warm_steps) * warm_blocks;
    let steps = if t > from_s {
        ((t - from_s) / 2.0).floor() as i64 * step_blocks
    } else {
        0
    };
    At {
        allocated: warm + steps,
        live: warm + steps,
        other_allocs: (t * 1000.0) as u64,
        cpu_s: t * 0.5,
    }
}

#[test]
fn equal_small_steps_after_a_warm_up_are_a_leak() {
    // A 200-block warm-up over the first 5 s (one run of 10 intervals),
    // then a step of 2 blocks every 2 s, work going on throughout: the
    // steps are the leak, not noise beside the warm-up (a rule that
    // weighs a step against the warm-up's whole run says "not a leak").
    let growth = verdict_of(|t| warm_up_then_steps(t, 10, 20, 5.0, 2));
    assert_eq!(growth.verdict, Verdict::Leak, "{growth:?}");
    assert_eq!(growth.shape, Some(Shape::Steps), "{growth:?}");
    assert_eq!(growth.steps.unwrap().count, 8, "{growth:?}");
}

/// A cache of 300 entries of 64 KiB, one inserted every 50 ms (the
/// oldest evicted first once full) for 45 s, snapshotted every 250 ms;
/// the snapshots from `from_s` until `until_s` read it between an
/// eviction and its insert (an entry short).
fn an_lru_every_250ms_caught_mid_eviction(from_s: f64, until_s: f64) -> Growth {
    const ENTRY: i64 = 64 << 10;
    let mut points = vec![(0.0, Counters::default())];
    let mut activity = Activity {
        cpu_s: None,
        process_allocs: vec![0],
    };
    for i in 1..=180 {
        let t = f64::from(i) * 0.25;
        let inserted = (t * 20.0) as i64;
        let live = inserted.min(300) - i64::from(t >= from_s && t < until_s);
        let counters = Counters {
            live_bytes: live * ENTRY,
            live_allocs: live,
            alloc_bytes_total: (inserted * ENTRY) as u64,
            alloc_count_total: inserted as u64,
        };
        points.push((t, counters));
        activity.process_allocs.push(inserted as u64);
    }
    judge(&points, &activity)
}

#[test]
fn a_cache_caught_once_mid_eviction_is_still_not_a_leak() {
    // Row 8 of shapes:: as its 250 ms tracer once read it: one snapshot
    // (41 s) an entry short, so what the stack kept rose by one entry
    // after it; against the fill's 5 entries per interval that rise was
    // an increment ("leak, medium: rose in 2 steps"). One block in
    // flight, once, is not a step.
    let growth = an_lru_every_250ms_caught_mid_eviction(41.0, 41.25);
    assert_eq!(growth.verdict, Verdict::NotLeak, "{growth:?}");
    assert_eq!(growth.shape, Some(Shape::Bounded));
    assert_eq!(growth.steps.unwrap().count, 1, "{growth:?}");
    // Caught so at every snapshot after the fill but the last.
    let growth = an_lru_every_250ms_caught_mid_eviction(16.0, 45.0);
    assert_eq!(growth.verdict, Verdict::NotLeak, "{growth:?}");
}

#[test]
fn one_block_steps_that_repeat_are_a_leak() {
    // 16-block warm-up, then one block every 2 s: each step is a block,
    // and they repeat.
    let growth = verdict_of(|t| warm_up_then_steps(t, 4, 4, 2.0, 1));
    assert_eq!(growth.verdict, Verdict::Leak, "{growth:?}");
    assert!(growth.steps.unwrap().count >= 8, "{growth:?}");
}
