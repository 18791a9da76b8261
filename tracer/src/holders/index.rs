//! Where in the sorted, disjoint blocks an address may fall, without a
//! binary search over millions of them for each word the scan reads: the
//! blocks under 64 KiB are indexed by 4 KiB page (per page, the first block
//! that ends after the page's start; a page's candidates are then a few
//! neighbours), in spans of pages that hold blocks; the larger blocks,
//! few, are searched in a list of their own. The page table costs 4 bytes
//! per page of small blocks (and of the gaps of at most 16 pages a span
//! bridges), not per page of address space.

/// Where a block lies: what the lookups read, 16 bytes a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub address: u64,
    pub size: u64,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.address.saturating_add(self.size)
    }
}

const PAGE_SHIFT: u32 = 12;
/// Blocks at least this large are looked up in their own list.
const LARGE_BYTES: u64 = 64 << 10;
/// Pages without small blocks a span bridges before a new one begins.
const GAP_PAGES: u64 = 16;

#[derive(Default)]
pub struct PageIndex {
    /// (first page, end page (exclusive), where its pages start in
    /// `first`), by page.
    spans: Vec<(u64, u64, u32)>,
    /// Per page of each span and one past its end: the index of the first
    /// block that ends after the page's start.
    first: Vec<u32>,
    /// (start, end, index) of the large blocks, by start.
    large: Vec<(u64, u64, u32)>,
}

fn page_of(address: u64) -> u64 {
    address >> PAGE_SHIFT
}

/// The page after the one `block`'s last byte lies in.
fn end_page(block: &Extent) -> u64 {
    page_of(block.end() - 1) + 1
}

impl PageIndex {
    /// Indexes `blocks` (sorted by address, disjoint, none empty).
    pub fn new(blocks: &[Extent]) -> PageIndex {
        let mut index = PageIndex::default();
        let small: Vec<usize> = (0..blocks.len())
            .filter(|&position| blocks[position].size < LARGE_BYTES)
            .collect();
        index.large = blocks
            .iter()
            .enumerate()
            .filter(|(_, block)| block.size >= LARGE_BYTES)
            .map(|(position, block)| (block.address, block.end(), position as u32))
            .collect();
        let mut next = 0;
        while next < small.len() {
            let start = page_of(blocks[small[next]].address);
            let mut end = end_page(&blocks[small[next]]);
            next += 1;
            while next < small.len() && page_of(blocks[small[next]].address) <= end + GAP_PAGES {
                end = end.max(end_page(&blocks[small[next]]));
                next += 1;
            }
            index.spans.push((start, end, 0));
        }
        let mut cursor = 0;
        for span in &mut index.spans {
            span.2 = index.first.len() as u32;
            for page in span.0..=span.1 {
                let page_start = page << PAGE_SHIFT;
                while cursor < blocks.len() && blocks[cursor].end() <= page_start {
                    cursor += 1;
                }
                index.first.push(cursor as u32);
            }
        }
        index
    }

    /// The index of the block that holds `address`, if any.
    #[inline]
    pub fn find(&self, blocks: &[Extent], address: u64) -> Option<usize> {
        let page = page_of(address);
        let span = self.spans.partition_point(|&(_, end, _)| end <= page);
        if let Some(&(start, _, offset)) = self.spans.get(span)
            && start <= page
        {
            let slot = (offset as u64 + page - start) as usize;
            let from = self.first[slot] as usize;
            let to = (self.first[slot + 1] as usize + 1).min(blocks.len());
            let after = from + blocks[from..to].partition_point(|block| block.address <= address);
            if after > from && address < blocks[after - 1].end() {
                return Some(after - 1);
            }
        }
        let after = self
            .large
            .partition_point(|&(start, _, _)| start <= address);
        let &(_, end, position) = self.large.get(after.checked_sub(1)?)?;
        (address < end).then_some(position as usize)
    }

    /// Tracer memory it takes.
    pub fn bytes(&self) -> usize {
        self.spans.len() * 24 + self.first.len() * 4 + self.large.len() * 24
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_block_of_every_address_as_a_search_does() {
        // Small blocks packed in a page and across pages, a gap a span
        // bridges, a gap it does not, and large blocks between them.
        let mut blocks = Vec::new();
        let mut address = 0x10_0000u64;
        for size in [16u64, 16, 48, 4000, 9000, 100, 70_000, 32, 1 << 20, 64] {
            blocks.push(Extent { address, size });
            address += size + if size == 100 { 0x40_0000 } else { 32 };
        }
        blocks.push(Extent {
            address: address + 0x3000,
            size: 16,
        });
        let index = PageIndex::new(&blocks);
        let search = |value: u64| {
            let after = blocks.partition_point(|block| block.address <= value);
            after
                .checked_sub(1)
                .filter(|&position| value < blocks[position].end())
        };
        let last = blocks.last().unwrap().end();
        for value in (0x0f_f000..last + 0x1000).step_by(8) {
            assert_eq!(index.find(&blocks, value), search(value), "{value:#x}");
        }
        assert_eq!(index.find(&[], 0x1000), None);
    }
}
