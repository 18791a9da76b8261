//! `record --holders --python-objects` on a Python target, with real eBPF:
//! the finalize-registry leak (tests/fixtures/python/finalize_registry.py,
//! the pattern of iree-turbine issue 281). The leaked numpy copies are all
//! held, and their chain to a root names each Python object on it by its
//! type, read from the running target (`ob_type->tp_name`): the same chain
//! the fixture finds itself and checks with gc.get_referents, `ndarray`,
//! `dict`, `Tracker`, `method`, `_Info` (weakref.finalize's record), up to
//! weakref.finalize's registry, a dict made before tracer attached.

#[allow(dead_code, reason = "other test files use the rest of the harness")]
mod harness;

use std::process::Command;

use harness::{Fixture, Record, field, fixture, stack_int as int, workspace_root};
use serde_json::Value;

const LIBPYTHON: &str = "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0";
const SCRIPT: &str = "finalize_registry.py";
const TRACKERS: i64 = 20;

#[test]
fn the_path_from_a_leaked_numpy_copy_names_the_finalize_chain_by_type() {
    assert!(
        std::path::Path::new(LIBPYTHON).exists(),
        "{LIBPYTHON} is missing: run `cargo xtask setup`"
    );
    let script = workspace_root().join("tests/fixtures/python").join(SCRIPT);
    let copy_line = harness::marked_line(&script, "# COPY-SITE");
    let mut command = Command::new(fixture("embed_script"));
    command.arg(&script);
    let mut fixture = Fixture::start_command(command);
    let trace = Record::pid(fixture.pid)
        .args(["--holders", "--python-objects"])
        .attach();
    // The unwind tables of numpy's objects are built after attach: a stack
    // taken before would be one of its own.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let answer = fixture.cmd(&format!("leak {TRACKERS}"));
    std::thread::sleep(std::time::Duration::from_millis(600));
    let traced = trace.stop();
    fixture.cmd("quit");

    // The copies' buffers: heap blocks (numpy mallocs them) whose innermost
    // Python frame is the copy's line.
    let copies: Vec<&Value> = traced
        .report
        .stacks()
        .iter()
        .filter(|stack| {
            stack["kind"] == "heap"
                && harness::python_frames(stack).first().map(|frame| frame.2) == Some(copy_line)
        })
        .collect();
    assert_eq!(copies.len(), 1, "one copy stack:\n{}", traced.report);
    let reachability = &copies[0]["reachability"];
    assert_eq!(int(reachability, "unreachable_bytes"), 0, "{reachability}");
    assert_eq!(
        int(reachability, "reachable_bytes") + int(reachability, "possibly_lost_bytes"),
        field(&answer, "copies_bytes"),
        "every copy is held: {reachability}"
    );

    // The fixture's own chain, the copy's array first and the registry
    // (untraced: made before attach) last; the path's typed steps are the
    // rest, in order, after the buffer itself (raw float64s, no type).
    let truth: Vec<&str> = answer
        .split_whitespace()
        .find_map(|word| word.strip_prefix("chain="))
        .expect("chain= in the answer")
        .split(',')
        .collect();
    assert_eq!(truth.last(), Some(&"dict"), "{answer}");
    let path = reachability["path_to_root"].as_array().expect("a path");
    assert!(path[0]["type_name"].is_null(), "the buffer: {}", path[0]);
    let typed: Vec<&str> = path
        .iter()
        .filter_map(|step| step["type_name"].as_str())
        // numpy's static type is named with its module, as in tp_name.
        .map(|name| name.rsplit('.').next().unwrap_or(name))
        .collect();
    // What held the copies' arrays, for a failure's message.
    let arrays: Vec<&Value> = traced
        .report
        .stacks()
        .iter()
        .filter(|stack| {
            stack["kind"] == "python-object"
                && harness::python_frames(stack).first().map(|frame| frame.2) == Some(copy_line)
        })
        .map(|stack| &stack["reachability"]["held_by"])
        .collect();
    assert_eq!(
        typed,
        truth[..truth.len() - 1],
        "path: {path:?}\nthe arrays' holders: {arrays:?}"
    );
    let root = path.last().unwrap();
    assert_eq!(root["kind"], "untraced", "the registry: {root}");

    // The text report prints the types on the path, and what the scan
    // named and left out.
    let text = &traced.output.stdout;
    assert!(
        text.contains("<- numpy.ndarray from Tracker.track (finalize_registry.py:"),
        "{text}"
    );
    assert!(text.contains("<- _Info from "), "{text}");
    let scan = &traced.report.json["holders_scans"][0];
    assert!(int(scan, "python_objects") >= 5 * TRACKERS, "{scan}");
    assert!(int(scan, "gc_links") > 0, "{scan}");
}
