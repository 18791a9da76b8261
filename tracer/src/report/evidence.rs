//! The verdict in words, the same in every format: what a stack kept (its
//! steps, or what it gave back) and how that tracked the target's work,
//! which is why it is, or is not, a leak. The text report prints the two
//! halves on two lines; JSON carries them joined as `evidence`.

use super::human_bytes;
use crate::model::{
    Kind,
    leak::{Clock, Growth, Shape, StepGrowth, Verdict, Work},
};

/// What a kind's counters count, in words: allocation calls and blocks,
/// or (`resident`) the page faults that charged pages, and pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Units {
    pub call: &'static str,
    pub calls: &'static str,
    pub block: &'static str,
    pub blocks: &'static str,
}

impl Units {
    pub fn of(kind: Kind) -> Units {
        match kind {
            Kind::Resident => Units {
                call: "page fault",
                calls: "page faults",
                block: "page",
                blocks: "pages",
            },
            _ => Units {
                call: "allocation call",
                calls: "allocation calls",
                block: "block",
                blocks: "blocks",
            },
        }
    }
}

/// What the stack kept: `rose in 4 steps of ~20.0 MiB, none freed (80 of
/// 80 blocks since attach still live)`; empty for a verdict on nothing.
pub fn growth_words(growth: &Growth, units: Units) -> String {
    let Some(steps) = growth.steps else {
        return String::new();
    };
    let blocks = blocks_words(&steps, units);
    match growth.shape {
        Some(Shape::Churn) => format!(
            "gave back {} from a peak of {}, {}",
            human_bytes(steps.given_back_bytes as f64),
            human_bytes(steps.peak_live_bytes as f64),
            blocks
        ),
        Some(Shape::Steps) => format!(
            "rose in {} steps of ~{}, {blocks}",
            steps.count,
            human_bytes(steps.typical_step_bytes as f64)
        ),
        _ => format!(
            "grew by {} in {} {}, {blocks}",
            human_bytes((steps.typical_step_bytes * steps.count as i64) as f64),
            steps.increments,
            plural(steps.increments, "interval", "intervals")
        ),
    }
}

/// `none freed (80 of 80 blocks since attach still live)`.
fn blocks_words(steps: &StepGrowth, units: Units) -> String {
    let freed = steps
        .alloc_count_total
        .saturating_sub(steps.live_allocs.max(0) as u64);
    let how = if steps.none_freed {
        "none freed".to_owned()
    } else {
        format!("{freed} freed")
    };
    format!(
        "{how} ({} of {} {} since attach still live)",
        steps.live_allocs, steps.alloc_count_total, units.blocks
    )
}

/// Why the verdict: how the growth tracked the target's work.
pub fn work_words(growth: &Growth, units: Units) -> String {
    let (Some(steps), Some(work)) = (growth.steps, growth.work) else {
        return String::new();
    };
    let since = work_phrase(&work.since_last_increment, units);
    let part = growth.leaking_part.map_or_else(String::new, |part| {
        format!(
            "{} of its {} stacks, holding {}: ",
            part.stacks,
            part.of_stacks,
            human_bytes(part.live_bytes as f64)
        )
    });
    let share = growth.site_share.map_or_else(String::new, |share| {
        format!(
            "grew at {} of its site's {} rises (the site leaks, through its other stacks \
             since): ",
            share.rises, share.of_site_rises
        )
    });
    let words = match growth.verdict {
        Verdict::Empty => String::new(),
        // Within the rounding of "0.0 s ago" (a final snapshot taken
        // right after the one before) it is still growing.
        Verdict::Leak if work.since_s < 0.05 => format!(
            "grew with the target's work ({}) and was still growing at the end",
            work_phrase(&work.while_growing, units)
        ),
        Verdict::Leak => format!(
            "grew with the target's work ({}); since its last rise {:.1} s ago: {since}",
            work_phrase(&work.while_growing, units),
            work.since_s
        ),
        Verdict::NotLeak if growth.shape == Some(Shape::Churn) => {
            format!("fell back {} times: churn", steps.falls)
        }
        Verdict::NotLeak => {
            let clock = work.decided_by.unwrap_or(Clock::Allocs);
            let (since, during) = clock_phrases(
                clock,
                &work.since_last_increment,
                &work.while_growing,
                units,
            );
            format!(
                "flat for {:.1} s of work after it grew ({since} against {during} while growing)",
                work.since_s,
            )
        }
        Verdict::TooEarly => match growth.more_to_decide() {
            Some(more) if steps.increments < crate::model::verdict::MIN_INCREMENTS => format!(
                "{more} more {} would decide (since its last, {:.1} s: {since})",
                plural(more, "rise", "rises"),
                work.since_s
            ),
            Some(more) => format!(
                "flat for {:.1} s ({since}), more than between its rises; work worth {more} \
                 more {}, without growth, would decide",
                work.since_s,
                plural(more, "rise", "rises")
            ),
            None => format!(
                "the window holds too few snapshots to tell (need {})",
                crate::model::leak::MIN_SNAPSHOTS
            ),
        },
    };
    format!("{part}{share}{words}")
}

/// The verdict and its confidence: `leak, high confidence`.
pub fn verdict_words(growth: &Growth) -> String {
    match growth.confidence {
        Some(confidence) => format!(
            "{}, {} confidence",
            growth.verdict.words(),
            confidence.as_str()
        ),
        None => growth.verdict.words().to_owned(),
    }
}

/// Both halves, one line: what JSON's `evidence` says.
pub fn evidence_line(growth: &Growth, units: Units) -> String {
    let (kept, why) = (growth_words(growth, units), work_words(growth, units));
    match (kept.is_empty(), why.is_empty()) {
        (true, _) => why,
        (_, true) => kept,
        _ => format!("{kept}; {why}"),
    }
}

/// `1200 allocation calls, 3.4 s CPU`.
fn work_phrase(work: &Work, units: Units) -> String {
    let calls = format!(
        "{} {}",
        work.allocs,
        plural(work.allocs as usize, units.call, units.calls)
    );
    match work.cpu_s {
        Some(cpu_s) => format!("{calls}, {cpu_s:.1} s CPU"),
        None => calls,
    }
}

/// The work since and during on one clock: `1.2 s CPU`, `0.3 s`.
fn clock_phrases(clock: Clock, since: &Work, during: &Work, units: Units) -> (String, String) {
    match clock {
        Clock::Cpu => (
            format!("{:.1} s CPU", since.cpu_s.unwrap_or(0.0)),
            format!("{:.1} s", during.cpu_s.unwrap_or(0.0)),
        ),
        Clock::Allocs => (
            format!("{} {}", since.allocs, units.calls),
            during.allocs.to_string(),
        ),
        Clock::SiteAllocs => (
            format!("{} {} of its own", since.site_allocs, units.calls),
            during.site_allocs.to_string(),
        ),
    }
}

fn plural(count: usize, one: &'static str, many: &'static str) -> &'static str {
    if count == 1 { one } else { many }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Counters, activity::Activity, verdict::judge};

    const MIB: i64 = 1 << 20;

    fn judged(live: &[i64], allocs: &[u64], cpu_s: &[f64]) -> Growth {
        let points: Vec<(f64, Counters)> = live
            .iter()
            .enumerate()
            .map(|(index, &blocks)| {
                let allocated = live[..=index].iter().copied().max().unwrap_or(0);
                (
                    index as f64,
                    Counters {
                        live_bytes: blocks * MIB,
                        live_allocs: blocks,
                        alloc_bytes_total: (allocated * MIB) as u64,
                        alloc_count_total: allocated as u64,
                    },
                )
            })
            .collect();
        judge(
            &points,
            &Activity {
                cpu_s: Some(cpu_s.to_vec()),
                process_allocs: allocs.to_vec(),
            },
        )
    }

    #[test]
    fn a_leak_whose_target_went_idle_says_so() {
        let growth = judged(
            &[0, 10, 10, 20, 20, 30, 30, 30],
            &[0, 100, 100, 200, 200, 300, 300, 300],
            &[0.0, 0.5, 0.5, 1.0, 1.0, 1.5, 1.5, 1.5],
        );
        assert_eq!(verdict_words(&growth), "leak, high confidence");
        assert_eq!(
            evidence_line(&growth, Units::of(Kind::Heap)),
            "rose in 3 steps of ~10.0 MiB, none freed (30 of 30 blocks since attach still \
             live); grew with the target's work (300 allocation calls, 1.5 s CPU); since its \
             last rise 2.0 s ago: 0 allocation calls, 0.0 s CPU"
        );
        assert_eq!(
            evidence_line(&growth, Units::of(Kind::Resident)),
            "rose in 3 steps of ~10.0 MiB, none freed (30 of 30 pages since attach still \
             live); grew with the target's work (300 page faults, 1.5 s CPU); since its \
             last rise 2.0 s ago: 0 page faults, 0.0 s CPU"
        );
    }

    #[test]
    fn a_warm_up_says_how_much_work_it_stayed_flat_for() {
        let growth = judged(
            &[0, 10, 20, 30, 30, 30, 30, 30, 30],
            &[0, 100, 200, 300, 500, 700, 900, 1100, 1300],
            &[0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0],
        );
        assert_eq!(verdict_words(&growth), "not a leak, high confidence");
        assert_eq!(
            work_words(&growth, Units::of(Kind::Heap)),
            "flat for 5.0 s of work after it grew (1000 allocation calls against 300 while \
             growing)"
        );
    }

    #[test]
    fn too_early_says_what_would_decide() {
        let growth = judged(&[0, 0, 10, 10, 10, 10], &[0, 0, 10, 10, 10, 10], &[0.0; 6]);
        assert_eq!(verdict_words(&growth), "too early to tell, low confidence");
        assert_eq!(
            work_words(&growth, Units::of(Kind::Heap)),
            "2 more rises would decide (since its last, 3.0 s: 0 allocation calls, 0.0 s CPU)"
        );
    }
}
