//! Reading what `tracer top` and a report's first lines print.

use super::TracerOutput;

impl TracerOutput {
    /// The last table `tracer top` printed on its piped stdout (one plain
    /// table per interval), from just after its `tracer top — ` title.
    pub fn last_top_table(&self) -> &str {
        self.stdout
            .rsplit_once("tracer top — ")
            .unwrap_or_else(|| panic!("no table on stdout: {self}"))
            .1
    }

    /// The report line starting with `prefix` among its first three lines
    /// (where the verdict's header is).
    pub fn header_line(&self, prefix: &str) -> &str {
        self.stdout
            .lines()
            .take(3)
            .find(|line| line.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in the first lines:\n{self}"))
    }
}
