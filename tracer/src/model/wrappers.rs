//! The allocation wrappers a stack's site is looked for past (`zmalloc`,
//! `g_malloc`, `PyMem_Malloc`, `--wrapper`): the built-in list and the
//! program's own, as the labels of every output and `--wrapper` see them.
use regex::RegexSet;

/// Functions that only pass an allocation on to the allocator, in common
/// C, C++ and Python code bases and inside the allocators themselves;
/// each matched against a whole function name.
const BUILTIN_WRAPPERS: &[&str] = &[
    // redis, and every project that took its zmalloc.
    r"z(try)?(malloc|calloc|realloc)\w*",
    r"zstrdup",
    // GLib.
    r"g_(try_)?(malloc|malloc0|realloc|malloc_n|malloc0_n|realloc_n)",
    r"g_(memdup2?|strdup|strndup|slice_alloc|slice_alloc0|slice_copy)",
    // GNU and BSD code, git, gcc.
    r"x(malloc|calloc|realloc|zalloc|mallocz|memdup|strdup|strndup|reallocarray)",
    // CPython's allocator API and pymalloc.
    r"_?PyMem_(Raw)?(Malloc|Calloc|Realloc)",
    r"_?PyObject_(Malloc|Calloc|Realloc)",
    r"_PyMem_\w+|pymalloc_\w+|_PyObject_ArenaMmap|allocate_from_new_pool",
    // C++ allocators, as demangled.
    r"(std::|__gnu_cxx::)(__new_allocator|new_allocator|allocator|allocator_traits)<.*>::allocate.*",
    // FFmpeg.
    r"av_(malloc|mallocz|calloc|realloc|realloc_f|reallocp|malloc_array|mallocz_array|realloc_array|fast_malloc|fast_mallocz|fast_realloc|strdup|strndup|memdup)",
    // OpenSSL.
    r"(OPENSSL|CRYPTO)_(malloc|zalloc|realloc|clear_realloc|memdup|strdup|strndup|secure_malloc|secure_zalloc)",
    // The allocators' own internals.
    r"_int_(malloc|realloc|memalign|free)|sysmalloc|tcache_init|ptmalloc_init|malloc_hook_ini",
    r"(je_|_rjem_)\w+|imalloc\w*|tcmalloc::.*|_mi_\w+",
    r"tc_(malloc|calloc|realloc|new|newarray|memalign)\w*|mi_(malloc|calloc|realloc|zalloc|heap_malloc)\w*",
    // Rust's global allocator shims.
    r"__rust_(alloc|alloc_zeroed|realloc)|__rdl_\w+|__rg_\w+",
];

/// The allocation wrappers a stack's site is looked for past: the
/// built-in list and the program's own (`--wrapper REGEX`).
#[derive(Clone, Debug)]
pub struct Wrappers {
    set: RegexSet,
}

impl Default for Wrappers {
    fn default() -> Self {
        Wrappers::new(&[]).expect("the built-in wrapper patterns compile")
    }
}

impl Wrappers {
    /// The built-in list and `custom`, each pattern matched against a whole
    /// function name (`my_alloc.*` matches `my_alloc_impl`, `my_alloc`
    /// matches only itself).
    pub fn new(custom: &[String]) -> Result<Wrappers, regex::Error> {
        let patterns = BUILTIN_WRAPPERS
            .iter()
            .map(|pattern| (*pattern).to_owned())
            .chain(custom.iter().cloned())
            .map(|pattern| format!("^(?:{pattern})$"));
        Ok(Wrappers {
            set: RegexSet::new(patterns)?,
        })
    }

    /// Whether `function` is an allocation wrapper.
    pub fn matches(&self, function: &str) -> bool {
        self.set.is_match(function)
    }
}
