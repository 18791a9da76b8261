//! Which glibc a process runs and where its malloc keeps its state: the
//! version (from the library's own version string) picks the structure
//! layout from a table of the x86-64 releases tracer knows (2.30-2.41),
//! and `main_arena` is found by its symbol in the library's separate
//! debug file (Debian's libc6-dbg) or, without one, by its shape in the
//! library's writable data. Either way the arena found is checked before
//! it is trusted: most of its bins empty (a bin's list head points at
//! itself), the others heads of lists, its `next` a pointer.
//!
//! Offsets (x86-64, every release in the table; checked against glibc
//! 2.36's debug information): `struct malloc_state` holds the fastbins at
//! 16, `top` at 96, the bins at 112 (254 words), `next` at 2160, 2200
//! bytes in all; `heap_info` is 32 bytes before 2.35 and 48 from 2.35
//! (`pagesize`); a thread's tcache is 64 `uint16_t` counts then 64 list
//! heads (640 bytes, a 0x290-byte chunk); from 2.32 the tcache and fastbin
//! links are mangled ("safe-linking": stored = (its own address >> 12) ^
//! pointer).
use std::path::Path;

use object::{Object as _, ObjectSymbol as _};

use super::super::{memory::MapsLine, names::Module};
use crate::{
    debug_files,
    target_memory::{self, Process, TargetMemory},
};

pub const STATE_FASTBINS: u64 = 16;
pub const FASTBINS: usize = 10;
pub const STATE_TOP: u64 = 96;
pub const STATE_BINS: u64 = 112;
/// Bins (two words each: fd, bk), bin 0 unused.
pub const BINS: usize = 127;
pub const STATE_NEXT: u64 = 2160;
pub const STATE_BYTES: u64 = 2200;
pub const TCACHE_BINS: usize = 64;
pub const TCACHE_BYTES: usize = 640;
/// The chunk size of a thread's tcache (640 bytes asked).
pub const TCACHE_CHUNK_BYTES: u64 = 0x290;
/// Where a thread arena's heaps are aligned, and their largest size.
pub const HEAP_MAX_BYTES: u64 = 64 << 20;
pub const CHUNK_HEADER_BYTES: u64 = 16;
pub const MIN_CHUNK_BYTES: u64 = 32;
pub const ALIGNMENT: u64 = 16;
pub const PREV_INUSE: u64 = 1;
pub const IS_MMAPPED: u64 = 2;
pub const NON_MAIN_ARENA: u64 = 4;
pub const FLAGS: u64 = 7;

/// The oldest and newest glibc releases whose layout the table holds.
const OLDEST: (u32, u32) = (2, 30);
const NEWEST: (u32, u32) = (2, 41);

/// One process's glibc malloc, as far as the walk needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glibc {
    pub version: (u32, u32),
    pub heap_info_bytes: u64,
    pub safe_linking: bool,
    pub main_arena: u64,
    /// How `main_arena` was found: "debug symbols" or "its shape".
    pub found_by: &'static str,
    /// `tcache_key` (2.34+), when the debug symbols name it.
    pub tcache_key_address: Option<u64>,
}

/// The release in a glibc's version string ("... release version 2.36.").
pub fn version_of(bytes: &[u8]) -> Option<(u32, u32)> {
    const NEEDLE: &[u8] = b"release version ";
    let at = bytes
        .windows(NEEDLE.len())
        .position(|window| window == NEEDLE)?;
    let rest = &bytes[at + NEEDLE.len()..];
    let text: String = rest
        .iter()
        .take(16)
        .take_while(|byte| byte.is_ascii_digit() || **byte == b'.')
        .map(|&byte| byte as char)
        .collect();
    let mut parts = text.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The layout of `version`, or why there is none.
pub fn layout(version: (u32, u32)) -> Result<(u64, bool), String> {
    if version < OLDEST || version > NEWEST {
        return Err(format!(
            "glibc {}.{} is not in tracer's table of malloc layouts ({}.{}-{}.{})",
            version.0, version.1, OLDEST.0, OLDEST.1, NEWEST.0, NEWEST.1
        ));
    }
    let heap_info_bytes = if version >= (2, 35) { 48 } else { 32 };
    Ok((heap_info_bytes, version >= (2, 32)))
}

/// Finds `main_arena` in `libc` (mapped in `pid`, `regions`): by symbol
/// in its debug file, else by shape in its writable data; checked.
pub fn locate(pid: u32, libc: &Module, regions: &[MapsLine]) -> Result<Glibc, String> {
    let file = crate::target_files::open_in_root(pid, Path::new(&libc.path))
        .map_err(|error| format!("could not read {}: {error}", libc.path))?;
    // SAFETY: the map is read-only and only parsed.
    let data = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|error| format!("could not map {}: {error}", libc.path))?;
    let version =
        version_of(&data).ok_or_else(|| format!("{} has no glibc version string", libc.path))?;
    let (heap_info_bytes, safe_linking) = layout(version)?;
    let glibc = |main_arena, found_by, tcache_key_address| Glibc {
        version,
        heap_info_bytes,
        safe_linking,
        main_arena,
        found_by,
        tcache_key_address,
    };
    if let Some((arena, key)) = debug_symbols(pid, libc, &data) {
        let state = read_state(&Process(pid), arena);
        if state.as_deref().is_some_and(|state| is_arena(state, arena)) {
            return Ok(glibc(arena, "debug symbols", key));
        }
    }
    let found = by_shape(pid, libc, regions);
    match found.as_slice() {
        [arena] => Ok(glibc(*arena, "its shape", None)),
        [] => Err(format!(
            "no main_arena in {}'s data (glibc {}.{}; malloc never called?)",
            libc.name, version.0, version.1
        )),
        _ => Err(format!(
            "{} places that look like main_arena in {}'s data",
            found.len(),
            libc.name
        )),
    }
}

/// `main_arena` and `tcache_key` by symbol, from the debug file of the
/// object in `data`.
fn debug_symbols(pid: u32, libc: &Module, data: &[u8]) -> Option<(u64, Option<u64>)> {
    let elf = object::File::parse(data).ok()?;
    let link = debug_files::read_debug_link(&elf);
    let file = debug_files::find(
        &link,
        Path::new(&libc.path),
        crate::target_files::Root::Target(pid),
        &[],
    )?;
    // SAFETY: as above, read-only.
    let debug = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let debug = object::File::parse(&*debug).ok()?;
    let address = |name: &str| {
        debug
            .symbols()
            .find(|symbol| symbol.name() == Ok(name))
            .map(|symbol| symbol.address().wrapping_add(libc.bias))
    };
    Some((address("main_arena")?, address("tcache_key")))
}

/// Most bytes of a libc's writable data searched for main_arena: glibc's
/// is under 64 KiB, but the span comes from the file's `p_memsz`, which a
/// fake libc sets as it likes.
pub const MAX_DATA_BYTES: u64 = 4 << 20;

/// The places in `libc`'s writable data shaped like a main arena (its
/// first MAX_DATA_BYTES).
pub(super) fn by_shape(pid: u32, libc: &Module, regions: &[MapsLine]) -> Vec<u64> {
    let mut found = Vec::new();
    let mut budget = MAX_DATA_BYTES;
    for region in regions
        .iter()
        .filter(|region| region.writable && region.start >= libc.start && region.end <= libc.end)
    {
        let length = region.bytes().min(budget);
        budget -= length;
        let mut bytes = vec![0u8; length as usize];
        let read = target_memory::read(pid, region.start, &mut bytes);
        bytes.truncate(read);
        let mut offset = 0;
        while offset + STATE_BYTES as usize <= bytes.len() {
            let address = region.start + offset as u64;
            if is_arena(&bytes[offset..offset + STATE_BYTES as usize], address) {
                found.push(address);
            }
            offset += 8;
        }
    }
    found
}

/// A malloc_state's bytes at `address`, read whole.
pub fn read_state(memory: &impl TargetMemory, address: u64) -> Option<Vec<u8>> {
    let mut state = vec![0u8; STATE_BYTES as usize];
    memory.read_exact(address, &mut state).then_some(state)
}

pub fn word(bytes: &[u8], offset: u64) -> u64 {
    let offset = offset as usize;
    u64::from_ne_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
}

/// Whether `state`, read at `address`, is an initialized malloc arena: its
/// lock word and flags small, its top chunk aligned, `next` an aligned
/// pointer, at least 8 bins empty (both links point at the bin's own head,
/// 16 bytes before its fd word), and every other bin's links aligned
/// pointers elsewhere.
pub fn is_arena(state: &[u8], address: u64) -> bool {
    if state.len() < STATE_BYTES as usize {
        return false;
    }
    let half = |offset: usize| u32::from_ne_bytes(state[offset..offset + 4].try_into().unwrap());
    if half(0) > 2 || half(4) > 0xff || half(8) > 1 {
        return false;
    }
    let top = word(state, STATE_TOP);
    let next = word(state, STATE_NEXT);
    if top == 0 || !top.is_multiple_of(ALIGNMENT) || next == 0 || !next.is_multiple_of(8) {
        return false;
    }
    let mut empty = 0;
    for bin in 0..BINS as u64 {
        let head = address + STATE_BINS + 16 * bin - 16;
        let fd = word(state, STATE_BINS + 16 * bin);
        let bk = word(state, STATE_BINS + 16 * bin + 8);
        if fd == head && bk == head {
            empty += 1;
        } else if fd == 0
            || bk == 0
            || !fd.is_multiple_of(ALIGNMENT)
            || !bk.is_multiple_of(ALIGNMENT)
            || fd == head
            || bk == head
        {
            return false;
        }
    }
    empty >= 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_release_from_the_version_string() {
        assert_eq!(
            version_of(
                b"xx GNU C Library (Debian GLIBC 2.36-9+deb12u14) stable release version 2.36.\n"
            ),
            Some((2, 36))
        );
        assert_eq!(
            version_of(b"development release version 2.41.9000"),
            Some((2, 41))
        );
        assert_eq!(version_of(b"no version here"), None);
        assert_eq!(layout((2, 36)), Ok((48, true)));
        assert_eq!(layout((2, 31)), Ok((32, false)));
        assert!(
            layout((2, 28))
                .unwrap_err()
                .contains("not in tracer's table")
        );
        assert!(layout((2, 42)).is_err());
    }

    /// An arena's bytes at `address` with every bin empty but `full`.
    fn arena(address: u64, full: &[usize]) -> Vec<u8> {
        let mut state = vec![0u8; STATE_BYTES as usize];
        let mut put = |offset: u64, value: u64| {
            state[offset as usize..offset as usize + 8].copy_from_slice(&value.to_ne_bytes())
        };
        put(STATE_TOP, 0x5555_0000_1230);
        put(STATE_NEXT, address);
        for bin in 0..BINS as u64 {
            let head = if full.contains(&(bin as usize)) {
                0x5555_0000_0040 + 0x100 * bin
            } else {
                address + STATE_BINS + 16 * bin - 16
            };
            put(STATE_BINS + 16 * bin, head);
            put(STATE_BINS + 16 * bin + 8, head);
        }
        state
    }

    #[test]
    fn an_arena_is_told_by_its_empty_bins() {
        let address = 0x7f00_0000_3c60;
        assert!(is_arena(&arena(address, &[]), address));
        assert!(is_arena(&arena(address, &[0, 5, 60]), address));
        assert!(!is_arena(&arena(address, &[]), address + 8), "elsewhere");
        let mut state = arena(address, &[3]);
        state[STATE_BINS as usize + 16 * 3] ^= 8;
        assert!(!is_arena(&state, address), "a link out of alignment");
        assert!(
            !is_arena(&vec![0u8; STATE_BYTES as usize], address),
            "zeroes"
        );
        let mut state = arena(address, &[]);
        state[STATE_NEXT as usize..STATE_NEXT as usize + 8].fill(0);
        assert!(!is_arena(&state, address), "no next");
    }
}
