//! The reference graph: nodes are the traced blocks (0..blocks) and the
//! roots after them (a global, a thread's stack, its registers, untraced
//! memory); an edge is a word in its source that points into a block.
//! Two breadth-first walks from every root tell each block apart:
//! reachable through start pointers only, possibly lost (reached only
//! through a pointer into its interior somewhere on the way), unreachable
//! (no chain at all). The walk over every pointer keeps each block's
//! parent, for the shortest chain to a root, in four passes: through start
//! pointers from the strong roots (globals, thread stacks, registers), then
//! from the weak ones (untraced memory, where freed memory keeps stale
//! pointers), then the same two again through interior pointers as well.
//! A chain ends at a strong root whenever one exists without an interior
//! pointer, and takes an interior pointer (the likeliest to be an integer
//! that only looks like a pointer into a large block) only where no chain
//! of start pointers exists.
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

/// Edges as they are found, then walked.
#[derive(Default)]
pub struct Graph {
    /// (source, target block | INTERIOR when the pointer is not its start)
    edges: Vec<(Node, u32)>,
}

/// The walked graph.
pub struct Walked {
    pub class: Vec<Class>,
    /// Each node's parent on a shortest chain from a root.
    pub parent: Vec<Node>,
    /// Whether the pointer from the parent is an interior one.
    pub parent_interior: Vec<bool>,
    /// Steps from the nearest root (roots and unreached: u32::MAX).
    pub depth: Vec<u32>,
    /// Whether a block was reached from a weak root only.
    pub weak: Vec<bool>,
    /// Whether a block's chain takes an interior pointer somewhere.
    pub through_interior: Vec<bool>,
}

impl Graph {
    pub fn add(&mut self, source: Node, target: u32, interior: bool) {
        debug_assert!(target < INTERIOR);
        self.edges
            .push((source, target | if interior { INTERIOR } else { 0 }));
    }

    /// How many edges it holds (distinct, once walked).
    pub fn len(&self) -> usize {
        self.edges.len()
    }

    /// The edges, as (source, target block, interior).
    pub fn edges(&self) -> impl Iterator<Item = (Node, u32, bool)> + '_ {
        self.edges
            .iter()
            .map(|&(source, target)| (source, target & !INTERIOR, target & INTERIOR != 0))
    }

    /// Walks the graph of `blocks` blocks and the roots after them, weak
    /// where `weak_roots` says so.
    pub fn walk(&mut self, blocks: u32, weak_roots: &[bool]) -> Walked {
        let roots = weak_roots.len() as u32;
        let nodes = (blocks + roots) as usize;
        self.edges.sort_unstable();
        self.edges.dedup();
        // Compressed adjacency: the edges of node n are edges[first[n]..first[n + 1]].
        let mut first = vec![0usize; nodes + 1];
        for &(source, _) in &self.edges {
            first[source as usize + 1] += 1;
        }
        for index in 0..nodes {
            first[index + 1] += first[index];
        }
        let out = |node: Node| &self.edges[first[node as usize]..first[node as usize + 1]];
        let roots = blocks..blocks + roots;
        let through_starts = reached(blocks as usize, roots.clone(), &out);
        let mut parent = vec![NONE; nodes];
        let mut parent_interior = vec![false; nodes];
        let mut depth = vec![u32::MAX; nodes];
        let mut weak = vec![false; nodes];
        let mut through_interior = vec![false; nodes];
        for (interior, tier) in [(false, false), (false, true), (true, false), (true, true)] {
            let mut queue: VecDeque<Node> = roots
                .clone()
                .filter(|root| weak_roots[(root - blocks) as usize] == tier)
                .collect();
            for &root in &queue {
                depth[root as usize] = 0;
            }
            if interior {
                // On from every block reached so far from a root of this
                // tier, nearest first (a strong block's edges were all
                // followed in the strong interior pass already).
                let mut reached: Vec<Node> = (0..blocks)
                    .filter(|&block| {
                        depth[block as usize] != u32::MAX && weak[block as usize] == tier
                    })
                    .collect();
                reached.sort_by_key(|&block| depth[block as usize]);
                queue.extend(reached);
            }
            while let Some(node) = queue.pop_front() {
                for &(_, target) in out(node) {
                    let is_interior = target & INTERIOR != 0;
                    if is_interior && !interior {
                        continue;
                    }
                    let block = (target & !INTERIOR) as usize;
                    if depth[block] == u32::MAX {
                        depth[block] = depth[node as usize] + 1;
                        parent[block] = node;
                        parent_interior[block] = is_interior;
                        weak[block] = tier || weak[node as usize];
                        through_interior[block] = interior;
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
        weak.truncate(blocks as usize);
        through_interior.truncate(blocks as usize);
        Walked {
            class,
            parent,
            parent_interior,
            depth,
            weak,
            through_interior,
        }
    }
}

/// The blocks reached from `roots` through start pointers only.
fn reached<'a>(
    blocks: usize,
    roots: std::ops::Range<Node>,
    out: &impl Fn(Node) -> &'a [(Node, u32)],
) -> Vec<bool> {
    let mut seen = vec![false; blocks];
    let mut queue: VecDeque<Node> = roots.collect();
    while let Some(node) = queue.pop_front() {
        for &(_, target) in out(node) {
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
        let walked = graph.walk(5, &[false]);
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
        assert!(walked.parent_interior[2]);
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
        let walked = graph.walk(3, &[true, false]);
        assert_eq!(walked.parent[0], 1);
        assert_eq!(walked.depth[0], 3);
        assert_eq!(walked.weak, [false, false, false]);
        let mut graph = Graph::default();
        graph.add(1, 0, false);
        let walked = graph.walk(1, &[true]);
        assert!(walked.weak[0]);
    }

    #[test]
    fn chains_of_start_pointers_come_before_interior_ones() {
        // Block 0, a large one: the strong root 1 points into its interior
        // (an integer that looks like a pointer, say); the weak root 2
        // points at its start, as untraced memory holding its real owner.
        let mut graph = Graph::default();
        graph.add(1, 0, true);
        graph.add(2, 0, false);
        let walked = graph.walk(1, &[false, true]);
        assert_eq!(walked.parent[0], 2);
        assert!(!walked.parent_interior[0]);
        assert!(walked.weak[0]);
        assert!(!walked.through_interior[0]);
        // Where only the interior pointer holds it, the chain takes it,
        // and goes on from it.
        let mut graph = Graph::default();
        graph.add(2, 0, true);
        graph.add(0, 1, false);
        let walked = graph.walk(2, &[false]);
        assert_eq!(walked.parent[0], 2);
        assert_eq!(walked.parent[1], 0);
        assert!(walked.through_interior[1]);
        assert_eq!(walked.depth[1], 2);
    }

    #[test]
    fn a_cycle_without_a_root_is_unreachable() {
        let mut graph = Graph::default();
        graph.add(0, 1, false);
        graph.add(1, 0, false);
        let walked = graph.walk(2, &[false]);
        assert_eq!(walked.class, [Class::Unreachable, Class::Unreachable]);
    }
}
