//! What the HTTP server shows: a `View` of the latest snapshot, built by
//! the collection loop and published whole, and the responses made from it
//! (Prometheus metrics, pprof heap and growth profiles).
use std::collections::{BTreeMap, HashMap};

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::{
    model::{Frame, Kind, Model, trim_allocator_frames},
    output::{self, Report, StackReport},
};

/// The labels of one metric sample, in order.
type Labels = Vec<(&'static str, String)>;

/// The latest snapshot as the server shows it: only targets still alive.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Seconds from attach to the snapshot.
    pub window_s: f64,
    pub targets: Vec<TargetView>,
    /// Drop counters by reason, zeros included.
    pub drops: Vec<(String, u64)>,
    /// The top stacks by live bytes and the suspected leaks (`--top` of
    /// each), without duplicates.
    pub stacks: Vec<StackView>,
    /// The report the profiles are written from (its `stacks` are those of
    /// `stacks`, series left out).
    pub report: Option<Report>,
}

/// A live target's totals.
#[derive(Clone, Debug)]
pub struct TargetView {
    pub pid: u32,
    pub comm: String,
    /// Live bytes and blocks by kind.
    pub totals: BTreeMap<Kind, (i64, i64)>,
}

/// One ranked stack, labelled.
#[derive(Clone, Debug)]
pub struct StackView {
    pub pid: u32,
    pub comm: String,
    pub kind: Kind,
    pub stack_id: u32,
    /// Where the stack allocates (`site_label`).
    pub site: String,
    /// A short hash of the stack's frames, the same in every run of the
    /// same binaries.
    pub hash: String,
    pub live_bytes: i64,
    pub live_allocs: i64,
    pub growth_bytes_per_s: f64,
    pub suspected_leak: bool,
}

impl View {
    /// The view of `report` (built from `model` with the live targets'
    /// stacks): `comm` names each PID.
    pub fn build(model: &Model, mut report: Report, comm: &dyn Fn(u32) -> String) -> View {
        let alive: Vec<u32> = report
            .targets
            .iter()
            .filter(|target| target.target.exited_after_s.is_none())
            .map(|target| target.target.pid)
            .collect();
        let mut stacks: Vec<StackReport> = Vec::new();
        for stack in report
            .stacks
            .drain(..)
            .chain(report.suspected_leaks.drain(..))
        {
            let seen = stacks.iter().any(|other| {
                (other.pid, other.kind, other.stack_id) == (stack.pid, stack.kind, stack.stack_id)
            });
            if !seen && alive.contains(&stack.pid) {
                stacks.push(stack);
            }
        }
        for stack in &mut stacks {
            stack.series = Vec::new();
        }
        let comms: HashMap<u32, String> = alive.iter().map(|&pid| (pid, comm(pid))).collect();
        let comm_of = |pid: u32| comms.get(&pid).cloned().unwrap_or_default();
        let targets = alive
            .iter()
            .map(|&pid| TargetView {
                pid,
                comm: comm_of(pid),
                totals: model
                    .totals_for_pid(pid)
                    .into_iter()
                    .map(|(kind, totals)| (kind, (totals.live_bytes, totals.live_allocs)))
                    .collect(),
            })
            .collect();
        let views = stacks
            .iter()
            .map(|stack| StackView {
                pid: stack.pid,
                comm: comm_of(stack.pid),
                kind: stack.kind,
                stack_id: stack.stack_id,
                site: stack
                    .site
                    .as_ref()
                    .map_or_else(|| site_label(&stack.frames), |site| site.label.clone()),
                hash: stack_hash(stack.kind, &stack.frames),
                live_bytes: stack.live_bytes,
                live_allocs: stack.live_allocs,
                growth_bytes_per_s: stack.growth_bytes_per_s,
                suspected_leak: stack.suspected_leak,
            })
            .collect();
        report.stacks = stacks;
        report
            .targets
            .retain(|target| alive.contains(&target.target.pid));
        View {
            window_s: model.window_s(),
            targets,
            drops: tracer_ebpf::STAT_NAMES
                .into_iter()
                .enumerate()
                .filter(|&(_, (_, class))| class == tracer_ebpf::StatClass::Drop)
                .map(|(index, (name, _))| {
                    let count = model.stats().get(index).copied().unwrap_or(0);
                    (name.to_owned(), count)
                })
                .collect(),
            stacks: views,
            report: Some(report),
        }
    }

    /// The Prometheus (OpenMetrics) text of the view.
    pub fn metrics(&self) -> String {
        let mut registry = Registry::default();
        let live_bytes = Family::<Labels, Gauge>::default();
        let live_allocs = Family::<Labels, Gauge>::default();
        let dropped = Family::<Labels, Counter>::default();
        let stack_bytes = Family::<Labels, Gauge>::default();
        let stack_allocs = Family::<Labels, Gauge>::default();
        let stack_growth = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let stack_leak = Family::<Labels, Gauge>::default();
        let window = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        let targets = Gauge::<i64>::default();
        window.set(self.window_s);
        targets.set(self.targets.len() as i64);
        for target in &self.targets {
            for (kind, &(bytes, allocs)) in &target.totals {
                let labels = vec![
                    ("pid", target.pid.to_string()),
                    ("comm", target.comm.clone()),
                    ("kind", kind.as_str().to_owned()),
                ];
                live_bytes.get_or_create(&labels).set(bytes);
                live_allocs.get_or_create(&labels).set(allocs);
            }
        }
        for (reason, count) in &self.drops {
            dropped
                .get_or_create(&vec![("reason", reason.clone())])
                .inc_by(*count);
        }
        for stack in &self.stacks {
            let labels = vec![
                ("pid", stack.pid.to_string()),
                ("comm", stack.comm.clone()),
                ("kind", stack.kind.as_str().to_owned()),
                ("site", stack.site.clone()),
                ("stack", stack.hash.clone()),
            ];
            stack_bytes.get_or_create(&labels).set(stack.live_bytes);
            stack_allocs.get_or_create(&labels).set(stack.live_allocs);
            stack_growth
                .get_or_create(&labels)
                .set(stack.growth_bytes_per_s);
            stack_leak
                .get_or_create(&labels)
                .set(i64::from(stack.suspected_leak));
        }
        registry.register(
            "tracer_window_seconds",
            "Seconds from attach to the latest snapshot",
            window,
        );
        registry.register(
            "tracer_targets",
            "Processes traced now (exited ones are left out)",
            targets,
        );
        registry.register(
            "tracer_live_bytes",
            "Live bytes traced, by process and memory kind",
            live_bytes,
        );
        registry.register(
            "tracer_live_allocs",
            "Live blocks traced, by process and memory kind",
            live_allocs,
        );
        registry.register(
            "tracer_dropped",
            "Events tracer could not count, by reason (its figures are low by these)",
            dropped,
        );
        registry.register(
            "tracer_stack_live_bytes",
            "Live bytes of one call stack (the top --top by live bytes and the suspected leaks)",
            stack_bytes,
        );
        registry.register(
            "tracer_stack_live_allocs",
            "Live blocks of one call stack",
            stack_allocs,
        );
        registry.register(
            "tracer_stack_growth_bytes_per_second",
            "Least-squares slope of the stack's live bytes since attach",
            stack_growth,
        );
        registry.register(
            "tracer_stack_suspected_leak",
            "1 when the stack is judged a leak (it grew with the target's work and kept it), else 0",
            stack_leak,
        );
        let mut text = String::new();
        encode(&mut text, &registry).expect("writing to a String cannot fail");
        text
    }

    /// The live memory of the view's stacks as a gzipped pprof profile
    /// (none before the first snapshot).
    pub fn heap_profile(&self) -> Option<Vec<u8>> {
        self.report.as_ref().map(output::pprof::render)
    }

    /// What grew from `base` to this view, as a gzipped pprof profile: per
    /// stack, the live bytes and blocks now less those of `base` (0 for a
    /// stack it did not show), and what was allocated between the two. A
    /// stack of `base` is found by any id it was made of (its own and the
    /// ones merged into it for equal frames), so a stack whose frames were
    /// merged differently in the two views (one named only in the later)
    /// is still one stack; each of `base`'s is taken off once.
    pub fn growth_profile(&self, base: &View) -> Option<Vec<u8>> {
        let report = self.report.as_ref()?;
        let before_stacks: Vec<&StackReport> = base
            .report
            .iter()
            .flat_map(|report| &report.stacks)
            .collect();
        let ids = |stack: &StackReport| {
            std::iter::once(stack.stack_id)
                .chain(stack.merged_stack_ids.iter().copied())
                .map(move |id| (stack.pid, stack.kind, id))
                .collect::<Vec<(u32, Kind, u32)>>()
        };
        let mut before: HashMap<(u32, Kind, u32), usize> = HashMap::new();
        for (index, stack) in before_stacks.iter().enumerate() {
            for id in ids(stack) {
                before.entry(id).or_insert(index);
            }
        }
        let mut taken = vec![false; before_stacks.len()];
        let mut report = report.clone();
        report.stacks.retain_mut(|stack| {
            let mut olds: Vec<usize> = ids(stack)
                .iter()
                .filter_map(|id| before.get(id).copied())
                .collect();
            olds.sort_unstable();
            olds.dedup();
            for index in olds {
                if std::mem::replace(&mut taken[index], true) {
                    continue;
                }
                let old = before_stacks[index];
                stack.live_bytes -= old.live_bytes;
                stack.live_allocs -= old.live_allocs;
                stack.alloc_bytes_total = stack
                    .alloc_bytes_total
                    .saturating_sub(old.alloc_bytes_total);
                stack.alloc_count_total = stack
                    .alloc_count_total
                    .saturating_sub(old.alloc_count_total);
            }
            stack.live_bytes != 0 || stack.alloc_bytes_total != 0
        });
        report.window_s = self.window_s - base.window_s;
        Some(output::pprof::render(&report))
    }
}

/// The `site` label of a stack the report gave no site (the report's site
/// is its first frame past the allocator and the allocation wrappers,
/// `model::site`): the first frame that is not the allocator's,
/// as `function (file:line)`, `function`, or `module+0xOFFSET`.
pub fn site_label(frames: &[Frame]) -> String {
    let trimmed = trim_allocator_frames(frames.to_vec());
    let Some(frame) = trimmed.first() else {
        return "(stack not recorded)".to_owned();
    };
    let module = || {
        frame.module.as_deref().map(|module| {
            std::path::Path::new(module)
                .file_name()
                .map_or_else(|| module.to_owned(), |name| name.to_string_lossy().into())
        })
    };
    match (&frame.function, frame.short_location(), module()) {
        (Some(function), Some(location), _) => format!("{function} ({location})"),
        (Some(function), None, _) => function.clone(),
        (None, _, Some(module)) => match frame.file_offset {
            Some(offset) => format!("{module}+0x{offset:x}"),
            None => format!("{module}@0x{:x}", frame.address),
        },
        (None, _, None) => format!("0x{:x}", frame.address),
    }
}

/// 8 hex digits naming a stack by its kind and frames (object file name
/// and offset, else function), so the same stack has the same hash in a
/// restarted process and on another host with the same binaries.
pub fn stack_hash(kind: Kind, frames: &[Frame]) -> String {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(kind.as_str().as_bytes());
    for frame in frames {
        let module = frame
            .module
            .as_deref()
            .and_then(|module| std::path::Path::new(module).file_name())
            .map(|name| name.to_string_lossy());
        match (module, frame.file_offset) {
            (Some(module), Some(offset)) => {
                hasher.update(module.as_bytes());
                hasher.update(&offset.to_le_bytes());
            }
            _ => {
                hasher.update(frame.function.as_deref().unwrap_or("?").as_bytes());
                hasher.update(&frame.address.to_le_bytes());
            }
        }
        hasher.update(b";");
    }
    format!("{:08x}", hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: Option<&str>, file: Option<&str>, line: Option<u32>) -> Frame {
        Frame {
            address: 0x5555_0000_1234,
            function: function.map(str::to_owned),
            file: file.map(str::to_owned),
            line,
            module: Some("/opt/app/server".to_owned()),
            build_id: None,
            file_offset: Some(0x1234),
            offset: None,
            language: crate::model::Language::Native,
        }
    }

    #[test]
    fn site_skips_the_allocator_and_names_function_and_line() {
        let frames = [
            Frame {
                module: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".to_owned()),
                ..frame(Some("malloc"), None, None)
            },
            frame(Some("leak_here"), Some("/src/tests/leaky.c"), Some(71)),
            frame(Some("main"), Some("/src/tests/leaky.c"), Some(300)),
        ];
        assert_eq!(site_label(&frames), "leak_here (leaky.c:71)");
    }

    #[test]
    fn site_without_symbols_is_module_and_offset() {
        assert_eq!(site_label(&[frame(None, None, None)]), "server+0x1234");
        assert_eq!(site_label(&[frame(Some("f"), None, None)]), "f");
        assert_eq!(site_label(&[]), "(stack not recorded)");
    }

    #[test]
    fn hash_ignores_where_the_process_mapped_its_code() {
        let one = [frame(Some("f"), None, None)];
        let moved = [Frame {
            address: 0x7777_0000_1234,
            ..frame(Some("f"), None, None)
        }];
        assert_eq!(stack_hash(Kind::Heap, &one), stack_hash(Kind::Heap, &moved));
        assert_ne!(
            stack_hash(Kind::Heap, &one),
            stack_hash(Kind::MmapAnon, &one)
        );
        assert_eq!(stack_hash(Kind::Heap, &one).len(), 8);
    }

    #[test]
    fn metrics_name_each_stack_with_its_labels() {
        let view = View {
            window_s: 3.0,
            targets: vec![TargetView {
                pid: 42,
                comm: "leaky".to_owned(),
                totals: BTreeMap::from([(Kind::Heap, (13370, 10))]),
            }],
            drops: vec![("live_table_full".to_owned(), 0)],
            stacks: vec![StackView {
                pid: 42,
                comm: "leaky".to_owned(),
                kind: Kind::Heap,
                stack_id: 7,
                site: "leak_here (leaky.c:71)".to_owned(),
                hash: "0badf00d".to_owned(),
                live_bytes: 13370,
                live_allocs: 10,
                growth_bytes_per_s: 1.5,
                suspected_leak: true,
            }],
            report: None,
        };
        let text = view.metrics();
        for line in [
            r#"tracer_live_bytes{pid="42",comm="leaky",kind="heap"} 13370"#,
            r#"tracer_live_allocs{pid="42",comm="leaky",kind="heap"} 10"#,
            r#"tracer_dropped_total{reason="live_table_full"} 0"#,
            r#"tracer_stack_live_bytes{pid="42",comm="leaky",kind="heap",site="leak_here (leaky.c:71)",stack="0badf00d"} 13370"#,
            r#"tracer_stack_suspected_leak{pid="42",comm="leaky",kind="heap",site="leak_here (leaky.c:71)",stack="0badf00d"} 1"#,
            r#"tracer_stack_growth_bytes_per_second{pid="42",comm="leaky",kind="heap",site="leak_here (leaky.c:71)",stack="0badf00d"} 1.5"#,
            "tracer_targets 1",
        ] {
            assert!(text.lines().any(|got| got == line), "{line} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
