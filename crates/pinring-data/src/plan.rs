//! The deterministic epoch plan: which dataset samples go into which batch.
//!
//! The daemon and every loader process compute the plan independently and
//! must agree bit for bit, so everything here is a pure function of
//! [`PlanParams`]. Semantics follow PyTorch's `DistributedSampler` +
//! `BatchSampler`:
//!
//! 1. For epoch `e` the order of the `samples` indices is the identity, or
//!    (with `shuffle`) a Fisher-Yates permutation driven by [`SplitMix64`]
//!    seeded from `(seed, e)`.
//! 2. Sharding over `world_size` ranks: with `drop_last` the order is
//!    truncated to a multiple of `world_size`, otherwise it is padded to a
//!    multiple by repeating from its start. Rank `r` takes positions
//!    `r, r + W, r + 2W, ...`.
//! 3. The rank's samples are cut into batches of `batch_size`; with
//!    `drop_last` a final partial batch is dropped, otherwise it is kept
//!    (shorter).
//!
//! 4. Each batch is cut into `P` parts ([`Plan::parts_per_batch`]) of
//!    `samples_per_part` consecutive samples each: part `j` holds the batch's
//!    samples `j * spp .. min((j + 1) * spp, len)`. A short last batch keeps
//!    all `P` parts; the parts past its samples are empty (0 samples), so
//!    every batch has the same number of parts and seqs map to parts by
//!    arithmetic alone.
//!
//! 5. A sample too large for one part is cut into *byte parts*
//!    ([`PlanParams::cut`], [`SampleCut`]): each sample of the batch becomes
//!    `k = ceil(field_bytes / chunk_bytes)` parts, part `j` of a sample holding
//!    the byte range `j * chunk_bytes .. min((j + 1) * chunk_bytes, field_bytes)`
//!    of the sample's cut field ([`ByteRange`]). Then `P = batch_size * k`, and
//!    part `i * k + j` of a batch is byte part `j` of its sample `i`; the parts
//!    of the samples past the end of a short last batch are empty.
//!
//! **`dataset.kind = "webdataset"`** ([`Plan::with_shards`], a [`ShardOrder`]) replaces steps 1
//! and 2: rank `r`'s samples of epoch `e` are the shard order of [`crate::shard_order`] (shard
//! `i` belongs to rank `i % W`; with `shuffle` the rank's shards are shuffled by `(seed, e, r)`
//! and streamed through the shuffle buffer, without it they stay in order). Ranks' counts differ
//! with their shards' sizes, and every rank must have the same number of batches: with
//! `drop_last` every rank truncates its order to the smallest rank's count, otherwise every rank
//! pads its order to the largest rank's count by repeating from the start of its own order. A
//! rank without shards (`W` > shards) or whose shards hold no sample is an error. Steps 3 and 4
//! are unchanged.
//!
//! Batch number `b` is batch `b % bpe` of epoch `start_epoch + b / bpe`,
//! where `bpe` is [`Plan::batches_per_epoch`]. The ring carries one seq per
//! part: seq `s` is part `s % P` of batch `s / P` ([`Plan::part_into`]). With
//! `P = 1` (a whole batch per slot) seq and batch number coincide.

use crate::shard_order::ShardOrder;

/// Largest dataset a plan supports (permutations are stored as `u32`).
pub const MAX_PLAN_SAMPLES: u64 = 1 << 32;

/// Errors from building or querying a [`Plan`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A parameter is out of range.
    #[error("invalid plan parameter {key} = {value}: {allowed}")]
    InvalidParam {
        /// Parameter name (e.g. `plan.rank`).
        key: &'static str,
        /// Offending value.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// The parameters leave this rank with no batch at all.
    #[error("plan gives rank {rank} of {world_size} no batches ({samples} samples, batch_size {batch_size}, drop_last {drop_last}); lower plan.batch_size or plan.world_size, or set plan.drop_last = false")]
    Empty {
        /// Rank.
        rank: u32,
        /// World size.
        world_size: u32,
        /// Dataset length.
        samples: u64,
        /// Batch size.
        batch_size: u32,
        /// drop_last flag.
        drop_last: bool,
    },
    /// `dataset.kind = "webdataset"` with more ranks than shards: some rank gets none.
    #[error("plan.world_size = {world_size} is more than the {shards} shards of dataset.webdataset.shards: shard i goes to rank i % world_size, so rank {shards} would get none; use at most {shards} ranks, or cut the dataset into at least {world_size} shards")]
    TooFewShards {
        /// Number of shards.
        shards: u64,
        /// World size.
        world_size: u32,
    },
    /// `dataset.kind = "webdataset"`: a rank's shards hold no sample.
    #[error("rank {rank} of {world_size} gets {shards} shards of dataset.webdataset.shards (shard i goes to rank i % world_size) and they hold no sample; drop the empty shards or change plan.world_size")]
    EmptyRank {
        /// The rank.
        rank: u32,
        /// World size.
        world_size: u32,
        /// Its number of shards.
        shards: u64,
    },
    /// `seq` is past the end of the plan.
    #[error("seq {seq} is out of range: the plan has {total} (seq 0..{total}, one per part of each batch); the ring and the plan disagree, check that daemon and loaders use the same config")]
    SeqOutOfRange {
        /// Requested sequence number.
        seq: u64,
        /// Number of seqs (batches with [`Plan::batch`], parts with [`Plan::part_into`]).
        total: u64,
    },
}

/// Inputs of a [`Plan`] (see [`crate::Config::plan_params`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanParams {
    /// Dataset length (1..=[`MAX_PLAN_SAMPLES`]).
    pub samples: u64,
    /// The `[plan]` section: batch size, shuffle and seed, epochs, `drop_last`, rank and world
    /// size.
    pub plan: crate::PlanConfig,
    /// Samples in each part of a batch (1..=batch_size); `batch_size` means one part per batch.
    pub samples_per_part: u32,
    /// Byte parts: each sample is cut into parts of `chunk_bytes` of its cut field
    /// (`samples_per_part` must then be 1). `None`: parts of whole samples.
    pub cut: Option<SampleCut>,
}

/// How a sample too large for one part is cut into byte parts ([`PlanParams::cut`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SampleCut {
    /// Bytes of the cut field (the sample's largest) per sample (>= 1).
    pub field_bytes: u64,
    /// Bytes of the cut field in each byte part (>= 1); the last part of a sample is shorter
    /// when `field_bytes` is not a multiple of it.
    pub chunk_bytes: u64,
}

impl SampleCut {
    /// Byte parts per sample: `ceil(field_bytes / chunk_bytes)`.
    pub fn chunks(&self) -> u64 {
        self.field_bytes.div_ceil(self.chunk_bytes.max(1))
    }

    /// The byte range of the cut field that byte part `chunk` (< [`SampleCut::chunks`]) of a
    /// sample carries.
    pub fn range(&self, chunk: u64) -> ByteRange {
        let offset = chunk.saturating_mul(self.chunk_bytes).min(self.field_bytes);
        ByteRange {
            offset,
            len: self.chunk_bytes.min(self.field_bytes - offset),
        }
    }
}

/// The bytes of a sample's cut field that a byte part carries: `offset .. offset + len`
/// ([`SampleCut::range`]). The part's metadata records it ([`crate::BatchMeta::byte_range`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ByteRange {
    /// Offset of the first byte in the sample's cut field.
    pub offset: u64,
    /// Bytes carried.
    pub len: u64,
}

impl ByteRange {
    /// Whether this is a sample's first byte part, the one that also carries the sample's other
    /// fields whole.
    pub fn is_first(&self) -> bool {
        self.offset == 0
    }
}

/// Where a seq's part lies: in which batch, which part of it, and which of the batch's samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Part {
    /// The part's sequence number (the seq a ring slot carries).
    pub seq: u64,
    /// Number of the batch the part belongs to (`seq / parts`).
    pub batch: u64,
    /// Index of the part in its batch (`seq % parts`).
    pub part: u32,
    /// Parts per batch.
    pub parts: u32,
    /// Epoch of the batch (includes `start_epoch`).
    pub epoch: u32,
    /// Index of the batch within its epoch.
    pub index_in_epoch: u64,
    /// Position in the batch of the part's first sample.
    pub first_in_batch: u64,
    /// Samples in the part (0 for the parts past the end of a short last batch).
    pub samples: u64,
    /// Samples in the whole batch.
    pub batch_samples: u64,
    /// For a byte part of a sample ([`PlanParams::cut`]; then `samples` is 1): the range of the
    /// sample's cut field it carries. `None` for a part of whole samples and for an empty part.
    pub bytes: Option<ByteRange>,
}

impl Part {
    /// Byte offset of the part in its batch's payload, for samples of `sample_bytes` bytes.
    pub fn byte_offset(&self, sample_bytes: u64) -> u64 {
        self.first_in_batch.saturating_mul(sample_bytes)
    }

    /// Bytes of payload in the part, for samples of `sample_bytes` bytes.
    pub fn payload_bytes(&self, sample_bytes: u64) -> u64 {
        self.samples.saturating_mul(sample_bytes)
    }
}

/// One batch of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BatchIndices {
    /// Global batch sequence number.
    pub seq: u64,
    /// Epoch number (includes `start_epoch`).
    pub epoch: u32,
    /// Batch index within the epoch.
    pub index_in_epoch: u64,
    /// Dataset indices of the samples in the batch, in order.
    pub samples: Vec<u64>,
}

/// The splitmix64 generator (Steele, Lea & Flood 2014; constants from
/// Vigna's reference implementation).
///
/// Hand-written on purpose: the plan must be bit-stable across releases,
/// builds and platforms because the daemon and every loader compute it
/// independently and compare results. The `rand` crate documents that its
/// algorithms (and `gen_range`'s sampling) may change between versions, so
/// depending on it would silently break cross-version agreement. Do not
/// change this code without bumping the fingerprint version.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

/// 2^64 / golden ratio, the splitmix64 increment.
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 output function: a bijective 64-bit mixer.
#[inline(always)]
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SplitMix64 {
    /// A generator starting at `seed`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }

    /// Uniform integer in `0..n` (`n >= 1`), by Lemire's multiply-shift
    /// method with rejection (unbiased, deterministic).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let mut m = (self.next_u64() as u128) * (n as u128);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = (self.next_u64() as u128) * (n as u128);
            }
        }
        (m >> 64) as u64
    }
}

/// Seed of the shuffle for `epoch`.
fn epoch_seed(seed: u64, epoch: u32) -> u64 {
    mix64(seed ^ mix64(u64::from(epoch) ^ 0x7069_6e72_696e_6731)) // "pinring1"
}

/// The permutation of `0..n` used for `epoch` when shuffling.
///
/// # Panics
/// If `n > MAX_PLAN_SAMPLES`.
pub fn epoch_permutation(n: u64, seed: u64, epoch: u32) -> Vec<u32> {
    assert!(n <= MAX_PLAN_SAMPLES, "dataset too large for a plan");
    // Indices are < 2^32 so they fit u32; `i as u32` wraps only for n = 2^32
    // at i = 2^32, which is excluded by the range.
    let mut perm: Vec<u32> = (0..n).map(|i| i as u32).collect();
    let mut rng = SplitMix64::new(epoch_seed(seed, epoch));
    for i in (1..perm.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        perm.swap(i, j);
    }
    perm
}

/// The deterministic plan of one rank. Cheap to query sequentially: the
/// shuffled order of the most recently used epoch is cached.
#[derive(Debug, Clone)]
pub struct Plan {
    params: PlanParams,
    /// The shard order (`dataset.kind = "webdataset"`) and this rank's count in it.
    shards: Option<(ShardOrder, u64)>,
    per_rank: u64,
    bpe: u64,
    /// Parts per batch.
    parts: u64,
    /// (epoch, this rank's samples for that epoch) when shuffling.
    cache: Option<(u32, Vec<u32>)>,
}

impl Plan {
    /// Checks the ranges of `p`.
    fn check(p: &PlanParams) -> Result<(), PlanError> {
        let bad = |key, value: String, allowed: &str| {
            Err(PlanError::InvalidParam {
                key,
                value,
                allowed: allowed.to_string(),
            })
        };
        if p.samples == 0 || p.samples > MAX_PLAN_SAMPLES {
            return bad(
                "dataset.samples",
                p.samples.to_string(),
                "must be between 1 and 4294967296",
            );
        }
        if p.plan.batch_size == 0 {
            return bad("plan.batch_size", "0".into(), "must be >= 1");
        }
        if p.plan.epochs == 0 {
            return bad("plan.epochs", "0".into(), "must be >= 1");
        }
        if let Some(cut) = p.cut {
            if p.samples_per_part != 1 {
                return bad(
                    "samples per part",
                    p.samples_per_part.to_string(),
                    "must be 1 when samples are cut into byte parts",
                );
            }
            if cut.field_bytes == 0 || cut.chunk_bytes == 0 {
                return bad(
                    "byte part size",
                    format!("{} of {}", cut.chunk_bytes, cut.field_bytes),
                    "the cut field and its byte parts must be at least 1 byte",
                );
            }
            if u64::from(p.plan.batch_size).saturating_mul(cut.chunks()) > u64::from(u32::MAX) {
                return bad(
                    "plan.batch_size",
                    p.plan.batch_size.to_string(),
                    &format!(
                        "batch_size x {} byte parts per sample must be at most {}; use a \
                         smaller batch or larger slots",
                        cut.chunks(),
                        u32::MAX
                    ),
                );
            }
        }
        if p.samples_per_part == 0 || p.samples_per_part > p.plan.batch_size {
            return bad(
                "samples per part",
                p.samples_per_part.to_string(),
                &format!(
                    "must be between 1 and plan.batch_size ({})",
                    p.plan.batch_size
                ),
            );
        }
        if p.plan.world_size == 0 {
            return bad("plan.world_size", "0".into(), "must be >= 1");
        }
        if p.plan.rank >= p.plan.world_size {
            return bad(
                "plan.rank",
                p.plan.rank.to_string(),
                &format!("must be < plan.world_size ({})", p.plan.world_size),
            );
        }
        if u64::from(p.plan.start_epoch) + u64::from(p.plan.epochs) - 1 > u64::from(u32::MAX) {
            return bad(
                "plan.start_epoch",
                p.plan.start_epoch.to_string(),
                "start_epoch + epochs - 1 must fit in 32 bits",
            );
        }
        Ok(())
    }

    /// Checks `params` and builds the plan (no permutation is computed yet): the global order
    /// of steps 1 and 2 of the module docs.
    pub fn new(params: &PlanParams) -> Result<Plan, PlanError> {
        let p = *params;
        Plan::check(&p)?;
        let w = u64::from(p.plan.world_size);
        let per_rank = if p.plan.drop_last {
            p.samples / w
        } else {
            p.samples.div_ceil(w)
        };
        Plan::build(p, None, per_rank)
    }

    /// Checks `params` and builds the plan of `dataset.kind = "webdataset"`: this rank's samples
    /// are the shard order of `shards` (see the module docs), whose sizes must add up to
    /// `params.samples`.
    pub fn with_shards(params: &PlanParams, shards: ShardOrder) -> Result<Plan, PlanError> {
        let p = *params;
        Plan::check(&p)?;
        let sum = shards.samples();
        if sum != p.samples {
            let allowed = if shards.shards() == 0 {
                "unknown: the shards' sample counts are recorded when the shards are opened"
                    .to_string()
            } else {
                format!(
                    "must add up to dataset.samples ({}); leave it out, it is recorded from the \
                     shards when they are opened",
                    p.samples
                )
            };
            return Err(PlanError::InvalidParam {
                key: "dataset.webdataset.shard_samples",
                value: format!("{:?} (sum {sum})", shards.shard_sizes()),
                allowed,
            });
        }
        if shards.shards() < u64::from(p.plan.world_size) {
            return Err(PlanError::TooFewShards {
                shards: shards.shards(),
                world_size: p.plan.world_size,
            });
        }
        let mut min = u64::MAX;
        let mut max = 0;
        for r in 0..p.plan.world_size {
            let n = shards.rank_samples(r, p.plan.world_size);
            if n == 0 {
                return Err(PlanError::EmptyRank {
                    rank: r,
                    world_size: p.plan.world_size,
                    shards: shards.rank_shards(r, p.plan.world_size),
                });
            }
            min = min.min(n);
            max = max.max(n);
        }
        let own = shards.rank_samples(p.plan.rank, p.plan.world_size);
        let per_rank = if p.plan.drop_last { min } else { max };
        Plan::build(p, Some((shards, own)), per_rank)
    }

    fn build(
        p: PlanParams,
        shards: Option<(ShardOrder, u64)>,
        per_rank: u64,
    ) -> Result<Plan, PlanError> {
        let bs = u64::from(p.plan.batch_size);
        let bpe = if p.plan.drop_last {
            per_rank / bs
        } else {
            per_rank.div_ceil(bs)
        };
        if bpe == 0 {
            return Err(PlanError::Empty {
                rank: p.plan.rank,
                world_size: p.plan.world_size,
                samples: p.samples,
                batch_size: p.plan.batch_size,
                drop_last: p.plan.drop_last,
            });
        }
        Ok(Plan {
            params: p,
            shards,
            per_rank,
            bpe,
            parts: match p.cut {
                Some(cut) => u64::from(p.plan.batch_size) * cut.chunks(),
                None => u64::from(p.plan.batch_size.div_ceil(p.samples_per_part)),
            },
            cache: None,
        })
    }

    /// The parameters of this plan.
    pub fn params(&self) -> &PlanParams {
        &self.params
    }

    /// The shard order of a `dataset.kind = "webdataset"` plan ([`Plan::with_shards`]).
    pub fn shard_order(&self) -> Option<&ShardOrder> {
        self.shards.as_ref().map(|(o, _)| o)
    }

    /// Samples this rank sees per epoch (after padding/truncation).
    pub fn samples_per_rank(&self) -> u64 {
        self.per_rank
    }

    /// Batches per epoch for this rank.
    pub fn batches_per_epoch(&self) -> u64 {
        self.bpe
    }

    /// Batches in the whole plan (`epochs * batches_per_epoch`).
    pub fn total_batches(&self) -> u64 {
        // Saturating: a plan run until stopped (over four billion epochs) of a dataset of
        // billions of parts counts past u64; its end is then u64::MAX, never reached.
        u64::from(self.params.plan.epochs).saturating_mul(self.bpe)
    }

    /// Parts per batch (`ceil(batch_size / samples_per_part)`, or `batch_size × k` with byte
    /// parts; at least 1).
    pub fn parts_per_batch(&self) -> u64 {
        self.parts
    }

    /// Seqs in the whole plan: one per part of each batch (`total_batches * parts_per_batch`).
    pub fn total_seqs(&self) -> u64 {
        self.total_batches().saturating_mul(self.parts)
    }

    /// The part with sequence number `seq`: fills `out` (cleared first) with its sample ids, in
    /// payload order, and says where it lies. With one part per batch this is
    /// [`Plan::batch_into`], seq for seq.
    pub fn part_into(&mut self, seq: u64, out: &mut Vec<u64>) -> Result<Part, PlanError> {
        let total = self.total_seqs();
        if seq >= total {
            return Err(PlanError::SeqOutOfRange { seq, total });
        }
        let batch = seq / self.parts;
        // < parts, which Plan::new keeps within a u32.
        let part = (seq % self.parts) as u32;
        let (epoch, index_in_epoch, start, end) = self.batch_range(batch);
        let batch_samples = end - start;
        let (lo, hi, bytes) = match self.params.cut {
            None => {
                let spp = u64::from(self.params.samples_per_part);
                let lo = (u64::from(part) * spp).min(batch_samples);
                (lo, (lo + spp).min(batch_samples), None)
            }
            Some(cut) => {
                // Part i·k + j: byte part j of the batch's sample i.
                let k = cut.chunks();
                let i = u64::from(part) / k;
                let lo = i.min(batch_samples);
                let hi = (i + 1).min(batch_samples);
                let bytes = (hi > lo).then(|| cut.range(u64::from(part) % k));
                (lo, hi, bytes)
            }
        };
        self.fill(epoch, start + lo, start + hi, out);
        Ok(Part {
            seq,
            batch,
            part,
            parts: self.parts as u32,
            epoch,
            index_in_epoch,
            first_in_batch: lo,
            samples: hi - lo,
            batch_samples,
            bytes,
        })
    }

    /// The batch with batch number `seq` (see [`Plan::part_into`] for the seqs of parts).
    pub fn batch(&mut self, seq: u64) -> Result<BatchIndices, PlanError> {
        let mut samples = Vec::new();
        let (epoch, index_in_epoch) = self.batch_into(seq, &mut samples)?;
        Ok(BatchIndices {
            seq,
            epoch,
            index_in_epoch,
            samples,
        })
    }

    /// Like [`Plan::batch`] but reuses `out` for the sample indices (cleared
    /// first); returns `(epoch, index_in_epoch)`.
    pub fn batch_into(&mut self, seq: u64, out: &mut Vec<u64>) -> Result<(u32, u64), PlanError> {
        let total = self.total_batches();
        if seq >= total {
            return Err(PlanError::SeqOutOfRange { seq, total });
        }
        let (epoch, index_in_epoch, start, end) = self.batch_range(seq);
        self.fill(epoch, start, end, out);
        Ok((epoch, index_in_epoch))
    }

    /// Epoch, index in epoch, and the range of this rank's positions of batch `batch` (which
    /// must be < `total_batches`).
    fn batch_range(&self, batch: u64) -> (u32, u64, u64, u64) {
        let p = self.params;
        // Fits: batch / bpe < epochs and start_epoch + epochs - 1 fits u32 (checked in new).
        let epoch = p.plan.start_epoch + (batch / self.bpe) as u32;
        let index_in_epoch = batch % self.bpe;
        let bs = u64::from(p.plan.batch_size);
        let start = index_in_epoch * bs;
        let end = (start + bs).min(self.per_rank);
        (epoch, index_in_epoch, start, end)
    }

    /// Fills `out` (cleared first) with the sample ids at this rank's positions `start..end` of
    /// `epoch`.
    fn fill(&mut self, epoch: u32, start: u64, end: u64, out: &mut Vec<u64>) {
        let p = self.params;
        out.clear();
        out.reserve((end - start) as usize);
        let n = p.samples;
        let w = u64::from(p.plan.world_size);
        let r = u64::from(p.plan.rank);
        if let Some(own) = self.shards.as_ref().map(|&(_, own)| own) {
            // The rank's shard order, padded by repeating from its start (positions past the
            // smallest rank's count are never asked for with drop_last).
            let order = self.shard(epoch);
            out.extend((start..end).map(|k| u64::from(order[(k % own) as usize])));
        } else if p.plan.shuffle {
            let shard = self.shard(epoch);
            out.extend(
                shard[start as usize..end as usize]
                    .iter()
                    .map(|&s| u64::from(s)),
            );
        } else {
            // Identity order: position k of this rank is global position
            // r + k*W, padded by wrapping around.
            out.extend((start..end).map(|k| (r + k * w) % n));
        }
    }

    /// This rank's sample order for `epoch` (shuffled case, or the shard order), cached.
    fn shard(&mut self, epoch: u32) -> &[u32] {
        let fresh = !matches!(&self.cache, Some((e, _)) if *e == epoch);
        if fresh {
            // Drop the old epoch's memory before allocating the new one.
            self.cache = None;
            let p = self.params;
            if let Some((order, _)) = &self.shards {
                // Ids < samples <= 2^32, so they fit u32.
                let ids = order.order(
                    p.plan.seed,
                    epoch,
                    p.plan.rank,
                    p.plan.world_size,
                    p.plan.shuffle,
                );
                self.cache = Some((epoch, ids.into_iter().map(|id| id as u32).collect()));
                return self.cached();
            }
            let perm = epoch_permutation(p.samples, p.plan.seed, epoch);
            let n = p.samples;
            let shard = if p.plan.world_size == 1 && self.per_rank == n {
                perm
            } else {
                let w = u64::from(p.plan.world_size);
                let r = u64::from(p.plan.rank);
                (0..self.per_rank)
                    .map(|k| perm[((r + k * w) % n) as usize])
                    .collect()
            };
            self.cache = Some((epoch, shard));
        }
        self.cached()
    }

    fn cached(&self) -> &[u32] {
        match &self.cache {
            Some((_, s)) => s,
            None => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    fn params(samples: u64, batch_size: u32) -> PlanParams {
        PlanParams {
            samples,
            // The defaults: shuffled, seed 0, 2 epochs from epoch 0, rank 0 of 1.
            plan: crate::PlanConfig {
                batch_size,
                ..Default::default()
            },
            samples_per_part: batch_size.max(1),
            cut: None,
        }
    }

    /// The same plan with one part per batch (whole samples, no byte parts).
    fn params_like(p: &PlanParams) -> PlanParams {
        PlanParams {
            samples_per_part: p.plan.batch_size,
            cut: None,
            ..*p
        }
    }

    #[test]
    fn a_short_last_batch_has_empty_trailing_parts() {
        // 10 samples, batches of 8 in parts of 3: batch 1 has 2 samples, in part 0 only.
        let mut p = params(10, 8);
        p.plan.shuffle = false;
        p.plan.epochs = 1;
        p.samples_per_part = 3;
        let mut plan = Plan::new(&p).unwrap();
        assert_eq!(plan.parts_per_batch(), 3);
        assert_eq!(plan.total_seqs(), 6);
        let mut ids = Vec::new();
        let got: Vec<(u64, u64, Vec<u64>)> = (0..6)
            .map(|s| {
                let part = plan.part_into(s, &mut ids).unwrap();
                (part.batch, part.first_in_batch, ids.clone())
            })
            .collect();
        assert_eq!(
            got,
            [
                (0, 0, vec![0, 1, 2]),
                (0, 3, vec![3, 4, 5]),
                (0, 6, vec![6, 7]),
                (1, 0, vec![8, 9]),
                (1, 2, vec![]),
                (1, 2, vec![]),
            ]
        );
        p.samples_per_part = 9;
        assert!(Plan::new(&p)
            .unwrap_err()
            .to_string()
            .contains("samples per part"));
        p.samples_per_part = 0;
        assert!(Plan::new(&p).is_err());
    }

    #[test]
    fn a_sample_of_24_bytes_in_parts_of_10_is_cut_into_three_the_last_short() {
        // 3 samples, batches of 2, each sample's field of 24 bytes in byte parts of 10.
        let mut p = params(3, 2);
        p.plan.shuffle = false;
        p.plan.epochs = 1;
        p.samples_per_part = 1;
        p.cut = Some(SampleCut {
            field_bytes: 24,
            chunk_bytes: 10,
        });
        let mut plan = Plan::new(&p).unwrap();
        assert_eq!(plan.parts_per_batch(), 6);
        assert_eq!(plan.total_seqs(), 12);
        let mut ids = Vec::new();
        type Row = (u64, u64, Vec<u64>, Option<(u64, u64)>);
        let got: Vec<Row> = (0..12)
            .map(|s| {
                let part = plan.part_into(s, &mut ids).unwrap();
                let r = part.bytes.map(|r| (r.offset, r.len));
                (part.batch, part.first_in_batch, ids.clone(), r)
            })
            .collect();
        assert_eq!(
            got,
            [
                (0, 0, vec![0], Some((0, 10))),
                (0, 0, vec![0], Some((10, 10))),
                (0, 0, vec![0], Some((20, 4))),
                (0, 1, vec![1], Some((0, 10))),
                (0, 1, vec![1], Some((10, 10))),
                (0, 1, vec![1], Some((20, 4))),
                (1, 0, vec![2], Some((0, 10))),
                (1, 0, vec![2], Some((10, 10))),
                (1, 0, vec![2], Some((20, 4))),
                // The short last batch has one sample: its second sample's parts are empty.
                (1, 1, vec![], None),
                (1, 1, vec![], None),
                (1, 1, vec![], None),
            ]
        );
        // Byte parts hold one sample each.
        p.samples_per_part = 2;
        assert!(Plan::new(&p)
            .unwrap_err()
            .to_string()
            .contains("byte parts"));
        p.samples_per_part = 1;
        p.cut = Some(SampleCut {
            field_bytes: 24,
            chunk_bytes: 0,
        });
        assert!(Plan::new(&p).is_err());
        // batch_size × parts per sample must fit the part index.
        p.plan.batch_size = u32::MAX / 2;
        p.cut = Some(SampleCut {
            field_bytes: 24,
            chunk_bytes: 10,
        });
        assert!(Plan::new(&p)
            .unwrap_err()
            .to_string()
            .contains("byte parts"));
    }

    fn epoch_samples(plan: &mut Plan, epoch_idx: u64) -> Vec<u64> {
        let bpe = plan.batches_per_epoch();
        (0..bpe)
            .flat_map(|b| plan.batch(epoch_idx * bpe + b).unwrap().samples)
            .collect()
    }

    #[test]
    fn splitmix_reference_values() {
        // Reference output of Vigna's splitmix64.c seeded with 0.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn permutation_is_bit_stable() {
        // Pinned so an accidental algorithm change is caught.
        let p = epoch_permutation(10, 0, 0);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<u32>>());
        assert_eq!(p, epoch_permutation(10, 0, 0));
        assert_eq!(p, PINNED_PERM_10);
    }

    const PINNED_PERM_10: [u32; 10] = [6, 9, 8, 2, 7, 4, 3, 1, 0, 5];

    #[test]
    fn batch_sizes_and_counts() {
        let mut plan = Plan::new(&params(10, 4)).unwrap();
        assert_eq!(plan.batches_per_epoch(), 3);
        assert_eq!(plan.total_batches(), 6);
        let sizes: Vec<usize> = (0..6)
            .map(|s| plan.batch(s).unwrap().samples.len())
            .collect();
        assert_eq!(sizes, [4, 4, 2, 4, 4, 2]);
        let b = plan.batch(4).unwrap();
        assert_eq!((b.seq, b.epoch, b.index_in_epoch), (4, 1, 1));
        assert!(matches!(
            plan.batch(6),
            Err(PlanError::SeqOutOfRange { seq: 6, total: 6 })
        ));

        let mut p = params(10, 4);
        p.plan.drop_last = true;
        let mut plan = Plan::new(&p).unwrap();
        assert_eq!(plan.batches_per_epoch(), 2);
        assert!((0..4).all(|s| plan.batch(s).unwrap().samples.len() == 4));
    }

    #[test]
    fn start_epoch_offsets_epoch_numbers() {
        let mut p = params(10, 5);
        p.plan.start_epoch = 7;
        let mut plan = Plan::new(&p).unwrap();
        assert_eq!(plan.batch(0).unwrap().epoch, 7);
        assert_eq!(plan.batch(3).unwrap().epoch, 8);
        // Same epoch number gives the same order regardless of start_epoch.
        let mut q = params(10, 5);
        q.plan.start_epoch = 6;
        let mut plan2 = Plan::new(&q).unwrap();
        assert_eq!(epoch_samples(&mut plan, 0), epoch_samples(&mut plan2, 1));
    }

    #[test]
    fn no_shuffle_is_identity() {
        let mut p = params(10, 3);
        p.plan.shuffle = false;
        let mut plan = Plan::new(&p).unwrap();
        assert_eq!(epoch_samples(&mut plan, 0), (0..10).collect::<Vec<u64>>());
        p.plan.world_size = 3;
        p.plan.rank = 1;
        let mut plan = Plan::new(&p).unwrap();
        // positions 1,4,7,10 -> 10 wraps to 0
        assert_eq!(epoch_samples(&mut plan, 0), vec![1, 4, 7, 0]);
    }

    #[test]
    fn errors() {
        let mut p = params(10, 4);
        p.plan.rank = 1;
        let e = Plan::new(&p).unwrap_err().to_string();
        assert!(e.contains("plan.rank"), "{e}");
        let mut p = params(3, 4);
        p.plan.drop_last = true;
        assert!(matches!(Plan::new(&p), Err(PlanError::Empty { .. })));
        assert!(Plan::new(&params(0, 4)).is_err());
        assert!(Plan::new(&params(10, 0)).is_err());
        let mut p = params(10, 4);
        p.plan.start_epoch = u32::MAX;
        assert!(Plan::new(&p).is_err());
    }

    #[test]
    fn epochs_differ_when_shuffled() {
        let mut plan = Plan::new(&params(1000, 10)).unwrap();
        let e0 = epoch_samples(&mut plan, 0);
        let e1 = epoch_samples(&mut plan, 1);
        assert_ne!(e0, e1);
        assert_ne!(e0, (0..1000).collect::<Vec<u64>>());
        // Going back to epoch 0 (cache miss) reproduces it.
        assert_eq!(epoch_samples(&mut plan, 0), e0);
    }

    #[test]
    fn large_dataset_smoke() {
        let mut p = params(5_000_000, 256);
        p.plan.world_size = 8;
        p.plan.rank = 3;
        let mut plan = Plan::new(&p).unwrap();
        let b = plan.batch(plan.total_batches() - 1).unwrap();
        assert!(!b.samples.is_empty());
        assert!(b.samples.iter().all(|&s| s < 5_000_000));
    }

    fn wds(p: &PlanParams, sizes: &[u64], buffer: u64) -> Result<Plan, PlanError> {
        Plan::with_shards(p, ShardOrder::new(sizes, buffer))
    }

    #[test]
    fn shard_order_is_bit_stable() {
        // Pinned so an accidental change of the webdataset order is caught (these are the
        // values of the order as pinring-sources computed it before it moved here).
        let o = ShardOrder::new(&[3u64, 2, 4, 5, 1][..], 3);
        assert_eq!(o.order(7, 1, 0, 2, true), [1, 2, 6, 7, 5, 8, 0, 14]);
        assert_eq!(o.order(7, 1, 1, 2, true), [11, 10, 12, 3, 4, 9, 13]);
    }

    #[test]
    fn unshuffled_shard_plans_pad_or_truncate_the_rank_order() {
        // Shards of 3, 2, 4 samples: ids 0..3, 3..5, 5..9; rank 0 has shards 0 and 2 (7
        // samples), rank 1 shard 1 (2 samples).
        let sizes = [3u64, 2, 4];
        let mut p = params(9, 2);
        p.plan.shuffle = false;
        p.plan.epochs = 1;
        p.plan.world_size = 2;
        let mut r0 = wds(&p, &sizes, 100).unwrap();
        assert_eq!(epoch_samples(&mut r0, 0), [0, 1, 2, 5, 6, 7, 8]);
        p.plan.rank = 1;
        let mut r1 = wds(&p, &sizes, 100).unwrap();
        // Padded to rank 0's 7 by repeating from the start of its own order.
        assert_eq!(epoch_samples(&mut r1, 0), [3, 4, 3, 4, 3, 4, 3]);
        assert_eq!(r1.batches_per_epoch(), r0.batches_per_epoch());
        p.plan.drop_last = true;
        let mut r1 = wds(&p, &sizes, 100).unwrap();
        assert_eq!(epoch_samples(&mut r1, 0), [3, 4]);
        p.plan.rank = 0;
        let mut r0 = wds(&p, &sizes, 100).unwrap();
        // Truncated to rank 1's 2.
        assert_eq!(epoch_samples(&mut r0, 0), [0, 1]);
        assert_eq!(r0.samples_per_rank(), 2);
    }

    #[test]
    fn shard_plan_errors() {
        let mut p = params(9, 2);
        p.plan.world_size = 4;
        let e = wds(&p, &[3, 2, 4], 0).unwrap_err();
        assert_eq!(
            e,
            PlanError::TooFewShards {
                shards: 3,
                world_size: 4
            }
        );
        assert!(e.to_string().contains("use at most 3 ranks"), "{e}");
        p.plan.world_size = 2;
        let e = wds(&p, &[9, 0, 0, 0], 0).unwrap_err();
        assert_eq!(
            e,
            PlanError::EmptyRank {
                rank: 1,
                world_size: 2,
                shards: 2
            }
        );
        let e = wds(&p, &[3, 2], 0).unwrap_err().to_string();
        assert!(
            e.contains("dataset.webdataset.shard_samples") && e.contains("sum 5"),
            "{e}"
        );
        let e = wds(&p, &[], 0).unwrap_err().to_string();
        assert!(e.contains("recorded when the shards are opened"), "{e}");
        // The smallest rank has 1 sample: no full batch of 2 with drop_last.
        p.plan.drop_last = true;
        assert!(matches!(wds(&p, &[8, 1], 0), Err(PlanError::Empty { .. })));
    }

    /// What the loaders of every rank deliver when they claim the seqs in any interleaving:
    /// each rank's seqs are claimed in an order drawn from `claims`, each by one of `loaders`
    /// loader processes drawn from `claims` too, and each loader asks its own copy of its
    /// rank's plan (as every process builds its own), so the copies' caches see the epochs in
    /// any order. Checks that every position of every rank's epoch is delivered exactly once,
    /// and returns the samples at those positions, per epoch (from `start_epoch`) and rank.
    fn deliver(
        plans: &[Plan],
        loaders: usize,
        claims: u64,
    ) -> Result<Vec<Vec<Vec<u64>>>, TestCaseError> {
        let mut rng = SplitMix64::new(claims);
        let epochs = plans[0].params().plan.epochs as usize;
        let mut out = vec![Vec::new(); epochs];
        let mut ids = Vec::new();
        for plan in plans {
            let p = *plan.params();
            let bs = u64::from(p.plan.batch_size);
            let per_epoch = (plan.batches_per_epoch() * bs).min(plan.samples_per_rank());
            let mut copies = vec![plan.clone(); loaders];
            let mut seqs: Vec<u64> = (0..plan.total_seqs()).collect();
            for i in (1..seqs.len()).rev() {
                seqs.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let mut at = vec![vec![None; per_epoch as usize]; epochs];
            for seq in seqs {
                let loader = rng.below(loaders as u64) as usize;
                let part = copies[loader].part_into(seq, &mut ids).unwrap();
                let e = (part.epoch - p.plan.start_epoch) as usize;
                let first = part.index_in_epoch * bs + part.first_in_batch;
                for (k, &id) in ids.iter().enumerate() {
                    let slot = &mut at[e][(first + k as u64) as usize];
                    prop_assert!(
                        slot.is_none(),
                        "rank {} epoch {} position {} twice",
                        p.plan.rank,
                        e,
                        first + k as u64
                    );
                    *slot = Some(id);
                }
            }
            for (e, positions) in at.into_iter().enumerate() {
                let got: Option<Vec<u64>> = positions.into_iter().collect();
                prop_assert!(
                    got.is_some(),
                    "rank {} epoch {}: a position was never delivered",
                    p.plan.rank,
                    e
                );
                out[e].push(got.unwrap_or_default());
            }
        }
        Ok(out)
    }

    /// The ids of the shards of rank `r` of `w`, in shard order.
    fn rank_ids(sizes: &[u64], r: u32, w: u32) -> Vec<u64> {
        let mut start = 0;
        let mut out = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            if i as u64 % u64::from(w) == u64::from(r) {
                out.extend(start..start + n);
            }
            start += n;
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn shard_orders_are_disjoint_cover_deterministic_and_bounded(
            sizes in proptest::collection::vec(0u64..30, 1..14),
            w in 1u32..7,
            buffer in 0u64..40,
            seed: u64,
            epoch: u32,
            shuffle: bool,
        ) {
            let o = ShardOrder::new(sizes.as_slice(), buffer);
            let total: u64 = sizes.iter().sum();
            let mut seen = vec![false; total as usize];
            for r in 0..w {
                let order = o.order(seed, epoch, r, w, shuffle);
                prop_assert_eq!(&order, &o.order(seed, epoch, r, w, shuffle));
                prop_assert_eq!(order.len() as u64, o.rank_samples(r, w));
                // A permutation of its shards' samples.
                let mut sorted = order.clone();
                sorted.sort_unstable();
                prop_assert_eq!(sorted, rank_ids(&sizes, r, w));
                for &id in &order {
                    prop_assert!(!seen[id as usize], "id {} on two ranks", id);
                    seen[id as usize] = true;
                }
                if !shuffle {
                    prop_assert_eq!(&order, &rank_ids(&sizes, r, w));
                    continue;
                }
                // Never more than buffer - 1 places ahead of its position in the stream.
                let stream = crate::shard_order::rank_stream(&sizes, seed, epoch, r, w);
                let mut at = vec![0usize; total as usize];
                for (q, &id) in stream.iter().enumerate() {
                    at[id as usize] = q;
                }
                for (q, &id) in order.iter().enumerate() {
                    prop_assert!(q + buffer.max(1) as usize > at[id as usize],
                        "id {} leaves at {}, streamed at {}", id, q, at[id as usize]);
                }
            }
            prop_assert!(seen.iter().all(|&s| s), "every sample on some rank");
        }

        #[test]
        fn shard_plans_give_every_rank_the_same_batches(
            sizes in proptest::collection::vec(0u64..30, 1..14),
            w in 1u32..7,
            bs in 1u32..9,
            buffer in 0u64..40,
            seed: u64,
            drop_last: bool,
            shuffle: bool,
        ) {
            let total: u64 = sizes.iter().sum();
            let o = ShardOrder::new(sizes.as_slice(), buffer);
            let counts: Vec<u64> = (0..w).map(|r| o.rank_samples(r, w)).collect();
            let mut p = params(total.max(1), bs);
            p.plan.seed = seed;
            p.plan.world_size = w;
            p.plan.drop_last = drop_last;
            p.plan.shuffle = shuffle;
            p.plan.start_epoch = 3;
            let mut bpes = Vec::new();
            let mut all = HashSet::new();
            for r in 0..w {
                p.plan.rank = r;
                let plan = Plan::with_shards(&p, o.clone());
                let Ok(mut plan) = plan else {
                    let e = plan.unwrap_err();
                    match e {
                        PlanError::InvalidParam { .. } => prop_assert_eq!(total, 0),
                        PlanError::TooFewShards { .. } => prop_assert!(sizes.len() < w as usize),
                        PlanError::EmptyRank { rank, .. } => prop_assert_eq!(counts[rank as usize], 0),
                        PlanError::Empty { .. } => {
                            prop_assert!(drop_last && counts.iter().min().copied().unwrap_or(0) < u64::from(bs));
                        }
                        e => prop_assert!(false, "unexpected {}", e),
                    }
                    return Ok(());
                };
                let per = if drop_last { *counts.iter().min().unwrap() } else { *counts.iter().max().unwrap() };
                prop_assert_eq!(plan.samples_per_rank(), per);
                bpes.push(plan.batches_per_epoch());
                for e in 0..2u64 {
                    let got = epoch_samples(&mut plan, e);
                    let order = o.order(seed, 3 + e as u32, r, w, shuffle);
                    let want: Vec<u64> = if drop_last {
                        order[..(per / u64::from(bs) * u64::from(bs)) as usize].to_vec()
                    } else {
                        (0..per).map(|k| order[(k % order.len() as u64) as usize]).collect()
                    };
                    prop_assert_eq!(&got, &want);
                    if e == 0 {
                        all.extend(got);
                    }
                }
            }
            // Every rank has the same number of batches; without drop_last every sample is seen.
            prop_assert!(bpes.windows(2).all(|b| b[0] == b[1]), "{:?}", bpes);
            if !drop_last {
                prop_assert_eq!(all.len() as u64, total);
            }
        }

        #[test]
        fn epoch_is_permutation(n in 1u64..500, bs in 1u32..40, seed: u64, shuffle: bool) {
            let mut p = params(n, bs);
            p.plan.seed = seed;
            p.plan.shuffle = shuffle;
            let mut plan = Plan::new(&p).unwrap();
            for e in 0..2 {
                let mut s = epoch_samples(&mut plan, e);
                s.sort_unstable();
                prop_assert_eq!(s, (0..n).collect::<Vec<u64>>());
            }
        }

        #[test]
        fn loaders_in_any_interleaving_deliver_disjoint_covering_samples(
            n in 1u64..200, w in 1u32..=6, loaders in 1usize..=8, bs in 1u32..9,
            spp_raw in 1u32..9, epochs in 1u32..4, drop_last: bool, shuffle: bool,
            seed: u64, claims: u64,
        ) {
            let mut p = params(n, bs);
            p.plan.seed = seed;
            p.plan.world_size = w;
            p.plan.drop_last = drop_last;
            p.plan.shuffle = shuffle;
            p.plan.epochs = epochs;
            p.plan.start_epoch = 5;
            p.samples_per_part = spp_raw.min(bs);
            let mut plans = Vec::new();
            for r in 0..w {
                p.plan.rank = r;
                let Ok(plan) = Plan::new(&p) else {
                    // Only when a rank would get no batch (padding_and_drop_last_sizes).
                    prop_assert!(drop_last && n / u64::from(w) < u64::from(bs));
                    return Ok(());
                };
                plans.push(plan);
            }
            let per = plans[0].samples_per_rank();
            let w64 = u64::from(w);
            for (e, ranks) in deliver(&plans, loaders, claims)?.iter().enumerate() {
                let mut count = vec![0u32; n as usize];
                for ids in ranks {
                    for &id in ids {
                        count[id as usize] += 1;
                    }
                }
                // Rank r's position k is the global position r + k·W of the epoch's order
                // (padded by wrapping), so the ranks are disjoint unless padding wraps.
                let order = if shuffle {
                    epoch_permutation(n, seed, 5 + e as u32)
                } else {
                    (0..n as u32).collect()
                };
                if drop_last {
                    // Disjoint: no sample twice, over all ranks and loaders.
                    prop_assert!(count.iter().all(|&c| c <= 1), "epoch {}: {:?}", e, count);
                    let delivered = per / u64::from(bs) * u64::from(bs) * w64;
                    prop_assert_eq!(count.iter().map(|&c| u64::from(c)).sum::<u64>(), delivered);
                } else {
                    // Cover: every sample, and the only repeats are the padding: the samples at
                    // global positions pos, pos + n, ... below per·W (with n >= W, the first
                    // per·W − n samples of the order once more), as DistributedSampler pads.
                    for (pos, &id) in order.iter().enumerate() {
                        let want = (per * w64 - 1 - pos as u64) / n + 1;
                        prop_assert_eq!(u64::from(count[id as usize]), want, "epoch {}: sample {}", e, id);
                    }
                }
                if n % w64 == 0 && (!drop_last || per % u64::from(bs) == 0) {
                    // No padding, no truncation: every sample exactly once.
                    prop_assert!(count.iter().all(|&c| c == 1), "epoch {}: {:?}", e, count);
                }
            }
        }

        #[test]
        fn loaders_in_any_interleaving_deliver_disjoint_covering_shard_samples(
            sizes in proptest::collection::vec(0u64..30, 1..14), w in 1u32..=6,
            loaders in 1usize..=8, bs in 1u32..9, spp_raw in 1u32..9, buffer in 0u64..40,
            epochs in 1u32..4, drop_last: bool, shuffle: bool, seed: u64, claims: u64,
        ) {
            let total: u64 = sizes.iter().sum();
            let o = ShardOrder::new(sizes.as_slice(), buffer);
            let mut p = params(total.max(1), bs);
            p.plan.seed = seed;
            p.plan.world_size = w;
            p.plan.drop_last = drop_last;
            p.plan.shuffle = shuffle;
            p.plan.epochs = epochs;
            p.plan.start_epoch = 5;
            p.samples_per_part = spp_raw.min(bs);
            let mut plans = Vec::new();
            for r in 0..w {
                p.plan.rank = r;
                // Errors (no samples, too few shards, an empty rank, no full batch) are
                // shard_plans_give_every_rank_the_same_batches' business.
                let Ok(plan) = Plan::with_shards(&p, o.clone()) else { return Ok(()); };
                plans.push(plan);
            }
            let per = plans[0].samples_per_rank();
            for (e, ranks) in deliver(&plans, loaders, claims)?.iter().enumerate() {
                let mut count = vec![0u64; total as usize];
                for (r, ids) in ranks.iter().enumerate() {
                    let own: HashSet<u64> = rank_ids(&sizes, r as u32, w).into_iter().collect();
                    for &id in ids {
                        // Disjoint: a rank delivers its own shards' samples only.
                        prop_assert!(own.contains(&id), "epoch {}: rank {} delivered {}", e, r, id);
                        count[id as usize] += 1;
                    }
                    // Padding repeats the rank's own order: at most ceil(per / own) times.
                    let most = per.div_ceil(own.len() as u64);
                    prop_assert!(ids.iter().all(|&id| count[id as usize] <= most));
                }
                if drop_last {
                    // Truncated: no sample twice, over all ranks and loaders.
                    prop_assert!(count.iter().all(|&c| c <= 1), "epoch {}: {:?}", e, count);
                } else {
                    // Padded: every sample of every shard.
                    prop_assert!(count.iter().all(|&c| c >= 1), "epoch {}: {:?}", e, count);
                }
                if o.rank_samples(0, w) * u64::from(w) == total
                    && (0..w).all(|r| o.rank_samples(r, w) == per)
                    && (!drop_last || per % u64::from(bs) == 0)
                {
                    // Ranks of equal counts and whole batches: every sample exactly once.
                    prop_assert!(count.iter().all(|&c| c == 1), "epoch {}: {:?}", e, count);
                }
            }
        }

        #[test]
        fn padding_and_drop_last_sizes(n in 1u64..300, w in 1u32..9, bs in 1u32..20, drop_last: bool, shuffle: bool) {
            let mut total = 0u64;
            let mut distinct = HashSet::new();
            for r in 0..w {
                let mut p = params(n, bs);
                p.plan.world_size = w;
                p.plan.rank = r;
                p.plan.drop_last = drop_last;
                p.plan.shuffle = shuffle;
                let Ok(mut plan) = Plan::new(&p) else {
                    // Only allowed when a rank would get no batch.
                    let per = if drop_last { n / u64::from(w) } else { n.div_ceil(u64::from(w)) };
                    let bpe = if drop_last { per / u64::from(bs) } else { per.div_ceil(u64::from(bs)) };
                    prop_assert_eq!(bpe, 0);
                    return Ok(());
                };
                let s = epoch_samples(&mut plan, 0);
                let per = plan.samples_per_rank();
                if drop_last {
                    prop_assert_eq!(per, n / u64::from(w));
                    prop_assert_eq!(s.len() as u64, per / u64::from(bs) * u64::from(bs));
                    let bpe = plan.batches_per_epoch();
                    for b in 0..bpe {
                        prop_assert_eq!(plan.batch(b).unwrap().samples.len(), bs as usize);
                    }
                } else {
                    prop_assert_eq!(per, n.div_ceil(u64::from(w)));
                    prop_assert_eq!(s.len() as u64, per);
                }
                total += s.len() as u64;
                distinct.extend(s);
            }
            if !drop_last {
                // Padding: every sample appears, total is n rounded up to W.
                prop_assert_eq!(distinct.len() as u64, n);
                prop_assert_eq!(total, n.div_ceil(u64::from(w)) * u64::from(w));
            } else {
                // Truncation: no sample appears twice.
                prop_assert_eq!(distinct.len() as u64, total);
            }
        }

        #[test]
        fn parts_are_disjoint_in_order_and_cover_their_batch(
            n in 1u64..300, bs in 1u32..24, spp_raw in 1u32..24, w in 1u32..4,
            drop_last: bool, shuffle: bool, seed: u64,
        ) {
            let mut p = params(n, bs);
            p.plan.seed = seed;
            p.plan.world_size = w;
            p.plan.rank = w - 1;
            p.plan.drop_last = drop_last;
            p.plan.shuffle = shuffle;
            p.samples_per_part = spp_raw.min(bs);
            let (Ok(mut parts), Ok(mut whole)) = (Plan::new(&p), Plan::new(&params_like(&p))) else {
                return Ok(());
            };
            let pp = parts.parts_per_batch();
            prop_assert_eq!(pp, u64::from(bs.div_ceil(p.samples_per_part)));
            prop_assert_eq!(parts.total_seqs(), parts.total_batches() * pp);
            let mut ids = Vec::new();
            for b in 0..parts.total_batches() {
                let batch = whole.batch(b).unwrap();
                let mut joined = Vec::new();
                for j in 0..pp {
                    let seq = b * pp + j;
                    let part = parts.part_into(seq, &mut ids).unwrap();
                    prop_assert_eq!((part.seq, part.batch, u64::from(part.part)), (seq, b, j));
                    prop_assert_eq!(u64::from(part.parts), pp);
                    prop_assert_eq!((part.epoch, part.index_in_epoch), (batch.epoch, batch.index_in_epoch));
                    prop_assert_eq!(part.batch_samples, batch.samples.len() as u64);
                    prop_assert_eq!(part.samples, ids.len() as u64);
                    prop_assert!(part.samples <= u64::from(p.samples_per_part));
                    // In order: each part starts where the previous one ended.
                    prop_assert_eq!(part.first_in_batch, joined.len() as u64);
                    prop_assert_eq!(part.byte_offset(12), joined.len() as u64 * 12);
                    prop_assert_eq!(part.payload_bytes(12), ids.len() as u64 * 12);
                    joined.extend_from_slice(&ids);
                }
                // Disjoint and covering: the parts, joined, are exactly the batch.
                prop_assert_eq!(&joined, &batch.samples);
            }
            let total = parts.total_seqs();
            let past_the_end = parts.part_into(total, &mut ids);
            prop_assert!(matches!(past_the_end, Err(PlanError::SeqOutOfRange { .. })), "{:?}", past_the_end);
        }

        #[test]
        fn byte_parts_are_disjoint_in_order_and_cover_every_byte_of_every_sample(
            n in 1u64..60, bs in 1u32..6, field in 1u64..5000, chunk in 1u64..1200,
            drop_last: bool, shuffle: bool, seed: u64,
        ) {
            let mut p = params(n, bs);
            p.plan.seed = seed;
            p.plan.drop_last = drop_last;
            p.plan.shuffle = shuffle;
            p.samples_per_part = 1;
            let cut = SampleCut { field_bytes: field, chunk_bytes: chunk };
            p.cut = Some(cut);
            let (Ok(mut parts), Ok(mut whole)) = (Plan::new(&p), Plan::new(&params_like(&p))) else {
                return Ok(());
            };
            let k = field.div_ceil(chunk);
            prop_assert_eq!(cut.chunks(), k);
            prop_assert_eq!(parts.parts_per_batch(), u64::from(bs) * k);
            let mut ids = Vec::new();
            for b in 0..parts.total_batches() {
                let batch = whole.batch(b).unwrap();
                // Per sample of the batch: the ranges its parts carried, in order.
                let mut covered = vec![0u64; batch.samples.len()];
                for j in 0..parts.parts_per_batch() {
                    let seq = b * parts.parts_per_batch() + j;
                    let part = parts.part_into(seq, &mut ids).unwrap();
                    prop_assert_eq!((part.batch, u64::from(part.part)), (b, j));
                    prop_assert_eq!((part.epoch, part.index_in_epoch), (batch.epoch, batch.index_in_epoch));
                    let i = j / k;
                    if i >= batch.samples.len() as u64 {
                        // Past the end of a short batch: empty.
                        prop_assert_eq!(part.samples, 0);
                        prop_assert!(ids.is_empty() && part.bytes.is_none());
                        continue;
                    }
                    prop_assert_eq!(part.samples, 1);
                    prop_assert_eq!(&ids, &vec![batch.samples[i as usize]]);
                    prop_assert_eq!(part.first_in_batch, i);
                    let r = part.bytes.unwrap();
                    // In order and disjoint: each starts where the sample's previous one ended.
                    prop_assert_eq!(r.offset, covered[i as usize]);
                    prop_assert!(r.len >= 1 && r.len <= chunk);
                    prop_assert_eq!(r.is_first(), j % k == 0);
                    if j % k + 1 < k {
                        prop_assert_eq!(r.len, chunk);
                    } else {
                        // The last part of a sample ends the field, short when chunk does not divide it.
                        prop_assert_eq!(r.offset + r.len, field);
                        prop_assert_eq!(r.len, field - (k - 1) * chunk);
                    }
                    covered[i as usize] = r.offset + r.len;
                }
                // Every byte of every sample.
                prop_assert!(covered.iter().all(|&c| c == field), "{:?}", covered);
            }
        }

        #[test]
        fn one_part_per_batch_is_the_batch_mapping(
            n in 1u64..300, bs in 1u32..24, w in 1u32..4, drop_last: bool, shuffle: bool, seed: u64,
        ) {
            let mut p = params(n, bs);
            p.plan.seed = seed;
            p.plan.world_size = w;
            p.plan.rank = 0;
            p.plan.drop_last = drop_last;
            p.plan.shuffle = shuffle;
            let Ok(mut plan) = Plan::new(&p) else { return Ok(()); };
            prop_assert_eq!(plan.parts_per_batch(), 1);
            prop_assert_eq!(plan.total_seqs(), plan.total_batches());
            let mut ids = Vec::new();
            for seq in 0..plan.total_seqs() {
                let part = plan.part_into(seq, &mut ids).unwrap();
                let batch = plan.batch(seq).unwrap();
                prop_assert_eq!(&ids, &batch.samples);
                prop_assert_eq!((part.batch, part.part, part.first_in_batch), (seq, 0, 0));
                prop_assert_eq!((part.epoch, part.index_in_epoch), (batch.epoch, batch.index_in_epoch));
            }
        }

        #[test]
        fn deterministic(n in 1u64..300, bs in 1u32..20, seed: u64, w in 1u32..4, drop_last: bool) {
            let mut p = params(n, bs);
            p.plan.seed = seed;
            p.plan.world_size = w;
            p.plan.rank = w - 1;
            p.plan.drop_last = drop_last;
            let (Ok(mut a), Ok(mut b)) = (Plan::new(&p), Plan::new(&p)) else { return Ok(()); };
            let total = a.total_batches();
            // Query b in reverse order to exercise the cache.
            let fwd: Vec<_> = (0..total).map(|s| a.batch(s).unwrap()).collect();
            let mut rev: Vec<_> = (0..total).rev().map(|s| b.batch(s).unwrap()).collect();
            rev.reverse();
            prop_assert_eq!(fwd, rev);
        }
    }
}
