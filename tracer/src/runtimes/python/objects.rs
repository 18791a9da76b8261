//! `--python-objects`: CPython's allocator hooked in an interpreter
//! (`PyObject_*`, `PyMem_*`: pymalloc, which serves objects from its own
//! arenas), its blocks of kind python-object. The functions are found as
//! attach finds any (`attach::sites::symbols::sites_in_mapped`), with the
//! malloc family's programs; a free that only jumps through CPython's
//! allocator table is probed in the function it jumps to.
use std::{fs, path::Path};

use anyhow::Result;
use tracer_ebpf::program;

use crate::{
    attach::{
        HookSite, Probes,
        sites::{
            family::HookFamily,
            forwarding::Forwarding,
            function::HookedFunction,
            prologue,
            symbols::{self, function_size},
        },
    },
    model::{
        allocators::{Allocator, AllocatorCall, PYTHON_OBJECT_ALLOCATORS},
        run::NoticedBy,
    },
    procfs::{self, Mapping},
};

/// CPython's allocator, as attach hooks it: on request, in the
/// interpreter found (`attach`).
pub static OBJECTS: HookFamily = HookFamily {
    name: "CPython's allocator",
    functions: &FUNCTIONS,
    everywhere: false,
    reads_moved_arguments: true,
    unexported_in: None,
    missing: "",
    signatures: SIGNATURES,
    throwing: &[],
};

const FUNCTIONS: [HookedFunction; PYTHON_OBJECT_ALLOCATORS.len()] = {
    let mut functions = [hooked(&PYTHON_OBJECT_ALLOCATORS[0]); PYTHON_OBJECT_ALLOCATORS.len()];
    let mut index = 1;
    while index < functions.len() {
        functions[index] = hooked(&PYTHON_OBJECT_ALLOCATORS[index]);
        index += 1;
    }
    functions
};

/// The integer arguments of CPython's allocator functions, for the
/// prologue check.
const SIGNATURES: &[(&str, usize)] = &[
    ("PyObject_Malloc", 1),
    ("PyObject_Calloc", 2),
    ("PyObject_Realloc", 2),
    ("PyObject_Free", 1),
    ("PyMem_Malloc", 1),
    ("PyMem_Calloc", 2),
    ("PyMem_Realloc", 2),
    ("PyMem_Free", 1),
];

/// One of CPython's allocator functions: the malloc family's programs,
/// but its blocks are python objects.
const fn hooked(allocator: &Allocator) -> HookedFunction {
    let entry_program = match allocator.call {
        AllocatorCall::Calloc => program::PYOBJECT_CALLOC_ENTER,
        AllocatorCall::Realloc | AllocatorCall::ReallocArray => program::PYOBJECT_REALLOC_ENTER,
        AllocatorCall::Free => program::FREE_ENTER,
        _ => program::PYOBJECT_MALLOC_ENTER,
    };
    let free = matches!(allocator.call, AllocatorCall::Free);
    HookedFunction {
        name: allocator.name,
        entry_program: Some(entry_program),
        return_program: if free {
            None
        } else {
            Some(program::ALLOC_RETURN)
        },
        cookie: 0,
    }
}

/// The size above which `PyObject_Malloc` holds pymalloc itself rather
/// than a jump through CPython's allocator table: 27 to 35 bytes in
/// every CPython 3.10-3.13 built without LTO seen (pyenv's, Debian's
/// libpython3.11.so), 247 in Debian's /usr/bin/python3.11 (LTO), whose
/// callers carry the same inlined copy and call it for few objects.
const THIN_WRAPPER_BYTES: u64 = 64;

/// CPython's allocator functions hooked in one interpreter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonObjectHooks {
    /// The names hooked.
    pub functions: Vec<&'static str>,
    /// The size of `PyObject_Malloc` when it holds pymalloc inlined (an
    /// LTO build: most objects are allocated without calling it).
    pub inlined_bytes: Option<u64>,
}

/// Hooks CPython's allocator functions in `object` (the interpreter
/// `pid` runs) for `--python-objects`.
pub fn attach(
    probes: &mut Probes,
    pid: u32,
    object: &Path,
    noticed_by: NoticedBy,
) -> Result<PythonObjectHooks> {
    let sites = sites_in(pid, object)?;
    let Some(malloc) = sites
        .iter()
        .find(|site| site.function.name == "PyObject_Malloc")
    else {
        anyhow::bail!("{} defines no PyObject_Malloc", object.display());
    };
    let inlined_bytes = function_size(pid, &malloc.path, "PyObject_Malloc")
        .filter(|&size| size > THIN_WRAPPER_BYTES);
    for note in probes.attach_sites(pid, &sites, noticed_by)? {
        eprintln!("tracer: {note}");
    }
    Ok(PythonObjectHooks {
        functions: sites.iter().map(|site| site.function.name).collect(),
        inlined_bytes,
    })
}

/// CPython's allocator functions defined in `path` (the interpreter), a
/// file `pid` maps. A free that only jumps through CPython's allocator
/// table is hooked in the function it jumps to (see
/// [`free_behind_wrapper`]).
fn sites_in(pid: u32, path: &Path) -> Result<Vec<HookSite>> {
    let maps = procfs::read_maps(pid).unwrap_or_default();
    let sites = symbols::sites_in_mapped(pid, path, &maps, &FUNCTIONS, Forwarding::TailJumpsOnly)?;
    let mut chosen: Vec<HookSite> = Vec::new();
    for site in sites {
        let site = if site.function.entry_program == Some(tracer_ebpf::program::FREE_ENTER) {
            free_behind_wrapper(pid, &site, &maps).unwrap_or(site)
        } else {
            site
        };
        // PyObject_Free and PyMem_Free jump to the same function.
        if chosen
            .iter()
            .all(|seen| (&seen.file, seen.offset) != (&site.file, site.offset))
        {
            chosen.push(site);
        }
    }
    Ok(chosen)
}

/// Where a thin `PyObject_Free` or `PyMem_Free` really frees. Built
/// without LTO, each is `mov %rdi,%rsi; mov ctx(%rip),%rdi; jmp
/// *free(%rip)` (3.12+: the table's address loaded from the GOT into
/// `%rax` first, then `jmp *free(%rax)`): the pointer moves to the second
/// argument and the call goes through CPython's allocator table
/// (pymalloc's `_PyObject_Free`, unexported). Both instructions after the move read memory relative to
/// the instruction pointer, which the kernel single-steps (~16 µs per free
/// on a VM); the function the table points to now, read from the target,
/// usually starts with instructions it emulates. Its probe reads the
/// pointer from `%rsi` (the attach cookie). None: not such a wrapper, or
/// the table could not be read.
fn free_behind_wrapper(pid: u32, site: &HookSite, maps: &[Mapping]) -> Option<HookSite> {
    use iced_x86::{Code, Decoder, DecoderOptions, Instruction, Register};
    let mapping = maps.iter().find(|mapping| {
        mapping.executable
            && mapping.path == site.path
            && (mapping.file_offset..mapping.file_offset + (mapping.end - mapping.start))
                .contains(&site.function_offset)
    })?;
    let runtime = mapping.start + (site.function_offset - mapping.file_offset);
    // The file the site was read from, which its probe goes in.
    // SAFETY: read only, as attach reads the files it probes.
    let data = unsafe { memmap2::Mmap::map(site.file.opened()?) }.ok()?;
    let code = data.get(usize::try_from(site.function_offset).ok()?..)?;
    let mut decoder = Decoder::with_ip(
        64,
        &code[..code.len().min(32)],
        runtime,
        DecoderOptions::NONE,
    );
    let mut instruction = Instruction::default();
    let mut pointer_moved = false;
    // Registers loaded from memory at a known address (3.12+ load the
    // table's address from the GOT first), and what they hold.
    let mut loaded: Vec<(Register, u64)> = Vec::new();
    let mut slot = None;
    for _ in 0..5 {
        if !decoder.can_decode() {
            break;
        }
        decoder.decode_out(&mut instruction);
        let base = instruction.memory_base();
        let base_value = || {
            if base == Register::RIP {
                Some(0)
            } else {
                loaded
                    .iter()
                    .find(|(register, _)| *register == base)
                    .map(|&(_, value)| value)
            }
        };
        match instruction.code() {
            Code::Mov_r64_rm64 | Code::Mov_rm64_r64
                if instruction.op0_register() == Register::RSI
                    && instruction.op1_register() == Register::RDI =>
            {
                pointer_moved = true;
            }
            // `mov ctx(%rip),%rdi`, `mov GOT(%rip),%rax`, `mov 0xb0(%rax),%rdi`.
            Code::Mov_r64_rm64 if base_value().is_some() => {
                let address = base_value()?.wrapping_add(instruction.memory_displacement64());
                if instruction.op0_register() != Register::RDI {
                    loaded.push((instruction.op0_register(), read_target_u64(pid, address)?));
                }
            }
            Code::Jmp_rm64 if base_value().is_some() => {
                slot = Some(base_value()?.wrapping_add(instruction.memory_displacement64()));
                break;
            }
            _ => return None,
        }
    }
    let slot = slot.filter(|_| pointer_moved)?;
    let target = read_target_u64(pid, slot)?;
    let behind = maps.iter().find(|mapping| {
        mapping.executable && mapping.path == site.path && mapping.contains(target)
    })?;
    let function_offset = behind.file_offset_of(target);
    let code = data.get(usize::try_from(function_offset).ok()?..)?;
    let chosen = prologue::choose_site(code, 0, &[Register::RSI], true);
    let moved = if chosen.moved_arguments.is_empty() {
        vec![(0, Register::RSI)]
    } else {
        chosen.moved_arguments.clone()
    };
    let mut function = site.function;
    function.cookie = symbols::moved_arguments_cookie(&moved);
    Some(HookSite {
        function,
        path: site.path.clone(),
        file: site.file.clone(),
        function_offset,
        offset: function_offset + chosen.offset,
        emulated: chosen.emulated,
        reason: format!(
            "{} (in the function {} jumps to through CPython's allocator table)",
            chosen.reason, site.function.name
        ),
    })
}

/// Eight bytes of `pid`'s memory at `address`.
fn read_target_u64(pid: u32, address: u64) -> Option<u64> {
    use std::os::unix::fs::FileExt as _;
    let memory = fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut word = [0u8; 8];
    memory.read_exact_at(&mut word, address).ok()?;
    Some(u64::from_ne_bytes(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debian's libpython3.11.so jumps through the allocator table; its
    /// /usr/bin/python3.11 (LTO) holds pymalloc in PyObject_Malloc.
    #[test]
    fn debian_lto_python_is_told_from_its_shared_library() {
        let size = |path: &str| {
            function_size(
                std::process::id(),
                std::path::Path::new(path),
                "PyObject_Malloc",
            )
            .unwrap_or_else(|| panic!("{path}: no PyObject_Malloc (cargo xtask setup)"))
        };
        let shared = size("/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0");
        let lto = size("/usr/bin/python3.11");
        assert!(shared <= THIN_WRAPPER_BYTES, "{shared}");
        assert!(lto > THIN_WRAPPER_BYTES, "{lto}");
    }
}
