//! uprobe *session* programs (Linux 6.13+), which aya 0.14 cannot load or
//! attach: raw `bpf(2)` calls, kept in this one module.
//!
//! A session program runs at a function's entry and, unless its entry
//! returned 1, again at its return, so a call that is not recorded (not
//! sampled, or outside `--min-size`/`--max-size`) pays for the entry only:
//! no return-address hijack, no return trap.
//!
//! The `*_session` programs of the tracer-ebpf object are relocated here
//! with aya-obj against the maps aya already created (the same fds, so the
//! programs share LIVE, BY_STACK, ... and the load-time globals), their
//! `bpf_session_is_return()` placeholder is turned into a kfunc call with
//! the id from the kernel's BTF, and they are loaded with expected attach
//! type `BPF_TRACE_UPROBE_SESSION` and attached with `BPF_LINK_CREATE`
//! (uprobe_multi, scoped to one PID). Any failure before the first attach
//! means the kernel lacks the feature: tracer then uses entry uprobes and
//! `alloc_return` uretprobes.

use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{Ebpf, maps::Map};
use aya_obj::{
    Object,
    btf::{Btf, BtfKind},
    generated::bpf_insn,
};

/// `bpf(2)` commands and constants (include/uapi/linux/bpf.h).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_TRACE_UPROBE_SESSION: u32 = 57;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
const BPF_JMP_CALL: u8 = 0x85;

/// The helper id tracer-ebpf's `session_is_return` calls as a placeholder.
const SESSION_IS_RETURN_PLACEHOLDER: i32 = 0x7ead_beef;
const SESSION_IS_RETURN_KFUNC: &str = "bpf_session_is_return";
/// Verifier log size kept for an error message.
const LOG_BYTES: usize = 64 * 1024;

/// `union bpf_attr` for BPF_PROG_LOAD, up to `expected_attach_type`.
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

/// The loaded session programs, by the name of their plain-uprobe twin
/// (`malloc_enter` -> `malloc_session`), and their links.
pub struct SessionPrograms {
    programs: HashMap<String, OwnedFd>,
    links: Vec<OwnedFd>,
}

impl SessionPrograms {
    /// Loads every `*_session` program of `object` against the maps of
    /// `ebpf` (loaded from the same object). An error means this kernel
    /// cannot run them.
    pub fn load(object: &[u8], ebpf: &Ebpf) -> Result<SessionPrograms> {
        let kfunc_id = Btf::from_sys_fs()
            .context("could not read the kernel's BTF")?
            .id_by_type_name_kind(SESSION_IS_RETURN_KFUNC, BtfKind::Func)
            .map_err(|_| anyhow!("the kernel has no {SESSION_IS_RETURN_KFUNC} (Linux < 6.13)"))?;
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
            .context("could not relocate the session programs' maps")?;
        obj.relocate_calls(&text_sections)
            .context("could not relocate the session programs' calls")?;

        let mut programs = HashMap::new();
        for (name, program) in &obj.programs {
            let Some(stem) = name.strip_suffix("_session") else {
                continue;
            };
            let mut instructions = obj.functions[&program.function_key()].instructions.clone();
            patch_kfunc_calls(&mut instructions, kfunc_id as i32);
            let fd = load_program(name, &instructions, &program.license)?;
            programs.insert(format!("{stem}_enter"), fd);
        }
        if programs.is_empty() {
            bail!("the eBPF object has no session programs");
        }
        Ok(SessionPrograms {
            programs,
            links: Vec::new(),
        })
    }

    /// Whether `entry_program` has a session twin.
    pub fn covers(&self, entry_program: &str) -> bool {
        self.programs.contains_key(entry_program)
    }

    /// Attaches the session twin of `entry_program` at `file_offset` of
    /// `path`, for process `pid` only, with attach cookie `cookie`.
    pub fn attach(
        &mut self,
        entry_program: &str,
        path: &Path,
        file_offset: u64,
        pid: u32,
        cookie: u64,
    ) -> Result<()> {
        let program = self
            .programs
            .get(entry_program)
            .with_context(|| format!("no session program for {entry_program}"))?;
        let path_c = CString::new(path.as_os_str().as_encoded_bytes())
            .with_context(|| format!("{} has a NUL byte", path.display()))?;
        let offsets = [file_offset];
        let cookies = [cookie];
        let attr = UprobeMultiLinkAttr {
            prog_fd: program.as_raw_fd() as u32,
            attach_type: BPF_TRACE_UPROBE_SESSION,
            path: path_c.as_ptr() as u64,
            offsets: offsets.as_ptr() as u64,
            cookies: cookies.as_ptr() as u64,
            cnt: 1,
            pid,
            ..UprobeMultiLinkAttr::default()
        };
        let fd = bpf(BPF_LINK_CREATE, &attr).with_context(|| {
            format!(
                "could not attach a uprobe session to {}+{file_offset:#x}",
                path.display()
            )
        })?;
        self.links.push(fd);
        Ok(())
    }

    /// Number of session links in place.
    pub fn link_count(&self) -> usize {
        self.links.len()
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

fn load_program(name: &str, instructions: &[bpf_insn], license: &CString) -> Result<OwnedFd> {
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
        expected_attach_type: BPF_TRACE_UPROBE_SESSION,
        ..ProgLoadAttr::default()
    };
    if let Ok(fd) = bpf(BPF_PROG_LOAD, &attr) {
        return Ok(fd);
    }
    // Again with the verifier's log, for the error message.
    attr.log_level = 1;
    attr.log_size = LOG_BYTES as u32;
    attr.log_buf = log.as_mut_ptr() as u64;
    let error = match bpf(BPF_PROG_LOAD, &attr) {
        Ok(fd) => return Ok(fd),
        Err(error) => error,
    };
    let text = String::from_utf8_lossy(&log);
    let last_lines: Vec<&str> = text.trim_end_matches('\0').lines().rev().take(3).collect();
    Err(error).with_context(|| {
        format!(
            "the kernel refused session program {name}: {}",
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
