//! Go programs: stacks of C code called through cgo go on into the Go
//! functions that called it, across the switch from the thread's system
//! stack to the goroutine's, whether the C code keeps frame pointers
//! (`--unwind fp`) or not (the default unwinder copies the stacks of such
//! a program, the goroutine's included).
use crate::harness;

use harness::*;

/// What tests/fixtures/cgo_leak keeps each round: through C.c_keep_blocks,
/// and through each of its two callbacks into Go.
const BLOCKS_PER_ROUND: i64 = 100;
const BLOCK_BYTES: i64 = 1000;
const CALLBACK_BLOCKS: i64 = 30;
const CALLBACK_BLOCK_BYTES: i64 = 500;
const ROUNDS: i64 = 6;

/// The frames of a block kept by C from a Go callback, innermost first,
/// up to the C function that called back.
const THROUGH_THE_CALLBACK: [&str; 5] = [
    "c_keep_from_callback",
    "main.keepFromCallback",
    "main.goKeepFromCallback",
    "runtime.cgocallback",
    "c_call_back",
];

/// C called back into Go from the goroutine's own call into C (the
/// goroutine's stack holds frames of both calls) and from a thread C
/// started: each stack goes on from the callback's C frames to where
/// its thread began.
fn assert_callback_stacks(report: &Report) {
    let stacks = report.heap_stacks_with("c_keep_from_callback");
    let from_go: Vec<_> = stacks
        .iter()
        .filter(|stack| frames_contain(stack, "main._Cfunc_c_call_back"))
        .collect();
    let from_c_thread: Vec<_> = stacks
        .iter()
        .filter(|stack| frames_contain(stack, "callback_thread"))
        .collect();
    assert!(
        from_go.len() == 1 && from_c_thread.len() == 1 && stacks.len() == 2,
        "the callbacks' blocks are not in one stack each: {report}"
    );
    let callback_blocks = Live::blocks(ROUNDS * CALLBACK_BLOCKS, CALLBACK_BLOCK_BYTES);
    let mut via_go = THROUGH_THE_CALLBACK.to_vec();
    via_go.extend(["main._Cfunc_c_call_back", "main.main", "runtime.main"]);
    assert_in_order(from_go[0], &via_go, report);
    let mut via_c_thread = THROUGH_THE_CALLBACK.to_vec();
    via_c_thread.extend(["callback_thread", "start_thread"]);
    assert_in_order(from_c_thread[0], &via_c_thread, report);
    for stack in [from_go[0], from_c_thread[0]] {
        let live = Live {
            bytes: stack_int(stack, "live_bytes"),
            allocs: stack_int(stack, "live_allocs"),
        };
        assert_eq!(live, callback_blocks, "{report}");
    }
}

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
    let callbacks_held = 2 * ROUNDS * CALLBACK_BLOCKS * CALLBACK_BLOCK_BYTES;
    assert!(
        output.stdout.ends_with(&format!(
            "callbacks held {callbacks_held}\ndone held {held}\n"
        )),
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
/// function through runtime.cgocall into main.leakViaC and its callers,
/// and through Go callbacks from C. The runtime's own first mappings,
/// made as soon as the spawned program runs, have their stacks too.
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
    assert_callback_stacks(&report);
}

/// The same C code built with frame pointers, walked by them in the
/// kernel (`--unwind fp`): asmcgocall keeps the goroutine's frame pointer
/// while C runs, so the walk goes on into the Go callers (and through
/// the callbacks).
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
    assert_callback_stacks(&report);
}
