//! JIT runtimes: code compiled at run time, named by the perf map the
//! runtime writes (`perf_map`: Node.js with `--perf-basic-prof`, Java
//! with perf-map-agent, Python 3.12+ with `-X perf`), through the
//! symbolizer's seam (`symbolize::jit::JitNames`). Their frames are
//! walked as native code: a JIT that keeps frame pointers (V8 does) is
//! walked by them.
pub mod perf_map;

pub use perf_map::PerfMaps;
