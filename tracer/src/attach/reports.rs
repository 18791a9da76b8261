//! What the probes are, as a report describes them: where each probe went
//! and why, how allocations are recorded, how stacks are walked.
use crate::attach::{ProbeLinks, Probes, safety::exceptions};
use crate::{
    model::run::{
        DwarfProcess, ProbeReport, ReturnProbes, SamplingMode, SamplingReport, UnwindingReport,
    },
    unwind::UnwindMode,
};

impl Probes {
    /// The exception fixer (`exceptions`), where the kernel's layout is
    /// known.
    pub fn exceptions(&self) -> Option<&exceptions::ExceptionFixer> {
        self.exceptions.as_ref()
    }

    /// `--unwind auto`: the processes whose stacks are copied and unwound
    /// here, and the objects without frame pointers that made it so.
    pub fn copying_stacks_of(&self) -> &[(u32, Vec<String>)] {
        &self.unwind.copying_stacks_of
    }

    /// Whether a process whose dlopen() completes before its new
    /// libraries are hooked is held at the loader gate.
    pub fn set_loader_pause(&mut self, pause: bool) {
        self.gate.pause = pause;
    }

    /// Time spent finding a target's Python, counted with the attach's.
    pub fn add_python_time(&mut self, spent: std::time::Duration) {
        self.measured.times.python += spent;
    }

    /// How stacks are walked for the processes `pids`.
    pub fn unwinding_report(&self, pids: &[u32]) -> UnwindingReport {
        UnwindingReport {
            mode: self.modes.unwinding.mode,
            stack_bytes: self.modes.unwinding.stack_bytes,
            dwarf: pids
                .iter()
                .copied()
                .filter_map(|pid| {
                    let lacking = self
                        .unwind
                        .copying_stacks_of
                        .iter()
                        .chain(&self.unwind.walking_tables_of)
                        .find(|(walked, _)| *walked == pid)
                        .map(|(_, objects)| objects.clone());
                    match (self.copies_stacks_of(pid), lacking) {
                        (_, Some(objects))
                            if !objects.is_empty()
                                || self.unwind.lacking_unnamed.contains(&pid) =>
                        {
                            Some(objects)
                        }
                        (true, _) => Some(Vec::new()),
                        _ => None,
                    }
                    .map(|objects| DwarfProcess {
                        pid,
                        objects_without_frame_pointers: objects,
                    })
                })
                .collect(),
        }
    }

    /// Exact or sampled, size filters, and how return values are read.
    pub fn sampling_report(&self) -> SamplingReport {
        let sampling = &self.modes.sampling;
        SamplingReport {
            mode: if self.modes.resident.is_some() {
                SamplingMode::Resident
            } else if sampling.sample_bytes == 0 {
                SamplingMode::Exact
            } else {
                SamplingMode::Sampled
            },
            sample_bytes: (sampling.sample_bytes != 0).then_some(sampling.sample_bytes),
            min_size_bytes: sampling.min_size_bytes,
            max_size_bytes: (sampling.max_size_bytes != u64::MAX)
                .then_some(sampling.max_size_bytes),
            return_probes: self.modes.return_probes.clone(),
        }
    }

    /// Every probe in place.
    pub fn probe_reports(&self) -> Vec<ProbeReport> {
        self.hooked
            .hooks
            .iter()
            .map(|hook| ProbeReport {
                pid: hook.pid,
                module: hook.site.path.display().to_string(),
                symbol: hook.site.function.name.to_owned(),
                offset: hook.site.offset,
                offset_in_function: hook.site.offset - hook.site.function_offset,
                single_stepped: !hook.site.emulated,
                reason: hook.site.reason.clone(),
            })
            .collect()
    }

    /// Lines for stderr after attach: a warning for every single-stepped
    /// probe and for a uprobe session fallback; with `verbose`, where every
    /// probe went and why, and how return values are read.
    pub fn attach_notes(&self, verbose: bool) -> Vec<String> {
        let mut notes = Vec::new();
        for hook in &self.hooked.hooks {
            let site = &hook.site;
            let line = format!(
                "{}+{} in {} (PID {}): {}",
                site.function.name,
                site.offset - site.function_offset,
                site.path.display(),
                hook.pid,
                site.reason
            );
            if !site.emulated {
                notes.push(format!("warning: probe on {line}"));
            } else if verbose {
                notes.push(format!("probe on {line}"));
            }
        }
        if verbose {
            let held_back = self.watch.throwing.unprobed();
            notes.extend(
                self.hooked
                    .unprobed
                    .iter()
                    .chain(&held_back)
                    .map(|(pid, unprobed)| {
                        format!(
                            "{} in {} (PID {pid}): {}",
                            unprobed.name,
                            unprobed.path.display(),
                            unprobed.why
                        )
                    }),
            );
        }
        match &self.links.how {
            ProbeLinks::Multi if verbose => notes.push(format!(
                "uprobes attached in {} uprobe_multi links",
                self.multi_link_count()
            )),
            ProbeLinks::Multi => {}
            // Expected before Linux 6.6; on a kernel that has the links, a
            // refusal is a fault worth seeing: exit is slower and libraries
            // opened later can only be hooked late.
            ProbeLinks::PerProbe(why) if verbose || has_uprobe_multi() => notes.push(format!(
                "{}uprobes attached one by one (uprobe_multi links unavailable: {why}): \
                 each costs ~0.1 s to release at exit, and libraries opened later are \
                 hooked late",
                if has_uprobe_multi() { "warning: " } else { "" }
            )),
            ProbeLinks::PerProbe(_) => {}
        }
        if verbose || matches!(self.modes.return_probes, ReturnProbes::UretprobeFallback(_)) {
            notes.push(format!(
                "return probes: {}",
                self.modes.return_probes.describe()
            ));
        }
        if verbose {
            notes.push(self.attach_time_note());
        }
        notes
    }

    /// Where the attach time went: maps, tracepoints, the targets'
    /// objects, the verifier (on threads of its own while the objects were
    /// read: only the wait for it adds to the attach), the links.
    fn attach_time_note(&self) -> String {
        let (programs, verifier) = [&self.links.multi, &self.links.session]
            .into_iter()
            .flatten()
            .map(|programs| programs.load_times())
            .fold((0, std::time::Duration::ZERO), |(count, sum), (n, time)| {
                (count + n, sum + time)
            });
        let times = &self.measured.times;
        let ms = |duration: std::time::Duration| duration.as_secs_f64() * 1e3;
        format!(
            "attach time: maps {:.0} ms, tracepoints {:.0} ms, symbols and probe sites {:.0} ms, \
             unwinding {:.0} ms, Python {:.0} ms, waiting for the verifier {:.0} ms, links {:.0} ms \
             ({programs} uprobe programs verified so far, {:.0} ms of verifier time, in parallel)",
            ms(times.maps),
            ms(times.tracepoints),
            ms(times.symbols),
            ms(times.unwinding),
            ms(times.python),
            ms(times.verifier_wait),
            ms(times.links),
            ms(verifier),
        )
    }

    /// Whether some process's stacks are copied (the copy ring is in use).
    pub fn copies_any_stacks(&self) -> bool {
        self.modes.unwinding.mode == UnwindMode::Copy || !self.unwind.copying_stacks_of.is_empty()
    }
}

/// Whether this kernel has uprobe_multi links (Linux 6.6+).
fn has_uprobe_multi() -> bool {
    aya::util::KernelVersion::current()
        .is_ok_and(|version| version >= aya::util::KernelVersion::new(6, 6, 0))
}
