//! A traced process that forks or replaces its image (exec): children
//! followed or left alone, and the boundary an exec draws (what the old
//! image held is gone, the new one is traced). Real tracer, real eBPF,
//! fixtures that know their own truth.

use crate::harness;

use std::process::Command;

use harness::{
    ATTACH_TIMEOUT, Fixture, KillOnDrop, Live, PREALLOC_COUNT, REENTRANT_BLOCK_BYTES, Record,
    Report, Traced, field, leaked, stdout_pipe_buffer, sum_live,
};

#[test]
fn follow_forks_traces_children_and_without_it_they_cost_nothing() {
    for follow in [true, false] {
        let mut fixture = Fixture::start("reentrant", &[]);
        let follow_args: &[&str] = if follow { &["--follow-forks"] } else { &[] };
        let trace = Record::pid(fixture.pid).args(follow_args).attach();
        let child: u32 = field(&fixture.cmd("spawn 300"), "pid").try_into().unwrap();
        let _child = KillOnDrop::pid(child);
        // The child leaks 1.5 s after the fork and says so.
        assert_eq!(fixture.next_line("the child's leak"), "child leaked=300");
        let Traced { output, report } = trace.stop();
        let child_leak = report.heap_live_of(child, "child_alloc");
        let followed = report
            .targets()
            .iter()
            .find(|target| target["pid"].as_u64() == Some(child.into()));
        if follow {
            let leak = Live::blocks(300, REENTRANT_BLOCK_BYTES);
            assert_eq!(child_leak, leak, "{report}");
            assert_eq!(report.target_total(child, "heap"), leak, "{report}");
            let window = report.json["window_s"].as_f64().expect("window_s");
            let followed_after = followed.and_then(|target| target["followed_after_s"].as_f64());
            assert!(
                followed_after.is_some_and(|after| after > 0.0 && after <= window),
                "followed after {followed_after:?} s in a window of {window} s: {report}"
            );
            assert!(output.stdout.contains("a child followed from"), "{output}");
        } else {
            assert_eq!(child_leak, Live::default(), "{report}");
            assert!(followed.is_none(), "{}", report.json["targets"]);
        }
    }
}

#[test]
fn exec_marks_the_boundary_and_the_new_image_is_traced() {
    let report = exec_marks_the_boundary_with(&[]);
    // The new image's start-up blocks beyond the leaks are its stdio
    // buffers, by name.
    let stdio = sum_live(&report.heap_stacks_with("_IO_file_doallocate"));
    assert_eq!(report.total("heap"), leaked(10) + stdio, "{report}");
}

/// The same through stack copies unwound by tracer (`--unwind copy`),
/// whose totals tracer keeps itself: the exec comes in their ring, after
/// the old image's last copy. (The stdio buffers' copies, taken before
/// the new image's libc was mapped, are not named: no name is checked.)
#[test]
fn exec_marks_the_boundary_with_copied_stacks() {
    exec_marks_the_boundary_with(&["--unwind", "copy"]);
}

/// `reentrant` leaks in a signal handler, then execs `leaky`, which
/// leaks 10 blocks and frees its start-up blocks: the report holds the 10
/// blocks and at most leaky's stdio buffers, nothing of reentrant's.
fn exec_marks_the_boundary_with(args: &[&str]) -> Report {
    let mut fixture = Fixture::start("reentrant", &[]);
    let mut trace = Record::pid(fixture.pid).args(args).attach();
    fixture.cmd("signal 20");
    let leaky = harness::fixture("leaky");
    let ready = fixture.cmd(&format!("exec {}", leaky.display()));
    assert_eq!(
        ready,
        format!("ready pid={}", fixture.pid),
        "the same process runs leaky now"
    );
    // The new image allocated its start-up blocks before tracer saw the
    // exec; they count from zero all the same.
    trace.tracer.wait_stderr(
        &format!("PID {} exec'ed {}", fixture.pid, leaky.display()),
        ATTACH_TIMEOUT,
    );
    fixture.cmd("leak 10");
    // Frees every start-up block: those seen come off, none twice.
    assert_eq!(
        fixture.cmd("free_pre"),
        format!("freed_pre count={PREALLOC_COUNT}")
    );
    let Traced { output, report } = trace.stop();
    assert_eq!(report.heap_live_with("leak_here"), leaked(10), "{report}");
    // Nothing of the old image's heap is left, none of it below zero. Of the
    // new image's own start-up, only its stdio buffers can be left (its
    // first fgets comes right after "ready"; the loader gate usually holds
    // the new image until it is hooked, a slow hook misses them): at most
    // the two, stdin's and stdout's, one pipe buffer each. Of the
    // PREALLOC_COUNT blocks, a late hook (a busy machine) sees only some
    // (30 of 100 was): free_pre took every one seen off.
    let total = report.total("heap");
    let start_up = Live {
        bytes: total.bytes - leaked(10).bytes,
        allocs: total.allocs - leaked(10).allocs,
    };
    let buffer = stdout_pipe_buffer().bytes;
    assert!(
        (0..=2).contains(&start_up.allocs) && start_up.bytes == start_up.allocs * buffer,
        "stdio buffers of {buffer} B at most: {report}"
    );
    assert_eq!(
        report.heap_live_with("prealloc_blocks"),
        Live::default(),
        "start-up blocks: {report}"
    );
    // What the old image held is gone.
    assert_eq!(
        report.heap_live_with("outer_alloc"),
        Live::default(),
        "{report}"
    );
    assert_eq!(
        report.heap_live_with("handler_alloc"),
        Live::default(),
        "{report}"
    );
    let execs = report.target(fixture.pid)["execs_after_s"]
        .as_array()
        .unwrap();
    assert_eq!(execs.len(), 1, "{}", report.json["targets"]);
    assert!(
        output.stdout.contains("replaced its image (exec)"),
        "{output}"
    );
    report
}

/// reentrant's `hold` blocks of 1000 B and of 996 B take the same room in
/// its arena (a 16-byte header, 16-byte alignment).
const HELD_RECORDED_BYTES: i64 = 1000;
const HELD_UNRECORDED_BYTES: i64 = 996;
const HELD_COUNT: i64 = 50;

/// An image that frees an address its replaced image's block held (a block
/// of its own the tracer did not record) takes nothing off: the kernel
/// zeroed the old image's totals at the exec and ignores the old block,
/// counting the free in `frees_of_replaced_image`. Without address
/// randomization, reentrant run again allocates the same addresses.
#[test]
fn a_free_of_an_address_the_replaced_image_held_is_ignored_and_counted() {
    let reentrant = harness::fixture("reentrant");
    let mut command = Command::new("setarch");
    command
        .args([std::env::consts::ARCH, "--addr-no-randomize"])
        .arg(&reentrant);
    let mut fixture = Fixture::start_command(command);
    // Blocks under --min-size are not recorded; their frees are looked up.
    let trace = Record::pid(fixture.pid)
        .args(["--min-size", &HELD_RECORDED_BYTES.to_string()])
        .attach();
    let old = fixture.cmd(&format!("hold {HELD_COUNT} {HELD_RECORDED_BYTES}"));
    assert_eq!(field(&old, "count"), HELD_COUNT);
    let ready = fixture.cmd(&format!("exec {}", reentrant.display()));
    assert_eq!(
        ready,
        format!("ready pid={}", fixture.pid),
        "reentrant again"
    );
    let new = fixture.cmd(&format!("hold {HELD_COUNT} {HELD_UNRECORDED_BYTES}"));
    assert_eq!(
        field(&new, "first"),
        field(&old, "first"),
        "the new image's blocks are at the old one's addresses"
    );
    assert_eq!(
        fixture.cmd("release"),
        format!("released count={HELD_COUNT}")
    );
    let Traced { output, report } = trace.stop();
    assert_eq!(
        report.int("/events/frees_of_replaced_image"),
        HELD_COUNT,
        "{}",
        report.json["events"]
    );
    assert_eq!(report.int("/events/frees"), 0, "{}", report.json["events"]);
    // The old image's blocks are gone, none below zero: what is live is the
    // new image's stdio buffers (allocated after the exec; one pipe buffer
    // each, stdout's and stdin's).
    assert_eq!(
        report.heap_live_with("hold_alloc"),
        Live::default(),
        "{report}"
    );
    let stdio = sum_live(&report.heap_stacks_with("_IO_file_doallocate"));
    assert_eq!(
        stdio,
        Live::blocks(2, stdout_pipe_buffer().bytes),
        "{report}"
    );
    assert_eq!(report.total("heap"), stdio, "{report}");
    assert!(
        output.stdout.contains(&format!(
            "frees of blocks of an image replaced by exec (ignored): {HELD_COUNT}"
        )),
        "{output}"
    );
}

#[test]
fn full_ring_buffer_is_reported_with_the_flag_to_raise() {
    let mut fixture = Fixture::start("mappings", &[]);
    let trace = Record::pid(fixture.pid)
        .args(["--ring-buffer-kib", "4"])
        .attach();
    fixture.cmd("churn 3000");
    let Traced { output, report } = trace.stop();
    assert!(
        report.int("/drops/mapping_events_lost") > 0,
        "{}",
        report.json["drops"]
    );
    assert!(output.stdout.starts_with("WARNING: "), "{output}");
    assert!(
        output.stdout.contains("raise --ring-buffer-kib"),
        "{output}"
    );
}

/// 10 000 children that fork, allocate once and exit one after another,
/// under `--follow-forks` (a shell loop, a pre-fork server under load):
/// tracer keeps up without growing (its peak RSS stays under 256 MiB; 61
/// MiB measured here), answers Ctrl-C within 1 s, and the parent's own
/// blocks, made after them, are exact.
#[test]
fn ten_thousand_short_lived_children_neither_hang_nor_bloat_tracer() {
    let mut fixture = Fixture::start("reentrant", &[]);
    let trace = Record::pid(fixture.pid).args(["--follow-forks"]).attach();
    assert_eq!(fixture.cmd("children 10000"), "children=10000 exited=10000");
    assert!(
        fixture
            .cmd("hold 7 1000")
            .starts_with("held count=7 bytes=7000")
    );
    let peak_kib: u64 = std::fs::read_to_string(format!("/proc/{}/status", trace.tracer.pid()))
        .expect("tracer's status")
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
        .expect("VmHWM");
    let report = trace.interrupt_within(std::time::Duration::from_secs(1));
    assert!(
        peak_kib < 256 << 10,
        "tracer's peak RSS {peak_kib} KiB\n{report}"
    );
    assert_eq!(
        report.heap_live_of(fixture.pid, "hold_alloc"),
        Live::blocks(7, 1000),
        "\n{report}"
    );
}
