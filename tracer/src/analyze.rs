//! `tracer report FILE` and `tracer plot FILE`: a recording turned into any view, later and
//! elsewhere, without the target. The model is rebuilt from the recorded
//! snapshots and the report from the same `output::Report` code as a live
//! run, so the two agree number for number.

use std::{io::Write as _, path::Path};

use anyhow::{Context as _, Result};

use crate::{
    config::{ReportConfig, ReportFormat},
    model::quality::is_thread_entry,
    output::{self, Report, ReportInput},
    recording::{self, Filter},
    symbolize::OfflineSymbols,
};

/// Stacks in a text or JSON report unless --top says otherwise: the live
/// run's default.
const DEFAULT_TOP: usize = 10;

/// Reads the recording, builds the report and writes it in the chosen
/// format.
pub fn report(config: &ReportConfig) -> Result<()> {
    let mut recording = recording::read(&config.recording_path)?;
    if let Some(warning) = recording.warning() {
        eprintln!("tracer: warning: {warning}");
    }
    let filter = Filter {
        pid: config.pid,
        kind: config.kind,
        from_s: config.from_s,
        to_s: config.to_s,
    };
    let top = config.top.unwrap_or(match config.format {
        ReportFormat::Text | ReportFormat::Json | ReportFormat::Svg => DEFAULT_TOP,
        ReportFormat::Folded | ReportFormat::Pprof | ReportFormat::Flamegraph => usize::MAX,
    });
    let model = recording.model(&filter);
    let mut frames = recording.take_frames_by_key();
    if !config.debug_dirs.is_empty() {
        let mut symbols = OfflineSymbols::new(config.debug_dirs.clone());
        for stack_frames in frames.values_mut() {
            *stack_frames = symbols.fill(std::mem::take(stack_frames));
        }
    }
    let apis = recording.apis_by_key();
    let probes = recording
        .metadata
        .probes
        .iter()
        .filter(|probe| filter.pid.is_none_or(|pid| pid == probe.pid))
        .cloned()
        .collect();
    let report = Report::build(ReportInput {
        model: &model,
        targets: &recording.targets(&filter),
        probes,
        sampling: recording.metadata.sampling.clone(),
        unwinding: recording.unwinding.clone(),
        loader_pauses: recording.loader_pauses,
        libraries: recording.libraries(&filter),
        api: &|key| apis.get(key).cloned(),
        interval_ms: recording.metadata.interval_ms,
        top,
        frames: &|key| frames.get(key).cloned().unwrap_or_default(),
        wrappers: &config.wrappers,
        layout: config.layout,
        memory_status: recording.memory_status(&filter),
        reaches_entry: &mut |key| {
            frames
                .get(key)
                .and_then(|frames| frames.last())
                .is_some_and(is_thread_entry)
        },
        unwinding_stopped: Default::default(),
        at_s: config.at_s,
    });
    let bytes = render(&report, &model, config)?;
    match &config.output_path {
        Some(path) => write_file(path, &bytes),
        None => std::io::stdout()
            .write_all(&bytes)
            .context("could not write to standard output"),
    }
}

fn render(report: &Report, model: &crate::model::Model, config: &ReportConfig) -> Result<Vec<u8>> {
    Ok(match config.format {
        ReportFormat::Text => output::text::render(report).into_bytes(),
        ReportFormat::Json => {
            let mut json = output::json::to_json(report);
            json.push('\n');
            json.into_bytes()
        }
        ReportFormat::Folded => output::folded::render(report, config.value).into_bytes(),
        ReportFormat::Pprof => output::pprof::render(report),
        ReportFormat::Flamegraph => output::flamegraph::render(report, config.value)?,
        ReportFormat::Svg => output::svg::render(report, model, config.plot_stacks)?.into_bytes(),
    })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    output::file::write_private(path, bytes)?;
    eprintln!("tracer: wrote {}", path.display());
    Ok(())
}
