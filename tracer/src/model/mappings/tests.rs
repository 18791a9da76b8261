use super::*;

const PID: u32 = 7;
const KIB: u64 = 1024;

fn mmap(address: u64, length: u64, stack_id: u32) -> (MappingEvent, StackId) {
    let event = MappingEvent {
        tgid: PID,
        call: mapping_call::MMAP,
        length,
        prot: 3,
        flags: 0x22,
        fd: u64::MAX,
        result: address,
        ..MappingEvent::default()
    };
    (event, StackId::Mapping(stack_id))
}

fn call(call: u32, address: u64, length: u64) -> MappingEvent {
    MappingEvent {
        tgid: PID,
        call,
        address,
        length,
        ..MappingEvent::default()
    }
}

fn mremap(old: u64, old_length: u64, new: u64, new_length: u64) -> MappingEvent {
    MappingEvent {
        new_length,
        result: new,
        ..call(mapping_call::MREMAP, old, old_length)
    }
}

fn apply(ledger: &mut MappingLedger, (event, stack_id): (MappingEvent, StackId)) {
    ledger.apply(&event, stack_id);
}

/// Live bytes and pieces of one stack and kind.
fn live(ledger: &MappingLedger, stack_id: u32, kind: Kind) -> (i64, i64) {
    let key = StackKey {
        pid: PID,
        stack_id: StackId::Mapping(stack_id),
        kind,
    };
    ledger
        .counters()
        .find(|(k, _)| *k == key)
        .map_or((0, 0), |(_, c)| (c.live_bytes, c.live_allocs))
}

#[test]
fn partial_unmaps_cut_head_tail_and_middle() {
    let mut ledger = MappingLedger::default();
    apply(&mut ledger, mmap(0x10_0000, 1024 * KIB, 1));
    ledger.apply(
        &call(mapping_call::MUNMAP, 0x10_0000, 768 * KIB),
        StackId::Lost,
    );
    assert_eq!(live(&ledger, 1, Kind::MmapAnon), (256 * KIB as i64, 1));
    apply(&mut ledger, mmap(0x100_0000, 64 * KIB, 2));
    ledger.apply(
        &call(mapping_call::MUNMAP, 0x100_4000, 16 * KIB),
        StackId::Lost,
    );
    assert_eq!(live(&ledger, 2, Kind::MmapAnon), (48 * KIB as i64, 2));
    ledger.apply(
        &call(mapping_call::MUNMAP, 0x100_0000, 4 * KIB),
        StackId::Lost,
    );
    ledger.apply(&call(mapping_call::MUNMAP, 0x100_f000, 5000), StackId::Lost);
    assert_eq!(live(&ledger, 2, Kind::MmapAnon), (40 * KIB as i64, 2));
    // One munmap over several mappings and the holes between them.
    ledger.apply(&call(mapping_call::MUNMAP, 0, 1 << 40), StackId::Lost);
    assert_eq!(live(&ledger, 1, Kind::MmapAnon), (0, 0));
    assert_eq!(live(&ledger, 2, Kind::MmapAnon), (0, 0));
}

#[test]
fn map_fixed_replaces_what_was_there() {
    let mut ledger = MappingLedger::default();
    apply(&mut ledger, mmap(0x10_0000, 64 * KIB, 1));
    apply(&mut ledger, mmap(0x10_4000, 16 * KIB, 2));
    assert_eq!(live(&ledger, 1, Kind::MmapAnon), (48 * KIB as i64, 2));
    assert_eq!(live(&ledger, 2, Kind::MmapAnon), (16 * KIB as i64, 1));
}

#[test]
fn mremap_grows_shrinks_and_moves_with_its_stack() {
    let mut ledger = MappingLedger::default();
    apply(&mut ledger, mmap(0x10_0000, 64 * KIB, 1));
    ledger.apply(
        &mremap(0x10_0000, 64 * KIB, 0x10_0000, 128 * KIB),
        StackId::Mapping(9),
    );
    assert_eq!(live(&ledger, 1, Kind::MmapAnon), (128 * KIB as i64, 2));
    ledger.apply(
        &mremap(0x10_0000, 128 * KIB, 0x80_0000, 32 * KIB),
        StackId::Mapping(9),
    );
    assert_eq!(live(&ledger, 1, Kind::MmapAnon), (32 * KIB as i64, 1));
    assert_eq!(ledger.pieces(PID)[0].start, 0x80_0000);
    ledger.apply(
        &call(mapping_call::MUNMAP, 0x80_0000, 32 * KIB),
        StackId::Lost,
    );
    assert_eq!(live(&ledger, 1, Kind::MmapAnon), (0, 0));
    assert_eq!(live(&ledger, 9, Kind::MmapAnon), (0, 0));
    // A mapping made before attach stays unknown when moved.
    ledger.apply(
        &mremap(0x50_0000, 8 * KIB, 0x60_0000, 16 * KIB),
        StackId::Mapping(9),
    );
    assert!(ledger.pieces(PID).is_empty());
}

#[test]
fn allocator_mappings_are_not_counted_but_their_removals_apply() {
    let mut ledger = MappingLedger::default();
    let (mut event, stack) = mmap(0x10_0000, 512 * KIB, 1);
    event.in_allocator = 1;
    ledger.apply(&event, stack);
    assert!(ledger.counters().all(|(_, c)| c.live_bytes == 0));
    apply(&mut ledger, mmap(0x20_0000, 8 * KIB, 2));
    let mut unmap = call(mapping_call::MUNMAP, 0x20_0000, 8 * KIB);
    unmap.in_allocator = 1;
    ledger.apply(&unmap, StackId::Lost);
    assert_eq!(live(&ledger, 2, Kind::MmapAnon), (0, 0));
}

#[test]
fn reservations_become_usable_through_mprotect_and_back() {
    let mut ledger = MappingLedger::default();
    let (mut reserve, stack) = mmap(0x10_0000, 1024 * KIB, 1);
    reserve.prot = PROT_NONE;
    ledger.apply(&reserve, stack);
    assert_eq!(live(&ledger, 1, Kind::MmapReserved).0, 1024 * KIB as i64);
    let mut usable = call(mapping_call::MPROTECT, 0x10_0000, 256 * KIB);
    usable.prot = 3;
    ledger.apply(&usable, StackId::Lost);
    assert_eq!(live(&ledger, 1, Kind::MmapAnon), (256 * KIB as i64, 1));
    assert_eq!(live(&ledger, 1, Kind::MmapReserved), (768 * KIB as i64, 1));
    let mut back = call(mapping_call::MPROTECT, 0x10_0000, 1024 * KIB);
    back.prot = PROT_NONE;
    ledger.apply(&back, StackId::Lost);
    assert_eq!(live(&ledger, 1, Kind::MmapAnon), (0, 0));
    assert_eq!(live(&ledger, 1, Kind::MmapReserved).0, 1024 * KIB as i64);
    // A thread stack stays reserved when its usable part is opened.
    let (mut stack_mapping, stack) = mmap(0x100_0000, 8192 * KIB, 2);
    stack_mapping.flags |= MAP_STACK;
    stack_mapping.prot = PROT_NONE;
    ledger.apply(&stack_mapping, stack);
    let mut open = call(mapping_call::MPROTECT, 0x100_1000, 8188 * KIB);
    open.prot = 3;
    ledger.apply(&open, StackId::Lost);
    assert_eq!(live(&ledger, 2, Kind::MmapReserved).0, 8192 * KIB as i64);
    assert_eq!(live(&ledger, 2, Kind::MmapAnon), (0, 0));
}

#[test]
fn file_mappings_are_their_own_kind() {
    let mut ledger = MappingLedger::default();
    let (mut event, stack) = mmap(0x10_0000, 10_000, 3);
    event.flags = 0x2;
    event.fd = 5;
    ledger.apply(&event, stack);
    assert_eq!(live(&ledger, 3, Kind::MmapFile), (12288, 1));
    assert_eq!(live(&ledger, 3, Kind::MmapAnon), (0, 0));
}

#[test]
fn brk_growth_counts_outside_the_allocator_only() {
    let mut ledger = MappingLedger::default();
    let brk = |result, in_allocator| MappingEvent {
        tgid: PID,
        call: mapping_call::BRK,
        result,
        in_allocator,
        ..MappingEvent::default()
    };
    ledger.apply(&brk(0x10_0000, 1), StackId::Mapping(4));
    ledger.apply(&brk(0x12_0000, 1), StackId::Mapping(4));
    ledger.apply(&brk(0x12_8000, 0), StackId::Mapping(5));
    assert_eq!(live(&ledger, 5, Kind::HeapBrk), (0x8000, 1));
    assert_eq!(live(&ledger, 4, Kind::HeapBrk), (0, 0));
    ledger.apply(&brk(0x12_4000, 1), StackId::Mapping(4));
    assert_eq!(live(&ledger, 5, Kind::HeapBrk), (0x4000, 1));
}

/// Random mmap, munmap, mremap and MAP_FIXED calls against a page-by-page
/// reference: the live bytes of every stack always match.
#[test]
fn matches_a_page_by_page_reference() {
    const PAGES: u64 = 512;
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    };
    let mut ledger = MappingLedger::default();
    let mut reference = vec![None::<u32>; PAGES as usize];
    for step in 0..10_000 {
        let start = next(PAGES);
        let pages = (1 + next(24)).min(PAGES - start);
        let address = start * PAGE_SIZE;
        match next(3) {
            0 => {
                let stack_id = next(5) as u32;
                apply(&mut ledger, mmap(address, pages * PAGE_SIZE, stack_id));
                reference[start as usize..(start + pages) as usize].fill(Some(stack_id));
            }
            1 => {
                ledger.apply(
                    &call(mapping_call::MUNMAP, address, pages * PAGE_SIZE),
                    StackId::Lost,
                );
                reference[start as usize..(start + pages) as usize].fill(None);
            }
            _ => {
                let new_start = next(PAGES);
                let new_pages = (1 + next(24)).min(PAGES - new_start);
                let old: Vec<_> = reference[start as usize..(start + pages) as usize].to_vec();
                ledger.apply(
                    &mremap(
                        address,
                        pages * PAGE_SIZE,
                        new_start * PAGE_SIZE,
                        new_pages * PAGE_SIZE,
                    ),
                    StackId::Mapping(99),
                );
                reference[start as usize..(start + pages) as usize].fill(None);
                reference[new_start as usize..(new_start + new_pages) as usize].fill(None);
                for page in 0..new_pages {
                    let value = if page < pages {
                        old[page as usize]
                    } else {
                        // Grown pages follow the piece that ended at the end.
                        old[pages as usize - 1]
                    };
                    reference[(new_start + page) as usize] = value;
                }
            }
        }
        for stack_id in 0..5 {
            let expected = reference.iter().filter(|v| **v == Some(stack_id)).count() as i64;
            assert_eq!(
                live(&ledger, stack_id, Kind::MmapAnon).0,
                expected * PAGE_SIZE as i64,
                "step {step}, stack {stack_id}"
            );
        }
        let pieces: i64 = (0..5).map(|id| live(&ledger, id, Kind::MmapAnon).1).sum();
        assert_eq!(pieces, ledger.pieces(PID).len() as i64, "step {step}");
    }
}
