//! What tracer costs its targets, in words: the status line's clause, the
//! report's lines, and what to do when it is over 20 %.

use crate::model::{
    cost::{Cost, HIGH_SHARE, MEASURABLE_NS},
    run::SamplingReport,
};

/// `tracer costs PID 4242 about 38 % (1.9 M probe hits, 4.1 µs each)`.
pub fn cost_line(cost: &Cost) -> String {
    cost_phrase(cost, false)
}

/// [`cost_line`] with the hits per second, for a status line.
pub fn cost_rate_line(cost: &Cost) -> String {
    cost_phrase(cost, true)
}

fn cost_phrase(cost: &Cost, per_second: bool) -> String {
    let hits = if per_second && cost.window_s > 0.0 {
        format!(
            "{} probe hits/s",
            human_count(cost.probe_hits as f64 / cost.window_s)
        )
    } else {
        format!("{} probe hits", human_count(cost.probe_hits as f64))
    };
    let each = format!("{hits}, {:.1} µs each", cost.ns_per_hit / 1e3);
    let targets = targets(&cost.pids);
    let lower = if cost.lower_bound.is_some() {
        "at least "
    } else {
        "about "
    };
    match cost.share {
        Some(share) => format!("tracer costs {targets} {lower}{} ({each})", percent(share)),
        None if cost.added_ns < MEASURABLE_NS => format!(
            "tracer costs {targets} {:.0} ms of CPU in {:.1} s, of {:.0} ms used: too little \
             to give a share ({each})",
            cost.added_ns as f64 / 1e6,
            cost.window_s,
            cost.target_cpu_ns as f64 / 1e6
        ),
        None => format!(
            "tracer costs {targets} about all the CPU it used: {:.0} ms estimated of {:.0} ms \
             in {:.1} s ({each})",
            cost.added_ns as f64 / 1e6,
            cost.target_cpu_ns as f64 / 1e6,
            cost.window_s
        ),
    }
}

/// What to do when the cost is over [`HIGH_SHARE`], naming
/// `--sample-bytes`; None below.
pub fn cost_advice(cost: &Cost, sampling: &SamplingReport) -> Option<String> {
    if !cost.is_high() {
        return None;
    }
    let over = format!("over {:.0} % of the targets' CPU", HIGH_SHARE * 100.0);
    Some(match sampling.sample_bytes {
        None => format!(
            "{over}: --sample-bytes 524288 records a sample of the allocations for less \
             (a call not sampled skips the stack walk)"
        ),
        Some(sample_bytes) => format!(
            "{over} even sampled (--sample-bytes {sample_bytes}): what is left is mostly the \
             trap every allocator call pays at its entry"
        ),
    })
}

/// The report's second cost line: where the time went.
pub fn cost_detail(cost: &Cost) -> String {
    let traps = match &cost.trap_ns_measured {
        Some(traps) => format!(
            "traps {:.0} ms (measured at start: {:.2} µs an entry, {:.2} µs a return, {:.1} µs \
             single-stepped)",
            cost.trap_ns as f64 / 1e6,
            traps.entry_ns / 1e3,
            traps.return_ns / 1e3,
            traps.single_stepped_ns / 1e3
        ),
        None => "traps not measured".to_owned(),
    };
    let programs = match cost.program_ns {
        Some(program_ns) => format!("programs {:.0} ms", program_ns as f64 / 1e6),
        None => "programs' time unknown".to_owned(),
    };
    let mut line = format!(
        "  {traps}, {programs}, of {:.0} ms of the targets' CPU in {:.1} s",
        cost.target_cpu_ns as f64 / 1e6,
        cost.window_s
    );
    if let Some(why) = &cost.lower_bound {
        line.push_str(&format!("; a lower bound: {why}"));
    }
    line
}

/// The targets a cost is for.
fn targets(pids: &[u32]) -> String {
    match pids {
        [] => "the targets".to_owned(),
        [pid] => format!("PID {pid}"),
        pids => format!(
            "PIDs {} together",
            pids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// 0.384 -> "38 %", 0.004 -> "0.4 %".
fn percent(share: f64) -> String {
    let percent = share * 100.0;
    if percent < 10.0 {
        format!("{percent:.1} %")
    } else {
        format!("{percent:.0} %")
    }
}

/// 1 900 000 -> "1.9 M", 12 345 -> "12.3 k", 999 -> "999".
fn human_count(count: f64) -> String {
    match count {
        count if count < 1e3 => format!("{count:.0}"),
        count if count < 1e6 => format!("{:.1} k", count / 1e3),
        count if count < 1e9 => format!("{:.1} M", count / 1e6),
        count => format!("{:.1} G", count / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(share: Option<f64>, pids: Vec<u32>) -> Cost {
        Cost {
            pids,
            window_s: 5.0,
            share,
            probe_hits: 9_500_000,
            ns_per_hit: 4100.0,
            program_ns: Some(1),
            trap_ns: 1,
            added_ns: 2_000_000,
            target_cpu_ns: 3_000_000,
            trap_ns_measured: None,
            accounting: String::new(),
            tracepoint_ns: None,
            lower_bound: None,
        }
    }

    #[test]
    fn the_line_names_the_target_share_hits_and_cost_per_hit() {
        let cost = cost(Some(0.384), vec![4242]);
        assert_eq!(
            cost_line(&cost),
            "tracer costs PID 4242 about 38 % (9.5 M probe hits, 4.1 µs each)"
        );
        assert_eq!(
            cost_rate_line(&cost),
            "tracer costs PID 4242 about 38 % (1.9 M probe hits/s, 4.1 µs each)"
        );
    }

    #[test]
    fn several_targets_a_lower_bound_and_no_share() {
        let mut several = cost(Some(0.004), vec![1, 2]);
        several.lower_bound = Some("why".to_owned());
        assert_eq!(
            cost_line(&several),
            "tracer costs PIDs 1, 2 together at least 0.4 % (9.5 M probe hits, 4.1 µs each)"
        );
        let mut saturated = cost(None, vec![7]);
        saturated.added_ns = 300_000_000;
        saturated.target_cpu_ns = 330_000_000;
        assert_eq!(
            cost_line(&saturated),
            "tracer costs PID 7 about all the CPU it used: 300 ms estimated of 330 ms in 5.0 s \
             (9.5 M probe hits, 4.1 µs each)"
        );
        let idle = cost(None, vec![]);
        assert_eq!(
            cost_line(&idle),
            "tracer costs the targets 2 ms of CPU in 5.0 s, of 3 ms used: too little to give a \
             share (9.5 M probe hits, 4.1 µs each)"
        );
    }

    #[test]
    fn the_warning_over_a_fifth_names_sample_bytes() {
        let exact = SamplingReport::exact();
        assert_eq!(cost_advice(&cost(Some(0.19), vec![7]), &exact), None);
        let warning = cost_advice(&cost(Some(0.21), vec![7]), &exact).expect("over 20 %");
        assert!(warning.contains("--sample-bytes 524288"), "{warning}");
        let sampled = SamplingReport {
            sample_bytes: Some(65536),
            ..SamplingReport::exact()
        };
        let warning = cost_advice(&cost(Some(0.5), vec![7]), &sampled).expect("over 20 %");
        assert!(warning.contains("--sample-bytes 65536"), "{warning}");
    }
}
