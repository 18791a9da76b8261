//! tracer's own readers of an ELF file: the object unwinding reads
//! (segments, sections, function symbols and their names, build id, Go's
//! `runtime.text` and asmcgocall, frame pointer use, unwind rows), the
//! allocator functions attach finds (symbols, prologues, what each calls),
//! the build id and `.gnu_debuglink`, and the dynamic section's run paths.
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tracer::{
    attach::{
        libraries::ahead::run_paths_in,
        sites::{
            forwarding::Forwarding,
            symbols::{SymbolTables, allocator_offsets},
        },
    },
    debug_files::read_debug_link,
    unwind::{
        ObjectInfo, frame_pointers,
        runtime_code::RuntimeCode as _,
        tables::{FrameSections, build_rows},
    },
};

fuzz_target!(|data: &[u8]| {
    tracer::runtimes::register();
    if let Some(object) = ObjectInfo::from_bytes(data) {
        for function in object.functions.iter().take(256) {
            let _ = object.is_own_code(function);
            if let Some(offset) = object.offset_of_address(function.address) {
                let _ = object.bytes_at(offset, 16);
            }
            let _ = object.has_unwind_info(function.address);
            let _ = object.code_before(function.address, 16);
        }
        let _ = object.function_named("malloc");
        let _ = object.build_id();
        let _ = object.eh_frame_hdr();
        let _ = tracer::runtimes::go::Go.stack_switch(&object);
        let _ = tracer::runtimes::go::Go.walker(&object, 0);
        let _ = frame_pointers::frame_pointer_share(&object);
        let _ = frame_pointers::keeps_frame_pointers(&object);
        let _ = build_rows(&FrameSections::of(&object));
    }
    for search in [SymbolTables::Dynamic, SymbolTables::DynamicAndFull] {
        let _ = allocator_offsets(data, search, Forwarding::TailJumpsAndCalls);
    }
    if let Ok(elf) = object::File::parse(data) {
        let _ = read_debug_link(&elf);
    }
    let dirs = run_paths_in(data, Path::new("/opt/app/lib"));
    assert!(dirs.len() <= tracer::attach::libraries::ahead::MAX_RUN_PATH_DIRS);
});
