//! `record --holders` with the heap as glibc's malloc sees it, with real
//! eBPF: free chunks hold nothing (a C program whose frees leave stale
//! pointers to its lost blocks in freed memory still has exactly its lost
//! bytes unreachable), and the chunks made before tracer attached are nodes
//! of the graph and counted by type (a C++ program's objects by the class
//! of their vtable, their buffers as the objects' data), each type with the
//! root that holds it.

use crate::harness;

use harness::{Fixture, Record, Traced, field, stack_int as int};
use serde_json::Value;

/// Entries the steady test makes before tracer attaches, and after.
const STEADY_BEFORE: i64 = 100;
const STEADY_AFTER: i64 = 300;
const STEADY_BYTES: i64 = 512;

/// The reachability of the one heap stack whose site is `function`.
fn reachability_of<'a>(traced: &'a Traced, function: &str) -> &'a Value {
    let stacks: Vec<&Value> = traced
        .report
        .stacks()
        .iter()
        .filter(|stack| stack["kind"] == "heap" && stack["site"]["function"] == function)
        .collect();
    assert_eq!(stacks.len(), 1, "one {function} stack:\n{}", traced.report);
    let reachability = &stacks[0]["reachability"];
    assert!(reachability.is_object(), "{function}: {}", stacks[0]);
    reachability
}

/// The one scan of the report.
fn the_scan(traced: &Traced) -> &Value {
    let scans = traced.report.json["holders_scans"]
        .as_array()
        .expect("holders_scans");
    assert_eq!(scans.len(), 1, "{}", traced.report);
    &scans[0]
}

#[test]
fn stale_pointers_in_freed_chunks_hold_nothing() {
    let mut fixture = Fixture::start("holders", &[]);
    fixture.cmd(&format!("steady {STEADY_BEFORE}"));
    let trace = Record::pid(fixture.pid).args(["--holders"]).attach();
    let answer = fixture.cmd(&format!("steady {STEADY_AFTER}"));
    std::thread::sleep(std::time::Duration::from_millis(600));
    let traced = trace.stop();
    fixture.cmd("quit");
    assert_eq!(
        field(&answer, "entries"),
        STEADY_BEFORE + STEADY_AFTER,
        "{answer}"
    );

    // Of the entries made since attach, all but the newest are lost,
    // exactly: the freed scratch blocks' pointers to them (and 64 bytes
    // into them) are no references.
    let steady = reachability_of(&traced, "steady_put");
    assert_eq!(
        int(steady, "unreachable_bytes"),
        (STEADY_AFTER - 1) * STEADY_BYTES,
        "{steady}"
    );
    assert_eq!(int(steady, "unreachable_blocks"), STEADY_AFTER - 1);
    assert_eq!(int(steady, "possibly_lost_bytes"), 0, "{steady}");
    assert_eq!(int(steady, "reachable_bytes"), field(&answer, "kept_bytes"));
    // The newest is held by its global (and maybe a stale copy on the
    // stack); no holder is untraced memory.
    let holders = steady["held_by"].as_array().expect("held_by");
    assert!(
        holders
            .iter()
            .any(|holder| holder["name"] == "g_steady in holders"),
        "{steady}"
    );
    assert!(
        holders.iter().all(|holder| holder["kind"] != "untraced"),
        "{steady}"
    );

    let scan = the_scan(&traced);
    let heap = &scan["heap"];
    assert!(
        heap["allocator"]
            .as_str()
            .is_some_and(|allocator| allocator.starts_with("glibc 2.")),
        "{heap}"
    );
    assert!(heap.get("not_parsed").is_none(), "{heap}");
    assert!(int(heap, "free_chunks") > 0, "{heap}");
    assert!(
        int(scan, "free_words") >= STEADY_AFTER,
        "the stale pointers were there, and left out: {scan}"
    );
    // The entries made before attach are chunks tracer has no block for:
    // in the census, untyped, and nothing holds them.
    let census = &scan["before_attach"];
    let untyped = census["by_type"]
        .as_array()
        .expect("by_type")
        .iter()
        .find(|row| row["type"] == "untyped")
        .unwrap_or_else(|| panic!("no untyped row: {census}"));
    assert!(
        int(untyped, "bytes") >= STEADY_BEFORE * STEADY_BYTES,
        "{census}"
    );
    assert_eq!(untyped["root"], "unreachable", "{census}");
    let text = &traced.output.stdout;
    assert!(text.contains("before attach (PID "), "{text}");
}

/// The census row of `type_name`.
fn census_row<'a>(scan: &'a Value, type_name: &str) -> &'a Value {
    scan["before_attach"]["by_type"]
        .as_array()
        .expect("by_type")
        .iter()
        .find(|row| row["type"] == type_name)
        .unwrap_or_else(|| panic!("no {type_name} in {}", scan["before_attach"]))
}

/// The C++ kernel cache with `before` kernels loaded before `record
/// --holders` (and `args`) attaches and `after` loaded after: its two
/// answers, and the trace.
fn kernel_cache_traced(before: i64, after: i64, args: &[&str]) -> (String, String, Traced) {
    let mut fixture = Fixture::start("cpp_kernel_cache", &[]);
    let loaded_before = fixture.cmd(&format!("load {before}"));
    let trace = Record::pid(fixture.pid)
        .args(["--holders"])
        .args(args.iter().copied())
        .attach();
    let loaded = fixture.cmd(&format!("load {after}"));
    std::thread::sleep(std::time::Duration::from_millis(600));
    let traced = trace.stop();
    fixture.cmd("quit");
    (loaded_before, loaded, traced)
}

#[test]
fn cpp_objects_made_before_attach_are_counted_by_class_and_held_from_the_global() {
    const BEFORE: i64 = 40;
    let (loaded_before, loaded, traced) = kernel_cache_traced(BEFORE, 10, &[]);

    // Kernel objects (24 bytes: vtable, key, code) by their vtable's
    // class; their code buffers (3000 bytes) as the kernels' data; both
    // held from the cache's global.
    let scan = the_scan(&traced);
    let per_kernel = field(&loaded_before, "kernel_bytes") / BEFORE;
    let kernels = census_row(scan, "(anonymous namespace)::Kernel");
    assert_eq!(int(kernels, "blocks"), BEFORE, "{kernels}");
    assert_eq!(int(kernels, "bytes"), BEFORE * per_kernel, "{kernels}");
    assert_eq!(
        kernels["root"], "(anonymous namespace)::g_cache in cpp_kernel_cache",
        "{kernels}"
    );
    let code = census_row(scan, "data of (anonymous namespace)::Kernel");
    assert_eq!(int(code, "blocks"), BEFORE, "{code}");
    assert_eq!(
        int(code, "bytes"),
        field(&loaded_before, "code_bytes"),
        "{code}"
    );
    assert_eq!(code["root"], kernels["root"], "{code}");

    // The kernels made since attach: still all reachable, their chain
    // through the map's nodes (made before attach or not) to the global.
    let stacks = traced.report.heap_stacks_with("CompileCode");
    assert_eq!(stacks.len(), 1, "{}", traced.report);
    let reachability = &stacks[0]["reachability"];
    assert_eq!(int(reachability, "unreachable_bytes"), 0, "{reachability}");
    assert_eq!(
        int(reachability, "reachable_bytes"),
        field(&loaded, "code_bytes") - field(&loaded_before, "code_bytes"),
        "{reachability}"
    );
    let root = reachability["path_to_root"]
        .as_array()
        .and_then(|path| path.last())
        .expect("a path");
    assert_eq!(
        root["name"], "(anonymous namespace)::g_cache in cpp_kernel_cache",
        "{reachability}"
    );
    let text = &traced.output.stdout;
    assert!(
        text.contains("B in 40 blocks: (anonymous namespace)::Kernel, held from (anonymous namespace)::g_cache in cpp_kernel_cache"),
        "{text}"
    );
}

#[test]
fn blocks_outside_the_size_filters_are_not_counted_as_made_before_attach() {
    // Kernel objects and the map's nodes (24 bytes) are below --min-size:
    // those made after attach are no more recorded than those before, so
    // the census counts them apart, not as memory made before attach.
    const BEFORE: i64 = 40;
    const AFTER: i64 = 10;
    let (loaded_before, loaded, traced) =
        kernel_cache_traced(BEFORE, AFTER, &["--min-size", "100"]);

    let scan = the_scan(&traced);
    let census = &scan["before_attach"];
    let rows = census["by_type"].as_array().expect("by_type");
    assert!(
        rows.iter()
            .all(|row| row["type"] != "(anonymous namespace)::Kernel"),
        "Kernel objects are below --min-size: {census}"
    );
    let outside = &census["outside_size_filters"];
    let kernel_bytes = field(&loaded, "kernel_bytes");
    assert!(
        int(outside, "blocks") >= BEFORE + AFTER,
        "every Kernel object, before attach and after: {census}"
    );
    assert!(int(outside, "bytes") >= kernel_bytes, "{census}");
    // Their code buffers (3000 bytes) are within the filters: those made
    // before attach are counted, named after the Kernel objects.
    let code = census_row(scan, "data of (anonymous namespace)::Kernel");
    assert_eq!(int(code, "blocks"), BEFORE, "{code}");
    assert_eq!(
        int(code, "bytes"),
        field(&loaded_before, "code_bytes"),
        "{code}"
    );
    assert_eq!(census["or_unrecorded"], serde_json::json!([]), "{census}");
    let text = &traced.output.stdout;
    assert!(text.contains("before attach (PID "), "{text}");
    assert!(
        text.contains("outside --min-size/--max-size (PID "),
        "{text}"
    );
}
