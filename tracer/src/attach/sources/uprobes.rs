//! The uprobe sources' attach (allocator calls, CUDA calls: the functions
//! `sources::traced_functions` lists): their functions found in every
//! object a target maps and in the libraries it may load (`ahead`), put in
//! batches of one program in one file, return probes first, and attached
//! through uprobe_multi or session links (else one perf-event uprobe
//! each); and the benchmark's floor, the same sites with empty programs.
use std::time::Instant;

use anyhow::Result;
use aya::programs::{
    UProbe,
    uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
};

use crate::{
    attach::{
        AttachedHook, Probes, attach_error,
        libraries::{HookedLibrary, NoticedBy, ahead},
        load::load_error,
        load::program,
        nonzero_pid,
        safety::held_back,
        sites::{
            forwarding::Forwarding,
            symbols::{self, FoundSites, HookSite},
        },
    },
    config::FloorSites,
    error::{ExitCode, fatal},
    procfs,
};

/// The benchmark's empty programs.
const FLOOR_ENTRY_PROGRAM: &str = tracer_ebpf::program::FLOOR_ENTER;
const FLOOR_RETURN_PROGRAM: &str = tracer_ebpf::program::FLOOR_RETURN;

/// Probes of one program in one file, attached together.
pub(in crate::attach) struct Batch<'a> {
    pub(in crate::attach) program: &'static str,
    pub(in crate::attach) site: &'a HookSite,
    /// (file offset, attach cookie) of each probe.
    pub(in crate::attach) points: Vec<(u64, u64)>,
}

/// Adds a probe of `program` at `offset` of `site`'s file to its batch.
fn add_to_batch<'a>(
    batches: &mut Vec<Batch<'a>>,
    program: &'static str,
    site: &'a HookSite,
    offset: u64,
    cookie: u64,
) {
    match batches
        .iter_mut()
        .find(|batch| batch.program == program && batch.site.file == site.file)
    {
        Some(batch) => batch.points.push((offset, cookie)),
        None => batches.push(Batch {
            program,
            site,
            points: vec![(offset, cookie)],
        }),
    }
}

/// When a batch is attached: return probes first, so that a call whose
/// entry is seen always has its return seen too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::attach) enum Stage {
    Return,
    /// Session programs: entry and return in one.
    Session,
    Entry,
}

/// The batches of `sites` in the order they are attached; a function
/// whose entry program `in_session` covers gets one session batch.
pub(in crate::attach) fn batches<'a>(
    sites: &'a [HookSite],
    in_session: impl Fn(&str) -> bool,
) -> Vec<(Stage, Batch<'a>)> {
    let mut returns = Vec::new();
    let mut sessions = Vec::new();
    let mut entries = Vec::new();
    for site in sites {
        let function = &site.function;
        if let Some(entry_program) = function.entry_program
            && in_session(entry_program)
        {
            add_to_batch(
                &mut sessions,
                entry_program,
                site,
                site.offset,
                function.cookie,
            );
            continue;
        }
        if let Some(return_program) = function.return_program {
            add_to_batch(&mut returns, return_program, site, site.offset, 0);
        }
        if let Some(entry_program) = function.entry_program {
            add_to_batch(
                &mut entries,
                entry_program,
                site,
                site.offset,
                function.cookie,
            );
        }
    }
    let staged = |stage, batches: Vec<Batch<'a>>| batches.into_iter().map(move |b| (stage, b));
    staged(Stage::Return, returns)
        .chain(staged(Stage::Session, sessions))
        .chain(staged(Stage::Entry, entries))
        .collect()
}

impl Probes {
    /// Attaches the probes of the uprobe sources (`Source::functions`:
    /// the allocators, CUDA, the runtimes' families) to every object `pid`
    /// maps that defines such functions and to the libraries it may load
    /// (`ahead`), after choosing how its stacks are unwound, and watches
    /// it for libraries mapped later. Returns the number of probes.
    pub fn attach_functions(&mut self, pid: u32) -> Result<usize> {
        let reading = Instant::now();
        let forwarding = self.forwarding();
        let (maps, found) = allocator_sites(pid, forwarding)?;
        let ahead = ahead::candidates(pid, &maps);
        let ahead_found = if ahead.is_empty() {
            FoundSites::default()
        } else {
            symbols::hook_sites_in(pid, &ahead, forwarding)?
        };
        let (sites, ahead_sites) = (found.sites, ahead_found.sites);
        self.hooked.unprobed.extend(
            found
                .unprobed
                .into_iter()
                .chain(ahead_found.unprobed)
                .map(|unprobed| (pid, unprobed)),
        );
        self.measured.times.symbols += reading.elapsed();
        if !sites
            .iter()
            .any(|site| site.function.name == "malloc" || site.function.name == "free")
        {
            // A Go program, or a static one with its own allocator: what it
            // maps is still followed (Go's heap arenas are mmap'd).
            eprintln!(
                "tracer: note: PID {pid} ({}) maps no object that defines malloc or free \
                 (a Go program, or a static binary with its own allocator): only its \
                 mappings (mmap, munmap, brk) are traced",
                procfs::command_line(pid)
            );
        }
        let choosing = Instant::now();
        self.choose_unwinding(pid, &maps)?;
        self.measured.times.unwinding += choosing.elapsed();
        self.follow_go_stack_switch(pid, &maps)?;
        let before = self.probe_count();
        self.watch.trace(pid, &maps)?;
        // Functions that can throw wait for the unwinder (`held_back`):
        // said once per process.
        let mut notes = self.attach_sites(pid, &sites, NoticedBy::Attach)?;
        // The CUDA and allocator libraries `pid` could load but has not
        // mapped, so that their first call after a dlopen is seen.
        notes.extend(self.attach_sites(pid, &ahead_sites, NoticedBy::Ahead)?);
        for note in notes {
            eprintln!("tracer: {note}");
        }
        Ok(self.probe_count() - before)
    }

    /// Attaches the probes of `sites`, as `attach_claimed` does. A file
    /// already hooked for `pid` (at open, ahead) is left as it is: a
    /// second probe on it would count every call twice. A function that
    /// can throw waits for `pid`'s unwinder (`held_back`); a batch that
    /// probes the unwinder attaches what waited, after its own. Returns
    /// lines for stderr.
    pub fn attach_sites(
        &mut self,
        pid: u32,
        sites: &[HookSite],
        noticed_by: NoticedBy,
    ) -> Result<Vec<String>> {
        let kept: Vec<HookSite>;
        let sites = if self.modes.resident.is_some() {
            // Only the CUDA calls (and the unwinder's entries, which keep
            // their return probes safe): no allocator call is trapped.
            kept = sites
                .iter()
                .filter(|site| {
                    super::cuda::is_cuda_function(site.function.name)
                        || crate::attach::safety::exceptions::UNWINDER_START
                            .iter()
                            .any(|function| function.name == site.function.name)
                })
                .cloned()
                .collect();
            &kept[..]
        } else {
            sites
        };
        let claimed = self.watch.files.claim_sites(pid, sites);
        let admitted = self.watch.throwing.admit(pid, claimed);
        if let Err(error) = self.attach_claimed(pid, &admitted.now, noticed_by) {
            self.watch.throwing.undo(pid, &admitted);
            return Err(error);
        }
        let mut notes: Vec<String> = admitted.warning.iter().cloned().collect();
        if !admitted.released.is_empty() {
            match self.attach_claimed(pid, &admitted.released, noticed_by) {
                Ok(()) => notes.push(held_back::released_note(pid, &admitted.released)),
                Err(error) => {
                    self.watch.throwing.hold_again(pid, &admitted.released);
                    notes.push(format!(
                        "warning: PID {pid}: the functions that waited for the unwinder \
                         could not be probed: {error:#}"
                    ));
                }
            }
        }
        Ok(notes)
    }

    /// Attaches the probes of `sites`, whose files are claimed for `pid`,
    /// return probes first, so that a call whose entry is seen always has
    /// its return seen too. With uprobe sessions, a session program is
    /// both.
    fn attach_claimed(
        &mut self,
        pid: u32,
        sites: &[HookSite],
        noticed_by: NoticedBy,
    ) -> Result<()> {
        if sites.is_empty() {
            return Ok(());
        }
        let session = self.links.session.as_ref();
        let ordered = batches(sites, |program| {
            session.is_some_and(|session| session.covers(program))
        });
        let waiting = Instant::now();
        // Verified together (the CUDA programs, when CUDA first appears).
        for (stage, batch) in &ordered {
            let programs = match stage {
                Stage::Session => self.links.session.as_ref(),
                _ => self.links.multi.as_ref(),
            };
            if let Some(programs) = programs {
                programs.prefetch(&[batch.program]);
            }
        }
        for (stage, batch) in &ordered {
            let programs = match stage {
                Stage::Session => self.links.session.as_ref(),
                _ => self.links.multi.as_ref(),
            };
            if let Some(programs) = programs {
                programs.ready(batch.program).map_err(load_error)?;
            }
        }
        let linking = Instant::now();
        self.measured.times.verifier_wait += linking - waiting;
        for (stage, batch) in &ordered {
            if *stage == Stage::Session {
                let session = self.links.session.as_mut().expect("sessions are loaded");
                session
                    .attach(batch.program, &batch.site.file, &batch.points, pid)
                    .map_err(|error| attach_error(error, pid))?;
            } else {
                self.attach_batch(batch, pid)?;
            }
        }
        self.measured.times.links += linking.elapsed();
        self.add_hooks(pid, sites, noticed_by, Instant::now());
        Ok(())
    }

    /// Records the hooks of `sites`, in place since `hooked_at`: a
    /// library hooked already (functions that waited for the unwinder)
    /// gets the new functions in its entry.
    pub(in crate::attach) fn add_hooks(
        &mut self,
        pid: u32,
        sites: &[HookSite],
        noticed_by: NoticedBy,
        hooked_at: Instant,
    ) {
        self.hooked
            .hooks
            .extend(sites.iter().map(|site| AttachedHook {
                pid,
                site: site.without_descriptor(),
            }));
        for mut library in HookedLibrary::from_sites(pid, sites, noticed_by) {
            match self
                .hooked
                .libraries
                .iter_mut()
                .find(|hooked| hooked.pid == pid && hooked.path == library.path)
            {
                Some(hooked) => hooked.functions.append(&mut library.functions),
                None => {
                    library.hooked_at = hooked_at;
                    self.hooked.libraries.push(library);
                }
            }
        }
    }

    /// The benchmark's floor: the empty `floor_enter` on every allocator
    /// function, and `floor_return` where tracer puts a return probe
    /// (unless `with_return` is false), at `sites`, attached as tracer's
    /// own probes are.
    pub fn attach_floor(&mut self, pid: u32, sites: FloorSites, with_return: bool) -> Result<()> {
        // Where other tools probe: every function's entry. Where tracer
        // probes: its own sites, none in functions that pass their calls on.
        let forwarding = match sites {
            FloorSites::FunctionEntry => Forwarding::TailJumpsOnly,
            FloorSites::Chosen => Forwarding::TailJumpsAndCalls,
        };
        let found = allocator_sites(pid, forwarding)?.1.sites;
        let offset = |site: &HookSite| match sites {
            FloorSites::FunctionEntry => site.function_offset,
            FloorSites::Chosen => site.offset,
        };
        let mut returns = Vec::new();
        let mut entries = Vec::new();
        for site in &found {
            if with_return && site.function.return_program.is_some() {
                add_to_batch(&mut returns, FLOOR_RETURN_PROGRAM, site, offset(site), 0);
            }
            if site.function.entry_program.is_some() {
                add_to_batch(&mut entries, FLOOR_ENTRY_PROGRAM, site, offset(site), 0);
            }
        }
        for batch in returns.iter().chain(&entries) {
            self.attach_batch(batch, pid)?;
        }
        for site in &found {
            let emulated = match sites {
                FloorSites::FunctionEntry => site.offset == site.function_offset && site.emulated,
                FloorSites::Chosen => site.emulated,
            };
            self.hooked.hooks.push(AttachedHook {
                pid,
                site: HookSite {
                    offset: offset(site),
                    emulated,
                    ..site.without_descriptor()
                },
            });
        }
        Ok(())
    }

    /// Attaches the probes of one batch: one uprobe_multi link, else one
    /// perf-event uprobe each.
    fn attach_batch(&mut self, batch: &Batch<'_>, pid: u32) -> Result<()> {
        let site = batch.site;
        if let Some(multi) = self.links.multi.as_mut() {
            return multi
                .attach(batch.program, &site.file, &batch.points, pid)
                .map_err(|error| attach_error(error, pid));
        }
        let scope = UProbeScope::OneProcess(nonzero_pid(pid)?);
        let attach_path = site.file.attach_path()?;
        let program: &mut UProbe = program(&mut self.ebpf, batch.program)?;
        for &(offset, cookie) in &batch.points {
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie: Some(cookie).filter(|&cookie| cookie != 0),
            };
            let link = program
                .attach(point, &attach_path, scope)
                .map_err(|error| {
                    attach_error(
                        anyhow::Error::new(error).context(format!(
                            "could not attach {} at offset {offset:#x} of {} (by its descriptor, {})",
                            batch.program,
                            site.path.display(),
                            attach_path.display()
                        )),
                        pid,
                    )
                })?;
            self.links.perf.push((pid, batch.program, link));
        }
        Ok(())
    }
}

/// The mappings of `pid` and the allocator functions in them, with their
/// probe sites.
fn allocator_sites(pid: u32, forwarding: Forwarding) -> Result<(Vec<procfs::Mapping>, FoundSites)> {
    let maps = procfs::read_maps(pid)
        .map_err(|error| fatal(ExitCode::NoTarget, format!("PID {pid}: {error:#}")))?;
    let sites = symbols::find_hook_sites(pid, &maps, forwarding)?;
    // An exiting process has no mappings left: not a target without an
    // allocator.
    if maps.is_empty() || !procfs::is_alive(pid) {
        return Err(fatal(
            ExitCode::NoTarget,
            format!("PID {pid} exited during attach"),
        ));
    }
    Ok((maps, sites))
}
