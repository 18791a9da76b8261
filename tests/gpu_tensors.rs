//! PyTorch's caching allocator seen through (issue 41): the fixture
//! libc10_cuda.so (tests/fixtures/cuda) has torch's two unexported
//! functions and `Block` layout, and carves tensor blocks out of segments it
//! cudaMallocs from the fixture runtime; tests/fixtures/python/tensors.py
//! drives it from Python through ctypes and prints what
//! `torch.cuda.memory_allocated()` and `memory_reserved()` would say. Each
//! kept tensor is a gpu-tensor block named by its Python line, the blocks
//! add up to memory_allocated, and the segments beside them (gpu-device)
//! to what was reserved since attach.

use crate::harness;

use std::process::Command;

use harness::{
    Live, Record, fixture, python_frames, python_line, stack_live, start_python, sum_live,
};

/// The fixture caching allocator, stripped of its full symbol table (as a
/// stripped build of torch would be), in a directory of its own.
fn stripped_library() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tracer-c10-stripped-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let stripped = dir.join("libc10_cuda.so");
    let status = Command::new("strip")
        .args(["--strip-all", "-o"])
        .arg(&stripped)
        .arg(fixture("cuda/libc10_cuda.so"))
        .status()
        .expect("strip (binutils) runs");
    assert!(status.success());
    stripped
}

const SCRIPT: &str = "tensors.py";
const KEPT: i64 = 4;

#[test]
fn tensor_blocks_are_exact_and_named_by_their_python_line() {
    let library = fixture("cuda/libc10_cuda.so");
    let exported = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&library)
        .output()
        .expect("nm (binutils) runs");
    assert!(
        !String::from_utf8_lossy(&exported.stdout).contains("DeviceCachingAllocator"),
        "the fixture must hide the caching allocator as torch does"
    );
    let mut fixture = start_python(SCRIPT, &[]);
    let trace = Record::pid(fixture.pid).attach();
    let answer = fixture.cmd(&format!("leak {KEPT}"));
    let traced = trace.stop();
    let (report, output) = (&traced.report, &traced.output);
    let field = |key| harness::field(&answer, key);

    let kept = report
        .stacks()
        .iter()
        .filter(|stack| stack["kind"] == "gpu-tensor")
        .filter(|stack| {
            python_frames(stack)
                .first()
                .map(|(f, file, line)| (f.as_str(), file.as_str(), *line))
                == Some(("keep_tensor", SCRIPT, python_line(SCRIPT, "# KEEP-TENSOR")))
        })
        .collect::<Vec<_>>();
    assert_eq!(
        sum_live(&kept),
        Live {
            bytes: field("kept_bytes"),
            allocs: KEPT
        },
        "the kept blocks under keep_tensor's line: {answer}\n{report}"
    );
    assert_eq!(kept.len(), 1, "one stack for one line\n{report}");
    assert_eq!(
        report.live_with("gpu-tensor", "churn"),
        Live::default(),
        "every temporary was freed\n{report}"
    );
    assert_eq!(
        report.total("gpu-tensor").bytes,
        field("allocated"),
        "gpu-tensor is torch.cuda.memory_allocated(): {answer}\n{report}"
    );
    assert_eq!(
        report.total("gpu-device").bytes,
        field("reserved") - field("reserved_at_ready"),
        "gpu-device is what was reserved since attach: {answer}\n{report}"
    );
    assert!(
        output.stdout.contains("gpu-tensor"),
        "the text report names the kind:\n{output}"
    );
    assert_eq!(
        report.json["events"]["gpu_tensor_frees_unknown"], 1,
        "the weights, allocated before attach, freed after\n{report}"
    );
    assert!(
        report.json["drops"]
            .get("gpu_tensor_block_unreadable")
            .is_none(),
        "every block read as torch's: {}",
        report.json["drops"]
    );
    // The blocks are inside the segments: counted once in what is traced.
    let target = &report.targets()[0];
    let not_tensors: i64 = target["totals"]
        .as_object()
        .expect("totals by kind")
        .iter()
        .filter(|(kind, _)| !matches!(kind.as_str(), "gpu-tensor" | "mmap-reserved"))
        .map(|(_, totals)| stack_live(totals).bytes)
        .sum();
    assert_eq!(
        target["memory"]["traced_bytes"].as_i64(),
        Some(not_tensors),
        "traced bytes leave gpu-tensor out\n{report}"
    );
}

/// Without its symbol table the caching allocator cannot be found: a note
/// says so, and its segments are still counted, exactly.
#[test]
fn a_stripped_caching_allocator_gets_a_note_and_its_segments() {
    let library = stripped_library();
    let runtime = fixture("cuda/libcudart.so.12");
    let runtime_dir = runtime.parent().expect("target/fixtures/cuda");
    let mut fixture = start_python(
        SCRIPT,
        &[
            ("C10_LIBRARY", library.to_str().expect("a UTF-8 path")),
            (
                "LD_LIBRARY_PATH",
                runtime_dir.to_str().expect("a UTF-8 path"),
            ),
        ],
    );
    let trace = Record::pid(fixture.pid).attach();
    let answer = fixture.cmd("leak 2");
    let traced = trace.stop();
    let _ = std::fs::remove_dir_all(library.parent().expect("its directory"));
    let (report, output) = (&traced.report, &traced.output);
    assert!(
        output
            .stderr
            .contains("does not list PyTorch's caching allocator"),
        "the note on the stripped library:\n{output}"
    );
    assert_eq!(report.total("gpu-tensor"), Live::default(), "\n{report}");
    assert_eq!(
        report.total("gpu-device").bytes,
        harness::field(&answer, "reserved") - harness::field(&answer, "reserved_at_ready"),
        "{answer}\n{report}"
    );
}

/// The caching allocator throws `c10::OutOfMemoryError` above its cap and
/// its caller catches it, as serving code does: the traced process
/// survives every throw (the return probe on `DeviceCachingAllocator::
/// malloc` is in the unwound frame), and the gpu-tensor bytes stay what the
/// allocator holds. On main before the fix, the first throw terminated
/// the process.
#[test]
fn out_of_memory_errors_caught_by_the_caller_leave_the_target_running() {
    const OOMS: i64 = 50;
    let mut fixture = start_python(SCRIPT, &[]);
    let trace = Record::pid(fixture.pid).attach();
    let leaked = fixture.cmd("leak 2");
    let oom = fixture.cmd(&format!("oom {OOMS}"));
    let leaked_after = fixture.cmd("leak 1");
    let traced = trace.stop();
    let report = &traced.report;
    assert_eq!(harness::field(&oom, "oom_caught"), OOMS);
    assert_eq!(
        harness::field(&oom, "allocated"),
        harness::field(&leaked, "allocated"),
        "a request that threw holds nothing"
    );
    assert_eq!(
        report.total("gpu-tensor").bytes,
        harness::field(&leaked_after, "allocated"),
        "gpu-tensor is torch.cuda.memory_allocated(): {leaked_after}\n{report}"
    );
    assert!(
        report.int("/events/exception_returns_restored") >= OOMS,
        "{}",
        report.json["events"]
    );
    report.assert_no_exception_restore_lost();
    assert_eq!(fixture.cmd("quit"), "bye");
}
