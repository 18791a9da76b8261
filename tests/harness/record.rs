//! `tracer record` as the integration tests run it, from start to the
//! parsed report, so that no test writes its own start-and-wait sequence.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use super::{ATTACH_TIMEOUT, EXIT_TIMEOUT, Report, Tracer, TracerOutput, json_path, require_root};

/// The arguments of one `tracer record` run: every 200 ms, every stack
/// (`--top 0`), a JSON report at a fresh temporary path, unless changed.
pub struct Record {
    targets: Vec<OsString>,
    interval: String,
    top: usize,
    json: PathBuf,
    extra_args: Vec<OsString>,
}

impl Record {
    /// `tracer record --pid PID` of one running process.
    pub fn pid(pid: u32) -> Self {
        Self::pids(&[pid])
    }

    /// `tracer record --pid P1 --pid P2 ...`.
    pub fn pids(pids: &[u32]) -> Self {
        let targets = pids
            .iter()
            .flat_map(|pid| [OsString::from("--pid"), OsString::from(pid.to_string())])
            .collect();
        Self {
            targets,
            interval: "200ms".to_owned(),
            top: 0,
            json: json_path("record"),
            extra_args: Vec::new(),
        }
    }

    /// `tracer record ... -- FIXTURE ARGS`: the tracer starts the fixture.
    pub fn command(program: &Path, args: &[&str]) -> Self {
        let mut record = Self::pids(&[]);
        record.targets = [OsStr::new("--"), program.as_os_str()]
            .into_iter()
            .chain(args.iter().map(OsStr::new))
            .map(OsStr::to_owned)
            .collect();
        record
    }

    /// `--interval` (200ms unless set).
    pub fn interval(mut self, interval: &str) -> Self {
        interval.clone_into(&mut self.interval);
        self
    }

    /// `--top` (0, every stack, unless set).
    pub fn top(mut self, top: usize) -> Self {
        self.top = top;
        self
    }

    /// Writes the JSON report to `json` instead of a fresh path.
    pub fn json_at(mut self, json: &Path) -> Self {
        json.clone_into(&mut self.json);
        self
    }

    /// More `tracer record` arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.extra_args
            .extend(args.into_iter().map(|arg| arg.as_ref().to_owned()));
        self
    }

    /// Starts the tracer and waits until it has attached.
    pub fn attach(self) -> Trace {
        let mut trace = self.start();
        trace.tracer.wait_attached(ATTACH_TIMEOUT);
        trace
    }

    /// Starts the tracer without waiting for it to attach.
    pub fn start(self) -> Trace {
        require_root();
        let interval = OsString::from(self.interval);
        let top = OsString::from(self.top.to_string());
        // The target goes last: a command after `--` takes every argument.
        let args: Vec<&OsStr> = [
            OsStr::new("record"),
            OsStr::new("--interval"),
            &interval,
            OsStr::new("--top"),
            &top,
            OsStr::new("--json"),
            self.json.as_os_str(),
        ]
        .into_iter()
        .chain(self.extra_args.iter().map(OsString::as_os_str))
        .chain(self.targets.iter().map(OsString::as_os_str))
        .collect();
        Trace {
            tracer: Tracer::start(args),
            json: self.json,
            top: self.top,
        }
    }
}

/// A running `tracer record` and the report it will write.
pub struct Trace {
    pub tracer: Tracer,
    pub json: PathBuf,
    top: usize,
}

/// What a successful `tracer record` left: its outputs and JSON report.
pub struct Traced {
    pub output: TracerOutput,
    pub report: Report,
}

impl Trace {
    /// [`Tracer::wait_tables_ready`].
    pub fn wait_tables_ready(&mut self) {
        self.tracer.wait_tables_ready();
    }

    /// Waits until the recording this session writes at `recording` (its
    /// `-o`) holds one snapshot more than when called: one taken after
    /// whatever the target did before.
    pub fn wait_next_snapshot(&mut self, recording: &Path) {
        let deadline = std::time::Instant::now() + ATTACH_TIMEOUT;
        let mut before = None;
        loop {
            let written = snapshots_written(recording);
            match (before, written) {
                (None, _) => before = written,
                (Some(before), Some(written)) if written > before => return,
                _ => {}
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no new snapshot in {} within {} s (had {before:?})",
                recording.display(),
                ATTACH_TIMEOUT.as_secs()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// SIGINT; the tracer must write its report and exit 0.
    pub fn stop(self) -> Traced {
        self.stop_with(libc::SIGINT)
    }

    /// Sends `signal` (one the tracer ends cleanly on); it must write its
    /// report and exit 0.
    pub fn stop_with(self, signal: libc::c_int) -> Traced {
        let output = self.tracer.stop_with(signal);
        Self::read(output, &self.json, self.top)
    }

    /// SIGINT (Ctrl-C): the tracer must write its report and exit 0 within
    /// `bound` of the signal, the wait a user at the terminal accepts.
    pub fn interrupt_within(mut self, bound: std::time::Duration) -> Report {
        self.tracer.signal(libc::SIGINT);
        self.exit_within("the exit after SIGINT", bound).1
    }

    /// SIGINT, then, once stderr shows `answer` (tracer's word that it is
    /// stopping), a second SIGINT: the tracer must write its report and
    /// exit 0 within `bound` of the second.
    pub fn interrupt_twice_within(
        mut self,
        answer: &str,
        bound: std::time::Duration,
    ) -> (TracerOutput, Report) {
        self.tracer.signal(libc::SIGINT);
        self.tracer.wait_stderr(answer, ATTACH_TIMEOUT);
        self.tracer.signal(libc::SIGINT);
        self.exit_within("the exit after a second SIGINT", bound)
    }

    /// The tracer, just signalled, must write its report and exit 0
    /// within `bound` (`what` for the failure message).
    fn exit_within(self, what: &str, bound: std::time::Duration) -> (TracerOutput, Report) {
        let signalled = std::time::Instant::now();
        let output = self.tracer.wait_exit(EXIT_TIMEOUT);
        let exit = signalled.elapsed();
        output.assert_success();
        let report = Report::read(&self.json);
        super::assert_took_under(what, exit, bound, &report);
        (output, report)
    }

    /// Waits for the tracer to end by itself (`--duration`, the target
    /// exited); it must write its report and exit 0.
    pub fn wait_exit(self) -> Traced {
        let output = self.tracer.wait_exit(EXIT_TIMEOUT);
        Self::read(output, &self.json, self.top)
    }

    fn read(output: TracerOutput, json: &Path, top: usize) -> Traced {
        output.assert_success();
        let report = Report::read(json);
        report.assert_totals_are_the_listed_stacks(top);
        Traced { output, report }
    }
}

/// The snapshots in a recording being written, read with tracer's own
/// reader; `None` until it exists, and while a snapshot is half-written.
fn snapshots_written(recording: &Path) -> Option<usize> {
    let bytes = std::fs::read(recording).ok()?;
    let parsed = tracer::recording::parse(&bytes, "the recording");
    parsed.ok().map(|recording| recording.snapshot_count())
}
