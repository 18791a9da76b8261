//! CPython: find the interpreter in a target, its threads' thread states
//! (for the kernel's Python-frame walk, `tracer-ebpf/src/python.rs`), and
//! name the code objects of the Python stacks the kernel walked, while
//! the target lives; then merge Python frames into native stacks.
//! `tracking` is the runtime through a run ([`Python`], what the collector
//! drives), `kernel` its maps in the eBPF object, `objects` CPython's
//! allocator hooked (`--python-objects`), `wheels` where an environment
//! keeps the CUDA libraries it may load.
//!
//! Everything is read from outside with `process_vm_readv`: the target is
//! never stopped or written.
pub mod heap;
mod kernel;
pub mod layout;
pub mod lines;
mod merge;
pub mod objects;
pub mod pools;
#[cfg(test)]
mod real_bytes;
mod tracking;
pub mod types;
pub mod wheels;

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
use tracer_ebpf::{PythonOffsets, PythonStack, python_frame};

pub use layout::VersionLayout;
pub use merge::merge;
pub use tracking::Python;

use crate::{
    model::{Frame, Language, quality::python_reaches_start},
    procfs::{self, Mapping},
    runtimes::StoredStacks,
    target_memory::{Process, TargetMemory},
};

/// A CPython interpreter found in a target.
#[derive(Clone, Debug)]
pub struct Interpreter {
    pub pid: u32,
    /// Where `_PyRuntime` is in the target.
    pub runtime: u64,
    /// (major, minor, micro).
    pub version: (u8, u8, u8),
    /// Whether the micro version is known (read from `Py_Version`, 3.11+;
    /// 3.10's comes from the object's name: "3.10").
    pub micro_known: bool,
    /// The object that defines it.
    pub object: PathBuf,
    pub layout: VersionLayout,
    /// Where `PyCode_Type` is (0: not found): a code object's `ob_type`.
    pub code_type: u64,
    /// Where glibc's `struct pthread` keeps the thread id, for layouts
    /// whose thread states name their thread by `pthread_self()` (3.10).
    pub pthread_tid: u64,
}

/// What looking for an interpreter found.
#[derive(Clone, Debug)]
pub enum Detection {
    /// No CPython in the target.
    None,
    Interpreter(Box<Interpreter>),
    /// A CPython tracer cannot read: why, in words.
    Unsupported(String),
}

/// Looks for `_PyRuntime` in the objects `pid` maps and checks that
/// tracer knows the interpreter's layout.
pub fn find(pid: u32) -> Detection {
    let Ok(maps) = procfs::read_maps(pid) else {
        return Detection::None;
    };
    let mut paths: Vec<&PathBuf> = Vec::new();
    for mapping in maps.iter().filter(|mapping| mapping.executable) {
        if !paths.contains(&&mapping.path) {
            paths.push(&mapping.path);
        }
    }
    for path in paths {
        if let Some(found) = find_in(pid, path, &maps) {
            return found;
        }
    }
    Detection::None
}

/// `_PyRuntime` (and `Py_Version`) in one mapped object.
fn find_in(pid: u32, path: &Path, maps: &[Mapping]) -> Option<Detection> {
    let name = path.file_name()?.to_string_lossy();
    if !name.starts_with("python") && !name.starts_with("libpython") {
        // Only CPython's executable and library define _PyRuntime; reading
        // every library's symbols would cost attach time.
        return None;
    }
    let file = crate::target_files::open_named(pid, path, maps).ok()?;
    // SAFETY: read only; a truncated file reads as zeros (`target_files`).
    let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*data).ok()?;
    let symbol = |wanted: &str| {
        elf.dynamic_symbols()
            .chain(elf.symbols())
            .find(|symbol| symbol.name() == Ok(wanted))
            .map(|symbol| symbol.address())
    };
    let runtime = symbol("_PyRuntime")?;
    let bias = load_bias(&elf, path, maps)?;
    let runtime = runtime + bias;
    let version = match symbol("Py_Version") {
        Some(address) => {
            let hex = read_u64(pid, address + bias).map(|word| word as u32);
            hex.map(|hex| ((hex >> 24) as u8, (hex >> 16) as u8, (hex >> 8) as u8))
        }
        None => version_from_name(&name),
    };
    let Some(version) = version else {
        return Some(Detection::Unsupported(format!(
            "{}: CPython of unknown version",
            path.display()
        )));
    };
    let layout = match version {
        (3, 13, _) => read(pid, runtime, layout::DEBUG_OFFSETS_3_13_BYTES)
            .and_then(|bytes| layout::from_debug_offsets_3_13(&bytes)),
        (major, minor, _) => layout::for_version(major, minor),
    };
    let Some(layout) = layout else {
        return Some(Detection::Unsupported(format!(
            "{}: CPython {}.{}.{}, whose layout tracer does not know (it knows 3.9, 3.10, 3.11, 3.12, \
             and 3.13 from its _Py_DebugOffsets)",
            path.display(),
            version.0,
            version.1,
            version.2
        )));
    };
    let interpreter = Interpreter {
        pid,
        runtime,
        version,
        micro_known: symbol("Py_Version").is_some(),
        object: path.to_owned(),
        layout,
        code_type: symbol("PyCode_Type").map_or(0, |address| address + bias),
        pthread_tid: if layout.thread_id_is_pthread {
            pthread_tid_offset(pid, maps)
        } else {
            0
        },
    };
    Some(match interpreter.check() {
        Ok(()) => Detection::Interpreter(Box::new(interpreter)),
        Err(why) => Detection::Unsupported(format!(
            "{}: CPython {}.{}.{} does not look as tracer expects ({why})",
            path.display(),
            version.0,
            version.1,
            version.2
        )),
    })
}

/// glibc's `struct pthread` offset of `tid` on x86-64 (2.28 to 2.40 alike).
const PTHREAD_TID: u64 = 720;

/// Where the target's glibc keeps a thread's id in its `struct pthread`:
/// the offset in `_thread_db_pthread_tid` (the descriptor glibc exports
/// for libthread_db: bits, count, offset), else glibc's usual offset.
fn pthread_tid_offset(pid: u32, maps: &[Mapping]) -> u64 {
    let libc = maps.iter().map(|mapping| &mapping.path).find(|path| {
        path.file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("libc.so"))
    });
    let from_libc = || {
        let path = libc?;
        let file = crate::target_files::open_named(pid, path, maps).ok()?;
        // SAFETY: read only; a truncated file reads as zeros (`target_files`).
        let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let elf = object::File::parse(&*data).ok()?;
        let address = elf
            .dynamic_symbols()
            .find(|symbol| symbol.name() == Ok("_thread_db_pthread_tid"))?
            .address();
        let bias = load_bias(&elf, path, maps)?;
        let descriptor = read(pid, address + bias, 12)?;
        let offset = u32::from_ne_bytes(descriptor[8..12].try_into().ok()?);
        Some(u64::from(offset))
    };
    from_libc().unwrap_or(PTHREAD_TID)
}

/// "3.10" in `libpython3.10.so.1.0` or `python3.10`.
fn version_from_name(name: &str) -> Option<(u8, u8, u8)> {
    let rest = name
        .strip_prefix("lib")
        .unwrap_or(name)
        .strip_prefix("python")?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor, 0))
}

/// Address in the process minus address in the file, for `path`.
fn load_bias(elf: &object::File<'_>, path: &Path, maps: &[Mapping]) -> Option<u64> {
    let first = maps
        .iter()
        .filter(|mapping| mapping.path == path)
        .min_by_key(|mapping| mapping.file_offset)?;
    let segment = elf.segments().find(|segment| {
        let (offset, size) = segment.file_range();
        (offset..offset + size.max(1)).contains(&first.file_offset)
    })?;
    let (offset, _) = segment.file_range();
    let address = segment.address() + (first.file_offset - offset);
    Some(first.start.wrapping_sub(address))
}

/// Reads `length` bytes of the target at `address`.
pub fn read(pid: u32, address: u64, length: usize) -> Option<Vec<u8>> {
    let mut buffer = vec![0u8; length];
    let local = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: length,
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: length,
    };
    // SAFETY: the local buffer is `length` bytes; the remote side is only
    // read by the kernel on the target's behalf.
    let read = unsafe { libc::process_vm_readv(pid as i32, &local, 1, &remote, 1, 0) };
    // Kept only while `pid` still names the process followed.
    (read == length as isize).then(|| crate::procfs::confirmed(pid, buffer))?
}

fn read_u64(pid: u32, address: u64) -> Option<u64> {
    read(pid, address, 8).map(|bytes| u64::from_ne_bytes(bytes.try_into().expect("8 bytes")))
}

fn field_u64(bytes: &[u8], offset: u64) -> u64 {
    let offset = offset as usize;
    bytes.get(offset..offset + 8).map_or(0, |word| {
        u64::from_ne_bytes(word.try_into().expect("8 bytes"))
    })
}

fn field_i32(bytes: &[u8], offset: u64) -> i32 {
    let offset = offset as usize;
    bytes.get(offset..offset + 4).map_or(0, |word| {
        i32::from_ne_bytes(word.try_into().expect("4 bytes"))
    })
}

/// Every thread state of every (sub-)interpreter in `memory`, from
/// `_PyRuntime` at `runtime`: (thread id, address). Bounded whatever the
/// lists hold: each interpreter and thread state is visited once (a
/// `next` back to one seen ends its list), at most MAX_INTERPRETERS and
/// MAX_THREADS of them, thread states of threads not started counted too.
pub fn thread_states(
    memory: &impl TargetMemory,
    layout: &VersionLayout,
    runtime: u64,
    pthread_tid: u64,
) -> Vec<(u32, u64)> {
    let mut threads = Vec::new();
    let mut seen_interpreters = HashSet::new();
    let mut seen_threads = HashSet::new();
    let mut interpreter = memory
        .read_u64(runtime + layout.runtime_interpreters)
        .unwrap_or(0);
    while interpreter != 0
        && seen_interpreters.len() < MAX_INTERPRETERS
        && seen_interpreters.insert(interpreter)
    {
        let mut thread = memory
            .read_u64(interpreter.wrapping_add(layout.interpreter_threads))
            .unwrap_or(0);
        while thread != 0 && seen_threads.len() < MAX_THREADS && seen_threads.insert(thread) {
            let Some(mut native_id) = memory.read_u64(thread.wrapping_add(layout.thread_native_id))
            else {
                break;
            };
            if layout.thread_id_is_pthread && native_id != 0 {
                // pthread_self(): the thread's struct pthread.
                native_id = memory
                    .read_u32(native_id.wrapping_add(pthread_tid))
                    .map_or(0, u64::from);
            }
            // 0: a thread state whose thread has not started yet.
            if native_id != 0 {
                threads.push((native_id as u32, thread));
            }
            thread = memory
                .read_u64(thread.wrapping_add(layout.thread_next))
                .unwrap_or(0);
        }
        interpreter = memory
            .read_u64(interpreter.wrapping_add(layout.interpreter_next))
            .unwrap_or(0);
    }
    threads
}

/// `PyObject.ob_type`.
const OB_TYPE: u64 = 8;

/// Most thread states read, of all interpreters together.
pub const MAX_THREADS: usize = 1 << 14;
/// Most (sub-)interpreters read.
pub const MAX_INTERPRETERS: usize = 256;

impl Interpreter {
    /// "3.11.2", or "3.10" where the micro version is not known.
    pub fn version_text(&self) -> String {
        let (major, minor, micro) = self.version;
        if self.micro_known {
            format!("{major}.{minor}.{micro}")
        } else {
            format!("{major}.{minor}")
        }
    }

    /// What the kernel reads for this process: the version's frame
    /// offsets, and where to look for the thread state of a thread that
    /// started since `threads` ran.
    pub fn kernel_offsets(&self) -> PythonOffsets {
        let layout = &self.layout;
        let small = |offset: u64| u32::try_from(offset).unwrap_or(0);
        PythonOffsets {
            interpreter_threads: small(layout.interpreter_threads),
            thread_next: small(layout.thread_next),
            thread_id: small(layout.thread_native_id),
            thread_id_is_pthread: u32::from(layout.thread_id_is_pthread),
            pthread_tid: small(self.pthread_tid),
            interpreters: self.runtime + layout.runtime_interpreters,
            ..layout.frames
        }
    }

    /// Every thread state of every (sub-)interpreter: (thread id, address).
    pub fn threads(&self) -> Vec<(u32, u64)> {
        thread_states(
            &Process(self.pid),
            &self.layout,
            self.runtime,
            self.pthread_tid,
        )
    }

    /// Checks the layout against the process: some thread state's
    /// `native_thread_id` must be one of its threads (an interpreter not
    /// initialized yet has none: accepted, checked again later).
    fn check(&self) -> Result<(), String> {
        let threads = self.threads();
        if threads.is_empty() {
            return Ok(());
        }
        let tasks = procfs_tasks(self.pid);
        if threads.iter().any(|(tid, _)| tasks.contains(tid)) {
            Ok(())
        } else {
            Err(format!(
                "no thread state names one of its threads: read {:?}",
                threads.iter().map(|(tid, _)| tid).collect::<Vec<_>>()
            ))
        }
    }
}

fn procfs_tasks(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A code object, named.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Code {
    /// What tells a code object apart from another later at the same
    /// address: its name and file objects and its first line.
    identity: (u64, u64, i32),
    name: String,
    file: String,
    first_line: i32,
    line_table: Vec<u8>,
}

/// Most code objects kept named: a program that keeps generating code
/// (torch.fx, exec) would grow the cache without end. Past it the cache
/// starts again (names are read again from the target).
const MAX_NAMED_CODES: usize = 1 << 16;

/// A named Python frame, shared by every stack that has it, and whether
/// it is an entry frame.
pub type SharedFrame = (Arc<Frame>, bool);

/// The Python stacks of every target, named while the targets live.
///
/// Memory: each distinct frame (code object and line) is kept once, in
/// `interned`; a stack is a list of references to them (16 bytes a
/// frame), not a copy of its frames' names and files. A stack goes when
/// the kernel evicts it (`collect::stack_table`), so there are at most as
/// many as PYTHON_STACKS holds (`--max-stacks`).
#[derive(Default)]
pub struct Stacks {
    interpreters: HashMap<u32, Interpreter>,
    /// Named code objects by (pid, address), at most MAX_NAMED_CODES.
    codes: HashMap<(u32, u64), Code>,
    /// Every distinct Python frame of the stacks, once.
    interned: HashSet<Arc<Frame>>,
    /// Each Python stack, named, by (pid, id).
    frames: HashMap<(u32, u32), Vec<SharedFrame>>,
    /// Stacks cut at --python-depth.
    truncated: HashMap<(u32, u32), bool>,
    /// Stacks forgotten since the frames were last pruned.
    forgotten: usize,
}

/// The frame that ends a Python stack deeper than `--python-depth`.
pub const TRUNCATED_FRAME: &str = "[python: truncated at --python-depth]";

impl Stacks {
    pub fn add(&mut self, interpreter: Interpreter) {
        self.interpreters.insert(interpreter.pid, interpreter);
    }

    pub fn interpreter(&self, pid: u32) -> Option<&Interpreter> {
        self.interpreters.get(&pid)
    }

    pub fn interpreters(&self) -> impl Iterator<Item = &Interpreter> {
        self.interpreters.values()
    }

    /// The one shared copy of `frame`.
    fn intern(&mut self, frame: Frame) -> Arc<Frame> {
        if let Some(known) = self.interned.get(&frame) {
            return Arc::clone(known);
        }
        let frame = Arc::new(frame);
        self.interned.insert(Arc::clone(&frame));
        frame
    }

    /// The named frames of a Python stack, innermost first, each with
    /// whether it is an entry frame; and whether the stack was truncated.
    pub fn frames(&self, pid: u32, id: u32) -> Option<(&[SharedFrame], bool)> {
        let frames = self.frames.get(&(pid, id))?;
        let truncated = self.truncated.get(&(pid, id)).copied().unwrap_or(false);
        Some((frames, truncated))
    }

    fn frame(&mut self, interpreter: &Interpreter, address: u64, offset: u64) -> Frame {
        let pid = interpreter.pid;
        let layout = &interpreter.layout;
        let header = read(pid, address, layout.code_header);
        // Still a code object: a module's code is freed once it ran, and
        // its memory may hold another object by now.
        let header = header.filter(|header| {
            interpreter.code_type == 0 || field_u64(header, OB_TYPE) == interpreter.code_type
        });
        let code = header.and_then(|header| {
            let identity = (
                field_u64(&header, layout.code_filename),
                field_u64(&header, layout.code_qualname.unwrap_or(layout.code_name)),
                field_i32(&header, layout.code_first_line),
            );
            if let Some(known) = self.codes.get(&(pid, address))
                && known.identity == identity
            {
                return Some(known.clone());
            }
            let code = Code {
                identity,
                name: read_string(pid, identity.1, layout)?,
                file: read_string(pid, identity.0, layout)?,
                first_line: identity.2,
                line_table: read_bytes(pid, field_u64(&header, layout.code_line_table), layout)
                    .unwrap_or_default(),
            };
            if self.codes.len() >= MAX_NAMED_CODES {
                self.codes.clear();
            }
            self.codes.insert((pid, address), code.clone());
            Some(code)
        });
        match code {
            Some(code) => Frame {
                function: Some(code.name.clone()),
                line: match layout.version {
                    (3, 9) => lines::line_3_9(&code.line_table, code.first_line.into(), offset),
                    (3, 10) => lines::line_3_10(&code.line_table, code.first_line.into(), offset),
                    _ => lines::line_3_11(&code.line_table, code.first_line.into(), offset),
                },
                file: Some(code.file),
                language: Language::Python,
                ..Frame::default()
            },
            None => Frame {
                function: Some(format!(
                    "[python code object 0x{address:x}, freed before named]"
                )),
                language: Language::Python,
                ..Frame::default()
            },
        }
    }
}

impl StoredStacks for Stacks {
    fn is_empty(&self) -> bool {
        self.interpreters.is_empty()
    }

    fn runs_in(&self, pid: u32) -> bool {
        self.interpreters.contains_key(&pid)
    }

    /// Names the frames of a Python stack the kernel walked, while its
    /// process lives. `pid` is the process the stack's id belongs to.
    fn resolve(&mut self, pid: u32, id: u32, stack: &PythonStack) {
        if self.frames.contains_key(&(pid, id)) {
            return;
        }
        let Some(interpreter) = self.interpreters.get(&pid).cloned() else {
            return;
        };
        let count = (stack.count as usize).min(stack.frames.len());
        let mut frames: Vec<SharedFrame> = Vec::with_capacity(count);
        for &packed in &stack.frames[..count] {
            let address = packed & python_frame::ADDRESS_MASK;
            let offset = packed >> python_frame::OFFSET_SHIFT;
            let entry = packed & python_frame::ENTRY != 0;
            if entry && interpreter.layout.entry_is_shim {
                // 3.12+: the C stack's shim below an entry frame.
                if let Some((_, last_entry)) = frames.last_mut() {
                    *last_entry = true;
                }
                continue;
            }
            let frame = self.frame(&interpreter, address, offset);
            frames.push((self.intern(frame), entry));
        }
        self.frames.insert((pid, id), frames);
        self.truncated.insert((pid, id), stack.truncated != 0);
    }

    /// Whether the stack `id` of `pid` was named already.
    fn knows(&self, pid: u32, id: u32) -> bool {
        self.frames.contains_key(&(pid, id))
    }

    fn reaches_start(&self, pid: u32, id: u32) -> Option<bool> {
        let (frames, truncated) = self.frames(pid, id)?;
        let frames: Vec<&Frame> = frames.iter().map(|(frame, _)| &**frame).collect();
        Some(!truncated && python_reaches_start(&frames))
    }

    /// Forgets the stack `id` of `pid` (the kernel evicted it: the id
    /// will name other frames). The frames no stack has any more go once
    /// as many stacks went as there are frames kept.
    fn forget(&mut self, pid: u32, id: u32) {
        if self.frames.remove(&(pid, id)).is_some() {
            self.truncated.remove(&(pid, id));
            self.forgotten += 1;
            if self.forgotten >= self.interned.len() {
                self.interned.retain(|frame| Arc::strong_count(frame) > 1);
                self.forgotten = 0;
            }
        }
    }
}

/// The text of a `str` object (compact ASCII or compact Latin-1/UCS-2/
/// UCS-4), at most 4 KiB of characters.
fn read_string(pid: u32, object: u64, layout: &VersionLayout) -> Option<String> {
    if object == 0 {
        return None;
    }
    let header = read(pid, object, layout.compact_data as usize)?;
    let length = (field_u64(&header, 16) as usize).min(4096);
    let state = field_i32(&header, layout.unicode_state) as u32;
    let kind = (state >> 2) & 7;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if !compact {
        return None;
    }
    if ascii {
        let bytes = read(pid, object + layout.ascii_data, length)?;
        return String::from_utf8(bytes).ok();
    }
    let width = match kind {
        1 | 2 | 4 => kind as usize,
        _ => return None,
    };
    let bytes = read(pid, object + layout.compact_data, length * width)?;
    Some(
        bytes
            .chunks(width)
            .filter_map(|unit| {
                let mut value = 0u32;
                for (shift, byte) in unit.iter().enumerate() {
                    value |= u32::from(*byte) << (8 * shift);
                }
                char::from_u32(value)
            })
            .collect(),
    )
}

/// The contents of a `bytes` object, at most 64 KiB.
fn read_bytes(pid: u32, object: u64, layout: &VersionLayout) -> Option<Vec<u8>> {
    if object == 0 {
        return None;
    }
    let length = (read_u64(pid, object + 16)? as usize).min(1 << 16);
    read(pid, object + layout.bytes_data, length)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target_memory::Image;

    const RUNTIME: u64 = 0x1000;
    const INTERPRETER: u64 = 0x2000;
    const THREADS: [u64; 3] = [0x3000, 0x4000, 0x5000];

    /// A runtime with one interpreter and three thread states whose
    /// `native_thread_id`s are `ids`, the last one's `next` = `last_next`.
    fn image(ids: [u64; 3], last_next: u64) -> Image {
        let layout = layout::PYTHON_3_12;
        let mut image = Image::new();
        image
            .place(RUNTIME, vec![0; 0x100])
            .place(INTERPRETER, vec![0; 0x100])
            .write_u64(RUNTIME + layout.runtime_interpreters, INTERPRETER)
            .write_u64(INTERPRETER + layout.interpreter_threads, THREADS[0]);
        for (index, (&thread, id)) in THREADS.iter().zip(ids).enumerate() {
            let next = THREADS.get(index + 1).copied().unwrap_or(last_next);
            image
                .place(thread, vec![0; 0x100])
                .write_u64(thread + layout.thread_next, next)
                .write_u64(thread + layout.thread_native_id, id);
        }
        image
    }

    #[test]
    fn thread_states_are_listed_in_order() {
        let threads = thread_states(&image([11, 0, 13], 0), &layout::PYTHON_3_12, RUNTIME, 0);
        assert_eq!(threads, [(11, THREADS[0]), (13, THREADS[2])]);
    }

    #[test]
    fn a_cycle_of_thread_states_not_started_ends() {
        // No thread started (ids 0): such states were never counted
        // toward the cap, and a cycle among them spun for ever.
        let threads = thread_states(
            &image([0, 0, 0], THREADS[1]),
            &layout::PYTHON_3_12,
            RUNTIME,
            0,
        );
        assert_eq!(threads, []);
        // A cycle back to the first, with ids: each listed once.
        let threads = thread_states(
            &image([11, 12, 13], THREADS[0]),
            &layout::PYTHON_3_12,
            RUNTIME,
            0,
        );
        assert_eq!(threads.len(), 3);
    }

    #[test]
    fn an_interpreter_list_that_loops_ends() {
        let layout = layout::PYTHON_3_12;
        let mut image = image([11, 0, 0], 0);
        image.write_u64(INTERPRETER + layout.interpreter_next, INTERPRETER);
        let threads = thread_states(&image, &layout, RUNTIME, 0);
        assert_eq!(threads, [(11, THREADS[0])]);
    }

    #[test]
    fn versions_from_file_names() {
        assert_eq!(version_from_name("libpython3.10.so.1.0"), Some((3, 10, 0)));
        assert_eq!(version_from_name("python3.12"), Some((3, 12, 0)));
        assert_eq!(version_from_name("python"), None);
    }
}
