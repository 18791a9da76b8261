//! The traced live blocks of one process, sorted by address, and the
//! lookup of the block an address points into (start or interior).
use crate::model::StackKey;

/// One traced live block: what LIVE knows of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    /// The stack (canonical id) and kind it is counted under.
    pub key: StackKey,
}

impl Block {
    pub fn end(&self) -> u64 {
        self.address.saturating_add(self.size)
    }
}

/// Where a pointer lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    /// Index of the block in `Blocks`.
    pub block: u32,
    /// The pointer is not the block's start.
    pub interior: bool,
}

/// The blocks, sorted by start; overlapping entries (a stale LIVE entry
/// under a block that reuses its memory) keep the later start only.
pub struct Blocks {
    blocks: Vec<Block>,
    low: u64,
    high: u64,
    /// Entries left out because they overlapped the previous block.
    pub overlapping: u64,
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
            blocks: kept,
            low,
            high,
            overlapping,
        }
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    pub fn get(&self, index: u32) -> &Block {
        &self.blocks[index as usize]
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
        let after = self.blocks.partition_point(|block| block.address <= value);
        let index = after.checked_sub(1)?;
        let block = &self.blocks[index];
        (value < block.end()).then_some(Hit {
            block: index as u32,
            interior: value != block.address,
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
                interior: false
            })
        );
        assert_eq!(
            blocks.find(0x101f),
            Some(Hit {
                block: 0,
                interior: true
            })
        );
        assert_eq!(blocks.find(0x1020), None);
        assert_eq!(blocks.find(0xfff), None);
        assert_eq!(
            blocks.find(0x2008),
            Some(Hit {
                block: 1,
                interior: true
            })
        );
        assert_eq!(blocks.find(0x2010), None);
        assert_eq!(blocks.first_ending_after(0x1020), 1);
    }

    #[test]
    fn overlapping_entries_are_counted_and_left_out() {
        let blocks = Blocks::new(vec![block(0x1000, 0x100), block(0x1010, 0x10)]);
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks.overlapping, 1);
    }
}
