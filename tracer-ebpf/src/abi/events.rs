//! Rare events for userspace (EVENTS) and the fields their watcher reads.

/// Rare events for userspace, in the EVENTS ring buffer.
pub mod event {
    /// A traced process mapped a file with execute permission (a library
    /// being loaded): its symbols must be looked up.
    pub const EXEC_MAPPED: u32 = 1;
    /// A traced process replaced its image (execve).
    pub const EXEC: u32 = 2;
    /// A traced process destroyed or reset a CUDA context.
    pub const GPU_CONTEXT_DESTROYED: u32 = 3;
}

/// One message in the EVENTS ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RareEvent {
    /// An `event` value.
    pub what: u32,
    pub tgid: u32,
    pub timestamp_ns: u64,
    /// EXEC and GPU_CONTEXT_DESTROYED: the CUDA context epoch that ended.
    pub context_epoch: u32,
    pub pad: u32,
}

/// Bytes of a path in an [`OpenedFile`] (with its NUL); longer paths are
/// cut and left to the late hook.
pub const OPENED_PATH_BYTES: usize = 512;

/// A traced process opened a file whose name is a shared object's
/// (`*.so`, `*.so.*`): sent to userspace at once (with a wakeup) through
/// the OPENED ring buffer, so that the file's allocator and CUDA functions
/// are hooked while the loader is still reading its headers.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenedFile {
    pub tgid: u32,
    /// What `openat` returned.
    pub fd: u32,
    /// When `openat` returned (CLOCK_MONOTONIC).
    pub timestamp_ns: u64,
    /// The path as passed to `openat`, up to its NUL.
    pub path: [u8; OPENED_PATH_BYTES],
}

/// Byte offsets of the `sys_enter_openat` and `sys_exit_openat` fields the
/// at-open watcher reads, from tracefs at start-up (defaults: Linux 6.x).
pub mod openat_format {
    pub const FILENAME_OFFSET: u32 = 24;
    pub const RET_OFFSET: u32 = 16;
}

/// Byte offsets of the `sys_enter_mmap` tracepoint fields the EXEC_MAPPED
/// watcher reads, from tracefs at start-up (defaults: Linux 6.x).
pub mod mmap_format {
    pub const PROT_OFFSET: u32 = 32;
    pub const FD_OFFSET: u32 = 48;
}

/// Whether a NUL-terminated path holds `.so` followed by its end or a dot
/// (`libcudart.so`, `libcudart.so.12`).
#[inline(always)]
pub fn names_shared_object(path: &[u8; OPENED_PATH_BYTES]) -> bool {
    let mut at = 0;
    while at + 3 < OPENED_PATH_BYTES {
        if path[at] == 0 {
            return false;
        }
        if path[at] == b'.'
            && path[at + 1] == b's'
            && path[at + 2] == b'o'
            && (path[at + 3] == 0 || path[at + 3] == b'.')
        {
            return true;
        }
        at += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(text: &str) -> [u8; OPENED_PATH_BYTES] {
        let mut path = [0; OPENED_PATH_BYTES];
        path[..text.len()].copy_from_slice(text.as_bytes());
        path
    }

    #[test]
    fn a_shared_object_is_dot_so_at_the_end_or_before_a_dot() {
        for (text, shared) in [
            ("/usr/lib/libcudart.so", true),
            ("libcudart.so.12", true),
            ("/opt/x.so.1.2.3", true),
            ("/data/model.sock", false),
            ("/tmp/a.solib", false),
            ("/usr/lib/python3/x.soname.so", true),
            ("/etc/ld.so.cache", true),
            ("/usr/bin/ls", false),
            ("so", false),
            ("", false),
        ] {
            assert_eq!(names_shared_object(&path(text)), shared, "{text:?}");
        }
    }

    #[test]
    fn only_the_bytes_before_the_nul_count() {
        let mut hidden = path("/bin/ls");
        hidden[8..11].copy_from_slice(b".so");
        assert!(!names_shared_object(&hidden));
        // A path that fills the buffer without a NUL is read to its end.
        let mut full = [b'a'; OPENED_PATH_BYTES];
        full[OPENED_PATH_BYTES - 4..].copy_from_slice(b".so.");
        assert!(names_shared_object(&full));
    }
}
