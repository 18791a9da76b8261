//! GPU libraries loaded while tracer runs, against tests/fixtures/cuda:
//! the CUDA runtime and driver dlopen()ed after attach (found through
//! LD_LIBRARY_PATH, a RUNPATH, or by absolute path) are hooked ahead of
//! their mapping or at open, so no executor is missed; and a tracer killed
//! while the loader gate holds its target leaves it running.

use crate::harness;

use std::time::{Duration, Instant};

use harness::*;
use serde_json::Value;

#[test]
fn executor_exact_when_cuda_is_loaded_after_attach() {
    let mut fixture = Fixture::start("gpu_executor_dlopen", &[]);
    let mut trace = Record::pid(fixture.pid).attach();
    assert_eq!(fixture.cmd("load"), "loaded");
    let loaded_at = Instant::now();
    trace
        .tracer
        .wait_stderr("libcudart.so.12 (PID", HOOK_DEADLINE);
    trace.tracer.wait_stderr("libcuda.so.1 (PID", HOOK_DEADLINE);
    assert_took_under(
        "hooking libcudart and libcuda after their dlopen",
        loaded_at.elapsed(),
        HOOK_DEADLINE,
        &"(the two lines came)",
    );
    let answer = fixture.cmd("executor 4");
    let Traced { output, report } = trace.stop();

    assert_executor_leak(&report, &answer, 4);
    for name in ["libcudart.so.12", "libcuda.so.1"] {
        let library = listed_library(&report, name);
        assert_ne!(library["noticed_by"], "attach", "{library}");
        assert!(library["hooked_after_s"].as_f64().unwrap() > 0.0);
    }
    assert!(
        output
            .stdout
            .contains("hooked after attach: libcudart.so.12"),
        "{output}"
    );
}

/// `loadexec`: dlopen, then at once 2 threads of executors, the runtime
/// found through LD_LIBRARY_PATH. tracer hooks it ahead of the mapping (a
/// candidate from the target's LD_LIBRARY_PATH), so not one executor is
/// missed, 20 times out of 20.
#[test]
fn executors_right_after_dlopen_are_all_counted_when_hooked_ahead() {
    let cuda_dir = harness::workspace_root().join("target/fixtures/cuda");
    let cuda_dir = cuda_dir.to_str().expect("a UTF-8 path");
    for attempt in 0..20 {
        let mut fixture = Fixture::start_with_env(
            "gpu_executor_dlopen",
            &[],
            &[
                ("LD_LIBRARY_PATH", cuda_dir),
                ("GPU_EXECUTOR_DLOPEN_BY_NAME", "1"),
            ],
        );
        let trace = Record::pid(fixture.pid).interval("100ms").attach();
        let answer = fixture.cmd("loadexec 3");
        let Traced { output, report } = trace.stop();
        assert_executor_leak(&report, &answer, 6);
        for name in ["libcudart.so.12", "libcuda.so.1"] {
            let library = listed_library(&report, name);
            assert_eq!(
                library["noticed_by"], "ahead",
                "attempt {attempt}: {library}"
            );
            assert_eq!(library["hooked"], "ahead", "attempt {attempt}: {library}");
        }
        assert!(
            output
                .stdout
                .contains("hooked ahead of their mapping in PID")
                && output.stdout.contains("libcudart.so.12"),
            "{output}"
        );
    }
}

/// `loadexec` in an executor that finds the runtime it dlopen()s by name
/// through its RUNPATH (`$ORIGIN/cuda`, as TVM's do), and the driver
/// through the runtime's (`$ORIGIN`): both are hooked ahead of their
/// mapping, so not one executor is missed, 20 times out of 20.
#[test]
fn executors_right_after_dlopen_through_origin_runpath_are_all_counted() {
    for attempt in 0..20 {
        let mut fixture = Fixture::start_with_env(
            "gpu_executor_runpath",
            &[],
            &[("GPU_EXECUTOR_DLOPEN_BY_NAME", "1")],
        );
        let trace = Record::pid(fixture.pid).interval("100ms").attach();
        let answer = fixture.cmd("loadexec 3");
        let Traced { report, .. } = trace.stop();
        assert_executor_leak(&report, &answer, 6);
        for name in ["libcudart.so.12", "libcuda.so.1"] {
            let library = listed_library(&report, name);
            assert_eq!(library["hooked"], "ahead", "attempt {attempt}: {library}");
        }
    }
}

/// The JSON report's entry for the library whose path ends with `name`.
fn listed_library<'a>(report: &'a Report, name: &str) -> &'a Value {
    report.json["libraries"]
        .as_array()
        .expect("libraries")
        .iter()
        .find(|library| library["path"].as_str().unwrap().ends_with(name))
        .unwrap_or_else(|| panic!("{name} is not listed: {}", report.json["libraries"]))
}

/// `loadexec` with the runtime dlopen()ed by its absolute path, in a
/// directory no rule of `ahead` looks in: tracer learns of it only when the
/// target opens it. The openat tracepoint wakes tracer's at-open thread,
/// which hooks the file while the loader maps it, relocates it and runs its
/// constructors (~340 µs here before the first cudaMalloc); should the
/// dlopen complete first, the loader gate holds the process at
/// `_dl_debug_state` until the hooks are in place, and the late hook (the
/// mmap event) waits for the at-open thread rather than claim the file
/// first (it did, once in a suite run beside another test, and the
/// process went on unhooked; a 60 ms sleep in the thread fails attempt 0
/// without the wait). So 20 times of 20, also
/// on a busy machine: both libraries are hooked at open (not late), every
/// executor of `loadexec` is counted exactly, and so is every call after
/// the hook (`executor 2`, from the main thread, is its own stack).
#[test]
fn executors_right_after_dlopen_by_path_are_counted_when_hooked_at_open() {
    for attempt in 0..20 {
        let mut fixture = Fixture::start("gpu_executor_dlopen", &[]);
        let mut trace = Record::pid(fixture.pid).interval("100ms").attach();
        let raced = fixture.cmd("loadexec 3");
        for name in ["libcudart.so.12 (PID", "libcuda.so.1 (PID"] {
            trace.tracer.wait_stderr(name, HOOK_DEADLINE);
        }
        let hooked_lines = trace.tracer.stderr_lines_with(", at open: ");
        let after_hook = fixture.cmd("executor 2");
        let Traced { output, report } = trace.stop();

        for name in ["libcudart.so.12", "libcuda.so.1"] {
            let library = listed_library(&report, name);
            assert_eq!(library["hooked"], "at-open", "attempt {attempt}: {library}");
            assert_eq!(library["noticed_by"], "at-open", "attempt {attempt}");
        }
        assert!(
            output
                .stdout
                .contains("hooked after attach: libcudart.so.12 in PID")
                && output.stdout.contains("(at open)"),
            "attempt {attempt}: {output}"
        );
        // The gate held: never let go by its bound, and the late hook
        // waited for the at-open thread instead of claiming a file first.
        for not_said in ["(the bound)", "the at-open thread is"] {
            assert!(
                !output.stderr.contains(not_said),
                "attempt {attempt}: {output}"
            );
        }
        let main_thread: Vec<&Value> = report
            .stacks_with("gpu-device", "setup_storage")
            .into_iter()
            .filter(|stack| frames_contain(stack, "run_executor"))
            .collect();
        assert_eq!(main_thread.len(), 1, "attempt {attempt}:\n{report}");
        assert_eq!(
            stack_live(main_thread[0]),
            Live {
                bytes: field(&after_hook, "leaked_bytes"),
                allocs: 2 * LEAKED_BUFFERS_PER_INSTANCE
            },
            "attempt {attempt}: after the hook\n{report}"
        );
        assert_eq!(
            stack_allocated(main_thread[0]),
            Allocated {
                bytes: 2 * POOL_BYTES_PER_INSTANCE,
                count: 2 * POOL_ENTRIES
            },
            "attempt {attempt}: after the hook\n{report}"
        );

        let raced_allocs = report.int("/events/gpu_allocs") - 2 * ALLOCS_PER_INSTANCE;
        let threads: Vec<&Value> = report
            .stacks_with("gpu-device", "setup_storage")
            .into_iter()
            .filter(|stack| frames_contain(stack, "executor_thread_main"))
            .collect();
        assert_eq!(
            raced_allocs,
            6 * ALLOCS_PER_INSTANCE,
            "attempt {attempt}: device allocations right after the dlopen ({hooked_lines:?})\n{report}"
        );
        assert_eq!(threads.len(), 1, "attempt {attempt}:\n{report}");
        assert_eq!(
            stack_live(threads[0]),
            Live {
                bytes: field(&raced, "leaked_bytes"),
                allocs: 6 * LEAKED_BUFFERS_PER_INSTANCE,
            },
            "attempt {attempt}: right after the dlopen ({hooked_lines:?})\n{report}"
        );
        assert_eq!(
            stack_allocated(threads[0]),
            Allocated {
                bytes: 6 * POOL_BYTES_PER_INSTANCE,
                count: 6 * POOL_ENTRIES
            },
            "attempt {attempt}: right after the dlopen ({hooked_lines:?})\n{report}"
        );
    }
}

/// The state letter of `pid` in /proc/PID/stat ('T': stopped).
fn process_state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the target runs");
    let after_name = &stat[stat.rfind(')').expect("stat has the name in parentheses") + 2..];
    after_name.chars().next().expect("a state letter")
}

/// A tracer killed (SIGKILL) while the loader gate holds its target at a
/// dlopen does not leave the target stopped: its watchdog lets it go on.
/// The tracer is stopped first (SIGSTOP), so that it cannot look at the
/// libraries itself: the gate holds the target until tracer is gone.
#[test]
fn sigkilled_tracer_leaves_no_process_held_at_the_loader_gate() {
    let mut fixture = Fixture::start("gpu_executor_dlopen", &[]);
    let target = fixture.pid;
    let trace = Record::pid(target).attach();
    let tracer = trace.tracer;
    // SAFETY: a plain signal to our own child.
    assert_eq!(unsafe { libc::kill(tracer.pid() as i32, libc::SIGSTOP) }, 0);
    std::thread::scope(|scope| {
        let loading = scope.spawn(|| fixture.cmd("load"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_state(target) != 'T' {
            assert!(
                Instant::now() < deadline,
                "the loader gate did not hold the target"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let output = tracer.stop_with(libc::SIGKILL);
        assert_eq!(output.status.code(), None, "killed by a signal");
        assert_eq!(loading.join().expect("the load answered"), "loaded");
    });
    let answer = fixture.cmd("executor 1");
    assert_eq!(
        field(&answer, "instances"),
        1,
        "the target runs on: {answer}"
    );
}
