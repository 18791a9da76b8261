//! The report as text for a terminal, read by an engineer in the middle of an
//! incident: warnings first, then what was traced and for how long, then the
//! stacks holding the most memory, each with the code that allocated it,
//! innermost frame first. Lines stay readable at 100 columns.

use std::{collections::BTreeMap, path::Path};

use tracer_ebpf::{GPU_API_NAMES, STAT_NAMES, stat};

use super::{MemoryReconciliation, Report, StackReport, human_bytes};
use crate::model::{Frame, Kind, quality::StackQuality, run::NoticedBy};

mod evidence;
mod holders;

/// Renders the whole report, one `\n`-terminated line after another.
pub fn render(report: &Report) -> String {
    let mut lines = Vec::new();
    if !report.drops.is_empty() {
        lines.extend(report.drop_warning());
        for name in report.drops.keys() {
            if let Some(hint) = drop_hint(name) {
                lines.push(format!("  {name}: {hint}"));
            }
        }
    }
    lines.extend(evidence::judged_at_lines(report));
    for target in &report.targets {
        if let Some(quality) = target.stack_quality.filter(StackQuality::is_poor) {
            lines.push(format!(
                "WARNING: PID {}: only {:.0} % of allocated bytes have stacks reaching main or \
                 their thread's start:",
                target.target.pid,
                quality.share_reaching_entry * 100.0
            ));
            lines.push(
                "  stacks are cut short and a leak may be split over several \
                 (try --unwind dwarf, or --stack-bytes)"
                    .to_owned(),
            );
        }
    }
    for target_report in &report.targets {
        let target = &target_report.target;
        let mut line = format!("target: PID {} ({})", target.pid, target.command);
        if let Some(exited_after_s) = target.exited_after_s {
            line.push_str(&format!(", exited after {exited_after_s:.1} s"));
        }
        for exec_after_s in &target.execs_after_s {
            line.push_str(&format!(
                ", replaced its image (exec) at {exec_after_s:.1} s (what it held before is gone)"
            ));
        }
        for destroyed in &target_report.gpu_contexts_destroyed {
            let released: Vec<String> = destroyed
                .released
                .iter()
                .map(|(kind, totals)| {
                    format!(
                        "{kind} {} in {} allocs",
                        human_bytes(totals.live_bytes as f64),
                        totals.live_allocs
                    )
                })
                .collect();
            line.push_str(&format!(
                ", destroyed or reset a CUDA context at {:.1} s (released {})",
                destroyed.after_s,
                if released.is_empty() {
                    "no traced GPU memory".to_owned()
                } else {
                    released.join(", ")
                }
            ));
        }
        if let Some(followed_after_s) = target.followed_after_s {
            line.push_str(&format!(
                ", a child followed from {followed_after_s:.1} s (earlier allocations not seen)"
            ));
        }
        lines.push(line);
    }
    lines.push(format!(
        "window: {:.1} s from attach, {} snapshots every {} ms; \
         allocations made before attach are not seen",
        report.window_s, report.snapshots, report.interval_ms
    ));
    if let Some(sample_bytes) = report.sampling.sample_bytes {
        lines.push(format!(
            "sampled: one point per {} allocated (--sample-bytes); live bytes are unbiased \
             estimates, live allocs count sampled blocks",
            human_bytes(sample_bytes as f64)
        ));
    }
    if let Some(unwinding) = &report.unwinding
        && !unwinding.dwarf.is_empty()
    {
        let pids: Vec<String> = unwinding
            .dwarf
            .iter()
            .map(|process| process.pid.to_string())
            .collect();
        let how = if unwinding.mode == crate::model::run::UnwindMode::Copy {
            format!(
                "from {} copied at each allocation",
                human_bytes(unwinding.stack_bytes as f64)
            )
        } else {
            "in the kernel, through unwind tables (stack copies for Go programs that call C)"
                .to_owned()
        };
        lines.push(format!(
            "stacks unwound with DWARF {how} (--unwind {}): PID {}",
            unwinding.mode,
            pids.join(", ")
        ));
    }
    let qualities: Vec<String> = report
        .targets
        .iter()
        .filter_map(|target| {
            let quality = target.stack_quality?;
            Some(format!(
                "PID {} {:.1} %",
                target.target.pid,
                quality.share_reaching_entry * 100.0
            ))
        })
        .collect();
    if !qualities.is_empty() {
        lines.push(format!(
            "stacks reaching main or their thread's start: {} of allocated bytes",
            qualities.join(", ")
        ));
    }
    if !report.unwinding_stopped.is_empty() {
        let reasons: Vec<String> = report
            .unwinding_stopped
            .iter()
            .map(|(reason, count)| format!("{reason}={count}"))
            .collect();
        lines.push(format!(
            "unwinding stopped early in {} stacks ({})",
            report.unwinding_stopped.values().sum::<u64>(),
            reasons.join(", ")
        ));
    }
    let frees_unknown_name = STAT_NAMES[stat::FREES_UNKNOWN as usize].0;
    let frees_unknown = report.events.get(frees_unknown_name).copied().unwrap_or(0);
    lines.push(format!(
        "frees of blocks allocated before attach (ignored): {frees_unknown}"
    ));
    let stepped: Vec<&str> = report
        .probes
        .iter()
        // CUDA calls are rare and slow themselves: a trap does not matter.
        .filter(|probe| probe.single_stepped && !GPU_API_NAMES.contains(&probe.symbol.as_str()))
        .map(|probe| probe.symbol.as_str())
        .collect();
    if !stepped.is_empty() {
        lines.push(format!(
            "note: probes on {} are single-stepped by the kernel (~16 µs per call on a VM)",
            stepped.join(", ")
        ));
    }
    let file_name_of = |path: &str| {
        Path::new(path)
            .file_name()
            .map_or_else(|| path.to_owned(), |n| n.to_string_lossy().into_owned())
    };
    let mut ahead: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for entry in report
        .libraries
        .iter()
        .filter(|entry| entry.library.noticed_by == NoticedBy::Ahead)
    {
        ahead
            .entry(entry.library.pid)
            .or_default()
            .push(file_name_of(&entry.library.path));
    }
    for (pid, file_names) in ahead {
        // Files it could load: probes in place before any mapping of them.
        lines.push(format!(
            "hooked ahead of their mapping in PID {pid}: {}",
            file_names.join(", ")
        ));
    }
    for entry in report.libraries.iter().filter(|entry| {
        entry.library.noticed_by != NoticedBy::Attach
            && entry.library.noticed_by != NoticedBy::Ahead
    }) {
        let library = &entry.library;
        let how = match library.noticed_by {
            NoticedBy::AtOpen => "at open".to_owned(),
            NoticedBy::LoaderStop => "loader-stop, before its constructors".to_owned(),
            noticed_by => format!("{noticed_by}, {}", entry.hooked),
        };
        lines.push(format!(
            "hooked after attach: {} in PID {} at {:.2} s ({how}), {} functions",
            file_name_of(&library.path),
            library.pid,
            library.hooked_after_s,
            library.functions.len()
        ));
    }
    let pauses = &report.loader_pauses;
    if pauses.times > 0 {
        lines.push(format!(
            "held at the loader gate until the libraries a dlopen() opened were hooked: \
             paused {} times, {:.1} ms in all (--no-loader-pause: never)",
            pauses.times, pauses.held_ms
        ));
    }
    for (kind, totals) in &report.totals {
        if kind == Kind::MmapReserved.as_str() {
            lines.push(format!(
                "reserved address space at end (PROT_NONE, thread stacks; not ranked): \
                 {} in {} ranges",
                human_bytes(totals.live_bytes as f64),
                totals.live_allocs
            ));
        } else {
            lines.push(format!(
                "live {kind} at end: {} in {} allocs",
                human_bytes(totals.live_bytes as f64),
                totals.live_allocs
            ));
        }
    }
    for target in &report.targets {
        if let Some(memory) = &target.memory {
            lines.push(describe_memory(target.target.pid, memory));
        }
    }
    lines.extend(holders::scan_lines(report));
    lines.push(String::new());
    if report.snapshots > 0 && report.snapshots < crate::model::leak::MIN_SNAPSHOTS {
        lines.push(format!(
            "suspected leaks: the window holds {} snapshots, too few to judge growth (need {})",
            report.snapshots,
            crate::model::leak::MIN_SNAPSHOTS
        ));
    } else if report.suspected_leaks.is_empty() {
        lines.push(format!(
            "suspected leaks: none (no stack grew steadily{}, or in several steps it kept)",
            as_of(report).unwrap_or_else(|| " until the end".to_owned())
        ));
    } else {
        lines.push(format!(
            "suspected leaks ({}): stacks that grew steadily or in steps{}, fastest first:",
            report.suspected_leaks.len(),
            as_of(report).unwrap_or_default()
        ));
        for stack in &report.suspected_leaks {
            lines.push(String::new());
            render_leak(report, stack, &mut lines);
        }
    }
    lines.push(String::new());
    if report.stacks.is_empty() {
        lines.push("no live allocations seen in the window".to_owned());
    } else {
        lines.push(format!(
            "top {} stacks by live bytes{}:",
            report.stacks.len(),
            as_of(report).unwrap_or_default()
        ));
        for stack in &report.stacks {
            lines.push(String::new());
            render_stack(report, stack, &mut lines);
        }
    }
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

/// One target's traced memory next to its RSS.
fn describe_memory(pid: u32, memory: &MemoryReconciliation) -> String {
    let parts = match (
        memory.rss_anon_bytes,
        memory.rss_file_bytes,
        memory.rss_shmem_bytes,
    ) {
        // Shared memory (PostgreSQL's shared buffers) is often most of a
        // gap: named whenever there is some.
        (Some(anon), Some(file), Some(shmem)) if shmem > 0 => format!(
            " (anon {}, file {}, shmem {})",
            human_bytes(anon as f64),
            human_bytes(file as f64),
            human_bytes(shmem as f64)
        ),
        (Some(anon), Some(file), _) => format!(
            " (anon {}, file {})",
            human_bytes(anon as f64),
            human_bytes(file as f64)
        ),
        _ => String::new(),
    };
    format!(
        "PID {pid}: RSS {}{parts}, traced live {}, gap {}",
        human_bytes(memory.rss_bytes as f64),
        human_bytes(memory.traced_bytes as f64),
        human_bytes(memory.gap_bytes as f64),
    )
}

/// What to do about a kind of drop.
fn drop_hint(name: &str) -> Option<&'static str> {
    Some(match name {
        "live_map_full" => "more blocks were live than the table holds: raise --max-live",
        "stack_table_full" | "by_stack_map_full" => {
            "more distinct stacks than the table holds: raise --max-stacks"
        }
        "stack_error" => "the kernel could not walk some stacks (their blocks count as NO_STACK)",
        "pending_map_full" => "more threads were inside an allocator at once than tracked (16384)",
        "mapping_events_lost" => {
            "mapping calls came faster than tracer drained them: raise --ring-buffer-kib"
        }
        "mapping_pending_full" => "more threads were inside a mapping call at once than tracked",
        "out_param_unreadable" => "posix_memalign results that could not be read",
        "stack_copy_ring_full" => {
            "stack copies came faster than tracer unwound them: raise --stack-ring-mib"
        }
        "stack_free_lost" => "frees found both the copy ring and its overflow table full",
        _ => return None,
    })
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
    let live = format!(
        "live {} in {} allocs",
        human_bytes(stack.live_bytes as f64),
        stack.live_allocs
    );
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

fn render_leak(report: &Report, stack: &StackReport, lines: &mut Vec<String>) {
    let growth = &stack.growth;
    lines.push(format!("L{}  {}", stack.rank, site_label(stack)));
    lines.push(format!(
        "    {}  pid {}  growth +{}/s  {}",
        kind_and_api(stack),
        stack.pid,
        human_bytes(growth.rate_bytes_per_s),
        live_words(report, stack),
    ));
    lines.push(format!("    {}", evidence::evidence_line(stack)));
    holders::stack_lines(stack, lines);
    render_frames(stack, lines);
}

fn render_stack(report: &Report, stack: &StackReport, lines: &mut Vec<String>) {
    let growth_sign = if stack.growth_bytes_per_s >= 0.0 {
        "+"
    } else {
        ""
    };
    lines.push(format!("#{}  {}", stack.rank, site_label(stack)));
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
    holders::stack_lines(stack, lines);
    lines.push(format!(
        "    allocated {} in {} calls since attach, from:",
        human_bytes(stack.alloc_bytes_total as f64),
        stack.alloc_count_total
    ));
    render_frames(stack, lines);
}

/// What a stack is named by (`createStringObject (object.c:94) via
/// zmalloc`), cut to fit a line.
fn site_label(stack: &StackReport) -> String {
    const WIDTH: usize = 90;
    let label = match &stack.site {
        Some(site) => site.label.clone(),
        None => format!("stack {} (not recorded)", stack.stack_id),
    };
    if label.chars().count() <= WIDTH {
        return label;
    }
    let mut cut: String = label.chars().take(WIDTH - 1).collect();
    cut.push('…');
    cut
}

/// `gpu-device via cudaMalloc`, or the kind alone.
fn kind_and_api(stack: &StackReport) -> String {
    match &stack.api {
        Some(api) => format!("{} via {api}", stack.kind.as_str()),
        None => stack.kind.as_str().to_owned(),
    }
}

fn render_frames(stack: &StackReport, lines: &mut Vec<String>) {
    if stack.frames.is_empty() {
        lines.push("      (stack not recorded)".to_owned());
    }
    for frame in &stack.frames {
        lines.push(format!("      {}", describe_frame(frame)));
    }
}

/// `function (file:line)` when the source is known, otherwise the function
/// and where it is in its object (`libfoo.so+0x1a2b`, see
/// `frames::module_offset`).
fn describe_frame(frame: &Frame) -> String {
    let location = match (&frame.file, frame.line) {
        (Some(file), Some(line)) => format!("({file}:{line})"),
        (Some(file), None) => format!("({file})"),
        (None, _) => super::frames::module_offset(frame),
    };
    match &frame.function {
        // A marker frame (the stack ends here) has no address.
        Some(function) if frame.address == 0 && frame.module.is_none() && frame.file.is_none() => {
            function.clone()
        }
        Some(function) => format!("{function} {location}"),
        None => location,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Totals;
    use crate::output::fixtures::sample_report;

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
        assert!(text.contains(
            "#1  grow_1 (leak.c:12)\n    heap  pid 10  live 256.0 KiB in 4096 allocs  growth +64.0 KiB/s\n    \
             allocated 512.0 KiB in 8192 calls since attach, from:\n      \
             grow_1 (leak.c:12)\n      main server+0x1000\n"
        ));
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
            unwinding: None,
            loader_pauses: Default::default(),
            libraries: Vec::new(),
            unwinding_stopped: BTreeMap::new(),
            stacks: Vec::new(),
            unlisted: Vec::new(),
            suspected_leaks: Vec::new(),
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
    fn describes_frames_with_what_is_known() {
        let with = |function: Option<&str>, file: Option<&str>, line, module: Option<&str>| Frame {
            address: 0x7f00_1234,
            function: function.map(str::to_owned),
            file: file.map(str::to_owned),
            line,
            module: module.map(str::to_owned),
            offset: module.map(|_| 0x1234),
            ..Frame::default()
        };
        let module = Some("/usr/lib/libfoo.so.1");
        assert_eq!(
            describe_frame(&with(Some("f"), Some("src/f.c"), Some(3), module)),
            "f (src/f.c:3)"
        );
        assert_eq!(
            describe_frame(&with(Some("f"), Some("src/f.c"), None, None)),
            "f (src/f.c)"
        );
        assert_eq!(
            describe_frame(&with(Some("f"), None, None, module)),
            "f libfoo.so.1+0x1234"
        );
        assert_eq!(
            describe_frame(&with(None, None, None, module)),
            "libfoo.so.1+0x1234"
        );
        assert_eq!(describe_frame(&with(None, None, None, None)), "0x7f001234");
        let marker = Frame {
            function: Some("[unwinding stopped: outside code]".to_owned()),
            ..Frame::default()
        };
        assert_eq!(describe_frame(&marker), "[unwinding stopped: outside code]");
    }

    #[test]
    fn rss_breakdown_names_shared_memory_when_there_is_some() {
        let memory = |shmem| MemoryReconciliation {
            rss_bytes: 3 << 20,
            rss_anon_bytes: Some(1 << 20),
            rss_file_bytes: Some(1 << 20),
            rss_shmem_bytes: Some(shmem),
            traced_bytes: 512 << 10,
            gap_bytes: (3 << 20) - (512 << 10),
        };
        assert_eq!(
            describe_memory(7, &memory(1 << 20)),
            "PID 7: RSS 3.0 MiB (anon 1.0 MiB, file 1.0 MiB, shmem 1.0 MiB), \
             traced live 512.0 KiB, gap 2.5 MiB"
        );
        assert_eq!(
            describe_memory(7, &memory(0)),
            "PID 7: RSS 3.0 MiB (anon 1.0 MiB, file 1.0 MiB), traced live 512.0 KiB, gap 2.5 MiB"
        );
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
        report.stacks[0].kind = Kind::GpuDevice;
        report.stacks[0].api = Some("cudaMalloc".to_owned());
        let text = render(&report);
        assert!(text.contains("\n    gpu-device via cudaMalloc  pid 10  live 256.0 KiB"));
    }

    #[test]
    fn negative_growth_keeps_its_sign_and_empty_stacks_say_so() {
        let mut report = sample_report(1);
        report.stacks[0].growth_bytes_per_s = -2048.0;
        report.stacks[0].frames.clear();
        let text = render(&report);
        assert!(text.contains("growth -2.0 KiB/s"));
        assert!(text.contains("\n      (stack not recorded)\n"));
    }
}
