//! Reads a recording back into what every report is made from: a
//! [`Model`], the frames of each stack and the metadata.
//!
//! A file cut short (tracer killed, copy interrupted) is read up to its last
//! complete record and says so in [`Recording::warning`]; a missing, damaged
//! or newer-version file is an error whose one line names the problem.
//!
//! Recordings come from other machines: the file is read record by record
//! (never whole), each kind of record has a size cap checked before it is
//! decoded, and what the decoded records hold is counted against
//! MAX_HELD_BYTES, so that no file makes `tracer report` hold more than
//! about 256 MiB.
//!
//! Long: the reader of every record kind of the format, with its checks
//! against damage, in one pass.

use std::{
    collections::{BTreeMap, HashMap},
    io::Read,
    path::Path,
};

use anyhow::Result;

use super::{
    FORMAT_VERSION, MAGIC, MAX_RECORD_BYTES, Metadata, PREAMBLE_BYTES, RECORD_HEADER_BYTES, Record,
    SnapshotRecord, StackRecord, decode, record_crc,
};
use crate::{
    error::{ExitCode, fatal},
    model::{
        Counters, Frame, Kind, MemoryStatus, Model, Snapshot, StackId, StackKey, Target,
        quality::is_thread_entry,
        run::{LibraryReport, LoaderPauses, RunFacts, StackFacts, Traced, UnwindingReport},
    },
};

/// A stack of the recording; `key` is `None` for a memory kind this build
/// does not know (written by a newer tracer).
#[derive(Clone, Debug)]
struct RecordedStack {
    key: Option<StackKey>,
    frames: Vec<Frame>,
    api: Option<String>,
}

/// How the file ends.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ending {
    /// With the end mark: tracing stopped cleanly.
    Complete,
    /// After a complete record, without the end mark.
    Unfinished,
    /// Inside a record that starts at this byte.
    CutAt(usize),
}

/// A recording, read.
#[derive(Clone, Debug)]
pub struct Recording {
    pub metadata: Metadata,
    /// How stacks were walked (None: written before format 3).
    pub unwinding: Option<UnwindingReport>,
    /// The pauses at the loader gate (none when not recorded).
    pub loader_pauses: LoaderPauses,
    stacks: Vec<RecordedStack>,
    snapshots: Vec<SnapshotRecord>,
    /// (pid, seconds after attach) of each target exit.
    exits: Vec<(u32, f64)>,
    libraries: Vec<LibraryReport>,
    /// RSS and its parts of the targets alive when tracing stopped.
    memory_status: BTreeMap<u32, MemoryStatus>,
    ending: Ending,
    /// Name of the file, for messages.
    name: String,
}

/// Which part of a recording a report covers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Filter {
    pub pid: Option<u32>,
    pub kind: Option<Kind>,
    /// Count only what happened after this many seconds after attach: the
    /// counters of the last snapshot at or before it become zero, and time
    /// starts at that snapshot.
    pub from_s: Option<f64>,
    /// Leave out snapshots taken after this many seconds after attach.
    pub to_s: Option<f64>,
}

/// The largest stack record decoded (a stack's frames: thousands of
/// frames fit), and the largest of any other kind (a snapshot's changed
/// counters: some 500 000 stacks fit); the decoded records take at most
/// about 25 and 8 times their encoded bytes.
pub const MAX_STACK_RECORD_BYTES: usize = 1 << 20;
pub const MAX_OTHER_RECORD_BYTES: usize = 8 << 20;
/// The most memory the decoded records of one recording may take
/// (estimated from what they hold).
pub const MAX_HELD_BYTES: usize = 160 << 20;

/// `Record::Stack`'s variant index, the first byte of its payload.
const STACK_VARIANT: u8 = 1;

/// Reads the recording at `path`, record by record.
pub fn read(path: &Path) -> Result<Recording> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|error| {
        fatal(
            ExitCode::BadRecording,
            format!("cannot read {name}: {error}"),
        )
    })?;
    parse_from(std::io::BufReader::new(file), &name)
}

/// Parses the bytes of a recording; `name` is what messages call it.
pub fn parse(bytes: &[u8], name: &str) -> Result<Recording> {
    parse_from(bytes, name)
}

/// Reads up to `buffer.len()` bytes: how many came (fewer at the end).
fn read_up_to(source: &mut impl Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buffer.len() {
        match source.read(&mut buffer[done..]) {
            Ok(0) => break,
            Ok(count) => done += count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(done)
}

/// Parses a recording read from `source`; `name` is what messages call it.
pub fn parse_from(mut source: impl Read, name: &str) -> Result<Recording> {
    let bad = |problem: String| fatal(ExitCode::BadRecording, format!("{name} {problem}"));
    let too_large = |offset: usize, bytes: usize, cap: usize| {
        bad(format!(
            "is too large to report: the record at byte {offset} holds {bytes} bytes (at most \
             {} MiB)",
            cap >> 20
        ))
    };
    let read_error = |error: std::io::Error| bad(format!("could not be read: {error}"));
    let mut preamble = [0u8; PREAMBLE_BYTES];
    let got = read_up_to(&mut source, &mut preamble).map_err(read_error)?;
    let bytes = &preamble[..got];
    if bytes.is_empty() {
        return Err(bad(
            "is empty: not a tracer recording, or one killed before it began".to_owned(),
        ));
    }
    let magic_bytes = bytes.len().min(MAGIC.len());
    if bytes[..magic_bytes] != MAGIC[..magic_bytes] {
        return Err(bad(
            "is not a tracer recording (wrong magic bytes)".to_owned()
        ));
    }
    if bytes.len() < PREAMBLE_BYTES {
        return Err(bad("is truncated inside its header".to_owned()));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version > FORMAT_VERSION {
        return Err(bad(format!(
            "was written by a newer tracer (recording format {version}; this tracer reads \
             format {FORMAT_VERSION}): upgrade tracer to read it"
        )));
    }
    if version == 0 {
        return Err(bad("is corrupt: its format version is 0".to_owned()));
    }

    let mut builder = Builder::default();
    let mut offset = PREAMBLE_BYTES;
    let mut payload = Vec::new();
    let ending = loop {
        let mut header = [0u8; RECORD_HEADER_BYTES];
        let got = read_up_to(&mut source, &mut header).map_err(read_error)?;
        if got == 0 {
            break Ending::Unfinished;
        }
        if builder.ended {
            return Err(bad(format!(
                "is corrupt: data follows its end mark at byte {offset}"
            )));
        }
        if got < RECORD_HEADER_BYTES {
            break Ending::CutAt(offset);
        }
        let length_bytes: [u8; 4] = header[..4].try_into().expect("4 bytes");
        let length = u32::from_le_bytes(length_bytes);
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        if length > MAX_RECORD_BYTES {
            return Err(bad(format!(
                "is corrupt: the record at byte {offset} claims {length} bytes"
            )));
        }
        if length as usize > MAX_OTHER_RECORD_BYTES {
            return Err(too_large(offset, length as usize, MAX_OTHER_RECORD_BYTES));
        }
        let start = offset + RECORD_HEADER_BYTES;
        // Read in steps, so that a length the file does not hold costs
        // no more than the file.
        payload.clear();
        let got = (&mut source)
            .take(u64::from(length))
            .read_to_end(&mut payload)
            .map_err(read_error)?;
        if got < length as usize {
            break Ending::CutAt(offset);
        }
        if record_crc(length_bytes, &payload) != crc {
            return Err(bad(format!(
                "is corrupt: the record at byte {offset} fails its checksum"
            )));
        }
        if payload.first() == Some(&STACK_VARIANT) && payload.len() > MAX_STACK_RECORD_BYTES {
            return Err(too_large(offset, payload.len(), MAX_STACK_RECORD_BYTES));
        }
        let record = decode(&payload, version).map_err(|error| {
            bad(format!(
                "is corrupt: the record at byte {offset} does not decode ({error})"
            ))
        })?;
        builder.held_bytes += held_bytes(&record);
        if builder.held_bytes > MAX_HELD_BYTES {
            return Err(bad(format!(
                "is too large to report: its records up to byte {offset} hold more than {} MiB",
                MAX_HELD_BYTES >> 20
            )));
        }
        builder
            .add(record)
            .map_err(|problem| bad(format!("is corrupt: the record at byte {offset} {problem}")))?;
        offset = start + length as usize;
    };
    let ending = if builder.ended {
        Ending::Complete
    } else {
        ending
    };
    let Some(metadata) = builder.metadata else {
        return Err(bad(
            "is truncated before its metadata: tracer stopped before it attached".to_owned(),
        ));
    };
    Ok(Recording {
        metadata,
        stacks: builder.stacks,
        snapshots: builder.snapshots,
        exits: builder.exits,
        libraries: builder.libraries,
        memory_status: builder.memory_status,
        unwinding: builder.unwinding,
        loader_pauses: builder.loader_pauses,
        ending,
        name: name.to_owned(),
    })
}

/// Collects records and checks that they fit together.
///
/// Wide: one field per kind of record of the recording being read back.
#[derive(Default)]
struct Builder {
    metadata: Option<Metadata>,
    stacks: Vec<RecordedStack>,
    snapshots: Vec<SnapshotRecord>,
    exits: Vec<(u32, f64)>,
    libraries: Vec<LibraryReport>,
    memory_status: BTreeMap<u32, MemoryStatus>,
    unwinding: Option<UnwindingReport>,
    loader_pauses: LoaderPauses,
    /// The CPU times read with the next snapshot.
    pending_cpu_s: Vec<(u32, f64)>,
    ended: bool,
    /// What the records decoded so far take, estimated.
    held_bytes: usize,
}

/// The memory a decoded record takes, and what the model built from it
/// will take again, estimated from what it holds.
fn held_bytes(record: &Record) -> usize {
    use std::mem::size_of;
    let text = |text: &Option<String>| text.as_ref().map_or(0, String::len);
    match record {
        Record::Stack(stack) => {
            size_of::<RecordedStack>()
                + stack.kind.len()
                + text(&stack.api)
                + stack
                    .frames
                    .iter()
                    .map(|frame| {
                        size_of::<Frame>()
                            + text(&frame.function)
                            + text(&frame.file)
                            + text(&frame.module)
                            + text(&frame.build_id)
                    })
                    .sum::<usize>()
        }
        // Each changed counter again in the model.
        Record::Snapshot(snapshot) => {
            size_of::<SnapshotRecord>()
                + snapshot.changed.len() * size_of::<(u32, Counters)>() * 2
                + snapshot.stats.len() * 8 * 2
                + snapshot.rss_bytes.len() * 16 * 2
        }
        Record::CpuTime(cpu_s) => cpu_s.len() * 16 * 2,
        _ => size_of::<Record>(),
    }
}

impl Builder {
    fn add(&mut self, record: Record) -> Result<(), String> {
        match (&self.metadata, record) {
            (None, Record::Metadata(metadata)) => self.metadata = Some(metadata),
            (None, _) => return Err("comes before the metadata".to_owned()),
            (Some(_), Record::Metadata(_)) => return Err("repeats the metadata".to_owned()),
            (Some(_), Record::Stack(stack)) => self.stacks.push(recorded_stack(stack)),
            (Some(_), Record::Snapshot(snapshot)) => {
                let last_s = self.snapshots.last().map_or(0.0, |last| last.elapsed_s);
                if !(snapshot.elapsed_s >= last_s && snapshot.elapsed_s.is_finite()) {
                    return Err(format!(
                        "goes back in time ({} s after {last_s} s)",
                        snapshot.elapsed_s
                    ));
                }
                let stack_count = self.stacks.len();
                if let Some((number, _)) = snapshot
                    .changed
                    .iter()
                    .find(|(number, _)| *number as usize >= stack_count)
                {
                    return Err(format!(
                        "names stack {number} of {stack_count} recorded so far"
                    ));
                }
                self.snapshots.push(SnapshotRecord {
                    cpu_s: std::mem::take(&mut self.pending_cpu_s),
                    ..snapshot
                });
            }
            (Some(_), Record::TargetExited { pid, after_s }) => self.exits.push((pid, after_s)),
            (Some(_), Record::Library(library)) => self.libraries.push(library),
            (Some(_), Record::End) => self.ended = true,
            (Some(_), Record::Unwinding(unwinding)) => self.unwinding = Some(unwinding),
            (Some(_), Record::LoaderPauses(pauses)) => self.loader_pauses = pauses,
            (Some(_), Record::TargetMemory { pid, status }) => {
                self.memory_status.insert(pid, status);
            }
            (Some(_), Record::CpuTime(cpu_s)) => self.pending_cpu_s = cpu_s,
        }
        Ok(())
    }
}

fn recorded_stack(stack: StackRecord) -> RecordedStack {
    RecordedStack {
        key: Kind::from_name(&stack.kind).map(|kind| StackKey {
            pid: stack.pid,
            stack_id: StackId::from_raw(stack.stack_id),
            kind,
        }),
        frames: stack.frames,
        api: stack.api,
    }
}

impl Recording {
    /// Complete snapshots in the file.
    pub fn snapshot_count(&self) -> usize {
        self.snapshots.len()
    }

    /// Why the report may not show the whole trace, if it may not.
    pub fn warning(&self) -> Option<String> {
        let holds = format!(
            "reporting the {} snapshots it holds ({:.1} s)",
            self.snapshots.len(),
            self.snapshots.last().map_or(0.0, |last| last.elapsed_s)
        );
        match self.ending {
            Ending::Complete => None,
            Ending::Unfinished => Some(format!(
                "{} has no end mark (tracer was killed, or is still recording): {holds}",
                self.name
            )),
            Ending::CutAt(offset) => Some(format!(
                "{} is truncated at byte {offset} (tracer was killed, or the copy is \
                 incomplete): {holds}",
                self.name
            )),
        }
    }

    /// RSS and its parts at the end of tracing, of the targets alive then;
    /// none when the filter ends the window early (`--to`).
    pub fn memory_status(&self, filter: &Filter) -> BTreeMap<u32, MemoryStatus> {
        if filter.to_s.is_some() {
            return BTreeMap::new();
        }
        self.memory_status
            .iter()
            .filter(|(pid, _)| filter.pid.is_none_or(|wanted| wanted == **pid))
            .map(|(pid, status)| (*pid, *status))
            .collect()
    }

    /// The traced processes, with their exits, keeping those the filter
    /// selects.
    pub fn targets(&self, filter: &Filter) -> Vec<Target> {
        self.metadata
            .targets
            .iter()
            .filter(|target| filter.pid.is_none_or(|pid| pid == target.pid))
            .map(|target| Target {
                exited_after_s: self
                    .exits
                    .iter()
                    .find(|(pid, _)| *pid == target.pid)
                    .map(|&(_, after_s)| after_s),
                ..target.clone()
            })
            .collect()
    }

    /// The objects hooked, at attach and later, of the processes `filter`
    /// selects.
    pub fn libraries(&self, filter: &Filter) -> Vec<LibraryReport> {
        self.libraries
            .iter()
            .filter(|library| filter.pid.is_none_or(|pid| pid == library.pid))
            .cloned()
            .collect()
    }

    /// The CUDA function that made each GPU stack's memory, by key.
    pub fn apis_by_key(&self) -> HashMap<StackKey, String> {
        self.stacks
            .iter()
            .filter_map(|stack| Some((stack.key?, stack.api.clone()?)))
            .collect()
    }

    /// Every stack's recorded frames, innermost first, by key, moved out
    /// of the recording (a copy doubled `tracer report`'s memory: 93 MiB
    /// more for a 20 s torch recording).
    pub fn take_frames_by_key(&mut self) -> HashMap<StackKey, Vec<Frame>> {
        self.stacks
            .iter_mut()
            .filter_map(|stack| Some((stack.key?, std::mem::take(&mut stack.frames))))
            .collect()
    }

    /// What the recorded run tells its report beside the model, of the
    /// processes `filter` selects: every stack's frames moved out of the
    /// recording, each through `fill` (symbols from `--debug-dir`); no
    /// cost (a recording keeps none).
    pub fn run_facts(
        &mut self,
        filter: &Filter,
        mut fill: impl FnMut(Vec<Frame>) -> Vec<Frame>,
    ) -> RunFacts {
        let mut stacks = StackFacts {
            apis: self.apis_by_key(),
            ..StackFacts::default()
        };
        for (key, frames) in self.take_frames_by_key() {
            let frames = fill(frames);
            if frames.last().is_some_and(is_thread_entry) {
                stacks.reaching_entry.insert(key);
            }
            stacks
                .frames
                .insert(key, frames.into_iter().map(std::sync::Arc::new).collect());
        }
        let traced = Traced {
            probes: (self.metadata.probes.iter())
                .filter(|probe| filter.pid.is_none_or(|pid| pid == probe.pid))
                .cloned()
                .collect(),
            sampling: self.metadata.sampling.clone(),
            unwinding: self.unwinding.clone(),
            libraries: self.libraries(filter),
            loader_pauses: self.loader_pauses,
            ..Traced::default()
        };
        RunFacts {
            targets: self.targets(filter),
            interval_ms: self.metadata.interval_ms,
            memory_status: self.memory_status(filter),
            memory_limits: BTreeMap::new(),
            traced,
            stacks,
        }
    }

    /// The model of the part of the trace that `filter` selects: fed the
    /// same snapshots as the live run's model, so with no filter it is the
    /// same model.
    pub fn model(&self, filter: &Filter) -> Model {
        let selected = |stack: &RecordedStack| {
            stack.key.is_some_and(|key| {
                filter.pid.is_none_or(|pid| pid == key.pid)
                    && filter.kind.is_none_or(|kind| kind == key.kind)
            })
        };
        // Time zero of the report: the last snapshot at or before --from,
        // whose counters are subtracted from every later one.
        let mut base_s = 0.0;
        let mut current = vec![Counters::default(); self.stacks.len()];
        let mut baseline: Option<(Vec<Counters>, Vec<u64>)> = None;
        // The last snapshot at or before --from: its counters are copied
        // once, when the first snapshot after it comes.
        let mut base_snapshot: Option<&SnapshotRecord> = None;
        // CPU seconds of each process at time zero.
        let mut base_cpu_s: BTreeMap<u32, f64> = BTreeMap::new();
        let mut model = Model::new();
        for snapshot in &self.snapshots {
            if filter.to_s.is_some_and(|to_s| snapshot.elapsed_s > to_s) {
                break;
            }
            if filter
                .from_s
                .is_some_and(|from_s| snapshot.elapsed_s <= from_s)
            {
                for &(number, counters) in &snapshot.changed {
                    current[number as usize] = counters;
                }
                base_snapshot = Some(snapshot);
                base_s = snapshot.elapsed_s;
                base_cpu_s.extend(snapshot.cpu_s.iter().copied());
                continue;
            }
            if let Some(base) = base_snapshot.take() {
                baseline = Some((current.clone(), base.stats.clone()));
            }
            for &(number, counters) in &snapshot.changed {
                current[number as usize] = counters;
            }
            let stacks = snapshot
                .changed
                .iter()
                .filter(|(number, _)| selected(&self.stacks[*number as usize]))
                .filter_map(|&(number, counters)| {
                    let key = self.stacks[number as usize].key?;
                    let since = baseline.as_ref().map(|(base, _)| base[number as usize]);
                    Some((
                        key,
                        since.map_or(counters, |base| difference(counters, base)),
                    ))
                })
                .collect();
            let stats = match &baseline {
                Some((_, base_stats)) => snapshot
                    .stats
                    .iter()
                    .enumerate()
                    .map(|(index, &count)| {
                        count.saturating_sub(base_stats.get(index).copied().unwrap_or(0))
                    })
                    .collect(),
                None => snapshot.stats.clone(),
            };
            let cpu_s = snapshot
                .cpu_s
                .iter()
                .filter(|(pid, _)| filter.pid.is_none_or(|selected| selected == *pid))
                .map(|&(pid, cpu_s)| (pid, cpu_s - base_cpu_s.get(&pid).copied().unwrap_or(0.0)))
                .collect();
            model.push(Snapshot {
                elapsed_s: snapshot.elapsed_s - base_s,
                stacks,
                stats,
                rss_bytes: snapshot.rss_bytes.clone(),
                retired: Vec::new(),
                cpu_s,
            });
        }
        model
    }
}

/// What changed from `base` to `counters`.
fn difference(counters: Counters, base: Counters) -> Counters {
    Counters {
        live_bytes: counters.live_bytes.wrapping_sub(base.live_bytes),
        live_allocs: counters.live_allocs.wrapping_sub(base.live_allocs),
        alloc_bytes_total: counters
            .alloc_bytes_total
            .saturating_sub(base.alloc_bytes_total),
        alloc_count_total: counters
            .alloc_count_total
            .saturating_sub(base.alloc_count_total),
    }
}
