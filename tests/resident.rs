//! `tracer record --resident` against tests/fixtures/mappings: pages are
//! charged to the code that first touched them, with no allocator probe;
//! credited back when given back (madvise, munmap); a huge page counts at
//! its size; a leak is flagged and named, a steady heap is not.

use crate::harness;

use std::time::Duration;

use harness::{Fixture, Live, Record, Traced, field, frames_contain};
use serde_json::Value;

const KIB: i64 = 1024;
const PAGE: i64 = 4 * KIB;

/// Starts the mappings fixture traced with `--resident`, its unwind
/// tables ready (the faults in malloc are walked through libc's).
fn traced() -> (Fixture, harness::Trace) {
    let fixture = Fixture::start("mappings", &[]);
    let mut trace = Record::pid(fixture.pid)
        .args(["-v", "--resident"])
        .interval("250ms")
        .attach();
    trace.wait_tables_ready();
    (fixture, trace)
}

#[test]
fn pages_are_charged_to_the_code_that_touched_them_and_credited_back() {
    let (mut fixture, trace) = traced();
    let touched = fixture.cmd("touch 10");
    fixture.cmd("advise 8");
    fixture.cmd("unmap_touched 8");
    let Traced { output, report } = trace.stop();
    assert_eq!(report.json["sampling"]["mode"], "resident", "{output}");
    // Every page of the 10 blocks, whether malloc's header write or the
    // loop touched it first: the two stacks run through touch_heap_leak.
    let bytes = field(&touched, "bytes");
    assert_eq!(
        report.live_with("resident", "touch_heap_leak"),
        Live::blocks(bytes / PAGE, PAGE),
        "{output}\n{report}"
    );
    for function in ["advise_back", "unmap_touched"] {
        assert_eq!(
            report.live_with("resident", function),
            Live::default(),
            "{function} gave its pages back:\n{report}"
        );
    }
    // Their pages were seen made resident before they were given back.
    let touched_pages = bytes / PAGE + 2 * 8 * 256 * KIB / PAGE;
    // No allocator call was trapped: no heap kind, no allocation counted.
    assert_eq!(report.total("heap"), Live::default(), "{report}");
    assert_eq!(
        report.json["events"]["allocs"], 0,
        "{}",
        report.json["events"]
    );
    let faults = report.json["events"]["page_faults"].as_i64().unwrap_or(0);
    assert!(faults >= touched_pages, "{}", report.json["events"]);
    let text = output.to_string();
    assert!(
        text.contains("resident mode (--resident)")
            && text.contains("live resident at end:")
            && text.contains(" pages"),
        "{output}"
    );
}

#[test]
fn a_huge_page_counts_at_its_size() {
    let (mut fixture, trace) = traced();
    let answer = fixture.cmd("huge 3");
    let Traced { output, report } = trace.stop();
    let huge_bytes = field(&answer, "huge_bytes");
    let huge_pages = huge_bytes / (2048 * KIB);
    // The pages the kernel served small (THP off, or none free) count as
    // the one 4 KiB page each write made resident.
    let expected = huge_bytes + (3 - huge_pages) * PAGE;
    assert_eq!(
        report.live_with("resident", "touch_huge_page").bytes,
        expected,
        "{answer}\n{output}\n{report}"
    );
    assert_eq!(
        report.json["events"]["huge_page_faults"], huge_pages,
        "{}",
        report.json["events"]
    );
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if !thp.contains("[never]") {
        assert!(
            huge_pages > 0,
            "transparent huge pages are on ({thp}), yet none was given: {answer}"
        );
        assert!(
            output
                .to_string()
                .contains(&format!("({huge_pages} faults served by one)")),
            "{output}"
        );
    }
}

/// Steps with pauses between them, so that the verdict sees the target
/// idle after each.
fn in_steps(fixture: &mut Fixture, command: &str) {
    for _ in 0..4 {
        fixture.cmd(command);
        std::thread::sleep(Duration::from_millis(1500));
    }
    std::thread::sleep(Duration::from_millis(1500));
}

fn suspected_leaks(report: &harness::Report) -> Vec<Value> {
    report.json["suspected_leaks"]
        .as_array()
        .unwrap_or_else(|| panic!("no suspected_leaks: {}", report.json))
        .clone()
}

#[test]
fn a_growing_resident_set_is_flagged() {
    let (mut fixture, trace) = traced();
    in_steps(&mut fixture, "touch 40");
    let Traced { output, report } = trace.stop();
    let leaks = suspected_leaks(&report);
    assert!(
        leaks
            .first()
            .is_some_and(|first| frames_contain(first, "touch_heap_leak")),
        "the growing stack is the first suspected leak:\n{output}"
    );
    assert_eq!(
        report.live_with("resident", "touch_heap_leak"),
        Live::blocks(4 * 40 * 16, PAGE),
        "{report}"
    );
    let text = output.to_string();
    assert!(
        text.contains("page faults") && !text.contains("allocation calls"),
        "the evidence counts page faults, not allocation calls:\n{output}"
    );
}

/// A heap that churns (blocks written, then freed, the same each round)
/// keeps the pages it needs and touches no new one: nothing is flagged.
/// (Beside a leak it would be: the pages it touched and freed are reused
/// by the leak's blocks, and stay charged to it, the code that first
/// touched them: the mode's documented blind spot.)
#[test]
fn a_steady_heap_is_not_flagged() {
    let (mut fixture, trace) = traced();
    in_steps(&mut fixture, "steady 30");
    let Traced { output, report } = trace.stop();
    let leaks = suspected_leaks(&report);
    assert!(leaks.is_empty(), "nothing grows:\n{output}");
    // Bounded: the pages glibc keeps at the top of its heap between rounds.
    let steady = report.live_with("resident", "steady_heap");
    assert!(
        steady.bytes > 0 && steady.bytes <= 512 * KIB,
        "{steady:?}\n{report}"
    );
}

/// Faults that come fast are sampled by page (one in 2^s, each standing
/// for 2^s pages): fewer walks, the same bytes within a few percent.
#[test]
fn fast_faults_are_sampled_and_the_bytes_stay_unbiased() {
    let (mut fixture, trace) = traced();
    let mut touched = 0;
    for _ in 0..3 {
        touched += field(&fixture.cmd("touch 1000"), "bytes");
        // A snapshot (every 250 ms) sees the rate and raises the shift.
        std::thread::sleep(Duration::from_millis(600));
    }
    let Traced { output, report } = trace.stop();
    let events = &report.json["events"];
    let shift = events["fault_sample_shift"].as_i64().unwrap_or(0);
    assert!(
        shift > 0,
        "1000 faults in a burst raise the shift: {events}"
    );
    let faults = events["page_faults"].as_i64().unwrap_or(0);
    assert!(
        faults < touched / PAGE,
        "fewer faults walked ({faults}) than pages touched: {events}"
    );
    let live = report.live_with("resident", "touch_heap_leak").bytes;
    let error = (live - touched).abs() as f64 / touched as f64;
    assert!(
        error < 0.1,
        "estimated {live} bytes of {touched} ({:.1} % off, shift {shift})\n{output}",
        error * 100.0
    );
    assert!(
        output
            .to_string()
            .contains("sampled where faults came fast"),
        "{output}"
    );
}

/// A memory cgroup with a limit, removed when dropped (after the process
/// in it is gone: declare it before the fixture).
struct LimitedCgroup {
    dir: std::path::PathBuf,
}

impl LimitedCgroup {
    /// A cgroup (v1's memory controller, else v2's) limited to
    /// `limit_bytes`, with `pid` moved into it.
    fn new(pid: u32, limit_bytes: u64) -> LimitedCgroup {
        let name = format!("tracer-test-{}", std::process::id());
        let v1 = std::path::Path::new("/sys/fs/cgroup/memory");
        let (dir, limit_file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(&name), "memory.limit_in_bytes")
        } else {
            let controllers = std::fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
                .unwrap_or_default();
            assert!(
                controllers.split_whitespace().any(|c| c == "memory"),
                "no memory cgroup controller here (v1 or v2): cannot test the limit line"
            );
            (
                std::path::Path::new("/sys/fs/cgroup").join(&name),
                "memory.max",
            )
        };
        std::fs::create_dir_all(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()));
        std::fs::write(dir.join(limit_file), limit_bytes.to_string()).unwrap();
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        LimitedCgroup { dir }
    }
}

impl Drop for LimitedCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Where the target has a memory limit, the report says when its
/// suspected leaks reach it at their growth.
#[test]
fn the_report_says_when_a_leak_reaches_the_cgroup_limit() {
    let limit_bytes: u64 = 1 << 30;
    let fixture = Fixture::start("mappings", &[]);
    let _cgroup = LimitedCgroup::new(fixture.pid, limit_bytes);
    let mut fixture = fixture;
    let mut trace = Record::pid(fixture.pid)
        .args(["-v", "--resident"])
        .interval("250ms")
        .attach();
    trace.wait_tables_ready();
    in_steps(&mut fixture, "touch 40");
    let Traced { output, report } = trace.stop();
    let limit = &report.json["targets"][0]["memory_limit"];
    assert_eq!(limit["limit_bytes"], limit_bytes, "{limit}");
    assert!(
        limit["source"]
            .as_str()
            .is_some_and(|source| source.starts_with("cgroup /") && source.contains("tracer-test-")),
        "{limit}"
    );
    let growth = limit["growth_bytes_per_s"].as_f64().unwrap_or(0.0);
    let used = limit["used_bytes"].as_f64().unwrap_or(0.0);
    let reached = limit["reached_in_s"].as_f64().unwrap_or(0.0);
    assert!(growth > 0.0 && used > 0.0, "{limit}");
    assert!(
        (reached - (limit_bytes as f64 - used) / growth).abs() < 1.0,
        "{limit}"
    );
    let text = output.to_string();
    assert!(
        text.contains("(its suspected leaks), the limit of cgroup /")
            && text.contains("1.0 GiB")
            && text.contains("is reached in ~"),
        "{output}"
    );
}

/// A fault on a function's first instruction is walked by that
/// instruction's own row: the caller is found. (A walk that looked up the
/// row one byte early, as for a return address, took the previous
/// function's, a frame of 24 bytes, and lost the caller.)
#[test]
fn a_fault_at_a_functions_first_instruction_finds_its_caller() {
    let fixture = Fixture::start("mappings", &[]);
    let mut fixture = fixture;
    let mut trace = Record::pid(fixture.pid)
        .args(["-v", "--resident", "--unwind", "dwarf"])
        .interval("250ms")
        .attach();
    trace.wait_tables_ready();
    let answer = fixture.cmd("entry 64");
    let Traced { output, report } = trace.stop();
    let bytes = field(&answer, "bytes");
    let stacks = report.stacks_with("resident", "touch_at_entry");
    assert!(!stacks.is_empty(), "{output}\n{report}");
    for stack in &stacks {
        let functions: Vec<&str> = stack["frames"]
            .as_array()
            .map(|frames| {
                frames
                    .iter()
                    .filter_map(|frame| frame["function"].as_str())
                    .take(2)
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            functions,
            ["touch_at_entry", "touch_through_entry"],
            "{report}"
        );
    }
    assert_eq!(
        report.live_with("resident", "touch_through_entry"),
        Live::blocks(bytes / PAGE, PAGE),
        "{report}"
    );
}
