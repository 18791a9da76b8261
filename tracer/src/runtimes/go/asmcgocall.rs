//! How Go's `runtime.asmcgocall` calls C, read from its code: where it
//! keeps the goroutine's `g` and the depth of its stack pointer (the call
//! made after switching to the system stack), and where the caller's
//! stack pointer (the call made on the system stack already).
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};
use tracer_ebpf::{GoStackSwitch, MAX_GO_SLOT};

use super::GoRuntime;
use crate::unwind::ObjectInfo;

/// The symbols asmcgocall's code has: the assembly function itself
/// (`.abi0`, Go 1.17+, behind an ABI wrapper), or the function (older).
const ASMCGOCALL: [&str; 2] = ["runtime.asmcgocall.abi0", "runtime.asmcgocall"];
/// Most bytes of asmcgocall's code decoded (each byte may be one decoded
/// instruction kept).
const MAX_ASMCGOCALL_BYTES: usize = 4096;

/// What a Go object's asmcgocall does, read from its code; None for an
/// object that is not Go or has no asmcgocall (no cgo).
pub(super) fn go_runtime(object: &ObjectInfo) -> Option<GoRuntime> {
    let text = object.managed.as_ref()?.text.clone()?;
    let function = ASMCGOCALL
        .iter()
        .find_map(|name| object.function_named(name))?;
    let offset = object.offset_of_address(function.address)?;
    // The symbol's size is the file's word: asmcgocall is ~150 bytes.
    let size = usize::try_from(function.size)
        .unwrap_or(usize::MAX)
        .min(MAX_ASMCGOCALL_BYTES);
    let code = object.bytes_at(offset, size)?;
    let (switched, on_system_stack) = read_asmcgocall(code, function.address);
    Some(GoRuntime {
        text,
        switched,
        on_system_stack,
    })
}

/// asmcgocall's two calls into C (register-indirect), told apart by what
/// follows each: after the switched call, the goroutine's stack pointer is
/// computed back from `g` and the depth
/// (`mov G(%rsp),%g; mov HI(%g),%r; sub DEPTH(%rsp),%r`); after the other,
/// the caller's is reloaded (`mov SP(%rsp),%r; mov %r,%rsp`).
fn read_asmcgocall(code: &[u8], address: u64) -> (Option<GoStackSwitch>, Option<(u64, u32)>) {
    let instructions: Vec<Instruction> = Decoder::with_ip(64, code, address, DecoderOptions::NONE)
        .into_iter()
        .take_while(|instruction| !instruction.is_invalid())
        .collect();
    let mut switched = None;
    let mut on_system_stack = None;
    for (index, call) in instructions.iter().enumerate() {
        if call.flow_control() != FlowControl::IndirectCall || call.op0_kind() != OpKind::Register {
            continue;
        }
        let after = &instructions[index + 1..instructions.len().min(index + 8)];
        let return_address = call.next_ip();
        if let Some(switch) = read_switch_back(after, return_address) {
            switched.get_or_insert(switch);
        } else if let Some(slot) = read_reload(after) {
            on_system_stack.get_or_insert((return_address, slot));
        }
    }
    (switched, on_system_stack)
}

/// `mov G(%rsp),%g; mov HI(%g),%r; sub DEPTH(%rsp),%r` among `after`
/// (other instructions may come between).
fn read_switch_back(after: &[Instruction], return_address: u64) -> Option<GoStackSwitch> {
    let mut g = None;
    let mut stack_hi = None;
    for instruction in after {
        match (instruction.mnemonic(), g, stack_hi) {
            (Mnemonic::Mov, None, _) => {
                if let Some(slot) = stack_slot(instruction) {
                    g = Some((instruction.op0_register(), slot));
                }
            }
            (Mnemonic::Mov, Some((g_register, _)), None)
                if instruction.op1_kind() == OpKind::Memory
                    && instruction.memory_base() == g_register
                    && instruction.memory_index() == Register::None =>
            {
                stack_hi = Some((
                    instruction.op0_register(),
                    instruction.memory_displacement64() as u32,
                ));
            }
            (Mnemonic::Sub, Some((_, g_slot)), Some((register, hi)))
                if instruction.op0_register() == register =>
            {
                let depth_slot = stack_slot(instruction)?;
                return (g_slot <= MAX_GO_SLOT && depth_slot <= MAX_GO_SLOT).then_some(
                    GoStackSwitch {
                        return_address,
                        g_slot,
                        depth_slot,
                        stack_hi: hi,
                        pad: 0,
                    },
                );
            }
            _ => {}
        }
    }
    None
}

/// `mov SLOT(%rsp),%r; mov %r,%rsp` at the start of `after`.
fn read_reload(after: &[Instruction]) -> Option<u32> {
    let [load, set, ..] = after else {
        return None;
    };
    let slot = stack_slot(load).filter(|_| load.mnemonic() == Mnemonic::Mov)?;
    let sets_sp = set.mnemonic() == Mnemonic::Mov
        && set.op0_register() == Register::RSP
        && set.op1_kind() == OpKind::Register
        && set.op1_register() == load.op0_register();
    (sets_sp && slot <= MAX_GO_SLOT).then_some(slot)
}

/// The displacement of a 64-bit load from `N(%rsp)` into a register.
fn stack_slot(instruction: &Instruction) -> Option<u32> {
    (instruction.op0_kind() == OpKind::Register
        && instruction.op1_kind() == OpKind::Memory
        && instruction.memory_base() == Register::RSP
        && instruction.memory_index() == Register::None
        && instruction.memory_size() == iced_x86::MemorySize::UInt64)
        .then(|| instruction.memory_displacement64() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// runtime.asmcgocall.abi0 of Debian's Go 1.19 (amd64), from its
    /// first instruction after the stack checks.
    const GO_1_19: &[u8] = &[
        0xe8, 0x00, 0x00, 0x00, 0x00, // call gosave_systemstack_switch
        0x64, 0x48, 0x89, 0x34, 0x25, 0xf8, 0xff, 0xff, 0xff, // mov %rsi,%fs:-8
        0x48, 0x8b, 0x66, 0x38, // mov 0x38(%rsi),%rsp
        0x48, 0x83, 0xec, 0x40, // sub $0x40,%rsp
        0x48, 0x83, 0xe4, 0xf0, // and $-16,%rsp
        0x48, 0x89, 0x7c, 0x24, 0x30, // mov %rdi,0x30(%rsp)
        0x48, 0x8b, 0x7f, 0x08, // mov 0x8(%rdi),%rdi
        0x48, 0x29, 0xd7, // sub %rdx,%rdi
        0x48, 0x89, 0x7c, 0x24, 0x28, // mov %rdi,0x28(%rsp)
        0x48, 0x89, 0xdf, // mov %rbx,%rdi
        0x48, 0x89, 0xd9, // mov %rbx,%rcx
        0xff, 0xd0, // call *%rax
        0x48, 0x8b, 0x7c, 0x24, 0x30, // mov 0x30(%rsp),%rdi
        0x48, 0x8b, 0x77, 0x08, // mov 0x8(%rdi),%rsi
        0x48, 0x2b, 0x74, 0x24, 0x28, // sub 0x28(%rsp),%rsi
        0x64, 0x48, 0x89, 0x3c, 0x25, 0xf8, 0xff, 0xff, 0xff, // mov %rdi,%fs:-8
        0x48, 0x89, 0xf4, // mov %rsi,%rsp
        0x89, 0x44, 0x24, 0x18, // mov %eax,0x18(%rsp)
        0xc3, // ret
        0x48, 0x83, 0xec, 0x40, // sub $0x40,%rsp
        0x48, 0x83, 0xe4, 0xf0, // and $-16,%rsp
        0x48, 0xc7, 0x44, 0x24, 0x30, 0x00, 0x00, 0x00, 0x00, // movq $0,0x30(%rsp)
        0x48, 0x89, 0x54, 0x24, 0x28, // mov %rdx,0x28(%rsp)
        0x48, 0x89, 0xdf, // mov %rbx,%rdi
        0x48, 0x89, 0xd9, // mov %rbx,%rcx
        0xff, 0xd0, // call *%rax
        0x48, 0x8b, 0x74, 0x24, 0x28, // mov 0x28(%rsp),%rsi
        0x48, 0x89, 0xf4, // mov %rsi,%rsp
        0x89, 0x44, 0x24, 0x18, // mov %eax,0x18(%rsp)
        0xc3, // ret
    ];

    #[test]
    fn reads_both_calls_of_go_1_19s_asmcgocall() {
        let (switched, on_system_stack) = read_asmcgocall(GO_1_19, 0x1000);
        let first_call_end =
            0x1000 + GO_1_19.windows(2).position(|w| w == [0xff, 0xd0]).unwrap() as u64 + 2;
        assert_eq!(
            switched,
            Some(GoStackSwitch {
                return_address: first_call_end,
                g_slot: 0x30,
                depth_slot: 0x28,
                stack_hi: 8,
                pad: 0,
            })
        );
        let (return_address, slot) = on_system_stack.unwrap();
        assert!(return_address > first_call_end);
        assert_eq!(slot, 0x28);
    }

    /// The fixture built by Debian's Go: both calls found, in asmcgocall.
    #[test]
    fn reads_the_cgo_fixtures_asmcgocall() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fixtures/cgo_leak");
        let bytes = std::fs::read(&path).unwrap_or_else(|error| {
            panic!("{} ({error}): run `cargo xtask setup`", path.display())
        });
        crate::runtimes::register();
        let object = ObjectInfo::from_bytes(&bytes).expect("an ELF");
        let runtime = go_runtime(&object).expect("cgo_leak calls C");
        let switch = runtime.switched.expect("the switched call");
        assert!(runtime.text.contains(&switch.return_address));
        assert_eq!(
            (switch.g_slot, switch.depth_slot, switch.stack_hi),
            (0x30, 0x28, 8)
        );
        assert!(runtime.on_system_stack.is_some());
    }

    #[test]
    fn code_without_the_pattern_has_no_switch() {
        let code = [0xff, 0xd0, 0xc3]; // call *%rax; ret
        assert_eq!(read_asmcgocall(&code, 0), (None, None));
    }
}
