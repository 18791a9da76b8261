//! Loads the eBPF programs and attaches them to the target processes: one
//! uprobe (and one uretprobe where the result is needed) per allocator
//! function, in whichever mapped object defines it, scoped to the target's
//! PID so other processes pay nothing.
pub mod prologue;
pub mod spawn;
pub mod symbols;

use std::{fs, num::NonZeroU32};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf, EbpfLoader,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeLinkId, UProbeScope},
    },
};

use crate::{
    error::{ExitCode, fatal},
    procfs,
};
pub use symbols::HookSite;

/// The return program shared by every allocator function.
const RETURN_PROGRAM: &str = "alloc_return";

/// A hook that is in place: where, and in which process.
#[derive(Clone, Debug)]
pub struct AttachedHook {
    pub pid: u32,
    pub site: HookSite,
}

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
    if !std::path::Path::new("/sys/bus/event_source/devices/uprobe/type").exists() {
        return Err(fatal(
            ExitCode::KernelUnsupported,
            "this kernel has no uprobe support (no /sys/bus/event_source/devices/uprobe): \
             tracer needs a kernel built with CONFIG_UPROBE_EVENTS",
        ));
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
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

/// The loaded eBPF object: programs and maps.
pub struct Probes {
    pub ebpf: Ebpf,
    pub hooks: Vec<AttachedHook>,
    links: Vec<(&'static str, UProbeLinkId)>,
}

impl Probes {
    /// Loads the embedded eBPF object and every program in it, with the
    /// tables sized as asked: `max_live_allocs` outstanding blocks,
    /// `max_stacks` distinct stacks (and four times as many per-stack
    /// totals: one stack may hold several kinds in several processes).
    pub fn load(max_live_allocs: u32, max_stacks: u32) -> Result<Probes> {
        raise_memlock_limit();
        let object = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("LIVE", max_live_allocs)
            .map_max_entries("STACKS", max_stacks)
            .map_max_entries("BY_STACK", max_stacks.saturating_mul(4))
            .load(object)
            .map_err(|error| load_error(error.into()))?;
        let names: Vec<String> = ebpf.programs().map(|(name, _)| name.to_owned()).collect();
        for name in names {
            let program: &mut UProbe = program(&mut ebpf, &name)?;
            program
                .load()
                .map_err(|error| load_error(error.into()))
                .with_context(|| format!("could not load eBPF program {name}"))?;
        }
        Ok(Probes {
            ebpf,
            hooks: Vec::new(),
            links: Vec::new(),
        })
    }

    /// Attaches the allocator probes to every object `pid` maps that
    /// defines allocator functions. Return probes go in first, so that a
    /// call whose entry is seen always has its return seen too.
    pub fn attach_allocators(&mut self, pid: u32) -> Result<usize> {
        let maps = procfs::read_maps(pid)
            .map_err(|error| fatal(ExitCode::NoTarget, format!("PID {pid}: {error:#}")))?;
        let sites = symbols::find_hook_sites(pid, &maps)?;
        if maps.is_empty() || !procfs::is_alive(pid) {
            return Err(fatal(
                ExitCode::NoTarget,
                format!("PID {pid} exited during attach"),
            ));
        }
        if !sites
            .iter()
            .any(|site| site.function.name == "malloc" || site.function.name == "free")
        {
            return Err(fatal(
                ExitCode::NoAllocator,
                format!(
                    "PID {pid} ({}) maps no object that defines malloc or free: a static \
                     binary without symbols, or an allocator tracer does not know",
                    procfs::command_line(pid)
                ),
            ));
        }
        let before = self.links.len();
        for site in sites.iter().filter(|site| site.function.has_return) {
            self.attach_one(RETURN_PROGRAM, site, pid)?;
        }
        for site in &sites {
            self.attach_one(site.function.entry_program, site, pid)?;
            self.hooks.push(AttachedHook {
                pid,
                site: site.clone(),
            });
        }
        Ok(self.links.len() - before)
    }

    fn attach_one(&mut self, program_name: &'static str, site: &HookSite, pid: u32) -> Result<()> {
        let scope = UProbeScope::OneProcess(nonzero_pid(pid)?);
        let program: &mut UProbe = program(&mut self.ebpf, program_name)?;
        let link = program
            .attach(
                UProbeAttachLocation::AbsoluteOffset(site.offset),
                &site.host_path,
                scope,
            )
            .map_err(|error| {
                if procfs::is_alive(pid) {
                    anyhow::Error::new(error).context(format!(
                        "could not attach {program_name} to {} in {}",
                        site.function.name,
                        site.path.display()
                    ))
                } else {
                    fatal(
                        ExitCode::NoTarget,
                        format!("PID {pid} exited during attach"),
                    )
                }
            })?;
        self.links.push((program_name, link));
        Ok(())
    }

    /// Number of uprobes and uretprobes in place.
    pub fn probe_count(&self) -> usize {
        self.links.len()
    }
}

/// A program of the object, as a uprobe.
pub fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe> {
    ebpf.program_mut(name)
        .with_context(|| format!("eBPF object lacks program {name}"))?
        .try_into()
        .with_context(|| format!("eBPF program {name} is not a uprobe"))
}

pub fn nonzero_pid(pid: u32) -> Result<NonZeroU32> {
    NonZeroU32::new(pid).ok_or_else(|| fatal(ExitCode::NoTarget, "PID 0 is not a process"))
}

/// Kernels >= 5.11 account eBPF memory to the cgroup and ignore
/// RLIMIT_MEMLOCK; older ones need it raised. Failing to raise it is fine.
fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid rlimit struct.
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
}

/// Maps a load failure to the error a user can act on.
fn load_error(error: anyhow::Error) -> anyhow::Error {
    let text = format!("{error:#}");
    if text.contains("Operation not permitted") || text.contains("EPERM") {
        fatal(
            ExitCode::Permission,
            format!("the kernel refused to load eBPF programs ({text}): run tracer as root"),
        )
    } else {
        error.context("could not load the eBPF programs")
    }
}
