//! Which page faults a transparent huge page served (`--resident`): the
//! one fault of a huge page makes 2 MiB resident, and the tracepoint
//! cannot tell (it fires before the fault is handled; a kernel probe on
//! the huge-page fault path needs kprobes, which kernels may lack).
//!
//! So, for a write fault that charged a page, the target's page table is
//! read where it is cheap and exact: /proc/PID/pagemap for the fault's
//! 2 MiB-aligned region (one 4 KiB read: 512 entries) tells whether all
//! 512 pages are present on 512 consecutive frames, and /proc/kpageflags
//! whether the first frame belongs to a transparent huge page. Only the
//! first charged fault of a region is checked: a region found mapped by
//! small pages is remembered (until it is given back), as later faults in
//! it cannot be served by a huge page. Smaller multi-size huge pages
//! count as their faulted 4 KiB page. Nothing is read when huge pages are
//! off (`/sys/kernel/mm/transparent_hugepage/enabled`: never).
use std::{
    collections::{HashMap, HashSet},
    fs::File,
    os::unix::fs::FileExt as _,
};

/// A PMD-mapped huge page on x86-64.
pub const HUGE_PAGE_BYTES: u64 = 2 << 20;
const PAGES: usize = (HUGE_PAGE_BYTES / 4096) as usize;
const PRESENT: u64 = 1 << 63;
const PFN_MASK: u64 = (1 << 55) - 1;
/// `KPF_THP` in /proc/kpageflags.
const KPF_THP: u64 = 1 << 22;

pub struct HugePages {
    /// None: huge pages are off, or the frames cannot be read.
    kpageflags: Option<File>,
    pagemaps: HashMap<u32, File>,
    /// 2 MiB regions found mapped by small pages, by process.
    small: HashMap<u32, HashSet<u64>>,
    /// Faults found served by a huge page.
    pub found: u64,
}

impl HugePages {
    pub fn new() -> HugePages {
        let enabled = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|modes| !modes.contains("[never]"));
        HugePages {
            kpageflags: enabled
                .then(|| File::open("/proc/kpageflags").ok())
                .flatten(),
            pagemaps: HashMap::new(),
            small: HashMap::new(),
            found: 0,
        }
    }

    /// Whether the write fault at `address` of `pid`, which charged its
    /// page, was served by a transparent huge page; None while its page is
    /// not in the page table yet (the event is read while the kernel may
    /// still be handling the fault: zeroing 2 MiB, or compacting memory
    /// for it): ask again later.
    pub fn served_by_huge_page(&mut self, pid: u32, address: u64) -> Option<bool> {
        let Some(kpageflags) = &self.kpageflags else {
            return Some(false);
        };
        let region = address & !(HUGE_PAGE_BYTES - 1);
        let small = self.small.entry(pid).or_default();
        if small.contains(&region) {
            return Some(false);
        }
        let pagemap = match self.pagemaps.entry(pid) {
            std::collections::hash_map::Entry::Occupied(open) => open.into_mut(),
            std::collections::hash_map::Entry::Vacant(vacant) => {
                match File::open(format!("/proc/{pid}/pagemap")) {
                    Ok(file) => vacant.insert(file),
                    Err(_) => return Some(false),
                }
            }
        };
        let mut bytes = [0u8; PAGES * 8];
        if pagemap
            .read_exact_at(&mut bytes, region / 4096 * 8)
            .is_err()
        {
            return Some(false);
        }
        let entry = |index: usize| {
            u64::from_ne_bytes(
                bytes[index * 8..index * 8 + 8]
                    .try_into()
                    .unwrap_or_default(),
            )
        };
        if entry(((address - region) / 4096) as usize) & PRESENT == 0 {
            return None;
        }
        let first = entry(0);
        let frame = first & PFN_MASK;
        let contiguous = first & PRESENT != 0
            && frame != 0
            && (1..PAGES).all(|index| {
                let page = entry(index);
                page & PRESENT != 0 && page & PFN_MASK == frame + index as u64
            });
        let mut flags = [0u8; 8];
        let huge = contiguous
            && kpageflags.read_exact_at(&mut flags, frame * 8).is_ok()
            && u64::from_ne_bytes(flags) & KPF_THP != 0;
        if huge {
            self.found += 1;
        } else {
            small.insert(region);
        }
        Some(huge)
    }

    /// `[start, end)` of `pid` was given back: its regions may be served
    /// by huge pages when touched again.
    pub fn release(&mut self, pid: u32, start: u64, end: u64) {
        if let Some(small) = self.small.get_mut(&pid) {
            small.retain(|&region| region + HUGE_PAGE_BYTES <= start || region >= end);
        }
    }

    pub fn forget(&mut self, pid: u32) {
        self.pagemaps.remove(&pid);
        self.small.remove(&pid);
    }
}
