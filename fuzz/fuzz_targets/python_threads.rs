//! CPython's layout and thread states read from a memory image:
//! `[version: u8][_PyRuntime address: u64][pthread tid offset: u64]`,
//! then the image. Version 0 is 3.13+, whose layout is read from the
//! `_Py_DebugOffsets` at `_PyRuntime`; 9 to 12 are 3.9 to 3.12's tables.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer::{
    runtimes::python::{self, layout},
    target_memory::TargetMemory as _,
};

fuzz_target!(|data: &[u8]| {
    let mut fields = tracer_fuzz::Fields::new(data);
    let version = fields.u8();
    let runtime = fields.u64();
    let pthread_tid = fields.u64();
    let image = tracer_fuzz::image(fields.rest());
    let layout = if version == 0 {
        let mut offsets = vec![0u8; layout::DEBUG_OFFSETS_3_13_BYTES];
        if !image.read_exact(runtime, &mut offsets) {
            return;
        }
        layout::from_debug_offsets_3_13(&offsets)
    } else {
        layout::for_version(3, version)
    };
    let Some(layout) = layout else {
        return;
    };
    let threads = python::thread_states(&image, &layout, runtime, pthread_tid);
    assert!(threads.len() <= python::MAX_THREADS);
});
