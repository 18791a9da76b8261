//! Go's frames in a copied stack, by frame pointer, and across
//! asmcgocall's switch from the goroutine's stack to the system stack.
use framehop::{FrameAddress, x86_64::UnwindRegsX86_64};

use super::GoRuntime;
use crate::unwind::{
    UnwindStop, Unwound,
    runtime_code::{CodeWalker, CopiedStack},
};

impl CodeWalker for GoRuntime {
    fn contains(&self, address: u64) -> bool {
        self.text.contains(&address)
    }

    fn walk(
        &self,
        stack: &dyn CopiedStack,
        frame: u64,
        regs: UnwindRegsX86_64,
        unwound: &mut Unwound,
    ) -> Option<(FrameAddress, UnwindRegsX86_64)> {
        walk_go_frames(self, stack, frame, regs, unwound)
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
    go: &GoRuntime,
    memory: &dyn CopiedStack,
    frame: u64,
    regs: UnwindRegsX86_64,
    unwound: &mut Unwound,
) -> Option<(FrameAddress, UnwindRegsX86_64)> {
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
            let Some(sp) = memory.switched_from_sp(&switch, regs.sp()) else {
                unwound.stopped = Some(UnwindStop::StackReadOutsideCopy);
                return None;
            };
            Some(sp)
        }
        (_, Some((return_address, slot))) if return_address == frame => {
            let slot = regs.sp() + u64::from(slot);
            match memory.read(slot) {
                Some(sp) => Some(sp),
                None => {
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
            Some(address) if go.text.contains(&address) => {
                if !unwound.keep(address) {
                    return None;
                }
            }
            Some(_) => {
                unwound.stopped = Some(UnwindStop::OutsideCode);
                return None;
            }
            None => {
                stop(sp, unwound);
                return None;
            }
        }
    }
    let mut bp = regs.bp();
    while bp != 0 {
        let (Some(return_address), Some(next)) = (memory.read(bp + 8), memory.read(bp)) else {
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
        if !unwound.keep(return_address) || next == bp {
            return None;
        }
        bp = next;
    }
    None
}
