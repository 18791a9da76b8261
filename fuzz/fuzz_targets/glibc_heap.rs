//! glibc's malloc heap read from a memory image: arenas, heaps, chunks,
//! tcaches and fastbins. `[glibc minor version: u8][main_arena: u64]
//! [tcache_key address: u64 (0: none)][[heap] start: u64][[heap] end:
//! u64][traced blocks: u8]`, each block `[address: u64][size: u32]`,
//! then the image.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer::holders::{
    Block,
    blocks::{Blocks, Origin},
    glibc::{self, Glibc},
};

fuzz_target!(|data: &[u8]| {
    let mut fields = tracer_fuzz::Fields::new(data);
    let version = (2, u32::from(fields.u8()));
    let main_arena = fields.u64();
    let tcache_key_address = Some(fields.u64()).filter(|&address| address != 0);
    let brk_heap = Some((fields.u64(), fields.u64())).filter(|(start, end)| start < end);
    let traced = (0..fields.u8())
        .map(|_| Block::untraced(fields.u64(), u64::from(fields.u32()), Origin::HeapChunk))
        .collect();
    let image = tracer_fuzz::image(fields.rest());
    let Ok((heap_info_bytes, safe_linking)) = glibc::layout(version) else {
        return;
    };
    let glibc = Glibc {
        version,
        heap_info_bytes,
        safe_linking,
        main_arena,
        found_by: "fuzz input",
        tcache_key_address,
    };
    let traced = Blocks::new(traced);
    if let Ok((arenas, chunks, free)) = glibc::read_arenas(&image, &glibc, brk_heap, &traced) {
        assert!(chunks.in_use.windows(2).all(|pair| pair[0] <= pair[1]));
        assert!(free.tcache_chunks as usize + free.fastbin_chunks as usize >= free.chunks.len());
        let _ = arenas.len();
    }
});
