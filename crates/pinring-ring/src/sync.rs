//! The atomics the protocol is made of, behind one indirection: every module that touches the
//! segment's control fields names its atomic types and orderings through here, so that a
//! model-checking build can swap in a checker's atomics in one place.
//!
//! A normal build re-exports `std::sync::atomic`: the segment's structs (layout.rs) are made of
//! these very types, their sizes and offsets are pinned by compile-time asserts, and the futex
//! calls take std's `AtomicU32`.

/// `std::sync::atomic`.
pub mod atomic {
    pub use std::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64, Ordering};
}
