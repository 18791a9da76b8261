//! The /proc files tracer parses: maps (file mappings, and every region
//! for `--holders`), stat, status and syscall, all over the same text.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer::{holders::memory, procfs};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for mapping in procfs::parse_maps(&text) {
        if mapping.contains(mapping.start) {
            let _ = mapping.file_offset_of(mapping.start);
        }
    }
    let regions = memory::parse_regions(&text);
    for region in &regions {
        let _ = (region.scanned(), region.is_file(), region.bytes());
    }
    let _ = memory::joined(&regions);
    let _ = memory::parse_syscall(&text);
    let _ = procfs::stat_state(&text);
    let _ = procfs::stat_cpu_time_ns(&text, 100);
    let _ = procfs::stat_start_ticks(&text);
    let _ = procfs::status_memory(&text);
    let _ = procfs::status_namespace_pid(&text);
    let _ = procfs::status_tgid(&text);
});
