//! Stacks through code without frame pointers: the probes copy the top of
//! the user stack (`--unwind copy`), and this module turns a copy into
//! return addresses with framehop, from the `.eh_frame` (and
//! `.debug_frame`) of each mapped object.
//!
//! Objects are read from the target's own files (the inodes it maps,
//! through /proc/PID/map_files: `target_files`), mapped, not copied, and shared
//! between processes that map the same file or the same build (build id).
//! `frame_pointers` decides, for `--unwind auto`, which processes need
//! copies at all; `stops` where a stack must end rather than show a
//! guessed frame; `go` how a Go program's frames go on from C code called
//! through cgo (Go code is walked by its frame pointers).
pub mod frame_pointers;
pub mod go;
mod modules;
pub mod registry;
mod stops;
pub mod tables;
pub mod walk;

use std::{
    collections::{BTreeMap, HashMap},
    ops::Range,
    sync::Arc,
    time::{Duration, Instant},
};

use framehop::{
    FrameAddress, Unwinder as _,
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
};
use tracer_ebpf::{MAX_GOROUTINE_BYTES, StackCopy};

pub use crate::model::run::UnwindMode;
use crate::procfs;
pub use modules::ObjectInfo;
use modules::{ModuleFiles, Section};
pub use stops::UnwindStop;

/// A stack unwound from a copy: return addresses, innermost first (the
/// first is the allocator's return address into its caller). Two copies
/// whose stacks are equal up to where unwinding stopped are equal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Unwound {
    pub addresses: Vec<u64>,
    /// The stack goes on beyond the copy: outer frames are missing.
    pub truncated: bool,
    /// Unwinding stopped before the thread's first frame: the frames
    /// beyond `addresses` could not be trusted.
    pub stopped: Option<UnwindStop>,
}

/// The frame that ends a stack deeper than the copy.
pub const TRUNCATED_FRAME: &str = "[truncated: stack deeper than --stack-bytes]";

impl Unwound {
    /// The marker frame that ends this stack, when it does not reach the
    /// thread's first frame.
    pub fn end_marker(&self) -> Option<String> {
        match self.stopped {
            Some(reason) => Some(reason.marker()),
            None => self.truncated.then(|| TRUNCATED_FRAME.to_owned()),
        }
    }
}

/// Most frames kept per stack (the kernel's frame-pointer walk keeps 127).
const MAX_FRAMES: usize = 127;
/// A process's modules are read again at most this often, when a stack
/// has an address outside every module known (a library loaded later).
const REFRESH_AT_MOST_EVERY: Duration = Duration::from_millis(200);

/// An executable mapping given to the unwinder.
struct MappedCode {
    addresses: Range<u64>,
    object: Arc<ObjectInfo>,
    /// Where the object's address 0 is mapped.
    base: u64,
}

struct Process {
    unwinder: UnwinderX86_64<Section>,
    code: Code,
    /// The Go runtime of a Go executable, relocated.
    go: Option<go::GoRuntime>,
    refreshed_at: Instant,
}

/// A process's code, as the unwinder was given it.
#[derive(Default)]
struct Code {
    mapped: Vec<MappedCode>,
    /// What [`Code::check`] found for each frame seen.
    checked: HashMap<(u64, bool), Option<UnwindStop>>,
}

impl Code {
    /// Why a stack must stop at `frame` rather than keep it (outside the
    /// mapped code, not after a call), or go on from it (no unwind
    /// information: the caller would be guessed from the frame pointer).
    fn check(&mut self, frame: FrameAddress) -> Option<(UnwindStop, bool)> {
        let address = frame.address_for_lookup();
        let is_return_address = frame.is_return_address();
        let code = &self.mapped;
        let reason = *self
            .checked
            .entry((address, is_return_address))
            .or_insert_with(|| {
                let Some(mapped) = code
                    .iter()
                    .find(|mapped| mapped.addresses.contains(&address))
                else {
                    return Some(UnwindStop::OutsideCode);
                };
                let object_address = address - mapped.base;
                if is_return_address
                    && !mapped
                        .object
                        .code_before(frame.address() - mapped.base, stops::LONGEST_CALL)
                        .is_some_and(stops::ends_with_call)
                {
                    return Some(UnwindStop::NotAfterCall);
                }
                (!mapped.object.has_unwind_info(object_address)).then_some(UnwindStop::NoUnwindInfo)
            });
        // A frame without unwind information is itself right; its caller
        // is what cannot be known.
        reason.map(|reason| (reason, reason == UnwindStop::NoUnwindInfo))
    }
}

/// framehop unwinders for every traced process, sharing one rule cache and
/// the sections of files mapped by several processes.
pub struct Unwinder {
    processes: HashMap<u32, Process>,
    files: ModuleFiles,
    cache: CacheX86_64,
    /// Copies whose unwinding stopped, by reason.
    stopped: BTreeMap<UnwindStop, u64>,
}

impl Default for Unwinder {
    fn default() -> Self {
        Self::new()
    }
}

impl Unwinder {
    /// Forgets a process that exited (`--comm`).
    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }

    pub fn new() -> Unwinder {
        Unwinder {
            processes: HashMap::new(),
            files: ModuleFiles::default(),
            cache: CacheX86_64::new(),
            stopped: BTreeMap::new(),
        }
    }

    /// How many copies' unwinding stopped early, by reason.
    pub fn stopped(&self) -> &BTreeMap<UnwindStop, u64> {
        &self.stopped
    }

    /// Unwinds one copy; `stack` holds the bytes that follow its header:
    /// those copied from `copy.base`, then those of a goroutine's stack.
    pub fn unwind(&mut self, copy: &StackCopy, stack: &[u8]) -> Unwound {
        let pid = copy.tgid;
        if !self.processes.contains_key(&pid) {
            self.refresh(pid);
        }
        let mut unwound = self.unwind_known(copy, stack);
        let uncovered = unwound.stopped == Some(UnwindStop::OutsideCode)
            && self.processes[&pid].refreshed_at.elapsed() >= REFRESH_AT_MOST_EVERY;
        if uncovered {
            self.refresh(pid);
            unwound = self.unwind_known(copy, stack);
        }
        if let Some(reason) = unwound.stopped {
            *self.stopped.entry(reason).or_default() += 1;
        }
        unwound
    }

    fn unwind_known(&mut self, copy: &StackCopy, stack: &[u8]) -> Unwound {
        let Some(process) = self.processes.get_mut(&copy.tgid) else {
            return Unwound::default();
        };
        let memory = CopiedMemory::new(copy, stack);
        let mut read_stack = |address: u64| memory.read(address);
        let Process {
            unwinder, code, go, ..
        } = process;
        let mut regs = UnwindRegsX86_64::new(copy.ip, copy.sp, copy.bp);
        let mut frame = FrameAddress::InstructionPointer(copy.ip);
        let mut unwound = Unwound::default();
        while unwound.addresses.len() < MAX_FRAMES {
            if let Some(go) = go.as_ref()
                && go.text.contains(&frame.address_for_lookup())
            {
                unwound.addresses.push(frame.address());
                match walk_go_frames(go, &memory, frame.address(), regs, &mut unwound) {
                    Some((caller, caller_regs)) => {
                        // Go code called from C: the C frames go on from
                        // their unwind information.
                        frame = caller;
                        regs = caller_regs;
                        continue;
                    }
                    None => break,
                }
            }
            let stop = code.check(frame);
            if stop.is_none_or(|(_, keep_frame)| keep_frame) {
                unwound.addresses.push(frame.address());
            }
            if let Some((reason, _)) = stop {
                unwound.stopped = Some(reason);
                break;
            }
            let next = unwinder
                .unwind_frame(frame, &mut regs, &mut self.cache, &mut read_stack)
                .and_then(|next| match next {
                    Some(address) => FrameAddress::from_return_address(address)
                        .map(Some)
                        .ok_or(framehop::Error::ReturnAddressIsNull),
                    None => Ok(None),
                });
            match next {
                Ok(Some(caller)) => frame = caller,
                Ok(None) => break,
                Err(framehop::Error::CouldNotReadStack(address)) if memory.beyond_copy(address) => {
                    unwound.truncated = true;
                    break;
                }
                Err(error) => {
                    unwound.stopped = Some(error.into());
                    break;
                }
            }
        }
        if unwound.addresses.len() >= MAX_FRAMES {
            unwound.addresses.truncate(MAX_FRAMES);
            unwound.truncated = true;
        }
        unwound
    }

    /// (Re)reads the executable mappings of `pid` and gives each object's
    /// unwind sections to a new unwinder (also when its image changed).
    pub fn refresh(&mut self, pid: u32) {
        let mut process = Process {
            unwinder: UnwinderX86_64::new(),
            code: Code::default(),
            go: None,
            refreshed_at: Instant::now(),
        };
        let mappings = procfs::read_maps(pid).unwrap_or_default();
        for mapping in mappings.iter().filter(|mapping| mapping.executable) {
            if let Some((module, object, base)) = self.files.module(pid, mapping) {
                if object.is_go && process.go.is_none() {
                    process.go = go::go_runtime(&object).map(|runtime| runtime.relocated(base));
                }
                process.unwinder.add_module(module);
                process.code.mapped.push(MappedCode {
                    addresses: mapping.start..mapping.end,
                    object,
                    base,
                });
            }
        }
        if mappings.is_empty()
            && let Some(known) = self.processes.remove(&pid)
        {
            // Gone: keep what was known, for copies still in the ring.
            process = Process {
                refreshed_at: Instant::now(),
                ..known
            };
        }
        self.processes.insert(pid, process);
    }
}

/// The memory a copy holds: the stack copied from `copy.base` and, for a
/// Go program that called C, the goroutine's stack above the switch.
struct CopiedMemory<'a> {
    base: u64,
    stack: &'a [u8],
    /// The copy stopped at its size limit, not at the stack's top.
    stack_goes_on: bool,
    goroutine_sp: u64,
    goroutine: &'a [u8],
    /// The switch's frame: the address of its return address.
    switch_at: u64,
}

impl<'a> CopiedMemory<'a> {
    fn new(copy: &StackCopy, bytes: &'a [u8]) -> CopiedMemory<'a> {
        let length = (copy.length as usize).min(bytes.len());
        let goroutine_end = length.saturating_add(copy.goroutine_length as usize);
        CopiedMemory {
            base: copy.base,
            stack: &bytes[..length],
            stack_goes_on: copy.reached_top == 0,
            goroutine_sp: copy.goroutine_sp,
            goroutine: bytes.get(length..goroutine_end).unwrap_or_default(),
            switch_at: copy.switch_at,
        }
    }

    fn read(&self, address: u64) -> Result<u64, ()> {
        let word = |bytes: &[u8], start: u64| -> Option<u64> {
            let offset = usize::try_from(address.checked_sub(start)?).ok()?;
            let word = bytes.get(offset..offset.checked_add(8)?)?;
            Some(u64::from_le_bytes(word.try_into().ok()?))
        };
        word(self.stack, self.base)
            .or_else(|| word(self.goroutine, self.goroutine_sp))
            .ok_or(())
    }

    /// The goroutine's stack pointer before the switch whose call into C
    /// has its CFA at `cfa`: the one the kernel copied from, or an outer
    /// switch of the same goroutine (C called back into Go, which called
    /// C again), found from the two depths below the same stack top.
    fn goroutine_sp_at(&self, switch: &tracer_ebpf::GoStackSwitch, cfa: u64) -> Option<u64> {
        if self.switch_at == 0 {
            return None;
        }
        let inner_cfa = self.switch_at + 8;
        if cfa == inner_cfa {
            return Some(self.goroutine_sp);
        }
        let g_and_depth = |cfa: u64| {
            let g = self.read(cfa + u64::from(switch.g_slot)).ok()?;
            let depth = self.read(cfa + u64::from(switch.depth_slot)).ok()?;
            Some((g, depth))
        };
        let (inner_g, inner_depth) = g_and_depth(inner_cfa)?;
        let (g, depth) = g_and_depth(cfa)?;
        // The outer switch left the goroutine's stack higher up.
        (g == inner_g && depth <= inner_depth).then(|| self.goroutine_sp + (inner_depth - depth))
    }

    /// Whether `address`, unreadable, lies beyond a copy that stopped at
    /// its size limit: the stack goes on there.
    fn beyond_copy(&self, address: u64) -> bool {
        // The stack `address` is in: the copied one that starts closest
        // below it (a goroutine's stack and the system stack lie anywhere
        // from each other).
        let system = (self.base, self.stack, self.stack_goes_on);
        let goroutine = (
            self.goroutine_sp,
            self.goroutine,
            self.goroutine.len() as u64 == MAX_GOROUTINE_BYTES,
        );
        let (start, bytes, goes_on) = [system, goroutine]
            .into_iter()
            .filter(|(start, _, _)| *start != 0 && *start <= address)
            .max_by_key(|(start, _, _)| *start)
            .unwrap_or(system);
        goes_on && start != 0 && address >= start + bytes.len() as u64
    }
}

/// Go frames from `frame` (a return address into Go code, kept already)
/// outwards, by frame pointer: `regs` are the registers in that frame.
/// asmcgocall's frames are frameless: from the call that switched stacks,
/// the goroutine's frames go on from its stack pointer at the switch (the
/// copy holds them when the kernel found that frame where the unwinding
/// did); from the call made on the system stack, from the caller's stack
/// pointer kept in its slot. A Go function that returns into C (called
/// from C) ends the walk: its caller, and the registers there, come back
/// for the C frames to be unwound from their unwind information (frame
/// pointers in C code without them would give junk).
fn walk_go_frames(
    go: &go::GoRuntime,
    memory: &CopiedMemory,
    frame: u64,
    regs: UnwindRegsX86_64,
    unwound: &mut Unwound,
) -> Option<(FrameAddress, UnwindRegsX86_64)> {
    let keep = |address: u64, unwound: &mut Unwound| -> bool {
        unwound.addresses.push(address);
        unwound.addresses.len() < MAX_FRAMES
    };
    let stop = |address: u64, unwound: &mut Unwound| {
        if memory.beyond_copy(address) {
            unwound.truncated = true;
        } else {
            unwound.stopped = Some(UnwindStop::StackReadOutsideCopy);
        }
    };
    let callers_sp = match (go.switched, go.on_system_stack) {
        (Some(switch), _) if switch.return_address == frame => {
            // The CFA of the call into C is just above its return address.
            let Some(sp) = memory.goroutine_sp_at(&switch, regs.sp()) else {
                unwound.stopped = Some(UnwindStop::StackReadOutsideCopy);
                return None;
            };
            Some(sp)
        }
        (_, Some((return_address, slot))) if return_address == frame => {
            let slot = regs.sp() + u64::from(slot);
            match memory.read(slot) {
                Ok(sp) => Some(sp),
                Err(()) => {
                    stop(slot, unwound);
                    return None;
                }
            }
        }
        _ => None,
    };
    if let Some(sp) = callers_sp {
        // asmcgocall's caller: Go code (the ABI wrapper or cgocall).
        match memory.read(sp) {
            Ok(address) if go.text.contains(&address) => {
                if !keep(address, unwound) {
                    return None;
                }
            }
            Ok(_) => {
                unwound.stopped = Some(UnwindStop::OutsideCode);
                return None;
            }
            Err(()) => {
                stop(sp, unwound);
                return None;
            }
        }
    }
    let mut bp = regs.bp();
    while bp != 0 {
        let (Ok(return_address), Ok(next)) = (memory.read(bp + 8), memory.read(bp)) else {
            stop(bp, unwound);
            return None;
        };
        if return_address == 0 {
            return None;
        }
        if !go.text.contains(&return_address) {
            // The frame's function was called from C: its CFA is just
            // above its return address.
            let caller = FrameAddress::from_return_address(return_address)?;
            return Some((caller, UnwindRegsX86_64::new(return_address, bp + 16, next)));
        }
        if !keep(return_address, unwound) || next == bp {
            return None;
        }
        bp = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy of 16 bytes of system stack at 0x7f00_0000 (its size limit,
    /// not its top) and 8 bytes of a goroutine's stack at 0xc000_1000 (all
    /// of it: below the 8 KiB limit).
    fn memory_of(bytes: &[u8]) -> CopiedMemory<'_> {
        let copy = StackCopy {
            base: 0x7f00_0000,
            length: 16,
            reached_top: 0,
            goroutine_sp: 0xc000_1000,
            goroutine_length: 8,
            switch_at: 0x7f00_0008,
            ..StackCopy::default()
        };
        CopiedMemory::new(&copy, bytes)
    }

    #[test]
    fn copied_memory_reads_both_stacks_and_knows_which_goes_on() {
        let bytes: Vec<u8> = [1u64, 2, 3]
            .iter()
            .flat_map(|word| word.to_le_bytes())
            .collect();
        let memory = memory_of(&bytes);
        assert_eq!(memory.read(0x7f00_0000), Ok(1));
        assert_eq!(memory.read(0x7f00_0008), Ok(2));
        assert_eq!(memory.read(0xc000_1000), Ok(3));
        assert_eq!(memory.read(0x7f00_0010), Err(()));
        assert_eq!(memory.read(0xc000_1008), Err(()));
        // The system stack's copy stopped at its limit: it goes on.
        assert!(memory.beyond_copy(0x7f00_0010));
        // The goroutine's is whole: a read past it is not "deeper".
        assert!(!memory.beyond_copy(0xc000_1008));
    }
}
