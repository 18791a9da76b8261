//! The raw `bpf(2)` calls of `raw.rs`: the `union bpf_attr` layouts it
//! needs, loading the object's BTF and a program (with the verifier's last
//! lines when the kernel refuses it), a session program's kfunc patch,
//! and creating a link.

use std::{
    ffi::CString,
    os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::{Context as _, Result, bail};
use aya::maps::Map;
use aya_obj::{Object, generated::bpf_insn};

use super::FuncInfo;

/// `bpf(2)` commands and constants (include/uapi/linux/bpf.h).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_BTF_LOAD: libc::c_long = 18;
pub(super) const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
pub(super) const BPF_TRACE_UPROBE_MULTI: u32 = 48;
pub(super) const BPF_TRACE_UPROBE_SESSION: u32 = 57;
/// `uprobe_multi.flags`: the link's probes are return probes.
pub(super) const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
const BPF_JMP_CALL: u8 = 0x85;

/// The helper id tracer-ebpf's `session_is_return` calls as a placeholder.
const SESSION_IS_RETURN_PLACEHOLDER: i32 = 0x7ead_beef;
pub(super) const SESSION_IS_RETURN_KFUNC: &str = "bpf_session_is_return";
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
///
/// Wide: the kernel's `union bpf_attr` for BPF_PROG_LOAD, field for field.
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
///
/// Wide: the kernel's `union bpf_attr` for BPF_LINK_CREATE of uprobe_multi,
/// field for field.
#[repr(C)]
#[derive(Default)]
pub(super) struct UprobeMultiLinkAttr {
    pub(super) prog_fd: u32,
    pub(super) target_fd: u32,
    pub(super) attach_type: u32,
    pub(super) flags: u32,
    pub(super) path: u64,
    pub(super) offsets: u64,
    pub(super) ref_ctr_offsets: u64,
    pub(super) cookies: u64,
    pub(super) cnt: u32,
    pub(super) uprobe_flags: u32,
    pub(super) pid: u32,
    pub(super) pad: u32,
}

/// Blocks every signal on the calling thread, a verifying one: the
/// verifier gives up with EAGAIN when a signal is pending on its thread
/// (a SIGCHLD of `ldconfig`, a Ctrl-C), and the process's other threads
/// take them.
pub(in crate::attach) fn block_signals() {
    // SAFETY: a zeroed sigset filled by sigfillset, then set as this
    // thread's mask; neither call has other preconditions.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}

/// The fd of one of aya's maps.
pub(super) fn map_fd(map: &Map) -> Result<i32> {
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
pub(super) fn patch_kfunc_calls(instructions: &mut [bpf_insn], kfunc_id: i32) {
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
pub(super) fn load_btf(obj: &mut Object) -> Result<Option<OwnedFd>> {
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
pub(super) fn load_program(
    name: &str,
    instructions: &[bpf_insn],
    license: &CString,
    expected_attach_type: u32,
    func_info: Option<&FuncInfo>,
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
    if let Some(info) = func_info {
        attr.prog_btf_fd = info.btf.as_raw_fd() as u32;
        attr.func_info_rec_size = info.record_bytes;
        attr.func_info = info.records.as_ptr() as u64;
        attr.func_info_cnt = info.records.len() as u32;
    }
    // EAGAIN: a signal came to the verifying thread; the load is to be
    // made again.
    let mut first = None;
    for _ in 0..5 {
        match bpf(BPF_PROG_LOAD, &attr) {
            Ok(fd) => return Ok(fd),
            Err(error) if error.raw_os_error() == Some(libc::EAGAIN) => first = Some(error),
            Err(error) => {
                first = Some(error);
                break;
            }
        }
    }
    let first = first.expect("at least one load was tried");
    // Again with the verifier's verdict alone (BPF_LOG_STATS): a bound
    // passed (the stack of a chain of calls, the program's size) is said
    // there in one line, which a full log, rotated, may have lost.
    attr.log_level = LOG_STATS;
    attr.log_size = LOG_BYTES as u32;
    attr.log_buf = log.as_mut_ptr() as u64;
    if let Ok(fd) = bpf(BPF_PROG_LOAD, &attr) {
        return Ok(fd);
    }
    let verdict: Vec<String> = String::from_utf8_lossy(&log)
        .trim_end_matches('\0')
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !is_stats_line(line))
        .map(String::from)
        .collect();
    if !verdict.is_empty() {
        return Err(first).with_context(|| {
            format!("the kernel refused program {name}: {}", verdict.join(" / "))
        });
    }
    // Else with the full log: it is rotated, so its last lines say where
    // the verifier stopped (a log too long for the buffer fails with
    // ENOSPC, so the first error is kept).
    log.fill(0);
    attr.log_level = 1;
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

/// `BPF_LOG_STATS`: the verifier's log holds its verdict and statistics.
const LOG_STATS: u32 = 4;

/// A line of the verifier's statistics, or of its notes on global
/// functions: not the reason a program was refused.
fn is_stats_line(line: &str) -> bool {
    line.starts_with("verification time")
        || line.starts_with("stack depth")
        || line.starts_with("processed ")
        || line.ends_with("is global and assumed valid.")
}

/// `bpf(cmd, attr, sizeof attr)`, returning the new fd.
pub(super) fn bpf<T>(command: libc::c_long, attr: &T) -> std::io::Result<OwnedFd> {
    let result = bpf_call(command, attr)?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(result as i32) })
}

/// `bpf(cmd, attr, sizeof attr)`, returning what it returned.
fn bpf_call<T>(command: libc::c_long, attr: &T) -> std::io::Result<libc::c_long> {
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
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::is_stats_line;

    #[test]
    fn the_verdict_is_told_from_the_statistics() {
        // A BPF_LOG_STATS log of Linux 6.18, for a program whose chain of
        // calls passed the stack bound.
        let log = "func#6 ('tracer_python_window') is global and assumed valid.\n\
                   combined stack size of 3 calls is 528. Too large\n\
                   verification time 375937 usec\n\
                   stack depth 280+0+32+40+48+128+16+16+136+0+96+136+8+16\n\
                   processed 93010 insns (limit 1000000) max_states_per_insn 16";
        let verdict: Vec<&str> = log.lines().filter(|line| !is_stats_line(line)).collect();
        assert_eq!(
            verdict,
            ["combined stack size of 3 calls is 528. Too large"]
        );
    }
}
