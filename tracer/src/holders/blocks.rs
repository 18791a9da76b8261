//! The traced live blocks of one process, sorted by address, and the
//! lookup of the block an address points into (start or interior).
use super::index::PageIndex;
use crate::model::{Kind, StackId, StackKey};

/// sizeof(PyGC_Head), the collector's header before a tracked object.
pub const GC_HEAD_BYTES: u64 = 16;

/// No type known.
pub const NO_TYPE: u32 = u32::MAX;

/// Where a block the scan adds, one tracer has no block for, was found:
/// its key has pid 0 (no process a scan reads, so it is counted under no
/// stack) and the origin's number as its stack id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    /// A live block of a pymalloc pool, found from the pool's header.
    PymallocObject = 1,
    /// An in-use chunk of a glibc malloc arena.
    HeapChunk = 2,
    /// A chunk glibc's malloc mapped on its own (a large block).
    MmappedChunk = 3,
}

impl Origin {
    /// The key of an untraced block found there.
    pub const fn key(self) -> StackKey {
        StackKey {
            pid: 0,
            stack_id: StackId::Kernel(self as u32),
            kind: Kind::Heap,
        }
    }

    /// What a report calls such memory.
    pub fn name(self) -> &'static str {
        match self {
            Origin::PymallocObject => "untraced pymalloc memory",
            Origin::HeapChunk => "untraced heap chunk",
            Origin::MmappedChunk => "untraced mmapped chunk",
        }
    }
}

/// What the scan knows of one block's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Its type or class, in `objects::Shapes::names`.
    pub type_id: u32,
    /// Where the object starts in the block.
    pub object_offset: u8,
    /// A `PyGC_Head` lies right before the object.
    pub gc_head: bool,
    /// A CPython weak reference: its `wr_object` (WEAK_REFERENT past the
    /// object's start) keeps nothing alive.
    pub weak_reference: bool,
}

/// The offset of `wr_object` in a `PyWeakReference`, after the object's
/// refcount and type.
pub const WEAK_REFERENT: u64 = 16;

impl Default for Shape {
    fn default() -> Shape {
        Shape {
            type_id: NO_TYPE,
            object_offset: 0,
            gc_head: false,
            weak_reference: false,
        }
    }
}

/// One traced live block: what LIVE knows of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    /// The stack (canonical id) and kind it is counted under.
    pub key: StackKey,
}

impl Block {
    /// An untraced block found at `origin`.
    pub fn untraced(address: u64, size: u64, origin: Origin) -> Block {
        Block {
            address,
            size,
            key: origin.key(),
        }
    }

    /// Where an untraced block was found (None for a traced one).
    pub fn origin(&self) -> Option<Origin> {
        if self.key.pid != 0 {
            return None;
        }
        match self.key.stack_id {
            StackId::Kernel(1) => Some(Origin::PymallocObject),
            StackId::Kernel(2) => Some(Origin::HeapChunk),
            StackId::Kernel(3) => Some(Origin::MmappedChunk),
            _ => None,
        }
    }

    pub fn end(&self) -> u64 {
        self.address.saturating_add(self.size)
    }
}

/// Where a pointer lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    /// Index of the block in `Blocks`.
    pub block: u32,
    /// The pointer is not the block's start (nor, for a Python object
    /// behind a collector header, the object's).
    pub interior: bool,
    /// It points into a Python object's collector header: a link of the
    /// collector's lists, no reference.
    pub gc_link: bool,
}

/// The blocks, sorted by start; overlapping entries (a stale LIVE entry
/// under a block that reuses its memory) keep the later start only.
pub struct Blocks {
    blocks: Vec<Block>,
    low: u64,
    high: u64,
    /// Entries left out because they overlapped the previous block.
    pub overlapping: u64,
    /// What each block holds at its start, once read (empty before).
    shapes: Vec<Shape>,
    index: PageIndex,
}

impl Blocks {
    pub fn new(mut blocks: Vec<Block>) -> Blocks {
        blocks.retain(|block| block.size > 0);
        blocks.sort_unstable_by_key(|block| block.address);
        let mut kept: Vec<Block> = Vec::with_capacity(blocks.len());
        let mut overlapping = 0;
        for block in blocks {
            match kept.last() {
                Some(last) if last.end() > block.address => overlapping += 1,
                _ => kept.push(block),
            }
        }
        let low = kept.first().map_or(u64::MAX, |block| block.address);
        let high = kept.iter().map(Block::end).max().unwrap_or(0);
        Blocks {
            index: PageIndex::new(&kept),
            blocks: kept,
            low,
            high,
            overlapping,
            shapes: Vec::new(),
        }
    }

    /// These blocks and `more`, which overlap none of them.
    pub fn with(self, more: Vec<Block>) -> Blocks {
        let overlapping = self.overlapping;
        let mut all = self.blocks;
        all.extend(more);
        let mut blocks = Blocks::new(all);
        blocks.overlapping += overlapping;
        blocks
    }

    /// Sets what each block holds at its start, one shape per block.
    pub fn set_shapes(&mut self, shapes: Vec<Shape>) {
        debug_assert_eq!(shapes.len(), self.blocks.len());
        self.shapes = shapes;
    }

    pub fn shape(&self, index: u32) -> Shape {
        self.shapes.get(index as usize).copied().unwrap_or_default()
    }

    /// Where the referent of weak reference `index` lies, if it is one.
    #[inline]
    pub fn weak_referent_word(&self, index: u32) -> Option<u64> {
        let shape = self.shapes.get(index as usize)?;
        shape.weak_reference.then(|| {
            self.blocks[index as usize].address + shape.object_offset as u64 + WEAK_REFERENT
        })
    }

    /// The collector header of block `index` (a Python object's), if any.
    #[inline]
    pub fn gc_head(&self, index: u32) -> Option<std::ops::Range<u64>> {
        let shape = self.shapes.get(index as usize)?;
        shape.gc_head.then(|| {
            let object = self.blocks[index as usize].address + shape.object_offset as u64;
            object - GC_HEAD_BYTES..object
        })
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Tracer memory its page index takes.
    pub fn index_bytes(&self) -> usize {
        self.index.bytes()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    pub fn get(&self, index: u32) -> &Block {
        &self.blocks[index as usize]
    }

    /// Block `index`, None for a root's node number.
    pub fn get_checked(&self, index: u32) -> Option<&Block> {
        self.blocks.get(index as usize)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Block> {
        self.blocks.iter()
    }

    /// The block `value` points into, if any.
    #[inline]
    pub fn find(&self, value: u64) -> Option<Hit> {
        if value < self.low || value >= self.high {
            return None;
        }
        let index = self.index.find(&self.blocks, value)?;
        let block = &self.blocks[index];
        let start = block.address + self.shape(index as u32).object_offset as u64;
        Some(Hit {
            block: index as u32,
            interior: value != block.address && value != start,
            gc_link: self
                .gc_head(index as u32)
                .is_some_and(|head| head.contains(&value)),
        })
    }

    /// The index of the first block that ends after `address` (blocks are
    /// disjoint, so their ends are sorted too).
    pub fn first_ending_after(&self, address: u64) -> usize {
        self.blocks.partition_point(|block| block.end() <= address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Kind, StackId};

    fn block(address: u64, size: u64) -> Block {
        Block {
            address,
            size,
            key: StackKey {
                pid: 1,
                stack_id: StackId::Kernel(1),
                kind: Kind::Heap,
            },
        }
    }

    #[test]
    fn finds_starts_and_interiors_and_nothing_between() {
        let blocks = Blocks::new(vec![block(0x2000, 0x10), block(0x1000, 0x20)]);
        assert_eq!(
            blocks.find(0x1000),
            Some(Hit {
                block: 0,
                interior: false,
                gc_link: false
            })
        );
        assert_eq!(
            blocks.find(0x101f),
            Some(Hit {
                block: 0,
                interior: true,
                gc_link: false
            })
        );
        assert_eq!(blocks.find(0x1020), None);
        assert_eq!(blocks.find(0xfff), None);
        assert_eq!(
            blocks.find(0x2008),
            Some(Hit {
                block: 1,
                interior: true,
                gc_link: false
            })
        );
        assert_eq!(blocks.find(0x2010), None);
        assert_eq!(blocks.first_ending_after(0x1020), 1);
    }

    #[test]
    fn a_python_object_behind_its_collector_header_is_its_block_start() {
        let mut blocks = Blocks::new(vec![block(0x1000, 0x40)]);
        blocks.set_shapes(vec![Shape {
            type_id: 0,
            object_offset: 16,
            gc_head: true,
            weak_reference: false,
        }]);
        let hit = |value| blocks.find(value).map(|hit| (hit.interior, hit.gc_link));
        assert_eq!(hit(0x1010), Some((false, false)), "the object");
        assert_eq!(hit(0x1000), Some((false, true)), "the header: a link");
        assert_eq!(hit(0x1001), Some((true, true)), "gc_prev, flag bits set");
        assert_eq!(hit(0x1018), Some((true, false)));
        assert_eq!(blocks.gc_head(0), Some(0x1000..0x1010));
    }

    #[test]
    fn overlapping_entries_are_counted_and_left_out() {
        let blocks = Blocks::new(vec![block(0x1000, 0x100), block(0x1010, 0x10)]);
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks.overlapping, 1);
    }
}
