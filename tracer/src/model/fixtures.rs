//! Stacks and counters for the unit tests of the layers that take the
//! model's types (model, output, recording).
use super::{Counters, Frame, Kind, Language, StackId, StackKey};

/// Heap stack `stack_id` (a kernel id) of process `pid`.
pub fn heap_key(pid: u32, stack_id: u32) -> StackKey {
    StackKey {
        pid,
        stack_id: StackId::Kernel(stack_id),
        kind: Kind::Heap,
    }
}

/// A stack holding `live_bytes` in 64-byte blocks, having allocated twice
/// as much.
pub fn counters(live_bytes: i64) -> Counters {
    Counters {
        live_bytes,
        live_allocs: live_bytes / 64,
        alloc_bytes_total: 2 * live_bytes as u64,
        alloc_count_total: 2 * (live_bytes / 64) as u64,
    }
}

/// The Python frame of `function` at `file:line`.
pub fn python_frame(function: &str, file: &str, line: u32) -> Frame {
    Frame {
        function: Some(function.to_owned()),
        file: Some(file.to_owned()),
        line: Some(line),
        language: Language::Python,
        ..Frame::default()
    }
}
