//! The recording file (`tracer record -o trace.tracer`): one trace saved so
//! that every report can be made later, elsewhere, without the target.
//!
//! Layout: an 8-byte magic, the format version (u32, little endian), then
//! records, each `[payload length: u32 LE][CRC-32 of length and payload:
//! u32 LE][payload]`. A payload is one [`Record`] encoded with postcard:
//!
//! - `Metadata` first, once: host, kernel, tracer version, start time,
//!   interval, targets with their command lines, the probes attached;
//! - `Stack` the first time a stack appears: its key and its frames, already
//!   symbolized, each with its module's build id and file offset. Stacks are
//!   numbered by the order of these records;
//! - `Snapshot` every interval: the counters of the stacks that changed
//!   since the previous snapshot (a stack absent keeps its counters, as in
//!   `model`), and the kernel's event and drop counters, right after a
//!   `CpuTime`: the CPU seconds each live target used since attach;
//! - `TargetExited` when a target exits; `End` when tracing stopped cleanly.
//!
//! Every record is flushed as soon as it is written, so a tracer killed
//! with SIGKILL leaves a file that reads up to its last complete snapshot.
//! The size grows with distinct stacks x snapshots, and a quiet stack costs
//! nothing per snapshot; the allocation rate does not matter.
//!
//! Why this format: postcard is a maintained serde format with a frozen wire
//! specification (1.0), compact varints and no schema compiler; the version
//! in the header guards what serde's field order cannot. Length prefixes
//! make a cut tail easy to find, and a CRC-32 per record (crc32fast) tells a
//! damaged record from a cut one.

use serde::{Deserialize, Serialize};

use crate::model::{
    Counters, Frame, MemoryStatus, Target,
    run::{LibraryReport, LoaderPauses, ProbeReport, SamplingReport, UnwindingReport},
};

mod read;
#[cfg(test)]
mod tests;
mod write;

pub use read::{Filter, Recording, parse, read};
pub use write::Writer;

/// The first bytes of every recording. The high first byte and the newline
/// catch files mangled by a text-mode transfer, as PNG's magic does.
pub const MAGIC: [u8; 8] = *b"\x89TRACER\n";
/// The format this build writes and the newest it reads (2 added
/// `Record::TargetMemory`, 3 `Record::Unwinding`, 4 the ELF virtual
/// address of each frame, `Frame::offset`, and `Frame::language`, 5
/// `Record::CpuTime`).
pub const FORMAT_VERSION: u32 = 5;
/// The last format whose frames are [`FrameV3`].
const LAST_FORMAT_WITHOUT_OFFSETS: u32 = 3;
/// Magic plus version.
const PREAMBLE_BYTES: usize = 12;
/// Payload length plus CRC.
const RECORD_HEADER_BYTES: usize = 8;
/// No record is larger; a length above it means a damaged header.
const MAX_RECORD_BYTES: u32 = 256 << 20;

/// What the whole trace is about, written once at the start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    pub tracer_version: String,
    /// Host name of the traced machine.
    pub host: String,
    /// Kernel release and build of the traced machine.
    pub kernel: String,
    /// When the probes were in place (time zero of every series), in
    /// milliseconds since the Unix epoch.
    pub started_at_unix_ms: u64,
    pub interval_ms: u64,
    /// The traced processes and their command lines, as attached.
    pub targets: Vec<Target>,
    /// Every probe attached, with the library it is in.
    pub probes: Vec<ProbeReport>,
    /// Exact or sampled, size filters, how return values were read.
    pub sampling: SamplingReport,
}

/// One entry of the file; `F` is the frame of the format (only formats 3
/// and older differ).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Record<F = Frame> {
    Metadata(Metadata),
    Stack(StackRecord<F>),
    Snapshot(SnapshotRecord),
    TargetExited {
        pid: u32,
        after_s: f64,
    },
    /// An object hooks were put in (at attach, or when it was mapped).
    Library(LibraryReport),
    End,
    /// A live target's RSS and its parts when tracing stopped.
    TargetMemory {
        pid: u32,
        status: MemoryStatus,
    },
    /// How stacks were walked, right after the metadata.
    Unwinding(UnwindingReport),
    /// The pauses at the loader gate, when tracing stopped.
    LoaderPauses(LoaderPauses),
    /// (pid, CPU seconds since attach) of each live target, right before
    /// the snapshot they were read with.
    CpuTime(Vec<(u32, f64)>),
}

/// A stack seen for the first time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct StackRecord<F = Frame> {
    pid: u32,
    stack_id: u32,
    /// `Kind::as_str`: a name, so kinds added later never shift meaning.
    kind: String,
    /// Innermost first, as symbolized (allocator frames not trimmed).
    frames: Vec<F>,
    /// The CUDA function that made its memory, for GPU stacks.
    api: Option<String>,
}

/// A frame as formats 1 to 3 wrote it: without `offset`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct FrameV3 {
    address: u64,
    function: Option<String>,
    file: Option<String>,
    line: Option<u32>,
    module: Option<String>,
    build_id: Option<String>,
    file_offset: Option<u64>,
}

impl From<Record<FrameV3>> for Record {
    fn from(record: Record<FrameV3>) -> Record {
        match record {
            Record::Metadata(metadata) => Record::Metadata(metadata),
            Record::Stack(stack) => Record::Stack(StackRecord {
                pid: stack.pid,
                stack_id: stack.stack_id,
                kind: stack.kind,
                frames: stack
                    .frames
                    .into_iter()
                    .map(|frame| Frame {
                        address: frame.address,
                        function: frame.function,
                        file: frame.file,
                        line: frame.line,
                        module: frame.module,
                        build_id: frame.build_id,
                        file_offset: frame.file_offset,
                        ..Frame::default()
                    })
                    .collect(),
                api: stack.api,
            }),
            Record::Snapshot(snapshot) => Record::Snapshot(snapshot),
            Record::TargetExited { pid, after_s } => Record::TargetExited { pid, after_s },
            Record::Library(library) => Record::Library(library),
            Record::End => Record::End,
            Record::TargetMemory { pid, status } => Record::TargetMemory { pid, status },
            Record::Unwinding(unwinding) => Record::Unwinding(unwinding),
            Record::LoaderPauses(pauses) => Record::LoaderPauses(pauses),
            Record::CpuTime(cpu_s) => Record::CpuTime(cpu_s),
        }
    }
}

/// The record in `payload`, written in format `version`.
fn decode(payload: &[u8], version: u32) -> postcard::Result<Record> {
    if version <= LAST_FORMAT_WITHOUT_OFFSETS {
        postcard::from_bytes::<Record<FrameV3>>(payload).map(Record::from)
    } else {
        postcard::from_bytes(payload)
    }
}

/// The changes of one snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct SnapshotRecord {
    /// Seconds since attach.
    elapsed_s: f64,
    /// (stack number, counters) of the stacks that changed.
    changed: Vec<(u32, Counters)>,
    /// STATS by `tracer_ebpf::stat` index, cumulative.
    stats: Vec<u64>,
    /// RSS of each live target, in bytes (for the growth plot).
    rss_bytes: Vec<(u32, u64)>,
    /// CPU seconds of each live target, from the `CpuTime` record just
    /// before (not written here: formats before 5 have none).
    #[serde(skip)]
    cpu_s: Vec<(u32, f64)>,
}

/// The CRC that guards a record: over its length field and its payload, so
/// a damaged length is caught whenever it still fits in the file.
fn record_crc(length: [u8; 4], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&length);
    hasher.update(payload);
    hasher.finalize()
}
