//! `tracer record -- COMMAND`: the command is traced from before its
//! libraries' constructors run, through exec (a `#!` script runs through
//! its interpreter), its stdout stays its own, and it is never left behind
//! silently when tracing stops.
use crate::harness;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use harness::*;

/// What libctor's constructor allocates (tests/fixtures/ctor/ctor.h).
const CTOR_COUNT: i64 = 300;
const CTOR_SIZE_BYTES: i64 = 1000;
/// ctor_main's ground-truth line; with --sleep its signal handlers are in
/// place once it is printed.
const CTOR_LINE: &str = "ctor_blocks ";
/// Blocks ctor_main keeps (`--keep`), the rest it frees.
const KEPT: i64 = 20;

/// Spawns `program ARGS` (ctor_main, or a wrapper that execs it) until it
/// exits and checks that every block its library's constructor made was
/// seen and every free of them matched, and that the report stayed out of
/// its stdout.
fn assert_constructor_blocks_seen(program: &Path) {
    let kept = KEPT.to_string();
    let Traced { output, report } = Record::command(program, &["--keep", &kept])
        .start()
        .wait_exit();
    assert_eq!(
        output.stdout,
        format!(
            "ctor_blocks {CTOR_COUNT} size {CTOR_SIZE_BYTES} freed {} kept {KEPT}\n",
            CTOR_COUNT - KEPT
        ),
        "the command's stdout is not its own: {output}"
    );
    assert!(
        output.stderr.contains("live heap at end:"),
        "the text report is not on stderr: {output}"
    );
    assert_eq!(
        report.int("/events/frees_unknown"),
        0,
        "frees of the constructor's blocks were not matched:\n{}",
        report.json
    );
    assert_eq!(
        report.heap_live_with("ctor_alloc"),
        Live::blocks(KEPT, CTOR_SIZE_BYTES),
        "\n{report}"
    );
    let allocated: i64 = report
        .heap_stacks_with("ctor_make_blocks")
        .into_iter()
        .map(|stack| stack_allocated(stack).count)
        .sum();
    assert_eq!(allocated, CTOR_COUNT, "\n{report}");
}

#[test]
fn library_constructor_blocks_are_seen_and_their_frees_matched() {
    assert_constructor_blocks_seen(&fixture("ctor_main"));
}

/// A shell wrapper (as /usr/local/bin/convert is) that execs the program:
/// started through /bin/sh, traced on into the program it execs.
#[test]
fn wrapper_script_is_followed_into_the_program_it_execs() {
    assert_constructor_blocks_seen(&fixture("ctor_wrapper"));
}

/// The tracer's PID line: "attached N probes to PID P (...)".
fn spawned_pid(stderr: &str) -> u32 {
    let line = stderr
        .lines()
        .find(|line| line.starts_with("tracer: attached"))
        .unwrap_or_else(|| panic!("no attach line in:\n{stderr}"));
    let after = line
        .split(" to PID ")
        .nth(1)
        .expect("a PID in the attach line");
    after
        .split_whitespace()
        .next()
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no PID in {line:?}"))
}

fn is_running(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name in parentheses.
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.trim().chars().next());
        !matches!(state, Some('Z' | 'X') | None)
    })
}

fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !is_running(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A Python script run by its `#!` line (through env, as users write it):
/// traced in the interpreter env execs, its strings' blocks found under
/// their Python function. Debian's python3.11 has CPython in its
/// executable (no libpython): tracer finds it in the image the exec
/// started, while the loader gate holds it, before the script runs.
#[test]
fn python_script_runs_through_its_interpreter() {
    const STRINGS: i64 = 20_000;
    const LENGTH: i64 = 600;
    let script = std::env::temp_dir().join(format!("tracer-spawn-{}.py", std::process::id()));
    fs::write(
        &script,
        format!(
            "#!/usr/bin/env -S /usr/bin/python3.11\n\
             import sys, time\n\
             held = []\n\
             def leak_strings():\n\
             \x20   for i in range({STRINGS}):\n\
             \x20       held.append('x' * {LENGTH} + str(i))\n\
             leak_strings()\n\
             print('held', len(held), f'bytes={{sum(map(sys.getsizeof, held))}}', flush=True)\n\
             time.sleep(120)\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let Traced { output, report } = Record::command(&script, &[])
        .args(["--duration", "6s"])
        .start()
        .wait_exit();
    let _ = fs::remove_file(&script);
    assert!(
        output.stdout.contains(&format!("held {STRINGS}")),
        "the script did not run to its leak: {output}"
    );
    // Each string is one block of its own size (sys.getsizeof), made by
    // PyUnicode_New under leak_strings (Debian's build inlines it into
    // PyUnicode_Concat, which calls malloc itself).
    let held_line = output
        .stdout
        .lines()
        .find(|line| line.starts_with("held "))
        .unwrap_or_else(|| panic!("no held line: {output}"));
    let strings = sum_live(
        &report
            .heap_stacks_with("PyUnicode_")
            .into_iter()
            .filter(|stack| frames_contain(stack, "leak_strings"))
            .collect::<Vec<_>>(),
    );
    assert_eq!(
        strings,
        Live {
            bytes: field(held_line, "bytes"),
            allocs: STRINGS
        },
        "the script's strings are not in the report: {output}\n{report}"
    );
    let pid = spawned_pid(&output.stderr);
    assert!(
        output
            .stderr
            .contains(&format!("tracer: sending SIGTERM to PID {pid}")),
        "{output}"
    );
    assert!(!is_running(pid), "the script is still running: {output}");
}

/// --duration: the command gets SIGTERM and tracer waits for its exit,
/// saying so.
#[test]
fn duration_stops_the_command_and_waits_for_it() {
    let Traced { output, .. } = Record::command(&fixture("ctor_main"), &["--sleep"])
        .args(["--duration", "1s"])
        .start()
        .wait_exit();
    let pid = spawned_pid(&output.stderr);
    assert!(
        output.stdout.ends_with("signal 15\n"),
        "the command did not get SIGTERM: {output}"
    );
    for line in [
        format!("tracer: sending SIGTERM to PID {pid}"),
        format!("tracer: PID {pid} ended: exit code 0"),
    ] {
        assert!(output.stderr.contains(&line), "no {line:?}: {output}");
    }
    assert!(!is_running(pid), "PID {pid} left behind: {output}");
}

/// Ctrl-C to tracer reaches the command too.
#[test]
fn interrupt_is_passed_on_to_the_command() {
    let mut trace = Record::command(&fixture("ctor_main"), &["--sleep"]).attach();
    trace.tracer.wait_stdout(CTOR_LINE, ATTACH_TIMEOUT);
    let Traced { output, .. } = trace.stop();
    let pid = spawned_pid(&output.stderr);
    assert!(
        output.stdout.ends_with("signal 2\n"),
        "the command did not get SIGINT: {output}"
    );
    assert!(
        output
            .stderr
            .contains(&format!("tracer: sending SIGINT to PID {pid}")),
        "{output}"
    );
    assert!(!is_running(pid), "PID {pid} left behind: {output}");
}

/// --leave-running: the command goes on, and tracer names its PID.
#[test]
fn leave_running_names_the_command_left_behind() {
    require_root();
    let directory = std::env::temp_dir();
    let stdout_path = directory.join(format!("tracer-leave-{}.out", std::process::id()));
    let stderr_path = directory.join(format!("tracer-leave-{}.err", std::process::id()));
    // Files, not pipes: the command left running keeps its stdout open.
    let status = Command::new(env!("CARGO_BIN_EXE_tracer"))
        .args(["record", "--duration", "1s", "--leave-running", "--"])
        .arg(fixture("ctor_main"))
        .arg("--sleep")
        .stdin(Stdio::null())
        .stdout(fs::File::create(&stdout_path).unwrap())
        .stderr(fs::File::create(&stderr_path).unwrap())
        .status()
        .expect("run the tracer");
    let stderr = fs::read_to_string(&stderr_path).unwrap();
    let pid = spawned_pid(&stderr);
    let alive = is_running(pid);
    // SAFETY: signals the fixture this test started through the tracer.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let gone = wait_gone(pid, Duration::from_secs(10));
    let stdout = fs::read_to_string(&stdout_path).unwrap();
    let _ = fs::remove_file(&stdout_path);
    let _ = fs::remove_file(&stderr_path);
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains(&format!("tracer: PID {pid} (")) && stderr.contains("left running"),
        "tracer did not say it left PID {pid} running:\n{stderr}"
    );
    assert!(
        alive,
        "PID {pid} is not running after tracer exited:\n{stderr}"
    );
    assert!(
        gone && stdout.ends_with("signal 15\n"),
        "PID {pid} was not running free (stdout {stdout:?})"
    );
}

/// Should tracer die without a chance to stop the command (SIGKILL), the
/// command gets SIGTERM from the kernel: never a silent orphan.
#[test]
fn killed_tracer_takes_the_command_with_it() {
    let mut trace = Record::command(&fixture("ctor_main"), &["--sleep"]).attach();
    trace.tracer.wait_stdout(CTOR_LINE, ATTACH_TIMEOUT);
    let output = trace.tracer.stop_with(libc::SIGKILL);
    let pid = spawned_pid(&output.stderr);
    assert!(
        wait_gone(pid, Duration::from_secs(10)),
        "PID {pid} outlived the killed tracer: {output}"
    );
    assert!(output.stdout.ends_with("signal 15\n"), "{output}");
}

/// A pure Go program (no malloc anywhere): traced for its mappings, with
/// a note, its leak found in the heap arenas Go maps, under its function.
#[test]
fn go_program_is_traced_for_its_mappings() {
    const ROUNDS: i64 = 6;
    const CHUNK_BYTES: i64 = 4 << 20;
    let rounds = ROUNDS.to_string();
    let Traced { output, report } = Record::command(
        &fixture("go_leak"),
        &["-rounds", &rounds, "-period", "300ms"],
    )
    .start()
    .wait_exit();
    let held = ROUNDS * CHUNK_BYTES;
    assert!(
        output.stdout.ends_with(&format!("done held {held}\n")),
        "{output}"
    );
    assert!(
        output
            .stderr
            .contains("maps no object that defines malloc or free")
            && output.stderr.contains("only its mappings"),
        "no note: {output}"
    );
    // Each chunk is a large span of its own, mapped as Go's heap grows for
    // it (make -> mallocgc -> mcache.allocLarge). The runtime may also map
    // its own memory while leakChunk runs: a GC's mark bits while it is
    // preempted (asyncPreempt), or, when that make starts a GC, the
    // workers' goroutines (gcStart -> newproc). Those are not the chunks.
    let (chunks, runtime_own): (Vec<_>, Vec<_>) = report
        .stacks_with("mmap-anon", "main.leakChunk")
        .into_iter()
        .partition(|stack| frames_contain(stack, "runtime.(*mcache).allocLarge"));
    for stack in &runtime_own {
        assert!(
            frames_contain(stack, "runtime.asyncPreempt")
                || frames_contain(stack, "runtime.gcStart"),
            "{report}"
        );
    }
    let leak = sum_live(&chunks);
    assert_eq!(
        leak,
        Live::blocks(ROUNDS, CHUNK_BYTES),
        "main.leakChunk's mappings are not the {held} bytes retained: {output}\n{report}"
    );
}

/// Node.js with `--perf-basic-prof` writes /tmp/perf-PID.map: the JS
/// function that leaks is named in the leak's stack (V8 code keeps frame
/// pointers, so `--unwind fp` walks through it).
#[test]
fn node_jit_frames_are_named_from_its_perf_map() {
    require_root();
    let script = std::env::temp_dir().join(format!("tracer-jit-{}.js", std::process::id()));
    fs::write(
        &script,
        "const held = [];\n\
         function leakBuffers(count) {\n\
         \x20 for (let i = 0; i < count; i++) held.push(Buffer.allocUnsafeSlow(64 * 1024));\n\
         }\n\
         // Run it until V8 compiles it (and writes its perf map line).\n\
         for (let i = 0; i < 5000; i++) { leakBuffers(1); held.pop(); }\n\
         console.log(`ready pid=${process.pid}`);\n\
         require('readline').createInterface({ input: process.stdin }).on('line', (line) => {\n\
         \x20 leakBuffers(Number(line.split(' ')[1]));\n\
         \x20 console.log(`held count=${held.length} bytes=${held.length * 64 * 1024}`);\n\
         });\n",
    )
    .unwrap();
    let mut command = Command::new("node");
    // V8 writes an isolate log next to it: not in the source tree.
    command
        .current_dir(std::env::temp_dir())
        .arg("--perf-basic-prof")
        .arg(&script);
    let mut node = Fixture::start_command(command);
    // No periodic snapshot in the test's time: the buffers are in the
    // final one, taken at SIGINT after the script answered.
    let trace = Record::pid(node.pid)
        .interval("60s")
        .args(["--unwind", "fp"])
        .attach();
    let answer = node.cmd("leak 200");
    let Traced { output, report } = trace.stop();
    let pid = node.pid;
    drop(node);
    let _ = fs::remove_file(&script);
    let _ = fs::remove_file(format!("/tmp/perf-{pid}.map"));
    // The buffers themselves (V8 keeps a few small blocks beside each).
    let buffers: Vec<_> = report
        .heap_stacks_with("AllocateUninitialized")
        .into_iter()
        .filter(|stack| frames_contain(stack, "leakBuffers"))
        .collect();
    assert_eq!(
        sum_live(&buffers),
        Live::answered(&answer, "bytes", "count"),
        "the JS function leakBuffers is not named in the heap stacks of its buffers: \
         {output}\n{report}"
    );
}
