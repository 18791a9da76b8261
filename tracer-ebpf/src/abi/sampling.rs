//! Sampling by bytes: a block of `s` bytes is recorded with probability
//! `1 - exp(-s / N)` (N = `--sample-bytes`), the chance that a Poisson
//! process with one point per N bytes puts a point in it, and then counts
//! for `s / (1 - exp(-s / N))` bytes. The kernel reads `exp(-x)` from a
//! table set at load time, in steps of 1/[`SAMPLE_STEPS_PER_PERIOD`] of N,
//! interpolated linearly; it records with exactly the probability it
//! weights by, so the estimate stays unbiased.

/// Table steps per sampling period N.
pub const SAMPLE_STEPS_PER_PERIOD: u64 = 64;
/// Blocks of this many periods or more are always recorded.
pub const SAMPLE_TABLE_PERIODS: u64 = 16;
/// Entries of the skip-chance table (one more than the steps, for the
/// interpolation's upper end).
pub const SAMPLE_TABLE_LEN: usize = (SAMPLE_STEPS_PER_PERIOD * SAMPLE_TABLE_PERIODS) as usize + 1;
/// Probabilities are fixed point, 1.0 = 2^32 (one random u32 draw).
pub const PROBABILITY_ONE: u64 = 1 << 32;
/// The largest sampling period: keeps `size << 32` within 63 bits for
/// every size below `SAMPLE_TABLE_PERIODS` periods.
pub const MAX_SAMPLE_BYTES: u64 = 1 << 27;
