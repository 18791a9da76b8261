//! Who holds a stack's blocks (`record --holders`): the result of scanning
//! the target for pointers to its traced live blocks, per stack and per
//! scan. Pure data; `holders` computes it, `output` renders it.

/// What holds a block: another traced block, a global, a thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HolderKind {
    /// A traced live block, named by its stack's site label.
    #[default]
    Block,
    /// A module's global, named `SYMBOL in MODULE` (`data of MODULE`
    /// where no symbol covers the word).
    Global,
    /// A thread's stack, from its stack pointer up: `thread TID (COMM)`.
    Thread,
    /// The argument registers of the system call a thread is blocked in.
    Registers,
    /// Memory tracer does not know the blocks of (allocated before attach,
    /// allocator metadata, freed memory): named by its mapping.
    Untraced,
}

/// One holder of a stack's blocks and how much of it it holds directly.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Holder {
    pub kind: HolderKind,
    pub name: String,
    /// The stack's blocks it points into, and their bytes.
    pub blocks: u64,
    pub bytes: u64,
}

/// One step of a chain to a root.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PathStep {
    pub kind: HolderKind,
    pub name: String,
    /// A block's address (null for a root).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<u64>,
    /// The pointer to the step before points into that block's interior.
    pub interior: bool,
    /// What the block is, read from its first words: a Python object's
    /// type (`tp_name`: `dict`, `numpy.ndarray`), a C++ object's class
    /// (from its vtable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
}

/// What the scan found for one stack's blocks (those live at the scan).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Reachability {
    /// No pointer reaches them from anywhere readable ("definitely lost").
    pub unreachable_bytes: u64,
    pub unreachable_blocks: u64,
    /// Reached only through a pointer into some block's interior.
    pub possibly_lost_bytes: u64,
    pub possibly_lost_blocks: u64,
    /// Reached from a root through start pointers.
    pub reachable_bytes: u64,
    pub reachable_blocks: u64,
    /// Direct holders, most bytes first.
    pub held_by: Vec<Holder>,
    /// The chain from one of the stack's blocks to the root that holds
    /// most of them, the stack's own block first, the root last; empty
    /// when none is reached (`paths[0].steps`).
    pub path_to_root: Vec<PathStep>,
    /// The distinct roots that hold the stack's blocks, up to three, each
    /// with its chain and the bytes whose preferred chain ends there.
    pub paths: Vec<RootPath>,
    /// Globals that reach the first chain's objects without owning them.
    pub non_owning: Vec<Registry>,
}

/// One root that holds a stack's blocks, and the chain to it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RootPath {
    pub root: String,
    pub kind: HolderKind,
    /// The stack's blocks whose preferred chain ends at this root (each
    /// block counted under one root: the chains' bytes do not overlap).
    pub bytes: u64,
    pub blocks: u64,
    /// Steps of the chain whose ownership is unknown (a C or C++ pointer;
    /// a Python reference, counted by its object, owns).
    pub unowned_steps: u32,
    /// The stack's block nearest the root first, the root last.
    pub steps: Vec<PathStep>,
    /// Where tracer could not follow the chain on (untraced memory no
    /// parsed allocator explains), and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// A global that reaches an object of a chain without owning it: a
/// registry of live objects (a map whose entries point at objects held
/// elsewhere).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Registry {
    pub root: String,
    /// The chain's object its entry points at, and the entry.
    pub points_at: String,
    pub via: String,
    pub note: String,
}

/// What one scan of a process read and found, and what it cost.
///
/// Wide: the JSON report's `holders_scans[]` entry, one field per key.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct HoldersScan {
    pub pid: u32,
    /// Seconds to read the kernel's LIVE table, then to scan and walk
    /// (the modules' symbols and the heap's parse first), and the CPU
    /// seconds of both passes.
    pub live_read_seconds: f64,
    pub seconds: f64,
    pub globals_seconds: f64,
    pub heap_seconds: f64,
    pub cpu_seconds: f64,
    /// Bytes read from the target's writable mappings, and the bytes of
    /// those mappings that could not be read (guard pages).
    pub bytes_read: u64,
    pub bytes_unreadable: u64,
    /// Bytes of the writable mappings neither resident nor swapped out
    /// (never written: zeros), not read.
    pub bytes_not_resident: u64,
    /// Pointers left out past the scan's cap on edges (holders::scan::MAX_EDGES).
    pub edges_left_out: u64,
    /// Thread stack bytes below a blocked thread's stack pointer: dead
    /// frames, not scanned.
    pub bytes_below_stack_pointers: u64,
    pub mappings: u64,
    pub threads: u64,
    /// Threads whose stack pointer and registers were readable (blocked);
    /// a running thread's stack is scanned whole, as untraced memory.
    pub threads_blocked: u64,
    /// Traced live blocks scanned for, and their bytes.
    pub blocks: u64,
    pub block_bytes: u64,
    /// Aligned words that point into a traced block (distinct edges).
    pub pointers: u64,
    /// LIVE entries that went away while the table was read (or belong to
    /// an image replaced by exec, or a destroyed CUDA context), and entries
    /// left out because they overlapped another block.
    pub blocks_gone: u64,
    pub blocks_overlapping: u64,
    /// A second pass over the same blocks, right after: the blocks it
    /// classes otherwise (the target changed its pointers meanwhile), and
    /// what it took.
    pub rescan_disagreed_blocks: u64,
    pub rescan_seconds: f64,
    /// Tracer memory for the block table and the graph.
    pub graph_bytes: u64,
    /// Blocks named as a Python object (by its type) and as a C++ object
    /// (by its vtable's class).
    pub python_objects: u64,
    pub cpp_objects: u64,
    /// Words left out as links of CPython's collector lists (a header's
    /// words, pointers into a header), first pass.
    pub gc_links: u64,
    /// Referents of CPython weak references (`wr_object`), left out: a
    /// weak reference keeps nothing alive.
    pub weak_referents: u64,
    /// CPython's small objects in untraced memory, found from the headers
    /// of pymalloc's pools and added to the graph as untraced blocks: the
    /// pools, headers that looked right but whose free list disagreed,
    /// the objects added and those left out past the cap (1 Mi), and the
    /// bytes read to find them.
    pub untraced_pools: u64,
    pub untraced_pools_rejected: u64,
    pub untraced_objects: u64,
    pub untraced_objects_left_out: u64,
    pub untraced_pool_bytes_read: u64,
    /// The heap as its allocator sees it, read from outside.
    pub heap: HeapParse,
    /// Words that point into a block but lie in free memory or the
    /// allocator's own data (a parsed heap or pool outside its blocks):
    /// stale pointers, no references, left out (first pass).
    pub free_words: u64,
    /// What the process held before tracer attached.
    pub before_attach: BeforeAttach,
}

/// What the parse of a target's heap found: glibc malloc's arenas and
/// chunks, in use and free, and the chunks it mapped on their own.
///
/// Wide: the JSON report's heap-parse figures, one field per key.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HeapParse {
    /// e.g. "glibc 2.36 (main_arena by debug symbols)"; empty when not
    /// parsed.
    pub allocator: String,
    /// Why the heap before attach was not parsed, when it was not
    /// ("heap before attach not parsed for jemalloc").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_parsed: Option<String>,
    pub arenas: u64,
    pub heaps: u64,
    /// Chunks the walk saw in use (tcache and fastbin chunks among them),
    /// and those of them tracer has no block for, added to the graph.
    pub chunks_in_use: u64,
    pub untraced_chunks: u64,
    pub untraced_chunk_bytes: u64,
    /// Untraced chunks past the scan's cap on untraced blocks: left out,
    /// with the arena memory after the first of them (untraced memory).
    pub chunks_left_out: u64,
    /// Free chunks in the bins (the next chunk says so), and their bytes.
    pub free_chunks: u64,
    pub free_bytes: u64,
    /// Thread caches found, those that changed on each of three reads,
    /// and the chunks on their lists; chunks on the fastbins.
    pub tcaches: u64,
    pub tcaches_unreadable: u64,
    pub tcache_chunks: u64,
    pub fastbin_chunks: u64,
    /// Chunks malloc mapped on their own that tracer has no block for.
    pub mmapped_chunks: u64,
    pub mmapped_chunk_bytes: u64,
    /// Headers that made no sense (a chunk changing while read): the walk
    /// went on from the next traced block; the bytes it skipped.
    pub resyncs: u64,
    pub unparsed_bytes: u64,
    pub bytes_read: u64,
}

/// The memory a process held before tracer attached, as far as the scan
/// could find it (the heap's chunks tracer has no block for, pymalloc's
/// objects in pools of arenas mapped before attach), by type.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct BeforeAttach {
    pub bytes: u64,
    pub blocks: u64,
    /// Most bytes first; memory without a type is listed as "untyped".
    pub by_type: Vec<TypeCensus>,
    /// Why the blocks above may also have been made after attach, by calls
    /// tracer did not record (`sampled out (--sample-bytes N)`, `dropped
    /// (live_map_full=N)`); empty: every call within the size filters was
    /// recorded, so they were there before attach.
    pub or_unrecorded: Vec<String>,
    /// The blocks outside the size filters (`--min-size`, `--max-size`,
    /// by their chunk's size): tracer records none of them, so they may
    /// be from before attach or after; not in the figures above.
    pub outside_size_filters: UntracedTotals,
}

/// Bytes and blocks of untraced memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UntracedTotals {
    pub bytes: u64,
    pub blocks: u64,
}

/// One type's share of what was there before attach.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TypeCensus {
    /// A Python type (`dict`), a C++ class, `data of numpy.ndarray` (a
    /// buffer named after the object that owns it), or `untyped`.
    #[serde(rename = "type")]
    pub type_name: String,
    pub bytes: u64,
    pub blocks: u64,
    /// The root that holds most of these bytes ("unreachable" when
    /// nothing does).
    pub root: String,
}
