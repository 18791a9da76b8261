//! tracer's integration tests: one binary, a module per area (run one
//! area with `cargo test --release -p tracer --test integration --
//! AREA::`). Each test starts real processes, attaches the real tracer
//! binary to them and checks its report against what they printed; the
//! shared harness is in `harness/`.

#[allow(dead_code, reason = "each area uses part of the harness")]
mod harness;

mod allocators;
mod attach;
mod cost;
mod debug_files;
mod dist;
mod docs;
mod ebpf_names;
mod errors;
mod exceptions;
mod forks_and_execs;
mod go;
mod gpu;
mod gpu_dlopen;
mod gpu_tensors;
mod growth;
mod holders;
mod holders_heap;
mod holders_python;
mod holders_reservation;
mod hostile_files;
mod house;
mod labels;
mod listen;
mod listen_comm;
mod mappings;
mod phantom;
mod python;
mod python_objects;
mod record;
mod recording;
mod recording_limits;
mod reliability;
mod resident;
mod rust_stacks;
mod sampling;
mod shapes;
mod sites;
mod slow_symbols;
mod spawn;
mod stack_eviction;
mod stack_table;
mod terminal;
mod torch;
mod torch_verdicts;
mod unwind;
mod verdicts;
