//! Tracepoint formats from tracefs: the byte offsets of the fields the eBPF
//! tracepoint programs read, taken from the running kernel at start-up
//! instead of being hard-coded. Mounts tracefs when nothing is mounted at
//! its usual place.
use std::{fs, path::Path};

use anyhow::Result;

use crate::error::{ExitCode, fatal};

const TRACEFS_DIR: &str = "/sys/kernel/tracing";
const MMAP_FORMAT: &str = "events/syscalls/sys_enter_mmap/format";

/// Offsets of the `syscalls:sys_enter_mmap` fields tracer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmapOffsets {
    pub prot: u32,
    pub fd: u32,
}

/// Reads the `sys_enter_mmap` format, mounting tracefs first if needed.
pub fn mmap_offsets() -> Result<MmapOffsets> {
    let path = Path::new(TRACEFS_DIR).join(MMAP_FORMAT);
    ensure_mounted()?;
    let format = fs::read_to_string(&path).map_err(|error| {
        fatal(
            ExitCode::KernelUnsupported,
            format!(
                "could not read {} ({error}): tracer needs the syscalls:sys_enter_mmap \
                 tracepoint (CONFIG_FTRACE_SYSCALLS)",
                path.display()
            ),
        )
    })?;
    let offset = |field: &str| {
        field_offset(&format, field).ok_or_else(|| {
            fatal(
                ExitCode::KernelUnsupported,
                format!("{} has no field `{field}`", path.display()),
            )
        })
    };
    Ok(MmapOffsets {
        prot: offset("prot")?,
        fd: offset("fd")?,
    })
}

/// Mounts tracefs at /sys/kernel/tracing unless it (or the older debugfs
/// path) is there. Many hosts mount it at boot; a minimal VM may not, and
/// root can mount it (nothing changes for other users).
pub fn ensure_mounted() -> Result<()> {
    let mounted = |path: &str| Path::new(path).join("events").is_dir();
    if mounted(TRACEFS_DIR) || mounted("/sys/kernel/debug/tracing") {
        return Ok(());
    }
    let source = c"tracefs";
    let target = c"/sys/kernel/tracing";
    // SAFETY: mount(2) with NUL-terminated strings and no data.
    let result = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            source.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if result == 0 {
        return Ok(());
    }
    Err(fatal(
        ExitCode::KernelUnsupported,
        format!(
            "tracefs is not mounted at {TRACEFS_DIR} and mounting it failed ({}): run \
             `mount -t tracefs tracefs {TRACEFS_DIR}`",
            std::io::Error::last_os_error()
        ),
    ))
}

/// The offset of `field` in the record of tracepoint `category:event`.
pub fn event_field_offset(category: &str, event: &str, field: &str) -> Option<u32> {
    let format = fs::read_to_string(
        Path::new(TRACEFS_DIR).join(format!("events/{category}/{event}/format")),
    )
    .ok()?;
    field_offset(&format, field)
}

/// The offset of `field` in a tracepoint format file:
/// `field:unsigned long prot; offset:32; size:8; signed:0;` (tab separated).
pub fn field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let mut parts = line.trim().split(';');
        let declaration = parts.next()?.strip_prefix("field:")?;
        let name = declaration.rsplit([' ', '*']).next()?;
        if name != field {
            return None;
        }
        parts.find_map(|part| part.trim().strip_prefix("offset:")?.parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: &str = "name: sys_enter_mmap
ID: 174
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:unsigned long addr;\toffset:16;\tsize:8;\tsigned:0;
\tfield:unsigned long prot;\toffset:32;\tsize:8;\tsigned:0;
\tfield:unsigned long fd;\toffset:48;\tsize:8;\tsigned:0;
";

    #[test]
    fn reads_field_offsets() {
        assert_eq!(field_offset(FORMAT, "prot"), Some(32));
        assert_eq!(field_offset(FORMAT, "fd"), Some(48));
        assert_eq!(field_offset(FORMAT, "common_pid"), Some(4));
        assert_eq!(field_offset(FORMAT, "flags"), None);
    }
}
