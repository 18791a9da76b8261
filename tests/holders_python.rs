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

use crate::harness;

use harness::{Record, Traced, field, python_line, stack_int as int, start_embedded};
use serde_json::Value;

const TRACKERS: i64 = 20;

/// One traced leak of numpy copies in a holders fixture.
struct CopiesLeak {
    traced: Traced,
    /// The fixture's answer to the leak: the copies' bytes and its chain.
    answer: String,
    /// The line of the fixture's `# COPY-SITE`.
    copy_line: i64,
}

/// Starts `script` inside libpython3.11, sends it `before_attach` (if
/// any), attaches `record --holders` with `args`, sends `leak` once every
/// unwind table is in (numpy's are built after attach: a stack taken
/// before would be one of its own) and stops the trace.
fn trace_copies_leak(
    script: &str,
    before_attach: Option<&str>,
    args: &[&str],
    leak: &str,
) -> CopiesLeak {
    let mut fixture = start_embedded(script);
    if let Some(command) = before_attach {
        fixture.cmd(command);
    }
    let mut trace = Record::pid(fixture.pid)
        .args(["--holders", "-v"])
        .args(args)
        .attach();
    trace.wait_tables_ready();
    let answer = fixture.cmd(leak);
    let traced = trace.stop();
    fixture.cmd("quit");
    CopiesLeak {
        traced,
        answer,
        copy_line: python_line(script, "# COPY-SITE"),
    }
}

impl CopiesLeak {
    /// The stacks of `kind` whose innermost Python frame is the copy's
    /// line.
    fn at_copy_site(&self, kind: &str) -> Vec<&Value> {
        self.traced
            .report
            .stacks()
            .iter()
            .filter(|stack| {
                stack["kind"] == kind
                    && harness::python_frames(stack).first().map(|frame| frame.2)
                        == Some(self.copy_line)
            })
            .collect()
    }

    /// The reachability of the one stack of the copies' buffers: heap
    /// blocks (numpy mallocs them) at the copy's line.
    fn copies_reachability(&self) -> &Value {
        let copies = self.at_copy_site("heap");
        assert_eq!(copies.len(), 1, "one copy stack:\n{}", self.traced.report);
        &copies[0]["reachability"]
    }

    /// The fixture's own chain of holders, by type name, the copy first.
    fn chain(&self) -> Vec<&str> {
        self.answer
            .split_whitespace()
            .find_map(|word| word.strip_prefix("chain="))
            .unwrap_or_else(|| panic!("no chain= in the answer {:?}", self.answer))
            .split(',')
            .collect()
    }
}

/// The type names of a path's Python objects, in order (numpy's static
/// type is named with its module, as in tp_name: the module left out; a
/// buffer named after its owner, `data of dict`, is no object).
fn typed_steps(path: &[Value]) -> Vec<&str> {
    path.iter()
        .filter_map(|step| step["type_name"].as_str())
        .filter(|name| !name.starts_with("data of "))
        .map(|name| name.rsplit('.').next().unwrap_or(name))
        .collect()
}

#[test]
fn the_path_from_a_leaked_numpy_copy_names_the_finalize_chain_by_type() {
    let leak = trace_copies_leak(
        "finalize_registry.py",
        None,
        &["--python-objects"],
        &format!("leak {TRACKERS}"),
    );
    let (traced, answer) = (&leak.traced, &leak.answer);

    let reachability = leak.copies_reachability();
    assert_eq!(int(reachability, "unreachable_bytes"), 0, "{reachability}");
    assert_eq!(
        int(reachability, "reachable_bytes") + int(reachability, "possibly_lost_bytes"),
        field(answer, "copies_bytes"),
        "every copy is held: {reachability}"
    );

    // The fixture's own chain, the copy's array first and the registry
    // (untraced: made before attach) last, is the path's typed steps, in
    // order, after the buffer itself (raw float64s, no type).
    let truth = leak.chain();
    assert_eq!(truth.last(), Some(&"dict"), "{answer}");
    let path = reachability["path_to_root"].as_array().expect("a path");
    assert_eq!(
        path[0]["type_name"], "data of numpy.ndarray",
        "the buffer: {}",
        path[0]
    );
    // What held the copies' arrays, for a failure's message.
    let arrays: Vec<&Value> = leak
        .at_copy_site("python-object")
        .into_iter()
        .map(|stack| &stack["reachability"]["held_by"])
        .collect();
    assert_eq!(
        typed_steps(path),
        truth,
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
    let leak = trace_copies_leak(
        "atexit_registry.py",
        Some(&format!("prepare {TRACKERS}")),
        &[],
        "leak",
    );
    let (traced, answer) = (&leak.traced, &leak.answer);
    let reachability = leak.copies_reachability();
    assert_eq!(int(reachability, "unreachable_bytes"), 0, "{reachability}");
    assert_eq!(
        int(reachability, "reachable_bytes"),
        field(answer, "copies_bytes"),
        "every copy is held: {reachability}"
    );
    assert_eq!(int(reachability, "reachable_blocks"), TRACKERS);

    // The fixture's own chain (ndarray, dict, Tracker, method) is the
    // path's typed steps, in order, after the buffer; every step after the
    // buffer is an untraced pymalloc block, and the root is a global.
    let path = reachability["path_to_root"].as_array().expect("a path");
    assert_eq!(typed_steps(path), leak.chain(), "path: {path:#?}");
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

/// Attached after the leak happened: the trackers, their arrays and the
/// arrays' buffers made before attach are chunks of a thread's glibc arena
/// and pymalloc objects tracer has no record of, counted in the census by
/// type, each type with the root that holds most of it (the interpreter,
/// through weakref.finalize's registry); the leak's next trackers, made
/// after attach, have their chain through the registry as before.
#[test]
fn a_finalize_leak_made_before_attach_is_counted_by_type_with_its_root() {
    let leak = trace_copies_leak(
        "finalize_registry.py",
        Some(&format!("leak {TRACKERS}")),
        &[],
        "leak 2",
    );
    let (traced, answer) = (&leak.traced, &leak.answer);
    assert_eq!(field(answer, "copies"), TRACKERS + 2, "{answer}");
    let scan = &traced.report.json["holders_scans"][0];
    let census = &scan["before_attach"];
    let row = |type_name: &str| {
        census["by_type"]
            .as_array()
            .expect("by_type")
            .iter()
            .find(|row| row["type"] == type_name)
            .unwrap_or_else(|| panic!("no {type_name} in {census:#}"))
    };
    const RUNTIME: &str = "_PyRuntime in libpython3.11.so.1.0";
    // Each tracker made before attach: an array and its copy, their
    // buffers (ELEMENTS float64s each) named after them.
    let buffers = row("data of numpy.ndarray");
    let per_buffer = field(answer, "copies_bytes") / (TRACKERS + 2);
    assert!(int(buffers, "blocks") >= 2 * TRACKERS, "{buffers}");
    assert!(
        int(buffers, "bytes") >= 2 * TRACKERS * per_buffer,
        "{buffers}"
    );
    assert_eq!(buffers["root"], RUNTIME, "{buffers}");
    for (type_name, at_least) in [
        ("numpy.ndarray", 2 * TRACKERS),
        ("Tracker", TRACKERS),
        ("_Info", TRACKERS),
    ] {
        let objects = row(type_name);
        assert!(int(objects, "blocks") >= at_least, "{objects}");
        assert_eq!(objects["root"], RUNTIME, "{objects}");
    }
    let text = &traced.output.stdout;
    assert!(
        text.contains(&format!("data of numpy.ndarray, held from {RUNTIME}")),
        "{text}"
    );

    // The trackers made since: their copies are held from the runtime.
    // Their chain is not the fixture's own here (issue 37, not met): with
    // the trackers made before attach untraced, the shortest chain goes
    // through untraced pymalloc memory (ndarray <- function <- dict <-
    // function) instead of the finalize registry; the_path_from_a_leaked_
    // numpy_copy_names_the_finalize_chain_by_type checks the chain where
    // every tracker is traced.
    let reachability = leak.copies_reachability();
    let path = reachability["path_to_root"].as_array().expect("a path");
    assert_eq!(
        typed_steps(path).first(),
        Some(&"ndarray"),
        "path: {path:#?}"
    );
    assert_eq!(path.last().unwrap()["name"], RUNTIME, "{path:#?}");
}
