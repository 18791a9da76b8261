//! Checks made before anything is loaded: privileges, the kernel's
//! support, and that each `--pid` is a process tracer can trace. Each
//! failure is a one-line error that says what to do.
use std::{fs, path::Path};

use anyhow::{Context as _, Result};

use crate::{
    error::{ExitCode, fatal},
    procfs,
};

/// Fails unless this process may load eBPF and attach uprobes.
pub fn check_privileges() -> Result<()> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status =
        fs::read_to_string("/proc/self/status").context("could not read /proc/self/status")?;
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    let has = |capability: u32| effective & (1 << capability) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        Ok(())
    } else {
        Err(fatal(
            ExitCode::Permission,
            "tracer needs root (or CAP_BPF and CAP_PERFMON) to load eBPF programs: run it with sudo",
        ))
    }
}

/// Fails unless the kernel has BTF and uprobe support.
pub fn check_kernel() -> Result<()> {
    if !Path::new("/sys/bus/event_source/devices/uprobe/type").exists() {
        return Err(fatal(
            ExitCode::KernelUnsupported,
            "this kernel has no uprobe support (no /sys/bus/event_source/devices/uprobe): \
             tracer needs a kernel built with CONFIG_UPROBE_EVENTS",
        ));
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(fatal(
            ExitCode::KernelUnsupported,
            "this kernel has no BTF (no /sys/kernel/btf/vmlinux): tracer needs a kernel built \
             with CONFIG_DEBUG_INFO_BTF (Linux >= 5.11 distributions ship it)",
        ));
    }
    Ok(())
}

/// What this kernel offers tracer, as `tracer --version` prints it: a
/// copied binary meets kernels of every age, and which of its paths it
/// takes there is the first thing to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFeatures {
    /// `uname -r`.
    pub release: String,
    /// /sys/kernel/btf/vmlinux (needed).
    pub btf: bool,
    /// The uprobe perf event source (needed).
    pub uprobes: bool,
    /// uprobe_multi links (Linux 6.6+; else one perf event per probe).
    pub uprobe_multi: bool,
    /// uprobe session programs (Linux 6.13+; else entry and return probes).
    pub uprobe_session: bool,
    /// Where tracefs is mounted, if it is.
    pub tracefs: Option<&'static str>,
    /// Root, or CAP_BPF and CAP_PERFMON.
    pub privileged: bool,
}

impl KernelFeatures {
    /// Looks, without loading anything: the link kinds are named in the
    /// kernel's own BTF (enum bpf_attach_type), so a kernel that lists
    /// them knows them (tracer still falls back if a load fails).
    pub fn detect() -> Self {
        let btf = fs::read("/sys/kernel/btf/vmlinux").ok();
        let names = |name: &str| {
            btf.as_deref().is_some_and(|bytes| {
                let needle = [name.as_bytes(), b"\0"].concat();
                bytes.windows(needle.len()).any(|window| window == needle)
            })
        };
        Self {
            release: fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(
                |_| "unknown".to_owned(),
                |release| release.trim().to_owned(),
            ),
            btf: btf.is_some(),
            uprobes: Path::new("/sys/bus/event_source/devices/uprobe/type").exists(),
            uprobe_multi: names("BPF_TRACE_UPROBE_MULTI"),
            uprobe_session: names("BPF_TRACE_UPROBE_SESSION"),
            tracefs: crate::tracefs::mounted_at(),
            privileged: check_privileges().is_ok(),
        }
    }
}

impl std::fmt::Display for KernelFeatures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let yes = |found: bool, missing: &'static str| if found { "yes" } else { missing };
        writeln!(f, "kernel: Linux {}", self.release)?;
        writeln!(
            f,
            "  BTF (/sys/kernel/btf/vmlinux): {}",
            yes(
                self.btf,
                "NO: tracer cannot run (needs CONFIG_DEBUG_INFO_BTF)"
            )
        )?;
        writeln!(
            f,
            "  uprobes: {}",
            yes(
                self.uprobes,
                "NO: tracer cannot run (needs CONFIG_UPROBE_EVENTS)"
            )
        )?;
        writeln!(
            f,
            "  uprobe_multi links (6.6+): {}",
            yes(
                self.uprobe_multi,
                "no: one perf event per probe (slower attach and exit)"
            )
        )?;
        writeln!(
            f,
            "  uprobe sessions (6.13+): {}",
            yes(
                self.uprobe_session,
                "no: an entry and a return probe on every call"
            )
        )?;
        writeln!(
            f,
            "  tracefs: {}",
            self.tracefs
                .unwrap_or("not mounted (tracer mounts it at /sys/kernel/tracing as root)")
        )?;
        write!(
            f,
            "  privileges: {}",
            yes(
                self.privileged,
                "missing: run as root (or with CAP_BPF and CAP_PERFMON)"
            )
        )
    }
}

/// Fails with a clear reason unless `pid` is a live user-space process.
pub fn check_target(pid: u32) -> Result<()> {
    match procfs::state(pid) {
        None => Err(fatal(
            ExitCode::NoTarget,
            format!("no process with PID {pid} (check it with `ps -p {pid}`)"),
        )),
        Some('Z' | 'X') => Err(fatal(
            ExitCode::NoTarget,
            format!("PID {pid} has exited (it is a zombie): nothing left to trace"),
        )),
        Some(_) => {
            let maps = procfs::read_maps(pid)
                .map_err(|error| fatal(ExitCode::NoTarget, format!("PID {pid}: {error:#}")))?;
            if maps.is_empty() {
                return Err(fatal(
                    ExitCode::NoTarget,
                    format!("PID {pid} is a kernel thread: it has no user-space memory to trace"),
                ));
            }
            Ok(())
        }
    }
}
