//! Whether an object keeps frame pointers, for `--unwind auto`: its
//! functions are taken from the `.eh_frame_hdr` search table (stripped
//! objects have it too) and a sample of them is checked for the
//! `push %rbp; mov %rsp,%rbp` prologue near their start (GCC's
//! shrink-wrapping may put early-exit checks before it).
use std::collections::HashSet;

use super::modules::{ModuleFiles, ObjectInfo};
use crate::procfs::Mapping;

/// Functions checked per object.
const SAMPLE: usize = 256;
/// Fewer named functions than this: use the `.eh_frame_hdr` table.
const MIN_NAMED_FUNCTIONS: usize = 2;
/// Bytes from a function's start searched for its frame-pointer prologue.
const PROLOGUE_WINDOW: usize = 48;
/// An object keeps frame pointers when at least this share of its sampled
/// functions set one up. Built with -fno-omit-frame-pointer nearly all do;
/// without it, only functions that need a frame (alloca, large frames) do.
const FRAME_POINTER_SHARE: f64 = 0.5;

/// Objects never counted against frame pointers in `auto`: glibc's own.
/// Distributions build them without frame pointers, they are in every
/// process, and the allocator entry points in them are probed directly;
/// counting them would copy every stack of every process.
const GLIBC_OBJECTS: [&str; 9] = [
    "libc.so",
    "libc-",
    "ld-linux",
    "ld64.so",
    "libm.so",
    "libpthread.so",
    "libdl.so",
    "librt.so",
    "libresolv.so",
];

/// What `auto` found among `mappings` of a process (all of them at attach,
/// the new ones later): the objects that lack frame pointers (file names),
/// or nothing when every object keeps them.
pub fn objects_lacking<'a>(
    pid: u32,
    mappings: impl IntoIterator<Item = &'a Mapping>,
) -> Vec<String> {
    let mut files = ModuleFiles::default();
    let mut seen = HashSet::new();
    let mut lacking = Vec::new();
    for mapping in mappings.into_iter().filter(|mapping| mapping.executable) {
        let name = mapping
            .path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        if GLIBC_OBJECTS.iter().any(|glibc| name.starts_with(glibc))
            || !seen.insert(mapping.path.clone())
        {
            continue;
        }
        let keeps = files
            .object(pid, mapping)
            .and_then(|object| keeps_frame_pointers(&object));
        if keeps == Some(false) {
            lacking.push(name);
        }
    }
    lacking
}

/// Functions that the C runtime's start files (crt1.o, crtbegin.o) link
/// into every program, built without frame pointers: in a small program
/// they would outnumber its own functions.
const START_FILE_FUNCTIONS: [&str; 9] = [
    "_start",
    "_init",
    "_fini",
    "deregister_tm_clones",
    "register_tm_clones",
    "__do_global_dtors_aux",
    "frame_dummy",
    "__libc_csu_init",
    "__libc_csu_fini",
];

/// Some(true) when the object's functions set up frame pointers, None when
/// there are no functions to check: named in its symbol tables (start
/// files' functions and cold parts aside), else listed in `.eh_frame_hdr`;
/// only those in `.text`.
pub fn keeps_frame_pointers(object: &ObjectInfo) -> Option<bool> {
    let text = object.text()?;
    let mut starts: Vec<u64> = object
        .functions
        .iter()
        .filter(|(_, name)| {
            !START_FILE_FUNCTIONS.contains(&name.as_str()) && !name.contains(".cold")
        })
        .map(|(address, _)| *address)
        .collect();
    if starts.len() < MIN_NAMED_FUNCTIONS {
        let (hdr_address, hdr) = object.eh_frame_hdr()?;
        starts = function_starts(hdr_address, hdr)?;
    }
    starts.retain(|start| text.contains(start));
    starts.sort_unstable();
    starts.dedup();
    if starts.is_empty() {
        return None;
    }
    let step = starts.len().div_ceil(SAMPLE).max(1);
    let mut checked = 0;
    let mut with_frame_pointer = 0;
    for &start in starts.iter().step_by(step) {
        let Some(bytes) = object
            .offset_of_address(start)
            .and_then(|offset| object.bytes_at(offset, PROLOGUE_WINDOW))
        else {
            continue;
        };
        checked += 1;
        if sets_up_frame_pointer(bytes) {
            with_frame_pointer += 1;
        }
    }
    (checked > 0).then_some(with_frame_pointer as f64 >= FRAME_POINTER_SHARE * checked as f64)
}

/// `mov %rsp,%rbp` among the first bytes of a function (GCC schedules
/// other instructions between it and `push %rbp`). Code built without
/// frame pointers pushes %rbp only to use it as a register, and copies the
/// stack pointer into it only in the rare function that needs a frame.
fn sets_up_frame_pointer(code: &[u8]) -> bool {
    code.windows(3).any(|window| window == [0x48, 0x89, 0xe5])
}

/// The initial locations of the FDEs listed in `.eh_frame_hdr` (at object
/// address `hdr_address`), for the encodings every toolchain emits: the
/// table as `datarel | sdata4` pairs.
fn function_starts(hdr_address: u64, hdr: &[u8]) -> Option<Vec<u64>> {
    const DW_EH_PE_UDATA4: u8 = 0x03;
    const DW_EH_PE_DATAREL_SDATA4: u8 = 0x3b;
    let (&version, rest) = hdr.split_first()?;
    let [_frame_pointer_encoding, count_encoding, table_encoding] = *rest.get(..3)? else {
        return None;
    };
    if version != 1
        || count_encoding != DW_EH_PE_UDATA4
        || table_encoding != DW_EH_PE_DATAREL_SDATA4
    {
        return None;
    }
    // version, three encodings, then a 4-byte eh_frame pointer.
    let count = u32::from_le_bytes(hdr.get(8..12)?.try_into().ok()?) as usize;
    let table = hdr.get(12..12 + count.checked_mul(8)?)?;
    Some(
        table
            .chunks_exact(8)
            .map(|pair| {
                let relative = i32::from_le_bytes(pair[..4].try_into().expect("4 bytes"));
                hdr_address.wrapping_add_signed(relative as i64)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognizes_frame_pointer_prologues() {
        assert!(sets_up_frame_pointer(&[0x55, 0x48, 0x89, 0xe5, 0x90]));
        assert!(sets_up_frame_pointer(&[
            0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5
        ]));
        // push %rbx; sub $0x10,%rsp: no frame pointer.
        assert!(!sets_up_frame_pointer(&[0x53, 0x48, 0x83, 0xec, 0x10]));
        // push %rbp as a callee-saved register, no mov.
        assert!(!sets_up_frame_pointer(&[0x55, 0x53, 0x48, 0x83]));
        // push %rbp; mov $0x539,%edi; mov %rsp,%rbp (scheduled apart).
        assert!(sets_up_frame_pointer(&[
            0x55, 0xbf, 0x39, 0x05, 0x00, 0x00, 0x48, 0x89, 0xe5
        ]));
        // Shrink-wrapped: cmpq $0x0,0x8(%rdi); je; then the prologue.
        assert!(sets_up_frame_pointer(&[
            0x48, 0x83, 0x7f, 0x08, 0x00, 0x74, 0x30, 0x55, 0x48, 0x89, 0xe5
        ]));
    }

    #[test]
    fn reads_the_eh_frame_hdr_search_table() {
        let mut hdr = vec![1, 0x1b, 0x03, 0x3b];
        hdr.extend_from_slice(&0i32.to_le_bytes());
        hdr.extend_from_slice(&2u32.to_le_bytes());
        for (start, fde) in [(-0x100i32, 0x10i32), (0x20, 0x30)] {
            hdr.extend_from_slice(&start.to_le_bytes());
            hdr.extend_from_slice(&fde.to_le_bytes());
        }
        assert_eq!(
            function_starts(0x1000, &hdr),
            Some(vec![0x1000 - 0x100, 0x1020])
        );
        hdr[3] = 0x1b;
        assert_eq!(function_starts(0x1000, &hdr), None);
    }
}
