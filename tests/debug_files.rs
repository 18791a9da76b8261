//! Frames of stripped code: symbols and lines from separate debug files
//! (found by build id under a `--debug-dir`, or through `.gnu_debuglink`
//! next to the object), and `module+0xOFFSET` (the ELF virtual address,
//! as `nm` lists it) where there is none; `tracer report --debug-dir`
//! symbolizes such a recording later. The fixtures are stripped copies of
//! `leaky` (`cargo xtask setup`, target/fixtures/stripped).

use crate::harness;

use std::ffi::OsStr;
use std::path::PathBuf;

use harness::{
    EXIT_TIMEOUT, Fixture, LEAK_SIZE_BYTES, Record, Report, Traced, Tracer, build_id, field,
    fixture, json_path, return_address, stack_int, workspace_root,
};
use serde_json::Value;

const LEAKS: i64 = 25;

fn debug_dir() -> PathBuf {
    workspace_root().join("target/fixtures/stripped/debug")
}

/// Traces stripped fixture `name` while it leaks, with `args`.
fn trace_leaks(name: &str, args: &[&OsStr]) -> Traced {
    let mut leaky = Fixture::start(&format!("stripped/{name}"), &[]);
    let trace = Record::pid(leaky.pid).interval("60s").args(args).attach();
    let answer = leaky.cmd(&format!("leak {LEAKS}"));
    assert_eq!(field(&answer, "bytes"), LEAKS * LEAK_SIZE_BYTES);
    // The fixture answered after its last malloc returned: the final
    // snapshot at SIGINT holds them all (the only one after attach, at
    // this interval).
    trace.stop()
}

/// The heap stack that holds exactly the leak.
fn leak_stack(report: &Report) -> &Value {
    let stacks: Vec<&Value> = report
        .stacks()
        .iter()
        .filter(|stack| {
            stack["kind"] == "heap" && stack_int(stack, "live_bytes") == LEAKS * LEAK_SIZE_BYTES
        })
        .collect();
    assert_eq!(stacks.len(), 1, "one stack holds the leak:\n{report}");
    stacks[0]
}

fn assert_leak_here_named_with_its_line(traced: &Traced) {
    assert_site_is_leak_here(&leak_stack(&traced.report)["site"]);
}

/// leak_here, in leaky.c, at its malloc's line: names from the debug file.
fn assert_site_is_leak_here(site: &Value) {
    let source = workspace_root().join("tests/fixtures/leaky.c");
    assert_eq!(site["function"], "leak_here", "{site}");
    assert!(
        site["file"]
            .as_str()
            .is_some_and(|file| file.ends_with("leaky.c")),
        "file from the debug file: {site}"
    );
    assert_eq!(
        site["line"].as_i64(),
        Some(harness::marked_line(
            &source,
            "sink = malloc(LEAK_SIZE_BYTES);"
        )),
        "line from the debug file: {site}"
    );
}

#[test]
fn a_debug_file_under_a_build_id_path_names_the_leak() {
    let traced = trace_leaks(
        "leaky_buildid",
        &[OsStr::new("--debug-dir"), debug_dir().as_os_str()],
    );
    assert_leak_here_named_with_its_line(&traced);
}

#[test]
fn a_debug_file_named_by_gnu_debuglink_names_the_leak() {
    let traced = trace_leaks("leaky_debuglink", &[]);
    assert_leak_here_named_with_its_line(&traced);
}

#[test]
fn without_a_debug_file_frames_are_module_and_elf_address() {
    let traced = trace_leaks("leaky_nodebug", &[]);
    let stack = leak_stack(&traced.report);
    let frame = &stack["site"];
    assert_eq!(frame["function"], Value::Null, "stripped: {frame}");
    assert!(
        frame["module"]
            .as_str()
            .is_some_and(|module| module.ends_with("/leaky_nodebug"))
    );
    assert_eq!(
        frame["build_id"],
        build_id(&fixture("stripped/leaky_nodebug")).as_str(),
        "{frame}"
    );
    let offset = frame["offset"].as_u64().expect("an ELF address");
    // The return address of leak_here's malloc call, as the unstripped
    // build (the same code) disassembles.
    assert_eq!(
        offset,
        return_address(&fixture("leaky"), "leak_here", "malloc"),
        "{frame}"
    );
    let label = format!("leaky_nodebug+0x{offset:x}");
    assert_eq!(frame["label"], label.as_str());
    assert!(
        traced.output.stdout.contains(&label),
        "the text report names {label}:\n{}",
        traced.output
    );
    assert!(
        !traced.output.stdout.contains("[leaky_nodebug] 0x"),
        "no process address:\n{}",
        traced.output
    );
}

#[test]
fn report_symbolizes_a_recording_from_a_debug_dir() {
    let recording = json_path("debug_dir").with_extension("tracer");
    trace_leaks("leaky_nodebug", &[OsStr::new("-o"), recording.as_os_str()]);
    let json = json_path("debug_dir_report");
    let output = Tracer::start([
        OsStr::new("report"),
        recording.as_os_str(),
        OsStr::new("--format"),
        OsStr::new("json"),
        OsStr::new("--debug-dir"),
        debug_dir().as_os_str(),
        OsStr::new("-o"),
        json.as_os_str(),
    ])
    .wait_exit(EXIT_TIMEOUT);
    output.assert_success();
    let _ = std::fs::remove_file(&recording);
    let report = Report::read(&json);
    assert_site_is_leak_here(&leak_stack(&report)["site"]);
}
