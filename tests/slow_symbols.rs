//! Slow symbolization never holds the collect loop: a target maps a
//! library whose DWARF takes blazesym seconds to read at its first
//! look-up (tests/fixtures/slow_dwarf_lib.c), and leaks through it.
//! tracer keeps snapshotting meanwhile (the stack shown as module and
//! offset, named once the symbolizer answers). Ctrl-C stops tracing at
//! once and the report waits for the names (bounded); a second Ctrl-C
//! ends that wait within a second, the leak counted exactly with the
//! frames it had.

use crate::harness;

use std::time::{Duration, Instant};

use harness::{Fixture, Live, Record, field, require_root};
use serde_json::Value;

/// slow_dwarf_lib.c's block size.
const BLOCK_BYTES: i64 = 1000;

/// The `hostile` fixture with the slow library loaded.
fn hostile_with_slow_library() -> (Fixture, String) {
    let library = harness::fixture("slow_dwarf_lib");
    let mut hostile = Fixture::start("hostile", &[]);
    assert_eq!(
        hostile.cmd(&format!("load {}", library.display())),
        "loaded"
    );
    (hostile, library.display().to_string())
}

/// The stacks of `lib_a 7`'s leak (a frame in `library`), checked to hold
/// its 7 blocks exactly.
fn leak_stacks<'a>(report: &'a harness::Report, library: &str) -> Vec<&'a Value> {
    let stacks = stacks_in(report.stacks(), library);
    assert_eq!(
        harness::sum_live(&stacks),
        Live::blocks(7, BLOCK_BYTES),
        "\n{report}"
    );
    stacks
}

/// The heap stacks with a frame in `module`.
fn stacks_in<'a>(stacks: &'a [Value], module: &str) -> Vec<&'a Value> {
    stacks
        .iter()
        .filter(|stack| {
            stack["frames"]
                .as_array()
                .is_some_and(|frames| frames.iter().any(|frame| frame["module"] == module))
        })
        .collect()
}

#[test]
fn a_second_ctrl_c_during_the_last_slow_symbolization_ends_tracer_within_1_s_with_the_leak_counted()
{
    require_root();
    let (mut hostile, library) = hostile_with_slow_library();
    let trace = Record::pid(hostile.pid).interval("100ms").attach();
    assert_eq!(field(&hostile.cmd("lib_a 7"), "count"), 7);
    // The leak's stack is looked up in the slow library by the next
    // snapshot or by the final report, whichever comes first; blazesym
    // reads it for seconds, and the second Ctrl-C comes meanwhile.
    let (output, report) =
        trace.interrupt_twice_within("stopping (Interrupted)", Duration::from_secs(1));
    assert!(
        output
            .stderr
            .contains("were still being symbolized when the last wait ended"),
        "the second Ctrl-C cut a wait that had addresses left: {output}"
    );
    let stacks = leak_stacks(&report, &library);
    // Unnamed, still re-symbolizable: its build id and offset are kept.
    for stack in stacks {
        let frame = stack["frames"]
            .as_array()
            .unwrap()
            .iter()
            .find(|frame| frame["module"] == library.as_str())
            .unwrap();
        assert!(frame["build_id"].is_string(), "{frame}");
        assert!(frame["offset"].is_u64(), "{frame}");
        assert!(frame["file_offset"].is_u64(), "{frame}");
    }
}

#[test]
fn one_ctrl_c_during_a_slow_symbolization_waits_for_the_names() {
    require_root();
    let (mut hostile, library) = hostile_with_slow_library();
    let trace = Record::pid(hostile.pid).interval("100ms").attach();
    assert_eq!(field(&hostile.cmd("lib_a 7"), "count"), 7);
    // Nothing lost on Ctrl-C: the report waits for blazesym (seconds,
    // within the 10 s bound) and names the leak's function.
    let report = trace.interrupt_within(Duration::from_secs(15));
    let stacks = leak_stacks(&report, &library);
    for stack in stacks {
        assert!(
            stack["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|frame| frame["function"] == "slow_dwarf_leak"),
            "named once blazesym answered: {stack}"
        );
    }
}

#[test]
fn a_stack_shown_unnamed_while_the_symbolizer_is_slow_is_named_once_it_answers() {
    require_root();
    let (mut hostile, _) = hostile_with_slow_library();
    let mut trace = Record::pid(hostile.pid)
        .interval("100ms")
        .args(["--listen", "0"])
        .attach();
    let address = harness::listen_address(&mut trace.tracer);
    assert_eq!(field(&hostile.cmd("lib_a 7"), "count"), 7);
    let leak = |samples: &[(u32, String, i64)], named: bool| {
        samples.iter().any(|(pid, site, bytes)| {
            *pid == hostile.pid
                && *bytes == 7 * BLOCK_BYTES
                && site.contains("slow_dwarf_leak") == named
        })
    };
    // Published unnamed while blazesym reads the library (seconds): the
    // loop did not wait for it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen_unnamed = None;
    loop {
        let samples = harness::stack_samples(&address);
        if leak(&samples, false) {
            seen_unnamed = Some(samples.clone());
        }
        if leak(&samples, true) {
            break;
        }
        assert!(Instant::now() < deadline, "never named: {samples:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        seen_unnamed.is_some(),
        "the stack was never published before the slow look-up ended"
    );
    trace.stop();
}
