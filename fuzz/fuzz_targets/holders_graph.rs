//! The holders graph over a memory image: blocks (with their shapes),
//! the words of the image that point into them as edges (from the block
//! the word lies in, or from the root of its range), then the walk.
//! `[blocks: u8]`, each `[address: u64][size: u32][shape: u8]` (object
//! offset in sixteens: 2 bits, a collector header, a weak reference),
//! `[weak roots: u8 bits]`, then the image, each range a root.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer::{
    holders::{
        Block,
        blocks::{Blocks, Origin, Shape},
        graph::{Class, Graph, NONE, Node},
    },
    target_memory::TargetMemory as _,
};

/// Roots the image's ranges map to, at most.
const ROOTS: usize = 8;

fuzz_target!(|data: &[u8]| {
    let mut fields = tracer_fuzz::Fields::new(data);
    let listed: Vec<(Block, u8)> = (0..fields.u8())
        .map(|_| {
            let block = Block::untraced(
                fields.u64(),
                u64::from(fields.u32()),
                Origin::PymallocObject,
            );
            (block, fields.u8())
        })
        .collect();
    let weak_bits = fields.u8();
    let ranges = tracer_fuzz::image_ranges(fields.rest());
    let mut blocks = Blocks::new(listed.iter().map(|(block, _)| *block).collect());
    // Shapes by the address each block kept.
    let shapes = blocks
        .iter()
        .map(|kept| {
            let bits = listed
                .iter()
                .find(|(block, _)| block.address == kept.address)
                .map_or(0, |(_, bits)| *bits);
            Shape {
                type_id: 0,
                object_offset: (bits & 3) * 16,
                gc_head: bits & 4 != 0,
                weak_reference: bits & 8 != 0,
            }
        })
        .collect();
    blocks.set_shapes(shapes);
    let image = tracer_fuzz::image(fields.rest());
    let count = blocks.len() as u32;
    let mut graph = Graph::default();
    for (index, &(start, length)) in ranges.iter().enumerate() {
        let root = count + (index % ROOTS) as Node;
        let mut bytes = vec![0u8; length];
        let read = image.read(start, &mut bytes) & !7;
        for (word_index, word) in bytes[..read].chunks_exact(8).enumerate() {
            let value = u64::from_ne_bytes(word.try_into().expect("8 bytes"));
            let Some(hit) = blocks.find(value).filter(|hit| !hit.gc_link) else {
                continue;
            };
            let location = start.wrapping_add(8 * word_index as u64);
            let source = match blocks.find(location) {
                Some(inside) if inside.block == hit.block => continue,
                Some(inside) if blocks.weak_referent_word(inside.block) == Some(location) => {
                    continue;
                }
                Some(inside) => inside.block,
                None => root,
            };
            graph.add(source, hit.block, hit.interior);
        }
    }
    let weak_roots: Vec<bool> = (0..ROOTS).map(|root| weak_bits >> root & 1 != 0).collect();
    let walked = graph.walk(count, &weak_roots, &[]);
    let nodes = count as usize + ROOTS;
    assert_eq!(walked.class.len(), count as usize);
    for block in 0..count as usize {
        // A reached block's chain ends at a root, one step up at a time.
        let mut node = block as Node;
        let mut steps = 0;
        while node != NONE && (node as usize) < count as usize {
            node = walked.parent[node as usize];
            steps += 1;
            assert!(steps <= nodes, "the parents of block {block} loop");
        }
        let reached = walked.parent[block] != NONE;
        assert_eq!(reached, walked.class[block] != Class::Unreachable);
    }
});
