//! One pass over the target's memory: every aligned 8-byte word of its
//! writable mappings, read in chunks with process_vm_readv, and the
//! registers of its blocked threads, checked against the traced blocks.
//! A word that points into a block is an edge from where it lies: the
//! block that holds it, or a root named by its place (a global of a
//! module, a thread's stack, untraced memory of a mapping).
use std::collections::HashMap;

use super::{
    blocks::Blocks,
    graph::{Graph, Node},
    memory::{self, MapsLine, Thread},
    names::{self, Globals},
};
use crate::{
    model::reachability::{HolderKind, HoldersScan},
    target_memory,
};

/// Bytes read per process_vm_readv.
const CHUNK_BYTES: usize = 1 << 20;
const PAGE_BYTES: u64 = 4096;
/// Most edges one scan keeps (8 bytes each: 256 MiB); past it, pointers
/// are counted, left out.
pub const MAX_EDGES: usize = 1 << 25;
/// The x86-64 red zone: a function may keep data this far below its
/// stack pointer.
const RED_ZONE_BYTES: u64 = 128;

/// The roots met so far, each named once.
#[derive(Default)]
pub struct Roots {
    pub names: Vec<(HolderKind, String)>,
    index: HashMap<(HolderKind, String), u32>,
}

impl Roots {
    fn intern(&mut self, kind: HolderKind, name: String) -> u32 {
        let next = self.names.len() as u32;
        *self.index.entry((kind, name)).or_insert_with_key(|key| {
            self.names.push(key.clone());
            next
        })
    }
}

/// Whose words a mapping holds, outside traced blocks.
enum Owner {
    /// A thread's stack, scanned from `from` up.
    Thread { name: String, from: u64 },
    /// A module's data: named by global symbol.
    Module(String),
    /// Any other mapping.
    Mapping(String),
}

fn thread_name(thread: &Thread) -> String {
    format!("thread {} ({})", thread.tid, thread.comm)
}

fn owner_of(pid: u32, region: &MapsLine, threads: &[Thread], globals: &Globals) -> Owner {
    if let Some(thread) = threads.iter().find(|thread| {
        thread
            .stack_pointer
            .is_some_and(|sp| (region.start..region.end).contains(&sp))
    }) {
        let sp = thread.stack_pointer.unwrap_or(region.start);
        return Owner::Thread {
            name: thread_name(thread),
            from: sp.saturating_sub(RED_ZONE_BYTES).max(region.start) & !7,
        };
    }
    if region.name == "[stack]" {
        let main = threads.iter().find(|thread| thread.tid == pid);
        return Owner::Thread {
            name: main.map_or_else(|| format!("thread {pid}"), thread_name) + ", running",
            from: region.start,
        };
    }
    match globals.module_name(region.start) {
        Some(module) => Owner::Module(module.to_owned()),
        None => Owner::Mapping(names::mapping_name(region)),
    }
}

/// Scans `pid` for pointers into `blocks`: the edges, the roots they come
/// from, and what was read (in `cost`). Words of a Python object's
/// collector header, and pointers into one, are links of the collector's
/// lists, a weak reference's referent keeps nothing alive, and a word in
/// a `parsed` range (sorted) outside blocks is free memory or allocator
/// data: counted, left out.
pub fn scan(
    pid: u32,
    blocks: &Blocks,
    parsed: &[(u64, u64)],
    globals: &Globals,
    cost: &mut HoldersScan,
) -> anyhow::Result<(Graph, Roots)> {
    let regions = globals.split_at_module_ends(memory::regions(pid)?);
    let threads = memory::threads(pid);
    cost.threads = threads.len() as u64;
    cost.threads_blocked = threads
        .iter()
        .filter(|thread| thread.stack_pointer.is_some())
        .count() as u64;
    let mut graph = Graph::default();
    let mut roots = Roots::default();
    let root_base = blocks.len() as u32;
    let mut buffer = vec![0u8; CHUNK_BYTES];
    let populated = memory::Populated::open(pid);
    let mut last_edge = None;
    for region in regions.iter().filter(|region| region.scanned()) {
        cost.mappings += 1;
        let owner = owner_of(pid, region, &threads, globals);
        let mut address = match &owner {
            Owner::Thread { from, .. } => *from,
            _ => region.start,
        };
        cost.bytes_below_stack_pointers += address - region.start;
        // The source of the words outside blocks: one root per mapping or
        // thread, one per global (the last one looked up kept).
        let mut region_root: Option<u32> = None;
        let mut last_global: Option<(u64, u64, u32)> = None;
        let mut cursor = blocks.first_ending_after(address);
        let mut parsed_cursor = parsed.partition_point(|&(_, end)| end <= address);
        // Only the pages that hold data: the rest reads as zeros.
        let mut resident = populated.ranges(address & !(PAGE_BYTES - 1), region.end);
        resident.reverse();
        let mut resident_end = address;
        while address < region.end {
            if address >= resident_end {
                let Some((start, end)) = resident.pop() else {
                    cost.bytes_not_resident += region.end - address;
                    break;
                };
                let start = start.max(address);
                cost.bytes_not_resident += start - address;
                address = start;
                resident_end = end;
                if address >= resident_end {
                    continue;
                }
            }
            let want = ((resident_end - address) as usize).min(CHUNK_BYTES);
            let read = target_memory::read(pid, address, &mut buffer[..want]) & !7;
            if read == 0 {
                let skip = (PAGE_BYTES - address % PAGE_BYTES).min(resident_end - address);
                cost.bytes_unreadable += skip;
                address += skip;
                continue;
            }
            cost.bytes_read += read as u64;
            for (index, word) in buffer[..read].chunks_exact(8).enumerate() {
                let value = u64::from_ne_bytes(word.try_into().expect("8 bytes"));
                let Some(hit) = blocks.find(value) else {
                    continue;
                };
                if hit.gc_link {
                    cost.gc_links += 1;
                    continue;
                }
                let location = address + 8 * index as u64;
                while cursor < blocks.len() && blocks.get(cursor as u32).end() <= location {
                    cursor += 1;
                }
                let source: Node = if cursor < blocks.len()
                    && blocks.get(cursor as u32).address <= location
                {
                    if cursor as u32 == hit.block {
                        continue;
                    }
                    if blocks
                        .gc_head(cursor as u32)
                        .is_some_and(|head| head.contains(&location))
                    {
                        cost.gc_links += 1;
                        continue;
                    }
                    if blocks.weak_referent_word(cursor as u32) == Some(location) {
                        cost.weak_referents += 1;
                        continue;
                    }
                    cursor as Node
                } else {
                    while parsed_cursor < parsed.len() && parsed[parsed_cursor].1 <= location {
                        parsed_cursor += 1;
                    }
                    if parsed_cursor < parsed.len() && parsed[parsed_cursor].0 <= location {
                        cost.free_words += 1;
                        continue;
                    }
                    root_base
                        + match &owner {
                            Owner::Module(module) => match last_global {
                                Some((start, end, root)) if (start..end).contains(&location) => {
                                    root
                                }
                                _ => {
                                    let (start, end, kind, name) =
                                        match globals.symbol_range(location) {
                                            Some((start, end, symbol, module)) => (
                                                start,
                                                end,
                                                HolderKind::Global,
                                                format!("{symbol} in {module}"),
                                            ),
                                            None => (
                                                location,
                                                location + 8,
                                                HolderKind::Global,
                                                format!("data of {module}"),
                                            ),
                                        };
                                    let root = roots.intern(kind, name);
                                    last_global = Some((start, end, root));
                                    root
                                }
                            },
                            Owner::Thread { name, .. } => *region_root.get_or_insert_with(|| {
                                roots.intern(HolderKind::Thread, name.clone())
                            }),
                            Owner::Mapping(name) => *region_root.get_or_insert_with(|| {
                                roots.intern(
                                    HolderKind::Untraced,
                                    format!("untraced memory in {name}"),
                                )
                            }),
                        }
                };
                // A run of words to one block from one source is one edge.
                if last_edge == Some((source, hit.block)) {
                    continue;
                }
                if graph.edge_count() >= MAX_EDGES {
                    cost.edges_left_out += 1;
                    continue;
                }
                last_edge = Some((source, hit.block));
                graph.add(source, hit.block, hit.interior);
            }
            address += read as u64;
        }
    }
    for thread in &threads {
        for &value in &thread.registers {
            if let Some(hit) = blocks.find(value).filter(|hit| !hit.gc_link) {
                let root = roots.intern(
                    HolderKind::Registers,
                    format!("registers of {}", thread_name(thread)),
                );
                graph.add(root_base + root, hit.block, hit.interior);
            }
        }
    }
    Ok((graph, roots))
}
