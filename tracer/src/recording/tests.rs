//! The recording's writer and reader together: round trips, every way a file
//! can be damaged, and a proptest that no input makes the reader panic.

use std::path::PathBuf;

use proptest::prelude::*;

use super::*;
use crate::{
    error::{ExitCode, exit_code},
    model::{
        Frame, Model, Snapshot, StackKey, Target,
        fixtures::{counters, heap_key},
    },
};

fn frames_of(key: &StackKey) -> Vec<Frame> {
    vec![Frame {
        address: 0x401000 + u64::from(key.stack_id.to_raw()),
        function: Some(format!("grow_{}", key.stack_id)),
        file: Some("leak.c".to_owned()),
        line: Some(key.stack_id.to_raw()),
        module: Some("/opt/app".to_owned()),
        build_id: Some("abcdef01".to_owned()),
        file_offset: Some(0x1000 + u64::from(key.stack_id.to_raw())),
        offset: None,
        language: crate::model::Language::Native,
    }]
}

fn metadata() -> Metadata {
    Metadata::for_this_host(
        std::time::Instant::now(),
        250,
        vec![
            Target::new(10, "./leak --fast".to_owned()),
            Target::new(20, "python3 export.py".to_owned()),
        ],
        Vec::new(),
        crate::model::run::SamplingReport::exact(),
    )
}

/// Pid 10 leaks 64 KiB per snapshot on stack 1; stack 2 is quiet; pid 20's
/// stack 1 appears at the third snapshot.
fn snapshots(count: usize) -> Vec<Snapshot> {
    (1..=count as i64)
        .map(|step| {
            let mut stacks = vec![
                (heap_key(10, 1), counters(65536 * step)),
                (heap_key(10, 2), counters(4096)),
            ];
            if step >= 3 {
                stacks.push((heap_key(20, 1), counters(640 * step)));
            }
            let mut stats = vec![0; tracer_ebpf::stat::COUNT as usize];
            stats[tracer_ebpf::stat::ALLOCS as usize] = 100 * step as u64;
            Snapshot {
                elapsed_s: step as f64 * 0.25,
                stacks,
                stats,
                rss_bytes: vec![(10, 1 << 20), (20, 2 << 20)],
                retired: Vec::new(),
                cpu_s: vec![(10, 0.125 * step as f64), (20, 0.5)],
            }
        })
        .collect()
}

fn temp_path(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "tracer-recording-{}-{test}.tracer",
        std::process::id()
    ))
}

/// Writes a recording of `count` snapshots; returns its bytes and the
/// length of the file after each snapshot.
fn record(test: &str, count: usize, finish: bool) -> (Vec<u8>, Vec<u64>) {
    let path = temp_path(test);
    let mut writer = Writer::create(&path, metadata()).unwrap();
    let mut lengths = Vec::new();
    for snapshot in snapshots(count) {
        writer
            .append_snapshot(&snapshot, &mut |key| (frames_of(key), None))
            .unwrap();
        lengths.push(writer.bytes_written());
    }
    writer.append_exit(20, 0.9).unwrap();
    if finish {
        writer.finish().unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    (bytes, lengths)
}

/// What a report shows of `model`: window, totals, counters, every stack
/// with its growth, series and frames, and the targets.
fn report_view(
    model: &Model,
    targets: &[Target],
    frames: &dyn Fn(&StackKey) -> Vec<Frame>,
) -> String {
    let stacks: Vec<String> = model
        .top_stacks(100)
        .iter()
        .map(|summary| {
            format!(
                "{summary:?} {:?} {:?} {:?}",
                model.growth(&summary.key),
                model.live_bytes_at_every_snapshot(&summary.key),
                frames(&summary.key)
            )
        })
        .collect();
    format!(
        "{} {:?} {:?} {:?} {stacks:#?} {targets:?}",
        model.window_s(),
        model.totals(),
        model.drops(),
        model.events()
    )
}

fn error_line(bytes: &[u8]) -> String {
    let error = parse(bytes, "t.tracer").unwrap_err();
    assert_eq!(exit_code(&error), ExitCode::BadRecording);
    crate::error::one_line(&error)
}

#[test]
fn round_trip_gives_the_live_report() {
    let mut live = Model::new();
    for snapshot in snapshots(8) {
        live.push(snapshot);
    }
    let mut live_targets = metadata().targets;
    live_targets[1].exited_after_s = Some(0.9);
    let (bytes, _) = record("round-trip", 8, true);

    let mut recording = parse(&bytes, "t.tracer").unwrap();
    assert_eq!(recording.warning(), None);
    assert_eq!(recording.snapshot_count(), 8);
    assert_eq!(recording.metadata.interval_ms, 250);
    let frames = recording.take_frames_by_key();
    let replayed = recording.model(&Filter::default());
    assert_eq!(
        report_view(&replayed, &recording.targets(&Filter::default()), &|key| {
            frames[key].clone()
        }),
        report_view(&live, &live_targets, &frames_of)
    );
}

#[test]
fn loader_pauses_come_back_from_the_recording() {
    let path = temp_path("loader-pauses");
    let mut writer = Writer::create(&path, metadata()).unwrap();
    let pauses = LoaderPauses {
        times: 3,
        held_ms: 4.1,
    };
    writer.append_loader_pauses(pauses).unwrap();
    writer.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(parse(&bytes, "t.tracer").unwrap().loader_pauses, pauses);
    // A recording without them (older, or nothing held) reads as none.
    let (bytes, _) = record("no-loader-pauses", 2, true);
    assert_eq!(
        parse(&bytes, "t.tracer").unwrap().loader_pauses,
        LoaderPauses::default()
    );
}

#[test]
fn a_quiet_stack_costs_nothing_per_snapshot() {
    let (_, lengths) = record("quiet", 12, true);
    let per_snapshot: Vec<u64> = lengths.windows(2).map(|pair| pair[1] - pair[0]).collect();
    // From the fourth snapshot on, two stacks change and one is quiet: the
    // two stacks, the snapshot's header and the RSS of the two targets take
    // about 50 bytes, their CPU times with its record's header 28, and
    // each STATS counter one more.
    let bound = 55 + 28 + u64::from(tracer_ebpf::stat::COUNT);
    assert!(
        per_snapshot[3..].iter().all(|&bytes| bytes <= bound),
        "{per_snapshot:?} (at most {bound})"
    );
}

#[test]
fn filters_select_pid_kind_and_window() {
    let (bytes, _) = record("filters", 8, true);
    let recording = parse(&bytes, "t.tracer").unwrap();
    let only_20 = Filter {
        pid: Some(20),
        ..Filter::default()
    };
    let model = recording.model(&only_20);
    let top = model.top_stacks(10);
    assert_eq!(top.len(), 1);
    assert_eq!(top[0].key, heap_key(20, 1));
    assert_eq!(recording.targets(&only_20).len(), 1);
    assert_eq!(recording.targets(&only_20)[0].exited_after_s, Some(0.9));

    let window = Filter {
        from_s: Some(0.5),
        to_s: Some(1.5),
        ..Filter::default()
    };
    let model = recording.model(&window);
    assert_eq!(model.snapshot_count(), 4);
    assert_eq!(model.window_s(), 1.0);
    let leak = model.top_stacks(1)[0].clone();
    assert_eq!(leak.key, heap_key(10, 1));
    assert_eq!(
        leak.latest.live_bytes,
        4 * 65536,
        "grown between 0.5 s and 1.5 s"
    );
    assert!((leak.growth_bytes_per_s - 4.0 * 65536.0).abs() < 1e-6);
    assert!(
        model
            .top_stacks(10)
            .iter()
            .all(|stack| stack.key != heap_key(10, 2))
    );
    assert_eq!(model.stats()[tracer_ebpf::stat::ALLOCS as usize], 400);
}

#[test]
fn a_cut_file_reads_up_to_its_last_complete_snapshot() {
    let (bytes, lengths) = record("cut", 5, true);
    for cut in 0..bytes.len() {
        match parse(&bytes[..cut], "t.tracer") {
            Ok(recording) => {
                let complete = lengths
                    .iter()
                    .filter(|&&length| length as usize <= cut)
                    .count();
                assert_eq!(recording.snapshot_count(), complete, "cut at {cut}");
                let warning = recording.warning().expect("a cut file warns");
                assert!(warning.starts_with("t.tracer "), "{warning}");
                assert!(
                    warning.contains(&format!("reporting the {complete} snapshots it holds")),
                    "{warning}"
                );
            }
            Err(error) => {
                let line = crate::error::one_line(&error);
                assert!(
                    line.contains("is empty") || line.contains("truncated"),
                    "cut at {cut}: {line}"
                );
            }
        }
    }
    let mid_record = lengths[2] as usize + 5;
    let warning = parse(&bytes[..mid_record], "t.tracer")
        .unwrap()
        .warning()
        .unwrap();
    assert_eq!(
        warning,
        format!(
            "t.tracer is truncated at byte {} (tracer was killed, or the copy is incomplete): \
             reporting the 3 snapshots it holds (0.8 s)",
            lengths[2]
        )
    );
}

#[test]
fn a_file_without_end_mark_warns() {
    let (bytes, _) = record("unfinished", 3, false);
    let recording = parse(&bytes, "t.tracer").unwrap();
    assert_eq!(recording.snapshot_count(), 3);
    assert_eq!(
        recording.warning().unwrap(),
        "t.tracer has no end mark (tracer was killed, or is still recording): \
         reporting the 3 snapshots it holds (0.8 s)"
    );
}

#[test]
fn damaged_files_are_one_line_errors() {
    let (bytes, lengths) = record("damaged", 3, true);
    assert_eq!(
        error_line(&[]),
        "t.tracer is empty: not a tracer recording, or one killed before it began"
    );
    assert_eq!(
        error_line(b"{\"stacks\": []}\n"),
        "t.tracer is not a tracer recording (wrong magic bytes)"
    );
    assert_eq!(
        error_line(&bytes[..10]),
        "t.tracer is truncated inside its header"
    );
    assert_eq!(
        error_line(&bytes[..PREAMBLE_BYTES + 3]),
        "t.tracer is truncated before its metadata: tracer stopped before it attached"
    );

    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert_eq!(
        error_line(&newer),
        format!(
            "t.tracer was written by a newer tracer (recording format {}; this tracer reads \
             format {FORMAT_VERSION}): upgrade tracer to read it",
            FORMAT_VERSION + 1
        )
    );

    let mut flipped = bytes.clone();
    let second_snapshot_payload = lengths[0] as usize + RECORD_HEADER_BYTES + 2;
    flipped[second_snapshot_payload] ^= 0x40;
    assert_eq!(
        error_line(&flipped),
        format!(
            "t.tracer is corrupt: the record at byte {} fails its checksum",
            lengths[0]
        )
    );

    let mut huge = bytes.clone();
    huge[PREAMBLE_BYTES..PREAMBLE_BYTES + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        error_line(&huge),
        format!("t.tracer is corrupt: the record at byte {PREAMBLE_BYTES} claims 4294967295 bytes")
    );

    let mut trailing = bytes.clone();
    trailing.extend_from_slice(&bytes[PREAMBLE_BYTES..]);
    assert!(error_line(&trailing).contains("is corrupt: data follows its end mark"));
}

#[test]
fn a_missing_file_names_its_path() {
    let error = read(std::path::Path::new("/nonexistent/trace.tracer")).unwrap_err();
    assert_eq!(exit_code(&error), ExitCode::BadRecording);
    assert_eq!(
        crate::error::one_line(&error),
        "cannot read /nonexistent/trace.tracer: No such file or directory (os error 2)"
    );
}

/// A valid recording, written once for the property tests.
fn sample_bytes() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| record("proptest", 6, true).0)
}

/// Reading must end in a recording or a one-line error, never a panic; and
/// what it reports must be usable (model and targets build).
fn read_without_panic(bytes: &[u8]) -> Option<usize> {
    match parse(bytes, "t.tracer") {
        Ok(recording) => {
            let model = recording.model(&Filter::default());
            let _ = recording.targets(&Filter::default());
            assert_eq!(model.snapshot_count(), recording.snapshot_count());
            Some(recording.snapshot_count())
        }
        Err(error) => {
            assert_eq!(exit_code(&error), ExitCode::BadRecording);
            assert!(!crate::error::one_line(&error).contains('\n'));
            None
        }
    }
}

proptest! {
    // PROPTEST_CASES=200000 fuzzes for a few minutes.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(2000)
    ))]

    #[test]
    fn arbitrary_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = sample_bytes()[..PREAMBLE_BYTES].to_vec();
        bytes.extend_from_slice(&tail);
        read_without_panic(&bytes);
        read_without_panic(&tail);
    }

    #[test]
    fn damaged_recordings_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1..=255u8), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = sample_bytes().to_vec();
        for (index, mask) in flips {
            let at = index.index(bytes.len());
            bytes[at] ^= mask;
        }
        if let Some(count) = read_without_panic(&bytes) {
            prop_assert!(count <= 6);
        }
        bytes.truncate(cut.index(bytes.len()));
        read_without_panic(&bytes);
    }
}

#[test]
fn format_3_frames_read_without_offsets() {
    let frame = super::FrameV3 {
        address: 0x7f00_1234,
        function: None,
        file: None,
        line: None,
        module: Some("/usr/lib/libfoo.so".to_owned()),
        build_id: Some("ab12".to_owned()),
        file_offset: Some(0x1234),
    };
    let record: super::Record<super::FrameV3> = super::Record::Stack(super::StackRecord {
        pid: 7,
        stack_id: 3,
        kind: "heap".to_owned(),
        frames: vec![frame],
        api: None,
    });
    let payload = postcard::to_allocvec(&record).unwrap();
    let super::Record::Stack(stack) = super::decode(&payload, 3).unwrap() else {
        panic!("a stack record");
    };
    assert_eq!(stack.frames[0].file_offset, Some(0x1234));
    assert_eq!(stack.frames[0].offset, None);
    assert_eq!(stack.frames[0].build_id.as_deref(), Some("ab12"));
}
