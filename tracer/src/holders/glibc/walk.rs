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
use super::{
    super::{blocks::Blocks, memory},
    layout::{
        self, ALIGNMENT, CHUNK_HEADER_BYTES, FLAGS, Glibc, HEAP_MAX_BYTES, IS_MMAPPED,
        MIN_CHUNK_BYTES, NON_MAIN_ARENA, PREV_INUSE, STATE_BYTES, STATE_NEXT, STATE_TOP, word,
    },
};

/// Bytes read at once.
const WINDOW_BYTES: usize = 1 << 20;
/// More arenas and heaps than a process has (glibc caps arenas at 8 per
/// core).
const MAX_ARENAS: usize = 4096;
const MAX_HEAPS: usize = 1 << 16;

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
pub fn arenas(pid: u32, glibc: &Glibc, brk_heap: Option<(u64, u64)>) -> Result<Vec<Arena>, String> {
    let main = layout::read_state(pid, glibc.main_arena)
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
    while next != glibc.main_arena && arenas.len() < MAX_ARENAS {
        let address = next;
        let state = layout::read_state(pid, address)
            .filter(|state| layout::is_arena(state, address))
            .ok_or_else(|| format!("thread arena {address:#x} could not be read as an arena"))?;
        next = word(&state, STATE_NEXT);
        let heaps = thread_heaps(pid, glibc, address, word(&state, STATE_TOP));
        arenas.push(Arena { state, heaps });
    }
    Ok(arenas)
}

/// A thread arena's heaps: the one its top chunk is in, then back through
/// each `heap_info`'s `prev`.
fn thread_heaps(pid: u32, glibc: &Glibc, arena: u64, top: u64) -> Vec<Heap> {
    let mut heaps = Vec::new();
    let mut start = top & !(HEAP_MAX_BYTES - 1);
    while start != 0 && heaps.len() < MAX_HEAPS {
        // heap_info: ar_ptr, prev, size, ...
        let mut info = [0u8; 24];
        if memory::read(pid, start, &mut info) < info.len() || word(&info, 0) != arena {
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
            end: start + size,
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
}

/// A window of the target's memory.
struct Window {
    start: u64,
    bytes: Vec<u8>,
}

impl Window {
    /// The two words at `address` (prev_size, size), read from the target
    /// when outside the window; None past `end` or where unreadable.
    fn header(&mut self, pid: u32, address: u64, end: u64, read: &mut u64) -> Option<(u64, u64)> {
        if address + CHUNK_HEADER_BYTES > end {
            return None;
        }
        let inside = address >= self.start
            && address + CHUNK_HEADER_BYTES <= self.start + self.bytes.len() as u64;
        if !inside {
            let want = ((end - address) as usize).min(WINDOW_BYTES);
            self.bytes.resize(want, 0);
            let got = memory::read(pid, address, &mut self.bytes);
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
pub fn walk(pid: u32, heap: &Heap, traced: &Blocks, chunks: &mut Chunks) {
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
        let header = window.header(pid, address, heap.end, &mut chunks.bytes_read);
        let Some((_, size_field)) = header else {
            // The end of the heap without its top chunk (it moved), or
            // memory that cannot be read: the last chunk's state is
            // unknown.
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
        let sane = size >= MIN_CHUNK_BYTES
            && size.is_multiple_of(ALIGNMENT)
            && flags_fit(size_field, heap)
            && address + size <= heap.end;
        if sane {
            pending = Some((address, size));
            address += size;
            continue;
        }
        // Go on from the next traced block whose chunk header is sane.
        chunks.resyncs += 1;
        chunks.parsed.push((parsed_from, address));
        let Some(resume) = resume_after(pid, address, heap, traced, &mut window, chunks) else {
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
    pid: u32,
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
        let Some((_, size_field)) = window.header(pid, chunk, heap.end, &mut chunks.bytes_read)
        else {
            continue;
        };
        let size = size_field & !FLAGS;
        if size >= block.size + 8
            && size.is_multiple_of(ALIGNMENT)
            && flags_fit(size_field, heap)
            && chunk + size <= heap.end
        {
            return Some(chunk);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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
