//! Bad input ends with one `tracer: error:` line on stderr and a documented
//! exit code: never a panic, a backtrace or exit code 0.

use crate::harness;

use std::process::Command;

use harness::{
    EXIT_TIMEOUT, Fixture, KillOnDrop, Tracer, TracerOutput, assert_one_line_error as assert_error,
    fixture, require_root,
};

/// Exit codes of the tracer binary.
const EXIT_USAGE: i32 = 2;
const EXIT_TARGET_NOT_FOUND: i32 = 3;
const EXIT_NOT_PRIVILEGED: i32 = 4;
const EXIT_KERNEL_UNSUPPORTED: i32 = 5;
const EXIT_SPAWN_FAILED: i32 = 7;
const EXIT_OUTPUT: i32 = 8;

/// The unprivileged user the not-root case runs as.
const NOBODY_UID: &str = "65534";

fn run_tracer(args: &[&str]) -> TracerOutput {
    Tracer::start(args).wait_exit(EXIT_TIMEOUT)
}

/// A process id that no process has right now.
fn unused_pid() -> u32 {
    (999_999..)
        .find(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        .expect("some pid is free")
}

#[test]
fn no_such_process() {
    require_root();
    let pid = unused_pid().to_string();
    assert_error(
        &run_tracer(&["record", "--pid", &pid]),
        EXIT_TARGET_NOT_FOUND,
    );
}

#[test]
fn command_does_not_exist() {
    require_root();
    assert_error(
        &run_tracer(&["record", "--", "/nonexistent/prog"]),
        EXIT_SPAWN_FAILED,
    );
}

/// A process without malloc or free (Go, a static program with its own
/// allocator) is no error any more: its mappings are traced, with a note.
#[test]
fn target_without_allocator_is_traced_for_its_mappings() {
    require_root();
    let path = fixture("noalloc");
    let noalloc = KillOnDrop::child(
        Command::new(&path)
            .spawn()
            .unwrap_or_else(|error| panic!("could not start {}: {error}", path.display())),
    );
    let pid = noalloc.pid.to_string();
    let output = run_tracer(&["record", "--duration", "300ms", "--pid", &pid]);
    output.assert_success();
    assert!(
        output.stderr.contains(&format!(
            "tracer: note: PID {pid} ({}) maps no object that defines malloc or free",
            path.display()
        )) && output
            .stderr
            .contains("only its mappings (mmap, munmap, brk) are traced"),
        "no note that only mappings are traced: {output}"
    );
    assert!(
        output.stdout.contains(&format!("target: PID {pid}")),
        "no report: {output}"
    );
}

#[test]
fn not_root() {
    require_root();
    let leaky = Fixture::start("leaky", &[]);
    let mut command = Command::new("setpriv");
    command
        .arg(format!("--reuid={NOBODY_UID}"))
        .arg(format!("--regid={NOBODY_UID}"))
        .arg("--clear-groups")
        .arg(env!("CARGO_BIN_EXE_tracer"))
        .args(["record", "--pid", &leaky.pid.to_string()]);
    assert_error(
        &Tracer::spawn(command).wait_exit(EXIT_TIMEOUT),
        EXIT_NOT_PRIVILEGED,
    );
}

#[test]
fn pid_and_command_together() {
    require_root();
    let pid = std::process::id().to_string();
    assert_error(
        &run_tracer(&["record", "--pid", &pid, "--", "/bin/true"]),
        EXIT_USAGE,
    );
}

/// Runs the tracer in a private mount namespace where `hidden` (a sysfs
/// directory) is covered by an empty tmpfs: the kernel as a tracer without
/// that support would see it.
fn run_tracer_without(hidden: &str, args: &[&str]) -> TracerOutput {
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs none {hidden} && exec \"$0\" \"$@\""
        ))
        .arg(env!("CARGO_BIN_EXE_tracer"))
        .args(args);
    Tracer::spawn(command).wait_exit(EXIT_TIMEOUT)
}

/// `tracer record --pid` of a running leaky where `hidden` is covered:
/// exit code 5 and an error that names `missing`.
fn assert_kernel_unsupported_without(hidden: &str, missing: &str) {
    require_root();
    let leaky = Fixture::start("leaky", &[]);
    let output = run_tracer_without(hidden, &["record", "--pid", &leaky.pid.to_string()]);
    assert_error(&output, EXIT_KERNEL_UNSUPPORTED);
    assert!(output.stderr.contains(missing), "{output}");
}

#[test]
fn kernel_without_btf() {
    assert_kernel_unsupported_without("/sys/kernel/btf", "BTF");
}

#[test]
fn kernel_without_uprobes() {
    assert_kernel_unsupported_without("/sys/bus/event_source/devices/uprobe", "uprobe");
}

#[test]
fn zombie_target() {
    require_root();
    // A child of this test that exited and was not waited for.
    let zombie = KillOnDrop::child(Command::new("true").spawn().expect("start true"));
    let pid = zombie.pid;
    let deadline = std::time::Instant::now() + EXIT_TIMEOUT;
    while !std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.contains(") Z "))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "PID {pid} never became a zombie"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let output = run_tracer(&["record", "--pid", &pid.to_string()]);
    assert_error(&output, EXIT_TARGET_NOT_FOUND);
    assert!(output.stderr.contains("zombie"), "{output}");
}

#[test]
fn kernel_thread_target() {
    require_root();
    // PID 2 is kthreadd, the parent of every kernel thread.
    let output = run_tracer(&["record", "--pid", "2"]);
    assert_error(&output, EXIT_TARGET_NOT_FOUND);
    assert!(output.stderr.contains("kernel thread"), "{output}");
}

#[test]
fn invalid_values_are_usage_errors() {
    require_root();
    let pid = std::process::id().to_string();
    for bad in [
        &["--interval", "5ms"][..],
        &["--interval", "0s"],
        &["--duration", "soon"],
        &["--duration", "-3s"],
        &["--max-live", "0"],
        &["--max-stacks", "lots"],
        &["--top", "-1"],
    ] {
        let mut args = vec!["record", "--pid", &pid];
        args.extend_from_slice(bad);
        assert_error(&run_tracer(&args), EXIT_USAGE);
    }
}

#[test]
fn output_in_a_missing_directory() {
    require_root();
    let leaky = Fixture::start("leaky", &[]);
    let output = run_tracer(&[
        "record",
        "--pid",
        &leaky.pid.to_string(),
        "--json",
        "/nonexistent-dir/report.json",
    ]);
    assert_error(&output, EXIT_OUTPUT);
    assert!(output.stderr.contains("/nonexistent-dir"), "{output}");
}

#[test]
fn output_in_a_read_only_directory() {
    require_root();
    let leaky = Fixture::start("leaky", &[]);
    let directory = std::env::temp_dir().join(format!("tracer-ro-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    // A read-only mount refuses writes even to root.
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs -o ro none "$1" && shift && exec "$@""#)
        .arg("sh")
        .arg(&directory)
        .arg(env!("CARGO_BIN_EXE_tracer"))
        .args(["record", "--pid", &leaky.pid.to_string(), "--svg"])
        .arg(directory.join("growth.svg"));
    let output = Tracer::spawn(command).wait_exit(EXIT_TIMEOUT);
    let _ = std::fs::remove_dir(&directory);
    assert_error(&output, EXIT_OUTPUT);
    assert!(output.stderr.contains("not writable"), "{output}");
}

#[test]
fn pid_exiting_during_attach() {
    require_root();
    // Processes that exit while the tracer looks them up and attaches: every
    // run must end with a report or with one line and exit code 3.
    for delay_ms in [0, 20, 40, 60, 80, 120, 160, 200, 300] {
        let child = KillOnDrop::child(
            Command::new("sh")
                .arg("-c")
                .arg(format!("sleep {}", f64::from(delay_ms) / 1000.0))
                .spawn()
                .expect("start sh"),
        );
        let pid = child.pid.to_string();
        let output = Tracer::start(["record", "--pid", &pid]).wait_exit(EXIT_TIMEOUT);
        if output.status.success() {
            assert!(output.stdout.contains("exited after"), "{output}");
        } else {
            assert_error(&output, EXIT_TARGET_NOT_FOUND);
        }
    }
}
