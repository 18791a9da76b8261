//! `.eh_frame` and `.debug_frame` bytes -> the unwind rows the kernel's
//! walker reads: `[eh_frame address: u64][text address: u64][eh_frame
//! length: u32]`, then `.eh_frame`'s bytes and `.debug_frame`'s (the
//! rest). The rows must come out sorted, and every address must find its
//! row.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer::unwind::tables::{FrameSections, build_rows, row_for};

fuzz_target!(|data: &[u8]| {
    let mut fields = tracer_fuzz::Fields::new(data);
    let eh_frame_address = fields.u64();
    let text_address = fields.u64();
    let eh_frame_bytes = (fields.u32() as usize).min(fields.rest().len());
    let (eh_frame, debug_frame) = fields.rest().split_at(eh_frame_bytes);
    let sections = FrameSections {
        eh_frame: Some((eh_frame_address, eh_frame)),
        debug_frame: (!debug_frame.is_empty()).then_some(debug_frame),
        text_address,
    };
    let built = build_rows(&sections);
    assert!(
        built.rows.windows(2).all(|pair| pair[0].pc <= pair[1].pc),
        "rows out of order"
    );
    for row in built.rows.iter().take(64) {
        let found = row_for(&built.rows, u64::from(row.pc)).expect("a row at its own pc");
        assert_eq!(found.pc, row.pc);
    }
    let _ = built.bytes();
});
