//! Writes a recording while tracing: the metadata when the probes are in
//! place, then each snapshot as it is taken, flushed at once.

use std::{
    collections::HashMap,
    fs::File,
    io::{BufWriter, Write as _},
    path::{Path, PathBuf},
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};

use super::{FORMAT_VERSION, MAGIC, Metadata, Record, SnapshotRecord, StackRecord, record_crc};
use crate::{
    model::{
        Counters, Frame, MemoryStatus, Snapshot, StackKey, Target,
        run::{LibraryReport, LoaderPauses, ProbeReport, SamplingReport, UnwindingReport},
    },
    procfs,
};

impl Metadata {
    /// Metadata of a trace on this machine whose probes were in place at
    /// `attached_at`.
    pub fn for_this_host(
        attached_at: Instant,
        interval_ms: u64,
        targets: Vec<Target>,
        probes: Vec<ProbeReport>,
        sampling: SamplingReport,
    ) -> Metadata {
        let started_at_unix_ms = (SystemTime::now() - attached_at.elapsed())
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        Metadata {
            tracer_version: env!("CARGO_PKG_VERSION").to_owned(),
            host: procfs::host_name(),
            kernel: procfs::kernel_description(),
            started_at_unix_ms,
            interval_ms,
            targets,
            probes,
            sampling,
        }
    }
}

/// What the writer asks of a stack shown for the first time: its frames,
/// and the CUDA function that made its memory (GPU stacks).
pub type StackOf<'a> = dyn FnMut(&StackKey) -> (Vec<Frame>, Option<String>) + 'a;

/// An open recording.
pub struct Writer {
    path: PathBuf,
    file: BufWriter<File>,
    /// Number of each stack already written, by key, with its counters
    /// last written.
    stack_numbers: HashMap<StackKey, (u32, Counters)>,
    /// The number of the next stack written.
    next_number: u32,
    bytes_written: u64,
}

impl Writer {
    /// Creates (or replaces) the file, mode 0600 and never through a
    /// symlink, and writes its header and metadata.
    pub fn create(path: &Path, metadata: Metadata) -> Result<Writer> {
        use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .and_then(|file| {
                file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                Ok(file)
            })
            .with_context(|| format!("could not create recording {}", path.display()))?;
        let mut writer = Writer {
            path: path.to_owned(),
            file: BufWriter::new(file),
            stack_numbers: HashMap::new(),
            next_number: 0,
            bytes_written: 0,
        };
        let mut preamble = MAGIC.to_vec();
        preamble.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        writer.write_bytes(&preamble)?;
        writer.write_record(&Record::Metadata(metadata))?;
        writer.flush()?;
        Ok(writer)
    }

    /// Appends a snapshot: first the stacks it shows for the first time,
    /// with their frames and CUDA API from `stack_of`, then the counters
    /// that changed. Flushed before returning.
    pub fn append_snapshot(
        &mut self,
        snapshot: &Snapshot,
        stack_of: &mut StackOf<'_>,
    ) -> Result<()> {
        let mut changed = Vec::new();
        for (key, counters) in &snapshot.stacks {
            let number = match self.stack_numbers.get_mut(key) {
                Some((number, written)) => {
                    if written == counters {
                        continue;
                    }
                    *written = *counters;
                    *number
                }
                None => {
                    let number = self.next_number;
                    self.next_number += 1;
                    let (frames, api) = stack_of(key);
                    self.write_record(&Record::Stack(StackRecord {
                        pid: key.pid,
                        stack_id: key.stack_id.to_raw(),
                        kind: key.kind.as_str().to_owned(),
                        frames,
                        api,
                    }))?;
                    self.stack_numbers.insert(*key, (number, *counters));
                    number
                }
            };
            changed.push((number, *counters));
        }
        self.write_record(&Record::CpuTime(snapshot.cpu_s.clone()))?;
        self.write_record(&Record::Snapshot(SnapshotRecord {
            elapsed_s: snapshot.elapsed_s,
            changed,
            stats: snapshot.stats.clone(),
            rss_bytes: snapshot.rss_bytes.clone(),
            cpu_s: Vec::new(),
        }))?;
        self.flush()
    }

    /// Forgets stacks that never change again (folded by the model): their
    /// last counters are written.
    pub fn forget(&mut self, keys: &[StackKey]) {
        for key in keys {
            self.stack_numbers.remove(key);
        }
    }

    /// Notes objects hooks were put in.
    pub fn append_libraries(&mut self, libraries: &[LibraryReport]) -> Result<()> {
        for library in libraries {
            self.write_record(&Record::Library(library.clone()))?;
        }
        self.flush()
    }

    /// Notes how stacks are walked (once, after the metadata).
    pub fn append_unwinding(&mut self, unwinding: &UnwindingReport) -> Result<()> {
        self.write_record(&Record::Unwinding(unwinding.clone()))?;
        self.flush()
    }

    /// Notes that a target exited `after_s` seconds after attach.
    pub fn append_exit(&mut self, pid: u32, after_s: f64) -> Result<()> {
        self.write_record(&Record::TargetExited { pid, after_s })?;
        self.flush()
    }

    /// A live target's RSS and its parts when tracing stopped.
    pub fn append_memory_status(&mut self, pid: u32, status: MemoryStatus) -> Result<()> {
        self.write_record(&Record::TargetMemory { pid, status })
    }

    /// The pauses at the loader gate, when tracing stopped.
    pub fn append_loader_pauses(&mut self, pauses: LoaderPauses) -> Result<()> {
        self.write_record(&Record::LoaderPauses(pauses))
    }

    /// Marks the recording complete and closes it.
    pub fn finish(mut self) -> Result<()> {
        self.write_record(&Record::End)?;
        self.flush()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes in the file so far.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    fn write_record(&mut self, record: &Record) -> Result<()> {
        let payload = postcard::to_stdvec(record).context("could not encode a record")?;
        let length = (payload.len() as u32).to_le_bytes();
        let mut framed = Vec::with_capacity(payload.len() + super::RECORD_HEADER_BYTES);
        framed.extend_from_slice(&length);
        framed.extend_from_slice(&record_crc(length, &payload).to_le_bytes());
        framed.extend_from_slice(&payload);
        self.write_bytes(&framed)
    }

    fn write_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        self.file
            .write_all(bytes)
            .with_context(|| format!("could not write recording {}", self.path.display()))?;
        self.bytes_written += bytes.len() as u64;
        Ok(())
    }

    /// Hands what is buffered to the kernel: from then on it survives the
    /// tracer being killed (not a power cut, which fsync would be for).
    fn flush(&mut self) -> Result<()> {
        self.file
            .flush()
            .with_context(|| format!("could not write recording {}", self.path.display()))
    }
}
