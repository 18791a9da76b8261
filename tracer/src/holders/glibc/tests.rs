//! The heap walk on the test process and a forked child of it (glibc's
//! malloc: the library's tests do not link tracer's own allocator):
//! main_arena found by shape where the debug symbols put it; blocks the
//! child keeps found in use with their sizes, blocks it freed (tcache,
//! fastbins, bins) not, its large block an mmapped chunk.
use std::collections::HashSet;

use super::*;
use crate::holders::memory;

#[test]
fn main_arena_is_found_by_shape_where_its_symbol_is() {
    // On a forked child, waiting: the test process's own arenas are in
    // use by the other tests' threads while they are read (a lock held,
    // bins filling), which a target's are not while it waits.
    let (child, report) = fork_child(|report| {
        let kept: Vec<Box<[u8; 64]>> = (0..16).map(|_| Box::new([1u8; 64])).collect();
        std::hint::black_box(&kept);
        // SAFETY: one byte from a live buffer; the child then only waits.
        unsafe {
            libc::write(report, [1u8].as_ptr().cast(), 1);
            loop {
                libc::pause();
            }
        }
    });
    let mut byte = [0u8; 1];
    // SAFETY: reads one byte into a live buffer.
    assert_eq!(
        unsafe { libc::read(report, byte.as_mut_ptr().cast(), 1) },
        1
    );
    let pid = child.0 as u32;
    let regions = memory::regions(pid).unwrap();
    let globals = Globals::load(pid, &regions);
    let libc = globals
        .modules()
        .iter()
        .find(|module| is_glibc(&module.name))
        .expect("the tests run on glibc");
    let located = layout::locate(pid, libc, &regions).expect("main_arena");
    let by_shape = layout::by_shape(pid, libc, &regions);
    assert_eq!(by_shape, [located.main_arena], "{located:?}");
    // Debian's libc6-dbg, where installed, names it: the same place.
    if located.found_by == "debug symbols" {
        assert!(located.tcache_key_address.is_some());
    }
}

/// Forks a child that runs `child` with the write end of a pipe; returns
/// the child (killed and reaped when dropped) and the read end.
fn fork_child(child: fn(libc::c_int) -> !) -> (Kill, libc::c_int) {
    let mut pipe = [0; 2];
    // SAFETY: a pipe, then a fork whose child runs `child` only.
    let pid = unsafe {
        assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0);
        libc::fork()
    };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        child(pipe[1]);
    }
    (Kill(pid), pipe[0])
}

/// Kills and reaps a forked child of the test when dropped.
struct Kill(i32);

impl Drop for Kill {
    fn drop(&mut self) {
        // SAFETY: our own child, killed and reaped.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

/// Blocks a forked child of the test keeps and frees, by size: the small
/// ones freed last (the tcache, then the fastbins: a larger malloc after
/// them would merge the fastbins' chunks away), larger ones into the bins.
const SIZES: [usize; 4] = [5000, 2000, 100, 24];
const PER_SIZE: usize = 40;
/// Above glibc's largest mmap threshold (32 MiB; it rises from 128 KiB
/// with each mmapped chunk freed, as the test process's other tests do).
const BIG_BYTES: usize = 1 << 26;

/// What the child reports: its big block, then (address, size, kept)
/// per block, as words on a pipe.
fn heap_of_a_child(report: libc::c_int) -> ! {
    // Everything the child keeps is allocated before the blocks, so that
    // nothing reallocates between the frees and the scan.
    let mut kept: Vec<Vec<u8>> = Vec::with_capacity(SIZES.len() * PER_SIZE);
    let mut words: Vec<u64> = Vec::with_capacity(1 + 3 * SIZES.len() * PER_SIZE);
    let big = vec![9u8; BIG_BYTES];
    words.push(big.as_ptr() as u64);
    for size in SIZES {
        let mut blocks: Vec<Vec<u8>> = Vec::with_capacity(PER_SIZE);
        blocks.extend((0..PER_SIZE).map(|_| vec![7u8; size]));
        // Every other block freed: no two free neighbours merge.
        for (index, block) in blocks.drain(..).enumerate() {
            words.extend([block.as_ptr() as u64, size as u64, (index % 2 == 0) as u64]);
            if index % 2 == 0 {
                kept.push(block);
            } else {
                drop(block);
            }
        }
    }
    let bytes = words.len() * 8;
    // SAFETY: the words are plain memory of `bytes` bytes; the child only
    // waits after this, and exits without unwinding.
    unsafe {
        libc::write(report, words.as_ptr().cast(), bytes);
        loop {
            libc::pause();
        }
    }
}

#[test]
fn kept_blocks_are_chunks_in_use_and_freed_ones_are_not() {
    let (child, report) = fork_child(heap_of_a_child);
    let mut words = vec![0u64; 1 + 3 * SIZES.len() * PER_SIZE];
    let mut read = 0;
    while read < words.len() * 8 {
        // SAFETY: reads into the words' own bytes, past those read.
        let got = unsafe {
            libc::read(
                report,
                words.as_mut_ptr().cast::<u8>().add(read).cast(),
                words.len() * 8 - read,
            )
        };
        assert!(got > 0, "the child's report");
        read += got as usize;
    }
    let pid = child.0 as u32;
    let regions = memory::regions(pid).unwrap();
    let globals = Globals::load(pid, &regions);
    let heap = find(
        pid,
        &regions,
        &Blocks::new(Vec::new()),
        &globals,
        usize::MAX,
    );
    assert_eq!(heap.parse.not_parsed, None, "{:?}", heap.parse);
    let found = Blocks::new(heap.blocks.clone());
    let block_at = |address: u64| {
        found
            .find(address)
            .map(|hit| found.get(hit.block))
            .filter(|block| block.address == address)
    };
    // A freed block's memory may be handed out again to a later one.
    let kept_addresses: HashSet<u64> = words[1..]
        .chunks(3)
        .filter(|block| block[2] == 1)
        .map(|block| block[0])
        .collect();
    for block in words[1..].chunks(3) {
        let (address, size, kept) = (block[0], block[1], block[2] == 1);
        let chunk = block_at(address);
        if !kept && kept_addresses.contains(&address) {
            continue;
        }
        if !kept {
            assert_eq!(
                chunk, None,
                "freed {size} B at {address:#x}: {:?}",
                heap.parse
            );
            assert!(
                heap.parsed
                    .iter()
                    .any(|&(start, end)| (start..end).contains(&address)),
                "freed {address:#x} outside the parsed ranges"
            );
            continue;
        }
        let chunk =
            chunk.unwrap_or_else(|| panic!("kept {size} B at {address:#x}: {:?}", heap.parse));
        assert_eq!(chunk.origin(), Some(Origin::HeapChunk));
        assert!(
            chunk.size >= size && chunk.size < size + 32,
            "{size} bytes in a chunk of {}",
            chunk.size
        );
    }
    let big = block_at(words[0]).expect("the big block's mmapped chunk");
    assert_eq!(big.origin(), Some(Origin::MmappedChunk));
    assert!(big.size >= BIG_BYTES as u64);
    // 20 freed of each small size: 7 to the tcache, the rest to a
    // fastbin; the larger ones into the bins.
    assert!(heap.parse.tcache_chunks >= 14, "{:?}", heap.parse);
    assert!(heap.parse.fastbin_chunks >= 20, "{:?}", heap.parse);
    assert!(heap.parse.free_chunks >= 20, "{:?}", heap.parse);
    assert_eq!(heap.parse.tcaches_unreadable, 0, "{:?}", heap.parse);
}

#[test]
fn ranges_are_merged() {
    assert_eq!(
        sorted(vec![(5, 9), (1, 3), (3, 4), (8, 12), (20, 20)]),
        [(1, 4), (5, 12)]
    );
}
