//! What the fixtures allocate, as their C sources define it, so that a
//! size is written once for every test that checks it.

use super::{Live, Report, field};

/// `malloc` size in leaky.c's `leak_here`.
pub const LEAK_SIZE_BYTES: i64 = 1337;
/// `count` blocks leaked in leaky.c's `leak_here`.
pub fn leaked(count: i64) -> Live {
    Live::blocks(count, LEAK_SIZE_BYTES)
}

/// `malloc` size in leaky.c's `thread_leak`.
pub const THREAD_LEAK_SIZE_BYTES: i64 = 2048;
/// Blocks leaky.c allocates before it is ready (and frees on `free_pre`).
pub const PREALLOC_COUNT: i64 = 100;
/// Size of each of those blocks.
pub const PREALLOC_SIZE_BYTES: i64 = 64;
/// Allocator calls that return a block in one `churn` round of leaky.c:
/// three in churn_realloc, one in each of the other seven functions.
pub const CHURN_ALLOCS_PER_ROUND: i64 = 10;
/// Block size of leaky.c's `churn_keep` (`calloc(4, 100)`), kept every round.
pub const CHURN_KEEP_BYTES: i64 = 400;
/// Block size of leaky.c's `churn_memalign`, kept every second round.
pub const CHURN_MEMALIGN_BYTES: i64 = 128;
/// `malloc` size in nested_nofp.c's `inner_static`.
pub const NESTED_LEAK_BYTES: i64 = 777;
/// `malloc` size at the bottom of nested_nofp.c's `deep_recurse`.
pub const DEEP_LEAK_BYTES: i64 = 999;
/// `malloc` size in nofp_plugin.c's `plugin_inner`.
pub const PLUGIN_LEAK_BYTES: i64 = 555;
/// `malloc` size in reentrant.c's `thread_alloc` and `child_alloc`.
pub const REENTRANT_BLOCK_BYTES: i64 = 1000;

/// The heap leaky holds after `churn`, from its answer: churn_keep's
/// blocks and every second churn_memalign block.
pub fn churn_held(answer: &str) -> Live {
    let keep_bytes = field(answer, "churn_keep");
    let memalign_bytes = field(answer, "churn_memalign");
    Live {
        bytes: keep_bytes + memalign_bytes,
        allocs: keep_bytes / CHURN_KEEP_BYTES + memalign_bytes / CHURN_MEMALIGN_BYTES,
    }
}

/// The block glibc's pthread_create keeps for each new thread (its
/// thread-local storage vector, from allocate_dtv): one per thread, of
/// `(TLS modules + DTV_SURPLUS 14 + 2) * 16` bytes, the TLS modules being
/// the objects with a PT_TLS segment among the first target's program and
/// the libraries `ldd` lists for it.
pub fn thread_dtvs(report: &Report, threads: i64) -> Live {
    let program = report.targets()[0]["command"]
        .as_str()
        .and_then(|command| command.split_whitespace().next())
        .unwrap_or_else(|| panic!("no command line in the report:\n{}", report.json))
        .to_owned();
    let modules = loaded_objects(&program)
        .iter()
        .filter(|object| has_tls_segment(object))
        .count();
    let vector_bytes = (modules as i64 + 14 + 2) * 16;
    let dtvs = report.heap_live_with("allocate_dtv");
    assert_eq!(
        dtvs,
        Live::blocks(threads, vector_bytes),
        "one TLS vector of {modules} modules per thread:\n{report}"
    );
    dtvs
}

/// `program` and the libraries the dynamic loader maps for it.
fn loaded_objects(program: &str) -> Vec<std::path::PathBuf> {
    let output = std::process::Command::new("ldd")
        .arg(program)
        .output()
        .unwrap_or_else(|error| panic!("ldd {program}: {error}"));
    let listing = String::from_utf8_lossy(&output.stdout);
    let libraries = listing.lines().filter_map(|line| {
        let path = match line.split_once("=>") {
            Some((_, after)) => after.split_whitespace().next()?,
            None => line.split_whitespace().next()?,
        };
        path.starts_with('/').then(|| path.into())
    });
    std::iter::once(program.into()).chain(libraries).collect()
}

/// Whether the ELF file at `path` has a PT_TLS program header.
fn has_tls_segment(path: &std::path::Path) -> bool {
    const PT_TLS: u32 = 7;
    let elf = std::fs::read(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let read = |at: usize, width: usize| -> u64 {
        let mut bytes = [0u8; 8];
        bytes[..width].copy_from_slice(&elf[at..at + width]);
        u64::from_le_bytes(bytes)
    };
    assert!(
        elf.starts_with(b"\x7fELF\x02\x01"),
        "{} is not a 64-bit LE ELF",
        path.display()
    );
    let (table, entry, count) = (
        read(0x20, 8) as usize,
        read(0x36, 2) as usize,
        read(0x38, 2),
    );
    (0..count as usize).any(|index| read(table + index * entry, 4) as u32 == PT_TLS)
}

/// glibc's `BUFSIZ`, the largest buffer `_IO_file_doallocate` gives a
/// stream.
const GLIBC_BUFSIZ: i64 = 8192;

/// The buffer glibc gives stdout (on its first write) in a process whose
/// stdout is a pipe, as the harness's are: one block of the pipe's
/// `st_blksize`, at most `BUFSIZ`.
pub fn stdout_pipe_buffer() -> Live {
    let mut ends = [0; 2];
    // SAFETY: pipe writes two descriptors into `ends`.
    assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0, "pipe(2)");
    // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `ends[1]` is open; fstat writes one stat into `stat`.
    let fstat = unsafe { libc::fstat(ends[1], &mut stat) };
    // SAFETY: both ends are ours and closed once.
    unsafe {
        libc::close(ends[0]);
        libc::close(ends[1]);
    }
    assert_eq!(fstat, 0, "fstat on a pipe");
    let block = i64::from(stat.st_blksize as i32);
    Live::blocks(
        1,
        if block > 0 {
            block.min(GLIBC_BUFSIZ)
        } else {
            GLIBC_BUFSIZ
        },
    )
}

/// The GNU build id of the ELF file at `path`, as `readelf -n` prints it.
pub fn build_id(path: &std::path::Path) -> String {
    let output = std::process::Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .expect("readelf runs");
    let notes = String::from_utf8_lossy(&output.stdout);
    notes
        .lines()
        .find_map(|line| line.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id in {}:\n{notes}", path.display()))
        .to_owned()
}

/// The ELF address of the instruction after `function`'s call to
/// `callee` (through the PLT) in the file at `path`, as `objdump -d`
/// disassembles it: the return address a stack of that call holds.
pub fn return_address(path: &std::path::Path, function: &str, callee: &str) -> u64 {
    let output = std::process::Command::new("objdump")
        .arg(format!("--disassemble={function}"))
        .arg(path)
        .output()
        .expect("objdump runs");
    let listing = String::from_utf8_lossy(&output.stdout);
    let address = |line: &str| {
        u64::from_str_radix(line.trim().split(':').next().unwrap_or(""), 16)
            .unwrap_or_else(|_| panic!("no address in objdump's line {line:?}"))
    };
    let mut lines = listing.lines();
    lines
        .by_ref()
        .find(|line| line.contains("call") && line.contains(&format!("<{callee}@plt>")))
        .unwrap_or_else(|| panic!("{function} calls no {callee} in:\n{listing}"));
    address(lines.next().expect("an instruction after the call"))
}
