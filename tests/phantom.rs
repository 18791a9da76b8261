//! Numbers a user can trust under load: frees of blocks whose stacks were
//! copied reach the totals even when the copy ring is full (no phantom
//! live bytes), the mappings an allocator makes inside free are counted
//! once (as its blocks), and copies keep up at an ordinary allocation
//! rate. The fixture (tests/fixtures/burst.c) has no frame pointers; the
//! copy-path tests ask for `--unwind copy`. It prints what it holds.

use crate::harness;

use std::time::Duration;

use harness::{Fixture, Live, Record, Report, Traced, field};

/// Bytes of each block `hold` keeps.
const HELD_SIZE: i64 = 1000;

/// Sends `command` to the fixture and returns what it holds after it.
fn held_after(burst: &mut Fixture, command: &str) -> Live {
    let answer = burst.cmd(command);
    Live::answered(&answer, "held_bytes", "held")
}

/// Fails with `why` if the report lists an mmap-anon stack.
fn assert_no_mmap_anon(report: &Report, why: &str) {
    assert!(
        !report
            .stacks()
            .iter()
            .any(|stack| stack["kind"] == "mmap-anon"),
        "{why}:\n{report}"
    );
}

/// Stops (SIGSTOP) or resumes (SIGCONT) the tracer: a tracer that gets no
/// CPU for a while, as on a busy machine, lets the copy ring fill.
fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) on the tracer this test started.
    assert_eq!(
        unsafe { libc::kill(pid as i32, signal) },
        0,
        "kill {signal}"
    );
}

/// CLOCK_MONOTONIC in microseconds, the fixture's clock.
fn monotonic_us() -> i64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) },
        0
    );
    now.tv_sec * 1_000_000 + now.tv_nsec / 1000
}

#[test]
fn bursts_of_frees_reach_the_totals_even_when_the_copy_ring_is_full() {
    let mut burst = Fixture::start("burst", &[]);
    let trace = Record::pid(burst.pid).args(["--unwind", "copy"]).attach();
    let tracer_pid = trace.tracer.pid();
    // The program: 5 000 x 1 000 B every 50 ms, all freed; then
    // a faster one, 20 000 every 10 ms. The tracer is stopped during each,
    // so the ring fills with copies and the frees of copied blocks find
    // it full: they must not be lost.
    for command in ["burst 5000 1000 50 1.5", "burst 20000 1000 10 1.5"] {
        signal(tracer_pid, libc::SIGSTOP);
        let held = held_after(&mut burst, command);
        signal(tracer_pid, libc::SIGCONT);
        assert_eq!(held, Live::default());
    }
    let held = held_after(&mut burst, &format!("hold 100 {HELD_SIZE}"));
    assert_eq!(held, Live::blocks(100, HELD_SIZE));
    let Traced { output, report } = trace.stop();

    // The frees did find the ring full (else this proves nothing), and
    // went through COPY_FREES instead.
    assert!(
        report.int("/drops/stack_copy_ring_full") > 0,
        "the ring never filled: {}",
        report.json["drops"]
    );
    assert!(
        report.int("/events/stack_frees_deferred") > 0,
        "no free found the ring full: {}",
        report.json["events"]
    );
    assert_eq!(report.int_if_present("/drops/stack_free_lost"), None);
    // Live heap at the end is what the program holds, exactly.
    assert_eq!(report.total("heap"), held, "\n{report}");
    assert_eq!(report.heap_live_with("burst_alloc"), Live::default());
    assert_eq!(report.heap_live_with("hold_block"), held, "\n{report}");
    // Only copies fell back to frame pointers: the bytes are exact, and
    // the warning says so, never that they are lower bounds.
    assert!(
        output.stdout.contains("bytes exact, but") && !output.stdout.contains("lower bound"),
        "{output}"
    );
}

#[test]
fn an_arena_made_inside_free_is_the_allocators_not_mmap_anon() {
    let mut burst = Fixture::start("burst", &[]);
    let trace = Record::pid(burst.pid).attach();
    // A thread whose first allocator call is free(): glibc makes its
    // arena (an mmap of 132 KiB or more) inside that free; then it
    // mallocs 300 blocks of 1 000 B into the arena.
    let held = held_after(&mut burst, &format!("arena 300 {HELD_SIZE}"));
    assert_eq!(held, Live::blocks(300, HELD_SIZE));
    let Traced { report, .. } = trace.stop();
    assert_eq!(report.heap_live_with("arena_block"), held, "\n{report}");
    assert_no_mmap_anon(&report, "the arena is counted twice, as mmap-anon");
    assert_eq!(report.int_if_present("/totals/mmap-anon/live_bytes"), None);
    report.assert_no_drops();
}

#[test]
fn copies_keep_up_at_an_ordinary_allocation_rate() {
    let mut burst = Fixture::start("burst", &[]);
    let trace = Record::pid(burst.pid).args(["--unwind", "copy"]).attach();
    let tracer_pid = trace.tracer.pid();
    // A 100 ms hiccup while the burst runs, as a busy machine gives
    // tracer: the ring must hold the ~2 000 copies made meanwhile (a
    // 16 MiB ring, the old default, held 1 000 and lost the rest to frame
    // pointers). 100 blocks every 5 ms: 20 000 allocations and frees a
    // second, each with its stack copied, for 3 s, at the default options;
    // the fixture says when its first round is done.
    assert_eq!(burst.cmd("burst 100 1000 5 3 announce"), "bursting");
    signal(tracer_pid, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(100));
    signal(tracer_pid, libc::SIGCONT);
    let resumed_us = monotonic_us();
    let answer = burst.next_line("the burst's answer");
    // The hiccup ended inside the burst (else the ring was never tested).
    let end_us = field(&answer, "end_us");
    assert!(
        resumed_us < end_us,
        "the tracer was resumed at {resumed_us} µs, after the burst ended ({end_us} µs)"
    );
    let blocks = field(&answer, "blocks");
    let held = held_after(&mut burst, &format!("hold 100 {HELD_SIZE}"));
    let Traced { report, .. } = trace.stop();
    report.assert_no_drops();
    // One copy per allocation: the burst's blocks and the 100 held.
    assert_eq!(
        report.int("/events/stack_copies"),
        blocks + 100,
        "\n{report}"
    );
    assert_eq!(report.total("heap"), held, "\n{report}");
    assert_eq!(report.heap_live_with("burst_alloc"), Live::default());
}

#[test]
fn a_block_mapped_inside_an_unrecorded_malloc_is_not_mmap_anon() {
    let mut burst = Fixture::start("burst", &[]);
    // --max-size leaves the 1 MiB blocks unrecorded: their malloc skips
    // its return (a uprobe session) and glibc maps each block inside it.
    // Those mappings are the allocator's, not mmap-anon.
    let trace = Record::pid(burst.pid).args(["--max-size", "4096"]).attach();
    let held = held_after(&mut burst, "hold 5 1048576");
    assert_eq!(held, Live::blocks(5, 1 << 20));
    let Traced { report, .. } = trace.stop();
    assert_no_mmap_anon(&report, "blocks mapped by malloc counted as mmap-anon");
    assert_eq!(report.int("/events/allocs_not_recorded"), 5, "\n{report}");
}
