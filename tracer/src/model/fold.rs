//! Folding stacks that hold nothing and never count again, so that the
//! model holds what is live, not every stack a long run ever made.
//!
//! The collector retires a stack (`Snapshot::retired`) when the kernel no
//! longer holds any id for it: it held nothing, and its name is never given
//! to other frames. Its state here (counters, series, growth fit) then only
//! matters for the moments a report may be judged at (`peak`): the end,
//! where it holds nothing, or a moment before a fall in the traced live
//! bytes. Those moments, now and at any later snapshot, are among:
//!
//! - the last snapshot within `PEAK_SHARE` of the maximum (a later one
//!   replaces it);
//! - the start of the final fall, the snapshot a walk back from the end
//!   reaches over the flat end and the strictly falling run before it (a
//!   later fall starts after a later rise, or inside the flat end);
//! - the snapshots of the flat end;
//! - snapshots to come, where the stack holds nothing.
//!
//! So a retired stack that held nothing at the first three is folded: its
//! allocated totals join its process and kind's `FoldedStacks`, exactly
//! (the stack quality counts them), and its state goes. One that held
//! memory there waits, retried at every snapshot. A retired stack seen in
//! a later snapshot is held again and waits no more. The owner of the model
//! takes the keys folded (`take_folded`) and tells the collector, which
//! forgets their frames.

use super::{Counters, Kind, Model, Series, StackKey, peak};

/// A stack that holds nothing and will never count again (the collector
/// let go of every kernel id of its frames), and whether it reaches its
/// thread's start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Retired {
    pub key: StackKey,
    pub reaches_entry: bool,
}

/// The stacks of one process and kind folded away, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FoldedStacks {
    pub stacks: u64,
    /// Their counters added (live ones 0).
    pub counters: Counters,
    /// The bytes they allocated whose stacks reach their thread's start.
    pub reaching_entry_bytes: u64,
}

/// The moments a retired stack must hold nothing at to be folded.
struct Moments {
    points_s: Vec<f64>,
    /// The flat end: from, to.
    flat_s: (f64, f64),
}

impl Model {
    /// Takes the stacks retired in a snapshot, after its counters, and
    /// folds every retired stack that can be.
    pub(super) fn retire(&mut self, retired: Vec<Retired>) {
        for Retired { key, reaches_entry } in retired {
            if self.stacks.contains_key(&key) {
                self.retiring.insert(key, reaches_entry);
            }
        }
        if self.retiring.is_empty() {
            return;
        }
        let Some(moments) = self.fold_moments() else {
            return;
        };
        let foldable: Vec<(StackKey, bool)> = self
            .retiring
            .iter()
            .filter(|(key, _)| {
                self.stacks
                    .get(key)
                    .is_none_or(|state| holds_nothing_at(&state.series, &moments))
            })
            .map(|(&key, &reaches)| (key, reaches))
            .collect();
        for (key, reaches_entry) in foldable {
            self.retiring.remove(&key);
            let Some(state) = self.stacks.remove(&key) else {
                continue;
            };
            let folded = self.folded.entry((key.pid, key.kind)).or_default();
            folded.stacks += 1;
            folded.counters = folded.counters.plus(state.latest);
            if reaches_entry {
                folded.reaching_entry_bytes += state.latest.alloc_bytes_total;
            }
            self.folded_keys.push(key);
        }
    }

    /// The stacks folded since the last call: the collector forgets them.
    pub fn take_folded(&mut self) -> Vec<StackKey> {
        std::mem::take(&mut self.folded_keys)
    }

    /// The stacks folded away, by process and kind.
    pub fn folded_stacks(&self) -> impl Iterator<Item = (&(u32, Kind), &FoldedStacks)> {
        self.folded.iter()
    }

    /// Stacks retired and not folded yet (they held memory at a moment a
    /// report may be judged at).
    pub fn retiring_count(&self) -> usize {
        self.retiring.len()
    }

    /// The moments of the traced live bytes a report may be judged at
    /// (see the module's comment); None before any snapshot.
    fn fold_moments(&self) -> Option<Moments> {
        let series = self.traced_live_series();
        let &(end_s, _) = series.last()?;
        let max_bytes = series.iter().map(|&(_, bytes)| bytes).max()?;
        let mut points_s = Vec::new();
        if let Some(&(near_max_s, _)) = series
            .iter()
            .rev()
            .find(|&&(_, bytes)| bytes as f64 >= peak::PEAK_SHARE * max_bytes as f64)
        {
            points_s.push(near_max_s);
        }
        let mut start = series.len() - 1;
        while start > 0 && series[start - 1].1 == series[start].1 {
            start -= 1;
        }
        let flat_s = (series[start].0, end_s);
        while start > 0 && series[start - 1].1 > series[start].1 {
            start -= 1;
        }
        points_s.push(series[start].0);
        Some(Moments { points_s, flat_s })
    }
}

/// Whether a series holds no live bytes at any of `moments`.
fn holds_nothing_at(series: &Series, moments: &Moments) -> bool {
    let points = series.points();
    // The live bytes at `time_s`: those of the last point at or before it.
    let at = |time_s: f64| {
        let index = points.partition_point(|&(point_s, _)| point_s <= time_s);
        index
            .checked_sub(1)
            .map_or(0, |index| points[index].1.live_bytes)
    };
    if moments.points_s.iter().any(|&time_s| at(time_s) != 0) {
        return false;
    }
    let (from_s, to_s) = moments.flat_s;
    at(from_s) == 0
        && points
            .iter()
            .filter(|&&(point_s, _)| point_s > from_s && point_s <= to_s)
            .all(|(_, counters)| counters.live_bytes == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Snapshot, StackId, fixtures::heap_key};

    const MIB: i64 = 1 << 20;

    fn held(live_blocks: i64, allocated: u64) -> Counters {
        Counters {
            live_bytes: live_blocks * MIB,
            live_allocs: live_blocks,
            alloc_bytes_total: allocated * MIB as u64,
            alloc_count_total: allocated,
        }
    }

    fn push(model: &mut Model, time_s: f64, stacks: &[(StackKey, Counters)], retired: &[StackKey]) {
        model.push(Snapshot {
            elapsed_s: time_s,
            stacks: stacks.to_vec(),
            retired: retired
                .iter()
                .map(|&key| Retired {
                    key,
                    reaches_entry: key.stack_id == StackId::Kernel(1),
                })
                .collect(),
            ..Snapshot::default()
        });
    }

    /// A temporary (5 blocks, then none) beside a leak (1 block, then 9):
    /// the leak grows past what the temporary ever held, the peak is at
    /// 3 s, and the temporary, retired then, is folded. The model, the
    /// leak and the temporary.
    fn temporary_folded_past_the_peak() -> (Model, StackKey, StackKey) {
        let (leak, temporary) = (heap_key(7, 1), heap_key(7, 2));
        let mut model = Model::new();
        push(&mut model, 1.0, &[(temporary, held(5, 5))], &[]);
        push(
            &mut model,
            2.0,
            &[(temporary, held(0, 5)), (leak, held(1, 1))],
            &[],
        );
        push(&mut model, 3.0, &[(leak, held(9, 9))], &[temporary]);
        assert_eq!(model.take_folded(), [temporary]);
        (model, leak, temporary)
    }

    #[test]
    fn a_stack_that_held_memory_only_long_before_the_peak_is_folded_with_its_totals() {
        let (model, _, temporary) = temporary_folded_past_the_peak();
        assert!(model.series(&temporary).is_none());
        let folded: Vec<_> = model.folded_stacks().collect();
        assert_eq!(
            folded,
            [(
                &(7, Kind::Heap),
                &FoldedStacks {
                    stacks: 1,
                    counters: held(0, 5),
                    reaching_entry_bytes: 0,
                }
            )]
        );
        // Totals are unchanged: the folded stack held nothing.
        assert_eq!(model.totals()[&Kind::Heap].live_bytes, 9 * MIB);
        let quality = crate::model::quality::stack_quality(&model, |_| true);
        assert_eq!(quality[&7].recorded_bytes, 14 * MIB as u64);
        assert_eq!(quality[&7].reaching_entry_bytes, 9 * MIB as u64);
    }

    #[test]
    fn a_stack_that_held_the_peak_waits_until_the_peak_is_passed() {
        let (early, late) = (heap_key(7, 1), heap_key(7, 2));
        let mut model = Model::new();
        push(&mut model, 1.0, &[(early, held(8, 8))], &[]);
        // Freed: the target tore down. The peak (t = 1) is where a report
        // is judged: the early stack stays.
        push(&mut model, 2.0, &[(early, held(0, 8))], &[early]);
        assert!(model.take_folded().is_empty());
        assert_eq!(model.retiring_count(), 1);
        let judged = model.as_of(1.0);
        assert_eq!(judged.totals()[&Kind::Heap].live_bytes, 8 * MIB);
        // Another stack grows past it: the early peak can no longer be
        // judged at, and the early stack is folded.
        push(&mut model, 3.0, &[(late, held(9, 9))], &[]);
        assert_eq!(model.take_folded(), [early]);
        assert_eq!(model.retiring_count(), 0);
    }

    /// The process's allocation calls, a clock the verdicts judge growth
    /// against, count the calls of stacks folded away: they never fall.
    #[test]
    fn a_process_calls_keep_those_of_its_folded_stacks() {
        let (mut model, leak, _) = temporary_folded_past_the_peak();
        push(&mut model, 4.0, &[(leak, held(10, 10))], &[]);
        assert_eq!(model.activity(7).process_allocs, [0, 5, 6, 14, 15]);
    }

    #[test]
    fn a_retired_stack_seen_again_is_held_again() {
        let (early, other) = (heap_key(7, 1), heap_key(7, 2));
        let mut model = Model::new();
        push(&mut model, 1.0, &[(early, held(8, 8))], &[]);
        push(&mut model, 2.0, &[(early, held(0, 8))], &[early]);
        assert_eq!(model.retiring_count(), 1);
        // Walked again before it was folded: it counts again.
        push(&mut model, 3.0, &[(early, held(2, 10))], &[]);
        assert_eq!(model.retiring_count(), 0);
        push(&mut model, 4.0, &[(other, held(20, 20))], &[]);
        assert!(model.take_folded().is_empty());
        assert_eq!(model.series(&early).map(|s| s.latest()), Some(held(2, 10)));
    }
}
