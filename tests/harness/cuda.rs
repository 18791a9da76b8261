//! What tests/fixtures/cuda's executor holds, for the GPU tests: its
//! buffers and pool in numbers, and the one check of its leak.

use std::time::Duration;

use serde_json::Value;

use super::{Allocated, Live, Report, field, frames_contain, stack_allocated, stack_live};

/// Buffers each executor instance leaks (SHARED_PARAMS in the fixture).
pub const LEAKED_BUFFERS_PER_INSTANCE: i64 = 3;
/// Pool entries of an executor instance (POOL_ENTRIES in the fixture).
pub const POOL_ENTRIES: i64 = 8;
/// Device allocations per executor instance: the pool, then the shared.
pub const ALLOCS_PER_INSTANCE: i64 = POOL_ENTRIES + LEAKED_BUFFERS_PER_INSTANCE;
/// Bytes of one instance's pool: entry i holds (i + 1) x 256 KiB.
pub const POOL_BYTES_PER_INSTANCE: i64 = 256 * 1024 * POOL_ENTRIES * (POOL_ENTRIES + 1) / 2;
/// How soon a library mapped after attach must be hooked: a generous
/// bound a busy machine meets (milliseconds on a quiet one); what counts
/// is that the calls after it are exact.
pub const HOOK_DEADLINE: Duration = Duration::from_secs(10);

/// The one stack of `kind` containing `function` and made by `api`.
pub fn stack_by_api<'a>(report: &'a Report, kind: &str, function: &str, api: &str) -> &'a Value {
    let stacks: Vec<&Value> = report
        .stacks_with(kind, function)
        .into_iter()
        .filter(|stack| stack["api"] == api)
        .collect();
    assert_eq!(
        stacks.len(),
        1,
        "one {kind} stack in {function} via {api}:\n{report}"
    );
    stacks[0]
}

/// The executor's leak: the pool buffers replaced by share_params and never
/// freed, allocated in setup_storage through cudaMalloc.
pub fn assert_executor_leak(report: &Report, answer: &str, instances: i64) {
    let leaked_bytes = field(answer, "leaked_bytes");
    assert_eq!(
        field(answer, "leaked_buffers"),
        instances * LEAKED_BUFFERS_PER_INSTANCE
    );
    let top = report
        .stacks()
        .iter()
        .find(|stack| stack["kind"] == "gpu-device")
        .unwrap_or_else(|| panic!("no gpu-device stack:\n{report}"));
    assert!(
        frames_contain(top, "setup_storage"),
        "setup_storage is not the top gpu-device stack:\n{report}"
    );
    assert_eq!(top["api"], "cudaMalloc", "\n{report}");
    let leak = Live {
        bytes: leaked_bytes,
        allocs: instances * LEAKED_BUFFERS_PER_INSTANCE,
    };
    assert_eq!(stack_live(top), leak, "\n{report}");
    assert_eq!(
        stack_allocated(top),
        Allocated {
            bytes: instances * POOL_BYTES_PER_INSTANCE,
            count: instances * POOL_ENTRIES
        },
        "\n{report}"
    );
    assert_eq!(
        report.live_with("gpu-device", "share_params"),
        Live::default(),
        "the shared buffers are freed on destroy:\n{report}"
    );
    // Counted once: the driver calls made inside the runtime add nothing;
    // the shared buffers freed to zero, not below.
    assert_eq!(report.total("gpu-device"), leak, "\n{report}");
    assert_eq!(
        report.int("/events/gpu_allocs"),
        instances * ALLOCS_PER_INSTANCE
    );
    assert_eq!(
        report.int("/events/gpu_frees"),
        instances * (ALLOCS_PER_INSTANCE - LEAKED_BUFFERS_PER_INSTANCE)
    );
    assert!(
        report
            .stacks()
            .iter()
            .all(|stack| stack["api"] != "cuMemAlloc_v2"),
        "a driver call under the runtime was counted:\n{report}"
    );
}
