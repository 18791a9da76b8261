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

/// xorshift64*: the upper 32 bits of the next value of `state` (which
/// must not be 0: it would stay 0).
#[inline(always)]
pub fn next_random_u32(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32
}

/// A thread's first random state from `seed` and its id (`thread`, the
/// low 32 bits of bpf_get_current_pid_tgid): never 0.
#[inline(always)]
pub const fn thread_random_state(seed: u64, thread: u64) -> u64 {
    // Spread the seed over all bits before mixing in the thread id, so
    // that nearby seeds and thread ids never cancel out; then the
    // splitmix64 finalizer: distinct threads get unrelated streams.
    let mut z = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (thread as u32 as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xorshift_draws_are_uniform_u32s() {
        let mut state = thread_random_state(1, 1);
        let draws: Vec<u64> = (0..200_000).map(|_| next_random_u32(&mut state)).collect();
        assert!(draws.iter().all(|&draw| draw < PROBABILITY_ONE));
        let mean = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
        // A uniform u32's sd is 2^32 / sqrt(12): the mean's is that over
        // sqrt(200 000); five of them.
        let bound = 5.0 * (PROBABILITY_ONE as f64 / 12f64.sqrt()) / (draws.len() as f64).sqrt();
        assert!(
            (mean - PROBABILITY_ONE as f64 / 2.0).abs() < bound,
            "mean {mean}"
        );
        // Each sixteenth of the range gets its share (within 5 %).
        let mut bins = [0u32; 16];
        for &draw in &draws {
            bins[(draw >> 28) as usize] += 1;
        }
        let share = draws.len() as f64 / 16.0;
        assert!(
            bins.iter()
                .all(|&bin| (f64::from(bin) - share).abs() < 0.05 * share),
            "{bins:?}"
        );
    }

    #[test]
    fn the_generator_is_xorshift64_star() {
        // Marsaglia's shifts (12, 25, 27) and Vigna's multiplier, by hand.
        let mut state = 1u64;
        let first = next_random_u32(&mut state);
        let x = 1u64 ^ (1 << 25);
        let x = x ^ (x >> 27);
        assert_eq!(state, x);
        assert_eq!(first, x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32);
        assert_ne!(next_random_u32(&mut state), first);
    }

    #[test]
    fn threads_and_seeds_get_distinct_nonzero_states() {
        let mut states = std::collections::HashSet::new();
        for seed in 1..=64u64 {
            for thread in 1..=64u64 {
                let state = thread_random_state(seed, thread);
                assert_ne!(state, 0);
                assert!(states.insert(state), "seed {seed} thread {thread}");
            }
        }
        // Only the thread id's low 32 bits (the tid) count.
        assert_eq!(
            thread_random_state(7, 5),
            thread_random_state(7, (1234 << 32) | 5)
        );
        // Seeds and tids that differ by the same amount do not cancel.
        assert_ne!(thread_random_state(1, 2), thread_random_state(2, 1));
    }
}
