//! Where a Python environment keeps the CUDA libraries its programs may
//! load: NVIDIA's wheels (`nvidia-cuda-runtime-cu12`, `nvidia-cublas-cu12`,
//! ...) install them in `site-packages/nvidia/*/lib`, and PyTorch dlopens
//! them from there. Given to attach (`attach::sites::family::library_dirs`) for
//! the libraries hooked ahead of their mapping.
use std::path::{Path, PathBuf};

use crate::target_files;

/// `site-packages/nvidia/*/lib` and `dist-packages/nvidia/*/lib` of a
/// Python executable's prefix (a virtual environment or conda's, or the
/// system's `/usr` and `/usr/local`).
pub fn wheel_dirs(pid: u32, executable: &Path) -> Vec<PathBuf> {
    let is_python = executable
        .file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("python"));
    if !is_python {
        return Vec::new();
    }
    let prefix = executable
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/usr"));
    let mut lib_dirs = vec![prefix.join("lib")];
    lib_dirs.extend(["/usr/lib", "/usr/local/lib"].map(PathBuf::from));
    let mut dirs = Vec::new();
    for lib_dir in lib_dirs {
        for version in target_files::list_dir(pid, &lib_dir) {
            if !version.to_string_lossy().starts_with("python") {
                continue;
            }
            for packages in ["site-packages", "dist-packages"] {
                let nvidia = lib_dir.join(&version).join(packages).join("nvidia");
                dirs.extend(
                    target_files::list_dir(pid, &nvidia)
                        .into_iter()
                        .map(|wheel| nvidia.join(wheel).join("lib")),
                );
            }
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A virtual environment's wheel, found from its interpreter's path
    /// as the target sees it (its root: this process's), by attach too.
    #[test]
    fn a_venvs_nvidia_wheel_is_a_library_dir() {
        let venv = std::env::temp_dir().join(format!("tracer-wheels-{}", std::process::id()));
        let lib = venv.join("lib/python3.11/site-packages/nvidia/cuda_runtime/lib");
        std::fs::create_dir_all(&lib).unwrap();
        let python = venv.join("bin/python3.11");
        let pid = std::process::id();
        let found = wheel_dirs(pid, &python);
        crate::runtimes::register();
        let from_attach = crate::attach::sites::family::library_dirs(pid, &python);
        let not_python = wheel_dirs(pid, &venv.join("bin/node"));
        std::fs::remove_dir_all(&venv).unwrap();
        assert!(found.contains(&lib), "{found:?}");
        assert!(from_attach.contains(&lib), "{from_attach:?}");
        assert!(not_python.is_empty(), "{not_python:?}");
    }
}
