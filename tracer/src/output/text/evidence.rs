//! The lines that say why: the moment the stacks are judged at, when it
//! is not the end (a target that exited or tore down is judged at its
//! peak), and the verdict's lines under each entry (`output::evidence`).

use crate::model::{
    leak::Verdict,
    peak::{JudgedWhy, Judgement},
};
use crate::output::{
    Report, StackReport,
    evidence::{Units, growth_words, verdict_words, work_words},
    human_bytes,
};

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

/// The verdict's lines: what the stack kept (`rose in 4 steps of ~90.0
/// MiB, none freed (248 of 248 blocks since attach still live)`), then
/// the verdict, its confidence and why (`leak, high confidence: grew with
/// the target's work ...`). `with_growth` false gives the second only.
pub fn verdict_lines(stack: &StackReport, with_growth: bool, lines: &mut Vec<String>) {
    let growth = &stack.growth;
    if growth.verdict == Verdict::Empty {
        return;
    }
    let units = Units::of(stack.kind);
    if with_growth {
        wrap(&growth_words(growth, units), lines);
    }
    wrap(
        &format!("{}: {}", verdict_words(growth), work_words(growth, units)),
        lines,
    );
}

/// Lines stay readable at 100 columns: `text` indented by 4, wrapped at
/// spaces onto lines indented by 4 too (frames are indented by 6).
fn wrap(text: &str, lines: &mut Vec<String>) {
    const WIDTH: usize = 100;
    let mut line = "   ".to_owned();
    for word in text.split(' ') {
        if line.chars().count() + 1 + word.chars().count() > WIDTH && line.trim_start() != "" {
            lines.push(std::mem::replace(&mut line, "   ".to_owned()));
        }
        line.push(' ');
        line.push_str(word);
    }
    lines.push(line);
}
