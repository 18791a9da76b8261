//! Names of the memory outside traced blocks that holds pointers: a
//! module's globals by symbol (the ELF symbol tables, data objects only,
//! C++ names demangled), the module by file name, and the other mappings
//! by what /proc/PID/maps calls them.
use std::collections::HashMap;

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _, SymbolKind};

use super::memory::MapsLine;

/// A mapped ELF object: where it was loaded and its data symbols.
pub struct Module {
    /// Its file name (`libc.so.6`).
    pub name: String,
    /// Its path, as the target sees it.
    pub path: String,
    /// What its ELF addresses are moved by where it is loaded.
    pub bias: u64,
    /// Addresses from its first load segment to the end of its last,
    /// `.bss` included (an anonymous mapping after the file's own).
    pub start: u64,
    pub end: u64,
    /// (start, end, name) of each data object, as loaded, sorted.
    symbols: Vec<(u64, u64, String)>,
}

/// The mapped objects of one process.
#[derive(Default)]
pub struct Globals {
    modules: Vec<Module>,
}

impl Globals {
    /// Reads the symbol tables of the objects `regions` maps (through
    /// /proc/PID/root); an object that cannot be read names no symbol.
    pub fn load(pid: u32, regions: &[MapsLine]) -> Globals {
        let mut modules: Vec<Module> = first_mappings(regions)
            .into_iter()
            .filter_map(|(path, region)| load_module(pid, path, region))
            .collect();
        modules.sort_by_key(|module| module.start);
        Globals { modules }
    }

    /// The mapped objects, by load address.
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    fn module_at(&self, address: u64) -> Option<&Module> {
        let after = self
            .modules
            .partition_point(|module| module.start <= address);
        let module = &self.modules[after.checked_sub(1)?];
        (address < module.end).then_some(module)
    }

    /// `regions` with each anonymous one that begins inside a module and
    /// goes on past its end cut there. A module's `.bss` is an anonymous mapping,
    /// and the kernel merges an anonymous mapping made right after it (a
    /// pymalloc arena, a chunk malloc mapped) into the same region: that
    /// part is no module's data.
    pub fn split_at_module_ends(&self, regions: Vec<MapsLine>) -> Vec<MapsLine> {
        let mut split = Vec::with_capacity(regions.len());
        for region in regions {
            // The module's last page is its own to the page's end.
            let end = self
                .module_at(region.start)
                .map(|module| module.end.next_multiple_of(4096));
            match end {
                Some(end) if end < region.end && region.name.is_empty() => {
                    let rest = MapsLine {
                        start: end,
                        ..region.clone()
                    };
                    split.push(MapsLine { end, ..region });
                    split.push(rest);
                }
                _ => split.push(region),
            }
        }
        split
    }

    /// The file name of the module whose load range holds `address`.
    pub fn module_name(&self, address: u64) -> Option<&str> {
        self.module_at(address).map(|module| module.name.as_str())
    }

    /// The data object at `address` and its module, e.g.
    /// (`g_list`, `holders`).
    #[cfg(test)]
    pub fn symbol(&self, address: u64) -> Option<(&str, &str)> {
        self.symbol_range(address)
            .map(|(_, _, name, module)| (name, module))
    }

    /// [`Globals::symbol`] with the object's address range.
    pub fn symbol_range(&self, address: u64) -> Option<(u64, u64, &str, &str)> {
        let module = self.module_at(address)?;
        let after = module
            .symbols
            .partition_point(|(start, _, _)| *start <= address);
        let (start, end, name) = module.symbols.get(after.checked_sub(1)?)?;
        (address < *end).then_some((*start, *end, name.as_str(), module.name.as_str()))
    }

    /// The address of the data object `name` in the first module that
    /// defines it (`PyType_Type`).
    pub fn symbol_address(&self, name: &str) -> Option<u64> {
        self.modules.iter().find_map(|module| {
            module
                .symbols
                .iter()
                .find(|(_, _, symbol)| symbol == name)
                .map(|(start, _, _)| *start)
        })
    }

    /// The class whose vtable `address` points into (a C++ object's
    /// first word): `Kernel` for an address in `vtable for Kernel`.
    pub fn vtable_class(&self, address: u64) -> Option<&str> {
        let (_, _, symbol, _) = self.symbol_range(address)?;
        vtable_class(symbol)
    }
}

/// Each mapped object's first load segment, by path: the mapping at file
/// offset 0 that starts its executable mapping's run. A process may also
/// map a loaded object's file whole and read-only (a profiler, a linker,
/// tracer's own tests reading libc), below or above the object itself;
/// that copy is no module. A file mapped without code (data only) is
/// taken at its lowest mapping at offset 0.
fn first_mappings(regions: &[MapsLine]) -> Vec<(&str, &MapsLine)> {
    let mut first_of: HashMap<&str, &MapsLine> = HashMap::new();
    let mut code_of: HashMap<&str, u64> = HashMap::new();
    for region in regions.iter().filter(|region| region.is_file()) {
        if region.executable {
            code_of
                .entry(region.name.as_str())
                .and_modify(|code| *code = (*code).min(region.start))
                .or_insert(region.start);
        }
    }
    for region in regions
        .iter()
        .filter(|region| region.is_file() && region.file_offset == 0)
    {
        let code = code_of.get(region.name.as_str()).copied();
        // Before its code: the nearest such mapping below it wins.
        let better = |first: &&MapsLine| match code {
            Some(code) if region.start <= code => first.start > code || region.start > first.start,
            Some(_) => false,
            None => region.start < first.start,
        };
        first_of
            .entry(region.name.as_str())
            .and_modify(|first| {
                if better(first) {
                    *first = region;
                }
            })
            .or_insert(region);
    }
    first_of.into_iter().collect()
}

fn load_module(pid: u32, path: &str, first: &MapsLine) -> Option<Module> {
    let file = crate::target_files::open_mapped_at(
        pid,
        first.start..first.end,
        std::path::Path::new(path),
    )
    .ok()?;
    // SAFETY: the map is read-only and only parsed; a file changed under
    // it gives wrong names (a truncated one zeros: `target_files::sigbus`).
    let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*data).ok()?;
    let loads: Vec<(u64, u64, u64)> = elf
        .segments()
        .map(|segment| {
            let (offset, _) = segment.file_range();
            (segment.address(), segment.size(), offset)
        })
        .collect();
    // The mapping at file offset 0 is the first load segment's.
    let &(first_address, _, first_offset) = loads.iter().min_by_key(|(address, _, _)| *address)?;
    let bias = first
        .start
        .wrapping_sub(first_address)
        .wrapping_add(first_offset);
    let end = loads
        .iter()
        .map(|(address, size, _)| address.saturating_add(*size))
        .max()?;
    let mut symbols: Vec<(u64, u64, String)> = elf
        .symbols()
        .chain(elf.dynamic_symbols())
        .filter(|symbol| symbol.kind() == SymbolKind::Data && symbol.size() > 0)
        .filter_map(|symbol| {
            let start = symbol.address().wrapping_add(bias);
            Some((
                start,
                start.saturating_add(symbol.size()),
                demangle(symbol.name().ok()?),
            ))
        })
        .collect();
    symbols.sort();
    symbols.dedup_by_key(|(start, _, _)| *start);
    Some(Module {
        name: path.rsplit('/').next().unwrap_or(path).to_owned(),
        path: path.to_owned(),
        bias,
        start: first.start,
        end: end.wrapping_add(bias),
        symbols,
    })
}

/// A C++ or Rust name demangled (`(anonymous namespace)::cache`,
/// `rust_leak::CACHE`, without Rust's hash and LLVM's suffix); others as
/// they are.
fn demangle(name: &str) -> String {
    if is_rust_symbol(name)
        && let Ok(symbol) =
            rustc_demangle::try_demangle(name.split_once('.').map_or(name, |(name, _)| name))
    {
        return format!("{symbol:#}");
    }
    if name.starts_with("_Z")
        && let Ok(symbol) = cpp_demangle::Symbol::new(name)
        && let Ok(demangled) = symbol.demangle()
    {
        return demangled;
    }
    name.to_owned()
}

/// Rust's v0 mangling (`_R`), or its legacy one: an Itanium path whose
/// last element is the hash, `17h` and 16 hex digits (before a suffix
/// LLVM may add: `.0`, `.llvm.123`).
fn is_rust_symbol(name: &str) -> bool {
    if name.starts_with("_R") {
        return true;
    }
    let name = name.split_once('.').map_or(name, |(name, _)| name);
    let Some(path) = name
        .strip_prefix("_ZN")
        .and_then(|rest| rest.strip_suffix('E'))
    else {
        return false;
    };
    let path = path.as_bytes();
    path.len() > 19
        && path[path.len() - 19..]
            .strip_prefix(b"17h")
            .is_some_and(|hash| hash.iter().all(u8::is_ascii_hexdigit))
}

/// The class of a demangled vtable symbol: cpp_demangle writes `_ZTV`
/// symbols as `{vtable(CLASS)}`, c++filt as `vtable for CLASS`.
fn vtable_class(symbol: &str) -> Option<&str> {
    symbol
        .strip_prefix("{vtable(")
        .and_then(|rest| rest.strip_suffix(")}"))
        .or_else(|| symbol.strip_prefix("vtable for "))
}

/// What a mapping outside any module is called in a report:
/// `[heap]`, `anonymous mapping 0x7f..`, or its path.
pub fn mapping_name(region: &MapsLine) -> String {
    if region.name.is_empty() {
        format!("anonymous mapping {:#x}", region.start)
    } else {
        region.name.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holders::memory::parse_regions;

    #[test]
    fn a_loaded_object_is_told_from_a_whole_file_map_of_it() {
        // libc mapped whole and read-only below and above the loaded one
        // (an earlier and a later mmap of the file), and a data-only file.
        let regions = parse_regions(
            "7f0000000000-7f00001e0000 r--s 00000000 fe:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1000000000-7f1000026000 r--p 00000000 fe:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1000026000-7f100017b000 r-xp 00026000 fe:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6
7f100017b000-7f10001ce000 r--p 0017b000 fe:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6
7f10001d2000-7f10001d4000 rw-p 001d2000 fe:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6
7f2000000000-7f20001e0000 r--p 00000000 fe:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6
7f3000000000-7f3000001000 r--p 00000000 fe:01 13 /data/table.bin
7f3000004000-7f3000005000 r--p 00000000 fe:01 13 /data/table.bin
",
        );
        let mut firsts: Vec<(&str, u64)> = first_mappings(&regions)
            .into_iter()
            .map(|(path, region)| (path, region.start))
            .collect();
        firsts.sort();
        assert_eq!(
            firsts,
            [
                ("/data/table.bin", 0x7f30_0000_0000),
                ("/usr/lib/x86_64-linux-gnu/libc.so.6", 0x7f10_0000_0000),
            ]
        );
    }

    #[test]
    fn an_arena_merged_into_a_modules_bss_is_no_module_data() {
        // libc's `.bss` ends inside the page at 0x..1d4000; a 1 MiB
        // anonymous mapping made right after it shares its region.
        let globals = Globals {
            modules: vec![Module {
                name: "libc.so.6".to_owned(),
                path: "/usr/lib/x86_64-linux-gnu/libc.so.6".to_owned(),
                bias: 0x7f10_0000_0000,
                start: 0x7f10_0000_0000,
                end: 0x7f10_001d_4800,
                symbols: Vec::new(),
            }],
        };
        let regions = parse_regions(
            "7f1000000000-7f1000026000 r--p 00000000 fe:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6
7f10001d2000-7f10001d4000 rw-p 001d2000 fe:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6
7f10001d4000-7f10002d5000 rw-p 00000000 00:00 0
7f3000000000-7f3000100000 rw-p 00000000 00:00 0
",
        );
        let split = globals.split_at_module_ends(regions.clone());
        let spans: Vec<(u64, u64, Option<&str>)> = split
            .iter()
            .map(|region| (region.start, region.end, globals.module_name(region.start)))
            .collect();
        assert_eq!(
            spans,
            [
                (0x7f10_0000_0000, 0x7f10_0002_6000, Some("libc.so.6")),
                (0x7f10_001d_2000, 0x7f10_001d_4000, Some("libc.so.6")),
                (0x7f10_001d_4000, 0x7f10_001d_5000, Some("libc.so.6")),
                (0x7f10_001d_5000, 0x7f10_002d_5000, None),
                (0x7f30_0000_0000, 0x7f30_0010_0000, None),
            ]
        );
        assert!(split[3].name.is_empty() && split[3].writable);
        // A region that is the module's alone is left whole.
        assert_eq!(
            globals.split_at_module_ends(regions[..2].to_vec()),
            regions[..2]
        );
    }

    #[test]
    fn demangles_cpp_names_and_keeps_c_names() {
        assert_eq!(demangle("g_list"), "g_list");
        assert_eq!(
            demangle("_ZN12_GLOBAL__N_15cacheE"),
            "(anonymous namespace)::cache"
        );
        assert_eq!(
            vtable_class(&demangle("_ZTVN12_GLOBAL__N_16KernelE")),
            Some("(anonymous namespace)::Kernel")
        );
        assert_eq!(vtable_class(&demangle("_ZTV6Kernel")), Some("Kernel"));
        assert_eq!(
            demangle("_ZN9rust_leak5CACHE17h3f2e6169f8534970E"),
            "rust_leak::CACHE"
        );
        assert_eq!(
            demangle("_ZN9rust_leak8LAST_BOX17hebc193a96def642bE.0"),
            "rust_leak::LAST_BOX"
        );
        assert_eq!(demangle("_ZN3foo3barE"), "foo::bar", "C++, no hash");
        assert_eq!(vtable_class(&demangle("_ZN12_GLOBAL__N_15cacheE")), None);
    }

    #[test]
    fn names_own_globals_by_symbol_and_module() {
        static NAMED_BY_THE_TEST: std::sync::atomic::AtomicU64 =
            std::sync::atomic::AtomicU64::new(1);
        let pid = std::process::id();
        let regions = super::super::memory::regions(pid).unwrap();
        let globals = Globals::load(pid, &regions);
        let address = &NAMED_BY_THE_TEST as *const _ as u64;
        let (symbol, module) = globals.symbol(address).expect("a symbol");
        assert!(symbol.contains("NAMED_BY_THE_TEST"), "{symbol}");
        let exe = std::env::current_exe().unwrap();
        assert_eq!(module, exe.file_name().unwrap().to_str().unwrap());
        assert_eq!(
            globals.module_name(address + 1),
            Some(module),
            "inside the module's range"
        );
    }
}
