//! The recording decoder below the CRC: every whole record of the input
//! gets a valid checksum (`with_checksums`), so each payload reaches
//! postcard and the checks that fit records together; a recording that
//! parses is turned into its model, whole and for a window.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer::recording::{Filter, parse};

fuzz_target!(|data: &[u8]| {
    let bytes = tracer_fuzz::with_checksums(data);
    let Ok(mut recording) = parse(&bytes, "fuzz input") else {
        return;
    };
    let _ = recording.warning();
    let whole = Filter::default();
    let window = Filter {
        from_s: Some(1.0),
        to_s: Some(5.0),
        ..Filter::default()
    };
    for filter in [whole, window] {
        let model = recording.model(&filter);
        let _ = model.snapshot_count();
        let _ = recording.targets(&filter);
        let _ = recording.libraries(&filter);
        let _ = recording.memory_status(&filter);
    }
    let _ = recording.apis_by_key();
    let _ = recording.take_frames_by_key();
});
