//! Spawn mode (`tracer record -- CMD ARGS`): starts the command stopped
//! once the dynamic loader has mapped its libraries and before it runs any
//! of their constructors, so the probes are in place for its first
//! allocation.
//!
//! How: fork; the child stops itself (SIGSTOP) before exec; tracer puts the
//! `spawn_gate` uprobe, scoped to the child, on the dynamic loader's
//! `_dl_debug_state` (which ld.so calls for debuggers whenever its list of
//! objects changes) and lets the child exec. The gate stops the child each
//! time that list is complete again: at startup, after every dlopen and in
//! every image the command execs later (a script's interpreter, a wrapper
//! that execs the real program), before any constructor of the new objects
//! runs. Tracer hooks what was mapped and lets the child go on
//! (`Collector`). A static executable has no loader: the gate goes on its
//! entry point and is removed after the first stop.
//!
//! A script (`#!`) is started as the kernel starts it, through its
//! interpreter: the gate goes on the interpreter's loader.
//!
//! Long: spawn mode from fork to the loader's gate, and the end of a spawned
//! command.
use std::{
    ffi::{CString, OsString},
    fs,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use object::Object as _;

use crate::attach::{
    Probes, load::program, nonzero_pid, sites::prologue::file_offset, sites::symbols::SiteFile,
};
use crate::error::{ExitCode, fatal};

const GATE_PROGRAM: &str = tracer_ebpf::program::SPAWN_GATE;
const GATE_TIMEOUT: Duration = Duration::from_secs(10);

/// A child started by tracer, stopped at the gate.
#[derive(Debug)]
pub struct Spawned {
    pub pid: u32,
    /// The gate stays (on the loader): the child stops again whenever the
    /// loader mapped more objects, until tracer resumes it.
    pub gate_stays: bool,
}

/// Where the gate goes.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Gate {
    /// The file (the loader, or a static executable), as named.
    pub(super) path: PathBuf,
    /// The same file as tracer read it, which the gate is attached by.
    pub(super) file: SiteFile,
    /// File offset of the probed instruction.
    pub(super) offset: u64,
    /// Distance from the probed function to `_r_debug.r_state` (0: stop
    /// at every hit).
    pub(super) cookie: u64,
}

/// Offset of `r_state` in glibc's `struct r_debug` on 64-bit targets
/// (`int r_version; struct link_map *r_map; ElfW(Addr) r_brk; enum r_state`).
const R_STATE_OFFSET: u64 = 24;
/// How many `#!` interpreters deep a script may go, as Linux allows.
const MAX_INTERPRETER_DEPTH: usize = 4;

/// Starts `command` and returns once it is stopped at the gate. With
/// `end_with_tracer`, the command gets SIGTERM should tracer die without
/// stopping it (never a silent orphan).
pub fn spawn_stopped(
    probes: &mut Probes,
    command: &[OsString],
    end_with_tracer: bool,
) -> Result<Spawned> {
    let (name, _) = command
        .split_first()
        .ok_or_else(|| fatal(ExitCode::Usage, "no command given after --"))?;
    let program_path = resolve_program(Path::new(name))?;
    let gate_site = gate_for(&program_path)?;
    let gate_stays = gate_site.cookie != 0;
    let arguments: Vec<CString> = command
        .iter()
        .map(|argument| CString::new(argument.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| fatal(ExitCode::SpawnFailed, "an argument contains a NUL byte"))?;
    let c_path = CString::new(program_path.as_os_str().as_bytes()).map_err(|_| {
        fatal(
            ExitCode::SpawnFailed,
            "the program path contains a NUL byte",
        )
    })?;

    let (pid, error_pipe) = fork_stopped(&c_path, &arguments, end_with_tracer)?;
    let spawn_error = |message: String| fatal(ExitCode::SpawnFailed, message);
    let gate = program(&mut probes.ebpf, GATE_PROGRAM)?;
    if gate.fd().is_err() {
        gate.load()
            .map_err(|error| crate::attach::load::load_error(error.into()))
            .context("could not load the spawn gate")?;
    }
    let link = gate
        .attach(
            UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(gate_site.offset),
                cookie: Some(gate_site.cookie),
            },
            gate_site.file.attach_path()?,
            UProbeScope::OneProcess(nonzero_pid(pid)?),
        )
        .with_context(|| {
            format!(
                "could not attach the spawn gate to {}",
                gate_site.path.display()
            )
        })?;
    // SAFETY: plain syscalls on our own child and pipe.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    if let Some(errno) = read_exec_error(error_pipe) {
        kill(pid);
        return Err(spawn_error(format!(
            "could not start {}: {}",
            program_path.display(),
            std::io::Error::from_raw_os_error(errno)
        )));
    }
    let stopped = wait_for_stop(pid);
    if !gate_stays || stopped.is_err() {
        let gate = program(&mut probes.ebpf, GATE_PROGRAM)?;
        gate.detach(link)
            .context("could not detach the spawn gate")?;
    }
    stopped.map_err(|error| {
        kill(pid);
        spawn_error(format!("{} {error}", program_path.display()))
    })?;
    Ok(Spawned { pid, gate_stays })
}

/// What a spawned child is doing, as waitpid tells its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildState {
    Running,
    /// Stopped by this signal (SIGSTOP: the gate).
    Stopped(i32),
    /// Exited (reaped): its exit code, or the signal that killed it.
    Exited(ExitStatus),
}

/// How a spawned child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitStatus::Code(code) => write!(formatter, "exit code {code}"),
            ExitStatus::Signal(signal) => write!(formatter, "killed by {}", signal_name(*signal)),
        }
    }
}

/// SIGINT, SIGTERM, ... by number.
pub fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".to_owned(),
        libc::SIGTERM => "SIGTERM".to_owned(),
        libc::SIGKILL => "SIGKILL".to_owned(),
        libc::SIGSEGV => "SIGSEGV".to_owned(),
        libc::SIGABRT => "SIGABRT".to_owned(),
        libc::SIGHUP => "SIGHUP".to_owned(),
        libc::SIGSTOP => "SIGSTOP".to_owned(),
        other => format!("signal {other}"),
    }
}

/// Whether the child stopped, exited or runs, without blocking; reaps it
/// once it has exited.
pub fn poll(pid: u32) -> ChildState {
    let mut status = 0;
    // SAFETY: waitpid on our own child with a valid status pointer.
    let result = unsafe { libc::waitpid(pid as i32, &mut status, libc::WUNTRACED | libc::WNOHANG) };
    if result == 0 {
        return ChildState::Running;
    }
    if result < 0 {
        // Reaped already (or not ours): gone either way.
        return ChildState::Exited(ExitStatus::Code(-1));
    }
    if libc::WIFSTOPPED(status) {
        ChildState::Stopped(libc::WSTOPSIG(status))
    } else if libc::WIFSIGNALED(status) {
        ChildState::Exited(ExitStatus::Signal(libc::WTERMSIG(status)))
    } else {
        ChildState::Exited(ExitStatus::Code(libc::WEXITSTATUS(status)))
    }
}

/// Sends `signal` to the child (then SIGCONT, should the gate hold it) and
/// waits up to `patience` for it to exit; SIGKILL after that. Returns how it
/// ended and whether it had to be killed.
pub fn stop_and_wait(pid: u32, signal: i32, patience: Duration) -> (ExitStatus, bool) {
    // SAFETY: signals our own child.
    unsafe {
        libc::kill(pid as i32, signal);
        libc::kill(pid as i32, libc::SIGCONT);
    }
    let deadline = Instant::now() + patience;
    loop {
        match poll(pid) {
            ChildState::Exited(status) => return (status, false),
            ChildState::Stopped(_) => resume(pid),
            ChildState::Running => {}
        }
        if Instant::now() > deadline {
            kill(pid);
            return (ExitStatus::Signal(libc::SIGKILL), true);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Lets a stopped child run.
pub fn resume(pid: u32) {
    // SAFETY: signals our own child.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
}

/// Looks a program up like a shell does: a name with a slash is a path,
/// anything else is searched in $PATH.
fn resolve_program(name: &Path) -> Result<PathBuf> {
    let not_found = || {
        fatal(
            ExitCode::SpawnFailed,
            format!(
                "could not start {}: no such file or not executable",
                name.display()
            ),
        )
    };
    let executable = |path: &Path| {
        use std::os::unix::fs::PermissionsExt as _;
        fs::metadata(path)
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if name.as_os_str().as_bytes().contains(&b'/') {
        return if executable(name) {
            Ok(name.to_path_buf())
        } else {
            Err(not_found())
        };
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&search)
        .map(|directory| directory.join(name))
        .find(|candidate| executable(candidate))
        .ok_or_else(not_found)
}

/// Where the gate goes for `program`: on the loader named by its ELF
/// interpreter (`PT_INTERP`), else on its entry point. A script is looked
/// at through its `#!` interpreter, as the kernel starts it.
fn gate_for(program: &Path) -> Result<Gate> {
    let executable = elf_behind(program)?;
    let (opened, data) = read(&executable)?;
    let file = object::File::parse(&*data).map_err(|_| {
        fatal(
            ExitCode::SpawnFailed,
            format!("{} is not an ELF executable", executable.display()),
        )
    })?;
    if let Some(loader) = interpreter(&data)
        && let Ok((loader_file, loader_data)) = read(&loader)
        && let Some(gate) = loader_gate(&loader, loader_file, &loader_data)
    {
        return Ok(gate);
    }
    let offset = file_offset(&file, file.entry()).ok_or_else(|| {
        fatal(
            ExitCode::SpawnFailed,
            format!(
                "{}: its entry point is outside every loadable segment",
                executable.display()
            ),
        )
    })?;
    let failed = |error: std::io::Error| {
        fatal(
            ExitCode::SpawnFailed,
            format!("could not read {}: {error}", executable.display()),
        )
    };
    Ok(Gate {
        file: SiteFile::of(opened, &executable).map_err(failed)?,
        path: executable,
        offset,
        cookie: 0,
    })
}

/// The file at `path`, and its map (only its headers are read: a program
/// is never read whole into memory), opened without waiting on a FIFO.
fn read(path: &Path) -> Result<(fs::File, memmap2::Mmap)> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let failed = |error: std::io::Error| {
        fatal(
            ExitCode::SpawnFailed,
            format!("could not read {}: {error}", path.display()),
        )
    };
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(failed)?;
    if !file.metadata().map_err(failed)?.is_file() {
        return Err(failed(std::io::Error::other("not a regular file")));
    }
    // SAFETY: only read; a truncated file reads as zeros past its end
    // (`target_files::sigbus`).
    let data = unsafe { memmap2::Mmap::map(&file) }.map_err(failed)?;
    Ok((file, data))
}

/// The ELF file the kernel runs for `program`: itself, or the interpreter
/// its `#!` line names (followed through scripts run by scripts).
fn elf_behind(program: &Path) -> Result<PathBuf> {
    let mut path = program.to_path_buf();
    for _ in 0..=MAX_INTERPRETER_DEPTH {
        let (_, data) = read(&path)?;
        if data.starts_with(b"\x7fELF") {
            return Ok(path);
        }
        match shebang_interpreter(&data) {
            Some(interpreter) => path = interpreter,
            None => {
                return Err(fatal(
                    ExitCode::SpawnFailed,
                    format!(
                        "{} is neither an ELF executable nor a script with a #! line",
                        path.display()
                    ),
                ));
            }
        }
    }
    Err(fatal(
        ExitCode::SpawnFailed,
        format!(
            "{}: more than {MAX_INTERPRETER_DEPTH} nested #! interpreters",
            program.display()
        ),
    ))
}

/// The interpreter a `#!` line names (its first word).
fn shebang_interpreter(data: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt as _;
    let line = data.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&byte| byte == b'\n')?];
    let word = line
        .split(|byte| byte.is_ascii_whitespace())
        .find(|word| !word.is_empty())?;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(word)))
}

/// The ELF interpreter (`PT_INTERP`) of an executable, if it has one.
fn interpreter(data: &[u8]) -> Option<PathBuf> {
    use object::read::elf::{ElfFile64, ProgramHeader as _};
    use std::os::unix::ffi::OsStrExt as _;
    let file = ElfFile64::<object::Endianness>::parse(data).ok()?;
    let endian = file.endian();
    file.elf_program_headers().iter().find_map(|header| {
        let bytes = header.interpreter(endian, data).ok()??;
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
    })
}

/// The gate on a glibc loader: `_dl_debug_state`, with the distance to
/// `_r_debug.r_state` as cookie. None when the loader lacks either symbol.
/// The loader gate of a running process: its dynamic loader's
/// `_dl_debug_state` (the loader read inside its root); None for a
/// static executable.
pub(super) fn running_loader_gate(pid: u32) -> Option<Gate> {
    // The image it runs, whatever its path names now.
    let executable = fs::File::open(format!("/proc/{pid}/exe")).ok()?;
    // SAFETY: only read; a truncated file reads as zeros (`target_files`).
    let data = unsafe { memmap2::Mmap::map(&executable) }.ok()?;
    // PT_INTERP names a link (/lib64/ld-linux-x86-64.so.2): resolved
    // inside the target's root, then opened there.
    let loader = crate::target_files::resolve_in_root(pid, &interpreter(&data)?)?;
    let loader_file = crate::target_files::open_in_root(pid, &loader).ok()?;
    // SAFETY: as above.
    let loader_data = unsafe { memmap2::Mmap::map(&loader_file) }.ok()?;
    loader_gate(&loader, loader_file, &loader_data)
}

/// The gate in the loader `file` (named `loader`), whose bytes are
/// `data`; attached by that file, not by its name.
fn loader_gate(loader: &Path, file: fs::File, data: &[u8]) -> Option<Gate> {
    let opened = SiteFile::of(file, loader).ok()?;
    use object::ObjectSymbol as _;
    let file = object::File::parse(data).ok()?;
    let address = |name: &str| {
        file.dynamic_symbols()
            .chain(file.symbols())
            .find(|symbol| symbol.name() == Ok(name))
            .map(|symbol| symbol.address())
    };
    let function = address("_dl_debug_state")?;
    let r_debug = address("_r_debug")?;
    Some(Gate {
        path: loader.to_path_buf(),
        file: opened,
        offset: file_offset(&file, function)?,
        cookie: (r_debug + R_STATE_OFFSET).wrapping_sub(function),
    })
}

/// Forks a child that stops itself, then execs `path` (with
/// `end_with_tracer`, it gets SIGTERM when tracer dies). Returns its PID once
/// it is stopped, and the read end of a close-on-exec pipe on which it
/// reports a failed exec.
fn fork_stopped(
    path: &CString,
    arguments: &[CString],
    end_with_tracer: bool,
) -> Result<(u32, i32)> {
    let mut argv: Vec<*const libc::c_char> = arguments.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut pipe = [0i32; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("could not create a pipe");
    }
    let parent = std::process::id() as i32;
    // SAFETY: the child only calls async-signal-safe functions (prctl,
    // getppid, raise, execv, write, _exit) before exec; tracer has started
    // no thread yet.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("could not fork");
    }
    if pid == 0 {
        unsafe {
            libc::close(pipe[0]);
            if end_with_tracer {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong);
                if libc::getppid() != parent {
                    libc::_exit(127);
                }
            }
            libc::raise(libc::SIGSTOP);
            libc::execv(path.as_ptr(), argv.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(pipe[1], (&raw const errno).cast(), size_of::<i32>());
            libc::_exit(127);
        }
    }
    // SAFETY: closing our copy of the write end; waitpid on our child.
    unsafe { libc::close(pipe[1]) };
    let mut status = 0;
    let waited = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
    if waited != pid || !libc::WIFSTOPPED(status) {
        return Err(fatal(
            ExitCode::SpawnFailed,
            "the child did not stop before exec",
        ));
    }
    Ok((pid as u32, pipe[0]))
}

/// Reads the child's exec result: None when exec succeeded (the pipe closed).
fn read_exec_error(read_end: i32) -> Option<i32> {
    let mut errno = 0i32;
    // SAFETY: reads at most 4 bytes into errno, then closes our fd.
    let count = unsafe { libc::read(read_end, (&raw mut errno).cast(), size_of::<i32>()) };
    unsafe { libc::close(read_end) };
    (count == size_of::<i32>() as isize).then_some(errno)
}

/// Waits until the child stops at the gate.
fn wait_for_stop(pid: u32) -> Result<(), String> {
    let deadline = Instant::now() + GATE_TIMEOUT;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid status pointer.
        let waited =
            unsafe { libc::waitpid(pid as i32, &mut status, libc::WUNTRACED | libc::WNOHANG) };
        if waited == pid as i32 {
            if libc::WIFSTOPPED(status) {
                return Ok(());
            }
            return Err("exited before tracer could attach".into());
        }
        if waited < 0 {
            return Err("vanished before tracer could attach".into());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "did not reach its entry point within {GATE_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Kills and reaps a child that will not be traced.
pub fn kill(pid: u32) {
    let mut status = 0;
    // SAFETY: kills and reaps our own child.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
        libc::waitpid(pid as i32, &mut status, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shebang_names_the_interpreter() {
        assert_eq!(
            shebang_interpreter(b"#!/bin/sh -e\necho hi\n"),
            Some(PathBuf::from("/bin/sh"))
        );
        assert_eq!(
            shebang_interpreter(b"#! /usr/bin/env python3.11\n"),
            Some(PathBuf::from("/usr/bin/env"))
        );
        assert_eq!(shebang_interpreter(b"echo hi\n"), None);
        assert_eq!(shebang_interpreter(b"#!\n"), None);
    }

    /// Debian's loader exports both symbols the gate needs; the cookie
    /// leads from `_dl_debug_state` to `_r_debug.r_state`.
    #[test]
    fn gate_goes_on_the_loader_of_a_dynamic_program() {
        let gate = gate_for(Path::new("/bin/sh")).unwrap();
        let loader = interpreter(&fs::read("/bin/sh").unwrap()).unwrap();
        assert_eq!(gate.path, loader);
        assert_ne!(gate.cookie, 0);
    }

    #[test]
    fn a_script_is_gated_through_its_interpreter() {
        let script = std::env::temp_dir().join(format!("tracer-spawn-{}.sh", std::process::id()));
        fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
        let gate = gate_for(&script);
        let _ = fs::remove_file(&script);
        assert_eq!(gate.unwrap(), gate_for(Path::new("/bin/sh")).unwrap());
    }
}
