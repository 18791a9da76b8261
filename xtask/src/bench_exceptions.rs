//! The exceptions row (`cargo xtask bench --exceptions`, and in the full
//! benchmark): what a function costs a call with a uretprobe, against a
//! probe on each of its `ret` instructions (the other way to see a return
//! without a return address an unwinder cannot pass). The fixture
//! `ret_calls` calls a function that starts with `push %rbp` and has two
//! `ret`s; tracefs uprobes (no program: the trap alone) are put on it.
use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

const TRACEFS: &str = "/sys/kernel/tracing";
const GROUP: &str = "tracer_bench_ret";
const FUNCTION: &str = "probed";
const CALLS: u64 = 200_000;

/// The table rows and their JSON.
pub struct ExceptionsBench {
    pub table: String,
    pub json: Value,
}

/// How the function is probed.
#[derive(Clone, Copy)]
enum Probing {
    None,
    Uretprobe,
    EachRet,
}

impl Probing {
    fn name(self) -> &'static str {
        match self {
            Probing::None => "no probe",
            Probing::Uretprobe => "uretprobe",
            Probing::EachRet => "uprobe on each ret",
        }
    }
}

pub fn bench_exceptions(root: &Path, reps: usize) -> Result<ExceptionsBench> {
    let fixture = root.join("target/fixtures/ret_calls");
    let (entry, rets) = function_offsets(&fixture)?;
    let mut rows = Vec::new();
    for probing in [Probing::None, Probing::Uretprobe, Probing::EachRet] {
        let mut runs = Vec::new();
        for _ in 0..reps {
            runs.push(measure(&fixture, probing, entry, &rets)?);
        }
        runs.sort_by(f64::total_cmp);
        rows.push((probing, runs[runs.len() / 2], runs));
    }
    let mut table = format!(
        "\nA return seen without a return probe (ret_calls, {CALLS} calls, median of {reps}; \
         {} ret instructions)\n\n| probe | ns per call |\n|---|---|\n",
        rets.len()
    );
    for (probing, median, _) in &rows {
        table.push_str(&format!("| {} | {median:.0} |\n", probing.name()));
    }
    let json = json!(
        rows.iter()
            .map(|(probing, median, runs)| json!({
                "probe": probing.name(),
                "ns_per_call_median": median,
                "ns_per_call_runs": runs,
            }))
            .collect::<Vec<_>>()
    );
    Ok(ExceptionsBench { table, json })
}

/// File offsets of `FUNCTION`'s entry and of each of its `ret`s, from
/// objdump (binutils).
fn function_offsets(fixture: &Path) -> Result<(u64, Vec<u64>)> {
    let output = Command::new("objdump")
        .args(["-d", "-F", "--no-show-raw-insn"])
        .arg(fixture)
        .output()
        .context("could not run objdump (binutils)")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let header = format!("<{FUNCTION}> (File Offset: 0x");
    // The function's own header line (calls to it name it too).
    let mut lines = text
        .lines()
        .skip_while(|line| !(line.contains(&header) && line.ends_with("):")));
    let first = lines
        .next()
        .with_context(|| format!("{} has no {FUNCTION}", fixture.display()))?;
    let hex = |text: &str| u64::from_str_radix(text.trim(), 16).ok();
    let address = first.split_whitespace().next().and_then(hex);
    let file_offset = first
        .split("File Offset: 0x")
        .nth(1)
        .and_then(|rest| hex(rest.trim_end_matches("):")));
    let (Some(address), Some(file_offset)) = (address, file_offset) else {
        bail!("could not read {FUNCTION}'s address: {first}");
    };
    let rets: Vec<u64> = lines
        .take_while(|line| !line.trim().is_empty())
        .filter(|line| line.split_whitespace().nth(1) == Some("ret"))
        .filter_map(|line| hex(line.split(':').next()?))
        .map(|ret| file_offset + (ret - address))
        .collect();
    if rets.is_empty() {
        bail!("{FUNCTION} has no ret");
    }
    Ok((file_offset, rets))
}

/// ns per call of one run of the fixture, probed as `probing` says.
fn measure(fixture: &Path, probing: Probing, entry: u64, rets: &[u64]) -> Result<f64> {
    let path = fixture.display();
    let definitions: Vec<String> = match probing {
        Probing::None => Vec::new(),
        Probing::Uretprobe => vec![format!("r:{GROUP}/uret {path}:{entry:#x}")],
        Probing::EachRet => rets
            .iter()
            .enumerate()
            .map(|(index, ret)| format!("p:{GROUP}/ret{index} {path}:{ret:#x}"))
            .collect(),
    };
    let events = format!("{TRACEFS}/uprobe_events");
    for definition in &definitions {
        append(&events, definition)?;
    }
    let enable = format!("{TRACEFS}/events/{GROUP}/enable");
    if !definitions.is_empty() {
        std::fs::write(&enable, "1").with_context(|| format!("could not write {enable}"))?;
    }
    let output = Command::new(fixture).arg(CALLS.to_string()).output();
    if !definitions.is_empty() {
        let _ = std::fs::write(&enable, "0");
        for definition in &definitions {
            let name = definition
                .split_whitespace()
                .next()
                .and_then(|head| head.split_once(':'))
                .map(|(_, name)| name)
                .unwrap_or_default();
            let _ = append(&events, &format!("-:{name}"));
        }
    }
    let output = output.with_context(|| format!("could not run {path}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .split_whitespace()
        .find_map(|word| word.strip_prefix("ns_per_call="))
        .and_then(|value| value.parse().ok())
        .with_context(|| format!("{path} said {stdout:?}"))
}

fn append(path: &str, line: &str) -> Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("could not open {path}"))?;
    writeln!(file, "{line}").with_context(|| format!("could not write {line:?} to {path}"))
}
