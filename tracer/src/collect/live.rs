//! The traced live blocks of a process, read from the kernel's LIVE map
//! (userspace keeps only per-stack totals), each with the stack it is
//! counted under: `record --holders` scans for pointers to them.
use anyhow::Result;

use super::Collector;
use crate::{
    holders::Block,
    model::{Kind, StackId, StackKey},
};

/// The blocks, and the LIVE entries left out: gone while read, of a
/// CUDA context destroyed since, or of an image the process replaced
/// (exec) since (no longer counted; the kernel drops such an entry only
/// when its address is met again).
pub struct LiveBlocks {
    pub blocks: Vec<Block>,
    pub gone: u64,
}

impl Collector {
    /// Every traced live block of `pid` the kernel knows now, after the
    /// copies sent so far are applied.
    pub fn live_blocks(&mut self, pid: u32) -> Result<LiveBlocks> {
        self.start_copy_reader()?;
        self.stacks.copied.flush();
        let maps = self.probes.maps();
        let (entries, mut gone) = maps.live_blocks(pid)?;
        let epoch = maps
            .epochs()?
            .get(&pid)
            .copied()
            .unwrap_or(tracer_ebpf::FIRST_CONTEXT_EPOCH);
        let exec_ns = maps.exec_time(pid);
        let mut blocks = Vec::with_capacity(entries.len());
        for (address, entry) in entries {
            let Some(kind) = Kind::from_raw(entry.kind) else {
                continue;
            };
            // Allocated before an exec: memory of the old image, not the
            // new one's (its address may hold anything now).
            if exec_ns.is_some_and(|exec_ns| entry.timestamp_ns < exec_ns) {
                gone += 1;
                continue;
            }
            if entry.context_epoch != 0 && entry.context_epoch != epoch {
                gone += 1;
                continue;
            }
            let key = if tracer_ebpf::is_copied_stack(entry.stack_id) {
                match self.stacks.copied.block_key(pid, entry.stack_id) {
                    Some(key) => key,
                    None => {
                        gone += 1;
                        continue;
                    }
                }
            } else {
                StackKey {
                    pid,
                    stack_id: match entry.stack_id {
                        tracer_ebpf::NO_STACK => StackId::Lost,
                        id => self.kernel_name(pid, id),
                    },
                    kind,
                }
            };
            blocks.push(Block {
                address,
                size: entry.size,
                key,
            });
        }
        Ok(LiveBlocks { blocks, gone })
    }
}
