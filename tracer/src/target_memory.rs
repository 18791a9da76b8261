//! The memory of a traced process, as the walkers over its structures
//! (glibc's arenas, CPython's thread states) see it: a typed interface with
//! one implementation that reads a live process (process_vm_readv) and one
//! over a fabricated image, so that every walk can be tested, and fuzzed,
//! over memory that a hostile target could have laid out. The system
//! calls that read a live process (`read`, `read_pieces`) are here too:
//! the holders scan uses them directly, for its batches.
use std::collections::BTreeMap;

/// Memory that can be read at an address.
pub trait TargetMemory {
    /// Reads `buffer.len()` bytes at `address`; returns how many bytes
    /// from the start could be read (fewer at an unreadable page).
    fn read(&self, address: u64, buffer: &mut [u8]) -> usize;

    /// Reads `buffer.len()` bytes at `address`, all of them or none.
    fn read_exact(&self, address: u64, buffer: &mut [u8]) -> bool {
        self.read(address, buffer) == buffer.len()
    }

    /// The native-endian word at `address`.
    fn read_u64(&self, address: u64) -> Option<u64> {
        let mut word = [0u8; 8];
        self.read_exact(address, &mut word)
            .then(|| u64::from_ne_bytes(word))
    }

    /// The native-endian 32-bit word at `address`.
    fn read_u32(&self, address: u64) -> Option<u32> {
        let mut word = [0u8; 4];
        self.read_exact(address, &mut word)
            .then(|| u32::from_ne_bytes(word))
    }
}

/// A live process, read with process_vm_readv without stopping it. A
/// read is kept only while the PID still names the process tracer
/// follows (`procfs::confirmed`): after it exited, nothing reads.
#[derive(Clone, Copy, Debug)]
pub struct Process(pub u32);

impl TargetMemory for Process {
    fn read(&self, address: u64, buffer: &mut [u8]) -> usize {
        let read = read(self.0, address, buffer);
        crate::procfs::confirmed(self.0, read).unwrap_or(0)
    }
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

/// Memory made of byte ranges placed at addresses; everything else is
/// unreadable, as an unmapped page is.
#[derive(Clone, Debug, Default)]
pub struct Image {
    ranges: BTreeMap<u64, Vec<u8>>,
}

impl Image {
    pub fn new() -> Image {
        Image::default()
    }

    /// Places `bytes` at `address` (ranges must not overlap).
    pub fn place(&mut self, address: u64, bytes: Vec<u8>) -> &mut Image {
        self.ranges.insert(address, bytes);
        self
    }

    /// Writes the native-endian word `value` at `address`, inside a range
    /// placed before.
    pub fn write_u64(&mut self, address: u64, value: u64) -> &mut Image {
        let (&start, bytes) = self
            .ranges
            .range_mut(..=address)
            .next_back()
            .expect("a range placed at or before the address");
        let offset = (address - start) as usize;
        bytes[offset..offset + 8].copy_from_slice(&value.to_ne_bytes());
        self
    }
}

impl TargetMemory for Image {
    fn read(&self, address: u64, buffer: &mut [u8]) -> usize {
        let mut done = 0;
        while done < buffer.len() {
            let at = address.saturating_add(done as u64);
            let Some((&start, bytes)) = self.ranges.range(..=at).next_back() else {
                break;
            };
            let offset = (at - start) as usize;
            if offset >= bytes.len() {
                break;
            }
            let count = (bytes.len() - offset).min(buffer.len() - done);
            buffer[done..done + count].copy_from_slice(&bytes[offset..offset + count]);
            done += count;
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_and_stops_at_an_unmapped_address() {
        let data = [7u8; 64];
        let mut buffer = [0u8; 64];
        let got = read(std::process::id(), data.as_ptr() as u64, &mut buffer);
        assert_eq!(got, 64);
        assert_eq!(buffer, data);
        assert_eq!(read(std::process::id(), 8, &mut buffer), 0);
    }

    #[test]
    fn an_image_reads_across_adjacent_ranges_and_stops_at_a_hole() {
        let mut image = Image::new();
        image
            .place(0x1000, vec![1; 16])
            .place(0x1010, vec![2; 16])
            .place(0x2000, vec![3; 8]);
        let mut buffer = [0u8; 40];
        assert_eq!(image.read(0x1008, &mut buffer), 24);
        assert_eq!(&buffer[..8], &[1; 8]);
        assert_eq!(&buffer[8..24], &[2; 16]);
        assert_eq!(image.read_u64(0x2000), Some(u64::from_ne_bytes([3; 8])));
        assert_eq!(image.read_u64(0x2004), None);
        assert_eq!(image.read_u64(0x10), None);
    }

    #[test]
    fn a_process_reads_its_own_memory() {
        let word = 0x1234_5678_9abc_def0u64;
        let process = Process(std::process::id());
        assert_eq!(process.read_u64(&word as *const u64 as u64), Some(word));
    }
}
