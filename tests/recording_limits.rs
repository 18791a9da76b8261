//! `tracer report` on crafted recordings (valid checksums, so the decoder
//! is reached): however the file is made, the report ends within 10 s
//! and tracer never holds more than 256 MiB. A file too large to report is
//! refused in one line; one it can report is reported.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracer::model::{Frame, run::SamplingReport};
use tracer::recording::Writer;

/// `tracer report`'s exit code for a recording it cannot read.
const BAD_RECORDING: i32 = 9;

/// A recording with its header and metadata only, at a fresh path.
fn base(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "tracer-test-limits-{name}-{}.rec",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let metadata = tracer::recording::Metadata::for_this_host(
        Instant::now(),
        100,
        Vec::new(),
        Vec::new(),
        SamplingReport::exact(),
    );
    drop(Writer::create(&path, metadata).expect("a recording"));
    path
}

/// Appends records (payloads as postcard writes `Record`), each with its
/// length and checksum.
fn append(path: &Path, payloads: impl Iterator<Item = Vec<u8>>) {
    let mut file = std::io::BufWriter::new(
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .expect("open the recording"),
    );
    for payload in payloads {
        let length = (payload.len() as u32).to_le_bytes();
        let mut crc = crc32fast::Hasher::new();
        crc.update(&length);
        crc.update(&payload);
        file.write_all(&length).unwrap();
        file.write_all(&crc.finalize().to_le_bytes()).unwrap();
        file.write_all(&payload).unwrap();
    }
    file.flush().unwrap();
}

fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// `Record::Stack` of `frames` copies of `frame`.
fn stack_record(stack_id: u32, frames: usize, frame: &[u8]) -> Vec<u8> {
    let mut payload = vec![1];
    varint(1000, &mut payload);
    varint(u64::from(stack_id), &mut payload);
    varint(4, &mut payload);
    payload.extend_from_slice(b"heap");
    varint(frames as u64, &mut payload);
    for _ in 0..frames {
        payload.extend_from_slice(frame);
    }
    payload.push(0);
    payload
}

/// `Record::Snapshot` at `elapsed_s` that changes nothing.
fn empty_snapshot(elapsed_s: f64) -> Vec<u8> {
    let mut payload = vec![2];
    payload.extend_from_slice(&elapsed_s.to_le_bytes());
    payload.extend_from_slice(&[0, 0, 0]);
    payload
}

/// `tracer report` on `path` with `args`: its output, how long it took and
/// its peak RSS in KiB (a child of its own, so that only it is measured).
fn report(path: &Path, args: &[&str]) -> (std::process::Output, Duration, i64) {
    let started = Instant::now();
    let binary = std::env::var_os("TRACER_TEST_BINARY")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_tracer").into());
    #[allow(
        clippy::zombie_processes,
        reason = "reaped by wait4 below, for its resource usage"
    )]
    let mut child = std::process::Command::new(binary)
        .arg("report")
        .arg(path)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tracer report");
    let pid = child.id() as libc::pid_t;
    let deadline = started + Duration::from_secs(60);
    // Waited for with wait4, for its own resource usage.
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: wait4 on our own child, into live locals.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let done = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if done == pid {
            break (status, usage);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tracer report ran over 60 s on {}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    std::io::Read::read_to_end(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    std::io::Read::read_to_end(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let output = std::process::Output {
        status: std::os::unix::process::ExitStatusExt::from_raw(status),
        stdout,
        stderr,
    };
    (output, took, usage.ru_maxrss)
}

fn assert_bounded(what: &str, took: Duration, max_rss_kib: i64, output: &std::process::Output) {
    assert!(
        took < Duration::from_secs(10),
        "{what}: {took:?}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        max_rss_kib < 256 << 10,
        "{what}: max RSS {max_rss_kib} KiB\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn stacks_of_empty_frames_that_would_expand_past_the_budget_are_refused() {
    // 64 records of 1 MiB, each of some 100 000 empty frames: a frame
    // decodes to some 20 times its encoded bytes.
    let frame = postcard::to_allocvec(&Frame::default()).expect("a frame");
    let frames = ((1 << 20) - 64) / frame.len();
    let path = base("frames");
    append(&path, (0..64).map(|id| stack_record(id, frames, &frame)));
    let (output, took, max_rss) = report(&path, &[]);
    let _ = std::fs::remove_file(&path);
    assert_bounded("empty frames", took, max_rss, &output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(BAD_RECORDING), "{stderr}");
    assert!(stderr.contains("is too large to report"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn from_past_many_snapshots_of_many_stacks_is_reported_in_time() {
    // 100 000 stacks, then 100 000 snapshots before --from: one copy of
    // the counters per early snapshot was 320 GB of copying.
    let frame = postcard::to_allocvec(&Frame::default()).expect("a frame");
    let path = base("from");
    append(&path, (0..100_000).map(|id| stack_record(id, 1, &frame)));
    append(
        &path,
        (0..100_000).map(|index| empty_snapshot(f64::from(index) * 0.001)),
    );
    let (output, took, max_rss) = report(&path, &["--from", "99s"]);
    let _ = std::fs::remove_file(&path);
    assert_bounded("--from", took, max_rss, &output);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
