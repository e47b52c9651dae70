//! Position-sensitive checksum over bytes, computable as a commutative sum.
//!
//! The bytes are split into little-endian `u64` words (the last word zero-padded). Word `i`
//! contributes `mix64(w_i ^ i * 0x9E3779B97F4A7C15)` where `mix64` is the splitmix64 finalizer;
//! the checksum is the wrapping sum of all contributions. Because the index is mixed into each
//! term, reordering words changes the result, yet the sum itself is commutative, so a GPU
//! reduction with atomics in any order gives exactly the same value as this reference.

/// The golden-ratio constant that spreads word indices.
pub const INDEX_MUL: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 finalizer.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The contribution of word `w` at word index `index`.
#[inline]
pub fn word_term(index: u64, w: u64) -> u64 {
    mix64(w ^ index.wrapping_mul(INDEX_MUL))
}

/// Checksum of `bytes` (one shot).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut c = Checksum::new();
    c.update_tail(bytes);
    c.value()
}

/// Incremental checksum: feed pieces whose lengths are multiples of 8 with [`Checksum::update`],
/// optionally a last piece of any length with [`Checksum::update_tail`].
#[derive(Debug, Clone, Default)]
pub struct Checksum {
    sum: u64,
    next_word: u64,
}

impl Checksum {
    /// A fresh accumulator at word index 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh accumulator whose first word has index `word_index` (for checksumming a piece
    /// that starts at byte `8 * word_index` of a larger buffer).
    pub fn starting_at_word(word_index: u64) -> Self {
        Self {
            sum: 0,
            next_word: word_index,
        }
    }

    /// Adds `bytes`, which must be a whole number of words.
    ///
    /// # Panics
    /// If `bytes.len()` is not a multiple of 8.
    pub fn update(&mut self, bytes: &[u8]) {
        assert!(
            bytes.len() % 8 == 0,
            "Checksum::update needs a multiple of 8 bytes, got {} (use update_tail for the last piece)",
            bytes.len()
        );
        self.add_words(bytes);
    }

    /// Adds a last piece of any length (its trailing partial word is zero-padded). Further
    /// updates after a piece whose length is not a multiple of 8 would mis-index words; don't.
    pub fn update_tail(&mut self, bytes: &[u8]) {
        let whole = bytes.len() - bytes.len() % 8;
        self.add_words(&bytes[..whole]);
        let rest = &bytes[whole..];
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add_word(u64::from_le_bytes(w));
        }
    }

    /// Adds one word at the next index.
    #[inline]
    pub fn add_word(&mut self, w: u64) {
        self.sum = self.sum.wrapping_add(word_term(self.next_word, w));
        self.next_word = self.next_word.wrapping_add(1);
    }

    fn add_words(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks_exact(8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            self.add_word(u64::from_le_bytes(w));
        }
    }

    /// Number of words consumed so far (plus the starting index).
    pub fn words(&self) -> u64 {
        self.next_word
    }

    /// The checksum so far.
    pub fn value(&self) -> u64 {
        self.sum
    }

    /// Combines with the accumulator of a later, disjoint piece (sums are commutative).
    pub fn combine(a: u64, b: u64) -> u64 {
        a.wrapping_add(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 + 7) as u8).collect()
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(checksum(&[]), 0);
    }

    #[test]
    fn mix64_known_value() {
        // splitmix64 with state 0: first output is mix64(0x9E3779B97F4A7C15).
        assert_eq!(mix64(0x9E37_79B9_7F4A_7C15), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn word_order_matters() {
        let a = bytes(64);
        let mut b = a.clone();
        // swap word 0 and word 1
        let (w0, w1) = b.split_at_mut(8);
        w0.swap_with_slice(&mut w1[..8]);
        assert_ne!(a, b);
        assert_ne!(checksum(&a), checksum(&b));
    }

    #[test]
    fn flipped_byte_changes_it() {
        let a = bytes(1000);
        let base = checksum(&a);
        for pos in [0, 7, 8, 500, 999] {
            let mut b = a.clone();
            b[pos] ^= 0x01;
            assert_ne!(base, checksum(&b), "flip at {pos}");
        }
    }

    #[test]
    fn tail_is_zero_padded() {
        let a = bytes(13);
        let mut padded = a.clone();
        padded.resize(16, 0);
        assert_eq!(checksum(&a), checksum(&padded));
    }

    #[test]
    fn incremental_equals_one_shot() {
        let a = bytes(4096 + 5);
        let mut c = Checksum::new();
        c.update(&a[..8]);
        c.update(&a[8..1024]);
        c.update(&a[1024..4096]);
        c.update_tail(&a[4096..]);
        assert_eq!(c.value(), checksum(&a));
        assert_eq!(c.words(), 513);
    }

    #[test]
    fn pieces_combine() {
        let a = bytes(2048);
        let mut lo = Checksum::new();
        lo.update(&a[..1024]);
        let mut hi = Checksum::starting_at_word(128);
        hi.update(&a[1024..]);
        assert_eq!(Checksum::combine(lo.value(), hi.value()), checksum(&a));
    }

    #[test]
    #[should_panic(expected = "multiple of 8")]
    fn update_rejects_partial_words() {
        Checksum::new().update(&[1, 2, 3]);
    }
}
