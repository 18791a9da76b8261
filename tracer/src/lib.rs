//! tracer's library: one module per stage of the data flow, so a reader can
//! follow one allocation from probe to report.
//!
//! cli (parses the command line into `config`) -> attach (probes in the target) -> collect (snapshots of the
//! kernel's per-stack totals) -> model (time series, ranking) -> symbolize
//! -> output (text and JSON reports).
//!
//! `recording` saves the snapshots and symbolized stacks to a file while
//! tracing; `analyze` (the `report` verb) rebuilds the model from such a
//! file and hands it to the same output code.
pub mod analyze;
pub mod attach;
pub mod cli;
pub mod collect;
pub mod config;
pub mod debug_files;
pub mod error;
pub mod holders;
pub mod model;
pub mod output;
pub mod procfs;
pub mod record;
pub mod recording;
pub mod report;
pub mod runtimes;
pub mod serve;
pub mod session;
pub mod symbolize;
pub mod target_files;
pub mod target_memory;
pub mod top;
pub mod tracefs;
pub mod unwind;
