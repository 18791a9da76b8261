//! The report's formats: the report (`crate::report`), built once from the
//! model and the run's facts, written by one small file per format
//! (`text`, `json`, `folded`, `pprof`, `flamegraph`, `svg`). Building it
//! apart from the formats keeps every format showing the same numbers,
//! whether the report comes from a live run or from a recording, and lets a
//! new format touch one file here.

pub mod file;
pub mod flamegraph;
pub mod folded;
pub mod json;
pub mod pprof;
pub mod svg;
pub mod terminal;
pub mod text;

pub use crate::config::{GroupBy, NativeFrames, ReportLayout};
pub use crate::model::Wrappers;
pub use crate::report::{
    Entry, MemoryReconciliation, Report, ReportInput, SiteGroup, StackReport, TargetReport,
    by_site_label, evidence, human_bytes, live_totals, stacks_of_sites,
};
