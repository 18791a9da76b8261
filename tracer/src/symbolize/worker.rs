//! blazesym on a thread of its own, so that a slow look-up never holds
//! the collect loop: the first look-up in a file parses its symbols, and
//! with DWARF its whole line program and functions, which takes seconds
//! for a big debug file and as long as a hostile target likes for a
//! library it made (tests/fixtures/slow_dwarf_lib.c). The loop sends
//! look-ups and waits for their answers a bounded time
//! ([`super::Symbols`]); what comes later is kept for the next time the
//! same addresses are asked for. [`THREADS`] threads share the files, each
//! file always on the same one: a slow file holds up only the files that
//! share its thread.
use std::{
    fs::File,
    os::fd::AsRawFd as _,
    sync::{
        Arc,
        mpsc::{self, Receiver, RecvTimeoutError, Sender},
    },
    time::Instant,
};

use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use super::{elf_source, fd_path, frames_of, new_symbolizer, symbolize_in};
use crate::model::Frame;

/// Symbolizer threads.
pub const THREADS: usize = 4;

/// One address to look up in a mapped file (and first in its debug
/// file), with the files held open until it is answered.
pub(super) struct Lookup {
    pub pid: u32,
    pub return_address: u64,
    /// The debug file, whether blazesym may read its DWARF, and the ELF
    /// virtual address to look up in it (already inside the call).
    pub debug_file: Option<(Arc<File>, bool, u64)>,
    /// The mapped file, whether blazesym may read its DWARF, and the file
    /// offset to look up in it (already inside the call).
    pub object: (Arc<File>, bool, u64),
    /// The frame without a function: module, build id and offsets.
    pub unresolved: Frame,
}

impl Lookup {
    fn run(&self, symbolizer: &Symbolizer) -> Vec<Frame> {
        // The debug file first: the object itself may be stripped.
        let from_debug_file =
            self.debug_file
                .as_ref()
                .and_then(|(file, dwarf, virtual_address)| {
                    symbolize_in(
                        symbolizer,
                        elf_source(fd_path(file), *dwarf),
                        *virtual_address,
                        &self.unresolved,
                    )
                });
        if let Some(frames) = from_debug_file {
            return frames;
        }
        let (file, dwarf, file_offset) = &self.object;
        let source = elf_source(fd_path(file), *dwarf);
        match symbolizer.symbolize_single(&source, Input::FileOffset(*file_offset)) {
            Ok(Symbolized::Sym(symbol)) => frames_of(&symbol, &self.unresolved),
            _ => vec![self.unresolved.clone()],
        }
    }
}

enum Request {
    Resolve(Vec<Lookup>),
    /// Forget every file blazesym has cached (a descriptor number closed
    /// may be given to another file).
    Reset,
}

/// The frames of one looked-up address.
pub(super) struct Answer {
    pub pid: u32,
    pub return_address: u64,
    pub frames: Vec<Frame>,
}

/// The loop's end of the symbolizer threads.
pub(super) struct Worker {
    requests: Vec<Sender<Request>>,
    answers: Receiver<Answer>,
}

/// Why [`Worker::answer_by`] returned no answer.
pub(super) enum NoAnswer {
    /// The deadline passed first.
    Late,
    /// The thread is gone.
    Gone,
}

impl Worker {
    /// Starts the threads; None when one could not be started.
    pub fn start() -> Option<Worker> {
        let (answer, answers) = mpsc::channel();
        let requests = (0..THREADS)
            .map(|_| start_thread(answer.clone()))
            .collect::<Option<Vec<_>>>()?;
        Some(Worker { requests, answers })
    }

    /// Sends look-ups, each to its file's thread; false when a thread is
    /// gone.
    pub fn send(&self, lookups: Vec<Lookup>) -> bool {
        let mut by_thread: Vec<Vec<Lookup>> = (0..THREADS).map(|_| Vec::new()).collect();
        for lookup in lookups {
            let thread = lookup.object.0.as_raw_fd().unsigned_abs() as usize % THREADS;
            by_thread[thread].push(lookup);
        }
        by_thread
            .into_iter()
            .zip(&self.requests)
            .filter(|(lookups, _)| !lookups.is_empty())
            .all(|(lookups, requests)| requests.send(Request::Resolve(lookups)).is_ok())
    }

    pub fn reset(&self) {
        for requests in &self.requests {
            let _ = requests.send(Request::Reset);
        }
    }

    /// An answer that already came, if any.
    pub fn answer_now(&self) -> Option<Answer> {
        self.answers.try_recv().ok()
    }

    /// The next answer, waiting until `deadline` at most.
    pub fn answer_by(&self, deadline: Instant) -> Result<Answer, NoAnswer> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.answers
            .recv_timeout(left)
            .map_err(|error| match error {
                RecvTimeoutError::Timeout => NoAnswer::Late,
                RecvTimeoutError::Disconnected => NoAnswer::Gone,
            })
    }
}

/// One symbolizer thread, with blazesym's cache of the files it was
/// given; None when it could not be started.
fn start_thread(answer: Sender<Answer>) -> Option<Sender<Request>> {
    let (requests, incoming) = mpsc::channel::<Request>();
    std::thread::Builder::new()
        .name("tracer-symbols".to_owned())
        .spawn(move || {
            let mut symbolizer = new_symbolizer();
            for request in incoming {
                match request {
                    Request::Reset => symbolizer = new_symbolizer(),
                    Request::Resolve(lookups) => {
                        for lookup in lookups {
                            let frames = lookup.run(&symbolizer);
                            let sent = answer.send(Answer {
                                pid: lookup.pid,
                                return_address: lookup.return_address,
                                frames,
                            });
                            if sent.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        })
        .ok()?;
    Some(requests)
}
