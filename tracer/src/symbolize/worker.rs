//! blazesym on a thread of its own, so that a slow look-up never holds
//! the collect loop: the first look-up in a file parses its symbols, and
//! with DWARF its whole line program and functions, which takes seconds
//! for a big debug file and as long as a hostile target likes for a
//! library it made (tests/fixtures/slow_dwarf_lib.c). The loop sends
//! look-ups and waits for their answers a bounded time
//! ([`super::Symbols`]); what comes later is kept for the next time the
//! same addresses are asked for.
use std::{
    fs::File,
    sync::{
        Arc,
        mpsc::{self, Receiver, RecvTimeoutError, Sender},
    },
    time::Instant,
};

use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use super::{elf_source, fd_path, frames_of, new_symbolizer, symbolize_in};
use crate::model::Frame;

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

/// The loop's end of the symbolizer thread.
pub(super) struct Worker {
    requests: Sender<Request>,
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
    /// Starts the thread; None when it could not be started.
    pub fn start() -> Option<Worker> {
        let (requests, incoming) = mpsc::channel::<Request>();
        let (answer, answers) = mpsc::channel();
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
        Some(Worker { requests, answers })
    }

    /// Sends look-ups; false when the thread is gone.
    pub fn send(&self, lookups: Vec<Lookup>) -> bool {
        self.requests.send(Request::Resolve(lookups)).is_ok()
    }

    pub fn reset(&self) {
        let _ = self.requests.send(Request::Reset);
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
