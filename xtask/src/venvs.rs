//! Python virtual environments from PyPI under target/, each made from
//! Debian's python3.11 (the interpreter whose layout tracer's tests know):
//!
//! - `numpy2` (every `cargo xtask setup`, ~20 MB): numpy 2, whose allocation
//!   paths differ from Debian's numpy 1.24 (tests/sampling.rs checks that
//!   sampled runs keep its blocks);
//! - `ml/torch` and `ml/tf` (`cargo xtask setup --ml` only, about 8 GB and
//!   10 minutes; never in CI): the real ML stacks tracer is measured on,
//!   PyPI's torch + transformers + iree-turbine, and tensorflow-cpu
//!   (`cargo xtask bench` runs their rows when they exist).
//!
//! The versions are pinned: the figures in docs/performance.md were
//! measured on them. A venv is made again when its list changes (a marker
//! file in it keeps the list it was made with).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::shell::Shell;

/// One venv: where under target/, and what it holds.
pub struct Venv {
    pub dir: &'static str,
    pub packages: &'static [&'static str],
}

/// numpy 2, for the sampling test.
pub const NUMPY2: Venv = Venv {
    dir: "venv-numpy2",
    packages: &["numpy==2.4.6"],
};

/// PyPI torch (with its CUDA libraries: the wheel PyPI serves), transformers
/// and iree-turbine: the S1 export loop
/// (tests/fixtures/python/ml/s1_export_loop.py).
pub const ML_TORCH: Venv = Venv {
    dir: "ml/torch",
    packages: &[
        "torch==2.15.0",
        "transformers==5.25.0",
        "iree-turbine==3.9.0",
        "iree-base-compiler==3.13.0",
        "iree-base-runtime==3.13.0",
        "numpy==2.4.6",
    ],
};

/// tensorflow-cpu: the load loop (tests/fixtures/python/ml/tf_load_loop.py).
pub const ML_TF: Venv = Venv {
    dir: "ml/tf",
    packages: &["tensorflow-cpu==2.21.0"],
};

const BASE_PYTHON: &str = "/usr/bin/python3.11";
const MARKER: &str = ".tracer-packages";

impl Venv {
    pub fn path(&self, root: &Path) -> PathBuf {
        root.join("target").join(self.dir)
    }

    /// Its python3.
    pub fn python(&self, root: &Path) -> PathBuf {
        self.path(root).join("bin/python3")
    }

    /// Whether it was made with its current package list.
    pub fn is_ready(&self, root: &Path) -> bool {
        std::fs::read_to_string(self.path(root).join(MARKER))
            .is_ok_and(|made_with| made_with == self.packages.join("\n"))
    }

    /// Makes it (Debian's python3.11 -m venv, then pip from PyPI), unless
    /// it is ready.
    pub fn ensure(&self, shell: &Shell, root: &Path) -> Result<()> {
        let path = self.path(root);
        if self.is_ready(root) {
            eprintln!("xtask: venv {}: ready", path.display());
            return Ok(());
        }
        shell.run(shell.cmd(BASE_PYTHON).args(["-m", "venv"]).arg(&path))?;
        let pip = path.join("bin/pip");
        shell.run(
            shell
                .cmd(&pip)
                .args(["install", "--quiet", "--disable-pip-version-check"])
                .args(self.packages),
        )?;
        if !shell.is_dry_run() {
            std::fs::write(path.join(MARKER), self.packages.join("\n"))
                .with_context(|| format!("could not write {}", path.join(MARKER).display()))?;
        }
        Ok(())
    }
}
