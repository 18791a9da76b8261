//! The head of the text report: warnings first, then what was traced,
//! for how long and how, and the live memory at the end.

use std::{collections::BTreeMap, path::Path};

use tracer_ebpf::{GPU_API_NAMES, STAT_NAMES, stat};

use super::super::{MemoryReconciliation, Report, human_bytes};
use crate::model::{
    Kind,
    quality::StackQuality,
    run::{NoticedBy, SamplingMode},
};

/// The lines above the stacks.
pub fn lines(report: &Report) -> Vec<String> {
    let mut lines = Vec::new();
    if !report.drops.is_empty() {
        lines.extend(report.drop_warning());
        for name in report.drops.keys() {
            if let Some(hint) = drop_hint(name) {
                lines.push(format!("  {name}: {hint}"));
            }
        }
    }
    if let Some(cost) = &report.cost
        && let Some(advice) = super::cost::cost_advice(cost, &report.sampling)
    {
        lines.push(format!("WARNING: {}", super::cost::cost_line(cost)));
        lines.push(format!("  {advice}"));
    }
    if !report.refused_files.is_empty() {
        let reasons: Vec<String> = report
            .refused_files
            .iter()
            .map(|(reason, count)| format!("{reason}={count}"))
            .collect();
        lines.push(format!(
            "WARNING: refused_files: {} files a target named were refused or cut short ({}): \
             see docs/troubleshooting.md#limits",
            report.refused_files.values().sum::<u64>(),
            reasons.join(", ")
        ));
    }
    lines.extend(super::evidence::judged_at_lines(report));
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
    if report.sampling.mode == SamplingMode::Resident {
        lines.push(format!(
            "window: {:.1} s from attach, {} snapshots every {} ms; pages made resident \
             before attach are not seen",
            report.window_s, report.snapshots, report.interval_ms
        ));
        let huge_faults = stat_count(report, "huge_page_faults");
        lines.extend(resident_lines(huge_faults));
        let shift = stat_count(report, "fault_sample_shift");
        if shift > 0 {
            lines.push(format!(
                "sampled where faults came fast: the faults of one page in up to {} were \
                 followed (chosen by address), each standing for that many pages; resident \
                 bytes are unbiased estimates",
                1u64 << shift.min(63)
            ));
        }
    } else {
        lines.push(format!(
            "window: {:.1} s from attach, {} snapshots every {} ms; \
             allocations made before attach are not seen",
            report.window_s, report.snapshots, report.interval_ms
        ));
    }
    if let Some(cost) = &report.cost {
        lines.push(format!("cost: {}", super::cost::cost_line(cost)));
        lines.push(super::cost::cost_detail(cost));
    }
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
    let frees_replaced_name = STAT_NAMES[stat::FREES_OF_REPLACED_IMAGE as usize].0;
    let frees_replaced = report.events.get(frees_replaced_name).copied().unwrap_or(0);
    if frees_replaced > 0 {
        lines.push(format!(
            "frees of blocks of an image replaced by exec (ignored): {frees_replaced}"
        ));
    }
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
        } else if kind == Kind::Resident.as_str() {
            lines.push(format!(
                "live {kind} at end: {} in {} pages",
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
        if let Some(limit) = &target.memory_limit {
            lines.push(describe_limit(target.target.pid, limit));
        }
    }
    lines
}

/// When a target reaches its memory limit at its suspected leaks' growth:
/// `PID 7: at +1.2 MiB/s (its suspected leaks), the limit of cgroup
/// /app, 512.0 MiB (256.0 MiB used), is reached in ~3.6 min`.
pub fn describe_limit(pid: u32, limit: &crate::report::LimitReport) -> String {
    let of = if limit.limit.source == "host" {
        format!("the host's {}", human_bytes(limit.limit.limit_bytes as f64))
    } else {
        format!(
            "the limit of {}, {}",
            limit.limit.source,
            human_bytes(limit.limit.limit_bytes as f64)
        )
    };
    let used = human_bytes(limit.limit.used_bytes as f64);
    match limit.reached_in_s {
        Some(seconds) => format!(
            "PID {pid}: at +{}/s (its suspected leaks), {of} ({used} used) is reached in ~{}",
            human_bytes(limit.growth_bytes_per_s),
            human_duration(seconds)
        ),
        None => format!("PID {pid}: {of} ({used} used); no suspected leak grows toward it"),
    }
}

/// `45 s`, `3.6 min`, `2.5 h`, `3.1 days`.
fn human_duration(seconds: f64) -> String {
    if seconds < 90.0 {
        format!("{seconds:.0} s")
    } else if seconds < 90.0 * 60.0 {
        format!("{:.1} min", seconds / 60.0)
    } else if seconds < 48.0 * 3600.0 {
        format!("{:.1} h", seconds / 3600.0)
    } else {
        format!("{:.1} days", seconds / 86400.0)
    }
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

/// What `--resident` sees and misses, said before any figure.
fn resident_lines(huge_faults: u64) -> [String; 2] {
    [
        format!(
            "resident mode (--resident): each page is charged to the stack that first touched \
             it, and credited back when unmapped or given back (madvise); a transparent huge \
             page counts 2 MiB ({huge_faults} {} served by one); no allocator call is traced",
            if huge_faults == 1 { "fault" } else { "faults" }
        ),
        "it misses growth that reuses freed memory without a new page, and frees inside the \
         heap that give no page back (still resident, still charged); the stack is the code \
         that touched the page (run exact mode on a flagged one for its blocks)"
            .to_owned(),
    ]
}

/// The count of the STATS counter `name` in the report's events.
fn stat_count(report: &Report, name: &str) -> u64 {
    report.events.get(name).copied().unwrap_or(0)
}

/// What to do about a kind of drop.
fn drop_hint(name: &str) -> Option<&'static str> {
    Some(match name {
        "live_map_full" => "more blocks were live than the table holds: raise --max-live",
        "stack_table_full" | "by_stack_map_full" => {
            "more distinct stacks than the table holds: raise --max-stacks"
        }
        "stack_error" => "the kernel could not walk some stacks (their blocks count as NO_STACK)",
        "stack_collision_lost" => {
            "stacks whose hash was another stack's (forged return addresses?): counted as NO_STACK"
        }
        "pending_map_full" => "more threads were inside an allocator at once than tracked (16384)",
        "mapping_events_lost" => {
            "mapping calls came faster than tracer drained them: raise --ring-buffer-kib"
        }
        "mapping_pending_full" => "more threads were inside a mapping call at once than tracked",
        "fault_events_lost" => {
            "page faults came faster than tracer drained them (--resident): their pages are not counted"
        }
        "out_param_unreadable" => "posix_memalign results that could not be read",
        "stack_copy_ring_full" => {
            "stack copies came faster than tracer unwound them: raise --stack-ring-mib"
        }
        "stack_free_lost" => "frees found both the copy ring and its overflow table full",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
