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
use std::{
    fs::File,
    path::{Path, PathBuf},
};

use object::Object as _;

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

/// The debug file of the object at `object_path` (a path as the target
/// sees it) with `link`, looked up under `root` (`/proc/PID/root`, or `/`
/// for a recording symbolized later) and in `debug_dirs` (already host
/// paths: `--debug-dir`), then `root`'s /usr/lib/debug.
pub fn find(
    link: &DebugLink,
    object_path: &Path,
    root: &Path,
    debug_dirs: &[PathBuf],
) -> Option<PathBuf> {
    let under_root = |path: &Path| root.join(path.strip_prefix("/").unwrap_or(path));
    let dirs: Vec<PathBuf> = debug_dirs
        .iter()
        .cloned()
        .chain([under_root(Path::new(SYSTEM_DEBUG_DIR))])
        .collect();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(build_id) = link.build_id.as_deref().filter(|id| id.len() > 2) {
        let (head, tail) = build_id.split_at(2);
        candidates.extend(dirs.iter().map(|dir| {
            dir.join(".build-id")
                .join(head)
                .join(format!("{tail}.debug"))
        }));
    }
    if let Some(name) = &link.link_name
        && let Some(object_dir) = object_path.parent()
    {
        let host_dir = under_root(object_dir);
        candidates.push(host_dir.join(name));
        candidates.push(host_dir.join(".debug").join(name));
        let relative_dir = object_dir.strip_prefix("/").unwrap_or(object_dir);
        candidates.extend(dirs.iter().map(|dir| dir.join(relative_dir).join(name)));
        candidates.extend(dirs.iter().map(|dir| dir.join(name)));
    }
    candidates.into_iter().find(|candidate| {
        candidate.as_path() != under_root(object_path) && matches(candidate, link)
    })
}

/// Whether `path` is a debug file for an object with `link`: the same build
/// id, or symbols at all when the object has no build id.
fn matches(path: &Path, link: &DebugLink) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    // SAFETY: the map is only read; debug files are not rewritten in place.
    let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
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
        assert_eq!(
            find(&link, Path::new("/usr/bin/true"), Path::new("/"), &[]),
            None
        );
    }

    #[test]
    fn a_build_id_that_matches_no_file_finds_nothing() {
        let link = DebugLink {
            build_id: Some("00".repeat(20)),
            link_name: Some("true.debug".to_owned()),
        };
        let dirs = [std::env::temp_dir()];
        assert_eq!(
            find(&link, Path::new("/usr/bin/true"), Path::new("/"), &dirs),
            None
        );
    }
}
