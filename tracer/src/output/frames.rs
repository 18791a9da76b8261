//! Allocator frames off the top of a stack, so the first frame shown is
//! the code that asked for the memory.
use std::path::Path;

use crate::model::{Frame, allocators};

/// Allocator libraries whose every frame is noise at the top of a stack.
const ALLOCATOR_LIBRARIES: [&str; 3] = ["libjemalloc", "libtcmalloc", "libmimalloc"];

/// Drops leading allocator frames so the first frame shown is the caller:
/// frames whose function is one of malloc calloc realloc reallocarray free
/// posix_memalign aligned_alloc memalign valloc pvalloc, their `__libc_` /
/// `__GI_` prefixed forms, `operator new` / `operator new[]` (demangled or
/// `_Znwm` / `_Znam`-style mangled), or whose module file name starts with
/// libjemalloc, libtcmalloc or libmimalloc. Never trims every frame: if all
/// match, the last one is kept.
pub fn trim_allocator_frames(mut frames: Vec<Frame>) -> Vec<Frame> {
    let leading = frames
        .iter()
        .take_while(|frame| is_allocator_frame(frame))
        .count()
        .min(frames.len().saturating_sub(1));
    frames.drain(..leading);
    frames
}

fn is_allocator_frame(frame: &Frame) -> bool {
    let in_allocator_library = frame.module.as_deref().is_some_and(|module| {
        let file_name = Path::new(module)
            .file_name()
            .map_or_else(|| module.into(), |name| name.to_string_lossy());
        ALLOCATOR_LIBRARIES
            .iter()
            .any(|library| file_name.starts_with(library))
    });
    in_allocator_library
        || frame
            .function
            .as_deref()
            .is_some_and(allocators::is_allocator_function)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn frame(function: &str, module: &str) -> Frame {
        Frame {
            address: 0x1000,
            function: Some(function.to_owned()),
            file: None,
            line: None,
            module: Some(module.to_owned()),
            build_id: Some("0123abcd".to_owned()),
            file_offset: Some(0x1000),
            language: crate::model::Language::Native,
        }
    }

    pub(crate) fn functions(frames: &[Frame]) -> Vec<&str> {
        frames
            .iter()
            .map(|f| f.function.as_deref().unwrap_or("?"))
            .collect()
    }

    const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";
    const APP: &str = "/opt/app/bin/server";

    #[test]
    fn trims_libc_allocator_frames() {
        let frames = vec![
            frame("__GI___libc_malloc", LIBC),
            frame("__libc_calloc", LIBC),
            frame("load_model", APP),
            frame("malloc", APP),
            frame("main", APP),
        ];
        assert_eq!(
            functions(&trim_allocator_frames(frames)),
            ["load_model", "malloc", "main"]
        );
    }

    #[test]
    fn trims_operator_new_in_both_spellings() {
        let libstdcxx = "/usr/lib/libstdc++.so.6";
        let frames = vec![
            frame("operator new[](unsigned long)", libstdcxx),
            frame("_Znwm", libstdcxx),
            frame("_ZnamSt11align_val_t", libstdcxx),
            frame("operator new(unsigned long)", libstdcxx),
            frame("Cache::insert", APP),
        ];
        assert_eq!(functions(&trim_allocator_frames(frames)), ["Cache::insert"]);
    }

    #[test]
    fn trims_allocator_libraries_by_file_name() {
        let frames = vec![
            frame("je_malloc_default", "/usr/lib/libjemalloc.so.2"),
            frame("tc_newarray", "libtcmalloc_minimal.so.4"),
            Frame {
                address: 0x42,
                module: Some("/opt/lib/libmimalloc.so.2".to_owned()),
                ..Frame::default()
            },
            frame("alloc_buffer", "/opt/lib/libjemalloc_user.so"),
        ];
        let trimmed = trim_allocator_frames(frames);
        assert_eq!(trimmed.len(), 1);
        assert_eq!(trimmed[0].function.as_deref(), Some("alloc_buffer"));
    }

    #[test]
    fn keeps_frames_that_only_look_like_allocators() {
        let frames = vec![
            frame("malloc_trim", LIBC),
            frame("my_malloc", APP),
            frame("freelist_pop", APP),
        ];
        assert_eq!(trim_allocator_frames(frames.clone()), frames);
    }

    #[test]
    fn never_trims_every_frame() {
        let frames = vec![frame("__libc_malloc", LIBC), frame("malloc", LIBC)];
        assert_eq!(functions(&trim_allocator_frames(frames)), ["malloc"]);
        assert!(trim_allocator_frames(Vec::new()).is_empty());
    }
}
