//! Symbols for a recording, later and elsewhere (`tracer report
//! --debug-dir`).
use std::{
    collections::HashMap,
    fs::File,
    path::{Path, PathBuf},
};

use blazesym::symbolize::Symbolizer;

use super::{
    files::{dwarf_is_safe, elf_source, fd_path},
    symbolize_in,
};
use crate::{
    debug_files::{self, DebugLink},
    model::Frame,
    target_files::Root,
};

/// Symbols for a recording made where the debug files were not
/// installed (`tracer report --debug-dir`): frames without a function are
/// looked up in separate debug files found by their build id in the
/// directories given, then /usr/lib/debug, at their ELF virtual address.
pub struct OfflineSymbols {
    symbolizer: Symbolizer,
    debug_dirs: Vec<PathBuf>,
    /// The debug file of each build id, once looked up, and whether
    /// blazesym may read its DWARF.
    debug_files: HashMap<String, Option<(File, bool)>>,
}

impl OfflineSymbols {
    pub fn new(debug_dirs: Vec<PathBuf>) -> OfflineSymbols {
        OfflineSymbols {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .build(),
            debug_dirs,
            debug_files: HashMap::new(),
        }
    }

    /// `frames` with those that had no function symbolized where a debug
    /// file has them.
    pub fn fill(&mut self, frames: Vec<Frame>) -> Vec<Frame> {
        frames
            .into_iter()
            .flat_map(|frame| self.symbolize(&frame).unwrap_or_else(|| vec![frame]))
            .collect()
    }

    fn symbolize(&mut self, frame: &Frame) -> Option<Vec<Frame>> {
        if frame.function.is_some() {
            return None;
        }
        let (module, build_id, offset) = (
            frame.module.as_ref()?,
            frame.build_id.as_ref()?,
            frame.offset?,
        );
        let debug_dirs = &self.debug_dirs;
        let debug_file = self.debug_files.entry(build_id.clone()).or_insert_with(|| {
            let link = DebugLink {
                build_id: Some(build_id.clone()),
                link_name: None,
            };
            debug_files::find(&link, Path::new(module), Root::Host, debug_dirs).map(|file| {
                let dwarf = dwarf_is_safe(&file, Root::Host);
                (file, dwarf)
            })
        });
        // A return address: look inside the call instruction.
        let (debug_file, dwarf) = debug_file.as_ref()?;
        symbolize_in(
            &self.symbolizer,
            elf_source(fd_path(debug_file), *dwarf),
            offset.saturating_sub(1),
            frame,
        )
    }
}
