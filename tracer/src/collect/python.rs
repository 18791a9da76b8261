//! Python frames (`--python`): at attach, the interpreter of each target
//! (`python::find`) and the kernel's walk turned on for it; while tracing,
//! its threads' thread states kept current (each new Python stack the
//! kernel stored is named at once, `stack_table`: code objects may be gone
//! by report time); and in every stack's frames, the Python stack merged in.
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
};

use tracer_ebpf::python_stack_of_frame;

use super::{Collector, Event};
use crate::{
    config::{PythonMode, PythonOptions},
    model::{Frame, Language, run::NoticedBy},
    python::{self, Detection},
};

/// What `--python` found and keeps per target.
#[derive(Default)]
pub struct PythonState {
    pub mode: PythonMode,
    pub depth: u32,
    pub stacks: python::Stacks,
    /// The thread ids set in the kernel, by process.
    threads: HashMap<u32, Vec<u32>>,
    /// One line per target with a CPython tracer cannot read.
    pub unsupported: Vec<(u32, String)>,
    /// Targets whose later-mapped libpython was looked at already.
    looked_again: Vec<u32>,
    /// Every thread id seen with a thread state.
    ever: HashSet<u32>,
    /// `--python-objects`: CPython's allocator is hooked in each target
    /// found running one.
    pub objects: bool,
    /// The targets whose CPython allocator is hooked.
    objects_hooked: Vec<u32>,
}

impl Collector {
    /// `--python`, `--python-depth` and `--python-objects`, before
    /// targets are added.
    pub fn set_python(&mut self, options: PythonOptions) {
        self.python.mode = options.mode;
        self.python.depth = options.depth;
        self.python.objects = options.objects;
    }

    /// Looks for a CPython in `pid` and walks its frames from now on.
    pub(super) fn start_python(&mut self, pid: u32, noticed_by: NoticedBy) -> anyhow::Result<()> {
        let interpreter = self.find_python(pid)?;
        self.hook_found_python_objects(pid, interpreter, noticed_by);
        Ok(())
    }

    /// The part of [`Collector::start_python`] that needs no probe: the
    /// kernel learns the interpreter's layout and thread states, so done
    /// before the allocator probes are attached, their first allocations
    /// already get Python frames. Returns the interpreter's object.
    pub(super) fn find_python(&mut self, pid: u32) -> anyhow::Result<Option<PathBuf>> {
        if self.python.mode == PythonMode::Off || self.python.stacks.interpreter(pid).is_some() {
            return Ok(None);
        }
        match python::find(pid) {
            Detection::Interpreter(interpreter) => {
                self.probes
                    .start_python(pid, interpreter.kernel_offsets(), self.python.depth)?;
                let object = interpreter.object.clone();
                self.python.stacks.add(*interpreter);
                self.refresh_python_threads(pid);
                return Ok(Some(object));
            }
            Detection::Unsupported(why) => {
                if self.python.mode == PythonMode::On {
                    anyhow::bail!("--python on: PID {pid}: {why}");
                }
                self.python.unsupported.push((pid, why));
            }
            Detection::None => {
                if self.python.mode == PythonMode::On {
                    anyhow::bail!("--python on: PID {pid} runs no CPython tracer can find");
                }
            }
        }
        Ok(None)
    }

    /// `--python-objects`: hooks the allocator of the interpreter
    /// [`Collector::find_python`] found, if it found one.
    pub(super) fn hook_found_python_objects(
        &mut self,
        pid: u32,
        interpreter: Option<PathBuf>,
        noticed_by: NoticedBy,
    ) {
        if let Some(object) = interpreter
            && self.python.objects
        {
            self.hook_python_objects(pid, &object, noticed_by);
        }
    }

    /// `--python-objects`: hooks CPython's allocator in `object`, the
    /// interpreter `pid` runs. A failure is a warning: Python frames and
    /// the other kinds go on.
    fn hook_python_objects(&mut self, pid: u32, object: &std::path::Path, noticed_by: NoticedBy) {
        match self.probes.attach_python_objects(pid, object, noticed_by) {
            Ok(hooks) => {
                self.python.objects_hooked.push(pid);
                if let Some(size) = hooks.inlined_bytes {
                    self.pace.queued.push_back(Event::Notice(format!(
                        "warning: PID {pid}: --python-objects: {} inlines CPython's allocator \
                         into its callers (an LTO build: PyObject_Malloc is {size} bytes, not a \
                         jump): most objects are allocated without a call tracer sees, and show \
                         only as the 1 MiB arenas (mmap-anon) they fill. Start the program with \
                         PYTHONMALLOC=malloc to see every object as a heap block, named by its \
                         Python line",
                        object.display()
                    )));
                }
            }
            Err(error) => self.pace.queued.push_back(Event::Notice(format!(
                "warning: PID {pid}: --python-objects: CPython's allocator not hooked: {error:#}"
            ))),
        }
    }

    /// Re-reads the thread states of `pid` into the kernel's map.
    pub(super) fn refresh_python_threads(&mut self, pid: u32) {
        let Some(interpreter) = self.python.stacks.interpreter(pid) else {
            return;
        };
        let threads = interpreter.threads();
        let before = self.python.threads.remove(&pid).unwrap_or_default();
        let gone: Vec<u32> = before
            .into_iter()
            .filter(|tid| !threads.iter().any(|(now, _)| now == tid))
            .collect();
        if let Err(error) = self.probes.set_python_threads(&threads, &gone) {
            self.pace.queued.push_back(Event::Notice(format!(
                "warning: PID {pid}: Python thread states not updated: {error:#}"
            )));
        }
        self.python.ever.extend(threads.iter().map(|(tid, _)| *tid));
        self.python
            .threads
            .insert(pid, threads.into_iter().map(|(tid, _)| tid).collect());
    }

    /// Says how many Python threads got native frames only for some
    /// allocations (their thread state was not found yet), at the end.
    pub(super) fn note_python_threads_missed(&mut self) {
        if self.python.stacks.is_empty() {
            return;
        }
        self.python.ever.extend(self.probes.python_threads());
        let missed: Vec<(u32, u64)> = self
            .probes
            .python_missed()
            .into_iter()
            .filter(|(tid, _)| self.python.ever.contains(tid))
            .collect();
        if missed.is_empty() {
            return;
        }
        let allocations: u64 = missed.iter().map(|(_, allocations)| allocations).sum();
        self.pace.queued.push_back(Event::Notice(format!(
            "{} Python thread(s) had {allocations} allocation(s) with native frames only: \
             their thread state was not found then",
            missed.len()
        )));
    }

    /// Keeps every live Python target's threads current, and looks for
    /// an interpreter in targets that mapped a libpython since attach
    /// (programs embedding Python `dlopen` it).
    pub(super) fn refresh_python(&mut self) {
        if self.python.mode != PythonMode::Off {
            for pid in super::live_pids(&self.watching.processes) {
                if self.python.stacks.interpreter(pid).is_some()
                    || self.python.looked_again.contains(&pid)
                    || self
                        .python
                        .unsupported
                        .iter()
                        .any(|(known, _)| *known == pid)
                    || !maps_libpython(pid)
                {
                    continue;
                }
                self.python.looked_again.push(pid);
                self.look_for_python_again(pid, NoticedBy::MapsPoll, "mapped after attach");
            }
        }
        let pids: Vec<u32> = self
            .python
            .stacks
            .interpreters()
            .map(|interpreter| interpreter.pid)
            .filter(|&pid| crate::procfs::is_alive(pid))
            .collect();
        for pid in pids {
            self.refresh_python_threads(pid);
        }
    }

    /// A target that replaced its image (a script's `#!` interpreter
    /// behind `env`, a wrapper that execs Python): the new image is looked
    /// at for an interpreter, once per exec, unless one was found already
    /// (an interpreter exec'ing another keeps the first one's layout).
    /// Spawn mode calls it while the loader gate holds the new image, so
    /// the script's first allocations get Python frames.
    pub(super) fn look_for_python_after_exec(&mut self, pid: u32, noticed_by: NoticedBy) {
        if self.python.mode == PythonMode::Off || self.python.stacks.interpreter(pid).is_some() {
            return;
        }
        self.python.unsupported.retain(|(known, _)| *known != pid);
        self.look_for_python_again(pid, noticed_by, "started by an exec");
    }

    /// Looks for an interpreter in `pid` after attach, saying what it found.
    fn look_for_python_again(&mut self, pid: u32, noticed_by: NoticedBy, when: &str) {
        let mode = self.python.mode;
        // `on` was checked at attach: a later interpreter is a bonus.
        self.python.mode = PythonMode::Auto;
        let started = self.start_python(pid, noticed_by);
        self.python.mode = mode;
        if let Err(error) = started {
            self.pace.queued.push_back(Event::Notice(format!(
                "warning: PID {pid}: no Python frames: {error:#}"
            )));
        } else if let Some(interpreter) = self.python.stacks.interpreter(pid) {
            let note = format!(
                "PID {pid}: Python frames on from now (CPython {} in {}, {when})",
                interpreter.version_text(),
                interpreter.object.display()
            );
            self.pace.queued.push_back(Event::Notice(note));
        }
    }

    /// `frames` with the Python stack its tag frame names merged in.
    pub(super) fn merge_python(&mut self, pid: u32, mut frames: Vec<Frame>) -> Vec<Frame> {
        let Some(tagged) = frames
            .iter()
            .position(|frame| python_stack_of_frame(frame.address).is_some())
        else {
            return frames;
        };
        let id = python_stack_of_frame(frames.remove(tagged).address).expect("a tag");
        if !self.python.stacks.knows(pid, id) {
            self.resolve_python_stacks();
        }
        if !self.python.stacks.knows(pid, id) {
            self.resolve_python_stack(pid, id);
        }
        match self.python.stacks.frames(pid, id) {
            Some((python, truncated)) => python::merge(frames, python, truncated),
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

    /// Says whether Python frames are on, for the attach line.
    pub fn python_summary(&self) -> String {
        let mut on: Vec<String> = self
            .python
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
        match (self.python.mode, on.is_empty()) {
            (PythonMode::Off, _) => "Python frames off (--python off)".to_owned(),
            (_, true) if !self.python.unsupported.is_empty() => {
                "no CPython tracer can read: native frames only".to_owned()
            }
            (_, true) => "no CPython found: native frames only".to_owned(),
            (_, false) if !self.python.objects_hooked.is_empty() => format!(
                "Python frames on ({}); Python objects counted (--python-objects)",
                on.join(", ")
            ),
            (_, false) => format!("Python frames on ({})", on.join(", ")),
        }
    }

    /// Targets running a CPython tracer cannot read, and why.
    pub fn python_unsupported(&self) -> &[(u32, String)] {
        &self.python.unsupported
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
