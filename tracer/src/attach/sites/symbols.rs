//! Finds the allocator functions in the objects a target maps: glibc, the
//! executable itself (static builds, custom allocators) or an allocator
//! library (jemalloc, tcmalloc, mimalloc). Reads both the dynamic symbol
//! table (present even in stripped libraries) and the full symbol table.
//!
//! Long: one reading of an object's symbol tables for every allocator family,
//! with the rules that pick each one's hook sites.
use std::{
    collections::BTreeMap,
    fs::{self, File},
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context as _, Result};
use object::{Object as _, ObjectSymbol as _, SymbolKind};

use crate::attach::{
    safety::exceptions::UNWINDER_START,
    sites::family,
    sites::forwarding::{Callees, Forwarding, PassesOn},
    sites::function::HookedFunction,
    sites::prologue,
    sources::traced_functions,
};
use crate::{procfs::Mapping, target_files};

/// Every function looked up in a mapped object: the uprobe sources'
/// (`sources::traced_functions`: the allocators, the families runtimes
/// registered, the CUDA entry points), then the unwinder's entry points
/// (`exceptions`).
fn hooked_functions() -> impl Iterator<Item = HookedFunction> {
    traced_functions().chain(UNWINDER_START)
}

/// The file a site is in: the descriptor tracer read its symbols and
/// code through (`target_files`), and that file's device and inode, the
/// key by which two sites are in one file.
///
/// Probes are attached by `/proc/self/fd/N` of that descriptor, never by
/// the target's path: the kernel follows the descriptor's link to the very
/// inode tracer read, so a target that swaps a directory, a link or the
/// file itself between the read and the attach cannot make root probe (or
/// the kernel open) another file, nor put offsets read from one inode into
/// another.
#[derive(Clone, Debug)]
pub struct SiteFile {
    pub device: u64,
    pub inode: u64,
    /// The name it was opened by, for messages only.
    pub name: PathBuf,
    /// Open until the site is attached, then let go (`without_descriptor`):
    /// the links hold the inode, and tracer keeps no descriptor per file.
    descriptor: Option<Arc<File>>,
}

impl SiteFile {
    /// `file`, opened by `target_files` as `name`, with its device and
    /// inode.
    pub fn of(file: File, name: &Path) -> std::io::Result<SiteFile> {
        let metadata = file.metadata()?;
        Ok(SiteFile {
            device: metadata.dev(),
            inode: metadata.ino(),
            name: name.to_path_buf(),
            descriptor: Some(Arc::new(file)),
        })
    }

    /// The path the kernel attaches probes in this file by:
    /// `/proc/self/fd/N` of the descriptor its sites were read through.
    pub fn attach_path(&self) -> Result<PathBuf> {
        let descriptor = self.descriptor.as_ref().with_context(|| {
            format!(
                "{} was let go before its probes were attached",
                self.name.display()
            )
        })?;
        Ok(PathBuf::from(format!(
            "/proc/self/fd/{}",
            descriptor.as_raw_fd()
        )))
    }

    /// The file as tracer opened it; None once let go.
    pub fn opened(&self) -> Option<&File> {
        self.descriptor.as_deref()
    }

    /// The same file, its descriptor let go (once attached).
    pub fn without_descriptor(&self) -> SiteFile {
        SiteFile {
            device: self.device,
            inode: self.inode,
            name: self.name.clone(),
            descriptor: None,
        }
    }

    /// A file that was never opened, for tests of site choice.
    #[cfg(test)]
    pub fn unopened(device: u64, inode: u64) -> SiteFile {
        SiteFile {
            device,
            inode,
            name: PathBuf::from("/lib/libx.so"),
            descriptor: None,
        }
    }
}

impl PartialEq for SiteFile {
    fn eq(&self, other: &Self) -> bool {
        (self.device, self.inode) == (other.device, other.inode)
    }
}

impl Eq for SiteFile {}

/// One place to attach: an allocator function in one mapped file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookSite {
    pub function: HookedFunction,
    /// The file as the target sees it (for reports).
    pub path: PathBuf,
    /// The file tracer read, which its probes are attached by.
    pub file: SiteFile,
    /// File offset of the function's first instruction.
    pub function_offset: u64,
    /// File offset of the probed instruction (see `prologue`).
    pub offset: u64,
    /// Whether the kernel emulates the probed instruction (else it is
    /// single-stepped: ~16 µs per call on a VM).
    pub emulated: bool,
    /// Why the probe is where it is (see `prologue`).
    pub reason: String,
}

impl HookSite {
    /// The site once attached, kept for reports: its file's descriptor
    /// let go.
    pub fn without_descriptor(&self) -> HookSite {
        HookSite {
            file: self.file.without_descriptor(),
            ..self.clone()
        }
    }
}

/// A hooked function that gets no probe: it only passes its calls on to
/// another hooked function (`forwarding`), for `-v`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unprobed {
    pub name: &'static str,
    /// The file as the target sees it.
    pub path: PathBuf,
    pub why: String,
}

/// The sites to probe in some files, and the hooked functions there that
/// need no probe.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoundSites {
    pub sites: Vec<HookSite>,
    pub unprobed: Vec<Unprobed>,
}

/// The files `pid` maps with execute permission, each once.
pub fn executable_paths(maps: &[Mapping]) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = maps
        .iter()
        .filter(|mapping| mapping.executable)
        .map(|mapping| mapping.path.clone())
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// The allocator and CUDA functions defined in the executable files `pid`
/// maps.
/// Each is read (and probed) in the inode mapped (`target_files::open_named`).
pub fn find_hook_sites(pid: u32, maps: &[Mapping], forwarding: Forwarding) -> Result<FoundSites> {
    sites_in(
        pid,
        &executable_paths(maps),
        |path| target_files::open_named(pid, path, maps),
        &hooked_functions().collect::<Vec<_>>(),
        forwarding,
    )
}

/// The allocator and CUDA functions defined in `paths`, files `pid` maps.
pub fn hook_sites_in(pid: u32, paths: &[PathBuf], forwarding: Forwarding) -> Result<FoundSites> {
    sites_in(
        pid,
        paths,
        |path| target_files::open_in_root(pid, path),
        &hooked_functions().collect::<Vec<_>>(),
        forwarding,
    )
}

/// The functions of `functions` defined in `path`, a file `pid` maps,
/// opened as the inode it maps (a runtime's family hooked on request:
/// `runtimes::python`'s objects).
pub fn sites_in_mapped(
    pid: u32,
    path: &Path,
    maps: &[Mapping],
    functions: &[HookedFunction],
    forwarding: Forwarding,
) -> Result<Vec<HookSite>> {
    Ok(sites_in(
        pid,
        &[path.to_path_buf()],
        |path| target_files::open_named(pid, path, maps),
        functions,
        forwarding,
    )?
    .sites)
}

/// The size in bytes of the function `name` defined in the ELF file at
/// `path` in `pid`'s root, from its dynamic or full symbol table.
pub fn function_size(pid: u32, path: &std::path::Path, name: &str) -> Option<u64> {
    let file = target_files::open_in_root(pid, path).ok()?;
    // SAFETY: read only, as in `sites_in_file`.
    let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*data).ok()?;
    elf.dynamic_symbols()
        .chain(elf.symbols())
        .find(|symbol| symbol.is_definition() && symbol.name() == Ok(name))
        .map(|symbol| symbol.size())
}

/// The functions of `functions` defined in `paths`, files `pid` maps or
/// could load, each opened by `open`.
fn sites_in(
    pid: u32,
    paths: &[PathBuf],
    open: impl Fn(&Path) -> Result<File, target_files::OpenError>,
    functions: &[HookedFunction],
    forwarding: Forwarding,
) -> Result<FoundSites> {
    let mut found_sites = FoundSites::default();
    for path in paths {
        // A file that vanished, cannot be read or is refused (a FIFO, a
        // link: `target_files`) holds no hook we can use.
        let Some(file) = open(path)
            .ok()
            .and_then(|file| SiteFile::of(file, path).ok())
        else {
            continue;
        };
        sites_in_file(pid, path, &file, functions, forwarding, &mut found_sites)?;
    }
    Ok(found_sites)
}

/// The allocator and CUDA functions defined in `file`, opened by tracer,
/// which the target `pid` names `path`.
pub fn hook_sites_in_file(
    pid: u32,
    path: &Path,
    file: &SiteFile,
    forwarding: Forwarding,
) -> Result<FoundSites> {
    let mut found_sites = FoundSites::default();
    sites_in_file(
        pid,
        path,
        file,
        &hooked_functions().collect::<Vec<_>>(),
        forwarding,
        &mut found_sites,
    )?;
    Ok(found_sites)
}

/// Adds the sites of the functions of `functions` defined in `file` (the
/// target `pid` names it `path`) to `found_sites`.
fn sites_in_file(
    pid: u32,
    path: &Path,
    file: &SiteFile,
    functions: &[HookedFunction],
    forwarding: Forwarding,
    found_sites: &mut FoundSites,
) -> Result<()> {
    let executable = fs::read_link(format!("/proc/{pid}/exe")).ok();
    {
        let Some(opened) = file.opened() else {
            return Ok(());
        };
        // SAFETY: the mapping is only read; a file truncated meanwhile
        // reads as zeros past its end (`target_files::sigbus`).
        let Ok(data) = (unsafe { memmap2::Mmap::map(opened) }) else {
            return Ok(());
        };
        // Shared libraries export their allocator; only the executable
        // (a static build, a custom allocator) may define it unexported,
        // and walking the full symbol table of a huge library is slow.
        // A runtime's family may be unexported in its own small library
        // (PyTorch's caching allocator).
        let unexported = path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(family::unexported_in);
        let search = if executable.as_deref() == Some(path) || unexported.is_some() {
            SymbolTables::DynamicAndFull
        } else {
            SymbolTables::Dynamic
        };
        let found_functions = function_offsets(&data, search, functions)
            .with_context(|| format!("could not read the symbols of {}", path.display()))?;
        if let Some(family) = unexported
            && family
                .functions
                .iter()
                .any(|function| functions.contains(function))
            && !found_functions
                .iter()
                .any(|found| family.contains(&found.function))
        {
            eprintln!(
                "tracer: note: {} does not list {} in its symbol table (a stripped or \
                 unknown build): {}",
                path.display(),
                family.name,
                family.missing
            );
        }
        for found in found_functions {
            if found.passes_on.needs_no_probe(forwarding) {
                found_sites.unprobed.push(Unprobed {
                    name: found.function.name,
                    path: path.to_path_buf(),
                    why: found.passes_on.why_not_probed().unwrap_or_default(),
                });
                continue;
            }
            let start = usize::try_from(found.file_offset).unwrap_or(usize::MAX);
            let code = data.get(start..).unwrap_or_default();
            // The CUDA programs take their cookie for the API: only the
            // malloc family can read a moved argument (a runtime's family's
            // programs do not).
            let follow_copies = found.function.cookie == 0
                && family::of(&found.function).is_none_or(|family| family.reads_moved_arguments);
            let site = prologue::choose_site(
                code,
                found.size_bytes,
                prologue::argument_registers(found.function.name),
                follow_copies,
            );
            let mut function = found.function;
            if follow_copies {
                function.cookie = moved_arguments_cookie(&site.moved_arguments);
            }
            let reason = match found.passes_on.why_probed(forwarding) {
                Some(why) => format!("{}; {why}", site.reason),
                None => site.reason,
            };
            found_sites.sites.push(HookSite {
                function,
                path: path.to_path_buf(),
                file: file.clone(),
                function_offset: found.file_offset,
                offset: found.file_offset + site.offset,
                emulated: site.emulated,
                reason,
            });
        }
    }
    Ok(())
}

/// Which symbol tables to search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymbolTables {
    Dynamic,
    DynamicAndFull,
}

/// An allocator function defined in an ELF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundFunction {
    pub function: HookedFunction,
    /// File offset of its first instruction.
    pub file_offset: u64,
    /// Its size from the symbol table; 0 when unknown.
    pub size_bytes: u64,
    /// What it does with its calls (`forwarding`).
    pub passes_on: PassesOn,
}

/// The allocator functions an ELF file defines that need a probe of their
/// own (`forwarding`). Two names at one address (glibc 2.36's
/// `aligned_alloc` is `memalign`) are hooked once, under the first name.
pub fn allocator_offsets(
    data: &[u8],
    search: SymbolTables,
    forwarding: Forwarding,
) -> Result<Vec<FoundFunction>> {
    Ok(
        function_offsets(data, search, &hooked_functions().collect::<Vec<_>>())?
            .into_iter()
            .filter(|found| !found.passes_on.needs_no_probe(forwarding))
            .collect(),
    )
}

/// The functions of `functions` an ELF file defines, as
/// [`allocator_offsets`].
fn function_offsets(
    data: &[u8],
    search: SymbolTables,
    functions: &[HookedFunction],
) -> Result<Vec<FoundFunction>> {
    let Ok(file) = object::File::parse(data) else {
        return Ok(Vec::new());
    };
    let mut addresses: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let full = (search == SymbolTables::DynamicAndFull).then(|| file.symbols());
    for symbol in file.dynamic_symbols().chain(full.into_iter().flatten()) {
        if !symbol.is_definition() || symbol.kind() != SymbolKind::Text || symbol.address() == 0 {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        if let Some(function) = functions.iter().find(|f| f.name == name) {
            addresses
                .entry(function.name)
                .or_insert((symbol.address(), symbol.size()));
        }
    }
    let mut found: Vec<FoundFunction> = Vec::new();
    let defined: Vec<(u64, &'static str)> = functions
        .iter()
        .filter_map(|function| Some((addresses.get(function.name)?.0, function.name)))
        .collect();
    let names: Vec<&'static str> = functions.iter().map(|function| function.name).collect();
    let callees = Callees::new(&file, data, &defined, &names);
    for &function in functions {
        let Some(&(address, size_bytes)) = addresses.get(function.name) else {
            continue;
        };
        let Some(offset) = prologue::file_offset(&file, address) else {
            continue;
        };
        // CUDA layers stay apart even when one only forwards to the other:
        // the report names the API a block came through.
        let passes_on = if function.cookie == 0 {
            callees.passes_on(address, size_bytes)
        } else {
            PassesOn::No
        };
        if found.iter().all(|seen| seen.file_offset != offset) {
            found.push(FoundFunction {
                function,
                file_offset: offset,
                size_bytes,
                passes_on,
            });
        }
    }
    Ok(found)
}

/// The attach cookie that tells a malloc-family entry program where its
/// moved arguments are (`tracer_ebpf::argument_register`).
pub fn moved_arguments_cookie(moved: &[(usize, iced_x86::Register)]) -> u64 {
    use iced_x86::Register;
    use tracer_ebpf::argument_register as slot;
    moved
        .iter()
        .map(|&(argument, register)| {
            let slot = match register {
                Register::R15 => slot::R15,
                Register::R14 => slot::R14,
                Register::R13 => slot::R13,
                Register::R12 => slot::R12,
                Register::RBP => slot::RBP,
                Register::RBX => slot::RBX,
                Register::R11 => slot::R11,
                Register::R10 => slot::R10,
                Register::R9 => slot::R9,
                Register::R8 => slot::R8,
                Register::RAX => slot::RAX,
                Register::RCX => slot::RCX,
                Register::RDX => slot::RDX,
                Register::RSI => slot::RSI,
                Register::RDI => slot::RDI,
                _ => 0,
            };
            slot << (8 * argument)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path a file's probes are attached by is its descriptor's: it
    /// reaches the inode tracer read after another file was renamed over
    /// the name it was opened by, and nothing once the descriptor is let go.
    #[test]
    fn a_site_file_is_attached_by_its_descriptor_not_by_its_name() {
        let dir = std::env::temp_dir().join(format!("tracer-site-file-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let name = dir.join("lib.so");
        fs::write(&name, b"read").unwrap();
        let file = SiteFile::of(File::open(&name).unwrap(), &name).unwrap();
        let replacement = dir.join("replacement.so");
        fs::write(&replacement, b"swapped in").unwrap();
        fs::rename(&replacement, &name).unwrap();

        let attach_path = file.attach_path().unwrap();
        assert!(
            attach_path.starts_with("/proc/self/fd"),
            "{}",
            attach_path.display()
        );
        // What the kernel reaches by that path (it follows the link, as
        // kern_path does for a uprobe or uprobe_multi attach).
        let reached = fs::metadata(&attach_path).unwrap();
        assert_eq!((reached.dev(), reached.ino()), (file.device, file.inode));
        assert_eq!(fs::read(&attach_path).unwrap(), b"read");
        let named = fs::metadata(&name).unwrap();
        assert_ne!(named.ino(), file.inode, "the name now names another file");

        let attached = file.without_descriptor();
        assert_eq!(attached, file, "still the same file for dedup");
        assert!(attached.attach_path().is_err());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn finds_glibc_allocators() {
        let data = fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("glibc is installed");
        let found =
            allocator_offsets(&data, SymbolTables::Dynamic, Forwarding::TailJumpsAndCalls).unwrap();
        let names: Vec<&str> = found.iter().map(|found| found.function.name).collect();
        for name in ["malloc", "calloc", "realloc", "free", "posix_memalign"] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
        let mut offsets: Vec<u64> = found.iter().map(|found| found.file_offset).collect();
        offsets.sort();
        offsets.dedup();
        assert_eq!(offsets.len(), found.len(), "one hook per address");
    }

    /// Distribution libcs are stripped: only the dynamic symbol table is
    /// left, and it is enough. (A copy stripped here makes sure of it on
    /// any distribution.)
    #[test]
    fn finds_allocators_in_a_stripped_libc() {
        let stripped = std::env::temp_dir().join(format!("libc-stripped-{}", std::process::id()));
        let status = std::process::Command::new("strip")
            .args(["--strip-all", "-o"])
            .arg(&stripped)
            .arg("/lib/x86_64-linux-gnu/libc.so.6")
            .status()
            .expect("strip (binutils) is installed with gcc");
        assert!(status.success());
        let data = fs::read(&stripped).unwrap();
        let _ = fs::remove_file(&stripped);
        let file = object::File::parse(&*data).unwrap();
        assert!(file.symbols().next().is_none(), "no full symbol table left");
        let found = allocator_offsets(
            &data,
            SymbolTables::DynamicAndFull,
            Forwarding::TailJumpsAndCalls,
        )
        .unwrap();
        let names: Vec<&str> = found.iter().map(|found| found.function.name).collect();
        for name in ["malloc", "free", "realloc"] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
    }

    /// On this machine's glibc, malloc and free get emulated sites.
    #[test]
    fn glibc_malloc_and_free_are_not_single_stepped() {
        let data = fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("glibc is installed");
        for found in
            allocator_offsets(&data, SymbolTables::Dynamic, Forwarding::TailJumpsAndCalls).unwrap()
        {
            if !matches!(found.function.name, "malloc" | "free") {
                continue;
            }
            let code = &data[found.file_offset as usize..];
            let site = prologue::choose_site(
                code,
                found.size_bytes,
                prologue::argument_registers(found.function.name),
                true,
            );
            assert!(site.emulated, "{}: {}", found.function.name, site.reason);
        }
    }

    /// libstdc++'s `operator delete` variants and `operator new[]` only
    /// jump on (to `free`, `operator delete`, `operator new`), and every
    /// `operator new` returns what its call of `malloc` (or
    /// `aligned_alloc`, or another `operator new`) returns: no probes of
    /// their own, so no allocation traps twice and no free is seen twice.
    /// With `--unwind fp` the calling ones keep theirs.
    #[test]
    fn libstdcxx_forwarders_get_no_probe() {
        let data = fs::read("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
            .expect("libstdc++ is installed with g++");
        let names = |forwarding| {
            allocator_offsets(&data, SymbolTables::Dynamic, forwarding)
                .unwrap()
                .iter()
                .map(|found| found.function.name)
                .collect::<Vec<&str>>()
        };
        let unwound = names(Forwarding::TailJumpsAndCalls);
        assert!(unwound.is_empty(), "{unwound:?}");
        let walked_by_frame_pointers = names(Forwarding::TailJumpsOnly);
        for calling in [
            "_Znwm",
            "_ZnwmRKSt9nothrow_t",
            "_ZnwmSt11align_val_t",
            "_ZnamRKSt9nothrow_t",
        ] {
            assert!(
                walked_by_frame_pointers.contains(&calling),
                "{calling} not in {walked_by_frame_pointers:?}"
            );
        }
        for forwarder in [
            "_Znam",
            "_ZdlPv",
            "_ZdlPvm",
            "_ZdaPv",
            "_ZdlPvSt11align_val_t",
        ] {
            assert!(
                !walked_by_frame_pointers.contains(&forwarder),
                "{forwarder} in {walked_by_frame_pointers:?}"
            );
        }
    }

    /// What each `operator new` passes its calls on to, read from its code.
    #[test]
    fn libstdcxx_operator_new_returns_what_malloc_returns() {
        let data = fs::read("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
            .expect("libstdc++ is installed with g++");
        let found = function_offsets(
            &data,
            SymbolTables::Dynamic,
            &hooked_functions().collect::<Vec<_>>(),
        )
        .unwrap();
        let passes_on = |name: &str| {
            found
                .iter()
                .find(|found| found.function.name == name)
                .map(|found| found.passes_on.clone())
        };
        assert_eq!(
            passes_on("_Znwm"),
            Some(PassesOn::Returns("malloc".to_owned()))
        );
        assert_eq!(
            passes_on("_ZnwmSt11align_val_t"),
            Some(PassesOn::Returns("aligned_alloc".to_owned()))
        );
        assert_eq!(
            passes_on("_ZnwmRKSt9nothrow_t"),
            Some(PassesOn::Returns("_Znwm".to_owned()))
        );
        assert_eq!(
            passes_on("_Znam"),
            Some(PassesOn::TailJump("_Znwm".to_owned()))
        );
        assert_eq!(
            passes_on("_ZdlPv"),
            Some(PassesOn::TailJump("free".to_owned()))
        );
    }

    /// glibc's own functions serve their calls: none passes them on.
    #[test]
    fn glibc_malloc_serves_its_calls() {
        let data = fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("glibc is installed");
        let found = function_offsets(
            &data,
            SymbolTables::Dynamic,
            &hooked_functions().collect::<Vec<_>>(),
        )
        .unwrap();
        for function in ["malloc", "free", "calloc", "realloc"] {
            let passes_on = found
                .iter()
                .find(|found| found.function.name == function)
                .map(|found| &found.passes_on);
            assert!(
                matches!(passes_on, Some(PassesOn::No | PassesOn::ServesSome(_))),
                "{function}: {passes_on:?}"
            );
        }
    }

    #[test]
    fn non_elf_has_no_allocators() {
        assert!(
            allocator_offsets(
                b"#!/bin/sh\n",
                SymbolTables::DynamicAndFull,
                Forwarding::TailJumpsAndCalls
            )
            .unwrap()
            .is_empty()
        );
    }
}
