//! Loads the eBPF programs and attaches them to the target processes: one
//! uprobe (and one uretprobe where the result is needed) per allocator
//! function, in whichever mapped object defines it, scoped to the target's
//! PID so other processes pay nothing. Libraries mapped later (dlopen) are
//! noticed and hooked by `libraries`.
pub mod cuda;
pub mod libraries;
pub mod prologue;
pub mod spawn;
pub mod symbols;

use std::{fs, num::NonZeroU32};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf, EbpfLoader,
    programs::{
        Program, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};

use crate::{
    error::{ExitCode, fatal},
    procfs, tracefs,
};
use libraries::{HookedLibrary, LibraryWatch, NoticedBy};
pub use symbols::HookSite;

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
    /// The objects hooks were put in, and when.
    pub libraries: Vec<HookedLibrary>,
    links: Vec<(&'static str, UProbeLinkId)>,
    watch: LibraryWatch,
}

impl Probes {
    /// Loads the embedded eBPF object and every program in it.
    pub fn load(max_live_allocs: u32) -> Result<Probes> {
        raise_memlock_limit();
        let mmap = tracefs::mmap_offsets()?;
        let object = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("LIVE", max_live_allocs)
            .override_global("MMAP_PROT_OFFSET", &mmap.prot, true)
            .override_global("MMAP_FD_OFFSET", &mmap.fd, true)
            .load(object)
            .map_err(|error| load_error(error.into()))?;
        for (name, program) in ebpf.programs_mut() {
            match program {
                Program::UProbe(program) => program.load(),
                Program::TracePoint(program) => program.load(),
                _ => continue,
            }
            .map_err(|error| load_error(error.into()))
            .with_context(|| format!("could not load eBPF program {name}"))?;
        }
        let watch = LibraryWatch::start(&mut ebpf)?;
        Ok(Probes {
            ebpf,
            hooks: Vec::new(),
            libraries: Vec::new(),
            links: Vec::new(),
            watch,
        })
    }

    /// Attaches the allocator and CUDA probes to every object `pid` maps
    /// that defines such functions, and watches it for libraries mapped
    /// later.
    pub fn attach_allocators(&mut self, pid: u32) -> Result<usize> {
        let maps = procfs::read_maps(pid)
            .map_err(|error| fatal(ExitCode::NoTarget, format!("PID {pid}: {error:#}")))?;
        let sites = symbols::find_hook_sites(pid, &maps)?;
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
        self.watch.trace(pid, &maps)?;
        self.attach_sites(pid, &sites, NoticedBy::Attach)?;
        Ok(self.links.len() - before)
    }

    /// Attaches the probes of `sites`, return probes first, so that a
    /// call whose entry is seen always has its return seen too.
    fn attach_sites(&mut self, pid: u32, sites: &[HookSite], noticed_by: NoticedBy) -> Result<()> {
        for site in sites {
            if let Some(return_program) = site.function.return_program {
                self.attach_one(return_program, None, site, pid)?;
            }
        }
        for site in sites {
            let cookie = Some(site.function.cookie).filter(|&cookie| cookie != 0);
            self.attach_one(site.function.entry_program, cookie, site, pid)?;
            self.hooks.push(AttachedHook {
                pid,
                site: site.clone(),
            });
        }
        self.libraries
            .extend(HookedLibrary::from_sites(pid, sites, noticed_by));
        Ok(())
    }

    fn attach_one(
        &mut self,
        program_name: &'static str,
        cookie: Option<u64>,
        site: &HookSite,
        pid: u32,
    ) -> Result<()> {
        let scope = UProbeScope::OneProcess(nonzero_pid(pid)?);
        let program: &mut UProbe = program(&mut self.ebpf, program_name)?;
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(site.offset),
            cookie,
        };
        let link = program
            .attach(point, &site.host_path, scope)
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
