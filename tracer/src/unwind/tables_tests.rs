//! The table builder on Debian's real libraries: a few functions each with
//! rows written down once from `readelf --debug-dump=frames-interp`, the
//! special rows (PLT, signal frame, outermost frame), and every FDE (a
//! sample of libtorch_cpu's) checked against readelf's own interpretation
//! (`tables_readelf.rs`).
use std::fs::File;
use std::process::Command;
use std::time::Instant;

use object::{Object as _, ObjectSection as _};

use super::*;

const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";
const LIBSTDCXX: &str = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6";
const LIBTORCH_CPU: &str = "/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13.0";

fn object(path: &str) -> ObjectInfo {
    let file = File::open(path)
        .unwrap_or_else(|error| panic!("{path}: {error} (installed by `cargo xtask setup`)"));
    ObjectInfo::read(&file).unwrap_or_else(|| panic!("{path}: not an ELF object"))
}

fn built(path: &str) -> (ObjectInfo, BuiltRows) {
    let object = object(path);
    let built = build_rows(&FrameSections::of(&object));
    assert_eq!(built.fdes_skipped, 0, "{path}");
    (object, built)
}

fn function_address(object: &ObjectInfo, name: &str) -> u64 {
    object
        .function_named(name)
        .unwrap_or_else(|| panic!("no function {name}"))
        .address
}

/// A row as (offset from `start`, rule, cfa offset, rbp offset in words).
type Relative = (u64, u8, u16, i8);

/// The rows that apply from `start` to `end` (inclusive: the row at `end`
/// says what follows the function), offsets from `start`.
fn rows_between(rows: &[UnwindRow], start: u64, end: u64) -> Vec<Relative> {
    let first = row_for(rows, start).expect("a row at the start");
    std::iter::once(first)
        .chain(
            rows.iter()
                .filter(|row| (start + 1..=end).contains(&u64::from(row.pc))),
        )
        .map(|row| {
            let pc = u64::from(row.pc).max(start) - start;
            (pc, row.rule, row.cfa_offset, row.rbp_offset_words)
        })
        .collect()
}

use cfa_rule::{NO_INFO, PLT, RBP, RSP};

#[test]
fn libc_free_rows_match_readelf() {
    let (object, built) = built(LIBC);
    let free = function_address(&object, "free");
    // readelf --debug-dump=frames-interp, FDE pc=98ef0..98ff1 (glibc
    // 2.41), rbx and the other columns dropped, equal rows merged.
    let expected: Vec<Relative> = vec![
        (0x0, RSP, 8, 0),
        (0xa, RSP, 16, -2),
        (0xf, RSP, 24, -2),
        (0x13, RSP, 48, -2),
        (0x76, RSP, 24, -2),
        (0x77, RSP, 16, -2),
        (0x78, RSP, 8, -2),
        (0x80, RSP, 48, -2),
        (0xbf, RSP, 24, -2),
        (0xc0, RSP, 16, -2),
        (0xc1, RSP, 8, -2),
        // DW_CFA_restore_state back to the entry's rules: rbp unsaved.
        (0xc8, RSP, 8, 0),
        (0xd0, RSP, 48, -2),
        (0x101, NO_INFO, 0, 0),
    ];
    assert_eq!(rows_between(&built.rows, free, free + 0x101), expected);
}

#[test]
fn libstdcxx_rows_match_readelf() {
    let (object, built) = built(LIBSTDCXX);
    // operator new(unsigned long): one push of rbx.
    let new = function_address(&object, "_Znwm");
    let expected: Vec<Relative> = vec![
        (0x0, RSP, 8, 0),
        (0xd, RSP, 16, 0),
        (0x22, RSP, 8, 0),
        (0x23, RSP, 16, 0),
        (0x35, NO_INFO, 0, 0),
    ];
    assert_eq!(rows_between(&built.rows, new, new + 0x35), expected);
    // operator<<(ostream&, complex<long double> const&): an rbp frame.
    let print = function_address(
        &object,
        "_ZStlsIecSt11char_traitsIcEERSt13basic_ostreamIT0_T1_ES6_RKSt7complexIT_E",
    );
    let expected: Vec<Relative> = vec![
        (0x0, RSP, 8, 0),
        (0x5, RSP, 16, -2),
        (0x8, RBP, 16, -2),
        (0x3e8, RSP, 8, -2),
        (0x3f0, RBP, 16, -2),
        (0x503, NO_INFO, 0, 0),
    ];
    assert_eq!(rows_between(&built.rows, print, print + 0x503), expected);
}

#[test]
fn libtorch_cpu_rows_match_readelf() {
    let (object, built) = built(LIBTORCH_CPU);
    // at::native::add(Tensor const&, Scalar const&, Scalar const&).
    let add = function_address(&object, "_ZN2at6native3addERKNS_6TensorERKN3c106ScalarES7_");
    let expected: Vec<Relative> = vec![
        (0x0, RSP, 8, 0),
        (0x2, RSP, 16, 0),
        (0x7, RSP, 24, 0),
        (0x13, RSP, 32, -4),
        (0x14, RSP, 40, -4),
        (0x1b, RSP, 64, -4),
        (0x63, RSP, 40, -4),
        (0x67, RSP, 32, -4),
        (0x68, RSP, 24, -4),
        (0x6a, RSP, 16, -4),
        (0x6c, RSP, 8, -4),
        (0x6d, RSP, 64, -4),
        (0x7a, NO_INFO, 0, 0),
    ];
    assert_eq!(rows_between(&built.rows, add, add + 0x7a), expected);
    // at::_ops::matmul::call(Tensor const&, Tensor const&): an rbp frame.
    let matmul = function_address(&object, "_ZN2at4_ops6matmul4callERKNS_6TensorES4_");
    let expected: Vec<Relative> = vec![
        (0x0, RSP, 8, 0),
        (0x1, RSP, 16, -2),
        (0x4, RBP, 16, -2),
        (0x19c, RSP, 8, -2),
        (0x1a0, RBP, 16, -2),
        (0x329, NO_INFO, 0, 0),
    ];
    assert_eq!(rows_between(&built.rows, matmul, matmul + 0x329), expected);
}

#[test]
fn libc_plt_entries_get_the_plt_rule() {
    let (_, built) = built(LIBC);
    let data = std::fs::read(LIBC).expect("libc");
    let elf = object::File::parse(&data[..]).expect("an ELF");
    let plt = elf.section_by_name(".plt").expect("libc has a .plt");
    let (start, size) = (plt.address(), plt.size());
    // PLT0 pushes once, then jumps; every entry after it has the
    // expression.
    let expected: Vec<Relative> = vec![(0x0, RSP, 16, 0), (0x6, RSP, 24, 0), (0x10, PLT, 0, 0)];
    assert_eq!(rows_between(&built.rows, start, start + size - 1), expected);
}

#[test]
fn plt_expression_is_recognized_only_as_written_by_linkers() {
    assert!(is_plt_expression(&PLT_EXPRESSION));
    let mut lit10 = PLT_EXPRESSION;
    lit10[PLT_THRESHOLD_INDEX] = DW_OP_LIT10;
    assert!(is_plt_expression(&lit10));
    let mut other = PLT_EXPRESSION;
    other[1] = 0x10;
    assert!(!is_plt_expression(&other));
    assert!(!is_plt_expression(&PLT_EXPRESSION[..10]));
}

#[test]
fn libc_restore_rt_is_the_signal_frame() {
    let (object, built) = built(LIBC);
    let signal: Vec<&UnwindRow> = built
        .rows
        .iter()
        .filter(|row| row.rule == cfa_rule::SIGNAL)
        .collect();
    assert_eq!(signal.len(), 1, "{signal:?}");
    // The FDE starts one byte before __restore_rt (a nop), so that a
    // return address there minus one is still inside; the code is
    // `mov $15 (rt_sigreturn),%rax; syscall`.
    let restore_rt = u64::from(signal[0].pc) + 1;
    let offset = object.offset_of_address(restore_rt).expect("in a segment");
    assert_eq!(
        object.bytes_at(offset, 9),
        Some(&[0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05][..])
    );
}

#[test]
fn libc_clone_children_are_outermost_frames() {
    let (object, built) = built(LIBC);
    // __clone's child branch: `xor %ebp,%ebp; pop %rax; pop %rdi; call
    // *%rax`, with the return address undefined (readelf's `u`).
    let clone = function_address(&object, "__clone");
    let child = row_for(&built.rows, clone + 0x3a).expect("a row");
    assert_eq!(
        (child.pc, child.rule),
        ((clone + 0x3a) as u32, cfa_rule::END)
    );
    assert_eq!(row_for(&built.rows, clone).map(|row| row.rule), Some(RSP));
    // clone3's child (not exported) is the only other outermost frame.
    let ends: Vec<u64> = built
        .rows
        .iter()
        .filter(|row| row.rule == cfa_rule::END)
        .map(|row| u64::from(row.pc))
        .collect();
    assert_eq!(ends.len(), 2, "{ends:x?}");
    for end in ends {
        let offset = object.offset_of_address(end).expect("in a segment");
        assert_eq!(
            object.bytes_at(offset, 2),
            Some(&[0x31, 0xed][..]),
            "{end:x}"
        );
    }
}

#[path = "tables_readelf.rs"]
mod readelf;

#[test]
fn libtorch_cpu_builds_fast_and_compact() {
    let object = object(LIBTORCH_CPU);
    let started = Instant::now();
    let built = build_rows(&FrameSections::of(&object));
    let elapsed = started.elapsed();
    eprintln!(
        "{LIBTORCH_CPU}: {} FDEs, {} rows, {} bytes, built in {elapsed:?}",
        built.fdes,
        built.rows.len(),
        built.bytes()
    );
    assert!(built.fdes > 200_000, "{built:?}");
    assert!(built.rows.windows(2).all(|pair| pair[0].pc < pair[1].pc));
    // Generous for a shared, loaded CI machine; ~0.2 s when idle.
    assert!(elapsed.as_secs_f64() < 2.0, "{elapsed:?}");
}

/// A C file built without `.eh_frame` (only `.debug_frame`, as `-g
/// -fno-asynchronous-unwind-tables` makes it) and, from the same
/// assembly, with both sections.
const FRAME_SECTIONS_SOURCE: &str = r#"
#include <stdlib.h>
__attribute__((noinline)) long leaf(long *p, long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += p[i] * 3;
    return s;
}
long outer(long n) {
    long *p = malloc(n * sizeof *p);
    for (long i = 0; i < n; i++) p[i] = i;
    long s = leaf(p, n);
    free(p);
    return n > 0 ? s + outer(n - 1) : s;
}
"#;

/// Builds the two objects of FRAME_SECTIONS_SOURCE: (only .debug_frame,
/// both sections).
fn frame_section_objects() -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("tracer-frame-sections-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let source = dir.join("f.c");
    std::fs::write(&source, FRAME_SECTIONS_SOURCE).expect("the source");
    let flags = [
        "-O2",
        "-g",
        "-fPIC",
        "-fomit-frame-pointer",
        "-fno-asynchronous-unwind-tables",
    ];
    let cc = |arguments: &[&std::ffi::OsStr]| {
        let status = Command::new("cc")
            .args(flags)
            .args(arguments)
            .status()
            .expect("cc (gcc) must be installed");
        assert!(status.success(), "cc {arguments:?}");
    };
    let debug_only = dir.join("debug_frame.so");
    cc(&[
        "-shared".as_ref(),
        source.as_os_str(),
        "-o".as_ref(),
        debug_only.as_os_str(),
    ]);
    let assembly = dir.join("f.s");
    cc(&[
        "-S".as_ref(),
        source.as_os_str(),
        "-o".as_ref(),
        assembly.as_os_str(),
    ]);
    let text = std::fs::read_to_string(&assembly).expect("the assembly");
    let directive = "\t.cfi_sections\t.debug_frame";
    assert!(
        text.contains(directive),
        "gcc no longer writes {directive:?}"
    );
    let both_assembly = dir.join("both.s");
    std::fs::write(
        &both_assembly,
        text.replace(directive, "\t.cfi_sections .eh_frame, .debug_frame"),
    )
    .expect("the assembly");
    let both = dir.join("both.so");
    cc(&[
        "-shared".as_ref(),
        both_assembly.as_os_str(),
        "-o".as_ref(),
        both.as_os_str(),
    ]);
    (debug_only, both)
}

#[test]
fn debug_frame_alone_or_beside_eh_frame() {
    let (debug_only_path, both_path) = frame_section_objects();
    let (debug_only, both) = (
        debug_only_path.to_str().unwrap(),
        both_path.to_str().unwrap(),
    );

    // Only .debug_frame: its FDEs are the rows, as readelf reads them.
    let object = self::object(debug_only);
    assert!(object.debug_frame().is_some());
    let built = build_rows(&FrameSections::of(&object));
    assert_eq!((built.fdes, built.fdes_skipped), (2, 0), "{built:?}");
    let outer = function_address(&object, "outer");
    assert_eq!(
        row_for(&built.rows, outer).map(|row| (row.rule, row.cfa_offset)),
        Some((RSP, 8))
    );
    assert_eq!(readelf::check_against_readelf(debug_only, 1), 2);

    // Both: .eh_frame's FDEs win, .debug_frame's (the same code) are
    // left out, and either section alone gives the same rows.
    let object = self::object(both);
    let sections = FrameSections::of(&object);
    let built = build_rows(&sections);
    let eh_only = build_rows(&FrameSections {
        debug_frame: None,
        ..sections
    });
    let debug_only = build_rows(&FrameSections {
        eh_frame: None,
        ..sections
    });
    // .eh_frame also has the linker's FDEs of the PLT.
    assert_eq!(debug_only.fdes, 2);
    assert!(eh_only.fdes > 2, "{eh_only:?}");
    assert_eq!(
        (built.fdes, built.fdes_skipped),
        (eh_only.fdes, 2),
        "{built:?}"
    );
    assert_eq!(built.rows, eh_only.rows);
    for name in ["leaf", "outer"] {
        let function = object.function_named(name).expect(name);
        let (start, end) = (function.address, function.address + function.size);
        assert_eq!(
            rows_between(&debug_only.rows, start, end),
            rows_between(&eh_only.rows, start, end),
            "{name}"
        );
    }
    std::fs::remove_dir_all(both_path.parent().expect("a directory")).expect("removed");
}

/// `.eh_frame` of one CIE (`zR`, absolute 8-byte addresses, CFA =
/// rsp+8) and one FDE for [start, start + range) whose instructions are
/// `after_start`.
fn one_fde(start: u64, range: u64, after_start: &[u8]) -> Vec<u8> {
    let mut cie = vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x04];
    cie.extend([0x0c, 7, 8, 0x90, 1]);
    while !(cie.len() + 4).is_multiple_of(8) {
        cie.push(0);
    }
    let mut bytes = (cie.len() as u32).to_le_bytes().to_vec();
    bytes.extend(&cie);
    let mut fde = ((bytes.len() + 4) as u32).to_le_bytes().to_vec();
    fde.extend(start.to_le_bytes());
    fde.extend(range.to_le_bytes());
    fde.push(0);
    fde.extend(after_start);
    while !(fde.len() + 4).is_multiple_of(8) {
        fde.push(0);
    }
    bytes.extend((fde.len() as u32).to_le_bytes());
    bytes.extend(fde);
    bytes
}

fn rows_of(eh_frame: &[u8]) -> BuiltRows {
    build_rows(&FrameSections {
        eh_frame: Some((0, eh_frame)),
        ..FrameSections::default()
    })
}

fn assert_sorted(rows: &[UnwindRow]) {
    if let Some(pair) = rows.windows(2).find(|pair| pair[0].pc >= pair[1].pc) {
        panic!("rows out of order: {pair:?}");
    }
}

/// An FDE whose instructions advance past its own end (a hostile file):
/// its rows stop at its end, so they stay sorted for the kernel's binary
/// search (found by the unwind_rows fuzz target).
#[test]
fn rows_of_an_fde_stop_at_its_end() {
    // DW_CFA_advance_loc4 0x100, DW_CFA_def_cfa_offset 16.
    let built = rows_of(&one_fde(0x1000, 0x10, &[0x04, 0, 1, 0, 0, 0x0e, 16]));
    assert_sorted(&built.rows);
    assert_eq!(built.rows.last().map(|row| row.pc), Some(0x1010));
}

/// An FDE whose end wraps around past 2^64 to a small address is left
/// out, not given rows ending below their start.
#[test]
fn an_fde_whose_end_wraps_around_is_left_out() {
    let built = rows_of(&one_fde(u64::MAX - 0xf, 0x20, &[]));
    assert_eq!((built.fdes, built.fdes_skipped), (0, 1));
    assert!(built.rows.is_empty(), "{:?}", built.rows);
}

/// The fuzz target's input (fuzz/regressions/unwind_rows): libc's
/// `.eh_frame` mutated so that an FDE's instructions fail after its first
/// row replaced the end row of the FDE before it. Taking its rows back
/// restores that end row, so the rows stay sorted.
#[test]
fn rows_stay_sorted_after_an_fde_that_does_not_evaluate() {
    // [eh_frame address][text address][eh_frame length], .eh_frame, then
    // .debug_frame.
    let input = include_bytes!("../../../fuzz/regressions/unwind_rows/rows_out_of_order");
    let eh_frame_address = u64::from_le_bytes(input[..8].try_into().expect("8 bytes"));
    let text_address = u64::from_le_bytes(input[8..16].try_into().expect("8 bytes"));
    let length = u32::from_le_bytes(input[16..20].try_into().expect("4 bytes")) as usize;
    let (eh_frame, debug_frame) = input[20..].split_at(length.min(input.len() - 20));
    let built = build_rows(&FrameSections {
        eh_frame: Some((eh_frame_address, eh_frame)),
        debug_frame: (!debug_frame.is_empty()).then_some(debug_frame),
        text_address,
    });
    assert_sorted(&built.rows);
}
