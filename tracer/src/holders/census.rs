//! What each block is, once the graph is known, and what the process held
//! before tracer attached. A block without a type of its own (no Python
//! object header, no vtable) that a typed object points at, at its start,
//! is that object's data: "data of numpy.ndarray" (the array's buffer),
//! "data of list" (its item array), "data of c10::StorageImpl". A buffer
//! that views share is named after the object that exports it, not after
//! a view on it (`memoryview`, its `managedbuffer`), where both point at
//! it.
//!
//! The census (`before_attach`) sums the untraced blocks (heap chunks
//! tracer has no block for, chunks malloc mapped on their own, pymalloc
//! objects in arenas mapped before attach) by that type, "untyped" where
//! there is none, each type with the root that holds most of its bytes.
use std::collections::{BTreeMap, HashMap};

use super::{
    blocks::{Blocks, NO_TYPE},
    graph::{NONE, Node, Owner},
    objects::TypeNames,
};
use crate::model::{
    reachability::{BeforeAttach, HolderKind, TypeCensus},
    run::SamplingReport,
};

/// What tracer did not record after attach: the blocks outside the size
/// filters, and why blocks within them may be unrecorded too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unrecorded {
    pub min_size_bytes: u64,
    pub max_size_bytes: u64,
    /// Sampling, drops of blocks: `BeforeAttach::or_unrecorded`.
    pub reasons: Vec<String>,
}

/// The drops that leave a block made after attach out of the live set.
const UNRECORDED_DROPS: [&str; 3] = ["live_map_full", "pending_map_full", "out_param_unreadable"];

impl Unrecorded {
    /// Every call recorded: what tracer has no record of was there before.
    pub const NONE: Unrecorded = Unrecorded {
        min_size_bytes: 0,
        max_size_bytes: u64::MAX,
        reasons: Vec::new(),
    };

    /// What a run that recorded as `sampling` says and dropped `drops`
    /// (by name) left unrecorded.
    pub fn of(sampling: &SamplingReport, drops: &BTreeMap<String, u64>) -> Unrecorded {
        let mut reasons = Vec::new();
        if let Some(bytes) = sampling.sample_bytes {
            reasons.push(format!("sampled out (--sample-bytes {bytes})"));
        }
        let dropped: Vec<String> = UNRECORDED_DROPS
            .iter()
            .filter_map(|name| {
                let count = drops.get(*name).copied().unwrap_or(0);
                (count > 0).then(|| format!("{name}={count}"))
            })
            .collect();
        if !dropped.is_empty() {
            reasons.push(format!("dropped ({})", dropped.join(", ")));
        }
        Unrecorded {
            min_size_bytes: sampling.min_size_bytes,
            max_size_bytes: sampling.max_size_bytes.unwrap_or(u64::MAX),
            reasons,
        }
    }

    /// Whether tracer records a block of `size` bytes.
    pub fn within_filters(&self, size: u64) -> bool {
        (self.min_size_bytes..=self.max_size_bytes).contains(&size)
    }
}

/// What the census calls memory without a type.
const UNTYPED: &str = "untyped";

/// Each block's type as shown (an index into `names`, NO_TYPE for none):
/// its own, else `data of OWNER` for the typed object that points at its
/// start (one that is no view first, then the lowest address); and what
/// it is to ownership (`TypeNames::counted`: objects of a runtime that
/// counts references to them). `edges`: (source, target block, interior).
pub fn types_of(
    blocks: &Blocks,
    names: &mut TypeNames,
    edges: impl Iterator<Item = (u32, u32, bool)>,
) -> (Vec<u32>, Vec<Owner>) {
    let own: Vec<u32> = (0..blocks.len() as u32)
        .map(|block| blocks.shape(block).type_id)
        .collect();
    let is_view = &names.view;
    // Per untyped block, its best owner so far: (is a view, source).
    let mut owner: HashMap<u32, (bool, u32)> = HashMap::new();
    for (source, target, interior) in edges {
        if interior || source as usize >= own.len() || own[target as usize] != NO_TYPE {
            continue;
        }
        let source_type = own[source as usize];
        if source_type == NO_TYPE {
            continue;
        }
        let candidate = (is_view[source_type as usize], source);
        owner
            .entry(target)
            .and_modify(|best| *best = (*best).min(candidate))
            .or_insert(candidate);
    }
    let is_counted =
        |names: &TypeNames, type_id: u32| names.counted.get(type_id as usize) == Some(&true);
    let mut owners: Vec<Owner> = own
        .iter()
        .map(|&type_id| {
            if type_id != NO_TYPE && is_counted(names, type_id) {
                Owner::CountedObject
            } else {
                Owner::Unknown
            }
        })
        .collect();
    let mut data_of: HashMap<u32, u32> = HashMap::new();
    let mut types = own.clone();
    for (target, (_, source)) in owner {
        let owner_type = own[source as usize];
        let id = *data_of.entry(owner_type).or_insert_with(|| {
            let name = format!("data of {}", names.names[owner_type as usize]);
            names.push(name)
        });
        types[target as usize] = id;
        if is_counted(names, owner_type) {
            owners[target as usize] = Owner::CountedData;
        }
    }
    (types, owners)
}

/// The census of the untraced blocks: by type (`types`, `names`), each
/// with the root (`roots_of`: each block's root node, `root_names` after
/// the blocks) that holds most of its bytes. Blocks tracer would not have
/// recorded after attach either (`unrecorded`: outside the size filters)
/// are counted apart.
pub fn before_attach(
    blocks: &Blocks,
    types: &[u32],
    names: &[String],
    roots_of: &[(Node, Node)],
    root_names: &[(HolderKind, String)],
    unrecorded: &Unrecorded,
) -> BeforeAttach {
    // Per type: bytes, blocks, and bytes per root.
    let mut by_type: HashMap<u32, (u64, u64, HashMap<Node, u64>)> = HashMap::new();
    let mut census = BeforeAttach {
        or_unrecorded: unrecorded.reasons.clone(),
        ..BeforeAttach::default()
    };
    for (index, block) in blocks.iter().enumerate() {
        if block.origin().is_none() {
            continue;
        }
        if !unrecorded.within_filters(block.size) {
            census.outside_size_filters.bytes += block.size;
            census.outside_size_filters.blocks += 1;
            continue;
        }
        census.bytes += block.size;
        census.blocks += 1;
        let entry = by_type.entry(types[index]).or_default();
        entry.0 += block.size;
        entry.1 += 1;
        *entry.2.entry(roots_of[index].0).or_default() += block.size;
    }
    let blocks_len = blocks.len() as Node;
    census.by_type = by_type
        .into_iter()
        .map(|(type_id, (bytes, count, roots))| {
            let root = roots
                .into_iter()
                .max_by_key(|&(root, bytes)| (bytes, std::cmp::Reverse(root)))
                .map(|(root, _)| root)
                .filter(|&root| root != NONE)
                .and_then(|root| root_names.get((root - blocks_len) as usize))
                .map_or_else(|| "unreachable".to_owned(), |(_, name)| name.clone());
            TypeCensus {
                type_name: names
                    .get(type_id as usize)
                    .cloned()
                    .unwrap_or_else(|| UNTYPED.to_owned()),
                bytes,
                blocks: count,
                root,
            }
        })
        .collect();
    census
        .by_type
        .sort_by(|a, b| (b.bytes, b.blocks, &a.type_name).cmp(&(a.bytes, a.blocks, &b.type_name)));
    census
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holders::blocks::{Block, Origin, Shape};

    #[test]
    fn a_buffer_is_named_after_its_owner_not_its_views() {
        // 0: an ndarray, 1: a memoryview, 2: the buffer both point at,
        // 3: a buffer only a view points at, 4: one pointed into only.
        let mut blocks = Blocks::new(
            (0..5)
                .map(|index| Block::untraced(0x1000 * (index + 1), 64, Origin::HeapChunk))
                .collect(),
        );
        let typed = |type_id| Shape {
            type_id,
            ..Shape::default()
        };
        blocks.set_shapes(vec![
            typed(0),
            typed(1),
            Shape::default(),
            Shape::default(),
            Shape::default(),
        ]);
        let mut type_names = TypeNames::default();
        type_names.intern_runtime("numpy.ndarray", false);
        type_names.intern_runtime("memoryview", true);
        let edges = [
            (1, 2, false),
            (0, 2, false),
            (1, 3, false),
            (0, 4, true),
            (5, 4, false),
        ];
        let (types, owners) = types_of(&blocks, &mut type_names, edges.into_iter());
        let names = type_names.names;
        assert_eq!(owners[0], Owner::CountedObject);
        assert_eq!(owners[2], Owner::CountedData);
        assert_eq!(owners[4], Owner::Unknown);
        let name = |block: usize| names.get(types[block] as usize).map(String::as_str);
        assert_eq!(name(0), Some("numpy.ndarray"));
        assert_eq!(name(2), Some("data of numpy.ndarray"));
        assert_eq!(name(3), Some("data of memoryview"));
        assert_eq!(name(4), None, "an interior pointer, and a root: no owner");

        // Blocks 0..3 held from root 5, block 4 from none.
        let roots_of = [(5, 0), (5, 0), (5, 0), (5, 1), (NONE, NONE)];
        let root_names = [(HolderKind::Global, "g_arrays in prog".to_owned())];
        let census = before_attach(
            &blocks,
            &types,
            &names,
            &roots_of,
            &root_names,
            &Unrecorded::NONE,
        );
        assert_eq!((census.bytes, census.blocks), (320, 5));
        let row = |type_name: &str| {
            census
                .by_type
                .iter()
                .find(|row| row.type_name == type_name)
                .unwrap_or_else(|| panic!("{type_name}: {census:?}"))
        };
        assert_eq!(row("data of numpy.ndarray").root, "g_arrays in prog");
        assert_eq!(row("untyped").root, "unreachable");
        assert_eq!(row("untyped").blocks, 1);
    }

    #[test]
    fn what_tracer_would_not_have_recorded_is_counted_apart() {
        let mut sampling = SamplingReport::exact();
        assert_eq!(
            Unrecorded::of(&sampling, &BTreeMap::new()),
            Unrecorded::NONE
        );
        sampling.sample_bytes = Some(524288);
        sampling.min_size_bytes = 32;
        sampling.max_size_bytes = Some(1 << 20);
        let drops = BTreeMap::from([
            ("live_map_full".to_owned(), 3),
            ("mapping_events_lost".to_owned(), 9),
        ]);
        let unrecorded = Unrecorded::of(&sampling, &drops);
        assert_eq!(
            unrecorded.reasons,
            [
                "sampled out (--sample-bytes 524288)",
                "dropped (live_map_full=3)"
            ],
            "a mapping event lost leaves no heap block out"
        );
        assert!(!unrecorded.within_filters(24));
        assert!(unrecorded.within_filters(32) && unrecorded.within_filters(1 << 20));
        assert!(!unrecorded.within_filters((1 << 20) + 1));

        // Two 64-byte blocks and one of 24 bytes, none traced.
        let blocks = Blocks::new(vec![
            Block::untraced(0x1000, 64, Origin::HeapChunk),
            Block::untraced(0x2000, 24, Origin::HeapChunk),
            Block::untraced(0x3000, 64, Origin::HeapChunk),
        ]);
        let types = [NO_TYPE; 3];
        let roots_of = [(NONE, NONE); 3];
        let census = before_attach(&blocks, &types, &[], &roots_of, &[], &unrecorded);
        assert_eq!((census.bytes, census.blocks), (128, 2));
        assert_eq!(
            (
                census.outside_size_filters.bytes,
                census.outside_size_filters.blocks
            ),
            (24, 1)
        );
        assert_eq!(census.or_unrecorded, unrecorded.reasons);
        let all = before_attach(&blocks, &types, &[], &roots_of, &[], &Unrecorded::NONE);
        assert_eq!((all.bytes, all.blocks), (152, 3));
        assert_eq!(all.outside_size_filters.blocks, 0);
    }
}
