//! Stacks through code without frame pointers (`--unwind`): fixtures built
//! with -O2 -fomit-frame-pointer (tests/fixtures/kernel_cache.cpp,
//! nested_nofp.c) whose leaking functions and bytes are known exactly.
//! The default walks them in the kernel through unwind tables (no stack
//! copy, nothing per allocation in userspace); `--unwind copy` is the
//! earlier path, copies unwound in userspace.

use crate::harness;

use harness::{
    DEEP_LEAK_BYTES, Fixture, LEAK_SIZE_BYTES, Live, NESTED_LEAK_BYTES, PLUGIN_LEAK_BYTES, Record,
    THREAD_LEAK_SIZE_BYTES, Traced, assert_in_order, churn_held, dwarf_pids, field, frames_contain,
    function_names, record_with, stack_live, thread_dtvs,
};

/// kernel_cache's threads (the main thread and three workers).
const THREADS: i64 = 4;
/// Kernels per model in kernel_cache's LoadModel.
const LAYERS: i64 = 6;

#[test]
fn cpp_cache_without_frame_pointers_is_unwound_in_the_kernel() {
    // Default --unwind auto: the executable has no frame pointers. Once
    // every table is in: stacks walked before (by frame pointers) lose
    // their frames in code without them.
    let session = harness::record_with_tables_ready("kernel_cache", &[], &["load 25"]);
    let report = &session.report;
    let answer = &session.answers[0];
    let kernels = 25 * LAYERS * THREADS;
    assert_eq!(field(answer, "kernels"), kernels);
    assert!(
        session
            .output
            .stderr
            .contains("no frame pointers in kernel_cache"),
        "auto did not say why it unwinds with DWARF: {}",
        session.output
    );
    assert_eq!(dwarf_pids(report).len(), 1, "{}", report.json["unwinding"]);

    assert_eq!(
        report.heap_live_with("GetOrCreate"),
        Live {
            bytes: field(answer, "bytes"),
            allocs: kernels
        },
        "\n{report}"
    );
    let top = &report.stacks()[0];
    assert!(frames_contain(top, "GetOrCreate"), "\n{report}");
    let stacks = report.heap_stacks_with("GetOrCreate");
    for stack in &stacks {
        // Allocator frames trimmed: the innermost frame is the caller of
        // operator new (std::make_unique, inlined into GetOrCreate).
        let names = function_names(stack);
        assert!(
            !names[0].contains("operator new") && !names[0].starts_with("_Znwm"),
            "allocator frame left in {names:?}"
        );
        assert_in_order(stack, &["GetOrCreate", "LoadModel", "ServeModels"], report);
    }
    // The main thread's own loads reach main.
    let from_main: Vec<_> = stacks
        .iter()
        .filter(|stack| frames_contain(stack, "main"))
        .collect();
    assert_eq!(from_main.len(), 1, "\n{report}");
    assert_in_order(
        from_main[0],
        &["GetOrCreate", "LoadModel", "ServeModels", "main"],
        report,
    );
    assert_eq!(stack_live(from_main[0]).allocs, 25 * LAYERS, "\n{report}");
    // Besides the kernels, each worker thread allocates its std::thread
    // state, its TLS vector and one growth of the workers' vector; every
    // allocation is walked through the tables (the thread stacks'
    // mappings add some walks), none copied.
    let workers = THREADS - 1;
    assert_eq!(
        report.int("/events/allocs"),
        kernels + 3 * workers,
        "{}",
        report.json["events"]
    );
    assert_eq!(report.int("/events/stack_copies"), 0);
    assert!(report.int("/events/unwind_stacks") >= report.int("/events/allocs"));
    report.assert_no_drops();
}

#[test]
fn frame_pointer_walk_loses_the_callers_of_code_without_frame_pointers() {
    // What --unwind fp shows for the same leak: the bytes are exact, but
    // the walk stops in GetOrCreate, which keeps no frame pointer.
    let session = record_with("kernel_cache", &["--unwind", "fp"], &["load 25"]);
    let report = &session.report;
    let answer = &session.answers[0];
    assert_eq!(
        report.heap_live_with("GetOrCreate"),
        Live::answered(answer, "bytes", "kernels"),
        "\n{report}"
    );
    assert_eq!(
        report.heap_live_with("LoadModel"),
        Live::default(),
        "the frame-pointer walk found LoadModel after all:\n{report}"
    );
    assert!(dwarf_pids(report).is_empty());
    assert_eq!(report.int("/events/stack_copies"), 0);
}

#[test]
fn c_leak_through_three_static_functions_shows_all_three() {
    let session = record_with("nested_nofp", &[], &["leak 300"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "bytes"), 300 * NESTED_LEAK_BYTES);
    let leak = Live::blocks(300, NESTED_LEAK_BYTES);
    assert_eq!(report.heap_live_with("inner_static"), leak, "\n{report}");
    assert_eq!(report.total("heap"), leak, "\n{report}");
    let stacks = report.heap_stacks_with("inner_static");
    assert_eq!(stacks.len(), 1, "\n{report}");
    assert_in_order(
        stacks[0],
        &["inner_static", "middle_static", "outer_static", "main"],
        report,
    );
}

#[test]
fn stack_deeper_than_the_copy_is_truncated_and_still_attributed() {
    // 300 levels of ~200 bytes: far deeper than an 8 KiB copy.
    let session = record_with(
        "nested_nofp",
        &["--unwind", "copy", "--stack-bytes", "8192"],
        &["deep 300 7", "leak 5"],
    );
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "bytes"), 7 * DEEP_LEAK_BYTES);
    let deep = report.heap_stacks_with("deep_recurse");
    assert_eq!(deep.len(), 1, "\n{report}");
    let names = function_names(deep[0]);
    assert!(
        names
            .last()
            .is_some_and(|name| name.starts_with("[truncated")),
        "the deep stack is not marked truncated: {names:?}"
    );
    assert!(names[0].contains("deep_recurse"), "{names:?}");
    assert_eq!(stack_live(deep[0]), Live::blocks(7, DEEP_LEAK_BYTES));
    // A shallow stack in the same run is whole, and not marked.
    let shallow = report.heap_stacks_with("outer_static");
    assert_eq!(shallow.len(), 1, "\n{report}");
    assert!(!frames_contain(shallow[0], "[truncated"), "\n{report}");
    assert!(frames_contain(shallow[0], "main"), "\n{report}");
    assert_eq!(stack_live(shallow[0]), Live::blocks(5, NESTED_LEAK_BYTES));
    assert_eq!(
        report.total("heap"),
        Live::blocks(7, DEEP_LEAK_BYTES) + Live::blocks(5, NESTED_LEAK_BYTES),
        "\n{report}"
    );
}

#[test]
fn copy_mode_counts_frees_reallocs_and_threads_exactly() {
    // leaky keeps frame pointers; --unwind copy copies its stacks anyway,
    // and every free, realloc and memalign must still balance.
    counts_frees_reallocs_and_threads_exactly(&[
        "--unwind",
        "copy",
        // A ring that holds the bursts below whole: no copy falls back to
        // frame pointers, so every free goes through the copy path.
        "--stack-ring-mib",
        "64",
    ]);
}

#[test]
fn dwarf_mode_counts_frees_reallocs_and_threads_exactly() {
    // --unwind dwarf walks even leaky's own frames through its table.
    counts_frees_reallocs_and_threads_exactly(&["--unwind", "dwarf"]);
}

fn counts_frees_reallocs_and_threads_exactly(args: &[&str]) {
    let session = record_with(
        "leaky",
        args,
        &["churn 20", "threads 4 300", "realloc_chain", "leak 40"],
    );
    let report = &session.report;
    let churn = &session.answers[0];
    assert_eq!(
        report.heap_live_with("churn_keep"),
        Live {
            bytes: field(churn, "churn_keep"),
            allocs: 20
        },
        "\n{report}"
    );
    for &function in harness::CHURN_FREED.iter().chain(&["realloc_edge"]) {
        assert_eq!(
            report.heap_live_with(function),
            Live::default(),
            "{function} frees everything it allocates:\n{report}"
        );
    }
    assert_eq!(
        report.heap_live_with("thread_leak"),
        Live::blocks(4 * 300, THREAD_LEAK_SIZE_BYTES),
        "\n{report}"
    );
    let grown = Live {
        bytes: field(&session.answers[2], "final_bytes"),
        allocs: 1,
    };
    assert_eq!(report.heap_live_with("grow_buffer"), grown, "\n{report}");
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live::blocks(40, LEAK_SIZE_BYTES),
        "\n{report}"
    );
    assert_eq!(
        report.total("heap"),
        churn_held(churn)
            + Live::blocks(4 * 300, THREAD_LEAK_SIZE_BYTES)
            + thread_dtvs(report, 4)
            + grown
            + Live::blocks(40, LEAK_SIZE_BYTES),
        "\n{report}"
    );
    report.assert_no_drops();
}

#[test]
fn auto_keeps_frame_pointers_for_code_that_has_them() {
    // leaky is built with frame pointers and links only glibc: no copies.
    let session = record_with("leaky", &[], &["leak 20"]);
    let report = &session.report;
    assert_eq!(report.json["unwinding"]["mode"], "auto");
    assert!(
        dwarf_pids(report).is_empty(),
        "{}",
        report.json["unwinding"]
    );
    assert_eq!(report.int("/events/stack_copies"), 0);
    let leak = Live::blocks(20, LEAK_SIZE_BYTES);
    assert_eq!(report.heap_live_with("leak_here"), leak, "\n{report}");
    assert_eq!(report.total("heap"), leak, "\n{report}");
}

#[test]
fn cuda_allocations_are_unwound_too() {
    let session = record_with("gpu_executor", &["--unwind", "copy"], &["executor 4"]);
    let report = &session.report;
    let leaked_bytes = field(&session.answers[0], "leaked_bytes");
    let top = report
        .stacks()
        .iter()
        .find(|stack| stack["kind"] == "gpu-device")
        .unwrap_or_else(|| panic!("no gpu-device stack:\n{report}"));
    assert_in_order(top, &["setup_storage", "main"], report);
    assert_eq!(top["api"], "cudaMalloc", "\n{report}");
    let leak = Live {
        bytes: leaked_bytes,
        allocs: field(&session.answers[0], "leaked_buffers"),
    };
    assert_eq!(stack_live(top), leak, "\n{report}");
    // Counted once, whichever layer: the runtime's driver calls add nothing.
    assert_eq!(report.total("gpu-device"), leak, "\n{report}");
    // One copy per allocation: the device blocks, and the fixture driver's
    // malloc-ed bookkeeping record of each.
    assert_eq!(
        report.int("/events/stack_copies"),
        report.int("/events/gpu_allocs") + report.int("/events/allocs"),
        "{}",
        report.json["events"]
    );
}

#[test]
fn mapping_calls_are_unwound_too() {
    // mmap through glibc's wrapper and a raw syscall(SYS_mmap): the copy is
    // taken at the system call and unwound through the wrapper.
    let report = mapping_stacks_through_the_wrappers(&["--unwind", "copy"]);
    // One copy per mapping call that mapped: 6 + 4 + 3.
    assert_eq!(
        report.int("/events/stack_copies"),
        13,
        "{}",
        report.json["events"]
    );
}

#[test]
fn mapping_calls_are_walked_through_the_wrappers_tables() {
    // The same stacks walked in the kernel from the registers at the
    // system call, through glibc's wrapper by its table.
    let report = mapping_stacks_through_the_wrappers(&["--unwind", "dwarf"]);
    assert_eq!(report.int("/events/stack_copies"), 0);
    assert!(report.int("/events/unwind_stacks") >= 13);
}

fn mapping_stacks_through_the_wrappers(args: &[&str]) -> harness::Report {
    let session = record_with("mappings", args, &["anon 6", "raw 4", "file 3"]);
    let report = &session.report;
    let anon = report.stacks_with("mmap-anon", "leak_anon_mapping");
    assert_eq!(anon.len(), 1, "\n{report}");
    assert_eq!(
        stack_live(anon[0]),
        Live::blocks(6, 256 * 1024),
        "\n{report}"
    );
    // The wrapper is not the innermost frame: its caller is.
    let names = function_names(anon[0]);
    assert!(names[0].contains("leak_anon_mapping"), "{names:?}");
    assert_in_order(anon[0], &["leak_anon_mapping", "main"], report);
    assert_eq!(
        report.live_with("mmap-anon", "raw_syscall_mapping"),
        Live::blocks(4, 64 * 1024),
        "\n{report}"
    );
    assert_eq!(
        report.live_with("mmap-file", "mmap-file").allocs,
        3,
        "\n{report}"
    );
    session.report
}

#[test]
fn auto_walks_a_library_without_frame_pointers_loaded_later_through_its_table() {
    // plugin_host keeps frame pointers; its plugin, loaded after attach,
    // does not: its table is built when it is mapped, and each stack is
    // one walk, by frame pointers in the host and by the table in the
    // plugin. The table is built off the loop (walked by frame pointers
    // while pending: on a busy machine, past the 100 ms the hook waits),
    // so the leak waits for `-v`'s line that it is ready and in place.
    let mut host = Fixture::start("plugin_host", &[]);
    let mut trace = Record::pid(host.pid).args(["-v"]).attach();
    assert_eq!(host.cmd("load"), "loaded");
    trace.tracer.wait_stderr(
        "mapped nofp_plugin without frame pointers",
        harness::ATTACH_TIMEOUT,
    );
    trace
        .tracer
        .wait_stderr("unwind table nofp_plugin: ", harness::ATTACH_TIMEOUT);
    let answer = host.cmd("leak 30");
    let Traced { report, .. } = trace.stop();
    assert_eq!(field(&answer, "bytes"), 30 * PLUGIN_LEAK_BYTES);
    let stacks = report.heap_stacks_with("plugin_inner");
    assert_eq!(stacks.len(), 1, "\n{report}");
    assert_eq!(stack_live(stacks[0]), Live::blocks(30, PLUGIN_LEAK_BYTES));
    assert_in_order(
        stacks[0],
        &[
            "plugin_inner",
            "plugin_outer",
            "plugin_leak",
            "host_calls_plugin",
            "main",
        ],
        &report,
    );
    assert_eq!(
        report.json["unwinding"]["dwarf"][0]["objects_without_frame_pointers"],
        serde_json::json!(["nofp_plugin"])
    );
    assert_eq!(report.int("/events/stack_copies"), 0);
    assert!(report.int("/events/unwind_stacks") >= 30);
}

#[test]
fn stack_deeper_than_64_frames_without_frame_pointers_reaches_main() {
    // 100 levels of deep_recurse, each without a frame pointer: past
    // where a 64-frame walk would stop, within the 127 frames kept.
    let session = record_with("nested_nofp", &[], &["deep 100 7"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "bytes"), 7 * DEEP_LEAK_BYTES);
    let deep = report.heap_stacks_with("deep_recurse");
    assert_eq!(deep.len(), 1, "\n{report}");
    let names = function_names(deep[0]);
    let recursions = names
        .iter()
        .filter(|name| name.contains("deep_recurse"))
        .count();
    assert_eq!(recursions, 101, "{names:?}");
    assert_in_order(deep[0], &["deep_recurse", "deep_leak", "main"], report);
    assert_eq!(stack_live(deep[0]), Live::blocks(7, DEEP_LEAK_BYTES));
    assert_eq!(report.total("heap"), Live::blocks(7, DEEP_LEAK_BYTES));
    assert_eq!(report.int("/events/stack_copies"), 0);
    assert_eq!(report.int("/events/unwind_stop_depth"), 0);
    report.assert_no_drops();
}

#[test]
fn stack_deeper_than_the_frames_kept_is_cut_and_counted() {
    let session = record_with("nested_nofp", &[], &["deep 300 5", "leak 3"]);
    let report = &session.report;
    let deep = report.heap_stacks_with("deep_recurse");
    assert_eq!(deep.len(), 1, "\n{report}");
    assert_eq!(stack_live(deep[0]), Live::blocks(5, DEEP_LEAK_BYTES));
    assert!(!frames_contain(deep[0], "main"), "\n{report}");
    assert!(report.int("/events/unwind_stop_depth") >= 5);
    let shallow = report.heap_stacks_with("outer_static");
    assert_eq!(shallow.len(), 1, "\n{report}");
    assert!(frames_contain(shallow[0], "main"), "\n{report}");
    assert_eq!(report.int("/events/stack_copies"), 0);
}

#[test]
fn walk_stopped_at_a_signal_frame_is_counted() {
    // reentrant's SIGUSR1 handler allocates: its stack goes through the
    // kernel's signal trampoline (__restore_rt), whose unwind rule the
    // tables mark as a signal frame, where the walk stops.
    let session = record_with("reentrant", &["--unwind", "dwarf"], &["signal 50"]);
    let report = &session.report;
    let answer = &session.answers[0];
    assert_eq!(
        report.heap_live_with("handler_alloc"),
        Live {
            bytes: field(answer, "handler_bytes"),
            allocs: 50
        },
        "\n{report}"
    );
    // One stop per handler's allocation: each walk reaches the trampoline.
    assert_eq!(
        report.int("/events/unwind_stop_signal_frame"),
        field(answer, "count"),
        "{}",
        report.json["events"]
    );
}
