//! `tracer top`: a live table of the stacks growing fastest, refreshed at
//! every snapshot, like `py-spy top`. Suspected leaks (`model::verdict`)
//! come first, so a one-time step does not hide a leak, and each row says
//! its verdict (LEAK? yes, early: too early to tell, no); the stacks of one
//! site share a row (`--group-by`), and a target that exited or tore down
//! is ranked at its peak, as in the report. On a terminal it redraws one
//! screen (q or Ctrl-C quits); otherwise it prints one plain table per
//! interval.
use std::{
    collections::HashMap,
    io::{IsTerminal as _, Write as _},
};

use anyhow::{Context as _, Result};
use crossterm::{
    cursor,
    event::{self, Event as KeyboardEvent, KeyCode, KeyEvent, KeyModifiers},
    execute, terminal,
};

use crate::{
    config::Config,
    model::{
        Frame, Growth, Model, StackKey, Target, labels,
        leak::Verdict,
        merge,
        peak::{self, Judgement},
        site, trim_allocator_frames,
    },
    output::{self, GroupBy, by_site_label, human_bytes, stacks_of_sites},
    session::{self, Live, Session, Step},
};

/// Runs `tracer top` until q, Ctrl-C, --duration or the targets' exit.
pub fn run(config: &Config) -> Result<()> {
    let mut server = crate::serve::start_if_asked(config.listen, false)?;
    let mut session = Session::attach(config)?;
    let interactive = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    let screen = if interactive {
        Some(Screen::enter()?)
    } else {
        None
    };
    session.resume();
    let reason = session.run(|step, live| {
        // The screen is the report: the rest shows in its header.
        if let Step::Snapshot = step {
            if let Some(server) = server.as_mut() {
                server.publish(live, false);
                server.answer_holders(live);
            }
            draw(live, config, interactive)?;
        }
        Ok(())
    })?;
    drop(screen);
    session.end(reason);
    Ok(())
}

/// Draws the table of `model` (a new screen when `interactive`), stacks
/// with equal frames merged into one row, and with `--group-by site` the
/// stacks of one site too, judged by its stacks (`Model::site_growth`);
/// ranked at the peak when a target exited or tore down, as the report is
/// (`model::peak`). Rows that would read the same are told apart as the
/// report tells them (`model::labels`).
fn draw(live: &mut Live<'_>, config: &Config, interactive: bool) -> Result<()> {
    let model = live.model();
    let watched = live.targets();
    let merged_keys: std::collections::HashSet<_> =
        session::stacks_to_merge(model, config.show.top)
            .into_iter()
            .collect();
    // Each stack's site label and frames, taken from the frames the merge
    // reads.
    let mut labels: HashMap<StackKey, String> = HashMap::new();
    let mut frames_of: HashMap<StackKey, Vec<Frame>> = HashMap::new();
    let (merged, _) = merge::by_frames(model, |key| {
        if !merged_keys.contains(key) {
            return Vec::new();
        }
        let frames = trim_allocator_frames(live.frames(key));
        if let Some(site) = site(&frames, &config.show.wrappers) {
            labels.insert(*key, site.label);
        }
        frames_of.insert(*key, frames.clone());
        frames
    });
    let merged = merged.as_ref().unwrap_or(model);
    // Every stack's site: the rows with --group-by site; with --group-by
    // stack, a stack of a leaking site carries its verdict
    // (`Model::carried_verdicts`).
    let sites = by_site_label(
        merged
            .latest_counters()
            .filter_map(|(key, latest)| Some((key, latest.live_bytes, labels.get(&key)?.clone()))),
    );
    let stacks_of_site = stacks_of_sites(&sites);
    let (into_site, members_of, lending) = match config.show.layout.group_by {
        GroupBy::Site => (sites, stacks_of_site, None),
        GroupBy::Stack => (HashMap::new(), HashMap::new(), Some(stacks_of_site)),
    };
    let grouped = (!into_site.is_empty())
        .then(|| merged.merged(|key| into_site.get(key).copied().unwrap_or(*key)));
    let shown = grouped.as_ref().unwrap_or(merged);
    let judgement = peak::judgement(shown, &watched, None);
    let judged = judgement.map(|judged| shown.as_of(judged.at_s));
    let judged_stacks = judgement.map(|judged| merged.as_of(judged.at_s));
    let stacks = judged_stacks.as_ref().unwrap_or(merged);
    let carried = lending
        .map(|sites| stacks.carried_verdicts(&sites))
        .unwrap_or_default();
    let table = render_table(
        judged.as_ref().unwrap_or(shown),
        &watched,
        config.show.top,
        judgement,
        |key| match members_of.get(key) {
            Some(members) => stacks.site_growth(members, &stacks.activity(key.pid)),
            None => carried
                .get(key)
                .copied()
                .unwrap_or_else(|| stacks.growth(key)),
        },
        |keys| {
            let base: Vec<String> = keys
                .iter()
                .map(|key| {
                    labels
                        .get(key)
                        .cloned()
                        .unwrap_or_else(|| format!("stack {}", key.stack_id.to_raw()))
                })
                .collect();
            let entries: Vec<(&str, &[Frame])> = keys
                .iter()
                .zip(&base)
                .map(|(key, label)| {
                    let frames = frames_of.get(key).map_or(&[][..], Vec::as_slice);
                    (label.as_str(), frames)
                })
                .collect();
            let through = labels::distinguishing_frames(&entries);
            keys.iter()
                .zip(&base)
                .zip(through)
                .map(|((key, label), through)| {
                    let label = through
                        .map_or_else(|| label.clone(), |through| labels::grown(label, &through));
                    match members_of.get(key).map_or(1, Vec::len) {
                        count if count > 1 => format!("{label}  ({count} stacks)"),
                        _ => label,
                    }
                })
                .collect()
        },
    );
    // When each target reaches its memory limit at its leaks' growth.
    let mut leaks = stacks.suspected_leaks_among(stacks.latest_counters().map(|(key, _)| key));
    leaks.extend(carried.iter().map(|(key, growth)| (*key, *growth)));
    let mut table = table;
    for target in watched
        .iter()
        .filter(|target| target.exited_after_s.is_none())
    {
        if let Some(limit) = crate::procfs::memory_limit(target.pid) {
            let limit = crate::report::LimitReport::of(target.pid, limit, &leaks);
            if !table.ends_with('\n') {
                table.push('\n');
            }
            table.push_str(&output::text::describe_limit(target.pid, &limit));
        }
    }
    // The rows' names come from the target: escaped, so only the table's
    // own sequences reach the terminal.
    let table = output::terminal::lines(&table);
    let mut stdout = std::io::stdout().lock();
    if interactive {
        // Raw mode: lines need a carriage return.
        write!(stdout, "\x1b[H\x1b[2J{}", table.replace('\n', "\r\n"))?;
    } else {
        writeln!(stdout, "{table}")?;
    }
    stdout.flush().context("could not write to stdout")
}

/// The table: a header line with the window and totals, then one row per
/// stack growing fastest, leaks first; `judged` is the moment it is ranked
/// at when that is not the end, `verdict` judges a row, `labels` names the
/// rows shown.
pub fn render_table(
    model: &Model,
    targets: &[Target],
    rows: usize,
    judged: Option<Judgement>,
    verdict: impl Fn(&StackKey) -> Growth,
    labels: impl FnOnce(&[StackKey]) -> Vec<String>,
) -> String {
    let targets: Vec<String> = targets
        .iter()
        .map(|target| {
            let exited = if target.exited_after_s.is_some() {
                ", exited"
            } else {
                ""
            };
            format!("PID {} ({}{exited})", target.pid, target.command)
        })
        .collect();
    let totals = crate::output::live_totals(model);
    let dropped: u64 = model.drops().iter().map(|(_, count)| count).sum();
    let mut lines = vec![
        format!(
            "tracer top — {} — {:.0} s",
            targets.join(", "),
            model.window_s()
        ),
        format!(
            "{} — {dropped} dropped — q or Ctrl-C quits",
            if totals.is_empty() {
                "nothing live yet".to_owned()
            } else {
                totals.join(", ")
            }
        ),
    ];
    if let Some(judged) = judged {
        lines.push(format!(
            "ranked at the peak, {} live at {:.1} s ({} now): it freed or exited since",
            human_bytes(judged.live_bytes as f64),
            judged.at_s,
            human_bytes(judged.end_live_bytes as f64)
        ));
    }
    let header_lines = lines.len() + 2;
    lines.push(String::new());
    lines.push(format!(
        "{:>4}  {:>12}  {:>11}  {:>8}  {:<5}  {}",
        "RANK", "GROWTH/S", "LIVE", "ALLOCS", "LEAK?", "WHERE"
    ));
    // Leaks first, then the rest; fastest first within each.
    let mut ranked: Vec<(Verdict, crate::model::StackSummary)> = model
        .fastest_growing(rows.saturating_mul(4))
        .into_iter()
        .map(|summary| (verdict(&summary.key).verdict, summary))
        .collect();
    ranked.sort_by_key(|(verdict, _)| std::cmp::Reverse(*verdict == Verdict::Leak));
    ranked.truncate(rows);
    let keys: Vec<StackKey> = ranked.iter().map(|(_, summary)| summary.key).collect();
    for (index, ((verdict, summary), label)) in ranked.iter().zip(labels(&keys)).enumerate() {
        lines.push(format!(
            "{:>4}  {:>12}  {:>11}  {:>8}  {:<5}  {label}",
            index + 1,
            format!("+{}", human_bytes(summary.growth_bytes_per_s)),
            human_bytes(summary.latest.live_bytes as f64),
            summary.latest.live_allocs,
            match verdict {
                Verdict::Leak => "yes",
                Verdict::TooEarly => "early",
                Verdict::NotLeak => "no",
                Verdict::Empty => "",
            },
        ));
    }
    if lines.len() == header_lines {
        lines.push("(no stack has grown yet)".to_owned());
    }
    lines.join("\n")
}

/// The terminal in raw mode on the alternate screen, restored on drop. A
/// thread turns q and Ctrl-C (raw mode delivers it as a key, not a signal)
/// into SIGINT, which stops collection like Ctrl-C does elsewhere.
struct Screen;

impl Screen {
    fn enter() -> Result<Screen> {
        terminal::enable_raw_mode().context("could not set up the terminal")?;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )
        .context("could not set up the terminal")?;
        std::thread::spawn(|| {
            loop {
                let Ok(KeyboardEvent::Key(KeyEvent {
                    code, modifiers, ..
                })) = event::read()
                else {
                    continue;
                };
                let quit = code == KeyCode::Char('q')
                    || (code == KeyCode::Char('c') && modifiers.contains(KeyModifiers::CONTROL));
                if quit {
                    // SAFETY: signals this process.
                    unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
                    return;
                }
            }
        });
        Ok(Screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Counters, Kind, Snapshot, StackId, StackKey};

    #[test]
    fn table_lists_the_fastest_first_and_flags_leaks() {
        let leak = StackKey {
            pid: 7,
            stack_id: StackId::Kernel(1),
            kind: Kind::Heap,
        };
        let slow = StackKey {
            pid: 7,
            stack_id: StackId::Kernel(2),
            kind: Kind::Heap,
        };
        let mut model = Model::new();
        for i in 1..=10_i64 {
            let counters = |bytes| Counters {
                live_bytes: bytes,
                live_allocs: 1,
                ..Counters::default()
            };
            model.push(Snapshot {
                elapsed_s: i as f64,
                stacks: vec![(leak, counters(4096 * i)), (slow, counters(i))],
                ..Snapshot::default()
            });
        }
        let targets = [Target::new(7, "leaky".into())];
        let table = render_table(
            &model,
            &targets,
            5,
            None,
            |key| model.growth(key),
            |keys| {
                keys.iter()
                    .map(|key| format!("frame{}", key.stack_id.to_raw()))
                    .collect()
            },
        );
        let rows: Vec<&str> = table.lines().skip(4).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(
            rows[0].contains("frame1") && rows[0].contains("yes"),
            "{table}"
        );
        assert!(rows[1].contains("frame2"), "{table}");
        assert!(table.starts_with("tracer top — PID 7 (leaky)"));
    }
}
