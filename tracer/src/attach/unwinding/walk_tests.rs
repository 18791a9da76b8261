//! The kernel's walk (`tracer-ebpf/src/unwind.rs`) composed from the same
//! decisions it makes (`tracer_ebpf::unwind_walk`), on a real stack of
//! this process through libc's qsort (no frame pointers) with the
//! registry's tables, against the reference walk (`unwind::walk`).
use std::time::Duration;

use tracer_ebpf::{
    UNWIND_ROW_SEARCH_STEPS, UnwindMappings, UnwindRow, UnwindTable, mapping_unwind,
    unwind_walk::{
        PlainBounds, Registers, Step, find_mapping, last_at_or_below, step_by_frame_pointer,
        step_by_row,
    },
};

use crate::{
    procfs,
    unwind::{
        registry::{UnwindMapSizes, UnwindTables},
        walk::{
            self,
            tests::{CAPTURED, Captured, compare},
        },
    },
};

/// What `step_of` in tracer-ebpf/src/unwind.rs decides, over slices.
fn kernel_step(
    mappings: &UnwindMappings,
    rows: &[UnwindRow],
    tables: &[UnwindTable],
    regs: Registers,
    read: impl Fn(u64) -> Option<u64>,
) -> Step {
    let address = regs.lookup_address();
    let mut bounds = PlainBounds::default();
    let Some(index) = find_mapping(&mut bounds, &mappings.mappings, mappings.count, address) else {
        return step_by_frame_pointer(regs, read);
    };
    let mapping = &mappings.mappings[index];
    if mapping.unwind != mapping_unwind::TABLE {
        return step_by_frame_pointer(regs, read);
    }
    let Some(table) = tables.get(mapping.table as usize) else {
        return Step::Stop(tracer_ebpf::stat::UNWIND_STOP_UNSUPPORTED);
    };
    let pc = address.wrapping_sub(mapping.bias);
    let row_at = |index: u32| rows.get((table.first_row + index) as usize);
    let found = last_at_or_below(
        &mut bounds,
        table.row_count,
        UNWIND_ROW_SEARCH_STEPS + 1,
        pc,
        |index| row_at(index).map(|row| u64::from(row.pc)),
    );
    match found.and_then(row_at) {
        Some(row) => step_by_row(row, regs, read),
        None => step_by_frame_pointer(regs, read),
    }
}

fn kernel_walk(
    mappings: &UnwindMappings,
    rows: &[UnwindRow],
    tables: &[UnwindTable],
    mut regs: Registers,
    read: impl Fn(u64) -> Option<u64> + Copy,
) -> (Vec<u64>, Step) {
    let mut frames = vec![regs.ip];
    loop {
        match kernel_step(mappings, rows, tables, regs, read) {
            Step::Caller(next) if frames.len() < tracer_ebpf::MAX_STACK_FRAMES => {
                frames.push(next.ip);
                regs = next;
            }
            step => return (frames, step),
        }
    }
}

#[test]
fn kernel_walk_takes_the_reference_walks_frames_through_qsort() {
    let mut numbers: Vec<i32> = (0..64).rev().collect();
    // SAFETY: a valid array of 64 i32 and a comparator of i32.
    unsafe {
        libc::qsort(numbers.as_mut_ptr().cast(), numbers.len(), 4, Some(compare));
    }
    let Captured { registers, stack } = CAPTURED.take().expect("the comparator ran");
    let pid = std::process::id();
    let maps = procfs::read_maps(pid).expect("own maps");
    for trust_frame_pointers in [false, true] {
        let capacity = UnwindMapSizes {
            rows: 1 << 24,
            tables: 4096,
        };
        let mut tables = UnwindTables::new(capacity, trust_frame_pointers);
        tables.process_mappings(pid, &maps);
        assert!(tables.wait_for_builds(Duration::from_secs(60)));
        let mappings = tables.process_mappings(pid, &maps);
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
        let kernel_registers = Registers {
            ip: registers.ip,
            sp: registers.sp,
            bp: registers.bp,
        };
        let (kernel, step) =
            kernel_walk(&mappings.mappings, &rows, &placed, kernel_registers, read);
        let reference = walk::walk(
            &mappings.mappings,
            &rows,
            &placed,
            registers,
            read,
            tracer_ebpf::MAX_STACK_FRAMES,
        );
        assert_eq!(kernel, reference.0, "{step:?} vs {:?}", reference.1);
        assert_eq!(step, Step::End, "{kernel:x?}");
        assert!(kernel.len() > 8, "{kernel:x?}");
    }
}
