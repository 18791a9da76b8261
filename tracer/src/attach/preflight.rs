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
