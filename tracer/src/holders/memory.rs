//! What the scan reads of a running target, without stopping it: its
//! writable mappings (/proc/PID/maps), its threads' stack pointers and
//! syscall argument registers (/proc/PID/task/TID/syscall, which the kernel
//! fills for a thread blocked in a system call without stopping it), and
//! memory through process_vm_readv, chunk by chunk.
use std::path::PathBuf;

use anyhow::{Context as _, Result};

/// One line of /proc/PID/maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    pub file_offset: u64,
    /// The path, `[heap]`, `[stack]`, `[anon:NAME]`, or empty (anonymous).
    pub name: String,
}

impl Region {
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
pub fn parse_regions(text: &str) -> Vec<Region> {
    text.lines().filter_map(parse_region).collect()
}

fn parse_region(line: &str) -> Option<Region> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    let file_offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let _device = fields.next()?;
    let _inode = fields.next()?;
    let name = fields.next().unwrap_or("").trim_start().to_owned();
    Some(Region {
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
pub fn joined(regions: &[Region]) -> Vec<Region> {
    let mut joined: Vec<Region> = Vec::with_capacity(regions.len());
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

pub fn regions(pid: u32) -> Result<Vec<Region>> {
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

/// Reads `buffer.len()` bytes at `address` of `pid`; returns how many
/// bytes from the start could be read (fewer at an unreadable page).
pub fn read(pid: u32, address: u64, buffer: &mut [u8]) -> usize {
    let local = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: buffer.len(),
    };
    // SAFETY: the local iovec covers `buffer`, which is writable and lives
    // through the call; the remote one is only read, in the other process.
    let read = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    read.max(0) as usize
}

/// iovecs per process_vm_readv (the kernel's UIO_MAXIOV).
pub const IOVECS: usize = 1024;

/// Reads the pieces `wanted` (address, length; at most `slot` bytes each),
/// piece i at `i * slot` in `buffer`, IOVECS per system call; `lengths`
/// says how many bytes of each were read (none where it could not be).
pub fn read_pieces(
    pid: u32,
    wanted: &[(u64, usize)],
    slot: usize,
    buffer: &mut [u8],
    lengths: &mut Vec<usize>,
) {
    assert!(buffer.len() >= wanted.len() * slot, "a slot per piece");
    lengths.clear();
    lengths.extend(wanted.iter().map(|&(_, length)| length.min(slot)));
    let mut next = 0;
    while next < lengths.len() {
        let batch = next..lengths.len().min(next + IOVECS);
        let remote: Vec<libc::iovec> = batch
            .clone()
            .map(|index| libc::iovec {
                iov_base: wanted[index].0 as *mut libc::c_void,
                iov_len: lengths[index],
            })
            .collect();
        let local: Vec<libc::iovec> = batch
            .clone()
            .map(|index| libc::iovec {
                iov_base: buffer[index * slot..].as_mut_ptr().cast(),
                iov_len: lengths[index],
            })
            .collect();
        // SAFETY: each local iovec covers its own `slot` bytes of
        // `buffer`, which lives and is not otherwise touched through the
        // call; the remote ones are only read, in the other process.
        let read = unsafe {
            libc::process_vm_readv(
                pid as libc::pid_t,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        if read < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            // The process is gone: nothing more to read.
            lengths[next..].fill(0);
            return;
        }
        // A read stops at the first piece it cannot read whole: keep what
        // came, cut that one short, go on after it.
        let mut left = read.max(0) as usize;
        let mut index = next;
        while index < batch.end && left >= lengths[index] {
            left -= lengths[index];
            index += 1;
        }
        if index < batch.end {
            lengths[index] = left;
            index += 1;
        }
        next = index;
    }
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
    fn reads_own_memory_and_stops_at_an_unmapped_address() {
        let data = [7u8; 64];
        let mut buffer = [0u8; 64];
        let read = read(std::process::id(), data.as_ptr() as u64, &mut buffer);
        assert_eq!(read, 64);
        assert_eq!(buffer, data);
        assert_eq!(super::read(std::process::id(), 8, &mut buffer), 0);
    }
}
