//! `--holders` at the end of a session or on request (`/holders`): each
//! listed stack's reachability, from a scan of its running process.
use std::{collections::HashMap, time::Instant};

use crate::{
    collect::Collector,
    error, holders,
    model::{StackId, StackKey},
    report,
};

/// `--holders`: scans each traced process (alive at the end) for pointers
/// to its traced live blocks, puts what holds them on its listed stacks,
/// and says what it held before attach (even with no stack listed: an
/// engineer may attach at the peak, when nothing new is allocated); a
/// process that cannot be scanned is named on stderr.
pub(super) fn add_holders(
    collector: &mut Collector,
    report: &mut report::Report,
    config: &crate::config::Config,
) {
    let pending = prepare_holders(collector, report, config);
    finish_holders(report, pending);
}

/// What a holders scan needs of the collection, read on its loop: each
/// process's live blocks and the labels of its listed stacks. The scan
/// itself (`finish_holders`) needs nothing more of it, so it can run on
/// another thread while the collection goes on.
pub struct PendingHolders {
    scans: Vec<PendingScan>,
}

struct PendingScan {
    pid: u32,
    live: crate::collect::LiveBlocks,
    live_read_seconds: f64,
    groups: Vec<Vec<StackKey>>,
    labels: HashMap<StackKey, String>,
}

/// The stacks of `report` listed for `pid` (its own stacks and site
/// groups), each with the ids it stands for: its own and those merged
/// into it for equal frames, or a site group's members.
fn listed_stacks(
    report: &mut report::Report,
    pid: u32,
) -> (Vec<&mut report::StackReport>, Vec<Vec<u32>>) {
    report
        .stacks
        .iter_mut()
        .chain(report.suspected_leaks.iter_mut())
        .map(|stack| {
            let ids = std::iter::once(stack.stack_id)
                .chain(stack.merged_stack_ids.iter().copied())
                .collect();
            (stack, ids)
        })
        .chain(
            report
                .groups
                .iter_mut()
                .chain(report.suspected_leak_groups.iter_mut())
                .map(|group| (&mut group.sum, group.stack_ids.clone())),
        )
        .filter(|(stack, _)| stack.pid == pid)
        .unzip()
}

/// Reads, on the collection's loop, what the scans of `report`'s processes
/// need (`PendingHolders`).
pub(super) fn prepare_holders(
    collector: &mut Collector,
    report: &mut report::Report,
    config: &crate::config::Config,
) -> PendingHolders {
    let listed: Vec<u32> = report
        .stacks
        .iter()
        .chain(&report.suspected_leaks)
        .chain(report.groups.iter().map(|group| &group.sum))
        .chain(report.suspected_leak_groups.iter().map(|group| &group.sum))
        .map(|stack| stack.pid)
        .collect();
    let mut pids: Vec<u32> = listed
        .iter()
        .copied()
        .chain(report.targets.iter().map(|target| target.target.pid))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    let mut scans = Vec::new();
    for pid in pids {
        if !crate::procfs::is_alive(pid) {
            if listed.contains(&pid) {
                eprintln!("tracer: PID {pid} exited: no holders to scan for");
            }
            continue;
        }
        let (stacks, members) = listed_stacks(report, pid);
        let groups: Vec<Vec<StackKey>> = stacks
            .iter()
            .zip(&members)
            .map(|(stack, ids)| {
                ids.iter()
                    .map(|&raw| StackKey {
                        pid,
                        stack_id: StackId::from_raw(raw),
                        kind: stack.kind,
                    })
                    .collect()
            })
            .collect();
        let started = Instant::now();
        let live = match collector.live_blocks(pid) {
            Ok(live) => live,
            Err(error) => {
                eprintln!(
                    "tracer: PID {pid}: could not scan for holders: {}",
                    error::one_line(&error)
                );
                continue;
            }
        };
        let live_read_seconds = started.elapsed().as_secs_f64();
        let labels = groups
            .iter()
            .flatten()
            .map(|key| {
                let frames = crate::model::trim_allocator_frames(collector.frames(key));
                let label = crate::model::site(&frames, &config.show.wrappers).map_or_else(
                    || format!("stack {} (not recorded)", key.stack_id),
                    |site| site.label,
                );
                (*key, label)
            })
            .collect();
        scans.push(PendingScan {
            pid,
            live,
            live_read_seconds,
            groups,
            labels,
        });
    }
    PendingHolders { scans }
}

/// Scans each process of `pending` and puts what holds each listed stack
/// of `report` (the one `pending` was prepared from) on it.
pub fn finish_holders(report: &mut report::Report, pending: PendingHolders) {
    let unrecorded = holders::Unrecorded::of(&report.sampling, &report.drops);
    for scan in pending.scans {
        let pid = scan.pid;
        let labels = scan.labels;
        let mut label = |key: &StackKey| {
            labels
                .get(key)
                .cloned()
                .unwrap_or_else(|| format!("stack {} (not recorded)", key.stack_id))
        };
        let (found, mut cost) = match holders::scan(
            pid,
            scan.live.blocks,
            scan.live.gone,
            &scan.groups,
            &mut label,
            &crate::runtimes::heaps(),
            &unrecorded,
        ) {
            Ok(scanned) => scanned,
            Err(error) => {
                eprintln!(
                    "tracer: PID {pid}: could not scan for holders: {}",
                    error::one_line(&error)
                );
                continue;
            }
        };
        cost.live_read_seconds = scan.live_read_seconds;
        let (stacks, _) = listed_stacks(report, pid);
        for (stack, reachability) in stacks.into_iter().zip(found) {
            stack.reachability = Some(reachability);
        }
        eprintln!(
            "tracer: PID {pid}: scanned {} MiB for holders of {} blocks in {:.2} s \
             (LIVE read in {:.2} s)",
            cost.bytes_read >> 20,
            cost.blocks,
            cost.seconds,
            cost.live_read_seconds
        );
        report.holders_scans.push(cost);
    }
}
