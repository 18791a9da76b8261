//! Chooses where in a function its probes go, so that the kernel emulates
//! the probed instruction instead of single-stepping it.
//!
//! A uprobe on an instruction the kernel cannot emulate costs a single-step
//! trap: ~16 µs per call on a VM instead of ~0.45 µs (KERNEL-NOTES.md).
//! glibc's `free` starts with `test %rdi,%rdi`, `posix_memalign` with a
//! `cmpb` on a global, CET builds with `endbr64`. So the function is decoded
//! (iced-x86) and the probe moves to the first instruction the kernel
//! emulates (x86 `arch_uprobe_analyze_insn`: `push` of a register, relative
//! `jmp`/`call`/`jcc`, `nop` without a 0x66 prefix), but only when every
//! instruction before it provably
//!
//! - falls through to the next one (no branch, call or return),
//! - writes no argument register, no stack pointer and no memory,
//!
//! and no branch anywhere in the function lands inside the skipped bytes or
//! on the site itself (the probe would fire twice). An entry probe there
//! reads the same arguments as at the entry, and a return probe still finds
//! the return address at the top of the stack. Otherwise the probe stays at
//! the entry, single-stepped, and the reason says why.
//!
//! The site is a `jcc` when one comes first (glibc's `free`: `je` at +3):
//! the kernel evaluates the branch itself, so no call misses the probe, not
//! even `free(NULL)`.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Formatter as _, GasFormatter, Instruction,
    InstructionInfoFactory, OpAccess, Register,
};

/// Where a function's probes go, and why there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSite {
    /// Bytes after the function's entry.
    pub offset: u64,
    /// Whether the kernel emulates the instruction there (cheap), or must
    /// single-step it (expensive).
    pub emulated: bool,
    /// One sentence for `tracer record -v` and the JSON report.
    pub reason: String,
}

/// How far past the entry a site may be.
const MAX_SKIP_BYTES: u64 = 48;
/// How much of a function of unknown size is searched for branches into
/// the skipped bytes.
const UNKNOWN_SIZE_SCAN_BYTES: usize = 4096;

/// The registers that carry integer arguments in the x86-64 SysV ABI.
const ARGUMENT_REGISTERS: [Register; 6] = [
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
];

/// Decodes `code` (the function, from its entry; `function_bytes` long, or
/// 0 when the symbol has no size) and returns where to probe it.
pub fn choose_site(code: &[u8], function_bytes: u64) -> ProbeSite {
    let scanned = match usize::try_from(function_bytes) {
        Ok(0) | Err(_) => code.len().min(UNKNOWN_SIZE_SCAN_BYTES),
        Ok(size) => code.len().min(size),
    };
    let code = &code[..scanned];
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut instruction = Instruction::default();
    while decoder.can_decode() && decoder.position() as u64 <= MAX_SKIP_BYTES {
        decoder.decode_out(&mut instruction);
        let offset = instruction.ip();
        let text = format_instruction(&instruction);
        if instruction.is_invalid() {
            return entry(code, format!("cannot decode the instruction at +{offset}"));
        }
        if is_emulated(&instruction, code) {
            if offset == 0 {
                return ProbeSite {
                    offset: 0,
                    emulated: true,
                    reason: format!("entry instruction `{text}` is emulated"),
                };
            }
            if let Some(source) = branch_into(code, offset) {
                return entry(
                    code,
                    format!("the branch at +{source} lands inside the first {offset} bytes"),
                );
            }
            return ProbeSite {
                offset,
                emulated: true,
                reason: format!(
                    "moved past `{}` (would be single-stepped) to `{text}` at +{offset} \
                     (emulated): argument registers and stack pointer unchanged",
                    skipped.join("; ")
                ),
            };
        }
        if let Some(why) = unsafe_to_skip(&instruction, &mut info) {
            return entry(code, format!("`{text}` at +{offset} {why}"));
        }
        skipped.push(text);
    }
    entry(
        code,
        format!("no emulated instruction in the first {MAX_SKIP_BYTES} bytes"),
    )
}

/// The entry as the site, with the reason it could not move.
fn entry(code: &[u8], why: String) -> ProbeSite {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let first = decoder.decode();
    let emulated = !first.is_invalid() && is_emulated(&first, code);
    let reason = if emulated {
        format!(
            "entry instruction `{}` is emulated",
            format_instruction(&first)
        )
    } else {
        format!(
            "entry instruction `{}` is single-stepped (~16 µs per call on a VM); kept \
             there because {why}",
            format_instruction(&first)
        )
    };
    ProbeSite {
        offset: 0,
        emulated,
        reason,
    }
}

/// Whether the kernel emulates the instruction (no single-step).
fn is_emulated(instruction: &Instruction, code: &[u8]) -> bool {
    let start = instruction.ip() as usize;
    let bytes = &code[start..start + instruction.len()];
    match instruction.code() {
        // `push %reg`: opcode 0x50+r, optionally REX.B (0x41); nothing else.
        Code::Push_r64 => matches!(bytes, [0x50..=0x57] | [0x41, 0x50..=0x57]),
        Code::Jmp_rel8_64 | Code::Jmp_rel32_64 | Code::Call_rel32_64 => !has_prefix_66(bytes),
        _ if instruction.is_jcc_short_or_near() => !has_prefix_66(bytes),
        // 0x90 and 0f 1f /0 nops; the kernel rejects a 0x66 prefix.
        Code::Nopd | Code::Nopq | Code::Nop_rm32 | Code::Nop_rm64 => !has_prefix_66(bytes),
        _ => false,
    }
}

fn has_prefix_66(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .take_while(|&&byte| matches!(byte, 0x66 | 0x67 | 0xf2 | 0xf3 | 0x2e | 0x3e | 0x40..=0x4f))
        .any(|&byte| byte == 0x66)
}

/// Why a probe may not move past this instruction, if it may not.
fn unsafe_to_skip(instruction: &Instruction, info: &mut InstructionInfoFactory) -> Option<String> {
    if instruction.flow_control() != FlowControl::Next {
        return Some("branches, calls or returns".to_owned());
    }
    let used = info.info(instruction);
    for register in used.used_registers() {
        let written = matches!(
            register.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        );
        if !written {
            continue;
        }
        let full = register.register().full_register();
        if full == Register::RSP {
            return Some("moves the stack pointer".to_owned());
        }
        if ARGUMENT_REGISTERS.contains(&full) {
            return Some(format!(
                "writes argument register %{}",
                format!("{full:?}").to_lowercase()
            ));
        }
    }
    let writes_memory = used.used_memory().iter().any(|memory| {
        !matches!(
            memory.access(),
            OpAccess::Read | OpAccess::CondRead | OpAccess::NoMemAccess
        )
    });
    writes_memory.then(|| "writes memory".to_owned())
}

/// Offset of a branch in the function whose target lies in (0, `site`].
fn branch_into(code: &[u8], site: u64) -> Option<u64> {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        let branches = matches!(
            instruction.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
        );
        if branches && (1..=site).contains(&instruction.near_branch_target()) {
            return Some(instruction.ip());
        }
    }
    None
}

/// AT&T syntax, as objdump prints it; branch targets and rip-relative
/// operands relative to the function's entry.
fn format_instruction(instruction: &Instruction) -> String {
    let mut formatter = GasFormatter::new();
    let options = formatter.options_mut();
    options.set_uppercase_hex(false);
    options.set_branch_leading_zeros(false);
    options.set_rip_relative_addresses(true);
    let mut text = String::new();
    formatter.format(instruction, &mut text);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The site for `code` (the whole function).
    fn site(code: &[u8]) -> (u64, bool) {
        let site = choose_site(code, code.len() as u64);
        (site.offset, site.emulated)
    }

    #[test]
    fn glibc_236_free_probes_its_null_check_branch() {
        // test %rdi,%rdi; je +0xbf; push %rbp; lea -0x10(%rdi),%rsi
        let code = [
            0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0, 0, 0x55, 0x48, 0x8d, 0x77, 0xf0,
        ];
        let chosen = choose_site(&code, code.len() as u64);
        assert_eq!((chosen.offset, chosen.emulated), (3, true));
        assert!(
            chosen.reason.contains("test %rdi,%rdi"),
            "{}",
            chosen.reason
        );
    }

    #[test]
    fn push_at_entry_stays() {
        // malloc: push %r12; push %rbp
        let chosen = choose_site(&[0x41, 0x54, 0x55], 3);
        assert_eq!((chosen.offset, chosen.emulated), (0, true));
        assert_eq!(chosen.reason, "entry instruction `push %r12` is emulated");
    }

    #[test]
    fn posix_memalign_moves_past_cmpb() {
        // cmpb $0x0,0x140201(%rip); push %r12
        let code = [0x80, 0x3d, 0x01, 0x02, 0x14, 0x00, 0x00, 0x41, 0x54];
        assert_eq!(site(&code), (7, true));
    }

    #[test]
    fn rip_relative_load_into_a_scratch_register_is_skipped() {
        // mov 0x1234(%rip),%rax; push %rbx
        let code = [0x48, 0x8b, 0x05, 0x34, 0x12, 0x00, 0x00, 0x53];
        assert_eq!(site(&code), (7, true));
        // mov 0x1234(%rip),%rdx overwrites the third argument: entry.
        let code = [0x48, 0x8b, 0x15, 0x34, 0x12, 0x00, 0x00, 0x53];
        let chosen = choose_site(&code, code.len() as u64);
        assert_eq!((chosen.offset, chosen.emulated), (0, false));
        assert!(chosen.reason.contains("%rdx"), "{}", chosen.reason);
    }

    #[test]
    fn stack_pointer_and_memory_writes_stop_the_search() {
        // sub $0x18,%rsp; push %rbx
        let code = [0x48, 0x83, 0xec, 0x18, 0x53];
        let chosen = choose_site(&code, code.len() as u64);
        assert_eq!((chosen.offset, chosen.emulated), (0, false));
        assert!(chosen.reason.contains("stack pointer"), "{}", chosen.reason);
        // mov %rax,0x8(%rsp); push %rbx
        let code = [0x48, 0x89, 0x44, 0x24, 0x08, 0x53];
        assert_eq!(site(&code), (0, false));
    }

    #[test]
    fn a_return_before_any_emulated_instruction_keeps_the_entry() {
        // mov %rdi,%rax (rax is no argument); ret
        assert_eq!(site(&[0x48, 0x89, 0xf8, 0xc3]), (0, false));
    }

    #[test]
    fn memalign_probes_its_branch() {
        // cmpb $0,...(%rip); je +7; push %rbp
        let code = [0x80, 0x3d, 0x71, 0x0e, 0x14, 0x00, 0x00, 0x74, 0x07, 0x55];
        assert_eq!(site(&code), (7, true));
    }

    #[test]
    fn libstdcxx_operator_new_moves_to_its_push() {
        // _Znwm: endbr64; test %rdi,%rdi; mov $0x1,%eax; push %rbx
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x85, 0xff, 0xb8, 1, 0, 0, 0, 0x53,
        ];
        assert_eq!(site(&code), (12, true));
        // _Znam: endbr64; jmp _Znwm
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0xe9, 0x93, 0xff, 0xff, 0xff];
        assert_eq!(site(&code), (4, true));
    }

    #[test]
    fn endbr64_is_stepped_over() {
        assert_eq!(site(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55]), (4, true));
    }

    #[test]
    fn a_branch_back_into_the_skipped_bytes_keeps_the_entry() {
        // endbr64; push %rbp; ...; jmp back to +4 (the push)
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x90, 0xeb, 0xfc];
        let chosen = choose_site(&code, code.len() as u64);
        assert_eq!((chosen.offset, chosen.emulated), (0, false));
        assert!(chosen.reason.contains("+6"), "{}", chosen.reason);
    }

    #[test]
    fn nop_with_0x66_prefix_is_not_emulated() {
        // xchg %ax,%ax (66 90) is stepped over; push %rbx
        assert_eq!(site(&[0x66, 0x90, 0x53]), (2, true));
        assert_eq!(site(&[0x90, 0x53]), (0, true));
    }
}
