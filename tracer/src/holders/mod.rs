//! Who holds it (`record --holders`): at the end of a recording, the
//! running target is read, never stopped, written or signalled, for
//! pointers to its traced live blocks, and the reference graph of those
//! blocks tells, per stack, which blocks nothing reaches (definitely lost,
//! and possibly lost through interior pointers only), what holds the
//! others, and the shortest chain from the stack's blocks to a root.
//!
//! Limits, as `--help` states them: the scan is conservative (any word
//! that looks like a pointer into a block counts, an integer too); memory
//! tracer has no blocks for (allocated before attach, allocator metadata,
//! freed memory) is a root of its own, "untraced memory in MAPPING"; a
//! running thread's stack pointer is unknown, so its stack is scanned
//! whole as untraced memory; and the target runs on while it is read, so
//! the graph is a best-effort snapshot: the memory is read twice, and the
//! blocks the second pass classes otherwise are counted.
//!
//! CPython's small objects in untraced memory (pymalloc's pools, found
//! from their headers) are added as untraced blocks, so that a chain goes
//! on through them to what holds them.
//!
//! `blocks`: the block table; `memory`: /proc and process_vm_readv;
//! `names`: globals by ELF symbol; `pools`: pymalloc's objects;
//! `objects`: Python and C++ objects by type; `scan`: the pass over
//! memory; `graph`: the walk; here: the per-stack figures.
pub mod blocks;
mod census;
mod glibc;
mod graph;
mod index;
pub mod memory;
mod names;
mod objects;
mod pools;
mod scan;

use std::{
    collections::{HashMap, HashSet},
    time::Instant,
};

use anyhow::Result;

use crate::model::{
    StackKey,
    reachability::{Holder, HolderKind, HoldersScan, PathStep, Reachability},
};
pub use blocks::Block;
use blocks::Blocks;
use graph::{Class, Graph, NONE, Node, Walked};

/// The site labels of holder blocks (and the names of untraced ones by
/// type), each named once.
#[derive(Default)]
struct Labels {
    names: Vec<String>,
    kinds: Vec<HolderKind>,
    by_name: HashMap<String, u32>,
    of_stack: HashMap<StackKey, u32>,
}

impl Labels {
    fn intern(&mut self, name: String, kind: HolderKind) -> u32 {
        let next = self.names.len() as u32;
        *self.by_name.entry(name).or_insert_with_key(|name| {
            self.names.push(name.clone());
            self.kinds.push(kind);
            next
        })
    }
}

/// The walked reference graph of one process.
pub struct Scan {
    pub cost: HoldersScan,
    blocks: Blocks,
    /// The names of the blocks' types (Python, C++, `data of` them).
    type_names: Vec<String>,
    /// Each block's type as shown, in `type_names` (NO_TYPE: none).
    types: Vec<u32>,
    roots: Vec<(HolderKind, String)>,
    /// The edges, walked (sorted, each once).
    graph: Graph,
    walked: Walked,
}

/// Scans process `pid` for pointers to its traced live `blocks`;
/// `blocks_gone`: LIVE entries that went away while read.
pub fn scan(pid: u32, blocks: Vec<Block>, blocks_gone: u64) -> Result<Scan> {
    let started = Instant::now();
    let traced = Blocks::new(blocks);
    let regions = memory::regions(pid)?;
    let globals = names::Globals::load(pid, &regions);
    let traced_blocks = traced.len() as u64;
    let block_bytes = traced.iter().map(|block| block.size).sum();
    let heap = glibc::find(pid, &regions, &traced, &globals);
    let known = traced.with(heap.blocks);
    let untraced = pools::find(pid, &regions, &known, &heap.parsed, &globals);
    let untraced_objects = untraced.blocks.len() as u64;
    let parsed = glibc::sorted(heap.parsed.into_iter().chain(untraced.ranges).collect());
    let mut blocks = known.with(untraced.blocks);
    let shapes = objects::read(pid, &blocks, &globals);
    blocks.set_shapes(shapes.of_block);
    let mut cost = HoldersScan {
        pid,
        blocks: traced_blocks,
        block_bytes,
        blocks_gone,
        blocks_overlapping: blocks.overlapping,
        python_objects: shapes.python_objects,
        cpp_objects: shapes.cpp_objects,
        untraced_pools: untraced.pools,
        untraced_pools_rejected: untraced.pools_rejected,
        untraced_objects,
        untraced_objects_left_out: untraced.objects_left_out,
        untraced_pool_bytes_read: untraced.bytes_read,
        heap: heap.parse,
        ..HoldersScan::default()
    };
    let (mut graph, roots) = scan::scan(pid, &blocks, &parsed, &globals, &mut cost)?;
    let weak_roots: Vec<bool> = roots
        .names
        .iter()
        .map(|(kind, _)| *kind == HolderKind::Untraced)
        .collect();
    let walked = graph.walk(blocks.len() as u32, &weak_roots);
    cost.pointers = graph.len() as u64;
    cost.graph_bytes = (blocks.len()
        * (std::mem::size_of::<Block>() + std::mem::size_of::<blocks::Shape>())
        + graph.len() * 16
        + blocks.index_bytes()
        + walked.parent.len() * 10) as u64;
    cost.seconds = started.elapsed().as_secs_f64();
    // The target ran on while it was read: a second pass over the same
    // blocks tells how far one snapshot can be trusted.
    let rescan_started = Instant::now();
    let (mut again, again_roots) =
        scan::scan(pid, &blocks, &parsed, &globals, &mut HoldersScan::default())?;
    let weak_again: Vec<bool> = again_roots
        .names
        .iter()
        .map(|(kind, _)| *kind == HolderKind::Untraced)
        .collect();
    let walked_again = again.walk(blocks.len() as u32, &weak_again);
    cost.rescan_disagreed_blocks = walked
        .class
        .iter()
        .zip(&walked_again.class)
        .filter(|(first, second)| first != second)
        .count() as u64;
    cost.rescan_seconds = rescan_started.elapsed().as_secs_f64();
    let mut scan = Scan {
        cost,
        blocks,
        type_names: shapes.names,
        types: Vec::new(),
        roots: roots.names,
        graph,
        walked,
    };
    scan.types = census::types_of(&scan.blocks, &mut scan.type_names, scan.graph.edges());
    let roots_of = scan.roots_of_blocks();
    scan.cost.before_attach = census::before_attach(
        &scan.blocks,
        &scan.types,
        &scan.type_names,
        &roots_of,
        &scan.roots,
    );
    Ok(scan)
}

impl Scan {
    /// The reachability of each group of stacks (a listed stack and those
    /// merged into it; a stack listed twice, as a top stack and a suspected
    /// leak, gets the same figures twice); `label` names a traced block's
    /// stack.
    pub fn reachability(
        &self,
        groups: &[Vec<StackKey>],
        label: &mut dyn FnMut(&StackKey) -> String,
    ) -> Vec<Reachability> {
        let mut distinct: Vec<Vec<StackKey>> = Vec::new();
        let positions: Vec<usize> = groups
            .iter()
            .map(|group| {
                distinct
                    .iter()
                    .position(|seen| seen == group)
                    .unwrap_or_else(|| {
                        distinct.push(group.clone());
                        distinct.len() - 1
                    })
            })
            .collect();
        let found = self.reachability_of_distinct(&distinct, label);
        positions
            .into_iter()
            .map(|position| found[position].clone())
            .collect()
    }

    fn reachability_of_distinct(
        &self,
        groups: &[Vec<StackKey>],
        label: &mut dyn FnMut(&StackKey) -> String,
    ) -> Vec<Reachability> {
        // A stack can be in several groups (its own and its site's): each
        // key maps to the list of its groups, each distinct list kept once.
        let mut lists_of: HashMap<StackKey, Vec<usize>> = HashMap::new();
        for (index, keys) in groups.iter().enumerate() {
            for key in keys {
                lists_of.entry(*key).or_default().push(index);
            }
        }
        let mut lists: Vec<Vec<usize>> = Vec::new();
        let mut list_of: HashMap<StackKey, u32> = HashMap::new();
        for (key, list) in lists_of {
            let id = lists
                .iter()
                .position(|seen| *seen == list)
                .unwrap_or_else(|| {
                    lists.push(list);
                    lists.len() - 1
                });
            list_of.insert(key, id as u32);
        }
        let mut results = vec![Reachability::default(); groups.len()];
        // Per group, root and the chain's entry from it, the bytes they
        // hold and the group's block nearest the root: the path shown is
        // through the root and entry that hold most of the group's bytes,
        // untraced memory counted as one against a strong root, which wins
        // a tie (a stale pointer to one block, in a global that holds the
        // rest through another chain too, is no story of the leak).
        let roots_of = self.roots_of_blocks();
        let mut by_root: Vec<HashMap<(Node, Node), (u64, u32)>> =
            vec![HashMap::new(); groups.len()];
        let mut block_groups: Vec<Option<u32>> = Vec::with_capacity(self.blocks.len());
        let rank = |block: usize| {
            (
                self.walked.through_interior[block],
                self.walked.depth[block],
            )
        };
        for (index, block) in self.blocks.iter().enumerate() {
            let list = list_of.get(&block.key).copied();
            block_groups.push(list);
            let Some(list) = list else { continue };
            for &group in &lists[list as usize] {
                let result = &mut results[group];
                let (bytes, count) = match self.walked.class[index] {
                    Class::Reachable => (&mut result.reachable_bytes, &mut result.reachable_blocks),
                    Class::PossiblyLost => (
                        &mut result.possibly_lost_bytes,
                        &mut result.possibly_lost_blocks,
                    ),
                    Class::Unreachable => (
                        &mut result.unreachable_bytes,
                        &mut result.unreachable_blocks,
                    ),
                };
                *bytes += block.size;
                *count += 1;
                let root = roots_of[index];
                if root.0 != NONE {
                    let held = by_root[group].entry(root).or_insert((0, index as u32));
                    held.0 += block.size;
                    if rank(index) < rank(held.1 as usize) {
                        held.1 = index as u32;
                    }
                }
            }
        }
        // Direct holders: each (group, holder, block) once, holders by
        // number (a root's, or a block label's after the roots').
        let mut labels = Labels::default();
        let mut held: HashSet<(u32, u32, u32)> = HashSet::new();
        for (source, target, _) in self.graph.edges() {
            let Some(list) = block_groups[target as usize] else {
                continue;
            };
            let holder = self.holder_id(source, &mut labels, label);
            for &group in &lists[list as usize] {
                held.insert((group as u32, holder, target));
            }
        }
        let mut sums: HashMap<(u32, u32), (u64, u64)> = HashMap::new();
        for (group, holder, target) in held {
            let sum = sums.entry((group, holder)).or_default();
            sum.0 += 1;
            sum.1 += self.blocks.get(target).size;
        }
        for ((group, holder), (blocks, bytes)) in sums {
            let (kind, name) = self.holder_of_id(holder, &labels);
            results[group as usize].held_by.push(Holder {
                kind,
                name,
                blocks,
                bytes,
            });
        }
        let nearest = by_root.iter().map(|held| {
            // Untraced memory counts as one holder against each strong
            // root (its stale pointers spread over many mappings).
            let weak_bytes: u64 = held
                .values()
                .filter(|(_, block)| self.walked.weak[*block as usize])
                .map(|(bytes, _)| bytes)
                .sum();
            let best = |weak: bool| {
                held.iter()
                    .filter(|(_, (_, block))| self.walked.weak[*block as usize] == weak)
                    .max_by_key(|&(&root, &(bytes, _))| (bytes, std::cmp::Reverse(root)))
                    .map(|(_, &(bytes, block))| (bytes, block))
            };
            match (best(false), best(true)) {
                (Some((strong_bytes, block)), _) if strong_bytes >= weak_bytes => Some(block),
                (_, Some((_, block))) => Some(block),
                (strong, None) => strong.map(|(_, block)| block),
            }
        });
        for (result, nearest) in results.iter_mut().zip(nearest) {
            result
                .held_by
                .sort_by(|a, b| (b.bytes, b.blocks, &a.name).cmp(&(a.bytes, a.blocks, &b.name)));
            if let Some(block) = nearest {
                result.path_to_root = self.path(block, &mut labels, label);
            }
        }
        results
    }

    /// The root at the end of each block's chain and the chain's last
    /// block before it, its entry (NONE: unreached).
    fn roots_of_blocks(&self) -> Vec<(Node, Node)> {
        let blocks = self.blocks.len();
        let mut root_of = vec![(NONE, NONE); blocks];
        let mut chain = Vec::new();
        for start in 0..blocks {
            if root_of[start].0 != NONE || self.walked.depth[start] == u32::MAX {
                continue;
            }
            let mut node = start as Node;
            let mut last = node;
            while (node as usize) < blocks && root_of[node as usize].0 == NONE {
                chain.push(node);
                last = node;
                node = self.walked.parent[node as usize];
            }
            let found = if (node as usize) < blocks {
                root_of[node as usize]
            } else {
                (node, last)
            };
            for block in chain.drain(..) {
                root_of[block as usize] = found;
            }
        }
        root_of
    }

    /// A holder's number: a root's index, or a block label's after them.
    fn holder_id(
        &self,
        node: u32,
        labels: &mut Labels,
        label: &mut dyn FnMut(&StackKey) -> String,
    ) -> u32 {
        let roots = self.roots.len() as u32;
        match node.checked_sub(self.blocks.len() as u32) {
            Some(root) => root,
            None if let Some(origin) = self.blocks.get(node).origin() => {
                let name = match self.type_names.get(self.types[node as usize] as usize) {
                    Some(type_name) => format!("{type_name} in {}", origin.name()),
                    None => origin.name().to_owned(),
                };
                roots + labels.intern(name, HolderKind::Untraced)
            }
            None => {
                let key = self.blocks.get(node).key;
                let id = match labels.of_stack.get(&key) {
                    Some(&id) => id,
                    None => {
                        let id = labels.intern(label(&key), HolderKind::Block);
                        labels.of_stack.insert(key, id);
                        id
                    }
                };
                roots + id
            }
        }
    }

    fn holder_of_id(&self, id: u32, labels: &Labels) -> (HolderKind, String) {
        match id.checked_sub(self.roots.len() as u32) {
            Some(label) => (
                labels.kinds[label as usize],
                labels.names[label as usize].clone(),
            ),
            None => self.roots[id as usize].clone(),
        }
    }

    fn holder_name(
        &self,
        node: u32,
        labels: &mut Labels,
        label: &mut dyn FnMut(&StackKey) -> String,
    ) -> (HolderKind, String) {
        let id = self.holder_id(node, labels, label);
        self.holder_of_id(id, labels)
    }

    /// The chain from `block` to its root, `block` first.
    fn path(
        &self,
        block: u32,
        labels: &mut Labels,
        label: &mut dyn FnMut(&StackKey) -> String,
    ) -> Vec<PathStep> {
        let mut steps = Vec::new();
        let mut node = block;
        let mut interior = false;
        while node != NONE {
            let (kind, name) =
                if let Some(origin) = self.blocks.get_checked(node).and_then(Block::origin) {
                    (HolderKind::Untraced, origin.name().to_owned())
                } else {
                    self.holder_name(node, labels, label)
                };
            let is_block = (node as usize) < self.blocks.len();
            let type_id = if is_block {
                self.types[node as usize]
            } else {
                blocks::NO_TYPE
            };
            steps.push(PathStep {
                kind,
                name,
                address: is_block.then(|| self.blocks.get(node).address),
                interior,
                type_name: self.type_names.get(type_id as usize).cloned(),
            });
            if !is_block {
                break;
            }
            interior = self.walked.parent_interior[node as usize];
            node = self.walked.parent[node as usize];
        }
        steps
    }
}
