//! Loads the embedded eBPF object: sizes its tables, sets its read-only
//! configuration (sampling, size filters, unwinding, tracepoint field
//! offsets), loads the programs, attaches the tracepoints every run needs,
//! and takes out the ring buffers that collect drains.
//!
//! Long: the one load of the eBPF object: its tables' sizes, read-only
//! settings, programs and tracepoints.
pub(in crate::attach) mod btf;
pub(in crate::attach) mod links;
pub mod preflight;
pub(in crate::attach) mod raw;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Map, MapData, RingBuf},
    programs::{Program, UProbe},
};
use tracer_ebpf::sampling::{PROBABILITY_ONE, SAMPLE_STEPS_PER_PERIOD, SAMPLE_TABLE_LEN};

use crate::attach::{Hooked, Links, LoaderGate, Measured, Modes, UnwindState};
use crate::attach::{
    ProbeLinks, Probes, ReturnProbes,
    libraries::LibraryWatch,
    load::links::{TracepointLink, attach_tracepoint},
    load::raw::{LinkKind, RawPrograms},
    sources::mappings,
};
use crate::{
    config::MapSizes,
    config::{Sampling, Unwinding},
    error::{ExitCode, fatal},
    tracefs,
    unwind::UnwindMode,
};

/// The ring buffers collect drains, taken out of the object at load.
pub struct Rings {
    /// The targets' mapping calls (MAPPING_EVENTS).
    pub mapping_events: RingBuf<MapData>,
    /// Stack copies and the frees of their blocks (STACK_COPIES): mapped
    /// into tracer only once a process needs copies, as the ring costs its
    /// size in resident memory.
    pub stack_copies: Map,
    /// The frees of copied-stack blocks that found STACK_COPIES full
    /// (COPY_FREES), and how many entries were ever made there
    /// (COPY_FREES_MADE).
    pub copy_frees: Map,
    pub copy_frees_made: Map,
}

impl Probes {
    /// Loads the embedded eBPF object and its programs, configured for
    /// `sampling` (the session programs only when calls may be skipped),
    /// with the tables sized as `capacity` asks.
    pub fn load(
        capacity: MapSizes,
        sampling: &Sampling,
        unwinding: &Unwinding,
    ) -> Result<(Probes, Rings)> {
        let MapSizes {
            live_allocs: max_live_allocs,
            stacks: max_stacks,
            mapping_ring_bytes,
        } = capacity;
        let started = Instant::now();
        raise_memlock_limit();
        let mmap = tracefs::mmap_offsets()?;
        let object = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));
        let skip_chance = skip_chance_table();
        tracefs::ensure_mounted()?;
        let openat_filename_offset =
            tracefs::event_field_offset("syscalls", "sys_enter_openat", "filename")
                .unwrap_or(tracer_ebpf::openat_format::FILENAME_OFFSET);
        let openat_ret_offset = tracefs::event_field_offset("syscalls", "sys_exit_openat", "ret")
            .unwrap_or(tracer_ebpf::openat_format::RET_OFFSET);
        let fork_child_offset =
            tracefs::event_field_offset("sched", "sched_process_fork", "child_pid");
        // 0: no `group_dead` in this kernel's record (the program then
        // does nothing, and a target's exit is seen at the next tick).
        let exit_group_dead_offset =
            tracefs::event_field_offset("sched", "sched_process_exit", "group_dead").unwrap_or(0);
        let field_offsets = mappings::read_field_offsets().map_err(|error| {
            fatal(
                ExitCode::KernelUnsupported,
                format!("cannot follow mmap, munmap, mremap and brk: {error:#}"),
            )
        })?;
        // The kernel's walk needs bpf_loop; without it, stacks go by frame
        // pointers.
        let uses_tables = unwinding.uses_tables() && has_bpf_loop();
        // Where the kernel keeps a thread's pending return probes: without
        // it, functions that can throw get no return probe (`exceptions`).
        let return_instances = match crate::attach::load::btf::return_instance_offsets() {
            Ok(offsets) => Some(offsets),
            Err(error) => {
                eprintln!(
                    "tracer: warning: {error:#}: operator new and PyTorch's caching allocator \
                     are traced without a return probe (an exception through one would \
                     terminate the target): their blocks are counted by the malloc they \
                     call, or not at all"
                );
                None
            }
        };
        // Never written without tables: the smallest map there is.
        let table_rows = if uses_tables {
            unwinding.table_rows()
        } else {
            1
        };
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(tracer_ebpf::map::LIVE, max_live_allocs)
            // A block can only be freed while it is in LIVE: room for the
            // frees of every live block (entries made on use).
            .map_max_entries(tracer_ebpf::map::COPY_FREES, max_live_allocs)
            .map_max_entries(tracer_ebpf::map::STACKS, max_stacks)
            .map_max_entries(tracer_ebpf::map::STACK_IDS, max_stacks)
            .override_global(tracer_ebpf::global::MAX_STACKS, &max_stacks, true)
            // Room for every id: an id given back always fits.
            .map_max_entries(tracer_ebpf::map::STACK_FREE_IDS, max_stacks)
            // A stack names at most one Python stack: as many of them.
            .map_max_entries(tracer_ebpf::map::PYTHON_STACKS, max_stacks)
            .map_max_entries(tracer_ebpf::map::PYTHON_STACK_IDS, max_stacks)
            .override_global(tracer_ebpf::global::MAX_PYTHON_STACKS, &max_stacks, true)
            .map_max_entries(tracer_ebpf::map::PYTHON_FREE_IDS, max_stacks)
            .map_max_entries(tracer_ebpf::map::PYTHON_NEW_IDS, max_stacks)
            .map_max_entries(tracer_ebpf::map::BY_STACK, max_stacks.saturating_mul(4))
            .map_max_entries(tracer_ebpf::map::MAPPING_EVENTS, mapping_ring_bytes)
            .map_max_entries(
                tracer_ebpf::map::STACK_COPIES,
                if unwinding.mode == UnwindMode::FramePointers {
                    // Never written: the smallest ring there is.
                    4096
                } else {
                    unwinding.ring_bytes
                },
            )
            .override_global(
                tracer_ebpf::global::STACK_COPY_MODE,
                &unwinding.copy_mode(),
                true,
            )
            .override_global(
                tracer_ebpf::global::STACK_PAGES,
                &unwinding.stack_pages(),
                true,
            )
            .override_global(
                tracer_ebpf::global::SAMPLE_BYTES,
                &sampling.sample_bytes,
                true,
            )
            .override_global(
                tracer_ebpf::global::SAMPLE_SEED,
                &sampling.sample_seed,
                true,
            )
            .override_global(
                tracer_ebpf::global::MIN_SIZE_BYTES,
                &sampling.min_size_bytes,
                true,
            )
            .override_global(
                tracer_ebpf::global::MAX_SIZE_BYTES,
                &sampling.max_size_bytes,
                true,
            )
            .override_global(tracer_ebpf::global::SAMPLE_SKIP_CHANCE, &skip_chance, true)
            .override_global(tracer_ebpf::global::MMAP_PROT_OFFSET, &mmap.prot, true)
            .override_global(tracer_ebpf::global::MMAP_FD_OFFSET, &mmap.fd, true)
            .override_global(
                tracer_ebpf::global::OPENAT_FILENAME_OFFSET,
                &openat_filename_offset,
                true,
            )
            .override_global(
                tracer_ebpf::global::OPENAT_RET_OFFSET,
                &openat_ret_offset,
                true,
            )
            .override_global(
                tracer_ebpf::global::SYSCALL_FIELD_OFFSETS,
                &field_offsets,
                true,
            )
            .override_global(
                tracer_ebpf::global::FORK_CHILD_PID_OFFSET,
                &fork_child_offset.unwrap_or(0),
                true,
            )
            .override_global(
                tracer_ebpf::global::EXIT_GROUP_DEAD_OFFSET,
                &exit_group_dead_offset,
                true,
            )
            .override_global(
                tracer_ebpf::global::GO_STACK_SEARCH,
                &u32::from(has_bpf_loop()),
                true,
            )
            .override_global(
                tracer_ebpf::global::UNWIND_TABLES_ON,
                &u32::from(uses_tables),
                true,
            )
            .override_global(
                tracer_ebpf::global::RETURN_INSTANCE_OFFSETS,
                &return_instances.unwrap_or_default(),
                true,
            )
            .map_max_entries(tracer_ebpf::map::UNWIND_ROWS, table_rows)
            .load(object)
            .map_err(|error| load_error(error.into()))?;
        let maps_time = started.elapsed();
        // uprobe_multi links where the kernel has them: the uprobe programs
        // are then loaded apart (`raw`), like the session programs (only
        // when used), each when first linked; the allocator programs every
        // target needs are verified now, on threads of their own, while
        // the targets' objects are read. The CUDA programs wait for a
        // target with CUDA (mapped, found ahead, or opened later: the
        // loader gate holds it while they are verified). The fork tracepoint is loaded
        // only with --follow-forks (`watch_forks`), the exec one only with
        // --comm (`watch_execs`), the spawn gate only in spawn mode.
        let (multi, links) = match RawPrograms::load(object, &ebpf, LinkKind::Multi) {
            Ok(multi) => (Some(multi), ProbeLinks::Multi),
            Err(error) => (None, ProbeLinks::PerProbe(format!("{error:#}"))),
        };
        let (session, return_probes) = if sampling.skips_calls() {
            match RawPrograms::load(object, &ebpf, LinkKind::Session) {
                Ok(session) => (Some(session), ReturnProbes::Session),
                Err(error) => (None, ReturnProbes::UretprobeFallback(format!("{error:#}"))),
            }
        } else {
            (None, ReturnProbes::Uretprobe)
        };
        if let Some(session) = &session {
            session.prefetch(ALLOCATOR_PROGRAMS);
        }
        if let Some(multi) = &multi {
            let not_in_session: Vec<&str> = ALLOCATOR_PROGRAMS
                .iter()
                .copied()
                .filter(|name| !session.as_ref().is_some_and(|session| session.covers(name)))
                .collect();
            multi.prefetch(&not_in_session);
        }
        let tracepoints_started = Instant::now();
        load_together(&mut ebpf, |name, program| match program {
            // The fork and exec tracepoints are loaded by forks.rs, when asked.
            Program::TracePoint(_) => {
                name != tracer_ebpf::program::PROCESS_FORK
                    && name != tracer_ebpf::program::COMM_EXEC
                    && (multi.is_some()
                        || (name != tracer_ebpf::program::OPEN_ENTER
                            && name != tracer_ebpf::program::OPEN_EXIT))
            }
            // Without uprobe_multi links, aya attaches every uprobe.
            Program::UProbe(_) => {
                multi.is_none()
                    && name != tracer_ebpf::program::SPAWN_GATE
                    && !name.ends_with("_session")
            }
            _ => false,
        })?;
        let mut tracepoint_links = attach_signal_tracepoints(&mut ebpf)?;
        // After the session loader, which looks up every map of the object
        // (the watch takes EVENTS out of it).
        let linkers = match &multi {
            Some(multi) => Some((
                multi.linker()?,
                session.as_ref().map(RawPrograms::linker).transpose()?,
            )),
            None => None,
        };
        let mut watch = LibraryWatch::start(
            &mut ebpf,
            &mut tracepoint_links,
            linkers,
            crate::attach::sites::forwarding::Forwarding::for_unwinding(unwinding.mode),
            return_instances.is_some(),
        )?;
        let mapping_links = mappings::attach_tracepoints(&mut ebpf)
            .map_err(|error| load_error(error.context("could not follow mapping calls")))?;
        let mapping_tracepoints = mapping_links.len();
        tracepoint_links.extend(mapping_links);
        let exception_held: aya::maps::HashMap<MapData, u64, u64> = aya::maps::HashMap::try_from(
            ebpf.take_map(tracer_ebpf::map::EXCEPTION_HELD)
                .context("eBPF object lacks EXCEPTION_HELD")?,
        )?;
        let exception_held_fd = {
            use aya::maps::IterableMap as _;
            use std::os::fd::AsFd as _;
            exception_held.map().fd().as_fd().try_clone_to_owned()?
        };
        let exceptions = match return_instances {
            Some(_) => Some(crate::attach::safety::exceptions::ExceptionFixer::start(
                RingBuf::try_from(
                    ebpf.take_map(tracer_ebpf::map::EXCEPTION_UNWINDS)
                        .context("eBPF object lacks EXCEPTION_UNWINDS")?,
                )?,
                exception_held,
            )?),
            None => None,
        };
        let watchdog = match watch.loader_held.take() {
            Some(held) => {
                let events: Vec<u64> = tracepoint_links
                    .iter()
                    .filter_map(|link| link.event_id)
                    .collect();
                Some(crate::attach::safety::watchdog::Watchdog::start(
                    held,
                    exception_held_fd,
                    &events,
                )?)
            }
            None => None,
        };
        let times = AttachTimes {
            maps: maps_time,
            tracepoints: tracepoints_started.elapsed(),
            ..AttachTimes::default()
        };
        // After the session loader, which looks up every map of the object.
        let rings = Rings {
            mapping_events: RingBuf::try_from(
                ebpf.take_map(tracer_ebpf::map::MAPPING_EVENTS)
                    .context("eBPF object lacks MAPPING_EVENTS")?,
            )
            .context("MAPPING_EVENTS is not a ring buffer")?,
            stack_copies: ebpf
                .take_map(tracer_ebpf::map::STACK_COPIES)
                .context("eBPF object lacks STACK_COPIES")?,
            copy_frees: ebpf
                .take_map(tracer_ebpf::map::COPY_FREES)
                .context("eBPF object lacks COPY_FREES")?,
            copy_frees_made: ebpf
                .take_map(tracer_ebpf::map::COPY_FREES_MADE)
                .context("eBPF object lacks COPY_FREES_MADE")?,
        };
        let kernel_unwinding = if uses_tables {
            let maps = crate::attach::unwinding::maps::UnwindMaps::take(&mut ebpf, table_rows)?;
            Some(crate::attach::unwinding::tables::KernelUnwinding::new(
                maps,
                unwinding.mode == UnwindMode::Auto,
            ))
        } else {
            None
        };
        let probes = Probes {
            ebpf,
            hooked: Hooked::default(),
            modes: Modes {
                return_probes,
                sampling: *sampling,
                unwinding: *unwinding,
                resident: None,
            },
            unwind: UnwindState {
                kernel: kernel_unwinding,
                ..UnwindState::default()
            },
            links: Links {
                how: links,
                perf: Vec::new(),
                tracepoints: tracepoint_links,
                mapping_tracepoints,
                multi,
                session,
            },
            watch,
            measured: Measured {
                times,
                traps: crate::attach::cost::traps::TrapMeasurement::unavailable(
                    "not measured (tracer floor)".to_owned(),
                ),
            },
            gate: LoaderGate {
                pause: true,
                pauses: Vec::new(),
            },
            exceptions,
            _watchdog: watchdog,
        };
        Ok((probes, rings))
    }
}

/// The programs of the malloc family: every target with an allocator
/// needs them, so they are verified while its objects are read.
const ALLOCATOR_PROGRAMS: &[&str] = &[
    tracer_ebpf::program::MALLOC_ENTER,
    tracer_ebpf::program::CALLOC_ENTER,
    tracer_ebpf::program::REALLOC_ENTER,
    tracer_ebpf::program::REALLOCARRAY_ENTER,
    tracer_ebpf::program::POSIX_MEMALIGN_ENTER,
    tracer_ebpf::program::ALIGNED_ENTER,
    tracer_ebpf::program::PVALLOC_ENTER,
    tracer_ebpf::program::FREE_ENTER,
    tracer_ebpf::program::ALLOC_RETURN,
];

/// Where the time of the attach went, for `-v`.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttachTimes {
    /// Creating the maps (aya's load of the object).
    pub maps: Duration,
    /// Loading and attaching the tracepoints every run has.
    pub tracepoints: Duration,
    /// Reading the targets' objects: mappings, symbols, probe sites,
    /// libraries to hook ahead.
    pub symbols: Duration,
    /// Waiting for uprobe programs still being verified.
    pub verifier_wait: Duration,
    /// Choosing how stacks are walked: frame pointers checked, unwind
    /// tables waited for.
    pub unwinding: Duration,
    /// Finding CPython and its thread states (`--python`).
    pub python: Duration,
    /// Making the uprobe links.
    pub links: Duration,
}

/// Loads the programs of `ebpf` that `wanted` picks, each on a thread of
/// its own: the verifier's time is most of the attach.
fn load_together(ebpf: &mut Ebpf, wanted: impl Fn(&str, &Program) -> bool) -> Result<()> {
    std::thread::scope(|scope| {
        let loads: Vec<_> = ebpf
            .programs_mut()
            .filter(|(name, program)| wanted(name, program))
            .map(|(name, program)| {
                let load = scope.spawn(move || {
                    crate::attach::load::raw::block_signals();
                    match program {
                        Program::UProbe(program) => program.load(),
                        Program::TracePoint(program) => program.load(),
                        _ => Ok(()),
                    }
                });
                (name, load)
            })
            .collect();
        for (name, load) in loads {
            load.join()
                .map_err(|_| anyhow::anyhow!("the thread loading {name} panicked"))?
                .map_err(|error| load_error(error.into()))
                .with_context(|| format!("could not load eBPF program {name}"))?;
        }
        Ok(())
    })
}

/// `exp(-i / SAMPLE_STEPS_PER_PERIOD)` in units of 2^-32: the chance that
/// the sampling skips a block of i steps (see `tracer_ebpf::sampling`).
fn skip_chance_table() -> [u64; SAMPLE_TABLE_LEN] {
    std::array::from_fn(|step| {
        let periods = step as f64 / SAMPLE_STEPS_PER_PERIOD as f64;
        ((-periods).exp() * PROBABILITY_ONE as f64).round() as u64
    })
}

/// The tracepoints that set a thread's allocator state aside while a
/// signal handler runs on it (tracer-ebpf/src/signals.rs): program,
/// category, event.
const SIGNAL_TRACEPOINTS: [(&str, &str, &str); 2] = [
    (
        tracer_ebpf::program::SIGNAL_DELIVER,
        "signal",
        tracer_ebpf::program::SIGNAL_DELIVER,
    ),
    (
        tracer_ebpf::program::SIGNAL_RETURN,
        "syscalls",
        "sys_enter_rt_sigreturn",
    ),
];

/// Attaches the signal tracepoints (loaded with the other programs). They
/// stay attached as long as the object lives and cost other processes one
/// hash lookup per signal.
fn attach_signal_tracepoints(ebpf: &mut Ebpf) -> Result<Vec<TracepointLink>> {
    SIGNAL_TRACEPOINTS
        .into_iter()
        .map(|(name, category, event)| attach_tracepoint(ebpf, name, category, event))
        .collect()
}

/// A program of the object, as a uprobe.
pub fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe> {
    ebpf.program_mut(name)
        .with_context(|| format!("eBPF object lacks program {name}"))?
        .try_into()
        .with_context(|| format!("eBPF program {name} is not a uprobe"))
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
pub(in crate::attach) fn load_error(error: anyhow::Error) -> anyhow::Error {
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

/// Whether the kernel has the `bpf_loop` helper (Linux 5.17+): the search
/// for a Go program's stack switch in its copied stacks needs it.
fn has_bpf_loop() -> bool {
    aya::util::KernelVersion::current()
        .is_ok_and(|version| version >= aya::util::KernelVersion::new(5, 17, 0))
}
