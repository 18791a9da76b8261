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

use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{Ebpf, maps::Map};
use aya_obj::{
    Function, Object, ProgramSection,
    btf::{Btf, BtfKind},
    generated::bpf_insn,
};

/// `bpf(2)` commands and constants (include/uapi/linux/bpf.h).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_BTF_LOAD: libc::c_long = 18;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
const BPF_TRACE_UPROBE_SESSION: u32 = 57;
/// `uprobe_multi.flags`: the link's probes are return probes.
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
const BPF_JMP_CALL: u8 = 0x85;

/// The helper id tracer-ebpf's `session_is_return` calls as a placeholder.
const SESSION_IS_RETURN_PLACEHOLDER: i32 = 0x7ead_beef;
const SESSION_IS_RETURN_KFUNC: &str = "bpf_session_is_return";
/// Verifier log size kept for an error message.
const LOG_BYTES: usize = 64 * 1024;

/// `union bpf_attr` for BPF_BTF_LOAD.
#[repr(C)]
#[derive(Default)]
struct BtfLoadAttr {
    btf: u64,
    btf_log_buf: u64,
    btf_size: u32,
    btf_log_size: u32,
    btf_log_level: u32,
}

/// `union bpf_attr` for BPF_PROG_LOAD, up to `func_info_cnt`.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
}

/// `union bpf_attr` for BPF_LINK_CREATE of a uprobe_multi link.
#[repr(C)]
#[derive(Default)]
struct UprobeMultiLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    uprobe_flags: u32,
    pid: u32,
    pad: u32,
}

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
    /// Loads the programs of `object` that links of `kind` take, against
    /// the maps of `ebpf` (loaded from the same object). An error means
    /// this kernel cannot run them.
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
            let fd = load_program(
                name,
                &instructions,
                &program.license,
                attach_type,
                btf.as_ref().map(|btf| (btf, function)),
            )?;
            programs.insert(key, (fd, is_return));
        }
        if programs.is_empty() {
            bail!("the eBPF object has no programs for {kind:?} links");
        }
        Ok(RawPrograms {
            programs: Linker { kind, programs },
            links: Vec::new(),
            probe_count: 0,
        })
    }

    /// Whether `program` (for sessions: the plain-uprobe twin's name) is
    /// here.
    pub fn covers(&self, program: &str) -> bool {
        self.programs.covers(program)
    }

    /// Attaches `program` at every file offset of `path` in `points`
    /// (with its attach cookie), for process `pid` only, in one link.
    pub fn attach(
        &mut self,
        program: &str,
        path: &Path,
        points: &[(u64, u64)],
        pid: u32,
    ) -> Result<()> {
        let link = self.programs.link(program, path, points, pid)?;
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
}

/// Programs of one link kind, by name, that links are made of: those of
/// a [`RawPrograms`], or a copy of them for another thread.
pub struct Linker {
    pub kind: LinkKind,
    /// Each program and whether it is a return probe.
    programs: HashMap<String, (OwnedFd, bool)>,
}

impl Linker {
    /// The same programs through duplicated descriptors.
    fn try_clone(&self) -> Result<Linker> {
        let programs = self
            .programs
            .iter()
            .map(|(name, (fd, is_return))| {
                let fd = fd
                    .try_clone()
                    .with_context(|| format!("could not duplicate program {name}"))?;
                Ok((name.clone(), (fd, *is_return)))
            })
            .collect::<Result<_>>()?;
        Ok(Linker {
            kind: self.kind,
            programs,
        })
    }

    /// Whether `program` (for sessions: the plain-uprobe twin's name) is
    /// here.
    pub fn covers(&self, program: &str) -> bool {
        self.programs.contains_key(program)
    }

    /// A uprobe_multi or session link of `program` at every file offset
    /// of `path` in `points` (with its attach cookie), for process `pid`
    /// only.
    pub fn link(
        &self,
        program: &str,
        path: &Path,
        points: &[(u64, u64)],
        pid: u32,
    ) -> Result<OwnedFd> {
        let kind = self.kind;
        let (fd, is_return) = self
            .programs
            .get(program)
            .with_context(|| format!("no {kind:?} program {program}"))?;
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
            uprobe_flags: if *is_return {
                BPF_F_UPROBE_MULTI_RETURN
            } else {
                0
            },
            pid,
            ..UprobeMultiLinkAttr::default()
        };
        bpf(BPF_LINK_CREATE, &attr).with_context(|| {
            format!(
                "could not attach {program} to {} offsets of {}",
                points.len(),
                path.display()
            )
        })
    }
}

/// The fd of one of aya's maps.
fn map_fd(map: &Map) -> Result<i32> {
    let data = match map {
        Map::Array(data)
        | Map::HashMap(data)
        | Map::LruHashMap(data)
        | Map::PerCpuArray(data)
        | Map::StackTraceMap(data)
        | Map::Queue(data)
        | Map::RingBuf(data) => data,
        _ => bail!("unexpected map type in the eBPF object"),
    };
    Ok(data.fd().as_fd().as_raw_fd())
}

/// Turns the placeholder helper calls into calls of the kfunc `kfunc_id`
/// (in vmlinux's BTF: `off` 0).
fn patch_kfunc_calls(instructions: &mut [bpf_insn], kfunc_id: i32) {
    for instruction in instructions {
        if instruction.code == BPF_JMP_CALL
            && instruction.src_reg() == 0
            && instruction.imm == SESSION_IS_RETURN_PLACEHOLDER
        {
            instruction.set_src_reg(BPF_PSEUDO_KFUNC_CALL);
            instruction.off = 0;
            instruction.imm = kfunc_id;
        }
    }
}

/// Loads the object's BTF (fixed up for this kernel, as aya does for its
/// own programs) into the kernel; `None` when the object or the kernel
/// has none.
fn load_btf(obj: &mut Object) -> Result<Option<OwnedFd>> {
    let Some(features) = aya::features().btf() else {
        return Ok(None);
    };
    let Some(btf) = obj
        .fixup_and_sanitize_btf(features)
        .context("could not prepare the eBPF object's BTF")?
    else {
        return Ok(None);
    };
    let bytes = btf.to_bytes();
    let attr = BtfLoadAttr {
        btf: bytes.as_ptr() as u64,
        btf_size: bytes.len() as u32,
        ..BtfLoadAttr::default()
    };
    let fd = bpf(BPF_BTF_LOAD, &attr).context("the kernel refused the eBPF object's BTF")?;
    Ok(Some(fd))
}

/// Loads one program; with `btf`, its function info (each subprogram's
/// BTF type) goes with it.
fn load_program(
    name: &str,
    instructions: &[bpf_insn],
    license: &CString,
    expected_attach_type: u32,
    btf: Option<(&OwnedFd, &Function)>,
) -> Result<OwnedFd> {
    let mut prog_name = [0u8; 16];
    for (slot, byte) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *slot = byte;
    }
    let mut log = vec![0u8; LOG_BYTES];
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: instructions.len() as u32,
        insns: instructions.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name,
        expected_attach_type,
        ..ProgLoadAttr::default()
    };
    if let Some((btf, function)) = btf
        && !function.func_info.func_info.is_empty()
    {
        attr.prog_btf_fd = btf.as_raw_fd() as u32;
        attr.func_info_rec_size = function.func_info_rec_size as u32;
        attr.func_info = function.func_info.func_info.as_ptr() as u64;
        attr.func_info_cnt = function.func_info.func_info.len() as u32;
    }
    let first = match bpf(BPF_PROG_LOAD, &attr) {
        Ok(fd) => return Ok(fd),
        Err(error) => error,
    };
    // Again with the verifier's log, for the error message. The log is
    // rotated: its last lines say where the verifier stopped (a log too
    // long for the buffer fails with ENOSPC, so the first error is kept).
    attr.log_level = 1;
    attr.log_size = LOG_BYTES as u32;
    attr.log_buf = log.as_mut_ptr() as u64;
    if let Ok(fd) = bpf(BPF_PROG_LOAD, &attr) {
        return Ok(fd);
    }
    let text = String::from_utf8_lossy(&log);
    let last_lines: Vec<&str> = text.trim_end_matches('\0').lines().rev().take(3).collect();
    Err(first).with_context(|| {
        format!(
            "the kernel refused program {name}: {}",
            last_lines.into_iter().rev().collect::<Vec<_>>().join(" / ")
        )
    })
}

/// `bpf(cmd, attr, sizeof attr)`, returning the new fd.
fn bpf<T>(command: libc::c_long, attr: &T) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a live, fully initialized #[repr(C)] bpf_attr
    // prefix; every pointer in it outlives the call.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *const T,
            size_of::<T>() as libc::c_uint,
        )
    };
    if result < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(result as i32) })
}
