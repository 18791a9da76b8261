//! The growth plot: one SVG with two panels sharing the time axis, drawn
//! with plotters' SVG backend (text stays `<text>`: no fonts needed).
//!
//! - top: live bytes per kind of each target over time, with the target's
//!   RSS as a thin gray line, so the share tracer does not see is visible;
//! - bottom: live bytes of the stacks still growing (suspected leaks
//!   first, then the fastest growth in the second half), labelled with the
//!   rank the text report gives them (`L1` suspected leak, `#3` third by
//!   live bytes) and their most useful frame.
//!
//! Several targets share one plot: the top panel has one line per target
//! and kind (and one RSS line per target); the stack lines name their PID.
//! Legends sit in a column right of each panel, never over the data.
use std::path::Path;

use anyhow::Result;
use plotters::{coord::Shift, prelude::*, series::LineSeries};

use super::{Report, human_bytes};
use crate::model::Model;

mod stacks;

use stacks::stack_lines_of;

/// Size of the picture, readable without zooming.
pub const WIDTH_PX: u32 = 1200;
pub const HEIGHT_PX: u32 = 800;
/// Width of the legend column right of each panel.
const LEGEND_WIDTH_PX: u32 = 330;

/// Tableau 10: distinct colours that stay apart for most colour-blind
/// readers.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

const REFERENCE_GRAY: RGBColor = RGBColor(90, 90, 90);

/// One line of a panel and its legend entry (a label, a detail line and,
/// for a stack told apart from another of the same label, the frame that
/// tells it apart).
struct Line {
    label: String,
    detail: String,
    through: Option<String>,
    points: Vec<(f64, f64)>,
    /// Drawn thin and gray (RSS), apart from the coloured data lines.
    reference: bool,
}

/// Renders the plot as SVG text.
pub fn render(report: &Report, model: &Model, stack_lines: usize) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let root = root
            .titled(&title(report), ("sans-serif", 22))
            .map_err(plot_error)?;
        let (top, bottom) = root.split_vertically(HEIGHT_PX * 2 / 5 - 20);
        let window_s = report.window_s.max(1e-3);
        draw_panel(
            &top,
            "live bytes by kind, and RSS",
            window_s,
            &totals_lines(report, model),
        )?;
        let caption = match &report.judged_at {
            Some(judged) => format!(
                "stacks as ranked at {}, suspected leaks first (at most {stack_lines})",
                format_time(judged.at_s, report.window_s)
            ),
            None => format!("stacks still growing, suspected leaks first (at most {stack_lines})"),
        };
        draw_panel(
            &bottom,
            &caption,
            window_s,
            &stack_lines_of(report, stack_lines),
        )?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// Renders the plot and writes it (mode 0600), replacing the file
/// atomically so a viewer never reads half a picture.
pub fn write_svg(report: &Report, model: &Model, stack_lines: usize, path: &Path) -> Result<()> {
    let svg = render(report, model, stack_lines)?;
    super::file::write_private(path, svg.as_bytes())
}

/// The title: the target and its command, or with several targets their
/// PIDs only (the legend names each line's PID), so that it fits the width.
fn title(report: &Report) -> String {
    let targets = match report.targets.as_slice() {
        [target] => {
            let command = &target.target.command;
            let short: String = command.chars().take(40).collect();
            let ellipsis = if short.len() < command.len() {
                "…"
            } else {
                ""
            };
            format!("PID {} ({short}{ellipsis})", target.target.pid)
        }
        targets => {
            let pids: Vec<String> = targets
                .iter()
                .map(|target| target.target.pid.to_string())
                .collect();
            format!("PID {}", pids.join(", "))
        }
    };
    format!(
        "tracer: {targets} — {} window from attach",
        format_time(report.window_s, report.window_s)
    )
}

fn totals_lines(report: &Report, model: &Model) -> Vec<Line> {
    let several = report.targets.len() > 1;
    let suffix = |pid: u32| {
        if several {
            format!(" PID {pid}")
        } else {
            String::new()
        }
    };
    let mut lines: Vec<Line> = model
        .kind_totals_series()
        .iter()
        // Reserved address space is not memory: it would dwarf RSS.
        .filter(|((_, kind), _)| kind.is_memory())
        .map(|((pid, kind), points)| Line {
            label: format!("{} live{}", kind.as_str(), suffix(*pid)),
            detail: format!(
                "traced, {} at the end",
                human_bytes(points.last().map_or(0, |&(_, bytes)| bytes) as f64)
            ),
            points: std::iter::once((0.0, 0.0))
                .chain(points.iter().map(|&(t, bytes)| (t, bytes as f64)))
                .collect(),
            through: None,
            reference: false,
        })
        .collect();
    lines.extend(model.rss_series().iter().map(|(pid, points)| Line {
        label: format!("RSS{} (gray)", suffix(*pid)),
        detail: format!(
            "all resident memory, {} at the end",
            human_bytes(points.last().map_or(0, |&(_, bytes)| bytes) as f64)
        ),
        points: points.iter().map(|&(t, bytes)| (t, bytes as f64)).collect(),
        through: None,
        reference: true,
    }));
    lines
}

fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    window_s: f64,
    lines: &[Line],
) -> Result<()> {
    let (chart_area, legend_area) = area.split_horizontally(WIDTH_PX - LEGEND_WIDTH_PX);
    let max_bytes = lines
        .iter()
        .flat_map(|line| line.points.iter().map(|&(_, bytes)| bytes))
        .fold(0.0_f64, f64::max)
        .max(1.0);
    // Plot in one binary unit so the axis ticks are round numbers of it.
    let (unit_bytes, unit) = [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")]
        .into_iter()
        .find(|&(size, _)| max_bytes >= size as f64)
        .unwrap_or((1, "B"));
    let unit_bytes = unit_bytes as f64;
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(caption, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..window_s, 0.0..max_bytes / unit_bytes * 1.05)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_labels(8)
        .y_labels(6)
        .x_label_formatter(&|t| format_time(*t, window_s))
        .y_label_formatter(&|value| format!("{} {unit}", trim_number(*value)))
        .x_desc("time since attach")
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 14))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(plot_error)?;
    for (index, line) in lines.iter().enumerate() {
        let style = line_style(index, line);
        let points = line
            .points
            .iter()
            .map(|&(t, bytes)| (t, bytes / unit_bytes));
        chart
            .draw_series(LineSeries::new(points, style))
            .map_err(plot_error)?;
    }
    draw_legend(&legend_area, lines)
}

fn draw_legend(area: &DrawingArea<SVGBackend<'_>, Shift>, lines: &[Line]) -> Result<()> {
    if lines.is_empty() {
        area.draw(&Text::new(
            "nothing to plot yet",
            (10, 50),
            ("sans-serif", 14),
        ))
        .map_err(plot_error)?;
    }
    let mut y = 44;
    for (index, line) in lines.iter().enumerate() {
        let swatch = line_style(index, line).filled();
        area.draw(&Rectangle::new([(4, y - 3), (24, y + 3)], swatch))
            .map_err(plot_error)?;
        area.draw(&Text::new(
            shorten(&line.label, 40),
            (30, y - 8),
            ("sans-serif", 14),
        ))
        .map_err(plot_error)?;
        area.draw(&Text::new(
            shorten(&line.detail, 44),
            (30, y + 8),
            ("sans-serif", 12).into_font().color(&REFERENCE_GRAY),
        ))
        .map_err(plot_error)?;
        if let Some(through) = &line.through {
            // Cut from the left: frames that part differ at their end
            // (the line) as often as at their start.
            area.draw(&Text::new(
                format!("through {}", shorten_left(through, 36)),
                (30, y + 22),
                ("sans-serif", 12).into_font().color(&REFERENCE_GRAY),
            ))
            .map_err(plot_error)?;
            y += 14;
        }
        y += 38;
    }
    Ok(())
}

/// `text` cut to `max_chars` from the left: `…Layer.__init__ (m.py:164)`.
fn shorten_left(text: &str, max_chars: usize) -> String {
    let count = text.chars().count();
    if count <= max_chars {
        return text.to_owned();
    }
    let kept: String = text.chars().skip(count - (max_chars - 1)).collect();
    format!("…{kept}")
}

/// Data lines: 2 px in the palette's colours; reference lines: 1 px gray.
fn line_style(index: usize, line: &Line) -> ShapeStyle {
    if line.reference {
        REFERENCE_GRAY.stroke_width(1)
    } else {
        PALETTE[index % PALETTE.len()].stroke_width(2)
    }
}

fn shorten(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        text.to_owned()
    } else {
        let kept: String = text.chars().take(max_chars - 1).collect();
        format!("{kept}…")
    }
}

/// 2.50 -> "2.5", 3.00 -> "3".
fn trim_number(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Seconds, or minutes once the window is longer than three minutes.
fn format_time(time_s: f64, window_s: f64) -> String {
    if window_s > 180.0 {
        format!("{:.1} min", time_s / 60.0)
    } else if window_s > 20.0 {
        format!("{time_s:.0} s")
    } else {
        format!("{time_s:.1} s")
    }
}

fn plot_error<E: std::fmt::Debug>(error: E) -> anyhow::Error {
    anyhow::anyhow!("could not draw the plot: {error:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const STACK_LINES: usize = 8;
    use crate::model::run::{RunFacts, StackFacts};
    use crate::model::{Counters, Frame, Kind, Snapshot, StackId, StackKey, Target};
    use crate::report::{Report, ReportInput, ReportView};

    /// Data lines are drawn 2 px wide; axes and grid 1 px.
    fn data_polylines(svg: &str) -> Vec<String> {
        let document = roxmltree::Document::parse(svg).expect("the SVG is XML");
        document
            .descendants()
            .filter(|node| {
                node.has_tag_name("polyline") && node.attribute("stroke-width") == Some("2")
            })
            .map(|node| node.attribute("stroke").unwrap_or_default().to_owned())
            .collect()
    }

    fn texts(svg: &str) -> Vec<String> {
        let document = roxmltree::Document::parse(svg).expect("the SVG is XML");
        document
            .descendants()
            .filter(|node| node.has_tag_name("text"))
            .filter_map(|node| node.text().map(|text| text.trim().to_owned()))
            .collect()
    }

    /// A synthetic trace: a leak, a flat stack and a shrinking one.
    fn synthetic(stack_count: u32) -> (Report, Model) {
        synthetic_at(stack_count, &(1..=30).map(f64::from).collect::<Vec<_>>())
    }

    /// `stack_count` growing stacks, one snapshot at each of `times_s`.
    fn synthetic_at(stack_count: u32, times_s: &[f64]) -> (Report, Model) {
        let mut model = Model::new();
        let key = |stack_id| StackKey {
            pid: 42,
            stack_id: StackId::Kernel(stack_id),
            kind: Kind::Heap,
        };
        for (index, &time_s) in times_s.iter().enumerate() {
            let second = index as i64 + 1;
            let stacks = (1..=stack_count)
                .map(|id| {
                    let bytes =
                        if id == 1 { 3 << 20 } else { 1000 } * second + i64::from(id) * 4096;
                    (
                        key(id),
                        Counters {
                            live_bytes: bytes,
                            live_allocs: second,
                            ..Counters::default()
                        },
                    )
                })
                .collect();
            model.push(Snapshot {
                elapsed_s: time_s,
                stacks,
                rss_bytes: Vec::new(),
                ..Snapshot::default()
            });
        }
        let frames = |key: &StackKey| {
            vec![Frame {
                function: Some(format!("grow_{}(int)", key.stack_id)),
                file: Some("/src/leak.c".into()),
                line: Some(7),
                ..Frame::default()
            }]
        };
        let targets = [Target::new(42, "leaky --serve".into())];
        let report = Report::build(ReportInput {
            model: &model,
            run: RunFacts {
                targets: targets.to_vec(),
                interval_ms: 1000,
                stacks: StackFacts::of(&model, frames, |_| true),
                ..RunFacts::default()
            },
            view: ReportView {
                top: 10,
                wrappers: &crate::model::Wrappers::default(),
                layout: Default::default(),
                at_s: None,
            },
        });
        (report, model)
    }

    #[test]
    fn the_title_fits_with_three_targets() {
        let (mut report, _) = synthetic(1);
        let target = report.targets[0].clone();
        report.targets = (1..=3)
            .map(|pid| {
                let mut target = target.clone();
                target.target.pid = 1000 + pid;
                target.target.command =
                    format!("/usr/lib/postgresql/15/bin/postgres -D /var/lib/db{pid}");
                target
            })
            .collect();
        let title = title(&report);
        assert!(title.chars().count() <= 100, "{title}");
        assert!(
            title.starts_with("tracer: PID 1001, 1002, 1003 — "),
            "{title}"
        );
        assert!(title.ends_with("window from attach"), "{title}");
    }

    #[test]
    fn legend_lists_suspected_leaks_in_rank_order() {
        let (mut report, _) = synthetic(3);
        assert_eq!(
            report.suspected_leaks.len(),
            3,
            "{:?}",
            report.suspected_leaks
        );
        // The last-ranked leak grew fastest at the end: still listed last.
        report.suspected_leaks[2].growth.late_rate_bytes_per_s = 1e12;
        let labels: Vec<String> = stack_lines_of(&report, STACK_LINES)
            .into_iter()
            .map(|line| line.label.split(' ').next().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(labels, ["L1", "L2", "L3"]);
    }

    #[test]
    fn one_line_per_plotted_stack_and_per_kind() {
        let (report, model) = synthetic(3);
        let svg = render(&report, &model, STACK_LINES).unwrap();
        // One heap total, three stacks.
        assert_eq!(data_polylines(&svg).len(), 4, "{svg}");
        let (report, model) = synthetic(12);
        let svg = render(&report, &model, 5).unwrap();
        assert_eq!(data_polylines(&svg).len(), 1 + 5);
    }

    #[test]
    fn legend_names_the_leak_with_its_rank_and_units_are_human() {
        let (report, model) = synthetic(3);
        let svg = render(&report, &model, STACK_LINES).unwrap();
        let texts = texts(&svg);
        assert!(
            texts
                .iter()
                .any(|t| t.starts_with("L1 #1 grow_1 (leak.c:7)")),
            "{texts:?}"
        );
        assert!(
            texts.iter().any(|t| t.contains("suspected leak")),
            "{texts:?}"
        );
        assert!(texts.iter().any(|t| t.contains("MiB")), "{texts:?}");
        assert!(
            texts
                .iter()
                .any(|t| t.starts_with("tracer: PID 42 (leaky --serve)")),
            "{texts:?}"
        );
        assert!(texts.iter().any(|t| t == "time since attach"), "{texts:?}");
    }

    /// A spawned command that ran for a few milliseconds: two snapshots,
    /// the second half of the window holds one. Its stacks grew until the
    /// end and are plotted, not "nothing to plot yet".
    #[test]
    fn short_run_plots_its_stacks() {
        let (report, model) = synthetic_at(2, &[0.004, 0.03]);
        let svg = render(&report, &model, STACK_LINES).unwrap();
        let texts = texts(&svg);
        assert!(
            !texts.iter().any(|t| t == "nothing to plot yet"),
            "{texts:?}"
        );
        for name in ["grow_1", "grow_2"] {
            assert!(
                texts.iter().any(|t| t.starts_with('#') && t.contains(name)),
                "{name} not in the growing stacks' legend: {texts:?}"
            );
        }
    }

    /// A stack that first held memory at the last snapshot grew until the
    /// end: it is in the "stacks still growing" panel.
    #[test]
    fn stack_that_grew_at_the_end_is_plotted() {
        let (mut report, model) = synthetic_at(2, &[1.0, 2.0, 3.0]);
        let stack = report
            .stacks
            .iter_mut()
            .find(|stack| stack.frames[0].function.as_deref() == Some("grow_2(int)"))
            .expect("stack 2 listed");
        stack.series = vec![(0.0, 0), (1.0, 0), (2.0, 0), (3.0, 9000)];
        // Its second half holds one snapshot: no slope.
        stack.growth.late_rate_bytes_per_s = 0.0;
        let svg = render(&report, &model, STACK_LINES).unwrap();
        let texts = texts(&svg);
        assert!(
            texts
                .iter()
                .any(|t| t.starts_with('#') && t.contains("grow_2")),
            "{texts:?}"
        );
    }

    #[test]
    fn minutes_for_long_windows() {
        assert_eq!(format_time(120.0, 600.0), "2.0 min");
        assert_eq!(format_time(12.0, 60.0), "12 s");
        assert_eq!(format_time(1.5, 10.0), "1.5 s");
        assert_eq!(trim_number(2.5), "2.5");
        assert_eq!(trim_number(3.0), "3");
    }
}
