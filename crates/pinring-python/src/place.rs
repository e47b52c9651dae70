//! `pinring._native.Place`: where a batch or a part stands in the plan, the attributes `Batch`
//! (consumer.rs) and `Part` (producer.rs) share as their base class.

use pyo3::prelude::*;

/// Where a batch or a part stands in the plan: its seq, its batch's number, epoch and index in
/// the epoch. The base of `Batch` and `Part`.
#[derive(Debug, Clone, Copy)]
#[pyclass(module = "pinring._native", name = "Place", subclass, frozen)]
pub struct Place {
    /// The seq: a part's own, a batch's first (its part 0).
    #[pyo3(get)]
    pub(crate) seq: u64,
    /// The batch's number (`seq // parts_per_batch`).
    #[pyo3(get)]
    pub(crate) batch: u64,
    /// The batch's epoch.
    #[pyo3(get)]
    pub(crate) epoch: u32,
    /// The batch's index in its epoch.
    #[pyo3(get)]
    pub(crate) index_in_epoch: u64,
}
