//! The loader session: what every process that fills a ring does, whatever it fills it with.
//!
//! A [`Session`] joins a ring ([`Session::join`]: wait for a live daemon's READY ring, adopt its
//! resolved slot size, compare fingerprints, make the plan that covers its end seq, take a seat
//! in the loader table), then loops on [`Session::claim`] (a FREE slot, with a deadline and a
//! stop check), makes the part the slot's seq names into a [`PartGuard`] ([`Session::part`]), fills it, and
//! commits it ([`PartGuard::commit`]). The Rust
//! loader (`pinring-loader`: synthetic samples or a file source) and `pinring.Producer` (bytes
//! from Python) both run this one loop; the fill is the only difference between them.
//!
//! [`loader`] is that program: the `pinring-loader` binary's body, its flags, its service side
//! under systemd, and the fill from synthetic samples or a file source.
//!
//! The crate holds no unsafe code: the slot writes go through pinring-ring's `SlotWriter`.

#![forbid(unsafe_code)]

pub mod loader;
mod part;
mod session;

pub use part::{Done, Failure, FieldView, PartBuffers, PartError, PartGuard, PlanFailed};
pub use session::{Joined, Next, Session, SessionError};
