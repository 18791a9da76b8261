//! The lines of `record --holders`: what each scan read, and under a
//! stack what nothing reaches, who holds the rest, and its chain to a root.
use crate::model::reachability::{
    BeforeAttach, HeapParse, HolderKind, HoldersScan, PathStep, Reachability,
};
use crate::output::{Report, StackReport, human_bytes};

/// Holders named on a stack's "held by" line.
const HOLDERS_SHOWN: usize = 4;

/// Types named in a scan's "before attach" section.
const TYPES_SHOWN: usize = 8;

/// Per scan, under the run's totals: what it read, the heap as its
/// allocator sees it, and what the process held before tracer attached.
pub fn scan_lines(report: &Report) -> Vec<String> {
    let mut lines = Vec::new();
    for scan in &report.holders_scans {
        lines.push(scan_line(scan));
        lines.push(heap_line(scan.pid, &scan.heap));
        census_lines(scan.pid, &scan.before_attach, &mut lines);
    }
    lines
}

fn heap_line(pid: u32, heap: &HeapParse) -> String {
    if let Some(reason) = &heap.not_parsed {
        return format!("heap of PID {pid}: {reason}");
    }
    let unparsed = if heap.unparsed_bytes > 0 {
        format!(
            "; {} left unparsed after {} headers that changed while read",
            human_bytes(heap.unparsed_bytes as f64),
            heap.resyncs
        )
    } else {
        String::new()
    };
    format!(
        "heap of PID {pid}: {}, {} arenas: {} chunks in use, {} of them ({}) not traced; \
         free: {} chunks ({}) in bins, {} in {} tcaches, {} in fastbins (free memory holds \
         nothing); {} chunks mapped on their own ({}) not traced{unparsed}",
        heap.allocator,
        heap.arenas,
        heap.chunks_in_use,
        heap.untraced_chunks,
        human_bytes(heap.untraced_chunk_bytes as f64),
        heap.free_chunks,
        human_bytes(heap.free_bytes as f64),
        heap.tcache_chunks,
        heap.tcaches,
        heap.fastbin_chunks,
        heap.mmapped_chunks,
        human_bytes(heap.mmapped_chunk_bytes as f64),
    )
}

/// "before attach: 612 MiB in 1.9 M blocks", then its largest types;
/// what may have been made after attach and not recorded says so.
fn census_lines(pid: u32, census: &BeforeAttach, lines: &mut Vec<String>) {
    let when = if census.or_unrecorded.is_empty() {
        "before attach".to_owned()
    } else {
        format!(
            "before attach, or after it and not recorded: {},",
            census.or_unrecorded.join("; ")
        )
    };
    lines.push(format!(
        "{when} (PID {pid}): {} in {} blocks tracer has no record of{}",
        human_bytes(census.bytes as f64),
        census.blocks,
        if census.by_type.is_empty() {
            ""
        } else {
            ", by type:"
        }
    ));
    let outside = census.outside_size_filters;
    if outside.blocks > 0 {
        lines.push(format!(
            "outside --min-size/--max-size (PID {pid}): {} in {} blocks, before attach or \
             after (tracer records none of them)",
            human_bytes(outside.bytes as f64),
            outside.blocks
        ));
    }
    for row in census.by_type.iter().take(TYPES_SHOWN) {
        let held = if row.root == "unreachable" {
            "nothing holds most of it".to_owned()
        } else {
            format!("held from {}", row.root)
        };
        lines.push(format!(
            "    {} in {} block{}: {}, {held}",
            human_bytes(row.bytes as f64),
            row.blocks,
            if row.blocks == 1 { "" } else { "s" },
            row.type_name,
        ));
    }
    if census.by_type.len() > TYPES_SHOWN {
        let rest = &census.by_type[TYPES_SHOWN..];
        lines.push(format!(
            "    {} in {} more types",
            human_bytes(rest.iter().map(|row| row.bytes).sum::<u64>() as f64),
            rest.len()
        ));
    }
}

fn scan_line(scan: &HoldersScan) -> String {
    let untraced = if scan.untraced_objects + scan.untraced_objects_left_out > 0 {
        format!(
            "; {} untraced pymalloc objects in {} pools added ({} left out past the cap)",
            scan.untraced_objects, scan.untraced_pools, scan.untraced_objects_left_out
        )
    } else {
        String::new()
    };
    format!(
        "holders of PID {}: read {} of {} writable mappings and {} of {} thread stacks \
         (blocked ones, from their stack pointer) in {:.2} s, after {:.2} s reading LIVE; {} \
         traced blocks, {} pointers to them (conservative: a word that looks like a pointer \
         counts){untraced}; a rescan classed {} blocks otherwise",
        scan.pid,
        human_bytes(scan.bytes_read as f64),
        scan.mappings,
        scan.threads_blocked,
        scan.threads,
        scan.seconds,
        scan.live_read_seconds,
        scan.blocks,
        scan.pointers,
        scan.rescan_disagreed_blocks,
    )
}

/// The lines under a stack with reachability: the counts, the holders and
/// the path.
pub fn stack_lines(stack: &StackReport, lines: &mut Vec<String>) {
    let Some(reachability) = &stack.reachability else {
        return;
    };
    lines.push(format!("    {}", counts(reachability)));
    if !reachability.held_by.is_empty() {
        let mut holders: Vec<String> = reachability
            .held_by
            .iter()
            .take(HOLDERS_SHOWN)
            .map(|holder| {
                format!(
                    "{} ({}{} in {} block{})",
                    holder.name,
                    kind_word(holder.kind),
                    human_bytes(holder.bytes as f64),
                    holder.blocks,
                    if holder.blocks == 1 { "" } else { "s" }
                )
            })
            .collect();
        if reachability.held_by.len() > HOLDERS_SHOWN {
            holders.push(format!(
                "{} more",
                reachability.held_by.len() - HOLDERS_SHOWN
            ));
        }
        lines.push(format!("    held by: {}", holders.join("; ")));
    }
    if !reachability.path_to_root.is_empty() {
        lines.push(format!(
            "    path to root: {}",
            path_words(&reachability.path_to_root)
        ));
    }
    path_lines(reachability, lines);
}

/// The other roots' chains, where a chain stops and why, and the
/// registries that reach the first chain's objects without owning them.
fn path_lines(reachability: &Reachability, lines: &mut Vec<String>) {
    let several = reachability.paths.len() > 1;
    for (index, path) in reachability.paths.iter().enumerate() {
        let only = format!(
            "{} in {} block{}",
            human_bytes(path.bytes as f64),
            path.blocks,
            if path.blocks == 1 { "" } else { "s" }
        );
        if index > 0 {
            lines.push(format!(
                "    also held from {} ({only} only it explains): {}",
                path.root,
                path_words(&path.steps)
            ));
        } else if several {
            lines.push(format!("    ({only} of them held from {})", path.root));
        }
        if let Some(stopped) = &path.stopped {
            lines.push(format!("      the chain stops at {stopped}"));
        }
    }
    for registry in &reachability.non_owning {
        lines.push(format!("    {}: {}", registry.root, registry.note));
    }
}

fn counts(reachability: &Reachability) -> String {
    format!(
        "unreachable {} in {} blocks, possibly lost {} in {}, reachable {} in {}",
        human_bytes(reachability.unreachable_bytes as f64),
        reachability.unreachable_blocks,
        human_bytes(reachability.possibly_lost_bytes as f64),
        reachability.possibly_lost_blocks,
        human_bytes(reachability.reachable_bytes as f64),
        reachability.reachable_blocks,
    )
}

fn kind_word(kind: HolderKind) -> &'static str {
    match kind {
        HolderKind::Block => "block, ",
        HolderKind::Global => "global, ",
        HolderKind::Thread => "stack, ",
        HolderKind::Registers => "",
        HolderKind::Untraced => "",
    }
}

/// `a <- dict from b x3 <- g_list in prog`: a block's type (Python,
/// C++) before its site, runs of steps with one name folded.
fn path_words(path: &[PathStep]) -> String {
    let mut words: Vec<(String, usize, bool)> = Vec::new();
    for step in path {
        let name = match &step.type_name {
            Some(type_name) => format!("{type_name} from {}", step.name),
            None => step.name.clone(),
        };
        match words.last_mut() {
            Some((last, count, interior)) if *last == name => {
                *count += 1;
                *interior |= step.interior;
            }
            _ => words.push((name, 1, step.interior)),
        }
    }
    words
        .into_iter()
        .map(|(name, count, interior)| {
            let times = if count > 1 {
                format!(" x{count}")
            } else {
                String::new()
            };
            let inside = if interior { " (interior)" } else { "" };
            format!("{name}{times}{inside}")
        })
        .collect::<Vec<_>>()
        .join(" <- ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(kind: HolderKind, name: &str, interior: bool) -> PathStep {
        PathStep {
            kind,
            name: name.to_owned(),
            address: None,
            interior,
            type_name: None,
        }
    }

    #[test]
    fn folds_runs_of_one_site_in_a_path() {
        let path = [
            step(HolderKind::Block, "list_push (holders.c:1)", false),
            step(HolderKind::Block, "list_push (holders.c:1)", false),
            step(HolderKind::Block, "list_push (holders.c:1)", false),
            step(HolderKind::Global, "g_list in holders", false),
        ];
        assert_eq!(
            path_words(&path),
            "list_push (holders.c:1) x3 <- g_list in holders"
        );
        let mut typed = step(HolderKind::Block, "track (f.py:9)", false);
        typed.type_name = Some("dict".to_owned());
        assert_eq!(
            path_words(&[
                typed,
                step(HolderKind::Untraced, "untraced memory in [heap]", false)
            ]),
            "dict from track (f.py:9) <- untraced memory in [heap]"
        );
    }

    #[test]
    fn the_census_says_what_may_have_been_made_after_attach() {
        let mut census = BeforeAttach {
            bytes: 4096,
            blocks: 2,
            ..BeforeAttach::default()
        };
        let mut lines = Vec::new();
        census_lines(7, &census, &mut lines);
        assert_eq!(
            lines,
            ["before attach (PID 7): 4.0 KiB in 2 blocks tracer has no record of"]
        );
        census.or_unrecorded = vec![
            "sampled out (--sample-bytes 524288)".to_owned(),
            "dropped (live_map_full=3)".to_owned(),
        ];
        census.outside_size_filters.bytes = 240;
        census.outside_size_filters.blocks = 10;
        let mut lines = Vec::new();
        census_lines(7, &census, &mut lines);
        assert_eq!(
            lines,
            [
                "before attach, or after it and not recorded: sampled out (--sample-bytes \
                 524288); dropped (live_map_full=3), (PID 7): 4.0 KiB in 2 blocks tracer has \
                 no record of",
                "outside --min-size/--max-size (PID 7): 240 B in 10 blocks, before attach or \
                 after (tracer records none of them)"
            ]
        );
    }
}
