//! The chunks of glibc's arenas, read from outside: the main arena's heap
//! (the program break, `[heap]`) and each thread arena's heaps (64 MiB
//! aligned mappings that start with a `heap_info`, listed from the arena's
//! top chunk back through `prev`), each walked from its first chunk by the
//! chunks' own sizes. A chunk is free when the next one's PREV_INUSE bit
//! is clear (the bins and the top chunk); the walk cannot tell a chunk in
//! a tcache or a fastbin from one in use (`free` leaves that bit set for
//! them), `free.rs` does. Read in windows of 1 MiB while the target runs:
//! a header that makes no sense (a chunk being split or merged right now)
//! ends the walk there, and it goes on from the next traced block's chunk,
//! the range between left unparsed (counted).
//!
//! Bounded whatever the target wrote: each arena and each heap is walked
//! once (a `next` or `prev` that points back ends that list), a heap's
//! `prev` must be aligned as glibc aligns heaps (so no two heaps overlap),
//! and all the walks together take at most MAX_CHUNK_STEPS chunk headers.
use std::collections::HashSet;

use super::{
    super::blocks::Blocks,
    layout::{
        self, ALIGNMENT, CHUNK_HEADER_BYTES, FLAGS, Glibc, HEAP_MAX_BYTES, IS_MMAPPED,
        MIN_CHUNK_BYTES, NON_MAIN_ARENA, PREV_INUSE, STATE_BYTES, STATE_NEXT, STATE_TOP, word,
    },
};
use crate::target_memory::TargetMemory;

/// Bytes read at once.
const WINDOW_BYTES: usize = 1 << 20;
/// More arenas and heaps than a process has (glibc caps arenas at 8 per
/// core).
const MAX_ARENAS: usize = 4096;
const MAX_HEAPS: usize = 1 << 16;
/// Most chunk headers read by all the walks of one scan: 16 Mi, a heap
/// of 512 MiB of the smallest chunks (the rest is left unparsed,
/// counted), and at most 256 MiB of chunk entries.
pub const MAX_CHUNK_STEPS: u64 = 1 << 24;

/// One arena: its state as read, and its heaps.
pub struct Arena {
    pub state: Vec<u8>,
    pub heaps: Vec<Heap>,
}

/// A range of chunks: from `first` to `end`, the top chunk in it if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heap {
    /// Where its mapping (or `heap_info`) starts, and its first chunk.
    pub start: u64,
    pub first: u64,
    pub end: u64,
    pub top: Option<u64>,
    pub main: bool,
}

/// The arenas of a process: the main one (its heap: `[heap]`, where its
/// top chunk lies) and the thread arenas on its `next` list.
pub fn arenas(
    memory: &impl TargetMemory,
    glibc: &Glibc,
    brk_heap: Option<(u64, u64)>,
) -> Result<Vec<Arena>, String> {
    let main = layout::read_state(memory, glibc.main_arena)
        .filter(|state| layout::is_arena(state, glibc.main_arena))
        .ok_or("main_arena could not be read as an arena")?;
    let top = word(&main, STATE_TOP);
    let mut heaps = Vec::new();
    if let Some((start, end)) = brk_heap.filter(|(start, end)| (*start..*end).contains(&top)) {
        heaps.push(Heap {
            start,
            first: start,
            end,
            top: Some(top),
            main: true,
        });
    }
    let mut next = word(&main, STATE_NEXT);
    let mut arenas = vec![Arena { state: main, heaps }];
    let mut seen_arenas = HashSet::from([glibc.main_arena]);
    let mut seen_heaps = HashSet::new();
    while arenas.len() < MAX_ARENAS && seen_arenas.insert(next) {
        let address = next;
        let state = layout::read_state(memory, address)
            .filter(|state| layout::is_arena(state, address))
            .ok_or_else(|| format!("thread arena {address:#x} could not be read as an arena"))?;
        next = word(&state, STATE_NEXT);
        let heaps = thread_heaps(
            memory,
            glibc,
            address,
            word(&state, STATE_TOP),
            &mut seen_heaps,
        );
        arenas.push(Arena { state, heaps });
    }
    Ok(arenas)
}

/// A thread arena's heaps: the one its top chunk is in, then back through
/// each `heap_info`'s `prev`, each heap once (`seen`: of every arena).
fn thread_heaps(
    memory: &impl TargetMemory,
    glibc: &Glibc,
    arena: u64,
    top: u64,
    seen: &mut HashSet<u64>,
) -> Vec<Heap> {
    let mut heaps = Vec::new();
    let mut start = top & !(HEAP_MAX_BYTES - 1);
    while start != 0
        && start.is_multiple_of(HEAP_MAX_BYTES)
        && heaps.len() < MAX_HEAPS
        && seen.insert(start)
    {
        // heap_info: ar_ptr, prev, size, ...
        let mut info = [0u8; 24];
        if !memory.read_exact(start, &mut info) || word(&info, 0) != arena {
            break;
        }
        let size = word(&info, 16);
        if size > HEAP_MAX_BYTES {
            break;
        }
        let after_info = start + glibc.heap_info_bytes;
        let first = if after_info == arena {
            align_chunk(arena + STATE_BYTES)
        } else {
            after_info
        };
        heaps.push(Heap {
            start,
            first,
            end: start.saturating_add(size),
            top: (start == top & !(HEAP_MAX_BYTES - 1)).then_some(top),
            main: false,
        });
        start = word(&info, 8);
    }
    heaps
}

/// The first chunk at or after `address` whose user memory is aligned.
fn align_chunk(address: u64) -> u64 {
    (address + CHUNK_HEADER_BYTES).next_multiple_of(ALIGNMENT) - CHUNK_HEADER_BYTES
}

/// What the walk of the heaps found.
#[derive(Default)]
pub struct Chunks {
    /// (chunk address, chunk size) of every chunk that looks in use, in
    /// address order (tcache and fastbin chunks among them).
    pub in_use: Vec<(u64, u64)>,
    /// Ranges whose every chunk is known (the rest of a heap: unparsed).
    pub parsed: Vec<(u64, u64)>,
    pub free_bytes: u64,
    pub free_chunks: u64,
    pub resyncs: u64,
    pub unparsed_bytes: u64,
    pub bytes_read: u64,
    /// Chunk headers read, toward MAX_CHUNK_STEPS.
    pub steps: u64,
}

/// A window of the target's memory.
struct Window {
    start: u64,
    bytes: Vec<u8>,
}

impl Window {
    /// The two words at `address` (prev_size, size), read from the target
    /// when outside the window; None past `end` or where unreadable.
    fn header(
        &mut self,
        memory: &impl TargetMemory,
        address: u64,
        end: u64,
        read: &mut u64,
    ) -> Option<(u64, u64)> {
        if address.saturating_add(CHUNK_HEADER_BYTES) > end {
            return None;
        }
        let inside = address >= self.start
            && address + CHUNK_HEADER_BYTES <= self.start + self.bytes.len() as u64;
        if !inside {
            let want = ((end - address) as usize).min(WINDOW_BYTES);
            self.bytes.resize(want, 0);
            let got = memory.read(address, &mut self.bytes);
            *read += got as u64;
            self.bytes.truncate(got);
            self.start = address;
            if got < CHUNK_HEADER_BYTES as usize {
                return None;
            }
        }
        let offset = address - self.start;
        Some((word(&self.bytes, offset), word(&self.bytes, offset + 8)))
    }
}

/// Walks `heap`'s chunks into `chunks`; `traced` gives the chunks to go on
/// from after a header that makes no sense.
pub fn walk(memory: &impl TargetMemory, heap: &Heap, traced: &Blocks, chunks: &mut Chunks) {
    let mut window = Window {
        start: 0,
        bytes: Vec::new(),
    };
    // The chunk whose state the next header tells, and where the parsed
    // range began.
    let mut pending: Option<(u64, u64)> = None;
    let mut parsed_from = heap.start;
    let mut address = heap.first;
    loop {
        chunks.steps += 1;
        let header = (chunks.steps <= MAX_CHUNK_STEPS)
            .then(|| window.header(memory, address, heap.end, &mut chunks.bytes_read))
            .flatten();
        let Some((_, size_field)) = header else {
            // The end of the heap without its top chunk (it moved), memory
            // that cannot be read, or the step budget spent: the last
            // chunk's state is unknown.
            let from = pending.map_or(address, |(chunk, _)| chunk).min(heap.end);
            chunks.parsed.push((parsed_from, from));
            chunks.unparsed_bytes += heap.end - from;
            return;
        };
        let size = size_field & !FLAGS;
        if let Some((chunk, chunk_size)) = pending.take() {
            if size_field & PREV_INUSE != 0 {
                chunks.in_use.push((chunk, chunk_size));
            } else {
                chunks.free_chunks += 1;
                chunks.free_bytes += chunk_size;
            }
        }
        let fencepost = !heap.main
            && size < MIN_CHUNK_BYTES
            && size_field & PREV_INUSE != 0
            && address + 2 * CHUNK_HEADER_BYTES + ALIGNMENT > heap.end;
        if Some(address) == heap.top || fencepost {
            // The top chunk, or the fenceposts that end an old heap: the
            // rest is free.
            chunks.parsed.push((parsed_from, heap.end));
            return;
        }
        // A size the target wrote: one that wraps around would take the
        // walk back over chunks it has walked.
        let sane = size >= MIN_CHUNK_BYTES
            && size.is_multiple_of(ALIGNMENT)
            && flags_fit(size_field, heap)
            && address
                .checked_add(size)
                .is_some_and(|next| next <= heap.end);
        if sane {
            pending = Some((address, size));
            address += size;
            continue;
        }
        // Go on from the next traced block whose chunk header is sane.
        chunks.resyncs += 1;
        chunks.parsed.push((parsed_from, address));
        let Some(resume) = resume_after(memory, address, heap, traced, &mut window, chunks) else {
            chunks.unparsed_bytes += heap.end - address;
            return;
        };
        chunks.unparsed_bytes += resume - address;
        parsed_from = resume;
        address = resume;
    }
}

/// Whether a chunk's flags fit its heap: never IS_MMAPPED, and
/// NON_MAIN_ARENA only outside the main arena (where glibc sets it on
/// chunks it hands out, not on free remainders nor the top chunk).
fn flags_fit(size_field: u64, heap: &Heap) -> bool {
    size_field & IS_MMAPPED == 0 && (!heap.main || size_field & NON_MAIN_ARENA == 0)
}

/// The chunk of the first traced block past `address` in `heap` whose
/// header is sane.
fn resume_after(
    memory: &impl TargetMemory,
    address: u64,
    heap: &Heap,
    traced: &Blocks,
    window: &mut Window,
    chunks: &mut Chunks,
) -> Option<u64> {
    let mut index = traced.first_ending_after(address + CHUNK_HEADER_BYTES);
    while index < traced.len() {
        let block = traced.get(index as u32);
        if block.address >= heap.end {
            return None;
        }
        index += 1;
        let chunk = block.address.checked_sub(CHUNK_HEADER_BYTES)?;
        if chunk <= address || !block.address.is_multiple_of(ALIGNMENT) {
            continue;
        }
        chunks.steps += 1;
        if chunks.steps > MAX_CHUNK_STEPS {
            return None;
        }
        let Some((_, size_field)) = window.header(memory, chunk, heap.end, &mut chunks.bytes_read)
        else {
            continue;
        };
        let size = size_field & !FLAGS;
        if size >= block.size + 8
            && size.is_multiple_of(ALIGNMENT)
            && flags_fit(size_field, heap)
            && chunk.checked_add(size).is_some_and(|next| next <= heap.end)
        {
            return Some(chunk);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        holders::glibc::layout::{BINS, STATE_BINS},
        target_memory::Image,
    };

    const MAIN: u64 = 0x5555_0000_1000;
    const THREAD: u64 = 0x7f00_0000_0000 + 48;
    const HEAP: u64 = 0x7f00_0000_0000;

    /// An arena's state at `address` whose bins are all empty.
    fn state(address: u64, top: u64, next: u64) -> Vec<u8> {
        let mut image = Image::new();
        image.place(address, vec![0; STATE_BYTES as usize]);
        for bin in 0..BINS as u64 {
            let head = address + STATE_BINS + 16 * bin - 16;
            image.write_u64(address + STATE_BINS + 16 * bin, head);
            image.write_u64(address + STATE_BINS + 16 * bin + 8, head);
        }
        image.write_u64(address + STATE_TOP, top);
        image.write_u64(address + STATE_NEXT, next);
        layout::read_state(&image, address).unwrap()
    }

    fn glibc() -> Glibc {
        Glibc {
            version: (2, 36),
            heap_info_bytes: 48,
            safe_linking: true,
            main_arena: MAIN,
            found_by: "its shape",
            tcache_key_address: None,
        }
    }

    /// A main arena, and a thread arena at the start of its one heap
    /// (after `heap_info`), whose `next` and whose heap's `prev` are given.
    fn image(thread_next: u64, heap_prev: u64) -> Image {
        let top = HEAP + 0x1000;
        let mut heap = vec![0u8; 0x2000];
        let thread = state(THREAD, top, thread_next);
        heap[48..48 + thread.len()].copy_from_slice(&thread);
        let mut image = Image::new();
        image
            .place(MAIN, state(MAIN, MAIN + 0x4000, THREAD))
            .place(HEAP, heap)
            .write_u64(HEAP, THREAD)
            .write_u64(HEAP + 8, heap_prev)
            .write_u64(HEAP + 16, 0x2000)
            // One chunk in use, then the top chunk.
            .write_u64(HEAP + 0x8d0 + 8, 0x730 | PREV_INUSE)
            .write_u64(top + 8, 0x1000 | PREV_INUSE);
        image
    }

    #[test]
    fn a_heap_whose_prev_is_itself_is_walked_once() {
        let arenas = arenas(&image(MAIN, HEAP), &glibc(), None).unwrap();
        assert_eq!(arenas.len(), 2);
        assert_eq!(arenas[1].heaps.len(), 1, "prev = self: one heap");
        // A prev that is no heap's alignment ends the list too.
        let arenas = arenas_of(&image(MAIN, HEAP + 0x1000));
        assert_eq!(arenas[1].heaps.len(), 1);
    }

    fn arenas_of(image: &Image) -> Vec<Arena> {
        arenas(image, &glibc(), None).unwrap()
    }

    #[test]
    fn an_arena_list_that_loops_back_on_a_thread_arena_is_read_once() {
        let arenas = arenas_of(&image(THREAD, 0));
        assert_eq!(arenas.len(), 2, "thread arena's next = itself");
        let mut chunks = Chunks::default();
        let traced = Blocks::new(Vec::new());
        for heap in arenas.iter().flat_map(|arena| &arena.heaps) {
            walk(&image(THREAD, 0), heap, &traced, &mut chunks);
        }
        assert_eq!(chunks.in_use, [(HEAP + 0x8d0, 0x730)]);
        assert_eq!(chunks.steps, 2);
    }

    /// A chunk whose size wraps the address around to the heap's start
    /// (found by the glibc_heap fuzz target: the walk went round until its
    /// step budget, 16 Mi chunks "in use") ends the walk there.
    #[test]
    fn a_chunk_size_that_wraps_around_is_not_followed() {
        let mut image = Image::new();
        image
            .place(HEAP, vec![0; 0x1000])
            .write_u64(HEAP + 8, 0x100 | PREV_INUSE)
            .write_u64(HEAP + 0x108, 0u64.wrapping_sub(0x100) | PREV_INUSE);
        let heap = Heap {
            start: HEAP,
            first: HEAP,
            end: HEAP + 0x1000,
            top: None,
            main: false,
        };
        let mut chunks = Chunks::default();
        walk(&image, &heap, &Blocks::new(Vec::new()), &mut chunks);
        assert_eq!(chunks.steps, 2);
        assert_eq!(chunks.in_use, [(HEAP, 0x100)]);
        assert_eq!(chunks.resyncs, 1);
    }

    #[test]
    fn chunks_after_the_arena_start_aligned() {
        // 2.35+: heap_info is 48 bytes, the arena 2200: the first chunk's
        // user memory must be 16-aligned.
        let heap = 0x7f00_0000_0000;
        let first = align_chunk(heap + 48 + STATE_BYTES);
        assert_eq!((first + CHUNK_HEADER_BYTES) % ALIGNMENT, 0);
        assert!(first >= heap + 48 + STATE_BYTES && first < heap + 48 + STATE_BYTES + 16);
        assert_eq!(align_chunk(0x1000), 0x1000);
    }
}
