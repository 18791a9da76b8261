//! The blocks of one process (traced, and those the scan found tracer has
//! no record of), sorted by address, and the lookup of the block an
//! address points into (start or interior).
use std::collections::HashMap;

use super::index::{Extent, PageIndex};
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

/// Shape bits: the object's offset in sixteens (two bits), a collector
/// header before it, a weak reference.
const OFFSET_MASK: u8 = 0b11;
const GC_HEAD: u8 = 1 << 2;
const WEAK: u8 = 1 << 3;

/// The blocks, sorted by start; overlapping entries (a stale LIVE entry
/// under a block that reuses its memory) keep the earlier start only.
/// Stored apart, to take about 25 bytes a block: where it lies, its key
/// (an index into the distinct keys), its type and its shape's bits.
pub struct Blocks {
    extents: Vec<Extent>,
    keys: Vec<u32>,
    key_table: Vec<StackKey>,
    low: u64,
    high: u64,
    /// Entries left out because they overlapped the previous block.
    pub overlapping: u64,
    /// What each block holds at its start, once read (empty before).
    types: Vec<u32>,
    bits: Vec<u8>,
    index: PageIndex,
}

impl Blocks {
    pub fn new(mut blocks: Vec<Block>) -> Blocks {
        blocks.retain(|block| block.size > 0);
        blocks.sort_unstable_by_key(|block| block.address);
        let mut built = Blocks::empty(blocks.len());
        let mut key_ids: HashMap<StackKey, u32> = HashMap::new();
        for block in blocks {
            if built
                .extents
                .last()
                .is_some_and(|last| last.end() > block.address)
            {
                built.overlapping += 1;
                continue;
            }
            let next = key_ids.len() as u32;
            let id = *key_ids.entry(block.key).or_insert_with(|| {
                built.key_table.push(block.key);
                next
            });
            built.extents.push(Extent {
                address: block.address,
                size: block.size,
            });
            built.keys.push(id);
        }
        built.finish();
        built
    }

    fn empty(capacity: usize) -> Blocks {
        Blocks {
            extents: Vec::with_capacity(capacity),
            keys: Vec::with_capacity(capacity),
            key_table: Vec::new(),
            low: u64::MAX,
            high: 0,
            overlapping: 0,
            types: Vec::new(),
            bits: Vec::new(),
            index: PageIndex::default(),
        }
    }

    /// Bounds and the page index, once the extents are in.
    fn finish(&mut self) {
        self.extents.shrink_to_fit();
        self.keys.shrink_to_fit();
        self.low = self
            .extents
            .first()
            .map_or(u64::MAX, |extent| extent.address);
        self.high = self.extents.last().map_or(0, Extent::end);
        self.index = PageIndex::new(&self.extents);
    }

    /// These blocks and `more` (an entry that overlaps the one before it
    /// is counted and left out, as in `new`).
    pub fn with(self, mut more: Vec<Block>) -> Blocks {
        more.retain(|block| block.size > 0);
        more.sort_unstable_by_key(|block| block.address);
        let mut merged = Blocks::empty(self.len() + more.len());
        merged.overlapping = self.overlapping;
        // The others' keys after this one's (a key in both is kept twice:
        // equal keys compare equal wherever they are).
        merged.key_table = self.key_table.clone();
        let mut key_ids: HashMap<StackKey, u32> = HashMap::new();
        let (mut mine, mut theirs) = (0, 0);
        while mine < self.len() || theirs < more.len() {
            let take_mine = theirs == more.len()
                || (mine < self.len() && self.extents[mine].address <= more[theirs].address);
            let (extent, key) = if take_mine {
                mine += 1;
                (self.extents[mine - 1], self.keys[mine - 1])
            } else {
                let block = &more[theirs];
                theirs += 1;
                let next = merged.key_table.len() as u32;
                let key = *key_ids.entry(block.key).or_insert_with(|| {
                    merged.key_table.push(block.key);
                    next
                });
                let extent = Extent {
                    address: block.address,
                    size: block.size,
                };
                (extent, key)
            };
            if merged
                .extents
                .last()
                .is_some_and(|last| last.end() > extent.address)
            {
                merged.overlapping += 1;
                continue;
            }
            merged.extents.push(extent);
            merged.keys.push(key);
        }
        drop((self, more));
        merged.finish();
        merged
    }

    /// Sets what each block holds at its start, one shape per block.
    pub fn set_shapes(&mut self, shapes: Vec<Shape>) {
        debug_assert_eq!(shapes.len(), self.len());
        self.types = shapes.iter().map(|shape| shape.type_id).collect();
        self.bits = shapes
            .iter()
            .map(|shape| {
                ((shape.object_offset / 16) & OFFSET_MASK)
                    | if shape.gc_head { GC_HEAD } else { 0 }
                    | if shape.weak_reference { WEAK } else { 0 }
            })
            .collect();
    }

    pub fn shape(&self, index: u32) -> Shape {
        let Some(&bits) = self.bits.get(index as usize) else {
            return Shape::default();
        };
        Shape {
            type_id: self.types[index as usize],
            object_offset: (bits & OFFSET_MASK) * 16,
            gc_head: bits & GC_HEAD != 0,
            weak_reference: bits & WEAK != 0,
        }
    }

    /// Where the object of block `index` starts (past its headers).
    fn object_start(&self, index: usize, bits: u8) -> u64 {
        self.extents[index].address + ((bits & OFFSET_MASK) as u64) * 16
    }

    /// Where the referent of weak reference `index` lies, if it is one.
    #[inline]
    pub fn weak_referent_word(&self, index: u32) -> Option<u64> {
        let bits = *self.bits.get(index as usize)?;
        (bits & WEAK != 0).then(|| self.object_start(index as usize, bits) + WEAK_REFERENT)
    }

    /// The collector header of block `index` (a Python object's), if any.
    #[inline]
    pub fn gc_head(&self, index: u32) -> Option<std::ops::Range<u64>> {
        let bits = *self.bits.get(index as usize)?;
        (bits & GC_HEAD != 0).then(|| {
            let object = self.object_start(index as usize, bits);
            object - GC_HEAD_BYTES..object
        })
    }

    pub fn len(&self) -> usize {
        self.extents.len()
    }

    /// Tracer memory the blocks take, their index included.
    pub fn bytes(&self) -> usize {
        self.extents.capacity() * std::mem::size_of::<Extent>()
            + (self.keys.capacity() + self.types.capacity()) * 4
            + self.bits.capacity()
            + self.index.bytes()
    }

    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
    }

    pub fn get(&self, index: u32) -> Block {
        let Extent { address, size } = self.extents[index as usize];
        Block {
            address,
            size,
            key: self.key_table[self.keys[index as usize] as usize],
        }
    }

    /// Block `index`, None for a root's node number.
    pub fn get_checked(&self, index: u32) -> Option<Block> {
        ((index as usize) < self.len()).then(|| self.get(index))
    }

    pub fn iter(&self) -> impl Iterator<Item = Block> + '_ {
        (0..self.len() as u32).map(|index| self.get(index))
    }

    /// The block `value` points into, if any.
    #[inline]
    pub fn find(&self, value: u64) -> Option<Hit> {
        if value < self.low || value >= self.high {
            return None;
        }
        let index = self.index.find(&self.extents, value)?;
        let address = self.extents[index].address;
        let bits = self.bits.get(index).copied().unwrap_or(0);
        let start = self.object_start(index, bits);
        Some(Hit {
            block: index as u32,
            interior: value != address && value != start,
            gc_link: bits & GC_HEAD != 0 && value < start && value >= start - GC_HEAD_BYTES,
        })
    }

    /// The index of the first block that ends after `address` (blocks are
    /// disjoint, so their ends are sorted too).
    pub fn first_ending_after(&self, address: u64) -> usize {
        self.extents
            .partition_point(|extent| extent.end() <= address)
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
        let merged = blocks.with(vec![
            Block::untraced(0x1200, 0x10, Origin::HeapChunk),
            Block::untraced(0x1100, 0x10, Origin::HeapChunk),
            Block::untraced(0x10f0, 0x20, Origin::HeapChunk),
        ]);
        assert_eq!(merged.len(), 3);
        assert_eq!(merged.overlapping, 2);
        assert_eq!(merged.get(0), block(0x1000, 0x100));
        assert_eq!(merged.get(1).origin(), Some(Origin::HeapChunk));
        assert_eq!(merged.get(2).address, 0x1200);
    }
}
