//! How the stacks of a target are unwound (`--unwind`): through the
//! kernel's walk of unwind tables, or copied; and the check, on a thread of
//! its own, that names the objects without frame pointers.
pub(in crate::attach) mod maps;
pub(in crate::attach) mod tables;
use anyhow::{Context as _, Result};

use crate::attach::Probes;
use crate::procfs;

/// How long the stop waits for the frame-pointer checks still running
/// (a torch process's 300 objects take seconds; exit stays under 0.5 s).
const LACKING_CHECK_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

impl Probes {
    /// `--unwind auto`, `dwarf`: the kernel walks the stacks of `pid`
    /// through unwind tables, or, for a Go program that calls C (whose
    /// stack switch the kernel's walk does not follow), they are copied
    /// when an object it maps (other than glibc's) lacks frame pointers.
    pub(in crate::attach) fn choose_unwinding(
        &mut self,
        pid: u32,
        maps: &[procfs::Mapping],
    ) -> Result<()> {
        if !self.modes.unwinding.uses_tables() {
            return Ok(());
        }
        let cgo = crate::unwind::stack_switch(pid, maps).is_some();
        if cgo || self.unwind.kernel.is_none() {
            let lacking = crate::unwind::frame_pointers::objects_lacking(pid, maps);
            return self.start_copying(pid, lacking);
        }
        self.track_unwinding(pid, maps)?;
        // The objects without frame pointers are only named (the kernel
        // walks every stack through tables): checked on a thread of its
        // own, off the attach (a torch process's 300 objects take seconds).
        let maps = maps.to_vec();
        let check = std::thread::Builder::new()
            .name("tracer-fp-check".to_owned())
            .spawn(move || {
                crate::procfs::lower_this_threads_priority();
                crate::unwind::frame_pointers::objects_lacking(pid, &maps)
            })
            .context("could not start the frame-pointer check")?;
        self.unwind.lacking_checks.push((pid, check));
        self.unwind.walking_tables_of.push((pid, Vec::new()));
        Ok(())
    }

    /// The frame-pointer checks that ended (with `wait`, at stop: all of
    /// them, waited for at most [`LACKING_CHECK_WAIT`], so that Ctrl-C
    /// right after attach still exits at once): their objects join
    /// `walking_tables_of`; returns a line for stderr per process with
    /// some, and per check left unfinished at stop.
    pub fn take_lacking_checks(&mut self, wait: bool) -> Vec<String> {
        if wait {
            let deadline = std::time::Instant::now() + LACKING_CHECK_WAIT;
            while self
                .unwind
                .lacking_checks
                .iter()
                .any(|(_, check)| !check.is_finished())
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let (done, pending): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unwind.lacking_checks)
            .into_iter()
            .partition(|(_, check)| check.is_finished());
        let mut notes = Vec::new();
        if wait {
            // Left running: the thread only reads files, and ends with tracer.
            for (pid, _) in pending {
                notes.push(format!(
                    "PID {pid}: the check for objects without frame pointers had not finished \
                     at stop: they are not named (its stacks were walked through unwind tables)"
                ));
                self.unwind.lacking_unnamed.push(pid);
            }
        } else {
            self.unwind.lacking_checks = pending;
        }
        for (pid, check) in done {
            let lacking = check.join().unwrap_or_default();
            if lacking.is_empty() {
                continue;
            }
            notes.push(format!(
                "PID {pid}: no frame pointers in {}: its stacks are walked in the kernel \
                 through unwind tables",
                lacking.join(", ")
            ));
            self.name_lacking(pid, lacking);
        }
        notes
    }

    /// Names objects of `pid` without frame pointers in its unwinding
    /// report (its stacks are walked through unwind tables).
    pub(in crate::attach) fn name_lacking(&mut self, pid: u32, lacking: Vec<String>) {
        if let Some((_, objects)) = self
            .unwind
            .walking_tables_of
            .iter_mut()
            .find(|(walked, _)| *walked == pid)
        {
            objects.extend(lacking);
        }
    }
}
