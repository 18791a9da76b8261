//! The unwind sections of mapped objects, for framehop: each file is
//! mapped once (memmap, nothing copied) and shared by every process that
//! maps it, whatever path it has in their mount namespaces.
//!
//! Long: one reading of an ELF object's unwind sections, segments and
//! functions, shared by both unwinders.
use std::{
    collections::HashMap,
    fs::File,
    ops::Range,
    os::unix::fs::MetadataExt as _,
    sync::{Arc, OnceLock},
};

use framehop::{ExplicitModuleSectionInfo, Module};
use memmap2::Mmap;
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

use super::stops;
use crate::procfs::Mapping;

/// Bytes of one section of a mapped file.
#[derive(Clone)]
pub struct Section {
    map: Arc<Mmap>,
    range: Range<usize>,
}

impl std::ops::Deref for Section {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }
}

/// One loadable segment (PT_LOAD) of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    address: u64,
    file_offset: u64,
    file_size: u64,
    executable: bool,
}

impl Segment {
    /// The file offset where the loader's mapping of this segment starts.
    fn mapped_from(&self) -> u64 {
        self.file_offset & !(PAGE_BYTES - 1)
    }
}

/// A function in an object's symbols: where it is, and where its name is,
/// not the name (libtensorflow_cc names 1.2 M functions in 175 MB of
/// strings: [`ObjectInfo::is_own_code`] reads one name when asked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Function {
    pub address: u64,
    pub size: u64,
    /// Where its name starts in the symbols' string table.
    name_offset: u32,
}

/// Functions that every object links in from the C start files: their
/// prologues say nothing of how the object's own code was built.
const START_FILE_FUNCTIONS: [&str; 9] = [
    "_start",
    "_init",
    "_fini",
    "deregister_tm_clones",
    "register_tm_clones",
    "__do_global_dtors_aux",
    "frame_dummy",
    "__libc_csu_init",
    "__libc_csu_fini",
];

/// The loader maps segments in whole pages.
const PAGE_BYTES: u64 = 4096;

/// What framehop needs from one object, and how its file offsets map to
/// its addresses.
///
/// Wide: what one ELF object tells the unwinder (its mapping, segments, text,
/// the three unwind sections, functions, build id, Go's text), read once per
/// file.
pub struct ObjectInfo {
    map: Arc<Mmap>,
    segments: Vec<Segment>,
    text: Option<Range<u64>>,
    eh_frame: Option<(Range<u64>, Range<usize>)>,
    eh_frame_hdr: Option<(Range<u64>, Range<usize>)>,
    debug_frame: Option<Range<usize>>,
    /// The addresses that unwind information describes, read at the first
    /// question.
    unwind_info: OnceLock<Vec<Range<u64>>>,
    /// Functions named in the symbol table (or, without one, the dynamic
    /// symbol table).
    pub functions: Vec<Function>,
    /// The file bytes of the string table that names `functions`.
    function_names: Range<usize>,
    /// The GNU build id, when the object has one.
    build_id: Option<Vec<u8>>,
    /// Built by a language runtime registered with `runtime_code` (Go),
    /// and where its own code lies.
    pub managed: Option<super::runtime_code::ManagedCode>,
}

impl ObjectInfo {
    /// A keyed digest of what unwinding reads of it: the bytes of its
    /// unwind sections and where its code lies.
    fn unwind_digest(&self, key: &impl std::hash::BuildHasher) -> u64 {
        use std::hash::{Hash as _, Hasher as _};
        let mut hasher = key.build_hasher();
        let bytes = |range: Option<&Range<usize>>| {
            range
                .and_then(|range| self.map.get(range.clone()))
                .unwrap_or(&[])
        };
        bytes(self.eh_frame.as_ref().map(|(_, bytes)| bytes)).hash(&mut hasher);
        bytes(self.eh_frame_hdr.as_ref().map(|(_, bytes)| bytes)).hash(&mut hasher);
        bytes(self.debug_frame.as_ref()).hash(&mut hasher);
        self.eh_frame
            .as_ref()
            .map(|(svma, _)| svma)
            .hash(&mut hasher);
        self.eh_frame_hdr
            .as_ref()
            .map(|(svma, _)| svma)
            .hash(&mut hasher);
        self.text.hash(&mut hasher);
        self.managed.hash(&mut hasher);
        hasher.finish()
    }

    /// The object in `bytes`, written to a memory file and read as a
    /// mapped file is (what the fuzz targets read).
    pub fn from_bytes(bytes: &[u8]) -> Option<ObjectInfo> {
        use std::{io::Write as _, os::fd::FromRawFd as _};
        // SAFETY: memfd_create takes a name and flags, and returns a new
        // fd or -1.
        let fd = unsafe { libc::memfd_create(c"tracer-object".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: a new fd that nothing else owns.
        let mut file = unsafe { File::from_raw_fd(fd) };
        file.write_all(bytes).ok()?;
        ObjectInfo::read(&file)
    }

    pub(super) fn read(file: &File) -> Option<ObjectInfo> {
        // SAFETY: the map is only read; a file truncated underneath reads
        // as zeros past its new end (`target_files::sigbus`).
        let map = Arc::new(unsafe { Mmap::map(file) }.ok()?);
        let elf = object::File::parse(&map[..]).ok()?;
        let segments = elf
            .segments()
            .map(|segment| {
                let (file_offset, file_size) = segment.file_range();
                let executable = match segment.flags() {
                    object::SegmentFlags::Elf { p_flags } => p_flags & object::elf::PF_X != 0,
                    _ => false,
                };
                Segment {
                    address: segment.address(),
                    file_offset,
                    file_size,
                    executable,
                }
            })
            .collect();
        let section = |name: &str| {
            let section = elf.section_by_name(name)?;
            if section.compressed_file_range().ok()?.format != object::CompressionFormat::None {
                return None;
            }
            let (offset, size) = section.file_range()?;
            let address = section.address();
            Some((
                address..address + section.size(),
                offset as usize..(offset + size) as usize,
            ))
        };
        let (named, function_names) = function_symbols(&map).unwrap_or_default();
        Some(ObjectInfo {
            managed: super::runtime_code::recognize(&elf),
            build_id: elf.build_id().ok().flatten().map(<[u8]>::to_vec),
            functions: named,
            function_names,
            segments,
            text: section(".text").map(|(addresses, _)| addresses),
            eh_frame: section(".eh_frame"),
            eh_frame_hdr: section(".eh_frame_hdr"),
            debug_frame: section(".debug_frame").map(|(_, bytes)| bytes),
            unwind_info: OnceLock::new(),
            map: map.clone(),
        })
    }

    /// Whether `function` is the object's own calling code: not one of the
    /// C start files' functions, nor a part split off cold (`.cold`). Its
    /// name is read, and its page given back.
    pub fn is_own_code(&self, function: &Function) -> bool {
        const LONGEST_NAME: usize = 4096;
        let offset = self.function_names.start + function.name_offset as usize;
        let length = LONGEST_NAME.min(self.function_names.end.saturating_sub(offset));
        self.with_bytes_at(offset as u64, length, |bytes| {
            let name = bytes.split(|&byte| byte == 0).next().unwrap_or_default();
            let name = std::str::from_utf8(name).unwrap_or_default();
            !START_FILE_FUNCTIONS.contains(&name) && !name.contains(".cold")
        })
        .unwrap_or(true)
    }

    /// The function called `name` in the symbol table (or the dynamic
    /// one), read from the file now.
    pub fn function_named(&self, name: &str) -> Option<Function> {
        self.functions_named(|symbol| symbol == name)
            .into_iter()
            .next()
    }

    /// The functions of the symbol table (or, without one, the dynamic
    /// symbol table) whose name `matches`, read from the file now.
    pub fn functions_named(&self, matches: impl Fn(&str) -> bool) -> Vec<Function> {
        self.functions
            .iter()
            .filter(|function| {
                let offset = self.function_names.start + function.name_offset as usize;
                self.map
                    .get(offset..self.function_names.end)
                    .is_some_and(|bytes| {
                        let name = bytes.split(|&byte| byte == 0).next().unwrap_or_default();
                        std::str::from_utf8(name).is_ok_and(&matches)
                    })
            })
            .copied()
            .collect()
    }

    /// The object address at the start of `mapping` (which maps this
    /// object): see [`address_of_mapping`].
    pub fn address_of_mapping(&self, mapping: &Mapping) -> Option<u64> {
        address_of_mapping(&self.segments, mapping)
    }

    /// The loadable segments (PT_LOAD).
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The file offset of an object address.
    pub fn offset_of_address(&self, address: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|segment| {
                (segment.address..segment.address + segment.file_size).contains(&address)
            })
            .map(|segment| segment.file_offset + (address - segment.address))
    }

    /// Bytes of the file at an offset.
    pub fn bytes_at(&self, offset: u64, length: usize) -> Option<&[u8]> {
        let start = offset as usize;
        self.map.get(start..(start + length).min(self.map.len()))
    }

    /// `f` of the bytes of the file at an offset (as `bytes_at`), then
    /// the pages they lie in are given back: a sample of code across a
    /// large object leaves none of it in tracer's resident memory. The
    /// kernel maps up to 64 KiB around each faulting page (fault-around),
    /// so the 64 KiB blocks around the bytes are given back.
    pub fn with_bytes_at<R>(
        &self,
        offset: u64,
        length: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let bytes = self.bytes_at(offset, length)?;
        let result = f(bytes);
        release_pages(&self.map, offset as usize..offset as usize + bytes.len());
        Some(result)
    }

    /// Whether `.eh_frame` or `.debug_frame` has a rule for the code at an
    /// object address.
    pub fn has_unwind_info(&self, address: u64) -> bool {
        let ranges = self.unwind_info.get_or_init(|| {
            let eh_frame = self.eh_frame.as_ref().and_then(|(addresses, bytes)| {
                Some((addresses.start, self.map.get(bytes.clone())?))
            });
            let debug_frame = self
                .debug_frame
                .as_ref()
                .and_then(|bytes| self.map.get(bytes.clone()));
            let text_address = self.text.as_ref().map_or(0, |text| text.start);
            stops::unwind_info_ranges(eh_frame, debug_frame, text_address)
        });
        stops::ranges_hold(ranges, address)
    }

    /// Up to `length` bytes of code just before an object address (fewer
    /// at the start of a segment).
    pub fn code_before(&self, address: u64, length: usize) -> Option<&[u8]> {
        let segment = self.segments.iter().find(|segment| {
            segment.executable
                && (segment.address + 1..=segment.address + segment.file_size).contains(&address)
        })?;
        let length = (length as u64).min(address - segment.address);
        let offset = segment.file_offset + (address - length - segment.address);
        self.bytes_at(offset, length as usize)
    }

    /// The address range of `.text`.
    pub fn text(&self) -> Option<Range<u64>> {
        self.text.clone()
    }

    /// `.eh_frame`: its object address and bytes.
    pub fn eh_frame(&self) -> Option<(u64, &[u8])> {
        let (addresses, bytes) = self.eh_frame.clone()?;
        Some((addresses.start, self.map.get(bytes)?))
    }

    /// `.debug_frame`'s bytes (its addresses are absolute).
    pub fn debug_frame(&self) -> Option<&[u8]> {
        self.map.get(self.debug_frame.clone()?)
    }

    /// The GNU build id, when the object has one.
    pub fn build_id(&self) -> Option<&[u8]> {
        self.build_id.as_deref()
    }

    pub fn eh_frame_hdr(&self) -> Option<(u64, &[u8])> {
        let (addresses, bytes) = self.eh_frame_hdr.clone()?;
        Some((addresses.start, self.map.get(bytes)?))
    }

    fn section(&self, bytes: &Range<usize>) -> Option<Section> {
        (bytes.end <= self.map.len()).then(|| Section {
            map: self.map.clone(),
            range: bytes.clone(),
        })
    }
}

/// Objects by file identity (device, inode, size, modification time), and
/// by build id and the digest of their unwind information: the same build
/// in two containers is read and indexed once, but a file that claims
/// another's build id (a container's own, forged) shares nothing with it
/// unless its unwind sections are the same bytes. The digest is keyed per
/// run (SipHash with random keys), so no file can be made to match
/// another's without being it.
#[derive(Default)]
pub struct ModuleFiles {
    objects: HashMap<(u64, u64, u64, i64), Option<Arc<ObjectInfo>>>,
    by_build_id: HashMap<(Vec<u8>, u64), Arc<ObjectInfo>>,
    digest_key: std::collections::hash_map::RandomState,
}

impl ModuleFiles {
    /// The object mapped by `mapping` in `pid`, read once per file.
    pub fn object(&mut self, pid: u32, mapping: &Mapping) -> Option<Arc<ObjectInfo>> {
        let file = open_mapped(pid, mapping)?;
        let metadata = file.metadata().ok()?;
        let identity = (
            metadata.dev(),
            metadata.ino(),
            metadata.size(),
            metadata.mtime(),
        );
        if let Some(known) = self.objects.get(&identity) {
            return known.clone();
        }
        let object = ObjectInfo::read(&file).map(|object| match &object.build_id {
            Some(build_id) => {
                let digest = object.unwind_digest(&self.digest_key);
                self.by_build_id
                    .entry((build_id.clone(), digest))
                    .or_insert_with(|| Arc::new(object))
                    .clone()
            }
            None => Arc::new(object),
        });
        self.objects.insert(identity, object.clone());
        object
    }

    /// A framehop module for one executable mapping, with its object and
    /// the address where the object's address 0 is mapped.
    pub fn module(
        &mut self,
        pid: u32,
        mapping: &Mapping,
    ) -> Option<(Module<Section>, Arc<ObjectInfo>, u64)> {
        let object = self.object(pid, mapping)?;
        let base_avma = mapping
            .start
            .checked_sub(object.address_of_mapping(mapping)?)?;
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: object.text.clone(),
            eh_frame_svma: object.eh_frame.as_ref().map(|(svma, _)| svma.clone()),
            eh_frame: object
                .eh_frame
                .as_ref()
                .and_then(|(_, bytes)| object.section(bytes)),
            eh_frame_hdr_svma: object.eh_frame_hdr.as_ref().map(|(svma, _)| svma.clone()),
            eh_frame_hdr: object
                .eh_frame_hdr
                .as_ref()
                .and_then(|(_, bytes)| object.section(bytes)),
            debug_frame: object
                .debug_frame
                .as_ref()
                .and_then(|bytes| object.section(bytes)),
            text: None,
            stubs_svma: None,
            stub_helper_svma: None,
            got_svma: None,
            unwind_info: None,
            text_segment_svma: None,
            text_segment: None,
        };
        let module = Module::new(
            mapping.path.display().to_string(),
            mapping.start..mapping.end,
            base_avma,
            info,
        );
        Some((module, object, base_avma))
    }
}

/// The object address at the start of `mapping` (which maps the object
/// of `segments`): from the segment that the loader mapped there. lld packs
/// segments into shared file pages (the read-only segment ends and the
/// executable one begins in the same page, one page apart in addresses),
/// so the first segment whose file range holds the mapping's offset can be
/// the wrong one, a page off: the segment whose mapping starts there, with
/// the mapping's permission, is right.
pub fn address_of_mapping(segments: &[Segment], mapping: &Mapping) -> Option<u64> {
    let offset = mapping.file_offset;
    segments
        .iter()
        .filter(|segment| {
            (segment.mapped_from()..segment.file_offset + segment.file_size).contains(&offset)
        })
        .max_by_key(|segment| {
            (
                segment.mapped_from() == offset,
                segment.executable == mapping.executable,
            )
        })
        .map(|segment| {
            segment
                .address
                .wrapping_add(offset)
                .wrapping_sub(segment.file_offset)
        })
}

/// The functions of an ELF object's symbol table (or, without one, its
/// dynamic symbol table), and the file bytes of the string table that
/// names them. The table's pages are given back after: a large C++
/// library's symbols (30 MB for libtensorflow_cc) are read once, not kept
/// in tracer's resident memory.
fn function_symbols(map: &Mmap) -> Option<(Vec<Function>, Range<usize>)> {
    use object::read::elf::{ElfFile64, SectionHeader as _, Sym as _};
    let file = ElfFile64::<object::Endianness>::parse(&map[..]).ok()?;
    let endian = file.endian();
    let mut table = file.elf_symbol_table();
    if table.is_empty() {
        table = file.elf_dynamic_symbol_table();
    }
    let strings = file
        .elf_section_table()
        .section(table.string_section())
        .ok()?;
    let (names_offset, names_size) = strings.file_range(endian)?;
    let functions = table
        .symbols()
        .iter()
        .filter(|symbol| {
            matches!(
                symbol.st_type(),
                object::elf::STT_FUNC | object::elf::STT_GNU_IFUNC
            ) && symbol.st_shndx(endian) != object::elf::SHN_UNDEF
                && symbol.st_size(endian) > 0
        })
        .map(|symbol| Function {
            address: symbol.st_value(endian),
            size: symbol.st_size(endian),
            name_offset: symbol.st_name(endian),
        })
        .collect();
    let symbols = table.symbols();
    let start = symbols.as_ptr() as usize - map.as_ptr() as usize;
    release_pages(map, start..start + size_of_val(symbols));
    Some((
        functions,
        names_offset as usize..(names_offset + names_size) as usize,
    ))
}

/// Gives back the pages of `range` of a read-only file mapping (the
/// kernel maps up to 64 KiB around each page faulted in: those blocks
/// too), so that what was read does not stay in tracer's resident memory.
fn release_pages(map: &Mmap, range: Range<usize>) {
    const FAULT_AROUND_BYTES: usize = 64 << 10;
    let start = range.start / FAULT_AROUND_BYTES * FAULT_AROUND_BYTES;
    let end = range
        .end
        .div_ceil(FAULT_AROUND_BYTES)
        .saturating_mul(FAULT_AROUND_BYTES)
        .min(map.len());
    if start < end {
        // SAFETY: a range of our own read-only shared file mapping
        // (page-aligned: the map starts on a page); no reference into it
        // is used after, and the pages read back from the file.
        unsafe {
            libc::madvise(
                map.as_ptr().add(start).cast_mut().cast(),
                end - start,
                libc::MADV_DONTNEED,
            );
        }
    }
}

/// Opens a file the target maps: the inode mapped (`target_files`).
pub fn open_mapped(pid: u32, mapping: &Mapping) -> Option<File> {
    crate::target_files::open_mapped(pid, mapping).ok()
}

#[cfg(test)]
mod tests {
    use std::io::BufRead as _;
    use std::process::{Command, Stdio};

    use super::*;

    #[test]
    fn a_build_id_is_shared_only_with_the_same_unwind_bytes() {
        // leaky (built by `cargo xtask setup`) and a copy of it with one
        // byte of its .eh_frame changed: the same build id, other rows.
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fixtures/leaky");
        let bytes = std::fs::read(&path).expect("target/fixtures/leaky: run `cargo xtask setup`");
        let object = ObjectInfo::read(&File::open(&path).expect("readable")).expect("an ELF");
        let (_, eh_frame) = object.eh_frame.clone().expect("an .eh_frame");
        let mut forged = bytes.clone();
        forged[eh_frame.start + 40] ^= 0xff;
        let copy = |name: &str, bytes: &[u8]| {
            let path =
                std::env::temp_dir().join(format!("tracer-unwind-{name}-{}", std::process::id()));
            std::fs::write(&path, bytes).expect("a copy");
            let object = ObjectInfo::read(&File::open(&path).expect("readable")).expect("an ELF");
            let _ = std::fs::remove_file(&path);
            object
        };
        let same = copy("same", &bytes);
        let forged = copy("forged", &forged);
        assert_eq!(forged.build_id, object.build_id);
        let key = std::collections::hash_map::RandomState::new();
        assert_eq!(same.unwind_digest(&key), object.unwind_digest(&key));
        assert_ne!(forged.unwind_digest(&key), object.unwind_digest(&key));
    }

    #[test]
    fn lld_executable_is_placed_where_the_loader_mapped_it() {
        // rust_leak (built by `cargo xtask setup`) is linked by lld: its
        // read-only segment ends in the file page where its executable
        // segment starts, and that segment's addresses are a page further.
        let path = std::fs::canonicalize(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fixtures/rust_leak"),
        )
        .expect("target/fixtures/rust_leak: run `cargo xtask setup`");
        let mut child = Command::new(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("rust_leak starts");
        let mut ready = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut ready)
            .expect("rust_leak answers");
        let maps = crate::procfs::read_maps(child.id()).expect("its maps");
        child.kill().expect("rust_leak stops");
        child.wait().expect("rust_leak is reaped");

        let own: Vec<&Mapping> = maps.iter().filter(|mapping| mapping.path == path).collect();
        // Where the loader put the object's start (file offset 0, address 0).
        let load_base = own
            .iter()
            .find(|mapping| mapping.file_offset == 0)
            .expect("its first page is mapped")
            .start;
        let text = own
            .iter()
            .find(|mapping| mapping.executable)
            .expect("its code is mapped");
        let object = ObjectInfo::read(&File::open(&path).expect("readable")).expect("an ELF");
        let shared_page = object.segments.iter().any(|segment| {
            !segment.executable
                && (segment.file_offset..segment.file_offset + segment.file_size)
                    .contains(&text.file_offset)
        });
        assert!(
            shared_page,
            "the executable segment no longer shares a page: {:?}",
            object.segments
        );
        assert_eq!(
            text.start - object.address_of_mapping(text).expect("a segment"),
            load_base,
            "{own:?}"
        );
    }
}
