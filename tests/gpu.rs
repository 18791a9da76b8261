//! GPU memory against tests/fixtures/cuda: the fixture CUDA driver and
//! runtime hand out fake device addresses, and gpu_executor prints the
//! exact bytes each named function still holds. Every figure in the report
//! must match, each allocation counted once although the runtime calls the
//! driver and both are hooked.

use crate::harness;

use harness::*;
use serde_json::Value;

#[test]
fn executor_leak_exact() {
    let session = record_while("gpu_executor", &["executor 6"]);
    assert_executor_leak(&session.report, &session.answers[0], 6);
    assert!(
        session.output.stdout.contains("gpu-device via cudaMalloc"),
        "the text report does not name the API: {}",
        session.output
    );
}

#[test]
fn pinned_host_exact() {
    let session = record_while("gpu_executor", &["pinned 5"]);
    let (report, answer) = (&session.report, &session.answers[0]);
    let runtime = stack_by_api(
        report,
        "gpu-host-pinned",
        "pinned_runtime_keep",
        "cudaMallocHost",
    );
    assert_eq!(
        stack_live(runtime),
        Live {
            bytes: field(answer, "pinned_runtime_keep"),
            allocs: 5
        }
    );
    let driver = stack_by_api(
        report,
        "gpu-host-pinned",
        "pinned_driver_keep",
        "cuMemAllocHost_v2",
    );
    assert_eq!(
        stack_live(driver),
        Live {
            bytes: field(answer, "pinned_driver_keep"),
            allocs: 5
        }
    );
    assert_eq!(
        report.live_with("gpu-host-pinned", "pinned_churn"),
        Live::default()
    );
    assert_eq!(
        report.total("gpu-host-pinned"),
        Live {
            bytes: field(answer, "pinned_runtime_keep") + field(answer, "pinned_driver_keep"),
            allocs: 2 * 5
        },
        "\n{report}"
    );
    assert_eq!(report.total("gpu-device"), Live::default());
}

#[test]
fn managed_exact() {
    let session = record_while("gpu_executor", &["managed 3"]);
    let (report, answer) = (&session.report, &session.answers[0]);
    let keep = stack_by_api(report, "gpu-managed", "managed_keep", "cudaMallocManaged");
    let kept = Live {
        bytes: field(answer, "managed_keep"),
        allocs: 3,
    };
    assert_eq!(stack_live(keep), kept);
    assert_eq!(
        report.live_with("gpu-managed", "managed_churn"),
        Live::default()
    );
    assert_eq!(report.total("gpu-managed"), kept, "\n{report}");
}

#[test]
fn pitch_exact() {
    let session = record_while("gpu_executor", &["pitch 3"]);
    let (report, answer) = (&session.report, &session.answers[0]);
    let runtime = stack_by_api(report, "gpu-device", "pitch_keep", "cudaMallocPitch");
    assert_eq!(
        stack_live(runtime),
        Live {
            bytes: field(answer, "pitch_keep"),
            allocs: 3
        }
    );
    let driver = stack_by_api(
        report,
        "gpu-device",
        "pitch_driver_keep",
        "cuMemAllocPitch_v2",
    );
    assert_eq!(
        stack_live(driver),
        Live {
            bytes: field(answer, "pitch_driver_keep"),
            allocs: 3
        }
    );
    assert_eq!(
        report.total("gpu-device"),
        Live {
            bytes: field(answer, "pitch_keep") + field(answer, "pitch_driver_keep"),
            allocs: 2 * 3
        },
        "\n{report}"
    );
}

#[test]
fn async_exact() {
    let session = record_while("gpu_executor", &["async 4"]);
    let (report, answer) = (&session.report, &session.answers[0]);
    let runtime = stack_by_api(report, "gpu-device", "async_keep", "cudaMallocAsync");
    assert_eq!(
        stack_live(runtime),
        Live {
            bytes: field(answer, "runtime"),
            allocs: 4
        }
    );
    let driver = stack_by_api(report, "gpu-device", "async_keep", "cuMemAllocAsync");
    assert_eq!(
        stack_live(driver),
        Live {
            bytes: field(answer, "driver"),
            allocs: 4
        }
    );
    assert_eq!(
        report.live_with("gpu-device", "async_churn"),
        Live::default()
    );
    assert_eq!(
        report.total("gpu-device"),
        Live {
            bytes: field(answer, "runtime") + field(answer, "driver"),
            allocs: 2 * 4
        },
        "\n{report}"
    );
}

#[test]
fn vmm_counts_physical_memory_until_released_and_unmapped() {
    let session = record_while("gpu_executor", &["vmm 6"]);
    let (report, answer) = (&session.report, &session.answers[0]);
    let chunks = stack_by_api(report, "gpu-device", "vmm_map_chunk", "cuMemCreate");
    let mapped = Live::answered(answer, "vmm_map_chunk", "chunks");
    assert_eq!(stack_live(chunks), mapped);
    assert_eq!(
        report.live_with("gpu-device", "vmm_round_trip"),
        Live::default()
    );
    // The address reservation is not usage.
    assert_eq!(report.total("gpu-device"), mapped, "\n{report}");
    // The fabric handle refused first (as on an H200) made nothing.
    assert_eq!(field(answer, "fabric_failed"), 1);
    assert_eq!(report.int("/events/gpu_failed_calls"), 1, "\n{report}");
}

#[test]
fn failed_calls_count_nothing() {
    let session = record_while("gpu_executor", &["fail"]);
    let report = &session.report;
    assert_eq!(
        report.int("/events/gpu_failed_calls"),
        field(&session.answers[0], "failed")
    );
    assert_eq!(report.int("/events/gpu_allocs"), 0);
    assert_eq!(report.int("/events/gpu_frees"), 0);
    for kind in ["gpu-device", "gpu-managed", "gpu-host-pinned"] {
        assert_eq!(report.total(kind), Live::default(), "{kind}:\n{report}");
    }
}

#[test]
fn exit_without_freeing_reports_what_was_live() {
    let mut fixture = Fixture::start("gpu_executor", &[]);
    let trace = Record::pid(fixture.pid).attach();
    let executor = fixture.cmd("executor 2");
    let driver = fixture.cmd("driver 3");
    assert_eq!(fixture.cmd("quit"), "bye");
    let Traced { report, .. } = trace.wait_exit();

    assert!(
        report.target(fixture.pid)["exited_after_s"].is_f64(),
        "{}",
        report.json["targets"]
    );
    let leak = stack_by_api(&report, "gpu-device", "driver_leak", "cuMemAlloc_v2");
    assert_eq!(
        stack_live(leak),
        Live {
            bytes: field(&driver, "driver_leak"),
            allocs: 3
        }
    );
    assert_eq!(
        report.target_total(fixture.pid, "gpu-device"),
        Live {
            bytes: field(&driver, "driver_leak") + field(&executor, "leaked_bytes"),
            allocs: 3 + field(&executor, "leaked_buffers")
        },
        "\n{report}"
    );
}

/// The CUDA context destructions the report lists for its first target.
fn contexts_destroyed(report: &Report) -> &[Value] {
    report.json["targets"][0]["gpu_contexts_destroyed"]
        .as_array()
        .unwrap_or_else(|| panic!("no gpu_contexts_destroyed:\n{report}"))
}

/// What one context destruction released, by kind name.
fn released(destroyed: &Value) -> Vec<(&str, Live)> {
    destroyed["released"]
        .as_object()
        .unwrap_or_else(|| panic!("no released in {destroyed}"))
        .iter()
        .map(|(kind, totals)| (kind.as_str(), stack_live(totals)))
        .collect()
}

#[test]
fn device_reset_releases_what_was_live_and_reused_addresses_count_once() {
    assert_device_reset_exact(&[]);
}

#[test]
fn device_reset_is_exact_with_copied_stacks_too() {
    // --unwind copy: the blocks are counted in userspace from the stack
    // copies, and the reset must release them there as well.
    assert_device_reset_exact(&["--unwind", "copy"]);
}

fn assert_device_reset_exact(tracer_args: &[&str]) {
    let session = harness::record_with("gpu_executor", tracer_args, &["reset 6"]);
    let (report, answer) = (&session.report, &session.answers[0]);
    assert!(
        field(answer, "reused") > 0,
        "the reset handed no address back: {answer}"
    );

    // Released by the reset, without frees: gone from the live figures,
    // and the new blocks at the same addresses count once, in full.
    assert_eq!(
        report.live_with("gpu-device", "reset_before"),
        Live::default(),
        "\n{report}"
    );
    let after = stack_by_api(report, "gpu-device", "reset_after", "cudaMalloc");
    assert_eq!(
        stack_live(after),
        Live::answered(answer, "reset_after", "reset_after_buffers"),
        "\n{report}"
    );
    // Stream-ordered memory belongs to no context: the reset left it.
    let pool = stack_by_api(report, "gpu-device", "reset_pool_keep", "cudaMallocAsync");
    assert_eq!(
        stack_live(pool),
        Live {
            bytes: field(answer, "reset_pool_keep"),
            allocs: 1
        }
    );
    assert_eq!(
        report.total("gpu-device"),
        Live {
            bytes: field(answer, "reset_after") + field(answer, "reset_pool_keep"),
            allocs: field(answer, "reset_after_buffers") + 1
        },
        "\n{report}"
    );
    assert_eq!(
        report.total("gpu-host-pinned"),
        Live::default(),
        "\n{report}"
    );
    assert_eq!(report.total("gpu-managed"), Live::default(), "\n{report}");

    // What was live at that moment, counted once although cudaDeviceReset
    // calls cuDevicePrimaryCtxReset_v2.
    assert_eq!(report.int("/events/gpu_context_destroys"), 1);
    let destroyed = contexts_destroyed(report);
    assert_eq!(destroyed.len(), 1, "\n{report}");
    assert!(destroyed[0]["after_s"].as_f64().unwrap() > 0.0);
    assert_eq!(
        released(&destroyed[0]),
        [
            (
                "gpu-device",
                Live {
                    bytes: field(answer, "released_device"),
                    allocs: 6
                }
            ),
            (
                "gpu-host-pinned",
                Live {
                    bytes: field(answer, "released_pinned"),
                    allocs: 6
                }
            ),
            (
                "gpu-managed",
                Live {
                    bytes: field(answer, "released_managed"),
                    allocs: 1
                }
            ),
        ]
    );
    assert!(
        session
            .output
            .stdout
            .contains("destroyed or reset a CUDA context at"),
        "{}",
        session.output
    );
}

#[test]
fn destroyed_context_releases_its_memory_for_the_next_one() {
    let session = record_while("gpu_executor", &["ctxdestroy 3"]);
    let (report, answer) = (&session.report, &session.answers[0]);
    assert_eq!(field(answer, "reused"), 3, "{answer}");

    let leak = stack_by_api(report, "gpu-device", "driver_leak", "cuMemAlloc_v2");
    let leaked = Live {
        bytes: field(answer, "driver_leak"),
        allocs: 3,
    };
    assert_eq!(stack_live(leak), leaked, "\n{report}");
    assert_eq!(report.live_with("gpu-device", "ctx_work"), Live::default());
    assert_eq!(report.total("gpu-device"), leaked, "\n{report}");
    assert_eq!(
        report.total("gpu-host-pinned"),
        Live::default(),
        "\n{report}"
    );

    let destroyed = contexts_destroyed(report);
    assert_eq!(destroyed.len(), 1, "\n{report}");
    assert_eq!(
        released(&destroyed[0]),
        [
            (
                "gpu-device",
                Live {
                    bytes: field(answer, "released_device"),
                    allocs: 3
                }
            ),
            (
                "gpu-host-pinned",
                Live {
                    bytes: field(answer, "released_pinned"),
                    allocs: 1
                }
            ),
        ]
    );
}
