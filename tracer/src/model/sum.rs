//! A model with stacks summed into one (`Model::merged`): the stacks of
//! equal frames (`merge`) and the stacks of one site (the report's site
//! groups), their counters, series and growth fits added exactly.

use std::collections::HashMap;

use super::{Counters, LiveBytesFit, Model, Series, StackKey, StackState};

impl Model {
    /// The model with the stacks that `canonical` maps to one key summed
    /// into that key: counters, series and growth fit added exactly, at
    /// every snapshot (a stack adds 0 before it first appeared). A key
    /// `canonical` maps to itself stays as it is.
    pub fn merged(&self, canonical: impl Fn(&StackKey) -> StackKey) -> Model {
        let mut groups: HashMap<StackKey, Vec<&StackState>> = HashMap::new();
        for (key, state) in &self.stacks {
            groups.entry(canonical(key)).or_default().push(state);
        }
        let stacks = groups
            .into_iter()
            .map(|(key, members)| {
                let state = match members.as_slice() {
                    [only] => (*only).clone(),
                    _ => self.summed(&members),
                };
                (key, state)
            })
            .collect();
        Model {
            stacks,
            ..self.clone_without_stacks()
        }
    }

    fn clone_without_stacks(&self) -> Model {
        Model {
            stacks: HashMap::new(),
            times_s: self.times_s.clone(),
            kind_totals: self.kind_totals.clone(),
            rss_bytes: self.rss_bytes.clone(),
            cpu_s: self.cpu_s.clone(),
            process_allocs: self.process_allocs.clone(),
            time: self.time,
            window_s: self.window_s,
            snapshot_count: self.snapshot_count,
            stats: self.stats.clone(),
            retiring: HashMap::new(),
            folded: self.folded.clone(),
            folded_keys: Vec::new(),
        }
    }

    /// One stack holding what every one of `members` holds.
    fn summed(&self, members: &[&StackState]) -> StackState {
        let first_s = members
            .iter()
            .filter_map(|member| member.series.points.first().map(|&(time_s, _)| time_s))
            .fold(f64::INFINITY, f64::min);
        // Per member: the next series point to take and the counters so far.
        let mut cursors = vec![(0, Counters::default()); members.len()];
        let mut series = Series::default();
        for &time_s in self.times_s.iter().filter(|&&time_s| time_s >= first_s) {
            let mut sum = Counters::default();
            for (member, (next, current)) in members.iter().zip(cursors.iter_mut()) {
                let points = member.series.points();
                while *next < points.len() && points[*next].0 <= time_s {
                    *current = points[*next].1;
                    *next += 1;
                }
                sum = sum.plus(*current);
            }
            series.record(time_s, sum);
        }
        StackState {
            latest: members
                .iter()
                .fold(Counters::default(), |sum, member| sum.plus(member.latest)),
            series,
            // The fit is linear in live bytes: the sum's is the sum of fits.
            fit: LiveBytesFit {
                mean_live_bytes: members.iter().map(|m| m.fit.mean_live_bytes).sum(),
                co_moment_bytes_s: members.iter().map(|m| m.fit.co_moment_bytes_s).sum(),
            },
        }
    }
}
