//! tracer's library: one module per stage of the data flow, so a reader can
//! follow one allocation from probe to report.
//!
//! cli -> attach (probes in the target) -> collect (snapshots of the
//! kernel's per-stack totals) -> model (time series, ranking) -> symbolize
//! -> output (text and JSON reports).
pub mod attach;
pub mod cli;
pub mod collect;
pub mod error;
pub mod model;
pub mod output;
pub mod procfs;
pub mod session;
pub mod symbolize;
pub mod top;
pub mod tracefs;
