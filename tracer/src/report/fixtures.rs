//! A report of two processes, for the tests of every format.
use std::collections::BTreeMap;

use super::{Report, ReportInput, ReportView};
use crate::model::site::tests::frame;
use crate::model::{
    Frame, MemoryStatus, Model, Snapshot, StackId, StackKey, Target,
    fixtures::{counters, heap_key},
    run::{LibraryReport, NoticedBy, ProbeReport, RunFacts, StackFacts, Traced},
};

const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";
const APP: &str = "/opt/app/bin/server";

/// Two processes; pid 10 leaks 64 KiB/s on stack 1.
pub(crate) fn sample_model() -> Model {
    let mut model = Model::new();
    for second in 1..=4_i64 {
        let mut stats = vec![0; tracer_ebpf::stat::COUNT as usize];
        stats[tracer_ebpf::stat::FREES_UNKNOWN as usize] = 7;
        stats[tracer_ebpf::stat::DROP_STACK_TABLE_FULL as usize] = 3;
        model.push(Snapshot {
            elapsed_s: second as f64,
            stacks: vec![
                (heap_key(10, 1), counters(65536 * second)),
                (heap_key(10, 2), counters(4096)),
                (heap_key(20, 1), counters(8192)),
                (heap_key(20, 3), counters(0)),
            ],
            stats,
            ..Snapshot::default()
        });
    }
    model
}

pub(crate) fn sample_frames(key: &StackKey) -> Vec<Frame> {
    vec![
        frame("malloc", LIBC),
        Frame {
            address: 0x401234,
            function: Some(format!("grow_{}", key.stack_id)),
            file: Some("leak.c".to_owned()),
            line: Some(12),
            module: Some(APP.to_owned()),
            build_id: Some("0123abcd".to_owned()),
            file_offset: Some(0x1234),
            offset: None,
            language: crate::model::Language::Native,
        },
        frame("main", APP),
    ]
}

pub(crate) fn sample_report(top: usize) -> Report {
    sample_report_with(top, &sample_frames)
}

/// The sample report with the stacks' frames given by `frames`.
pub(crate) fn sample_report_with(top: usize, frames: &dyn Fn(&StackKey) -> Vec<Frame>) -> Report {
    report_of(&sample_model(), top, frames)
}

/// The report of `model` with the sample report's targets and settings.
pub(crate) fn report_of(
    model: &Model,
    top: usize,
    frames: &dyn Fn(&StackKey) -> Vec<Frame>,
) -> Report {
    let targets = [
        Target::new(10, "./leak --fast".to_owned()),
        Target {
            exited_after_s: Some(3.2),
            ..Target::new(20, "python3 export.py".to_owned())
        },
    ];
    let traced = Traced {
        probes: vec![ProbeReport {
            pid: 10,
            module: LIBC.to_owned(),
            symbol: "malloc".to_owned(),
            offset: 0xa5120,
            offset_in_function: 0,
            single_stepped: false,
            reason: "entry instruction `push %r12` is emulated".to_owned(),
        }],
        libraries: vec![
            LibraryReport {
                pid: 10,
                path: LIBC.to_owned(),
                hooked_after_s: 0.0,
                noticed_by: NoticedBy::Attach,
                functions: vec!["malloc".to_owned(), "free".to_owned()],
            },
            LibraryReport {
                pid: 10,
                path: "/opt/venv/nvidia/cuda_runtime/lib/libcudart.so.12".to_owned(),
                hooked_after_s: 2.5,
                noticed_by: NoticedBy::MmapEvent,
                functions: vec!["cudaMalloc".to_owned(), "cudaFree".to_owned()],
            },
            LibraryReport {
                pid: 10,
                path: "/opt/venv/nvidia/cuda_runtime/lib/libcuda.so.1".to_owned(),
                hooked_after_s: 2.5,
                noticed_by: NoticedBy::AtOpen,
                functions: vec!["cuMemAlloc_v2".to_owned()],
            },
        ],
        unwinding_stopped: BTreeMap::from([("outside_code".to_owned(), 2)]),
        ..Traced::default()
    };
    Report::build(ReportInput {
        model,
        run: RunFacts {
            targets: targets.to_vec(),
            interval_ms: 1000,
            memory_limits: BTreeMap::new(),
            memory_status: BTreeMap::from([(
                10,
                MemoryStatus {
                    rss_bytes: 1 << 20,
                    rss_anon_bytes: 768 << 10,
                    rss_file_bytes: 256 << 10,
                    rss_shmem_bytes: 0,
                },
            )]),
            traced,
            stacks: StackFacts::of(model, frames, |key| key.stack_id == StackId::Kernel(1)),
        },
        view: ReportView {
            top,
            wrappers: &crate::model::Wrappers::default(),
            layout: Default::default(),
            at_s: None,
        },
    })
}

/// pid 10's stacks 1 and 2 allocate at one line (`fill`) through two
/// callers.
fn one_site_two_paths(key: &StackKey) -> Vec<Frame> {
    if key.pid != 10 {
        return sample_frames(key);
    }
    let mut frames = sample_frames(key);
    frames[1].function = Some("fill".to_owned());
    frames.insert(2, frame(&format!("caller_{}", key.stack_id), "/app"));
    frames
}

/// The sample report where pid 10's two stacks share a site.
pub(crate) fn one_site_report() -> Report {
    sample_report_with(10, &one_site_two_paths)
}
