//! A batch's named fields, placed in its buffer as the daemon's config says.

use crate::memory::Memory;
use pinring_data::{BatchLayout, Config, Dtype};

/// Where a batch's memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Host memory (the host backend: inside the ring's mapping).
    Host,
    /// Device memory of a CUDA device.
    Cuda(u32),
}

/// One field of one batch: a dense, C-ordered tensor `[samples, ...]` at `ptr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldView {
    /// Field name (`images`, `labels`, ...).
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape, batch dimension first.
    pub shape: Vec<u64>,
    /// Address: a device pointer (CUDA) or a host address in this process.
    pub ptr: u64,
    /// Bytes of the field in this batch.
    pub bytes: u64,
    /// Where `ptr` points.
    pub location: Location,
}

/// The fields of the ring's batches: where each lies in every batch buffer.
#[derive(Debug, Clone)]
pub(crate) struct Fields(BatchLayout);

impl Fields {
    /// The fields of a config's batches.
    pub(crate) fn of(cfg: &Config) -> Result<Fields, String> {
        let layout = cfg.batch_layout();
        if layout.fields.is_empty() {
            return Err("the stored config's dataset has no fields".into());
        }
        Ok(Fields(layout))
    }

    /// Where each field of a batch lies.
    pub(crate) fn layout(&self) -> &BatchLayout {
        &self.0
    }

    /// The views of a batch of `samples` in `buffer`; fails if a field would leave the buffer.
    pub(crate) fn views(
        &self,
        samples: u32,
        memory: &Memory,
        buffer: u32,
    ) -> Result<Vec<FieldView>, String> {
        let base = memory.ptr(buffer);
        self.0
            .placements(u64::from(samples))
            .into_iter()
            .map(|p| {
                if p.offset + p.bytes > memory.buffer_bytes() {
                    return Err(format!(
                        "field {} of {samples} samples ends at byte {}, past the buffer's {}",
                        p.name,
                        p.offset + p.bytes,
                        memory.buffer_bytes()
                    ));
                }
                Ok(FieldView {
                    name: p.name,
                    dtype: p.dtype,
                    shape: p.shape,
                    ptr: base + p.offset,
                    bytes: p.bytes,
                    location: memory.location(),
                })
            })
            .collect()
    }
}
