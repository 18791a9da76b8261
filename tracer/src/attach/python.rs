//! The kernel's Python maps (`tracer-ebpf/src/python.rs`): turning the
//! Python-frame walk on for a process, its threads' thread states, and the
//! Python stacks the walk stored.
use anyhow::{Context as _, Result};
use aya::maps::{Array, HashMap as KernelHashMap, MapData};
use tracer_ebpf::{PythonOffsets, PythonThreadMiss, map, python_setting};

use super::{
    NoticedBy, Probes,
    symbols::{function_size, python_object_sites_in},
};

/// The size above which `PyObject_Malloc` holds pymalloc itself rather
/// than a jump through CPython's allocator table: 27 to 35 bytes in
/// every CPython 3.10-3.13 built without LTO seen (pyenv's, Debian's
/// libpython3.11.so), 247 in Debian's /usr/bin/python3.11 (LTO), whose
/// callers carry the same inlined copy and call it for few objects.
const THIN_WRAPPER_BYTES: u64 = 64;

/// CPython's allocator functions hooked in one interpreter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonObjectHooks {
    /// The names hooked.
    pub functions: Vec<&'static str>,
    /// The size of `PyObject_Malloc` when it holds pymalloc inlined (an
    /// LTO build: most objects are allocated without calling it).
    pub inlined_bytes: Option<u64>,
}

impl Probes {
    /// Hooks CPython's allocator functions in `object` (the interpreter
    /// `pid` runs) for `--python-objects`.
    pub fn attach_python_objects(
        &mut self,
        pid: u32,
        object: &std::path::Path,
        noticed_by: NoticedBy,
    ) -> Result<PythonObjectHooks> {
        let sites = python_object_sites_in(pid, object)?;
        let Some(malloc) = sites
            .iter()
            .find(|site| site.function.name == "PyObject_Malloc")
        else {
            anyhow::bail!("{} defines no PyObject_Malloc", object.display());
        };
        let inlined_bytes = function_size(pid, &malloc.path, "PyObject_Malloc")
            .filter(|&size| size > THIN_WRAPPER_BYTES);
        self.attach_sites(pid, &sites, noticed_by)?;
        Ok(PythonObjectHooks {
            functions: sites.iter().map(|site| site.function.name).collect(),
            inlined_bytes,
        })
    }

    /// Walks the Python frames of `pid`'s threads from now on, laid out as
    /// `offsets`, up to `depth` frames per stack.
    pub fn start_python(&mut self, pid: u32, offsets: PythonOffsets, depth: u32) -> Result<()> {
        let mut per_process: KernelHashMap<_, u32, PythonOffsets> = KernelHashMap::try_from(
            self.ebpf
                .map_mut(map::PYTHON_OFFSETS)
                .context("eBPF object lacks PYTHON_OFFSETS")?,
        )?;
        per_process
            .insert(pid, offsets, 0)
            .with_context(|| format!("could not ask for the Python frames of PID {pid}"))?;
        let mut settings: Array<_, u32> = Array::try_from(
            self.ebpf
                .map_mut(map::PYTHON_ON)
                .context("eBPF object lacks PYTHON_ON")?,
        )?;
        settings.set(python_setting::DEPTH, depth, 0)?;
        settings.set(python_setting::ON, 1, 0)?;
        Ok(())
    }

    /// Makes the kernel's thread states of `pid` those of `threads`
    /// (thread id, `PyThreadState` address); `known` are the thread ids
    /// set before, for `pid`, removed when they are gone.
    pub fn set_python_threads(&mut self, threads: &[(u32, u64)], gone: &[u32]) -> Result<()> {
        let mut map: KernelHashMap<_, u32, u64> = KernelHashMap::try_from(
            self.ebpf
                .map_mut(map::PYTHON_THREADS)
                .context("eBPF object lacks PYTHON_THREADS")?,
        )?;
        for tid in gone {
            let _ = map.remove(tid);
        }
        for &(tid, thread_state) in threads {
            if map.get(&tid, 0).ok() != Some(thread_state) {
                map.insert(tid, thread_state, 0)
                    .context("could not store a Python thread state")?;
            }
        }
        Ok(())
    }

    /// The threads whose thread state the kernel holds (userspace's and
    /// those the kernel found itself).
    pub fn python_threads(&self) -> Vec<u32> {
        self.ebpf
            .map(map::PYTHON_THREADS)
            .and_then(|map| KernelHashMap::<&MapData, u32, u64>::try_from(map).ok())
            .map(|threads| threads.keys().filter_map(Result::ok).collect())
            .unwrap_or_default()
    }

    /// The threads of Python processes whose allocations got native
    /// frames only (thread state not found then), with how many.
    pub fn python_missed(&self) -> Vec<(u32, u64)> {
        self.ebpf
            .map(map::PYTHON_MISSED)
            .and_then(|map| KernelHashMap::<&MapData, u32, PythonThreadMiss>::try_from(map).ok())
            .map(|missed| {
                missed
                    .iter()
                    .filter_map(Result::ok)
                    .map(|(tid, miss)| (tid, miss.allocations))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debian's libpython3.11.so jumps through the allocator table; its
    /// /usr/bin/python3.11 (LTO) holds pymalloc in PyObject_Malloc.
    #[test]
    fn debian_lto_python_is_told_from_its_shared_library() {
        let size = |path: &str| {
            function_size(
                std::process::id(),
                std::path::Path::new(path),
                "PyObject_Malloc",
            )
            .unwrap_or_else(|| panic!("{path}: no PyObject_Malloc (cargo xtask setup)"))
        };
        let shared = size("/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0");
        let lto = size("/usr/bin/python3.11");
        assert!(shared <= THIN_WRAPPER_BYTES, "{shared}");
        assert!(lto > THIN_WRAPPER_BYTES, "{lto}");
    }
}
