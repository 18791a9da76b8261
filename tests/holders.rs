//! `record --holders` on the holders fixture, with real eBPF: a cache that
//! keeps only its newest entry (every older one definitely lost), a list
//! rooted in a global, and blocks held only through interior pointers.
//! The unreachable bytes are the fixture's own count, exactly; the list's
//! chain to a root ends at its global, named by symbol and module; a C++
//! object on a chain is named by its class, from its vtable.

#[allow(dead_code, reason = "other test files use the rest of the harness")]
mod harness;

use harness::{Fixture, Record, Traced, field};
use serde_json::Value;

fn trace_holders() -> (Traced, [String; 3]) {
    let mut fixture = Fixture::start("holders", &[]);
    let trace = Record::pid(fixture.pid).args(["--holders"]).attach();
    let answers = [
        fixture.cmd("cache 50"),
        fixture.cmd("list 20"),
        fixture.cmd("interior 10"),
    ];
    std::thread::sleep(std::time::Duration::from_millis(600));
    let traced = trace.stop();
    fixture.cmd("quit");
    (traced, answers)
}

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

fn int(value: &Value, key: &str) -> i64 {
    value[key]
        .as_i64()
        .unwrap_or_else(|| panic!("no integer {key} in {value}"))
}

#[test]
fn holders_tell_lost_from_held_and_name_the_roots() {
    let (traced, [cache, list, interior]) = trace_holders();

    // The cache: every entry but the newest is lost, exactly.
    let cached = reachability_of(&traced, "cache_put");
    assert_eq!(
        int(cached, "unreachable_bytes"),
        field(&cache, "lost_bytes"),
        "{cached}"
    );
    assert_eq!(
        int(cached, "unreachable_blocks"),
        field(&cache, "entries") - 1
    );
    assert_eq!(int(cached, "reachable_bytes"), field(&cache, "kept_bytes"));
    assert_eq!(
        cached["held_by"][0]["name"], "g_newest in holders",
        "{cached}"
    );

    // Its site group (what the text report lists by default) carries the
    // same figures.
    let groups: Vec<&Value> = traced.report.json["groups"]
        .as_array()
        .expect("groups in the report")
        .iter()
        .filter(|group| group["kind"] == "heap" && group["site"]["function"] == "cache_put")
        .collect();
    assert_eq!(groups.len(), 1, "one cache_put group:\n{}", traced.report);
    assert_eq!(groups[0]["reachability"], *cached, "{}", groups[0]);

    // The list: all reachable, held by its own nodes and the global, and
    // its chain to a root ends at g_list.
    let listed = reachability_of(&traced, "list_push");
    assert_eq!(int(listed, "unreachable_bytes"), 0, "{listed}");
    assert_eq!(int(listed, "possibly_lost_bytes"), 0, "{listed}");
    assert_eq!(int(listed, "reachable_bytes"), field(&list, "list_bytes"));
    let holders: Vec<(&str, &str, i64)> = listed["held_by"]
        .as_array()
        .unwrap()
        .iter()
        .map(|holder| {
            (
                holder["kind"].as_str().unwrap(),
                holder["name"].as_str().unwrap(),
                int(holder, "blocks"),
            )
        })
        .collect();
    assert_eq!(holders.len(), 2, "{listed}");
    assert_eq!(holders[1], ("global", "g_list in holders", 1), "{listed}");
    assert_eq!(holders[0].0, "block");
    assert!(
        holders[0].1.starts_with("list_push (holders.c:"),
        "{listed}"
    );
    assert_eq!(holders[0].2, 19);
    let path = listed["path_to_root"].as_array().unwrap();
    let root = path.last().expect("a path");
    assert_eq!(root["kind"], "global", "{listed}");
    assert_eq!(root["name"], "g_list in holders");
    assert_eq!(path[0]["kind"], "block");

    // Held only through interior pointers: possibly lost, none unreachable.
    // (A stale copy of the last start pointer may be left on the stack:
    // the scan is conservative, and such a block counts as reachable.)
    let inside = reachability_of(&traced, "interior_keep");
    assert_eq!(int(inside, "unreachable_bytes"), 0, "{inside}");
    assert_eq!(
        int(inside, "possibly_lost_bytes") + int(inside, "reachable_bytes"),
        field(&interior, "inside_bytes")
    );
    assert!(
        int(inside, "possibly_lost_blocks") >= 9,
        "at most the last block is held by a start pointer: {inside}"
    );
    assert_eq!(inside["held_by"][0]["name"], "g_inside in holders");
    assert_eq!(int(&inside["held_by"][0], "blocks"), 10);

    // The text report says the same under each stack, and the scan's cost.
    let text = &traced.output.stdout;
    assert!(
        text.contains("    held by: g_newest in holders (global, 1000 B in 1 block)"),
        "{text}"
    );
    assert!(text.contains("<- g_list in holders\n"), "{text}");
    assert!(text.contains("holders of PID "), "{text}");
    let scans = traced.report.json["holders_scans"].as_array().unwrap();
    assert_eq!(scans.len(), 1);
    assert!(int(&scans[0], "bytes_read") > 0);
    assert_eq!(
        int(&scans[0], "threads_blocked"),
        1,
        "the fixture waits in read()"
    );
}

/// The one heap stack with `function` and without `not`, by frames.
fn stack_with<'a>(traced: &'a Traced, function: &str, not: &str) -> &'a Value {
    let stacks: Vec<&Value> = traced
        .report
        .heap_stacks_with(function)
        .into_iter()
        .filter(|stack| !traced.report.heap_stacks_with(not).contains(stack))
        .collect();
    assert_eq!(
        stacks.len(),
        1,
        "one stack with {function}, without {not}:\n{}",
        traced.report
    );
    stacks[0]
}

#[test]
fn an_unbounded_cpp_map_holds_every_kernel_from_its_global() {
    let mut fixture = Fixture::start("cpp_kernel_cache", &[]);
    let trace = Record::pid(fixture.pid).args(["--holders"]).attach();
    let loaded = fixture.cmd("load 40");
    std::thread::sleep(std::time::Duration::from_millis(600));
    let traced = trace.stop();
    fixture.cmd("quit");

    let code = &stack_with(&traced, "CompileCode", "(none)")["reachability"];
    assert_eq!(int(code, "unreachable_bytes"), 0, "{code}");
    assert_eq!(int(code, "possibly_lost_bytes"), 0, "{code}");
    assert_eq!(int(code, "reachable_bytes"), field(&loaded, "code_bytes"));
    let kernels = &stack_with(&traced, "MakeKernel", "CompileCode")["reachability"];
    assert_eq!(int(kernels, "unreachable_bytes"), 0, "{kernels}");
    assert_eq!(
        int(kernels, "reachable_bytes"),
        field(&loaded, "kernel_bytes")
    );

    // Kernel::code <- Kernel <- hash node(s) <- ... <- the global object.
    let path = code["path_to_root"].as_array().unwrap();
    let names: Vec<&str> = path
        .iter()
        .map(|step| step["name"].as_str().unwrap())
        .collect();
    assert!(path.len() >= 4, "{names:?}");
    assert!(
        names[0].starts_with("CompileCode (cpp_kernel_cache.cpp:"),
        "{names:?}"
    );
    assert!(
        names[1].starts_with("make_unique<(anonymous namespace)::Kernel>"),
        "{names:?}"
    );
    // Kernel is polymorphic: its object is named by its vtable's class;
    // the code buffer (bytes) and the map's nodes have none.
    assert_eq!(
        path[1]["type_name"], "(anonymous namespace)::Kernel",
        "{names:?}"
    );
    assert!(path[0]["type_name"].is_null(), "{:?}", path[0]);
    assert!(
        path[2..].iter().all(|step| step["type_name"].is_null()),
        "{path:?}"
    );
    assert!(
        traced.output.stdout.contains(
            "<- (anonymous namespace)::Kernel from make_unique<(anonymous namespace)::Kernel>"
        ),
        "{}",
        traced.output.stdout
    );
    assert_eq!(
        int(&traced.report.json["holders_scans"][0], "cpp_objects"),
        field(&loaded, "kernels"),
        "one C++ object per kernel"
    );
    assert!(
        path[1..path.len() - 1]
            .iter()
            .all(|step| step["kind"] == "block"),
        "{names:?}"
    );
    let root = path.last().unwrap();
    assert_eq!(root["kind"], "global");
    assert_eq!(
        root["name"],
        "(anonymous namespace)::g_cache in cpp_kernel_cache"
    );
}
