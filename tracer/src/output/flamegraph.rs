//! The report as an interactive SVG flame graph of live bytes (inferno):
//! the folded stacks drawn, with search and zoom in any browser.

use anyhow::{Context as _, Result};
use inferno::flamegraph::{self, Options};

use super::{Report, folded};
use crate::config::FoldedValue;

/// The flame graph of `value` as SVG.
pub fn render(report: &Report, value: FoldedValue) -> Result<Vec<u8>> {
    let lines: Vec<String> = folded::lines(report, value).collect();
    let mut options = Options::default();
    let (title, unit) = match value {
        FoldedValue::LiveBytes => ("live bytes", "bytes"),
        FoldedValue::LiveAllocs => ("live allocations", "allocations"),
        FoldedValue::AllocBytes => ("bytes allocated", "bytes"),
        FoldedValue::Growth => ("growth of live bytes", "bytes/s"),
    };
    options.title = format!(
        "tracer: {title} by stack, {:.1} s from attach",
        report.window_s
    );
    options.count_name = unit.to_owned();
    options.subtitle = report.drop_summary();
    let mut svg = Vec::new();
    if lines.is_empty() {
        // inferno refuses an empty graph; say so in a valid SVG instead.
        svg.extend_from_slice(
            b"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\" height=\"40\">\
              <text x=\"10\" y=\"25\">no stacks with a value above zero</text></svg>\n",
        );
        return Ok(svg);
    }
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .context("could not draw the flame graph")?;
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::sample_report;

    #[test]
    fn draws_every_stack_as_svg() {
        let svg =
            String::from_utf8(render(&sample_report(10), FoldedValue::LiveBytes).unwrap()).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..80]);
        assert!(svg.contains("grow_1"));
        assert!(svg.contains("tracer: live bytes by stack, 4.0 s from attach"));
        assert!(svg.contains("3 events dropped"));
    }

    #[test]
    fn an_empty_report_is_still_an_svg() {
        let mut report = sample_report(10);
        report.stacks.clear();
        let svg = String::from_utf8(render(&report, FoldedValue::LiveBytes).unwrap()).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("no stacks"));
    }
}
