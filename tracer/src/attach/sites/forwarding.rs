//! Which hooked functions only pass their call on to another hooked one, so
//! that they need no probe of their own: one set of traps per allocation
//! (DESIGN.md). Decided from each function's code, in the object that
//! defines it, never from its name:
//!
//! - a tail jump: `_Znam` is `jmp _Znwm@plt`, libstdc++'s `operator delete`
//!   is `jmp free@plt`;
//! - a call whose result is the function's: libstdc++'s `operator new` calls
//!   `malloc@plt` until it gets a block (calling the new-handler between
//!   tries, or throwing) and returns that block. Every path from the entry
//!   to a `ret` is followed (jumps into cold code and into landing pads
//!   too), knowing for each general register whether it holds the result of
//!   a call to a hooked allocator, zero, or anything else. The function
//!   passes its call on when every `ret` it can reach returns the inner
//!   call's result or zero (a nothrow variant's failure), and one returns
//!   the result. jemalloc's and tcmalloc's own `operator new`, which serve
//!   most calls from an inlined fast path, return other values and keep
//!   their probes.
//!
//! A block made through such a function is recorded by the inner probe; the
//! stack, walked from the inner call's return through the outer function's
//! unwind table (libstdc++ has no frame pointers), still names the outer
//! function's caller. A frame-pointer walk (`--unwind fp`) would lose that
//! caller, so there the calling functions keep their probes
//! ([`Forwarding::TailJumpsOnly`]).
use std::collections::{HashMap, HashSet};

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, OpAccess,
    OpKind, Register,
};
use object::{Object as _, ObjectSymbol as _, ObjectSymbolTable as _};

use crate::attach::{sites::prologue, sites::prologue::file_offset};
use crate::unwind::UnwindMode;

/// Which functions count as passing their call on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forwarding {
    /// Only those that tail-jump to a hooked function (`--unwind fp`: a
    /// frame-pointer walk from inside a function without a frame pointer
    /// loses its caller).
    TailJumpsOnly,
    /// Also those that return what their call of a hooked function returned
    /// (stacks are unwound through them).
    TailJumpsAndCalls,
}

impl Forwarding {
    /// What stacks walked in `mode` allow.
    pub fn for_unwinding(mode: UnwindMode) -> Forwarding {
        if mode == UnwindMode::FramePointers {
            Forwarding::TailJumpsOnly
        } else {
            Forwarding::TailJumpsAndCalls
        }
    }
}

/// What a hooked function does with its calls, as far as its code says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PassesOn {
    /// `jmp` to the hooked function (directly or through the PLT).
    TailJump(String),
    /// Returns what its call of the hooked function returned (or zero).
    Returns(String),
    /// Calls the hooked function, but some return gives back another
    /// value: it serves calls itself (an inlined fast path).
    ServesSome(String),
    /// Calls no hooked function, or its code could not be followed.
    No,
}

impl PassesOn {
    /// Whether the function needs no probe of its own under `forwarding`.
    pub fn needs_no_probe(&self, forwarding: Forwarding) -> bool {
        match self {
            PassesOn::TailJump(_) => true,
            PassesOn::Returns(_) => forwarding == Forwarding::TailJumpsAndCalls,
            PassesOn::ServesSome(_) | PassesOn::No => false,
        }
    }

    /// Why a function that calls a hooked one keeps its probe, for `-v`.
    pub fn why_probed(&self, forwarding: Forwarding) -> Option<String> {
        match self {
            PassesOn::Returns(inner) if forwarding == Forwarding::TailJumpsOnly => Some(format!(
                "probed although it returns what its call of {inner} returns: with \
                 --unwind fp a walk from {inner}'s return would skip its caller"
            )),
            PassesOn::ServesSome(inner) => Some(format!(
                "probed: it calls {inner}, but not every return passes {inner}'s block on \
                 (it serves some calls itself)"
            )),
            _ => None,
        }
    }

    /// Why a function has no probe, for `-v`.
    pub fn why_not_probed(&self) -> Option<String> {
        match self {
            PassesOn::TailJump(inner) => Some(format!(
                "no probe: it jumps to {inner}, whose probe sees the call"
            )),
            PassesOn::Returns(inner) => Some(format!(
                "no probe: it returns what its call of {inner} returns, so {inner}'s probe \
                 records the block once; stacks are unwound through it to its caller"
            )),
            PassesOn::ServesSome(_) | PassesOn::No => None,
        }
    }
}

/// Most instructions followed in one function (its cold code included):
/// past it, the function keeps its probe.
const MAX_INSTRUCTIONS: usize = 512;

/// Callees after which the path ends: they never return (a `throw`, an
/// abort), so what the compiler placed after the call is another block's
/// code.
const NO_RETURN: [&str; 12] = [
    "__cxa_throw",
    "__cxa_rethrow",
    "__cxa_throw_bad_array_new_length",
    "_Unwind_Resume",
    "_ZSt17__throw_bad_allocv",
    "_ZSt28__throw_bad_array_new_lengthv",
    "_ZSt9terminatev",
    "abort",
    "exit",
    "_exit",
    "__stack_chk_fail",
    "__assert_fail",
];

/// What a call or jump reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Callee<'n> {
    /// A hooked function, by name.
    Hooked(&'n str),
    NoReturn,
    Other,
}

/// The functions of one object that calls and jumps may reach.
pub struct Callees<'a> {
    file: &'a object::File<'a>,
    data: &'a [u8],
    /// Hooked functions defined in this object: address, name.
    defined: &'a [(u64, &'static str)],
    /// Names of every hooked function, wherever it is defined.
    hooked_names: &'a [&'static str],
    /// The symbol each PLT/GOT slot is bound to, read on first use.
    slots: std::cell::OnceCell<HashMap<u64, String>>,
}

impl<'a> Callees<'a> {
    pub fn new(
        file: &'a object::File<'a>,
        data: &'a [u8],
        defined: &'a [(u64, &'static str)],
        hooked_names: &'a [&'static str],
    ) -> Self {
        Callees {
            file,
            data,
            defined,
            hooked_names,
            slots: std::cell::OnceCell::new(),
        }
    }

    /// What the function at `address` (`size_bytes` long, 0 when unknown)
    /// does with its calls.
    pub fn passes_on(&self, address: u64, size_bytes: u64) -> PassesOn {
        if let Some(name) = self.tail_jump(address) {
            return PassesOn::TailJump(name.to_owned());
        }
        if size_bytes == 0 {
            return PassesOn::No;
        }
        returns_result_of(self, address)
    }

    /// The hooked function the code at `address` tail-jumps to (after
    /// instructions that only shuffle registers).
    fn tail_jump(&self, address: u64) -> Option<&str> {
        let relative = prologue::tail_jump_target(self.code_at(address)?)?;
        match self.callee(address.wrapping_add_signed(relative)) {
            Callee::Hooked(name) => Some(name),
            _ => None,
        }
    }

    /// The object's bytes from virtual address `address` on.
    fn code_at(&self, address: u64) -> Option<&'a [u8]> {
        let offset = usize::try_from(file_offset(self.file, address)?).ok()?;
        self.data.get(offset..)
    }

    /// What a direct call or jump to `target` reaches: a hooked function of
    /// this object, or, through a PLT stub, the function its slot is bound
    /// to.
    fn callee(&self, target: u64) -> Callee<'_> {
        if let Some(&(_, name)) = self.defined.iter().find(|(address, _)| *address == target) {
            return Callee::Hooked(name);
        }
        match self
            .code_at(target)
            .and_then(|stub| prologue::plt_slot(stub, target))
        {
            Some(slot) => self.bound_to(slot),
            None => Callee::Other,
        }
    }

    /// What the function bound to the GOT slot at `slot` is.
    fn bound_to(&self, slot: u64) -> Callee<'_> {
        let Some(name) = self.slots().get(&slot) else {
            return Callee::Other;
        };
        if let Some(hooked) = self.hooked_names.iter().find(|hooked| **hooked == name) {
            Callee::Hooked(hooked)
        } else if NO_RETURN.contains(&name.as_str()) {
            Callee::NoReturn
        } else {
            Callee::Other
        }
    }

    fn slots(&self) -> &HashMap<u64, String> {
        self.slots.get_or_init(|| {
            let (Some(relocations), Some(symbols)) = (
                self.file.dynamic_relocations(),
                self.file.dynamic_symbol_table(),
            ) else {
                return HashMap::new();
            };
            relocations
                .filter_map(|(at, relocation)| match relocation.target() {
                    object::RelocationTarget::Symbol(index) => {
                        let name = symbols.symbol_by_index(index).ok()?.name().ok()?;
                        Some((at, name.to_owned()))
                    }
                    _ => None,
                })
                .collect()
        })
    }
}

/// What a general register may hold at one point: bits of these.
const INNER: u8 = 1;
const ZERO: u8 = 2;
const OTHER: u8 = 4;

/// Per general register (RAX..R15 in iced's order), what it may hold.
type State = [u8; 16];

/// The registers a call may change (System V): rax, rcx, rdx, rsi, rdi,
/// r8-r11.
const CALLER_SAVED: [Register; 9] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
];

fn slot(register: Register) -> Option<usize> {
    let full = register.full_register();
    (full.is_gpr64()).then(|| full as usize - Register::RAX as usize)
}

/// Whether the function at `entry` returns, on every path that returns,
/// the result of its call of a hooked function (or zero).
fn returns_result_of(callees: &Callees<'_>, entry: u64) -> PassesOn {
    let mut inner_name: Option<&str> = None;
    match follow(callees, entry, &mut inner_name) {
        Some(true) => PassesOn::Returns(inner_name.unwrap_or_default().to_owned()),
        Some(false) | None => match inner_name {
            Some(inner) => PassesOn::ServesSome(inner.to_owned()),
            None => PassesOn::No,
        },
    }
}

/// Follows every path from `entry`: Some(true) when every `ret` returns
/// the result of a call of `inner_name` (set to the hooked function called)
/// or zero, and one returns that result; Some(false) when none does; None
/// when some `ret` returns another value or the code cannot be followed.
fn follow<'c>(
    callees: &'c Callees<'_>,
    entry: u64,
    inner_name: &mut Option<&'c str>,
) -> Option<bool> {
    let mut states: HashMap<u64, State> = HashMap::new();
    let mut queue: Vec<u64> = vec![entry];
    states.insert(entry, [OTHER; 16]);
    let mut decoded: HashSet<u64> = HashSet::new();
    let mut returns_inner = false;
    let mut info = InstructionInfoFactory::new();
    while let Some(address) = queue.pop() {
        decoded.insert(address);
        if decoded.len() > MAX_INSTRUCTIONS {
            return None;
        }
        let mut state = states[&address];
        let code = callees.code_at(address)?;
        let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            return None;
        }
        let next = instruction.next_ip();
        let mut successors: [Option<u64>; 2] = [None, None];
        match instruction.flow_control() {
            FlowControl::Return => {
                let rax = state[0];
                if rax & OTHER != 0 {
                    return None;
                }
                returns_inner |= rax & INNER != 0;
            }
            FlowControl::Interrupt | FlowControl::Exception => {}
            FlowControl::UnconditionalBranch => {
                let target = instruction.near_branch_target();
                match callees.callee(target) {
                    // A tail call: the inner function's result is returned.
                    Callee::Hooked(name) => {
                        if inner_name.is_some_and(|inner| inner != name) {
                            return None;
                        }
                        *inner_name = Some(name);
                        returns_inner = true;
                    }
                    Callee::NoReturn => {}
                    Callee::Other => successors[0] = Some(target),
                }
            }
            FlowControl::ConditionalBranch => {
                successors = [Some(instruction.near_branch_target()), Some(next)];
            }
            FlowControl::Call | FlowControl::IndirectCall => {
                let callee = match instruction.code() {
                    Code::Call_rel32_64 => callees.callee(instruction.near_branch_target()),
                    _ if instruction.is_ip_rel_memory_operand() => {
                        callees.bound_to(instruction.ip_rel_memory_address())
                    }
                    _ => Callee::Other,
                };
                for register in CALLER_SAVED {
                    if let Some(index) = slot(register) {
                        state[index] = OTHER;
                    }
                }
                match callee {
                    Callee::Hooked(name) => {
                        if inner_name.is_some_and(|inner| inner != name) {
                            return None;
                        }
                        *inner_name = Some(name);
                        state[0] = INNER;
                        successors[0] = Some(next);
                    }
                    Callee::NoReturn => {}
                    Callee::Other => successors[0] = Some(next),
                }
            }
            FlowControl::IndirectBranch => {
                // `jmp *slot(%rip)` to a hooked function is a tail call;
                // any other computed jump is not followed.
                if !instruction.is_ip_rel_memory_operand() {
                    return None;
                }
                match callees.bound_to(instruction.ip_rel_memory_address()) {
                    Callee::Hooked(name) => {
                        if inner_name.is_some_and(|inner| inner != name) {
                            return None;
                        }
                        *inner_name = Some(name);
                        returns_inner = true;
                    }
                    Callee::NoReturn => {}
                    Callee::Other => return None,
                }
            }
            FlowControl::Next => {
                step(&instruction, &mut state, &mut info);
                successors[0] = Some(next);
            }
            FlowControl::XbeginXabortXend => return None,
        }
        for successor in successors.into_iter().flatten() {
            let merged = match states.get(&successor) {
                Some(old) => {
                    let mut merged = *old;
                    for (into, from) in merged.iter_mut().zip(state) {
                        *into |= from;
                    }
                    if merged == *old && decoded.contains(&successor) {
                        continue;
                    }
                    merged
                }
                None => state,
            };
            states.insert(successor, merged);
            queue.push(successor);
        }
    }
    Some(returns_inner)
}

/// What an instruction that falls through does to the registers.
fn step(instruction: &Instruction, state: &mut State, info: &mut InstructionInfoFactory) {
    let registers =
        instruction.op0_kind() == OpKind::Register && instruction.op1_kind() == OpKind::Register;
    let (to, from) = (
        slot(instruction.op0_register()),
        slot(instruction.op1_register()),
    );
    // `mov r64, r64`: the value moves.
    if registers
        && matches!(instruction.code(), Code::Mov_r64_rm64 | Code::Mov_rm64_r64)
        && let (Some(to), Some(from)) = (to, from)
    {
        state[to] = state[from];
        return;
    }
    // `xor r32, r32` (or r64): zero.
    if registers
        && matches!(
            instruction.code(),
            Code::Xor_r32_rm32 | Code::Xor_rm32_r32 | Code::Xor_r64_rm64 | Code::Xor_rm64_r64
        )
        && instruction.op0_register() == instruction.op1_register()
        && let Some(to) = to
    {
        state[to] = ZERO;
        return;
    }
    let used = info.info(instruction);
    for register in used.used_registers() {
        let written = matches!(
            register.access(),
            OpAccess::Write | OpAccess::ReadWrite | OpAccess::CondWrite | OpAccess::ReadCondWrite
        );
        if written && let Some(index) = slot(register.register()) {
            if matches!(
                register.access(),
                OpAccess::CondWrite | OpAccess::ReadCondWrite
            ) {
                state[index] |= OTHER;
            } else {
                state[index] = OTHER;
            }
        }
    }
}
