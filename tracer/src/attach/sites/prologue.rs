//! Chooses where in a function its probes go, so that the kernel emulates
//! the probed instruction instead of single-stepping it.
//!
//! A uprobe on an instruction the kernel cannot emulate costs a single-step
//! trap: ~16 µs per call on a VM instead of ~0.45 µs (KERNEL-NOTES.md).
//! glibc's `free` starts with `test %rdi,%rdi`, jemalloc's with
//! `mov %rdi,%rax`, mimalloc's `malloc` with a `%rip`-relative load, CET
//! builds with `endbr64`. So the function is decoded (iced-x86) and the
//! probe moves to the first instruction the kernel emulates (x86
//! `arch_uprobe_analyze_insn`: `push` of a register, relative
//! `jmp`/`call`/`jcc`, `nop` without a 0x66 prefix), but only when every
//! instruction before it provably
//!
//! - falls through to the next one (no branch, call or return),
//! - moves no stack pointer and writes no memory,
//! - leaves every argument of *that* function's signature (`SIGNATURES`)
//!   in a register: its own, or one it was copied into by a 64-bit
//!   register move (mimalloc's `malloc`: `mov %rdi,%rsi` before it loads
//!   the heap into `%rdi`; the probe then reads the size from `%rsi`),
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
//!
//! Long: the decoder of function prologues: a rule per instruction shape the
//! kernel emulates.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Formatter as _, GasFormatter, Instruction,
    InstructionInfoFactory, OpAccess, OpKind, Register,
};
use object::{Object as _, ObjectSegment as _};

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
    /// The arguments that are no longer in their own register at the site:
    /// (argument index, the register that holds it there).
    pub moved_arguments: Vec<(usize, Register)>,
}

/// How far past the entry a site may be (jemalloc 5.3's `free` needs 48).
const MAX_SKIP_BYTES: u64 = 64;
/// How much of a function of unknown size is searched for branches into
/// the skipped bytes.
const UNKNOWN_SIZE_SCAN_BYTES: usize = 4096;

/// The registers that carry integer arguments in the x86-64 SysV ABI.
pub const ARGUMENT_REGISTERS: [Register; 6] = [
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
];

/// How many integer arguments each hooked function takes (its C or C++
/// signature; mangled names for C++). A site must keep these, and only
/// these, readable. A function missing here keeps all six.
pub const SIGNATURES: &[(&str, usize)] = &[
    // C: glibc and every allocator that replaces it.
    ("malloc", 1),
    ("free", 1),
    ("calloc", 2),
    ("realloc", 2),
    ("reallocarray", 3),
    ("posix_memalign", 3),
    ("aligned_alloc", 2),
    ("memalign", 2),
    ("valloc", 1),
    ("pvalloc", 1),
    // The unwinder's entry points (`exceptions`): their arguments are not read.
    ("_Unwind_RaiseException", 1),
    ("_Unwind_Resume_or_Rethrow", 1),
    ("_Unwind_ForcedUnwind", 3),
    // operator new(size_t), new[](size_t), nothrow (+ const nothrow_t&),
    // aligned (+ align_val_t).
    ("_Znwm", 1),
    ("_Znam", 1),
    ("_ZnwmRKSt9nothrow_t", 2),
    ("_ZnamRKSt9nothrow_t", 2),
    ("_ZnwmSt11align_val_t", 2),
    ("_ZnamSt11align_val_t", 2),
    ("_ZnwmSt11align_val_tRKSt9nothrow_t", 3),
    ("_ZnamSt11align_val_tRKSt9nothrow_t", 3),
    // operator delete(void*), sized (+ size_t), nothrow, aligned.
    ("_ZdlPv", 1),
    ("_ZdaPv", 1),
    ("_ZdlPvm", 2),
    ("_ZdaPvm", 2),
    ("_ZdlPvRKSt9nothrow_t", 2),
    ("_ZdaPvRKSt9nothrow_t", 2),
    ("_ZdlPvSt11align_val_t", 2),
    ("_ZdaPvSt11align_val_t", 2),
    ("_ZdlPvmSt11align_val_t", 3),
    ("_ZdaPvmSt11align_val_t", 3),
    ("_ZdlPvSt11align_val_tRKSt9nothrow_t", 3),
    ("_ZdaPvSt11align_val_tRKSt9nothrow_t", 3),
    // jemalloc's own API (also with the je_ and _rjem_ prefixes, below).
    ("mallocx", 2),
    ("rallocx", 3),
    ("dallocx", 2),
    ("sdallocx", 3),
    // tcmalloc's own names (aliases of the C and C++ ones in Debian).
    ("tc_malloc", 1),
    ("tc_malloc_skip_new_handler", 1),
    ("tc_calloc", 2),
    ("tc_realloc", 2),
    ("tc_free", 1),
    ("tc_free_sized", 2),
    ("tc_memalign", 2),
    ("tc_posix_memalign", 3),
    ("tc_valloc", 1),
    ("tc_pvalloc", 1),
    ("tc_new", 1),
    ("tc_newarray", 1),
    ("tc_new_nothrow", 2),
    ("tc_newarray_nothrow", 2),
    ("tc_delete", 1),
    ("tc_deletearray", 1),
    ("tc_delete_sized", 2),
    ("tc_deletearray_sized", 2),
    // mimalloc's own API.
    ("mi_malloc", 1),
    ("mi_zalloc", 1),
    ("mi_calloc", 2),
    ("mi_mallocn", 2),
    ("mi_realloc", 2),
    ("mi_reallocn", 3),
    ("mi_reallocarray", 3),
    ("mi_free", 1),
    ("mi_free_size", 2),
    ("mi_free_aligned", 2),
    ("mi_free_size_aligned", 3),
    ("mi_malloc_aligned", 2),
    ("mi_zalloc_aligned", 2),
    ("mi_calloc_aligned", 3),
    ("mi_realloc_aligned", 3),
    ("mi_aligned_alloc", 2),
    ("mi_posix_memalign", 3),
    ("mi_memalign", 2),
    ("mi_valloc", 1),
    ("mi_pvalloc", 1),
    ("mi_new", 1),
    ("mi_new_nothrow", 1),
    ("mi_new_aligned", 2),
    ("mi_new_aligned_nothrow", 2),
    ("mi_new_n", 2),
    // CUDA driver (libcuda) and runtime (libcudart).
    ("cuMemAlloc_v2", 2),
    ("cuMemAllocPitch_v2", 5),
    ("cuMemAllocManaged", 3),
    ("cuMemAllocHost_v2", 2),
    ("cuMemHostAlloc", 3),
    ("cuMemAllocAsync", 3),
    ("cuMemAllocFromPoolAsync", 4),
    ("cuMemFree_v2", 1),
    ("cuMemFreeHost", 1),
    ("cuMemFreeAsync", 2),
    ("cuMemCreate", 4),
    ("cuMemRelease", 1),
    ("cuMemMap", 5),
    ("cuMemUnmap", 2),
    ("cuCtxDestroy_v2", 1),
    ("cuDevicePrimaryCtxReset_v2", 1),
    ("cudaMalloc", 2),
    ("cudaMallocManaged", 3),
    ("cudaMallocHost", 2),
    ("cudaHostAlloc", 3),
    ("cudaMallocPitch", 4),
    ("cudaMallocAsync", 3),
    ("cudaMallocFromPoolAsync", 4),
    ("cudaFree", 1),
    ("cudaFreeHost", 1),
    ("cudaFreeAsync", 2),
    ("cudaDeviceReset", 0),
];

/// The prefixes a statically linked jemalloc puts before its names
/// (`--with-jemalloc-prefix`): redis' own build, Rust's tikv-jemallocator.
pub const JEMALLOC_PREFIXES: [&str; 2] = ["je_", "_rjem_"];

/// The integer argument registers of `symbol`, from `SIGNATURES` or a
/// runtime's family (`family::signature`) (a
/// prefixed jemalloc name as the plain one); all six when unknown.
pub fn argument_registers(symbol: &str) -> &'static [Register] {
    let plain = JEMALLOC_PREFIXES
        .iter()
        .find_map(|prefix| symbol.strip_prefix(prefix))
        .unwrap_or(symbol);
    let count = SIGNATURES
        .iter()
        .find(|(name, _)| *name == plain)
        .map(|&(_, count)| count)
        .or_else(|| crate::attach::sites::family::signature(plain))
        .unwrap_or(ARGUMENT_REGISTERS.len());
    &ARGUMENT_REGISTERS[..count]
}

/// Where each argument is while the prologue is skipped: the registers
/// that hold it.
struct ArgumentLocations {
    /// Per argument, the registers holding it (its own first).
    held_in: Vec<Vec<Register>>,
}

impl ArgumentLocations {
    fn new(arguments: &[Register]) -> ArgumentLocations {
        ArgumentLocations {
            held_in: arguments.iter().map(|&register| vec![register]).collect(),
        }
    }

    /// Follows one instruction that falls through: a 64-bit register move
    /// copies an argument; any other register write forgets what the
    /// register held. The argument that is left nowhere, if one is.
    fn follow(
        &mut self,
        instruction: &Instruction,
        written: &[Register],
        follow_copies: bool,
    ) -> Option<usize> {
        let copy = (follow_copies
            && matches!(instruction.code(), Code::Mov_rm64_r64 | Code::Mov_r64_rm64)
            && instruction.op0_kind() == OpKind::Register
            && instruction.op1_kind() == OpKind::Register)
            .then(|| (instruction.op1_register(), instruction.op0_register()));
        let copied: Vec<usize> = copy
            .map(|(source, _)| {
                (0..self.held_in.len())
                    .filter(|&argument| self.held_in[argument].contains(&source))
                    .collect()
            })
            .unwrap_or_default();
        for held in &mut self.held_in {
            held.retain(|register| !written.contains(register));
        }
        if let Some((_, destination)) = copy {
            for argument in copied {
                self.held_in[argument].push(destination);
            }
        }
        self.held_in.iter().position(Vec::is_empty)
    }

    /// The arguments not in their own register, and where they are.
    fn moved(&self, arguments: &[Register]) -> Vec<(usize, Register)> {
        self.held_in
            .iter()
            .enumerate()
            .filter(|(argument, held)| !held.contains(&arguments[*argument]))
            .map(|(argument, held)| (argument, held[0]))
            .collect()
    }
}

/// Decodes `code` (the function, from its entry; `function_bytes` long, or
/// 0 when the symbol has no size) and returns where to probe it so that
/// `arguments` (its integer argument registers) can still be read there.
/// With `follow_copies`, an argument may be read from a register it was
/// copied into (the entry program must be told, see `moved_arguments`).
pub fn choose_site(
    code: &[u8],
    function_bytes: u64,
    arguments: &[Register],
    follow_copies: bool,
) -> ProbeSite {
    let scanned = match usize::try_from(function_bytes) {
        Ok(0) | Err(_) => code.len().min(UNKNOWN_SIZE_SCAN_BYTES),
        Ok(size) => code.len().min(size),
    };
    let code = &code[..scanned];
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut locations = ArgumentLocations::new(arguments);
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
                    moved_arguments: Vec::new(),
                };
            }
            if let Some(source) = branch_into(code, offset) {
                return entry(
                    code,
                    format!("the branch at +{source} lands inside the first {offset} bytes"),
                );
            }
            let moved_arguments = locations.moved(arguments);
            let reads = moved_arguments
                .iter()
                .map(|&(argument, register)| {
                    format!(
                        "; reads {} from {}",
                        register_name(arguments[argument]),
                        register_name(register)
                    )
                })
                .collect::<String>();
            return ProbeSite {
                offset,
                emulated: true,
                reason: format!(
                    "moved past `{}` (would be single-stepped) to `{text}` at +{offset} \
                     (emulated): {} arguments and stack pointer kept{reads}",
                    skipped.join("; "),
                    arguments.len()
                ),
                moved_arguments,
            };
        }
        if let Some(why) = unsafe_to_skip(
            &instruction,
            &mut info,
            arguments,
            &mut locations,
            follow_copies,
        ) {
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
        moved_arguments: Vec::new(),
    }
}

/// Where the function jumps when all it does is pass its call on: its
/// first instructions only shuffle registers, then a direct `jmp` (an
/// offset from the entry). libstdc++'s `operator delete` is
/// `endbr64; jmp free@plt`, mimalloc's `posix_memalign` is
/// `jmp mi_posix_memalign@plt`. Such a function needs no probe of its own
/// when its target has one.
pub fn tail_jump_target(code: &[u8]) -> Option<i64> {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut instruction = Instruction::default();
    while decoder.can_decode() && decoder.position() as u64 <= MAX_SKIP_BYTES {
        decoder.decode_out(&mut instruction);
        if matches!(instruction.code(), Code::Jmp_rel8_64 | Code::Jmp_rel32_64) {
            return Some(instruction.near_branch_target() as i64);
        }
        let used = info.info(&instruction);
        let passes_on = instruction.flow_control() == FlowControl::Next
            && !instruction.is_invalid()
            && used
                .used_memory()
                .iter()
                .all(|memory| memory.access() == OpAccess::Read)
            && used.used_registers().iter().all(|register| {
                register.register().full_register() != Register::RSP
                    || register.access() == OpAccess::Read
            });
        if !passes_on {
            return None;
        }
    }
    None
}

/// The address a PLT stub jumps through (`jmp *GOT(%rip)`, after an
/// optional `endbr64`), `code` being the stub at virtual address `address`.
pub fn plt_slot(code: &[u8], address: u64) -> Option<u64> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instruction = decoder.decode();
    if instruction.code() == Code::Endbr64 {
        instruction = decoder.decode();
    }
    (instruction.code() == Code::Jmp_rm64 && instruction.is_ip_rel_memory_operand())
        .then(|| instruction.ip_rel_memory_address())
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
fn unsafe_to_skip(
    instruction: &Instruction,
    info: &mut InstructionInfoFactory,
    arguments: &[Register],
    locations: &mut ArgumentLocations,
    follow_copies: bool,
) -> Option<String> {
    if instruction.flow_control() != FlowControl::Next {
        return Some("branches, calls or returns".to_owned());
    }
    let used = info.info(instruction);
    let mut written = Vec::new();
    for register in used.used_registers() {
        if matches!(
            register.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        ) {
            written.push(register.register().full_register());
        }
    }
    if written.contains(&Register::RSP) {
        return Some("moves the stack pointer".to_owned());
    }
    let writes_memory = used.used_memory().iter().any(|memory| {
        !matches!(
            memory.access(),
            OpAccess::Read | OpAccess::CondRead | OpAccess::NoMemAccess
        )
    });
    if writes_memory {
        return Some("writes memory".to_owned());
    }
    locations
        .follow(instruction, &written, follow_copies)
        .map(|argument| {
            format!(
                "overwrites argument register {}{}",
                register_name(arguments[argument]),
                if follow_copies {
                    " (and no copy of it is left)"
                } else {
                    ""
                }
            )
        })
}

/// `%rdi`, as objdump writes it.
fn register_name(register: Register) -> String {
    format!("%{}", format!("{register:?}").to_lowercase())
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

/// Converts a virtual address of the ELF file to a file offset through the
/// loadable segment that holds it.
pub fn file_offset(file: &object::File<'_>, address: u64) -> Option<u64> {
    file.segments().find_map(|segment| {
        let (offset, size) = segment.file_range();
        let start = segment.address();
        (start..start + size)
            .contains(&address)
            .then(|| address - start + offset)
    })
}

#[cfg(test)]
mod tests;
