//! Reliability: the target's and the tracer's lifecycles, full tables,
//! other processes, namespaces and load. Each test runs the real tracer
//! with real eBPF against fixtures that know their own truth.

#[allow(dead_code, reason = "other test files use the rest of the harness")]
mod harness;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::fs::PermissionsExt as _,
    process::{Command, Stdio},
    time::Duration,
};

use harness::{
    ATTACH_TIMEOUT, EXIT_TIMEOUT, Fixture, Live, Report, Tracer, field, json_path, require_root,
};

const LEAK_SIZE_BYTES: i64 = 1337;

fn record_args<'a>(pids: &'a [String], json: &'a str) -> Vec<&'a str> {
    let mut args = vec![
        "record",
        "--interval",
        "200ms",
        "--top",
        "100",
        "--json",
        json,
    ];
    for pid in pids {
        args.extend(["--pid", pid.as_str()]);
    }
    args
}

fn signal(tracer_pid: u32, signal: i32) {
    // SAFETY: kill has no memory preconditions; the pid is our child.
    assert_eq!(unsafe { libc::kill(tracer_pid as i32, signal) }, 0);
}

#[test]
fn sigterm_writes_every_output() {
    require_root();
    let mut leaky = Fixture::start("leaky", &[]);
    let json = json_path("sigterm");
    let svg = json.with_extension("svg");
    let pid = leaky.pid.to_string();
    let mut args = record_args(std::slice::from_ref(&pid), json.to_str().unwrap());
    args.extend(["--svg", svg.to_str().unwrap()]);
    let mut tracer = Tracer::start(&args);
    tracer.wait_attached(ATTACH_TIMEOUT);
    leaky.cmd("leak 7");
    signal(tracer.pid(), libc::SIGTERM);
    let output = tracer.wait_exit(EXIT_TIMEOUT);
    output.assert_success();
    let svg_text = std::fs::read_to_string(&svg).expect("SIGTERM wrote the SVG");
    assert!(
        svg_text.contains(&format!("PID {pid}")),
        "the plot names the target"
    );
    assert_eq!(
        std::fs::metadata(&svg).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let _ = std::fs::remove_file(&svg);
    let report = Report::read(&json);
    assert_eq!(
        report.heap_live_with("leak_here").bytes,
        7 * LEAK_SIZE_BYTES
    );
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
    require_root();
    let mut leaky = Fixture::start("leaky", &[]);
    let pid = leaky.pid.to_string();
    let mut tracer = Tracer::start(["record", "--pid", &pid]);
    tracer.wait_attached(ATTACH_TIMEOUT);
    let tracer_pid = tracer.pid();
    let held = bpf_objects_of(tracer_pid);
    assert!(
        held.iter().any(|id| id.starts_with("prog"))
            && held.iter().any(|id| id.starts_with("link")),
        "the tracer holds no eBPF programs and links: {held:?}"
    );
    assert!(
        held.iter().all(|id| bpf_object_exists(id)),
        "bpftool sees {held:?}"
    );
    signal(tracer_pid, libc::SIGKILL);
    let output = tracer.wait_exit(EXIT_TIMEOUT);
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
    assert!(
        leaky.cmd("leak 3").starts_with("leaked count=3"),
        "the target runs on"
    );
}

#[test]
fn target_exit_ends_the_trace_with_a_report() {
    require_root();
    let mut leaky = Fixture::start("leaky", &[]);
    let json = json_path("target_exit");
    let pid = leaky.pid.to_string();
    let mut tracer = Tracer::start(record_args(
        std::slice::from_ref(&pid),
        json.to_str().unwrap(),
    ));
    tracer.wait_attached(ATTACH_TIMEOUT);
    leaky.cmd("leak 11");
    assert_eq!(leaky.cmd("quit"), "bye");
    let output = tracer.wait_exit(EXIT_TIMEOUT);
    output.assert_success();
    let report = Report::read(&json);
    assert!(
        report.json["targets"][0]["exited_after_s"]
            .as_f64()
            .is_some(),
        "{}",
        report.json
    );
    assert_eq!(
        report.heap_live_with("leak_here").bytes,
        11 * LEAK_SIZE_BYTES
    );
}

#[test]
fn one_target_exits_early_the_other_is_traced_on() {
    require_root();
    let mut first = Fixture::start("leaky", &[]);
    let mut second = Fixture::start("leaky", &[]);
    let json = json_path("two_targets");
    let pids = [first.pid.to_string(), second.pid.to_string()];
    let mut tracer = Tracer::start(record_args(&pids, json.to_str().unwrap()));
    tracer.wait_attached(ATTACH_TIMEOUT);
    first.cmd("leak 5");
    assert_eq!(first.cmd("quit"), "bye");
    std::thread::sleep(Duration::from_millis(500));
    second.cmd("leak 9");
    let output = tracer.stop();
    output.assert_success();
    let report = Report::read(&json);
    let targets = report.json["targets"].as_array().unwrap();
    let by_pid = |pid: u32| {
        targets
            .iter()
            .find(|target| target["pid"].as_u64() == Some(pid.into()))
            .unwrap_or_else(|| panic!("PID {pid} missing: {}", report.json))
    };
    assert!(by_pid(first.pid)["exited_after_s"].as_f64().is_some());
    assert!(by_pid(second.pid)["exited_after_s"].is_null());
    let live_of = |pid: u32| -> i64 {
        report
            .heap_stacks_with("leak_here")
            .iter()
            .filter(|stack| stack["pid"].as_u64() == Some(pid.into()))
            .map(|stack| stack["live_bytes"].as_i64().unwrap())
            .sum()
    };
    assert_eq!(live_of(first.pid), 5 * LEAK_SIZE_BYTES);
    assert_eq!(live_of(second.pid), 9 * LEAK_SIZE_BYTES);
}

#[test]
fn only_the_given_pid_is_traced() {
    require_root();
    let mut traced = Fixture::start("leaky", &[]);
    let mut bystander = Fixture::start("leaky", &[]);
    let json = json_path("bystander");
    let pid = traced.pid.to_string();
    let mut tracer = Tracer::start(record_args(
        std::slice::from_ref(&pid),
        json.to_str().unwrap(),
    ));
    tracer.wait_attached(ATTACH_TIMEOUT);
    bystander.cmd("leak 40");
    bystander.cmd("churn 5");
    traced.cmd("leak 2");
    let output = tracer.stop();
    output.assert_success();
    let report = Report::read(&json);
    for stack in report.stacks() {
        assert_eq!(stack["pid"].as_u64(), Some(traced.pid.into()), "{stack}");
    }
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live {
            bytes: 2 * LEAK_SIZE_BYTES,
            allocs: 2
        }
    );
    // 2 leaks, plus nothing from the bystander's 40 + 5 rounds of churn.
    assert!(report.int("/events/allocs") < 10, "{}", report.json);
}

#[test]
fn full_live_table_is_reported_with_the_flag_to_raise() {
    require_root();
    let mut leaky = Fixture::start("leaky", &[]);
    let json = json_path("live_full");
    let pid = leaky.pid.to_string();
    let mut args = record_args(std::slice::from_ref(&pid), json.to_str().unwrap());
    args.extend(["--max-live", "10"]);
    let mut tracer = Tracer::start(&args);
    tracer.wait_attached(ATTACH_TIMEOUT);
    leaky.cmd("leak 50");
    let output = tracer.stop();
    output.assert_success();
    let report = Report::read(&json);
    assert_eq!(report.int("/drops/live_map_full"), 40, "{}", report.json);
    assert_eq!(
        report.heap_live_with("leak_here").bytes,
        10 * LEAK_SIZE_BYTES
    );
    let first_line = output.stdout.lines().next().unwrap_or_default();
    assert!(
        first_line.starts_with("WARNING: 40 events dropped (live_map_full=40)"),
        "{output}"
    );
    assert!(output.stdout.contains("raise --max-live"), "{output}");
}

#[test]
fn full_stack_table_is_reported_with_the_flag_to_raise() {
    require_root();
    let mut leaky = Fixture::start("leaky", &[]);
    let json = json_path("stacks_full");
    let pid = leaky.pid.to_string();
    let mut args = record_args(std::slice::from_ref(&pid), json.to_str().unwrap());
    args.extend(["--max-stacks", "2"]);
    let mut tracer = Tracer::start(&args);
    tracer.wait_attached(ATTACH_TIMEOUT);
    let answer = leaky.cmd("churn 10");
    let output = tracer.stop();
    output.assert_success();
    let report = Report::read(&json);
    let collisions = report.int("/drops/stack_map_collision");
    assert!(collisions > 0, "{}", report.json);
    assert!(output.stdout.starts_with("WARNING: "), "{output}");
    assert!(output.stdout.contains("raise --max-stacks"), "{output}");
    // Blocks whose stack was not stored still count, under no stack.
    let live: i64 = report
        .stacks()
        .iter()
        .map(|stack| stack["live_bytes"].as_i64().unwrap())
        .sum();
    let held = field(&answer, "churn_keep") + field(&answer, "churn_memalign");
    assert!(live >= held, "live {live} < held {held}: {}", report.json);
}

#[test]
fn outputs_never_follow_a_planted_symlink() {
    require_root();
    let mut leaky = Fixture::start("leaky", &[]);
    let json = json_path("symlink");
    let victim = json.with_extension("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::os::unix::fs::symlink(&victim, &json).unwrap();
    let pid = leaky.pid.to_string();
    let mut tracer = Tracer::start(record_args(
        std::slice::from_ref(&pid),
        json.to_str().unwrap(),
    ));
    tracer.wait_attached(ATTACH_TIMEOUT);
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
    Report::read(&json);
}

/// A fixture started in its own PID and mount namespaces, from a tmpfs that
/// only that mount namespace sees.
struct NamespacedFixture {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
    host_pid: u32,
}

impl NamespacedFixture {
    fn start() -> Self {
        Self::start_named("leaky")
    }

    /// Fixture `name`, copied into the namespace's tmpfs as `leaky`.
    fn start_named(name: &str) -> Self {
        let directory =
            std::env::temp_dir().join(format!("tracer-ns-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let fixture = harness::fixture(name);
        let mut child = Command::new("unshare")
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
            .arg(&fixture)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start unshare");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut ready = String::new();
        stdout.read_line(&mut ready).unwrap();
        assert_eq!(ready.trim(), "ready pid=1", "PID 1 in its own namespace");
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id())).unwrap();
        let host_pid = children.split_whitespace().next().unwrap().parse().unwrap();
        assert!(
            !directory.join("leaky").exists(),
            "the fixture's file is invisible from the host"
        );
        Self {
            child,
            stdin,
            stdout,
            host_pid,
        }
    }

    fn cmd(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        answer.trim().to_owned()
    }
}

impl Drop for NamespacedFixture {
    fn drop(&mut self) {
        // SAFETY: kills the fixture, PID 1 of its namespace, and so the rest.
        unsafe { libc::kill(self.host_pid as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

#[test]
fn target_in_other_pid_and_mount_namespaces() {
    require_root();
    let mut fixture = NamespacedFixture::start();
    let json = json_path("namespaces");
    let pid = fixture.host_pid.to_string();
    let mut tracer = Tracer::start(record_args(
        std::slice::from_ref(&pid),
        json.to_str().unwrap(),
    ));
    tracer.wait_attached(ATTACH_TIMEOUT);
    assert!(fixture.cmd("leak 13").starts_with("leaked count=13"));
    let output = tracer.stop();
    output.assert_success();
    let report = Report::read(&json);
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live {
            bytes: 13 * LEAK_SIZE_BYTES,
            allocs: 13
        },
        "{report}"
    );
    assert!(
        fixture.cmd("leak 1").starts_with("leaked count=1"),
        "the target runs on"
    );
}

#[test]
fn dwarf_unwinding_reads_the_files_of_a_target_in_other_namespaces() {
    // nested_nofp has no frame pointers: its stacks are unwound from the
    // .eh_frame of a file that only the target's mount namespace sees
    // (read through /proc/PID/root).
    require_root();
    let mut fixture = NamespacedFixture::start_named("nested_nofp");
    let json = json_path("namespaces-dwarf");
    let pid = fixture.host_pid.to_string();
    let mut args = record_args(std::slice::from_ref(&pid), json.to_str().unwrap());
    args.extend(["--unwind", "dwarf"]);
    let mut tracer = Tracer::start(args);
    tracer.wait_attached(ATTACH_TIMEOUT);
    assert_eq!(fixture.cmd("leak 11"), format!("leaked bytes={}", 11 * 777));
    let output = tracer.stop();
    output.assert_success();
    let report = Report::read(&json);
    let stacks = report.heap_stacks_with("inner_static");
    assert_eq!(stacks.len(), 1, "{report}");
    assert_eq!(harness::stack_int(stacks[0], "live_bytes"), 11 * 777);
    for function in ["middle_static", "outer_static", "main"] {
        assert!(
            harness::frames_contain(stacks[0], function),
            "{function} missing: {report}"
        );
    }
}

#[test]
fn eight_threads_storming_for_60_s_stay_exact() {
    require_root();
    let mut storm = Fixture::start("storm", &[]);
    let json = json_path("storm");
    let pid = storm.pid.to_string();
    let mut tracer = Tracer::start(record_args(
        std::slice::from_ref(&pid),
        json.to_str().unwrap(),
    ));
    tracer.wait_attached(ATTACH_TIMEOUT);
    let answer = storm.cmd("run 8 60");
    let output = tracer.stop();
    output.assert_success();
    let report = Report::read(&json);
    assert!(
        report.json["drops"].as_object().unwrap().is_empty(),
        "{}",
        report.json["drops"]
    );
    assert_eq!(
        report.heap_live_with("storm_ring"),
        Live {
            bytes: field(&answer, "ring_bytes"),
            allocs: field(&answer, "ring_blocks")
        },
        "{answer}"
    );
    assert_eq!(
        report.heap_live_with("storm_keep"),
        Live {
            bytes: field(&answer, "keep_bytes"),
            allocs: field(&answer, "keep_blocks")
        },
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
    let outer: i64 = report
        .stacks()
        .iter()
        .filter(|stack| innermost_is(stack, "outer_alloc"))
        .map(|stack| stack["live_bytes"].as_i64().unwrap())
        .sum();
    assert_eq!(outer, field(answer, "outer_bytes"), "{report}");
    assert_eq!(
        report.heap_live_with("handler_alloc"),
        Live {
            bytes: field(answer, "handler_bytes"),
            allocs: 50
        },
        "{report}"
    );
}

#[test]
fn fork_in_a_multithreaded_process_keeps_the_parent_exact() {
    let session = harness::record_while("reentrant", &["fork 4 200", "overflow"]);
    let report = &session.report;
    assert_eq!(field(&session.answers[0], "child_exit"), 0);
    assert_eq!(
        report.heap_live_with("thread_alloc"),
        Live {
            bytes: field(&session.answers[0], "thread_bytes"),
            allocs: 800
        },
        "{report}"
    );
    assert_eq!(
        report.heap_live_with("child_alloc"),
        Live::default(),
        "children are not traced"
    );
    assert_eq!(session.answers[1], "overflow null=1");
    assert!(report.int("/events/failed_allocs") >= 1, "{}", report.json);
}

#[test]
fn follow_forks_traces_children_and_without_it_they_cost_nothing() {
    for follow in [true, false] {
        require_root();
        let mut fixture = Fixture::start("reentrant", &[]);
        let json = json_path("follow_forks");
        let pid = fixture.pid.to_string();
        let mut args = record_args(std::slice::from_ref(&pid), json.to_str().unwrap());
        if follow {
            args.push("--follow-forks");
        }
        let mut tracer = Tracer::start(&args);
        tracer.wait_attached(ATTACH_TIMEOUT);
        let child: u32 = field(&fixture.cmd("spawn 300"), "pid").try_into().unwrap();
        // The child leaks 1.5 s after the fork; give it time to finish.
        std::thread::sleep(Duration::from_millis(3000));
        let output = tracer.stop();
        // SAFETY: the child of our fixture, which sleeps until killed.
        unsafe { libc::kill(child as i32, libc::SIGKILL) };
        output.assert_success();
        let report = Report::read(&json);
        let child_bytes: i64 = report
            .heap_stacks_with("child_alloc")
            .iter()
            .filter(|stack| stack["pid"].as_u64() == Some(child.into()))
            .map(|stack| stack["live_bytes"].as_i64().unwrap())
            .sum();
        let followed = report.json["targets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|target| target["pid"].as_u64() == Some(child.into()));
        if follow {
            assert_eq!(child_bytes, 300 * 1000, "{report}");
            assert!(followed.is_some_and(|target| target["followed_after_s"].as_f64().is_some()));
            assert!(output.stdout.contains("a child followed from"), "{output}");
        } else {
            assert_eq!(child_bytes, 0, "{report}");
            assert!(followed.is_none(), "{}", report.json["targets"]);
        }
    }
}

#[test]
fn exec_marks_the_boundary_and_the_new_image_is_traced() {
    require_root();
    let mut fixture = Fixture::start("reentrant", &[]);
    let json = json_path("exec");
    let pid = fixture.pid.to_string();
    let mut tracer = Tracer::start(record_args(
        std::slice::from_ref(&pid),
        json.to_str().unwrap(),
    ));
    tracer.wait_attached(ATTACH_TIMEOUT);
    fixture.cmd("signal 20");
    let leaky = harness::fixture("leaky");
    let ready = fixture.cmd(&format!("exec {}", leaky.display()));
    assert_eq!(
        ready,
        format!("ready pid={pid}"),
        "the same process runs leaky now"
    );
    // Let the tracer see the exec and the new image's files.
    std::thread::sleep(Duration::from_millis(1500));
    fixture.cmd("leak 10");
    let output = tracer.stop();
    output.assert_success();
    let report = Report::read(&json);
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live {
            bytes: 10 * LEAK_SIZE_BYTES,
            allocs: 10
        },
        "{report}"
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
    let execs = report.json["targets"][0]["execs_after_s"]
        .as_array()
        .unwrap();
    assert_eq!(execs.len(), 1, "{}", report.json["targets"]);
    assert!(
        output.stdout.contains("replaced its image (exec)"),
        "{output}"
    );
}

#[test]
fn full_ring_buffer_is_reported_with_the_flag_to_raise() {
    require_root();
    let mut fixture = Fixture::start("mappings", &[]);
    let json = json_path("ring_full");
    let pid = fixture.pid.to_string();
    let mut args = record_args(std::slice::from_ref(&pid), json.to_str().unwrap());
    args.extend(["--ring-buffer-kib", "4"]);
    let mut tracer = Tracer::start(&args);
    tracer.wait_attached(ATTACH_TIMEOUT);
    fixture.cmd("churn 3000");
    let output = tracer.stop();
    output.assert_success();
    let report = Report::read(&json);
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
