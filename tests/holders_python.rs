//! `record --holders --python-objects` on a Python target, with real eBPF:
//! the finalize-registry leak (tests/fixtures/python/finalize_registry.py,
//! the pattern of iree-turbine issue 281). The leaked numpy copies are all
//! held, and their chain to a root names each Python object on it by its
//! type, read from the running target (`ob_type->tp_name`): the same chain
//! the fixture finds itself and checks with gc.get_referents, `ndarray`,
//! `dict`, `Tracker`, `method`, `_Info` (weakref.finalize's record), up to
//! weakref.finalize's registry, a dict made before tracer attached (an
//! untraced pymalloc object, found from its pool's header), and on to the
//! interpreter's state in the global `_PyRuntime`.

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
    // (untraced: made before attach) last, is the path's typed steps, in
    // order, after the buffer itself (raw float64s, no type).
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
        typed, truth,
        "path: {path:#?}\nthe arrays' holders: {arrays:?}"
    );
    let registry = path
        .iter()
        .rposition(|step| step["type_name"] == "dict")
        .expect("the registry");
    assert_eq!(
        path[registry]["kind"], "untraced",
        "the registry: {path:#?}"
    );
    assert_eq!(path[registry]["name"], "untraced pymalloc memory");
    let root = path.last().unwrap();
    assert_eq!(root["kind"], "global", "{path:#?}");
    assert_eq!(root["name"], "_PyRuntime in libpython3.11.so.1.0");

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

/// Without `--python-objects`, the Python objects on the chain live in
/// pymalloc's arenas, where tracer has no blocks (tests/fixtures/python/
/// atexit_registry.py makes them before tracer attaches): the scan finds
/// them from their pools' headers, names them by type, and the path goes
/// on through them, past the atexit list's own blocks, to the interpreter
/// in the global `_PyRuntime`.
#[test]
fn without_python_objects_the_path_goes_on_through_pymalloc_objects_to_a_global() {
    const SCRIPT: &str = "atexit_registry.py";
    const TRACKERS: i64 = 20;
    assert!(
        std::path::Path::new(LIBPYTHON).exists(),
        "{LIBPYTHON} is missing: run `cargo xtask setup`"
    );
    let script = workspace_root().join("tests/fixtures/python").join(SCRIPT);
    let copy_line = harness::marked_line(&script, "# COPY-SITE");
    let mut command = Command::new(fixture("embed_script"));
    command.arg(&script);
    let mut fixture = Fixture::start_command(command);
    fixture.cmd(&format!("prepare {TRACKERS}"));
    let trace = Record::pid(fixture.pid).args(["--holders"]).attach();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let answer = fixture.cmd("leak");
    std::thread::sleep(std::time::Duration::from_millis(600));
    let traced = trace.stop();
    fixture.cmd("quit");

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
        int(reachability, "reachable_bytes"),
        field(&answer, "copies_bytes"),
        "every copy is held: {reachability}"
    );
    assert_eq!(int(reachability, "reachable_blocks"), TRACKERS);

    // The fixture's own chain (ndarray, dict, Tracker, method) is the
    // path's typed steps, in order, after the buffer; every step after the
    // buffer is an untraced pymalloc block, and the root is a global.
    let truth: Vec<&str> = answer
        .split_whitespace()
        .find_map(|word| word.strip_prefix("chain="))
        .expect("chain= in the answer")
        .split(',')
        .collect();
    let path = reachability["path_to_root"].as_array().expect("a path");
    let typed: Vec<&str> = path
        .iter()
        .filter_map(|step| step["type_name"].as_str())
        .map(|name| name.rsplit('.').next().unwrap_or(name))
        .collect();
    assert_eq!(typed, truth, "path: {path:#?}");
    let (root, steps) = path.split_last().expect("a root");
    for step in &steps[1..] {
        assert_eq!(step["kind"], "untraced", "{step}");
        assert_eq!(step["name"], "untraced pymalloc memory", "{step}");
    }
    assert_eq!(root["kind"], "global", "{path:#?}");
    assert_eq!(root["name"], "_PyRuntime in libpython3.11.so.1.0");
    // The atexit list's own blocks (its array and a callback record, no
    // Python objects) lie between the method and the interpreter.
    let method = steps
        .iter()
        .position(|step| step["type_name"] == "method")
        .expect("the method");
    assert_eq!(steps.len() - method, 3, "{path:#?}");

    let held_by = reachability["held_by"].as_array().expect("holders");
    assert_eq!(
        held_by[0]["name"], "numpy.ndarray in untraced pymalloc memory",
        "{held_by:?}"
    );
    assert_eq!(int(&held_by[0], "blocks"), TRACKERS);
    let text = &traced.output.stdout;
    assert!(
        text.contains("<- dict from untraced pymalloc memory <- Tracker from untraced pymalloc memory <- method from untraced pymalloc memory <- untraced pymalloc memory x2 <- _PyRuntime in libpython3.11.so.1.0"),
        "{text}"
    );
    let scan = &traced.report.json["holders_scans"][0];
    assert!(int(scan, "untraced_pools") > 0, "{scan}");
    assert!(int(scan, "untraced_objects") > 10_000, "{scan}");
    assert_eq!(int(scan, "untraced_objects_left_out"), 0, "{scan}");
    assert!(
        int(scan, "python_objects") > 10_000,
        "named by type: {scan}"
    );
}
