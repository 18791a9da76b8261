//! Tracepoint formats from tracefs: the byte offsets of the fields the eBPF
//! tracepoint programs read, taken from the running kernel at start-up
//! instead of being hard-coded. Mounts tracefs when nothing is mounted at
//! its usual place.
use std::{fs, path::Path};

use anyhow::{Context as _, Result, anyhow};

use crate::error::{ExitCode, fatal};

const TRACEFS_DIR: &str = "/sys/kernel/tracing";
/// Where older systems mount it (with debugfs).
const DEBUGFS_TRACING_DIR: &str = "/sys/kernel/debug/tracing";

/// Offsets of the `syscalls:sys_enter_mmap` fields tracer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmapOffsets {
    pub prot: u32,
    pub fd: u32,
}

/// Reads the `sys_enter_mmap` format, mounting tracefs first if needed.
pub fn mmap_offsets() -> Result<MmapOffsets> {
    ensure_mounted()?;
    let offset = |field: &str| {
        required_field_offset("syscalls", "sys_enter_mmap", field).map_err(|error| {
            fatal(
                ExitCode::KernelUnsupported,
                format!(
                    "{error:#}: tracer needs the syscalls:sys_enter_mmap tracepoint \
                     (CONFIG_FTRACE_SYSCALLS)"
                ),
            )
        })
    };
    Ok(MmapOffsets {
        prot: offset("prot")?,
        fd: offset("fd")?,
    })
}

/// Where tracefs is mounted: its usual place, or under debugfs.
fn mount_point() -> Option<&'static Path> {
    mounted_at().map(Path::new)
}

/// [`mount_point`], as text (`tracer --version`).
pub fn mounted_at() -> Option<&'static str> {
    [TRACEFS_DIR, DEBUGFS_TRACING_DIR]
        .into_iter()
        .find(|path| Path::new(path).join("events").is_dir())
}

/// Mounts tracefs at /sys/kernel/tracing unless it (or the older debugfs
/// path) is there. Many hosts mount it at boot; a minimal VM may not, and
/// root can mount it (nothing changes for other users).
pub fn ensure_mounted() -> Result<()> {
    if mount_point().is_some() {
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

/// The `format` file of tracepoint `category:event`.
fn read_format(category: &str, event: &str) -> Result<String> {
    let root = mount_point().ok_or_else(|| {
        anyhow!("tracefs is not mounted (mount -t tracefs tracefs {TRACEFS_DIR})")
    })?;
    let path = root.join(format!("events/{category}/{event}/format"));
    fs::read_to_string(&path).with_context(|| format!("could not read {}", path.display()))
}

/// The id of tracepoint `category:event` (for perf_event_open).
pub fn event_id(category: &str, event: &str) -> Option<u64> {
    let path = mount_point()?.join(format!("events/{category}/{event}/id"));
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The offset of `field` in the record of tracepoint `category:event`.
pub fn event_field_offset(category: &str, event: &str, field: &str) -> Option<u32> {
    field_offset(&read_format(category, event).ok()?, field)
}

/// Like `event_field_offset`, with an error that names what is missing.
pub fn required_field_offset(category: &str, event: &str, field: &str) -> Result<u32> {
    let format = read_format(category, event)?;
    field_offset(&format, field)
        .with_context(|| format!("tracepoint {category}:{event} has no field `{field}`"))
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

    #[test]
    fn reads_the_offsets_of_a_syscall_with_typedef_fields() {
        let format = "name: sys_enter_munmap
ID: 801
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:unsigned long addr;\toffset:16;\tsize:8;\tsigned:0;
\tfield:size_t len;\toffset:24;\tsize:8;\tsigned:0;

print fmt: \"addr: 0x%08lx, len: 0x%08lx\"
";
        assert_eq!(field_offset(format, "addr"), Some(16));
        assert_eq!(field_offset(format, "len"), Some(24));
        assert_eq!(field_offset(format, "__syscall_nr"), Some(8));
        assert_eq!(field_offset(format, "common_type"), Some(0));
    }

    #[test]
    fn reads_this_kernels_mapping_tracepoints() {
        ensure_mounted().expect("tracefs can be mounted (tests run as root)");
        // After the common fields (8 bytes), __syscall_nr and addr.
        assert_eq!(
            required_field_offset("syscalls", "sys_enter_munmap", "len").unwrap(),
            24
        );
        let missing = required_field_offset("syscalls", "sys_enter_munmap", "nope");
        assert!(format!("{:#}", missing.unwrap_err()).contains("has no field `nope`"));
    }
}
