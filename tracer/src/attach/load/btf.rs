//! A small reader of the kernel's BTF (/sys/kernel/btf/vmlinux): the byte
//! offsets of a few struct fields the eBPF programs read through kernel
//! pointers, which aya-ebpf cannot relocate (no CO-RE). Only what that
//! needs: type records are walked once, structs found by name, members
//! (also inside anonymous structs and unions) by name.
use anyhow::{Context as _, Result, bail};
use tracer_ebpf::ReturnInstanceOffsets;

const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
const MAGIC: u16 = 0xeb9f;

const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

/// The parsed type section: where each type's record starts, by id.
pub struct Btf {
    data: Vec<u8>,
    types_start: usize,
    strings_start: usize,
    strings_len: usize,
    /// Byte offset (from `types_start`) of type id `i + 1`.
    records: Vec<usize>,
}

impl Btf {
    pub fn parse(data: Vec<u8>) -> Result<Btf> {
        let word = |at: usize| -> Result<u32> {
            let bytes = data.get(at..at + 4).context("BTF cut short")?;
            Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
        };
        if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != MAGIC {
            bail!("not little-endian BTF");
        }
        let header_len = word(4)? as usize;
        let types_start = header_len + word(8)? as usize;
        let types_len = word(12)? as usize;
        let strings_start = header_len + word(16)? as usize;
        let strings_len = word(20)? as usize;
        if types_start + types_len > data.len() || strings_start + strings_len > data.len() {
            bail!("BTF sections past the end of the data");
        }
        let mut records = Vec::new();
        let mut at = 0usize;
        while at + 12 <= types_len {
            records.push(at);
            let info = word(types_start + at + 4)?;
            let vlen = (info & 0xffff) as usize;
            let extra = match (info >> 24) & 0x1f {
                1 | 14 | 17 => 4,          // int, var, decl tag
                3 => 12,                   // array
                4 | 5 => 12 * vlen,        // struct, union
                6 | 13 => 8 * vlen,        // enum, func proto
                15 | 19 => 12 * vlen,      // datasec, enum64
                2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef, qualifiers, func, float, type tag
                kind => bail!("unknown BTF kind {kind}"),
            };
            at += 12 + extra;
        }
        Ok(Btf {
            data,
            types_start,
            strings_start,
            strings_len,
            records,
        })
    }

    fn word(&self, at: usize) -> u32 {
        self.data.get(at..at + 4).map_or(0, |bytes| {
            u32::from_le_bytes(bytes.try_into().expect("4 bytes"))
        })
    }

    fn name(&self, offset: u32) -> &[u8] {
        let offset = offset as usize;
        if offset >= self.strings_len {
            return b"";
        }
        let strings =
            &self.data[self.strings_start + offset..self.strings_start + self.strings_len];
        let end = strings
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(strings.len());
        &strings[..end]
    }

    /// (kind, vlen, kind_flag, record start) of type `id`.
    fn record(&self, id: u32) -> Option<(u32, usize, bool, usize)> {
        let at = self.types_start + *self.records.get((id as usize).checked_sub(1)?)?;
        let info = self.word(at + 4);
        Some((
            (info >> 24) & 0x1f,
            (info & 0xffff) as usize,
            info >> 31 == 1,
            at,
        ))
    }

    /// The id of the struct named `name`.
    fn struct_id(&self, name: &str) -> Option<u32> {
        (1..=self.records.len() as u32).find(|&id| {
            self.record(id).is_some_and(|(kind, _, _, at)| {
                kind == KIND_STRUCT && self.name(self.word(at)) == name.as_bytes()
            })
        })
    }

    /// Byte offset of member `member` of the struct or union `id`, looked
    /// for in its anonymous members too.
    fn member_offset(&self, id: u32, member: &str, depth: u32) -> Option<u32> {
        let (kind, vlen, kind_flag, at) = self.record(id)?;
        if !(kind == KIND_STRUCT || kind == KIND_UNION) || depth > 8 {
            return None;
        }
        for index in 0..vlen {
            let member_at = at + 12 + 12 * index;
            let name = self.word(member_at);
            let member_type = self.word(member_at + 4);
            let raw_offset = self.word(member_at + 8);
            let bit_offset = if kind_flag {
                raw_offset & 0x00ff_ffff
            } else {
                raw_offset
            };
            if name == 0 {
                if let Some(inner) = self.member_offset(member_type, member, depth + 1) {
                    return Some(bit_offset / 8 + inner);
                }
            } else if self.name(name) == member.as_bytes() {
                return Some(bit_offset / 8);
            }
        }
        None
    }

    /// Byte offset of `structure.member`.
    pub fn field_offset(&self, structure: &str, member: &str) -> Option<u32> {
        self.member_offset(self.struct_id(structure)?, member, 0)
    }
}

/// Where a thread's pending return instances are in this kernel
/// (`exceptions.rs` of tracer-ebpf), from its BTF.
pub fn return_instance_offsets() -> Result<ReturnInstanceOffsets> {
    let data = std::fs::read(VMLINUX).with_context(|| format!("could not read {VMLINUX}"))?;
    let btf = Btf::parse(data)?;
    let field = |structure: &str, member: &str| {
        btf.field_offset(structure, member)
            .with_context(|| format!("the kernel's BTF has no {structure}.{member}"))
    };
    let offsets = ReturnInstanceOffsets {
        task_utask: field("task_struct", "utask")?,
        utask_return_instances: field("uprobe_task", "return_instances")?,
        instance_func: field("return_instance", "func")?,
        instance_stack: field("return_instance", "stack")?,
        instance_original: field("return_instance", "orig_ret_vaddr")?,
        instance_next: field("return_instance", "next")?,
    };
    if !offsets.known() {
        bail!("the kernel's BTF gives unusable offsets: {offsets:?}");
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernels_return_instances_are_found() {
        let Ok(data) = std::fs::read(VMLINUX) else {
            eprintln!("no {VMLINUX}: nothing to check");
            return;
        };
        let btf = Btf::parse(data).unwrap();
        // Offsets every kernel since 6.12 has (checked with bpftool btf
        // dump): `func`, `stack`, `orig_ret_vaddr` follow a 16-byte hprobe.
        let offsets = return_instance_offsets().unwrap();
        assert_eq!(offsets.instance_stack, offsets.instance_func + 8);
        assert_eq!(offsets.instance_original, offsets.instance_stack + 8);
        assert!(offsets.instance_next > offsets.instance_original);
        assert!(btf.field_offset("task_struct", "utask").unwrap() > 0);
        assert_eq!(btf.field_offset("task_struct", "no_such_member"), None);
    }
}
