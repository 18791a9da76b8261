//! The builder against readelf's own interpretation of the call frame
//! information (`--debug-dump=frames-interp`): every FDE of libc and
//! libstdc++, a sample of libtorch_cpu's, each row's rule and address.
use std::collections::HashSet;
use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

use super::*;

/// A rule as readelf shows it: exact, or a CFA expression (which the
/// builder decodes as PLT or marks unsupported).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expected {
    Exact(Rule),
    Expression { rbp_offset_words: i8 },
}

impl Expected {
    fn accepts(self, row: &UnwindRow) -> bool {
        match self {
            Expected::Exact(rule) => {
                (rule.rule, rule.cfa_offset, rule.rbp_offset_words)
                    == (row.rule, row.cfa_offset, row.rbp_offset_words)
            }
            Expected::Expression { rbp_offset_words } => {
                row.rule == cfa_rule::UNSUPPORTED
                    || (row.rule == PLT && row.rbp_offset_words == rbp_offset_words)
            }
        }
    }
}

/// One FDE as readelf interprets it.
#[derive(Debug)]
struct ReadelfFde {
    start: u64,
    end: u64,
    rows: Vec<(u64, Expected)>,
}

/// A row of readelf's table: the CFA and the other columns by name.
type ReadelfRow = (String, Vec<(String, String)>);

/// readelf's column value for a saved register: `c-16` -> Some(-16).
fn cfa_relative(value: &str) -> Option<i64> {
    value.strip_prefix('c')?.parse().ok()
}

/// What the kernel should do with one of readelf's rows.
fn readelf_rule(signal: bool, cfa: &str, columns: &[(&str, &str)]) -> Expected {
    let unsupported = Expected::Exact(UNSUPPORTED_ROW);
    if signal {
        return Expected::Exact(only(cfa_rule::SIGNAL));
    }
    let column = |name: &str| {
        columns
            .iter()
            .find(|(column, _)| *column == name)
            .map(|(_, value)| *value)
    };
    match column("ra") {
        Some("u") => return Expected::Exact(only(cfa_rule::END)),
        Some("c-8") => {}
        _ => return unsupported,
    }
    let rbp_offset_words = match column("rbp") {
        None | Some("u") | Some("s") => 0,
        Some(value) => match cfa_relative(value) {
            Some(offset) if offset != 0 && offset % 8 == 0 && (-1024..=1016).contains(&offset) => {
                (offset / 8) as i8
            }
            _ => return unsupported,
        },
    };
    if cfa == "exp" {
        return Expected::Expression { rbp_offset_words };
    }
    let rule = |register: &str, rule: u8| {
        let offset: i64 = cfa.strip_prefix(register)?.parse().ok()?;
        Some(Rule {
            cfa_offset: u16::try_from(offset).ok()?,
            rule,
            rbp_offset_words,
        })
    };
    match rule("rsp", RSP).or_else(|| rule("rbp", RBP)) {
        Some(rule) => Expected::Exact(rule),
        None => unsupported,
    }
}

/// readelf's interpretation of every `sample`-th FDE of an object, and
/// where every FDE starts.
fn readelf_fdes(path: &str, sample: usize) -> (Vec<ReadelfFde>, HashSet<u64>) {
    let mut child = Command::new("readelf")
        .args(["--debug-dump=no-follow-links,frames-interp", path])
        .stdout(Stdio::piped())
        .spawn()
        .expect("readelf (binutils) must be installed: it is the reference of this test");
    let lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    // Per CIE offset: signal frame, and its initial row's CFA and columns.
    let mut cies: HashMap<String, (bool, Option<ReadelfRow>)> = HashMap::new();
    let mut fdes = Vec::new();
    let mut header: Vec<String> = Vec::new();
    // The entry whose table follows: a CIE's offset, or an FDE (index,
    // kept or not).
    enum Current {
        Cie(String),
        Fde { cie: String, kept: bool },
        None,
    }
    let mut current = Current::None;
    let mut fde_count = 0usize;
    let mut starts = HashSet::new();
    for line in lines {
        let line = line.expect("readelf's output").replace(" (", "(");
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 4 && fields[3] == "CIE" {
            let signal = fields[4].trim_matches('"').contains('S');
            cies.insert(fields[0].to_owned(), (signal, None));
            current = Current::Cie(fields[0].to_owned());
        } else if fields.len() >= 6 && fields[3] == "FDE" {
            let cie = fields[4].strip_prefix("cie=").expect("cie=").to_owned();
            let (start, end) = fields[5]
                .strip_prefix("pc=")
                .and_then(|range| range.split_once(".."))
                .expect("pc=start..end");
            let parse = |hex: &str| u64::from_str_radix(hex, 16).expect("hex");
            starts.insert(parse(start));
            let kept = fde_count.is_multiple_of(sample) && parse(start) < parse(end);
            fde_count += 1;
            if kept {
                let (signal, initial) = &cies[&cie];
                // Without instructions of its own, the CIE's row holds.
                let rows = match initial {
                    Some((cfa, columns)) => {
                        let columns: Vec<(&str, &str)> = columns
                            .iter()
                            .map(|(name, value)| (name.as_str(), value.as_str()))
                            .collect();
                        vec![(parse(start), readelf_rule(*signal, cfa, &columns))]
                    }
                    None if *signal => {
                        vec![(parse(start), Expected::Exact(only(cfa_rule::SIGNAL)))]
                    }
                    None => vec![(parse(start), Expected::Exact(UNSUPPORTED_ROW))],
                };
                fdes.push(ReadelfFde {
                    start: parse(start),
                    end: parse(end),
                    rows,
                });
            }
            current = Current::Fde { cie, kept };
        } else if fields.first() == Some(&"LOC") {
            header = fields[1..].iter().map(|name| (*name).to_owned()).collect();
        } else if fields.len() >= 2
            && fields[0].len() == 16
            && fields[0].bytes().all(|byte| byte.is_ascii_hexdigit())
        {
            let pc = u64::from_str_radix(fields[0], 16).expect("hex");
            let values = &fields[1..];
            assert_eq!(values.len(), header.len(), "{line}");
            match &current {
                Current::Cie(offset) => {
                    let entry = cies.get_mut(offset).expect("this CIE");
                    let columns = header[1..]
                        .iter()
                        .cloned()
                        .zip(values[1..].iter().map(|value| (*value).to_owned()))
                        .collect();
                    entry.1.get_or_insert((values[0].to_owned(), columns));
                }
                Current::Fde { cie, kept: true } => {
                    let signal = cies[cie].0;
                    let columns: Vec<(&str, &str)> = header[1..]
                        .iter()
                        .map(String::as_str)
                        .zip(values[1..].iter().copied())
                        .collect();
                    let rule = readelf_rule(signal, values[0], &columns);
                    let fde = fdes.last_mut().expect("this FDE");
                    // The FDE's own table replaces the CIE's row.
                    if fde.rows.last().is_some_and(|(last, _)| *last == pc) {
                        fde.rows.pop();
                    }
                    if fde.rows.last().map(|(_, last)| *last) != Some(rule) {
                        fde.rows.push((pc, rule));
                    }
                }
                _ => {}
            }
        }
    }
    assert!(
        child.wait().expect("readelf ran").success(),
        "readelf {path} failed"
    );
    assert!(!fdes.is_empty(), "readelf printed no FDE for {path}");
    (fdes, starts)
}

/// The builder's rows over every sampled FDE equal readelf's.
pub(super) fn check_against_readelf(path: &str, sample: usize) -> usize {
    let (_, built) = built(path);
    let (fdes, starts) = readelf_fdes(path, sample);
    let mut mismatches = Vec::new();
    for fde in &fdes {
        let mine: Vec<&UnwindRow> =
            std::iter::once(row_for(&built.rows, fde.start).expect("a row"))
                .chain(
                    built
                        .rows
                        .iter()
                        .filter(|row| (fde.start + 1..fde.end).contains(&u64::from(row.pc))),
                )
                .collect();
        let same = mine.len() == fde.rows.len()
            && mine.iter().zip(&fde.rows).all(|(row, (pc, expected))| {
                u64::from(row.pc).max(fde.start) == *pc && expected.accepts(row)
            });
        // Where no FDE follows at once, a NO_INFO row ends this one.
        let after = row_for(&built.rows, fde.end).expect("a row after");
        let closed =
            starts.contains(&fde.end) || (u64::from(after.pc) == fde.end && after.rule == NO_INFO);
        if !same || !closed {
            mismatches.push(format!("{fde:x?}\n  built: {mine:?}\n  after: {after:?}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{path}: {} of {} FDEs differ from readelf, first:\n{}",
        mismatches.len(),
        fdes.len(),
        mismatches[..mismatches.len().min(3)].join("\n")
    );
    fdes.len()
}

#[test]
fn libc_every_fde_matches_readelf() {
    assert!(check_against_readelf(LIBC, 1) > 3000);
}

#[test]
fn libstdcxx_every_fde_matches_readelf() {
    assert!(check_against_readelf(LIBSTDCXX, 1) > 4000);
}

#[test]
fn libtorch_cpu_sampled_fdes_match_readelf() {
    assert!(check_against_readelf(LIBTORCH_CPU, 97) > 2000);
}
