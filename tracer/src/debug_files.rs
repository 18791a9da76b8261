//! Separate debug files: where the symbols and lines of a stripped object
//! are, when they are installed apart from it (Debian's `-dbgsym`
//! packages, `objcopy --only-keep-debug`).
//!
//! Looked up as gdb does: by build id under each debug directory
//! (`DIR/.build-id/ab/cdef....debug`), then by the object's
//! `.gnu_debuglink` name next to the object, in its `.debug/` directory and
//! under each debug directory followed by the object's directory. The
//! debug directories are the ones given with `--debug-dir`, then
//! `/usr/lib/debug`; for a running target, paths are read through
//! `/proc/PID/root` so that a container's own debug files are found. A file
//! found is used only when its build id is the object's (or, for an object
//! without one, when it has symbols at all).
//!
//! The names come from the object, which the target controls: a
//! `.gnu_debuglink` name with `/` (an absolute host path) or `..`, or a
//! build id that is not hex, is refused (counted, `target_files`), and
//! every candidate is opened inside the root it belongs to (the target's,
//! or the host's for `--debug-dir`), never waiting on a FIFO.
use std::{
    fs::File,
    path::{Path, PathBuf},
};

use object::Object as _;

use crate::target_files::{self, Refusal, Root};

/// Where debug files are installed on most distributions.
pub const SYSTEM_DEBUG_DIR: &str = "/usr/lib/debug";

/// What an object says about its debug file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DebugLink {
    /// GNU build id, lowercase hex.
    pub build_id: Option<String>,
    /// The `.gnu_debuglink` file name.
    pub link_name: Option<String>,
}

/// The build id and `.gnu_debuglink` of the ELF object in `file`.
pub fn read_debug_link(elf: &object::File<'_>) -> DebugLink {
    DebugLink {
        build_id: elf
            .build_id()
            .ok()
            .flatten()
            .map(|build_id| build_id.iter().map(|byte| format!("{byte:02x}")).collect()),
        link_name: elf
            .gnu_debuglink()
            .ok()
            .flatten()
            .and_then(|(name, _crc)| std::str::from_utf8(name).ok().map(str::to_owned)),
    }
}

/// The debug file, opened, of the object at `object_path` (a path as the
/// target sees it) with `link`, looked up in `root` (the target's, or the
/// host's for a recording symbolized later) and in `debug_dirs` (host
/// paths: `--debug-dir`), then `root`'s /usr/lib/debug.
pub fn find(
    link: &DebugLink,
    object_path: &Path,
    root: Root,
    debug_dirs: &[PathBuf],
) -> Option<File> {
    let dirs: Vec<(Root, PathBuf)> = debug_dirs
        .iter()
        .map(|dir| (Root::Host, dir.clone()))
        .chain([(root, PathBuf::from(SYSTEM_DEBUG_DIR))])
        .collect();
    let mut candidates: Vec<(Root, PathBuf)> = Vec::new();
    if let Some(build_id) = link.build_id.as_deref().filter(|id| id.len() > 2) {
        if !is_hex(build_id) {
            target_files::refuse(Refusal::BadName);
            return None;
        }
        let (head, tail) = build_id.split_at(2);
        candidates.extend(dirs.iter().map(|(dir_root, dir)| {
            (
                *dir_root,
                dir.join(".build-id")
                    .join(head)
                    .join(format!("{tail}.debug")),
            )
        }));
    }
    if let Some(name) = link
        .link_name
        .as_deref()
        .filter(|name| target_files::plain_file_name(name))
        && let Some(object_dir) = object_path.parent()
    {
        candidates.push((root, object_dir.join(name)));
        candidates.push((root, object_dir.join(".debug").join(name)));
        let relative_dir = object_dir.strip_prefix("/").unwrap_or(object_dir);
        candidates.extend(
            dirs.iter()
                .map(|(dir_root, dir)| (*dir_root, dir.join(relative_dir).join(name))),
        );
        candidates.extend(
            dirs.iter()
                .map(|(dir_root, dir)| (*dir_root, dir.join(name))),
        );
    }
    candidates
        .into_iter()
        .filter(|(candidate_root, candidate)| {
            (*candidate_root, candidate.as_path()) != (root, object_path)
        })
        .filter_map(|(candidate_root, candidate)| {
            target_files::open_following_links(candidate_root, &candidate).ok()
        })
        .find(|file| matches(file, link))
}

/// Lowercase or uppercase hex digits only (a build id as `read_debug_link`
/// writes it).
fn is_hex(text: &str) -> bool {
    text.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// Whether `file` is a debug file for an object with `link`: the same build
/// id, or symbols at all when the object has no build id.
fn matches(file: &File, link: &DebugLink) -> bool {
    // SAFETY: the map is only read; a file truncated underneath reads as
    // zeros (`target_files::sigbus`).
    let Ok(map) = (unsafe { memmap2::Mmap::map(file) }) else {
        return false;
    };
    let Ok(elf) = object::File::parse(&*map) else {
        return false;
    };
    match &link.build_id {
        Some(build_id) => read_debug_link(&elf).build_id.as_ref() == Some(build_id),
        None => elf.symbols().next().is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_found_for_an_object_that_names_no_debug_file() {
        let link = DebugLink::default();
        assert!(find(&link, Path::new("/usr/bin/true"), Root::Host, &[]).is_none());
    }

    #[test]
    fn a_build_id_that_matches_no_file_finds_nothing() {
        let link = DebugLink {
            build_id: Some("00".repeat(20)),
            link_name: Some("true.debug".to_owned()),
        };
        let dirs = [std::env::temp_dir()];
        assert!(find(&link, Path::new("/usr/bin/true"), Root::Host, &dirs).is_none());
    }

    /// A build id that is not hex (a crafted recording or object) is
    /// refused, without a panic on a character boundary.
    #[test]
    fn a_build_id_that_is_not_hex_is_refused() {
        let link = DebugLink {
            build_id: Some("éé/../../etc".to_owned()),
            link_name: None,
        };
        assert!(find(&link, Path::new("/usr/bin/true"), Root::Host, &[]).is_none());
    }

    /// A debug link that names a path is never opened.
    #[test]
    fn a_debug_link_with_a_slash_is_refused() {
        let dir = std::env::temp_dir().join(format!("tracer-debuglink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("real.debug");
        std::fs::copy("/proc/self/exe", &target).unwrap();
        let link = DebugLink {
            build_id: None,
            link_name: Some(target.display().to_string()),
        };
        let found = find(&link, Path::new("/usr/bin/true"), Root::Host, &[]);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(found.is_none());
    }
}
