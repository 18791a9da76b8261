//! The per-stack figures of a walked graph: how much of a stack's blocks
//! nothing reaches, what holds the rest directly, and the chains to the
//! distinct roots that hold them (up to three, each with the bytes whose
//! preferred chain ends there), the first through the root and entry that
//! hold most of them. Roots that reach the first chain's objects only
//! through a registry (a C or C++ global whose entries point at objects the
//! chain holds through owning references) are named as non-owning.
//!
//! Long: the per-stack figures of one walked graph (unreached, direct holders,
//! chains), computed together.
use std::collections::{HashMap, HashSet};

use super::{
    Scan,
    blocks::NO_TYPE,
    graph::{Class, NONE, Node},
};
use crate::model::{
    StackKey,
    reachability::{Holder, HolderKind, PathStep, Reachability, Registry, RootPath},
};

/// Chains shown per stack, and non-owning registries named.
const PATHS: usize = 3;
const REGISTRIES: usize = 3;
/// Holders of a chain's object looked at for registries, per object.
const SOURCES_PER_OBJECT: usize = 64;
/// Steps followed up a registry's chain before giving it up.
const MAX_CHAIN: usize = 10_000;

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

/// What one group's blocks hold per root: bytes, blocks, and the block
/// nearest the root.
#[derive(Clone, Copy)]
struct Held {
    bytes: u64,
    blocks: u64,
    nearest: u32,
}

impl Scan {
    /// The reachability of each group of stacks (a stack listed twice, as
    /// a top stack and a suspected leak, gets the same figures twice);
    /// `roots_of`: each block's root and entry.
    pub(super) fn reachability(
        &self,
        groups: &[Vec<StackKey>],
        roots_of: &[(Node, Node)],
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
        let found = self.reachability_of_distinct(&distinct, roots_of, label);
        positions
            .into_iter()
            .map(|position| found[position].clone())
            .collect()
    }

    /// The chain's rank of a block: start pointers, owning steps, then
    /// fewest steps first.
    fn rank(&self, block: usize) -> (bool, u32, u32) {
        (
            self.walked.through_interior(block),
            self.walked.unowned[block],
            self.walked.depth[block],
        )
    }

    fn reachability_of_distinct(
        &self,
        groups: &[Vec<StackKey>],
        roots_of: &[(Node, Node)],
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
        // Per group, root and the chain's entry from it, what they hold:
        // the first chain shown is through the root and entry that hold
        // most of the group's bytes, untraced memory counted as one against
        // a strong root, which wins a tie (a stale pointer to one block,
        // in a global that holds the rest through another chain too, is no
        // story of the leak). Per root alone, the other chains.
        let mut by_entry: Vec<HashMap<(Node, Node), Held>> = vec![HashMap::new(); groups.len()];
        let mut by_root: Vec<HashMap<Node, Held>> = vec![HashMap::new(); groups.len()];
        let mut block_groups: HashMap<u32, u32> = HashMap::new();
        for (index, block) in self.blocks.iter().enumerate() {
            if block.origin().is_some() {
                continue;
            }
            let Some(&list) = list_of.get(&block.key) else {
                continue;
            };
            block_groups.insert(index as u32, list);
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
                if root.0 == NONE {
                    continue;
                }
                for held in [
                    by_entry[group].entry(root).or_insert(Held {
                        bytes: 0,
                        blocks: 0,
                        nearest: index as u32,
                    }),
                    by_root[group].entry(root.0).or_insert(Held {
                        bytes: 0,
                        blocks: 0,
                        nearest: index as u32,
                    }),
                ] {
                    held.bytes += block.size;
                    held.blocks += 1;
                    if self.rank(index) < self.rank(held.nearest as usize) {
                        held.nearest = index as u32;
                    }
                }
            }
        }
        let mut labels = Labels::default();
        self.direct_holders(&block_groups, &lists, &mut results, &mut labels, label);
        let firsts: Vec<Option<u32>> = by_entry.iter().map(|held| self.first_chain(held)).collect();
        let chains: Vec<Vec<Node>> = firsts
            .iter()
            .map(|first| first.map_or_else(Vec::new, |block| self.chain(block)))
            .collect();
        let holders_of = self.holders_of(&chains);
        for (group, result) in results.iter_mut().enumerate() {
            result
                .held_by
                .sort_by(|a, b| (b.bytes, b.blocks, &a.name).cmp(&(a.bytes, a.blocks, &b.name)));
            let Some(first) = firsts[group] else {
                continue;
            };
            let first_root = roots_of[first as usize].0;
            let mut roots: Vec<(&Node, &Held)> = by_root[group]
                .iter()
                .filter(|(root, _)| **root != first_root)
                .collect();
            roots.sort_by_key(|(root, held)| (std::cmp::Reverse(held.bytes), **root));
            let first_held = by_root[group][&first_root];
            let mut first_held = first_held;
            first_held.nearest = first;
            for (root, held) in std::iter::once((&first_root, &first_held))
                .chain(roots)
                .take(PATHS)
            {
                let steps = self.path(held.nearest, &mut labels, label);
                let (kind, name) = self.roots[(*root - self.blocks.len() as Node) as usize].clone();
                result.paths.push(RootPath {
                    stopped: (kind == HolderKind::Untraced)
                        .then(|| format!("{name}: {}", self.untraced_reason)),
                    root: name,
                    kind,
                    bytes: held.bytes,
                    blocks: held.blocks,
                    unowned_steps: self.walked.unowned[held.nearest as usize],
                    steps,
                });
            }
            result.path_to_root = result.paths[0].steps.clone();
            result.non_owning = self.registries(
                &chains[group],
                first_root,
                roots_of,
                &holders_of,
                &mut labels,
                label,
            );
        }
        results
    }

    /// Direct holders: each (group, holder, block) once, holders by number
    /// (a root's, or a block label's after the roots').
    fn direct_holders(
        &self,
        block_groups: &HashMap<u32, u32>,
        lists: &[Vec<usize>],
        results: &mut [Reachability],
        labels: &mut Labels,
        label: &mut dyn FnMut(&StackKey) -> String,
    ) {
        let mut held: HashSet<(u32, u32, u32)> = HashSet::new();
        for (source, target, _) in self.graph.edges() {
            let Some(&list) = block_groups.get(&target) else {
                continue;
            };
            let holder = self.holder_id(source, labels, label);
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
            let (kind, name) = self.holder_of_id(holder, labels);
            results[group as usize].held_by.push(Holder {
                kind,
                name,
                blocks,
                bytes,
            });
        }
    }

    /// The block the first chain starts from: through the root and entry
    /// that hold most bytes, untraced memory counted as one holder against
    /// each strong root (its stale pointers spread over many mappings).
    fn first_chain(&self, held: &HashMap<(Node, Node), Held>) -> Option<u32> {
        let weak = |held: &Held| self.walked.weak(held.nearest as usize);
        let weak_bytes: u64 = held
            .values()
            .filter(|held| weak(held))
            .map(|held| held.bytes)
            .sum();
        let best = |is_weak: bool| {
            held.iter()
                .filter(|(_, held)| weak(held) == is_weak)
                .max_by_key(|&(&root, held)| (held.bytes, std::cmp::Reverse(root)))
                .map(|(_, held)| (held.bytes, held.nearest))
        };
        match (best(false), best(true)) {
            (Some((strong_bytes, block)), _) if strong_bytes >= weak_bytes => Some(block),
            (_, Some((_, block))) => Some(block),
            (strong, None) => strong.map(|(_, block)| block),
        }
    }

    /// The nodes of `block`'s chain, `block` first, its root last.
    fn chain(&self, block: u32) -> Vec<Node> {
        let mut nodes = Vec::new();
        let mut node = block;
        while node != NONE && nodes.len() < MAX_CHAIN {
            nodes.push(node);
            if node as usize >= self.blocks.len() {
                break;
            }
            node = self.walked.parent[node as usize];
        }
        nodes
    }

    /// The holders of every block on `chains` other than its parent there,
    /// at most SOURCES_PER_OBJECT each: one pass over the edges.
    fn holders_of(&self, chains: &[Vec<Node>]) -> HashMap<u32, Vec<Node>> {
        let mut holders: HashMap<u32, Vec<Node>> = chains
            .iter()
            .flatten()
            .filter(|&&node| (node as usize) < self.blocks.len())
            .map(|&node| (node, Vec::new()))
            .collect();
        for (source, target, _) in self.graph.edges() {
            if let Some(sources) = holders.get_mut(&target)
                && sources.len() < SOURCES_PER_OBJECT
                && self.walked.parent[target as usize] != source
            {
                sources.push(source);
            }
        }
        holders
    }

    /// The globals other than `first_root` that reach an object of
    /// `chain` (the first chain's nodes) from outside it, each through
    /// more steps of unknown ownership than the chain holds it by: a
    /// registry of live objects that points at an object held elsewhere.
    fn registries(
        &self,
        chain: &[Node],
        first_root: Node,
        roots_of: &[(Node, Node)],
        holders_of: &HashMap<u32, Vec<Node>>,
        labels: &mut Labels,
        label: &mut dyn FnMut(&StackKey) -> String,
    ) -> Vec<Registry> {
        let on_chain: HashSet<Node> = chain.iter().copied().collect();
        let blocks = self.blocks.len() as Node;
        let mut found: Vec<Registry> = Vec::new();
        let mut seen: HashSet<Node> = HashSet::new();
        for &object in chain.iter().filter(|&&node| node < blocks) {
            for &holder in holders_of.get(&object).into_iter().flatten() {
                let (root, unowned) = if holder >= blocks {
                    (holder, 0)
                } else {
                    (
                        roots_of[holder as usize].0,
                        self.walked.unowned[holder as usize],
                    )
                };
                if root == NONE || root == first_root || seen.contains(&root) {
                    continue;
                }
                let (kind, root_name) = &self.roots[(root - blocks) as usize];
                if *kind != HolderKind::Global
                    || unowned < self.walked.unowned[object as usize]
                    || (holder < blocks && !self.apart_from(holder, &on_chain))
                {
                    continue;
                }
                seen.insert(root);
                let (_, via) = self.holder_name(holder, labels, label);
                let points_at = self.object_name(object, labels, label);
                found.push(Registry {
                    root: root_name.clone(),
                    points_at: points_at.clone(),
                    via: via.clone(),
                    note: format!(
                        "non-owning: its entry ({via}) points at {points_at}, which the chain \
                         above holds through owning references: a registry of live objects, \
                         not their owner"
                    ),
                });
                if found.len() == REGISTRIES {
                    return found;
                }
            }
        }
        found
    }

    /// Whether `holder`'s own chain stays off `chain` (it is no object the
    /// chain itself holds).
    fn apart_from(&self, holder: u32, chain: &HashSet<Node>) -> bool {
        let mut node = holder;
        for _ in 0..MAX_CHAIN {
            if chain.contains(&node) {
                return false;
            }
            if node as usize >= self.blocks.len() {
                return true;
            }
            node = self.walked.parent[node as usize];
            if node == NONE {
                return true;
            }
        }
        false
    }

    /// A chain object as a report names it: its type, else its holder name.
    fn object_name(
        &self,
        block: u32,
        labels: &mut Labels,
        label: &mut dyn FnMut(&StackKey) -> String,
    ) -> String {
        match self.type_names.get(self.types[block as usize] as usize) {
            Some(type_name) => type_name.clone(),
            None => self.holder_name(block, labels, label).1,
        }
    }

    /// The root at the end of each block's chain and the chain's last
    /// block before it, its entry (NONE: unreached).
    pub(super) fn roots_of_blocks(&self) -> Vec<(Node, Node)> {
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
        let mut interior = false;
        for node in self.chain(block) {
            let (kind, name) = if let Some(origin) = self
                .blocks
                .get_checked(node)
                .and_then(|block| block.origin())
            {
                (HolderKind::Untraced, origin.name().to_owned())
            } else {
                self.holder_name(node, labels, label)
            };
            let is_block = (node as usize) < self.blocks.len();
            let type_id = if is_block {
                self.types[node as usize]
            } else {
                NO_TYPE
            };
            steps.push(PathStep {
                kind,
                name,
                address: is_block.then(|| self.blocks.get(node).address),
                interior,
                type_name: self.type_names.get(type_id as usize).cloned(),
            });
            if is_block {
                interior = self.walked.parent_interior(node as usize);
            }
        }
        steps
    }
}
