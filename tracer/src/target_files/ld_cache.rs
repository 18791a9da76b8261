//! The loader cache (`/etc/ld.so.cache`) of a target, read by tracer
//! itself: the libraries its loader would find by name. Running the host's
//! `ldconfig -p` on it would run a C parser as root on a file a container
//! controls, with no timeout.
//!
//! The format is glibc's `glibc-ld.so.cache1.1` (elf/cache.c,
//! sysdeps/generic/dl-cache.h), alone (glibc 2.32 on) or after the old
//! `ld.so-1.7.0` table. A 48-byte header (magic, version, library count,
//! string table length, 20 bytes unused here), then one 24-byte entry per
//! library (flags, name offset, path offset, OS version, hwcap); offsets
//! count from the header's first byte. Every count and offset is checked
//! against the file before use, and the file against [`MAX_BYTES`].
use std::path::{Path, PathBuf};

use super::OpenError;

/// The largest loader cache read (a full Debian system's is ~100 KiB).
pub const MAX_BYTES: u64 = 16 << 20;

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_HEADER_BYTES: usize = 16;
const OLD_ENTRY_BYTES: usize = 12;
const NEW_HEADER_BYTES: usize = 48;
const NEW_ENTRY_BYTES: usize = 24;

/// One library of the cache: its name (`libcuda.so.1`) and path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedLibrary {
    pub name: String,
    pub path: PathBuf,
}

/// The libraries of `pid`'s loader cache (inside its root); none when it
/// has no readable cache.
pub fn read(pid: u32) -> Result<Vec<CachedLibrary>, OpenError> {
    let data = super::read_in_root(pid, Path::new("/etc/ld.so.cache"), MAX_BYTES)?;
    Ok(parse(&data).unwrap_or_default())
}

/// The libraries of a loader cache; None for a file that is not one.
pub fn parse(data: &[u8]) -> Option<Vec<CachedLibrary>> {
    let start = if data.starts_with(NEW_MAGIC) {
        0
    } else if data.starts_with(OLD_MAGIC) {
        let old_count = u32_at(data, OLD_MAGIC.len())? as usize;
        let end = old_count
            .checked_mul(OLD_ENTRY_BYTES)?
            .checked_add(OLD_HEADER_BYTES)?;
        // The new header follows, aligned as its 8-byte entries are.
        end.checked_add(7)? & !7
    } else {
        return None;
    };
    let table = data.get(start..)?;
    if !table.starts_with(NEW_MAGIC) {
        return None;
    }
    let count = u32_at(table, NEW_MAGIC.len())? as usize;
    // Each entry takes its bytes: a count the file cannot hold is refused
    // before anything is sized by it.
    if count > table.len() / NEW_ENTRY_BYTES {
        return None;
    }
    let libraries = (0..count)
        .filter_map(|index| {
            let entry = NEW_HEADER_BYTES + index * NEW_ENTRY_BYTES;
            let name = string_at(table, u32_at(table, entry + 4)? as usize)?;
            let path = string_at(table, u32_at(table, entry + 8)? as usize)?;
            Some(CachedLibrary {
                name: name.to_owned(),
                path: PathBuf::from(path),
            })
        })
        .collect();
    Some(libraries)
}

fn u32_at(data: &[u8], offset: usize) -> Option<u32> {
    let bytes = data.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// The NUL-ended UTF-8 string at `offset`.
fn string_at(data: &[u8], offset: usize) -> Option<&str> {
    let rest = data.get(offset..)?;
    let length = rest.iter().position(|&byte| byte == 0)?;
    std::str::from_utf8(&rest[..length]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What this machine's `ldconfig -p` lists, read by tracer itself.
    #[test]
    fn the_hosts_cache_lists_what_ldconfig_lists() {
        let data = std::fs::read("/etc/ld.so.cache").expect("a loader cache");
        let libraries = parse(&data).expect("a glibc cache");
        let output = std::process::Command::new("ldconfig")
            .arg("-p")
            .output()
            .expect("ldconfig runs");
        let listed: Vec<(String, String)> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let (name, path) = line.trim().split_once(" => ")?;
                Some((name.split_whitespace().next()?.to_owned(), path.to_owned()))
            })
            .collect();
        assert!(listed.len() > 10, "{listed:?}");
        let parsed: Vec<(String, String)> = libraries
            .iter()
            .map(|library| (library.name.clone(), library.path.display().to_string()))
            .collect();
        assert_eq!(parsed, listed);
    }

    #[test]
    fn a_count_beyond_the_file_or_offsets_outside_it_read_nothing() {
        let mut data = NEW_MAGIC.to_vec();
        data.extend(u32::MAX.to_le_bytes());
        data.resize(NEW_HEADER_BYTES, 0);
        assert_eq!(parse(&data), None);
        let mut one = NEW_MAGIC.to_vec();
        one.extend(1u32.to_le_bytes());
        one.resize(NEW_HEADER_BYTES, 0);
        one.extend(3i32.to_le_bytes());
        one.extend(u32::MAX.to_le_bytes());
        one.extend(9999u32.to_le_bytes());
        one.resize(NEW_HEADER_BYTES + NEW_ENTRY_BYTES, 0);
        assert_eq!(parse(&one), Some(Vec::new()));
        assert_eq!(parse(b"not a cache"), None);
        assert_eq!(parse(OLD_MAGIC), None);
    }
}
