//! The memory of a traced process, as the walkers over its structures
//! (glibc's arenas, CPython's thread states) see it: a typed interface with
//! one implementation that reads a live process (process_vm_readv) and one
//! over a fabricated image, so that every walk can be tested, and fuzzed,
//! over memory that a hostile target could have laid out.
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
        let read = crate::holders::memory::read(self.0, address, buffer);
        crate::procfs::confirmed(self.0, read).unwrap_or(0)
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
