//! Which allocations are recorded: `--min-size`/`--max-size` and sampling
//! by bytes (`--sample-bytes`; the estimator is described in
//! `tracer_ebpf::sampling`), decided in the entry probes.
use aya_ebpf::{Global, helpers::bpf_get_prandom_u32};
use tracer_ebpf::sampling::{
    self, PROBABILITY_ONE, SAMPLE_STEPS_PER_PERIOD, SAMPLE_TABLE_LEN, SAMPLE_TABLE_PERIODS,
};

// Configuration, set by userspace at load time. Read-only, so the verifier
// knows the values and drops the branches they rule out.

/// Sampling period in bytes; 0 records every allocation (exact mode).
#[unsafe(no_mangle)]
static SAMPLE_BYTES: Global<u64> = Global::new(0);
/// Seed of the sampling decisions; 0 draws one per thread.
#[unsafe(no_mangle)]
static SAMPLE_SEED: Global<u64> = Global::new(0);
/// `--min-size` and `--max-size`: blocks outside are not recorded.
#[unsafe(no_mangle)]
static MIN_SIZE_BYTES: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static MAX_SIZE_BYTES: Global<u64> = Global::new(u64::MAX);
/// `exp(-i / SAMPLE_STEPS_PER_PERIOD)` in units of 1/2^32: the chance
/// that a block of i steps is not sampled. Read with volatile loads.
#[unsafe(no_mangle)]
static SAMPLE_SKIP_CHANCE: [u64; SAMPLE_TABLE_LEN] = [0; SAMPLE_TABLE_LEN];

/// What a new block of `size` bytes counts for in the live totals; 0
/// when it is not recorded. See `tracer_ebpf::sampling`.
#[inline(always)]
pub(crate) fn recorded_bytes(size: u64, random_state: &mut u64) -> u64 {
    if size < MIN_SIZE_BYTES.load() || size > MAX_SIZE_BYTES.load() {
        return 0;
    }
    let period_bytes = SAMPLE_BYTES.load();
    if period_bytes == 0 {
        return size;
    }
    if size >= period_bytes * SAMPLE_TABLE_PERIODS {
        return size;
    }
    let scaled = size * SAMPLE_STEPS_PER_PERIOD;
    let index = (scaled / period_bytes) as usize;
    if index + 1 >= SAMPLE_TABLE_LEN {
        return size;
    }
    let fraction = scaled % period_bytes;
    // SAFETY: both indices are below SAMPLE_TABLE_LEN; volatile, so the
    // compiler never folds the table's placeholder values.
    let (upper, lower) = unsafe {
        (
            core::ptr::read_volatile(SAMPLE_SKIP_CHANCE.as_ptr().add(index)),
            core::ptr::read_volatile(SAMPLE_SKIP_CHANCE.as_ptr().add(index + 1)),
        )
    };
    let skip_chance = upper - (upper - lower) * fraction / period_bytes;
    if sampling::next_random_u32(random_state) < skip_chance {
        return 0;
    }
    (size << 32) / (PROBABILITY_ONE - skip_chance)
}

/// A thread's first random state: from the load-time SAMPLE_SEED when
/// one is set (reproducible runs), else from the kernel's generator.
#[inline(always)]
pub(crate) fn seed_for(thread: u64) -> u64 {
    let seed = match SAMPLE_SEED.load() {
        0 => unsafe { ((bpf_get_prandom_u32() as u64) << 32) | bpf_get_prandom_u32() as u64 },
        seed => seed,
    };
    sampling::thread_random_state(seed, thread)
}
