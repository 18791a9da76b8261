//! A process's memory limit: the lowest limit of the memory cgroups on
//! its path (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`), with
//! what counts against it now (that cgroup's usage); else the host's
//! memory and what is used of it. The figure incident responders ask
//! first: when will it hit the limit (`report`).
use std::path::{Path, PathBuf};

use crate::model::run::MemoryLimit;

/// v1 reports "no limit" as a huge page-rounded number.
const UNLIMITED_V1: u64 = 1 << 62;

/// The memory limit of `pid`, read now; None when the process is gone.
pub fn memory_limit(pid: u32) -> Option<MemoryLimit> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    cgroup_limit(&cgroups, Path::new("/sys/fs/cgroup"), &|path| {
        std::fs::read_to_string(path).ok()
    })
    .or_else(host_limit)
}

/// The lowest limit on the memory cgroup path that `/proc/PID/cgroup`'s
/// text names, under the cgroup mounts at `root` (v2 at `root` itself or
/// `root/unified`, v1's memory controller at `root/memory`), read through
/// `read`.
pub fn cgroup_limit(
    cgroups: &str,
    root: &Path,
    read: &dyn Fn(&Path) -> Option<String>,
) -> Option<MemoryLimit> {
    let mut found: Option<MemoryLimit> = None;
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let candidates: Vec<(PathBuf, &str, &str)> = if controllers.is_empty() {
            [root.to_path_buf(), root.join("unified")]
                .into_iter()
                .map(|mount| (mount, "memory.max", "memory.current"))
                .collect()
        } else if controllers.split(',').any(|name| name == "memory") {
            vec![(
                root.join("memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )]
        } else {
            continue;
        };
        for (mount, limit_file, usage_file) in candidates {
            // The cgroup and each of its ancestors, below the root (whose
            // files hold no limit).
            let mut dir = PathBuf::from(path.trim_start_matches('/'));
            loop {
                if dir.as_os_str().is_empty() || dir.components().any(|c| c.as_os_str() == "..") {
                    break;
                }
                let at = mount.join(&dir);
                let limit = read(&at.join(limit_file))
                    .and_then(|text| text.trim().parse::<u64>().ok())
                    .filter(|&limit| limit < UNLIMITED_V1);
                if let Some(limit_bytes) = limit
                    && found
                        .as_ref()
                        .is_none_or(|best| limit_bytes < best.limit_bytes)
                {
                    let used_bytes = read(&at.join(usage_file))
                        .and_then(|text| text.trim().parse().ok())
                        .unwrap_or(0);
                    found = Some(MemoryLimit {
                        limit_bytes,
                        used_bytes,
                        source: format!("cgroup /{}", dir.display()),
                    });
                }
                if !dir.pop() {
                    break;
                }
            }
        }
    }
    found
}

/// The host's memory and what is used of it (MemTotal - MemAvailable).
fn host_limit() -> Option<MemoryLimit> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |name: &str| super::kib_field(&meminfo, name);
    let total = kib("MemTotal")? * 1024;
    let available = kib("MemAvailable").map_or(0, |kib| kib * 1024);
    Some(MemoryLimit {
        limit_bytes: total,
        used_bytes: total.saturating_sub(available),
        source: "host".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let entries: Vec<(PathBuf, String)> = entries
            .iter()
            .map(|(path, text)| (PathBuf::from(path), (*text).to_owned()))
            .collect();
        move |path| {
            entries
                .iter()
                .find(|(at, _)| at == path)
                .map(|(_, text)| text.clone())
        }
    }

    #[test]
    fn the_lowest_limit_on_a_v2_path_wins_with_its_usage() {
        let read = files(&[
            ("/cg/kubepods/memory.max", "8589934592\n"),
            ("/cg/kubepods/memory.current", "100\n"),
            ("/cg/kubepods/pod1/memory.max", "max\n"),
            ("/cg/kubepods/pod1/app/memory.max", "536870912\n"),
            ("/cg/kubepods/pod1/app/memory.current", "268435456\n"),
        ]);
        let limit = cgroup_limit("0::/kubepods/pod1/app\n", Path::new("/cg"), &read).unwrap();
        assert_eq!(limit.limit_bytes, 512 << 20);
        assert_eq!(limit.used_bytes, 256 << 20);
        assert_eq!(limit.source, "cgroup /kubepods/pod1/app");
    }

    #[test]
    fn v1_memory_controller_and_no_limit() {
        let read = files(&[
            (
                "/cg/memory/a/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            ("/cg/memory/a/b/memory.limit_in_bytes", "1073741824\n"),
            ("/cg/memory/a/b/memory.usage_in_bytes", "5\n"),
        ]);
        let text = "9:name=systemd:/\n4:memory:/a/b\n0::/\n";
        let limit = cgroup_limit(text, Path::new("/cg"), &read).unwrap();
        assert_eq!((limit.limit_bytes, limit.used_bytes), (1 << 30, 5));
        assert_eq!(
            cgroup_limit("4:memory:/a\n", Path::new("/cg"), &read),
            None,
            "unlimited"
        );
        assert_eq!(
            cgroup_limit("4:memory:/../x\n", Path::new("/cg"), &read),
            None
        );
    }
}
