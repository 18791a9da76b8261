//! `--comm`: a daemon that follows a service by its command name across
//! restarts and leaves other programs alone, read through `--listen`'s
//! /metrics; and `top --listen`, which serves the same metrics.

use crate::harness;

use std::path::PathBuf;
use std::process::Command;

use harness::*;

/// A copy of leaky under another command name, in a fresh directory.
fn leaky_named(name: &str) -> PathBuf {
    let directory = std::env::temp_dir().join(format!("tracer-test-comm-{}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("comm directory");
    let path = directory.join(name);
    std::fs::copy(fixture("leaky"), &path).expect("copy leaky");
    path
}

/// Starts `program` (a leaky) and waits for its `ready` line.
fn start_leaky_at(program: &PathBuf) -> Fixture {
    let (fixture, ready) = Fixture::spawn(Command::new(program));
    assert_eq!(ready, format!("ready pid={}", fixture.pid));
    fixture
}

#[test]
fn comm_follows_a_service_across_restarts_and_leaves_others_alone() {
    let name = format!("lc{}", std::process::id() % 100_000_000);
    let service = leaky_named(&name);
    let bystander = leaky_named(&format!("lb{}", std::process::id() % 100_000_000));
    let mut other = start_leaky_at(&bystander);
    let mut first = start_leaky_at(&service);
    let mut trace = Record::pids(&[])
        .interval("200ms")
        .args(["--comm", &name, "--listen", "0"])
        .attach();
    let address = listen_address(&mut trace.tracer);
    other.cmd("leak 9");

    // First life: running at attach.
    let leaked = field(&first.cmd("leak 3"), "bytes");
    let first_pid = first.pid;
    wait_for_samples(&address, "the first life's leak", |samples| {
        samples.iter().any(|(pid, site, bytes)| {
            *pid == first_pid && site.starts_with("leak_here") && *bytes == leaked
        })
    });
    drop(first); // killed: the service crashes
    wait_for_samples(&address, "the first life's metrics gone", |samples| {
        samples.iter().all(|(pid, _, _)| *pid != first_pid)
    });

    // Second life: started later under the same name.
    let mut second = start_leaky_at(&service);
    trace
        .tracer
        .wait_stderr(&format!("tracing PID {}", second.pid), ATTACH_TIMEOUT);
    let leaked = field(&second.cmd("leak 5"), "bytes");
    let second_pid = second.pid;
    let samples = wait_for_samples(&address, "the second life's leak", |samples| {
        samples.iter().any(|(pid, site, bytes)| {
            *pid == second_pid && site.starts_with("leak_here") && *bytes == leaked
        })
    });
    assert!(
        samples.iter().all(|(pid, _, _)| *pid == second_pid),
        "only the live service is listed: {samples:?}"
    );
    let (_, metrics) = http_get(&address, "/metrics");
    let metrics = String::from_utf8_lossy(&metrics).into_owned();
    assert!(metrics.contains("\ntracer_targets 1\n"), "{metrics}");

    let traced = trace.stop();
    let stderr = &traced.output.stderr;
    assert!(
        !stderr.contains(&format!("PID {}", other.pid)),
        "the bystander was never traced: {stderr}"
    );
    assert!(
        stderr.contains(&format!("PID {first_pid} exited")),
        "{stderr}"
    );
    let pids: Vec<i64> = traced.report.json["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .map(|target| target["pid"].as_i64().expect("pid"))
        .collect();
    assert_eq!(pids, vec![i64::from(first_pid), i64::from(second_pid)]);
    assert_eq!(
        traced.report.heap_live_with("leak_here"),
        Live::blocks(5, LEAK_SIZE_BYTES),
        "the report holds the live service only:\n{}",
        traced.report
    );
    let _ = std::fs::remove_dir_all(service.parent().expect("directory"));
    drop(other);
}

#[test]
fn comm_flags_that_cannot_work_fail_in_one_line() {
    for (args, message) in [
        (&["--comm", "a/b"][..], "a command name, without '/'"),
        (
            &["--comm-regex", "("][..],
            "is not a regular expression: unclosed group",
        ),
        (&["--comm", "x", "--pid", "1"][..], "cannot be used with"),
        (
            &["--comm", "x", "--max-targets", "0"][..],
            "--max-targets must be at least 1",
        ),
    ] {
        let output = Tracer::start(std::iter::once("record").chain(args.iter().copied()))
            .wait_exit(EXIT_TIMEOUT);
        let line = assert_one_line_error(&output, 2);
        assert!(line.contains(message), "{args:?}: {output}");
    }
}

#[test]
fn top_serves_the_same_metrics() {
    require_root();
    let mut fixture = Fixture::start("leaky", &[]);
    let pid = fixture.pid.to_string();
    let mut tracer = Tracer::start(["top", "--pid", &pid, "--interval", "200ms", "--listen", "0"]);
    let address = listen_address(&mut tracer);
    tracer.wait_attached(ATTACH_TIMEOUT);
    let leaked = field(&fixture.cmd("leak 4"), "bytes");
    wait_for_samples(&address, "top's /metrics", |samples| {
        samples.iter().any(|(sample_pid, site, bytes)| {
            *sample_pid == fixture.pid && site.starts_with("leak_here") && *bytes == leaked
        })
    });
    tracer.stop().assert_success();
}
