//! Unit tests of the command line.
use std::{path::PathBuf, time::Duration};

use super::{values::parse_interval, *};
use crate::{
    config::{FloorSites, FoldedValue, ReportFormat, Sampling, Targets},
    model::Kind,
};

fn record(arguments: &[&str]) -> Result<Parsed> {
    parse(
        ["tracer", "record"]
            .iter()
            .chain(arguments)
            .map(OsString::from),
    )
}

#[test]
fn durations() {
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
    assert!(parse_duration("0s").is_err());
    assert!(parse_duration("abc").is_err());
    assert!(parse_duration("5 parsecs").is_err());
    assert!(parse_interval("1ms").is_err());
}

#[test]
fn pids_and_command() {
    let Ok(Parsed::Record(config)) = record(&["--pid", "2", "-p", "1", "-p", "2", "--top", "3"])
    else {
        panic!("expected a config");
    };
    assert_eq!(config.trace.targets, Targets::Pids(vec![1, 2]));
    assert_eq!(config.trace.show.top, 3);
    assert_eq!(config.trace.schedule.interval, Duration::from_secs(1));
    assert_eq!(config.trace.probing.sampling, Sampling::EXACT);
    let Ok(Parsed::Record(config)) = record(&["--", "./prog", "--flag"]) else {
        panic!("expected a config");
    };
    assert_eq!(
        config.trace.targets,
        Targets::Spawn(vec!["./prog".into(), "--flag".into()])
    );
}

#[test]
fn sampling_and_size_filters() {
    let Ok(Parsed::Record(config)) = record(&[
        "-p",
        "1",
        "--sample-bytes",
        "524288",
        "--sample-seed",
        "7",
        "--min-size",
        "16",
        "--max-size",
        "4096",
    ]) else {
        panic!("expected a config");
    };
    assert_eq!(
        config.trace.probing.sampling,
        Sampling {
            sample_bytes: 524288,
            sample_seed: 7,
            min_size_bytes: 16,
            max_size_bytes: 4096,
        }
    );
    assert!(config.trace.probing.sampling.skips_calls());
    let Ok(Parsed::Floor(floor)) = parse(
        [
            "tracer",
            "floor",
            "--pid",
            "3",
            "--sites",
            "chosen",
            "--entry-only",
        ]
        .iter()
        .map(OsString::from),
    ) else {
        panic!("expected a floor config");
    };
    assert_eq!(
        floor,
        FloorConfig {
            pid: 3,
            sites: FloorSites::Chosen,
            with_return: false
        }
    );
}

#[test]
fn usage_errors_are_one_line_with_code_2() {
    for arguments in [
        &["--pid", "1", "--", "prog"][..],
        &[],
        &["--pid", "x"],
        &["--interval", "0s", "-p", "1"],
        &["-p", "1", "--sample-bytes", "0"],
        &["-p", "1", "--sample-bytes", "268435456"],
        &["-p", "1", "--min-size", "10", "--max-size", "9"],
        &["-p", "1", "--sample-seed", "1"],
    ] {
        let error = record(arguments).err().expect("an error");
        assert_eq!(
            crate::error::exit_code(&error),
            ExitCode::Usage,
            "{arguments:?}"
        );
        assert!(!error.to_string().contains('\n'), "{error}");
    }
}

#[test]
fn top_zero_is_every_stack() {
    let Ok(Parsed::Record(config)) = record(&["--pid", "1", "--top", "0"]) else {
        panic!("expected a config");
    };
    assert_eq!(config.trace.show.top, usize::MAX);
    let Ok(Parsed::Report(config)) = report(&["t.tracer", "--top", "0"]) else {
        panic!("expected a report config");
    };
    assert_eq!(config.top, Some(usize::MAX));
    let Ok(Parsed::Report(config)) = report(&["t.tracer", "--top", "7"]) else {
        panic!("expected a report config");
    };
    assert_eq!(config.top, Some(7));
}

fn report(arguments: &[&str]) -> Result<Parsed> {
    parse(
        ["tracer", "report"]
            .iter()
            .chain(arguments)
            .map(OsString::from),
    )
}

#[test]
fn report_flags() {
    let Ok(Parsed::Report(config)) = report(&[
        "t.tracer", "--format", "folded", "--value", "growth", "--kind", "heap", "-p", "7",
        "--from", "0", "--to", "1m", "-o", "out.txt",
    ]) else {
        panic!("expected a report config");
    };
    assert_eq!(config.recording_path, PathBuf::from("t.tracer"));
    assert_eq!(config.format, ReportFormat::Folded);
    assert_eq!(config.value, FoldedValue::Growth);
    assert_eq!(config.kind, Some(Kind::Heap));
    assert_eq!(
        (config.pid, config.from_s, config.to_s),
        (Some(7), Some(0.0), Some(60.0))
    );
    assert_eq!(config.top, None);
    assert_eq!(config.output_path, Some(PathBuf::from("out.txt")));
    for arguments in [
        &["t.tracer", "--from", "2s", "--to", "1s"][..],
        &["t.tracer", "--kind", "lunar"],
        &["t.tracer", "--format", "xml"],
        &[],
    ] {
        let error = report(arguments).err().expect("an error");
        assert_eq!(
            crate::error::exit_code(&error),
            ExitCode::Usage,
            "{arguments:?}"
        );
    }
}
