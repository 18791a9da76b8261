//! The holders scan's side of the runtime seam: what a runtime knows of
//! the memory it manages, asked through [`RuntimeHeap`]. Its own
//! allocator's live objects in memory tracer has no blocks for (CPython's
//! pymalloc pools), found so that a chain goes on through them and the
//! census counts them; and its objects named by type (CPython's by their
//! type's `tp_name`), read from each block's first bytes, with what each
//! type is to ownership. The runtimes are given to [`super::scan`] by the
//! session (`runtimes::heaps`: `runtimes::python::pools` and
//! `runtimes::python::types`); nothing here names one.
use super::{
    blocks::{Block, Blocks},
    memory::MapsLine,
    names::Globals,
    objects::ObjectReader,
};

/// What the scan has read of a process when it asks a runtime.
pub struct ScanContext<'a> {
    pub pid: u32,
    /// Its mappings, split at the ends of modules' data.
    pub regions: &'a [MapsLine],
    /// The symbols of its modules.
    pub globals: &'a Globals,
}

/// A runtime's memory, as the scan reads it.
pub trait RuntimeHeap: Sync {
    /// Finds the runtime's live objects in the anonymous mappings of the
    /// scan's regions outside the `known` blocks and the `skip` ranges
    /// (sorted: a parsed heap), at most `limit` of them.
    fn find(
        &self,
        scan: &ScanContext<'_>,
        known: &Blocks,
        skip: &[(u64, u64)],
        limit: usize,
    ) -> UntracedObjects;

    /// A reader of the runtime's objects for one scan of the process;
    /// none where it does not run the runtime.
    fn objects<'a>(&self, scan: &ScanContext<'a>) -> Option<Box<dyn ObjectReader + 'a>>;
}

/// The live objects a runtime's allocator holds, and what finding them
/// took.
#[derive(Default)]
pub struct UntracedObjects {
    /// Sorted by address, none overlapping a known block.
    pub blocks: Vec<Block>,
    /// The allocator's pieces parsed (pymalloc's pools).
    pub pools: u64,
    /// Headers that looked right whose free list did not agree.
    pub pools_rejected: u64,
    /// Live objects past the cap, not added (their pools stay untraced
    /// memory).
    pub objects_left_out: u64,
    pub bytes_read: u64,
    /// The pieces parsed, (start, end) in address order: their memory
    /// outside live blocks is free blocks and headers.
    pub ranges: Vec<(u64, u64)>,
}

impl UntracedObjects {
    /// What every runtime in `heaps` found, together, at most `limit`
    /// objects in all.
    pub fn of(
        heaps: &[&dyn RuntimeHeap],
        scan: &ScanContext<'_>,
        known: &Blocks,
        skip: &[(u64, u64)],
        limit: usize,
    ) -> UntracedObjects {
        let mut all = UntracedObjects::default();
        for heap in heaps {
            let found = heap.find(scan, known, skip, limit.saturating_sub(all.blocks.len()));
            all.blocks.extend(found.blocks);
            all.pools += found.pools;
            all.pools_rejected += found.pools_rejected;
            all.objects_left_out += found.objects_left_out;
            all.bytes_read += found.bytes_read;
            all.ranges.extend(found.ranges);
        }
        all.blocks.sort_unstable_by_key(|block| block.address);
        all.ranges.sort_unstable();
        all
    }
}
