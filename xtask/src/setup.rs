//! `cargo xtask setup`: installs what building and testing tracer needs and
//! is missing, and nothing else, so it is cheap to run before every task.
//! The tests also need Go: `go tool pprof` checks the pprof output.
//!
//! The eBPF crate builds on nightly with rust-src and links with bpf-linker;
//! bpf-linker is built against the LLVM that nightly rustc itself ships, so
//! the two always agree on the bitcode format.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, anyhow, bail};

use crate::shell::{Shell, find_on_path, is_executable, is_root};
use crate::{fixtures, venvs};

/// The bpf-linker release that `setup` installs.
const BPF_LINKER_VERSION: &str = "0.13.0";
const TRACEFS_DIR: &str = "/sys/kernel/tracing";

pub fn setup(shell: &mut Shell, root: &Path) -> Result<()> {
    ensure_nightly_rust_src(shell)?;
    let linker = ensure_bpf_linker(shell, root)?;
    ensure_tracefs(shell)?;
    ensure_packages(shell)?;
    venvs::NUMPY2.ensure(shell, root)?;
    fixtures::build_all(shell, root)?;
    match linker {
        Some(install) => install.wait(),
        None => Ok(()),
    }
}

/// What `cargo xtask demo` needs and nothing more: the toolchain, tracefs,
/// gcc and the one fixture it traces (`leaky`). The test and bench set-up
/// (`setup`) installs the rest. A bpf-linker still building is returned,
/// for the tracer's build to go on beside it ([`BpfLinkerInstall`]).
pub fn setup_demo(shell: &mut Shell, root: &Path) -> Result<Option<BpfLinkerInstall>> {
    ensure_nightly_rust_src(shell)?;
    let linker = ensure_bpf_linker(shell, root)?;
    ensure_tracefs(shell)?;
    ensure_demo_packages(shell)?;
    fixtures::build_named(shell, root, &["leaky"])?;
    Ok(linker)
}

/// What building tracer needs and nothing more (`cargo xtask dist`): the
/// nightly toolchain and bpf-linker, installed once this returns.
pub fn setup_toolchain(shell: &mut Shell, root: &Path) -> Result<()> {
    ensure_nightly_rust_src(shell)?;
    match ensure_bpf_linker(shell, root)? {
        Some(install) => install.wait(),
        None => Ok(()),
    }
}

/// bpf-linker being built by `cargo install` in the background, its output
/// in a log file. While it builds, a marker file exists: tracer's build
/// script waits for it to go (`TRACER_BPF_LINKER_PENDING`), so that the
/// tracer's dependencies compile beside bpf-linker instead of after it.
pub struct BpfLinkerInstall {
    child: std::process::Child,
    line: String,
    log: PathBuf,
    pub marker: PathBuf,
}

impl BpfLinkerInstall {
    /// Waits for the install; the marker goes either way (a failed install
    /// leaves tracer's build script to fail on the missing linker).
    pub fn wait(mut self) -> Result<()> {
        let status = self.child.wait();
        let _ = std::fs::remove_file(&self.marker);
        let status = status.with_context(|| format!("`{}` was lost", self.line))?;
        if !status.success() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "`{}` failed: {status}; the last lines of {}:\n{}",
                self.line,
                self.log.display(),
                tail.join("\n")
            );
        }
        eprintln!("xtask: bpf-linker: built (log: {})", self.log.display());
        Ok(())
    }
}

fn ensure_nightly_rust_src(shell: &Shell) -> Result<()> {
    let toolchains = shell.read(shell.cmd("rustup").args(["toolchain", "list"]))?;
    if !toolchains.lines().any(|line| line.starts_with("nightly")) {
        shell.run(shell.cmd("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
        if shell.is_dry_run() {
            eprintln!("xtask: would run: rustup component add rust-src --toolchain nightly");
            return Ok(());
        }
    }
    let components = shell.read(shell.cmd("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))?;
    if components.lines().any(|line| line.starts_with("rust-src")) {
        eprintln!("xtask: nightly toolchain with rust-src: present");
        return Ok(());
    }
    shell.run(
        shell
            .cmd("rustup")
            .args(["component", "add", "rust-src", "--toolchain", "nightly"]),
    )
}

fn ensure_bpf_linker(shell: &mut Shell, root: &Path) -> Result<Option<BpfLinkerInstall>> {
    if let Some(path) = find_on_path("bpf-linker") {
        eprintln!("xtask: bpf-linker: present at {}", path.display());
        return Ok(None);
    }
    let bin_dir = cargo_install_bin_dir()?;
    if is_executable(&bin_dir.join("bpf-linker")) {
        eprintln!(
            "xtask: bpf-linker: present in {} (not on PATH; added for this run)",
            bin_dir.display()
        );
        shell.prepend_path(bin_dir);
        return Ok(None);
    }
    let install = install_bpf_linker(shell, root)?;
    shell.prepend_path(bin_dir);
    Ok(install)
}

/// Builds bpf-linker against nightly rustc's own libLLVM: LLVM_PREFIX points
/// at a directory whose lib/ links to it, under both the plain name (to link)
/// and its soname (so the installed binary finds it through its RUNPATH).
/// Started in the background (None under `--dry-run`). Built without
/// optimisation or debug info (`--debug`, 46 instead of 120 CPU-seconds):
/// the linking work is LLVM's, which is optimised either way (tracer's eBPF
/// object links in the same ~4 s).
fn install_bpf_linker(shell: &Shell, root: &Path) -> Result<Option<BpfLinkerInstall>> {
    let sysroot = shell.read(shell.cmd("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let (libllvm, llvm_major) = find_rustc_libllvm(Path::new(&sysroot))?;
    let prefix = root.join("target/llvm-prefix");
    let prefix_lib = prefix.join("lib");
    shell.create_dir_all(&prefix_lib)?;
    shell.symlink(&libllvm, &prefix_lib.join("libLLVM.so"))?;
    if let Some(soname) = libllvm.file_name() {
        shell.symlink(&libllvm, &prefix_lib.join(soname))?;
    }
    let mut command = shell.cmd("cargo");
    command
        .env("LLVM_PREFIX", &prefix)
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .args([
            "install",
            "bpf-linker",
            "--locked",
            "--debug",
            "--version",
            BPF_LINKER_VERSION,
        ])
        .args(["--no-default-features", "--features"])
        .arg(format!("llvm-{llvm_major}"));
    let line = crate::shell::display(&command);
    if shell.is_dry_run() {
        eprintln!("xtask: would run: {line}");
        return Ok(None);
    }
    let log = root.join("target/bpf-linker-install.log");
    let marker = root.join("target/bpf-linker-pending");
    std::fs::write(&marker, b"")
        .with_context(|| format!("could not write {}", marker.display()))?;
    let output = std::fs::File::create(&log)
        .with_context(|| format!("could not write {}", log.display()))?;
    eprintln!("$ {line}");
    eprintln!(
        "xtask: bpf-linker: building in the background (about a minute; log: {})",
        log.display()
    );
    let child = command
        .stdout(output.try_clone()?)
        .stderr(output)
        .spawn()
        .with_context(|| format!("could not start `{line}`"))?;
    Ok(Some(BpfLinkerInstall {
        child,
        line,
        log,
        marker,
    }))
}

/// `$sysroot/lib/libLLVM.so.<major>.<minor>-rust-...` and its major version.
fn find_rustc_libllvm(sysroot: &Path) -> Result<(PathBuf, u32)> {
    let lib_dir = sysroot.join("lib");
    let entries = std::fs::read_dir(&lib_dir)
        .with_context(|| format!("could not list {}", lib_dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("could not list {}", lib_dir.display()))?;
        let name = entry.file_name();
        let Some(version) = name
            .to_str()
            .and_then(|name| name.strip_prefix("libLLVM.so."))
        else {
            continue;
        };
        let digits: String = version.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(major) = digits.parse() {
            return Ok((entry.path(), major));
        }
    }
    bail!(
        "no libLLVM.so.<version> in {}; is the nightly toolchain complete?",
        lib_dir.display()
    )
}

/// Where `cargo install` puts binaries: $CARGO_INSTALL_ROOT/bin,
/// $CARGO_HOME/bin or ~/.cargo/bin.
fn cargo_install_bin_dir() -> Result<PathBuf> {
    let root = std::env::var_os("CARGO_INSTALL_ROOT")
        .or_else(|| std::env::var_os("CARGO_HOME"))
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .ok_or_else(|| anyhow!("neither CARGO_INSTALL_ROOT, CARGO_HOME nor HOME is set"))?;
    Ok(root.join("bin"))
}

/// The tracer reads tracepoint formats from tracefs.
fn ensure_tracefs(shell: &Shell) -> Result<()> {
    if Path::new(TRACEFS_DIR).join("events").is_dir() {
        eprintln!("xtask: tracefs: mounted at {TRACEFS_DIR}");
        return Ok(());
    }
    if !is_root() {
        eprintln!(
            "xtask: warning: tracefs is not mounted at {TRACEFS_DIR} and mounting it needs root; \
             run `sudo mount -t tracefs tracefs {TRACEFS_DIR}`"
        );
        return Ok(());
    }
    shell.run(
        shell
            .cmd("mount")
            .args(["-t", "tracefs", "tracefs", TRACEFS_DIR]),
    )
}

/// Debian packages the build and the tests need, by the command each
/// provides: the C compilers for the fixtures, bpftool for the test that
/// checks a killed tracer leaves no eBPF program behind, go for
/// `go tool pprof`, which reads the pprof profiles in the tests, and redis
/// (server, cli and benchmark), the real server of tests/allocators.rs and
/// the benchmark; Debian's python3.11 with numpy (the Python frames'
/// tests), prometheus (the scrape test of `--listen`) and nodejs (JIT frames
/// through `--perf-basic-prof`).
const PACKAGES: [(&str, &str); 9] = [
    ("gcc", "gcc"),
    ("g++", "g++"),
    ("bpftool", "bpftool"),
    ("go", "golang-go"),
    ("redis-server", "redis-server"),
    ("redis-benchmark", "redis-tools"),
    ("prometheus", "prometheus"),
    ("node", "nodejs"),
    ("python3.11", "python3.11"),
];

/// The allocators Debian ships besides glibc's, by the library each
/// provides: the tests and the benchmark preload them into the fixtures.
pub const ALLOCATOR_LIBRARIES: [(&str, &str); 3] = [
    ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "libjemalloc2"),
    (
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        "libtcmalloc-minimal4",
    ),
    (
        "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
        "libmimalloc2.0",
    ),
];

/// Packages known by a file they install rather than a command: numpy,
/// the shared libpython3.11 that the embedding fixtures dlopen
/// (embed_python, embed_script), and python3.11's venv module, which makes
/// the venvs of PyPI packages under target/ (`venvs`).
const PACKAGE_FILES: [(&str, &str); 3] = [
    (
        "/usr/lib/python3.11/ensurepip/__init__.py",
        "python3.11-venv",
    ),
    (
        "/usr/lib/python3/dist-packages/numpy/__init__.py",
        "python3-numpy",
    ),
    (
        "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
        "libpython3.11",
    ),
];

/// Debian's CPU build of PyTorch 1.13 for python3.11, the real ML workload
/// of tests/torch.rs and the benchmark's torch section. It is installed
/// without its recommends (libtorch-dev, build-essential, pybind11, and
/// through them Qt, GTK and the video drivers): measured on Debian 12,
/// 183 packages and 144 MB to download instead of 236 and 178 MB; the
/// install took 63 s with recommends on a VM next to a Debian mirror.
const TORCH: (&str, &str) = (
    "/usr/lib/python3/dist-packages/torch/__init__.py",
    "python3-torch",
);

fn ensure_packages(shell: &Shell) -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(command, _)| {
            find_on_path(command).is_none() && !Path::new("/usr/sbin").join(command).exists()
        })
        .map(|&(_, package)| package)
        .chain(
            ALLOCATOR_LIBRARIES
                .iter()
                .filter(|(library, _)| !Path::new(library).exists())
                .map(|&(_, package)| package),
        )
        .chain(
            PACKAGE_FILES
                .iter()
                .filter(|(file, _)| !Path::new(file).exists())
                .map(|&(_, package)| package),
        )
        .collect();
    let torch_missing = !Path::new(TORCH.0).exists();
    if missing.is_empty() && !torch_missing {
        eprintln!(
            "xtask: gcc, g++, bpftool, go, redis, jemalloc, tcmalloc, mimalloc, python3.11, numpy, torch, prometheus, nodejs: present"
        );
        return Ok(());
    }
    let apt_get = |args: &[&str]| {
        let mut command = apt_get(shell);
        command.args(args);
        command
    };
    shell.run(&mut apt_get(&["update"]))?;
    if !missing.is_empty() {
        shell.run(apt_get(&["install", "-y"]).args(&missing))?;
    }
    if torch_missing {
        shell.run(&mut apt_get(&[
            "install",
            "-y",
            "--no-install-recommends",
            TORCH.1,
        ]))?;
    }
    Ok(())
}

/// `cargo xtask setup --ml`: the real ML stacks in venvs under target/ml
/// (about 8 GB, 10 minutes; never in CI), after what `setup` installs.
pub fn setup_ml(shell: &mut Shell, root: &Path) -> Result<()> {
    setup(shell, root)?;
    for venv in [&venvs::ML_TORCH, &venvs::ML_TF] {
        venv.ensure(shell, root)?;
    }
    Ok(())
}

/// Debian's python3.11: its venv module makes maturin's environment
/// (`cargo xtask dist`) and the wheel test's.
pub const DEBIAN_PYTHON: &str = "/usr/bin/python3.11";

/// What `cargo xtask dist` and its tests need, by a file each package
/// installs: musl-gcc and the gcc it wraps (tracer links mimalloc, a C
/// library, built for musl too), Debian's python3.11 venv module, and
/// debootstrap (the Debian 11 userland of tests/dist.rs).
const DIST_PACKAGE_FILES: [(&str, &str); 4] = [
    ("/usr/bin/musl-gcc", "musl-tools"),
    ("/usr/bin/x86_64-linux-gnu-gcc", "gcc"),
    (
        "/usr/lib/python3.11/ensurepip/__init__.py",
        "python3.11-venv",
    ),
    ("/usr/sbin/debootstrap", "debootstrap"),
];

pub fn ensure_dist_packages(shell: &Shell) -> Result<()> {
    let missing: Vec<&str> = DIST_PACKAGE_FILES
        .iter()
        .filter(|(file, _)| !Path::new(file).exists())
        .map(|&(_, package)| package)
        .collect();
    if missing.is_empty() {
        eprintln!("xtask: musl-gcc, gcc, python3.11's venv, debootstrap: present");
        return Ok(());
    }
    shell.run(apt_get(shell).arg("update"))?;
    shell.run(apt_get(shell).args(["install", "-y"]).args(&missing))
}

/// The demo's packages, by the command each provides: gcc for its fixture.
const DEMO_PACKAGES: [(&str, &str); 1] = [("gcc", "gcc")];

fn ensure_demo_packages(shell: &Shell) -> Result<()> {
    let missing: Vec<&str> = DEMO_PACKAGES
        .iter()
        .filter(|(command, _)| find_on_path(command).is_none())
        .map(|&(_, package)| package)
        .collect();
    if missing.is_empty() {
        eprintln!("xtask: gcc: present");
        return Ok(());
    }
    shell.run(apt_get(shell).arg("update"))?;
    shell.run(apt_get(shell).args(["install", "-y"]).args(&missing))
}

/// `apt-get`, through sudo unless root, without questions.
fn apt_get(shell: &Shell) -> Command {
    let mut command = if is_root() {
        shell.cmd("apt-get")
    } else {
        let mut sudo = shell.cmd("sudo");
        sudo.arg("apt-get");
        sudo
    };
    command.env("DEBIAN_FRONTEND", "noninteractive");
    command
}
