//! Whether stacks are whole: the share of what each process allocated
//! whose stacks reach the start of its thread (`main`, `_start`,
//! `start_thread`, `clone3`, ...). A stack cut short (frame pointers
//! missing, unwinding stopped, the copy too small) splits one leak over
//! many stacks or hides its caller; this figure tells the user when to
//! distrust the stacks and what to do (`--unwind dwarf`, `--stack-bytes`).
use std::borrow::Borrow;
use std::collections::BTreeMap;

use serde::Serialize;

use super::{Counters, Frame, Language, Model, StackKey};

/// Below this share of bytes reaching their thread's start, the report
/// warns.
pub const WARN_BELOW_SHARE: f64 = 0.9;

/// The functions a thread's stack starts in: glibc's program and thread
/// entries (or `main` itself, when the walk cannot go through glibc's
/// start code), Rust's thread start, and the Go runtime's: a goroutine
/// starts from `runtime.goexit` (its return address), an OS thread in
/// `runtime.mstart`, the program in `runtime.rt0_go`.
const THREAD_ENTRIES: [&str; 13] = [
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "main",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "runtime.goexit",
    "runtime.mstart",
    "runtime.rt0_go",
];

/// Whether `outermost`, the last frame of a stack, is where a thread
/// starts.
pub fn is_thread_entry(outermost: &Frame) -> bool {
    let Some(function) = outermost.function.as_deref() else {
        return false;
    };
    let name = function.strip_prefix("__GI_").unwrap_or(function);
    THREAD_ENTRIES.contains(&name) || name.ends_with("::thread_start")
}

/// Whether a stack with Python frames reaches where Python started it:
/// its outermost Python frame is a module's code (`<module>`: the script,
/// `python -c`, a module run by `-m`) or threading's thread start
/// (`Thread._bootstrap`, 3.10: `_bootstrap`). The native frames below may
/// be cut (`--unwind fp` stops early in a Python built without frame
/// pointers); the Python stack is whole.
pub fn python_reaches_start<F: Borrow<Frame>>(frames: &[F]) -> bool {
    let Some(outermost) = frames
        .iter()
        .map(Borrow::borrow)
        .rev()
        .find(|frame| frame.language == Language::Python)
    else {
        return false;
    };
    let in_threading = || {
        outermost
            .file
            .as_deref()
            .is_some_and(|file| file.ends_with("threading.py"))
    };
    match outermost.function.as_deref() {
        Some("<module>") => true,
        Some("Thread._bootstrap" | "_bootstrap") => in_threading(),
        _ => false,
    }
}

/// What a process allocated, and how much of it has whole stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StackQuality {
    /// Bytes allocated since attach (every memory kind).
    pub recorded_bytes: u64,
    /// The part whose stacks reach the thread's start.
    pub reaching_entry_bytes: u64,
    /// `reaching_entry_bytes / recorded_bytes` (1 when nothing was
    /// recorded).
    pub share_reaching_entry: f64,
}

impl StackQuality {
    pub fn is_poor(&self) -> bool {
        self.share_reaching_entry < WARN_BELOW_SHARE
    }
}

/// Whether a stack counts in its process's stack quality (`reaches_entry`
/// is asked of it): memory it allocated.
pub fn is_weighed(key: &StackKey, counters: &Counters) -> bool {
    key.kind.is_memory() && counters.alloc_bytes_total != 0
}

/// The stack quality of each process of `model`; `reaches_entry` says
/// whether a stack reaches its thread's start.
pub fn stack_quality(
    model: &Model,
    mut reaches_entry: impl FnMut(&StackKey) -> bool,
) -> BTreeMap<u32, StackQuality> {
    let mut quality: BTreeMap<u32, StackQuality> = BTreeMap::new();
    for (key, counters) in model.latest_counters() {
        if !is_weighed(&key, &counters) {
            continue;
        }
        let process = quality.entry(key.pid).or_default();
        process.recorded_bytes += counters.alloc_bytes_total;
        if reaches_entry(&key) {
            process.reaching_entry_bytes += counters.alloc_bytes_total;
        }
    }
    // Stacks folded away (`fold`): what they allocated, whole or not.
    for (&(pid, kind), folded) in model.folded_stacks() {
        if !kind.is_memory() || folded.counters.alloc_bytes_total == 0 {
            continue;
        }
        let process = quality.entry(pid).or_default();
        process.recorded_bytes += folded.counters.alloc_bytes_total;
        process.reaching_entry_bytes += folded.reaching_entry_bytes;
    }
    for process in quality.values_mut() {
        process.share_reaching_entry = if process.recorded_bytes == 0 {
            1.0
        } else {
            process.reaching_entry_bytes as f64 / process.recorded_bytes as f64
        };
    }
    quality
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Counters, Kind, Snapshot, StackId};

    fn frame(function: &str) -> Frame {
        Frame {
            function: Some(function.to_owned()),
            ..Frame::default()
        }
    }

    #[test]
    fn a_python_stack_from_a_module_or_a_thread_start_is_whole() {
        let python = |function: &str, file: &str| Frame {
            function: Some(function.to_owned()),
            file: Some(file.to_owned()),
            language: Language::Python,
            ..Frame::default()
        };
        let cut = Frame {
            function: Some("[unwinding stopped: no frame pointer]".to_owned()),
            ..Frame::default()
        };
        let stack = |outer: Frame| {
            vec![
                frame("array_new"),
                python("leak", "app.py"),
                outer,
                frame("PyEval_EvalCode"),
                cut.clone(),
            ]
        };
        assert!(python_reaches_start(&stack(python("<module>", "app.py"))));
        let threading = "/usr/lib/python3.11/threading.py";
        assert!(python_reaches_start(&stack(python(
            "Thread._bootstrap",
            threading
        ))));
        assert!(python_reaches_start(&stack(python(
            "_bootstrap",
            threading
        ))));
        assert!(!python_reaches_start(&stack(python(
            "_bootstrap",
            "mine.py"
        ))));
        assert!(
            !python_reaches_start(&stack(python("serve", "app.py"))),
            "cut at --python-depth or a frame not read"
        );
        assert!(!python_reaches_start(&[frame("main")]), "no Python frame");
    }

    #[test]
    fn thread_entries_of_c_rust_and_glibc() {
        for name in [
            "_start",
            "main",
            "__GI___clone3",
            "start_thread",
            "std::sys::pal::unix::thread::Thread::new::thread_start",
            "runtime.goexit",
            "runtime.mstart",
            "runtime.rt0_go",
        ] {
            assert!(is_thread_entry(&frame(name)), "{name}");
        }
        for name in [
            "leak_here",
            "[unwinding stopped: outside code]",
            "maintain",
            "runtime.mallocgc",
        ] {
            assert!(!is_thread_entry(&frame(name)), "{name}");
        }
        assert!(!is_thread_entry(&Frame::default()));
    }

    #[test]
    fn share_of_allocated_bytes_per_process() {
        let key = |pid, id| StackKey {
            pid,
            stack_id: StackId::Kernel(id),
            kind: Kind::Heap,
        };
        let allocated = |bytes| Counters {
            alloc_bytes_total: bytes,
            alloc_count_total: 1,
            ..Counters::default()
        };
        let mut model = Model::new();
        model.push(Snapshot {
            elapsed_s: 1.0,
            stacks: vec![
                (key(1, 1), allocated(900)),
                (key(1, 2), allocated(100)),
                (key(2, 1), allocated(50)),
            ],
            ..Snapshot::default()
        });
        let quality = stack_quality(&model, |key| key.stack_id == StackId::Kernel(1));
        assert_eq!(quality[&1].recorded_bytes, 1000);
        assert_eq!(quality[&1].reaching_entry_bytes, 900);
        assert!((quality[&1].share_reaching_entry - 0.9).abs() < 1e-12);
        assert!(!quality[&1].is_poor());
        assert_eq!(quality[&2].share_reaching_entry, 1.0);
    }
}
