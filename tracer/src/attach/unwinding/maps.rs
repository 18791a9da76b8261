//! The kernel's unwind tables (`tracer-ebpf/src/unwind.rs`) as userspace
//! fills them: the rows of every table in UNWIND_ROWS, written through a
//! shared mapping of the map (millions of rows, no system call per row),
//! where each table's rows are in UNWIND_TABLES, and per process its
//! executable mappings in UNWIND_MAPPINGS.
use std::os::fd::{AsFd as _, AsRawFd as _};

use anyhow::{Context as _, Result, bail};
use aya::{
    Ebpf,
    maps::{Array, HashMap, Map, MapData},
};
use tracer_ebpf::{UnwindMappings, UnwindRow, UnwindTable};

/// UNWIND_ROWS, written through shared mappings of its memory.
struct MappedRows {
    map: Map,
    capacity: u32,
}

const PAGE_BYTES: usize = 4096;

impl MappedRows {
    fn new(map: Map, capacity: u32) -> Result<MappedRows> {
        if !matches!(map, Map::Array(_)) {
            bail!("UNWIND_ROWS is not an array");
        }
        Ok(MappedRows { map, capacity })
    }

    /// Copies `rows` to rows `first..`, through a mapping of just the
    /// pages they fall in, unmapped after: the rows stay in the map, not
    /// in tracer's resident memory.
    fn write(&mut self, first: u32, rows: &[UnwindRow]) -> Result<()> {
        let end = first as usize + rows.len();
        if end > self.capacity as usize {
            bail!(
                "rows {first}..{end} do not fit in UNWIND_ROWS ({} rows)",
                self.capacity
            );
        }
        let Map::Array(data) = &self.map else {
            bail!("UNWIND_ROWS is not an array");
        };
        let row_bytes = size_of::<UnwindRow>();
        let start_byte = first as usize * row_bytes;
        let offset = start_byte / PAGE_BYTES * PAGE_BYTES;
        let length = (end * row_bytes).div_ceil(PAGE_BYTES) * PAGE_BYTES - offset;
        // SAFETY: a shared mapping of pages of the map's memory (within
        // its size: checked above), unmapped before returning.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                length,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                data.fd().as_fd().as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if address == libc::MAP_FAILED {
            bail!(
                "could not map UNWIND_ROWS: {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: the rows' bytes lie in the mapping; UnwindRow is plain
        // data.
        unsafe {
            let target = address
                .cast::<u8>()
                .add(start_byte - offset)
                .cast::<UnwindRow>();
            std::ptr::copy_nonoverlapping(rows.as_ptr(), target, rows.len());
            libc::munmap(address, length);
        }
        Ok(())
    }
}

/// The three maps of the kernel's unwind tables.
pub struct UnwindMaps {
    rows: MappedRows,
    tables: Array<MapData, UnwindTable>,
    mappings: HashMap<MapData, u32, UnwindMappings>,
    /// The last `UnwindMappings::generation` written.
    generation: u32,
}

impl UnwindMaps {
    /// Takes the maps out of the loaded object (UNWIND_ROWS sized to
    /// `row_capacity` rows at load).
    pub fn take(ebpf: &mut Ebpf, row_capacity: u32) -> Result<UnwindMaps> {
        let take = |ebpf: &mut Ebpf, name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("eBPF object lacks {name}"))
        };
        let rows = MappedRows::new(take(ebpf, tracer_ebpf::map::UNWIND_ROWS)?, row_capacity)?;
        let tables = Array::try_from(take(ebpf, tracer_ebpf::map::UNWIND_TABLES)?)
            .context("UNWIND_TABLES is not an array")?;
        let mappings = HashMap::try_from(take(ebpf, tracer_ebpf::map::UNWIND_MAPPINGS)?)
            .context("UNWIND_MAPPINGS is not a hash map")?;
        Ok(UnwindMaps {
            rows,
            tables,
            mappings,
            generation: 0,
        })
    }

    /// Most rows the tables hold together.
    pub fn row_capacity(&self) -> u32 {
        self.rows.capacity
    }

    /// Most tables.
    pub fn table_capacity(&self) -> u32 {
        self.tables.len()
    }

    /// Writes table `index`: its rows from row `first_row` on.
    pub fn write_table(&mut self, index: u32, first_row: u32, rows: &[UnwindRow]) -> Result<()> {
        self.rows.write(first_row, rows)?;
        let table = UnwindTable {
            first_row,
            row_count: rows.len() as u32,
        };
        self.tables
            .set(index, table, 0)
            .with_context(|| format!("could not write unwind table {index}"))
    }

    /// Sets the mappings the kernel walks the stacks of `pid` by, under a
    /// generation of their own: what the kernel's step cache holds for the
    /// mappings before no longer applies.
    pub fn set_mappings(&mut self, pid: u32, mappings: &UnwindMappings) -> Result<()> {
        self.generation = self.generation.wrapping_add(1).max(1);
        let stamped = UnwindMappings {
            generation: self.generation,
            ..*mappings
        };
        self.mappings
            .insert(pid, stamped, 0)
            .with_context(|| format!("could not set the unwind mappings of PID {pid}"))
    }

    /// Forgets a process: its stacks go by frame pointers.
    pub fn forget(&mut self, pid: u32) {
        let _ = self.mappings.remove(&pid);
    }
}
