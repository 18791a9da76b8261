//! CPython's allocator hooked (`--python-objects`): its functions are
//! allocator functions as any other (`symbols::python_object_sites_in`);
//! the Python runtime itself is `runtimes::python`.
use anyhow::Result;

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
