//! The reference graph: nodes are the blocks (0..blocks) and the roots
//! after them (a global, a thread's stack, its registers, untraced
//! memory); an edge is a word in its source that points into a block.
//! Walks from every root tell each block apart: reachable through start
//! pointers only, possibly lost (reached only through a pointer into its
//! interior somewhere on the way), unreachable (no chain at all).
//!
//! The walk over every pointer keeps each block's parent, for the chain
//! to a root, in four passes: through start pointers from the strong roots
//! (globals, thread stacks, registers), then from the weak ones (untraced
//! memory, where freed memory keeps stale pointers), then the same two
//! again through interior pointers as well. A chain ends at a strong root
//! whenever one exists without an interior pointer, and takes an interior
//! pointer (the likeliest to be an integer that only looks like a pointer
//! into a large block) only where no chain of start pointers exists.
//!
//! Within a pass the chain preferred is the one with the fewest steps
//! whose ownership is unknown, then the shortest: a step is owning when
//! it points at a counted object (a Python object: only counted
//! references point at it) or comes from one or from its data (a
//! container's slots); a C or C++ pointer may own or only list (a registry
//! of live objects). A 0-1 breadth-first walk finds those chains in one
//! pass over the edges.
use std::collections::VecDeque;

/// A node's index: blocks first, then roots.
pub type Node = u32;

/// No parent: a root, or a block never reached.
pub const NONE: Node = Node::MAX;

const INTERIOR: u32 = 1 << 31;

/// What a block is, once the graph is walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Reachable,
    PossiblyLost,
    Unreachable,
}

/// What a block is to the ownership of its pointers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Owner {
    /// No counted object: its pointers' ownership is unknown.
    #[default]
    Unknown,
    /// An object of a runtime that counts references to it (a CPython
    /// object): pointed at by counted references only.
    CountedObject,
    /// Such an object's data (a list's items, a dict's keys table): its
    /// pointers are the object's references.
    CountedData,
}

/// Edges as they are found, then walked: compressed once walked, the
/// targets of node n (each a block, | INTERIOR when the pointer is not its
/// start) are targets[first[n]..first[n + 1]].
#[derive(Default)]
pub struct Graph {
    /// (source, target) as found; empty once compressed.
    edges: Vec<(Node, u32)>,
    first: Vec<u32>,
    targets: Vec<u32>,
}

/// Flags of a walked block.
const PARENT_INTERIOR: u8 = 1;
const WEAK: u8 = 1 << 1;
const THROUGH_INTERIOR: u8 = 1 << 2;

/// The walked graph.
pub struct Walked {
    pub class: Vec<Class>,
    /// Each node's parent on its preferred chain from a root.
    pub parent: Vec<Node>,
    /// Steps from its root (roots and unreached: u32::MAX).
    pub depth: Vec<u32>,
    /// Steps of unknown ownership on the chain (unreached: u32::MAX).
    pub unowned: Vec<u32>,
    flags: Vec<u8>,
}

impl Walked {
    /// Whether the pointer from the parent is an interior one.
    pub fn parent_interior(&self, block: usize) -> bool {
        self.flags[block] & PARENT_INTERIOR != 0
    }

    /// Whether a block was reached from a weak root only.
    pub fn weak(&self, block: usize) -> bool {
        self.flags[block] & WEAK != 0
    }

    /// Whether a block's chain takes an interior pointer somewhere.
    pub fn through_interior(&self, block: usize) -> bool {
        self.flags[block] & THROUGH_INTERIOR != 0
    }

    /// Tracer memory it takes.
    pub fn bytes(&self) -> usize {
        self.class.len() + self.parent.len() * 12 + self.flags.len()
    }
}

impl Graph {
    pub fn add(&mut self, source: Node, target: u32, interior: bool) {
        debug_assert!(target < INTERIOR);
        self.edges
            .push((source, target | if interior { INTERIOR } else { 0 }));
    }

    /// How many edges it holds (distinct, once walked).
    pub fn edge_count(&self) -> usize {
        self.edges.len() + self.targets.len()
    }

    /// Tracer memory its edges take.
    pub fn bytes(&self) -> usize {
        self.edges.capacity() * 8 + (self.first.capacity() + self.targets.capacity()) * 4
    }

    /// The edges, as (source, target block, interior).
    pub fn edges(&self) -> impl Iterator<Item = (Node, u32, bool)> + '_ {
        let found = self.edges.iter().copied();
        let compressed = (0..self.first.len().saturating_sub(1)).flat_map(move |node| {
            self.out(node as Node)
                .iter()
                .map(move |&target| (node as Node, target))
        });
        found
            .chain(compressed)
            .map(|(source, target)| (source, target & !INTERIOR, target & INTERIOR != 0))
    }

    /// The targets of `node`, compressed.
    fn out(&self, node: Node) -> &[u32] {
        &self.targets[self.first[node as usize] as usize..self.first[node as usize + 1] as usize]
    }

    /// Sorts the edges found, each kept once, into the compressed form
    /// for `nodes` nodes (found edges of a graph compressed before are
    /// added to it).
    fn compress(&mut self, nodes: usize) {
        let mut edges = std::mem::take(&mut self.edges);
        if !self.targets.is_empty() {
            edges.extend((0..self.first.len() - 1).flat_map(|node| {
                self.out(node as Node)
                    .iter()
                    .map(move |&target| (node as Node, target))
            }));
        }
        edges.sort_unstable();
        edges.dedup();
        let mut first = vec![0u32; nodes + 1];
        for &(source, _) in &edges {
            first[source as usize + 1] += 1;
        }
        for index in 0..nodes {
            first[index + 1] += first[index];
        }
        self.targets = edges.iter().map(|&(_, target)| target).collect();
        self.first = first;
    }

    /// Walks the graph of `blocks` blocks and the roots after them, weak
    /// where `weak_roots` says so; `owners`: what each block is to
    /// ownership (empty: all unknown).
    pub fn walk(&mut self, blocks: u32, weak_roots: &[bool], owners: &[Owner]) -> Walked {
        let roots = weak_roots.len() as u32;
        let nodes = (blocks + roots) as usize;
        self.compress(nodes);
        let out = |node: Node| self.out(node);
        let owner = |node: Node| owners.get(node as usize).copied().unwrap_or_default();
        let owning = |source: Node, target: u32| {
            owner(target) == Owner::CountedObject
                || (source < blocks && owner(source) != Owner::Unknown)
        };
        let roots = blocks..blocks + roots;
        let through_starts = reached(blocks as usize, roots.clone(), &out);
        let mut parent = vec![NONE; nodes];
        let mut depth = vec![u32::MAX; nodes];
        let mut unowned = vec![u32::MAX; nodes];
        let mut flags = vec![0u8; nodes];
        // The pass a block was reached in: final once that pass is over.
        let mut pass_of = vec![u8::MAX; blocks as usize];
        let passes = [(false, false), (false, true), (true, false), (true, true)];
        for (pass, &(interior, tier)) in passes.iter().enumerate() {
            let pass = pass as u8;
            let mut queue: VecDeque<Node> = roots
                .clone()
                .filter(|root| weak_roots[(root - blocks) as usize] == tier)
                .collect();
            for &root in &queue {
                depth[root as usize] = 0;
                unowned[root as usize] = 0;
            }
            if interior {
                // On from every block reached so far from a root of this
                // tier, best first (a strong block's edges were all
                // followed in the strong interior pass already).
                let mut reached: Vec<Node> = (0..blocks)
                    .filter(|&block| {
                        pass_of[block as usize] != u8::MAX
                            && (flags[block as usize] & WEAK != 0) == tier
                    })
                    .collect();
                reached.sort_by_key(|&block| (unowned[block as usize], depth[block as usize]));
                queue.extend(reached);
            }
            while let Some(node) = queue.pop_front() {
                for &target in out(node) {
                    let is_interior = target & INTERIOR != 0;
                    if is_interior && !interior {
                        continue;
                    }
                    let block = (target & !INTERIOR) as usize;
                    if pass_of[block] < pass {
                        continue;
                    }
                    let step = u32::from(!owning(node, block as u32));
                    let cost = unowned[node as usize] + step;
                    let better = pass_of[block] != pass
                        || cost < unowned[block]
                        || (cost == unowned[block] && depth[node as usize] + 1 < depth[block]);
                    if !better {
                        continue;
                    }
                    pass_of[block] = pass;
                    unowned[block] = cost;
                    depth[block] = depth[node as usize] + 1;
                    parent[block] = node;
                    let weak = tier || (node < blocks && flags[node as usize] & WEAK != 0);
                    flags[block] = if is_interior { PARENT_INTERIOR } else { 0 }
                        | if weak { WEAK } else { 0 }
                        | if interior { THROUGH_INTERIOR } else { 0 };
                    if step == 0 {
                        queue.push_front(block as Node);
                    } else {
                        queue.push_back(block as Node);
                    }
                }
            }
        }
        let class = (0..blocks as usize)
            .map(|block| {
                if through_starts[block] {
                    Class::Reachable
                } else if depth[block] != u32::MAX {
                    Class::PossiblyLost
                } else {
                    Class::Unreachable
                }
            })
            .collect();
        for root_depth in &mut depth[blocks as usize..] {
            *root_depth = u32::MAX;
        }
        flags.truncate(blocks as usize);
        Walked {
            class,
            parent,
            depth,
            unowned,
            flags,
        }
    }
}

/// The blocks reached from `roots` through start pointers only.
fn reached<'a>(
    blocks: usize,
    roots: std::ops::Range<Node>,
    out: &impl Fn(Node) -> &'a [u32],
) -> Vec<bool> {
    let mut seen = vec![false; blocks];
    let mut queue: VecDeque<Node> = roots.collect();
    while let Some(node) = queue.pop_front() {
        for &target in out(node) {
            if target & INTERIOR != 0 {
                continue;
            }
            let block = (target & !INTERIOR) as usize;
            if !seen[block] {
                seen[block] = true;
                queue.push_back(block as Node);
            }
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_reachable_possibly_lost_and_unreachable_apart() {
        // Blocks 0..5, root 5. root -> 0 -> 1 (start); 0 -> 2 (interior),
        // 2 -> 3 (start); 4 points to itself and to 0 only.
        let mut graph = Graph::default();
        graph.add(5, 0, false);
        graph.add(0, 1, false);
        graph.add(0, 2, true);
        graph.add(2, 3, false);
        graph.add(4, 0, false);
        let walked = graph.walk(5, &[false], &[]);
        assert_eq!(
            walked.class,
            [
                Class::Reachable,
                Class::Reachable,
                Class::PossiblyLost,
                Class::PossiblyLost,
                Class::Unreachable
            ]
        );
        assert_eq!(walked.parent[3], 2);
        assert_eq!(walked.parent[2], 0);
        assert!(walked.parent_interior(2));
        assert_eq!(walked.parent[0], 5);
        assert_eq!(walked.depth[3], 3);
        assert_eq!(walked.parent[4], NONE);
    }

    #[test]
    fn chains_end_at_a_strong_root_when_one_exists() {
        // Blocks 0..3; root 3 (weak) -> 0; root 4 (strong) -> 2 -> 1 -> 0.
        let mut graph = Graph::default();
        graph.add(3, 0, false);
        graph.add(4, 2, false);
        graph.add(2, 1, false);
        graph.add(1, 0, false);
        let walked = graph.walk(3, &[true, false], &[]);
        assert_eq!(walked.parent[0], 1);
        assert_eq!(walked.depth[0], 3);
        assert!((0..3).all(|block| !walked.weak(block)));
        let mut graph = Graph::default();
        graph.add(1, 0, false);
        let walked = graph.walk(1, &[true], &[]);
        assert!(walked.weak(0));
    }

    #[test]
    fn chains_of_start_pointers_come_before_interior_ones() {
        // Block 0, a large one: the strong root 1 points into its interior
        // (an integer that looks like a pointer, say); the weak root 2
        // points at its start, as untraced memory holding its real owner.
        let mut graph = Graph::default();
        graph.add(1, 0, true);
        graph.add(2, 0, false);
        let walked = graph.walk(1, &[false, true], &[]);
        assert_eq!(walked.parent[0], 2);
        assert!(!walked.parent_interior(0));
        assert!(walked.weak(0));
        assert!(!walked.through_interior(0));
        // Where only the interior pointer holds it, the chain takes it,
        // and goes on from it.
        let mut graph = Graph::default();
        graph.add(2, 0, true);
        graph.add(0, 1, false);
        let walked = graph.walk(2, &[false], &[]);
        assert_eq!(walked.parent[0], 2);
        assert_eq!(walked.parent[1], 0);
        assert!(walked.through_interior(1));
        assert_eq!(walked.depth[1], 2);
    }

    #[test]
    fn an_owning_chain_comes_before_a_shorter_registry() {
        // Block 0 (a buffer) <- 1 (C++ object) <- root 6, a registry, in
        // two steps; and <- 1 <- 2 (a Python object) <- 3 (a dict's data)
        // <- 4 (a dict) <- root 5: longer, but every step but one owning.
        let mut graph = Graph::default();
        graph.add(6, 1, false);
        graph.add(1, 0, false);
        graph.add(5, 4, false);
        graph.add(4, 3, false);
        graph.add(3, 2, false);
        graph.add(2, 1, false);
        let owners = [
            Owner::Unknown,
            Owner::Unknown,
            Owner::CountedObject,
            Owner::CountedData,
            Owner::CountedObject,
        ];
        let walked = graph.walk(5, &[false, false], &owners);
        assert_eq!(walked.parent[1], 2, "through the Python object");
        assert_eq!(walked.parent[2], 3);
        assert_eq!(walked.unowned[0], 1, "only the buffer's step is unknown");
        // Without ownership, the shortest chain wins.
        let walked = graph.walk(5, &[false, false], &[]);
        assert_eq!(walked.parent[1], 6);
    }

    #[test]
    fn a_cycle_without_a_root_is_unreachable() {
        let mut graph = Graph::default();
        graph.add(0, 1, false);
        graph.add(1, 0, false);
        let walked = graph.walk(2, &[false], &[]);
        assert_eq!(walked.class, [Class::Unreachable, Class::Unreachable]);
    }
}
