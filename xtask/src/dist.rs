//! `cargo xtask dist`: what a user installs in one line, in target/dist/.
//!
//! - `tracer`: one static x86-64 executable (musl, static-pie: no program
//!   interpreter, no shared library), the eBPF object inside, stripped;
//!   it runs on any x86-64 Linux with BTF whatever the userland. Checked
//!   here: no PT_INTERP, no DT_NEEDED, at most 25 MiB.
//! - `tracer-<version>-py3-none-manylinux_2_17_x86_64...musllinux_1_2_x86_64.whl`:
//!   the same binary as a `tracer` command in a venv (maturin's `bin`
//!   bindings, tracer/pyproject.toml). maturin runs the one cargo build
//!   both come from.
//! - `tracer.1` and a page per verb (`tracer-record.1`, ...), `tracer.bash`,
//!   `_tracer` (zsh) and `tracer.fish`: made by the binary itself
//!   (`tracer generate`), from its clap definitions.
//! - `Containerfile`: an image `FROM scratch` holding the binary
//!   (docs/fleets.md runs it as a DaemonSet or a `kubectl debug` pod).
//!
//! `tracer --version` names the commit: it is passed to the build as
//! TRACER_COMMIT.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use crate::setup;
use crate::shell::{Shell, find_on_path, is_executable};

/// The static build's target: musl, linked statically by Rust's default.
const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";
/// The cargo profile (root Cargo.toml): release, stripped.
const PROFILE: &str = "static";
/// The maturin release `dist` installs into target/dist-tools.
const MATURIN_VERSION: &str = "1.16.0";
/// The platform tags of the wheel: the binary links nothing, so it suits
/// glibc systems from 2.17 on (what Rust's std asks of the kernel-facing
/// ABI) and musl ones.
const WHEEL_TAGS: [&str; 2] = ["manylinux2014", "musllinux_1_2"];
/// The bound on the binary's size.
const MAX_BINARY_BYTES: u64 = 25 << 20;
/// The completions and the file each shell loads.
const COMPLETIONS: [(&str, &str); 3] = [
    ("bash", "tracer.bash"),
    ("zsh", "_tracer"),
    ("fish", "tracer.fish"),
];

/// Builds everything into target/dist (see the module's comment).
pub fn dist(shell: &Shell, root: &Path) -> Result<()> {
    let started = Instant::now();
    let maturin = ensure_dist_tools(shell, root)?;
    let out = root.join("target/dist");
    remove_dir_contents(&out)?;
    let commit = commit(shell, root);
    eprintln!("xtask: dist: commit {commit}");
    let mut build = shell.cmd(&maturin);
    build
        .current_dir(root)
        .env("TRACER_COMMIT", &commit)
        .args(["build", "--manifest-path", "tracer/Cargo.toml"])
        .args(["--target", MUSL_TARGET, "--profile", PROFILE])
        .arg("--compatibility")
        .args(WHEEL_TAGS)
        .arg("--out")
        .arg(&out);
    shell.run(&mut build)?;

    let built = root
        .join("target")
        .join(MUSL_TARGET)
        .join(PROFILE)
        .join("tracer");
    let binary = out.join("tracer");
    std::fs::copy(&built, &binary)
        .with_context(|| format!("could not copy {} to {}", built.display(), binary.display()))?;
    let size = check_static(&binary)?;

    let generated = |args: &[&str]| shell.read(shell.cmd(&binary).arg("generate").args(args));
    generated(&["man", path_str(&out)?])?;
    for (shell_name, file) in COMPLETIONS {
        let text = generated(&[shell_name])?;
        write(&out.join(file), &(text + "\n"))?;
    }
    let containerfile = root.join("tracer/Containerfile");
    std::fs::copy(&containerfile, out.join("Containerfile"))
        .with_context(|| format!("could not copy {}", containerfile.display()))?;

    eprintln!(
        "xtask: dist: target/dist/tracer: {:.1} MiB, static (no interpreter, no shared \
         library); {} in {:.0} s",
        size as f64 / f64::from(1 << 20),
        listing(&out)?,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What `dist` needs beyond `setup`: Rust's musl target, musl-gcc (tracer
/// links mimalloc, a C library), Debian's venv module (for maturin here,
/// and the wheel's test) and maturin itself, in target/dist-tools.
/// Returns maturin's path.
fn ensure_dist_tools(shell: &Shell, root: &Path) -> Result<PathBuf> {
    let targets = shell.read(shell.cmd("rustup").args(["target", "list", "--installed"]))?;
    if targets.lines().any(|line| line.trim() == MUSL_TARGET) {
        eprintln!("xtask: rust target {MUSL_TARGET}: present");
    } else {
        shell.run(shell.cmd("rustup").args(["target", "add", MUSL_TARGET]))?;
    }
    setup::ensure_dist_packages(shell)?;
    let tools = root.join("target/dist-tools");
    let maturin = tools.join("bin/maturin");
    let installed = is_executable(&maturin)
        && shell
            .read(shell.cmd(&maturin).arg("--version"))
            .is_ok_and(|version| version.ends_with(MATURIN_VERSION));
    if installed {
        eprintln!(
            "xtask: maturin {MATURIN_VERSION}: present in {}",
            tools.display()
        );
        return Ok(maturin);
    }
    let python = find_on_path("python3.11")
        .filter(|path| path.starts_with("/usr"))
        .unwrap_or_else(|| PathBuf::from(setup::DEBIAN_PYTHON));
    shell.run(
        shell
            .cmd(&python)
            .args(["-m", "venv", "--clear"])
            .arg(&tools),
    )?;
    shell.run(
        shell
            .cmd(tools.join("bin/pip"))
            .args(["install", "--quiet"])
            .arg(format!("maturin=={MATURIN_VERSION}")),
    )?;
    Ok(maturin)
}

/// `git describe --always --dirty`: the commit, `-dirty` with
/// uncommitted changes; "unknown" outside a git checkout.
fn commit(shell: &Shell, root: &Path) -> String {
    shell
        .read(shell.cmd("git").arg("-C").arg(root).args([
            "describe",
            "--always",
            "--dirty",
            "--abbrev=12",
        ]))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Fails unless `binary` is an ELF executable with no program interpreter
/// and no shared library, of at most [`MAX_BINARY_BYTES`]; returns its size.
fn check_static(binary: &Path) -> Result<u64> {
    let bytes =
        std::fs::read(binary).with_context(|| format!("could not read {}", binary.display()))?;
    let elf = Elf64::parse(&bytes).with_context(|| format!("{}", binary.display()))?;
    if elf.has_interpreter() {
        bail!(
            "{} has a program interpreter (PT_INTERP): it is not static",
            binary.display()
        );
    }
    let needed = elf.needed_count();
    if needed > 0 {
        bail!(
            "{} needs {needed} shared libraries (DT_NEEDED): it is not static",
            binary.display()
        );
    }
    let size = bytes.len() as u64;
    if size > MAX_BINARY_BYTES {
        bail!(
            "{} is {size} bytes, over the bound of {MAX_BINARY_BYTES} (25 MiB)",
            binary.display()
        );
    }
    Ok(size)
}

/// The few fields of a little-endian ELF64 file that say whether it is
/// static.
struct Elf64<'a> {
    bytes: &'a [u8],
    /// (type, file offset, file size) of each program header.
    segments: Vec<(u32, usize, usize)>,
}

impl<'a> Elf64<'a> {
    const PT_DYNAMIC: u32 = 2;
    const PT_INTERP: u32 = 3;
    const DT_NEEDED: u64 = 1;

    fn parse(bytes: &'a [u8]) -> Result<Self> {
        if bytes.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
            bail!("not a little-endian 64-bit ELF file");
        }
        let table = usize::try_from(u64_at(bytes, 0x20)?)?;
        let entry_size = usize::from(u16_at(bytes, 0x36)?);
        let count = usize::from(u16_at(bytes, 0x38)?);
        let segments = (0..count)
            .map(|index| {
                let header = table + index * entry_size;
                Ok((
                    u32_at(bytes, header)?,
                    usize::try_from(u64_at(bytes, header + 8)?)?,
                    usize::try_from(u64_at(bytes, header + 32)?)?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Self { bytes, segments })
    }

    fn has_interpreter(&self) -> bool {
        self.segments
            .iter()
            .any(|&(kind, _, _)| kind == Self::PT_INTERP)
    }

    /// DT_NEEDED entries of the dynamic segment (a static-pie has one,
    /// for its relocations, with no DT_NEEDED).
    fn needed_count(&self) -> usize {
        self.segments
            .iter()
            .filter(|&&(kind, _, _)| kind == Self::PT_DYNAMIC)
            .flat_map(|&(_, offset, size)| {
                let end = (offset + size).min(self.bytes.len());
                self.bytes[offset.min(end)..end].chunks_exact(16)
            })
            .filter(|entry| u64_at(entry, 0).is_ok_and(|tag| tag == Self::DT_NEEDED))
            .count()
    }
}

fn u16_at(bytes: &[u8], at: usize) -> Result<u16> {
    Ok(u16::from_le_bytes(field(bytes, at)?))
}

fn u32_at(bytes: &[u8], at: usize) -> Result<u32> {
    Ok(u32::from_le_bytes(field(bytes, at)?))
}

fn u64_at(bytes: &[u8], at: usize) -> Result<u64> {
    Ok(u64::from_le_bytes(field(bytes, at)?))
}

fn field<const N: usize>(bytes: &[u8], at: usize) -> Result<[u8; N]> {
    bytes
        .get(at..at + N)
        .and_then(|field| field.try_into().ok())
        .with_context(|| format!("truncated ELF file (at byte {at})"))
}

/// Empties `dir` (creating it): a wheel of an older version must not stay
/// beside the new one.
fn remove_dir_contents(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("could not empty {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("could not write {}", path.display()))
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .with_context(|| format!("non-UTF-8 path {}", path.display()))
}

/// The files in `dir`, by name, comma-separated.
fn listing(dir: &Path) -> Result<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("could not list {}", dir.display()))?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This very test binary is dynamically linked (Rust's default on
    /// glibc): the check must say so.
    #[test]
    fn a_dynamic_executable_is_refused() {
        let own = std::fs::read("/proc/self/exe").expect("read own executable");
        let elf = Elf64::parse(&own).expect("parse own executable");
        assert!(elf.has_interpreter());
        assert!(elf.needed_count() >= 1);
    }
}
