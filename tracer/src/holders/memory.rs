//! What the scan reads of a running target, without stopping it: its
//! writable mappings (/proc/PID/maps), its threads' stack pointers and
//! syscall argument registers (/proc/PID/task/TID/syscall, which the kernel
//! fills for a thread blocked in a system call without stopping it), and
//! memory through process_vm_readv, chunk by chunk.
use std::path::PathBuf;

use anyhow::{Context as _, Result};

/// One line of /proc/PID/maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsLine {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    pub file_offset: u64,
    /// The path, `[heap]`, `[stack]`, `[anon:NAME]`, or empty (anonymous).
    pub name: String,
}

impl MapsLine {
    /// Whether the scan reads it: readable and writable memory that is no
    /// device (a GPU's mappings) and no kernel page.
    pub fn scanned(&self) -> bool {
        self.readable
            && self.writable
            && !self.name.starts_with("/dev/")
            && !matches!(self.name.as_str(), "[vvar]" | "[vsyscall]" | "[vdso]")
            && !self.name.starts_with("[vvar")
    }

    pub fn is_file(&self) -> bool {
        self.name.starts_with('/')
    }

    pub fn bytes(&self) -> u64 {
        self.end - self.start
    }
}

/// Parses /proc/PID/maps: every mapping, file-backed or not.
pub fn parse_regions(text: &str) -> Vec<MapsLine> {
    text.lines().filter_map(parse_region).collect()
}

fn parse_region(line: &str) -> Option<MapsLine> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    let file_offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let _device = fields.next()?;
    let _inode = fields.next()?;
    let name = fields.next().unwrap_or("").trim_start().to_owned();
    Some(MapsLine {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        readable: perms.first() == Some(&b'r'),
        writable: perms.get(1) == Some(&b'w'),
        executable: perms.get(2) == Some(&b'x'),
        file_offset,
        name,
    })
}

/// `regions` with neighbours of one name and the same permissions joined:
/// the kernel splits one mapping in several (transparent huge pages,
/// madvise), `[heap]` among them, where a chunk runs across the seams.
pub fn joined(regions: &[MapsLine]) -> Vec<MapsLine> {
    let mut joined: Vec<MapsLine> = Vec::with_capacity(regions.len());
    for region in regions {
        match joined.last_mut() {
            Some(last)
                if last.end == region.start
                    && last.name == region.name
                    && !region.is_file()
                    && (last.readable, last.writable) == (region.readable, region.writable) =>
            {
                last.end = region.end;
            }
            _ => joined.push(region.clone()),
        }
    }
    joined
}

pub fn regions(pid: u32) -> Result<Vec<MapsLine>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("could not read /proc/{pid}/maps"))?;
    Ok(parse_regions(&text))
}

/// One thread of the target, as the scan sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thread {
    pub tid: u32,
    pub comm: String,
    /// Its stack pointer, when it is blocked (in a system call or not
    /// running); None while it runs on a CPU.
    pub stack_pointer: Option<u64>,
    /// The argument registers of the system call it is blocked in.
    pub registers: Vec<u64>,
}

/// Parses /proc/PID/task/TID/syscall: `NR ARG1..ARG6 SP PC`, `-1 SP PC`
/// (blocked, not in a system call) or `running`.
pub fn parse_syscall(text: &str) -> (Option<u64>, Vec<u64>) {
    let words: Vec<&str> = text.split_whitespace().collect();
    let hex = |word: &str| u64::from_str_radix(word.trim_start_matches("0x"), 16).ok();
    match words.len() {
        9 => (
            hex(words[7]),
            words[1..7].iter().filter_map(|word| hex(word)).collect(),
        ),
        3 => (hex(words[1]), Vec::new()),
        _ => (None, Vec::new()),
    }
}

/// The target's threads, their stack pointers and registers as far as
/// the kernel tells them without stopping anything.
pub fn threads(pid: u32) -> Vec<Thread> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut threads: Vec<Thread> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .map(|tid| {
            let task = PathBuf::from(format!("/proc/{pid}/task/{tid}"));
            let comm = std::fs::read_to_string(task.join("comm"))
                .map(|comm| comm.trim_end().to_owned())
                .unwrap_or_default();
            let (stack_pointer, registers) = std::fs::read_to_string(task.join("syscall"))
                .map(|text| parse_syscall(&text))
                .unwrap_or_default();
            Thread {
                tid,
                comm,
                stack_pointer,
                registers,
            }
        })
        .collect();
    threads.sort_by_key(|thread| thread.tid);
    threads
}

/// `PAGEMAP_SCAN` (Linux 6.7+): `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: libc::c_ulong = 0xc060_6610;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;
/// Ranges asked for per PAGEMAP_SCAN call.
const SCAN_RANGES: usize = 512;
const PAGE_BYTES: u64 = 4096;

/// `struct pm_scan_arg` (include/uapi/linux/fs.h).
///
/// Wide: the kernel's `struct pm_scan_arg` (PAGEMAP_SCAN), field for field.
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// The target's pages that hold data, for the scan: what is neither
/// resident nor swapped out was never written (or was given back) and
/// reads as zeros, so a reservation of a terabyte costs nothing to scan.
pub struct Populated {
    pagemap: Option<std::fs::File>,
}

impl Populated {
    pub fn open(pid: u32) -> Populated {
        Populated {
            pagemap: std::fs::File::open(format!("/proc/{pid}/pagemap")).ok(),
        }
    }

    /// The ranges of `start..end` (page-aligned) whose pages are resident
    /// or swapped, joined, in order; the whole range where the kernel
    /// cannot tell (no pagemap), at most one range per page.
    pub fn ranges(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let Some(pagemap) = &self.pagemap else {
            return vec![(start, end)];
        };
        match scan_ranges(pagemap, start, end) {
            Some(ranges) => ranges,
            None => pagemap_ranges(pagemap, start, end).unwrap_or_else(|| vec![(start, end)]),
        }
    }
}

/// A region's populated ranges (`Populated::ranges`), for walks that skip
/// what holds no data.
pub struct Resident {
    ranges: Vec<(u64, u64)>,
}

impl Resident {
    pub fn of(populated: &Populated, region: &MapsLine) -> Resident {
        Resident {
            ranges: populated.ranges(region.start & !(PAGE_BYTES - 1), region.end),
        }
    }

    /// The first populated address at or after `address`; None past the
    /// last populated range.
    pub fn next(&self, address: u64) -> Option<u64> {
        let index = self.ranges.partition_point(|&(_, end)| end <= address);
        self.ranges.get(index).map(|&(start, _)| start.max(address))
    }

    /// The first populated page at or after `page` (page-aligned); None
    /// past the last populated range.
    pub fn next_page(&self, page: u64) -> Option<u64> {
        self.next(page).map(|at| at.next_multiple_of(PAGE_BYTES))
    }
}

/// The populated ranges by PAGEMAP_SCAN; None where the kernel has no
/// such ioctl.
fn scan_ranges(pagemap: &std::fs::File, start: u64, end: u64) -> Option<Vec<(u64, u64)>> {
    use std::os::fd::AsRawFd as _;
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut found = [PageRegion::default(); SCAN_RANGES];
    let mut from = start;
    while from < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start: from,
            end,
            vec: found.as_mut_ptr() as u64,
            vec_len: SCAN_RANGES as u64,
            category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            return_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            ..PmScanArg::default()
        };
        // SAFETY: `arg` and the `found` array it points at live through
        // the call; the kernel writes at most `vec_len` regions.
        let count = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
        if count < 0 {
            return None;
        }
        for region in &found[..(count as usize).min(SCAN_RANGES)] {
            match ranges.last_mut() {
                Some(last) if last.1 == region.start => last.1 = region.end,
                _ => ranges.push((region.start, region.end)),
            }
        }
        if arg.walk_end <= from {
            break;
        }
        from = arg.walk_end;
    }
    Some(ranges)
}

/// The populated ranges from /proc/PID/pagemap's entry per page (bit 63
/// present, bit 62 swapped), for kernels before 6.7.
fn pagemap_ranges(pagemap: &std::fs::File, start: u64, end: u64) -> Option<Vec<(u64, u64)>> {
    use std::os::unix::fs::FileExt as _;
    const ENTRIES: usize = 1 << 16;
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut entries = vec![0u8; ENTRIES * 8];
    let mut page = start / PAGE_BYTES;
    let last = end.div_ceil(PAGE_BYTES);
    while page < last {
        let count = ((last - page) as usize).min(ENTRIES);
        let read = pagemap.read_at(&mut entries[..count * 8], page * 8).ok()?;
        if read < 8 {
            return None;
        }
        for (index, entry) in entries[..read / 8 * 8].chunks_exact(8).enumerate() {
            let entry = u64::from_ne_bytes(entry.try_into().expect("8 bytes"));
            if entry & (3 << 62) == 0 {
                continue;
            }
            let at = (page + index as u64) * PAGE_BYTES;
            match ranges.last_mut() {
                Some(last) if last.1 == at => last.1 = at + PAGE_BYTES,
                _ => ranges.push((at, at + PAGE_BYTES)),
            }
        }
        page += (read / 8) as u64;
    }
    Some(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_kind_of_mapping_line() {
        let regions = parse_regions(
            "55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]\n\
             7f0000000000-7f0000001000 rw-p 00003000 08:01 1234                       /usr/lib/libc.so.6\n\
             7f0000002000-7f0000003000 r--p 00000000 00:00 0 \n\
             7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n",
        );
        assert_eq!(regions.len(), 4);
        assert_eq!(regions[0].name, "[heap]");
        assert!(regions[0].scanned());
        assert_eq!(regions[1].file_offset, 0x3000);
        assert!(regions[1].is_file());
        assert!(!regions[2].scanned(), "read-only");
        assert_eq!(regions[2].name, "");
        assert_eq!(regions[3].bytes(), 0x21000);
        let split = parse_regions(
            "55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0 [heap]\n\
             55d0c0a21000-55d0c0a40000 rw-p 00000000 00:00 0 [heap]\n\
             55d0c0a40000-55d0c0a50000 rw-p 00000000 00:00 0 \n\
             55d0c0a50000-55d0c0a60000 rw-p 00000000 00:00 0 \n",
        );
        let joined = joined(&split);
        assert_eq!(joined.len(), 2, "{joined:?}");
        assert_eq!(
            (joined[0].start, joined[0].end),
            (0x55d0c0a00000, 0x55d0c0a40000)
        );
        assert_eq!(joined[1].bytes(), 0x20000);
    }

    #[test]
    fn parses_syscall_lines() {
        assert_eq!(
            parse_syscall("0 0x0 0x55d0c0a002a0 0x400 0x0 0x0 0x0 0x7ffd0001f000 0x7f00001234\n"),
            (
                Some(0x7ffd0001f000),
                vec![0, 0x55d0c0a002a0, 0x400, 0, 0, 0]
            )
        );
        assert_eq!(
            parse_syscall("-1 0x7ffd0001f000 0x7f00001234\n"),
            (Some(0x7ffd0001f000), vec![])
        );
        assert_eq!(parse_syscall("running\n"), (None, vec![]));
    }

    #[test]
    fn only_the_touched_pages_of_a_reservation_are_populated() {
        let bytes = 1usize << 40;
        // SAFETY: a fresh private reservation, unmapped below; only its
        // pages 0 and 3 are written.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(start, libc::MAP_FAILED);
        let page = PAGE_BYTES as usize;
        // SAFETY: inside the reservation.
        unsafe {
            start.cast::<u8>().write_volatile(1);
            start.cast::<u8>().add(3 * page).write_volatile(1);
            start.cast::<u8>().add(4 * page).write_volatile(1);
        }
        let start_address = start as u64;
        let populated = Populated::open(std::process::id());
        let began = std::time::Instant::now();
        let ranges = populated.ranges(start_address, start_address + bytes as u64);
        let seconds = began.elapsed().as_secs_f64();
        // SAFETY: the reservation mapped above, no longer used.
        unsafe { libc::munmap(start, bytes) };
        assert_eq!(
            ranges,
            [
                (start_address, start_address + PAGE_BYTES),
                (
                    start_address + 3 * PAGE_BYTES,
                    start_address + 5 * PAGE_BYTES
                )
            ]
        );
        assert!(seconds < 5.0, "{seconds} s for a terabyte");
    }
}
