//! EVENTS: the ring buffer of rare events for userspace (a library mapped,
//! an exec, a CUDA context destroyed), never one per allocation.
//!
//! Messages are sent with BPF_RB_NO_WAKEUP (userspace drains EVENTS on a
//! timer), so a process that maps many files never wakes tracer per call.
use aya_ebpf::{bindings::BPF_RB_NO_WAKEUP, macros::map, maps::RingBuf};
use tracer_ebpf::{RareEvent, stat};

use crate::counters::count;

/// Rare events for userspace.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// Sends a rare event to userspace, without waking it.
#[inline(always)]
pub(crate) fn send_event(message: &RareEvent) {
    if EVENTS
        .output::<RareEvent>(message, BPF_RB_NO_WAKEUP as u64)
        .is_err()
    {
        count(stat::DROP_EVENTS_FULL);
    }
}
