//! Running external commands the same way everywhere: print the command line
//! first, fail with one line that names the command, and honour `--dry-run`
//! for everything that changes the machine.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

/// Runs commands for the xtask steps.
pub struct Shell {
    /// Print what would change the machine instead of doing it.
    dry_run: bool,
    /// Directories put in front of PATH for every command (a bpf-linker
    /// installed into a cargo bin directory that PATH lacks).
    extra_path_dirs: Vec<PathBuf>,
}

impl Shell {
    pub fn new(dry_run: bool) -> Self {
        Self {
            dry_run,
            extra_path_dirs: Vec::new(),
        }
    }

    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    /// Puts `dir` in front of PATH for every later command.
    pub fn prepend_path(&mut self, dir: PathBuf) {
        if !self.extra_path_dirs.contains(&dir) {
            self.extra_path_dirs.push(dir);
        }
    }

    /// A command for `program` with this shell's PATH.
    pub fn cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        if !self.extra_path_dirs.is_empty() {
            let current = std::env::var_os("PATH").unwrap_or_default();
            let dirs = self
                .extra_path_dirs
                .iter()
                .cloned()
                .chain(std::env::split_paths(&current));
            if let Ok(path) = std::env::join_paths(dirs) {
                command.env("PATH", path);
            }
        }
        command
    }

    /// Runs a command that changes the machine (skipped under `--dry-run`),
    /// with inherited stdio.
    pub fn run(&self, command: &mut Command) -> Result<()> {
        let line = display(command);
        if self.dry_run {
            eprintln!("xtask: would run: {line}");
            return Ok(());
        }
        eprintln!("$ {line}");
        let status = command
            .status()
            .with_context(|| format!("could not start `{line}`"))?;
        if !status.success() {
            bail!("`{line}` failed: {status}");
        }
        Ok(())
    }

    /// Runs a command that only looks (also under `--dry-run`) and returns
    /// its trimmed stdout.
    pub fn read(&self, command: &mut Command) -> Result<String> {
        let line = display(command);
        eprintln!("$ {line}");
        let output = command
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("could not start `{line}`"))?;
        if !output.status.success() {
            bail!("`{line}` failed: {}", output.status);
        }
        let stdout = String::from_utf8(output.stdout)
            .with_context(|| format!("`{line}` printed non-UTF-8 output"))?;
        Ok(stdout.trim().to_owned())
    }

    /// `mkdir -p`, skipped under `--dry-run`.
    pub fn create_dir_all(&self, dir: &Path) -> Result<()> {
        if dir.is_dir() {
            return Ok(());
        }
        self.announce(&format!("mkdir -p {}", dir.display()));
        if self.dry_run {
            return Ok(());
        }
        std::fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))
    }

    /// Makes `link` a symlink to `target`, replacing a different one;
    /// skipped under `--dry-run`.
    pub fn symlink(&self, target: &Path, link: &Path) -> Result<()> {
        if std::fs::read_link(link).is_ok_and(|existing| existing == target) {
            return Ok(());
        }
        self.announce(&format!("ln -sfn {} {}", target.display(), link.display()));
        if self.dry_run {
            return Ok(());
        }
        if link.symlink_metadata().is_ok() {
            std::fs::remove_file(link)
                .with_context(|| format!("could not replace {}", link.display()))?;
        }
        std::os::unix::fs::symlink(target, link)
            .with_context(|| format!("could not link {} to {}", link.display(), target.display()))
    }

    fn announce(&self, line: &str) {
        if self.dry_run {
            eprintln!("xtask: would run: {line}");
        } else {
            eprintln!("$ {line}");
        }
    }
}

/// The command as a shell line, with the environment variables it sets
/// (except PATH) in front.
pub fn display(command: &Command) -> String {
    let mut line = String::new();
    for (key, value) in command.get_envs() {
        if key == "PATH" {
            continue;
        }
        if let Some(value) = value {
            let _ = write!(line, "{}={} ", key.to_string_lossy(), quote(value.into()));
        }
    }
    line.push_str(&quote(command.get_program().into()));
    for arg in command.get_args() {
        line.push(' ');
        line.push_str(&quote(arg.into()));
    }
    line
}

fn quote(word: OsString) -> String {
    let word = word.to_string_lossy().into_owned();
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=+:@,%".contains(c));
    if plain {
        word
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The first `name` in PATH that is an executable file.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
