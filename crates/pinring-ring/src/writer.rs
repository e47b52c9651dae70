//! A loader's claim on a slot and its write access to the slot's bytes: [`Claim`],
//! [`SlotWriter`] (raw pointer writes into the mapping, never a reference over shared bytes).

use crate::slot::Seat;
#[cfg(doc)]
use crate::LoaderRing;

/// A slot claimed by a loader; only the claimant writes the slot's data until it commits.
/// Made only by [`LoaderRing::try_claim`] and consumed by [`LoaderRing::commit`]: safe code cannot forge one
/// or hold two for one round of a slot.
#[derive(Debug)]
pub struct Claim {
    pub(crate) slot: u32,
    pub(crate) seq: u64,
    pub(crate) ticket: u32,
    pub(crate) seat: Seat,
    /// Taken outside the claimant's own share of the slots ([`LoaderRing::try_claim_preferring`]).
    pub(crate) foreign: bool,
    /// Drop this process's pages of the slot once committed ([`Claim::forget_pages`]).
    pub(crate) forget: bool,
}

impl Claim {
    /// Slot index.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Seq of the batch to make.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Ticket of this round (the commit CAS expects it; an abandon names it).
    pub fn ticket(&self) -> u32 {
        self.ticket
    }

    /// The loader seat that claimed the slot.
    pub fn seat(&self) -> Seat {
        self.seat
    }

    /// Whether the slot lies outside the claimant's own share ([`LoaderRing::try_claim_preferring`]
    /// found none of its own free and took another loader's).
    pub fn foreign(&self) -> bool {
        self.foreign
    }

    /// Asks [`LoaderRing::commit`] to drop this process's pages of the slot once the part is published
    /// ([`LoaderRing::forget_slot_pages`]), so the bytes written here stop counting in this process's
    /// resident memory. For a slot this loader rarely writes (another's share).
    pub fn forget_pages(&mut self) {
        self.forget = true;
    }
}

/// Write access to a claimed slot's bytes. Deliberately not a `&mut [u8]`: the bytes are shared
/// memory that another process could (against the protocol) touch at the same time, and a Rust
/// reference would promise the compiler that nothing else does. Writes go through raw pointers
/// into the mapping; the slot protocol makes the claimant the only conforming writer until it
/// commits.
#[derive(Debug)]
pub struct SlotWriter<'a> {
    pub(crate) base: std::ptr::NonNull<u8>,
    pub(crate) len: usize,
    pub(crate) _claim: std::marker::PhantomData<&'a mut Claim>,
}

impl<'a> SlotWriter<'a> {
    /// Bytes in the slot.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a slot has at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfSlot> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfSlot {
                offset,
                len,
                slot_bytes: self.len,
            }),
        }
    }

    /// Copies `src` into the slot at `offset`.
    pub fn write(&mut self, offset: usize, src: &[u8]) -> Result<(), OutOfSlot> {
        self.check(offset, src.len())?;
        // SAFETY: offset <= len of the slot (checked), so the pointer stays inside it.
        let dst = unsafe { self.base.as_ptr().add(offset) };
        // SAFETY: offset + src.len() <= len (checked), so the destination range lies inside the
        // claimed slot; `src` is private memory of this process, so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Writes `len` bytes at `offset` as little-endian 64-bit words, taking each next word from
    /// `next`, in order (a final partial word is cut short). For generators that compute their
    /// bytes: the loop inlines and vectorises like a plain store loop (a generator that steps a
    /// counter vectorises well; one that multiplies per word does not).
    pub fn write_words(
        &mut self,
        offset: usize,
        len: usize,
        next: impl FnMut() -> u64,
    ) -> Result<(), OutOfSlot> {
        self.check(offset, len)?;
        // SAFETY: offset <= len of the slot (checked above).
        let dst = unsafe { self.base.as_ptr().add(offset) };
        // SAFETY: offset + len <= the slot's length (checked above), so dst..dst + len lies in
        // the claimed slot, which the protocol gives this claimant alone until it commits.
        unsafe { write_words_at(dst, len, next) };
        Ok(())
    }

    /// Cuts the slot into writers of the byte ranges `(offset, len)` of `ranges`, which must lie
    /// in the slot in ascending order without overlapping (a part's field chunks), so each field
    /// has its own writer. `OutOfSlot` names the first range that leaves the slot; ranges out of
    /// order or overlapping are a caller bug (panic).
    pub fn carve(self, ranges: &[(usize, usize)]) -> Result<Vec<SlotWriter<'a>>, OutOfSlot> {
        let mut end = 0;
        let mut out = Vec::with_capacity(ranges.len());
        for &(offset, len) in ranges {
            self.check(offset, len)?;
            assert!(
                offset >= end,
                "ranges overlap or are out of order at offset {offset}"
            );
            end = offset + len;
            out.push(SlotWriter {
                // SAFETY: offset + len <= the slot's length (checked), so the pointer stays
                // inside the slot; it is non-null as the slot's base is.
                base: unsafe { self.base.add(offset) },
                len,
                _claim: std::marker::PhantomData,
            });
        }
        Ok(out)
    }

    /// Copies `out.len()` bytes at `offset` of the slot into `out`: the claimant reading back
    /// what it wrote (a part's labels, for its metadata). A copy, never a reference over the
    /// shared bytes.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfSlot> {
        self.check(offset, out.len())?;
        // SAFETY: offset <= len of the slot (checked), so the pointer stays inside it.
        let src = unsafe { self.base.as_ptr().add(offset) };
        // SAFETY: offset + out.len() <= len (checked): the source range lies inside the claimed
        // slot, which the protocol gives this claimant alone until it commits; `out` is private
        // memory of this process, so the ranges cannot overlap; any byte is a valid u8.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// The slot's first byte, for foreign writers (a Python buffer, a decoder's output). Writing
    /// through it is the caller's `unsafe` business, within [`SlotWriter::len`] bytes and only
    /// while the claim lives.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.base.as_ptr()
    }
}

/// Writes `len` bytes at `dst` as little-endian 64-bit words taken from `next`, in order (a
/// final partial word is cut short): [`SlotWriter::write_words`] without the slot, for writers of
/// other shared regions (the benchmark's reference pipeline). Raw pointer writes, never a
/// reference over the bytes.
///
/// # Safety
/// `dst..dst + len` lies inside a live mapping (or allocation), and no other thread or process
/// reads or writes it until this returns.
pub unsafe fn write_words_at(dst: *mut u8, len: usize, mut next: impl FnMut() -> u64) {
    let whole = len / 8;
    for k in 0..whole {
        // SAFETY: k * 8 + 8 <= len: inside the range the caller vouches for.
        let at = unsafe { dst.add(k * 8) }.cast::<[u8; 8]>();
        // SAFETY: `at` is valid for 8 bytes (above); unaligned writes are allowed.
        unsafe { at.write_unaligned(next().to_le_bytes()) };
    }
    let rest = len % 8;
    if rest > 0 {
        let bytes = next().to_le_bytes();
        // SAFETY: whole * 8 <= len: inside the caller's range.
        let at = unsafe { dst.add(whole * 8) };
        // SAFETY: whole * 8 + rest == len: inside the caller's range; `bytes` is a local.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, rest) };
    }
}

/// A write that would leave the claimed slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{len} bytes at offset {offset} do not fit in the {slot_bytes}-byte slot")]
pub struct OutOfSlot {
    /// Offset of the write.
    pub offset: usize,
    /// Bytes written.
    pub len: usize,
    /// Bytes in the slot.
    pub slot_bytes: usize,
}
