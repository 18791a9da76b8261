//! Stacks through code without frame pointers (`--unwind`): fixtures built
//! with -O2 -fomit-frame-pointer (tests/fixtures/kernel_cache.cpp,
//! nested_nofp.c) whose leaking functions and bytes are known exactly.

#[allow(dead_code, reason = "other test files use the rest of the harness")]
mod harness;

use harness::{
    Live, Report, assert_in_order, dwarf_pids, field, frames_contain, function_names, record_with,
    stack_int,
};

/// kernel_cache's threads (the main thread and three workers).
const THREADS: i64 = 4;
/// Kernels per model in kernel_cache's LoadModel.
const LAYERS: i64 = 6;
const NESTED_LEAK_BYTES: i64 = 777;
const DEEP_LEAK_BYTES: i64 = 999;

#[test]
fn cpp_cache_without_frame_pointers_is_unwound_with_dwarf() {
    // Default --unwind auto: the executable has no frame pointers.
    let session = record_with("kernel_cache", &[], &["load 25"]);
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
    assert_eq!(
        stack_int(from_main[0], "live_allocs"),
        25 * LAYERS,
        "\n{report}"
    );
    assert!(report.int("/events/stack_copies") >= kernels);
    assert!(
        report.json["drops"].as_object().unwrap().is_empty(),
        "{}",
        report.json["drops"]
    );
}

#[test]
fn frame_pointer_walk_loses_the_callers_of_code_without_frame_pointers() {
    // What --unwind fp shows for the same leak: the bytes are exact, but
    // the walk stops in GetOrCreate, which keeps no frame pointer.
    let session = record_with("kernel_cache", &["--unwind", "fp"], &["load 25"]);
    let report = &session.report;
    let answer = &session.answers[0];
    assert_eq!(
        report.heap_live_with("GetOrCreate").bytes,
        field(answer, "bytes"),
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
    assert_eq!(
        report.heap_live_with("inner_static"),
        Live {
            bytes: 300 * NESTED_LEAK_BYTES,
            allocs: 300
        },
        "\n{report}"
    );
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
        &["--unwind", "dwarf", "--stack-bytes", "8192"],
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
    assert_eq!(
        (
            stack_int(deep[0], "live_bytes"),
            stack_int(deep[0], "live_allocs")
        ),
        (7 * DEEP_LEAK_BYTES, 7)
    );
    // A shallow stack in the same run is whole, and not marked.
    let shallow = report.heap_stacks_with("outer_static");
    assert_eq!(shallow.len(), 1, "\n{report}");
    assert!(!frames_contain(shallow[0], "[truncated"), "\n{report}");
    assert!(frames_contain(shallow[0], "main"), "\n{report}");
}

#[test]
fn dwarf_mode_counts_frees_reallocs_and_threads_exactly() {
    // leaky keeps frame pointers; --unwind dwarf copies its stacks anyway,
    // and every free, realloc and memalign must still balance.
    let session = record_with(
        "leaky",
        // A ring that holds the bursts below whole: no copy falls back to
        // frame pointers, so every free goes through the copy path.
        &["--unwind", "dwarf", "--stack-ring-mib", "64"],
        &["churn 20", "threads 4 300", "realloc_chain", "leak 40"],
    );
    let report = &session.report;
    let churn = &session.answers[0];
    assert_eq!(
        report.heap_live_with("churn_keep").bytes,
        field(churn, "churn_keep"),
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
        Live {
            bytes: 4 * 300 * 2048,
            allocs: 1200
        },
        "\n{report}"
    );
    assert_eq!(report.heap_live_with("grow_buffer").allocs, 1, "\n{report}");
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live {
            bytes: 40 * 1337,
            allocs: 40
        },
        "\n{report}"
    );
    assert!(
        report.json["drops"].as_object().unwrap().is_empty(),
        "{}",
        report.json["drops"]
    );
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
    assert_eq!(report.heap_live_with("leak_here").bytes, 20 * 1337);
}

#[test]
fn cuda_allocations_are_unwound_too() {
    let session = record_with("gpu_executor", &["--unwind", "dwarf"], &["executor 4"]);
    let report = &session.report;
    let leaked_bytes = field(&session.answers[0], "leaked_bytes");
    let top = report
        .stacks()
        .iter()
        .find(|stack| stack["kind"] == "gpu-device")
        .unwrap_or_else(|| panic!("no gpu-device stack:\n{report}"));
    assert_in_order(top, &["setup_storage", "main"], report);
    assert_eq!(top["api"], "cudaMalloc", "\n{report}");
    assert_eq!(stack_int(top, "live_bytes"), leaked_bytes, "\n{report}");
    // Counted once, whichever layer: the runtime's driver calls add nothing.
    assert_eq!(
        report.int("/totals/gpu-device/live_bytes"),
        leaked_bytes,
        "\n{report}"
    );
    assert!(report.int("/events/stack_copies") >= report.int("/events/gpu_allocs"));
}

#[test]
fn mapping_calls_are_unwound_too() {
    // mmap through glibc's wrapper and a raw syscall(SYS_mmap): the copy is
    // taken at the system call and unwound through the wrapper.
    let session = record_with(
        "mappings",
        &["--unwind", "dwarf"],
        &["anon 6", "raw 4", "file 3"],
    );
    let report = &session.report;
    let anon = report.stacks_with("mmap-anon", "leak_anon_mapping");
    assert_eq!(anon.len(), 1, "\n{report}");
    assert_eq!(
        (
            stack_int(anon[0], "live_bytes"),
            stack_int(anon[0], "live_allocs")
        ),
        (6 * 256 * 1024, 6),
        "\n{report}"
    );
    // The wrapper is not the innermost frame: its caller is.
    let names = function_names(anon[0]);
    assert!(names[0].contains("leak_anon_mapping"), "{names:?}");
    assert_in_order(anon[0], &["leak_anon_mapping", "main"], report);
    assert_eq!(
        report.live_with("mmap-anon", "raw_syscall_mapping"),
        Live {
            bytes: 4 * 64 * 1024,
            allocs: 4
        },
        "\n{report}"
    );
    assert_eq!(
        report.live_with("mmap-file", "mmap-file").allocs,
        3,
        "\n{report}"
    );
    assert!(report.int("/events/stack_copies") >= 13);
}

#[test]
fn auto_switches_to_dwarf_when_a_library_without_frame_pointers_is_loaded() {
    // plugin_host keeps frame pointers; its plugin, loaded after attach,
    // does not: auto starts copying its stacks when it is mapped.
    harness::require_root();
    let mut host = harness::Fixture::start("plugin_host", &[]);
    let json = harness::json_path("plugin");
    let mut tracer = harness::record_attached(host.pid, &json, &[]);
    assert_eq!(host.cmd("load"), "loaded");
    tracer.wait_stderr(
        "mapped nofp_plugin without frame pointers",
        harness::ATTACH_TIMEOUT,
    );
    let answer = host.cmd("leak 30");
    let output = tracer.stop();
    output.assert_success();
    let report = Report::read(&json);
    assert_eq!(field(&answer, "bytes"), 30 * 555);
    let stacks = report.heap_stacks_with("plugin_inner");
    assert_eq!(stacks.len(), 1, "\n{report}");
    assert_eq!(stack_int(stacks[0], "live_bytes"), 30 * 555);
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
}
