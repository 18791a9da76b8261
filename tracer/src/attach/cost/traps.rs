//! Measures what a probe's trap costs on this machine, at start: the
//! cost estimate (`model::cost`) multiplies the targets' probe hits by it.
//! A trap costs ~0.45 µs on one VM and a fraction of that on bare metal
//! (KERNEL-NOTES.md), so no figure can be assumed.
//!
//! Tracer's own functions below, one copy per case so that every case is
//! timed in the same rounds, under the same load: the empty floor programs
//! are attached to some of them, for tracer's own process only, and each
//! is called a few thousand times a round. Thread CPU time, not wall time:
//! the traps run in the calling thread, and a busy machine that preempts
//! it does not count. The medians of the differences are the costs: they
//! hold the empty programs' dispatch too, which every hit of a real
//! program pays and its own timing (`attach::cost`) does not see. It
//! runs on a thread of its own while the targets are attached (~0.2 s of
//! CPU).

use std::{
    sync::{Arc, OnceLock},
    thread::JoinHandle,
};

use anyhow::{Context as _, Result, bail};

use crate::attach::{load::raw::Linker, sites::symbols::SiteFile};
use crate::{model::cost::TrapCosts, procfs};

std::arch::global_asm!(
    ".pushsection .text.tracer_trap_cost,\"ax\",@progbits",
    // Emulated at the entry (`push %rbp`): unprobed, entry probe, entry
    // and return probe.
    ".balign 64",
    ".globl tracer_trap_bare",
    ".hidden tracer_trap_bare",
    "tracer_trap_bare:",
    "push rbp",
    "mov rbp, rsp",
    "pop rbp",
    "ret",
    ".balign 64",
    ".globl tracer_trap_entry",
    ".hidden tracer_trap_entry",
    "tracer_trap_entry:",
    "push rbp",
    "mov rbp, rsp",
    "pop rbp",
    "ret",
    ".balign 64",
    ".globl tracer_trap_return",
    ".hidden tracer_trap_return",
    "tracer_trap_return:",
    "push rbp",
    "mov rbp, rsp",
    "pop rbp",
    "ret",
    // Single-stepped at the entry (a register move): unprobed, probed.
    ".balign 64",
    ".globl tracer_trap_stepped_bare",
    ".hidden tracer_trap_stepped_bare",
    "tracer_trap_stepped_bare:",
    "mov rax, rdi",
    "push rbp",
    "pop rbp",
    "ret",
    ".balign 64",
    ".globl tracer_trap_stepped",
    ".hidden tracer_trap_stepped",
    "tracer_trap_stepped:",
    "mov rax, rdi",
    "push rbp",
    "pop rbp",
    "ret",
    ".popsection",
);

unsafe extern "C" {
    safe fn tracer_trap_bare();
    safe fn tracer_trap_entry();
    safe fn tracer_trap_return();
    safe fn tracer_trap_stepped_bare();
    safe fn tracer_trap_stepped();
}

/// Calls of an emulated-site function per round.
const CALLS: u32 = 4000;
/// Calls of a single-stepped one (each trap ~16 µs on a VM).
const STEPPED_CALLS: u32 = 400;
/// Rounds; the median of each case is taken.
const ROUNDS: usize = 7;
/// Less than this added per call: the probe did not fire (a trap is a
/// kernel entry and exit, 100+ ns anywhere).
const MIN_TRAP_NS: f64 = 20.0;

/// The measurement, under way or done.
pub(in crate::attach) struct TrapMeasurement {
    running: std::sync::Mutex<Option<JoinHandle<()>>>,
    result: Arc<OnceLock<Result<TrapCosts, String>>>,
}

impl TrapMeasurement {
    /// Starts measuring on a thread of its own, with the floor programs
    /// of `linker`.
    pub(in crate::attach) fn start(linker: Linker) -> TrapMeasurement {
        let result = Arc::new(OnceLock::new());
        let filled = Arc::clone(&result);
        let running = std::thread::Builder::new()
            .name("tracer-trap-cost".to_owned())
            .spawn(move || {
                crate::attach::load::raw::block_signals();
                let _ = filled.set(measure(&linker).map_err(|error| format!("{error:#}")));
            })
            .map_err(|error| {
                let _ = result.set(Err(format!("could not start its thread: {error}")));
            })
            .ok();
        TrapMeasurement {
            running: std::sync::Mutex::new(running),
            result,
        }
    }

    /// Not measured (why).
    pub(in crate::attach) fn unavailable(why: String) -> TrapMeasurement {
        TrapMeasurement {
            running: std::sync::Mutex::new(None),
            result: Arc::new(OnceLock::from(Err(why))),
        }
    }

    /// The costs, or why there are none (yet: unless `wait`, a measurement
    /// under way is not waited for).
    pub(in crate::attach) fn costs(&self, wait: bool) -> Result<&TrapCosts, &str> {
        if wait
            && let Some(running) = self
                .running
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .take()
        {
            let _ = running.join();
        }
        match self.result.get() {
            Some(result) => result.as_ref().map_err(String::as_str),
            None => Err("still being measured"),
        }
    }
}

/// The file offset of tracer's function at `address` in its executable.
fn offset_in_executable(maps: &[procfs::Mapping], address: usize) -> Result<u64> {
    let mapping = maps
        .iter()
        .find(|mapping| mapping.contains(address as u64))
        .context("tracer's own code is not in its mappings")?;
    Ok(mapping.file_offset_of(address as u64))
}

/// CPU time of the calling thread, in ns.
fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec; the clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// ns per call of `function`, called `calls` times.
fn time_calls(function: extern "C" fn(), calls: u32) -> f64 {
    let function = std::hint::black_box(function);
    let started = thread_cpu_ns();
    for _ in 0..calls {
        function();
    }
    (thread_cpu_ns() - started) as f64 / f64::from(calls)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn measure(linker: &Linker) -> Result<TrapCosts> {
    let pid = std::process::id();
    let maps = procfs::read_maps(pid)?;
    let offset = |function: extern "C" fn()| offset_in_executable(&maps, function as usize);
    let executable = "/proc/self/exe";
    let executable = &SiteFile::of(std::fs::File::open(executable)?, executable.as_ref())?;
    let entry_program = tracer_ebpf::program::FLOOR_ENTER;
    let return_program = tracer_ebpf::program::FLOOR_RETURN;
    let entries = [
        (offset(tracer_trap_entry)?, 0),
        (offset(tracer_trap_return)?, 0),
        (offset(tracer_trap_stepped)?, 0),
    ];
    // Return probes first, as tracer attaches its own.
    let _return_link = linker.link(
        return_program,
        executable,
        &[(offset(tracer_trap_return)?, 0)],
        pid,
    )?;
    let _entry_link = linker.link(entry_program, executable, &entries, pid)?;
    // Every function once, so that first-hit work is not timed.
    for function in [
        tracer_trap_bare,
        tracer_trap_entry,
        tracer_trap_return,
        tracer_trap_stepped_bare,
        tracer_trap_stepped,
    ] {
        time_calls(function, 10);
    }
    let mut rounds: [Vec<f64>; 5] = Default::default();
    for _ in 0..ROUNDS {
        rounds[0].push(time_calls(tracer_trap_bare, CALLS));
        rounds[1].push(time_calls(tracer_trap_entry, CALLS));
        rounds[2].push(time_calls(tracer_trap_return, CALLS));
        rounds[3].push(time_calls(tracer_trap_stepped_bare, STEPPED_CALLS));
        rounds[4].push(time_calls(tracer_trap_stepped, STEPPED_CALLS));
    }
    let [bare, entry, both, stepped_bare, stepped] = rounds.map(median);
    if entry - bare < MIN_TRAP_NS {
        bail!(
            "the probe on tracer's own function added {:.0} ns a call: it did not fire",
            entry - bare
        );
    }
    Ok(TrapCosts {
        entry_ns: (entry - bare).max(0.0),
        return_ns: (both - entry).max(0.0),
        single_stepped_ns: (stepped - stepped_bare).max(0.0),
        how: format!(
            "at start, on functions of tracer's own with empty programs attached as tracer \
             attaches its own: thread CPU time per call with the probe less without, median \
             of {ROUNDS} rounds of {CALLS} calls ({STEPPED_CALLS} single-stepped)"
        ),
    })
}
