//! Names of JIT-compiled code from the perf map a runtime writes:
//! `/tmp/perf-PID.map`, one `START SIZE name` line (hex START and SIZE) per
//! piece of code, appended as code is compiled. Node.js writes it with
//! `--perf-basic-prof`, Java with perf-map-agent, Python 3.12+ with
//! `-X perf`. Without it, frames in JIT code are bare addresses.
//!
//! The file is opened inside the target's root (`target_files`: a FIFO, a
//! link or a device is refused), under the PID the target has in its own
//! namespace, and only what was appended since the last read is parsed,
//! within caps: [`MAX_READ_BYTES`] per read, [`MAX_TOTAL_BYTES`] per file,
//! [`MAX_LINE_BYTES`] per line (longer lines are skipped) and
//! [`MAX_ENTRIES`] names. When code moves (V8 replaces optimized code), a
//! later line for the same start address wins.
use std::{
    collections::{BTreeMap, HashMap},
    io::{Seek as _, SeekFrom},
    path::PathBuf,
};

use crate::{procfs, symbolize::jit::JitNames, target_files};

/// The most read from a perf map per refresh.
pub const MAX_READ_BYTES: u64 = 16 << 20;
/// The most read from one perf map over a run.
pub const MAX_TOTAL_BYTES: u64 = 256 << 20;
/// The longest line kept (a longer one is skipped).
pub const MAX_LINE_BYTES: usize = 4096;
/// The most JIT names kept per process.
pub const MAX_ENTRIES: usize = 1 << 20;

/// The perf map of one process, as read so far.
#[derive(Debug, Default)]
struct PerfMap {
    pid: u32,
    /// The path as the target sees it.
    path: PathBuf,
    /// Bytes of whole lines read (or skipped) so far.
    read_bytes: u64,
    /// Inside a line longer than `MAX_LINE_BYTES`: skipped to its end.
    skipping: bool,
    /// Start address -> (end address, name).
    code: BTreeMap<u64, (u64, String)>,
}

impl PerfMap {
    /// Reads the lines appended since the last call (none if the file is
    /// absent, refused or not readable).
    fn read_new(&mut self) {
        let budget = MAX_TOTAL_BYTES.saturating_sub(self.read_bytes);
        if budget == 0 {
            return;
        }
        let Ok(mut file) = target_files::open_in_root(self.pid, &self.path) else {
            return;
        };
        if file.seek(SeekFrom::Start(self.read_bytes)).is_err() {
            return;
        }
        let Ok(data) = target_files::read_bounded(&mut file, budget.min(MAX_READ_BYTES)) else {
            return;
        };
        self.add(&data);
    }

    /// Takes the whole lines of `data`, the bytes that follow those read
    /// so far.
    fn add(&mut self, data: &[u8]) {
        let mut rest = data;
        while let Some(end) = rest.iter().position(|&byte| byte == b'\n') {
            let line = &rest[..end];
            self.read_bytes += end as u64 + 1;
            rest = &rest[end + 1..];
            if std::mem::take(&mut self.skipping) || line.len() > MAX_LINE_BYTES {
                continue;
            }
            if let Some((start, size, name)) = std::str::from_utf8(line).ok().and_then(parse_line)
                && (self.code.len() < MAX_ENTRIES || self.code.contains_key(&start))
            {
                self.code
                    .insert(start, (start.saturating_add(size), name.to_owned()));
            }
        }
        // A line still being written is read whole next time, unless it
        // is already too long to keep: then it is skipped to its end.
        if rest.len() > MAX_LINE_BYTES {
            self.read_bytes += rest.len() as u64;
            self.skipping = true;
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

impl JitNames for PerfMaps {
    /// Reads what `pid`'s runtime appended to its perf map since the last
    /// call. Call while the process lives (its /proc/PID/root is needed
    /// the first time).
    fn refresh(&mut self, pid: u32) {
        let map = self.maps.entry(pid).or_insert_with(|| PerfMap {
            pid,
            path: map_path(pid),
            ..PerfMap::default()
        });
        map.read_new();
    }

    /// The JIT function at `address` in `pid`, if its runtime named it.
    fn name(&self, pid: u32, address: u64) -> Option<String> {
        self.maps.get(&pid)?.name(address).map(str::to_owned)
    }

    fn forget(&mut self, pid: u32) {
        self.maps.remove(&pid);
    }
}

impl PerfMaps {
    /// Takes `data` as what `pid`'s runtime appended to its perf map since
    /// the last call (what `refresh` reads; the fuzz target's way in).
    pub fn add(&mut self, pid: u32, data: &[u8]) {
        self.maps
            .entry(pid)
            .or_insert_with(|| PerfMap {
                pid,
                ..PerfMap::default()
            })
            .add(data);
    }
}

/// `/tmp/perf-NSPID.map` as the target sees it, NSPID being its PID in its
/// own PID namespace (the one its runtime writes into the name).
fn map_path(pid: u32) -> PathBuf {
    let own_pid = procfs::namespace_pid(pid).unwrap_or(pid);
    PathBuf::from(format!("/tmp/perf-{own_pid}.map"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_process_keeps_no_names() {
        let mut maps = PerfMaps::default();
        maps.add(7, b"1000 100 first\n");
        maps.add(8, b"1000 100 other\n");
        assert_eq!(maps.name(7, 0x1010).as_deref(), Some("first"));
        maps.forget(7);
        assert_eq!(maps.name(7, 0x1010), None);
        assert!(!maps.maps.contains_key(&7));
        assert_eq!(maps.name(8, 0x1010).as_deref(), Some("other"));
    }

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
            pid: std::process::id(),
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

    /// A line longer than the cap is skipped, even read in pieces; the
    /// lines after it are kept.
    #[test]
    fn overlong_lines_are_skipped() {
        let path = std::env::temp_dir().join(format!("tracer-perf-long-{}", std::process::id()));
        let long = format!("1000 10 {}", "x".repeat(MAX_LINE_BYTES + 10));
        std::fs::write(&path, &long).unwrap();
        let mut map = PerfMap {
            pid: std::process::id(),
            path: path.clone(),
            ..PerfMap::default()
        };
        map.read_new();
        assert_eq!(map.name(0x1001), None);
        std::fs::write(&path, format!("{long}yyy\n2000 10 after\n")).unwrap();
        map.read_new();
        let _ = std::fs::remove_file(&path);
        assert_eq!(map.name(0x1001), None);
        assert_eq!(map.name(0x2001), Some("after"));
    }
}
