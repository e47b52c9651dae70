//! `AlignedBuf`: a page-aligned, zero-initialised heap allocation that is shared between threads
//! and accessed only through raw pointers.
//!
//! It never hands out `&mut [u8]`; writers go through [`AlignedBuf::write_from`] (raw copy) and
//! readers through [`AlignedBuf::slice`]. Whoever uses it must make sure a write never overlaps
//! in time with a read or another write of the same bytes; the uploaders do that with per-buffer
//! "pending upload" counters (see `host.rs`).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use crate::BackendError;

/// Alignment of every buffer: one 4 KiB page (also enough for any SIMD copy).
pub const PAGE: usize = 4096;

/// A page-aligned zeroed allocation of `len` bytes (at least one page is allocated), or a range
/// of memory someone else owns ([`AlignedBuf::placed`]).
#[derive(Debug)]
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// `Some` for our own allocation (freed on drop); `None` for placed memory.
    layout: Option<Layout>,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Box<[u8]>); the pointer is not tied to
// any thread. Concurrent access is only possible through the unsafe `write_from` / `slice`, whose
// contracts require callers to prevent overlapping write/read of the same bytes.
unsafe impl Send for AlignedBuf {}
// SAFETY: see `Send`: the only `&self` accessors that touch the bytes are unsafe and require
// the caller to rule out data races.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes aligned to [`PAGE`].
    pub fn new(len: usize, what: &'static str) -> Result<Self, BackendError> {
        let size = len.max(1).next_multiple_of(PAGE);
        let layout = Layout::from_size_align(size, PAGE)
            .map_err(|_| BackendError::HostAlloc { bytes: len, what })?;
        // SAFETY: `layout` has non-zero size (at least one page) as `alloc_zeroed` requires.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(BackendError::HostAlloc { bytes: len, what })?;
        Ok(Self {
            ptr,
            len,
            layout: Some(layout),
        })
    }

    /// `len` bytes at `ptr` that the caller owns (e.g. part of a shared-memory segment); they
    /// are neither zeroed nor freed, and need no particular alignment.
    ///
    /// # Safety
    /// `ptr..ptr+len` is valid for reads and writes for as long as the returned value lives.
    /// Its bytes may be read (and, by a process breaking the protocol, written) concurrently by
    /// other processes: the users of a placed buffer never make a Rust reference to them (see
    /// [`AlignedBuf::is_placed`]).
    pub unsafe fn placed(ptr: NonNull<u8>, len: usize) -> Self {
        Self {
            ptr,
            len,
            layout: None,
        }
    }

    /// Whether the memory is the caller's ([`AlignedBuf::placed`]): then it must only be read
    /// with raw copies, never through [`AlignedBuf::slice`].
    pub fn is_placed(&self) -> bool {
        self.layout.is_none()
    }

    /// Usable length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Start of the allocation.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Start of the allocation, for writing through raw pointers only.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Copies bytes `offset..offset + out.len()` into `out`, with a raw copy (no reference to
    /// the buffer's bytes is made, so it suits placed memory).
    ///
    /// # Safety
    /// - `offset + out.len() <= self.len()`;
    /// - no thread of this process writes those bytes during the call, and every earlier write
    ///   of this process happened-before it.
    pub unsafe fn copy_to(&self, offset: usize, out: &mut [u8]) {
        debug_assert!(offset
            .checked_add(out.len())
            .is_some_and(|end| end <= self.len));
        // In bounds (the caller's promise), so the wrapping add is a plain add.
        let start = self.ptr.as_ptr().wrapping_add(offset);
        // SAFETY: start..start+out.len() lies in the allocation (the caller's promise); `out` is
        // a private `&mut`, so the ranges do not overlap; the caller rules out writes by this
        // process.
        unsafe { std::ptr::copy_nonoverlapping(start, out.as_mut_ptr(), out.len()) };
    }

    /// Sets every usable byte to `byte` (touching, i.e. faulting in, every page).
    pub fn fill(&mut self, byte: u8) {
        // SAFETY: `&mut self` guarantees that no thread of this process uses the buffer; the
        // pointer is valid for `len` bytes. A raw write, so placed memory is never referenced.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) };
    }

    /// Copies `len` bytes from `src` to the buffer, starting at byte `offset`.
    ///
    /// # Safety
    /// - `offset + len <= self.len()`;
    /// - `src..src+len` is valid for reads and does not overlap this buffer;
    /// - no other thread reads or writes `self[offset..offset + len]` during the call (no live
    ///   `&[u8]` from [`AlignedBuf::slice`] covers those bytes).
    pub unsafe fn write_from(&self, offset: usize, src: *const u8, len: usize) {
        debug_assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        // In bounds (offset + len <= len of the allocation, the caller's promise), so the
        // wrapping add is a plain add.
        let dst = self.ptr.as_ptr().wrapping_add(offset);
        // SAFETY: the caller guarantees src is readable for len bytes, that offset + len fits in
        // our allocation (so dst..dst+len is writable), that the ranges do not overlap, and that
        // nobody else accesses these bytes meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    }

    /// Bytes `offset..offset + len` as a shared slice.
    ///
    /// # Safety
    /// - the buffer is not [placed](AlignedBuf::placed) (another process may write those bytes);
    /// - `offset + len <= self.len()`;
    /// - no write to `self[offset..offset + len]` happens while the returned slice is alive, and
    ///   every earlier write happened-before this call (e.g. via an Acquire load of a counter the
    ///   writer released).
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        debug_assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        // In bounds (the caller's promise), so the wrapping add is a plain add.
        let start = self.ptr.as_ptr().wrapping_add(offset);
        // SAFETY: offset + len <= self.len (the caller's promise), so start..start+len lies in
        // the allocation, which is initialised (zeroed at allocation); u8 needs no alignment; the
        // caller rules out concurrent writes for the slice's lifetime.
        unsafe { std::slice::from_raw_parts(start, len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: `ptr` came from `alloc_zeroed(layout)` and is freed exactly once, here.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let b = AlignedBuf::new(10_000, "test").unwrap();
        assert_eq!(b.as_ptr() as usize % PAGE, 0);
        assert_eq!(b.len(), 10_000);
        // SAFETY: single-threaded test, no writes.
        let s = unsafe { b.slice(0, 10_000) };
        assert!(s.iter().all(|&x| x == 0));
        // SAFETY: as above; 9_000 + 1_000 <= 10_000.
        assert_eq!(unsafe { b.slice(9_000, 1_000) }.len(), 1_000);
    }

    #[test]
    fn placed_memory_is_used_in_place_and_not_freed() {
        let mut mem = vec![0u8; 100];
        let ptr = NonNull::new(mem.as_mut_ptr()).unwrap();
        // SAFETY: `mem` outlives `b` (dropped first) and is used only through it meanwhile.
        let mut b = unsafe { AlignedBuf::placed(ptr, 64) };
        assert!(b.is_placed());
        assert_eq!(b.as_ptr(), mem.as_ptr());
        b.fill(3);
        // SAFETY: 4 + 2 <= 64; the source is a private array; single-threaded.
        unsafe { b.write_from(4, [9u8, 9].as_ptr(), 2) };
        let mut out = [0u8; 8];
        // SAFETY: 8 <= 64; single-threaded, the writes above happened before.
        unsafe { b.copy_to(0, &mut out) };
        assert_eq!(out, [3, 3, 3, 3, 9, 9, 3, 3]);
        drop(b);
        assert_eq!(mem[..8], out);
        assert_eq!(mem[64], 0, "nothing past the placed range");
    }

    #[test]
    fn zero_length_is_fine() {
        let b = AlignedBuf::new(0, "test").unwrap();
        assert_eq!(b.len(), 0);
    }
}
