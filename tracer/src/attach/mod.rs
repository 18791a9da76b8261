//! Loads the eBPF programs and attaches them to the target processes: one
//! uprobe (and one uretprobe where the result is needed) per allocator
//! function, in whichever mapped object defines it, scoped to the target's
//! PID so other processes pay nothing. Libraries mapped later (dlopen) are
//! noticed and hooked by `libraries`.
//!
//! The mapping system calls (mmap, munmap, mremap, brk, mprotect) are
//! followed by tracepoints (`mappings`), filtered in the kernel to the
//! targets.
//!
//! When calls may go unrecorded (sampling, size filters) and the kernel
//! has uprobe sessions, the entry and return programs of a function are one
//! session program (`session`), so an unrecorded call skips its return.
pub mod cuda;
pub mod libraries;
pub mod mappings;
pub mod prologue;
pub mod session;
pub mod spawn;
pub mod symbols;

use std::{cell::RefCell, fs, num::NonZeroU32};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, Queue, RingBuf},
    programs::{
        Program, TracePoint, UProbe,
        trace_point::TracePointLinkId,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};

use crate::{
    collect::{copied::CopiedStacks, mappings::MappingTracker},
    error::{ExitCode, fatal},
    procfs, tracefs,
    unwind::{UnwindMode, Unwinding},
};
use libraries::{HookedLibrary, LibraryWatch, NoticedBy};
use session::SessionPrograms;
pub use symbols::HookSite;
use tracer_ebpf::sampling::{PROBABILITY_ONE, SAMPLE_STEPS_PER_PERIOD, SAMPLE_TABLE_LEN};

/// The benchmark's empty programs.
const FLOOR_ENTRY_PROGRAM: &str = "floor_enter";
const FLOOR_RETURN_PROGRAM: &str = "floor_return";

/// What the probes record: every allocation or a sample, of which sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampling {
    /// Sampling period in bytes (`--sample-bytes`); 0: every allocation.
    pub sample_bytes: u64,
    /// Seed of the sampling decisions; 0: a random one per thread.
    pub sample_seed: u64,
    /// Blocks smaller than this are not recorded.
    pub min_size_bytes: u64,
    /// Blocks larger than this are not recorded.
    pub max_size_bytes: u64,
}

impl Sampling {
    /// Every allocation of every size.
    pub const EXACT: Sampling = Sampling {
        sample_bytes: 0,
        sample_seed: 0,
        min_size_bytes: 0,
        max_size_bytes: u64::MAX,
    };

    /// Whether some calls are not recorded, so may skip their return.
    pub fn skips_calls(&self) -> bool {
        self.sample_bytes != 0 || self.min_size_bytes != 0 || self.max_size_bytes != u64::MAX
    }
}

/// How return values reach the eBPF programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReturnProbes {
    /// A uretprobe on every allocator function that returns a block.
    Uretprobe,
    /// uprobe session programs: unrecorded calls skip the return.
    Session,
    /// Sessions were wanted but the kernel refused them (the reason).
    UretprobeFallback(String),
}

impl ReturnProbes {
    pub fn describe(&self) -> String {
        match self {
            ReturnProbes::Uretprobe => "uretprobe".to_owned(),
            ReturnProbes::Session => "uprobe session".to_owned(),
            ReturnProbes::UretprobeFallback(why) => {
                format!("uretprobe (uprobe sessions unavailable: {why})")
            }
        }
    }
}

/// Where the benchmark's empty floor programs go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorSites {
    /// The function entry, where other uprobe tools probe.
    FunctionEntry,
    /// The sites tracer chooses (`prologue`).
    Chosen,
}

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

/// How big the kernel tables are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Outstanding blocks (LIVE).
    pub live_allocs: u32,
    /// Distinct stacks (STACKS; BY_STACK holds four times as many per-stack
    /// totals: one stack may hold several kinds in several processes).
    pub stacks: u32,
    /// Bytes of the ring buffer of mapping calls (a power of two, whole
    /// pages).
    pub mapping_ring_bytes: u32,
}

impl Capacity {
    /// The defaults of `tracer record`.
    pub const DEFAULT: Capacity = Capacity {
        live_allocs: 1 << 20,
        stacks: 1 << 14,
        mapping_ring_bytes: 1 << 20,
    };
}

/// The loaded eBPF object: programs and maps.
pub struct Probes {
    pub ebpf: Ebpf,
    pub hooks: Vec<AttachedHook>,
    pub return_probes: ReturnProbes,
    /// The objects hooks were put in, and when.
    pub libraries: Vec<HookedLibrary>,
    /// The mapping calls of the targets, drained from the kernel's ring
    /// buffer by collect (a RefCell: the views that read stacks hold the
    /// probes shared while collect drains).
    pub mappings: RefCell<MappingTracker>,
    /// Blocks whose stacks were copied (`--unwind dwarf`), drained and
    /// unwound by collect.
    pub copied: RefCell<CopiedStacks>,
    /// How stacks are taken.
    pub unwinding: Unwinding,
    /// `--unwind auto`: the processes unwound with DWARF, and the objects
    /// without frame pointers that made it so.
    pub copying_stacks_of: Vec<(u32, Vec<String>)>,
    links: Vec<(&'static str, UProbeLinkId)>,
    mapping_links: Vec<TracePointLinkId>,
    session: Option<SessionPrograms>,
    watch: LibraryWatch,
}

impl Probes {
    /// Loads the embedded eBPF object and its programs, configured for
    /// `sampling` (the session programs only when calls may be skipped),
    /// with the tables sized as `capacity` asks.
    pub fn load(capacity: Capacity, sampling: &Sampling, unwinding: &Unwinding) -> Result<Probes> {
        let Capacity {
            live_allocs: max_live_allocs,
            stacks: max_stacks,
            mapping_ring_bytes,
        } = capacity;
        raise_memlock_limit();
        let mmap = tracefs::mmap_offsets()?;
        let object = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));
        let skip_chance = skip_chance_table();
        tracefs::ensure_mounted()?;
        let fork_child_offset =
            tracefs::event_field_offset("sched", "sched_process_fork", "child_pid");
        let field_offsets = mappings::read_field_offsets().map_err(|error| {
            fatal(
                ExitCode::KernelUnsupported,
                format!("cannot follow mmap, munmap, mremap and brk: {error:#}"),
            )
        })?;
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("LIVE", max_live_allocs)
            .map_max_entries("STACKS", max_stacks)
            .map_max_entries("BY_STACK", max_stacks.saturating_mul(4))
            .map_max_entries("MAPPING_EVENTS", mapping_ring_bytes)
            .map_max_entries(
                "STACK_COPIES",
                if unwinding.mode == UnwindMode::FramePointers {
                    // Never written: the smallest ring there is.
                    4096
                } else {
                    unwinding.ring_bytes
                },
            )
            .override_global("STACK_COPY_MODE", &unwinding.copy_mode(), true)
            .override_global("STACK_PAGES", &unwinding.stack_pages(), true)
            .override_global("SAMPLE_BYTES", &sampling.sample_bytes, true)
            .override_global("SAMPLE_SEED", &sampling.sample_seed, true)
            .override_global("MIN_SIZE_BYTES", &sampling.min_size_bytes, true)
            .override_global("MAX_SIZE_BYTES", &sampling.max_size_bytes, true)
            .override_global("SAMPLE_SKIP_CHANCE", &skip_chance, true)
            .override_global("MMAP_PROT_OFFSET", &mmap.prot, true)
            .override_global("MMAP_FD_OFFSET", &mmap.fd, true)
            .override_global("SYSCALL_FIELD_OFFSETS", &field_offsets, true)
            .override_global(
                "FORK_CHILD_PID_OFFSET",
                &fork_child_offset.unwrap_or(0),
                true,
            )
            .load(object)
            .map_err(|error| load_error(error.into()))?;
        // Session programs are loaded apart (`session`), only when used;
        // the fork tracepoint only with --follow-forks (`watch_forks`).
        for (name, program) in ebpf.programs_mut() {
            if name.ends_with("_session")
                || name == FORK_PROGRAM
                || mappings::is_mapping_program(name)
            {
                continue;
            }
            match program {
                Program::UProbe(program) => program.load(),
                Program::TracePoint(program) => program.load(),
                _ => continue,
            }
            .map_err(|error| load_error(error.into()))
            .with_context(|| format!("could not load eBPF program {name}"))?;
        }
        attach_signal_tracepoints(&mut ebpf)?;
        let (session, return_probes) = if sampling.skips_calls() {
            match SessionPrograms::load(object, &ebpf) {
                Ok(session) => (Some(session), ReturnProbes::Session),
                Err(error) => (None, ReturnProbes::UretprobeFallback(format!("{error:#}"))),
            }
        } else {
            (None, ReturnProbes::Uretprobe)
        };
        // After the session loader, which looks up every map of the object
        // (the watch takes EVENTS out of it).
        let watch = LibraryWatch::start(&mut ebpf)?;
        let mapping_links = mappings::attach_tracepoints(&mut ebpf)
            .map_err(|error| load_error(error.context("could not follow mapping calls")))?;
        // After the session loader, which looks up every map of the object.
        let events = ebpf
            .take_map("MAPPING_EVENTS")
            .context("eBPF object lacks MAPPING_EVENTS")?;
        let events = RingBuf::try_from(events).context("MAPPING_EVENTS is not a ring buffer")?;
        let copies = ebpf
            .take_map("STACK_COPIES")
            .context("eBPF object lacks STACK_COPIES")?;
        let mut copied = CopiedStacks::new(copies);
        if unwinding.mode == UnwindMode::Dwarf {
            copied.activate()?;
        }
        Ok(Probes {
            ebpf,
            hooks: Vec::new(),
            return_probes,
            libraries: Vec::new(),
            mappings: RefCell::new(MappingTracker::new(events)),
            copied: RefCell::new(copied),
            unwinding: *unwinding,
            copying_stacks_of: Vec::new(),
            links: Vec::new(),
            mapping_links,
            session,
            watch,
        })
    }

    /// Attaches the allocator and CUDA probes to every object `pid` maps
    /// that defines such functions, and watches it for libraries mapped
    /// later.
    pub fn attach_allocators(&mut self, pid: u32) -> Result<usize> {
        let (maps, sites) = allocator_sites(pid)?;
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
        self.choose_unwinding(pid, &maps)?;
        let before = self.probe_count();
        self.watch.trace(pid, &maps)?;
        self.attach_sites(pid, &sites, NoticedBy::Attach)?;
        Ok(self.probe_count() - before)
    }

    /// `--unwind auto`: copies the stacks of `pid` when an object it maps
    /// (other than glibc's) lacks frame pointers.
    fn choose_unwinding(&mut self, pid: u32, maps: &[procfs::Mapping]) -> Result<()> {
        if self.unwinding.mode != UnwindMode::Auto {
            return Ok(());
        }
        let lacking = crate::unwind::frame_pointers::objects_lacking(pid, maps);
        self.start_copying(pid, lacking)
    }

    /// `--unwind auto`: copies the stacks of `pid` from now on when one of
    /// its objects in `lacking` has no frame pointers (none: nothing to do).
    pub(crate) fn start_copying(&mut self, pid: u32, lacking: Vec<String>) -> Result<()> {
        if lacking.is_empty() || self.copies_stacks_of(pid) {
            return Ok(());
        }
        let mut copy_stacks_of: aya::maps::HashMap<_, u32, u32> = aya::maps::HashMap::try_from(
            self.ebpf
                .map_mut("COPY_STACKS_OF")
                .context("eBPF object lacks COPY_STACKS_OF")?,
        )?;
        copy_stacks_of
            .insert(pid, 1, 0)
            .with_context(|| format!("could not ask for the stacks of PID {pid} to be copied"))?;
        self.copied.borrow_mut().activate()?;
        self.copying_stacks_of.push((pid, lacking));
        Ok(())
    }

    /// Whether the stacks of `pid` are copied and unwound with DWARF.
    pub fn copies_stacks_of(&self, pid: u32) -> bool {
        match self.unwinding.mode {
            UnwindMode::FramePointers => false,
            UnwindMode::Dwarf => true,
            UnwindMode::Auto => self
                .copying_stacks_of
                .iter()
                .any(|(copied, _)| *copied == pid),
        }
    }

    /// Attaches the probes of `sites`, return probes first, so that a
    /// call whose entry is seen always has its return seen too. With
    /// uprobe sessions, a session program is both.
    fn attach_sites(&mut self, pid: u32, sites: &[HookSite], noticed_by: NoticedBy) -> Result<()> {
        let in_session = |site: &HookSite, session: &Option<SessionPrograms>| {
            session
                .as_ref()
                .is_some_and(|session| session.covers(site.function.entry_program))
        };
        for site in sites {
            if let Some(return_program) = site.function.return_program
                && !in_session(site, &self.session)
            {
                self.attach_one(return_program, None, site, site.offset, pid)?;
            }
        }
        for site in sites {
            let cookie = Some(site.function.cookie).filter(|&cookie| cookie != 0);
            match self.session.as_mut() {
                Some(session) if session.covers(site.function.entry_program) => session
                    .attach(
                        site.function.entry_program,
                        &site.host_path,
                        site.offset,
                        pid,
                        site.function.cookie,
                    )
                    .map_err(|error| attach_error(error, pid))?,
                _ => {
                    self.attach_one(site.function.entry_program, cookie, site, site.offset, pid)?
                }
            }
            self.hooks.push(AttachedHook {
                pid,
                site: site.clone(),
            });
        }
        self.libraries
            .extend(HookedLibrary::from_sites(pid, sites, noticed_by));
        Ok(())
    }

    /// The benchmark's floor: the empty `floor_enter` on every allocator
    /// function, and `floor_return` where tracer puts a return probe
    /// (unless `with_return` is false), at `sites`.
    pub fn attach_floor(&mut self, pid: u32, sites: FloorSites, with_return: bool) -> Result<()> {
        for site in allocator_sites(pid)?.1 {
            let offset = match sites {
                FloorSites::FunctionEntry => site.function_offset,
                FloorSites::Chosen => site.offset,
            };
            if with_return && site.function.return_program.is_some() {
                self.attach_one(FLOOR_RETURN_PROGRAM, None, &site, offset, pid)?;
            }
            self.attach_one(FLOOR_ENTRY_PROGRAM, None, &site, offset, pid)?;
            let emulated = match sites {
                FloorSites::FunctionEntry => site.offset == site.function_offset && site.emulated,
                FloorSites::Chosen => site.emulated,
            };
            self.hooks.push(AttachedHook {
                pid,
                site: HookSite {
                    offset,
                    emulated,
                    ..site
                },
            });
        }
        Ok(())
    }

    fn attach_one(
        &mut self,
        program_name: &'static str,
        cookie: Option<u64>,
        site: &HookSite,
        offset: u64,
        pid: u32,
    ) -> Result<()> {
        let scope = UProbeScope::OneProcess(nonzero_pid(pid)?);
        let program: &mut UProbe = program(&mut self.ebpf, program_name)?;
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie,
        };
        let link = program
            .attach(point, &site.host_path, scope)
            .map_err(|error| {
                attach_error(
                    anyhow::Error::new(error).context(format!(
                        "could not attach {program_name} to {} in {}",
                        site.function.name,
                        site.path.display()
                    )),
                    pid,
                )
            })?;
        self.links.push((program_name, link));
        Ok(())
    }

    /// Follows `pid`'s mapping calls from now on (from its current program
    /// break on).
    pub fn trace_mappings(&mut self, pid: u32) -> Result<()> {
        self.mappings.get_mut().start(pid);
        mappings::add_target(&mut self.ebpf, pid)
    }

    /// Number of uprobes, uretprobes, uprobe sessions and tracepoints in
    /// place.
    pub fn probe_count(&self) -> usize {
        self.links.len()
            + self.mapping_links.len()
            + self.session.as_ref().map_or(0, SessionPrograms::link_count)
    }
}

/// The mappings of `pid` and the allocator functions in them, with their
/// probe sites.
fn allocator_sites(pid: u32) -> Result<(Vec<procfs::Mapping>, Vec<HookSite>)> {
    let maps = procfs::read_maps(pid)
        .map_err(|error| fatal(ExitCode::NoTarget, format!("PID {pid}: {error:#}")))?;
    let sites = symbols::find_hook_sites(pid, &maps)?;
    // An exiting process has no mappings left: not a target without an
    // allocator.
    if maps.is_empty() || !procfs::is_alive(pid) {
        return Err(fatal(
            ExitCode::NoTarget,
            format!("PID {pid} exited during attach"),
        ));
    }
    Ok((maps, sites))
}

/// An attach failure, or the target's exit when that is what caused it.
fn attach_error(error: anyhow::Error, pid: u32) -> anyhow::Error {
    if procfs::is_alive(pid) {
        error
    } else {
        fatal(
            ExitCode::NoTarget,
            format!("PID {pid} exited during attach"),
        )
    }
}

/// `exp(-i / SAMPLE_STEPS_PER_PERIOD)` in units of 2^-32: the chance that
/// the sampling skips a block of i steps (see `tracer_ebpf::sampling`).
fn skip_chance_table() -> [u64; SAMPLE_TABLE_LEN] {
    std::array::from_fn(|step| {
        let periods = step as f64 / SAMPLE_STEPS_PER_PERIOD as f64;
        ((-periods).exp() * PROBABILITY_ONE as f64).round() as u64
    })
}

/// The program that announces new tasks of followed processes
/// (tracer-ebpf/src/forks.rs).
const FORK_PROGRAM: &str = "process_fork";

impl Probes {
    /// Starts announcing the children of followed processes (`follow`):
    /// attaches the sched_process_fork tracepoint.
    pub fn watch_forks(&mut self) -> Result<()> {
        if tracefs::event_field_offset("sched", "sched_process_fork", "child_pid").is_none() {
            return Err(fatal(
                ExitCode::KernelUnsupported,
                "this kernel's sched:sched_process_fork tracepoint has no child_pid field: \
                 --follow-forks cannot work here",
            ));
        }
        let program: &mut TracePoint = self
            .ebpf
            .program_mut(FORK_PROGRAM)
            .with_context(|| format!("eBPF object lacks program {FORK_PROGRAM}"))?
            .try_into()
            .with_context(|| format!("eBPF program {FORK_PROGRAM} is not a tracepoint"))?;
        program
            .load()
            .map_err(|error| load_error(error.into()))
            .with_context(|| format!("could not load eBPF program {FORK_PROGRAM}"))?;
        program
            .attach("sched", "sched_process_fork")
            .context("could not attach to tracepoint sched:sched_process_fork")?;
        Ok(())
    }

    /// Announces the children of `pid` from now on (see `watch_forks`).
    pub fn follow(&mut self, pid: u32) -> Result<()> {
        let mut followed: HashMap<&mut MapData, u32, u32> = HashMap::try_from(
            self.ebpf
                .map_mut("FOLLOWED")
                .context("eBPF object lacks FOLLOWED")?,
        )?;
        followed
            .insert(pid, 1, 0)
            .with_context(|| format!("could not follow the children of PID {pid}"))
    }

    /// New tasks of followed processes since the last call: processes and
    /// threads alike.
    pub fn take_forks(&mut self) -> Vec<u32> {
        let Some(map) = self.ebpf.map_mut("FORKS") else {
            return Vec::new();
        };
        let Ok(mut forks) = Queue::<&mut MapData, u32>::try_from(map) else {
            return Vec::new();
        };
        std::iter::from_fn(|| forks.pop(0).ok()).collect()
    }
}

/// The tracepoints that set a thread's allocator state aside while a
/// signal handler runs on it (tracer-ebpf/src/signals.rs): program,
/// category, event.
const SIGNAL_TRACEPOINTS: [(&str, &str, &str); 2] = [
    ("signal_deliver", "signal", "signal_deliver"),
    ("signal_return", "syscalls", "sys_enter_rt_sigreturn"),
];

/// Attaches the signal tracepoints (loaded with the other programs). They stay attached as long as
/// the object lives and cost other processes one hash lookup per signal.
fn attach_signal_tracepoints(ebpf: &mut Ebpf) -> Result<()> {
    for (name, category, event) in SIGNAL_TRACEPOINTS {
        let program: &mut TracePoint = ebpf
            .program_mut(name)
            .with_context(|| format!("eBPF object lacks program {name}"))?
            .try_into()
            .with_context(|| format!("eBPF program {name} is not a tracepoint"))?;
        program
            .attach(category, event)
            .with_context(|| format!("could not attach to tracepoint {category}:{event}"))?;
    }
    Ok(())
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
