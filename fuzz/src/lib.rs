//! What the fuzz targets share: a reader of the fixed fields at the
//! start of an input, and the memory image format of the targets that
//! walk a target's memory (`tracer::target_memory::Image`).
//!
//! An image is a list of ranges, each `[address: u64 LE][length: u16 LE]
//! [bytes]` (a last range may be cut short: it holds what is left), so a
//! seed can be a real process's memory, each structure at its address.
use tracer::target_memory::Image;

/// Fixed-size fields read from the front of an input; past its end every
/// field reads as zeros.
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    pub fn new(data: &'a [u8]) -> Fields<'a> {
        Fields { rest: data }
    }

    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let count = N.min(self.rest.len());
        out[..count].copy_from_slice(&self.rest[..count]);
        self.rest = &self.rest[count..];
        out
    }

    pub fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }

    /// What is left after the fields read.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }
}

/// The image the ranges in `data` make.
pub fn image(data: &[u8]) -> Image {
    let mut fields = Fields::new(data);
    let mut image = Image::new();
    while !fields.rest().is_empty() {
        let address = fields.u64();
        let length = usize::from(fields.u16()).min(fields.rest().len());
        let rest = fields.rest();
        image.place(address, rest[..length].to_vec());
        fields = Fields::new(&rest[length..]);
    }
    image
}

/// `data` as a recording whose every whole record passes its checksum,
/// with the magic in place: what the decoder reads below the CRC.
pub fn with_checksums(data: &[u8]) -> Vec<u8> {
    const PREAMBLE_BYTES: usize = 12;
    let mut bytes = data.to_vec();
    let magic = tracer::recording::MAGIC;
    let head = bytes.len().min(magic.len());
    bytes[..head].copy_from_slice(&magic[..head]);
    let mut offset = PREAMBLE_BYTES;
    while offset + 8 <= bytes.len() {
        let length_bytes: [u8; 4] = bytes[offset..offset + 4].try_into().expect("4 bytes");
        let length = u32::from_le_bytes(length_bytes) as usize;
        let start = offset + 8;
        if length > bytes.len() - start {
            break;
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&length_bytes);
        hasher.update(&bytes[start..start + length]);
        bytes[offset + 4..start].copy_from_slice(&hasher.finalize().to_le_bytes());
        offset = start + length;
    }
    bytes
}

/// The (address, length) of each range of the image in `data`.
pub fn image_ranges(data: &[u8]) -> Vec<(u64, usize)> {
    let mut fields = Fields::new(data);
    let mut ranges = Vec::new();
    while !fields.rest().is_empty() {
        let address = fields.u64();
        let length = usize::from(fields.u16()).min(fields.rest().len());
        ranges.push((address, length));
        let rest = fields.rest();
        fields = Fields::new(&rest[length..]);
    }
    ranges
}
