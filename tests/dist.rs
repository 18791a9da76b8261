//! What `cargo xtask dist` ships (issue 39), used the way an engineer in
//! an incident uses it: the static binary copied alone into an empty root,
//! the wheel installed offline into a fresh venv, and the binary run
//! inside an older userland (Debian 11: glibc 2.31, CPython 3.9).
//!
//! Those marked `#[ignore]` read target/dist/ and target/debian11 (the
//! Debian 11 root, made once with debootstrap): building the static binary
//! for musl and the root take minutes, so `cargo xtask test` (CI) lists
//! them as ignored and `cargo xtask dist --test` builds both and runs them.
//! The man pages and completions are checked on every run, from the
//! tested build's own `tracer generate`.

use crate::harness;

use std::path::{Path, PathBuf};
use std::process::Command;

use harness::{
    ATTACH_TIMEOUT, Fixture, LEAK_SIZE_BYTES, Live, Report, Tracer, field, python_frames,
    python_line, python_script, require_root, sum_live, workspace_root,
};
use serde_json::Value;

/// A file of target/dist/, failing loudly when `cargo xtask dist` has not
/// made it.
fn dist_file(name: &str) -> PathBuf {
    let path = workspace_root().join("target/dist").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask dist --test`, which builds it and runs these tests",
        path.display()
    );
    path
}

/// The one wheel in target/dist/.
fn dist_wheel() -> PathBuf {
    let dir = workspace_root().join("target/dist");
    let wheels: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}: run `cargo xtask dist --test`", dir.display()))
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .collect();
    assert_eq!(
        wheels.len(),
        1,
        "one wheel in {}: {wheels:?}",
        dir.display()
    );
    wheels.into_iter().next().expect("one wheel")
}

/// A fresh directory for one test, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(parent: &Path, name: &str) -> Self {
        let dir = parent.join(format!("tracer-dist-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|error| panic!("could not create {}: {error}", dir.display()));
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap_or_else(|error| {
        panic!(
            "could not copy {} to {}: {error}",
            from.display(),
            to.display()
        )
    });
}

/// `PROGRAM ARGS` run by chroot into `root`, where /proc, /sys and /dev
/// are bound (recursively, as a container runtime binds them) in a mount
/// namespace of its own: the binds vanish with it, whatever happens. Each
/// step execs the next, so the returned child is the program's process.
fn chrooted(root: &Path, program: &str, args: &[&str]) -> Command {
    let root = root.to_str().expect("a UTF-8 path");
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "--", "sh", "-ec"])
        .arg(
            r#"root="$1"; shift
for dir in proc sys dev; do mount --rbind "/$dir" "$root/$dir"; done
exec chroot "$root" "$@""#,
        )
        .args(["sh", root, program])
        .args(args);
    command
}

/// `tracer record` arguments that write the JSON report to `json` (a
/// path inside the chroot) every 200 ms.
fn record_args<'a>(pid: &'a str, json: &'a str) -> [&'a str; 9] {
    [
        "record",
        "--pid",
        pid,
        "--interval",
        "200ms",
        "--top",
        "0",
        "--json",
        json,
    ]
}

/// The static binary alone in an empty directory (only /proc, /sys and
/// /dev bound in: no libc, no loader, no /tmp, no /etc) attaches to a
/// fixture running outside and counts its leak exactly.
#[test]
#[ignore = "reads target/dist: `cargo xtask dist --test` builds it and runs this"]
fn static_binary_alone_in_an_empty_root_names_the_leak() {
    require_root();
    let binary = dist_file("tracer");
    let root = TempDir::new(&std::env::temp_dir(), "empty-root");
    for dir in ["proc", "sys", "dev"] {
        std::fs::create_dir(root.0.join(dir)).expect("create a mount point");
    }
    copy(&binary, &root.0.join("tracer"));

    let mut leaky = Fixture::start("leaky", &[]);
    let pid = leaky.pid.to_string();
    let mut tracer = Tracer::spawn(chrooted(
        &root.0,
        "/tracer",
        &record_args(&pid, "/report.json"),
    ));
    tracer.wait_attached(ATTACH_TIMEOUT);
    let answer = leaky.cmd("leak 40");
    let output = tracer.stop();
    output.assert_success();
    assert_eq!(field(&answer, "bytes"), 40 * LEAK_SIZE_BYTES, "{answer}");
    let report = Report::read(&root.0.join("report.json"));
    assert_eq!(
        report.heap_live_with("leak_here"),
        Live::blocks(40, LEAK_SIZE_BYTES),
        "{output}\n{report}"
    );
    assert!(
        output.stdout.contains("leak_here (leaky.c:"),
        "the text report names the leak's function and line: {output}"
    );
    assert!(
        !output.stderr.contains("SCHED_FIFO refused"),
        "the static build raises the library hooker's priority as the glibc one does: {output}"
    );
}

/// The wheel, installed offline into a fresh venv of Debian's python3.11,
/// gives the venv a `tracer` command: it says its version and commit, and
/// traces a Python program started from the same venv down to the line.
#[test]
#[ignore = "reads target/dist: `cargo xtask dist --test` builds it and runs this"]
fn wheel_installs_offline_into_a_fresh_venv_and_traces_python() {
    require_root();
    let wheel = dist_wheel();
    let dir = TempDir::new(&std::env::temp_dir(), "venv");
    let venv = dir.0.join("venv");
    run_ok(
        Command::new(harness::PYTHON)
            .args(["-m", "venv"])
            .arg(&venv),
    );
    run_ok(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--no-index", "--no-cache-dir", "--quiet"])
            .arg(&wheel),
    );
    let tracer = venv.join("bin/tracer");
    let version = run_ok(Command::new(&tracer).arg("--version"));
    assert!(
        version.starts_with(&format!("tracer {}\ncommit: ", env!("CARGO_PKG_VERSION")))
            && !version.contains("not recorded")
            && version.contains("(static, musl)")
            && version.contains("BTF (/sys/kernel/btf/vmlinux): yes"),
        "the venv's tracer says its version, commit, build and the kernel's features:\n{version}"
    );

    let mut python = Command::new(venv.join("bin/python"));
    python.arg(python_script("leaky_bytes.py"));
    let mut fixture = Fixture::start_command(python);
    let pid = fixture.pid.to_string();
    let json = dir.0.join("report.json");
    let json_arg = json.to_str().expect("a UTF-8 path");
    let mut command = Command::new(&tracer);
    command
        .args(record_args(&pid, json_arg))
        .args(["--min-size", "65536"]);
    let mut trace = Tracer::spawn(command);
    trace.wait_attached(ATTACH_TIMEOUT);
    let answer = fixture.cmd("leak 2");
    let output = trace.stop();
    output.assert_success();
    let report = Report::read(&json);
    assert_leak_site_named(&report, &answer, &output.to_string());
}

/// The leak of leaky_bytes.py's `leak_buffer` (both callers' buffers),
/// exactly, in stacks whose innermost Python frame is its LEAK-SITE line.
fn assert_leak_site_named(report: &Report, answer: &str, context: &str) {
    let file = "leaky_bytes.py";
    let line = python_line("leaky_bytes.py", "# LEAK-SITE");
    let stacks: Vec<&Value> = report
        .stacks()
        .iter()
        .filter(|stack| {
            stack["kind"] == "heap"
                && python_frames(stack)
                    .first()
                    .is_some_and(|(name, in_file, at)| {
                        name == "leak_buffer" && in_file == file && *at == line
                    })
        })
        .collect();
    let live = sum_live(&stacks);
    let answered = Live {
        bytes: field(answer, "a_bytes") + field(answer, "b_bytes"),
        allocs: field(answer, "a_allocs") + field(answer, "b_allocs"),
    };
    assert_eq!(
        live, answered,
        "leak_buffer at {file}:{line} holds both callers' buffers: {answer}\n{context}\n{report}"
    );
}

/// Debian 11's python3 (CPython 3.9.2 on glibc 2.31) leaks inside a
/// Debian 11 root, and the static tracer, run from inside that root,
/// names the Python line.
#[test]
#[ignore = "reads target/dist: `cargo xtask dist --test` builds it and runs this"]
fn static_binary_in_a_debian_11_root_names_the_python_line() {
    require_root();
    let binary = dist_file("tracer");
    let debian = workspace_root().join("target/debian11");
    assert!(
        debian.join(".tracer-complete").is_file() && debian.join("usr/bin/python3").exists(),
        "{} is missing or partial: `cargo xtask dist --test` makes it (debootstrap, once)",
        debian.display()
    );
    let scratch = TempDir::new(&debian.join("tmp"), "debian11");
    let inside = Path::new("/tmp").join(scratch.0.file_name().expect("a directory name"));
    let inside = |name: &str| inside.join(name).to_str().expect("UTF-8").to_owned();
    copy(&binary, &scratch.0.join("tracer"));
    copy(
        &python_script("leaky_bytes.py"),
        &scratch.0.join("leaky_bytes.py"),
    );

    // Python and tracer share the root and its mount namespace, as on a
    // host whose userland is Debian 11: tracer enters python's.
    let mut fixture = Fixture::start_command(chrooted(
        &debian,
        "/usr/bin/python3",
        &[&inside("leaky_bytes.py")],
    ));
    let pid = fixture.pid.to_string();
    let json = inside("report.json");
    let mut tracer = Command::new("nsenter");
    tracer
        .arg(format!("--mount=/proc/{pid}/ns/mnt"))
        .arg("--")
        .arg("chroot")
        .arg(&debian)
        .arg(inside("tracer"))
        .args(record_args(&pid, &json))
        .args(["--min-size", "65536"]);
    let mut trace = Tracer::spawn(tracer);
    trace.wait_attached(ATTACH_TIMEOUT);
    let answer = fixture.cmd("leak 2");
    let output = trace.stop();
    output.assert_success();
    assert!(
        output.stderr.contains("CPython 3.9"),
        "tracer found Debian 11's CPython 3.9: {output}"
    );
    let report = Report::read(&scratch.0.join("report.json"));
    assert_leak_site_named(&report, &answer, &output.to_string());
}

/// The man pages and completions `cargo xtask dist` ships are the
/// binary's own (`tracer generate`, run here on the tested build): a page
/// per verb, and completions that know the verbs and their flags (bash's
/// run here; zsh and fish are checked by their text).
#[test]
fn man_pages_and_completions_come_from_the_binary() {
    let tracer = env!("CARGO_BIN_EXE_tracer");
    let dir = TempDir::new(&std::env::temp_dir(), "man");
    let written = run_ok(Command::new(tracer).args(["generate", "man"]).arg(&dir.0));
    assert_eq!(written, "", "the pages go to the directory");
    let page = std::fs::read_to_string(dir.0.join("tracer.1")).expect("tracer.1");
    assert!(
        page.contains(".TH tracer 1") && page.contains("tracer\\-record(1)"),
        "tracer.1 is a man page that names tracer-record(1):\n{page}"
    );
    for verb in ["record", "top", "report", "plot"] {
        let page =
            std::fs::read_to_string(dir.0.join(format!("tracer-{verb}.1"))).expect("a verb's page");
        assert!(
            page.contains(&format!(".TH tracer-{verb} 1")),
            "tracer-{verb}.1:\n{page}"
        );
    }
    let bash = dir.0.join("tracer.bash");
    let text = run_ok(Command::new(tracer).args(["generate", "bash"]));
    std::fs::write(&bash, text).expect("write tracer.bash");
    let completed = run_ok(Command::new("bash").arg("-c").arg(format!(
        "source {}; COMP_WORDS=(tracer record --unw); COMP_CWORD=2; \
         _tracer tracer --unw record; echo \"${{COMPREPLY[@]}}\"",
        bash.display()
    )));
    assert_eq!(
        completed.trim(),
        "--unwind --unwind-table-mib",
        "{completed}"
    );
    for shell in ["zsh", "fish"] {
        let text = run_ok(Command::new(tracer).args(["generate", shell]));
        assert!(
            text.contains("record") && text.contains("unwind-table-mib"),
            "{shell}'s completions complete the verbs and their flags"
        );
    }
}

/// Runs `command`, fails with its output unless it succeeds; returns its
/// stdout.
fn run_ok(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("could not run {command:?}: {error}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
