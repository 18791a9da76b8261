//! Builds the eBPF programs (tracer-ebpf's bin target) for the bpf target
//! with aya-build, on nightly with rust-src and bpf-linker (`cargo xtask
//! setup` installs both). `src/attach.rs` embeds the resulting object.
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    wait_for_bpf_linker()?;
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let ebpf_dir = std::path::Path::new(&manifest_dir)
        .parent()
        .ok_or_else(|| anyhow!("tracer has no parent directory"))?
        .join("tracer-ebpf");
    let ebpf_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?;
    aya_build::build_ebpf(
        [Package {
            name: "tracer-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        Toolchain::default(),
    )
}

/// `cargo xtask demo` on a machine without bpf-linker builds it beside this
/// build and names a marker file that exists until it is installed: the
/// dependencies compile meanwhile, the eBPF object links once it is there.
fn wait_for_bpf_linker() -> anyhow::Result<()> {
    let Some(marker) = std::env::var_os("TRACER_BPF_LINKER_PENDING") else {
        return Ok(());
    };
    let marker = std::path::PathBuf::from(marker);
    let started = std::time::Instant::now();
    while marker.exists() {
        if started.elapsed() > std::time::Duration::from_secs(1800) {
            anyhow::bail!(
                "bpf-linker was not installed after 30 minutes ({} is still there)",
                marker.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    Ok(())
}
