//! The report as a pprof profile (gzip-compressed profile.proto), for
//! `go tool pprof` and the tools that read its format.
//!
//! Each ranked stack is one sample with four values: `inuse_space/bytes`,
//! `inuse_objects/count`, `alloc_space/bytes` and `alloc_objects/count`,
//! labelled with its pid and memory kind. Locations carry function, file and
//! line (inlined calls as extra lines of one location); mappings carry the
//! module's path and build id, so the profile can be symbolized again.
//!
//! The messages are declared here with prost's derive, field for field from
//! profile.proto (github.com/google/pprof/proto/profile.proto, stable since
//! 2016): prost does the encoding, and no protoc is needed to build.

use std::{collections::HashMap, io::Write as _};

use flate2::{Compression, write::GzEncoder};
use prost::Message as _;

use super::Report;
use crate::model::{Frame, Language};

/// The profile as gzip-compressed protobuf bytes.
pub fn render(report: &Report) -> Vec<u8> {
    let profile = build(report);
    let mut gzip = GzEncoder::new(Vec::new(), Compression::default());
    gzip.write_all(&profile.encode_to_vec())
        .expect("writing to a Vec cannot fail");
    gzip.finish().expect("writing to a Vec cannot fail")
}

/// The profile before encoding.
fn build(report: &Report) -> Profile {
    Builder::default().build(report)
}

/// Interns strings, functions, mappings and locations as profile.proto
/// wants them: by index into tables, ids from 1.
#[derive(Default)]
struct Builder {
    profile: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, Option<String>), u64>,
    mappings: HashMap<String, u64>,
    /// By (pid, address): the same address in two processes may be two
    /// different pieces of code.
    locations: HashMap<(u32, u64), u64>,
    /// Python frames (no address): by function, file and line.
    python_locations: HashMap<(String, Option<String>, Option<u32>), u64>,
}

impl Builder {
    fn build(mut self, report: &Report) -> Profile {
        self.string("");
        for (kind, unit) in [
            ("inuse_space", "bytes"),
            ("inuse_objects", "count"),
            ("alloc_space", "bytes"),
            ("alloc_objects", "count"),
        ] {
            let value_type = ValueType {
                kind: self.string(kind),
                unit: self.string(unit),
            };
            self.profile.sample_type.push(value_type);
        }
        self.profile.default_sample_type = self.string("inuse_space");
        self.profile.duration_nanos = (report.window_s * 1e9) as i64;
        let window = format!(
            "tracer {}: {:.1} s from attach, {} snapshots every {} ms",
            report.tracer_version, report.window_s, report.snapshots, report.interval_ms
        );
        let window_comment = self.string(&window);
        self.profile.comment.push(window_comment);
        if !report.drops.is_empty() {
            let drops: Vec<String> = report
                .drops
                .iter()
                .map(|(name, count)| format!("{name}={count}"))
                .collect();
            let comment = self.string(&format!("dropped events: {}", drops.join(", ")));
            self.profile.comment.push(comment);
        }
        self.add_mappings(report);
        for stack in &report.stacks {
            let location_id = stack_locations(&stack.frames)
                .map(|frames| self.location(stack.pid, frames))
                .collect();
            let label = vec![
                Label {
                    key: self.string("pid"),
                    num: i64::from(stack.pid),
                    ..Label::default()
                },
                Label {
                    key: self.string("kind"),
                    str: self.string(stack.kind.as_str()),
                    ..Label::default()
                },
            ];
            self.profile.sample.push(Sample {
                location_id,
                value: vec![
                    stack.live_bytes,
                    stack.live_allocs,
                    i64::try_from(stack.alloc_bytes_total).unwrap_or(i64::MAX),
                    i64::try_from(stack.alloc_count_total).unwrap_or(i64::MAX),
                ],
                label,
            });
        }
        self.profile
    }

    fn string(&mut self, text: &str) -> i64 {
        if let Some(&index) = self.strings.get(text) {
            return index;
        }
        let index = self.profile.string_table.len() as i64;
        self.profile.string_table.push(text.to_owned());
        self.strings.insert(text.to_owned(), index);
        index
    }

    /// One mapping per module, spanning the frames seen in it.
    fn add_mappings(&mut self, report: &Report) {
        let mut spans: Vec<(&str, &Frame, u64)> = Vec::new();
        for frame in report.stacks.iter().flat_map(|stack| &stack.frames) {
            let Some(module) = frame.module.as_deref() else {
                continue;
            };
            match spans.iter_mut().find(|(name, _, _)| *name == module) {
                Some((_, lowest, highest)) => {
                    if frame.address < lowest.address {
                        *lowest = frame;
                    }
                    *highest = (*highest).max(frame.address);
                }
                None => spans.push((module, frame, frame.address)),
            }
        }
        for (module, lowest, highest) in spans {
            let has_functions = report
                .stacks
                .iter()
                .flat_map(|stack| &stack.frames)
                .any(|frame| frame.module.as_deref() == Some(module) && frame.function.is_some());
            let mapping = Mapping {
                id: self.profile.mapping.len() as u64 + 1,
                memory_start: lowest.address,
                memory_limit: highest + 1,
                file_offset: lowest.file_offset.unwrap_or(0),
                filename: self.string(module),
                build_id: self.string(lowest.build_id.as_deref().unwrap_or("")),
                has_functions,
                has_filenames: has_functions,
                has_line_numbers: has_functions,
                has_inline_frames: has_functions,
            };
            self.mappings.insert(module.to_owned(), mapping.id);
            self.profile.mapping.push(mapping);
        }
    }

    /// The location of one address: `frames` are the inlined calls there,
    /// innermost first, then the function they were inlined into.
    fn location(&mut self, pid: u32, frames: &[Frame]) -> u64 {
        let address = frames[0].address;
        let python = (frames[0].language == Language::Python).then(|| {
            let frame = &frames[0];
            (
                frame.function.clone().unwrap_or_default(),
                frame.file.clone(),
                frame.line,
            )
        });
        let known = match &python {
            Some(key) => self.python_locations.get(key),
            None => self.locations.get(&(pid, address)),
        };
        if let Some(&id) = known {
            return id;
        }
        let mapping_id = frames[0]
            .module
            .as_ref()
            .and_then(|module| self.mappings.get(module))
            .copied()
            .unwrap_or(0);
        let line = frames
            .iter()
            .filter_map(|frame| {
                let function = frame.function.as_deref()?;
                Some(Line {
                    function_id: self.function(
                        function,
                        frame.file.as_deref(),
                        frame.language == Language::Python,
                    ),
                    line: frame.line.map_or(0, i64::from),
                    column: 0,
                })
            })
            .collect();
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(Location {
            id,
            mapping_id,
            address,
            line,
            is_folded: false,
        });
        match python {
            Some(key) => self.python_locations.insert(key, id),
            None => self.locations.insert((pid, address), id),
        };
        id
    }

    /// A function by name and file. A Python function has no system
    /// name: `go tool pprof` demangles a function whose system name is its
    /// name, and takes `<module>` for a C++ template argument list to cut
    /// (leaving `<unknown>`).
    fn function(&mut self, name: &str, file: Option<&str>, python: bool) -> u64 {
        let key = (name.to_owned(), file.map(str::to_owned));
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let function = Function {
            id,
            name: self.string(name),
            system_name: self.string(if python { "" } else { name }),
            filename: self.string(file.unwrap_or("")),
            start_line: 0,
        };
        self.profile.function.push(function);
        self.functions.insert(key, id);
        id
    }
}

/// Splits a stack's frames (innermost first) into runs that share an
/// address: one location each. Python frames (no address) are one each.
fn stack_locations(frames: &[Frame]) -> impl Iterator<Item = &[Frame]> {
    frames.chunk_by(|a, b| {
        a.address == b.address && a.language == Language::Native && b.language == Language::Native
    })
}

#[derive(Clone, PartialEq, prost::Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    time_nanos: i64,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
    #[prost(int64, repeated, tag = "13")]
    comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    default_sample_type: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ValueType {
    /// profile.proto's `type`.
    #[prost(int64, tag = "1")]
    kind: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Sample {
    /// Innermost first.
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Label {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
    #[prost(int64, tag = "3")]
    num: i64,
    #[prost(int64, tag = "4")]
    num_unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Mapping {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    memory_start: u64,
    #[prost(uint64, tag = "3")]
    memory_limit: u64,
    #[prost(uint64, tag = "4")]
    file_offset: u64,
    #[prost(int64, tag = "5")]
    filename: i64,
    #[prost(int64, tag = "6")]
    build_id: i64,
    #[prost(bool, tag = "7")]
    has_functions: bool,
    #[prost(bool, tag = "8")]
    has_filenames: bool,
    #[prost(bool, tag = "9")]
    has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    has_inline_frames: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    mapping_id: u64,
    #[prost(uint64, tag = "3")]
    address: u64,
    /// Inlined calls first; the last line is the caller they were inlined
    /// into.
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
    #[prost(bool, tag = "5")]
    is_folded: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
    #[prost(int64, tag = "3")]
    column: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
    #[prost(int64, tag = "4")]
    filename: i64,
    #[prost(int64, tag = "5")]
    start_line: i64,
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;
    use crate::model::fixtures::python_frame;
    use crate::report::fixtures::sample_report;

    fn string(profile: &Profile, index: i64) -> &str {
        &profile.string_table[index as usize]
    }

    #[test]
    fn gzip_of_a_profile_that_decodes_back() {
        let report = sample_report(10);
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(&render(&report)[..])
            .read_to_end(&mut bytes)
            .unwrap();
        assert_eq!(Profile::decode(&bytes[..]).unwrap(), build(&report));
    }

    #[test]
    fn samples_values_locations_and_mappings() {
        let report = sample_report(10);
        let profile = build(&report);
        let types: Vec<(&str, &str)> = profile
            .sample_type
            .iter()
            .map(|t| (string(&profile, t.kind), string(&profile, t.unit)))
            .collect();
        assert_eq!(
            types,
            [
                ("inuse_space", "bytes"),
                ("inuse_objects", "count"),
                ("alloc_space", "bytes"),
                ("alloc_objects", "count")
            ]
        );
        assert_eq!(string(&profile, profile.default_sample_type), "inuse_space");
        assert_eq!(profile.sample.len(), 3);
        let first = &profile.sample[0];
        assert_eq!(first.value, [4 * 65536, 4096, 8 * 65536, 8192]);
        assert_eq!(first.location_id.len(), 2, "grow_1 then main");
        let leaf = &profile.location[first.location_id[0] as usize - 1];
        let function = &profile.function[leaf.line[0].function_id as usize - 1];
        assert_eq!(string(&profile, function.name), "grow_1");
        assert_eq!(string(&profile, function.filename), "leak.c");
        assert_eq!(leaf.line[0].line, 12);
        let mapping = &profile.mapping[leaf.mapping_id as usize - 1];
        assert_eq!(string(&profile, mapping.filename), "/opt/app/bin/server");
        assert_eq!(string(&profile, mapping.build_id), "0123abcd");
        assert!(mapping.memory_start <= leaf.address && leaf.address < mapping.memory_limit);
        let pid_label = &first.label[0];
        assert_eq!(
            (string(&profile, pid_label.key), pid_label.num),
            ("pid", 10)
        );
        assert!(
            profile
                .comment
                .iter()
                .any(|&c| string(&profile, c) == "dropped events: stack_table_full=3")
        );
    }

    #[test]
    fn inlined_frames_share_one_location() {
        let inlined = |function: &str| Frame {
            address: 0x5000,
            function: Some(function.to_owned()),
            ..Frame::default()
        };
        let frames = [inlined("inner"), inlined("outer"), Frame::default()];
        let runs: Vec<usize> = stack_locations(&frames).map(<[Frame]>::len).collect();
        assert_eq!(runs, [2, 1]);
    }

    #[test]
    fn python_frames_are_one_location_each_by_function_file_and_line() {
        let python = |function: &str, line: u32| python_frame(function, "app.py", line);
        let frames = [
            python("leak", 3),
            python("caller", 7),
            python("<module>", 9),
        ];
        assert_eq!(stack_locations(&frames).count(), 3);
        let mut builder = Builder::default();
        let ids: Vec<u64> = stack_locations(&frames)
            .map(|run| builder.location(1, run))
            .collect();
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(
            builder.location(1, &[python("caller", 7)]),
            2,
            "the same line again"
        );
        assert_eq!(
            builder.location(1, &[python("caller", 8)]),
            4,
            "another line"
        );
        // `go tool pprof` would cut `<module>` as a C++ template argument
        // list from a function whose system name is its name.
        let module = &builder.profile.function[2];
        let text = |index: i64| builder.profile.string_table[index as usize].as_str();
        assert_eq!(
            (text(module.name), text(module.system_name)),
            ("<module>", "")
        );
        let native = builder.function("std::vector<int>::push_back", None, false);
        let native = &builder.profile.function[native as usize - 1];
        assert_eq!(native.system_name, native.name, "native: as before");
    }
}
