//! What a traced block is, read from its first words: a CPython object
//! (named by its type's `tp_name`: `dict`, `numpy.ndarray`) or a C++
//! object with a vtable (named by its class, from the `vtable for CLASS`
//! symbol its first word points into).
//!
//! A CPython object starts at the block, or after its garbage collector
//! header (`PyGC_Head`, 16 bytes, when its type has Py_TPFLAGS_HAVE_GC),
//! after the pre-header of two words before that (3.11+: a type with a
//! managed dict or, 3.12+, managed weak references). It is taken as one
//! only when its `ob_type` is a type: a readable object whose own
//! `ob_type` is `type` (`PyType_Type`, by symbol) or a metatype whose
//! `ob_type` is `type`, that is ready (Py_TPFLAGS_READY), whose flags put
//! the object where it was found, and whose `tp_name` is a printable
//! string. These offsets (ob_type +8, tp_name +24, tp_flags +168) are the
//! same in every 64-bit CPython 3.10-3.13.
//!
//! The collector's header links each object into its generation's list:
//! those links are no reference (a pointer into a header, and the header's
//! own words, are left out of the graph and counted), and a pointer to the
//! object itself, past its header, counts as a pointer to its block's start.
use std::collections::HashMap;

use super::{
    blocks::{Blocks, GC_HEAD_BYTES, Shape},
    names::Globals,
};
use crate::target_memory::{self, IOVECS};

/// Bytes read at the start of each block: an object as far as 32 bytes in
/// (pre-header and collector header), its refcount and type.
const HEAD_BYTES: usize = 48;
const OB_TYPE: u64 = 8;
const TP_NAME: u64 = 24;
const TP_FLAGS: u64 = 168;
const TYPE_BYTES: usize = TP_FLAGS as usize + 8;
/// CPython's weak reference types (`weakref.ref`, its proxies, and
/// `weakref.KeyedRef` of WeakValueDictionary), by `tp_name`.
const WEAK_REFERENCE_TYPES: [&str; 4] = [
    "weakref.ReferenceType",
    "weakref.ProxyType",
    "weakref.CallableProxyType",
    "KeyedRef",
];
/// The longest type name read.
const NAME_BYTES: usize = 128;
const TPFLAGS_MANAGED_WEAKREF: u64 = 1 << 3;
const TPFLAGS_MANAGED_DICT: u64 = 1 << 4;
const TPFLAGS_READY: u64 = 1 << 12;
const TPFLAGS_HAVE_GC: u64 = 1 << 14;
/// The pre-header's size (CPython 3.11+), before the `PyGC_Head`.
const PREHEADER_BYTES: u64 = 16;
/// No refcount of a live object is this high (3.12's immortal objects
/// have 2^32 - 1).
const MAX_REFCOUNT: u64 = 1 << 40;

/// The shape of every block, and the names of their types.
#[derive(Default)]
pub struct Shapes {
    pub names: Vec<String>,
    /// Per name: whether it is a Python type's (else a C++ class's).
    pub python: Vec<bool>,
    pub of_block: Vec<Shape>,
    /// Blocks named as a Python object, and as a C++ object.
    pub python_objects: u64,
    pub cpp_objects: u64,
}

/// A type tracer checked, as far as the scan needs it.
#[derive(Clone, Copy)]
struct Type {
    id: u32,
    flags: u64,
}

struct Reader<'a> {
    pid: u32,
    globals: &'a Globals,
    /// `PyType_Type`'s address, where a module defines it.
    type_type: Option<u64>,
    types: HashMap<u64, Option<Type>>,
    names: Vec<String>,
    by_name: HashMap<String, u32>,
    /// The ids of Python types' names.
    python_ids: Vec<u32>,
}

/// Reads the start of every block of `pid`, IOVECS blocks per system
/// call, and names what it can.
pub fn read(pid: u32, blocks: &Blocks, globals: &Globals) -> Shapes {
    let mut reader = Reader {
        pid,
        globals,
        type_type: globals.symbol_address("PyType_Type"),
        types: HashMap::new(),
        names: Vec::new(),
        by_name: HashMap::new(),
        python_ids: Vec::new(),
    };
    let mut shapes = Shapes {
        of_block: Vec::with_capacity(blocks.len()),
        ..Shapes::default()
    };
    let mut buffer = vec![0u8; IOVECS * HEAD_BYTES];
    let mut lengths = Vec::with_capacity(IOVECS);
    for first in (0..blocks.len()).step_by(IOVECS) {
        let batch = first..(first + IOVECS).min(blocks.len());
        let wanted: Vec<(u64, usize)> = batch
            .map(|index| {
                let block = blocks.get(index as u32);
                (block.address, (block.size as usize).min(HEAD_BYTES))
            })
            .collect();
        target_memory::read_pieces(pid, &wanted, HEAD_BYTES, &mut buffer, &mut lengths);
        for (index, &length) in lengths.iter().enumerate() {
            let head = &buffer[index * HEAD_BYTES..index * HEAD_BYTES + length];
            let shape = match reader.shape(head) {
                Some((shape, true)) => {
                    shapes.python_objects += 1;
                    shape
                }
                Some((shape, false)) => {
                    shapes.cpp_objects += 1;
                    shape
                }
                None => Shape::default(),
            };
            shapes.of_block.push(shape);
        }
    }
    shapes.python = vec![false; reader.names.len()];
    for type_id in reader.python_ids {
        shapes.python[type_id as usize] = true;
    }
    shapes.names = reader.names;
    shapes
}

fn word(bytes: &[u8], offset: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(
        bytes.get(offset..offset + 8)?.try_into().ok()?,
    ))
}

impl Reader<'_> {
    fn intern(&mut self, name: String) -> u32 {
        let next = self.names.len() as u32;
        *self.by_name.entry(name).or_insert_with_key(|name| {
            self.names.push(name.clone());
            next
        })
    }

    /// The block's shape, and whether it is a Python object.
    fn shape(&mut self, head: &[u8]) -> Option<(Shape, bool)> {
        if self.type_type.is_some() {
            for offset in [0, GC_HEAD_BYTES, GC_HEAD_BYTES + PREHEADER_BYTES] {
                if let Some(shape) = self.python_object_at(head, offset) {
                    return Some((shape, true));
                }
            }
        }
        let class = self.globals.vtable_class(word(head, 0)?)?.to_owned();
        let shape = Shape {
            type_id: self.intern(class),
            object_offset: 0,
            gc_head: false,
            weak_reference: false,
        };
        Some((shape, false))
    }

    /// The object at `offset` in a block whose first bytes are `head`.
    fn python_object_at(&mut self, head: &[u8], offset: u64) -> Option<Shape> {
        let refcount = word(head, offset as usize)?;
        let type_address = word(head, (offset + OB_TYPE) as usize)?;
        if refcount == 0 || refcount > MAX_REFCOUNT || type_address % 8 != 0 {
            return None;
        }
        let Type { id, flags } = self.python_type(type_address)?;
        let gc = flags & TPFLAGS_HAVE_GC != 0;
        let preheader = flags & (TPFLAGS_MANAGED_DICT | TPFLAGS_MANAGED_WEAKREF) != 0;
        let expected =
            if gc { GC_HEAD_BYTES } else { 0 } + if preheader { PREHEADER_BYTES } else { 0 };
        (expected == offset).then(|| Shape {
            type_id: id,
            object_offset: offset as u8,
            gc_head: gc,
            weak_reference: WEAK_REFERENCE_TYPES.contains(&self.names[id as usize].as_str()),
        })
    }

    /// The type at `address`, checked (and cached, junk too).
    fn python_type(&mut self, address: u64) -> Option<Type> {
        if let Some(known) = self.types.get(&address) {
            return *known;
        }
        let checked = self.check_python_type(address);
        self.types.insert(address, checked);
        checked
    }

    fn check_python_type(&mut self, address: u64) -> Option<Type> {
        let type_type = self.type_type?;
        let mut bytes = [0u8; TYPE_BYTES];
        if target_memory::read(self.pid, address, &mut bytes) < TYPE_BYTES {
            return None;
        }
        let meta = word(&bytes, OB_TYPE as usize)?;
        if meta != type_type {
            // A metatype (ABCMeta): its own type must be `type`.
            let mut meta_type = [0u8; 8];
            if target_memory::read(self.pid, meta + OB_TYPE, &mut meta_type) < 8
                || u64::from_ne_bytes(meta_type) != type_type
            {
                return None;
            }
        }
        let flags = word(&bytes, TP_FLAGS as usize)?;
        if flags & TPFLAGS_READY == 0 {
            return None;
        }
        let name = self.read_name(word(&bytes, TP_NAME as usize)?)?;
        Some(Type {
            id: {
                let id = self.intern(name);
                self.python_ids.push(id);
                id
            },
            flags,
        })
    }

    /// A NUL-terminated printable name at `address`.
    fn read_name(&self, address: u64) -> Option<String> {
        let mut bytes = [0u8; NAME_BYTES];
        let read = target_memory::read(self.pid, address, &mut bytes);
        if read == 0 {
            // The name may end near the end of a page: read it shorter.
            let to_page = (4096 - address % 4096) as usize;
            let read =
                target_memory::read(self.pid, address, &mut bytes[..to_page.min(NAME_BYTES)]);
            return printable(&bytes[..read]);
        }
        printable(&bytes[..read])
    }
}

fn printable(bytes: &[u8]) -> Option<String> {
    let end = bytes.iter().position(|&byte| byte == 0)?;
    let name = &bytes[..end];
    (!name.is_empty() && name.iter().all(|byte| byte.is_ascii_graphic()))
        .then(|| String::from_utf8_lossy(name).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_names_only() {
        assert_eq!(printable(b"dict\0junk"), Some("dict".to_owned()));
        assert_eq!(
            printable(b"numpy.ndarray\0"),
            Some("numpy.ndarray".to_owned())
        );
        assert_eq!(printable(b"\0"), None);
        assert_eq!(printable(b"no end"), None);
        assert_eq!(printable(b"bad\x01\0"), None);
    }
}
