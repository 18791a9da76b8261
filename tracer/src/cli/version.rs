//! `tracer --version`: what was built (version, commit, how it links) and
//! what it found on this machine's kernel, the first thing to paste into
//! a bug report from a host tracer was copied onto.

use crate::attach::KernelFeatures;

/// The commit `cargo xtask dist` built from (`git describe`-like, with
/// `-dirty` for uncommitted changes); absent from other builds.
const COMMIT: Option<&str> = option_env!("TRACER_COMMIT");

/// The text of `tracer --version` (and `-V`).
pub(super) fn version_text() -> String {
    let linking = if cfg!(target_env = "musl") {
        "static, musl"
    } else {
        "dynamic, glibc"
    };
    let commit =
        COMMIT.unwrap_or("not recorded (a development build: `cargo xtask dist` records it)");
    format!(
        "tracer {}\ncommit: {commit}\nbuilt for: {}-linux ({linking})\n{}\n",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH,
        KernelFeatures::detect()
    )
}
