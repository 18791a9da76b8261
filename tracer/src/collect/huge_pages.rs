//! Which page faults a transparent huge page served (`--resident`): the
//! one fault of a huge page makes 2 MiB resident, and the tracepoint
//! cannot tell (it fires before the fault is handled; a kernel probe on
//! the huge-page fault path needs kprobes, which kernels may lack).
//!
//! So, for a write fault that charged a page where a huge page may be,
//! the target's page table is read: /proc/PID/pagemap gives the fault's
//! frame and /proc/kpageflags whether it belongs to a transparent huge
//! page, and then whether the first and last pages of its 2 MiB region
//! are 511 frames apart (a PMD-mapped one; smaller multi-size huge pages
//! count as their faulted 4 KiB page). Each read of pagemap takes the
//! target's mmap lock for a moment, so they are few: only where the
//! policy (`/sys/kernel/mm/transparent_hugepage/enabled`) gives huge
//! pages (every range with `always`, the ranges advised MADV_HUGEPAGE
//! with `madvise`, none with `never`), and once per region: a region found
//! mapped by small pages is remembered (until it is given back), as later
//! faults in it cannot be served by a huge page.
use std::{
    collections::{HashMap, HashSet},
    fs::File,
    os::unix::fs::FileExt as _,
};

use crate::model::ranges::RangeMap;

/// A PMD-mapped huge page on x86-64.
pub const HUGE_PAGE_BYTES: u64 = 2 << 20;
const PAGES: usize = (HUGE_PAGE_BYTES / 4096) as usize;
const PRESENT: u64 = 1 << 63;
const PFN_MASK: u64 = (1 << 55) - 1;
/// `KPF_THP` in /proc/kpageflags.
const KPF_THP: u64 = 1 << 22;

/// When the kernel gives transparent huge pages
/// (/sys/kernel/mm/transparent_hugepage/enabled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    Never,
    /// Only in ranges advised MADV_HUGEPAGE.
    Madvise,
    Always,
}

pub struct HugePages {
    policy: Policy,
    /// None: huge pages are off, or the frames cannot be read.
    kpageflags: Option<File>,
    pagemaps: HashMap<u32, File>,
    /// 2 MiB regions found mapped by small pages, by process.
    small: HashMap<u32, HashSet<u64>>,
    /// Ranges advised MADV_HUGEPAGE (`Policy::Madvise`), by process.
    advised: HashMap<u32, RangeMap<()>>,
    /// Faults found served by a huge page.
    pub found: u64,
}

impl HugePages {
    pub fn new() -> HugePages {
        let modes = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        let policy = if modes.contains("[always]") {
            Policy::Always
        } else if modes.contains("[madvise]") {
            Policy::Madvise
        } else {
            Policy::Never
        };
        let kpageflags = (policy != Policy::Never)
            .then(|| File::open("/proc/kpageflags").ok())
            .flatten();
        if kpageflags.is_none() {
            eprintln!(
                "tracer: note: --resident: transparent huge pages are off, or their frames \
                 cannot be read (/proc/kpageflags): a huge page would count as its faulted \
                 4 KiB page"
            );
        }
        HugePages {
            policy,
            kpageflags,
            pagemaps: HashMap::new(),
            small: HashMap::new(),
            advised: HashMap::new(),
            found: 0,
        }
    }

    /// madvise(MADV_HUGEPAGE) (`on`) or MADV_NOHUGEPAGE of `[start, end)`.
    pub fn advise(&mut self, pid: u32, start: u64, end: u64, on: bool) {
        let advised = self.advised.entry(pid).or_default();
        advised.remove(start, end);
        if on {
            advised.insert_merging(start, end, ());
        }
    }

    /// Whether the write fault at `address` of `pid`, which charged its
    /// page, was served by a transparent huge page; None while its page is
    /// not in the page table yet (the event is read while the kernel may
    /// still be handling the fault: zeroing 2 MiB, or compacting memory
    /// for it): ask again later. Reads the page table only where a huge
    /// page may be (every anonymous range with the `always` policy, the
    /// ranges advised MADV_HUGEPAGE with `madvise`), once per region: the
    /// fault's entry and its frame's flags, then (a huge frame) the
    /// region's first and last entries, which must be 511 frames apart.
    pub fn served_by_huge_page(&mut self, pid: u32, address: u64) -> Option<bool> {
        let Some(kpageflags) = &self.kpageflags else {
            return Some(false);
        };
        let region = address & !(HUGE_PAGE_BYTES - 1);
        if self.policy == Policy::Madvise
            && self.advised.get(&pid).is_none_or(|advised| {
                advised
                    .overlapping(region, region + HUGE_PAGE_BYTES)
                    .first()
                    .is_none_or(|piece| {
                        piece.start > region || piece.end < region + HUGE_PAGE_BYTES
                    })
            })
        {
            return Some(false);
        }
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
        let entry = |page: u64| -> Option<u64> {
            let mut bytes = [0u8; 8];
            pagemap
                .read_exact_at(&mut bytes, page / 4096 * 8)
                .ok()
                .map(|()| u64::from_ne_bytes(bytes))
        };
        let faulted = entry(address)?;
        if faulted & PRESENT == 0 {
            return None;
        }
        let flags = |frame: u64| -> u64 {
            let mut bytes = [0u8; 8];
            kpageflags
                .read_exact_at(&mut bytes, frame * 8)
                .map_or(0, |()| u64::from_ne_bytes(bytes))
        };
        let huge = flags(faulted & PFN_MASK) & KPF_THP != 0
            && match (entry(region), entry(region + HUGE_PAGE_BYTES - 4096)) {
                (Some(first), Some(last)) => {
                    first & last & PRESENT != 0
                        && (last & PFN_MASK).wrapping_sub(first & PFN_MASK) == PAGES as u64 - 1
                }
                _ => false,
            };
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
            if small.is_empty() {
                return;
            }
            let first = start & !(HUGE_PAGE_BYTES - 1);
            if end.saturating_sub(first) / HUGE_PAGE_BYTES < small.len() as u64 {
                let mut region = first;
                while region < end {
                    small.remove(&region);
                    region += HUGE_PAGE_BYTES;
                }
            } else {
                small.retain(|&region| region + HUGE_PAGE_BYTES <= start || region >= end);
            }
        }
    }

    pub fn forget(&mut self, pid: u32) {
        self.pagemaps.remove(&pid);
        self.small.remove(&pid);
        self.advised.remove(&pid);
    }
}
