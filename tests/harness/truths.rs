//! What the fixtures allocate, as their C sources define it, so that a
//! size is written once for every test that checks it.

use super::{Live, Report, field};

/// `malloc` size in leaky.c's `leak_here`.
pub const LEAK_SIZE_BYTES: i64 = 1337;
/// `malloc` size in leaky.c's `thread_leak`.
pub const THREAD_LEAK_SIZE_BYTES: i64 = 2048;
/// Blocks leaky.c allocates before it is ready (and frees on `free_pre`).
pub const PREALLOC_COUNT: i64 = 100;
/// Size of each of those blocks.
pub const PREALLOC_SIZE_BYTES: i64 = 64;
/// Allocator calls that return a block in one `churn` round of leaky.c:
/// three in churn_realloc, one in each of the other seven functions.
pub const CHURN_ALLOCS_PER_ROUND: i64 = 10;
/// Block size of leaky.c's `churn_keep` (`calloc(4, 100)`), kept every round.
pub const CHURN_KEEP_BYTES: i64 = 400;
/// Block size of leaky.c's `churn_memalign`, kept every second round.
pub const CHURN_MEMALIGN_BYTES: i64 = 128;
/// `malloc` size in nested_nofp.c's `inner_static`.
pub const NESTED_LEAK_BYTES: i64 = 777;
/// `malloc` size at the bottom of nested_nofp.c's `deep_recurse`.
pub const DEEP_LEAK_BYTES: i64 = 999;
/// `malloc` size in nofp_plugin.c's `plugin_inner`.
pub const PLUGIN_LEAK_BYTES: i64 = 555;
/// `malloc` size in reentrant.c's `thread_alloc` and `child_alloc`.
pub const REENTRANT_BLOCK_BYTES: i64 = 1000;

/// The heap leaky holds after `churn`, from its answer: churn_keep's
/// blocks and every second churn_memalign block.
pub fn churn_held(answer: &str) -> Live {
    let keep_bytes = field(answer, "churn_keep");
    let memalign_bytes = field(answer, "churn_memalign");
    Live {
        bytes: keep_bytes + memalign_bytes,
        allocs: keep_bytes / CHURN_KEEP_BYTES + memalign_bytes / CHURN_MEMALIGN_BYTES,
    }
}

/// The block glibc's pthread_create keeps for each new thread (its
/// thread-local storage vector, from allocate_dtv): one per thread.
pub fn thread_dtvs(report: &Report, threads: i64) -> Live {
    let dtvs = report.heap_live_with("allocate_dtv");
    assert_eq!(dtvs.allocs, threads, "one TLS vector per thread:\n{report}");
    dtvs
}
