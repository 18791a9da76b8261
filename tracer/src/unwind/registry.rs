//! The unwind tables of every object that traced processes map: one per
//! file, built once and shared by every process that maps it (the same
//! build in two containers, by build id, is built once too), placed in one
//! row space of fixed capacity that the kernel's UNWIND_ROWS mirrors.
//!
//! Reading an object and building its rows takes up to ~0.5 s (libtorch),
//! so it runs on a background thread: collection asks for a process's
//! mappings, gets PENDING for what is still being built (the kernel walks
//! those frames by frame pointers and counts them), and asks again once
//! `take_ready` hands out new tables. Nothing here writes kernel maps: the
//! caller writes each ready table's rows at its place, then the mappings
//! of the processes that use it.
//!
//! Tables are kept for the whole run (the next process maps the same
//! libraries); the row space's capacity bounds their memory, and a table
//! that does not fit is a counted, reported failure.
//!
//! Long: one row space shared by every object's table: placing, evicting and
//! mirroring it into the kernel's map.
use std::{
    collections::HashMap,
    fmt,
    fs::File,
    os::unix::fs::MetadataExt as _,
    path::PathBuf,
    sync::mpsc::{self, Receiver, RecvTimeoutError, Sender},
    thread,
    time::{Duration, Instant},
};

use tracer_ebpf::{
    MAX_UNWIND_MAPPINGS, UNWIND_ROW_SEARCH_STEPS, UnwindMapping, UnwindMappings, UnwindRow,
    UnwindTable, mapping_unwind,
};

use super::{
    frame_pointers,
    modules::{self, ObjectInfo, Segment},
    tables::{self, BuiltRows, FrameSections},
};
use crate::procfs::Mapping;

/// Index of a table in UNWIND_TABLES (only built tables get one).
pub type TableId = u32;

/// How much the kernel's maps hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindMapSizes {
    /// Entries of UNWIND_ROWS.
    pub rows: u32,
    /// Entries of UNWIND_TABLES.
    pub tables: u32,
}

/// A file's identity: what `stat` says of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileKey {
    device: u64,
    inode: u64,
    size: u64,
    modified: i64,
}

/// Where one file's table stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableState {
    /// Being read and built on the background thread.
    Pending,
    /// Built and placed: its id and its rows' place.
    Ready(TableId, UnwindTable),
    /// The object keeps frame pointers (`frame_pointers.rs`): no table.
    FramePointers,
    /// The object has no call frame information that parses.
    NoUnwindInfo,
    /// Not readable as an ELF object.
    NotAnObject,
    /// Built, but its rows do not fit the row space left (or no table id
    /// is left): its frames are walked by frame pointers.
    NoRoom,
    /// More rows than the kernel's bounded search reaches
    /// (2^`UNWIND_ROW_SEARCH_STEPS`): frame pointers.
    TooManyRows,
}

/// One file's table, for `-v`: `Display` writes one line.
#[derive(Clone, Debug)]
pub struct TableInfo {
    /// The path of the file where it was first mapped.
    pub path: PathBuf,
    pub state: TableState,
    pub rows: u32,
    pub fdes: u32,
    pub fdes_skipped: u32,
    /// Reading the object, deciding on frame pointers and building rows.
    pub build_time: Duration,
    /// The same build as an earlier file (by build id): that file's table
    /// serves this one.
    same_as: Option<usize>,
    segments: Vec<Segment>,
}

impl TableInfo {
    pub fn bytes(&self) -> u64 {
        u64::from(self.rows) * size_of::<UnwindRow>() as u64
    }
}

impl fmt::Display for TableInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |name| name.to_string_lossy().into_owned(),
        );
        write!(f, "unwind table {name}: ")?;
        let built = |f: &mut fmt::Formatter<'_>| {
            write!(
                f,
                "{} rows ({:.1} MiB) from {} FDEs",
                self.rows,
                self.bytes() as f64 / f64::from(1 << 20),
                self.fdes
            )?;
            if self.fdes_skipped > 0 {
                write!(f, " ({} left out)", self.fdes_skipped)?;
            }
            write!(f, ", built in {} ms", self.build_time.as_millis())
        };
        match self.state {
            TableState::Pending => write!(f, "pending"),
            TableState::Ready(..) if self.same_as.is_some() => {
                write!(f, "the same build as another file's table")
            }
            TableState::Ready(..) => built(f),
            TableState::FramePointers => write!(f, "frame pointers (no table needed)"),
            TableState::NoUnwindInfo => write!(f, "no unwind information: frame pointers"),
            TableState::NotAnObject => write!(f, "not an ELF object: frame pointers"),
            TableState::NoRoom => {
                built(f)?;
                write!(f, "; no room left in the row space: frame pointers")
            }
            TableState::TooManyRows => {
                built(f)?;
                write!(f, "; too many rows for the kernel's search: frame pointers")
            }
        }
    }
}

/// Totals over all tables, for `-v` and the report: `Display` writes one
/// line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TablesSummary {
    pub ready: u32,
    pub pending: u32,
    pub frame_pointers: u32,
    /// No unwind information, or not an object.
    pub without_info: u32,
    /// Tables that did not fit, in the row space or in the kernel's
    /// search (counted once per file).
    pub no_room: u32,
    pub rows_used: u32,
    pub capacity: UnwindMapSizes,
}

impl fmt::Display for TablesSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |rows: u32| f64::from(rows) * size_of::<UnwindRow>() as f64 / f64::from(1 << 20);
        write!(
            f,
            "unwind tables: {} ready ({} rows, {:.1} of {:.1} MiB), {} pending, {} objects with frame pointers, {} without unwind information",
            self.ready,
            self.rows_used,
            mib(self.rows_used),
            mib(self.capacity.rows),
            self.pending,
            self.frame_pointers,
            self.without_info
        )?;
        if self.no_room > 0 {
            write!(f, ", {} did not fit", self.no_room)?;
        }
        Ok(())
    }
}

/// A table built since the last `take_ready`: write `rows` at
/// `table.first_row` of UNWIND_ROWS, then `table` at `id` of
/// UNWIND_TABLES.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyTable {
    pub id: TableId,
    pub table: UnwindTable,
    pub rows: Vec<UnwindRow>,
}

/// A process's executable mappings for UNWIND_MAPPINGS.
pub struct ProcessMappings {
    pub mappings: Box<UnwindMappings>,
    /// Mappings whose table is still being built: ask again after
    /// `take_ready` hands out tables.
    pub pending: u32,
    /// Mappings beyond `MAX_UNWIND_MAPPINGS`, left out (walked by frame
    /// pointers, as addresses outside every mapping are).
    pub left_out: u32,
    /// Mappings whose file could not be opened (the process exited, or
    /// the file is gone): listed as frame pointers.
    pub unreadable: u32,
}

/// A mapping walked by frame pointers.
fn frame_pointers(mapping: &Mapping) -> UnwindMapping {
    UnwindMapping {
        start: mapping.start,
        end: mapping.end,
        bias: 0,
        unwind: mapping_unwind::FRAME_POINTERS,
        table: 0,
    }
}

/// What the background thread reads and builds.
struct Job {
    file_index: usize,
    file: File,
}

/// What it found.
struct Done {
    file_index: usize,
    outcome: Outcome,
    segments: Vec<Segment>,
    build_time: Duration,
}

enum Outcome {
    Rows(BuiltRows),
    /// The same build id as an earlier file.
    SameAs(usize),
    FramePointers,
    NoUnwindInfo,
    NotAnObject,
}

/// The tables of every file seen, and the row space they are placed in.
pub struct UnwindTables {
    capacity: UnwindMapSizes,
    by_key: HashMap<FileKey, usize>,
    files: Vec<TableInfo>,
    rows_used: u32,
    tables_used: u32,
    ready: Vec<ReadyTable>,
    jobs: Sender<Job>,
    done: Receiver<Done>,
    in_flight: usize,
    /// Per process, the files its last `process_mappings` found pending.
    waiting: HashMap<u32, Vec<usize>>,
}

impl UnwindTables {
    /// Starts the background builder. With `trust_frame_pointers`, objects
    /// that keep frame pointers get no table (`--unwind auto`); without,
    /// every object with unwind information does.
    pub fn new(capacity: UnwindMapSizes, trust_frame_pointers: bool) -> UnwindTables {
        let (jobs, job_queue) = mpsc::channel::<Job>();
        let (finished, done) = mpsc::channel();
        thread::Builder::new()
            .name("unwind-tables".into())
            .spawn(move || build_jobs(job_queue, finished, trust_frame_pointers))
            .expect("a thread for unwind tables");
        UnwindTables {
            capacity,
            by_key: HashMap::new(),
            files: Vec::new(),
            rows_used: 0,
            tables_used: 0,
            ready: Vec::new(),
            jobs,
            done,
            in_flight: 0,
            waiting: HashMap::new(),
        }
    }

    /// The UNWIND_MAPPINGS value of process `pid` from its mappings
    /// (`procfs::read_maps`); files never seen are queued for building.
    /// Costs an open and a stat per executable mapping, never a build.
    pub fn process_mappings(&mut self, pid: u32, mappings: &[Mapping]) -> ProcessMappings {
        self.poll();
        let mut executable: Vec<&Mapping> = mappings.iter().filter(|m| m.executable).collect();
        executable.sort_by_key(|mapping| mapping.start);
        let mut result = ProcessMappings {
            mappings: Box::default(),
            pending: 0,
            left_out: 0,
            unreadable: 0,
        };
        let list = &mut result.mappings;
        let mut waiting = Vec::new();
        for mapping in executable {
            let entry = match self.file_index(pid, mapping) {
                Some(index) => {
                    let entry = self.mapping_entry(index, mapping);
                    if entry.unwind == mapping_unwind::PENDING {
                        waiting.push(index);
                    }
                    entry
                }
                None => {
                    result.unreadable += 1;
                    frame_pointers(mapping)
                }
            };
            if entry.unwind == mapping_unwind::PENDING {
                result.pending += 1;
            }
            let count = list.count as usize;
            if let Some(last) = count.checked_sub(1).map(|index| &mut list.mappings[index])
                && last.end == entry.start
                && (last.unwind, last.table, last.bias) == (entry.unwind, entry.table, entry.bias)
            {
                last.end = entry.end;
            } else if count < MAX_UNWIND_MAPPINGS {
                list.mappings[count] = entry;
                list.count += 1;
            } else {
                result.left_out += 1;
            }
        }
        if waiting.is_empty() {
            self.waiting.remove(&pid);
        } else {
            self.waiting.insert(pid, waiting);
        }
        result
    }

    /// The processes whose last `process_mappings` had a pending table
    /// that is now decided: call `process_mappings` for each again (after
    /// writing `take_ready`'s tables). Cheap.
    pub fn processes_to_refresh(&mut self) -> Vec<u32> {
        self.poll();
        let files = &self.files;
        let mut due: Vec<u32> = self
            .waiting
            .iter()
            .filter(|(_, waiting)| {
                waiting.iter().any(|&index| {
                    let index = files[index].same_as.unwrap_or(index);
                    files[index].state != TableState::Pending
                })
            })
            .map(|(&pid, _)| pid)
            .collect();
        due.sort_unstable();
        due
    }

    /// Forgets a process that exited (its tables stay, for the next
    /// process that maps the same files).
    pub fn forget_process(&mut self, pid: u32) {
        self.waiting.remove(&pid);
    }

    /// The entry of one executable mapping of the file `index`.
    fn mapping_entry(&self, index: usize, mapping: &Mapping) -> UnwindMapping {
        let frame_pointers = frame_pointers(mapping);
        let segments = &self.files[index].segments;
        let index = self.files[index].same_as.unwrap_or(index);
        match self.files[index].state {
            TableState::Pending => UnwindMapping {
                unwind: mapping_unwind::PENDING,
                ..frame_pointers
            },
            TableState::Ready(id, _) => match modules::address_of_mapping(segments, mapping) {
                Some(address) => UnwindMapping {
                    bias: mapping.start.wrapping_sub(address),
                    unwind: mapping_unwind::TABLE,
                    table: id,
                    ..frame_pointers
                },
                None => frame_pointers,
            },
            _ => frame_pointers,
        }
    }

    /// The file a mapping maps, queued for building when new; None when it
    /// cannot be opened.
    fn file_index(&mut self, pid: u32, mapping: &Mapping) -> Option<usize> {
        let file = modules::open_mapped(pid, mapping)?;
        let metadata = file.metadata().ok()?;
        let key = FileKey {
            device: metadata.dev(),
            inode: metadata.ino(),
            size: metadata.size(),
            modified: metadata.mtime(),
        };
        if let Some(&index) = self.by_key.get(&key) {
            return Some(index);
        }
        let file_index = self.files.len();
        self.files.push(TableInfo {
            path: mapping.path.clone(),
            state: TableState::Pending,
            rows: 0,
            fdes: 0,
            fdes_skipped: 0,
            build_time: Duration::ZERO,
            same_as: None,
            segments: Vec::new(),
        });
        self.by_key.insert(key, file_index);
        // The builder lives as long as `self`: sending cannot fail.
        self.jobs.send(Job { file_index, file }).ok()?;
        self.in_flight += 1;
        Some(file_index)
    }

    /// Takes in the builds finished since the last call; true when any
    /// was. Cheap: it never waits.
    pub fn poll(&mut self) -> bool {
        let mut any = false;
        while let Ok(done) = self.done.try_recv() {
            self.finish(done);
            any = true;
        }
        any
    }

    /// Waits up to `timeout` for every queued build; true when none is
    /// left.
    pub fn wait_for_builds(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.poll();
        while self.in_flight > 0 {
            match self
                .done
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(done) => self.finish(done),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        self.in_flight == 0
    }

    /// Places a finished build in the row space.
    fn finish(&mut self, done: Done) {
        self.in_flight -= 1;
        let info = &mut self.files[done.file_index];
        info.segments = done.segments;
        info.build_time = done.build_time;
        let state = match done.outcome {
            Outcome::FramePointers => TableState::FramePointers,
            Outcome::NoUnwindInfo => TableState::NoUnwindInfo,
            Outcome::NotAnObject => TableState::NotAnObject,
            Outcome::SameAs(first) => {
                info.same_as = Some(first);
                TableState::Pending
            }
            Outcome::Rows(built) => {
                info.rows = built.rows.len() as u32;
                info.fdes = built.fdes;
                info.fdes_skipped = built.fdes_skipped;
                let room = self.capacity.rows - self.rows_used;
                if info.rows > 1 << UNWIND_ROW_SEARCH_STEPS {
                    TableState::TooManyRows
                } else if info.rows > room || self.tables_used >= self.capacity.tables {
                    TableState::NoRoom
                } else {
                    let id = self.tables_used;
                    let table = UnwindTable {
                        first_row: self.rows_used,
                        row_count: info.rows,
                    };
                    self.tables_used += 1;
                    self.rows_used += info.rows;
                    self.ready.push(ReadyTable {
                        id,
                        table,
                        rows: built.rows,
                    });
                    TableState::Ready(id, table)
                }
            }
        };
        let state = match self.files[done.file_index].same_as {
            Some(first) => self.files[first].state,
            None => state,
        };
        self.files[done.file_index].state = state;
    }

    /// The tables built since the last call, their rows moved out (the
    /// registry keeps only their place). Cheap apart from the rows' move.
    pub fn take_ready(&mut self) -> Vec<ReadyTable> {
        self.poll();
        std::mem::take(&mut self.ready)
    }

    /// Every file seen, in the order first seen.
    pub fn tables(&self) -> &[TableInfo] {
        &self.files
    }

    pub fn summary(&self) -> TablesSummary {
        let mut summary = TablesSummary {
            rows_used: self.rows_used,
            capacity: self.capacity,
            ..TablesSummary::default()
        };
        for info in self.files.iter().filter(|info| info.same_as.is_none()) {
            match info.state {
                TableState::Pending => summary.pending += 1,
                TableState::Ready(..) => summary.ready += 1,
                TableState::FramePointers => summary.frame_pointers += 1,
                TableState::NoUnwindInfo | TableState::NotAnObject => summary.without_info += 1,
                TableState::NoRoom | TableState::TooManyRows => summary.no_room += 1,
            }
        }
        summary
    }
}

/// The background thread: reads each queued file, decides, builds. Ends
/// when the registry is dropped.
fn build_jobs(jobs: Receiver<Job>, done: Sender<Done>, trust_frame_pointers: bool) {
    crate::procfs::lower_this_threads_priority();
    let mut builds: HashMap<Vec<u8>, usize> = HashMap::new();
    for job in jobs {
        let started = Instant::now();
        let (outcome, segments) = match ObjectInfo::read(&job.file) {
            None => (Outcome::NotAnObject, Vec::new()),
            Some(object) => {
                let first = object
                    .build_id()
                    .map(|id| *builds.entry(id.to_vec()).or_insert(job.file_index));
                let outcome = match first {
                    Some(first) if first != job.file_index => Outcome::SameAs(first),
                    _ if trust_frame_pointers
                        && frame_pointers::keeps_frame_pointers(&object) == Some(true) =>
                    {
                        Outcome::FramePointers
                    }
                    _ => {
                        let built = tables::build_rows(&FrameSections::of(&object));
                        if built.rows.is_empty() {
                            Outcome::NoUnwindInfo
                        } else {
                            Outcome::Rows(built)
                        }
                    }
                };
                (outcome, object.segments().to_vec())
            }
        };
        let finished = Done {
            file_index: job.file_index,
            outcome,
            segments,
            build_time: started.elapsed(),
        };
        if done.send(finished).is_err() {
            return;
        }
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
