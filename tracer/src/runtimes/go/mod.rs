//! Go: stacks through cgo. Go code keeps frame pointers; C code called
//! through cgo runs on the thread's system stack (g0), switched to by
//! `runtime.asmcgocall`, while its Go callers stay on the goroutine's
//! stack. asmcgocall (amd64) keeps, just above the return address of its
//! call into C, the goroutine's `g` and the depth of its stack pointer
//! below the stack's top (`g.stack.hi`), and computes the stack pointer
//! back from them when C returns. This runtime reads where it keeps them
//! from its code (`asmcgocall`), so that the kernel can copy the
//! goroutine's stack with the system stack's
//! ([`tracer_ebpf::GoStackSwitch`], the kernel side in
//! `tracer-ebpf/src/stacks/copy.rs`) and the unwinder can go on from C
//! into Go (`walk`).
//!
//! Called while already on the system stack (the runtime's own C calls,
//! such as `x_cgo_mmap`), asmcgocall keeps the caller's stack pointer in
//! the depth's slot instead, and the Go frames go on on the same stack.
//!
//! Go programs allocate from their own heap: their mappings are what is
//! traced (`attach`'s note), nothing here hooks an allocator.
mod asmcgocall;
mod walk;

use std::ops::Range;

use tracer_ebpf::GoStackSwitch;

use crate::unwind::{
    ObjectInfo,
    runtime_code::{CodeWalker, ManagedCode, RuntimeCode},
};

/// Go, as the unwinder sees it.
pub struct Go;

impl RuntimeCode for Go {
    /// Built by the Go toolchain: it has `.go.buildinfo` or a Go build id
    /// note. Go keeps frame pointers on amd64, set up without `push
    /// %rbp`; its code runs from `runtime.text` to `runtime.etext`, and
    /// C code linked in with cgo lies outside.
    fn recognize(&self, elf: &object::File<'_>) -> Option<ManagedCode> {
        use object::Object as _;
        let is_go = elf.section_by_name(".go.buildinfo").is_some()
            || elf.section_by_name(".note.go.buildid").is_some();
        is_go.then(|| ManagedCode {
            runtime: 0,
            text: go_text(elf),
        })
    }

    fn stack_switch(&self, object: &ObjectInfo) -> Option<GoStackSwitch> {
        asmcgocall::go_runtime(object)?.switched
    }

    fn walker(&self, object: &ObjectInfo, base: u64) -> Option<Box<dyn CodeWalker>> {
        let runtime = asmcgocall::go_runtime(object)?.relocated(base);
        Some(Box::new(runtime))
    }
}

/// The addresses of a Go object's Go code, from the linker's
/// `runtime.text` and `runtime.etext` symbols.
fn go_text(elf: &object::File<'_>) -> Option<Range<u64>> {
    use object::{Object as _, ObjectSymbol as _};
    let address = |name: &str| {
        elf.symbols()
            .find(|symbol| symbol.name() == Ok(name))
            .map(|symbol| symbol.address())
    };
    let (start, end) = (address("runtime.text")?, address("runtime.etext")?);
    (start < end).then_some(start..end)
}

/// Where a Go object's asmcgocall calls C, in object addresses (or, once
/// relocated, in the process's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoRuntime {
    /// The Go code (`runtime.text` to `runtime.etext`).
    pub text: Range<u64>,
    /// The call into C after switching to the system stack.
    pub switched: Option<GoStackSwitch>,
    /// The call into C made on the system stack already: its return
    /// address and the slot (from the call's CFA) of the caller's stack
    /// pointer.
    pub on_system_stack: Option<(u64, u32)>,
}

impl GoRuntime {
    /// The same, for the object mapped with its address 0 at `base`.
    pub fn relocated(&self, base: u64) -> GoRuntime {
        GoRuntime {
            text: self.text.start + base..self.text.end + base,
            switched: self.switched.map(|switch| GoStackSwitch {
                return_address: switch.return_address + base,
                ..switch
            }),
            on_system_stack: self
                .on_system_stack
                .map(|(return_address, slot)| (return_address + base, slot)),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::unwind::{ObjectInfo, frame_pointers::keeps_frame_pointers};

    fn object(path: &str) -> ObjectInfo {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path);
        let bytes = std::fs::read(&path).unwrap_or_else(|error| {
            panic!("{} ({error}): run `cargo xtask setup`", path.display())
        });
        super::super::register();
        ObjectInfo::from_bytes(&bytes).expect("an ELF")
    }

    /// Go sets its frame pointers up without `push %rbp`: the Go fixture
    /// is known by its sections and walked with frame pointers, which
    /// reach its goroutine's functions through runtime.systemstack.
    #[test]
    fn go_program_keeps_frame_pointers() {
        let go = object("target/fixtures/go_leak");
        assert!(go.managed.is_some());
        assert_eq!(keeps_frame_pointers(&go), Some(true));
        assert!(object("target/fixtures/leaky").managed.is_none());
    }

    /// A Go program's C code (cgo) decides: Go builds it with `-g -O2`
    /// (no frame pointers) unless told otherwise.
    #[test]
    fn cgo_program_keeps_frame_pointers_only_when_its_c_code_does() {
        let cgo = object("target/fixtures/cgo_leak");
        assert!(cgo.managed.as_ref().is_some_and(|code| code.text.is_some()));
        assert_eq!(keeps_frame_pointers(&cgo), Some(false));
        assert_eq!(
            keeps_frame_pointers(&object("target/fixtures/cgo_leak_fp")),
            Some(true)
        );
    }
}
