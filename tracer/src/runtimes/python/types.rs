//! CPython's objects as `--holders` names them: by their type's
//! `tp_name` (`dict`, `numpy.ndarray`), read from a block's first bytes
//! (`holders::runtime_heaps::ObjectReader`).
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
//! CPython counts the references to its objects: every type named here is
//! a counted one (`TypeNames::intern_runtime`).
use std::collections::HashMap;

use crate::{
    holders::{
        blocks::{GC_HEAD_BYTES, Shape},
        objects::{ObjectReader, TypeNames, word},
        runtime_heaps::ScanContext,
    },
    target_memory,
};

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
/// Objects that view another's buffer (a buffer's owner is named before
/// them).
const VIEW_TYPES: [&str; 2] = ["memoryview", "managedbuffer"];
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

/// A type tracer checked, as far as the scan needs it.
#[derive(Clone, Copy)]
struct Type {
    id: u32,
    flags: u64,
    weak_reference: bool,
}

/// The reader of one scan: CPython's objects in a process that defines
/// `PyType_Type`.
pub struct PythonObjects {
    pid: u32,
    /// `PyType_Type`'s address.
    type_type: u64,
    /// The types checked, by address (junk too: `None`).
    types: HashMap<u64, Option<Type>>,
}

impl PythonObjects {
    /// The reader for the process `scan` reads; none where no module
    /// defines `PyType_Type`.
    pub fn reader(scan: &ScanContext<'_>) -> Option<PythonObjects> {
        Some(PythonObjects {
            pid: scan.pid,
            type_type: scan.globals.symbol_address("PyType_Type")?,
            types: HashMap::new(),
        })
    }

    /// The object at `offset` in a block whose first bytes are `head`.
    fn object_at(&mut self, head: &[u8], offset: u64, names: &mut TypeNames) -> Option<Shape> {
        let refcount = word(head, offset as usize)?;
        let type_address = word(head, (offset + OB_TYPE) as usize)?;
        if refcount == 0 || refcount > MAX_REFCOUNT || type_address % 8 != 0 {
            return None;
        }
        let Type {
            id,
            flags,
            weak_reference,
        } = self.python_type(type_address, names)?;
        let gc = flags & TPFLAGS_HAVE_GC != 0;
        let preheader = flags & (TPFLAGS_MANAGED_DICT | TPFLAGS_MANAGED_WEAKREF) != 0;
        let expected =
            if gc { GC_HEAD_BYTES } else { 0 } + if preheader { PREHEADER_BYTES } else { 0 };
        (expected == offset).then_some(Shape {
            type_id: id,
            object_offset: offset as u8,
            gc_head: gc,
            weak_reference,
        })
    }

    /// The type at `address`, checked (and cached, junk too).
    fn python_type(&mut self, address: u64, names: &mut TypeNames) -> Option<Type> {
        if let Some(known) = self.types.get(&address) {
            return *known;
        }
        let checked = self.check_python_type(address, names);
        self.types.insert(address, checked);
        checked
    }

    fn check_python_type(&mut self, address: u64, names: &mut TypeNames) -> Option<Type> {
        let mut bytes = [0u8; TYPE_BYTES];
        if target_memory::read(self.pid, address, &mut bytes) < TYPE_BYTES {
            return None;
        }
        let meta = word(&bytes, OB_TYPE as usize)?;
        if meta != self.type_type {
            // A metatype (ABCMeta): its own type must be `type`.
            let mut meta_type = [0u8; 8];
            if target_memory::read(self.pid, meta + OB_TYPE, &mut meta_type) < 8
                || u64::from_ne_bytes(meta_type) != self.type_type
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
            id: names.intern_runtime(&name, VIEW_TYPES.contains(&name.as_str())),
            flags,
            weak_reference: WEAK_REFERENCE_TYPES.contains(&name.as_str()),
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

impl ObjectReader for PythonObjects {
    fn object(&mut self, head: &[u8], types: &mut TypeNames) -> Option<Shape> {
        [0, GC_HEAD_BYTES, GC_HEAD_BYTES + PREHEADER_BYTES]
            .into_iter()
            .find_map(|offset| self.object_at(head, offset, types))
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
