//! `--unwind auto` and `dwarf`: the kernel walks each target's stacks
//! through unwind tables (`crate::unwind::registry` builds them in the
//! background). Here, per process, its executable mappings are kept
//! current in the kernel (at attach, when it maps libraries, after an
//! exec; forgotten when it exits), and the tables are written to the
//! kernel as they become ready, after which the processes that waited for
//! them get their mappings again.
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::attach::{Probes, unwinding::maps::UnwindMaps};
use crate::{
    procfs,
    unwind::registry::{TableState, UnwindMapSizes, UnwindTables},
};

/// How long attaching a process waits for its tables at most: the small
/// objects' are built by then; larger ones (libtorch, ~0.5 s) are
/// written when ready, their frames walked by frame pointers until then.
const ATTACH_WAIT: Duration = Duration::from_millis(150);
/// The same for the libraries a process maps later, as they are hooked.
const MAPPED_WAIT: Duration = Duration::from_millis(100);

/// What the kernel walks by, per process.
pub struct KernelUnwinding {
    maps: UnwindMaps,
    tables: UnwindTables,
    /// The processes walked through tables, with how many of their
    /// mappings wait for a table.
    processes: HashMap<u32, u32>,
    /// The tables already described (`-v`), by their index in the
    /// registry.
    described: HashSet<usize>,
    started_at: Instant,
}

impl KernelUnwinding {
    /// With `trust_frame_pointers` (`auto`), objects that keep frame
    /// pointers get no table.
    pub fn new(maps: UnwindMaps, trust_frame_pointers: bool) -> KernelUnwinding {
        let capacity = UnwindMapSizes {
            rows: maps.row_capacity(),
            tables: maps.table_capacity(),
        };
        KernelUnwinding {
            maps,
            tables: UnwindTables::new(capacity, trust_frame_pointers),
            processes: HashMap::new(),
            described: HashSet::new(),
            started_at: Instant::now(),
        }
    }

    /// Writes the tables built since the last call to the kernel.
    fn write_ready(&mut self) -> Result<bool> {
        let ready = self.tables.take_ready();
        for table in &ready {
            self.maps
                .write_table(table.id, table.table.first_row, &table.rows)?;
        }
        Ok(!ready.is_empty())
    }

    /// Sets the kernel's mappings of `pid` from `maps` (its tables written
    /// first).
    fn set(&mut self, pid: u32, maps: &[procfs::Mapping]) -> Result<u32> {
        let process = self.tables.process_mappings(pid, maps);
        let mut mappings = process.mappings;
        if process.left_out > 0 {
            // The kernel counts walks through the mappings left out.
            mappings.pad = 1;
        }
        self.write_ready()?;
        self.maps.set_mappings(pid, &mappings)?;
        self.processes.insert(pid, process.pending);
        Ok(process.pending)
    }

    /// `set`, after waiting up to `wait` for the tables it lacks.
    fn set_waiting(&mut self, pid: u32, maps: &[procfs::Mapping], wait: Duration) -> Result<()> {
        if self.set(pid, maps)? > 0 {
            self.tables.wait_for_builds(wait);
            self.set(pid, maps)?;
        }
        Ok(())
    }

    /// Lines for `-v` on the tables whose build ended since the last call.
    fn describe_new(&mut self) -> Vec<String> {
        let after_s = self.started_at.elapsed().as_secs_f64();
        let mut notes = Vec::new();
        for (index, table) in self.tables.tables().iter().enumerate() {
            if table.state != TableState::Pending && self.described.insert(index) {
                notes.push(format!("{table} (ready {after_s:.2} s after start)"));
            }
        }
        // From here on no stack is walked for want of a table (until a
        // library mapped later is built).
        let summary = self.tables.summary();
        if !notes.is_empty() && summary.pending == 0 {
            notes.push(format!(
                "{summary} (every table ready {after_s:.2} s after start)"
            ));
        }
        notes
    }
}

impl Probes {
    /// Starts walking the stacks of `pid` through unwind tables (its
    /// mappings `maps`), waiting a little for the tables of its objects.
    pub(in crate::attach) fn track_unwinding(
        &mut self,
        pid: u32,
        maps: &[procfs::Mapping],
    ) -> Result<()> {
        match self.unwind.kernel.as_mut() {
            Some(kernel) => kernel.set_waiting(pid, maps, ATTACH_WAIT),
            None => Ok(()),
        }
    }

    /// Reads the mappings of a tracked process again (libraries mapped),
    /// waiting a little for the tables of new objects.
    pub(in crate::attach) fn refresh_unwinding(
        &mut self,
        pid: u32,
        maps: &[procfs::Mapping],
    ) -> Result<()> {
        match self.unwind.kernel.as_mut() {
            Some(kernel) if kernel.processes.contains_key(&pid) => {
                kernel.set_waiting(pid, maps, MAPPED_WAIT)
            }
            _ => Ok(()),
        }
    }

    /// Reads the mappings of `pid` again after it replaced its image.
    pub fn remap_unwinding(&mut self, pid: u32) -> Result<()> {
        match procfs::read_maps(pid) {
            Ok(maps) => self.refresh_unwinding(pid, &maps),
            // Gone: forgotten when its exit is noticed.
            Err(_) => Ok(()),
        }
    }

    /// Writes the tables that became ready to the kernel, and the mappings
    /// of the processes that waited for them; returns lines for `-v`.
    pub fn poll_unwind_tables(&mut self) -> Result<Vec<String>> {
        let Some(kernel) = self.unwind.kernel.as_mut() else {
            return Ok(Vec::new());
        };
        kernel.write_ready()?;
        let notes = kernel.describe_new();
        if !notes.is_empty() {
            // Builds ended: the processes that waited get their tables.
            let waiting: Vec<u32> = kernel
                .processes
                .iter()
                .filter(|(_, pending)| **pending > 0)
                .map(|(pid, _)| *pid)
                .collect();
            for pid in waiting {
                if let Ok(maps) = procfs::read_maps(pid) {
                    kernel.set(pid, &maps)?;
                }
            }
        }
        Ok(notes)
    }

    /// One line on every table, for `-v` at the end.
    pub fn unwind_tables_summary(&self) -> Option<String> {
        self.unwind
            .kernel
            .as_ref()
            .map(|kernel| kernel.tables.summary().to_string())
    }

    /// Whether the kernel walks the stacks of `pid` through tables.
    pub fn walks_tables_of(&self, pid: u32) -> bool {
        self.unwind
            .kernel
            .as_ref()
            .is_some_and(|kernel| kernel.processes.contains_key(&pid))
    }

    /// Forgets a process that exited.
    pub(in crate::attach) fn forget_unwinding(&mut self, pid: u32) {
        if let Some(kernel) = self.unwind.kernel.as_mut() {
            kernel.maps.forget(pid);
            kernel.processes.remove(&pid);
        }
    }
}

#[cfg(test)]
#[path = "walk_tests.rs"]
mod walk_tests;
