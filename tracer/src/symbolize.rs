//! Turns stack addresses into function, file and line with blazesym.
//!
//! Addresses are resolved to (file, file offset) through the target's
//! /proc/PID/maps, refreshed while it lives, and each mapped file is kept
//! open. So stacks still resolve after the target exits, and files of
//! targets in other mount namespaces are read through /proc/PID/root.
//!
//! Every frame also carries its module's build id and its file offset, so a
//! recording can be symbolized again on another machine that has the same
//! binaries (or their debug files).
use std::{collections::HashMap, fs::File, os::fd::AsRawFd as _, path::PathBuf};

use object::Object as _;

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};

use crate::{
    model::Frame,
    procfs::{self, Mapping},
};

/// A mapped file, kept open, and its build id.
struct Module {
    file: File,
    build_id: Option<String>,
}

/// Symbolizer for every target, with a cache per (pid, address).
pub struct Symbols {
    symbolizer: Symbolizer,
    mappings: HashMap<u32, Vec<Mapping>>,
    /// Open mapped files, by (pid, path in the target).
    files: HashMap<(u32, PathBuf), Module>,
    cache: HashMap<(u32, u64), Vec<Frame>>,
}

impl Default for Symbols {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbols {
    pub fn new() -> Symbols {
        Symbols {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .build(),
            mappings: HashMap::new(),
            files: HashMap::new(),
            cache: HashMap::new(),
        }
    }

    /// Re-reads the target's mappings and opens files not seen before.
    /// Call while the target lives; a target that is gone keeps what was
    /// read last.
    pub fn refresh(&mut self, pid: u32) {
        let Ok(mappings) = procfs::read_maps(pid) else {
            return;
        };
        for mapping in mappings.iter().filter(|mapping| mapping.executable) {
            let key = (pid, mapping.path.clone());
            if !self.files.contains_key(&key)
                && let Ok(file) = File::open(procfs::host_path(pid, &mapping.path))
            {
                let build_id = read_build_id(&file);
                self.files.insert(key, Module { file, build_id });
            }
        }
        if !mappings.is_empty() {
            self.mappings.insert(pid, mappings);
        }
    }

    /// Frames of a user stack, innermost first. Every address of a stack
    /// taken at a return probe is a return address, so each is looked up
    /// one byte earlier: inside the call instruction.
    pub fn stack_frames(&mut self, pid: u32, addresses: &[u64]) -> Vec<Frame> {
        addresses
            .iter()
            .flat_map(|&address| self.frames_at(pid, address))
            .collect()
    }

    fn frames_at(&mut self, pid: u32, return_address: u64) -> Vec<Frame> {
        if let Some(frames) = self.cache.get(&(pid, return_address)) {
            return frames.clone();
        }
        let frames = self.resolve(pid, return_address);
        self.cache.insert((pid, return_address), frames.clone());
        frames
    }

    fn resolve(&self, pid: u32, return_address: u64) -> Vec<Frame> {
        let address = return_address.saturating_sub(1);
        let unknown = vec![Frame {
            address: return_address,
            ..Frame::default()
        }];
        let Some(mapping) = self
            .mappings
            .get(&pid)
            .and_then(|mappings| mappings.iter().find(|m| m.contains(address)))
        else {
            return unknown;
        };
        let opened = self.files.get(&(pid, mapping.path.clone()));
        let module = Some(mapping.path.display().to_string());
        let build_id = opened.and_then(|opened| opened.build_id.clone());
        // The return address's own offset: the one re-symbolization starts
        // from, like every other address in the frame.
        let return_offset = Some(mapping.file_offset_of(return_address));
        let file_offset = mapping.file_offset_of(address);
        let unresolved = vec![Frame {
            address: return_address,
            module: module.clone(),
            build_id: build_id.clone(),
            file_offset: return_offset,
            ..Frame::default()
        }];
        let Some(opened) = opened else {
            return unresolved;
        };
        let source = Source::Elf(Elf::new(format!(
            "/proc/self/fd/{}",
            opened.file.as_raw_fd()
        )));
        let Ok(symbolized) = self
            .symbolizer
            .symbolize_single(&source, Input::FileOffset(file_offset))
        else {
            return unresolved;
        };
        let Symbolized::Sym(symbol) = symbolized else {
            return unresolved;
        };
        let frame = |function: &str, code_info: Option<&blazesym::symbolize::CodeInfo<'_>>| Frame {
            address: return_address,
            function: Some(function.to_owned()),
            file: code_info.map(|info| info.to_path().display().to_string()),
            line: code_info.and_then(|info| info.line),
            module: module.clone(),
            build_id: build_id.clone(),
            file_offset: return_offset,
            language: crate::model::Language::Native,
        };
        // Inlined calls come outermost first; the innermost is the code
        // that really runs at this address.
        let mut frames: Vec<Frame> = symbol
            .inlined
            .iter()
            .rev()
            .map(|inlined| frame(&inlined.name, inlined.code_info.as_ref()))
            .collect();
        frames.push(frame(&symbol.name, symbol.code_info.as_deref()));
        frames
    }
}

/// The GNU build id note of an ELF file, in lowercase hex.
fn read_build_id(file: &File) -> Option<String> {
    // SAFETY: the map is only read, and mapped libraries are not rewritten
    // in place (an updated library is a new file).
    let map = unsafe { memmap2::Mmap::map(file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    let build_id = elf.build_id().ok()??;
    Some(build_id.iter().map(|byte| format!("{byte:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_build_id_of_this_test_binary() {
        let file = File::open("/proc/self/exe").unwrap();
        let build_id = read_build_id(&file).expect("rustc links a build id");
        assert!(build_id.len() >= 16, "{build_id}");
        assert!(
            build_id.chars().all(|c| c.is_ascii_hexdigit()),
            "{build_id}"
        );
    }
}
