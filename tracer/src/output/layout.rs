//! How a report lays its stacks out: one entry per site or per stack
//! (`--group-by`), and which native frames a stack with Python frames
//! shows (`--native`). Every format that lists stacks (text, SVG, `tracer
//! top`) follows it; the JSON has both the stacks and the site groups.

/// What the report lists as one entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupBy {
    /// The stacks that share a site label (the same function and line,
    /// reached by several call paths), summed into one entry.
    #[default]
    Site,
    /// Every stack on its own.
    Stack,
}

/// Which native frames a stack with Python frames shows in the text
/// report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NativeFrames {
    /// The native frames nearest the allocation, below the innermost
    /// Python frame; the interpreter's own frames, and the native frames
    /// between and below the Python frames, folded into one line each
    /// with their count (as do runs of one Python frame calling itself).
    #[default]
    Nearest,
    /// Every frame.
    All,
}

/// `--group-by` and `--native`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReportLayout {
    pub group_by: GroupBy,
    pub native: NativeFrames,
}
