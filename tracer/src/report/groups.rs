//! One entry per site (must-have 4 of issue 26): the stacks that share a
//! site label (one function and line reached by several call paths, such
//! as the 8 layer paths of a model that all allocate in
//! `Linear.__init__`) summed into one stack, which is ranked and judged
//! like any other: its counters and series are the sums, its frames those
//! of its largest stack. Its verdict is the sum's, unless the sum is no
//! leak but some of its stacks are (a leaking path beside a churning one):
//! then theirs, and its frames those of the largest of them.
use std::collections::{BTreeMap, HashMap};

use super::{ReportInput, Sites, StackReport, Views, ranked_lists};
use crate::config::GroupBy;
use crate::model::{Kind, StackId, StackKey, ranking::sort_leaks, site, trim_allocator_frames};

/// Beyond this many stacks the report lists them one by one: frames are
/// then known for only some of them (`session::MERGE_ALL_UP_TO`), so a
/// site's sum would leave some of its stacks out, and the grouping would
/// double the time a report of 10^5 stacks takes.
const MAX_GROUPED_STACKS: usize = 20_000;

/// The stacks of one process and kind that share a site, summed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SiteGroup {
    /// Counters, growth and series summed over the group's stacks; the
    /// stack id, frames and site are those of the stack that holds the
    /// most.
    #[serde(flatten)]
    pub sum: StackReport,
    /// How many stacks (of distinct frames) share the site.
    pub stack_count: usize,
    /// Their ids, the largest first (with those merged for equal frames).
    pub stack_ids: Vec<u32>,
}

/// The site groups as the report ranks them, and those judged leaks (by
/// their stacks: `Model::site_growth`); `canonical` maps each stack of the
/// model to the one it was merged into for equal frames.
pub(super) fn site_groups(
    input: &ReportInput<'_>,
    views: Views<'_>,
    canonical: &BTreeMap<StackKey, StackKey>,
    judged_elsewhere: bool,
    sites: Option<&SiteMap>,
) -> (Vec<SiteGroup>, Vec<SiteGroup>) {
    let Some(SiteMap {
        into_site,
        members_of,
    }) = sites
    else {
        return (Vec::new(), Vec::new());
    };
    let site_of = |key: &StackKey| into_site.get(key).copied().unwrap_or(*key);
    let model = views.model.merged(site_of);
    let judged = judged_elsewhere.then(|| views.judged.merged(site_of));
    let site_views = Views {
        model: &model,
        judged: judged.as_ref().unwrap_or(&model),
        sites: Some(Sites {
            stacks: views.judged,
            members: members_of,
        }),
        carried: None,
    };
    // Every stack, as merged for frames, to its group's.
    let mut members: BTreeMap<StackKey, StackKey> = views
        .model
        .latest_counters()
        .map(|(key, _)| (key, site_of(&key)))
        .collect();
    for (stack, into) in canonical {
        members.insert(*stack, site_of(into));
    }
    let mut leaks: Vec<_> = site_views
        .judged
        .leak_candidates(site_views.judged.latest_counters().map(|(key, _)| key))
        .into_iter()
        .map(|key| (key, site_views.growth(&key)))
        .filter(|(_, growth)| growth.suspected_leak)
        .collect();
    sort_leaks(&mut leaks);
    leaks.truncate(input.view.top);
    let listed = ranked_lists(input, site_views, &members, judged_elsewhere, leaks);
    let counts: HashMap<_, usize> = members_of
        .iter()
        .map(|(into, members)| ((into.pid, into.kind, into.stack_id.to_raw()), members.len()))
        .collect();
    let group = |sum: StackReport| {
        let stack_count = counts
            .get(&(sum.pid, sum.kind, sum.stack_id))
            .copied()
            .unwrap_or(1);
        let mut stack_ids = vec![sum.stack_id];
        stack_ids.extend(&sum.merged_stack_ids);
        // A site that leaks in some of its stacks shows the largest of
        // them.
        let frames = match sum.growth.leaking_part {
            Some(part) => trim_allocator_frames(input.run.stacks.frames(&StackKey {
                pid: sum.pid,
                stack_id: StackId::from_raw(part.stack_id),
                kind: sum.kind,
            })),
            None => sum.frames.clone(),
        };
        SiteGroup {
            sum: StackReport {
                merged_stack_ids: Vec::new(),
                frames,
                ..sum
            },
            stack_count: stack_count.max(1),
            stack_ids,
        }
    };
    (
        listed.stacks.into_iter().map(group).collect(),
        listed.suspected_leaks.into_iter().map(group).collect(),
    )
}

/// The site each stack of a model is of, and each site's stacks.
pub(super) struct SiteMap {
    /// Each stack (merged for frames) to the stack its site group is
    /// named by.
    pub into_site: HashMap<StackKey, StackKey>,
    pub members_of: HashMap<StackKey, Vec<StackKey>>,
}

impl SiteMap {
    /// The sites of `views`' stacks; none beyond `MAX_GROUPED_STACKS`.
    pub(super) fn of(input: &ReportInput<'_>, views: Views<'_>) -> Option<SiteMap> {
        if views.model.latest_counters().count() > MAX_GROUPED_STACKS {
            return None;
        }
        let into_site = site_map(input, views);
        let members_of = stacks_of_sites(&into_site);
        Some(SiteMap {
            into_site,
            members_of,
        })
    }
}

/// Each stack of the model (merged for frames) to the stack its site
/// group is named by (see [`by_site_label`]), by live bytes at the moment
/// judged.
fn site_map(input: &ReportInput<'_>, views: Views<'_>) -> HashMap<StackKey, StackKey> {
    by_site_label(views.model.latest_counters().filter_map(|(key, latest)| {
        let frames = trim_allocator_frames(input.run.stacks.frames(&key));
        let site = site(&frames, input.view.wrappers)?;
        let ranked_bytes = views
            .judged
            .series(&key)
            .map_or(latest.live_bytes, |series| series.latest().live_bytes);
        Some((key, ranked_bytes, site.label))
    }))
}

/// The stacks of each site group, from each stack's (`into_site`).
pub fn stacks_of_sites(
    into_site: &HashMap<StackKey, StackKey>,
) -> HashMap<StackKey, Vec<StackKey>> {
    let mut members_of: HashMap<StackKey, Vec<StackKey>> = HashMap::new();
    for (member, into) in into_site {
        members_of.entry(*into).or_default().push(*member);
    }
    members_of
}

/// Each stack to the stack its site group is named by: of the stacks
/// with the same process, kind and site label, the one holding the most
/// bytes (the smaller key on a tie). A stack not given stays alone.
pub fn by_site_label(
    stacks: impl IntoIterator<Item = (StackKey, i64, String)>,
) -> HashMap<StackKey, StackKey> {
    let mut by_site: HashMap<(u32, Kind, String), Vec<(i64, StackKey)>> = HashMap::new();
    for (key, bytes, label) in stacks {
        by_site
            .entry((key.pid, key.kind, label))
            .or_default()
            .push((bytes, key));
    }
    let mut into_site = HashMap::new();
    for mut stacks in by_site.into_values() {
        stacks.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let largest = stacks[0].1;
        for (_, key) in stacks {
            into_site.insert(key, largest);
        }
    }
    into_site
}

/// One entry of a list as the layout lays it out: a stack, or the sum of
/// a site's stacks, and how many stacks it holds.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    pub stack: &'a StackReport,
    pub stack_count: usize,
}

impl super::Report {
    /// The ranked entries and the suspected leaks, one per site or one
    /// per stack (`--group-by`; per stack where no groups were made).
    pub fn entries(&self) -> (Vec<Entry<'_>>, Vec<Entry<'_>>) {
        let grouped = !self.groups.is_empty() || self.stacks.is_empty();
        match self.layout.group_by {
            GroupBy::Site if grouped => (
                of_groups(&self.groups),
                of_groups(&self.suspected_leak_groups),
            ),
            _ => (of_stacks(&self.stacks), of_stacks(&self.suspected_leaks)),
        }
    }
}

fn of_groups(groups: &[SiteGroup]) -> Vec<Entry<'_>> {
    groups
        .iter()
        .map(|group| Entry {
            stack: &group.sum,
            stack_count: group.stack_count,
        })
        .collect()
}

fn of_stacks(stacks: &[StackReport]) -> Vec<Entry<'_>> {
    stacks
        .iter()
        .map(|stack| Entry {
            stack,
            stack_count: 1,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::report::fixtures::one_site_report as report;

    #[test]
    fn stacks_of_one_site_are_summed_into_one_group_and_kept() {
        let report = report();
        assert_eq!(report.stacks.len(), 3, "the stacks are kept");
        let group = &report.groups[0];
        assert_eq!((group.sum.rank, group.sum.pid), (1, 10));
        assert_eq!(group.stack_count, 2);
        assert_eq!(group.stack_ids, [1, 2], "the largest first");
        assert_eq!(group.sum.live_bytes, 4 * 65536 + 4096);
        assert_eq!(group.sum.live_allocs, 4096 + 64);
        assert_eq!(group.sum.series.last(), Some(&(4.0, 4 * 65536 + 4096)));
        assert_eq!(
            group.sum.site.as_ref().map(|site| site.label.as_str()),
            Some("fill (leak.c:12)")
        );
        assert_eq!(
            report.groups.len(),
            2,
            "pid 20's stack is a group of its own"
        );
        assert_eq!(report.groups[1].stack_count, 1);
    }
}
