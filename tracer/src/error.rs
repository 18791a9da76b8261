//! Errors that end the run: one line for the user and a distinct exit code
//! per cause, so scripts can tell "no such process" from "not root".
use std::fmt;

/// Exit codes, documented in `tracer --help`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitCode {
    /// Anything else that went wrong.
    Failure = 1,
    /// Bad command line.
    Usage = 2,
    /// The target process does not exist or exited during attach.
    NoTarget = 3,
    /// Not root, or missing CAP_BPF / CAP_PERFMON.
    Permission = 4,
    /// The kernel lacks BTF or uprobe support.
    KernelUnsupported = 5,
    /// No longer raised: a target without malloc/free is traced for its
    /// mappings. The code stays reserved.
    NoAllocator = 6,
    /// The command after `--` could not be started.
    SpawnFailed = 7,
    /// An output file cannot be written (missing or read-only directory).
    Output = 8,
    /// A recording file is missing, unreadable, damaged or from a newer
    /// tracer.
    BadRecording = 9,
}

/// A fatal error with the exit code that says what kind it is. Lives inside
/// `anyhow::Error`; `main` finds it with `downcast_ref`.
#[derive(Debug)]
pub struct Fatal {
    pub code: ExitCode,
    pub message: String,
}

impl fmt::Display for Fatal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Fatal {}

/// Builds an `anyhow::Error` carrying an exit code.
pub fn fatal(code: ExitCode, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Fatal {
        code,
        message: message.into(),
    })
}

/// The exit code for an error: its own if it carries one, else 1.
pub fn exit_code(error: &anyhow::Error) -> ExitCode {
    error
        .chain()
        .find_map(|cause| cause.downcast_ref::<Fatal>())
        .map_or(ExitCode::Failure, |fatal| fatal.code)
}

/// The error as one line: every cause, outermost first, joined by ": ".
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace('\n', " ")
}
