//! The guard around maps of target files. tracer maps the objects it reads
//! (its unwind tables, its symbolizer, its ELF readers) instead of copying
//! them: libtorch's are hundreds of MiB. A target that truncates a file
//! tracer has mapped makes the next read of a page past the new end raise
//! SIGBUS, which would kill tracer. The guard catches that SIGBUS
//! (`BUS_ADRERR`: a page of a file mapping with no file behind it), puts
//! a zero page in place of the missing one and lets the read go on: it
//! reads zeros, which every reader of ELF and DWARF already treats as
//! malformed data. Each such page is counted (`truncated_while_read`).
//! Any other SIGBUS keeps its default action.
use std::sync::{
    Once,
    atomic::{AtomicU64, Ordering},
};

static FAULTS: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

/// Pages of truncated files replaced by zeros so far.
pub fn faults() -> u64 {
    FAULTS.load(Ordering::Relaxed)
}

/// Installs the guard (once per process).
pub fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sigaction is plain data; the handler only makes system
        // calls that are safe in a signal handler (mmap, sigaction) and an
        // atomic add.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
        }
    });
}

extern "C" fn on_sigbus(_signal: i32, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, address) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == libc::BUS_ADRERR && replace_page(address) {
        FAULTS.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // Not a truncated file: the default action, on return the fault
    // happens again and ends tracer as it would have.
    // SAFETY: sigaction is plain data; SIG_DFL is always valid.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
    }
}

/// Maps a private zero page (read only) over the page holding `address`.
fn replace_page(address: usize) -> bool {
    // SAFETY: sysconf is async-signal-safe in practice (a cached value).
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let start = address & !(page - 1);
    // SAFETY: the page is part of a file mapping tracer made (the kernel
    // raised BUS_ADRERR for it); MAP_FIXED replaces that one page, and the
    // mapping's owner unmaps it with the rest.
    let mapped = unsafe {
        libc::mmap(
            start as *mut libc::c_void,
            page,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    mapped != libc::MAP_FAILED
}
