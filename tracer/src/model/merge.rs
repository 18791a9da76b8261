//! One site, one line: stacks of one process and memory kind whose
//! symbolized frames are the same are one place in the code, however the
//! kernel numbered them (a copied stack and its frame-pointer fallback, two
//! return addresses on one source line, a stack table that stored a walk
//! twice). Every report view shows them as one stack with their totals
//! added (`Model::merged`).
//!
//! Frames are compared as a reader sees them: by every field but the
//! process address, and but the file offset where a function name is
//! known. So the comparison takes in whatever a frame comes to carry
//! (language, file, line) without a change here.
//!
//! A stack whose walk stopped early (a frame-pointer walk that a copy fell
//! back to ends where the first function without frame pointers is, often
//! in libc's start code) is the inner part of the full one: a stack of at
//! least two frames that only one longer stack of its process and kind
//! extends is merged into that one. Where several do, it cannot be told
//! which, and it stays apart.
//!
//! Around Python frames, the interpreter's own native frames are call
//! machinery, not a place in the user's code: one Python line reaches
//! numpy through `PyObject_Vectorcall` before its call site is specialized
//! and straight from `_PyEval_EvalFrameDefault` after. They are left out
//! of the comparison (`without_interpreter_machinery`), so one Python site
//! is one stack; the merged stack shows the frames of its first stack.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    hash::{DefaultHasher, Hash as _, Hasher as _},
    sync::Arc,
};

use super::{Frame, Kind, Language, Model, StackKey};

/// More stacks than this beginning with one stack: it is not merged.
const MAX_EXTENSIONS: usize = 64;

/// A distinct list of frames (as `place` leaves them, each frame shared
/// by every list that has it) and the first stack that has it.
type FrameList = (Vec<Arc<Frame>>, StackKey);

/// Each stack of `model` with the key of the stack it is merged into: the
/// smallest key among the stacks of its process and kind with the same
/// frames (`frames` gives a stack's frames, innermost first). Stacks
/// without frames (not recorded) are never merged.
pub fn canonical_keys(
    model: &Model,
    mut frames: impl FnMut(&StackKey) -> Vec<Frame>,
) -> BTreeMap<StackKey, StackKey> {
    let mut keys: Vec<StackKey> = model.latest_counters().map(|(key, _)| key).collect();
    keys.sort_unstable();
    // Distinct frame lists of each process and kind, with the first
    // (smallest) key that has each.
    let mut lists: HashMap<(u32, Kind), Vec<FrameList>> = HashMap::new();
    let mut index_of: HashMap<(u32, Kind, Vec<Arc<Frame>>), usize> = HashMap::new();
    let mut list_of: Vec<(StackKey, Option<usize>)> = Vec::with_capacity(keys.len());
    // One copy of each distinct place: 20 000 stacks of 150 frames copied
    // twice each took GiBs (issue 25).
    let mut interned: HashSet<Arc<Frame>> = HashSet::new();
    for key in keys {
        let frames: Vec<Frame> = frames(&key)
            .into_iter()
            .filter(|frame| !is_marker(frame))
            .collect();
        let places: Vec<Arc<Frame>> = without_interpreter_machinery(&frames)
            .map(|frame| {
                let place = place(frame);
                if let Some(known) = interned.get(&place) {
                    return Arc::clone(known);
                }
                let place = Arc::new(place);
                interned.insert(Arc::clone(&place));
                place
            })
            .collect();
        if places.is_empty() {
            list_of.push((key, None));
            continue;
        }
        let group = lists.entry((key.pid, key.kind)).or_default();
        let index = *index_of
            .entry((key.pid, key.kind, places.clone()))
            .or_insert_with(|| {
                group.push((places, key));
                group.len() - 1
            });
        list_of.push((key, Some(index)));
    }
    let into: HashMap<(u32, Kind), Vec<usize>> = lists
        .iter()
        .map(|(&group_key, group)| (group_key, only_extension(group)))
        .collect();
    list_of
        .into_iter()
        .map(|(key, index)| {
            let canonical = index.map_or(key, |index| {
                let group = &lists[&(key.pid, key.kind)];
                group[into[&(key.pid, key.kind)][index]].1
            });
            (key, canonical)
        })
        .collect()
}

/// For each frame list of `group`, the index of the list it merges into:
/// the only longest list that extends it, or itself.
fn only_extension(group: &[FrameList]) -> Vec<usize> {
    // Hash of every prefix (two frames or more) of every list with the
    // list that has it, sorted: one flat vector, where a map of vectors
    // took ~70 MiB for 6 400 torch stacks of ~150 frames.
    let mut by_prefix: Vec<(u64, usize)> = Vec::with_capacity(
        group
            .iter()
            .map(|(list, _)| list.len().saturating_sub(1))
            .sum(),
    );
    for (index, (list, _)) in group.iter().enumerate() {
        for (length, hash) in prefix_hashes(list).enumerate() {
            if length + 1 >= 2 {
                by_prefix.push((hash, index));
            }
        }
    }
    by_prefix.sort_unstable();
    let lists_with = |hash: u64| {
        let start = by_prefix.partition_point(|&(other, _)| other < hash);
        by_prefix[start..]
            .iter()
            .take_while(move |&&(other, _)| other == hash)
            .map(|&(_, index)| index)
    };
    group
        .iter()
        .enumerate()
        .map(|(index, (list, _))| {
            if list.len() < 2 {
                return index;
            }
            let full_hash = prefix_hashes(list).last().unwrap_or_default();
            let mut extensions: Vec<&[Arc<Frame>]> = Vec::new();
            let mut longest = index;
            for other in lists_with(full_hash) {
                let longer = group[other].0.as_slice();
                if extensions.len() > MAX_EXTENSIONS {
                    break;
                }
                if longer.len() > list.len() && longer.starts_with(list) {
                    extensions.push(longer);
                    if longer.len() > group[longest].0.len() {
                        longest = other;
                    }
                }
            }
            // One longest stack extends it when every extension begins
            // the longest (they form a chain); a common prefix of many
            // stacks is ambiguous anyway, so its check is cut short.
            let longest_list = group[longest].0.as_slice();
            let only_one = extensions.len() <= MAX_EXTENSIONS
                && extensions
                    .iter()
                    .all(|extension| longest_list.starts_with(extension));
            if only_one { longest } else { index }
        })
        .collect()
}

/// The hash of `list[..1]`, `list[..2]`, ... in turn.
fn prefix_hashes(list: &[Arc<Frame>]) -> impl Iterator<Item = u64> + '_ {
    let mut hasher = DefaultHasher::new();
    list.iter().map(move |frame| {
        frame.hash(&mut hasher);
        hasher.finish()
    })
}

/// A frame that only says where a walk stopped (no address, no object).
fn is_marker(frame: &Frame) -> bool {
    frame.address == 0 && frame.module.is_none() && frame.file.is_none()
}

/// `model` with the stacks of equal frames merged (see `canonical_keys`),
/// or `None` when no two stacks merge; and the map from each stack to the
/// one it went into.
pub fn by_frames(
    model: &Model,
    frames: impl FnMut(&StackKey) -> Vec<Frame>,
) -> (Option<Model>, BTreeMap<StackKey, StackKey>) {
    let canonical = canonical_keys(model, frames);
    if canonical.iter().all(|(key, into)| key == into) {
        return (None, canonical);
    }
    let merged = model.merged(|key| canonical.get(key).copied().unwrap_or(*key));
    (Some(merged), canonical)
}

/// `frames` (innermost first) without the interpreter's native frames
/// that lie between Python frames, or between the innermost Python frame
/// and the native code it called (a C extension such as numpy; or, when
/// the interpreter allocates for itself, the innermost frame: a list
/// growing): those only say how the interpreter made the call. The
/// native frames below the outermost Python frame (`main`, the C caller
/// of an embedded interpreter) are kept.
fn without_interpreter_machinery(frames: &[Frame]) -> impl Iterator<Item = &Frame> {
    let python = |frame: &Frame| frame.language == Language::Python;
    let innermost = frames.iter().position(python);
    let outermost = frames.iter().rposition(python);
    // The native code the innermost Python frame called: the outermost
    // frame of another object inside it, else the innermost frame.
    let called = innermost.map(|innermost| {
        frames[..innermost]
            .iter()
            .rposition(|frame| !is_interpreter(frame))
            .unwrap_or(0)
    });
    frames.iter().enumerate().filter_map(move |(index, frame)| {
        let (Some(innermost), Some(outermost)) = (innermost, outermost) else {
            return Some(frame);
        };
        let between_python = innermost < index && index < outermost;
        let calling_out = called.is_some_and(|called| called < index && index < innermost);
        let machinery = is_interpreter(frame) && (between_python || calling_out);
        (!machinery).then_some(frame)
    })
}

/// A native frame of CPython's own code: in a `python3.X` executable or a
/// `libpython3.X` library.
pub fn is_interpreter(frame: &Frame) -> bool {
    let Some(module) = frame.module.as_deref() else {
        return false;
    };
    let name = std::path::Path::new(module)
        .file_name()
        .map_or_else(|| module.into(), |name| name.to_string_lossy());
    let name = name.strip_prefix("lib").unwrap_or(&name);
    frame.language == Language::Native
        && name.strip_prefix("python").is_some_and(|version| {
            version.is_empty() || version.starts_with(|c: char| c.is_ascii_digit())
        })
}

/// A frame as a reader tells it apart: without its process address, and
/// without its file offset where the function is known.
fn place(frame: &Frame) -> Frame {
    let mut place = frame.clone();
    if frame.function.is_some() || frame.file_offset.is_some() {
        place.address = 0;
    }
    if frame.function.is_some() {
        place.file_offset = None;
    }
    place
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        Counters, Snapshot, StackId,
        fixtures::{heap_key, python_frame},
    };

    fn frame(function: &str, line: u32, address: u64) -> Frame {
        Frame {
            address,
            function: Some(function.to_owned()),
            file: Some("leak.c".to_owned()),
            line: Some(line),
            module: Some("/app".to_owned()),
            build_id: None,
            file_offset: Some(address - 0x1000),
            offset: None,
            language: crate::model::Language::Native,
        }
    }

    fn counters(live_bytes: i64, allocs: i64) -> Counters {
        Counters {
            live_bytes,
            live_allocs: allocs,
            alloc_bytes_total: live_bytes as u64 * 2,
            alloc_count_total: allocs as u64 * 2,
        }
    }

    fn snapshot(elapsed_s: f64, stacks: &[(StackKey, Counters)]) -> Snapshot {
        Snapshot {
            elapsed_s,
            stacks: stacks.to_vec(),
            ..Snapshot::default()
        }
    }

    #[test]
    fn stacks_with_the_same_frames_are_one_stack_with_exact_totals() {
        let kernel = heap_key(7, 3);
        let copied = StackKey {
            stack_id: StackId::Copied(0),
            ..kernel
        };
        let other_line = heap_key(7, 4);
        let other_pid = heap_key(8, 3);
        let mut model = Model::new();
        model.push(snapshot(1.0, &[(kernel, counters(100, 1))]));
        model.push(snapshot(
            2.0,
            &[
                (kernel, counters(200, 2)),
                (copied, counters(1000, 10)),
                (other_line, counters(5, 1)),
                (other_pid, counters(7, 1)),
            ],
        ));
        model.push(snapshot(3.0, &[(copied, counters(3000, 30))]));
        let frames = |key: &StackKey| match (key.pid, key.stack_id) {
            (7, StackId::Kernel(4)) => vec![frame("leak", 13, 0x1234), frame("main", 40, 0x1300)],
            // The same lines at other return addresses.
            _ => vec![frame("leak", 12, 0x1200), frame("main", 40, 0x1310)],
        };
        let (merged, canonical) = by_frames(&model, frames);
        let merged = merged.expect("stacks merged");
        assert_eq!(canonical[&copied], kernel);
        assert_eq!(canonical[&other_line], other_line);
        assert_eq!(canonical[&other_pid], other_pid);
        assert!(merged.series(&copied).is_none());
        let live: Vec<(f64, i64)> = merged.live_bytes_at_every_snapshot(&kernel);
        assert_eq!(live, [(0.0, 0), (1.0, 100), (2.0, 1200), (3.0, 3200)]);
        let latest = merged.series(&kernel).unwrap().latest();
        assert_eq!(latest, counters(200, 2).plus(counters(3000, 30)));
        assert_eq!(merged.totals(), model.totals());
        let slope = |model: &Model, keys: &[StackKey]| -> f64 {
            keys.iter().map(|key| model.growth_bytes_per_s(key)).sum()
        };
        assert!((slope(&merged, &[kernel]) - slope(&model, &[kernel, copied])).abs() < 1e-9);
        assert_eq!(merged.top_stacks(10).len(), 3);
    }

    #[test]
    fn a_walk_that_stopped_early_merges_into_the_only_stack_it_begins() {
        let full = StackKey {
            stack_id: StackId::Copied(0),
            ..heap_key(1, 0)
        };
        let stopped = heap_key(1, 5);
        let (other_full, other_stopped) = (heap_key(1, 6), heap_key(1, 7));
        let ambiguous = heap_key(1, 8);
        let mut model = Model::new();
        let all = [full, stopped, other_full, other_stopped, ambiguous];
        let stacks: Vec<(StackKey, Counters)> =
            all.iter().map(|key| (*key, counters(10, 1))).collect();
        model.push(snapshot(1.0, &stacks));
        let frames = |key: &StackKey| {
            let f = |name: &str| frame(name, 1, 0x2000);
            let marker = Frame {
                function: Some("[unwinding stopped: outside code]".to_owned()),
                ..Frame::default()
            };
            match key.stack_id {
                StackId::Copied(0) => vec![f("leak"), f("run"), f("main"), f("_start")],
                StackId::Kernel(5) => vec![f("leak"), f("run"), f("main"), marker],
                StackId::Kernel(6) => vec![f("leak"), f("serve"), f("thread_start")],
                StackId::Kernel(7) => vec![f("leak"), f("serve")],
                _ => vec![f("leak")],
            }
        };
        let canonical = canonical_keys(&model, frames);
        assert_eq!(canonical[&stopped], full);
        assert_eq!(canonical[&other_stopped], other_full);
        assert_eq!(canonical[&ambiguous], ambiguous, "one frame: never merged");
        let (merged, _) = by_frames(&model, frames);
        let merged = merged.expect("stacks merged");
        assert_eq!(merged.series(&full).unwrap().latest().live_bytes, 20);
    }

    #[test]
    fn one_python_site_is_one_stack_whatever_interpreter_path_reached_it() {
        let in_object = |function: &str, module: &str, address: u64| Frame {
            module: Some(module.to_owned()),
            file: None,
            line: None,
            ..frame(function, 0, address)
        };
        let numpy = |function: &str| {
            in_object(
                function,
                "/usr/lib/python3/dist-packages/_multiarray_umath.so",
                0x5000,
            )
        };
        let interpreter =
            |function: &str, address: u64| in_object(function, "/usr/bin/python3.11", address);
        let python = |function: &str, line: u32| python_frame(function, "app.py", line);
        let (vectorcall, direct, other_path) = (heap_key(1, 1), heap_key(1, 2), heap_key(1, 3));
        let (other_caller, list_growth, list_growth_other_path) =
            (heap_key(1, 4), heap_key(1, 5), heap_key(1, 6));
        let mut model = Model::new();
        let keys = [
            vectorcall,
            direct,
            other_path,
            other_caller,
            list_growth,
            list_growth_other_path,
        ];
        let stacks: Vec<(StackKey, Counters)> =
            keys.iter().map(|key| (*key, counters(10, 1))).collect();
        model.push(snapshot(1.0, &stacks));
        let frames = |key: &StackKey| {
            let mut frames = match key.stack_id {
                StackId::Kernel(5) | StackId::Kernel(6) => vec![interpreter("list_resize", 0x100)],
                _ => vec![numpy("PyDataMem_UserNEW"), numpy("array_new")],
            };
            match key.stack_id {
                StackId::Kernel(1) | StackId::Kernel(6) => frames.extend([
                    interpreter("", 0x53ad87),
                    interpreter("PyObject_Vectorcall", 0x53acbc),
                ]),
                StackId::Kernel(3) => frames.push(interpreter("_PyObject_MakeTpCall", 0x300)),
                _ => {}
            }
            frames.push(python("leak", 3));
            if key.stack_id == StackId::Kernel(3) {
                frames.extend([
                    interpreter("_PyFunction_Vectorcall", 0x400),
                    interpreter("PyObject_Call", 0x500),
                ]);
            }
            let caller = if key.stack_id == StackId::Kernel(4) {
                9
            } else {
                7
            };
            frames.extend([
                python("caller", caller),
                python("<module>", 12),
                interpreter("PyEval_EvalCode", 0x600),
                interpreter("main", 0x700),
            ]);
            frames
        };
        let canonical = canonical_keys(&model, frames);
        assert_eq!(canonical[&direct], vectorcall);
        assert_eq!(canonical[&other_path], vectorcall);
        assert_eq!(
            canonical[&other_caller], other_caller,
            "another Python line"
        );
        assert_eq!(
            canonical[&list_growth_other_path], list_growth,
            "the interpreter allocating for itself: its allocating frame is the site"
        );
        let (merged, _) = by_frames(&model, frames);
        let merged = merged.expect("stacks merged");
        assert_eq!(merged.series(&vectorcall).unwrap().latest().live_bytes, 30);
        assert_eq!(merged.series(&list_growth).unwrap().latest().live_bytes, 20);
    }

    #[test]
    fn an_interpreter_frame_is_python_s_own_object_only() {
        let at = |module: &str| Frame {
            module: Some(module.to_owned()),
            ..Frame::default()
        };
        assert!(is_interpreter(&at("/usr/bin/python3.11")));
        assert!(is_interpreter(&at(
            "/root/.pyenv/versions/3.10.13/lib/libpython3.10.so.1.0"
        )));
        assert!(!is_interpreter(&at("/usr/lib/python3/dist-packages/x.so")));
        assert!(!is_interpreter(&at("/usr/lib/libpython-helper.so")));
        assert!(!is_interpreter(&Frame {
            language: Language::Python,
            ..at("/usr/bin/python3.11")
        }));
    }

    #[test]
    fn stacks_without_frames_stay_apart() {
        let (a, b) = (heap_key(1, 1), heap_key(1, 2));
        let mut model = Model::new();
        model.push(snapshot(1.0, &[(a, counters(1, 1)), (b, counters(2, 1))]));
        let (merged, _) = by_frames(&model, |_| Vec::new());
        assert!(merged.is_none());
    }
}
