//! The torch workload (tests/fixtures/python/torch_models.py in Debian's
//! python3-torch), started the same way by every test that traces it.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Fixture, require_root, workspace_root};

/// The interpreter Debian's python3-torch is installed for.
pub const TORCH_PYTHON: &str = "/usr/bin/python3";
/// Debian's python3-torch, present when `cargo xtask setup` installed it.
pub const TORCH_PACKAGE: &str = "/usr/lib/python3/dist-packages/torch/__init__.py";
/// The fixture's file name, as Python frames name it.
pub const TORCH_SCRIPT: &str = "torch_models.py";

/// The fixture's path.
pub fn torch_script() -> PathBuf {
    workspace_root()
        .join("tests/fixtures/python")
        .join(TORCH_SCRIPT)
}

/// Starts the fixture (as root, with torch installed) and builds one
/// model before anything attaches: torch is loaded and a model is held.
pub fn start_torch_models() -> Fixture {
    require_root();
    assert!(
        Path::new(TORCH_PACKAGE).exists(),
        "Debian's python3-torch is missing ({TORCH_PACKAGE}): run `cargo xtask setup`"
    );
    let mut command = Command::new(TORCH_PYTHON);
    command.arg(torch_script());
    let mut fixture = Fixture::start_command(command);
    fixture.cmd("build 1");
    fixture
}
