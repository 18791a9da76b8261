//! A map from disjoint address ranges to values: the bookkeeping under the
//! mapping kinds, where one `munmap` may cut a hole in one mapping, cover
//! several, or only touch their ends.
//!
//! A `BTreeMap` keyed by range start: every operation costs O(log n) plus
//! the pieces it touches, so 100 k live mappings stay in microseconds per
//! call. Pieces are never merged, so each piece keeps the value (the stack
//! and kind) of the call that made it.

use std::collections::BTreeMap;

/// One range `[start, end)` and its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece<V> {
    pub start: u64,
    pub end: u64,
    pub value: V,
}

impl<V> Piece<V> {
    pub fn length_bytes(&self) -> u64 {
        self.end - self.start
    }
}

/// What a removal changed: the pieces taken out whole, and the parts of
/// them that stayed because they were outside the removed range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal<V> {
    pub taken: Vec<Piece<V>>,
    pub kept: Vec<Piece<V>>,
}

impl<V: Copy> Removal<V> {
    /// The removed parts: each taken piece clipped to the removed range.
    pub fn clipped(&self, start: u64, end: u64) -> Vec<Piece<V>> {
        self.taken
            .iter()
            .map(|piece| Piece {
                start: piece.start.max(start),
                end: piece.end.min(end),
                value: piece.value,
            })
            .collect()
    }
}

/// Disjoint ranges with a value each.
#[derive(Clone, Debug)]
pub struct RangeMap<V> {
    /// start -> (end, value).
    pieces: BTreeMap<u64, (u64, V)>,
}

impl<V> Default for RangeMap<V> {
    fn default() -> Self {
        RangeMap {
            pieces: BTreeMap::new(),
        }
    }
}

impl<V: Copy> RangeMap<V> {
    /// Number of pieces.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Pieces in address order.
    pub fn iter(&self) -> impl Iterator<Item = Piece<V>> + '_ {
        self.pieces
            .iter()
            .map(|(&start, &(end, value))| Piece { start, end, value })
    }

    /// The pieces that overlap `[start, end)`, whole, in address order.
    pub fn overlapping(&self, start: u64, end: u64) -> Vec<Piece<V>> {
        if start >= end {
            return Vec::new();
        }
        let before = self
            .pieces
            .range(..start)
            .next_back()
            .filter(|(_, (piece_end, _))| *piece_end > start);
        before
            .into_iter()
            .chain(self.pieces.range(start..end))
            .map(|(&start, &(end, value))| Piece { start, end, value })
            .collect()
    }

    /// Empties `[start, end)`: pieces inside go, pieces across its ends are
    /// cut (a piece across both ends is split in two).
    pub fn remove(&mut self, start: u64, end: u64) -> Removal<V> {
        let taken = self.overlapping(start, end);
        let mut kept = Vec::new();
        for piece in &taken {
            self.pieces.remove(&piece.start);
            if piece.start < start {
                kept.push(Piece {
                    start: piece.start,
                    end: start,
                    value: piece.value,
                });
            }
            if piece.end > end {
                kept.push(Piece {
                    start: end,
                    end: piece.end,
                    value: piece.value,
                });
            }
        }
        for piece in &kept {
            self.pieces.insert(piece.start, (piece.end, piece.value));
        }
        Removal { taken, kept }
    }

    /// Puts `value` on `[start, end)`, which must be empty (remove first).
    pub fn insert_empty(&mut self, start: u64, end: u64, value: V) {
        debug_assert!(self.overlapping(start, end).is_empty());
        if start < end {
            self.pieces.insert(start, (end, value));
        }
    }
}

impl<V: Copy + PartialEq> RangeMap<V> {
    /// Puts `value` on the empty `[start, end)` and joins it with the
    /// pieces that touch it with the same value: one piece for a run of
    /// pages faulted one by one under one stack (`resident`).
    pub fn insert_merging(&mut self, mut start: u64, mut end: u64, value: V) {
        if start >= end {
            return;
        }
        debug_assert!(self.overlapping(start, end).is_empty());
        if let Some((&before, &(before_end, before_value))) = self.pieces.range(..start).next_back()
            && before_end == start
            && before_value == value
        {
            self.pieces.remove(&before);
            start = before;
        }
        if let Some(&(after_end, after_value)) = self.pieces.get(&end)
            && after_value == value
        {
            self.pieces.remove(&end);
            end = after_end;
        }
        self.pieces.insert(start, (end, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_inserts_join_touching_pieces_of_one_value_only() {
        let mut map = RangeMap::default();
        map.insert_merging(0x2000, 0x3000, 1u8);
        map.insert_merging(0x4000, 0x5000, 1);
        map.insert_merging(0x3000, 0x4000, 1);
        map.insert_merging(0x5000, 0x6000, 2);
        map.insert_merging(0x1000, 0x2000, 2);
        assert_eq!(
            ranges(&map),
            [
                (0x1000, 0x2000, 2),
                (0x2000, 0x5000, 1),
                (0x5000, 0x6000, 2)
            ]
        );
    }

    fn ranges(map: &RangeMap<u8>) -> Vec<(u64, u64, u8)> {
        map.iter()
            .map(|piece| (piece.start, piece.end, piece.value))
            .collect()
    }

    #[test]
    fn a_hole_splits_a_piece() {
        let mut map = RangeMap::default();
        map.insert_empty(0x1000, 0x5000, 1);
        let removal = map.remove(0x2000, 0x3000);
        assert_eq!(ranges(&map), [(0x1000, 0x2000, 1), (0x3000, 0x5000, 1)]);
        assert_eq!(removal.taken.len(), 1);
        assert_eq!(removal.kept.len(), 2);
        assert_eq!(
            removal.clipped(0x2000, 0x3000),
            [Piece {
                start: 0x2000,
                end: 0x3000,
                value: 1
            }]
        );
    }

    #[test]
    fn a_removal_covers_several_pieces_and_cuts_their_ends() {
        let mut map = RangeMap::default();
        map.insert_empty(0x1000, 0x3000, 1);
        map.insert_empty(0x4000, 0x5000, 2);
        map.insert_empty(0x6000, 0x9000, 3);
        let removal = map.remove(0x2000, 0x7000);
        assert_eq!(ranges(&map), [(0x1000, 0x2000, 1), (0x7000, 0x9000, 3)]);
        let removed: u64 = removal
            .clipped(0x2000, 0x7000)
            .iter()
            .map(Piece::length_bytes)
            .sum();
        assert_eq!(removed, 0x1000 + 0x1000 + 0x1000);
    }

    #[test]
    fn removing_a_hole_between_pieces_changes_nothing() {
        let mut map = RangeMap::default();
        map.insert_empty(0x1000, 0x2000, 1);
        map.insert_empty(0x3000, 0x4000, 2);
        let removal = map.remove(0x2000, 0x3000);
        assert!(removal.taken.is_empty() && removal.kept.is_empty());
        assert_eq!(map.len(), 2);
        assert!(map.remove(0x5000, 0x5000).taken.is_empty());
    }

    /// A random sequence of inserts (after removal) and removals against a
    /// page-by-page reference model.
    #[test]
    fn matches_a_page_by_page_reference() {
        const PAGES: u64 = 256;
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        };
        let mut map = RangeMap::default();
        let mut reference = [None::<u8>; PAGES as usize];
        for step in 0..20_000 {
            let start = next(PAGES);
            let end = (start + 1 + next(32)).min(PAGES);
            let removal = map.remove(start, end);
            let clipped_pages: u64 = removal
                .clipped(start, end)
                .iter()
                .map(Piece::length_bytes)
                .sum();
            let reference_pages = reference[start as usize..end as usize]
                .iter()
                .filter(|page| page.is_some())
                .count() as u64;
            assert_eq!(clipped_pages, reference_pages, "step {step}");
            reference[start as usize..end as usize].fill(None);
            if next(2) == 0 {
                let value = next(4) as u8;
                map.insert_empty(start, end, value);
                reference[start as usize..end as usize].fill(Some(value));
            }
            let mut flattened = [None::<u8>; PAGES as usize];
            let mut last_end = 0;
            for piece in map.iter() {
                assert!(piece.start >= last_end && piece.start < piece.end);
                last_end = piece.end;
                flattened[piece.start as usize..piece.end as usize].fill(Some(piece.value));
            }
            assert_eq!(flattened, reference, "step {step}");
        }
    }

    #[test]
    fn stays_fast_with_100k_pieces() {
        let mut map = RangeMap::default();
        for index in 0..100_000_u64 {
            map.insert_empty(index * 0x3000, index * 0x3000 + 0x2000, 0_u8);
        }
        let started = std::time::Instant::now();
        for index in 0..100_000_u64 {
            map.remove(index * 0x3000 + 0x1000, index * 0x3000 + 0x1800);
        }
        assert_eq!(map.len(), 200_000);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
