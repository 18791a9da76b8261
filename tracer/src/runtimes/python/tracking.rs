//! Python frames (`--python`) through a run: at attach, the interpreter of
//! each target (`find`) and the kernel's walk turned on for it; while
//! tracing, its threads' thread states kept current; after an exec, the
//! new image looked at again; at the end, the threads whose allocations
//! got native frames only. The Python stacks the kernel stored are named
//! as they come (`collect::stack_table`, through [`Python::stacks`]: code
//! objects may be gone by report time) and merged into native stacks
//! ([`Python::merge`]).
use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
};

use anyhow::Result;
use tracer_ebpf::python_stack_of_frame;

use super::{Detection, Stacks, kernel};
use crate::{
    attach::Probes,
    config::{PythonMode, PythonOptions},
    model::{Frame, Language, run::NoticedBy},
    runtimes::{Runtime, StoredStacks},
};

/// What `--python` found and keeps per target.
#[derive(Default)]
pub struct Python {
    mode: PythonMode,
    depth: u32,
    /// The interpreters found and the Python stacks named.
    pub stacks: Stacks,
    /// The thread ids set in the kernel, by process.
    threads: HashMap<u32, Vec<u32>>,
    /// One line per target with a CPython tracer cannot read.
    unsupported: Vec<(u32, String)>,
    /// Targets whose later-mapped libpython was looked at already.
    looked_again: Vec<u32>,
    /// Every thread id seen with a thread state.
    ever: HashSet<u32>,
    /// `--python-objects`: CPython's allocator is hooked in each target
    /// found running one.
    objects: bool,
    /// The targets whose CPython allocator is hooked.
    objects_hooked: Vec<u32>,
    /// The interpreter object found by `detect`, until `attach` hooks it.
    found: HashMap<u32, PathBuf>,
}

impl Python {
    /// `--python`, `--python-depth` and `--python-objects`.
    pub fn new(options: PythonOptions) -> Python {
        Python {
            mode: options.mode,
            depth: options.depth,
            objects: options.objects,
            ..Python::default()
        }
    }

    /// Looks for a CPython in `pid`; when found, the kernel learns the
    /// interpreter's layout and thread states. Returns the interpreter's
    /// object.
    fn find(
        &mut self,
        pid: u32,
        probes: &mut Probes,
        notices: &mut Vec<String>,
    ) -> Result<Option<PathBuf>> {
        if self.mode == PythonMode::Off || self.stacks.interpreter(pid).is_some() {
            return Ok(None);
        }
        match super::find(pid) {
            Detection::Interpreter(interpreter) => {
                kernel::start(probes, pid, interpreter.kernel_offsets(), self.depth)?;
                let object = interpreter.object.clone();
                self.stacks.add(*interpreter);
                self.refresh_threads(pid, probes, notices);
                return Ok(Some(object));
            }
            Detection::Unsupported(why) => {
                if self.mode == PythonMode::On {
                    anyhow::bail!("--python on: PID {pid}: {why}");
                }
                self.unsupported.push((pid, why));
            }
            Detection::None => {
                if self.mode == PythonMode::On {
                    anyhow::bail!("--python on: PID {pid} runs no CPython tracer can find");
                }
            }
        }
        Ok(None)
    }

    /// `--python-objects`: hooks CPython's allocator in `object`, the
    /// interpreter `pid` runs. A failure is a warning: Python frames and
    /// the other kinds go on.
    fn hook_objects(
        &mut self,
        pid: u32,
        object: &Path,
        probes: &mut Probes,
        noticed_by: NoticedBy,
        notices: &mut Vec<String>,
    ) {
        match super::objects::attach(probes, pid, object, noticed_by) {
            Ok(hooks) => {
                self.objects_hooked.push(pid);
                if let Some(size) = hooks.inlined_bytes {
                    notices.push(format!(
                        "warning: PID {pid}: --python-objects: {} inlines CPython's allocator \
                         into its callers (an LTO build: PyObject_Malloc is {size} bytes, not a \
                         jump): most objects are allocated without a call tracer sees, and show \
                         only as the 1 MiB arenas (mmap-anon) they fill. Start the program with \
                         PYTHONMALLOC=malloc to see every object as a heap block, named by its \
                         Python line",
                        object.display()
                    ));
                }
            }
            Err(error) => notices.push(format!(
                "warning: PID {pid}: --python-objects: CPython's allocator not hooked: {error:#}"
            )),
        }
    }

    /// Re-reads the thread states of `pid` into the kernel's map.
    fn refresh_threads(&mut self, pid: u32, probes: &mut Probes, notices: &mut Vec<String>) {
        let Some(interpreter) = self.stacks.interpreter(pid) else {
            return;
        };
        let threads = interpreter.threads();
        let before = self.threads.remove(&pid).unwrap_or_default();
        let gone: Vec<u32> = before
            .into_iter()
            .filter(|tid| !threads.iter().any(|(now, _)| now == tid))
            .collect();
        if let Err(error) = kernel::set_threads(probes, &threads, &gone) {
            notices.push(format!(
                "warning: PID {pid}: Python thread states not updated: {error:#}"
            ));
        }
        self.ever.extend(threads.iter().map(|(tid, _)| *tid));
        self.threads
            .insert(pid, threads.into_iter().map(|(tid, _)| tid).collect());
    }

    /// Looks for an interpreter in `pid` after attach, saying what it found.
    fn look_again(
        &mut self,
        pid: u32,
        probes: &mut Probes,
        noticed_by: NoticedBy,
        when: &str,
        notices: &mut Vec<String>,
    ) {
        let mode = self.mode;
        // `on` was checked at attach: a later interpreter is a bonus.
        self.mode = PythonMode::Auto;
        let found = self.find(pid, probes, notices);
        self.mode = mode;
        match found {
            Err(error) => notices.push(format!("warning: PID {pid}: no Python frames: {error:#}")),
            Ok(found) => {
                if let Some(object) = found
                    && self.objects
                {
                    self.hook_objects(pid, &object, probes, noticed_by, notices);
                }
                if let Some(interpreter) = self.stacks.interpreter(pid) {
                    notices.push(format!(
                        "PID {pid}: Python frames on from now (CPython {} in {}, {when})",
                        interpreter.version_text(),
                        interpreter.object.display()
                    ));
                }
            }
        }
    }

    /// `frames` with the Python stack its tag frame names merged in;
    /// `resolve` names a Python stack the kernel stored and
    /// [`Python::stacks`] does not know yet (from the stack tables).
    pub fn merge(
        &mut self,
        pid: u32,
        mut frames: Vec<Frame>,
        resolve: impl FnOnce(&mut dyn StoredStacks, u32),
    ) -> Vec<Frame> {
        let Some(tagged) = frames
            .iter()
            .position(|frame| python_stack_of_frame(frame.address).is_some())
        else {
            return frames;
        };
        let id = python_stack_of_frame(frames.remove(tagged).address).expect("a tag");
        if !self.stacks.knows(pid, id) {
            resolve(&mut self.stacks, id);
        }
        match self.stacks.frames(pid, id) {
            Some((python, truncated)) => super::merge(frames, python, truncated),
            None => {
                frames.push(Frame {
                    function: Some("[python frames unknown]".to_owned()),
                    language: Language::Python,
                    ..Frame::default()
                });
                frames
            }
        }
    }
}

impl Runtime for Python {
    fn detect(&mut self, pid: u32, probes: &mut Probes, notices: &mut Vec<String>) -> Result<()> {
        if let Some(object) = self.find(pid, probes, notices)? {
            self.found.insert(pid, object);
        }
        Ok(())
    }

    fn attach(
        &mut self,
        pid: u32,
        probes: &mut Probes,
        noticed_by: NoticedBy,
        notices: &mut Vec<String>,
    ) {
        if let Some(object) = self.found.remove(&pid)
            && self.objects
        {
            self.hook_objects(pid, &object, probes, noticed_by, notices);
        }
    }

    /// A target that replaced its image (a script's `#!` interpreter
    /// behind `env`, a wrapper that execs Python): the new image is looked
    /// at for an interpreter, once per exec, unless one was found already
    /// (an interpreter exec'ing another keeps the first one's layout).
    fn after_exec(
        &mut self,
        pid: u32,
        probes: &mut Probes,
        noticed_by: NoticedBy,
        notices: &mut Vec<String>,
    ) {
        if self.mode == PythonMode::Off || self.stacks.interpreter(pid).is_some() {
            return;
        }
        self.unsupported.retain(|(known, _)| *known != pid);
        self.look_again(pid, probes, noticed_by, "started by an exec", notices);
    }

    /// Keeps every live Python target's threads current, and looks for
    /// an interpreter in targets that mapped a libpython since attach
    /// (programs embedding Python `dlopen` it).
    fn tick(&mut self, live: &[u32], probes: &mut Probes, notices: &mut Vec<String>) {
        if self.mode != PythonMode::Off {
            for &pid in live {
                if self.stacks.interpreter(pid).is_some()
                    || self.looked_again.contains(&pid)
                    || self.unsupported.iter().any(|(known, _)| *known == pid)
                    || !maps_libpython(pid)
                {
                    continue;
                }
                self.looked_again.push(pid);
                self.look_again(
                    pid,
                    probes,
                    NoticedBy::MapsPoll,
                    "mapped after attach",
                    notices,
                );
            }
        }
        let pids: Vec<u32> = self
            .stacks
            .interpreters()
            .map(|interpreter| interpreter.pid)
            .filter(|&pid| crate::procfs::is_alive(pid))
            .collect();
        for pid in pids {
            self.refresh_threads(pid, probes, notices);
        }
    }

    /// Says how many Python threads got native frames only for some
    /// allocations (their thread state was not found yet).
    fn finish(&mut self, probes: &mut Probes, notices: &mut Vec<String>) {
        if self.stacks.is_empty() {
            return;
        }
        self.ever.extend(kernel::threads(probes));
        let missed: Vec<(u32, u64)> = kernel::missed(probes)
            .into_iter()
            .filter(|(tid, _)| self.ever.contains(tid))
            .collect();
        if missed.is_empty() {
            return;
        }
        let allocations: u64 = missed.iter().map(|(_, allocations)| allocations).sum();
        notices.push(format!(
            "{} Python thread(s) had {allocations} allocation(s) with native frames only: \
             their thread state was not found then",
            missed.len()
        ));
    }

    /// Whether Python frames are on.
    fn summary(&self) -> Option<String> {
        let mut on: Vec<String> = self
            .stacks
            .interpreters()
            .map(|interpreter| {
                format!(
                    "PID {} CPython {}",
                    interpreter.pid,
                    interpreter.version_text()
                )
            })
            .collect();
        on.sort();
        Some(match (self.mode, on.is_empty()) {
            (PythonMode::Off, _) => "Python frames off (--python off)".to_owned(),
            (_, true) if !self.unsupported.is_empty() => {
                "no CPython tracer can read: native frames only".to_owned()
            }
            (_, true) => "no CPython found: native frames only".to_owned(),
            (_, false) if !self.objects_hooked.is_empty() => format!(
                "Python frames on ({}); Python objects counted (--python-objects)",
                on.join(", ")
            ),
            (_, false) => format!("Python frames on ({})", on.join(", ")),
        })
    }

    /// Targets running a CPython tracer cannot read, and why.
    fn attach_notes(&self) -> Vec<String> {
        self.unsupported
            .iter()
            .map(|(pid, why)| format!("PID {pid}: no Python frames: {why}; native frames only"))
            .collect()
    }
}

/// Whether `pid` maps a `libpython*` object.
fn maps_libpython(pid: u32) -> bool {
    crate::procfs::read_maps(pid).is_ok_and(|maps| {
        maps.iter().any(|mapping| {
            mapping
                .path
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("libpython"))
        })
    })
}
