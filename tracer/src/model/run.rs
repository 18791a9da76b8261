//! What describes a run rather than its memory: how allocations were
//! recorded and stacks walked, where the probes went, which objects were
//! hooked. `attach` and `collect` fill these in, the recording saves them,
//! `output` renders them; none of those owns them.
//!
//! Modes are enums that serialize as the words the JSON report and the
//! recording have always held ("exact", "fp", "mmap-event"...), so both stay
//! byte-compatible.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Totals;

/// An enum of plain variants, each with the word it is written as in the
/// report and the recording (serialized as that string).
macro_rules! worded_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $word:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(into = "String", try_from = "String")]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// The word for it in reports.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)+
                }
            }

            /// The variant written as `word`.
            pub fn from_word(word: &str) -> Option<$name> {
                match word {
                    $($word => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.as_str().to_owned()
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;

            fn try_from(word: String) -> Result<$name, String> {
                $name::from_word(&word)
                    .ok_or_else(|| format!("unknown {}: {word}", stringify!($name)))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

worded_enum! {
    /// Whether every allocation is recorded or a sample, or (`--resident`)
    /// no allocation but the pages made resident.
    pub enum SamplingMode {
        Exact = "exact",
        Sampled = "sampled",
        Resident = "resident",
    }
}

worded_enum! {
    /// How stacks are walked (`--unwind`).
    pub enum UnwindMode {
        /// Frame pointers, walked in the kernel: cheapest, wrong through
        /// code built without them.
        FramePointers = "fp",
        /// Walked in the kernel through unwind tables built from every
        /// object's `.eh_frame` (frame pointers where an object has none).
        Dwarf = "dwarf",
        /// Walked in the kernel: through unwind tables for objects that lack
        /// frame pointers, by frame pointers for those that keep them.
        Auto = "auto",
        /// Every stack copied and unwound from `.eh_frame` in userspace (the
        /// earlier DWARF path, for comparison).
        Copy = "copy",
    }
}

worded_enum! {
    /// How tracer learnt of a library.
    pub enum NoticedBy {
        /// Mapped when tracer attached.
        Attach = "attach",
        /// Not mapped yet when tracer attached, but a library the target
        /// could load (its RUNPATH, LD_LIBRARY_PATH, the loader cache,
        /// Python's nvidia wheels): hooked by file ahead of its mapping.
        Ahead = "ahead",
        /// The openat tracepoint saw it being opened: hooked by file while
        /// the loader read it (before its first call if tracer won the
        /// race).
        AtOpen = "at-open",
        /// The mmap tracepoint saw it being mapped.
        MmapEvent = "mmap-event",
        /// The poll of /proc/PID/maps found it.
        MapsPoll = "maps-poll",
        /// A spawned command's loader had just mapped it: hooked while the
        /// command was stopped, before its constructors ran.
        LoaderStop = "loader-stop",
    }
}

impl NoticedBy {
    /// How the library's hooks got there, as the report says it:
    /// `attach`, `ahead` (before any mapping), `at-open` (while the loader
    /// read it: before its first call when tracer won the race), `late`
    /// (after the mapping: calls made meanwhile are missed) or
    /// `loader-stop` (a spawned command stopped before its constructors).
    pub fn hooked(self) -> &'static str {
        match self {
            NoticedBy::Attach => "attach",
            NoticedBy::Ahead => "ahead",
            NoticedBy::AtOpen => "at-open",
            NoticedBy::MmapEvent | NoticedBy::MapsPoll => "late",
            NoticedBy::LoaderStop => "loader-stop",
        }
    }
}

/// How return values reach the eBPF programs. Written as its description
/// ("uretprobe", "uprobe session", or the fallback with its reason).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
pub enum ReturnProbes {
    /// A uretprobe on every allocator function that returns a block.
    Uretprobe,
    /// uprobe session programs: unrecorded calls skip the return.
    Session,
    /// Sessions were wanted but the kernel refused them (the reason).
    UretprobeFallback(String),
}

const FALLBACK_PREFIX: &str = "uretprobe (uprobe sessions unavailable: ";

impl ReturnProbes {
    pub fn describe(&self) -> String {
        match self {
            ReturnProbes::Uretprobe => "uretprobe".to_owned(),
            ReturnProbes::Session => "uprobe session".to_owned(),
            ReturnProbes::UretprobeFallback(why) => format!("{FALLBACK_PREFIX}{why})"),
        }
    }
}

impl From<ReturnProbes> for String {
    fn from(value: ReturnProbes) -> String {
        value.describe()
    }
}

impl From<String> for ReturnProbes {
    fn from(description: String) -> ReturnProbes {
        match description.as_str() {
            "uretprobe" => ReturnProbes::Uretprobe,
            "uprobe session" => ReturnProbes::Session,
            other => ReturnProbes::UretprobeFallback(
                other
                    .strip_prefix(FALLBACK_PREFIX)
                    .and_then(|rest| rest.strip_suffix(')'))
                    .unwrap_or(other)
                    .to_owned(),
            ),
        }
    }
}

/// A process's resident memory, from /proc/PID/status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStatus {
    /// VmRSS: RssAnon + RssFile + RssShmem.
    pub rss_bytes: u64,
    pub rss_anon_bytes: u64,
    pub rss_file_bytes: u64,
    pub rss_shmem_bytes: u64,
}

/// A target's memory limit, read at the end of a live run
/// (`procfs::memory_limit`): its memory cgroup's lowest limit, else the
/// host's memory. Not recorded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryLimit {
    pub limit_bytes: u64,
    /// What counts against it now: the cgroup's usage, or the host's used
    /// memory.
    pub used_bytes: u64,
    /// `cgroup /PATH` or `host`.
    pub source: String,
}

/// A traced process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub pid: u32,
    pub command: String,
    /// Seconds after attach at which the process exited, if it did.
    pub exited_after_s: Option<f64>,
    /// Seconds after attach at which tracing began for a child followed
    /// with --follow-forks (its earlier allocations are not seen).
    pub followed_after_s: Option<f64>,
    /// Seconds after attach at which the process replaced its image
    /// (execve): what the old image held was gone from then on.
    pub execs_after_s: Vec<f64>,
    /// The CUDA contexts it destroyed or reset, in order. Kept out of the
    /// recording's metadata, whose layout is fixed: recorded apart.
    #[serde(skip)]
    pub gpu_contexts_destroyed: Vec<ContextDestroyed>,
}

impl Target {
    /// A process traced from its attach on: not exited, not a followed
    /// child, no exec and no CUDA context destroyed yet.
    pub fn new(pid: u32, command: String) -> Target {
        Target {
            pid,
            command,
            exited_after_s: None,
            followed_after_s: None,
            execs_after_s: Vec::new(),
            gpu_contexts_destroyed: Vec::new(),
        }
    }
}

/// A CUDA context a process destroyed or reset (cuCtxDestroy_v2,
/// cuDevicePrimaryCtxReset_v2, cudaDeviceReset): the GPU memory its
/// contexts owned was released without frees.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContextDestroyed {
    /// Seconds after attach at which the call returned.
    pub after_s: f64,
    /// What the context-owned GPU memory held at that moment, released, by
    /// kind name (kinds that held nothing are left out).
    pub released: BTreeMap<String, Totals>,
}

/// One attached probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    pub pid: u32,
    /// Path of the object the probe is in.
    pub module: String,
    pub symbol: String,
    /// File offset of the probed instruction in `module`.
    pub offset: u64,
    /// Bytes past the function's entry (the probe moves past instructions
    /// the kernel would have to single-step).
    pub offset_in_function: u64,
    /// The probed instruction is single-stepped: ~16 µs per call on a VM.
    pub single_stepped: bool,
    /// Why the probe is at this instruction.
    pub reason: String,
}

/// The times processes were held at the loader gate until the libraries
/// their dlopen() opened were hooked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoaderPauses {
    pub times: u64,
    /// Their time in all.
    pub held_ms: f64,
}

/// What the probes recorded: every allocation, or a sample.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplingReport {
    pub mode: SamplingMode,
    /// Sampling period (`--sample-bytes`); null in exact mode. Live bytes
    /// are then estimates and `live_allocs` counts sampled blocks.
    pub sample_bytes: Option<u64>,
    pub min_size_bytes: u64,
    /// null: no upper limit.
    pub max_size_bytes: Option<u64>,
    /// How return values are read.
    pub return_probes: ReturnProbes,
}

impl SamplingReport {
    /// Every allocation recorded, results read by uretprobes.
    pub fn exact() -> SamplingReport {
        SamplingReport {
            mode: SamplingMode::Exact,
            sample_bytes: None,
            min_size_bytes: 0,
            max_size_bytes: None,
            return_probes: ReturnProbes::Uretprobe,
        }
    }
}

impl Default for SamplingReport {
    /// Exact, tracer's default.
    fn default() -> SamplingReport {
        SamplingReport::exact()
    }
}

/// How stacks were walked (`--unwind`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnwindingReport {
    pub mode: UnwindMode,
    /// Bytes of stack copied above the stack pointer (dwarf).
    pub stack_bytes: u32,
    /// The processes whose stacks were copied and unwound with DWARF.
    pub dwarf: Vec<DwarfProcess>,
}

/// A process unwound with DWARF.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DwarfProcess {
    pub pid: u32,
    /// With `auto`: the objects that lack frame pointers (why DWARF).
    pub objects_without_frame_pointers: Vec<String>,
}

/// An object tracer put hooks in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LibraryReport {
    pub pid: u32,
    /// The file as the target sees it.
    pub path: String,
    /// Seconds after attach (0 for those mapped when tracer attached).
    pub hooked_after_s: f64,
    pub noticed_by: NoticedBy,
    /// The functions hooked in it.
    pub functions: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_written_as_the_words_they_always_were() {
        let report = SamplingReport {
            return_probes: ReturnProbes::UretprobeFallback("EINVAL".to_owned()),
            ..SamplingReport::exact()
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["mode"], "exact");
        assert_eq!(
            json["return_probes"],
            "uretprobe (uprobe sessions unavailable: EINVAL)"
        );
        let back: SamplingReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
        assert_eq!(
            serde_json::to_value(NoticedBy::MmapEvent).unwrap(),
            "mmap-event"
        );
        assert_eq!(
            serde_json::to_value(UnwindMode::FramePointers).unwrap(),
            "fp"
        );
    }

    #[test]
    fn the_recording_keeps_modes_as_strings() {
        // postcard writes a string as its length and bytes: the same bytes
        // as the String fields of recording format 3.
        let as_enum = postcard::to_stdvec(&NoticedBy::MapsPoll).unwrap();
        let as_string = postcard::to_stdvec("maps-poll").unwrap();
        assert_eq!(as_enum, as_string);
        let back: ReturnProbes =
            postcard::from_bytes(&postcard::to_stdvec(&ReturnProbes::Session).unwrap()).unwrap();
        assert_eq!(back, ReturnProbes::Session);
    }
}

/// What a run, live or recorded, tells its report beside the model:
/// self-contained, read once from the collector (`Collector::run_facts`) or
/// from a recording (`Recording::run_facts`) and handed down, so the report
/// never calls back into either.
#[derive(Debug, Default)]
pub struct RunFacts {
    pub targets: Vec<super::Target>,
    /// Milliseconds between snapshots.
    pub interval_ms: u64,
    /// RSS and its parts of the targets still alive, read at the end.
    pub memory_status: BTreeMap<u32, MemoryStatus>,
    /// The memory limits of the targets alive (live runs only).
    pub memory_limits: BTreeMap<u32, MemoryLimit>,
    pub traced: Traced,
    pub stacks: StackFacts,
}

/// How the run was traced: the probes, the modes, the hooked objects and
/// what tracing cost and refused.
#[derive(Debug, Default)]
pub struct Traced {
    pub probes: Vec<ProbeReport>,
    pub sampling: SamplingReport,
    /// Null for recordings made before tracer could unwind with DWARF.
    pub unwinding: Option<UnwindingReport>,
    pub libraries: Vec<LibraryReport>,
    pub loader_pauses: LoaderPauses,
    /// Stack copies whose unwinding stopped early, by reason.
    pub unwinding_stopped: BTreeMap<String, u64>,
    /// What tracer added to the targets' CPU time; none for a recording.
    pub cost: Option<super::cost::Cost>,
    /// Files a target named that tracer refused, by reason.
    pub refused_files: BTreeMap<String, u64>,
}

/// What the run knows of its stacks: the symbolized frames of the stacks a
/// report may show (innermost first; a stack given no frames is merged
/// with none), the CUDA function that made a stack's memory, and the
/// stacks that reach their thread's start. Frames are shared (`Arc`): up
/// to `session::MERGE_ALL_UP_TO` stacks of 100-200 frames each, whose
/// names copied per stack took GiBs (issue 25).
#[derive(Debug, Default)]
pub struct StackFacts {
    pub frames: std::collections::HashMap<super::StackKey, Vec<std::sync::Arc<super::Frame>>>,
    pub apis: std::collections::HashMap<super::StackKey, String>,
    pub reaching_entry: std::collections::HashSet<super::StackKey>,
}

impl StackFacts {
    /// The frames of `key` (innermost first), empty where unknown.
    pub fn frames(&self, key: &super::StackKey) -> Vec<super::Frame> {
        self.frames.get(key).map_or_else(Vec::new, |frames| {
            frames
                .iter()
                .map(|frame| super::Frame::clone(frame))
                .collect()
        })
    }

    /// The facts of the stacks of `model`, each asked of the functions
    /// given: `frames` of every stack, `reaches_entry` of every stack (the
    /// tests' reports).
    #[cfg(test)]
    pub fn of(
        model: &super::Model,
        mut frames: impl FnMut(&super::StackKey) -> Vec<super::Frame>,
        mut reaches_entry: impl FnMut(&super::StackKey) -> bool,
    ) -> StackFacts {
        let mut facts = StackFacts::default();
        for (key, _) in model.latest_counters() {
            let stack = frames(&key);
            if !stack.is_empty() {
                facts
                    .frames
                    .insert(key, stack.into_iter().map(std::sync::Arc::new).collect());
            }
            if reaches_entry(&key) {
                facts.reaching_entry.insert(key);
            }
        }
        facts
    }
}
