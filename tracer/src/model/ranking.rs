//! The rankings of a model: the stacks holding the most, growing fastest,
//! and suspected of leaking, and the growth fit they are ranked by.

use super::{Growth, Model, StackKey, StackState, StackSummary, verdict};

impl Model {
    /// The evidence about a stack's growth over the window, and the
    /// verdict (`verdict`).
    pub fn growth(&self, key: &StackKey) -> Growth {
        verdict::judge(
            &self.counters_at_every_snapshot(key),
            &self.activity(key.pid),
        )
    }

    /// Stacks judged leaks (`verdict`), fastest first, at most `count`.
    pub fn suspected_leaks(&self, count: usize) -> Vec<(StackKey, Growth)> {
        let mut leaks = self.suspected_leaks_among(self.stacks.keys().copied());
        sort_leaks(&mut leaks);
        leaks.truncate(count);
        leaks
    }

    /// The suspected leaks among `keys`, in no order.
    pub fn suspected_leaks_among(
        &self,
        keys: impl Iterator<Item = StackKey>,
    ) -> Vec<(StackKey, Growth)> {
        let candidates = self.leak_candidates(keys);
        let activities = self.activities(candidates.iter().copied());
        candidates
            .into_iter()
            .map(|key| {
                let points = self.counters_at_every_snapshot(&key);
                (key, verdict::judge(&points, &activities[&key.pid]))
            })
            .filter(|(_, growth)| growth.suspected_leak)
            .collect()
    }

    /// The stacks among `keys` that could be leaks: memory that holds
    /// bytes and grew over the window.
    pub fn leak_candidates(&self, keys: impl Iterator<Item = StackKey>) -> Vec<StackKey> {
        keys.filter(|key| {
            self.stacks.get(key).is_some_and(|state| {
                key.kind.is_memory() && state.latest.live_bytes > 0 && self.growth_of(state) > 0.0
            })
        })
        .collect()
    }

    /// The `count` stacks holding the most live bytes; ties go to the faster
    /// growing stack, then to the smaller key. Stacks holding nothing, and
    /// reserved address space, are left out.
    pub fn top_stacks(&self, count: usize) -> Vec<StackSummary> {
        let mut summaries: Vec<StackSummary> = self
            .stacks
            .iter()
            .filter(|(key, state)| key.kind.is_memory() && state.latest.live_bytes > 0)
            .map(|(key, state)| StackSummary {
                key: *key,
                latest: state.latest,
                growth_bytes_per_s: self.growth_of(state),
            })
            .collect();
        summaries.sort_by(|a, b| {
            b.latest
                .live_bytes
                .cmp(&a.latest.live_bytes)
                .then(b.growth_bytes_per_s.total_cmp(&a.growth_bytes_per_s))
                .then(a.key.cmp(&b.key))
        });
        summaries.truncate(count);
        summaries
    }

    /// The `count` stacks growing fastest (positive growth only), fastest
    /// first; ties go to the smaller key.
    pub fn fastest_growing(&self, count: usize) -> Vec<StackSummary> {
        let mut summaries: Vec<StackSummary> = self
            .stacks
            .iter()
            .map(|(key, state)| StackSummary {
                key: *key,
                latest: state.latest,
                growth_bytes_per_s: self.growth_of(state),
            })
            .filter(|summary| {
                summary.key.kind.is_memory()
                    && summary.growth_bytes_per_s > 0.0
                    && summary.latest.live_bytes > 0
            })
            .collect();
        summaries.sort_by(|a, b| {
            b.growth_bytes_per_s
                .total_cmp(&a.growth_bytes_per_s)
                .then(a.key.cmp(&b.key))
        });
        summaries.truncate(count);
        summaries
    }

    /// Least-squares slope of the stack's live bytes over the whole window:
    /// from the attach point (0 s, 0 bytes) through every snapshot, with 0
    /// bytes before the stack first appeared. 0 for an unknown stack or a
    /// window with fewer than two distinct times.
    pub fn growth_bytes_per_s(&self, key: &StackKey) -> f64 {
        self.stacks
            .get(key)
            .map_or(0.0, |state| self.growth_of(state))
    }

    fn growth_of(&self, state: &StackState) -> f64 {
        if self.time.m2_s2 > 0.0 {
            state.fit.co_moment_bytes_s / self.time.m2_s2
        } else {
            0.0
        }
    }
}

/// Suspected leaks fastest first, ties to the smaller key.
pub fn sort_leaks(leaks: &mut [(StackKey, Growth)]) {
    leaks.sort_by(|a, b| {
        b.1.rate_bytes_per_s
            .total_cmp(&a.1.rate_bytes_per_s)
            .then(a.0.cmp(&b.0))
    });
}
