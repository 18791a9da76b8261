//! CPython's small objects in memory tracer has no blocks for: pymalloc
//! serves every object and buffer of 512 bytes or less from pools in its
//! own arenas (anonymous mappings), mapped before tracer attached or
//! never traced per object. Each pool begins with a header that gives its
//! block size, so the live blocks of every pool found are added to the
//! graph as untraced blocks: a chain to a root goes on through them (a
//! leaked buffer <- its `numpy.ndarray` <- a `dict` <- ...) instead of
//! ending at "untraced memory in anonymous mapping".
//!
//! 64-bit CPython 3.10-3.13 (Objects/obmalloc.c, 3.12+
//! Include/internal/pycore_obmalloc.h): pools of 16 KiB (4 KiB in a build
//! without the radix tree), aligned to their size, blocks of
//! (szidx + 1) * 16 bytes after a 48-byte header:
//! `{ref.count, freeblock, nextpool, prevpool, arenaindex, szidx,
//! nextoffset, maxnextoffset}`. A pool is taken as one only when its
//! header is consistent (the size class in range, `maxnextoffset` =
//! pool size - block size, `nextoffset` on a block boundary past the
//! first two blocks, the free list inside the carved blocks, the list
//! links to pools or to a module's `usedpools`), and when its free list,
//! walked, leaves exactly `ref.count` live blocks: random memory, and a
//! pool that changed while read, are left out (counted).
use crate::{
    holders::{
        blocks::{Block, Blocks, Origin},
        memory::{self, MapsLine},
        names::Globals,
        runtime_heaps::{ScanContext, UntracedObjects},
    },
    target_memory,
};

const PAGE_BYTES: u64 = 4096;
/// The pool sizes tried, largest first.
const POOL_BYTES: [u64; 2] = [16 << 10, 4 << 10];
/// sizeof(struct pool_header), rounded up to ALIGNMENT.
const POOL_OVERHEAD: u64 = 48;
const ALIGNMENT: u64 = 16;
/// SMALL_REQUEST_THRESHOLD (512) / ALIGNMENT.
const SIZE_CLASSES: u32 = 32;
/// More arenas than any process has (1 MiB each: 16 TiB).
const MAX_ARENA_INDEX: u32 = 1 << 24;

/// A pool's header, as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    /// `ref`: the count in the low half, padding (0) above.
    count_word: u64,
    freeblock: u64,
    nextpool: u64,
    prevpool: u64,
    arenaindex: u32,
    szidx: u32,
    nextoffset: u32,
    maxnextoffset: u32,
}

fn word(bytes: &[u8], offset: usize) -> u64 {
    u64::from_ne_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
}

fn half(bytes: &[u8], offset: usize) -> u32 {
    u32::from_ne_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

impl Header {
    fn parse(bytes: &[u8]) -> Option<Header> {
        (bytes.len() >= POOL_OVERHEAD as usize).then(|| Header {
            count_word: word(bytes, 0),
            freeblock: word(bytes, 8),
            nextpool: word(bytes, 16),
            prevpool: word(bytes, 24),
            arenaindex: half(bytes, 32),
            szidx: half(bytes, 36),
            nextoffset: half(bytes, 40),
            maxnextoffset: half(bytes, 44),
        })
    }

    fn count(&self) -> u64 {
        self.count_word
    }

    fn block_bytes(&self) -> u64 {
        (self.szidx as u64 + 1) * ALIGNMENT
    }

    /// Blocks handed out at least once (live or on the free list).
    fn carved(&self) -> u64 {
        (self.nextoffset as u64 - POOL_OVERHEAD) / self.block_bytes()
    }

    /// Whether this is the header of a used pool of `pool_bytes` at `pool`.
    fn is_used_pool(&self, pool: u64, pool_bytes: u64, globals: &Globals) -> bool {
        if self.szidx >= SIZE_CLASSES || self.arenaindex >= MAX_ARENA_INDEX {
            return false;
        }
        let size = self.block_bytes();
        let next = self.nextoffset as u64;
        if self.maxnextoffset as u64 != pool_bytes - size
            || next < POOL_OVERHEAD + 2 * size
            || next > pool_bytes
            || !(next - POOL_OVERHEAD).is_multiple_of(size)
        {
            return false;
        }
        if self.count_word == 0 || self.count_word > self.carved() {
            return false;
        }
        if self.freeblock != 0 && !self.is_carved_block(pool, self.freeblock) {
            return false;
        }
        // Another pool, or the list's head in `usedpools` (a module's data).
        let link = |address: u64| {
            address != pool
                && address.is_multiple_of(8)
                && (address.is_multiple_of(pool_bytes) || globals.module_name(address).is_some())
        };
        link(self.nextpool) && link(self.prevpool)
    }

    fn is_carved_block(&self, pool: u64, address: u64) -> bool {
        let first = pool + POOL_OVERHEAD;
        address >= first
            && address < pool + self.nextoffset as u64
            && (address - first).is_multiple_of(self.block_bytes())
    }
}

/// Finds pymalloc's pools in the anonymous mappings of the scan's
/// regions outside `traced` blocks and the `skip` ranges (sorted: a
/// parsed heap) and returns their live blocks, whole pools up to `limit`
/// blocks.
pub fn find(
    scan: &ScanContext<'_>,
    traced: &Blocks,
    skip: &[(u64, u64)],
    limit: usize,
) -> UntracedObjects {
    let ScanContext {
        pid,
        regions,
        globals,
    } = *scan;
    let mut found = UntracedObjects::default();
    let pools = find_pools(pid, regions, traced, skip, globals, &mut found);
    let mut buffer = vec![0u8; POOL_BYTES[0] as usize];
    for (pool, pool_bytes, header) in pools {
        if found.blocks.len() + header.count() as usize > limit {
            found.objects_left_out += header.count();
            continue;
        }
        let bytes = &mut buffer[..pool_bytes as usize];
        let read = target_memory::read(pid, pool, bytes);
        found.bytes_read += read as u64;
        if read < pool_bytes as usize {
            found.pools_rejected += 1;
            continue;
        }
        match live_blocks(pool, bytes, globals, pool_bytes) {
            Some(live) if found.blocks.len() + live.len() > limit => {
                found.objects_left_out += live.len() as u64;
            }
            Some(live) => {
                found.pools += 1;
                found.ranges.push((pool, pool + pool_bytes));
                for address in live {
                    let block =
                        Block::untraced(address, header.block_bytes(), Origin::PymallocObject);
                    if !overlaps(traced, &block) {
                        found.blocks.push(block);
                    }
                }
            }
            None => found.pools_rejected += 1,
        }
    }
    found
}

/// Whether `block` overlaps a traced block.
fn overlaps(traced: &Blocks, block: &Block) -> bool {
    let index = traced.first_ending_after(block.address);
    index < traced.len() && traced.get(index as u32).address < block.end()
}

/// The used pools: every page of the anonymous mappings outside traced
/// blocks, its first 48 bytes read (IOVECS pages a system call) and
/// checked as a header, in address order.
fn find_pools(
    pid: u32,
    regions: &[MapsLine],
    traced: &Blocks,
    skip: &[(u64, u64)],
    globals: &Globals,
    found: &mut UntracedObjects,
) -> Vec<(u64, u64, Header)> {
    let slot = POOL_OVERHEAD as usize;
    let mut pools = Vec::new();
    let mut pages: Vec<(u64, usize)> = Vec::with_capacity(target_memory::IOVECS);
    let mut buffer = vec![0u8; target_memory::IOVECS * slot];
    let mut lengths = Vec::new();
    let mut pool_end = 0;
    let mut check = |pages: &mut Vec<(u64, usize)>,
                     pool_end: &mut u64,
                     found: &mut UntracedObjects| {
        target_memory::read_pieces(pid, pages, slot, &mut buffer, &mut lengths);
        for (index, &(page, _)) in pages.iter().enumerate() {
            found.bytes_read += lengths[index] as u64;
            if page < *pool_end {
                continue;
            }
            let Some(header) = Header::parse(&buffer[index * slot..index * slot + lengths[index]])
            else {
                continue;
            };
            if let Some(&pool_bytes) = POOL_BYTES.iter().find(|&&pool_bytes| {
                page.is_multiple_of(pool_bytes) && header.is_used_pool(page, pool_bytes, globals)
            }) {
                pools.push((page, pool_bytes, header));
                *pool_end = page + pool_bytes;
            }
        }
        pages.clear();
    };
    let populated = memory::Populated::open(pid);
    for region in regions.iter().filter(|region| {
        region.scanned() && region.name.is_empty() && globals.module_name(region.start).is_none()
    }) {
        // Only pages that hold data can start a pool.
        let resident = memory::Resident::of(&populated, region);
        let mut page = region.start.next_multiple_of(PAGE_BYTES);
        while page + POOL_OVERHEAD <= region.end {
            let Some(at) = resident.next_page(page) else {
                break;
            };
            if at != page {
                page = at;
                continue;
            }
            // Past the traced blocks and skipped ranges that cover this
            // page.
            let index = traced.first_ending_after(page);
            if index < traced.len() && traced.get(index as u32).address <= page {
                page = traced.get(index as u32).end().next_multiple_of(PAGE_BYTES);
                continue;
            }
            let index = skip.partition_point(|&(_, end)| end <= page);
            if let Some(&(start, end)) = skip.get(index)
                && start <= page
            {
                page = end.next_multiple_of(PAGE_BYTES);
                continue;
            }
            pages.push((page, slot));
            if pages.len() == target_memory::IOVECS {
                check(&mut pages, &mut pool_end, found);
            }
            page += PAGE_BYTES;
        }
    }
    if !pages.is_empty() {
        check(&mut pages, &mut pool_end, found);
    }
    pools
}

/// The live blocks of the pool at `pool` whose `pool_bytes` are `bytes`:
/// the carved ones not on its free list; None unless its header is still
/// a used pool's and the free list leaves exactly `ref.count` blocks.
fn live_blocks(pool: u64, bytes: &[u8], globals: &Globals, pool_bytes: u64) -> Option<Vec<u64>> {
    let header = Header::parse(bytes)?;
    if !header.is_used_pool(pool, pool_bytes, globals) {
        return None;
    }
    let carved = header.carved() as usize;
    let mut free = vec![false; carved];
    let mut free_count = 0;
    let mut next = header.freeblock;
    while next != 0 {
        if !header.is_carved_block(pool, next) {
            return None;
        }
        let index = ((next - pool - POOL_OVERHEAD) / header.block_bytes()) as usize;
        if free[index] {
            return None;
        }
        free[index] = true;
        free_count += 1;
        next = word(bytes, (next - pool) as usize);
    }
    if (carved - free_count) as u64 != header.count() {
        return None;
    }
    Some(
        (0..carved)
            .filter(|&index| !free[index])
            .map(|index| pool + POOL_OVERHEAD + index as u64 * header.block_bytes())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: u64 = 0x7f00_0000_4000;

    /// A 16 KiB pool of 64-byte blocks: 5 carved, blocks 1 and 3 free.
    fn pool() -> Vec<u8> {
        let mut bytes = vec![0u8; 16 << 10];
        let size = 64u64;
        let block = |index: u64| POOL + POOL_OVERHEAD + index * size;
        let mut put = |offset: usize, value: u64| {
            bytes[offset..offset + 8].copy_from_slice(&value.to_ne_bytes())
        };
        put(0, 3);
        put(8, block(3));
        put(16, POOL + (16 << 10));
        put(24, POOL - (16 << 10));
        put((block(3) - POOL) as usize, block(1));
        put((block(1) - POOL) as usize, 0);
        let halves = [7u32, 3, (POOL_OVERHEAD + 5 * size) as u32, (16 << 10) - 64];
        for (index, value) in halves.into_iter().enumerate() {
            bytes[32 + 4 * index..36 + 4 * index].copy_from_slice(&value.to_ne_bytes());
        }
        bytes
    }

    #[test]
    fn finds_the_live_blocks_of_a_pool_from_its_header_and_free_list() {
        let globals = Globals::default();
        let bytes = pool();
        let live = live_blocks(POOL, &bytes, &globals, 16 << 10).expect("a pool");
        let block = |index: u64| POOL + POOL_OVERHEAD + index * 64;
        assert_eq!(live, [block(0), block(2), block(4)]);
        assert!(
            live_blocks(POOL, &bytes, &globals, 4 << 10).is_none(),
            "maxnextoffset is a 16 KiB pool's"
        );
    }

    #[test]
    fn a_header_that_disagrees_is_no_pool() {
        let globals = Globals::default();
        assert!(
            live_blocks(POOL, &pool(), &globals, 16 << 10).is_some(),
            "the pool before its damage"
        );
        // (what is wrong, the byte written, its value)
        let damages: [(&str, usize, u8); 4] = [
            ("the count disagrees with the free list", 0, 4),
            ("szidx", 36, 32),
            ("nextpool", 16, 8),
            ("freeblock", 8, pool()[8] + 8),
        ];
        for (what, offset, value) in damages {
            let mut bytes = pool();
            bytes[offset] = value;
            assert!(
                live_blocks(POOL, &bytes, &globals, 16 << 10).is_none(),
                "{what}"
            );
        }
        assert!(
            live_blocks(POOL, &[0u8; 16 << 10], &globals, 16 << 10).is_none(),
            "zeroes"
        );
    }
}
