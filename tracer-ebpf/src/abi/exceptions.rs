//! Exceptions unwinding through return-probed frames (EXCEPTION_UNWINDS,
//! EXCEPTION_HELD) and the kernel layout the walk reads.

/// Pending return instances a message carries at most (the innermost
/// ones: the walk starts at the newest).
pub const RETURN_SLOTS: usize = 16;

/// One pending return of a uretprobe (or uprobe session) on the thread
/// that starts an unwind: the kernel's `struct return_instance`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReturnSlot {
    /// Address of the stack word that held the return address (the stack
    /// pointer at the probed function's entry), where the kernel wrote
    /// its trampoline's address.
    pub stack: u64,
    /// The return address the trampoline replaced.
    pub original: u64,
    /// The probed function's address.
    pub function: u64,
}

/// A thread of a traced process started an unwind while return probes
/// of its frames were pending; the process is stopped (SIGSTOP) until
/// userspace has put their return addresses back.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExceptionUnwind {
    /// pid_tgid of the thread.
    pub thread: u64,
    /// When it was held (`bpf_ktime_get_ns`), as in EXCEPTION_HELD.
    pub held_since_ns: u64,
    /// Entries of `slots` filled.
    pub count: u32,
    /// 1 when the thread had more pending returns than `slots` holds.
    pub cut: u32,
    pub slots: [ReturnSlot; RETURN_SLOTS],
}

/// Byte offsets, read from the kernel's BTF at start-up, of the fields
/// the walk of a thread's pending returns reads. All zero: unknown (no
/// walk; the functions that can throw get no return probe).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReturnInstanceOffsets {
    /// `task_struct.utask`.
    pub task_utask: u32,
    /// `uprobe_task.return_instances`.
    pub utask_return_instances: u32,
    /// `return_instance.func`.
    pub instance_func: u32,
    /// `return_instance.stack`.
    pub instance_stack: u32,
    /// `return_instance.orig_ret_vaddr`.
    pub instance_original: u32,
    /// `return_instance.next`.
    pub instance_next: u32,
}

impl ReturnInstanceOffsets {
    /// Whether the offsets were found.
    pub const fn known(&self) -> bool {
        self.task_utask != 0 && self.instance_next != 0
    }
}
