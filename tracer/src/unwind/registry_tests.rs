//! The registry on this test process's own mappings and on fixtures:
//! placement, bias, sharing by build id, frame-pointer objects, a row
//! space too small, and the mapping list's capacity.
use std::path::{Path, PathBuf};

use super::*;
use crate::procfs;

const ROOMY: UnwindMapSizes = UnwindMapSizes {
    rows: 1 << 24,
    tables: 4096,
};
const WAIT: Duration = Duration::from_secs(60);

fn fixture(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/fixtures")
        .join(name);
    std::fs::canonicalize(&path)
        .unwrap_or_else(|_| panic!("{}: run `cargo xtask setup`", path.display()))
}

/// Mappings of `path` that no process has: `process_mappings` opens
/// files through /proc/PID/root, so this process's pid reaches any path.
fn fake_mapping(path: &Path, start: u64, executable: bool) -> Mapping {
    Mapping {
        start,
        end: start + 0x1000,
        file_offset: 0x1000,
        executable,
        path: path.to_owned(),
    }
}

fn entries(mappings: &ProcessMappings) -> &[UnwindMapping] {
    &mappings.mappings.mappings[..mappings.mappings.count as usize]
}

#[test]
fn own_libc_gets_its_table_and_bias() {
    let pid = std::process::id();
    let maps = procfs::read_maps(pid).expect("own maps");
    let mut tables = UnwindTables::new(ROOMY, false);
    let first = tables.process_mappings(pid, &maps);
    assert!(first.pending > 0, "nothing queued");
    assert!(
        entries(&first)
            .iter()
            .all(|m| m.unwind != mapping_unwind::TABLE)
    );
    assert!(tables.wait_for_builds(WAIT), "builds did not finish");
    assert_eq!(tables.processes_to_refresh(), [pid]);

    let mappings = tables.process_mappings(pid, &maps);
    assert_eq!((mappings.pending, mappings.left_out), (0, 0));
    assert!(tables.processes_to_refresh().is_empty());
    let list = entries(&mappings);
    assert!(
        list.windows(2).all(|pair| pair[0].end <= pair[1].start),
        "{list:x?}"
    );
    // Where this process calls malloc, the table's numbering says the
    // object address that libc's symbols give.
    let malloc = libc::malloc as *const () as u64;
    let entry = list
        .iter()
        .find(|m| (m.start..m.end).contains(&malloc))
        .expect("libc's code is listed");
    assert_eq!(entry.unwind, mapping_unwind::TABLE);
    let libc_path = maps
        .iter()
        .find(|m| m.contains(malloc))
        .expect("mapped")
        .path
        .clone();
    let object = ObjectInfo::read(&File::open(&libc_path).expect("libc")).expect("an ELF");
    let symbol = object.function_named("malloc").expect("malloc");
    assert_eq!(malloc - entry.bias, symbol.address);

    let ready = tables.take_ready();
    let libc_table = ready
        .iter()
        .find(|ready| ready.id == entry.table)
        .expect("libc's table");
    let built = tables::build_rows(&FrameSections::of(&object));
    assert_eq!(libc_table.rows, built.rows);
    assert_eq!(libc_table.table.row_count as usize, built.rows.len());
    assert!(tables.take_ready().is_empty(), "handed out twice");
    // Tables lie one after the other in the row space.
    let mut placed: Vec<UnwindTable> = ready.iter().map(|ready| ready.table).collect();
    placed.sort_by_key(|table| table.first_row);
    assert!(
        placed
            .windows(2)
            .all(|pair| pair[0].first_row + pair[0].row_count == pair[1].first_row)
    );

    let summary = tables.summary();
    assert_eq!(summary.ready as usize, ready.len());
    assert_eq!(summary.pending, 0);
    let line = summary.to_string();
    assert!(
        line.starts_with(&format!("unwind tables: {} ready", ready.len())),
        "{line}"
    );
    let info = tables
        .tables()
        .iter()
        .find(|info| info.path == libc_path)
        .expect("libc's entry");
    let line = info.to_string();
    assert!(
        line.contains(&format!("{} rows", built.rows.len())),
        "{line}"
    );
    assert!(line.contains("built in"), "{line}");
}

#[test]
fn frame_pointer_objects_get_no_table_when_trusted() {
    let pid = std::process::id();
    let (with, without) = (fixture("leaky"), fixture("nested_nofp"));
    let maps = [
        fake_mapping(&with, 0x10000, true),
        fake_mapping(&without, 0x20000, true),
    ];
    let mut tables = UnwindTables::new(ROOMY, true);
    tables.process_mappings(pid, &maps);
    assert!(tables.wait_for_builds(WAIT));
    assert_eq!(tables.processes_to_refresh(), [pid]);
    tables.forget_process(pid);
    assert!(tables.processes_to_refresh().is_empty());
    let mappings = tables.process_mappings(pid, &maps);
    let list = entries(&mappings);
    assert_eq!(list.len(), 2, "{list:x?}");
    assert_eq!(list[0].unwind, mapping_unwind::FRAME_POINTERS);
    assert_eq!(list[1].unwind, mapping_unwind::TABLE);
    assert_eq!(tables.tables()[0].state, TableState::FramePointers);
    let summary = tables.summary();
    assert_eq!((summary.ready, summary.frame_pointers), (1, 1), "{summary}");

    // Untrusted, both get one.
    let mut tables = UnwindTables::new(ROOMY, false);
    tables.process_mappings(pid, &maps);
    assert!(tables.wait_for_builds(WAIT));
    let mappings = tables.process_mappings(pid, &maps);
    assert!(
        entries(&mappings)
            .iter()
            .all(|m| m.unwind == mapping_unwind::TABLE)
    );
}

#[test]
fn the_same_build_in_two_files_is_built_once() {
    let pid = std::process::id();
    let original = fixture("nested_nofp");
    let copy = std::env::temp_dir().join(format!("tracer-registry-copy-{pid}"));
    std::fs::copy(&original, &copy).expect("a copy");
    let maps = [
        fake_mapping(&original, 0x10000, true),
        fake_mapping(&copy, 0x30000, true),
    ];
    let mut tables = UnwindTables::new(ROOMY, false);
    tables.process_mappings(pid, &maps);
    assert!(tables.wait_for_builds(WAIT));
    let mappings = tables.process_mappings(pid, &maps);
    std::fs::remove_file(&copy).expect("removed");
    let list = entries(&mappings);
    assert_eq!(list.len(), 2);
    assert_eq!(list[0].unwind, mapping_unwind::TABLE);
    assert_eq!(list[1].unwind, mapping_unwind::TABLE);
    assert_eq!(list[0].table, list[1].table);
    assert_eq!(tables.take_ready().len(), 1);
    assert_eq!(tables.tables().len(), 2);
    assert_eq!(tables.summary().ready, 1);
    assert!(tables.tables()[1].to_string().contains("same build"));
}

#[test]
fn a_table_that_does_not_fit_is_counted_and_walked_by_frame_pointers() {
    let pid = std::process::id();
    let object = fixture("nested_nofp");
    let maps = [fake_mapping(&object, 0x10000, true)];
    let mut tables = UnwindTables::new(
        UnwindMapSizes {
            rows: 4,
            tables: 16,
        },
        false,
    );
    tables.process_mappings(pid, &maps);
    assert!(tables.wait_for_builds(WAIT));
    let mappings = tables.process_mappings(pid, &maps);
    assert_eq!(entries(&mappings)[0].unwind, mapping_unwind::FRAME_POINTERS);
    assert!(tables.take_ready().is_empty());
    let summary = tables.summary();
    assert_eq!(
        (summary.ready, summary.no_room, summary.rows_used),
        (0, 1, 0)
    );
    assert!(
        summary.to_string().ends_with(", 1 did not fit"),
        "{summary}"
    );
    let line = tables.tables()[0].to_string();
    assert!(line.contains("no room left"), "{line}");
}

#[test]
fn mappings_merge_when_adjacent_and_stop_at_capacity() {
    let pid = std::process::id();
    // Not an ELF object: frame pointers for every mapping of it.
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let mut maps: Vec<Mapping> = (0..MAX_UNWIND_MAPPINGS as u64 + 10)
        .map(|index| fake_mapping(&text, 0x100000 + index * 0x3000, true))
        .collect();
    // Adjacent to the first: merged with it. Not executable: left out.
    maps.push(fake_mapping(&text, 0x101000, true));
    maps.push(fake_mapping(&text, 0x50000, false));
    // Gone: counted, and walked by frame pointers.
    maps.push(fake_mapping(
        Path::new("/nonexistent/libgone.so"),
        1 << 32,
        true,
    ));
    let mut tables = UnwindTables::new(ROOMY, false);
    tables.process_mappings(pid, &maps);
    assert!(tables.wait_for_builds(WAIT));
    assert_eq!(tables.tables()[0].state, TableState::NotAnObject);
    let mappings = tables.process_mappings(pid, &maps);
    let list = entries(&mappings);
    assert_eq!(list.len(), MAX_UNWIND_MAPPINGS);
    assert_eq!((mappings.left_out, mappings.unreadable), (11, 1));
    assert_eq!((list[0].start, list[0].end), (0x100000, 0x102000));
    assert!(
        list.iter()
            .all(|m| m.unwind == mapping_unwind::FRAME_POINTERS)
    );
}

#[test]
fn lld_executable_bias_is_its_load_base() {
    // rust_leak is linked by lld: its executable segment's addresses are a
    // page beyond its file offsets (p_vaddr != p_offset), so the bias is
    // not the mapping's start minus its offset.
    use std::io::BufRead as _;
    use std::process::{Command, Stdio};
    let path = fixture("rust_leak");
    let mut child = Command::new(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("rust_leak starts");
    let mut ready = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut ready)
        .expect("rust_leak answers");
    let pid = child.id();
    let maps = procfs::read_maps(pid).expect("its maps");
    let mut tables = UnwindTables::new(ROOMY, false);
    tables.process_mappings(pid, &maps);
    assert!(tables.wait_for_builds(WAIT));
    let mappings = tables.process_mappings(pid, &maps);
    child.kill().expect("rust_leak stops");
    child.wait().expect("rust_leak is reaped");

    let own: Vec<&Mapping> = maps.iter().filter(|mapping| mapping.path == path).collect();
    let load_base = own
        .iter()
        .find(|mapping| mapping.file_offset == 0)
        .expect("its first page is mapped")
        .start;
    let text = own
        .iter()
        .find(|mapping| mapping.executable)
        .expect("its code");
    let entry = entries(&mappings)
        .iter()
        .find(|entry| entry.start == text.start)
        .expect("listed");
    assert_eq!(entry.unwind, mapping_unwind::TABLE);
    assert_eq!(entry.bias, load_base);
    assert_ne!(
        entry.bias,
        text.start - text.file_offset,
        "no longer an lld layout"
    );
}
