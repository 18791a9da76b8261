//! The reference walk: each rule on synthetic stacks, then real stacks of
//! this process (through libc's qsort, built without frame pointers; in a
//! signal handler) walked from the registry's tables and compared with
//! framehop's unwind of the same copy.
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::time::Duration;

use tracer_ebpf::{StackCopy, UnwindMapping};

use super::*;
use crate::procfs;
use crate::unwind::registry::{UnwindMapSizes, UnwindTables};

fn row(pc: u32, rule: u8, cfa_offset: u16, rbp_offset_words: i8) -> UnwindRow {
    UnwindRow {
        pc,
        cfa_offset,
        rule,
        rbp_offset_words,
    }
}

fn mappings(list: &[UnwindMapping]) -> UnwindMappings {
    let mut mappings = UnwindMappings {
        count: list.len() as u32,
        ..UnwindMappings::default()
    };
    mappings.mappings[..list.len()].copy_from_slice(list);
    mappings
}

/// Code at 0x7f00_0000_1000..0x7f00_0000_3000 whose object addresses are
/// 0x1000 lower (table 0), frame-pointer code at 0x5000..0x6000.
fn synthetic(rows: &[UnwindRow]) -> (UnwindMappings, Vec<UnwindRow>, Vec<UnwindTable>) {
    let table = UnwindTable {
        first_row: 2,
        row_count: rows.len() as u32,
    };
    // Two rows of another table before, so first_row matters.
    let mut all = vec![row(0, cfa_rule::UNSUPPORTED, 0, 0); 2];
    all.extend_from_slice(rows);
    let list = [
        UnwindMapping {
            start: 0x5000,
            end: 0x6000,
            bias: 0,
            unwind: mapping_unwind::FRAME_POINTERS,
            table: 0,
        },
        UnwindMapping {
            start: 0x7f00_0000_1000,
            end: 0x7f00_0000_3000,
            bias: 0x7f00_0000_1000,
            unwind: mapping_unwind::TABLE,
            table: 0,
        },
    ];
    (mappings(&list), all, vec![table])
}

const CODE: u64 = 0x7f00_0000_1000;

fn memory(words: &[(u64, u64)]) -> impl Fn(u64) -> Option<u64> {
    let words: HashMap<u64, u64> = words.iter().copied().collect();
    move |address| words.get(&address).copied()
}

#[test]
fn rsp_and_rbp_rows_find_callers_and_their_rbp() {
    let rows = [
        row(0x0, cfa_rule::RSP, 8, 0),
        row(0x100, cfa_rule::RSP, 24, -2),
        row(0x200, cfa_rule::RBP, 16, -2),
        row(0x300, cfa_rule::END, 0, 0),
        row(0x400, cfa_rule::NO_INFO, 0, 0),
    ];
    let (mappings, rows, tables) = synthetic(&rows);
    let stack = memory(&[
        // Frame 0 at a function's entry: the return address at sp.
        (0x8000, CODE + 0x150),
        // Frame 1 (rsp + 24): rbp saved at CFA - 16, return at CFA - 8.
        (0x8010, 0x9100),
        (0x8018, CODE + 0x250),
        // Frame 2 (rbp + 16 with rbp 0x9100): rbp at 0x9100.
        (0x9100, 0x9500),
        (0x9108, CODE + 0x310),
    ]);
    let registers = Registers {
        ip: CODE,
        sp: 0x8000,
        bp: 0x1234,
    };
    let (frames, end) = walk(&mappings, &rows, &tables, registers, stack, 16);
    assert_eq!(frames, [CODE, CODE + 0x150, CODE + 0x250, CODE + 0x310]);
    assert_eq!(end, WalkEnd::Outermost);
}

#[test]
fn return_addresses_look_up_the_call_before_them() {
    // The call ends the row at 0x0..0x100 (a noreturn call ending its
    // function): its return address 0x100 is the next row's first byte.
    let rows = [
        row(0x0, cfa_rule::RSP, 16, 0),
        row(0x100, cfa_rule::END, 0, 0),
        row(0x200, cfa_rule::NO_INFO, 0, 0),
    ];
    let (mappings, rows, tables) = synthetic(&rows);
    let stack = memory(&[(0x8008, CODE + 0x100), (0x8018, CODE + 0x150)]);
    let registers = Registers {
        ip: CODE + 0x10,
        sp: 0x8000,
        bp: 0,
    };
    let (frames, end) = walk(&mappings, &rows, &tables, registers, stack, 16);
    // 0x100 - 1 is in the RSP 16 row: one more step, to 0x150 (END).
    assert_eq!(frames, [CODE + 0x10, CODE + 0x100, CODE + 0x150]);
    assert_eq!(end, WalkEnd::Outermost);
    // The first frame is looked up as it is: 0x100 is END.
    let registers = Registers {
        ip: CODE + 0x100,
        ..registers
    };
    let (frames, end) = walk(&mappings, &rows, &tables, registers, |_| None, 16);
    assert_eq!((frames, end), (vec![CODE + 0x100], WalkEnd::Outermost));
}

#[test]
fn plt_rows_add_the_push_after_offset_11() {
    let rows = [
        row(0x0, cfa_rule::PLT, 0, 0),
        row(0x100, cfa_rule::NO_INFO, 0, 0),
    ];
    let (mappings, rows, tables) = synthetic(&rows);
    let stack = memory(&[(0x8000, 0x5100), (0x8008, 0x5200)]);
    for (offset, return_address) in [
        (0x20, 0x5100),
        (0x2a, 0x5100),
        (0x2b, 0x5200),
        (0x2f, 0x5200),
    ] {
        let registers = Registers {
            ip: CODE + offset,
            sp: 0x8000,
            bp: 0,
        };
        let (frames, end) = walk(&mappings, &rows, &tables, registers, &stack, 16);
        // The caller is frame-pointer code with rbp 0: the chain ends.
        assert_eq!(frames, [CODE + offset, return_address], "{offset:#x}");
        assert_eq!(end, WalkEnd::FramePointerChainEnd);
    }
}

#[test]
fn frame_pointers_walk_gaps_other_code_and_pending_tables() {
    let rows = [
        row(0x0, cfa_rule::RSP, 8, 0),
        row(0x100, cfa_rule::NO_INFO, 0, 0),
    ];
    let (mut mappings, rows, tables) = synthetic(&rows);
    let stack = memory(&[
        (0x8008, 0x5100),
        (0x8000, 0x8100),
        (0x8108, 0x1_0000),
        (0x8100, 0x8200),
        (0x8208, CODE + 0x80),
        (0x8200, 0),
        (0x8210, 0x5300),
    ]);
    // NO_INFO (0x180), frame-pointer mapping (0x5100), outside every
    // mapping (0x1_0000), then a table row again (rsp + 8).
    let registers = Registers {
        ip: CODE + 0x180,
        sp: 0x7ff0,
        bp: 0x8000,
    };
    let (frames, end) = walk(&mappings, &rows, &tables, registers, &stack, 16);
    assert_eq!(
        frames,
        [CODE + 0x180, 0x5100, 0x1_0000, CODE + 0x80, 0x5300]
    );
    assert_eq!(end, WalkEnd::FramePointerChainEnd);
    // A pending table: frame pointers too.
    mappings.mappings[1].unwind = mapping_unwind::PENDING;
    let registers = Registers {
        ip: CODE + 0x10,
        ..registers
    };
    let (frames, _) = walk(&mappings, &rows, &tables, registers, &stack, 2);
    assert_eq!(frames, [CODE + 0x10, 0x5100]);
}

#[test]
fn walks_stop_with_their_reason() {
    let rows = [
        row(0x0, cfa_rule::SIGNAL, 0, 0),
        row(0x100, cfa_rule::UNSUPPORTED, 0, 0),
        row(0x200, cfa_rule::RSP, 0, 0),
        row(0x300, cfa_rule::RSP, 8, 0),
        row(0x400, cfa_rule::RSP, 8, -2),
        row(0x500, cfa_rule::NO_INFO, 0, 0),
    ];
    let (mappings, rows, tables) = synthetic(&rows);
    let at = |offset: u64| Registers {
        ip: CODE + offset,
        sp: 0x8000,
        bp: 0x9000,
    };
    let stack = memory(&[(0x8000, CODE + 0x301)]);
    let cases = [
        (at(0x10), 16, WalkEnd::Signal),
        (at(0x110), 16, WalkEnd::Unsupported),
        // CFA = rsp: the stack pointer does not move up.
        (at(0x210), 16, WalkEnd::InvalidStep),
        // rsp + 8 returns to 0x301, then again (same sp + 8 read fails).
        (at(0x310), 16, WalkEnd::ReadFailed),
        (at(0x310), 1, WalkEnd::MaxFrames),
        // The saved rbp at CFA - 16 cannot be read.
        (at(0x410), 16, WalkEnd::ReadFailed),
    ];
    for (registers, max_frames, expected) in cases {
        let (frames, end) = walk(&mappings, &rows, &tables, registers, &stack, max_frames);
        assert_eq!(end, expected, "{registers:x?}: {frames:x?}");
        assert_eq!(frames[0], registers.ip);
        assert!(frames.len() <= max_frames);
    }
    // A table the tables do not have.
    let (frames, end) = walk(&mappings, &rows, &[], at(0x310), &stack, 16);
    assert_eq!((frames.len(), end), (1, WalkEnd::Unsupported));
}

/// What one capture inside the comparator saw: registers, and the thread's
/// stack from the stack pointer up.
pub(crate) struct Captured {
    pub(crate) registers: Registers,
    pub(crate) stack: Vec<u8>,
}

thread_local! {
    pub(crate) static CAPTURED: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

/// Reads this frame's registers and copies the stack above them (the
/// callers' frames stay as they are while this runs).
#[inline(never)]
pub(crate) fn capture() -> Captured {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers, writes nothing else.
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
        );
    }
    let maps = std::fs::read_to_string("/proc/self/maps").expect("own maps");
    let top = maps
        .lines()
        .filter_map(|line| {
            let (start, end) = line.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
            ))
        })
        .find(|(start, end)| (*start..*end).contains(&sp))
        .expect("the stack is mapped")
        .1;
    // SAFETY: from the stack pointer to the top of this thread's stack
    // mapping is this thread's own, mapped stack.
    let stack =
        unsafe { std::slice::from_raw_parts(sp as *const u8, (top - sp) as usize) }.to_vec();
    Captured {
        registers: Registers { ip, sp, bp },
        stack,
    }
}

pub(crate) extern "C" fn compare(a: *const c_void, b: *const c_void) -> c_int {
    CAPTURED.with(|captured| {
        if captured.borrow().is_none() {
            *captured.borrow_mut() = Some(capture());
        }
    });
    // SAFETY: qsort passes pointers to two elements of the i32 array.
    let (a, b) = unsafe { (*a.cast::<i32>(), *b.cast::<i32>()) };
    a.cmp(&b) as c_int
}

/// A capture walked by the reference walk over this process's tables,
/// and unwound by framehop: (frames, why the walk ended, framehop's).
fn walk_both_ways(captured: &Captured) -> (Vec<u64>, WalkEnd, crate::unwind::Unwound) {
    let Captured { registers, stack } = captured;
    let pid = std::process::id();
    let maps = procfs::read_maps(pid).expect("own maps");
    let capacity = UnwindMapSizes {
        rows: 1 << 24,
        tables: 4096,
    };
    let mut tables = UnwindTables::new(capacity, false);
    tables.process_mappings(pid, &maps);
    assert!(tables.wait_for_builds(Duration::from_secs(60)));
    let mappings = tables.process_mappings(pid, &maps);
    assert_eq!(mappings.pending, 0);
    let mut rows = vec![UnwindRow::default(); tables.summary().rows_used as usize];
    let mut placed = Vec::new();
    for ready in tables.take_ready() {
        let first = ready.table.first_row as usize;
        rows[first..first + ready.rows.len()].copy_from_slice(&ready.rows);
        if placed.len() <= ready.id as usize {
            placed.resize(ready.id as usize + 1, UnwindTable::default());
        }
        placed[ready.id as usize] = ready.table;
    }
    let read = |address: u64| {
        let offset = usize::try_from(address.checked_sub(registers.sp)?).ok()?;
        let word = stack.get(offset..offset + 8)?;
        Some(u64::from_le_bytes(word.try_into().ok()?))
    };
    let (frames, end) = walk(&mappings.mappings, &rows, &placed, *registers, read, 127);
    let copy = StackCopy {
        tgid: pid,
        ip: registers.ip,
        sp: registers.sp,
        bp: registers.bp,
        base: registers.sp,
        length: stack.len() as u64,
        reached_top: 1,
        ..StackCopy::default()
    };
    let unwound = crate::unwind::Unwinder::new().unwind(&copy, stack);
    (frames, end, unwound)
}

/// The executable mapping of this process that holds `address`.
fn own_mapping_of(address: u64) -> procfs::Mapping {
    procfs::read_maps(std::process::id())
        .expect("own maps")
        .into_iter()
        .find(|mapping| mapping.contains(address))
        .expect("mapped")
}

#[test]
fn own_stack_through_qsort_walks_as_framehop_unwinds_it() {
    let mut numbers: Vec<i32> = (0..64).rev().collect();
    // SAFETY: a valid array of 64 i32 and a comparator of i32.
    unsafe {
        libc::qsort(numbers.as_mut_ptr().cast(), numbers.len(), 4, Some(compare));
    }
    assert!(numbers.is_sorted());
    let captured = CAPTURED.take().expect("the comparator ran");
    let (frames, end, unwound) = walk_both_ways(&captured);
    assert_eq!(frames, unwound.addresses, "{end:?} vs framehop {unwound:?}");
    // The thread's first frame (clone3's child) ends both.
    assert_eq!(end, WalkEnd::Outermost);
    assert_eq!((unwound.stopped, unwound.truncated), (None, false));
    // Through libc: qsort's frames are in its code.
    let libc = own_mapping_of(libc::qsort as *const () as u64);
    let in_libc = frames.iter().filter(|frame| libc.contains(**frame)).count();
    assert!(in_libc >= 3, "{frames:x?}");
    assert!(frames.len() > 8 && frames.len() < 127, "{frames:x?}");
}

extern "C" fn on_signal(_signal: c_int) {
    CAPTURED.with(|captured| *captured.borrow_mut() = Some(capture()));
}

#[test]
fn own_stack_in_a_signal_handler_stops_at_the_signal_frame() {
    // SAFETY: a handler for SIGUSR2 raised by this thread itself, then
    // the default restored.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as *const () as usize;
        assert_eq!(
            libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()),
            0
        );
        assert_eq!(libc::raise(libc::SIGUSR2), 0);
        libc::signal(libc::SIGUSR2, libc::SIG_DFL);
    }
    let captured = CAPTURED.take().expect("the handler ran");
    let (frames, end, unwound) = walk_both_ways(&captured);
    assert_eq!(end, WalkEnd::Signal, "{frames:x?}");
    // The handler returns into libc's __restore_rt (`mov $15,%rax;
    // syscall`): the walk's last frame.
    let restorer = *frames.last().expect("frames");
    let libc = own_mapping_of(restorer);
    assert!(libc.path.to_string_lossy().contains("libc.so"), "{libc:?}");
    // SAFETY: reads 9 bytes of libc's mapped code.
    let code = unsafe { std::slice::from_raw_parts(restorer as *const u8, 9) };
    assert_eq!(code, [0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05]);
    // framehop agrees up to the handler's return address.
    let before = frames.len() - 1;
    assert_eq!(frames[..before], unwound.addresses[..before], "{unwound:?}");
}
