//! The ring's geometry from a config: how a batch is cut into parts (one per slot), how big a
//! slot is, how many slots the ring has, what `"auto"` resolves to on this host, and the checks
//! that the geometry is one pinring-ring accepts. config.rs keeps the settings and their parsing,
//! validate.rs the other checks.

use super::*;

/// How a batch is cut into parts, one part per ring slot (see [`crate::plan`]): the seq → samples
/// mapping and the slot size. Part of the fingerprint through `samples_per_part` and the slot
/// size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartLayout {
    /// Samples in each part (`batch_size` when a whole batch fits one slot).
    pub samples_per_part: u32,
    /// Parts per batch (`ceil(batch_size / samples_per_part)`).
    pub parts_per_batch: u32,
    /// Bytes per slot.
    pub slot_bytes: u64,
    /// Byte parts: a sample too large for one part is cut into parts of this many bytes of its
    /// largest field (`samples_per_part` is then 1 and `parts_per_batch` is `batch_size × k`).
    pub cut: Option<SampleCut>,
}

/// What `"auto"` picks ([`Config::auto_ring`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoRing {
    /// Bytes per slot.
    pub slot_bytes: u64,
    /// Number of slots.
    pub slots: u32,
    /// The ring size aimed for: `min(cache / 2, 128 MiB)`, or 32 MiB with the cache unknown.
    pub target_bytes: u64,
    /// Whether the slot size was `"auto"` too (false: given, and only the count was picked).
    pub slot_bytes_auto: bool,
}

impl AutoRing {
    /// The line that says what `"auto"` picked for `cfg` and, in `cache_origin`'s words, where
    /// the cache size it aimed for came from.
    pub fn line(&self, cfg: &Config, cache_origin: &str) -> String {
        let what = if self.slot_bytes_auto {
            "ring.slot_bytes = \"auto\" resolved to"
        } else {
            "ring.slots unset: the given slot size gets"
        };
        if cfg.decodes_on_copy() {
            return format!(
                "{what} {} slots x {} = {} ({}; images carried encoded: parts sized for the \
                 decoder's batches, two batches' parts in the ring, the cache not aimed at)",
                self.slots,
                ByteSize(self.slot_bytes),
                ByteSize(u64::from(self.slots) * self.slot_bytes),
                cfg.parts_described(),
            );
        }
        format!(
            "{what} {} slots x {} = {} ({}; ring aimed at {}, {cache_origin})",
            self.slots,
            ByteSize(self.slot_bytes),
            ByteSize(u64::from(self.slots) * self.slot_bytes),
            cfg.parts_described(),
            ByteSize(self.target_bytes),
        )
    }
}

impl Config {
    /// Warnings for this config's ring on a host with `host`'s cache and memory
    /// ([`ring_warnings`]): `pinring config check` prints them and the daemon logs them at
    /// start.
    pub fn ring_warnings(&self, host: &crate::HostFacts) -> Vec<String> {
        // Images carried encoded are read once by the decoder, not copied through the cache:
        // only the memory warning applies.
        let host = crate::HostFacts {
            cache_bytes: host.cache_bytes.filter(|_| !self.decodes_on_copy()),
            ..*host
        };
        ring_warnings(&self.ring.name, self.slots(), self.slot_bytes(), &host)
    }
}

/// Warnings for ring `ring` of `slots` slots of `slot_bytes` on a host with `host`'s cache and
/// memory: larger than the last-level cache (it works, only slower), larger than the available
/// memory (the daemon reserves every page at start and would fail). None for a size that is
/// unknown. Neither is an error.
pub fn ring_warnings(
    ring: &str,
    slots: u32,
    slot_bytes: u64,
    host: &crate::HostFacts,
) -> Vec<String> {
    let total = u64::from(slots).saturating_mul(slot_bytes);
    let size = format!(
        "{slots} slots x {} = {}",
        ByteSize(slot_bytes),
        ByteSize(total)
    );
    let mut out = Vec::new();
    if let Some(cache) = host.cache_bytes.filter(|&c| total > c) {
        out.push(format!(
            "ring {ring:?}: its slots ({size}) are larger than the last-level cache ({}{}): \
             batches are written and uploaded from memory rather than from the cache; fewer or \
             smaller slots (ring.slots, ring.slot_bytes, plan.batch_size) keep them in it",
            if host.cache_level > 0 {
                format!("L{}, ", host.cache_level)
            } else {
                String::new()
            },
            ByteSize(cache)
        ));
    }
    if let Some(avail) = host.available.filter(|&a| total > a) {
        out.push(format!(
            "ring {ring:?}: its slots ({size}) are more than the available memory \
             (MemAvailable {}): the daemon reserves every page at start and will fail (exit 4) \
             or push the host into swap; use fewer or smaller slots (ring.slots, \
             ring.slot_bytes, plan.batch_size) or free memory",
            ByteSize(avail)
        ));
    }
    out
}

impl Config {
    /// The ring's geometry: one sample with its metadata fits the largest slot unless the kind
    /// cuts samples into byte parts ([`DatasetKind::cuts_samples`]; a batch larger than a slot
    /// is cut into parts of whole samples, [`Config::part_layout`]); an explicit
    /// `ring.slot_bytes` is page aligned, holds at least one sample with its metadata (or, for a
    /// kind that cuts samples, a byte part) and is at most the largest slot; and pinring-ring
    /// accepts (slots, slot bytes). Each error names the value that fixes it.
    pub(super) fn validate_geometry(&self) -> Result<(), ConfigError> {
        let one = self.part_need(1);
        let cuts = self.dataset.kind.cuts_samples();
        if !cuts && self.max_samples_in(MAX_SLOT_BYTES) == 0 {
            let key = match self.dataset.kind {
                DatasetKind::External => "dataset.fields",
                _ => "dataset.kind",
            };
            return Err(self.invalid(
                key,
                format!("{} bytes a sample", self.record_bytes()),
                format!(
                    "one sample of {} bytes (all its fields) plus its metadata is more than the \
                     largest slot ({MAX_SLOT_BYTES} bytes, {}) holds, and kind = \"{}\" cannot \
                     make part of a sample (only \"synthetic\" and \"npy\" samples are cut \
                     into byte parts); use smaller samples",
                    self.record_bytes(),
                    ByteSize(MAX_SLOT_BYTES),
                    self.dataset.kind,
                ),
            ));
        }
        if let SlotBytes::Fixed(ByteSize(b)) = self.ring.slot_bytes {
            let value = if b >= ByteSize::KIB {
                format!("{b} ({})", ByteSize(b))
            } else {
                b.to_string()
            };
            let smallest = round_up(one, SLOT_ALIGN);
            let whole = round_up(self.min_slot_bytes(), SLOT_ALIGN);
            if b > MAX_SLOT_BYTES {
                return Err(self.invalid(
                    "ring.slot_bytes",
                    value,
                    format!(
                        "more than the largest slot ({MAX_SLOT_BYTES} bytes, {}); use \
                         \"auto\" or a size up to {MAX_SLOT_BYTES}",
                        ByteSize(MAX_SLOT_BYTES),
                    ),
                ));
            }
            if b % SLOT_ALIGN != 0 {
                let down = b / SLOT_ALIGN * SLOT_ALIGN;
                let up = down + SLOT_ALIGN;
                let choices: Vec<String> = [down, up]
                    .into_iter()
                    .filter(|&c| c >= smallest && c <= MAX_SLOT_BYTES)
                    .map(|c| c.to_string())
                    .collect();
                let choices = if choices.is_empty() {
                    format!("at least {smallest} (one sample with its metadata needs {one} bytes)")
                } else {
                    choices.join(" or ")
                };
                return Err(self.invalid(
                    "ring.slot_bytes",
                    value,
                    format!(
                        "not a multiple of {SLOT_ALIGN} (slots are page aligned); use {choices}, \
                         or \"auto\""
                    ),
                ));
            }
            if !cuts && self.max_samples_in(b) == 0 {
                let fix = if smallest <= MAX_SLOT_BYTES {
                    format!(
                        "use \"auto\" ({whole} bytes, a whole batch per slot) or at least \
                         {smallest}, or smaller samples"
                    )
                } else {
                    "use smaller samples".to_string()
                };
                return Err(self.invalid(
                    "ring.slot_bytes",
                    value,
                    format!(
                        "too small: one sample of {} bytes (all its fields) with its metadata \
                         needs {one} bytes, more than this slot holds, and kind = \"{}\" cannot \
                         make part of a sample (only \"synthetic\" and \"npy\" samples are cut \
                         into byte parts); {fix}",
                        self.record_bytes(),
                        self.dataset.kind,
                    ),
                ));
            }
        }
        if pinring_ring::Geometry::new(self.slots(), self.slot_bytes()).is_none() {
            return Err(self.invalid(
                "ring.slot_bytes",
                self.ring.slot_bytes,
                format!(
                    "{} slots of {} bytes is not a ring pinring can make; use fewer or smaller slots",
                    self.slots(),
                    self.slot_bytes()
                ),
            ));
        }
        Ok(())
    }

    /// Metadata reserve for a part of `samples` samples: an upper bound of its encoded
    /// [`crate::BatchMeta`], rounded up to [`META_RESERVE_ALIGN`].
    fn meta_reserve_for(&self, samples: u64) -> u64 {
        round_up(
            max_encoded_len(samples, self.first_field_ndims() as u64),
            META_RESERVE_ALIGN,
        )
    }

    /// Bytes a slot needs for `samples` samples (all their fields) and their metadata reserve
    /// (which starts at the payload's end rounded up to the segment layout's metadata alignment,
    /// as in [`pinring_ring::fit_in_slot`]).
    pub(super) fn part_need(&self, samples: u32) -> u64 {
        round_up(
            u64::from(samples).saturating_mul(self.record_bytes()),
            pinring_ring::layout::META_ALIGN,
        )
        .saturating_add(self.meta_reserve_for(u64::from(samples)))
    }

    /// The most samples (up to `plan.batch_size`) that fit, with their metadata reserve, in a
    /// slot of `slot_bytes` (an aligned size); 0 if not even one does.
    pub(super) fn max_samples_in(&self, slot_bytes: u64) -> u32 {
        let fits = |b: u32| {
            let need = self.part_need(b);
            need <= slot_bytes
                && pinring_ring::fit_in_slot(
                    u64::from(b).saturating_mul(self.record_bytes()),
                    self.meta_reserve_for(u64::from(b)),
                    slot_bytes,
                )
                .is_some()
        };
        // Largest b in 0..=batch_size with fits(b); fits is monotonic and fits(0) holds.
        let (mut lo, mut hi) = (0u32, self.plan.batch_size);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Space reserved in each slot for the encoded [`crate::BatchMeta`] of one part: an upper
    /// bound for a full part ([`Config::part_layout`]), rounded up to 64 bytes.
    pub fn meta_reserve_bytes(&self) -> u64 {
        self.meta_reserve_for(u64::from(self.part_layout().samples_per_part))
    }

    /// Smallest slot that holds a whole batch (payload of all fields + metadata reserve of a full
    /// batch).
    pub fn min_slot_bytes(&self) -> u64 {
        self.part_need(self.plan.batch_size)
    }

    /// How batches are cut into parts, one part per slot.
    ///
    /// The slot holds as many samples as fit, each with all its fields ([`Config::record_bytes`]):
    /// with `"auto"`, the whole batch when its largest field is at most
    /// [`AUTO_PART_PAYLOAD_BYTES`] (4 MiB), else the most whole samples whose largest field fits
    /// that (at least one); with an explicit `ring.slot_bytes`, as many as fit it with
    /// their metadata reserve. With `P = ceil(batch_size / that)` parts per batch, each part gets
    /// `ceil(batch_size / P)` samples, so the parts of a batch are as even as whole samples
    /// allow. `"auto"` then sizes the slot for one such part with its metadata reserve (rounded
    /// up to [`SLOT_ALIGN`]). An explicit `ring.slot_bytes` equal to that size gives the same
    /// layout, which is what [`Config::resolve_auto`] and a loader adopting the ring's slot size
    /// rely on. A config where not even one sample fits a slot is refused by
    /// [`Config::validate`]; here it gives one sample per part.
    pub fn part_layout(&self) -> PartLayout {
        let bs = self.plan.batch_size.max(1);
        if let Some(cut) = self.byte_part_layout(bs) {
            return cut;
        }
        let most = match self.ring.slot_bytes {
            SlotBytes::Auto => {
                let largest = self
                    .fields()
                    .iter()
                    .map(|f| f.sample_bytes())
                    .max()
                    .unwrap_or(1);
                let cap = if self.decodes_on_copy() {
                    AUTO_ENCODED_PART_PAYLOAD_BYTES
                } else {
                    AUTO_PART_PAYLOAD_BYTES
                };
                let fit = cap / largest.max(1);
                u32::try_from(fit).unwrap_or(u32::MAX).clamp(1, bs)
            }
            SlotBytes::Fixed(b) => self.max_samples_in(b.0).max(1),
        };
        let parts = bs.div_ceil(most);
        let samples_per_part = bs.div_ceil(parts);
        let slot_bytes = match self.ring.slot_bytes {
            SlotBytes::Auto => round_up(self.part_need(samples_per_part), SLOT_ALIGN),
            SlotBytes::Fixed(b) => b.0,
        };
        PartLayout {
            samples_per_part,
            parts_per_batch: parts,
            slot_bytes,
            cut: None,
        }
    }

    /// The part layout of byte parts, when samples are cut (else `None`): only for a kind that
    /// cuts samples ([`DatasetKind::cuts_samples`]), and only when one sample does not fit a
    /// part: with `"auto"`, its largest field is over [`AUTO_PART_PAYLOAD_BYTES`] and the whole
    /// sample needs more than the slot of a 4 MiB byte part; with an explicit `ring.slot_bytes`,
    /// not even one sample fits it. The slot is then `"auto"`'s (a 4 MiB byte part with the
    /// other fields and the metadata reserve, rounded up to [`SLOT_ALIGN`]) or the explicit one,
    /// and the byte part is the most of the largest field that slot holds
    /// ([`Config::chunk_in`]), so `"auto"` and its resolved slot size give the same layout.
    fn byte_part_layout(&self, bs: u32) -> Option<PartLayout> {
        if !self.dataset.kind.cuts_samples() {
            return None;
        }
        let (largest, others) = self.cut_sizes();
        let slot_bytes = match self.ring.slot_bytes {
            SlotBytes::Auto => {
                if largest <= AUTO_PART_PAYLOAD_BYTES {
                    return None;
                }
                let slot = round_up(self.cut_need(AUTO_PART_PAYLOAD_BYTES, others), SLOT_ALIGN);
                if self.part_need(1) <= slot {
                    return None;
                }
                slot
            }
            SlotBytes::Fixed(ByteSize(b)) => {
                if self.max_samples_in(b) > 0 {
                    return None;
                }
                b
            }
        };
        let cut = SampleCut {
            field_bytes: largest,
            chunk_bytes: self.chunk_in(slot_bytes, others),
        };
        Some(PartLayout {
            samples_per_part: 1,
            parts_per_batch: u32::try_from(u64::from(bs).saturating_mul(cut.chunks()))
                .unwrap_or(u32::MAX),
            slot_bytes,
            cut: Some(cut),
        })
    }

    /// Refuses `who`, a producer that writes whole samples only (a Python producer), when this
    /// config cuts samples into byte parts ([`Config::part_layout`]): the error names the
    /// sample's size, what a part holds and the fix.
    pub fn whole_samples_only(&self, who: &str) -> Result<(), ConfigError> {
        let layout = self.part_layout();
        let Some(cut) = layout.cut else {
            return Ok(());
        };
        let smallest = round_up(self.part_need(1), SLOT_ALIGN);
        let slot = if smallest <= MAX_SLOT_BYTES {
            format!(
                ", or a ring.slot_bytes that holds one sample with its metadata (at least \
                 {smallest}) in the daemon's and the producers' config"
            )
        } else {
            String::new()
        };
        Err(self.invalid(
            "ring.slot_bytes",
            self.ring.slot_bytes,
            format!(
                "{who} writes whole samples, but one sample of {} bytes (all its fields) is more \
                 than a part holds ({} bytes of its largest field in slots of {} bytes), so the \
                 plan cuts each sample into {} byte parts, which only pinring-loader makes (kind \
                 = \"synthetic\" or \"npy\"); use smaller samples{slot}",
                self.record_bytes(),
                cut.chunk_bytes,
                layout.slot_bytes,
                cut.chunks(),
            ),
        ))
    }

    /// Per-sample bytes of the largest field (the one byte parts cut, the first of equals:
    /// [`BatchLayout::cut_field`]) and of all the other fields together.
    pub(super) fn cut_sizes(&self) -> (u64, u64) {
        let largest = self
            .fields()
            .iter()
            .map(Field::sample_bytes)
            .max()
            .unwrap_or(0);
        (largest, self.record_bytes().saturating_sub(largest))
    }

    /// Bytes a slot needs for a byte part of `chunk` bytes of the largest field in a sample's
    /// first part (which also carries the `others` bytes of the other fields) with the
    /// metadata reserve of one sample.
    pub(super) fn cut_need(&self, chunk: u64, others: u64) -> u64 {
        round_up(
            chunk.saturating_add(others),
            pinring_ring::layout::META_ALIGN,
        )
        .saturating_add(self.meta_reserve_for(1))
    }

    /// The largest byte part of the largest field that a slot of `slot_bytes` holds with the
    /// other fields (`others` bytes) and the metadata reserve of one sample: a multiple of
    /// [`SLOT_ALIGN`] when it is at least that (whole pages copy fastest), else of 8 (the
    /// synthetic generator's word); 0 when the slot cannot hold 8 bytes of it.
    fn chunk_in(&self, slot_bytes: u64, others: u64) -> u64 {
        let align = pinring_ring::layout::META_ALIGN;
        let payload = slot_bytes.saturating_sub(self.meta_reserve_for(1)) / align * align;
        let chunk = payload.saturating_sub(others);
        if chunk >= SLOT_ALIGN {
            chunk / SLOT_ALIGN * SLOT_ALIGN
        } else {
            chunk / 8 * 8
        }
    }

    /// Slots in the ring: `ring.slots`, or [`DEFAULT_SLOTS`] when unset (and not resolved by
    /// [`Config::resolve_auto`]).
    pub fn slots(&self) -> u32 {
        self.ring.slots.unwrap_or(DEFAULT_SLOTS)
    }

    /// What `"auto"` picks on a host whose last-level cache has `cache_bytes` (`None`: unknown):
    /// the slot size of [`Config::part_layout`], and a slot count that keeps the ring (data
    /// area) near `min(cache / 2, 128 MiB)` (32 MiB when the cache is unknown): that target over
    /// the slot size, rounded to the nearest, and at least [`AUTO_MIN_SLOTS`] and at most
    /// [`MAX_SLOTS`]. An explicit `ring.slots` is kept; so is an explicit `ring.slot_bytes`,
    /// whose ring, with `ring.slots` unset, gets the same slot count for its size (a small
    /// explicit slot used to get [`DEFAULT_SLOTS`], a ring too small to keep the copy engine
    /// busy: docs/BENCHMARKS.md, "Small rings").
    pub fn auto_ring(&self, cache_bytes: Option<u64>) -> AutoRing {
        if self.decodes_on_copy() {
            return self.auto_encoded_ring();
        }
        let target = cache_bytes.map_or(AUTO_RING_FALLBACK_BYTES, |c| {
            (c / 2).min(AUTO_RING_MAX_BYTES)
        });
        // Only a cache that was read is small for sure: the fallback's 32 MiB is a guess.
        let slot_bytes = (self.ring.slots.is_none() && cache_bytes.is_some())
            .then(|| self.slot_for_small_cache(target))
            .flatten()
            .unwrap_or_else(|| self.slot_bytes());
        let slots = self.ring.slots.unwrap_or_else(|| {
            let s = slot_bytes.max(1);
            let n = (target + s / 2) / s;
            u32::try_from(n)
                .unwrap_or(u32::MAX)
                .clamp(AUTO_MIN_SLOTS, MAX_SLOTS)
        });
        AutoRing {
            slot_bytes,
            slots,
            target_bytes: target,
            slot_bytes_auto: self.ring.slot_bytes == SlotBytes::Auto,
        }
    }

    /// `"auto"` for a ring that carries its images encoded: the slot of [`Config::part_layout`]
    /// (parts of up to [`AUTO_ENCODED_PART_PAYLOAD_BYTES`]) and two batches' parts, at least
    /// [`AUTO_ENCODED_MIN_SLOTS`]; the cache is not aimed at (its target is the ring's size).
    fn auto_encoded_ring(&self) -> AutoRing {
        let slot_bytes = self.slot_bytes();
        let slots = self.ring.slots.unwrap_or_else(|| {
            self.parts_per_batch()
                .saturating_mul(2)
                .clamp(AUTO_ENCODED_MIN_SLOTS, MAX_SLOTS)
        });
        AutoRing {
            slot_bytes,
            slots,
            target_bytes: u64::from(slots).saturating_mul(slot_bytes),
            slot_bytes_auto: self.ring.slot_bytes == SlotBytes::Auto,
        }
    }

    /// The smaller `"auto"` slot for a ring that aims at `target` bytes, when
    /// [`AUTO_MIN_SLOTS`] of the usual slots (a 4 MiB part) would not fit it: parts of the most
    /// whole samples that fit `target / AUTO_MIN_SLOTS` (at least [`AUTO_MIN_SLOT_BYTES`]),
    /// evened out over the batch, as an explicit slot size gives them. `None` when the usual
    /// slot fits, when the slot size was given, or when samples are cut into byte parts or do
    /// not fit that size whole. The built-in default (2 MiB batches of 64 KiB samples) on a
    /// host with a 16 MiB last-level cache gets 18 slots of 452 KiB (5 parts of up to 7
    /// samples), 7.9 MiB, instead of 16 of 2 MiB, twice the cache.
    fn slot_for_small_cache(&self, target: u64) -> Option<u64> {
        if self.ring.slot_bytes != SlotBytes::Auto || self.part_layout().cut.is_some() {
            return None;
        }
        let usual = self.slot_bytes();
        let cap =
            (target / u64::from(AUTO_MIN_SLOTS)).max(AUTO_MIN_SLOT_BYTES) / SLOT_ALIGN * SLOT_ALIGN;
        if usual.saturating_mul(u64::from(AUTO_MIN_SLOTS)) <= target || cap >= usual {
            return None;
        }
        let most = self.max_samples_in(cap);
        if most == 0 {
            return None;
        }
        let bs = self.plan.batch_size.max(1);
        let samples_per_part = bs.div_ceil(bs.div_ceil(most));
        Some(round_up(self.part_need(samples_per_part), SLOT_ALIGN))
    }

    /// Resolves `"auto"` once, for the daemon (and `pinring config check`, to show it): an
    /// automatic `ring.slot_bytes` and an unset `ring.slots` become the explicit values of
    /// [`Config::auto_ring`], which keeps the part layout and so the fingerprint (except on a
    /// cache too small for 16 of the usual slots, `Config::slot_for_small_cache`: the parts are
    /// then the smaller slot's, and loaders adopting that slot compute the same). Loaders do
    /// not call this: they take the slot size from the daemon's ring
    /// ([`Config::adopt_slot_bytes`]), since their cache (or host) may differ.
    pub fn resolve_auto(&mut self, cache_bytes: Option<u64>) -> AutoRing {
        let auto = self.auto_ring(cache_bytes);
        self.ring.slot_bytes = SlotBytes::Fixed(ByteSize(auto.slot_bytes));
        self.ring.slots = Some(auto.slots);
        auto
    }

    /// A loader whose `ring.slot_bytes` is `"auto"` takes the slot size the daemon resolved and
    /// published in the ring header (and its slot count), so both compute the part layout, the
    /// seq -> samples mapping, from the same slot size; the fingerprint comparison that follows
    /// then checks the rest. An explicit `ring.slot_bytes` is kept (a different one shows up as
    /// a fingerprint mismatch). Returns whether anything was adopted.
    pub fn adopt_slot_bytes(&mut self, ring_slot_bytes: u64, ring_slots: u32) -> bool {
        if self.ring.slot_bytes != SlotBytes::Auto {
            return false;
        }
        self.ring.slot_bytes = SlotBytes::Fixed(ByteSize(ring_slot_bytes));
        self.ring.slots = Some(ring_slots);
        true
    }

    /// The part layout in words, for `pinring config check` and the daemon's log: "8 part(s)
    /// of up to 4 samples per batch", or for byte parts "6 byte parts per batch (6 per sample,
    /// 4194304 bytes of its largest field each)".
    pub fn parts_described(&self) -> String {
        let l = self.part_layout();
        match l.cut {
            Some(cut) => format!(
                "{} byte parts per batch ({} per sample, {} bytes of its largest field each)",
                l.parts_per_batch,
                cut.chunks(),
                cut.chunk_bytes
            ),
            None => format!(
                "{} part(s) of up to {} samples per batch",
                l.parts_per_batch, l.samples_per_part
            ),
        }
    }

    /// Samples in each part of a batch ([`Config::part_layout`]).
    pub fn samples_per_part(&self) -> u32 {
        self.part_layout().samples_per_part
    }

    /// Parts (slots) per batch ([`Config::part_layout`]).
    pub fn parts_per_batch(&self) -> u32 {
        self.part_layout().parts_per_batch
    }

    /// Payload bytes of a full part (`samples_per_part * record_bytes`, all fields; for byte
    /// parts a sample's first part: a byte part of its largest field and its other fields).
    pub fn part_payload_bytes_max(&self) -> u64 {
        let layout = self.part_layout();
        match layout.cut {
            Some(cut) => cut.chunk_bytes.saturating_add(self.cut_sizes().1),
            None => u64::from(layout.samples_per_part).saturating_mul(self.record_bytes()),
        }
    }

    /// Bytes per slot: explicit, or for `"auto"` one part (a whole batch when its payload is at
    /// most 4 MiB) with its metadata reserve, rounded up to [`SLOT_ALIGN`]
    /// ([`Config::part_layout`]).
    pub fn slot_bytes(&self) -> u64 {
        self.part_layout().slot_bytes
    }

    /// Bytes of all slots together (`slots * slot_bytes`, saturating);
    /// the ring's own header is not included.
    pub fn ring_bytes(&self) -> u64 {
        u64::from(self.slots()).saturating_mul(self.slot_bytes())
    }
}
