//! Spawn mode (`tracer record -- CMD ARGS`): starts the command stopped at
//! its entry point, after the dynamic loader has mapped its libraries but
//! before `main`, so the probes are in place for its first allocation.
//!
//! How: fork; the child stops itself (SIGSTOP) before exec; tracer puts the
//! `spawn_gate` uprobe, scoped to the child, on the executable's ELF entry
//! point and lets the child exec. The gate stops it again at `_start`.
use std::{
    ffi::{CString, OsString},
    fs,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeScope};
use object::Object as _;

use super::{Probes, load::program, nonzero_pid, symbols::file_offset};
use crate::error::{ExitCode, fatal};

const GATE_PROGRAM: &str = tracer_ebpf::program::SPAWN_GATE;
const GATE_TIMEOUT: Duration = Duration::from_secs(10);

/// A child started by tracer, stopped at its entry point.
#[derive(Debug)]
pub struct Spawned {
    pub pid: u32,
}

/// Starts `command` and returns once it is stopped at its entry point.
pub fn spawn_stopped(probes: &mut Probes, command: &[OsString]) -> Result<Spawned> {
    let (name, _) = command
        .split_first()
        .ok_or_else(|| fatal(ExitCode::Usage, "no command given after --"))?;
    let program_path = resolve_program(Path::new(name))?;
    let entry_offset = entry_file_offset(&program_path)?;
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

    let (pid, error_pipe) = fork_stopped(&c_path, &arguments)?;
    let spawn_error = |message: String| fatal(ExitCode::SpawnFailed, message);
    let gate = program(&mut probes.ebpf, GATE_PROGRAM)?;
    let link = gate
        .attach(
            UProbeAttachLocation::AbsoluteOffset(entry_offset),
            &program_path,
            UProbeScope::OneProcess(nonzero_pid(pid)?),
        )
        .with_context(|| {
            format!(
                "could not attach the spawn gate to {}",
                program_path.display()
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
    let gate = program(&mut probes.ebpf, GATE_PROGRAM)?;
    gate.detach(link)
        .context("could not detach the spawn gate")?;
    stopped.map_err(|error| {
        kill(pid);
        spawn_error(format!("{} {error}", program_path.display()))
    })?;
    Ok(Spawned { pid })
}

/// Lets a stopped child run.
pub fn resume(pid: u32) {
    // SAFETY: signals our own child.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
}

/// Reaps the child if it has exited; true when it has.
pub fn reap_if_exited(pid: u32) -> bool {
    let mut status = 0;
    // SAFETY: waitpid on our own child with a valid status pointer.
    let result = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
    result == pid as i32 || result < 0
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

/// File offset of the ELF entry point (`e_entry`), where the gate goes.
fn entry_file_offset(path: &Path) -> Result<u64> {
    let data = fs::read(path).map_err(|error| {
        fatal(
            ExitCode::SpawnFailed,
            format!("could not read {}: {error}", path.display()),
        )
    })?;
    let file = object::File::parse(&*data).map_err(|_| {
        fatal(
            ExitCode::SpawnFailed,
            format!(
                "{} is not an ELF executable (a script?): start it yourself and attach with --pid",
                path.display()
            ),
        )
    })?;
    file_offset(&file, file.entry()).ok_or_else(|| {
        fatal(
            ExitCode::SpawnFailed,
            format!(
                "{}: its entry point is outside every loadable segment",
                path.display()
            ),
        )
    })
}

/// Forks a child that stops itself, then execs `path`. Returns its PID once
/// it is stopped, and the read end of a close-on-exec pipe on which it
/// reports a failed exec.
fn fork_stopped(path: &CString, arguments: &[CString]) -> Result<(u32, i32)> {
    let mut argv: Vec<*const libc::c_char> = arguments.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut pipe = [0i32; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("could not create a pipe");
    }
    // SAFETY: the child only calls async-signal-safe functions (raise,
    // execv, write, _exit) before exec; tracer has started no thread yet.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("could not fork");
    }
    if pid == 0 {
        unsafe {
            libc::close(pipe[0]);
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
