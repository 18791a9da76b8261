//! A JIT runtime's perf map, as appended in pieces: `[first piece length:
//! u16][addresses to look up: 4 x u64]`, then the map's bytes (two
//! appends: the first piece, then the rest).
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer::{runtimes::jit::PerfMaps, symbolize::jit::JitNames as _};

fuzz_target!(|data: &[u8]| {
    let mut fields = tracer_fuzz::Fields::new(data);
    let first = usize::from(fields.u16());
    let addresses = [fields.u64(), fields.u64(), fields.u64(), fields.u64()];
    let (head, tail) = fields.rest().split_at(first.min(fields.rest().len()));
    let mut maps = PerfMaps::default();
    maps.add(1, head);
    maps.add(1, tail);
    for address in addresses {
        let _ = maps.name(1, address);
    }
});
