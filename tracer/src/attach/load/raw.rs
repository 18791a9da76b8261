//! Programs aya 0.14 cannot attach the way tracer needs: raw `bpf(2)`
//! calls, kept in this one module.
//!
//! - uprobe_multi links (Linux 6.6+): every offset of one program in one
//!   file, for one PID, in one link, with a cookie per offset. Attaching
//!   and detaching a whole set at once is what makes tracer start and stop
//!   fast: a perf-event uprobe costs ~110 ms to release on a VM, and a
//!   process with glibc, libstdc++ and an allocator library has 70+.
//! - uprobe *session* programs (Linux 6.13+): run at a function's entry
//!   and, unless the entry returned 1, again at its return, so a call that
//!   is not recorded (not sampled, or outside `--min-size`/`--max-size`)
//!   pays for the entry only: no return-address hijack, no return trap.
//!
//! Both are the tracer-ebpf object's programs, relocated here with aya-obj
//! against the maps aya already created (the same fds, so the programs
//! share LIVE, BY_STACK, ... and the load-time globals), and loaded with
//! the expected attach type of their link. A session program's
//! `bpf_session_is_return()` placeholder becomes a kfunc call with the id
//! from the kernel's BTF. Any failure to load means the kernel lacks the
//! feature: tracer then uses aya's perf-event uprobes and uretprobes.
//!
//! Verifying a program is most of what attaching costs (a return program
//! that captures stacks takes 0.1-0.5 s on a VM), so each program is
//! loaded when it is first linked, or ahead of that on threads of their own
//! (`prefetch`): a target without CUDA never pays for the CUDA programs,
//! and the allocator programs are verified while the target's objects are
//! read.

use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    os::fd::{AsRawFd as _, OwnedFd},
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::Ebpf;
use aya_obj::{
    Object, ProgramSection,
    btf::{Btf, BtfKind},
    generated::{bpf_func_info, bpf_insn},
};

mod bpf;

use crate::attach::sites::symbols::SiteFile;
pub(in crate::attach) use bpf::block_signals;
use bpf::{
    BPF_F_UPROBE_MULTI_RETURN, BPF_LINK_CREATE, BPF_TRACE_UPROBE_MULTI, BPF_TRACE_UPROBE_SESSION,
    SESSION_IS_RETURN_KFUNC, UprobeMultiLinkAttr, bpf, load_btf, load_program, map_fd,
    patch_kfunc_calls,
};

/// Which programs of the object a `RawPrograms` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// Every uprobe and uretprobe program (spawn mode's gate aside), for
    /// uprobe_multi links.
    Multi,
    /// The `*_session` programs, by the name of their plain-uprobe twin
    /// (`malloc_session` as `malloc_enter`).
    Session,
}

/// Programs loaded by raw `bpf(2)`, by name, and their links.
pub struct RawPrograms {
    programs: Linker,
    /// Each link and the process it is for.
    links: Vec<(u32, OwnedFd)>,
    /// Probes in the links.
    probe_count: usize,
}

/// The program aya attaches in spawn mode, never through a link here.
const SPAWN_GATE_PROGRAM: &str = tracer_ebpf::program::SPAWN_GATE;

impl RawPrograms {
    /// Prepares the programs of `object` that links of `kind` take, against
    /// the maps of `ebpf` (loaded from the same object), and loads one of
    /// them; the others are loaded on first use or `prefetch`. An error
    /// means this kernel cannot run them.
    pub fn load(object: &[u8], ebpf: &Ebpf, kind: LinkKind) -> Result<RawPrograms> {
        let kfunc_id = match kind {
            LinkKind::Session => Some(
                Btf::from_sys_fs()
                    .context("could not read the kernel's BTF")?
                    .id_by_type_name_kind(SESSION_IS_RETURN_KFUNC, BtfKind::Func)
                    .map_err(|_| {
                        anyhow!("the kernel has no {SESSION_IS_RETURN_KFUNC} (Linux < 6.13)")
                    })?,
            ),
            LinkKind::Multi => None,
        };
        let mut obj = Object::parse(object).context("could not parse the eBPF object")?;
        let text_sections: HashSet<usize> = obj
            .functions
            .keys()
            .map(|(section_index, _)| *section_index)
            .collect();
        let mut map_fds = Vec::new();
        for name in obj.maps.keys() {
            let map = ebpf
                .map(name)
                .with_context(|| format!("aya did not create map {name}"))?;
            map_fds.push((name.clone(), map_fd(map)?));
        }
        let map_objects = obj.maps.clone();
        let maps: Vec<_> = map_fds
            .iter()
            .map(|(name, fd)| (name.as_str(), *fd, &map_objects[name]))
            .collect();
        obj.relocate_maps(maps.into_iter(), &text_sections)
            .context("could not relocate the programs' maps")?;
        obj.relocate_calls(&text_sections)
            .context("could not relocate the programs' calls")?;
        // The object's BTF, for the programs' function info: a program that
        // passes a callback (`bpf_loop`) is refused without it.
        let btf = load_btf(&mut obj)?;

        let btf = btf.map(Arc::new);
        let mut programs = HashMap::new();
        for (name, program) in &obj.programs {
            let is_return = matches!(program.section, ProgramSection::URetProbe { .. });
            let is_uprobe = is_return || matches!(program.section, ProgramSection::UProbe { .. });
            let key = match kind {
                LinkKind::Session => name
                    .strip_suffix("_session")
                    .map(|stem| format!("{stem}_enter")),
                LinkKind::Multi => {
                    (is_uprobe && !name.ends_with("_session") && name != SPAWN_GATE_PROGRAM)
                        .then(|| name.clone())
                }
            };
            let Some(key) = key else { continue };
            let function = &obj.functions[&program.function_key()];
            let mut instructions = function.instructions.clone();
            let attach_type = match kfunc_id {
                Some(kfunc_id) => {
                    patch_kfunc_calls(&mut instructions, kfunc_id as i32);
                    BPF_TRACE_UPROBE_SESSION
                }
                None => BPF_TRACE_UPROBE_MULTI,
            };
            let func_info = btf
                .as_ref()
                .filter(|_| !function.func_info.func_info.is_empty())
                .map(|btf| FuncInfo {
                    btf: Arc::clone(btf),
                    record_bytes: function.func_info_rec_size as u32,
                    records: function.func_info.func_info.clone(),
                });
            programs.insert(
                key,
                LazyProgram {
                    name: name.clone(),
                    instructions,
                    license: program.license.clone(),
                    attach_type,
                    func_info,
                    is_return,
                    fd: OnceLock::new(),
                    load_time: Mutex::new(None),
                },
            );
        }
        if programs.is_empty() {
            bail!("the eBPF object has no programs for {kind:?} links");
        }
        let programs = Linker {
            kind,
            table: Arc::new(programs),
        };
        // One program now, to learn whether this kernel takes them at all.
        let probe = match kind {
            LinkKind::Multi => tracer_ebpf::program::FREE_ENTER,
            LinkKind::Session => tracer_ebpf::program::MALLOC_ENTER,
        };
        programs.program(probe)?;
        Ok(RawPrograms {
            programs,
            links: Vec::new(),
            probe_count: 0,
        })
    }

    /// Starts loading `names` (those that are here and not loaded yet),
    /// each on a thread of its own, so that they are verified by the time
    /// they are linked.
    pub fn prefetch(&self, names: &[&str]) {
        self.programs.prefetch(names);
    }

    /// Loads `program` unless it is loaded (or waits for the thread that
    /// loads it).
    pub fn ready(&self, program: &str) -> Result<()> {
        self.programs.program(program).map(|_| ())
    }

    /// The programs loaded so far: how many, and the verifier's time on
    /// them, summed.
    pub fn load_times(&self) -> (usize, Duration) {
        self.programs.load_times()
    }

    /// Whether `program` (for sessions: the plain-uprobe twin's name) is
    /// here.
    pub fn covers(&self, program: &str) -> bool {
        self.programs.covers(program)
    }

    /// Attaches `program` at every file offset of `file` in `points`
    /// (with its attach cookie), for process `pid` only, in one link.
    pub fn attach(
        &mut self,
        program: &str,
        file: &SiteFile,
        points: &[(u64, u64)],
        pid: u32,
    ) -> Result<()> {
        let link = self.programs.link(program, file, points, pid)?;
        self.adopt(pid, link, points.len());
        Ok(())
    }

    /// Takes in a link of `probe_count` probes that a [`Linker`] of these
    /// programs made for `pid`.
    pub fn adopt(&mut self, pid: u32, link: OwnedFd, probe_count: usize) {
        self.links.push((pid, link));
        self.probe_count += probe_count;
    }

    /// A handle that makes links of these programs on another thread (the
    /// at-open hooks); the links come back through `adopt`.
    pub fn linker(&self) -> Result<Linker> {
        self.programs.try_clone()
    }

    /// The links, to release (closing each costs a grace period).
    pub fn take_links(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.links)
            .into_iter()
            .map(|(_, link)| link)
            .collect()
    }

    /// The links of process `pid`, which exited, to release.
    pub fn take_links_of(&mut self, pid: u32) -> Vec<OwnedFd> {
        let (of_pid, others) = std::mem::take(&mut self.links)
            .into_iter()
            .partition(|(link_pid, _)| *link_pid == pid);
        self.links = others;
        of_pid.into_iter().map(|(_, link)| link).collect()
    }

    /// Number of links in place.
    pub fn link_count(&self) -> usize {
        self.links.len()
    }

    /// Number of probes in the links.
    pub fn probe_count(&self) -> usize {
        self.probe_count
    }

    /// Each loaded program: the name links ask for, the object's name,
    /// and whether it is a return program.
    pub fn loaded(&self) -> Vec<LoadedProgram<'_>> {
        self.programs
            .table
            .iter()
            .filter(|(_, lazy)| lazy.fd.get().is_some_and(Result::is_ok))
            .map(|(key, lazy)| LoadedProgram {
                key,
                name: &lazy.name,
                is_return: lazy.is_return,
            })
            .collect()
    }
}

/// One loaded program (`RawPrograms::loaded`).
pub struct LoadedProgram<'a> {
    /// The name links ask for (a session program's plain-uprobe twin's).
    pub key: &'a str,
    /// The object's name of the program.
    pub name: &'a str,
    pub is_return: bool,
}

/// Programs of one link kind, by name, that links are made of: those of
/// a [`RawPrograms`], or a copy of them for another thread.
pub struct Linker {
    pub kind: LinkKind,
    /// Each program, by the name links ask for, loaded once on first use.
    table: Arc<HashMap<String, LazyProgram>>,
}

/// One program of the object, ready to load, and its descriptor once
/// loaded (or why the kernel refused it).
struct LazyProgram {
    /// The object's name of the program.
    name: String,
    instructions: Vec<bpf_insn>,
    license: CString,
    attach_type: u32,
    func_info: Option<FuncInfo>,
    is_return: bool,
    fd: OnceLock<std::result::Result<OwnedFd, String>>,
    /// How long the kernel took to load it.
    load_time: Mutex<Option<Duration>>,
}

/// A program's function info: each subprogram's type in the object's BTF.
struct FuncInfo {
    btf: Arc<OwnedFd>,
    record_bytes: u32,
    records: Vec<bpf_func_info>,
}

impl LazyProgram {
    /// The loaded program: loaded now unless it was before (a caller that
    /// finds another thread loading it waits for that load).
    fn fd(&self) -> Result<&OwnedFd> {
        self.fd
            .get_or_init(|| {
                let started = Instant::now();
                let loaded = load_program(
                    &self.name,
                    &self.instructions,
                    &self.license,
                    self.attach_type,
                    self.func_info.as_ref(),
                )
                .map_err(|error| format!("{error:#}"));
                *self
                    .load_time
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(started.elapsed());
                loaded
            })
            .as_ref()
            .map_err(|error| anyhow!("{error}"))
    }
}

impl Linker {
    /// The same programs, for another thread.
    fn try_clone(&self) -> Result<Linker> {
        Ok(Linker {
            kind: self.kind,
            table: Arc::clone(&self.table),
        })
    }

    /// Whether `program` (for sessions: the plain-uprobe twin's name) is
    /// here.
    pub fn covers(&self, program: &str) -> bool {
        self.table.contains_key(program)
    }

    /// `program`, loaded.
    fn program(&self, program: &str) -> Result<(&OwnedFd, bool)> {
        let kind = self.kind;
        let lazy = self
            .table
            .get(program)
            .with_context(|| format!("no {kind:?} program {program}"))?;
        Ok((lazy.fd()?, lazy.is_return))
    }

    /// See [`RawPrograms::prefetch`].
    pub(in crate::attach) fn prefetch(&self, names: &[&str]) {
        for &name in names {
            let Some(lazy) = self.table.get(name) else {
                continue;
            };
            if lazy.fd.get().is_some() {
                continue;
            }
            let table = Arc::clone(&self.table);
            let name = name.to_owned();
            // A program that fails to load says so when it is linked.
            let _ = std::thread::Builder::new()
                .name("tracer-verify".to_owned())
                .spawn(move || {
                    block_signals();
                    let _ = table[&name].fd();
                });
        }
    }

    /// See [`RawPrograms::load_times`].
    fn load_times(&self) -> (usize, Duration) {
        self.table
            .values()
            .filter_map(|lazy| {
                *lazy
                    .load_time
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
            })
            .fold((0, Duration::ZERO), |(count, sum), time| {
                (count + 1, sum + time)
            })
    }

    /// A uprobe_multi or session link of `program` at every file offset
    /// of `file` in `points` (with its attach cookie), for process `pid`
    /// only. The kernel is given the file's descriptor (`/proc/self/fd/N`,
    /// `SiteFile::attach_path`), never the target's path.
    pub fn link(
        &self,
        program: &str,
        file: &SiteFile,
        points: &[(u64, u64)],
        pid: u32,
    ) -> Result<OwnedFd> {
        let kind = self.kind;
        let (fd, is_return) = self.program(program)?;
        let path = file.attach_path()?;
        let path = path.as_path();
        let path_c = CString::new(path.as_os_str().as_encoded_bytes())
            .with_context(|| format!("{} has a NUL byte", path.display()))?;
        let offsets: Vec<u64> = points.iter().map(|&(offset, _)| offset).collect();
        let cookies: Vec<u64> = points.iter().map(|&(_, cookie)| cookie).collect();
        let attr = UprobeMultiLinkAttr {
            prog_fd: fd.as_raw_fd() as u32,
            attach_type: match kind {
                LinkKind::Multi => BPF_TRACE_UPROBE_MULTI,
                LinkKind::Session => BPF_TRACE_UPROBE_SESSION,
            },
            path: path_c.as_ptr() as u64,
            offsets: offsets.as_ptr() as u64,
            cookies: cookies.as_ptr() as u64,
            cnt: points.len() as u32,
            uprobe_flags: if is_return {
                BPF_F_UPROBE_MULTI_RETURN
            } else {
                0
            },
            pid,
            ..UprobeMultiLinkAttr::default()
        };
        bpf(BPF_LINK_CREATE, &attr).with_context(|| {
            format!(
                "could not attach {program} to {} offsets of {} (by its descriptor, {})",
                points.len(),
                file.name.display(),
                path.display()
            )
        })
    }
}
