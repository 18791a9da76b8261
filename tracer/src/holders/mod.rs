//! Who holds it (`record --holders`): at the end of a recording, the
//! running target is read, never stopped, written or signalled, for
//! pointers to its traced live blocks, and the reference graph of those
//! blocks tells, per stack, which blocks nothing reaches (definitely lost,
//! and possibly lost through interior pointers only), what holds the
//! others, and the chains from the stack's blocks to the roots that hold
//! them.
//!
//! Memory tracer has no blocks for is read as its allocator sees it where
//! tracer knows the allocator: glibc's heap (its in-use chunks, made
//! before attach, become untraced blocks; free chunks and the allocator's
//! own data hold nothing) and a runtime's own allocator (CPython's
//! pymalloc pools, `runtimes::python::pools` through `runtime_heaps`:
//! their live objects become untraced blocks), so that a chain goes on
//! through what was there before attach, and what was there is counted by
//! type (the census).
//!
//! Limits, as `--help` states them: the scan is conservative (any word
//! that looks like a pointer into a block counts, an integer too); memory
//! no parsed allocator explains is a root of its own, "untraced memory in
//! MAPPING"; a running thread's stack pointer is unknown, so its stack is
//! scanned whole as untraced memory; and the target runs on while it is
//! read, so the graph is a best-effort snapshot: the memory is read twice,
//! and the blocks the second pass classes otherwise are counted.
//!
//! `blocks`: the block table (`index`: its page index); `memory`: /proc
//! and process_vm_readv; `names`: globals by ELF symbol; `glibc`: malloc's
//! heap; `runtime_heaps`: the seam for a runtime's memory (its allocator's
//! objects, its objects by type); `objects`: each block's type, a
//! runtime's or a C++ class; `census`: owners' data and what was there
//! before attach; `scan`: the pass over memory; `graph`: the walk;
//! `figures`: the per-stack figures and chains.
pub mod blocks;
mod census;
mod figures;
pub mod glibc;
pub mod graph;
mod index;
pub mod memory;
pub mod names;
pub mod objects;
pub mod runtime_heaps;
mod scan;

use std::time::Instant;

use anyhow::{Context as _, Result};

use crate::model::{
    StackKey,
    reachability::{HolderKind, HoldersScan, Reachability},
};
pub use blocks::Block;
use blocks::Blocks;
pub use census::Unrecorded;
use graph::{Graph, Walked};

/// The most untraced blocks (heap chunks, pymalloc objects) one scan adds
/// to its graph: about 60 bytes of tracer memory each, their pointers
/// included (docs/holders.md); those past it stay untraced memory.
const MAX_UNTRACED: usize = 4 << 20;

/// The walked reference graph of one process.
struct Scan {
    blocks: Blocks,
    /// The names of the blocks' types (Python, C++, `data of` them).
    type_names: Vec<String>,
    /// Each block's type as shown, in `type_names` (NO_TYPE: none).
    types: Vec<u32>,
    roots: Vec<(HolderKind, String)>,
    /// The edges, walked (sorted, each once).
    graph: Graph,
    walked: Walked,
    /// Why a chain that ends at untraced memory stops there.
    untraced_reason: String,
}

/// Scans process `pid` for pointers to its traced live `blocks`
/// (`blocks_gone`: LIVE entries that went away while read) and returns
/// the reachability of each group of stacks in `groups` (a listed stack
/// and those merged into it; `label` names a traced block's stack) and
/// what the scan read, found and cost; `unrecorded` is what the run did
/// not record after attach (the census counts it apart).
pub fn scan(
    pid: u32,
    blocks: Vec<Block>,
    blocks_gone: u64,
    groups: &[Vec<StackKey>],
    label: &mut dyn FnMut(&StackKey) -> String,
    heaps: &[&dyn runtime_heaps::RuntimeHeap],
    unrecorded: &Unrecorded,
) -> Result<(Vec<Reachability>, HoldersScan)> {
    let started = Instant::now();
    let cpu_started = thread_cpu_seconds();
    let traced = Blocks::new(blocks);
    let regions = memory::regions(pid)?;
    let globals = names::Globals::load(pid, &regions);
    let regions = globals.split_at_module_ends(regions);
    let traced_blocks = traced.len() as u64;
    let block_bytes = traced.iter().map(|block| block.size).sum();
    let globals_seconds = started.elapsed().as_secs_f64();
    let heap = glibc::find(pid, &regions, &traced, &globals, MAX_UNTRACED);
    let heap_seconds = started.elapsed().as_secs_f64() - globals_seconds;
    let room = MAX_UNTRACED - heap.blocks.len();
    let known = traced.with(heap.blocks);
    let context = runtime_heaps::ScanContext {
        pid,
        regions: &regions,
        globals: &globals,
    };
    let untraced = runtime_heaps::UntracedObjects::of(heaps, &context, &known, &heap.parsed, room);
    let untraced_objects = untraced.blocks.len() as u64;
    let parsed = glibc::sorted(heap.parsed.into_iter().chain(untraced.ranges).collect());
    let mut blocks = known.with(untraced.blocks);
    let mut readers: Vec<_> = heaps
        .iter()
        .filter_map(|heap| heap.objects(&context))
        .collect();
    let shapes = objects::read(pid, &blocks, &globals, &mut readers);
    drop(readers);
    blocks.set_shapes(shapes.of_block);
    let untraced_reason = match &heap.parse.not_parsed {
        Some(reason) => reason.clone(),
        None => format!(
            "no heap ({}), chunk or pymalloc pool tracer parsed covers it",
            heap.parse.allocator
        ),
    };
    let mut cost = HoldersScan {
        pid,
        blocks: traced_blocks,
        block_bytes,
        blocks_gone,
        blocks_overlapping: blocks.overlapping,
        python_objects: shapes.runtime_objects,
        cpp_objects: shapes.cpp_objects,
        untraced_pools: untraced.pools,
        untraced_pools_rejected: untraced.pools_rejected,
        untraced_objects,
        untraced_objects_left_out: untraced.objects_left_out,
        untraced_pool_bytes_read: untraced.bytes_read,
        heap: heap.parse,
        globals_seconds,
        heap_seconds,
        ..HoldersScan::default()
    };
    let (mut graph, roots) = scan::scan(pid, &blocks, &parsed, &globals, &mut cost)?;
    let mut type_names = shapes.types;
    let (types, owners) = census::types_of(&blocks, &mut type_names, graph.edges());
    let type_names = type_names.names;
    let weak = weak_roots(&roots.names);
    let walked = graph.walk(blocks.len() as u32, &weak, &owners);
    drop(owners);
    cost.pointers = graph.edge_count() as u64;
    cost.graph_bytes = (blocks.bytes() + graph.bytes() + walked.bytes() + types.len() * 4) as u64;
    let scan = Scan {
        blocks,
        type_names,
        types,
        roots: roots.names,
        graph,
        walked,
        untraced_reason,
    };
    let roots_of = scan.roots_of_blocks();
    cost.before_attach = census::before_attach(
        &scan.blocks,
        &scan.types,
        &scan.type_names,
        &roots_of,
        &scan.roots,
        unrecorded,
    );
    let found = scan.reachability(groups, &roots_of, label);
    drop(roots_of);
    cost.seconds = started.elapsed().as_secs_f64();
    // The target ran on while it was read: a second pass over the same
    // blocks tells how far one snapshot can be trusted (the first graph
    // dropped before, so that the two are never held at once).
    let rescan_started = Instant::now();
    let Scan { blocks, walked, .. } = scan;
    let classes = walked.class;
    let (mut again, again_roots) =
        scan::scan(pid, &blocks, &parsed, &globals, &mut HoldersScan::default())?;
    let walked_again = again.walk(blocks.len() as u32, &weak_roots(&again_roots.names), &[]);
    cost.rescan_disagreed_blocks = classes
        .iter()
        .zip(&walked_again.class)
        .filter(|(first, second)| first != second)
        .count() as u64;
    cost.rescan_seconds = rescan_started.elapsed().as_secs_f64();
    cost.cpu_seconds = thread_cpu_seconds() - cpu_started;
    // Everything above was read while the PID named the target, or the
    // scan is another process's (it exited and its PID was taken).
    crate::procfs::confirmed(pid, (found, cost))
        .with_context(|| format!("PID {pid} exited while it was scanned: no holders"))
}

/// Untraced memory is a weak root: freed memory keeps stale pointers.
fn weak_roots(roots: &[(HolderKind, String)]) -> Vec<bool> {
    roots
        .iter()
        .map(|(kind, _)| *kind == HolderKind::Untraced)
        .collect()
}

/// The CPU time of the calling thread, in seconds: the scan's cost on a
/// busy machine, where its wall-clock time also counts others' work.
fn thread_cpu_seconds() -> f64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
    time.tv_sec as f64 + time.tv_nsec as f64 * 1e-9
}
