//! The names userspace finds the eBPF object's maps, programs and globals
//! by (`tracer_ebpf::{map, program, global}`) exist in the object that
//! tracer embeds. The kernel side names them by its statics and functions,
//! so a rename on either side fails here, not at attach time. Parses the
//! object only: no root, no kernel.

use std::collections::BTreeSet;

use aya_obj::Object;
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use tracer_ebpf::{counted, global, map, program};

/// The object tracer embeds (`tracer/build.rs` builds it).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));

/// What no program constant names: the uprobe session programs, which
/// userspace finds by this suffix.
const SESSION_SUFFIX: &str = "_session";

fn parsed() -> Object {
    Object::parse(EBPF_OBJECT).expect("the embedded eBPF object parses")
}

fn missing<'a>(names: &[&'a str], present: impl Fn(&str) -> bool) -> Vec<&'a str> {
    names
        .iter()
        .copied()
        .filter(|name| !present(name))
        .collect()
}

#[test]
fn every_map_name_is_a_map_of_the_object() {
    let object = parsed();
    let missing = missing(map::ALL, |name| object.maps.contains_key(name));
    assert!(
        missing.is_empty(),
        "no such maps in the object: {missing:?}"
    );
}

#[test]
fn every_program_name_is_a_program_of_the_object() {
    let object = parsed();
    let missing = missing(program::ALL, |name| object.programs.contains_key(name));
    assert!(
        missing.is_empty(),
        "no such programs in the object: {missing:?}"
    );
}

#[test]
fn every_program_of_the_object_has_a_name() {
    let named: BTreeSet<&str> = program::ALL.iter().copied().collect();
    let unnamed: Vec<String> = parsed()
        .programs
        .into_keys()
        .filter(|name| !name.ends_with(SESSION_SUFFIX) && !named.contains(name.as_str()))
        .collect();
    assert!(
        unnamed.is_empty(),
        "programs without a constant in tracer_ebpf::program: {unnamed:?}"
    );
}

#[test]
fn every_session_program_has_its_entry_program() {
    let object = parsed();
    let sessions: Vec<&String> = object
        .programs
        .keys()
        .filter(|name| name.ends_with(SESSION_SUFFIX))
        .collect();
    assert!(!sessions.is_empty(), "the object has no session programs");
    for session in sessions {
        let entry = format!("{}_enter", session.trim_end_matches(SESSION_SUFFIX));
        assert!(
            program::ALL.contains(&entry.as_str()),
            "{session} has no entry program {entry} in tracer_ebpf::program"
        );
    }
}

/// The cost line's hits and program time come from each program's own
/// count (`tracer_ebpf::counted`): a program left out of it would run
/// uncounted. The floor programs are empty on purpose.
#[test]
fn every_program_but_the_floors_counts_its_runs() {
    let programs: BTreeSet<String> = parsed().programs.into_keys().collect();
    let counted: BTreeSet<String> = counted::COUNTED_NAMES
        .iter()
        .map(|name| (*name).to_owned())
        .collect();
    let floors: BTreeSet<String> = [program::FLOOR_ENTER, program::FLOOR_RETURN]
        .map(str::to_owned)
        .into();
    let expected: BTreeSet<String> = programs.difference(&floors).cloned().collect();
    assert_eq!(counted, expected, "counted programs vs the object's");
}

/// aya's `override_global` patches a symbol in the object's data sections.
#[test]
fn every_global_name_is_a_global_of_the_object() {
    let file = object::File::parse(EBPF_OBJECT).expect("the embedded eBPF object parses");
    let globals: BTreeSet<&str> = file
        .symbols()
        .filter(|symbol| {
            symbol
                .section_index()
                .and_then(|index| file.section_by_index(index).ok())
                .and_then(|section| section.name().ok().map(str::to_owned))
                .is_some_and(|section| {
                    [".rodata", ".data", ".bss"]
                        .iter()
                        .any(|prefix| section.starts_with(prefix))
                })
        })
        .filter_map(|symbol| symbol.name().ok())
        .collect();
    let missing = missing(global::ALL, |name| globals.contains(name));
    assert!(
        missing.is_empty(),
        "no such globals in the object: {missing:?}"
    );
}
