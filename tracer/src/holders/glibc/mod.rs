//! The heap as glibc's malloc sees it, read from outside without stopping
//! the target: its arenas and their chunks, which are in use and which are
//! free (bins, fastbins, tcaches, the top chunk), and the chunks it mapped
//! on its own. The in-use chunks tracer has no block for (allocated before
//! it attached) become untraced blocks of the graph, so that what was there
//! before attach is named, typed and held like the rest; free memory and
//! the allocator's own data hold nothing (their stale pointers are no
//! references): the ranges walked whole are returned for the scan to skip
//! outside blocks.
//!
//! Where the heap cannot be read this way the scan goes on as before (that
//! memory is "untraced memory in MAPPING") and the report says why: another
//! allocator took malloc (jemalloc, tcmalloc, mimalloc: "heap before attach
//! not parsed for jemalloc"), no glibc is mapped (a static binary, musl), a
//! glibc outside the layout table, or no arena that passes the checks.
//!
//! `layout`: versions, offsets, finding `main_arena`; `walk`: arenas,
//! heaps, chunks; `free`: tcaches and fastbins; `mmapped`: chunks mapped
//! on their own.
mod free;
mod layout;
mod mmapped;
mod walk;

use std::collections::HashSet;

use object::{Object as _, ObjectSymbol as _};

use super::{
    blocks::{Block, Blocks, Origin},
    memory::{self, MapsLine},
    names::{Globals, Module},
};
use crate::{
    model::reachability::HeapParse,
    target_memory::{Process, TargetMemory},
};
use layout::CHUNK_HEADER_BYTES;
pub use layout::{Glibc, layout};

/// The untraced blocks found in the heap, the ranges whose memory outside
/// blocks is free or the allocator's, and what was read.
#[derive(Default)]
pub struct Heap {
    pub blocks: Vec<Block>,
    /// Sorted, disjoint.
    pub parsed: Vec<(u64, u64)>,
    pub parse: HeapParse,
}

/// Allocators that replace glibc's malloc, by library file name.
const OTHER_ALLOCATORS: [(&str, &str); 3] = [
    ("libjemalloc", "jemalloc"),
    ("libtcmalloc", "tcmalloc"),
    ("libmimalloc", "mimalloc"),
];

/// Reads the heap of `pid` (`regions`, its modules in `globals`) outside
/// the `traced` blocks, at most `limit` untraced blocks (the chunks past
/// it, and the heap after the first of them, stay untraced memory).
pub fn find(
    pid: u32,
    regions: &[MapsLine],
    traced: &Blocks,
    globals: &Globals,
    limit: usize,
) -> Heap {
    let mut heap = Heap::default();
    if let Some(name) = other_allocator(pid, globals) {
        heap.parse.not_parsed = Some(format!("heap before attach not parsed for {name}"));
        return heap;
    }
    let Some(libc) = globals
        .modules()
        .iter()
        .find(|module| is_glibc(&module.name))
    else {
        heap.parse.not_parsed = Some(
            "heap before attach not parsed: no glibc libc.so.6 mapped (a static binary or \
             another C library)"
                .to_owned(),
        );
        return heap;
    };
    let glibc = match layout::locate(pid, libc, regions) {
        Ok(glibc) => glibc,
        Err(reason) => {
            heap.parse.not_parsed = Some(format!("heap before attach not parsed: {reason}"));
            return heap;
        }
    };
    heap.parse.allocator = format!(
        "glibc {}.{} (main_arena by {})",
        glibc.version.0, glibc.version.1, glibc.found_by
    );
    let joined = memory::joined(regions);
    let brk_heap = joined
        .iter()
        .find(|region| region.name == "[heap]")
        .map(|region| (region.start, region.end));
    let (arenas, chunks, free) = match read_arenas(&Process(pid), &glibc, brk_heap, traced) {
        Ok(read) => read,
        Err(reason) => {
            heap.parse.not_parsed = Some(format!("heap before attach not parsed: {reason}"));
            return heap;
        }
    };
    let metadata: HashSet<u64> = free.tcaches.iter().copied().collect();
    let mut left_out_from = u64::MAX;
    for &(chunk, size) in &chunks.in_use {
        if free.chunks.contains(&chunk) || metadata.contains(&chunk) {
            continue;
        }
        let block = Block::untraced(
            chunk + CHUNK_HEADER_BYTES,
            size - CHUNK_HEADER_BYTES / 2,
            Origin::HeapChunk,
        );
        if overlaps(traced, &block) {
            continue;
        }
        if heap.blocks.len() == limit {
            heap.parse.chunks_left_out += 1;
            left_out_from = left_out_from.min(chunk);
            continue;
        }
        heap.blocks.push(block);
    }
    let heaps: Vec<(u64, u64)> = sorted(
        arenas
            .iter()
            .flat_map(|arena| &arena.heaps)
            .map(|arena_heap| (arena_heap.start, arena_heap.end))
            .collect(),
    );
    let mut mapped = mmapped::find(pid, &joined, traced, &heaps, globals);
    let room = limit - heap.blocks.len();
    if mapped.chunks.len() > room {
        heap.parse.chunks_left_out += (mapped.chunks.len() - room) as u64;
        mapped.chunks.truncate(room);
    }
    for &(chunk, size) in &mapped.chunks {
        heap.blocks.push(Block::untraced(
            chunk + CHUNK_HEADER_BYTES,
            size - CHUNK_HEADER_BYTES,
            Origin::MmappedChunk,
        ));
    }
    // The arenas' memory from the first chunk left out on is no longer
    // known whole: untraced memory again.
    let arena_parsed = chunks.parsed.iter().filter_map(|&(start, end)| {
        (start < left_out_from).then_some((start, end.min(left_out_from)))
    });
    heap.parsed = sorted(
        arena_parsed
            .chain(
                mapped
                    .chunks
                    .iter()
                    .chain(&mapped.traced_chunks)
                    .map(|&(chunk, size)| (chunk, chunk + size)),
            )
            .collect(),
    );
    heap.parse = HeapParse {
        arenas: arenas.len() as u64,
        heaps: heaps.len() as u64,
        chunks_in_use: chunks.in_use.len() as u64,
        untraced_chunks: heap.blocks.len() as u64 - mapped.chunks.len() as u64,
        untraced_chunk_bytes: heap
            .blocks
            .iter()
            .filter(|block| block.origin() == Some(Origin::HeapChunk))
            .map(|block| block.size)
            .sum(),
        free_chunks: chunks.free_chunks,
        free_bytes: chunks.free_bytes,
        tcaches: free.tcaches.len() as u64,
        tcaches_unreadable: free.tcaches_unreadable,
        tcache_chunks: free.tcache_chunks,
        fastbin_chunks: free.fastbin_chunks,
        mmapped_chunks: mapped.chunks.len() as u64,
        mmapped_chunk_bytes: mapped.chunks.iter().map(|&(_, size)| size).sum(),
        resyncs: chunks.resyncs,
        unparsed_bytes: chunks.unparsed_bytes,
        bytes_read: chunks.bytes_read + mapped.bytes_read,
        ..std::mem::take(&mut heap.parse)
    };
    heap
}

/// The arenas of `glibc` in `memory` (`brk_heap`: the `[heap]` mapping),
/// their chunks walked (in use ones sorted by address), and the free ones
/// among those (tcaches, fastbins); `traced` gives the chunks a walk goes
/// on from after a header that makes no sense.
pub fn read_arenas(
    memory: &impl TargetMemory,
    glibc: &Glibc,
    brk_heap: Option<(u64, u64)>,
    traced: &Blocks,
) -> Result<(Vec<walk::Arena>, walk::Chunks, free::Free), String> {
    let arenas = walk::arenas(memory, glibc, brk_heap)?;
    let mut chunks = walk::Chunks::default();
    for arena_heap in arenas.iter().flat_map(|arena| &arena.heaps) {
        walk::walk(memory, arena_heap, traced, &mut chunks);
    }
    chunks.in_use.sort_unstable();
    let free = free::find(memory, glibc, &arenas, &chunks.in_use);
    Ok((arenas, chunks, free))
}

fn is_glibc(name: &str) -> bool {
    name == "libc.so.6" || (name.starts_with("libc-2.") && name.ends_with(".so"))
}

/// The allocator that took `malloc` from glibc, if one of those tracer
/// knows is mapped and exports it.
fn other_allocator(pid: u32, globals: &Globals) -> Option<&'static str> {
    globals.modules().iter().find_map(|module| {
        let (_, name) = OTHER_ALLOCATORS
            .iter()
            .find(|(prefix, _)| module.name.starts_with(prefix))?;
        exports_malloc(pid, module).then_some(*name)
    })
}

fn exports_malloc(pid: u32, module: &Module) -> bool {
    let Ok(file) = crate::target_files::open_in_root(pid, std::path::Path::new(&module.path))
    else {
        return false;
    };
    // SAFETY: read-only, only parsed.
    let Ok(data) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return false;
    };
    let Ok(elf) = object::File::parse(&*data) else {
        return false;
    };
    elf.dynamic_symbols()
        .any(|symbol| symbol.is_definition() && symbol.name() == Ok("malloc"))
}

/// Whether `block` overlaps a traced block.
fn overlaps(traced: &Blocks, block: &Block) -> bool {
    let index = traced.first_ending_after(block.address);
    index < traced.len() && traced.get(index as u32).address < block.end()
}

/// `ranges` sorted, overlapping ones merged.
pub fn sorted(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.retain(|(start, end)| start < end);
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

#[cfg(test)]
mod tests;
