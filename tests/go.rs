//! Go programs: stacks of C code called through cgo go on into the Go
//! functions that called it, across the switch from the thread's system
//! stack to the goroutine's, whether the C code keeps frame pointers
//! (`--unwind fp`) or not (the default unwinder copies the stacks of such
//! a program, the goroutine's included).
#[allow(dead_code, reason = "other test files use the rest of the harness")]
mod harness;

use harness::*;

/// What tests/fixtures/cgo_leak keeps each round.
const BLOCKS_PER_ROUND: i64 = 100;
const BLOCK_BYTES: i64 = 1000;
const ROUNDS: i64 = 6;

/// Spawns the cgo fixture `name` with `args` until it exits, checks its
/// printed ground truth, and returns the one heap stack holding what its
/// C function kept, after checking its bytes and blocks against it.
fn leak_stack_of(name: &str, args: &[&str]) -> (serde_json::Value, Report) {
    require_root();
    let rounds = ROUNDS.to_string();
    let Traced { output, report } =
        Record::command(&fixture(name), &["-rounds", &rounds, "-period", "200ms"])
            .args(args)
            .start()
            .wait_exit();
    let held = ROUNDS * BLOCKS_PER_ROUND * BLOCK_BYTES;
    assert!(
        output.stdout.ends_with(&format!("done held {held}\n")),
        "{output}"
    );
    let stacks = report.heap_stacks_with("c_keep_blocks");
    assert_eq!(
        stacks.len(),
        1,
        "c_keep_blocks's blocks are not in one stack: {output}\n{report}"
    );
    let stack = stacks[0].clone();
    assert_eq!(
        report.heap_live_with("c_keep_blocks"),
        Live::blocks(ROUNDS * BLOCKS_PER_ROUND, BLOCK_BYTES),
        "{output}\n{report}"
    );
    (stack, report)
}

/// The C code keeps no frame pointers (Go builds it with `-g -O2`): the
/// default unwinder copies the program's stacks, the goroutine's stack
/// above asmcgocall's switch included, and the stack goes from the C
/// function through runtime.cgocall into main.leakViaC and its callers.
/// The runtime's own first mappings, made as soon as the spawned program
/// runs, have their stacks too.
#[test]
fn cgo_stack_goes_on_into_the_go_callers() {
    let (stack, report) = leak_stack_of("cgo_leak", &[]);
    assert!(
        !dwarf_pids(&report).is_empty(),
        "the C code lacks frame pointers: its stacks must be copied\n{report}"
    );
    // The Go runtime maps its heap arenas right after the program is
    // attached, through C (x_cgo_mmap): those copies are read too.
    let arenas = report.stacks_with("mmap-anon", "x_cgo_mmap");
    assert!(
        !arenas.is_empty()
            && report
                .stacks()
                .iter()
                .filter(|stack| stack["kind"] == "mmap-anon")
                .all(|stack| !function_names(stack).is_empty()),
        "a Go heap arena's mapping has no stack\n{report}"
    );
    assert_in_order(
        &stack,
        &[
            "c_keep_blocks",
            "runtime.asmcgocall",
            "runtime.cgocall",
            "main._Cfunc_c_keep_blocks",
            "main.leakViaC",
            "main.leakRound",
            "main.main",
            "runtime.main",
        ],
        &report,
    );
}

/// The same C code built with frame pointers, walked by them in the
/// kernel (`--unwind fp`): asmcgocall keeps the goroutine's frame pointer
/// while C runs, so the walk goes on into the Go callers.
#[test]
fn cgo_stack_goes_on_into_the_go_callers_with_frame_pointers() {
    let (stack, report) = leak_stack_of("cgo_leak_fp", &["--unwind", "fp"]);
    assert_in_order(
        &stack,
        &[
            "c_keep_blocks",
            "main._Cfunc_c_keep_blocks",
            "main.leakViaC",
            "main.leakRound",
            "main.main",
            "runtime.main",
        ],
        &report,
    );
}
