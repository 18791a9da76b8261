//! The report as text for a terminal, read by an engineer in the middle of an
//! incident: warnings first, then what was traced and for how long, then the
//! stacks holding the most memory, each with the code that allocated it,
//! innermost frame first. Lines stay readable at 100 columns.

use super::{Entry, GroupBy, Report, StackReport, human_bytes};
use crate::model::Kind;

mod cost;
mod evidence;
mod frames;
mod header;

pub use header::describe_limit;
mod holders;

pub use cost::{cost_advice, cost_line, cost_rate_line};

/// Renders the whole report, one `\n`-terminated line after another.
pub fn render(report: &Report) -> String {
    let mut lines = header::lines(report);
    let (entries, leaks) = report.entries();
    let what = match report.layout.group_by {
        GroupBy::Site => "sites",
        GroupBy::Stack => "stacks",
    };
    lines.extend(holders::scan_lines(report));
    lines.push(String::new());
    if report.snapshots > 0 && report.snapshots < crate::model::leak::MIN_SNAPSHOTS {
        lines.push(format!(
            "suspected leaks: the window holds {} snapshots, too few to judge growth (need {})",
            report.snapshots,
            crate::model::leak::MIN_SNAPSHOTS
        ));
    } else if leaks.is_empty() {
        lines.push(format!(
            "suspected leaks: none (no {} grew with the target's work and kept it{}){}",
            &what[..what.len() - 1],
            as_of(report).unwrap_or_default(),
            too_early_words(&entries)
        ));
    } else {
        lines.push(format!(
            "suspected leaks ({}): {what} that grew with the target's work and kept it{}, \
             fastest first:",
            leaks.len(),
            as_of(report).unwrap_or_default()
        ));
        for leak in leaks {
            lines.push(String::new());
            render_leak(report, leak, &mut lines);
        }
    }
    lines.push(String::new());
    if entries.is_empty() {
        lines.push("no live allocations seen in the window".to_owned());
    } else {
        let stacks: usize = entries.iter().map(|entry| entry.stack_count).sum();
        let heading = if stacks > entries.len() {
            format!(
                "top {} sites by live bytes{}, {stacks} stacks in all (--group-by stack: \
                 one entry each):",
                entries.len(),
                as_of(report).unwrap_or_default()
            )
        } else {
            format!(
                "top {} stacks by live bytes{}:",
                entries.len(),
                as_of(report).unwrap_or_default()
            )
        };
        lines.push(heading);
        for entry in entries {
            lines.push(String::new());
            render_stack(report, entry, &mut lines);
        }
    }
    let mut text = lines.join("\n");
    text.push('\n');
    // As a terminal shows it: control characters in names from the target
    // escaped.
    super::terminal::lines(&text)
}

/// `; too early to tell for 2 (#1, #4 below)`, when ranked entries are.
fn too_early_words(entries: &[Entry<'_>]) -> String {
    let ranks: Vec<String> = entries
        .iter()
        .filter(|entry| entry.stack.verdict == crate::model::leak::Verdict::TooEarly)
        .map(|entry| format!("#{}", entry.stack.rank))
        .collect();
    if ranks.is_empty() {
        return String::new();
    }
    format!(
        "; too early to tell for {} ({} below)",
        ranks.len(),
        ranks.join(", ")
    )
}

/// ` as of 117.0 s` when the report is judged at another moment than the
/// end.
fn as_of(report: &Report) -> Option<String> {
    let judged = report.judged_at.as_ref()?;
    Some(format!(" as of {:.1} s", judged.at_s))
}

/// `live 358.2 MiB in 248 allocs`, with the end state beside it when the
/// report is judged at another moment.
fn live_words(report: &Report, stack: &StackReport) -> String {
    let live = if stack.kind == Kind::Resident {
        format!(
            "live {} in {} pages",
            human_bytes(stack.live_bytes as f64),
            stack.live_allocs
        )
    } else {
        format!(
            "live {} in {} allocs",
            human_bytes(stack.live_bytes as f64),
            stack.live_allocs
        )
    };
    match &report.judged_at {
        Some(judged) => format!(
            "live {} at {:.1} s, {} at end",
            human_bytes(stack.ranked_live_bytes as f64),
            judged.at_s,
            human_bytes(stack.live_bytes as f64)
        ),
        None => live,
    }
}

/// `  (8 stacks)` after the label of a site's entry.
fn stack_count_words(entry: Entry<'_>) -> String {
    if entry.stack_count > 1 {
        format!("  ({} stacks)", entry.stack_count)
    } else {
        String::new()
    }
}

fn render_leak(report: &Report, entry: Entry<'_>, lines: &mut Vec<String>) {
    let stack = entry.stack;
    let growth = &stack.growth;
    lines.push(format!(
        "L{}  {}{}",
        stack.rank,
        site_label(stack),
        stack_count_words(entry)
    ));
    lines.push(format!(
        "    {}  pid {}  growth +{}/s  {}",
        kind_and_api(stack),
        stack.pid,
        human_bytes(growth.rate_bytes_per_s),
        live_words(report, stack),
    ));
    evidence::verdict_lines(stack, true, lines);
    holders::stack_lines(stack, lines);
    match stack.growth.leaking_part {
        Some(part) if part.stacks > 1 => lines.push(format!(
            "    the largest of its {} leaking stacks, from:",
            part.stacks
        )),
        Some(_) => lines.push("    its leaking stack, from:".to_owned()),
        None if entry.stack_count > 1 => lines.push(format!(
            "    the largest of its {} stacks, from:",
            entry.stack_count
        )),
        None => {}
    }
    frames::render_frames(stack, report.layout.native, lines);
}

fn render_stack(report: &Report, entry: Entry<'_>, lines: &mut Vec<String>) {
    let stack = entry.stack;
    let growth_sign = if stack.growth_bytes_per_s >= 0.0 {
        "+"
    } else {
        ""
    };
    lines.push(format!(
        "#{}  {}{}",
        stack.rank,
        site_label(stack),
        stack_count_words(entry)
    ));
    lines.push(format!(
        "    {}  pid {}  {}  growth {growth_sign}{}/s{}",
        kind_and_api(stack),
        stack.pid,
        live_words(report, stack),
        human_bytes(stack.growth_bytes_per_s),
        if stack.suspected_leak {
            "  (suspected leak)"
        } else {
            ""
        },
    ));
    evidence::verdict_lines(stack, false, lines);
    holders::stack_lines(stack, lines);
    let from = match stack.growth.leaking_part {
        Some(part) if part.stacks > 1 => {
            format!("the largest of its {} leaking stacks", part.stacks)
        }
        Some(_) => "its leaking stack".to_owned(),
        None if entry.stack_count > 1 => {
            format!("the largest of its {} stacks", entry.stack_count)
        }
        None => String::new(),
    };
    let (made, calls) = if stack.kind == Kind::Resident {
        ("made resident", "faults")
    } else {
        ("allocated", "calls")
    };
    lines.push(format!(
        "    {made} {} in {} {calls} since attach, from{}{from}:",
        human_bytes(stack.alloc_bytes_total as f64),
        stack.alloc_count_total,
        if from.is_empty() { "" } else { " " }
    ));
    frames::render_frames(stack, report.layout.native, lines);
}

/// What a stack is named by (`createStringObject (object.c:94) via
/// zmalloc`), cut to fit a line; a label grown by the frame that tells it
/// apart (`labels`) keeps that frame whole and is cut before it.
fn site_label(stack: &StackReport) -> String {
    const WIDTH: usize = 90;
    let Some(site) = &stack.site else {
        return format!("stack {} (not recorded)", stack.stack_id);
    };
    if site.label.chars().count() <= WIDTH {
        return site.label.clone();
    }
    let tail = site
        .through
        .as_ref()
        .map_or_else(String::new, |through| format!(" through {through}"));
    let base = site.label.strip_suffix(&tail).unwrap_or(&site.label);
    let room = WIDTH.saturating_sub(tail.chars().count()).max(12);
    if base.chars().count() <= room {
        return format!("{base}{tail}");
    }
    let cut: String = base.chars().take(room - 1).collect();
    format!("{cut}…{tail}")
}

/// `gpu-device via cudaMalloc`, or the kind alone.
fn kind_and_api(stack: &StackReport) -> String {
    match &stack.api {
        Some(api) => format!("{} via {api}", stack.kind.as_str()),
        None => stack.kind.as_str().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::config::GroupBy;
    use crate::model::{Kind, Totals, quality::StackQuality};
    use crate::report::fixtures::{one_site_report, sample_report};

    #[test]
    fn renders_the_key_lines_in_order() {
        let text = render(&sample_report(2));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "WARNING: 3 events dropped (stack_table_full=3): numbers below are lower bounds"
        );
        assert_eq!(
            lines[1],
            "  stack_table_full: more distinct stacks than the table holds: raise --max-stacks"
        );
        assert_eq!(lines[2], "target: PID 10 (./leak --fast)");
        assert_eq!(
            lines[3],
            "target: PID 20 (python3 export.py), exited after 3.2 s"
        );
        assert_eq!(
            lines[4],
            "window: 4.0 s from attach, 4 snapshots every 1000 ms; \
             allocations made before attach are not seen"
        );
        assert_eq!(
            lines[5],
            "stacks reaching main or their thread's start: PID 10 98.5 %, PID 20 100.0 % \
             of allocated bytes"
        );
        assert_eq!(
            lines[6],
            "unwinding stopped early in 2 stacks (outside_code=2)"
        );
        assert_eq!(
            lines[7],
            "frees of blocks allocated before attach (ignored): 7"
        );
        assert!(
            lines.contains(
                &"hooked after attach: libcudart.so.12 in PID 10 at 2.50 s (mmap-event, late), 2 functions"
            ),
            "{text}"
        );
        assert!(
            lines.contains(
                &"hooked after attach: libcuda.so.1 in PID 10 at 2.50 s (at open), 1 functions"
            ),
            "{text}"
        );
        assert!(
            lines.contains(&"live heap at end: 268.0 KiB in 4288 allocs"),
            "{text}"
        );
        assert!(
            lines.contains(
                &"PID 10: RSS 1.0 MiB (anon 768.0 KiB, file 256.0 KiB), traced live 260.0 KiB, \
                  gap 764.0 KiB"
            ),
            "{text}"
        );
        assert!(text.contains("top 2 stacks by live bytes:\n"));
        assert!(
            text.contains(
                "#1  grow_1 (leak.c:12)\n    heap  pid 10  live 256.0 KiB in 4096 allocs  \
                 growth +64.0 KiB/s\n    too early to tell, low confidence: the window holds \
                 too few snapshots to tell (need 5)\n    \
                 allocated 512.0 KiB in 8192 calls since attach, from:\n      \
                 grow_1 (leak.c:12)\n      main server+0x1000\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("#2  grow_1 (leak.c:12)\n    heap  pid 20  live 8.0 KiB in 128 allocs")
        );
        assert!(!text.contains("#3"));
        assert!(
            text.lines().all(|line| line.chars().count() <= 100),
            "{text}"
        );
    }

    #[test]
    fn no_warning_and_a_plain_sentence_when_nothing_was_seen() {
        let report = Report {
            tracer_version: "0.1.0".to_owned(),
            window_s: 2.0,
            judged_at: None,
            interval_ms: 500,
            snapshots: 4,
            targets: Vec::new(),
            totals: BTreeMap::from([("heap".to_owned(), Totals::default())]),
            drops: BTreeMap::new(),
            events: BTreeMap::new(),
            probes: Vec::new(),
            sampling: crate::model::run::SamplingReport::exact(),
            cost: None,
            unwinding: None,
            loader_pauses: Default::default(),
            libraries: Vec::new(),
            unwinding_stopped: BTreeMap::new(),
            refused_files: BTreeMap::new(),
            stacks: Vec::new(),
            unlisted: Vec::new(),
            suspected_leaks: Vec::new(),
            groups: Vec::new(),
            suspected_leak_groups: Vec::new(),
            layout: Default::default(),
            holders_scans: Vec::new(),
        };
        let text = render(&report);
        assert!(text.starts_with("window: 2.0 s from attach, 4 snapshots every 500 ms;"));
        assert!(!text.contains("WARNING"));
        assert!(text.contains("frees of blocks allocated before attach (ignored): 0\n"));
        assert!(text.contains("live heap at end: 0 B in 0 allocs\n"));
        assert!(text.contains("\nsuspected leaks: the window holds 4 snapshots, too few"));
        assert!(text.ends_with("\nno live allocations seen in the window\n"));
    }

    #[test]
    fn warns_when_stacks_are_cut_short() {
        let mut report = sample_report(2);
        assert!(
            !render(&report).contains("have stacks reaching"),
            "no warning at 98.5 %"
        );
        report.targets[1].stack_quality = Some(StackQuality {
            recorded_bytes: 1000,
            reaching_entry_bytes: 450,
            share_reaching_entry: 0.45,
        });
        let text = render(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[2],
            "WARNING: PID 20: only 45 % of allocated bytes have stacks reaching main or \
             their thread's start:"
        );
        assert!(lines[3].contains("try --unwind dwarf"), "{text}");
    }

    #[test]
    fn gpu_stacks_name_their_api() {
        let mut report = sample_report(1);
        report.layout.group_by = GroupBy::Stack;
        report.stacks[0].kind = Kind::GpuDevice;
        report.stacks[0].api = Some("cudaMalloc".to_owned());
        let text = render(&report);
        assert!(text.contains("\n    gpu-device via cudaMalloc  pid 10  live 256.0 KiB"));
    }

    #[test]
    fn negative_growth_keeps_its_sign_and_empty_stacks_say_so() {
        let mut report = sample_report(1);
        report.layout.group_by = GroupBy::Stack;
        report.stacks[0].growth_bytes_per_s = -2048.0;
        report.stacks[0].frames.clear();
        let text = render(&report);
        assert!(text.contains("growth -2.0 KiB/s"));
        assert!(text.contains("\n      (stack not recorded)\n"));
    }

    #[test]
    fn entries_follow_group_by() {
        let mut report = one_site_report();
        let (entries, _) = report.entries();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].stack_count, 2);
        report.layout.group_by = GroupBy::Stack;
        let (entries, _) = report.entries();
        assert_eq!(entries.len(), 3);
        assert!(entries.iter().all(|entry| entry.stack_count == 1));
        // One stack per entry: the two of one site are told apart by the
        // caller where their paths part.
        let text = render(&report);
        let headings: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with('#') && line.contains("fill (leak.c:12)"))
            .collect();
        assert_eq!(
            headings,
            [
                "#1  fill (leak.c:12) through caller_1",
                "#3  fill (leak.c:12) through caller_2"
            ],
            "{text}"
        );
        let through = report.stacks[0].site.as_ref().unwrap().through.as_deref();
        assert_eq!(through, Some("caller_1"));
        let grouped = render(&one_site_report());
        assert!(
            !grouped.contains(" through "),
            "one entry per site: {grouped}"
        );
    }

    #[test]
    fn the_text_report_lists_a_site_once_with_its_count() {
        let text = render(&one_site_report());
        assert!(
            text.contains("\n#1  fill (leak.c:12)  (2 stacks)\n    heap  pid 10  live 260.0 KiB"),
            "{text}"
        );
        assert!(
            text.contains("top 2 sites by live bytes, 3 stacks in all"),
            "{text}"
        );
    }
}
