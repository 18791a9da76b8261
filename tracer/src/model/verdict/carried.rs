//! The verdict a stack of a leaking site carries when it reads otherwise
//! alone (issue 51): a site whose path beneath it changes leaks through
//! stacks that take turns.
use std::collections::HashMap;

use super::{judge_with_increments, sum};
use crate::model::{
    Counters, Model, StackKey,
    leak::{Growth, SiteShare, Verdict, WorkEvidence},
};

impl Model {
    /// The stacks of leaking sites that read otherwise on their own, with
    /// the verdict they carry (`members_of`: each site's stacks). A site
    /// whose path beneath it changes (CPython's adaptive specialization,
    /// an allocator's cache, a dispatch table built lazily) leaks through
    /// stacks that take turns: one that stopped growing while the site
    /// went on reads "not a leak" alone, since the target kept working.
    /// Such a stack, if it grew at some of the site's rises and never gave
    /// back, carries the site's verdict and confidence, with its own
    /// evidence and its share of the site's rises. A site judged a leak
    /// for a part of its stacks (`leaking_part`) lends nothing: its sum is
    /// no leak.
    pub fn carried_verdicts(
        &self,
        members_of: &HashMap<StackKey, Vec<StackKey>>,
    ) -> HashMap<StackKey, Growth> {
        let mut carried = HashMap::new();
        for members in members_of.values().filter(|members| members.len() >= 2) {
            let activity = self.activity(members[0].pid);
            let dense: Vec<Vec<(f64, Counters)>> = members
                .iter()
                .map(|member| self.counters_at_every_snapshot(member))
                .collect();
            let (site, site_rises) = judge_with_increments(&sum(dense.iter()), &activity);
            if site.verdict != Verdict::Leak || site.leaking_part.is_some() {
                continue;
            }
            for (member, points) in members.iter().zip(&dense) {
                let (own, own_rises) = judge_with_increments(points, &activity);
                let gave_back = own.steps.is_none_or(|steps| steps.falls > 0);
                if own.verdict == Verdict::Leak || own.verdict == Verdict::Empty || gave_back {
                    continue;
                }
                let rises = own_rises
                    .iter()
                    .filter(|rise| site_rises.contains(rise))
                    .count();
                if rises == 0 {
                    continue;
                }
                carried.insert(
                    *member,
                    Growth {
                        verdict: Verdict::Leak,
                        suspected_leak: true,
                        confidence: site.confidence,
                        shape: site.shape,
                        work: own.work.map(|work| WorkEvidence {
                            decided_by: None,
                            ..work
                        }),
                        site_share: Some(SiteShare {
                            rises,
                            of_site_rises: site_rises.len(),
                        }),
                        ..own
                    },
                );
            }
        }
        carried
    }
}
