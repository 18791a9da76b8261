//! C++ exceptions through return-probed frames: a program that catches
//! `std::bad_alloc` survives tracer under every allocator and mode where
//! operator new keeps a return probe, and what it keeps is counted as
//! untraced runs would show it, the requests that threw never live.
//!
//! On main before the fix, the tcmalloc, jemalloc, `--unwind fp` and
//! sampled runs were terminated (exit 134): the unwinder met the uprobe
//! trampoline where operator new's return address had been. With several
//! threads throwing at once (the `..._threads_throwing_at_once` tests),
//! main at 7a51578 still terminated the target within a few dozen throws:
//! a process-wide SIGSTOP already pending from one thread left another
//! thread that started an unwind free to run it unrepaired.

use crate::harness;

use std::time::Duration;

use harness::{Fixture, Live, Record, Report, field, require_root};

const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
const TCMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4";

const THROWS: i64 = 200;
const KEPT: i64 = 200;
const KEPT_BYTES: i64 = 1000;

/// The fixture's answers and tracer's report.
struct Run {
    answers: Vec<String>,
    report: Report,
    stderr: String,
}

/// The exceptions fixture (with `env`), traced with `extra_args` while it
/// runs `commands`; the tracer is stopped while the fixture lives, then
/// the fixture must quit and exit 0.
fn traced(env: &[(&str, &str)], extra_args: &[&str], commands: &[&str]) -> Run {
    require_root();
    for (name, library) in env {
        assert!(
            *name != "LD_PRELOAD" || std::path::Path::new(library).is_file(),
            "{library} is missing: run `cargo xtask setup`"
        );
    }
    let mut fixture = Fixture::start_with_env("exceptions", &[], env);
    let mut trace = Record::pid(fixture.pid)
        .args(["-v"])
        .args(extra_args)
        .attach();
    // libstdc++ has no frame pointers: a stack walked from the malloc of
    // an operator new before its table is in loses operator new's caller.
    if !extra_args.contains(&"fp") {
        trace.wait_tables_ready();
    }
    let answers: Vec<String> = commands
        .iter()
        .map(|command| fixture.cmd(command))
        .collect();
    let traced = trace.stop();
    let status = fixture.quit();
    assert!(status.success(), "the traced fixture exited with {status}");
    Run {
        answers,
        report: traced.report,
        stderr: traced.output.stderr,
    }
}

/// Throws 200 times and keeps 200 x 1000 B: every throw caught, the kept
/// blocks exact, nothing under the function that threw, and the restores
/// counted (at least one per throw where operator new is return-probed).
fn survives_exact(env: &[(&str, &str)], extra_args: &[&str], operator_new_probed: bool) {
    let run = traced(
        env,
        extra_args,
        &[&format!("throw {THROWS}"), &format!("keep {KEPT}")],
    );
    let report = &run.report;
    assert_eq!(field(&run.answers[0], "caught"), THROWS);
    assert_eq!(field(&run.answers[1], "kept_bytes"), KEPT * KEPT_BYTES);
    assert_kept_and_nothing_thrown_live(report);
    check_restores(report, operator_new_probed);
    if operator_new_probed {
        assert!(
            run.stderr
                .contains("C++ unwinds through return-probed frames held their process"),
            "tracer says what the holds cost:\n{}",
            run.stderr
        );
    }
}

/// The kept blocks exact, and nothing of the requests that threw live.
fn assert_kept_and_nothing_thrown_live(report: &Report) {
    assert_eq!(
        report.heap_live_with("keep_here"),
        Live::blocks(KEPT, KEPT_BYTES),
        "\n{report}"
    );
    assert_eq!(
        report.heap_live_with("throw_here"),
        Live::default(),
        "a request that threw is counted live:\n{report}"
    );
}

/// The unwinds were seen, and where operator new is return-probed, each
/// throw's return address was put back and none was lost.
fn check_restores(report: &Report, operator_new_probed: bool) {
    assert!(
        report.int("/events/exception_unwinds") >= THROWS,
        "{}",
        report.json["events"]
    );
    report.assert_no_exception_restore_lost();
    if operator_new_probed {
        assert!(
            report.int("/events/exception_returns_restored") >= THROWS,
            "{}",
            report.json["events"]
        );
        assert!(
            report.int("/events/calls_left_by_exception") >= THROWS,
            "{}",
            report.json["events"]
        );
    }
}

#[test]
fn glibc_survives_bad_alloc_exact() {
    // operator new passes its call on to malloc: it has no probe.
    survives_exact(&[], &[], false);
}

#[test]
fn glibc_with_frame_pointer_walks_survives_bad_alloc_exact() {
    survives_exact(&[], &["--unwind", "fp"], true);
}

#[test]
fn tcmalloc_survives_bad_alloc_exact() {
    survives_exact(&[("LD_PRELOAD", TCMALLOC)], &[], true);
}

#[test]
fn jemalloc_survives_bad_alloc_exact() {
    survives_exact(&[("LD_PRELOAD", JEMALLOC)], &[], true);
}

/// Sampled (uprobe sessions skip the return of calls not recorded; a
/// 2^47-byte request is always recorded, so its return probe stays): the
/// kept bytes are estimated within three standard deviations.
#[test]
fn sampled_jemalloc_survives_bad_alloc() {
    const SAMPLE_BYTES: f64 = 4096.0;
    let run = traced(
        &[("LD_PRELOAD", JEMALLOC)],
        &["--sample-bytes", "4096", "--sample-seed", "1"],
        &[&format!("throw {THROWS}"), &format!("keep {KEPT}")],
    );
    let report = &run.report;
    assert_eq!(field(&run.answers[0], "caught"), THROWS);
    let truth = (KEPT * KEPT_BYTES) as f64;
    let estimate = report.heap_live_with("keep_here").bytes as f64;
    let bound = 3.0 * (SAMPLE_BYTES * truth).sqrt();
    assert!(
        (estimate - truth).abs() <= bound,
        "estimate {estimate} truth {truth} bound ±{bound:.0}:\n{report}"
    );
    assert_eq!(
        report.heap_live_with("throw_here"),
        Live::default(),
        "\n{report}"
    );
    check_restores(report, true);
}

/// A tail call into operator new (its caller's frame is the one the
/// probe's return address is in) and a longjmp out of operator new (its
/// new_handler jumps: the kernel drops the return instance by itself)
/// both leave the target running, and the blocks kept before stay exact.
#[test]
fn tail_calls_and_longjmp_out_of_operator_new_still_work() {
    let run = traced(
        &[("LD_PRELOAD", JEMALLOC)],
        &[],
        &[
            &format!("keep {KEPT}"),
            &format!("throw_tail {THROWS}"),
            "jump 50",
            &format!("throw {THROWS}"),
        ],
    );
    let report = &run.report;
    assert_eq!(field(&run.answers[1], "caught"), THROWS);
    assert_eq!(field(&run.answers[2], "jumped"), 50);
    assert_eq!(field(&run.answers[3], "caught"), THROWS);
    assert_kept_and_nothing_thrown_live(report);
}

/// Threads throwing at once, each: `THREAD_THROWS` throws, as many 100 B
/// blocks made and freed, as many 1000 B blocks kept.
const THREADS: i64 = 4;
const THREAD_THROWS: i64 = 1000;

/// `THREADS` threads throw and keep at once while tracer is attached:
/// every throw caught, the kept blocks exact, nothing under the function
/// that threw, every unwind's return address put back and none lost.
fn threads_survive_exact(env: &[(&str, &str)], extra_args: &[&str]) {
    let run = traced(
        env,
        extra_args,
        &[&format!("throw_threads {THREADS} {THREAD_THROWS}")],
    );
    let report = &run.report;
    let throws = THREADS * THREAD_THROWS;
    assert_eq!(field(&run.answers[0], "caught"), throws);
    assert_eq!(field(&run.answers[0], "kept_bytes"), throws * KEPT_BYTES);
    assert_eq!(
        report.heap_live_with("keep_in_thread"),
        Live::blocks(throws, KEPT_BYTES),
        "\n{report}"
    );
    assert_eq!(
        report.heap_live_with("throw_here"),
        Live::default(),
        "a request that threw is counted live:\n{report}"
    );
    for (counter, at_least) in [
        ("/events/exception_unwinds", throws),
        ("/events/exception_returns_restored", throws),
        ("/events/calls_left_by_exception", throws),
    ] {
        assert!(
            report.int(counter) >= at_least,
            "{counter} under {at_least}: {}",
            report.json["events"]
        );
    }
    report.assert_no_exception_restore_lost();
    assert!(
        run.stderr
            .contains("C++ unwinds through return-probed frames held their process"),
        "tracer says what the holds cost:\n{}",
        run.stderr
    );
}

#[test]
fn jemalloc_survives_threads_throwing_at_once() {
    threads_survive_exact(&[("LD_PRELOAD", JEMALLOC)], &[]);
}

#[test]
fn tcmalloc_survives_threads_throwing_at_once() {
    threads_survive_exact(&[("LD_PRELOAD", TCMALLOC)], &[]);
}

#[test]
fn glibc_with_frame_pointer_walks_survives_threads_throwing_at_once() {
    threads_survive_exact(&[], &["--unwind", "fp"]);
}

/// The late hook fixture with `--unwind fp` (where operator new keeps its
/// return probe), after it dlopen()ed `library` once tracer attached
/// (with `wait_for_unwinder`, once tracer said the unwinder is probed;
/// else at once): 200 throws caught, 200 x 1000 B kept, exit 0.
fn late_library_survives(library: &str, wait_for_unwinder: bool) -> Run {
    require_root();
    let mut fixture = Fixture::start("late_new_host", &[]);
    let mut trace = Record::pid(fixture.pid)
        .args(["-v", "--unwind", "fp"])
        .attach();
    let mut answers = vec![fixture.cmd(&format!("load {library}"))];
    if wait_for_unwinder {
        trace
            .tracer
            .wait_stderr("the C++ unwinder is probed now", Duration::from_secs(60));
    }
    answers.push(fixture.cmd(&format!("throw {THROWS}")));
    answers.push(fixture.cmd(&format!("keep {KEPT}")));
    let traced = trace.stop();
    let status = fixture.quit();
    assert!(status.success(), "the traced fixture exited with {status}");
    assert_eq!(answers[0], "loaded", "{answers:?}");
    assert_eq!(field(&answers[1], "caught"), THROWS, "{answers:?}");
    assert_eq!(field(&answers[2], "kept_bytes"), KEPT * KEPT_BYTES);
    assert_kept_and_nothing_thrown_live(&traced.report);
    Run {
        answers,
        report: traced.report,
        stderr: traced.output.stderr,
    }
}

/// The symbols probed in files named `file_name` of the report's target.
fn probed_in(report: &Report, file_name: &str) -> Vec<String> {
    report.json["probes"]
        .as_array()
        .expect("probes")
        .iter()
        .filter(|probe| {
            probe["module"]
                .as_str()
                .is_some_and(|module| module.ends_with(file_name))
        })
        .filter_map(|probe| probe["symbol"].as_str().map(str::to_owned))
        .collect()
}

/// A C program (no unwinder mapped) dlopen()s a library that defines
/// operator new and carries its own unexported unwinder: no unwinder is
/// ever probed, so the at-open hook holds operator new's return probe
/// back for good. On main at c948d8c, libraries hooked after attach kept
/// their throwing return probes unconditionally: the first throw met the
/// trampoline and the fixture was terminated (exit 134).
#[test]
fn late_library_without_a_probed_unwinder_gets_no_throwing_return_probe() {
    let run = late_library_survives("liblate_new_static.so", false);
    let probed = probed_in(&run.report, "liblate_new_static.so");
    assert!(!probed.iter().any(|symbol| symbol == "_Znwm"), "{probed:?}");
    assert!(
        run.stderr
            .contains("_Znwm can throw and the C++ unwinder is not probed"),
        "tracer says what it left unprobed:\n{}",
        run.stderr
    );
}

/// A C program dlopen()s a library that defines operator new and needs
/// libstdc++, and throws at once: the loader opens the library before
/// libgcc_s, whose unwinder is probed tens of milliseconds later (its
/// program verified then), after the dlopen() returned. On main at
/// c948d8c, operator new's return probe went in first and the first
/// throws terminated the fixture (exit 134); now it waits.
#[test]
fn late_library_throwing_right_after_its_dlopen_survives() {
    late_library_survives("liblate_new.so", false);
}

/// The same, throwing once tracer said the unwinder is probed: operator
/// new has its return probe then (the restores show it in use). Main at
/// c948d8c never says so (it attached the return probe before the
/// unwinder's): there this test fails at the wait.
#[test]
fn late_library_gets_its_throwing_return_probe_once_the_unwinder_is_probed() {
    let run = late_library_survives("liblate_new.so", true);
    let report = &run.report;
    let probed = probed_in(report, "liblate_new.so");
    assert!(probed.iter().any(|symbol| symbol == "_Znwm"), "{probed:?}");
    assert!(
        probed_in(report, "libgcc_s.so.1")
            .iter()
            .any(|symbol| symbol == "_Unwind_RaiseException"),
        "{}",
        report.json["probes"]
    );
    assert!(
        run.stderr.contains("_Znwm in "),
        "tracer names the held-back probes that went in:\n{}",
        run.stderr
    );
    check_restores(report, true);
}
