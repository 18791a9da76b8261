//! The benchmark's holders section: what `tracer record --holders` costs
//! per GiB of target memory. The holders fixture builds a list of 2000 B
//! nodes rooted in a global (`list N`: about 1 GiB at full length, a
//! tenth with `--short`) while traced; at SIGINT the tracer reads LIVE,
//! scans the target twice and walks the graph. The row gives the scan's
//! own figures from the report (holders_scans) and the tracer's peak RSS
//! (wait4's ru_maxrss) against the same run without `--holders`.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::bench_runs::Attached;
use crate::fixture_process::FixtureProcess;

const NODE_BYTES: u64 = 2000;
const GIB: f64 = (1u64 << 30) as f64;

/// One run: the tracer's peak RSS in KiB and, with `--holders`, the
/// report's scan figures.
fn run(root: &Path, nodes: u64, holders: bool) -> Result<(u64, Option<Value>)> {
    let mut fixture = FixtureProcess::start(&root.join("target/fixtures/holders"), false)?;
    let json = std::env::temp_dir().join(format!(
        "tracer-bench-holders-{}-{holders}.json",
        std::process::id()
    ));
    let mut args: Vec<String> = ["record", "--pid", &fixture.pid.to_string(), "--json"]
        .map(str::to_owned)
        .into_iter()
        .chain([json.display().to_string()])
        .collect();
    if holders {
        args.push("--holders".to_owned());
    }
    let attached = Attached::start(root, &args)?;
    let answer = fixture.command(&format!("list {nodes}"))?;
    if answer != format!("list list_bytes={}", nodes * NODE_BYTES) {
        bail!("holders fixture answered {answer:?}");
    }
    std::thread::sleep(Duration::from_millis(500));
    let peak_rss_kib = attached.stop_peak_rss_kib()?;
    fixture.quit()?;
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(&json)
            .with_context(|| format!("could not read {}", json.display()))?,
    )?;
    let _ = std::fs::remove_file(&json);
    let scan = report["holders_scans"].get(0).cloned();
    if holders && scan.is_none() {
        bail!("the --holders report has no holders_scans");
    }
    Ok((peak_rss_kib, scan))
}

/// The section's table (markdown) and figures.
pub struct HoldersSection {
    pub table: String,
    pub json: Value,
}

pub fn bench_holders(root: &Path, short: bool) -> Result<HoldersSection> {
    let nodes: u64 = if short { 50_000 } else { 500_000 };
    let (base_kib, _) = run(root, nodes, false)?;
    let (holders_kib, scan) = run(root, nodes, true)?;
    let scan = scan.expect("checked in run");
    let figure = |key: &str| scan[key].as_f64().unwrap_or(0.0);
    let read_gib = figure("bytes_read") / GIB;
    let block_gib = figure("block_bytes") / GIB;
    let added_mib = (holders_kib.saturating_sub(base_kib)) as f64 / 1024.0;
    let per_gib = |value: f64| {
        if read_gib > 0.0 {
            value / read_gib
        } else {
            0.0
        }
    };
    eprintln!(
        "bench: holders: {:.2} GiB read, LIVE {:.2} s, pass {:.2} s, rescan {:.2} s, RSS {} -> {} KiB",
        read_gib,
        figure("live_read_seconds"),
        figure("seconds"),
        figure("rescan_seconds"),
        base_kib,
        holders_kib
    );
    let table = format!(
        "\nholders: `record --holders` at the end of a recording of the holders fixture after \
         `list {nodes}` ({:.0} MiB in {} traced blocks, {:.0} MiB of writable memory read a \
         pass); per GiB read\n\n\
         | reading LIVE | scan and walk, a pass | rescan | tracer peak RSS | without --holders | \
         added per GiB read | added per traced block |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n\
         | {:.2} s ({:.2} s/GiB) | {:.2} s ({:.2} s/GiB) | {:.2} s | {:.0} MiB | {:.0} MiB | \
         {:.0} MiB | {:.0} B |\n",
        block_gib * 1024.0,
        figure("blocks"),
        read_gib * 1024.0,
        figure("live_read_seconds"),
        per_gib(figure("live_read_seconds")),
        figure("seconds"),
        per_gib(figure("seconds")),
        figure("rescan_seconds"),
        holders_kib as f64 / 1024.0,
        base_kib as f64 / 1024.0,
        per_gib(added_mib),
        added_mib * 1024.0 * 1024.0 / figure("blocks").max(1.0),
    );
    Ok(HoldersSection {
        table,
        json: json!({
            "nodes": nodes,
            "scan": scan,
            "tracer_peak_rss_kib": holders_kib,
            "tracer_peak_rss_kib_without_holders": base_kib,
            "scan_seconds_per_gib_read": per_gib(figure("seconds")),
            "added_rss_mib_per_gib_read": per_gib(added_mib),
        }),
    })
}
