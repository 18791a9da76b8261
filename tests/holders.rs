//! `record --holders` on the holders fixture, with real eBPF: a cache that
//! keeps only its newest entry (every older one definitely lost), a list
//! rooted in a global, and blocks held only through interior pointers.
//! The unreachable bytes are the fixture's own count, exactly; the list's
//! chain to a root ends at its global, named by symbol and module; a C++
//! object on a chain is named by its class, from its vtable. A Rust
//! program's blocks held by a `static` end at its demangled name.

use crate::harness;

use harness::{
    Fixture, Record, Traced, field,
    redis::{RedisServer, pipeline, resp, set_keys},
    stack_int as int,
};
use serde_json::Value;

fn trace_holders() -> (Traced, [String; 3]) {
    trace_holders_with(&[], 50)
}

/// [`trace_holders`] with more environment variables (`LD_PRELOAD`) and
/// `entries` cache entries.
fn trace_holders_with(env: &[(&str, &str)], entries: usize) -> (Traced, [String; 3]) {
    let mut fixture = Fixture::start_with_env("holders", &[], env);
    let trace = Record::pid(fixture.pid).args(["--holders"]).attach();
    let answers = [
        fixture.cmd(&format!("cache {entries}")),
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
    // Once every table is in: operator new has no probe of its own, and
    // a stack walked from malloc by frame pointers before libstdc++'s
    // table is ready loses its C++ frames.
    let mut trace = Record::pid(fixture.pid).args(["--holders", "-v"]).attach();
    trace.wait_tables_ready();
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
    // Kernel is polymorphic: its object is named by its vtable's class,
    // the code buffer (bytes) as its data; the map's nodes have none.
    assert_eq!(
        path[1]["type_name"], "(anonymous namespace)::Kernel",
        "{names:?}"
    );
    assert_eq!(
        path[0]["type_name"], "data of (anonymous namespace)::Kernel",
        "{:?}",
        path[0]
    );
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
    // The hash nodes and bucket arrays are labelled at the container code
    // that asked, not at the standard allocator's `allocate`.
    assert!(
        names
            .iter()
            .all(|name| !name.contains("allocate (") && !name.contains("allocator<")),
        "{names:?}"
    );
    let root = path.last().unwrap();
    assert_eq!(root["kind"], "global");
    assert_eq!(
        root["name"],
        "(anonymous namespace)::g_cache in cpp_kernel_cache"
    );
}

/// The allocators Debian ships besides glibc's, preloaded as in
/// allocators.rs: tracer knows the blocks from its probes, not from the
/// allocator's internals.
const ALLOCATORS: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
];

/// The most blocks of one size class jemalloc 5.3's thread cache fills at
/// once (half its 200 slots at most): the stale copies it keeps of the
/// pointers it handed out since.
const JEMALLOC_STALE_SLOTS: i64 = 100;

/// The bytes and blocks of `reachability` held by untraced memory.
fn held_by_untraced(reachability: &Value) -> (i64, i64) {
    reachability["held_by"]
        .as_array()
        .expect("held_by")
        .iter()
        .filter(|holder| holder["kind"] == "untraced")
        .fold((0, 0), |(bytes, blocks), holder| {
            (bytes + int(holder, "bytes"), blocks + int(holder, "blocks"))
        })
}

#[test]
fn holders_are_exact_under_tcmalloc_and_mimalloc_and_bounded_under_jemalloc() {
    harness::require_root();
    for library in ALLOCATORS {
        assert!(
            std::path::Path::new(library).is_file(),
            "{library} is missing: run `cargo xtask setup`"
        );
        let (traced, [cache, list, interior]) = trace_holders_with(&[("LD_PRELOAD", library)], 300);
        let cached = reachability_of(&traced, "cache_put");
        let lost = field(&cache, "lost_bytes");
        let (stale_bytes, stale_blocks) = held_by_untraced(cached);
        assert_eq!(
            int(cached, "unreachable_bytes") + int(cached, "reachable_bytes"),
            lost + field(&cache, "kept_bytes"),
            "{library}: {cached}"
        );
        if library.contains("jemalloc") {
            // jemalloc's thread cache (its own memory, untraced) keeps a
            // copy of each pointer it filled the cache with and handed
            // out since: those lost blocks are held by untraced memory,
            // and only those.
            assert!(
                int(cached, "reachable_blocks") - 1 <= stale_blocks
                    && stale_blocks <= JEMALLOC_STALE_SLOTS,
                "{library}: {cached}"
            );
            assert!(stale_bytes > 0, "{library}: {cached}");
        } else {
            assert_eq!(
                int(cached, "unreachable_bytes"),
                lost,
                "{library}: {cached}"
            );
            assert_eq!(
                int(cached, "unreachable_blocks"),
                field(&cache, "entries") - 1,
                "{library}: {cached}"
            );
            assert_eq!(stale_blocks, 0, "{library}: {cached}");
        }
        assert!(
            cached["held_by"]
                .as_array()
                .expect("held_by")
                .iter()
                .any(|holder| holder["name"] == "g_newest in holders"
                    && int(holder, "blocks") == 1),
            "{library}: {cached}"
        );
        let listed = reachability_of(&traced, "list_push");
        assert_eq!(int(listed, "unreachable_bytes"), 0, "{library}: {listed}");
        assert_eq!(
            int(listed, "reachable_bytes"),
            field(&list, "list_bytes"),
            "{library}: {listed}"
        );
        let root = listed["path_to_root"]
            .as_array()
            .and_then(|path| path.last());
        assert_eq!(
            root.map(|root| &root["name"]),
            Some(&Value::from("g_list in holders")),
            "{library}: {listed}"
        );
        let inside = reachability_of(&traced, "interior_keep");
        assert_eq!(int(inside, "unreachable_bytes"), 0, "{library}: {inside}");
        assert_eq!(
            int(inside, "possibly_lost_bytes") + int(inside, "reachable_bytes"),
            field(&interior, "inside_bytes"),
            "{library}: {inside}"
        );
    }
}

/// Keys the redis test sets, in pipelined batches of [`REDIS_BATCH`].
const REDIS_KEYS: usize = 1000;
const REDIS_BATCH: usize = 50;

/// The heap stacks whose frames contain every one of `functions`.
fn stacks_through<'a>(traced: &'a Traced, functions: &[&str]) -> Vec<&'a Value> {
    traced
        .report
        .stacks()
        .iter()
        .filter(|stack| stack["kind"] == "heap")
        .filter(|stack| functions.iter().all(|f| harness::frames_contain(stack, f)))
        .collect()
}

#[test]
fn redis_values_are_reachable_and_held_by_its_dict_entries() {
    harness::require_root();
    let server = RedisServer::start();
    let mut client = server.connect().expect("redis listens");
    assert_eq!(pipeline(&mut client, &resp(&["PING"]), 1), "+PONG\r\n");
    // Once every table is in: redis' zmalloc path is walked through
    // code without frame pointers.
    let mut trace = Record::pid(server.child.id())
        .args(["--holders", "-v"])
        .attach();
    trace.wait_tables_ready();
    set_keys(&mut client, REDIS_KEYS, REDIS_BATCH);
    assert_eq!(
        pipeline(&mut client, &resp(&["DBSIZE"]), 1),
        format!(":{REDIS_KEYS}\r\n")
    );
    std::thread::sleep(std::time::Duration::from_millis(600));
    let traced = trace.stop();

    // The values (an embedded string each: robj and sds in one block):
    // every one reachable, held by the dict entries redis' dictAddRaw
    // allocated, one entry per value.
    let values = stacks_through(
        &traced,
        &["createEmbeddedStringObject", "processMultibulkBuffer"],
    );
    let sum = |stacks: &[&Value], key: &str| -> i64 {
        stacks
            .iter()
            .map(|stack| int(&stack["reachability"], key))
            .sum()
    };
    let live_allocs: i64 = values
        .iter()
        .map(|stack| harness::stack_int(stack, "live_allocs"))
        .sum();
    assert_eq!(live_allocs, REDIS_KEYS as i64, "\n{}", traced.report);
    assert_eq!(sum(&values, "unreachable_bytes"), 0, "\n{}", traced.report);
    assert_eq!(
        sum(&values, "possibly_lost_bytes"),
        0,
        "\n{}",
        traced.report
    );
    assert_eq!(sum(&values, "reachable_blocks"), REDIS_KEYS as i64);
    let held_by_entries: i64 = values
        .iter()
        .flat_map(|stack| {
            stack["reachability"]["held_by"]
                .as_array()
                .expect("held_by")
        })
        .filter(|holder| {
            holder["kind"] == "block"
                && holder["name"]
                    .as_str()
                    .is_some_and(|name| name.starts_with("dictAddRaw"))
        })
        .map(|holder| int(holder, "blocks"))
        .sum();
    assert_eq!(held_by_entries, REDIS_KEYS as i64, "\n{}", traced.report);

    // The entries themselves: reachable from the dict's table.
    let entries: Vec<&Value> = stacks_through(&traced, &["dictAddRaw", "dbAdd"])
        .into_iter()
        .filter(|stack| !harness::frames_contain(stack, "_dictExpand"))
        .collect();
    assert_eq!(sum(&entries, "unreachable_bytes"), 0, "\n{}", traced.report);
    assert_eq!(
        sum(&entries, "reachable_blocks") + sum(&entries, "possibly_lost_blocks"),
        REDIS_KEYS as i64,
        "\n{}",
        traced.report
    );

    // A stack counted in its own entry and in its site group (with other
    // stacks) gets its blocks in both: each group's figures cover every
    // live block of its stacks.
    let ids: Vec<i64> = values
        .iter()
        .chain(&entries)
        .map(|stack| harness::stack_int(stack, "stack_id"))
        .collect();
    let groups = traced.report.json["groups"].as_array().expect("groups");
    for group in groups.iter().filter(|group| {
        group["stack_ids"].as_array().is_some_and(|members| {
            members
                .iter()
                .any(|id| ids.contains(&id.as_i64().unwrap_or(-1)))
        })
    }) {
        let reachability = &group["reachability"];
        assert_eq!(
            int(reachability, "reachable_blocks")
                + int(reachability, "possibly_lost_blocks")
                + int(reachability, "unreachable_blocks"),
            harness::stack_int(group, "live_allocs"),
            "{group}"
        );
    }
    let text = &traced.output.stdout;
    assert!(text.contains("held by: dictAddRaw"), "{text}");
}

/// A Rust release build (tests/fixtures/rust_leak, `cache K`): the blocks
/// kept in `static CACHE: Mutex<Vec<Vec<u8>>>` are all held, their path
/// ends at the static's demangled name in the fixture's module; of the
/// boxes whose pointer the next one overwrites in a static, all but the
/// last are lost, exactly.
#[test]
fn a_rust_static_holds_its_cache_and_overwritten_boxes_are_lost() {
    const ROUNDS: i64 = 30;
    let mut fixture = Fixture::start("rust_leak", &[]);
    let trace = Record::pid(fixture.pid).args(["--holders"]).attach();
    let answer = fixture.cmd(&format!("cache {ROUNDS}"));
    std::thread::sleep(std::time::Duration::from_millis(600));
    let traced = trace.stop();
    fixture.cmd("quit");

    // The heap stack through all of `functions` (cache_put's own block,
    // not the cache's buffer that its push grows).
    let through = |functions: &[&str]| {
        let stacks: Vec<&Value> = traced
            .report
            .heap_stacks_with(functions[0])
            .into_iter()
            .filter(|stack| {
                functions
                    .iter()
                    .all(|function| harness::frames_contain(stack, function))
            })
            .collect();
        assert_eq!(
            stacks.len(),
            1,
            "one {functions:?} stack:\n{}",
            traced.report
        );
        &stacks[0]["reachability"]
    };
    let cached = through(&["rust_leak::cache_put", "with_capacity"]);
    assert_eq!(int(cached, "unreachable_bytes"), 0, "{cached}");
    assert_eq!(int(cached, "possibly_lost_bytes"), 0, "{cached}");
    assert_eq!(
        int(cached, "reachable_bytes"),
        field(&answer, "cached_bytes"),
        "{cached}"
    );
    assert_eq!(int(cached, "reachable_blocks"), field(&answer, "cached"));
    let path = cached["path_to_root"].as_array().expect("a path");
    let root = path.last().expect("a root");
    assert_eq!(root["kind"], "global", "{cached}");
    assert_eq!(root["name"], "rust_leak::CACHE in rust_leak", "{cached}");
    // The cached block, then the cache's own buffer of Vec headers.
    assert_eq!(path.len(), 3, "{cached}");

    let boxes = through(&["rust_leak::lose_box"]);
    assert_eq!(
        int(boxes, "unreachable_bytes"),
        field(&answer, "lost_bytes"),
        "{boxes}"
    );
    assert_eq!(
        int(boxes, "unreachable_blocks"),
        field(&answer, "lost_boxes"),
        "{boxes}"
    );
    assert_eq!(int(boxes, "reachable_blocks"), 1, "the last box: {boxes}");
    let root = boxes["path_to_root"]
        .as_array()
        .and_then(|path| path.last())
        .expect("a path");
    assert_eq!(root["kind"], "global", "{boxes}");
    assert_eq!(root["name"], "rust_leak::LAST_BOX in rust_leak", "{boxes}");
    assert!(field(&answer, "last_seed") >= 0, "{answer}");
}
