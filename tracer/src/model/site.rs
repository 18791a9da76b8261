//! Allocator frames off the top of a stack, so the first frame shown is
//! the code that asked for the memory; and the stack's site, the frame a
//! stack is named by: the first one outside the allocator and the
//! program's allocation wrappers (`zmalloc`, `g_malloc`, `PyMem_Malloc`,
//! `--wrapper`), so that four stacks through `zmalloc` are told apart by
//! their callers.
use std::{borrow::Cow, path::Path};

use super::{Frame, Language, Wrappers, allocators};

/// The frame a stack is named by, and the wrapper it called.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Site {
    #[serde(flatten)]
    pub frame: Frame,
    /// The outermost allocation wrapper between the site and the
    /// allocator (the one the site called), if any.
    pub via: Option<String>,
    /// `function (file:line) via wrapper`: what headings, legends and
    /// `tracer top` show; grown by `through` where it is set.
    pub label: String,
    /// The frame that tells this entry apart from another listed entry of
    /// the same label (`labels`), the label ending in ` through` it; null
    /// where none reads the same.
    pub through: Option<String>,
}

/// The site of a stack (frames innermost first, trimmed or not): the first
/// frame that is neither an allocator frame nor an allocation wrapper nor
/// a marker of where unwinding stopped; the outermost other frame when
/// there is none. `None` for a stack without frames.
pub fn site(frames: &[Frame], wrappers: &Wrappers) -> Option<Site> {
    let is_wrapper = |frame: &Frame| {
        frame
            .function
            .as_deref()
            .is_some_and(|function| wrappers.matches(function))
    };
    // A marker frame (the walk stopped there) names no code.
    let is_marker =
        |frame: &Frame| frame.address == 0 && frame.module.is_none() && frame.file.is_none();
    let first = frames
        .iter()
        .position(|frame| !is_allocator_frame(frame) && !is_wrapper(frame) && !is_marker(frame))
        .or_else(|| frames.iter().rposition(|frame| !is_marker(frame)))
        .unwrap_or(frames.len().checked_sub(1)?);
    // In a Python program the site is its own Python code: the extension
    // (numpy's stripped C) and library Python (numpy's `ones`) that it
    // called are what it went through.
    let program_python = frames[first..]
        .iter()
        .position(is_program_python)
        .filter(|&later| later > 0)
        .map(|later| first + later);
    let (index, via) = match program_python {
        Some(index) => (index, Some(python_via(&frames[first..index]))),
        None => (
            first,
            first
                .checked_sub(1)
                .map(|inner| &frames[inner])
                .filter(|inner| is_wrapper(inner))
                .and_then(|inner| inner.function.as_deref())
                .map(|function| without_arguments(function).to_owned()),
        ),
    };
    let frame = frames[index].clone();
    let mut label = frame_label(&frame);
    if let Some(via) = &via {
        label.push_str(" via ");
        label.push_str(via);
    }
    Some(Site {
        frame,
        via,
        label,
        through: None,
    })
}

/// What a Python program's site called on the way to the allocator
/// (`inner`, innermost first): the library Python function it called
/// (numpy's `ones`, weakref's `finalize.__init__`), past the interpreter's
/// own C frames; else the C function or, stripped, the object it called
/// (numpy's `np.zeros` is C only).
fn python_via(inner: &[Frame]) -> String {
    if let Some(python) = inner
        .iter()
        .rev()
        .find(|frame| frame.language == Language::Python)
    {
        return short_name(python);
    }
    let called = inner.last().expect("a site past the first frame");
    match (&called.function, &called.module) {
        (None, Some(module)) => file_name(module).into_owned(),
        _ => short_name(called),
    }
}

/// A Python frame of the program itself: not of the standard library, of
/// an installed package (numpy's Python code) or of the import machinery.
fn is_program_python(frame: &Frame) -> bool {
    frame.language == Language::Python
        && frame.file.as_deref().is_some_and(|file| {
            !(file.starts_with('<')
                || file.contains("/site-packages/")
                || file.contains("/dist-packages/")
                || is_standard_library(file))
        })
}

/// `.../lib/python3.11/json/decoder.py`, the standard library of any
/// interpreter (Debian's, pyenv's, a venv's base).
fn is_standard_library(file: &str) -> bool {
    file.split('/')
        .zip(file.split('/').skip(1))
        .any(|(lib, python)| {
            lib == "lib"
                && python
                    .strip_prefix("python")
                    .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
        })
}

/// A frame's function without arguments, or its object and offset.
fn short_name(frame: &Frame) -> String {
    match &frame.function {
        Some(function) => without_arguments(function).to_owned(),
        None => module_offset(frame),
    }
}

/// `function (file:line)` with C++ argument lists dropped, or the object
/// and offset of a frame without a symbol.
pub fn frame_label(frame: &Frame) -> String {
    let name = short_name(frame);
    match frame.short_location() {
        Some(location) => format!("{name} ({location})"),
        None => name,
    }
}

/// Where a frame is in its object, readable after the process is gone:
/// `libfoo.so+0x1a2b`, the ELF virtual address of the return address (what
/// `nm` lists and `addr2line -e libfoo.so 0x1a2b` takes); `libfoo.so@file
/// 0x1a2b` where only the file offset is known (recordings made before
/// tracer kept addresses); the process address only when the address is
/// in no mapped file.
pub fn module_offset(frame: &Frame) -> String {
    let Some(module) = &frame.module else {
        return format!("0x{:x}", frame.address);
    };
    let file_name = file_name(module);
    match (frame.offset, frame.file_offset) {
        (Some(offset), _) => format!("{file_name}+0x{offset:x}"),
        (None, Some(file_offset)) => format!("{file_name}@file 0x{file_offset:x}"),
        (None, None) => format!("{file_name} 0x{:x}", frame.address),
    }
}

/// The file name of an object's path (`libfoo.so` of `/usr/lib/libfoo.so`).
fn file_name(module: &str) -> Cow<'_, str> {
    Path::new(module)
        .file_name()
        .map_or_else(|| module.into(), |name| name.to_string_lossy())
}

/// A C++ name without its argument list (`Cache::insert(int)` ->
/// `Cache::insert`); `operator()` and names without one stay whole.
fn without_arguments(function: &str) -> &str {
    match function.rfind('(') {
        Some(paren)
            if paren > 0 && function.ends_with(')') && !function[..paren].ends_with("operator") =>
        {
            let name = &function[..paren];
            // Template arguments may hold parentheses: only cut at a top-level one.
            if name.matches('<').count() == name.matches('>').count() {
                name
            } else {
                function
            }
        }
        _ => function,
    }
}

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
        let file_name = file_name(module);
        ALLOCATOR_LIBRARIES
            .iter()
            .any(|library| file_name.starts_with(library))
    });
    in_allocator_library
        || frame
            .function
            .as_deref()
            .is_some_and(allocators::is_allocator_function)
        || is_std_allocate(frame)
}

/// The standard C++ library's allocators' headers: their `allocate` only
/// calls operator new.
const STD_ALLOCATOR_HEADERS: [&str; 3] = ["/new_allocator.h", "/allocator.h", "/alloc_traits.h"];

/// `allocate` of a standard C++ allocator, named as DWARF names it
/// (`allocate`, in new_allocator.h) or qualified: a container's blocks are
/// labelled at the container code that asked.
fn is_std_allocate(frame: &Frame) -> bool {
    let in_header = frame.file.as_deref().is_some_and(|file| {
        STD_ALLOCATOR_HEADERS
            .iter()
            .any(|header| file.ends_with(header))
    });
    in_header
        && frame.function.as_deref().is_some_and(|function| {
            let name = function.split('(').next().unwrap_or(function).trim_end();
            name == "allocate" || name.ends_with("::allocate")
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::fixtures::python_frame;

    pub(crate) fn frame(function: &str, module: &str) -> Frame {
        Frame {
            address: 0x1000,
            function: Some(function.to_owned()),
            file: None,
            line: None,
            module: Some(module.to_owned()),
            build_id: Some("0123abcd".to_owned()),
            file_offset: Some(0x1000),
            offset: Some(0x1000),
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
    fn trims_the_std_allocators_allocate_as_dwarf_names_it() {
        let libstdcxx = "/usr/lib/libstdc++.so.6";
        let in_header = |function: &str, file: &str| Frame {
            file: Some(file.to_owned()),
            ..frame(function, APP)
        };
        let frames = vec![
            frame("operator new(unsigned long)", libstdcxx),
            in_header("allocate", "/usr/include/c++/12/bits/new_allocator.h"),
            in_header(
                "std::allocator_traits<std::allocator<int> >::allocate",
                "/usr/include/c++/12/bits/alloc_traits.h",
            ),
            in_header(
                "_M_allocate_buckets",
                "/usr/include/c++/12/bits/hashtable_policy.h",
            ),
        ];
        assert_eq!(
            functions(&trim_allocator_frames(frames)),
            ["_M_allocate_buckets"]
        );
        // `allocate` elsewhere is the program's own.
        let own = vec![in_header("allocate", "/src/pool.cc"), frame("main", APP)];
        assert_eq!(functions(&trim_allocator_frames(own)), ["allocate", "main"]);
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
    fn site_is_the_first_frame_past_allocator_and_wrappers() {
        let redis = "/usr/bin/redis-server";
        let mut caller = frame("createStringObject", redis);
        caller.file = Some("/build/redis/src/object.c".to_owned());
        caller.line = Some(94);
        let frames = vec![
            frame("je_malloc_default", "/usr/lib/libjemalloc.so.2"),
            frame("malloc", "/usr/lib/libjemalloc.so.2"),
            frame("ztrymalloc_usable_internal", redis),
            frame("zmalloc", redis),
            caller,
            frame("main", redis),
        ];
        let site = site(&frames, &Wrappers::default()).unwrap();
        assert_eq!(site.frame.function.as_deref(), Some("createStringObject"));
        assert_eq!(site.via.as_deref(), Some("zmalloc"));
        assert_eq!(site.label, "createStringObject (object.c:94) via zmalloc");
        let stopped = Frame {
            function: Some("[unwinding stopped: outside code]".to_owned()),
            ..Frame::default()
        };
        let cut_short = site_of(&[frame("zrealloc_usable", redis), stopped], &[]);
        assert_eq!(cut_short.label, "zrealloc_usable");
        let direct = site_of(&[frame("load_model", APP)], &[]);
        assert_eq!(direct.label, "load_model");
        assert_eq!(direct.via, None);
    }

    fn site_of(frames: &[Frame], custom: &[&str]) -> Site {
        let custom: Vec<String> = custom.iter().map(|p| (*p).to_owned()).collect();
        site(frames, &Wrappers::new(&custom).unwrap()).unwrap()
    }

    #[test]
    fn python_site_is_the_programs_own_code_past_extensions_and_packages() {
        let numpy = "/usr/lib/python3/dist-packages/numpy/core/_multiarray_umath.so";
        let mut stripped = frame("", numpy);
        stripped.function = None;
        stripped.offset = Some(0xde138);
        let frames = [
            frame("malloc", LIBC),
            stripped.clone(),
            python_frame(
                "ones",
                "/usr/lib/python3/dist-packages/numpy/core/numeric.py",
                205,
            ),
            python_frame("deepcopy", "/usr/lib/python3.11/copy.py", 128),
            python_frame("Model._materialize_params", "/srv/app/exporter.py", 41),
            python_frame("main", "/srv/app/train.py", 12),
            frame("Py_BytesMain", "/usr/bin/python3.11"),
        ];
        let site = site(&frames, &Wrappers::default()).unwrap();
        assert_eq!(
            site.label,
            "Model._materialize_params (exporter.py:41) via deepcopy"
        );
        // A C function of an extension (numpy's `zeros`): the object it
        // is in, when stripped; and a library Python function reached
        // through the interpreter's C frames is named, not those frames.
        let program = python_frame("main", "/srv/app/train.py", 16);
        let site = site_of(&[frames[0].clone(), stripped.clone(), program.clone()], &[]);
        assert_eq!(site.label, "main (train.py:16) via _multiarray_umath.so");
        let finalize = python_frame("finalize.__init__", "/usr/lib/python3.11/weakref.py", 582);
        let call = frame("_PyObject_MakeTpCall", "/usr/bin/python3.11");
        let site = site_of(&[frames[0].clone(), finalize, call, program], &[]);
        assert_eq!(site.label, "main (train.py:16) via finalize.__init__");
        // Without Python code of its own, the first frame past the
        // allocator stays the site.
        let site = site_of(&[frames[0].clone(), stripped, frames[2].clone()], &[]);
        assert_eq!(site.label, "_multiarray_umath.so+0xde138");
        // pyenv's and a venv's standard library too.
        assert!(is_standard_library(
            "/root/.pyenv/versions/3.12.1/lib/python3.12/json/decoder.py"
        ));
        assert!(!is_standard_library("/srv/lib/python_tools/x.py"));
    }

    #[test]
    fn custom_wrappers_match_whole_names() {
        let frames = [
            frame("my_xmalloc_impl", APP),
            frame("my_xmalloc", APP),
            frame("load_config", APP),
        ];
        assert_eq!(site_of(&frames, &[]).label, "my_xmalloc_impl");
        assert_eq!(site_of(&frames, &["my_xmalloc"]).label, "my_xmalloc_impl");
        let site = site_of(&frames, &["my_xmalloc.*"]);
        assert_eq!(site.label, "load_config via my_xmalloc");
        assert!(Wrappers::new(&["(".to_owned()]).is_err());
    }

    #[test]
    fn builtin_wrappers_cover_common_code_bases() {
        let wrappers = Wrappers::default();
        for function in [
            "zmalloc_usable",
            "zcalloc",
            "g_malloc0",
            "xmalloc",
            "PyMem_Malloc",
            "PyObject_Malloc",
            "_PyObject_Malloc",
            "std::allocator<char>::allocate(unsigned long, void const*)",
            "__gnu_cxx::new_allocator<int>::allocate(unsigned long, void const*)",
            "av_mallocz",
            "CRYPTO_zalloc",
            "OPENSSL_malloc",
            "_int_malloc",
            "je_malloc_default",
        ] {
            assert!(wrappers.matches(function), "{function}");
        }
        for function in [
            "main",
            "mi_state",
            "g_main_loop_run",
            "malloc_trim",
            "my_xmalloc",
        ] {
            assert!(!wrappers.matches(function), "{function}");
        }
    }

    #[test]
    fn labels_drop_cxx_arguments_and_name_frames_without_symbols() {
        let mut frame = frame("Cache::insert(std::string const&)", APP);
        assert_eq!(frame_label(&frame), "Cache::insert");
        frame.function = None;
        frame.offset = None;
        frame.file_offset = Some(0x1a2b);
        assert_eq!(frame_label(&frame), "server@file 0x1a2b");
        frame.offset = Some(0x401a2b);
        assert_eq!(frame_label(&frame), "server+0x401a2b");
    }

    #[test]
    fn never_trims_every_frame() {
        let frames = vec![frame("__libc_malloc", LIBC), frame("malloc", LIBC)];
        assert_eq!(functions(&trim_allocator_frames(frames)), ["malloc"]);
        assert!(trim_allocator_frames(Vec::new()).is_empty());
    }
}
