//! Unit tests of the model with synthetic snapshots.
use super::*;
use tracer_ebpf::stat;

use super::fixtures::heap_key as heap;

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
        ..Snapshot::default()
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
    assert_eq!(Kind::from_name("heap"), Some(Kind::Heap));
    assert_eq!(Kind::from_name("gpu-lunar"), None);
    assert_eq!(serde_json::to_value(Kind::Heap).unwrap(), "heap");
    for (raw, kind, name) in [
        (tracer_ebpf::kind::GPU_DEVICE, Kind::GpuDevice, "gpu-device"),
        (
            tracer_ebpf::kind::GPU_MANAGED,
            Kind::GpuManaged,
            "gpu-managed",
        ),
        (
            tracer_ebpf::kind::GPU_HOST_PINNED,
            Kind::GpuHostPinned,
            "gpu-host-pinned",
        ),
        (
            tracer_ebpf::kind::PYTHON_OBJECT,
            Kind::PythonObject,
            "python-object",
        ),
        (tracer_ebpf::kind::GPU_TENSOR, Kind::GpuTensor, "gpu-tensor"),
        (tracer_ebpf::kind::RESIDENT, Kind::Resident, "resident"),
    ] {
        assert_eq!(Kind::from_raw(raw), Some(kind));
        assert_eq!(kind.as_str(), name);
        assert_eq!(serde_json::to_value(kind).unwrap(), name);
    }
    for raw in 0..16 {
        if let Some(kind) = Kind::from_raw(raw) {
            assert_eq!(kind.to_raw(), raw, "{kind:?}");
        }
    }
}

/// gpu-tensor blocks are carved out of gpu-device segments: ranked on
/// their own, never added to the segments in a sum over kinds.
#[test]
fn gpu_tensor_bytes_are_part_of_gpu_device_not_added() {
    let segment = StackKey {
        kind: Kind::GpuDevice,
        ..heap(1, 1)
    };
    let tensor = StackKey {
        kind: Kind::GpuTensor,
        ..heap(1, 1)
    };
    let mut model = Model::new();
    model.push(snapshot(
        1.0,
        &[
            (heap(1, 1), live(100)),
            (segment, live(4096)),
            (tensor, live(1024)),
        ],
    ));
    assert_eq!(model.totals()[&Kind::GpuTensor].live_bytes, 1024);
    assert_eq!(model.traced_live_series(), [(1.0, 4196)]);
    assert!(Kind::GpuTensor.is_memory() && Kind::GpuTensor.is_part_of_another());
    assert!(!Kind::GpuDevice.is_part_of_another());
}

#[test]
fn gpu_kinds_have_their_own_totals() {
    let device = StackKey {
        kind: Kind::GpuDevice,
        ..heap(1, 1)
    };
    let pinned = StackKey {
        kind: Kind::GpuHostPinned,
        ..heap(1, 1)
    };
    let mut model = Model::new();
    model.push(snapshot(
        1.0,
        &[
            (heap(1, 1), live(100)),
            (device, live(4096)),
            (pinned, live(512)),
        ],
    ));
    let totals = model.totals();
    assert_eq!(totals[&Kind::Heap].live_bytes, 100);
    assert_eq!(totals[&Kind::GpuDevice].live_bytes, 4096);
    assert_eq!(totals[&Kind::GpuHostPinned].live_bytes, 512);
    assert!(!totals.contains_key(&Kind::GpuManaged));
    assert_eq!(model.kind_totals_series().len(), 3);
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
        ..Snapshot::default()
    });
    assert_eq!(model.drops(), [("live_map_full", 5), ("stack_error", 2)]);
    let events = model.events();
    let event_names: Vec<&str> = tracer_ebpf::STAT_NAMES
        .iter()
        .filter(|(_, class)| *class == tracer_ebpf::StatClass::Event)
        .map(|&(name, _)| name)
        .collect();
    assert_eq!(
        events.iter().map(|&(name, _)| name).collect::<Vec<_>>(),
        event_names
    );
    assert_eq!(events[0], ("allocs", 10));
    assert!(events.contains(&("frees_unknown", 3)));
    assert!(events.contains(&("failed_allocs", 0)));
    assert_eq!(model.stats()[stat::ALLOCS as usize], 10);
}

#[test]
fn dense_series_fills_every_snapshot_from_attach() {
    let key = heap(1, 1);
    let mut model = Model::new();
    model.push(snapshot(1.0, &[]));
    model.push(snapshot(2.0, &[(key, live(10))]));
    model.push(snapshot(3.0, &[(key, live(10))]));
    model.push(snapshot(4.0, &[(key, live(10))]));
    model.push(snapshot(5.0, &[(key, live(30))]));
    assert_eq!(
        model.live_bytes_at_every_snapshot(&key),
        [
            (0.0, 0),
            (1.0, 0),
            (2.0, 10),
            (3.0, 10),
            (4.0, 10),
            (5.0, 30)
        ]
    );
}

#[test]
fn suspected_leaks_keep_the_steady_stack_only() {
    let leak = heap(1, 1);
    let step = heap(1, 2);
    let sawtooth = heap(1, 3);
    let mut model = Model::new();
    for i in 1..=20_i64 {
        model.push(snapshot(
            i as f64,
            &[
                (leak, live(1000 * i)),
                (step, live(if i >= 3 { 1 << 30 } else { 0 })),
                (sawtooth, live((i % 4) * 50_000)),
            ],
        ));
    }
    let leaks = model.suspected_leaks(10);
    assert_eq!(leaks.len(), 1, "{leaks:?}");
    assert_eq!(leaks[0].0, leak);
    assert!((leaks[0].1.rate_bytes_per_s - 1000.0).abs() < 1e-6);
    assert!(!model.growth(&step).suspected_leak);
}

#[test]
fn totals_and_rss_series_per_pid() {
    let mut model = Model::new();
    for i in 1..=3_i64 {
        model.push(Snapshot {
            elapsed_s: i as f64,
            stacks: vec![(heap(1, 1), live(100 * i)), (heap(2, 1), live(7))],
            stats: Vec::new(),
            rss_bytes: vec![(1, 4096 * i as u64)],
            retired: Vec::new(),
            cpu_s: Vec::new(),
        });
    }
    assert_eq!(
        model.kind_totals_series()[&(1, Kind::Heap)],
        [(1.0, 100), (2.0, 200), (3.0, 300)]
    );
    assert_eq!(model.kind_totals_series()[&(2, Kind::Heap)].len(), 3);
    assert_eq!(
        model.rss_series()[&1],
        [(1.0, 4096), (2.0, 8192), (3.0, 12288)]
    );
    assert!(!model.rss_series().contains_key(&2));
}

#[test]
fn fastest_growing_orders_by_rate() {
    let slow = heap(1, 1);
    let fast = heap(1, 2);
    let big_flat = heap(1, 3);
    let mut model = Model::new();
    for i in 1..=5_i64 {
        model.push(snapshot(
            i as f64,
            &[
                (slow, live(10 * i)),
                (fast, live(1000 * i)),
                (big_flat, live(1 << 30)),
            ],
        ));
    }
    // The 1 GiB that appeared after attach is growth over the window too.
    let keys: Vec<StackKey> = model.fastest_growing(2).iter().map(|s| s.key).collect();
    assert_eq!(keys, [big_flat, fast]);
    let all: Vec<StackKey> = model.fastest_growing(10).iter().map(|s| s.key).collect();
    assert_eq!(all, [big_flat, fast, slow]);
}
