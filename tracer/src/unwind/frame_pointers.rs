//! Whether an object keeps frame pointers, for `--unwind auto`: its
//! functions (an even sample of a large object's) are checked for the
//! `push %rbp; mov %rsp,%rbp` prologue near their start (GCC's
//! shrink-wrapping may put early-exit checks before it). Its functions are
//! taken from its symbols, or from the `.eh_frame_hdr` search table
//! (stripped objects have it too).
//!
//! Only functions that call others are counted: the others are never a
//! caller on a stack, and GCC gives leaf functions no frame pointer even
//! with -fno-omit-frame-pointer.
//!
//! Many objects mix code with and without frame pointers: a Rust program
//! links the standard library (built with them) into crate code built
//! without; a C program links static libraries built either way. One
//! function without a frame pointer on a stack breaks the walk there, so
//! an object is walked with frame pointers only when nearly all of its
//! calling code keeps them, counted in functions and in bytes of code.
use std::collections::HashSet;

use iced_x86::{Decoder, DecoderOptions, FlowControl};

use super::modules::{ObjectInfo, open_mapped};
use crate::procfs::Mapping;

/// Most functions checked per object: an even sample of larger ones
/// (decoding every function of libLLVM's 17 MiB of code costs ~190 ms
/// from a cold page cache, this sample ~30 ms).
const SAMPLE: usize = 4096;
/// Fewer named functions than this: use the `.eh_frame_hdr` table.
const MIN_NAMED_FUNCTIONS: usize = 2;
/// Bytes from a function's start searched for its frame-pointer prologue.
const PROLOGUE_WINDOW: usize = 48;
/// An object keeps frame pointers when at least this share of its calling
/// functions, and of their code bytes, set one up. Built with
/// -fno-omit-frame-pointer, all do but the few that a static library
/// built otherwise brings; built without it, only functions that need a
/// frame (alloca, large frames) do: at most 5 % in Debian's libraries. A
/// Rust executable has about half (its standard library's).
const FRAME_POINTER_SHARE: f64 = 0.9;

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
    // Each object is read, checked and dropped before the next: kept
    // together, a torch process's 300 objects held their symbols and
    // touched code in tracer's memory at once.
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
        let keeps = open_mapped(pid, mapping)
            .and_then(|file| ObjectInfo::read(&file))
            .and_then(|object| keeps_frame_pointers(&object));
        if keeps == Some(false) {
            lacking.push(name);
        }
    }
    lacking
}

/// How much of an object's calling code (functions that call others) sets
/// up frame pointers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FramePointerShare {
    pub functions: u64,
    pub functions_with_frame_pointer: u64,
    pub code_bytes: u64,
    pub code_bytes_with_frame_pointer: u64,
}

impl FramePointerShare {
    /// Nearly all functions, and nearly all bytes of code, set up a frame
    /// pointer.
    pub fn keeps_frame_pointers(&self) -> bool {
        let share = |part: u64, whole: u64| part as f64 >= FRAME_POINTER_SHARE * whole as f64;
        self.functions > 0
            && share(self.functions_with_frame_pointer, self.functions)
            && share(self.code_bytes_with_frame_pointer, self.code_bytes)
    }
}

/// Some(true) when the object keeps frame pointers, None when there are no
/// functions to check.
pub fn keeps_frame_pointers(object: &ObjectInfo) -> Option<bool> {
    if let Some(managed) = &object.managed {
        // A runtime's code keeps frame pointers (Go 1.7+, amd64, stores
        // them with `mov %rbp,N(%rsp); lea N(%rsp),%rbp`, which the
        // prologue check does not know). Native code linked in beside it
        // is built as C is (`go build` compiles cgo's C with -O2: no frame
        // pointers), and decides.
        if managed.text.is_none() {
            return Some(true);
        }
        return Some(frame_pointer_share(object).is_none_or(|share| share.keeps_frame_pointers()));
    }
    frame_pointer_share(object).map(|share| share.keeps_frame_pointers())
}

/// The share of the object's calling functions in `.text` that set up
/// frame pointers: of those named in its symbol tables (start files' functions,
/// cold parts and a Go object's Go code aside), else those listed in
/// `.eh_frame_hdr`. None when there are none.
pub fn frame_pointer_share(object: &ObjectInfo) -> Option<FramePointerShare> {
    let text = object.text()?;
    let is_runtime_code = |address: u64| {
        object
            .managed
            .as_ref()
            .and_then(|managed| managed.text.as_ref())
            .is_some_and(|text| text.contains(&address))
    };
    // The named functions (start, size in bytes): their names are read
    // for the sample only.
    let mut named: Vec<&crate::unwind::modules::Function> = object
        .functions
        .iter()
        .filter(|function| text.contains(&function.address) && !is_runtime_code(function.address))
        .collect();
    named.sort_unstable_by_key(|function| function.address);
    named.dedup_by_key(|function| function.address);
    let step = named.len().div_ceil(SAMPLE).max(1);
    let mut functions: Vec<(u64, u64)> = named
        .into_iter()
        .step_by(step)
        .filter(|function| object.is_own_code(function))
        .map(|function| (function.address, function.size))
        .collect();
    if functions.len() < MIN_NAMED_FUNCTIONS {
        let (hdr_address, hdr) = object.eh_frame_hdr()?;
        let mut starts = function_starts(hdr_address, hdr)?;
        starts.retain(|start| text.contains(start));
        starts.sort_unstable();
        starts.dedup();
        // Each function runs up to the next one's start (or the end of
        // `.text`): padding included, which is the same for both kinds.
        let ends = starts.iter().skip(1).copied().chain([text.end]);
        functions = starts
            .iter()
            .zip(ends)
            .map(|(&start, end)| (start, end - start))
            .collect();
    }
    functions.retain(|(start, _)| text.contains(start) && !is_runtime_code(*start));
    // Aliases (several names for one function) count once.
    functions.sort_unstable();
    functions.dedup_by_key(|(start, _)| *start);
    let mut share = FramePointerShare::default();
    let step = functions.len().div_ceil(SAMPLE).max(1);
    for &(start, size) in functions.iter().step_by(step) {
        let Some(offset) = object.offset_of_address(start) else {
            continue;
        };
        // The sample spans all of `.text` (82 MiB in libtorch_cpu): the
        // pages each function's decoding faulted in are dropped after it,
        // or they would all stay in tracer's resident memory.
        let checked = object.with_bytes_at(offset, size as usize, |code| {
            makes_calls(code)
                .then(|| sets_up_frame_pointer(&code[..PROLOGUE_WINDOW.min(code.len())]))
        });
        let Some(Some(with_frame_pointer)) = checked else {
            continue;
        };
        share.functions += 1;
        share.code_bytes += size;
        if with_frame_pointer {
            share.functions_with_frame_pointer += 1;
            share.code_bytes_with_frame_pointer += size;
        }
    }
    (share.functions > 0).then_some(share)
}

/// `mov %rsp,%rbp` among the first bytes of a function (GCC schedules
/// other instructions between it and `push %rbp`). Code built without
/// frame pointers pushes %rbp only to use it as a register, and copies the
/// stack pointer into it only in the rare function that needs a frame.
fn sets_up_frame_pointer(code: &[u8]) -> bool {
    code.windows(3).any(|window| window == [0x48, 0x89, 0xe5])
}

/// Whether a function's code calls another function (a direct or indirect
/// `call`), so that it can be a caller on a stack.
fn makes_calls(code: &[u8]) -> bool {
    Decoder::with_ip(64, code, 0, DecoderOptions::NONE)
        .into_iter()
        .any(|instruction| {
            matches!(
                instruction.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            )
        })
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

    /// A file the test reads: `path` from the workspace root
    /// (target/fixtures/ is built by `cargo xtask setup`), or an absolute
    /// path on this machine.
    fn object(path: &str) -> ObjectInfo {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path);
        let file = std::fs::File::open(&path).unwrap_or_else(|error| {
            panic!(
                "could not open {} ({error}): fixtures are built by `cargo xtask setup`",
                path.display()
            )
        });
        ObjectInfo::read(&file).unwrap_or_else(|| panic!("{} is not an ELF", path.display()))
    }

    fn share_of(path: &str) -> FramePointerShare {
        frame_pointer_share(&object(path)).unwrap_or_else(|| panic!("no functions in {path}"))
    }

    /// Functions whose (mangled) name contains `part`, and how many of
    /// them set up a frame pointer.
    fn named_with_frame_pointers(object: &ObjectInfo, part: &str) -> (usize, usize) {
        let named = object.functions_named(|name| name.contains(part));
        let with = named
            .iter()
            .filter(|function| {
                let offset = object
                    .offset_of_address(function.address)
                    .expect("in a segment");
                let window = PROLOGUE_WINDOW.min(function.size as usize);
                sets_up_frame_pointer(object.bytes_at(offset, window).expect("in the file"))
            })
            .count();
        (named.len(), with)
    }

    #[test]
    fn a_share_needs_nearly_all_functions_and_nearly_all_code() {
        let share = |functions_with, code_bytes_with| FramePointerShare {
            functions: 100,
            functions_with_frame_pointer: functions_with,
            code_bytes: 10_000,
            code_bytes_with_frame_pointer: code_bytes_with,
        };
        assert!(share(100, 10_000).keeps_frame_pointers());
        assert!(share(95, 9_500).keeps_frame_pointers());
        // Nearly every function, but the few without hold half the code.
        assert!(!share(95, 5_000).keeps_frame_pointers());
        // Most of the code, in a minority of the functions.
        assert!(!share(40, 9_500).keeps_frame_pointers());
        assert!(!FramePointerShare::default().keeps_frame_pointers());
    }

    #[test]
    fn rust_release_executable_mixes_and_is_not_walked_with_frame_pointers() {
        for path in [
            "target/fixtures/rust_leak",
            "target/fixtures/rust_leak_abort",
        ] {
            let object = object(path);
            // The standard library is shipped with frame pointers, the
            // crate's own code is built without (and so are the generic
            // std functions instantiated in it).
            let (std_functions, std_with) = named_with_frame_pointers(&object, "3std");
            assert!(
                std_with * 2 > std_functions && std_functions > 100,
                "{path}: {std_with} of {std_functions} std functions with frame pointers"
            );
            let (own_functions, own_with) = named_with_frame_pointers(&object, "9rust_leak");
            assert!(
                own_functions >= 8,
                "{path}: {own_functions} rust_leak functions"
            );
            assert_eq!(
                own_with, 0,
                "{path}: rust_leak functions with frame pointers"
            );
            let share = frame_pointer_share(&object).expect("functions");
            assert!(
                share.functions_with_frame_pointer > 0
                    && share.functions_with_frame_pointer < share.functions,
                "{path}: {share:?}"
            );
            assert!(!share.keeps_frame_pointers(), "{path}: {share:?}");
        }
    }

    #[test]
    fn c_executable_linking_a_frame_pointer_library_is_not_walked_with_them() {
        let object = object("target/fixtures/mixed_fp");
        let share = frame_pointer_share(&object).expect("functions");
        // Most calling functions (the static library's) keep frame
        // pointers: a majority by count is not enough.
        assert!(
            share.functions_with_frame_pointer * 2 > share.functions,
            "{share:?}"
        );
        assert!(!share.keeps_frame_pointers(), "{share:?}");
        assert_eq!(
            named_with_frame_pointers(&object, "leak_"),
            (2, 0),
            "mixed_fp's own functions keep no frame pointer"
        );
    }

    #[test]
    fn c_built_with_frame_pointers_keeps_them() {
        for path in ["target/fixtures/leaky", "target/fixtures/gpu_executor"] {
            let share = share_of(path);
            assert_eq!(
                (
                    share.functions_with_frame_pointer,
                    share.code_bytes_with_frame_pointer
                ),
                (share.functions, share.code_bytes),
                "{path}"
            );
            assert!(share.keeps_frame_pointers(), "{path}: {share:?}");
        }
    }

    #[test]
    fn debian_libraries_lack_frame_pointers() {
        for path in [
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
            "/usr/lib/x86_64-linux-gnu/libz.so.1",
            "/usr/lib/x86_64-linux-gnu/libcrypto.so.3",
            "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
            "/usr/bin/python3.11",
            "/usr/bin/redis-server",
        ] {
            let share = share_of(path);
            assert!(share.functions > 40, "{path}: {share:?}");
            assert!(
                share.functions_with_frame_pointer * 10 < share.functions,
                "{path}: {share:?}"
            );
            assert!(!share.keeps_frame_pointers(), "{path}: {share:?}");
        }
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
