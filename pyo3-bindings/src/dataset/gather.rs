//! A batch's columns laid end to end as its samples arrive (`NativeStream.next_columns`).

use std::sync::Arc;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use shardstream_sharding::mds::Encoding;
use shardstream_sharding::value::DType;
use shardstream_streamer::buffers::{BufferPool, PooledBuffer};
use shardstream_streamer::RawSample;

use crate::arena::{SlotBytes, SlotWriter};
use crate::buffer::{Buffer, ColumnBuffer};

/// One column of a batch, laid end to end.
pub(super) struct Gathered {
    /// `(dtype, shape)` when every value is one fixed-size number or array.
    fixed: Option<(DType, Vec<u64>)>,
    /// Otherwise `count + 1` little-endian u64 offsets into `data`.
    offsets: Vec<u8>,
    data: GatheredBytes,
}

impl Gathered {
    /// The column as `NativeStream.next_columns` hands it to Python: `(dtype, shape, buffer)`
    /// for a fixed-size numeric column, `(None, offsets, buffer)` for any other.
    pub(super) fn into_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let data = match (self.data, self.fixed.is_some()) {
            // Numeric columns are Python's to write (`ColumnBuffer`); variable ones are
            // sliced into values and may lie in a worker's arena.
            (GatheredBytes::Heap(b), true) => ColumnBuffer::new(b).into_pyobject(py)?.into_any(),
            (GatheredBytes::Heap(b), false) => Buffer::new(Bytes::from_owner(b))
                .into_pyobject(py)?
                .into_any(),
            (GatheredBytes::Slot(b), _) => Buffer::in_slot(b).into_pyobject(py)?.into_any(),
        };
        let value = match self.fixed {
            Some((dtype, shape)) => (
                Some(dtype.name()),
                PyTuple::new(py, &shape)?.into_any(),
                data,
            )
                .into_pyobject(py)?,
            None => {
                let offsets = Buffer::new(self.offsets.into()).into_pyobject(py)?;
                (None::<&str>, offsets.into_any(), data).into_pyobject(py)?
            }
        };
        Ok(value.into_any())
    }
}

/// Where a gathered column's bytes lie.
enum GatheredBytes {
    /// Goes back to the dataset's batch pool when Python drops the column.
    Heap(PooledBuffer),
    /// A worker-arena slot, freed when its last holder (here or in the main process) drops it.
    Slot(SlotBytes),
}

/// Value `c` of a sample's columns (empty when the sample has fewer).
pub(super) fn value_of(raw: &RawSample, c: usize) -> &[u8] {
    raw.column(c).unwrap_or(&[])
}

/// One column of a batch being laid end to end as its samples arrive, in an allocation from the
/// dataset's batch pool when one fits: a batch of large values would otherwise fault in and
/// zero fresh pages for every batch (64 MB for 64 samples of 1 MB).
pub(super) struct ColumnGather {
    pub(super) column: usize,
    /// `(dtype, shape)` while every value so far is one fixed-size number or array.
    fixed: Option<(DType, Vec<u64>)>,
    offsets: Vec<u8>,
    data: Vec<u8>,
    /// The arena slot the values go to instead of `data`, while they fit in it.
    slot: Option<SlotWriter>,
    end: u64,
}

impl ColumnGather {
    pub(super) fn new(
        column: usize,
        enc: &Encoding,
        pool: &BufferPool,
        expected_bytes: usize,
        slot: Option<SlotWriter>,
    ) -> Self {
        let data = if slot.is_some() {
            Vec::new()
        } else {
            let mut data = pool.take(expected_bytes);
            data.clear();
            data.reserve(expected_bytes);
            data
        };
        ColumnGather {
            column,
            fixed: fixed_numeric(enc),
            offsets: 0u64.to_le_bytes().to_vec(),
            data,
            slot,
            end: 0,
        }
    }

    pub(super) fn push(&mut self, value: &[u8]) {
        let in_slot = self.slot.as_mut().map(|w| w.push(value));
        if in_slot == Some(false) {
            // The batch outgrew the slot: it goes on the heap, and the slot back to the arena.
            if let Some(w) = self.slot.take() {
                self.data.extend_from_slice(w.written());
            }
        }
        if in_slot != Some(true) {
            self.data.extend_from_slice(value);
        }
        self.end += value.len() as u64;
        self.offsets.extend_from_slice(&self.end.to_le_bytes());
        if let Some((dtype, shape)) = &self.fixed {
            if value.len() as u64 != elem_bytes(*dtype, shape) {
                self.fixed = None;
            }
        }
    }

    pub(super) fn finish(self, pool: &Arc<BufferPool>) -> Gathered {
        Gathered {
            offsets: if self.fixed.is_some() {
                Vec::new()
            } else {
                self.offsets
            },
            fixed: self.fixed,
            data: match self.slot {
                Some(w) => GatheredBytes::Slot(w.finish()),
                None => GatheredBytes::Heap(PooledBuffer::pooled(self.data, pool)),
            },
        }
    }
}

/// A column whose every value is a fixed-size little-endian number or array.
pub(super) fn fixed_numeric(enc: &Encoding) -> Option<(DType, Vec<u64>)> {
    match enc {
        Encoding::Int => Some((DType::I64, Vec::new())),
        Encoding::Scalar(d) => Some((*d, Vec::new())),
        Encoding::NdArray {
            dtype: Some(d),
            shape: Some(shape),
        } => Some((*d, shape.clone())),
        _ => None,
    }
}

fn elem_bytes(dtype: DType, shape: &[u64]) -> u64 {
    shape.iter().product::<u64>() * dtype.size() as u64
}
