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
//! guessed frame; `runtime_code` the seam through which a language
//! runtime (Go: `runtimes::go`) walks its own frames in a copy.
pub mod frame_pointers;
mod modules;
pub mod registry;
pub mod runtime_code;
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
use runtime_code::CopiedStack as _;
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
    /// The walkers of runtime code the process maps (Go's).
    walkers: Vec<Box<dyn runtime_code::CodeWalker>>,
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
        let mut read_stack = |address: u64| memory.read(address).ok_or(());
        let Process {
            unwinder,
            code,
            walkers,
            ..
        } = process;
        let mut regs = UnwindRegsX86_64::new(copy.ip, copy.sp, copy.bp);
        let mut frame = FrameAddress::InstructionPointer(copy.ip);
        let mut unwound = Unwound::default();
        while unwound.addresses.len() < MAX_FRAMES {
            if let Some(walker) = walkers
                .iter()
                .find(|walker| walker.contains(frame.address_for_lookup()))
            {
                unwound.addresses.push(frame.address());
                match walker.walk(&memory, frame.address(), regs, &mut unwound) {
                    Some((caller, caller_regs)) => {
                        // Runtime code called from native code: the
                        // native frames go on from their unwind
                        // information.
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
            walkers: Vec::new(),
            refreshed_at: Instant::now(),
        };
        let mappings = procfs::read_maps(pid).unwrap_or_default();
        for mapping in mappings.iter().filter(|mapping| mapping.executable) {
            if let Some((module, object, base)) = self.files.module(pid, mapping) {
                if object.managed.is_some()
                    && let Some(walker) = runtime_code::walker(&object, base)
                {
                    process.walkers.push(walker);
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

/// How the executable of `pid` (among its `mappings`), when a runtime
/// built it, switches stacks to call native code, relocated; None for a
/// process whose code does not. Only the executable is read: Go programs
/// are executables.
pub fn stack_switch(pid: u32, mappings: &[procfs::Mapping]) -> Option<tracer_ebpf::GoStackSwitch> {
    let executable = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let mut files = ModuleFiles::default();
    mappings
        .iter()
        .filter(|mapping| mapping.executable && mapping.path == executable)
        .find_map(|mapping| {
            let object = files.object(pid, mapping)?;
            let switch = runtime_code::object_stack_switch(&object)?;
            let base = mapping
                .start
                .checked_sub(object.address_of_mapping(mapping)?)?;
            Some(tracer_ebpf::GoStackSwitch {
                return_address: switch.return_address + base,
                ..switch
            })
        })
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
}

impl runtime_code::CopiedStack for CopiedMemory<'_> {
    fn read(&self, address: u64) -> Option<u64> {
        let word = |bytes: &[u8], start: u64| -> Option<u64> {
            let offset = usize::try_from(address.checked_sub(start)?).ok()?;
            let word = bytes.get(offset..offset.checked_add(8)?)?;
            Some(u64::from_le_bytes(word.try_into().ok()?))
        };
        word(self.stack, self.base).or_else(|| word(self.goroutine, self.goroutine_sp))
    }

    /// The goroutine's stack pointer before the switch whose call into C
    /// has its CFA at `cfa`: the one the kernel copied from, or an outer
    /// switch of the same goroutine (C called back into Go, which called
    /// C again), found from the two depths below the same stack top.
    fn switched_from_sp(&self, switch: &tracer_ebpf::GoStackSwitch, cfa: u64) -> Option<u64> {
        if self.switch_at == 0 {
            return None;
        }
        let inner_cfa = self.switch_at + 8;
        if cfa == inner_cfa {
            return Some(self.goroutine_sp);
        }
        let g_and_depth = |cfa: u64| {
            let g = self.read(cfa + u64::from(switch.g_slot))?;
            let depth = self.read(cfa + u64::from(switch.depth_slot))?;
            Some((g, depth))
        };
        let (inner_g, inner_depth) = g_and_depth(inner_cfa)?;
        let (g, depth) = g_and_depth(cfa)?;
        // The outer switch left the goroutine's stack higher up.
        (g == inner_g && depth <= inner_depth).then(|| self.goroutine_sp + (inner_depth - depth))
    }

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
        assert_eq!(memory.read(0x7f00_0000), Some(1));
        assert_eq!(memory.read(0x7f00_0008), Some(2));
        assert_eq!(memory.read(0xc000_1000), Some(3));
        assert_eq!(memory.read(0x7f00_0010), None);
        assert_eq!(memory.read(0xc000_1008), None);
        // The system stack's copy stopped at its limit: it goes on.
        assert!(memory.beyond_copy(0x7f00_0010));
        // The goroutine's is whole: a read past it is not "deeper".
        assert!(!memory.beyond_copy(0xc000_1008));
    }
}
