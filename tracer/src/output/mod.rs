//! The report (`report`): what a trace found, built once from the model
//! and the symbolized stacks, then written by one small file per format
//! (`text`, `json`, `folded`, `pprof`, `flamegraph`, `svg`). Building it
//! apart from the formats keeps every format showing the same numbers,
//! whether the report comes from a live run or from a recording, and lets a
//! new format touch one file.

pub mod evidence;
pub mod file;
pub mod flamegraph;
pub mod folded;
pub mod json;
pub mod pprof;
mod report;
pub mod svg;
pub mod terminal;
pub mod text;
mod units;

#[cfg(test)]
mod fixtures;

pub use crate::config::{GroupBy, NativeFrames, ReportLayout};
pub use crate::model::Wrappers;
pub use report::{
    Entry, MemoryReconciliation, Report, ReportInput, SiteGroup, StackReport, TargetReport,
    by_site_label,
};
pub use units::{human_bytes, live_totals};
