//! Record once, analyze anywhere: `tracer record -o FILE` against
//! tests/fixtures/leaky, then `tracer report FILE` in every format, read
//! back by the tools each format is for (go tool pprof, inferno).

use crate::harness;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::{
    ATTACH_TIMEOUT, EXIT_TIMEOUT, Fixture, LEAK_SIZE_BYTES, Live, Record, Report, Traced, Tracer,
    TracerOutput, build_id, churn_held, field, fixture, json_path, return_address,
};
use serde_json::Value;
/// Exit code for a recording that cannot be read (`tracer --help`).
const EXIT_BAD_RECORDING: i32 = 9;

/// A fresh path for a recording in the temporary directory.
fn recording_path(test_name: &str) -> PathBuf {
    json_path(test_name).with_extension("tracer")
}

/// `tracer report <args>`, run to its end.
fn report(args: &[&OsStr]) -> TracerOutput {
    let mut all = vec![OsStr::new("report")];
    all.extend_from_slice(args);
    Tracer::start(all).wait_exit(EXIT_TIMEOUT)
}

/// `tracer report RECORDING --format FORMAT <args>`, run to its end.
fn report_as(recording: &Path, format: &str, args: &[&OsStr]) -> TracerOutput {
    let mut all = vec![
        recording.as_os_str(),
        OsStr::new("--format"),
        OsStr::new(format),
    ];
    all.extend_from_slice(args);
    report(&all)
}

/// Records the running `leaky` fixture while it leaks `leaks` blocks in
/// leak_here and churns a little, with the live JSON report next to the
/// recording; returns (recording, live report).
fn record_leaky(test_name: &str, leaks: i64) -> (PathBuf, Report) {
    let mut leaky = Fixture::start("leaky", &[]);
    let recording = recording_path(test_name);
    let trace = Record::pid(leaky.pid)
        .interval("100ms")
        .args([OsStr::new("-o"), recording.as_os_str()])
        .attach();
    let answer = leaky.cmd(&format!("leak {leaks}"));
    assert_eq!(field(&answer, "bytes"), leaks * LEAK_SIZE_BYTES);
    let churn = leaky.cmd("churn 5");
    let Traced { output, report } = trace.stop();
    let held = churn_held(&churn);
    assert_eq!(
        report.total("heap"),
        Live::blocks(leaks, LEAK_SIZE_BYTES) + held,
        "\n{report}"
    );
    assert!(
        output
            .stderr
            .contains(&format!("tracer: wrote {}", recording.display())),
        "{output}"
    );
    (recording, report)
}

#[test]
fn report_json_equals_the_live_json() {
    let (recording, live) = record_leaky("round-trip", 50);
    let output = report_as(
        &recording,
        "json",
        &[OsStr::new("--top"), OsStr::new("100")],
    );
    output.assert_success();
    assert_eq!(output.stderr, "", "a complete recording has no warning");
    let mut replayed: Value = serde_json::from_str(&output.stdout).expect("report is JSON");
    // What tracing cost the target is measured while tracing, and the
    // target's memory limit read at its end, and neither is recorded
    // (docs/recordings.md): null in a report of a recording.
    assert!(live.json["cost"].is_object(), "{}", live.json["cost"]);
    assert_eq!(replayed["cost"], Value::Null);
    assert!(
        live.json["targets"][0]["memory_limit"].is_object(),
        "{}",
        live.json["targets"][0]
    );
    assert_eq!(replayed["targets"][0]["memory_limit"], Value::Null);
    let mut live_json = live.json.clone();
    for json in [&mut replayed, &mut live_json] {
        json.as_object_mut().expect("an object").remove("cost");
        for target in json["targets"].as_array_mut().expect("targets") {
            target
                .as_object_mut()
                .expect("an object")
                .remove("memory_limit");
        }
    }
    assert_eq!(
        replayed, live_json,
        "report --format json differs from --json"
    );
    assert_eq!(
        live.heap_live_with("leak_here"),
        Live::blocks(50, LEAK_SIZE_BYTES)
    );
    let frame = &live.heap_stacks_with("leak_here")[0]["frames"][0];
    assert_eq!(frame["function"], "leak_here");
    let leaky = fixture("leaky");
    assert_eq!(frame["build_id"], build_id(&leaky).as_str(), "{frame}");
    // leaky's code is mapped at the file offsets of its ELF addresses.
    assert_eq!(
        frame["file_offset"],
        return_address(&leaky, "leak_here", "malloc"),
        "not the return address of leak_here's malloc call: {frame}"
    );

    let text = report(&[recording.as_os_str()]);
    text.assert_success();
    assert!(text.stdout.contains("leak_here"), "{text}");
    let _ = std::fs::remove_file(&recording);
}

#[test]
fn folded_stacks_are_read_by_inferno() {
    let (recording, _) = record_leaky("folded", 40);
    let output = report_as(&recording, "folded", &[]);
    output.assert_success();
    let leak_line = output
        .stdout
        .lines()
        .find(|line| line.contains("leak_here"))
        .unwrap_or_else(|| panic!("no leak_here line: {output}"));
    let (stack, value) = leak_line.rsplit_once(' ').expect("`stack value`");
    assert!(stack.ends_with(";leak_here"), "innermost last: {leak_line}");
    assert!(stack.contains("main;"), "outermost first: {leak_line}");
    assert_eq!(value, (40 * LEAK_SIZE_BYTES).to_string());

    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(
        &mut inferno::flamegraph::Options::default(),
        output.stdout.lines(),
        &mut svg,
    )
    .expect("inferno reads the folded stacks");
    assert!(String::from_utf8_lossy(&svg).contains("leak_here"));

    let allocs = report_as(
        &recording,
        "folded",
        &[OsStr::new("--value"), OsStr::new("live-allocs")],
    );
    assert!(
        allocs
            .stdout
            .lines()
            .any(|line| line == format!("{stack} 40")),
        "{allocs}"
    );

    let svg_path = recording.with_extension("svg");
    let flamegraph = report_as(
        &recording,
        "flamegraph",
        &[OsStr::new("-o"), svg_path.as_os_str()],
    );
    flamegraph.assert_success();
    let svg = std::fs::read_to_string(&svg_path).expect("flame graph written");
    assert!(svg.contains("<svg") && svg.contains("leak_here"));
    let _ = std::fs::remove_file(&svg_path);
    let _ = std::fs::remove_file(&recording);
}

#[test]
fn go_tool_pprof_lists_leak_here_with_its_bytes() {
    let (recording, _) = record_leaky("pprof", 60);
    let profile = recording.with_extension("pb.gz");
    let output = report_as(
        &recording,
        "pprof",
        &[OsStr::new("-o"), profile.as_os_str()],
    );
    output.assert_success();
    let go = std::process::Command::new("go")
        .args(["tool", "pprof", "-top", "-unit=byte"])
        .arg(&profile)
        .output();
    let go = go.unwrap_or_else(|error| {
        panic!("could not run go tool pprof ({error}): `cargo xtask setup` installs Go")
    });
    let top = String::from_utf8_lossy(&go.stdout);
    assert!(
        go.status.success(),
        "go tool pprof failed: {top}\n{}",
        String::from_utf8_lossy(&go.stderr)
    );
    let line = top
        .lines()
        .find(|line| line.trim_end().ends_with(" leak_here"))
        .unwrap_or_else(|| panic!("go tool pprof -top does not list leak_here:\n{top}"));
    let flat = line.split_whitespace().next().expect("flat column");
    assert_eq!(flat, format!("{}B", 60 * LEAK_SIZE_BYTES), "{top}");
    assert!(top.contains("Type: inuse_space"), "{top}");
    let _ = std::fs::remove_file(&profile);
    let _ = std::fs::remove_file(&recording);
}

/// Snapshots in a recording, read with tracer's own reader.
fn snapshots_in(bytes: &[u8]) -> usize {
    tracer::recording::parse(bytes, "copy")
        .expect("readable")
        .snapshot_count()
}

#[test]
fn kill_9_keeps_every_snapshot_before_the_kill() {
    let mut leaky = Fixture::start("leaky", &[]);
    let recording = recording_path("kill9");
    let tracer = Record::pid(leaky.pid)
        .interval("50ms")
        .args([OsStr::new("-o"), recording.as_os_str()])
        .attach()
        .tracer;
    leaky.cmd("leak 30");
    // Five snapshots written (50 ms apart), as the recording itself says.
    let deadline = Instant::now() + ATTACH_TIMEOUT;
    let before_kill = loop {
        let written = std::fs::read(&recording).expect("the recording exists while tracing");
        // A read that caught a snapshot half-written parses at the next.
        let parsed = tracer::recording::parse(&written, "copy");
        if parsed.is_ok_and(|recording| recording.snapshot_count() >= 5) {
            break written;
        }
        assert!(
            Instant::now() < deadline,
            "fewer than 5 snapshots within {} s",
            ATTACH_TIMEOUT.as_secs()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = tracer.stop_with(libc::SIGKILL);
    assert!(!output.status.success(), "{output}");
    let snapshots_before_kill = snapshots_in(&before_kill);

    let json = report_as(&recording, "json", &[]);
    json.assert_success();
    let warning = format!(
        "tracer: warning: {} has no end mark (tracer was killed, or is still recording): \
         reporting the ",
        recording.display()
    );
    assert!(json.stderr.starts_with(&warning), "{json}");
    assert_eq!(json.stderr.lines().count(), 1, "{json}");
    let replayed: Value = serde_json::from_str(&json.stdout).expect("report is JSON");
    let snapshots = replayed["snapshots"].as_u64().expect("snapshots") as usize;
    assert!(
        snapshots >= snapshots_before_kill,
        "{snapshots} < {snapshots_before_kill}"
    );
    let replayed = Report { json: replayed };
    let leak = Live::blocks(30, LEAK_SIZE_BYTES);
    assert_eq!(replayed.heap_live_with("leak_here"), leak, "\n{replayed}");
    assert_eq!(replayed.total("heap"), leak, "\n{replayed}");
    let _ = std::fs::remove_file(&recording);
}

/// Asserts a one-line `tracer: error:` ending with exit code 9.
fn assert_bad_recording(output: &TracerOutput, message: &str) {
    assert_eq!(output.status.code(), Some(EXIT_BAD_RECORDING), "{output}");
    assert_eq!(
        output.stderr,
        format!("tracer: error: {message}"),
        "{output}"
    );
    assert!(output.stdout.is_empty(), "{output}");
}

/// A real recording of a spawned run, cut, damaged, and from the future.
#[test]
fn damaged_recordings_give_one_line_errors() {
    let recording = recording_path("damaged");
    Record::command(&fixture("leaky"), &["--auto-count", "20", "--then-exit"])
        .interval("50ms")
        .args([OsStr::new("-o"), recording.as_os_str()])
        .start()
        .wait_exit();
    let bytes = std::fs::read(&recording).expect("recording written");
    let write = |name: &str, bytes: &[u8]| -> PathBuf {
        let path = recording.with_extension(name);
        std::fs::write(&path, bytes).expect("temporary file");
        path
    };

    let missing = Path::new("/nonexistent/trace.tracer");
    assert_bad_recording(
        &report(&[missing.as_os_str()]),
        "cannot read /nonexistent/trace.tracer: No such file or directory (os error 2)",
    );

    let not_a_recording = write("txt", b"hello\n");
    assert_bad_recording(
        &report(&[not_a_recording.as_os_str()]),
        &format!(
            "{} is not a tracer recording (wrong magic bytes)",
            not_a_recording.display()
        ),
    );

    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&99u32.to_le_bytes());
    let newer = write("newer", &newer);
    assert_bad_recording(
        &report(&[newer.as_os_str()]),
        &format!(
            "{} was written by a newer tracer (recording format 99; this tracer reads \
             format 5): upgrade tracer to read it",
            newer.display()
        ),
    );

    // The last 9 bytes are the end mark's record: this byte is its CRC.
    let mut corrupt = bytes.clone();
    let damaged_at = corrupt.len() - 5;
    corrupt[damaged_at] ^= 0xff;
    let corrupt = write("corrupt", &corrupt);
    let output = report(&[corrupt.as_os_str()]);
    assert_eq!(output.status.code(), Some(EXIT_BAD_RECORDING), "{output}");
    let prefix = format!(
        "tracer: error: {} is corrupt: the record at byte ",
        corrupt.display()
    );
    assert!(
        output.stderr.starts_with(&prefix) && output.stderr.ends_with(" fails its checksum"),
        "{output}"
    );

    let header_only = write("header", &bytes[..10]);
    assert_bad_recording(
        &report(&[header_only.as_os_str()]),
        &format!("{} is truncated inside its header", header_only.display()),
    );

    // Cut inside the end mark's record: every snapshot before it still reads.
    let cut = write("cut", &bytes[..bytes.len() - 3]);
    let output = report_as(&cut, "json", &[]);
    output.assert_success();
    assert!(
        output.stderr.starts_with(&format!(
            "tracer: warning: {} is truncated at byte ",
            cut.display()
        )),
        "{output}"
    );
    let replayed: Value = serde_json::from_str(&output.stdout).expect("report is JSON");
    assert_eq!(
        replayed["snapshots"].as_u64(),
        Some(snapshots_in(&bytes) as u64),
        "{output}"
    );

    for path in [not_a_recording, newer, corrupt, header_only, cut, recording] {
        let _ = std::fs::remove_file(path);
    }
}
