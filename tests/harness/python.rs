//! The Python fixtures (tests/fixtures/python), started the one way every
//! test starts them: under Debian's python3.11, or inside its libpython3.11
//! (tests/fixtures/embed_script.c), both installed by `cargo xtask setup`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Fixture, fixture, require_root, workspace_root};

/// Debian's python3.11 (built with LTO: pymalloc is inlined into its
/// callers).
pub const PYTHON: &str = "/usr/bin/python3.11";
/// Debian's libpython3.11, which calls CPython's allocator for every
/// object.
pub const LIBPYTHON: &str = "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0";

/// The path of `file` under tests/fixtures/python.
pub fn python_script(file: &str) -> PathBuf {
    workspace_root().join("tests/fixtures/python").join(file)
}

/// The line of `file` (under tests/fixtures/python) holding `marker`.
pub fn python_line(file: &str, marker: &str) -> i64 {
    super::marked_line(&python_script(file), marker)
}

/// Starts `script` (under tests/fixtures/python) under [`PYTHON`] with
/// more environment variables `env`, and waits for its `ready` line.
pub fn start_python(script: &str, env: &[(&str, &str)]) -> Fixture {
    start_script(PYTHON, Command::new(PYTHON), script, env)
}

/// Starts `script` (under tests/fixtures/python) under the numpy 2 venv
/// `cargo xtask setup` makes (target/venv-numpy2: PyPI numpy, whose array
/// data comes from PyDataMem_UserNEW), and waits for its `ready` line.
pub fn start_numpy2(script: &str) -> Fixture {
    let python = workspace_root().join("target/venv-numpy2/bin/python");
    let needs = python.to_string_lossy().into_owned();
    start_script(&needs, Command::new(&python), script, &[])
}

/// Starts `script` (under tests/fixtures/python) inside [`LIBPYTHON`],
/// dlopen()ed by tests/fixtures/embed_script.c, and waits for its `ready`
/// line.
pub fn start_embedded(script: &str) -> Fixture {
    start_script(
        LIBPYTHON,
        Command::new(fixture("embed_script")),
        script,
        &[],
    )
}

fn start_script(needs: &str, mut command: Command, script: &str, env: &[(&str, &str)]) -> Fixture {
    require_root();
    assert!(
        Path::new(needs).exists(),
        "{needs} is missing: run `cargo xtask setup`"
    );
    command.arg(python_script(script)).envs(env.iter().copied());
    Fixture::start_command(command)
}
