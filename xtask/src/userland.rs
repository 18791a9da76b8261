//! An older userland for tests/dist.rs: a Debian 11 (bullseye: glibc
//! 2.31, CPython 3.9) root made with debootstrap from Debian's own
//! packages, kept in target/debian11 and made once (about 3 minutes and
//! 250 MB; `rm -rf target/debian11` makes it again). The static tracer of
//! `cargo xtask dist` runs inside it against its python3, as it would on a
//! host that never saw Debian 12.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::shell::Shell;

/// Where the root is made, under the workspace.
const DEBIAN11_ROOT: &str = "target/debian11";
/// Written once debootstrap has finished: a root without it is partial.
const COMPLETE_MARKER: &str = ".tracer-complete";
const SUITE: &str = "bullseye";
/// Small (`minbase`), with the interpreter the test runs.
const PACKAGES: &str = "python3";

/// Makes the Debian 11 root unless a complete one is there.
pub fn ensure_debian11(shell: &Shell, root: &Path) -> Result<()> {
    let dir = root.join(DEBIAN11_ROOT);
    if dir.join(COMPLETE_MARKER).exists() {
        eprintln!("xtask: Debian 11 root: present in {}", dir.display());
        return Ok(());
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("could not remove the partial {}", dir.display()))?;
    }
    let mirror = debian_mirror()?;
    eprintln!(
        "xtask: Debian 11 root: making it in {} (about 3 minutes, once)",
        dir.display()
    );
    shell.run(
        shell
            .cmd("debootstrap")
            .args(["--variant=minbase", &format!("--include={PACKAGES}"), SUITE])
            .arg(&dir)
            .arg(&mirror),
    )?;
    let marker = dir.join(COMPLETE_MARKER);
    std::fs::write(&marker, b"").with_context(|| format!("could not write {}", marker.display()))
}

/// The Debian mirror this machine's apt uses (a deb822 `URIs:` line of
/// /etc/apt/sources.list.d/*.sources, or a `deb URI` line of
/// /etc/apt/sources.list), so the root comes from where its packages do.
fn debian_mirror() -> Result<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir("/etc/apt/sources.list.d")
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.push(PathBuf::from("/etc/apt/sources.list"));
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let uris = text.lines().flat_map(|line| {
            let line = line.trim();
            let words = line
                .strip_prefix("URIs:")
                .or_else(|| line.strip_prefix("deb "))
                .unwrap_or("");
            words.split_whitespace()
        });
        for uri in uris {
            if uri.starts_with("http") && uri.trim_end_matches('/').ends_with("/debian") {
                return Ok(uri.to_owned());
            }
        }
    }
    bail!(
        "no Debian mirror (a URI ending in /debian) in apt's sources under /etc/apt: \
         the Debian 11 root of tests/dist.rs is made with debootstrap from one"
    )
}
