//! Libraries hooked ahead of their mapping: uprobes are registered on a
//! file (its inode), so probes attached for a process before it maps the
//! file take effect the moment it does, and the first call after a
//! `dlopen` is counted (frameworks dlopen the CUDA runtime and allocate
//! their largest region right after). Without this, a library is hooked
//! when its mapping is noticed (`libraries`), a few milliseconds late.
//!
//! The candidates are the CUDA and allocator libraries the target could
//! load: those in the RUNPATH/RPATH of its executable and of every object
//! it maps (the loader searches the calling object's; `$ORIGIN`, `$LIB`
//! and `$PLATFORM` expanded as the loader does), and in those of the
//! candidates themselves (libcudart's `$ORIGIN` finds libcuda), in its
//! LD_LIBRARY_PATH
//! (/proc/PID/environ) and in the directories a runtime installs them in
//! (`family::library_dirs`: Python's nvidia wheels), and the CUDA
//! libraries of the loader cache (allocators installed system-wide are
//! linked or preloaded, hence mapped before attach, and hooking every one
//! installed would cost every target their probes). Paths are opened
//! inside the target's root (`target_files`), so a container's own files
//! are found and no host file is, and each file's probes are attached by
//! the descriptor it was read through (`symbols::SiteFile`), not by its
//! path again, so a swap after the read cannot move them into another
//! file; the loader cache is read by tracer
//! (`target_files::ld_cache`), not by the host's `ldconfig`. An object
//! gives at most [`MAX_RUN_PATH_DIRS`] directories.
use std::{
    fs,
    path::{Path, PathBuf},
};

use object::read::elf::{Dyn as _, FileHeader as _};

use crate::{procfs::Mapping, target_files};

/// The most RUNPATH/RPATH directories taken from one object.
pub const MAX_RUN_PATH_DIRS: usize = 64;
/// The longest RUNPATH/RPATH directory kept (the kernel's PATH_MAX).
const MAX_DIR_BYTES: usize = 4096;

/// File names (up to the first dot of the version) of the libraries worth
/// hooking ahead: the CUDA runtime and driver, and the allocators.
const LIBRARY_PREFIXES: [&str; 5] = [
    "libcudart.so",
    "libcuda.so",
    "libjemalloc.so",
    "libtcmalloc",
    "libmimalloc.so",
];

/// The CUDA libraries among them: the ones taken from the loader cache.
const CUDA_PREFIXES: [&str; 2] = ["libcudart.so", "libcuda.so"];

/// Whether a file name is one of [`LIBRARY_PREFIXES`]'s libraries.
pub fn is_candidate_name(file_name: &str) -> bool {
    LIBRARY_PREFIXES
        .iter()
        .any(|prefix| file_name.starts_with(prefix) && file_name.contains(".so"))
}

/// The candidate libraries of `pid` that it has not mapped (`maps`), as
/// the target sees them (symbolic links resolved), without repeats.
pub fn candidates(pid: u32, maps: &[Mapping]) -> Vec<PathBuf> {
    let executable = fs::read_link(format!("/proc/{pid}/exe")).ok();
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(executable) = &executable {
        dirs.extend(run_paths(pid, executable));
        dirs.extend(crate::attach::sites::family::library_dirs(pid, executable));
    }
    let mut objects: Vec<&Path> = maps
        .iter()
        .filter(|mapping| mapping.executable)
        .map(|mapping| mapping.path.as_path())
        .filter(|path| Some(*path) != executable.as_deref())
        .collect();
    objects.sort();
    objects.dedup();
    for object in objects {
        dirs.extend(run_paths(pid, object));
    }
    dirs.extend(library_path(pid));
    let found = |dirs: &[PathBuf]| -> Vec<PathBuf> {
        dirs.iter()
            .flat_map(|dir| files_in(pid, dir))
            .filter_map(|path| resolve(pid, &path))
            .collect()
    };
    let mut files: Vec<PathBuf> = found(&dirs);
    files.extend(
        loader_cache(pid)
            .iter()
            .filter_map(|path| resolve(pid, path)),
    );
    // The candidates' own RUNPATHs: the libraries they load in turn.
    let their_dirs: Vec<PathBuf> = files
        .iter()
        .flat_map(|file| run_paths(pid, file))
        .filter(|dir| !dirs.contains(dir))
        .collect();
    files.extend(found(&their_dirs));
    files.retain(|path| !maps.iter().any(|mapping| mapping.path == *path));
    files.sort();
    files.dedup();
    files
}

/// The target's path with its symbolic links resolved inside its root.
/// A plain `canonicalize` of `/proc/PID/root/...` would not do: the kernel
/// resolves an absolute link met on the way from tracer's root, so a
/// container's `ln -s /dev/watchdog x.so` would name a host file.
/// `openat2(RESOLVE_IN_ROOT)` resolves every link inside the target's
/// root.
pub(in crate::attach) fn resolve(pid: u32, path: &Path) -> Option<PathBuf> {
    target_files::resolve_in_root(pid, path)
}

/// The candidate libraries in `dir` (a path as the target sees it).
fn files_in(pid: u32, dir: &Path) -> Vec<PathBuf> {
    target_files::list_dir(pid, dir)
        .into_iter()
        .filter(|name| name.to_str().is_some_and(is_candidate_name))
        .map(|name| dir.join(name))
        .collect()
}

/// The directories of an object's DT_RUNPATH and DT_RPATH, with the
/// loader's dynamic string tokens expanded (`expand_tokens`). The file is
/// mapped, not read: only its headers and dynamic section are touched
/// (reading every object whole put libtorch_cpu's 115 MiB in tracer's
/// resident memory at attach).
fn run_paths(pid: u32, object: &Path) -> Vec<PathBuf> {
    let Ok(file) = target_files::open_in_root(pid, object) else {
        return Vec::new();
    };
    // SAFETY: the map is only read; a file truncated underneath reads as
    // zeros past its end (`target_files::sigbus`).
    let Ok(data) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return Vec::new();
    };
    run_paths_in(&data, object.parent().unwrap_or(Path::new("/")))
}

/// The directories of the DT_RUNPATH and DT_RPATH of the ELF file `data`
/// whose directory is `origin`, within the caps.
pub fn run_paths_in(data: &[u8], origin: &Path) -> Vec<PathBuf> {
    dynamic_paths(data)
        .unwrap_or_default()
        .iter()
        .flat_map(|paths| paths.split(':'))
        .filter(|dir| !dir.is_empty() && dir.len() <= MAX_DIR_BYTES)
        .take(MAX_RUN_PATH_DIRS)
        .map(|dir| PathBuf::from(expand_tokens(dir, origin)))
        .filter(|dir| dir.is_absolute())
        .collect()
}

/// `$ORIGIN` (the object's directory), `$LIB` and `$PLATFORM` (as glibc
/// expands them on x86-64 Debian: `lib/x86_64-linux-gnu`, `x86_64`), bare
/// or in braces.
fn expand_tokens(dir: &str, origin: &Path) -> String {
    let origin = origin.to_string_lossy();
    [
        ("ORIGIN", origin.as_ref()),
        ("LIB", LIB_TOKEN),
        ("PLATFORM", PLATFORM_TOKEN),
    ]
    .iter()
    .fold(dir.to_owned(), |dir, (token, value)| {
        dir.replace(&format!("${{{token}}}"), value)
            .replace(&format!("${token}"), value)
    })
}

/// What glibc's loader puts for `$LIB` and `$PLATFORM` here.
const LIB_TOKEN: &str = "lib/x86_64-linux-gnu";
const PLATFORM_TOKEN: &str = "x86_64";

/// The DT_RUNPATH and DT_RPATH strings of a 64-bit ELF file.
fn dynamic_paths(data: &[u8]) -> object::read::Result<Vec<String>> {
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data)?;
    let endian = header.endian()?;
    let sections = header.sections(endian, data)?;
    let Some((entries, index)) = sections.dynamic(endian, data)? else {
        return Ok(Vec::new());
    };
    // `index` is already the linked string table.
    let strings = sections.strings(endian, data, index)?;
    Ok(entries
        .iter()
        .filter(|entry| {
            matches!(
                entry.tag32(endian),
                Some(object::elf::DT_RUNPATH | object::elf::DT_RPATH)
            )
        })
        .filter_map(|entry| entry.string(endian, strings).ok())
        .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
        .collect())
}

/// The target's LD_LIBRARY_PATH directories.
fn library_path(pid: u32) -> Vec<PathBuf> {
    let Ok(environ) = fs::read(format!("/proc/{pid}/environ")) else {
        return Vec::new();
    };
    environ
        .split(|&byte| byte == 0)
        .filter_map(|variable| variable.strip_prefix(b"LD_LIBRARY_PATH="))
        .flat_map(|value| value.split(|&byte| byte == b':'))
        .filter(|dir| dir.first() == Some(&b'/'))
        .map(|dir| PathBuf::from(String::from_utf8_lossy(dir).into_owned()))
        .collect()
}

/// The candidate libraries the target's loader cache knows (its
/// /etc/ld.so.cache).
fn loader_cache(pid: u32) -> Vec<PathBuf> {
    target_files::ld_cache::read(pid)
        .unwrap_or_default()
        .into_iter()
        .filter(|library| {
            let is_cuda = CUDA_PREFIXES
                .iter()
                .any(|prefix| library.name.starts_with(prefix));
            is_cuda && is_candidate_name(&library.name)
        })
        .map(|library| library.path)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_tokens_are_expanded_as_glibc_does() {
        let origin = Path::new("/opt/app/bin");
        assert_eq!(
            expand_tokens("$ORIGIN/../lib:${ORIGIN}/cuda", origin),
            "/opt/app/bin/../lib:/opt/app/bin/cuda"
        );
        assert_eq!(
            expand_tokens("/opt/$LIB/nvidia:/opt/${PLATFORM}", origin),
            "/opt/lib/x86_64-linux-gnu/nvidia:/opt/x86_64"
        );
    }

    #[test]
    fn candidates_are_cuda_and_allocator_libraries() {
        for name in [
            "libcudart.so.12",
            "libcuda.so.1",
            "libjemalloc.so.2",
            "libtcmalloc_minimal.so.4",
        ] {
            assert!(is_candidate_name(name), "{name}");
        }
        for name in [
            "libc.so.6",
            "libcudnn.so.9",
            "libcuda_stub.a",
            "libcudart_static.a",
        ] {
            assert!(!is_candidate_name(name), "{name}");
        }
    }

    #[test]
    fn reads_the_runpath_of_an_elf_file() {
        // A program linked here with a runpath, and this test binary, which
        // has none.
        let dir = std::env::temp_dir().join(format!("tracer-runpath-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let (source, program) = (dir.join("main.c"), dir.join("main"));
        fs::write(&source, "int main(void) { return 0; }\n").unwrap();
        let status = std::process::Command::new("cc")
            .arg(&source)
            .arg("-o")
            .arg(&program)
            .arg("-Wl,--enable-new-dtags,-rpath,/opt/one:$ORIGIN/../lib")
            .status()
            .expect("cc runs");
        assert!(status.success(), "cc failed: {status}");
        let data = fs::read(&program).unwrap();
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(dynamic_paths(&data).unwrap(), ["/opt/one:$ORIGIN/../lib"]);
        let data = fs::read("/proc/self/exe").unwrap();
        assert_eq!(dynamic_paths(&data).unwrap(), Vec::<String>::new());
    }
}
