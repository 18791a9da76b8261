//! Reliability: the target's and the tracer's lifecycles, full tables,
//! other processes, namespaces and load. Each test runs the real tracer
//! with real eBPF against fixtures that know their own truth.

use crate::harness;

use std::{
    ffi::OsStr,
    os::unix::fs::PermissionsExt as _,
    process::{Command, Stdio},
    time::Duration,
};

use harness::{
    ATTACH_TIMEOUT, Fixture, Live, NESTED_LEAK_BYTES, Record, Report, Traced, churn_held, field,
    json_path, leaked, require_root, thread_dtvs,
};

#[test]
fn sigterm_writes_every_output() {
    let mut leaky = Fixture::start("leaky", &[]);
    let svg = json_path("sigterm").with_extension("svg");
    let trace = Record::pid(leaky.pid)
        .args([OsStr::new("--svg"), svg.as_os_str()])
        .attach();
    leaky.cmd("leak 7");
    let Traced { report, .. } = trace.stop_with(libc::SIGTERM);
    let svg_text = std::fs::read_to_string(&svg).expect("SIGTERM wrote the SVG");
    assert!(
        svg_text.contains(&format!("PID {}", leaky.pid)),
        "the plot names the target"
    );
    assert_eq!(
        std::fs::metadata(&svg).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let _ = std::fs::remove_file(&svg);
    assert_eq!(report.heap_live_with("leak_here"), leaked(7), "\n{report}");
    assert_eq!(report.total("heap"), leaked(7), "\n{report}");
}

/// The eBPF programs and links a process holds open, as "prog ID" and
/// "link ID", from its file descriptors.
fn bpf_objects_of(pid: u32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    let mut ids = Vec::new();
    for entry in entries.flatten() {
        let info = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in info.lines() {
            for (prefix, kind) in [("prog_id:", "prog"), ("link_id:", "link")] {
                if let Some(id) = line.strip_prefix(prefix) {
                    ids.push(format!("{kind} {}", id.trim()));
                }
            }
        }
    }
    ids.sort();
    ids.dedup();
    ids
}

/// Whether the kernel still has this program or link, per bpftool.
fn bpf_object_exists(id: &str) -> bool {
    let (kind, number) = id.split_once(' ').unwrap();
    Command::new("bpftool")
        .args([kind, "show", "id", number])
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("bpftool is installed by cargo xtask setup")
        .success()
}

#[test]
fn sigkill_leaves_nothing_behind_and_the_target_runs_on() {
    let mut leaky = Fixture::start("leaky", &[]);
    let tracer = Record::pid(leaky.pid).attach().tracer;
    let tracer_pid = tracer.pid();
    // What it holds for the trace, as bpftool sees it. Not all of its fds:
    // the programs that measured the trap cost at start close by
    // themselves, maybe between the two reads.
    let held: Vec<String> = bpf_objects_of(tracer_pid)
        .into_iter()
        .filter(|id| bpf_object_exists(id))
        .collect();
    assert!(
        held.iter().any(|id| id.starts_with("prog"))
            && held.iter().any(|id| id.starts_with("link")),
        "the tracer holds no eBPF programs and links that bpftool sees: {held:?}"
    );
    let output = tracer.stop_with(libc::SIGKILL);
    assert_eq!(output.status.code(), None, "killed by a signal");
    // The kernel frees programs and links once their last fd is closed;
    // give its deferred work a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<&String> = held.iter().filter(|id| bpf_object_exists(id)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left behind: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        field(&leaky.cmd("leak 3"), "count"),
        3,
        "the target runs on"
    );
}

/// Starts `leaky` so that it takes `pid`, which must be free: the kernel
/// hands out the PID after `ns_last_pid`, unless another process forks
/// first (then it tries again).
fn leaky_with_pid(pid: u32) -> Option<Fixture> {
    for _ in 0..100 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", pid - 1))
            .expect("root writes ns_last_pid");
        let fixture = Fixture::start("leaky", &[]);
        if fixture.pid == pid {
            return Some(fixture);
        }
    }
    None
}

#[test]
fn a_target_whose_pid_another_process_takes_has_exited() {
    let mut leaky = Fixture::start("leaky", &[]);
    let pid = leaky.pid;
    let trace = Record::pid(pid).attach();
    leaky.cmd("leak 11");
    assert_eq!(leaky.cmd("quit"), "bye");
    // Reaped at once: the PID is free again within a few ms, before
    // tracer's next look at the target (a zombie would hold it).
    drop(leaky);
    let mut taker = leaky_with_pid(pid).expect("a new process took the target's PID");
    taker.cmd("leak 5");
    // The trace ends by itself: its one target exited, whoever has its
    // PID now.
    let Traced { report, .. } = trace.wait_exit();
    let exited = report.target(pid)["exited_after_s"].as_f64();
    assert!(exited.is_some(), "the target exited: {}", report.json);
    // What the target leaked, on its own stack (symbolized from what was
    // read while it lived), and none of the newcomer's blocks or mappings.
    assert_eq!(report.heap_live_with("leak_here"), leaked(11), "\n{report}");
    assert_eq!(report.target_total(pid, "heap"), leaked(11), "\n{report}");
    assert_eq!(
        field(&taker.cmd("leak 1"), "count"),
        1,
        "the newcomer runs on"
    );
}

#[test]
fn target_exit_ends_the_trace_with_a_report() {
    let mut leaky = Fixture::start("leaky", &[]);
    let trace = Record::pid(leaky.pid).attach();
    leaky.cmd("leak 11");
    assert_eq!(leaky.cmd("quit"), "bye");
    let Traced { report, .. } = trace.wait_exit();
    // It exited after attach, and its exit ended the trace: the last
    // snapshot is the exit's.
    let exited = report.target(leaky.pid)["exited_after_s"].as_f64();
    let window = report.json["window_s"].as_f64().expect("window_s");
    assert!(
        exited.is_some_and(|exited| exited > 0.0 && exited <= window),
        "exited after {exited:?} s in a window of {window} s: {}",
        report.json
    );
    assert_eq!(report.heap_live_with("leak_here"), leaked(11), "\n{report}");
    assert_eq!(
        report.target_total(leaky.pid, "heap"),
        leaked(11),
        "\n{report}"
    );
}

#[test]
fn one_target_exits_early_the_other_is_traced_on() {
    let mut first = Fixture::start("leaky", &[]);
    let mut second = Fixture::start("leaky", &[]);
    let mut trace = Record::pids(&[first.pid, second.pid]).attach();
    first.cmd("leak 5");
    assert_eq!(first.cmd("quit"), "bye");
    trace.tracer.wait_stderr(
        &format!("tracer: PID {} exited after ", first.pid),
        ATTACH_TIMEOUT,
    );
    second.cmd("leak 9");
    let Traced { report, .. } = trace.stop();
    assert_eq!(report.targets().len(), 2, "{}", report.json["targets"]);
    // It exited inside the window, which the other target's end closed.
    let exited = report.target(first.pid)["exited_after_s"].as_f64();
    let window = report.json["window_s"].as_f64().expect("window_s");
    assert!(
        exited.is_some_and(|exited| exited > 0.0 && exited < window),
        "PID {} exited after {exited:?} s in a window of {window} s: {}",
        first.pid,
        report.json["targets"]
    );
    assert!(report.target(second.pid)["exited_after_s"].is_null());
    for (pid, count) in [(first.pid, 5), (second.pid, 9)] {
        assert_eq!(
            report.heap_live_of(pid, "leak_here"),
            leaked(count),
            "\n{report}"
        );
        assert_eq!(
            report.target_total(pid, "heap"),
            leaked(count),
            "\n{report}"
        );
    }
}

#[test]
fn only_the_given_pid_is_traced() {
    let mut traced = Fixture::start("leaky", &[]);
    let mut bystander = Fixture::start("leaky", &[]);
    let trace = Record::pid(traced.pid).attach();
    bystander.cmd("leak 40");
    bystander.cmd("churn 5");
    traced.cmd("leak 2");
    let Traced { report, .. } = trace.stop();
    for stack in report.stacks() {
        assert_eq!(stack["pid"].as_u64(), Some(traced.pid.into()), "{stack}");
    }
    assert_eq!(report.targets().len(), 1, "{}", report.json["targets"]);
    assert_eq!(report.heap_live_with("leak_here"), leaked(2), "\n{report}");
    assert_eq!(report.total("heap"), leaked(2), "\n{report}");
    // The 2 leaks, nothing from the bystander's 40 + 5 rounds of churn.
    assert_eq!(report.int("/events/allocs"), 2, "{}", report.json);
}

#[test]
fn full_live_table_is_reported_with_the_flag_to_raise() {
    let mut leaky = Fixture::start("leaky", &[]);
    let trace = Record::pid(leaky.pid).args(["--max-live", "10"]).attach();
    leaky.cmd("leak 50");
    let Traced { output, report } = trace.stop();
    assert_eq!(report.int("/drops/live_map_full"), 40, "{}", report.json);
    assert_eq!(report.heap_live_with("leak_here"), leaked(10), "\n{report}");
    assert_eq!(report.total("heap"), leaked(10), "\n{report}");
    let first_line = output.stdout.lines().next().unwrap_or_default();
    assert!(
        first_line.starts_with("WARNING: 40 events dropped (live_map_full=40)"),
        "{output}"
    );
    assert!(output.stdout.contains("raise --max-live"), "{output}");
}

#[test]
fn full_stack_table_is_reported_with_the_flag_to_raise() {
    let mut leaky = Fixture::start("leaky", &[]);
    let trace = Record::pid(leaky.pid).args(["--max-stacks", "2"]).attach();
    let answer = leaky.cmd("churn 10");
    let Traced { output, report } = trace.stop();
    let full = report.int("/drops/stack_table_full");
    assert!(full > 0, "{}", report.json);
    assert!(output.stdout.starts_with("WARNING: "), "{output}");
    assert!(output.stdout.contains("raise --max-stacks"), "{output}");
    // Blocks whose stack was not stored still count, under no stack: the
    // listed stacks add up to the totals (checked when the report is read),
    // and those to exactly what churn keeps.
    assert_eq!(report.total("heap"), churn_held(&answer), "\n{report}");
}

#[test]
fn outputs_never_follow_a_planted_symlink() {
    require_root();
    let mut leaky = Fixture::start("leaky", &[]);
    let json = json_path("symlink");
    let victim = json.with_extension("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::os::unix::fs::symlink(&victim, &json).unwrap();
    let tracer = Record::pid(leaky.pid).json_at(&json).attach().tracer;
    leaky.cmd("leak 1");
    tracer.stop().assert_success();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let metadata = std::fs::symlink_metadata(&json).unwrap();
    assert!(
        metadata.file_type().is_file(),
        "the symlink was replaced by the report"
    );
    assert_eq!(metadata.permissions().mode() & 0o777, 0o600);
    let _ = std::fs::remove_file(&victim);
    let report = Report::read_checked(&json);
    assert_eq!(report.heap_live_with("leak_here"), leaked(1), "\n{report}");
}

/// A fixture started in its own PID and mount namespaces, from a tmpfs that
/// only that mount namespace sees.
struct NamespacedFixture {
    /// `unshare`, whose child runs the fixture.
    fixture: Fixture,
    host_pid: u32,
}

impl NamespacedFixture {
    /// Fixture `name`, copied into the namespace's tmpfs as `leaky`.
    fn start(name: &str) -> Self {
        let directory =
            std::env::temp_dir().join(format!("tracer-ns-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let mut unshare = Command::new("unshare");
        unshare
            .args([
                "--mount",
                "--pid",
                "--fork",
                "--propagation",
                "private",
                "sh",
                "-c",
            ])
            .arg(r#"mount -t tmpfs none "$1" && cp "$2" "$1/leaky" && exec "$1/leaky""#)
            .arg("sh")
            .arg(&directory)
            .arg(harness::fixture(name));
        let (fixture, ready) = Fixture::spawn(unshare);
        assert_eq!(ready, "ready pid=1", "PID 1 in its own namespace");
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", fixture.pid)).unwrap();
        let host_pid = children.split_whitespace().next().unwrap().parse().unwrap();
        assert!(
            !directory.join("leaky").exists(),
            "the fixture's file is invisible from the host"
        );
        Self { fixture, host_pid }
    }
}

impl Drop for NamespacedFixture {
    fn drop(&mut self) {
        // SAFETY: kills the fixture, PID 1 of its namespace, and so the rest.
        unsafe { libc::kill(self.host_pid as i32, libc::SIGKILL) };
    }
}

#[test]
fn target_in_other_pid_and_mount_namespaces() {
    require_root();
    let mut namespaced = NamespacedFixture::start("leaky");
    let trace = Record::pid(namespaced.host_pid).attach();
    assert_eq!(field(&namespaced.fixture.cmd("leak 13"), "count"), 13);
    let Traced { report, .. } = trace.stop();
    assert_eq!(report.heap_live_with("leak_here"), leaked(13), "{report}");
    assert_eq!(report.total("heap"), leaked(13), "{report}");
    assert_eq!(
        field(&namespaced.fixture.cmd("leak 1"), "count"),
        1,
        "the target runs on"
    );
}

#[test]
fn dwarf_unwinding_reads_the_files_of_a_target_in_other_namespaces() {
    // nested_nofp has no frame pointers: its stacks are unwound from the
    // .eh_frame of a file that only the target's mount namespace sees
    // (read through /proc/PID/root).
    require_root();
    let mut namespaced = NamespacedFixture::start("nested_nofp");
    let trace = Record::pid(namespaced.host_pid)
        .args(["--unwind", "dwarf"])
        .attach();
    assert_eq!(
        namespaced.fixture.cmd("leak 11"),
        format!("leaked bytes={}", 11 * NESTED_LEAK_BYTES)
    );
    let Traced { report, .. } = trace.stop();
    let stacks = report.heap_stacks_with("inner_static");
    assert_eq!(stacks.len(), 1, "{report}");
    let leak = Live::blocks(11, NESTED_LEAK_BYTES);
    assert_eq!(harness::stack_live(stacks[0]), leak, "{report}");
    assert_eq!(report.total("heap"), leak, "{report}");
    for function in ["middle_static", "outer_static", "main"] {
        assert!(
            harness::frames_contain(stacks[0], function),
            "{function} missing: {report}"
        );
    }
}

#[test]
fn eight_threads_storming_for_60_s_stay_exact() {
    let mut storm = Fixture::start("storm", &[]);
    let trace = Record::pid(storm.pid).attach();
    let answer = storm.cmd("run 8 60");
    let Traced { report, .. } = trace.stop();
    report.assert_no_drops();
    assert_eq!(
        report.heap_live_with("storm_ring"),
        Live::answered(&answer, "ring_bytes", "ring_blocks"),
        "{answer}"
    );
    assert_eq!(
        report.heap_live_with("storm_keep"),
        Live::answered(&answer, "keep_bytes", "keep_blocks"),
        "{answer}"
    );
    assert!(field(&answer, "calls") > 1000, "{answer}");
}

#[test]
fn malloc_in_a_signal_handler_interrupting_malloc_is_counted() {
    let session = harness::record_while("reentrant", &["signal 50"]);
    let answer = &session.answers[0];
    let report = &session.report;
    // The handler's stacks run through outer_alloc too (the signal frame
    // sits on the interrupted stack): match the innermost frame.
    let innermost_is = |stack: &serde_json::Value, function: &str| {
        stack["frames"][0]["function"]
            .as_str()
            .is_some_and(|name| name.contains(function))
    };
    let outer_stacks: Vec<&serde_json::Value> = report
        .stacks()
        .iter()
        .filter(|stack| innermost_is(stack, "outer_alloc"))
        .collect();
    let outer = harness::sum_live(&outer_stacks);
    assert_eq!(
        outer,
        Live::answered(answer, "outer_bytes", "count"),
        "{report}"
    );
    let handler = Live {
        bytes: field(answer, "handler_bytes"),
        allocs: 50,
    };
    assert_eq!(report.heap_live_with("handler_alloc"), handler, "{report}");
    assert_eq!(report.total("heap"), outer + handler, "{report}");
}

#[test]
fn fork_in_a_multithreaded_process_keeps_the_parent_exact() {
    let session = harness::record_while("reentrant", &["fork 4 200", "overflow"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "child_exit"), 0);
    let threads = Live {
        bytes: field(&session.answers[0], "thread_bytes"),
        allocs: 800,
    };
    assert_eq!(report.heap_live_with("thread_alloc"), threads, "{report}");
    let dtvs = thread_dtvs(report, 4);
    assert_eq!(report.total("heap"), threads + dtvs, "{report}");
    assert_eq!(
        report.heap_live_with("child_alloc"),
        Live::default(),
        "children are not traced"
    );
    // reallocarray's and calloc's overflowing sizes: both fail, nothing
    // is recorded; glibc's reallocarray has no probe (it returns what
    // its call of realloc returns) and fails before that call, so only
    // calloc's failure is counted.
    assert_eq!(session.answers[1], "overflow null=2");
    assert_eq!(report.int("/events/failed_allocs"), 1, "{}", report.json);
}
