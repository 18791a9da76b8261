//! Return probes held back until the C++ unwinder is probed: a function
//! that can throw (`exceptions::THROWING`, `family::throws`) gets its return probe in a
//! process only once that process's unwinder entry points are probed
//! (and the kernel's return instances can be walked), else an exception
//! through the probe's trampoline would terminate it (`exceptions`).
//!
//! Libraries are hooked in batches, by three ways that share this state:
//! the first attach, the at-open thread and the late hook. A batch that
//! holds an unwinder entry marks its process probed; a throwing function
//! in a batch of a process not (yet) probed is held back, whole, and
//! attached once a later batch of the same process brings the unwinder
//! (a C program that dlopens a C++ library: the loader opens the library
//! before libstdc++ and libgcc_s). A return probe attached while a thread
//! is inside the function is harmless: that call has no return instance.
//! Where the walk is impossible, nothing held back is ever attached. The
//! state of a process is forgotten when it exits, and its mark when it
//! execs into an image that no longer maps the unwinder.
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
};

use crate::attach::{
    HookSite,
    safety::exceptions::{self, is_unwinder_start},
    sites::family,
    sites::symbols::Unprobed,
};

/// Why a held-back function has no probe (the `-v` list of unprobed).
const WHY: &str = "can throw, and the unwinder is not probed";

/// What one batch of sites of a process may attach.
#[derive(Debug, Default)]
pub struct Admitted {
    /// The batch's sites to attach now.
    pub now: Vec<HookSite>,
    /// Sites held back by earlier batches, to attach after `now` (which
    /// probes the unwinder): the unwinder's probes go in first.
    pub released: Vec<HookSite>,
    /// A warning, the first time a process has sites held back.
    pub warning: Option<String>,
    /// Whether this batch marked its process probed.
    marked: bool,
    /// The batch's own sites held back.
    held: Vec<HookSite>,
}

/// Per process: whether its unwinder is probed (by which files), and
/// the throwing sites held back until it is.
#[derive(Debug, Default)]
struct State {
    /// The kernel's return instances can be walked (`Probes.exceptions`).
    walkable: bool,
    /// The processes whose unwinder is probed, and the files (as each
    /// sees them) whose unwinder entries were probed.
    probed: HashMap<u32, Vec<PathBuf>>,
    held: HashMap<u32, Vec<HookSite>>,
    /// The processes warned about already.
    warned: HashSet<u32>,
}

/// The state, shared by the collect loop and the at-open thread.
#[derive(Clone, Debug, Default)]
pub struct ThrowingReturns(Arc<Mutex<State>>);

/// Whether `site` is a return-probed function that can throw.
fn throws(site: &HookSite) -> bool {
    site.function.return_program.is_some()
        && (exceptions::THROWING.contains(&site.function.name)
            || family::throws(site.function.name))
}

impl ThrowingReturns {
    /// For a kernel whose return instances can (`walkable`) or cannot be
    /// walked.
    pub fn new(walkable: bool) -> ThrowingReturns {
        ThrowingReturns(Arc::new(Mutex::new(State {
            walkable,
            ..State::default()
        })))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere leaves the state as it was: still usable.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Splits a batch of `pid`'s sites (files claimed for it) into what
    /// is attached now and what is held back; a batch that probes the
    /// unwinder releases what was held back before.
    pub fn admit(&self, pid: u32, sites: Vec<HookSite>) -> Admitted {
        let mut state = self.lock();
        let unwinder_files: Vec<PathBuf> = sites
            .iter()
            .filter(|site| is_unwinder_start(site.function.name))
            .map(|site| site.path.clone())
            .collect();
        if state.walkable && !unwinder_files.is_empty() {
            let marked = !state.probed.contains_key(&pid);
            state.probed.entry(pid).or_default().extend(unwinder_files);
            return Admitted {
                now: sites,
                released: state.held.remove(&pid).unwrap_or_default(),
                marked,
                ..Admitted::default()
            };
        }
        if state.walkable && state.probed.contains_key(&pid) {
            return Admitted {
                now: sites,
                ..Admitted::default()
            };
        }
        let (held, now): (Vec<HookSite>, Vec<HookSite>) = sites.into_iter().partition(throws);
        let warning = (!held.is_empty() && state.warned.insert(pid))
            .then(|| warning(pid, &held, state.walkable));
        state.held.entry(pid).or_default().extend(held.clone());
        Admitted {
            now,
            warning,
            held,
            ..Admitted::default()
        }
    }

    /// Takes back what `admitted` changed: its sites could not be
    /// attached (the file is left to another way, which admits it again).
    pub fn undo(&self, pid: u32, admitted: &Admitted) {
        let mut state = self.lock();
        if admitted.marked {
            state.probed.remove(&pid);
        }
        let held = state.held.entry(pid).or_default();
        held.retain(|site| !admitted.held.contains(site));
        held.extend(admitted.released.iter().cloned());
    }

    /// Holds `sites` back again: they were released but could not be
    /// attached (counted as unprobed).
    pub fn hold_again(&self, pid: u32, sites: &[HookSite]) {
        self.lock()
            .held
            .entry(pid)
            .or_default()
            .extend(sites.iter().cloned());
    }

    /// The sites held back, as unprobed functions, by process.
    pub fn unprobed(&self) -> Vec<(u32, Unprobed)> {
        let state = self.lock();
        let mut unprobed: Vec<(u32, Unprobed)> = state
            .held
            .iter()
            .flat_map(|(&pid, sites)| {
                sites.iter().map(move |site| {
                    (
                        pid,
                        Unprobed {
                            name: site.function.name,
                            path: site.path.clone(),
                            why: WHY.to_owned(),
                        },
                    )
                })
            })
            .collect();
        unprobed.sort_by(|(a_pid, a), (b_pid, b)| {
            (a_pid, &a.path, a.name).cmp(&(b_pid, &b.path, b.name))
        });
        unprobed
    }

    /// `pid` replaced its image: it stays probed only while it maps a
    /// file whose unwinder was probed (`mapped`, as it sees them).
    pub fn after_exec(&self, pid: u32, mapped: &[PathBuf]) {
        let mut state = self.lock();
        if let Some(files) = state.probed.get(&pid)
            && !files.iter().any(|file| mapped.contains(file))
        {
            state.probed.remove(&pid);
        }
    }

    /// Forgets `pid`, which exited.
    pub fn forget(&self, pid: u32) {
        let mut state = self.lock();
        state.probed.remove(&pid);
        state.held.remove(&pid);
        state.warned.remove(&pid);
    }
}

/// The line for stderr when `released` got their probes.
pub fn released_note(pid: u32, released: &[HookSite]) -> String {
    let mut names: Vec<String> = released
        .iter()
        .map(|site| format!("{} in {}", site.function.name, site.path.display()))
        .collect();
    names.dedup();
    format!(
        "PID {pid}: the C++ unwinder is probed now: {} probed as well",
        names.join(", ")
    )
}

/// The warning for `pid`'s first sites held back.
fn warning(pid: u32, held: &[HookSite], walkable: bool) -> String {
    let mut names: Vec<&str> = held.iter().map(|site| site.function.name).collect();
    names.sort_unstable();
    names.dedup();
    let until = if walkable {
        "until the process maps and tracer probes the unwinder"
    } else {
        "for as long as tracer runs"
    };
    format!(
        "warning: PID {pid}: {} can throw and the C++ unwinder is not probed (no \
         _Unwind_RaiseException found, or this kernel's return probes cannot be walked): \
         left without a probe {until}, so that an exception through them cannot terminate \
         the process; their blocks are counted by the malloc they call, with stacks that \
         start there (PyTorch's tensor blocks: not at all)",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::{
        attach::{
            safety::exceptions::UNWINDER_START, sites::function::HookedFunction,
            sites::symbols::SiteFile,
        },
        model::allocators::ALLOCATORS,
    };

    fn site(function: HookedFunction, path: &str) -> HookSite {
        HookSite {
            function,
            path: PathBuf::from(path),
            // One inode per path: sites of two paths are in two files.
            file: SiteFile::unopened(1, path.bytes().map(u64::from).sum()),
            function_offset: 0x1000,
            offset: 0x1000,
            emulated: true,
            reason: String::new(),
        }
    }

    fn allocator(name: &str, path: &str) -> HookSite {
        let allocator = ALLOCATORS
            .iter()
            .find(|allocator| allocator.name == name)
            .unwrap_or_else(|| panic!("{name} is not a hooked allocator"));
        site(HookedFunction::allocator(allocator), path)
    }

    fn unwinder(path: &str) -> HookSite {
        site(UNWINDER_START[0], path)
    }

    fn names(sites: &[HookSite]) -> Vec<(&str, &Path)> {
        sites
            .iter()
            .map(|site| (site.function.name, site.path.as_path()))
            .collect()
    }

    fn unprobed(throwing: &ThrowingReturns) -> Vec<(u32, &'static str, PathBuf)> {
        throwing
            .unprobed()
            .into_iter()
            .map(|(pid, unprobed)| (pid, unprobed.name, unprobed.path))
            .collect()
    }

    #[test]
    fn throwing_returns_wait_for_the_unwinder_of_their_process() {
        let throwing = ThrowingReturns::new(true);
        // A C program: malloc is probed, nothing throws yet.
        let first = throwing.admit(7, vec![allocator("malloc", "/libc.so")]);
        assert_eq!(names(&first.now), [("malloc", Path::new("/libc.so"))]);
        assert!(first.released.is_empty() && first.warning.is_none());

        // It dlopens a library that defines operator new: held back, with
        // one warning; the nothrow new and malloc go in.
        let plugin = throwing.admit(
            7,
            vec![
                allocator("_Znwm", "/plugin.so"),
                allocator("_ZnwmRKSt9nothrow_t", "/plugin.so"),
                allocator("_Znam", "/plugin.so"),
            ],
        );
        assert_eq!(
            names(&plugin.now),
            [("_ZnwmRKSt9nothrow_t", Path::new("/plugin.so"))]
        );
        let warning = plugin.warning.expect("warned");
        assert!(
            warning.contains("PID 7") && warning.contains("_Znwm"),
            "{warning}"
        );
        // The loader opens libstdc++ next: its operator new waits too,
        // without a second warning.
        let libstdcxx = throwing.admit(7, vec![allocator("_Znam", "/libstdc++.so")]);
        assert!(libstdcxx.now.is_empty() && libstdcxx.warning.is_none());
        assert_eq!(unprobed(&throwing).len(), 3);
        assert!(
            unprobed(&throwing)
                .iter()
                .all(|(pid, name, _)| *pid == 7 && *name != "_ZnwmRKSt9nothrow_t")
        );

        // Another process is not affected by what 7 holds or probes.
        let other = throwing.admit(8, vec![allocator("_Znwm", "/plugin.so")]);
        assert!(other.now.is_empty() && other.warning.is_some());

        // Then libgcc_s: its unwinder goes in now, and what was held back
        // after it, in the order it came.
        let libgcc = throwing.admit(7, vec![unwinder("/libgcc_s.so")]);
        assert_eq!(
            names(&libgcc.now),
            [("_Unwind_RaiseException", Path::new("/libgcc_s.so"))]
        );
        assert_eq!(
            names(&libgcc.released),
            [
                ("_Znwm", Path::new("/plugin.so")),
                ("_Znam", Path::new("/plugin.so")),
                ("_Znam", Path::new("/libstdc++.so")),
            ]
        );
        assert_eq!(
            unprobed(&throwing),
            [(8, "_Znwm", PathBuf::from("/plugin.so"))]
        );

        // From now on 7's throwing functions are attached at once.
        let later = throwing.admit(
            7,
            vec![allocator("_ZnamSt11align_val_t", "/libtcmalloc.so")],
        );
        assert_eq!(
            names(&later.now),
            [("_ZnamSt11align_val_t", Path::new("/libtcmalloc.so"))]
        );
        assert!(later.released.is_empty());

        // 8 exits: nothing of it is left.
        throwing.forget(8);
        assert!(unprobed(&throwing).is_empty());
    }

    #[test]
    fn nothing_throwing_is_attached_where_returns_cannot_be_walked() {
        let throwing = ThrowingReturns::new(false);
        let held = throwing.admit(
            3,
            vec![allocator("malloc", "/libc.so"), allocator("_Znwm", "/a.so")],
        );
        assert_eq!(names(&held.now), [("malloc", Path::new("/libc.so"))]);
        assert!(held.warning.unwrap().contains("for as long as tracer runs"));
        // The unwinder in the same batch or a later one changes nothing.
        let with_unwinder = throwing.admit(
            3,
            vec![unwinder("/libgcc_s.so"), allocator("_Znam", "/b.so")],
        );
        assert_eq!(
            names(&with_unwinder.now),
            [("_Unwind_RaiseException", Path::new("/libgcc_s.so"))]
        );
        assert!(with_unwinder.released.is_empty() && with_unwinder.warning.is_none());
        assert_eq!(
            unprobed(&throwing),
            [
                (3, "_Znwm", PathBuf::from("/a.so")),
                (3, "_Znam", PathBuf::from("/b.so")),
            ]
        );
    }

    #[test]
    fn a_batch_that_could_not_be_attached_is_taken_back() {
        let throwing = ThrowingReturns::new(true);
        let held = throwing.admit(5, vec![allocator("_Znwm", "/a.so")]);
        // The unwinder's batch fails: 5 is not probed, _Znwm still waits.
        let failed = throwing.admit(5, vec![unwinder("/libgcc_s.so")]);
        assert_eq!(failed.released.len(), 1);
        throwing.undo(5, &failed);
        assert_eq!(unprobed(&throwing), [(5, "_Znwm", PathBuf::from("/a.so"))]);
        let later = throwing.admit(5, vec![allocator("_Znam", "/b.so")]);
        assert!(later.now.is_empty());
        // A held-back batch that fails is forgotten (admitted again by
        // the way that retries it), not released twice.
        throwing.undo(5, &later);
        throwing.undo(5, &held);
        assert!(unprobed(&throwing).is_empty());
        let retried = throwing.admit(5, vec![unwinder("/libgcc_s.so")]);
        assert!(retried.released.is_empty());
    }

    #[test]
    fn an_exec_into_an_image_without_the_unwinder_unmarks_the_process() {
        let throwing = ThrowingReturns::new(true);
        throwing.admit(9, vec![unwinder("/libgcc_s.so")]);
        throwing.after_exec(9, &[PathBuf::from("/libgcc_s.so"), PathBuf::from("/bin/b")]);
        assert_eq!(
            throwing
                .admit(9, vec![allocator("_Znwm", "/a.so")])
                .now
                .len(),
            1
        );
        throwing.after_exec(9, &[PathBuf::from("/bin/c")]);
        assert!(
            throwing
                .admit(9, vec![allocator("_Znwm", "/a.so")])
                .now
                .is_empty()
        );
    }
}
