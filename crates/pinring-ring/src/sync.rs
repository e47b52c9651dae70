//! The atomics the protocol is made of, behind one indirection so that a model checker can stand
//! in for them.
//!
//! A normal build re-exports `std::sync::atomic`: the segment's structs (layout.rs) are made of
//! these very types, their sizes and offsets are pinned by compile-time asserts, and the futex
//! calls take std's `AtomicU32`. The model-checking build (`RUSTFLAGS="--cfg loom"`, see
//! `src/loom_tests.rs` and docs/ARCHITECTURE.md) swaps in `loom`'s atomics, which record every access
//! and let `loom` run the slot transitions (slot.rs, recovery.rs) and the counted futex wake-ups
//! (futex.rs) under every interleaving and every value the memory model allows a load to
//! return. Those atomics are larger than std's, so that build has no segment: layout.rs drops its
//! size asserts and the mmap-backed modules (segment, ring, lock, fault) are left out.

/// `std::sync::atomic` in a normal build.
#[cfg(not(loom))]
pub mod atomic {
    pub use std::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64, Ordering};
}

/// `loom`'s atomics in the model-checking build.
///
/// One adjustment: `loom` treats a `SeqCst` access as `AcqRel` (a documented limitation; its
/// `SeqCst` *fences* are exact). The counted futex wait rests on the store-load guarantee that
/// only `SeqCst` gives (each side increments one word, then loads the other), so under plain
/// `loom` types the checker would report a lost wake-up that the Rust memory model rules out.
/// Here a `SeqCst` load is therefore a `SeqCst` fence followed by the load, which gives two such
/// increment-then-load sequences exactly the guarantee `SeqCst` gives them. It is stronger than
/// `SeqCst` only for code that relies on a weaker store being ordered before a later `SeqCst`
/// load; the crate has none (every `SeqCst` load follows a `SeqCst` read-modify-write).
#[cfg(loom)]
pub mod atomic {
    pub use loom::sync::atomic::fence;
    pub use std::sync::atomic::Ordering;

    macro_rules! model_atomic {
        ($name:ident, $int:ty) => {
            /// A `loom` atomic with the methods the crate uses (see the module note on `SeqCst`).
            #[derive(Debug)]
            pub struct $name(loom::sync::atomic::$name);

            impl $name {
                /// A new atomic holding `v` (inside a `loom` model only).
                #[track_caller]
                pub fn new(v: $int) -> $name {
                    $name(loom::sync::atomic::$name::new(v))
                }

                /// Loads the value.
                #[track_caller]
                pub fn load(&self, order: Ordering) -> $int {
                    if order == Ordering::SeqCst {
                        fence(Ordering::SeqCst);
                    }
                    self.0.load(order)
                }

                /// Stores `v`.
                #[track_caller]
                pub fn store(&self, v: $int, order: Ordering) {
                    self.0.store(v, order)
                }

                /// Stores `v`, returning the previous value.
                #[track_caller]
                pub fn swap(&self, v: $int, order: Ordering) -> $int {
                    self.0.swap(v, order)
                }

                /// Stores `new` if the value is `current`.
                #[track_caller]
                pub fn compare_exchange(
                    &self,
                    current: $int,
                    new: $int,
                    success: Ordering,
                    failure: Ordering,
                ) -> Result<$int, $int> {
                    self.0.compare_exchange(current, new, success, failure)
                }

                /// Adds `v` (wrapping), returning the previous value.
                #[track_caller]
                pub fn fetch_add(&self, v: $int, order: Ordering) -> $int {
                    self.0.fetch_add(v, order)
                }

                /// Subtracts `v` (wrapping), returning the previous value.
                #[track_caller]
                pub fn fetch_sub(&self, v: $int, order: Ordering) -> $int {
                    self.0.fetch_sub(v, order)
                }

                /// Bitwise or with `v`, returning the previous value.
                #[track_caller]
                pub fn fetch_or(&self, v: $int, order: Ordering) -> $int {
                    self.0.fetch_or(v, order)
                }
            }
        };
    }

    model_atomic!(AtomicU16, u16);
    model_atomic!(AtomicU32, u32);
    model_atomic!(AtomicU64, u64);
}
