//! The stacks the growth plot's bottom panel draws, and their legend
//! entries: one line per site (the sum of its stacks, their count in the
//! legend) or per stack, as the text report lists them (`--group-by`).
use super::Line;
use crate::model::leak::Verdict;
use crate::output::{Entry, Report, StackReport, human_bytes};

/// The stacks to plot: among the suspected leaks and the top stacks by
/// live bytes, those still growing in the second half of the window;
/// suspected leaks first, then the fastest late growth, at most `count`.
/// A one-time step or a cache that filled early is not growing any more
/// and would only squash the scale.
pub(super) fn stack_lines_of(report: &Report, count: usize) -> Vec<Line> {
    let (entries, leaks) = report.entries();
    // (label, rank among suspected leaks, entry)
    let mut candidates: Vec<(String, Option<usize>, Entry<'_>)> = leaks
        .into_iter()
        .map(|leak| (format!("L{}", leak.stack.rank), Some(leak.stack.rank), leak))
        .collect();
    for entry in entries {
        let stack = entry.stack;
        let same = |other: &Entry<'_>| {
            let other = other.stack;
            other.pid == stack.pid && other.stack_id == stack.stack_id && other.kind == stack.kind
        };
        match candidates.iter_mut().find(|(_, _, other)| same(other)) {
            Some((rank, _, _)) => rank.push_str(&format!(" #{}", stack.rank)),
            None => candidates.push((format!("#{}", stack.rank), None, entry)),
        }
    }
    candidates.retain(|(_, leak_rank, entry)| leak_rank.is_some() || still_growing(entry.stack));
    // Suspected leaks in the order the report ranks them (L1, L2, ...),
    // then the fastest late growth.
    candidates.sort_by(|a, b| match (a.1, b.1) {
        (Some(a_rank), Some(b_rank)) => a_rank.cmp(&b_rank),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => {
            b.2.stack
                .growth
                .late_rate_bytes_per_s
                .total_cmp(&a.2.stack.growth.late_rate_bytes_per_s)
        }
    });
    candidates.truncate(count);
    let several = report.targets.len() > 1;
    candidates
        .into_iter()
        .map(|(rank, _, entry)| (rank, entry.stack, entry.stack_count))
        .map(|(rank, stack, stack_count)| Line {
            label: format!("{rank} {}", useful_frame(stack)),
            detail: format!(
                "{}{}+{}/s, {} live{}",
                if stack_count > 1 {
                    format!("{stack_count} stacks, ")
                } else {
                    String::new()
                },
                if several {
                    format!("PID {}, ", stack.pid)
                } else {
                    String::new()
                },
                human_bytes(stack.growth_bytes_per_s),
                human_bytes(stack.ranked_live_bytes as f64),
                verdict_words(stack.verdict),
            ),
            through: stack.site.as_ref().and_then(|site| site.through.clone()),
            points: stack
                .series
                .iter()
                .map(|&(t, bytes)| (t, bytes as f64))
                .collect(),
            reference: false,
        })
        .collect()
}

/// The verdict as the legend's detail ends: `, suspected leak`.
fn verdict_words(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Leak => ", suspected leak",
        Verdict::TooEarly => ", too early to tell",
        Verdict::NotLeak => ", not a leak",
        Verdict::Empty => "",
    }
}

/// Whether a stack's live bytes still rose in the second half of the
/// window: its slope there, or, where that half holds too few snapshots
/// for a slope (a short run, a stack that appeared at the last snapshot),
/// a net rise across it.
fn still_growing(stack: &StackReport) -> bool {
    if stack.growth.late_rate_bytes_per_s > 0.0 {
        return true;
    }
    let Some(&(end_s, last_bytes)) = stack.series.last() else {
        return false;
    };
    let at_half = stack
        .series
        .iter()
        .rev()
        .find(|&&(t, _)| t <= end_s / 2.0)
        .map_or(0, |&(_, bytes)| bytes);
    last_bytes > at_half
}

/// The stack's site (first frame past the allocator and its wrappers),
/// its function cut to 32 characters, with file:line when known.
fn useful_frame(stack: &StackReport) -> String {
    let Some(site) = &stack.site else {
        return format!("stack {}", stack.stack_id);
    };
    let mut name_only = site.frame.clone();
    name_only.file = None;
    let function: String = crate::model::frame_label(&name_only)
        .chars()
        .take(32)
        .collect();
    let location = site
        .frame
        .short_location()
        .map(|location| format!(" ({location})"))
        .unwrap_or_default();
    let via = site
        .via
        .as_deref()
        .map(|via| format!(" via {via}"))
        .unwrap_or_default();
    format!("{function}{location}{via}")
}
