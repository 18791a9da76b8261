//! `cargo xtask`: the project's tasks, so that a fresh machine needs one
//! command for each: `setup`, `build`, `dist`, `demo`, `test`, `bench`,
//! `fuzz`, `lint`.
//!
//! Every external command is printed before it runs, and a failure ends the
//! task with one line that names the command.

mod bench;
mod bench_attach;
mod bench_exceptions;
mod bench_holders;
mod bench_ml;
mod bench_python;
mod bench_real;
mod bench_runs;
mod bench_torch;
mod demo;
mod dist;
// The fixtures' line protocol, the test harness's own: one client for
// tests and xtask.
#[path = "../../tests/harness/fixture_client.rs"]
mod fixture_client;
mod fixture_process;
mod fixtures;
mod fuzz;
mod setup;
mod shell;
mod soak;
mod userland;
mod venvs;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};

use shell::{Shell, is_root};

#[derive(Parser)]
#[command(about = "Development tasks for tracer (run as `cargo xtask <command>`)")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what is missing: nightly + rust-src, bpf-linker, tracefs,
    /// gcc/g++, go (for go tool pprof), a numpy 2 venv; compile the test
    /// fixtures
    Setup {
        /// Print what would be installed or built, change nothing
        #[arg(long)]
        dry_run: bool,
        /// Also the real ML stacks the benchmark measures, in venvs under
        /// target/ml: PyPI torch + transformers + iree-turbine, and
        /// tensorflow-cpu (about 8 GB, 10 minutes; not needed by the tests)
        #[arg(long)]
        ml: bool,
    },
    /// Setup, then build the release tracer (eBPF included)
    Build,
    /// Install the toolchain and dist's tools, then write what users
    /// install to target/dist/: the static tracer (musl, eBPF inside), its
    /// Python wheel, man pages, bash/zsh/fish completions and a
    /// Containerfile
    Dist {
        /// Then make the Debian 11 root (debootstrap, once) and run
        /// tests/dist.rs on what was written (not in `cargo xtask test`:
        /// minutes on a fresh machine)
        #[arg(long)]
        test: bool,
    },
    /// Set up only what the demo needs (toolchain, tracefs, gcc, the leaky
    /// fixture), build, then trace the leaking fixture for 5 s and print the
    /// report
    Demo {
        /// Print what would be installed or built, change nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Setup, then run every test and the short benchmark; arguments go to
    /// `cargo test` (the benchmark is then left out), and those after a
    /// second `--` to the test binaries. The tests of `cargo xtask dist`'s
    /// files are listed as ignored: `cargo xtask dist --test` runs them
    Test {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build, then measure tracer's overhead next to the naive and site
    /// floors; print a table, write target/bench/bench.json
    Bench {
        /// The CI form (< 2 minutes): fails if exact mode is slower than the
        /// naive floor or malloc/free probes are single-stepped
        #[arg(long)]
        short: bool,
        /// Only the real ML rows (TensorFlow's load loop, the S1 export
        /// loop), in the venvs of `cargo xtask setup --ml`
        #[arg(long, conflicts_with = "short")]
        ml: bool,
        /// Only the exceptions row: a probe on each `ret` of a function
        /// against a uretprobe
        #[arg(long, conflicts_with_all = ["short", "ml"])]
        exceptions: bool,
    },
    /// Build, then trace a fixture at a steady allocation rate with a steady
    /// leak for a long time (not in CI); print the tracer's RSS and CPU over
    /// time and check the report is still exact
    Soak {
        /// How long, in seconds
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        /// tracer as a daemon (--comm, --listen) on a target killed and
        /// started again every 10 s, scraped every second
        #[arg(long)]
        restarting: bool,
    },
    /// Install cargo-fuzz and the toolchain, build the fuzz targets
    /// (fuzz/), run each for the given time over its seeds and regression
    /// inputs; fails on any crash
    Fuzz {
        /// Seconds each target runs
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Only this target
        #[arg(long)]
        only: Option<String>,
    },
    /// Run clippy (warnings are errors) and check formatting
    Lint,
}

fn main() -> ExitCode {
    match run(Cli::parse().task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(task: Task) -> Result<()> {
    let root = workspace_root();
    match task {
        Task::Setup { dry_run, ml } => {
            let mut shell = Shell::new(dry_run);
            if ml {
                setup::setup_ml(&mut shell, &root)
            } else {
                setup::setup(&mut shell, &root)
            }
        }
        Task::Build => {
            let shell = setup_shell(&root)?;
            build(&shell)
        }
        Task::Demo { dry_run } => {
            let mut shell = Shell::new(dry_run);
            let linker = setup::setup_demo(&mut shell, &root)?;
            build_beside(&shell, linker)?;
            if dry_run {
                return Ok(());
            }
            demo::demo(&root)
        }
        Task::Dist { test: false } => {
            let mut shell = Shell::new(false);
            setup::setup_toolchain(&mut shell, &root)?;
            dist::dist(&shell, &root)
        }
        Task::Dist { test: true } => {
            let shell = setup_shell(&root)?;
            dist::dist(&shell, &root)?;
            userland::ensure_debian11(&shell, &root)?;
            let args = [
                "-p",
                "tracer",
                "--test",
                "integration",
                "--",
                "--include-ignored",
                "dist::",
            ];
            test(&shell, &args.map(str::to_owned))
        }
        Task::Test { args } => {
            let shell = setup_shell(&root)?;
            test(&shell, &args)?;
            if args.is_empty() {
                build(&shell)?;
                bench::bench(&root, true)?;
            }
            Ok(())
        }
        Task::Soak {
            seconds,
            restarting,
        } => {
            let shell = setup_shell(&root)?;
            build(&shell)?;
            if restarting {
                soak::soak_restarting(&root, seconds)
            } else {
                soak::soak(&root, seconds)
            }
        }
        Task::Bench {
            short,
            ml,
            exceptions,
        } => {
            let shell = setup_shell(&root)?;
            build(&shell)?;
            if exceptions {
                bench::bench_exceptions_only(&root)
            } else if ml {
                bench::bench_ml_only(&root)
            } else {
                bench::bench(&root, short)
            }
        }
        Task::Fuzz { seconds, only } => {
            let mut shell = Shell::new(false);
            setup::setup_toolchain(&mut shell, &root)?;
            fuzz::fuzz(&shell, &root, seconds, only.as_deref())
        }
        Task::Lint => lint(&Shell::new(false), &root),
    }
}

/// The workspace root: the parent of this crate's directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// Runs `setup` and returns the shell it configured (PATH for bpf-linker).
fn setup_shell(root: &Path) -> Result<Shell> {
    let mut shell = Shell::new(false);
    setup::setup(&mut shell, root)?;
    Ok(shell)
}

/// `build`, beside a bpf-linker still building: tracer's build script waits
/// for it (the marker file) while cargo compiles the dependencies.
fn build_beside(shell: &Shell, linker: Option<setup::BpfLinkerInstall>) -> Result<()> {
    let Some(linker) = linker else {
        return build(shell);
    };
    let mut command = shell.cmd("cargo");
    command
        .args(["build", "--release", "-p", "tracer"])
        .env("TRACER_BPF_LINKER_PENDING", &linker.marker);
    let line = shell::display(&command);
    eprintln!("$ {line}");
    let mut cargo = command
        .spawn()
        .with_context(|| format!("could not start `{line}`"))?;
    let installed = linker.wait();
    let built = cargo.wait();
    installed?;
    let status = built.with_context(|| format!("`{line}` was lost"))?;
    if !status.success() {
        anyhow::bail!("`{line}` failed: {status}");
    }
    Ok(())
}

fn build(shell: &Shell) -> Result<()> {
    shell.run(
        shell
            .cmd("cargo")
            .args(["build", "--release", "-p", "tracer"]),
    )
}

/// `cargo test --workspace --release --no-fail-fast [cargo args] --
/// --test-threads=2 [test args]`: every test target (the unit tests, and
/// the one integration binary with a module per area) runs even after one
/// fails, so a run shows all failures; `--workspace` is left out when the
/// cargo args pick packages themselves.
fn test(shell: &Shell, args: &[String]) -> Result<()> {
    if !is_root() {
        eprintln!("xtask: warning: the integration tests load eBPF programs and fail without root");
    }
    let (cargo_args, test_args) = match args.iter().position(|arg| arg == "--") {
        Some(split) => (&args[..split], &args[split + 1..]),
        None => (args, &[][..]),
    };
    let picks_packages = cargo_args
        .iter()
        .any(|arg| arg == "-p" || arg.starts_with("--package"));
    let mut command = shell.cmd("cargo");
    command.arg("test");
    if !picks_packages {
        command.arg("--workspace");
    }
    shell.run(
        command
            .args(["--release", "--no-fail-fast"])
            .args(cargo_args)
            .args(["--", "--test-threads=2"])
            .args(test_args),
    )
}

fn lint(shell: &Shell, root: &std::path::Path) -> Result<()> {
    shell.run(shell.cmd("cargo").args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    shell.run(shell.cmd("cargo").args(["fmt", "--all", "--check"]))?;
    // The house's checks (issue 46): the module layers and no circle; a
    // run's config, and its parts, come back up at most 3 times from
    // `record::run`; no wide struct or long file without a written reason.
    for (script, args) in [
        ("module-graph.py", &["--check"][..]),
        ("config-flow.py", &["--parts", "--check", "3"][..]),
        ("sizes.py", &["--check"][..]),
    ] {
        shell.run(
            shell
                .cmd("python3")
                .arg(root.join("scripts").join(script))
                .args(args)
                .current_dir(root),
        )?;
    }
    Ok(())
}
