//! The parsed flags, checked and turned into the configs of
//! `crate::config`.
use anyhow::Result;
use tracer_ebpf::sampling::MAX_SAMPLE_BYTES;

use super::{ReportArgs, TargetArgs, UnwindArg, comm_targets};
use crate::{
    config::{
        Config, DEFAULT_PLOT_STACKS, MapSizes, Probing, PythonMode, PythonOptions, ReportConfig,
        Sampling, Schedule, Show, Targets, Unwinding,
    },
    error::{ExitCode, fatal},
    unwind::UnwindMode,
};

pub(super) fn config_of(args: TargetArgs) -> Result<Config> {
    let wrappers = args.labels.wrappers()?;
    let comms = comm_targets(&args.fleet)?;
    let targets = match (args.pids.is_empty(), args.command.is_empty()) {
        (true, true) if let Some(comms) = comms => Targets::Comms(comms),
        (false, true) => {
            let mut pids = args.pids;
            pids.sort_unstable();
            pids.dedup();
            Targets::Pids(pids)
        }
        (true, false) => Targets::Spawn(args.command),
        (true, true) => {
            return Err(fatal(
                ExitCode::Usage,
                "nothing to trace: give --pid PID, --comm NAME or a command after -- \
                 (see tracer --help)",
            ));
        }
        (false, false) => unreachable!("clap rejects --pid with a command"),
    };
    if args.max_live_allocs == 0 || args.max_stacks == 0 {
        return Err(fatal(
            ExitCode::Usage,
            "--max-live and --max-stacks must be at least 1",
        ));
    }
    let sampling = Sampling {
        sample_bytes: args.sample_bytes.unwrap_or(0),
        sample_seed: args.sample_seed.unwrap_or(0),
        min_size_bytes: args.min_size.unwrap_or(0),
        max_size_bytes: args.max_size.unwrap_or(u64::MAX),
    };
    if args
        .sample_bytes
        .is_some_and(|bytes| bytes == 0 || bytes > MAX_SAMPLE_BYTES)
    {
        return Err(fatal(
            ExitCode::Usage,
            format!("--sample-bytes must be 1..={MAX_SAMPLE_BYTES}"),
        ));
    }
    if !(4096..=Unwinding::MAX_STACK_BYTES).contains(&args.stack_bytes) {
        return Err(fatal(
            ExitCode::Usage,
            format!(
                "--stack-bytes must be 4096..={}",
                Unwinding::MAX_STACK_BYTES
            ),
        ));
    }
    if !args.stack_ring_mib.is_power_of_two() || args.stack_ring_mib > 1024 {
        return Err(fatal(
            ExitCode::Usage,
            "--stack-ring-mib must be a power of two, at most 1024",
        ));
    }
    if !(1..=Unwinding::MAX_TABLE_MIB).contains(&args.unwind_table_mib) {
        return Err(fatal(
            ExitCode::Usage,
            format!(
                "--unwind-table-mib must be 1..={}",
                Unwinding::MAX_TABLE_MIB
            ),
        ));
    }
    let unwinding = Unwinding {
        mode: match args.unwind {
            UnwindArg::Fp => UnwindMode::FramePointers,
            UnwindArg::Dwarf => UnwindMode::Dwarf,
            UnwindArg::Auto => UnwindMode::Auto,
            UnwindArg::Copy => UnwindMode::Copy,
        },
        stack_bytes: args.stack_bytes,
        ring_bytes: args.stack_ring_mib << 20,
        table_bytes: args.unwind_table_mib << 20,
    };
    if !(1..=tracer_ebpf::MAX_PYTHON_FRAMES as u32).contains(&args.python_depth) {
        return Err(fatal(
            ExitCode::Usage,
            format!(
                "--python-depth must be 1..={}",
                tracer_ebpf::MAX_PYTHON_FRAMES
            ),
        ));
    }
    if args.python_objects && args.python == PythonMode::Off {
        return Err(fatal(
            ExitCode::Usage,
            "--python-objects needs Python frames: it cannot go with --python off",
        ));
    }
    if sampling.min_size_bytes > sampling.max_size_bytes {
        return Err(fatal(
            ExitCode::Usage,
            "--min-size is larger than --max-size: nothing would be recorded",
        ));
    }
    let layout = args.labels.layout();
    Ok(Config {
        targets,
        schedule: Schedule {
            interval: args.interval,
            duration: args.duration,
            follow_forks: args.follow_forks,
        },
        map_sizes: MapSizes {
            live_allocs: args.max_live_allocs,
            stacks: args.max_stacks,
            mapping_ring_bytes: args.ring_buffer_kib * 1024,
        },
        probing: Probing {
            sampling,
            unwinding,
            loader_pause: !args.no_loader_pause,
            resident: args.resident,
            debug_dirs: args.labels.debug_dirs,
            python: PythonOptions {
                mode: args.python,
                depth: args.python_depth,
                objects: args.python_objects,
            },
        },
        show: Show {
            top: every_stack_if_zero(args.top),
            wrappers,
            layout,
        },
        listen: args.fleet.listen,
        verbose: args.verbose,
        leave_running: args.leave_running,
    })
}

/// `--top 0` asks for every stack.
fn every_stack_if_zero(top: usize) -> usize {
    if top == 0 { usize::MAX } else { top }
}

pub(super) fn report_config(args: ReportArgs) -> Result<ReportConfig> {
    if let (Some(from), Some(to)) = (args.filter.from, args.filter.to)
        && from >= to
    {
        return Err(fatal(
            ExitCode::Usage,
            format!(
                "--from {:.3}s is not before --to {:.3}s",
                from.as_secs_f64(),
                to.as_secs_f64()
            ),
        ));
    }
    Ok(ReportConfig {
        recording_path: args.recording,
        format: args.format,
        top: args.top.map(every_stack_if_zero),
        kind: args.filter.kind,
        pid: args.filter.pid,
        from_s: args.filter.from.map(|from| from.as_secs_f64()),
        to_s: args.filter.to.map(|to| to.as_secs_f64()),
        at_s: args.filter.at.map(|at| at.as_secs_f64()),
        value: args.value,
        output_path: args.output,
        plot_stacks: DEFAULT_PLOT_STACKS,
        wrappers: args.labels.wrappers()?,
        layout: args.labels.layout(),
        debug_dirs: args.labels.debug_dirs,
    })
}
