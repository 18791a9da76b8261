//! The target's own work over the window: the clocks a site's growth is
//! judged against (`verdict`). A leak grows with the work that leaks and
//! stops growing when that work stops (the process went idle); a warm-up,
//! a cache at its capacity or a pool at its high-water mark stop growing
//! while the work goes on. Over a short window the two series of live
//! bytes look alike against wall-clock time; against the work they do not.
//!
//! Two clocks per process: the CPU time it used (all its threads, read
//! from /proc/PID/stat at each snapshot by `collect`) and the allocation
//! calls it made (the sum of every stack's total, which the kernel keeps).
//! A site's own allocation calls, the third clock, are in its counters.

use super::Model;

/// One process's work at every snapshot, the attach point (0 s, no work)
/// first: cumulative since attach.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Activity {
    /// CPU seconds used; `None` where no reading was taken (a recording
    /// made before tracer read CPU time).
    pub cpu_s: Option<Vec<f64>>,
    /// Allocation calls made, every stack and kind together.
    pub process_allocs: Vec<u64>,
}

impl Model {
    /// The work of process `pid` at every snapshot: each reading carried
    /// forward to the snapshots without one (after the process exited),
    /// and no work before its first.
    pub fn activity(&self, pid: u32) -> Activity {
        let cpu_s = self
            .cpu_s
            .get(&pid)
            .map(|points| self.at_every_snapshot(points, 0.0));
        let process_allocs = self
            .process_allocs
            .get(&pid)
            .map_or_else(Vec::new, |points| self.at_every_snapshot(points, 0));
        Activity {
            cpu_s,
            process_allocs: if process_allocs.is_empty() {
                vec![0; self.times_s.len() + 1]
            } else {
                process_allocs
            },
        }
    }

    /// `points` (a subset of the snapshot times, in order) at the attach
    /// point and every snapshot, carried forward; `zero` before the first.
    fn at_every_snapshot<T: Copy>(&self, points: &[(f64, T)], zero: T) -> Vec<T> {
        let mut next = 0;
        let mut current = zero;
        let mut dense = Vec::with_capacity(self.times_s.len() + 1);
        dense.push(zero);
        for &time_s in &self.times_s {
            while next < points.len() && points[next].0 <= time_s {
                current = points[next].1;
                next += 1;
            }
            dense.push(current);
        }
        dense
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{Model, Snapshot, fixtures::counters, fixtures::heap_key};

    #[test]
    fn activity_sums_the_process_stacks_and_carries_cpu_forward() {
        let mut model = Model::new();
        for (t, cpu) in [(1.0, Some(0.5)), (2.0, Some(0.75)), (3.0, None)] {
            model.push(Snapshot {
                elapsed_s: t,
                stacks: vec![
                    (heap_key(1, 1), counters(64 * t as i64)),
                    (heap_key(1, 2), counters(128)),
                    (heap_key(2, 1), counters(6400)),
                ],
                cpu_s: cpu.map(|cpu| vec![(1, cpu)]).unwrap_or_default(),
                ..Snapshot::default()
            });
        }
        let activity = model.activity(1);
        assert_eq!(activity.cpu_s, Some(vec![0.0, 0.5, 0.75, 0.75]));
        // counters(b) made 2 * b / 64 calls.
        assert_eq!(activity.process_allocs, [0, 6, 8, 10]);
        assert_eq!(model.activity(2).cpu_s, None);
        assert_eq!(model.activity(2).process_allocs, [0, 200, 200, 200]);
        assert_eq!(model.activity(3).process_allocs, [0, 0, 0, 0]);
    }
}
