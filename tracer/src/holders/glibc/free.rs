//! The free chunks a heap walk cannot tell from used ones: those in a
//! thread's tcache and in an arena's fastbins (`free` leaves the next
//! chunk's PREV_INUSE bit set for them). A tcache is a 0x290-byte chunk
//! (or 0x2a0: a free chunk 16 bytes larger, handed out whole; 64 counts,
//! 64 list heads) taken as one only when every list, walked
//! (links unmangled from 2.32), holds exactly its count of chunks of its
//! bin's size, each marked with one key (the tcache's own address before
//! 2.34, a random `tcache_key` from 2.34), and ends there; a fastbin's
//! list is walked while its chunks have the bin's size. A tcache that
//! changed while read is read again (three tries), then counted as
//! unreadable: its chunks stay "in use".
use std::collections::HashSet;

use super::{
    layout::{
        self, ALIGNMENT, CHUNK_HEADER_BYTES, FASTBINS, FLAGS, Glibc, MIN_CHUNK_BYTES,
        STATE_FASTBINS, TCACHE_BINS, TCACHE_BYTES, TCACHE_CHUNK_BYTES,
    },
    walk::Arena,
};
use crate::target_memory::TargetMemory;

/// The longest list walked (tcache counts are 16-bit; a fastbin could be
/// longer, its rest stays "in use").
const MAX_LIST: usize = 1 << 20;
/// Most tcache entries read by one scan, over every tcache and try: a
/// target with many 640-byte blocks of looping lists cannot make the read
/// long (past it, tcaches count as unreadable).
pub const MAX_TCACHE_STEPS: usize = 1 << 22;
const TRIES: usize = 3;

/// The chunks found free, and the tcaches themselves (allocator data).
#[derive(Default)]
pub struct Free {
    /// Chunk addresses.
    pub chunks: HashSet<u64>,
    pub tcaches: Vec<u64>,
    pub tcache_chunks: u64,
    pub fastbin_chunks: u64,
    pub tcaches_unreadable: u64,
}

/// The size of the in-use-looking chunk at `chunk`, from the walk.
fn size_of(in_use: &[(u64, u64)], chunk: u64) -> Option<u64> {
    in_use
        .binary_search_by_key(&chunk, |&(address, _)| address)
        .ok()
        .map(|index| in_use[index].1)
}

fn unmangle(glibc: &Glibc, link_address: u64, stored: u64) -> u64 {
    if glibc.safe_linking {
        (link_address >> 12) ^ stored
    } else {
        stored
    }
}

/// The tcache and fastbin chunks among `in_use` (sorted by address); an
/// empty tcache is taken as one only as the first chunk of a heap (where
/// a thread's first malloc puts it), any other zeroed 640-byte block is
/// left in use.
pub fn find(
    memory: &impl TargetMemory,
    glibc: &Glibc,
    arenas: &[Arena],
    in_use: &[(u64, u64)],
) -> Free {
    let firsts: HashSet<u64> = arenas
        .iter()
        .flat_map(|arena| arena.heaps.iter().map(|heap| heap.first))
        .collect();
    let mut free = Free::default();
    let mut key = glibc
        .tcache_key_address
        .and_then(|address| memory.read_u64(address));
    let mut budget = MAX_TCACHE_STEPS;
    for &(chunk, size) in in_use {
        // malloc hands out a free chunk whole when what is left would be
        // under a chunk's minimum (32 bytes): a tcache made from one is one
        // alignment unit larger (a thread's, made where an earlier
        // thread's was freed).
        if size != TCACHE_CHUNK_BYTES && size != TCACHE_CHUNK_BYTES + ALIGNMENT {
            continue;
        }
        let tcache = chunk + CHUNK_HEADER_BYTES;
        let mut found = None;
        let mut disagreed = false;
        for _ in 0..TRIES {
            match read_tcache(memory, glibc, tcache, in_use, &mut key, &mut budget) {
                Read::Tcache(chunks) if chunks.is_empty() && !firsts.contains(&chunk) => break,
                Read::Tcache(chunks) => {
                    found = Some(chunks);
                    break;
                }
                Read::Changed => disagreed = true,
                Read::NotOne => break,
            }
        }
        match found {
            Some(chunks) => {
                free.tcaches.push(chunk);
                free.tcache_chunks += chunks.len() as u64;
                free.chunks.extend(chunks);
            }
            None if disagreed => free.tcaches_unreadable += 1,
            None => {}
        }
    }
    for arena in arenas {
        for bin in 0..FASTBINS {
            let mut chunk = layout::word(&arena.state, STATE_FASTBINS + 8 * bin as u64);
            let bin_size = (bin as u64 + 2) * 16;
            let mut walked = 0;
            while chunk != 0 && walked < MAX_LIST {
                if size_of(in_use, chunk) != Some(bin_size) || !free.chunks.insert(chunk) {
                    break;
                }
                free.fastbin_chunks += 1;
                walked += 1;
                let mut link = [0u8; 8];
                let fd = chunk + CHUNK_HEADER_BYTES;
                if memory.read(fd, &mut link) < 8 {
                    break;
                }
                chunk = unmangle(glibc, fd, u64::from_ne_bytes(link));
            }
        }
    }
    free
}

enum Read {
    /// A tcache: the chunks on its lists.
    Tcache(Vec<u64>),
    /// Lists that disagreed with their counts: maybe one that changed.
    Changed,
    /// Not a tcache at all.
    NotOne,
}

/// Reads the tcache that may be at `tcache` (its user memory), each entry
/// once, spending `budget`.
fn read_tcache(
    memory: &impl TargetMemory,
    glibc: &Glibc,
    tcache: u64,
    in_use: &[(u64, u64)],
    key: &mut Option<u64>,
    budget: &mut usize,
) -> Read {
    let mut bytes = [0u8; TCACHE_BYTES];
    if memory.read(tcache, &mut bytes) < TCACHE_BYTES {
        return Read::NotOne;
    }
    let count = |bin: usize| u16::from_ne_bytes([bytes[2 * bin], bytes[2 * bin + 1]]) as usize;
    let head = |bin: usize| layout::word(&bytes, (2 * TCACHE_BINS + 8 * bin) as u64);
    // A tcache's heads and counts go together; an array that breaks this
    // is some other 640-byte block.
    if (0..TCACHE_BINS).any(|bin| (count(bin) == 0) != (head(bin) == 0)) {
        return Read::NotOne;
    }
    // The counts are the target's word: room grows with what is read.
    let mut chunks = Vec::new();
    let mut seen = HashSet::new();
    for bin in 0..TCACHE_BINS {
        let bin_size = MIN_CHUNK_BYTES + 16 * bin as u64;
        let mut entry = head(bin);
        for _ in 0..count(bin) {
            if *budget == 0 {
                return Read::Changed;
            }
            *budget -= 1;
            let chunk = entry.wrapping_sub(CHUNK_HEADER_BYTES);
            if !seen.insert(chunk) {
                // A list that loops: no tcache's.
                return Read::Changed;
            }
            if size_of(in_use, chunk).map(|size| size & !FLAGS) != Some(bin_size) {
                return if chunks.is_empty() && bin_is_first(&bytes, bin) {
                    Read::NotOne
                } else {
                    Read::Changed
                };
            }
            let mut link = [0u8; 16];
            if memory.read(entry, &mut link) < 16 {
                return Read::Changed;
            }
            let entry_key = layout::word(&link, 8);
            let expected = if glibc.version >= (2, 34) {
                *key.get_or_insert(entry_key)
            } else {
                tcache
            };
            if entry_key != expected {
                return Read::Changed;
            }
            chunks.push(chunk);
            entry = unmangle(glibc, entry, layout::word(&link, 0));
        }
        if entry != 0 {
            return Read::Changed;
        }
    }
    Read::Tcache(chunks)
}

/// Whether `bin` is the first bin with a list (a wrong first entry means
/// the array was never a tcache, not that one changed).
fn bin_is_first(bytes: &[u8], bin: usize) -> bool {
    (0..bin).all(|earlier| bytes[2 * earlier] == 0 && bytes[2 * earlier + 1] == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target_memory::Process;

    /// glibc 2.36's layout (safe linking, tcache keys), main_arena unknown.
    fn glibc_2_36() -> Glibc {
        Glibc {
            version: (2, 36),
            heap_info_bytes: 48,
            safe_linking: true,
            main_arena: 0,
            found_by: "test",
            tcache_key_address: None,
        }
    }

    #[test]
    fn links_are_unmangled_from_2_32() {
        let mut glibc = glibc_2_36();
        let link = 0x5555_5555_a2c0u64;
        let pointer = 0x5555_5555_a300u64;
        assert_eq!(unmangle(&glibc, link, (link >> 12) ^ pointer), pointer);
        glibc.safe_linking = false;
        assert_eq!(unmangle(&glibc, link, pointer), pointer);
        assert_eq!(size_of(&[(0x10, 0x20), (0x30, 0x290)], 0x30), Some(0x290));
        assert_eq!(size_of(&[(0x10, 0x20)], 0x20), None);
    }

    /// A tcache in a 0x2a0-byte chunk (a free chunk 16 bytes larger than
    /// asked, handed out whole), holding one 32-byte chunk, in this
    /// process's own memory: found, and its chunk free.
    #[test]
    fn a_tcache_in_a_chunk_16_bytes_larger_is_found() {
        let glibc = glibc_2_36();
        // Words, so 16-byte alignment is one word off at most.
        let mut words = vec![0u64; (0x2a0 + 0x40) / 8 + 2];
        let aligned = (words.as_ptr() as u64).next_multiple_of(16);
        let skip = ((aligned - words.as_ptr() as u64) / 8) as usize;
        let heap = &mut words[skip..];
        let tcache_chunk = aligned;
        let entry_chunk = aligned + 0x2a0;
        let entry = entry_chunk + CHUNK_HEADER_BYTES;
        heap[1] = 0x2a1;
        // counts[0] = 1 (the first of 64 u16s), entries[0] = entry.
        heap[2] = 1;
        heap[2 + 2 * TCACHE_BINS / 8] = entry;
        heap[0x2a0 / 8 + 1] = 0x21;
        heap[0x2b0 / 8] = entry >> 12; // the list's end, mangled
        heap[0x2b0 / 8 + 1] = 0x1234_5678_9abc_def0; // the key
        let in_use = [(tcache_chunk, 0x2a0), (entry_chunk, 0x20)];
        let free = find(&Process(std::process::id()), &glibc, &[], &in_use);
        assert_eq!(free.tcaches, [tcache_chunk]);
        assert_eq!(free.chunks, HashSet::from([entry_chunk]));
        assert_eq!(free.tcache_chunks, 1);
        std::hint::black_box(&words);
    }
}
