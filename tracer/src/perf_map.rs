//! Names of JIT-compiled code from the perf map a runtime writes:
//! `/tmp/perf-PID.map`, one `START SIZE name` line (hex START and SIZE) per
//! piece of code, appended as code is compiled. Node.js writes it with
//! `--perf-basic-prof`, Java with perf-map-agent, Python 3.12+ with
//! `-X perf`. Without it, frames in JIT code are bare addresses.
//!
//! The file is read through /proc/PID/root (the target's /tmp), under the
//! PID the target has in its own namespace, and only what was appended
//! since the last read is parsed. When code moves (V8 replaces optimized
//! code), a later line for the same start address wins.
use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    io::{BufRead as _, BufReader, Seek as _, SeekFrom},
    path::PathBuf,
};

use crate::procfs;

/// The perf map of one process, as read so far.
#[derive(Debug, Default)]
struct PerfMap {
    path: PathBuf,
    /// Bytes of whole lines read so far.
    read_bytes: u64,
    /// Start address -> (end address, name).
    code: BTreeMap<u64, (u64, String)>,
}

impl PerfMap {
    /// Reads the lines appended since the last call (none if the file is
    /// absent or not readable).
    fn read_new(&mut self) {
        let Ok(mut file) = File::open(&self.path) else {
            return;
        };
        if file.seek(SeekFrom::Start(self.read_bytes)).is_err() {
            return;
        }
        let mut reader = BufReader::new(file);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                // A line still being written: read it whole next time.
                Ok(_) if !line.ends_with('\n') => break,
                Ok(length) => {
                    self.read_bytes += length as u64;
                    if let Some((start, size, name)) = parse_line(&line) {
                        self.code
                            .insert(start, (start.saturating_add(size), name.to_owned()));
                    }
                }
            }
        }
    }

    /// The name of the code that holds `address`.
    fn name(&self, address: u64) -> Option<&str> {
        let (_, (end, name)) = self.code.range(..=address).next_back()?;
        (address < *end).then_some(name.as_str())
    }
}

/// `START SIZE name`, START and SIZE in hex (with or without `0x`).
fn parse_line(line: &str) -> Option<(u64, u64, &str)> {
    let hex = |word: &str| {
        let digits = word
            .strip_prefix("0x")
            .or_else(|| word.strip_prefix("0X"))
            .unwrap_or(word);
        u64::from_str_radix(digits, 16).ok()
    };
    let mut parts = line.trim_end_matches(['\n', '\r']).splitn(3, ' ');
    let start = hex(parts.next()?)?;
    let size = hex(parts.next()?)?;
    let name = parts.next()?.trim();
    (size > 0 && !name.is_empty()).then_some((start, size, name))
}

/// The perf maps of every traced process.
#[derive(Debug, Default)]
pub struct PerfMaps {
    maps: HashMap<u32, PerfMap>,
}

impl PerfMaps {
    /// Reads what `pid`'s runtime appended to its perf map since the last
    /// call. Call while the process lives (its /proc/PID/root is needed
    /// the first time).
    pub fn refresh(&mut self, pid: u32) {
        let map = self.maps.entry(pid).or_insert_with(|| PerfMap {
            path: map_path(pid),
            ..PerfMap::default()
        });
        map.read_new();
    }

    /// The JIT function at `address` in `pid`, if its runtime named it.
    pub fn name(&self, pid: u32, address: u64) -> Option<String> {
        self.maps.get(&pid)?.name(address).map(str::to_owned)
    }
}

/// `/tmp/perf-NSPID.map` in the target's root, NSPID being its PID in its
/// own PID namespace (the one its runtime writes into the name).
fn map_path(pid: u32) -> PathBuf {
    let own_pid = procfs::namespace_pid(pid).unwrap_or(pid);
    procfs::host_path(pid, &PathBuf::from(format!("/tmp/perf-{own_pid}.map")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_node_and_java_lines() {
        assert_eq!(
            parse_line("3ef8c8204040 1e0 LazyCompile:~leak /tmp/leak.js:3\n"),
            Some((0x3ef8c8204040, 0x1e0, "LazyCompile:~leak /tmp/leak.js:3"))
        );
        assert_eq!(
            parse_line("0x7f0000001000 0x40 Ljava/lang/String;::hashCode\n"),
            Some((0x7f00_0000_1000, 0x40, "Ljava/lang/String;::hashCode"))
        );
        assert_eq!(parse_line("zz 10 name\n"), None);
        assert_eq!(parse_line("1000 0 empty\n"), None);
        assert_eq!(parse_line("1000 10\n"), None);
    }

    /// Lines appended later are read; a later line for the same code wins;
    /// a half-written line waits for its end.
    #[test]
    fn reads_what_was_appended_and_later_lines_win() {
        let path = std::env::temp_dir().join(format!("tracer-perf-map-{}", std::process::id()));
        std::fs::write(&path, "1000 100 first\n2000 10 second\n").unwrap();
        let mut map = PerfMap {
            path: path.clone(),
            ..PerfMap::default()
        };
        map.read_new();
        assert_eq!(map.name(0x1000), Some("first"));
        assert_eq!(map.name(0x10ff), Some("first"));
        assert_eq!(map.name(0x1100), None);
        assert_eq!(map.name(0x2005), Some("second"));
        assert_eq!(map.name(0xfff), None);
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(b"1000 80 replaced\n3000 10 half").unwrap();
        map.read_new();
        assert_eq!(map.name(0x1010), Some("replaced"));
        assert_eq!(map.name(0x3001), None);
        file.write_all(b"way\n").unwrap();
        map.read_new();
        let _ = std::fs::remove_file(&path);
        assert_eq!(map.name(0x3001), Some("halfway"));
    }
}
