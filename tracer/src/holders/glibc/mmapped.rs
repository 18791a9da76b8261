//! The chunks glibc's malloc maps on its own (a block above the mmap
//! threshold, 128 KiB to 32 MiB): each is a mapping of its own (or merged
//! with its anonymous neighbours in /proc/PID/maps) whose first page starts
//! with the chunk's header, `prev_size` 0 and the size, a multiple of the
//! page, with IS_MMAPPED alone among its flags. The first 16 bytes of
//! every page of the anonymous mappings outside the known blocks and
//! heaps are read (IOVECS pages a system call) and a page whose header
//! says so, with the chunk inside its mapping, starts a chunk.
use super::{
    super::{
        blocks::Blocks,
        memory::{self, MapsLine},
        names::Globals,
    },
    layout::{CHUNK_HEADER_BYTES, FLAGS, IS_MMAPPED},
};
use crate::target_memory;

const PAGE_BYTES: u64 = 4096;

/// What the probe found: (chunk address, chunk size) of each chunk no
/// known block is in, and what it read.
#[derive(Default)]
pub struct Mapped {
    pub chunks: Vec<(u64, u64)>,
    /// Chunks of traced blocks (the block at the chunk's user memory).
    pub traced_chunks: Vec<(u64, u64)>,
    pub bytes_read: u64,
}

/// Whether the header words (`prev_size`, `size`) of a page start an
/// mmapped chunk that fits in the `room` bytes left of its mapping.
fn is_mmapped_header(prev_size: u64, size_field: u64, room: u64) -> bool {
    let size = size_field & !FLAGS;
    prev_size == 0
        && size_field & FLAGS == IS_MMAPPED
        && size >= PAGE_BYTES
        && size.is_multiple_of(PAGE_BYTES)
        && size <= room
}

/// The mmapped chunks in the anonymous mappings of `regions`, outside
/// `known` blocks and the `skip` ranges (sorted: the arenas' heaps).
pub fn find(
    pid: u32,
    regions: &[MapsLine],
    known: &Blocks,
    skip: &[(u64, u64)],
    globals: &Globals,
) -> Mapped {
    let mut found = Mapped::default();
    let slot = CHUNK_HEADER_BYTES as usize;
    let mut buffer = vec![0u8; target_memory::IOVECS * slot];
    let mut lengths = Vec::new();
    let populated = memory::Populated::open(pid);
    for region in regions.iter().filter(|region| {
        region.scanned() && region.name.is_empty() && globals.module_name(region.start).is_none()
    }) {
        // Only pages that hold data can hold a header.
        let resident = memory::Resident::of(&populated, region);
        let mut page = region.start.next_multiple_of(PAGE_BYTES);
        let mut pages: Vec<(u64, usize)> = Vec::with_capacity(target_memory::IOVECS);
        while page < region.end {
            // Gather the next pages to read, past known blocks and heaps.
            pages.clear();
            let mut next = page;
            while next < region.end && pages.len() < target_memory::IOVECS {
                if let Some(end) = covered_until(next, known, skip) {
                    next = end.next_multiple_of(PAGE_BYTES);
                    continue;
                }
                let Some(at) = resident.next_page(next) else {
                    break;
                };
                if at != next {
                    next = at;
                    continue;
                }
                pages.push((next, slot));
                next += PAGE_BYTES;
            }
            if pages.is_empty() {
                break;
            }
            target_memory::read_pieces(pid, &pages, slot, &mut buffer, &mut lengths);
            let mut resume = next;
            for (index, &(at, _)) in pages.iter().enumerate() {
                found.bytes_read += lengths[index] as u64;
                if lengths[index] < slot {
                    continue;
                }
                let header = &buffer[index * slot..(index + 1) * slot];
                let word = |offset: usize| {
                    u64::from_ne_bytes(header[offset..offset + 8].try_into().expect("8 bytes"))
                };
                if !is_mmapped_header(word(0), word(8), region.end - at) {
                    continue;
                }
                let size = word(8) & !FLAGS;
                let user = at + CHUNK_HEADER_BYTES;
                // A known block in it: the traced block of this chunk, or
                // this was no header.
                let first = known.first_ending_after(at);
                if first < known.len() && known.get(first as u32).address < at + size {
                    if known.get(first as u32).address == user {
                        found.traced_chunks.push((at, size));
                    } else {
                        continue;
                    }
                } else {
                    found.chunks.push((at, size));
                }
                // Go on after the chunk: the pages read inside it are not
                // headers.
                resume = at + size;
                break;
            }
            page = resume.max(page + PAGE_BYTES);
        }
    }
    found
}

/// Where the known block or skipped range covering `address` ends.
fn covered_until(address: u64, known: &Blocks, skip: &[(u64, u64)]) -> Option<u64> {
    let index = known.first_ending_after(address);
    if index < known.len() && known.get(index as u32).address <= address {
        return Some(known.get(index as u32).end());
    }
    let index = skip.partition_point(|&(_, end)| end <= address);
    skip.get(index)
        .filter(|&&(start, _)| start <= address)
        .map(|&(_, end)| end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_is_prev_size_zero_and_a_page_multiple_marked_mmapped() {
        assert!(is_mmapped_header(0, 0x21000 | IS_MMAPPED, 0x21000));
        assert!(
            !is_mmapped_header(0, 0x21000 | IS_MMAPPED, 0x20000),
            "past its mapping"
        );
        assert!(
            !is_mmapped_header(0, 0x21000 | IS_MMAPPED | 1, 0x21000),
            "PREV_INUSE"
        );
        assert!(
            !is_mmapped_header(0, 0x21010 | IS_MMAPPED, 0x22000),
            "not pages"
        );
        assert!(!is_mmapped_header(16, 0x21000 | IS_MMAPPED, 0x21000));
        assert!(!is_mmapped_header(0, 0, 0x21000), "zeroes");
        assert!(!is_mmapped_header(0, IS_MMAPPED, 0x21000), "empty");
    }
}
