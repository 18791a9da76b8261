//! What a traced block is, read from its first words: a runtime's object
//! (an [`ObjectReader`], given by the runtime's
//! `runtime_heaps::RuntimeHeap`: CPython's names an object by its type's
//! `tp_name`, `dict`, `numpy.ndarray`, in `runtimes::python::types`), else
//! a C++ object with a vtable (named by its class, from the `vtable for
//! CLASS` symbol its first word points into).
use std::collections::HashMap;

use super::{
    blocks::{Blocks, Shape},
    names::Globals,
};
use crate::target_memory::{self, IOVECS};

/// Bytes read at the start of each block: a runtime's object as far as
/// 32 bytes in (CPython's pre-header and collector header), its refcount
/// and type.
pub const HEAD_BYTES: usize = 48;

/// The names of the blocks' types, each once, and what a runtime said of
/// each: the names' index is a block's `Shape::type_id`.
#[derive(Default)]
pub struct TypeNames {
    pub names: Vec<String>,
    by_name: HashMap<String, u32>,
    /// Per name: a type of a runtime that counts the references to its
    /// objects (CPython): only counted references point at them, and the
    /// blocks they point at are their data.
    pub counted: Vec<bool>,
    /// Per name: its objects view another's buffer (a buffer is named
    /// after its owner before them).
    pub view: Vec<bool>,
}

impl TypeNames {
    /// The id of `name` (a C++ class's, or a type no runtime counts).
    pub fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.by_name.get(name) {
            return id;
        }
        let id = self.push(name.to_owned());
        self.by_name.insert(name.to_owned(), id);
        id
    }

    /// The id of `name`, a type of a runtime that counts references to
    /// its objects; `view`: its objects view another's buffer.
    pub fn intern_runtime(&mut self, name: &str, view: bool) -> u32 {
        let id = self.intern(name);
        self.counted[id as usize] = true;
        self.view[id as usize] |= view;
        id
    }

    /// Adds a name of its own (`data of TYPE`), not looked up by name.
    pub fn push(&mut self, name: String) -> u32 {
        self.names.push(name);
        self.counted.push(false);
        self.view.push(false);
        self.names.len() as u32 - 1
    }
}

/// Names a runtime's objects by type, one block at a time.
pub trait ObjectReader {
    /// The runtime's object a block holds, from the block's first bytes
    /// (`head`, at most [`HEAD_BYTES`]): where in the block it
    /// starts and its type, named in `types` ([`TypeNames::intern_runtime`]).
    fn object(&mut self, head: &[u8], types: &mut TypeNames) -> Option<Shape>;
}

/// The shape of every block, and the names of their types.
#[derive(Default)]
pub struct Shapes {
    pub types: TypeNames,
    pub of_block: Vec<Shape>,
    /// Blocks named as a runtime's object, and as a C++ object.
    pub runtime_objects: u64,
    pub cpp_objects: u64,
}

/// Reads the start of every block of `pid`, IOVECS blocks per system
/// call, and names what it can: through the runtimes' `readers` first,
/// then by a C++ vtable.
pub fn read(
    pid: u32,
    blocks: &Blocks,
    globals: &Globals,
    readers: &mut [Box<dyn ObjectReader + '_>],
) -> Shapes {
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
            let runtime_object = readers
                .iter_mut()
                .find_map(|reader| reader.object(head, &mut shapes.types));
            let shape = match runtime_object {
                Some(shape) => {
                    shapes.runtime_objects += 1;
                    shape
                }
                None => match cpp_object(head, globals, &mut shapes.types) {
                    Some(shape) => {
                        shapes.cpp_objects += 1;
                        shape
                    }
                    None => Shape::default(),
                },
            };
            shapes.of_block.push(shape);
        }
    }
    shapes
}

/// A C++ object with a vtable: its class, from the `vtable for CLASS`
/// symbol its first word points into.
fn cpp_object(head: &[u8], globals: &Globals, types: &mut TypeNames) -> Option<Shape> {
    let class = globals.vtable_class(word(head, 0)?)?;
    Some(Shape {
        type_id: types.intern(class),
        object_offset: 0,
        gc_head: false,
        weak_reference: false,
    })
}

/// The word at `offset` of `bytes`, if they hold it.
pub fn word(bytes: &[u8], offset: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(
        bytes.get(offset..offset + 8)?.try_into().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_type_is_counted_and_a_class_is_not() {
        let mut types = TypeNames::default();
        let class = types.intern("Cache");
        let dict = types.intern_runtime("dict", false);
        let view = types.intern_runtime("memoryview", true);
        assert_eq!(types.intern("dict"), dict, "one id per name");
        let data = types.push("data of dict".to_owned());
        assert_eq!(types.names[data as usize], "data of dict");
        assert_eq!(types.counted, [false, true, true, false]);
        assert_eq!(types.view, [false, false, true, false]);
        assert_eq!((class, dict, view), (0, 1, 2));
    }
}
