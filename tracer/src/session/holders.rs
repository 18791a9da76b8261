//! `--holders` at the end of a session or on request (`/holders`): each
//! listed stack's reachability, from a scan of its running process.
use std::time::Instant;

use crate::{
    collect::Collector,
    error, holders,
    model::{StackId, StackKey},
    output,
};

/// `--holders`: scans each traced process (alive at the end) for pointers
/// to its traced live blocks, puts what holds them on its listed stacks,
/// and says what it held before attach (even with no stack listed: an
/// engineer may attach at the peak, when nothing new is allocated); a
/// process that cannot be scanned is named on stderr.
pub fn add_holders(
    collector: &mut Collector,
    report: &mut output::Report,
    config: &crate::config::Config,
) {
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
    for pid in pids {
        if !crate::procfs::is_alive(pid) {
            if listed.contains(&pid) {
                eprintln!("tracer: PID {pid} exited: no holders to scan for");
            }
            continue;
        }
        // Each listed stack with the ids it stands for: its own and those
        // merged into it for equal frames, or a site group's members.
        let (stacks, members): (Vec<&mut output::StackReport>, Vec<Vec<u32>>) = report
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
            .unzip();
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
        let mut label = |key: &StackKey| {
            let frames = output::trim_allocator_frames(collector.frames(key));
            output::site(&frames, &config.wrappers).map_or_else(
                || format!("stack {} (not recorded)", key.stack_id),
                |site| site.label,
            )
        };
        let (found, mut cost) =
            match holders::scan(pid, live.blocks, live.gone, &groups, &mut label) {
                Ok(scanned) => scanned,
                Err(error) => {
                    eprintln!(
                        "tracer: PID {pid}: could not scan for holders: {}",
                        error::one_line(&error)
                    );
                    continue;
                }
            };
        cost.live_read_seconds = live_read_seconds;
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
