//! CPython's memory as the holders scan reads it
//! (`holders::runtime_heaps::RuntimeHeap`): pymalloc's pools, whose live
//! objects tracer has no blocks for (`pools`), and its objects named by
//! type (`types`).
use super::{pools, types::PythonObjects};
use crate::holders::{
    blocks::Blocks,
    objects::ObjectReader,
    runtime_heaps::{RuntimeHeap, ScanContext, UntracedObjects},
};

/// CPython's heap.
pub struct PythonHeap;

impl RuntimeHeap for PythonHeap {
    fn find(
        &self,
        scan: &ScanContext<'_>,
        known: &Blocks,
        skip: &[(u64, u64)],
        limit: usize,
    ) -> UntracedObjects {
        pools::find(scan, known, skip, limit)
    }

    fn objects<'a>(&self, scan: &ScanContext<'a>) -> Option<Box<dyn ObjectReader + 'a>> {
        Some(Box::new(PythonObjects::reader(scan)?))
    }
}
