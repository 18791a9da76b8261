//! Turns stack addresses into function, file and line with blazesym.
//!
//! Addresses are resolved to (file, file offset) through the target's
//! /proc/PID/maps, refreshed while it lives, and each mapped file is kept
//! open (the inode mapped, through `target_files`), at most
//! [`MAX_OPEN_FILES`] at a time, the least recently used closed first. So
//! stacks still resolve after the target exits, whatever mount namespace
//! it runs in.
//!
//! Every frame also carries its module's build id and its file offset, so a
//! recording can be symbolized again on another machine that has the same
//! binaries (or their debug files).
//!
//! blazesym runs on threads of its own (`worker`): the collect loop waits
//! for an answer at most [`WAIT_FOR_SYMBOLS`], and not at all while an
//! earlier look-up is still late; a frame not answered in time is shown
//! as its module and offset, and named when asked for again after the
//! answer came.
//!
//! Long: the symbolizer's caches and its waits for its worker's answers.
mod files;
pub mod jit;
mod offline;
mod worker;

use files::{Module, dwarf_is_safe, elf_source, fd_path, read_identity};
pub use offline::OfflineSymbols;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use blazesym::symbolize::{Input, Symbolized, Symbolizer, source::Source};

use crate::{
    debug_files,
    model::Frame,
    procfs::{self, Mapping},
    target_files::{self, Root},
};

/// The most mapped files kept open at once (each with its debug file).
pub const MAX_OPEN_FILES: usize = 2048;

/// The longest the collect loop waits for the symbolizer thread to answer
/// the addresses of one stack; once it waited that long in vain, it waits
/// no more until every late answer came.
pub const WAIT_FOR_SYMBOLS: Duration = Duration::from_millis(250);

/// The longest the final report waits for the symbolizer threads once
/// tracing stopped (Ctrl-C, SIGTERM, --duration, the targets' exit), all
/// its stacks together; frames still unanswered then show their module
/// and offset. A second Ctrl-C (or SIGTERM) ends the wait at once.
pub const FINAL_WAIT_FOR_SYMBOLS: Duration = Duration::from_secs(10);

/// How long the final wait goes on before it says so on stderr.
const FINAL_WAIT_SAID_AFTER: Duration = Duration::from_secs(1);

/// How often the final wait looks whether it was told to end.
const FINAL_WAIT_STEP: Duration = Duration::from_millis(50);

/// Set by a second SIGINT or SIGTERM once tracing stopped: the final
/// wait for the symbolizer ends at once.
static SKIP_FINAL_WAIT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The final report's wait for the symbolizer: until `deadline`, or
/// until told to end; says so once when it lasts.
struct FinalWait {
    started: Instant,
    deadline: Instant,
    said: bool,
}

/// From now on a SIGINT or SIGTERM ends the final wait for the
/// symbolizer (tracing has stopped; the collect loop's own handlers no
/// longer listen). Registered once; call it before saying that tracing
/// stopped, so that a Ctrl-C answering that line is not lost.
pub fn skip_final_wait_on_signals() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        for signal in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: the action only stores to an atomic, which is
            // async-signal-safe.
            let registered = unsafe {
                signal_hook_registry::register(signal, || {
                    SKIP_FINAL_WAIT.store(true, std::sync::atomic::Ordering::Relaxed);
                })
            };
            if let Err(error) = registered {
                eprintln!("tracer: warning: a second Ctrl-C cannot cut the last symbolization short: {error}");
            }
        }
    });
}

/// Symbolizer for every target, with a cache per (pid, address).
///
/// Wide: the symbolizer's state for every process it serves (its worker, the
/// addresses asked and cached, mappings, files, perf maps, debug dirs, the
/// final wait's accounting): one owner, so each address is symbolized once.
pub struct Symbols {
    /// blazesym's thread; None when it could not be started (every frame
    /// is then its module and offset).
    worker: Option<worker::Worker>,
    /// Addresses sent to the worker and not answered yet.
    asked: HashSet<(u32, u64)>,
    /// Whether the loop waited [`WAIT_FOR_SYMBOLS`] in vain, and waits no
    /// more until every answer came.
    late: bool,
    /// Once tracing stopped: the final report's wait, shared by all its
    /// stacks, instead of [`WAIT_FOR_SYMBOLS`] per stack.
    final_wait: Option<FinalWait>,
    /// Frames given out unnamed because their answer was late.
    deferred: u64,
    mappings: HashMap<u32, Vec<Mapping>>,
    /// Open mapped files, by (pid, path in the target).
    files: HashMap<(u32, PathBuf), Module>,
    cache: HashMap<(u32, u64), Vec<Frame>>,
    /// Names of JIT code, from the runtimes that give them
    /// (`runtimes::jit`: perf maps).
    jit: Vec<Box<dyn jit::JitNames>>,
    /// `--debug-dir`s, searched before /usr/lib/debug.
    debug_dirs: Vec<PathBuf>,
    /// Processes forgotten so far.
    forgotten: u64,
    /// Look-ups so far: the clock of `Module::last_used`.
    uses: std::cell::Cell<u64>,
}

fn new_symbolizer() -> Symbolizer {
    Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .build()
}

impl Symbols {
    /// A symbolizer that names JIT code with `jit` (`runtimes::jit_names`).
    pub fn new(jit: Vec<Box<dyn jit::JitNames>>) -> Symbols {
        Symbols {
            worker: worker::Worker::start(),
            asked: HashSet::new(),
            late: false,
            final_wait: None,
            deferred: 0,
            mappings: HashMap::new(),
            files: HashMap::new(),
            cache: HashMap::new(),
            jit,
            debug_dirs: Vec::new(),
            forgotten: 0,
            uses: std::cell::Cell::new(0),
        }
    }

    /// Forgets a process that exited (`--comm`): its mappings, open files,
    /// cached frames and JIT names. blazesym caches files by the path it was given
    /// (`/proc/PID/root/...`), which differs for every process: every 16
    /// processes forgotten its symbolizer starts afresh, so a service
    /// restarted for days keeps tracer's memory and descriptors flat.
    pub fn forget(&mut self, pid: u32) {
        self.mappings.remove(&pid);
        self.files.retain(|(file_pid, _), _| *file_pid != pid);
        self.cache.retain(|(cache_pid, _), _| *cache_pid != pid);
        self.asked.retain(|(asked_pid, _)| *asked_pid != pid);
        for jit in &mut self.jit {
            jit.forget(pid);
        }
        self.forgotten += 1;
        if self.forgotten.is_multiple_of(16) {
            self.reset_symbolizer();
        }
    }

    /// Directories searched for separate debug files before
    /// /usr/lib/debug (`--debug-dir`); set before the first refresh.
    pub fn set_debug_dirs(&mut self, debug_dirs: Vec<PathBuf>) {
        self.debug_dirs = debug_dirs;
    }

    /// Re-reads the target's mappings and opens files not seen before.
    /// Call while the target lives; a target that is gone keeps what was
    /// read last.
    pub fn refresh(&mut self, pid: u32) {
        let Ok(mappings) = procfs::read_maps(pid) else {
            return;
        };
        for mapping in mappings.iter().filter(|mapping| mapping.executable) {
            let key = (pid, mapping.path.clone());
            if !self.files.contains_key(&key)
                && let Ok(file) = target_files::open_mapped(pid, mapping)
            {
                let (link, segments) = read_identity(&file);
                let root = Root::Target(pid);
                let debug_file = debug_files::find(&link, &mapping.path, root, &self.debug_dirs);
                let dwarf = dwarf_is_safe(&file, root);
                let debug_file_dwarf = debug_file
                    .as_ref()
                    .is_some_and(|debug_file| dwarf_is_safe(debug_file, root));
                self.make_room();
                self.files.insert(
                    key,
                    Module {
                        file: Arc::new(file),
                        last_used: std::cell::Cell::new(self.tick()),
                        build_id: link.build_id,
                        segments,
                        debug_file: debug_file.map(Arc::new),
                        dwarf,
                        debug_file_dwarf,
                    },
                );
            }
        }
        if !mappings.is_empty() {
            self.mappings.insert(pid, mappings);
        }
        for jit in &mut self.jit {
            jit.refresh(pid);
        }
    }

    /// The next tick of the look-up clock.
    fn tick(&self) -> u64 {
        self.uses.set(self.uses.get() + 1);
        self.uses.get()
    }

    /// Closes the least recently used files while `MAX_OPEN_FILES` are
    /// open. blazesym caches files by the path it was given
    /// (`/proc/self/fd/N`), and a descriptor number closed is given again
    /// to the next file: the symbolizer starts afresh.
    fn make_room(&mut self) {
        if self.files.len() < MAX_OPEN_FILES {
            return;
        }
        let mut by_age: Vec<(u64, (u32, PathBuf))> = self
            .files
            .iter()
            .map(|(key, module)| (module.last_used.get(), key.clone()))
            .collect();
        by_age.sort_unstable();
        for (_, key) in by_age.into_iter().take(MAX_OPEN_FILES / 8) {
            self.files.remove(&key);
            self.cache.retain(|(pid, _), _| *pid != key.0);
        }
        self.reset_symbolizer();
    }

    /// Starts blazesym afresh: after the look-ups already sent, which
    /// hold their files open.
    fn reset_symbolizer(&self) {
        if let Some(worker) = &self.worker {
            worker.reset();
        }
    }

    /// Frames given out so far without their function because the
    /// symbolizer had not answered in time: a caller that keeps frames
    /// compares it before and after, and keeps them only when it did not
    /// grow.
    pub fn deferred(&self) -> u64 {
        self.deferred
    }

    /// Addresses the symbolizer has not answered yet.
    pub fn unanswered(&self) -> usize {
        self.asked.len()
    }

    /// Tracing stopped: from now on every look-up waits for the
    /// symbolizer until `bound` from now (all of them together), or until
    /// a second SIGINT or SIGTERM; what was asked already is waited for
    /// first.
    pub fn settle(&mut self, bound: Duration) {
        skip_final_wait_on_signals();
        let started = Instant::now();
        self.final_wait = Some(FinalWait {
            started,
            deadline: started + bound,
            said: false,
        });
        self.late = false;
        let asked: Vec<(u32, u64)> = self.asked.iter().copied().collect();
        self.wait_for(&asked);
    }

    /// Frames of a user stack, innermost first. Every address of a stack
    /// taken at a return probe is a return address, so each is looked up
    /// one byte earlier: inside the call instruction.
    pub fn stack_frames(&mut self, pid: u32, addresses: &[u64]) -> Vec<Frame> {
        self.receive_now();
        let mut lookups = Vec::new();
        let mut waiting = Vec::new();
        let mut known = HashMap::new();
        for &address in addresses {
            let key = (pid, address);
            if self.cache.contains_key(&key) || known.contains_key(&address) {
                continue;
            }
            if self.asked.contains(&key) {
                waiting.push(key);
                continue;
            }
            match self.resolve(pid, address) {
                Resolved::Frames(frames) => {
                    known.insert(address, self.finish(pid, address, frames));
                }
                Resolved::Lookup(lookup) => {
                    self.asked.insert(key);
                    waiting.push(key);
                    lookups.push(*lookup);
                }
            }
        }
        if !lookups.is_empty() && !self.worker.as_ref().is_some_and(|w| w.send(lookups)) {
            self.worker = None;
            self.asked.clear();
        }
        self.wait_for(&waiting);
        addresses
            .iter()
            .flat_map(|&address| {
                if let Some(frames) = known.get(&address) {
                    return frames.clone();
                }
                if let Some(frames) = self.cache.get(&(pid, address)) {
                    return frames.clone();
                }
                self.deferred += 1;
                self.unresolved(pid, address)
            })
            .collect()
    }

    /// Waits for the answers to `keys`, [`WAIT_FOR_SYMBOLS`] at most, and
    /// not at all while an earlier answer is late.
    fn wait_for(&mut self, keys: &[(u32, u64)]) {
        if self.final_wait.is_some() {
            self.wait_finally(keys);
            return;
        }
        if self.late {
            self.receive_now();
            if !self.asked.is_empty() {
                return;
            }
            self.late = false;
        }
        let deadline = Instant::now() + WAIT_FOR_SYMBOLS;
        while keys.iter().any(|key| self.asked.contains(key)) {
            if !self.receive_by(deadline) {
                self.late = true;
                return;
            }
        }
    }

    /// The final report's wait for `keys`: in steps, so that a second
    /// Ctrl-C ends it, until the final deadline.
    fn wait_finally(&mut self, keys: &[(u32, u64)]) {
        while keys.iter().any(|key| self.asked.contains(key)) {
            let Some(wait) = self.final_wait.as_mut() else {
                return;
            };
            let now = Instant::now();
            if SKIP_FINAL_WAIT.load(std::sync::atomic::Ordering::Relaxed) || now >= wait.deadline {
                return;
            }
            if !wait.said && now >= wait.started + FINAL_WAIT_SAID_AFTER {
                wait.said = true;
                eprintln!(
                    "tracer: naming the frames of {} addresses still (at most {} s more; \
                     Ctrl-C again to skip: they keep their module and offset)",
                    self.asked.len(),
                    wait.deadline
                        .saturating_duration_since(now)
                        .as_secs_f64()
                        .ceil()
                );
            }
            let step = (now + FINAL_WAIT_STEP).min(wait.deadline);
            // Without a worker this forgets every address asked: the loop ends.
            self.receive_by(step);
        }
    }

    /// Keeps the answers that already came.
    fn receive_now(&mut self) {
        while let Some(answer) = self.worker.as_ref().and_then(worker::Worker::answer_now) {
            self.keep(answer);
        }
    }

    /// Keeps the next answer, waiting until `deadline` at most; false when
    /// none came.
    fn receive_by(&mut self, deadline: Instant) -> bool {
        let Some(worker) = &self.worker else {
            self.asked.clear();
            return false;
        };
        match worker.answer_by(deadline) {
            Ok(answer) => {
                self.keep(answer);
                true
            }
            Err(worker::NoAnswer::Late) => false,
            Err(worker::NoAnswer::Gone) => {
                self.worker = None;
                self.asked.clear();
                false
            }
        }
    }

    fn keep(&mut self, answer: worker::Answer) {
        // An answer for a process forgotten meanwhile is dropped.
        if self.asked.remove(&(answer.pid, answer.return_address)) {
            self.finish(answer.pid, answer.return_address, answer.frames);
        }
    }

    /// `frames` of an address, with JIT code named by its runtime (`jit`),
    /// kept for the next time unless nothing is known of it.
    fn finish(&mut self, pid: u32, return_address: u64, mut frames: Vec<Frame>) -> Vec<Frame> {
        if let [frame] = frames.as_mut_slice()
            && frame.function.is_none()
        {
            // JIT code: named by its runtime, when it says (a perf map).
            frame.function = self
                .jit
                .iter()
                .find_map(|jit| jit.name(pid, return_address - 1));
        }
        // An address in no known object, unnamed, may belong to a library
        // mapped after the last refresh (a dlopen): it is looked up again
        // next time rather than kept unknown for good.
        if frames
            .iter()
            .any(|frame| frame.module.is_some() || frame.function.is_some())
        {
            self.cache.insert((pid, return_address), frames.clone());
        }
        frames
    }

    /// The frame of an address whose answer is late: its module, build id
    /// and offsets, as [`Symbols::resolve`] knows them.
    fn unresolved(&self, pid: u32, return_address: u64) -> Vec<Frame> {
        match self.resolve(pid, return_address) {
            Resolved::Frames(frames) => frames,
            Resolved::Lookup(lookup) => vec![lookup.unresolved],
        }
    }

    /// The frames of an address when they are known without blazesym
    /// (no object, or one not open), else the look-up to send.
    fn resolve(&self, pid: u32, return_address: u64) -> Resolved {
        let address = return_address.saturating_sub(1);
        let unknown = vec![Frame {
            address: return_address,
            ..Frame::default()
        }];
        let Some(mapping) = self
            .mappings
            .get(&pid)
            .and_then(|mappings| mappings.iter().find(|m| m.contains(address)))
        else {
            return Resolved::Frames(unknown);
        };
        let opened = self.files.get(&(pid, mapping.path.clone()));
        let module = Some(mapping.path.display().to_string());
        let build_id = opened.and_then(|opened| opened.build_id.clone());
        // The return address's own offset: the one re-symbolization starts
        // from, like every other address in the frame.
        let return_offset = Some(mapping.file_offset_of(return_address));
        let offset = opened
            .zip(return_offset)
            .and_then(|(opened, return_offset)| opened.virtual_address(return_offset));
        let file_offset = mapping.file_offset_of(address);
        let unresolved = Frame {
            address: return_address,
            module: module.clone(),
            build_id: build_id.clone(),
            file_offset: return_offset,
            offset,
            ..Frame::default()
        };
        let Some(opened) = opened else {
            return Resolved::Frames(vec![unresolved]);
        };
        opened.last_used.set(self.tick());
        let debug_file = opened
            .debug_file
            .as_ref()
            .zip(opened.virtual_address(file_offset))
            .map(|(debug_file, virtual_address)| {
                (
                    Arc::clone(debug_file),
                    opened.debug_file_dwarf,
                    virtual_address,
                )
            });
        Resolved::Lookup(Box::new(worker::Lookup {
            pid,
            return_address,
            debug_file,
            object: (Arc::clone(&opened.file), opened.dwarf, file_offset),
            unresolved,
        }))
    }
}

/// What [`Symbols::resolve`] found.
enum Resolved {
    Frames(Vec<Frame>),
    Lookup(Box<worker::Lookup>),
}

/// The frames at ELF virtual address `virtual_address` (already inside the
/// call instruction) of the object whose symbols are in `path`, each a copy
/// of `unresolved` with the function and source filled in; None when
/// `path` has no symbol there.
fn symbolize_in(
    symbolizer: &Symbolizer,
    source: Source<'_>,
    virtual_address: u64,
    unresolved: &Frame,
) -> Option<Vec<Frame>> {
    match symbolizer.symbolize_single(&source, Input::VirtOffset(virtual_address)) {
        Ok(Symbolized::Sym(symbol)) => Some(frames_of(&symbol, unresolved)),
        _ => None,
    }
}

/// The frames of `symbol`, innermost first: inlined calls come outermost
/// first from blazesym, and the innermost is the code that really runs at
/// the address.
fn frames_of(symbol: &blazesym::symbolize::Sym<'_>, unresolved: &Frame) -> Vec<Frame> {
    let frame = |function: &str, code_info: Option<&blazesym::symbolize::CodeInfo<'_>>| Frame {
        function: Some(function.to_owned()),
        file: code_info.map(|info| info.to_path().display().to_string()),
        line: code_info.and_then(|info| info.line),
        ..unresolved.clone()
    };
    let mut frames: Vec<Frame> = symbol
        .inlined
        .iter()
        .rev()
        .map(|inlined| frame(&inlined.name, inlined.code_info.as_ref()))
        .collect();
    frames.push(frame(&symbol.name, symbol.code_info.as_deref()));
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_function_of_this_test() -> u64 {
        a_function_of_this_test as *const () as u64
    }

    #[test]
    fn an_address_unknown_before_a_refresh_is_named_after_it() {
        let pid = std::process::id();
        // A return address inside this function, as a stack would hold.
        let return_address = a_function_of_this_test() + 1;
        let mut symbols = Symbols::new(Vec::new());
        let before = symbols.stack_frames(pid, &[return_address]);
        assert!(
            before.iter().all(|frame| frame.module.is_none()),
            "{before:?}"
        );
        // Mapped since, as by a dlopen: the refresh must be seen.
        symbols.refresh(pid);
        let after = symbols.stack_frames(pid, &[return_address]);
        assert!(
            after.iter().any(|frame| frame
                .function
                .as_deref()
                .is_some_and(|name| name.contains("a_function_of_this_test"))),
            "{after:?}"
        );
    }

    #[test]
    fn reads_the_build_id_of_this_test_binary() {
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let (link, segments) = read_identity(&file);
        let build_id = link.build_id.expect("rustc links a build id");
        assert!(!segments.is_empty());
        assert!(build_id.len() >= 16, "{build_id}");
        assert!(
            build_id.chars().all(|c| c.is_ascii_hexdigit()),
            "{build_id}"
        );
    }
}
