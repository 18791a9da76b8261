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
use std::collections::HashMap;

use super::{
    blocks::{Blocks, NO_TYPE},
    graph::{NONE, Node, Owner},
    objects::TypeNames,
};
use crate::model::reachability::{BeforeAttach, HolderKind, TypeCensus};

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
    let is_view = names.view.clone();
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
    let counted = names.counted.clone();
    let is_counted = |type_id: u32| counted.get(type_id as usize).copied().unwrap_or(false);
    let mut owners: Vec<Owner> = own
        .iter()
        .map(|&type_id| {
            if type_id != NO_TYPE && is_counted(type_id) {
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
        if is_counted(owner_type) {
            owners[target as usize] = Owner::CountedData;
        }
    }
    (types, owners)
}

/// The census of the untraced blocks: by type (`types`, `names`), each
/// with the root (`roots_of`: each block's root node, `root_names` after
/// the blocks) that holds most of its bytes.
pub fn before_attach(
    blocks: &Blocks,
    types: &[u32],
    names: &[String],
    roots_of: &[(Node, Node)],
    root_names: &[(HolderKind, String)],
) -> BeforeAttach {
    // Per type: bytes, blocks, and bytes per root.
    let mut by_type: HashMap<u32, (u64, u64, HashMap<Node, u64>)> = HashMap::new();
    let mut census = BeforeAttach::default();
    for (index, block) in blocks.iter().enumerate() {
        if block.origin().is_none() {
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
        let census = before_attach(&blocks, &types, &names, &roots_of, &root_names);
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
}
