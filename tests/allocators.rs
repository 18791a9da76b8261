//! tracer on the allocators Debian ships besides glibc's, and on a real
//! server: jemalloc, tcmalloc and mimalloc preloaded into the leak fixture
//! (exact figures, every call counted once, and no probe of the allocator
//! on a single-stepped instruction), and Debian's redis-server (linked
//! with jemalloc) growing its keyspace while tracer is attached.

use crate::harness;

use std::time::{Duration, Instant};

use harness::{
    CHURN_ALLOCS_PER_ROUND, Fixture, LEAK_SIZE_BYTES, Live, Report, assert_took_under, churn_held,
    field, frames_contain, json_path, record_attached, record_in,
    redis::{RedisServer, pipeline, resp, set_keys},
    require_root, sum_live,
};
use serde_json::Value;

const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
const TCMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4";
const MIMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2";

/// The functions every allocator must have a probe on in its own library.
const HOT: [&str; 4] = ["malloc", "calloc", "realloc", "free"];

/// The probes tracer put in `library` (a path whose file name may carry a
/// longer version: libmimalloc.so.2 is libmimalloc.so.2.0).
fn probes_in<'a>(report: &'a Report, library: &str) -> Vec<&'a Value> {
    let file_name = library.rsplit('/').next().expect("a path");
    report
        .json
        .get("probes")
        .and_then(Value::as_array)
        .expect("the report lists its probes")
        .iter()
        .filter(|probe| {
            probe["module"]
                .as_str()
                .and_then(|module| module.rsplit('/').next())
                .is_some_and(|module| module.starts_with(file_name))
        })
        .collect()
}

/// leaky with `library` preloaded, traced through `leak 50` and
/// `churn 20`: the leak exact and named, every allocation counted once,
/// the churn freed, no free seen twice, and every probe in the allocator
/// at an emulated instruction.
fn exact_under(library: &str) {
    require_root();
    assert!(
        std::path::Path::new(library).is_file(),
        "{library} is missing: run `cargo xtask setup`"
    );
    let fixture = Fixture::start_with_env("leaky", &[], &[("LD_PRELOAD", library)]);
    let session = record_in(fixture, &[], &["leak 50", "churn 20"]);
    let report = &session.report;

    assert_eq!(field(&session.answers[0], "bytes"), 50 * LEAK_SIZE_BYTES);
    let top = report.stacks().first().expect("the report has no stacks");
    assert!(frames_contain(top, "leak_here"), "\n{report}");
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live {
            bytes: 50 * LEAK_SIZE_BYTES,
            allocs: 50
        },
        "\n{report}"
    );
    assert_eq!(
        report.int("/events/allocs"),
        50 + 20 * CHURN_ALLOCS_PER_ROUND,
        "every allocator call counted once, whichever layer it passed:\n{}",
        report.json
    );
    assert_eq!(
        report.int("/events/frees_unknown"),
        0,
        "no free seen twice (a forwarder and its target):\n{}",
        report.json
    );
    let keep = report.heap_live_with("churn_keep");
    assert_eq!(
        keep.bytes,
        field(&session.answers[1], "churn_keep"),
        "\n{report}"
    );
    harness::assert_churn_frees_everything(report);
    // What is left is the leak and what churn keeps: nothing vanished.
    assert_eq!(
        report.total("heap"),
        Live::blocks(50, LEAK_SIZE_BYTES) + churn_held(&session.answers[1]),
        "\n{report}"
    );

    let probes = probes_in(report, library);
    for function in HOT {
        assert!(
            probes.iter().any(|probe| probe["symbol"] == function),
            "no probe on {function} in {library}: {probes:#?}"
        );
    }
    let stepped: Vec<&&Value> = probes
        .iter()
        .filter(|probe| probe["single_stepped"] != false)
        .collect();
    assert!(
        stepped.is_empty(),
        "probes in {library} at single-stepped instructions: {stepped:#?}"
    );
}

#[test]
fn jemalloc_preloaded_is_exact_and_never_single_stepped() {
    exact_under(JEMALLOC);
}

#[test]
fn tcmalloc_preloaded_is_exact_and_never_single_stepped() {
    exact_under(TCMALLOC);
}

#[test]
fn mimalloc_preloaded_is_exact_and_never_single_stepped() {
    // mimalloc's malloc, calloc and realloc move their arguments before
    // the first emulated instruction: the probes read them from the copies.
    exact_under(MIMALLOC);
}

/// Keys the redis test writes.
const REDIS_KEYS: usize = 2000;
/// SETs sent at once.
const REDIS_BATCH: usize = 50;
/// `sizeof(dictEntry)` in redis 7.0: one per key.
const DICT_ENTRY_BYTES: i64 = 24;

/// The live blocks of the stacks that contain every one of `functions`
/// and none of `excluded`.
fn live_under(report: &Report, functions: &[&str], excluded: &[&str]) -> Live {
    let stacks: Vec<&Value> = report
        .stacks()
        .iter()
        .filter(|stack| stack["kind"] == "heap")
        .filter(|stack| functions.iter().all(|f| frames_contain(stack, f)))
        .filter(|stack| !excluded.iter().any(|f| frames_contain(stack, f)))
        .collect();
    sum_live(&stacks)
}

#[test]
fn redis_keyspace_growth_is_counted_under_redis_frames() {
    require_root();
    let server = RedisServer::start();
    let mut client = server.connect().expect("redis listens");
    assert_eq!(pipeline(&mut client, &resp(&["PING"]), 1), "+PONG\r\n");
    let json = json_path("redis");
    let mut tracer = record_attached(server.child.id(), &json, &["-v"]);
    // redis has no frame pointers: a SET before its unwind table is in
    // the kernel is walked by frame pointers and loses the redis frames.
    tracer.wait_tables_ready();

    // In pipelined batches, as a busy client would: each SET copies ~6
    // stacks for DWARF unwinding (redis has no frame pointers), and a
    // burst of all of them at once overflows the copy ring (counted).
    set_keys(&mut client, REDIS_KEYS, REDIS_BATCH);
    let started = Instant::now();
    assert_eq!(
        pipeline(&mut client, &resp(&["DBSIZE"]), 1),
        format!(":{REDIS_KEYS}\r\n")
    );
    // Not stalled by the probes (single-stepped ones would take seconds).
    assert_took_under(
        "redis' DBSIZE answer with tracer attached",
        started.elapsed(),
        Duration::from_secs(5),
        &"(redis)",
    );
    let output = tracer.stop();
    output.assert_success();
    let report = Report::read_checked(&json);
    report.assert_no_drops();

    // One dictEntry per new key, allocated in dictAddRaw (the table
    // itself grows in _dictExpand, under dictAddRaw too).
    assert_eq!(
        live_under(&report, &["dictAddRaw", "dbAdd"], &["dictExpand"]),
        Live {
            bytes: REDIS_KEYS as i64 * DICT_ENTRY_BYTES,
            allocs: REDIS_KEYS as i64
        },
        "\n{report}"
    );
    // One value object per key (an embedded string: robj and sds in one
    // block) and one copy of each key's name.
    let values = live_under(
        &report,
        &["createEmbeddedStringObject", "processMultibulkBuffer"],
        &[],
    );
    let key_names = live_under(&report, &["sdsnewlen", "dbAdd"], &["dictAddRaw"]);
    assert_eq!(values.allocs, REDIS_KEYS as i64, "\n{report}");
    assert_eq!(key_names.allocs, REDIS_KEYS as i64, "\n{report}");
}
