//! Counting, for every program: the per-CPU STATS counters, and the atomic
//! adds that keep shared totals exact when threads of the target run the
//! same probe at once.
use aya_ebpf::{macros::map, maps::PerCpuArray};
use tracer_ebpf::stat;

/// Event and drop counters, indexed by `tracer_ebpf::stat`.
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

#[inline(always)]
pub(crate) fn count(index: u32) {
    count_by(index, 1);
}

/// Adds `value` to a STATS counter (a byte count).
#[inline(always)]
pub(crate) fn count_by(index: u32, value: u64) {
    if let Some(counter) = STATS.get_ptr_mut(index) {
        atomic_add(counter, value);
    }
}

/// `*target += value` as one atomic instruction, so concurrent threads
/// of the target never lose an update.
#[inline(always)]
pub(crate) fn atomic_add(target: *mut u64, value: u64) {
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({target} + 0) += {value}",
            target = in(reg) target,
            value = in(reg) value,
        );
    }
}

/// `*target -= value` as one atomic instruction (an add of the two's
/// complement: the totals are wrapping sums).
#[inline(always)]
pub(crate) fn atomic_sub(target: *mut u64, value: u64) {
    atomic_add(target, value.wrapping_neg());
}

/// `*target += value` as one atomic instruction; returns the value
/// before, so that of two threads dropping the last holders exactly one
/// frees, two context destructions end two epochs, and two stack copies
/// get two references.
#[inline(always)]
pub(crate) fn fetch_add(target: *mut u64, mut value: u64) -> u64 {
    unsafe {
        core::arch::asm!(
            "{value} = atomic_fetch_add((u64 *)({target} + 0), {value})",
            target = in(reg) target,
            value = inout(reg) value,
        );
    }
    value
}

/// `*target = new` if it still holds `expected`, as one atomic
/// instruction; otherwise returns what it holds.
#[inline(always)]
pub(crate) fn compare_exchange(target: *mut u64, expected: u64, new: u64) -> Result<(), u64> {
    let previous: u64;
    unsafe {
        core::arch::asm!(
            "r0 = cmpxchg_64({target} + 0, r0, {new})",
            target = in(reg) target,
            new = in(reg) new,
            inout("r0") expected => previous,
        );
    }
    if previous == expected {
        Ok(())
    } else {
        Err(previous)
    }
}
