//! Compiles the C and C++ test fixtures under tests/fixtures into
//! target/fixtures, rebuilding a binary only when its source is newer.
//!
//! Every fixture keeps debug info, and frame pointers except the two built
//! to test DWARF unwinding (kernel_cache, nested_nofp), so the tracer's
//! stacks and symbols in the tests are exactly the functions in the source.
//!
//! tests/fixtures/mixed holds an executable built without frame pointers
//! and a static library built with them, linked into it (`mixed_fp`).
//!
//! tests/fixtures/rust_leak is a cargo project of its own, built with the
//! stable toolchain as users build theirs (`--release`, nothing more), and
//! again with `panic = "abort"` (`rust_leak`, `rust_leak_abort`).
//!
//! tests/fixtures/ctor holds a library whose constructor allocates and the
//! program linked to it (`ctor_main`), and a wrapper script that execs it
//! (`ctor_wrapper`): the spawn tests. tests/fixtures/late_new holds a
//! library that defines a throwing operator new (two builds) and the C
//! program that dlopen()s it (`late_new_host`): the late hooks of
//! tests/exceptions.rs. tests/fixtures/go_leak is a pure Go
//! program (`go_leak`, built with CGO_ENABLED=0); tests/fixtures/cgo_leak
//! a Go program that leaks through C (`cgo_leak` with Go's default C
//! flags, `cgo_leak_fp` with C frame pointers).
//!
//! tests/fixtures/cuda holds fixture CUDA libraries (`libcuda.so.1`,
//! `libcudart.so.12`, with sonames, and PyTorch's caching allocator
//! `libc10_cuda.so`, in target/fixtures/cuda) and the GPU programs built
//! against them.
//!
//! Long: one build rule per fixture (C, C++, Rust, Go, the objects without
//! frame pointers or unwind tables), in one table.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context as _, Result};

use crate::shell::Shell;

const COMMON_FLAGS: &[&str] = &["-O2", "-g", "-fno-omit-frame-pointer", "-pthread"];

/// Built without frame pointers, as most distributed code is (the DWARF
/// unwinding tests); the flag comes after COMMON_FLAGS' and wins.
const NO_FRAME_POINTERS: &[&str] = &["-fomit-frame-pointer"];

/// Fixtures that need flags beyond [`COMMON_FLAGS`], by source stem.
const EXTRA_FLAGS: &[(&str, &[&str])] = &[
    (
        "noalloc",
        &[
            "-nostdlib",
            "-static",
            "-ffreestanding",
            "-fno-stack-protector",
        ],
    ),
    ("kernel_cache", NO_FRAME_POINTERS),
    ("nested_nofp", NO_FRAME_POINTERS),
    ("burst", NO_FRAME_POINTERS),
    // A library (dlopen()ed by plugin_host by path), without frame pointers.
    ("nofp_plugin", &["-fomit-frame-pointer", "-shared", "-fPIC"]),
    // A library hostile loads by path (tests/hostile_files.rs).
    ("hostile_lib", &["-shared", "-fPIC"]),
    // A library whose DWARF is written by hand, slow to read
    // (tests/slow_symbols.rs): the compiler's own would be a second unit.
    (
        "slow_dwarf_lib",
        &["-shared", "-fPIC", "-g0", "-fno-toplevel-reorder"],
    ),
];

/// More binaries built from one fixture source: (output name, source file
/// name, extra flags). A static leaky carries malloc inside the executable.
const VARIANTS: &[(&str, &str, &[&str])] = &[
    ("leaky_static", "leaky.c", &["-static"]),
    // The benchmark's workloads without frame pointers: the kernel's walk
    // through unwind tables against its frame-pointer walk.
    ("bench_nofp", "bench.c", NO_FRAME_POINTERS),
];

/// The fixture CUDA libraries and the programs that use them, built in this
/// order from tests/fixtures/cuda: (output, source, flags after the
/// source). gcc runs in target/fixtures, so paths in flags are relative to it.
const CUDA_BUILDS: &[(&str, &str, &[&str])] = &[
    (
        "cuda/libcuda.so.1",
        "libcuda.c",
        &["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1"],
    ),
    (
        "cuda/libcudart.so.12",
        "libcudart.c",
        &[
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcudart.so.12",
            "cuda/libcuda.so.1",
            "-Wl,-rpath,$ORIGIN",
        ],
    ),
    // PyTorch's caching allocator, unexported as in torch's wheels.
    (
        "cuda/libc10_cuda.so",
        "libc10_cuda.cpp",
        &[
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            // It throws c10::OutOfMemoryError, as torch's does (gcc
            // links no C++ runtime by itself).
            "-lstdc++",
            "cuda/libcudart.so.12",
            "-Wl,-rpath,$ORIGIN",
        ],
    ),
    (
        "gpu_executor",
        "gpu_executor.c",
        &[
            "cuda/libcudart.so.12",
            "cuda/libcuda.so.1",
            "-Wl,-rpath,$ORIGIN/cuda",
        ],
    ),
    (
        "gpu_executor_dlopen",
        "gpu_executor.c",
        &["-DLOAD_LATER", "-ldl"],
    ),
    // The same, finding the runtime it dlopen()s by name through its
    // RUNPATH, as TVM's executors do.
    (
        "gpu_executor_runpath",
        "gpu_executor.c",
        &["-DLOAD_LATER", "-ldl", "-Wl,-rpath,$ORIGIN/cuda"],
    ),
];

/// The late hook fixtures, from tests/fixtures/late_new: a library that
/// defines a throwing operator new, linked to libstdc++ (whose loading
/// brings libgcc_s's unwinder), and the same carrying libstdc++ and the
/// unwinder inside, unexported; and the C program that dlopen()s one.
const LATE_NEW_BUILDS: &[(&str, &str, &[&str])] = &[
    (
        "late_new/liblate_new.so",
        "late_new.cpp",
        &["-shared", "-fPIC", "-lstdc++"],
    ),
    (
        "late_new/liblate_new_static.so",
        "late_new.cpp",
        &[
            "-shared",
            "-fPIC",
            "-static-libgcc",
            "-Wl,--exclude-libs,ALL",
            "-Wl,-Bstatic",
            "-lstdc++",
            "-Wl,-Bdynamic",
            "-lm",
        ],
    ),
    ("late_new_host", "late_new_host.c", &[]),
];

/// The spawn fixtures, built in this order from tests/fixtures/ctor: a
/// library whose constructor allocates and the program linked to it.
const CTOR_BUILDS: &[(&str, &str, &[&str])] = &[
    (
        "ctor/libctor.so",
        "libctor.c",
        &["-shared", "-fPIC", "-Wl,-soname,libctor.so"],
    ),
    (
        "ctor_main",
        "ctor_main.c",
        &["ctor/libctor.so", "-Wl,-rpath,$ORIGIN/ctor"],
    ),
];

/// Scripts copied next to the fixtures: (output, source in tests/fixtures).
const SCRIPTS: &[(&str, &str)] = &[("ctor_wrapper", "ctor/ctor_wrapper.sh")];

/// The Rust fixture, by cargo profile: (output name, profile, the
/// profile's directory under the cargo target directory).
const RUST_BUILDS: &[(&str, &str, &str)] = &[
    ("rust_leak", "release", "release"),
    ("rust_leak_abort", "release-abort", "release-abort"),
];

/// One binary to compile.
struct FixtureBuild {
    source: PathBuf,
    output: PathBuf,
    extra_flags: &'static [&'static str],
}

pub fn build_all(shell: &Shell, root: &Path) -> Result<()> {
    let source_dir = root.join("tests/fixtures");
    let output_dir = root.join("target/fixtures");
    shell.create_dir_all(&output_dir)?;
    for build in fixture_builds(&source_dir, &output_dir)? {
        compile(shell, &build)?;
    }
    build_stripped(shell, &output_dir)?;
    build_group(
        shell,
        &source_dir.join("cuda"),
        &output_dir,
        "cuda",
        CUDA_BUILDS,
    )?;
    build_group(
        shell,
        &source_dir.join("ctor"),
        &output_dir,
        "ctor",
        CTOR_BUILDS,
    )?;
    build_group(
        shell,
        &source_dir.join("late_new"),
        &output_dir,
        "late_new",
        LATE_NEW_BUILDS,
    )?;
    copy_scripts(shell, &source_dir, &output_dir)?;
    build_go(shell, &source_dir.join("go_leak"), &output_dir)?;
    build_cgo(shell, &source_dir.join("cgo_leak"), &output_dir)?;
    build_mixed(shell, &source_dir.join("mixed"), &output_dir)?;
    build_rust(shell, &source_dir.join("rust_leak"), &output_dir)
}

/// Builds only the named C fixtures (the demo's `leaky`), as `build_all`
/// builds them.
pub fn build_named(shell: &Shell, root: &Path, names: &[&str]) -> Result<()> {
    let source_dir = root.join("tests/fixtures");
    let output_dir = root.join("target/fixtures");
    shell.create_dir_all(&output_dir)?;
    let builds = fixture_builds(&source_dir, &output_dir)?;
    for name in names {
        let build = builds
            .iter()
            .find(|build| build.output.file_name() == Some(std::ffi::OsStr::new(name)))
            .with_context(|| format!("no fixture {name} in {}", source_dir.display()))?;
        compile(shell, build)?;
    }
    Ok(())
}

/// Compiles one C or C++ fixture unless it is up to date.
fn compile(shell: &Shell, build: &FixtureBuild) -> Result<()> {
    if is_up_to_date(&build.source, &build.output)? {
        eprintln!("xtask: fixture {}: up to date", build.output.display());
        return Ok(());
    }
    let is_cpp = build.source.extension().is_some_and(|ext| ext == "cpp");
    shell.run(
        shell
            .cmd(if is_cpp { "g++" } else { "gcc" })
            .args(COMMON_FLAGS)
            .args(build.extra_flags)
            .arg("-o")
            .arg(&build.output)
            .arg(&build.source),
    )
}

/// Stripped copies of `leaky` (no symbol table, no DWARF) for the tests
/// of separate debug files, in target/fixtures/stripped: `leaky_buildid`,
/// whose debug file is under debug/.build-id/ (found by build id with
/// `--debug-dir target/fixtures/stripped/debug`); `leaky_debuglink`, whose
/// .gnu_debuglink names `leaky_debuglink.debug` next to it; `leaky_nodebug`
/// with none.
fn build_stripped(shell: &Shell, output_dir: &Path) -> Result<()> {
    let leaky = output_dir.join("leaky");
    let dir = output_dir.join("stripped");
    let nodebug = dir.join("leaky_nodebug");
    if nodebug.exists() && modified(&nodebug)? >= modified(&leaky)? {
        eprintln!("xtask: fixture {}: up to date", dir.display());
        return Ok(());
    }
    let build_id_dir = dir.join("debug/.build-id");
    if build_id_dir.exists() {
        std::fs::remove_dir_all(&build_id_dir)
            .with_context(|| format!("could not remove {}", build_id_dir.display()))?;
    }
    let debug_file = dir.join("leaky_debuglink.debug");
    shell.create_dir_all(&dir)?;
    shell.run(
        shell
            .cmd("objcopy")
            .arg("--only-keep-debug")
            .arg(&leaky)
            .arg(&debug_file),
    )?;
    shell.run(
        shell
            .cmd("objcopy")
            .arg("--strip-all")
            .arg(&leaky)
            .arg(dir.join("leaky_buildid")),
    )?;
    // objcopy finds the file to link to by the path given, and records
    // its file name only.
    shell.run(
        shell
            .cmd("objcopy")
            .arg("--strip-all")
            .arg(format!("--add-gnu-debuglink={}", debug_file.display()))
            .arg(&leaky)
            .arg(dir.join("leaky_debuglink")),
    )?;
    let build_id = build_id_of(&leaky)?;
    let (head, tail) = build_id.split_at(2);
    let by_id = build_id_dir.join(head);
    shell.create_dir_all(&by_id)?;
    std::fs::copy(&debug_file, by_id.join(format!("{tail}.debug")))
        .context("could not install the build-id debug file")?;
    shell.run(
        shell
            .cmd("objcopy")
            .arg("--strip-all")
            .arg(&leaky)
            .arg(&nodebug),
    )
}

/// The GNU build id of an ELF file, in hex, as `readelf -n` prints it.
fn build_id_of(path: &Path) -> Result<String> {
    let output = std::process::Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .context("could not run readelf")?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.trim().strip_prefix("Build ID: ").map(str::to_owned))
        .with_context(|| format!("{} has no build id", path.display()))
}

/// `mixed_fp`: fp_library.c compiled with frame pointers into a static
/// library, linked into mixed_fp.c compiled without.
fn build_mixed(shell: &Shell, source_dir: &Path, output_dir: &Path) -> Result<()> {
    let output = output_dir.join("mixed_fp");
    if output.exists() && modified(&output)? >= newest_in(source_dir)? {
        eprintln!("xtask: fixture {}: up to date", output.display());
        return Ok(());
    }
    let build_dir = output_dir.join("mixed");
    shell.create_dir_all(&build_dir)?;
    let library_object = build_dir.join("fp_library.o");
    let library = build_dir.join("libfp_library.a");
    shell.run(
        shell
            .cmd("gcc")
            .args(COMMON_FLAGS)
            .arg("-c")
            .arg("-o")
            .arg(&library_object)
            .arg(source_dir.join("fp_library.c")),
    )?;
    if library.exists() {
        std::fs::remove_file(&library)
            .with_context(|| format!("could not remove {}", library.display()))?;
    }
    shell.run(
        shell
            .cmd("ar")
            .arg("rcs")
            .arg(&library)
            .arg(&library_object),
    )?;
    shell.run(
        shell
            .cmd("gcc")
            .args(COMMON_FLAGS)
            .args(NO_FRAME_POINTERS)
            .arg("-o")
            .arg(&output)
            .arg(source_dir.join("mixed_fp.c"))
            .arg(&library),
    )
}

/// [`RUST_BUILDS`] with the stable toolchain (cargo decides what is out of
/// date), into target/fixtures/rust_leak-build, then copied next to the
/// other fixtures.
fn build_rust(shell: &Shell, source_dir: &Path, output_dir: &Path) -> Result<()> {
    let target_dir = output_dir.join("rust_leak-build");
    for (output, profile, profile_dir) in RUST_BUILDS {
        shell.run(
            shell
                .cmd("cargo")
                .arg("+stable")
                .args(["build", "--locked", "--profile", profile, "--manifest-path"])
                .arg(source_dir.join("Cargo.toml"))
                .arg("--target-dir")
                .arg(&target_dir)
                // Nothing of the outer cargo's build (xtask's own) leaks in.
                .env_remove("RUSTFLAGS")
                .env_remove("CARGO_ENCODED_RUSTFLAGS")
                .env_remove("CARGO_TARGET_DIR")
                .env_remove("CARGO_BUILD_TARGET"),
        )?;
        let built = target_dir.join(profile_dir).join("rust_leak");
        let output = output_dir.join(output);
        if shell.is_dry_run() {
            eprintln!(
                "xtask: would run: cp {} {}",
                built.display(),
                output.display()
            );
        } else if !output.exists() || modified(&output)? < modified(&built)? {
            eprintln!("$ cp {} {}", built.display(), output.display());
            std::fs::copy(&built, &output).with_context(|| {
                format!("could not copy {} to {}", built.display(), output.display())
            })?;
        }
    }
    Ok(())
}

/// The newest modification time of the files in `dir`.
fn newest_in(dir: &Path) -> Result<SystemTime> {
    let mut newest = SystemTime::UNIX_EPOCH;
    for entry in
        std::fs::read_dir(dir).with_context(|| format!("could not list {}", dir.display()))?
    {
        let path = entry
            .with_context(|| format!("could not list {}", dir.display()))?
            .path();
        newest = newest.max(modified(&path)?);
    }
    Ok(newest)
}

/// Builds a group of libraries and the programs that link them
/// ([`CUDA_BUILDS`], [`CTOR_BUILDS`]) into `output_dir/<name>` and
/// `output_dir`, all of them when any source (a header included) is newer
/// than any output.
fn build_group(
    shell: &Shell,
    source_dir: &Path,
    output_dir: &Path,
    name: &str,
    builds: &[(&str, &str, &[&str])],
) -> Result<()> {
    shell.create_dir_all(&output_dir.join(name))?;
    let newest_source = newest_in(source_dir)?;
    let mut up_to_date = true;
    for (output, _, _) in builds {
        let output = output_dir.join(output);
        up_to_date &= output.exists() && modified(&output)? >= newest_source;
    }
    if up_to_date {
        eprintln!(
            "xtask: {name} fixtures in {}: up to date",
            output_dir.display()
        );
        return Ok(());
    }
    for (output, source, flags) in builds {
        shell.run(
            shell
                .cmd("gcc")
                .current_dir(output_dir)
                .args(COMMON_FLAGS)
                .arg("-o")
                .arg(output_dir.join(output))
                .arg(source_dir.join(source))
                .args(*flags),
        )?;
    }
    Ok(())
}

/// [`SCRIPTS`], copied (executable) when newer.
fn copy_scripts(shell: &Shell, source_dir: &Path, output_dir: &Path) -> Result<()> {
    for (output, source) in SCRIPTS {
        let (source, output) = (source_dir.join(source), output_dir.join(output));
        if is_up_to_date(&source, &output)? {
            continue;
        }
        if shell.is_dry_run() {
            eprintln!(
                "xtask: would run: cp {} {}",
                source.display(),
                output.display()
            );
            continue;
        }
        eprintln!("$ cp {} {}", source.display(), output.display());
        std::fs::copy(&source, &output).with_context(|| {
            format!(
                "could not copy {} to {}",
                source.display(),
                output.display()
            )
        })?;
    }
    Ok(())
}

/// `go_leak`: a pure Go program (CGO_ENABLED=0: static, no malloc), built
/// with the Debian toolchain.
fn build_go(shell: &Shell, source_dir: &Path, output_dir: &Path) -> Result<()> {
    go_build(
        shell,
        source_dir,
        &output_dir.join("go_leak"),
        &[("CGO_ENABLED", "0")],
    )
}

/// `cgo_leak` (C built with Go's default flags, `-g -O2`: no frame
/// pointers, as users get it) and `cgo_leak_fp` (C with frame pointers).
fn build_cgo(shell: &Shell, source_dir: &Path, output_dir: &Path) -> Result<()> {
    go_build(
        shell,
        source_dir,
        &output_dir.join("cgo_leak"),
        &[("CGO_ENABLED", "1")],
    )?;
    go_build(
        shell,
        source_dir,
        &output_dir.join("cgo_leak_fp"),
        &[
            ("CGO_ENABLED", "1"),
            ("CGO_CFLAGS", "-g -O2 -fno-omit-frame-pointer"),
        ],
    )
}

/// `go build` of the module in `source_dir` to `output`, offline, with
/// its caches under target/fixtures, when the sources are newer.
fn go_build(shell: &Shell, source_dir: &Path, output: &Path, env: &[(&str, &str)]) -> Result<()> {
    if output.exists() && modified(output)? >= newest_in(source_dir)? {
        eprintln!("xtask: fixture {}: up to date", output.display());
        return Ok(());
    }
    let output_dir = output.parent().context("a fixture path has a parent")?;
    shell.run(
        shell
            .cmd("go")
            .current_dir(source_dir)
            .args(["build", "-o"])
            .arg(output)
            .arg(".")
            .env("GOFLAGS", "-mod=mod")
            .env("GOCACHE", output_dir.join("go-build-cache"))
            .env("GOPATH", output_dir.join("go-path"))
            .env("GO111MODULE", "on")
            .env("GOPROXY", "off")
            .envs(env.iter().copied()),
    )
}

fn modified(path: &Path) -> Result<SystemTime> {
    path.metadata()
        .and_then(|meta| meta.modified())
        .with_context(|| format!("could not stat {}", path.display()))
}

fn fixture_builds(source_dir: &Path, output_dir: &Path) -> Result<Vec<FixtureBuild>> {
    let entries = std::fs::read_dir(source_dir)
        .with_context(|| format!("could not list {}", source_dir.display()))?;
    let mut builds = Vec::new();
    for entry in entries {
        let source = entry
            .with_context(|| format!("could not list {}", source_dir.display()))?
            .path();
        let is_c_or_cpp = source
            .extension()
            .is_some_and(|ext| ext == "c" || ext == "cpp");
        let Some(stem) = source.file_stem().and_then(|stem| stem.to_str()) else {
            continue;
        };
        if !is_c_or_cpp {
            continue;
        }
        let extra_flags = EXTRA_FLAGS
            .iter()
            .find(|(name, _)| *name == stem)
            .map_or(&[][..], |(_, flags)| *flags);
        builds.push(FixtureBuild {
            output: output_dir.join(stem),
            source: source.clone(),
            extra_flags,
        });
    }
    for (output, source, extra_flags) in VARIANTS {
        builds.push(FixtureBuild {
            source: source_dir.join(source),
            output: output_dir.join(output),
            extra_flags,
        });
    }
    builds.sort_by(|a, b| a.output.cmp(&b.output));
    Ok(builds)
}

fn is_up_to_date(source: &Path, output: &Path) -> Result<bool> {
    if !output.exists() {
        return Ok(false);
    }
    Ok(modified(source)? <= modified(output)?)
}
