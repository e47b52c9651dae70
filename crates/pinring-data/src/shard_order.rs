//! The shard order of `dataset.kind = "webdataset"`: which samples a rank delivers in an epoch,
//! and in which order ([`ShardOrder`], docs/FORMATS.md).
//!
//! The samples are numbered in shard order, then member order (shard `i` holds the ids
//! `start(i) .. start(i) + shard_sizes[i]`). For `world` ranks:
//!
//! 1. Shard `i` belongs to rank `i % world`: the ranks' shards are disjoint and together they are
//!    every shard.
//! 2. With shuffling, rank `r`'s shards are put in a Fisher-Yates order drawn from
//!    [`SplitMix64`] seeded by `(seed, epoch, r)`; without, they stay in index order.
//! 3. Their samples are streamed in that order, each shard's in member order.
//! 4. With shuffling, the stream goes through a shuffle buffer of `buffer` samples (0 or 1:
//!    none): once the buffer is full, each incoming sample evicts a uniformly drawn one (the same
//!    generator, after the shard shuffle), and at the end the rest leave in random order. A
//!    sample never leaves more than `buffer - 1` places before its position in the stream (it
//!    may leave later: a shuffle buffer bounds the lead, not the delay).
//!
//! The result is a permutation of the rank's samples, a pure function of the shard sizes,
//! `buffer`, `seed`, `epoch`, `rank` and `world` (the daemon and every loader compute it
//! independently). Ranks get different counts when shards differ in size; [`crate::Plan`] evens
//! them out (truncates to the smallest rank's count or pads to the largest's).

use std::sync::Arc;

use crate::plan::{mix64, SplitMix64};

/// The shard sizes and shuffle buffer of a `webdataset` plan ([`crate::Plan::with_shards`]).
///
/// Cheap to clone: the sizes are shared.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardOrder {
    sizes: Arc<[u64]>,
    buffer: u64,
}

impl ShardOrder {
    /// Shards of `shard_sizes` samples (in shard order) and a shuffle buffer of `buffer`
    /// samples (0 or 1: none).
    pub fn new(shard_sizes: impl Into<Arc<[u64]>>, buffer: u64) -> ShardOrder {
        ShardOrder {
            sizes: shard_sizes.into(),
            buffer,
        }
    }

    /// Samples in each shard, in shard order.
    pub fn shard_sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// Samples in the shuffle buffer.
    pub fn buffer(&self) -> u64 {
        self.buffer
    }

    /// Number of shards.
    pub fn shards(&self) -> u64 {
        self.sizes.len() as u64
    }

    /// Samples in all shards (saturating).
    pub fn samples(&self) -> u64 {
        self.sizes.iter().fold(0u64, |a, &n| a.saturating_add(n))
    }

    /// Shards of rank `rank` of `world` (`i % world == rank`).
    pub fn rank_shards(&self, rank: u32, world: u32) -> u64 {
        let (w, r) = (u64::from(world.max(1)), u64::from(rank));
        let n = self.shards();
        if r >= n {
            0
        } else {
            (n - r).div_ceil(w)
        }
    }

    /// Samples of rank `rank` of `world`: the sum of its shards' sizes (saturating).
    pub fn rank_samples(&self, rank: u32, world: u32) -> u64 {
        let (w, r) = (u64::from(world.max(1)), u64::from(rank));
        self.sizes
            .iter()
            .enumerate()
            .filter(|&(i, _)| i as u64 % w == r)
            .fold(0u64, |a, (_, &n)| a.saturating_add(n))
    }

    /// The sample ids rank `rank` of `world` delivers in `epoch`: with `shuffle`, its shards
    /// shuffled by `(seed, epoch, rank)` and the shuffle buffer ([`epoch_order_for`]); without,
    /// its shards in order, each in member order.
    pub fn order(&self, seed: u64, epoch: u32, rank: u32, world: u32, shuffle: bool) -> Vec<u64> {
        if shuffle {
            let buffer = usize::try_from(self.buffer).unwrap_or(usize::MAX);
            epoch_order_for(&self.sizes, seed, epoch, rank, world, buffer)
        } else {
            stream(&self.sizes, rank, world, None).0
        }
    }
}

/// Seed of rank `rank`'s order in `epoch`.
fn rank_seed(seed: u64, epoch: u32, rank: u32) -> u64 {
    mix64(seed ^ mix64((u64::from(epoch) << 32 | u64::from(rank)) ^ 0x7764_7368_7566_666c))
}

/// The sample ids rank `rank` of `world` streams, for shards of `shard_sizes` samples (ids
/// numbered in shard order): its shards in index order, or shuffled by the generator seeded
/// with `seed` (which is returned, for the shuffle buffer).
fn stream(shard_sizes: &[u64], rank: u32, world: u32, seed: Option<u64>) -> (Vec<u64>, SplitMix64) {
    let world = world.max(1);
    let mut starts = Vec::with_capacity(shard_sizes.len());
    let mut next = 0u64;
    for &n in shard_sizes {
        starts.push(next);
        next = next.saturating_add(n);
    }
    let mut mine: Vec<usize> = (0..shard_sizes.len())
        .filter(|&i| (i as u64) % u64::from(world) == u64::from(rank))
        .collect();
    let mut rng = SplitMix64::new(seed.unwrap_or(0));
    if seed.is_some() {
        for i in (1..mine.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            mine.swap(i, j);
        }
    }
    let mut out = Vec::new();
    for i in mine {
        out.extend(starts[i]..starts[i].saturating_add(shard_sizes[i]));
    }
    (out, rng)
}

/// The sample ids rank `rank` of `world` streams in `epoch` with shuffling, before the shuffle
/// buffer: its shards shuffled by `(seed, epoch, rank)`, each in member order (see the module
/// docs).
pub fn rank_stream(shard_sizes: &[u64], seed: u64, epoch: u32, rank: u32, world: u32) -> Vec<u64> {
    stream(shard_sizes, rank, world, Some(rank_seed(seed, epoch, rank))).0
}

/// The sample ids rank `rank` of `world` delivers in `epoch` with shuffling, for shards of
/// `shard_sizes` samples, through a shuffle buffer of `buffer` samples (0 or 1: no shuffle
/// buffer). See the module docs.
pub fn epoch_order_for(
    shard_sizes: &[u64],
    seed: u64,
    epoch: u32,
    rank: u32,
    world: u32,
    buffer: usize,
) -> Vec<u64> {
    let (stream, mut rng) = stream(shard_sizes, rank, world, Some(rank_seed(seed, epoch, rank)));
    if buffer <= 1 {
        return stream;
    }
    let mut out = Vec::with_capacity(stream.len());
    let mut buf = Vec::with_capacity(buffer.min(stream.len()));
    for id in stream {
        buf.push(id);
        if buf.len() >= buffer {
            let j = rng.below(buf.len() as u64) as usize;
            out.push(buf.swap_remove(j));
        }
    }
    while !buf.is_empty() {
        let j = rng.below(buf.len() as u64) as usize;
        out.push(buf.swap_remove(j));
    }
    out
}
