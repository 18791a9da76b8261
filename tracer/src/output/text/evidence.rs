//! The lines that say why: the moment the stacks are judged at, when it
//! is not the end (a target that exited or tore down is judged at its
//! peak), and the one line of evidence under each suspected leak.

use crate::model::{
    peak::{JudgedWhy, Judgement},
    verdict::LeakShape,
};
use crate::output::{Report, StackReport, human_bytes};

/// The first lines of a report judged at another moment than the end:
/// `PID 42 exited after 124.8 s; ranked at its peak, 746.0 MiB live at
/// 117.0 s (8.0 MiB at the end)`.
pub fn judged_at_lines(report: &Report) -> Vec<String> {
    let Some(judged) = &report.judged_at else {
        return Vec::new();
    };
    let moment = format!(
        "{} live at {:.1} s ({} at the end, shown as \"at end\" below)",
        human_bytes(judged.live_bytes as f64),
        judged.at_s,
        human_bytes(judged.end_live_bytes as f64)
    );
    let why = match judged.why {
        JudgedWhy::Exited => {
            let exited: Vec<String> = report
                .targets
                .iter()
                .filter_map(|target| {
                    let after_s = target.target.exited_after_s?;
                    Some(format!(
                        "PID {} exited after {after_s:.1} s",
                        target.target.pid
                    ))
                })
                .collect();
            format!("{}; ranked at its peak", exited.join(", "))
        }
        JudgedWhy::TornDown => format!(
            "{} freed {:.0} % of its traced memory in its last {:.1} s; ranked at its peak",
            pids(report),
            freed_share(judged) * 100.0,
            report.window_s - judged.at_s
        ),
        JudgedWhy::Asked => "ranked and judged at the moment asked (--at)".to_owned(),
    };
    vec![format!("{why}, {moment}")]
}

fn freed_share(judged: &Judgement) -> f64 {
    if judged.live_bytes <= 0 {
        return 0.0;
    }
    1.0 - judged.end_live_bytes as f64 / judged.live_bytes as f64
}

fn pids(report: &Report) -> String {
    let pids: Vec<String> = report
        .targets
        .iter()
        .map(|target| target.target.pid.to_string())
        .collect();
    format!("PID {}", pids.join(", "))
}

/// Why a suspected leak is suspected, in one line: `rose in 4 steps of
/// ~90.0 MiB, none freed (248 of 248 blocks since attach still live)`,
/// or the steady fit.
pub fn evidence_line(stack: &StackReport) -> String {
    let growth = &stack.growth;
    match (growth.shape, growth.steps) {
        (Some(LeakShape::Steps), Some(steps)) => format!(
            "rose in {} steps of ~{}, {} ({} of {} blocks since attach still live)",
            steps.count,
            human_bytes(steps.typical_step_bytes as f64),
            if steps.none_freed {
                "none freed"
            } else {
                "never fell back below a step"
            },
            steps.live_allocs,
            steps.alloc_count_total
        ),
        _ => format!(
            "steady: R² {:.2}, {:.0}% of intervals did not shrink, {:.0}% grew; \
             first {} -> last {}",
            growth.r_squared,
            growth.non_shrinking_fraction * 100.0,
            growth.growing_fraction * 100.0,
            human_bytes(growth.first_live_bytes as f64),
            human_bytes(growth.last_live_bytes as f64),
        ),
    }
}
