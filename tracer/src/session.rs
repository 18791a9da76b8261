//! A tracing session: the targets of a `Config` with probes attached, the
//! symbolizer that follows them, and the report of what was collected.
//! Shared by the verbs that trace (`record`, `top`).
use std::{
    collections::{BTreeMap, HashMap},
    time::Instant,
};

use anyhow::Result;

use crate::{
    attach::{self, Probes, spawn},
    cli::{Config, Targets},
    collect::{self, Watched},
    model::{
        Frame, MemoryStatus, Model, StackKey, Target,
        run::{DwarfProcess, ProbeReport, SamplingMode, SamplingReport, UnwindingReport},
    },
    output::{Report, ReportInput},
    procfs,
    symbolize::Symbols,
};

/// Probes in place on every target.
pub struct Session {
    pub probes: Probes,
    pub symbols: Symbols,
    pub watched: Vec<Watched>,
    /// When every probe was in place: time zero of the window.
    pub attached_at: Instant,
}

impl Session {
    /// Checks privileges, kernel and targets, loads the eBPF programs and
    /// attaches them. A spawned command is left stopped at its entry point
    /// until `resume`.
    pub fn attach(config: &Config) -> Result<Session> {
        attach::check_privileges()?;
        attach::check_kernel()?;
        if let Targets::Pids(pids) = &config.targets {
            for &pid in pids {
                attach::check_target(pid)?;
            }
        }
        let started_at = Instant::now();
        let capacity = attach::Capacity {
            live_allocs: config.max_live_allocs,
            stacks: config.max_stacks,
            mapping_ring_bytes: config.ring_buffer_kib * 1024,
        };
        let mut probes = Probes::load(capacity, &config.sampling, &config.unwinding)?;
        let mut symbols = Symbols::new();
        let mut watched = Vec::new();
        match &config.targets {
            Targets::Pids(pids) => {
                for &pid in pids {
                    probes.attach_allocators(pid)?;
                    probes.trace_mappings(pid)?;
                    symbols.refresh(pid);
                    watched.push(watch(pid, false));
                }
            }
            Targets::Spawn(command) => {
                let child = spawn::spawn_stopped(&mut probes, command)?;
                if let Err(error) = probes
                    .attach_allocators(child.pid)
                    .and_then(|_| probes.trace_mappings(child.pid))
                {
                    spawn::kill(child.pid);
                    return Err(error);
                }
                symbols.refresh(child.pid);
                watched.push(watch(child.pid, true));
            }
        }
        if config.follow_forks {
            probes.watch_forks()?;
            for watched in &watched {
                probes.follow(watched.target.pid)?;
            }
        }
        let attached_at = Instant::now();
        warn_about_probes(&probes, config.verbose);
        probes.mark_attached(attached_at);
        eprintln!(
            "tracer: attached {} probes to {} in {} ms; tracing{} (Ctrl-C to stop and report)",
            probes.probe_count(),
            describe_targets(&watched),
            (attached_at - started_at).as_millis(),
            config
                .duration
                .map(|duration| format!(" for {:.1} s", duration.as_secs_f64()))
                .unwrap_or_default(),
        );
        for (pid, objects) in &probes.copying_stacks_of {
            eprintln!(
                "tracer: PID {pid}: no frame pointers in {}: its stacks are copied and unwound \
                 with DWARF (--unwind auto; --unwind fp is cheaper, with shorter stacks)",
                objects.join(", ")
            );
        }
        Ok(Session {
            probes,
            symbols,
            watched,
            attached_at,
        })
    }

    /// Lets a spawned command run (nothing to do for --pid targets).
    pub fn resume(&self) {
        for watched in self.watched.iter().filter(|watched| watched.spawned) {
            spawn::resume(watched.target.pid);
        }
    }

    pub fn targets(&self) -> Vec<Target> {
        self.watched.iter().map(|w| w.target.clone()).collect()
    }

    /// How stacks are walked, as the report describes it.
    pub fn unwinding_report(&self) -> UnwindingReport {
        let pids: Vec<u32> = self.watched.iter().map(|w| w.target.pid).collect();
        unwinding_report(&self.probes, &pids)
    }

    /// How allocations are recorded, as the report describes it.
    pub fn sampling_report(&self, config: &Config) -> SamplingReport {
        sampling_report(&self.probes, config)
    }

    /// The probes in place, as the report lists them.
    pub fn probe_reports(&self) -> Vec<ProbeReport> {
        probe_reports(&self.probes)
    }
}

/// Symbolizes the stacks a report shows (top stacks by live bytes and
/// suspected leaks), then builds it; `memory_status` holds the RSS of the
/// targets alive at the end (empty while tracing goes on).
pub fn build_report(
    probes: &Probes,
    symbols: &mut Symbols,
    model: &Model,
    targets: &[Target],
    memory_status: BTreeMap<u32, MemoryStatus>,
    config: &Config,
) -> Report {
    let mut frames: HashMap<StackKey, Vec<Frame>> = HashMap::new();
    let leaks = model
        .suspected_leaks(config.top)
        .into_iter()
        .map(|(key, _)| key);
    let top = model
        .top_stacks(config.top)
        .into_iter()
        .map(|summary| summary.key);
    for key in top.chain(leaks) {
        frames
            .entry(key)
            .or_insert_with(|| collect::stack_frames(probes, symbols, &key));
    }
    let lookup = |key: &StackKey| frames.get(key).cloned().unwrap_or_default();
    let apis = collect::stack_apis(probes);
    Report::build(ReportInput {
        model,
        targets,
        probes: probe_reports(probes),
        sampling: sampling_report(probes, config),
        unwinding: Some(unwinding_report(
            probes,
            &targets.iter().map(|target| target.pid).collect::<Vec<_>>(),
        )),
        libraries: probes.library_reports(),
        interval_ms: config.interval.as_millis() as u64,
        top: config.top,
        frames: &lookup,
        api: &|key| apis.get(key).map(|api| (*api).to_owned()),
        memory_status,
    })
}

/// RSS and its parts of the targets still alive, read now.
pub fn memory_status(targets: &[Target]) -> BTreeMap<u32, MemoryStatus> {
    targets
        .iter()
        .filter(|target| target.exited_after_s.is_none())
        .filter_map(|target| Some((target.pid, procfs::memory_status(target.pid)?)))
        .collect()
}

fn unwinding_report(probes: &Probes, pids: &[u32]) -> UnwindingReport {
    let unwinding = &probes.unwinding;
    UnwindingReport {
        mode: unwinding.mode,
        stack_bytes: unwinding.stack_bytes,
        dwarf: pids
            .iter()
            .copied()
            .filter(|&pid| probes.copies_stacks_of(pid))
            .map(|pid| DwarfProcess {
                pid,
                objects_without_frame_pointers: probes
                    .copying_stacks_of
                    .iter()
                    .find(|(copied, _)| *copied == pid)
                    .map(|(_, objects)| objects.clone())
                    .unwrap_or_default(),
            })
            .collect(),
    }
}

/// How allocations were recorded: exact or sampled, size filters, and how
/// return probes were placed.
fn sampling_report(probes: &Probes, config: &Config) -> SamplingReport {
    let sampling = &config.sampling;
    SamplingReport {
        mode: if sampling.sample_bytes == 0 {
            SamplingMode::Exact
        } else {
            SamplingMode::Sampled
        },
        sample_bytes: (sampling.sample_bytes != 0).then_some(sampling.sample_bytes),
        min_size_bytes: sampling.min_size_bytes,
        max_size_bytes: (sampling.max_size_bytes != u64::MAX).then_some(sampling.max_size_bytes),
        return_probes: probes.return_probes.clone(),
    }
}

/// Says where each probe went and why (`-v`), and warns once about every
/// single-stepped probe and about a uprobe session fallback.
fn warn_about_probes(probes: &Probes, verbose: bool) {
    for hook in &probes.hooks {
        let site = &hook.site;
        let line = format!(
            "{}+{} in {} (PID {}): {}",
            site.function.name,
            site.offset - site.function_offset,
            site.path.display(),
            hook.pid,
            site.reason
        );
        if !site.emulated {
            eprintln!("tracer: warning: probe on {line}");
        } else if verbose {
            eprintln!("tracer: probe on {line}");
        }
    }
    if verbose
        || matches!(
            probes.return_probes,
            attach::ReturnProbes::UretprobeFallback(_)
        )
    {
        eprintln!("tracer: return probes: {}", probes.return_probes.describe());
    }
}

fn probe_reports(probes: &Probes) -> Vec<ProbeReport> {
    probes
        .hooks
        .iter()
        .map(|hook| ProbeReport {
            pid: hook.pid,
            module: hook.site.path.display().to_string(),
            symbol: hook.site.function.name.to_owned(),
            offset: hook.site.offset,
            offset_in_function: hook.site.offset - hook.site.function_offset,
            single_stepped: !hook.site.emulated,
            reason: hook.site.reason.clone(),
        })
        .collect()
}

fn watch(pid: u32, spawned: bool) -> Watched {
    Watched {
        target: Target {
            pid,
            command: procfs::command_line(pid),
            exited_after_s: None,
            followed_after_s: None,
            execs_after_s: Vec::new(),
            gpu_contexts_destroyed: Vec::new(),
        },
        spawned,
    }
}

fn describe_targets(watched: &[Watched]) -> String {
    watched
        .iter()
        .map(|w| format!("PID {} ({})", w.target.pid, w.target.command))
        .collect::<Vec<_>>()
        .join(", ")
}
