//! The files symbols are read from: each mapped object kept open with its
//! build id and load segments, whether blazesym may read its DWARF, and
//! the paths blazesym is given for them.
use std::{
    fs::File,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use blazesym::symbolize::source::{Elf, Source};
use object::{Object as _, ObjectSegment as _};

use crate::{
    debug_files::{self, DebugLink},
    target_files::{self, Root},
};

/// A mapped file, kept open, its build id and load segments.
pub(super) struct Module {
    pub(super) file: Arc<File>,
    /// When it was last looked up (`Symbols::uses`), for closing the least
    /// recently used first.
    pub(super) last_used: std::cell::Cell<u64>,
    pub(super) build_id: Option<String>,
    /// (file offset, size in the file, virtual address) of each load
    /// segment: file offsets become ELF virtual addresses through them.
    pub(super) segments: Vec<(u64, u64, u64)>,
    /// Its separate debug file (`debug_files`), when one is installed.
    pub(super) debug_file: Option<Arc<File>>,
    /// Whether blazesym may read the DWARF of the object, and of its debug
    /// file (`dwarf_is_safe`).
    pub(super) dwarf: bool,
    pub(super) debug_file_dwarf: bool,
}

/// Whether blazesym may read the DWARF of `file`. It follows the links a
/// file names to other debug files (`.gnu_debuglink`,
/// `.gnu_debugaltlink`, `.debug_sup`) by itself, by host path, with a
/// blocking open: a FIFO would hang it, an absolute name would reach a
/// host file. So it may only when the file names no such link, or names
/// a `.gnu_debugaltlink` (dwz's common file of a distribution's debug
/// files) that is a regular file at the same absolute path in `root` and
/// on the host, `root` being the host's own. tracer looks up debug links
/// itself (`debug_files`); without DWARF, blazesym still reads the ELF
/// symbols.
pub(super) fn dwarf_is_safe(file: &File, root: Root) -> bool {
    // SAFETY: only read; a truncated file reads as zeros (`target_files`).
    let Ok(map) = (unsafe { memmap2::Mmap::map(file) }) else {
        return false;
    };
    let Ok(elf) = object::File::parse(&*map) else {
        return false;
    };
    use object::ObjectSection as _;
    if elf.section_by_name(".gnu_debuglink").is_some()
        || elf.section_by_name(".debug_sup").is_some()
    {
        return false;
    }
    let Some(altlink) = elf.section_by_name(".gnu_debugaltlink") else {
        return true;
    };
    let Some(name) = altlink.data().ok().and_then(|data| {
        let length = data.iter().position(|&byte| byte == 0)?;
        std::str::from_utf8(&data[..length]).ok()
    }) else {
        return false;
    };
    let path = Path::new(name);
    let plain = path.is_absolute()
        && path.components().all(|component| {
            matches!(
                component,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        });
    let shares_host_root = match root {
        Root::Host => true,
        Root::Target(pid) => {
            std::fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|root| root == Path::new("/"))
        }
    };
    plain
        && shares_host_root
        && target_files::open_following_links(root, path).is_ok()
        && target_files::open_following_links(Root::Host, path).is_ok()
}

/// An ELF source for blazesym, with its DWARF read only when `dwarf`.
pub(super) fn elf_source(path: PathBuf, dwarf: bool) -> Source<'static> {
    let mut elf = Elf::new(path);
    elf.debug_syms = dwarf;
    Source::Elf(elf)
}

/// The path blazesym opens for a file tracer holds open.
pub(super) fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

impl Module {
    /// The ELF virtual address at `file_offset`, when a load segment
    /// holds it.
    pub(super) fn virtual_address(&self, file_offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|&&(start, size, _)| (start..start + size).contains(&file_offset))
            .map(|&(start, _, address)| address + (file_offset - start))
    }
}

/// The build id and debug link of an ELF file, and its load segments (see
/// `Module::segments`).
pub(super) fn read_identity(file: &File) -> (DebugLink, Vec<(u64, u64, u64)>) {
    // SAFETY: the map is only read, and mapped libraries are not rewritten
    // in place (an updated library is a new file).
    let Ok(map) = (unsafe { memmap2::Mmap::map(file) }) else {
        return (DebugLink::default(), Vec::new());
    };
    let Ok(elf) = object::File::parse(&*map) else {
        return (DebugLink::default(), Vec::new());
    };
    let link = debug_files::read_debug_link(&elf);
    let segments = elf
        .segments()
        .map(|segment| {
            let (start, size) = segment.file_range();
            (start, size, segment.address())
        })
        .collect();
    (link, segments)
}
