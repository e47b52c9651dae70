//! A 64-bit fingerprint of everything that decides which bytes go into
//! which batch.
//!
//! The daemon and the loaders compare fingerprints to make sure they run
//! the same dataset and plan. Ring-only settings (name, slots, in_order,
//! mode) are excluded: they do not change batch contents. So is
//! `plan.epochs`: it only bounds the run (the daemon publishes the end seq
//! in the ring header), while the contents of batch k do not depend on it,
//! so `pinring-daemon --epochs N` needs no matching flag on the loaders. The fingerprint
//! is xxh3-64 over an explicit, versioned little-endian encoding (see
//! [`Config::fingerprint_bytes`]), never over `Debug` output.

use xxhash_rust::xxh3::xxh3_64;

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::config::{Config, DatasetKind};
use crate::dataset::ImageTransform;

/// Appends `path` as written (u32 length, bytes).
fn push_path(b: &mut Vec<u8>, path: &Path) {
    let bytes = path.as_os_str().as_bytes();
    b.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    b.extend_from_slice(bytes);
}

/// Version of the fingerprint encoding *and* of the data algorithms (plan
/// PRNG, synthetic generator, metadata encoding, slot payload format). Bump it
/// when any of them changes so that mismatched builds refuse to talk to each
/// other. Version 3: a part's payload is field-major, its samples' images then
/// their labels as little-endian i64 ([`crate::fields`]), and slots are sized
/// for both; a loader of version 2 wrote the images alone. Version 4: the
/// fields a sample of `kind = "external"` declares are hashed, and new dtypes
/// (bool, i8, i16, u16, u32, u64) extend the metadata's dtype enum. Version 5:
/// the file kinds (`tokens`, `npy`): their fields are hashed like declared ones,
/// followed by what else decides their bytes (files as written, token dtype,
/// seq_len, stride, shift, arrays, `on_bad_sample`). Version 6: the image kinds
/// (`webdataset`, `imagefolder`): shards or root as written, `shuffle_buffer`, extensions and
/// every `[dataset.image]` key (pinring-image's decode and transform decide the bytes).
/// Version 7: `webdataset` delivers in its shard order (shard `i` to rank `i % world_size`,
/// shards shuffled per rank, a shuffle buffer, counts evened out across ranks), so the shards'
/// sample counts are hashed after `shuffle_buffer`.
/// Version 8: byte parts (a sample too large for one part is cut into byte ranges of its
/// largest field, [`crate::plan::SampleCut`]): the byte part size is hashed, and the metadata
/// ends with the part's byte range ([`crate::BatchMeta::byte_range`]).
/// Version 9: `webdataset` may read each sample's `.npy` member into a declared field and may
/// read no image (`[dataset.webdataset] npy` and `images`), both hashed after the shard sizes.
/// Version 10: a batch's fields start at multiples of 16 bytes in its device buffer, not 256
/// ([`crate::FIELD_ALIGN`]): a consumer of version 9 would read the later fields at the wrong
/// offsets.
pub const FINGERPRINT_VERSION: u32 = 10;

const MAGIC: &[u8; 8] = b"pinrngfp";

impl Config {
    /// The canonical byte string hashed by [`Config::fingerprint`]:
    /// magic `"pinrngfp"`, version (u32), then, little endian: dataset kind
    /// (u8), samples (u64), ndims (u32), each dim (u32), dtype code (u8),
    /// dataset seed (u64), classes (u32), batch_size (u32), shuffle (u8),
    /// plan seed (u64), start_epoch (u32), drop_last (u8),
    /// rank (u32), world_size (u32), resolved slot_bytes (u64), samples per part (u32;
    /// version 2: with the slot size and batch size it fixes which samples each seq carries),
    /// bytes of the largest field in each byte part (u64, 0 for parts of whole samples; version
    /// 7),
    /// then the declared fields (version 4; count (u32), then per field its name (u32 length,
    /// UTF-8), dtype code (u8), ndims (u32) and dims (u32 each)); for the file kinds
    /// (version 5; kind 2 `tokens`, 3 `npy`) these are the fields of [`Config::fields`], then
    /// `on_bad_sample` (u8: 0 fail, 1 skip) and, for `tokens`: file count (u32), each path as
    /// written (u32 length, bytes), token dtype code (u8), seq_len (u32), stride in effect
    /// (u32), shift (u8); for `npy`: the path as written, then labels (u8 0 none, 1 and the
    /// path); for `webdataset` (version 6, kind 4): shard count (u32), each path as written,
    /// shuffle_buffer (u64), then (version 7) the count of recorded shard sizes (u32, 0 before the
    /// shards are opened) and each size (u64), then (version 9) `images` (u8) and `npy` (u8: 0
    /// none; 1, then its field name (u32 length, UTF-8), dtype code (u8), ndims (u32) and dims
    /// (u32 each)); for `imagefolder` (kind 5): root as written, extension count
    /// (u32), each extension (u32 length, UTF-8); then for both `[dataset.image]`: transform (u8:
    /// 0 train, 1 eval), crop, resize (u32 each), scale and ratio (f64 bits, 2 each), flip (u8),
    /// output dtype code (u8), mean and std (f32 bits, 3 each), reduced_decode (u8), every value
    /// in effect (defaults included). The sample count is `samples`, the source's length once
    /// opened; the shifted windows' seed is the plan seed, and so is the seed of the train
    /// transform's crops and flips.
    /// The fields of a sample follow from the dataset kind, shape and dtype; their payload
    /// format is the version's (version 3: field-major images and i64 labels).
    pub fn fingerprint_bytes(&self) -> Vec<u8> {
        let d = &self.dataset;
        let p = &self.plan;
        let mut b = Vec::with_capacity(96 + 4 * d.sample_shape.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&FINGERPRINT_VERSION.to_le_bytes());
        b.push(match d.kind {
            DatasetKind::Synthetic => 0,
            DatasetKind::External => 1,
            DatasetKind::Tokens => 2,
            DatasetKind::Npy => 3,
            DatasetKind::WebDataset => 4,
            DatasetKind::ImageFolder => 5,
        });
        b.extend_from_slice(&d.samples.to_le_bytes());
        b.extend_from_slice(&(d.sample_shape.len() as u32).to_le_bytes());
        for dim in &d.sample_shape {
            b.extend_from_slice(&dim.to_le_bytes());
        }
        b.push(d.dtype.code());
        b.extend_from_slice(&d.seed.to_le_bytes());
        b.extend_from_slice(&d.classes.to_le_bytes());
        b.extend_from_slice(&p.batch_size.to_le_bytes());
        b.push(u8::from(p.shuffle));
        b.extend_from_slice(&p.seed.to_le_bytes());
        b.extend_from_slice(&p.start_epoch.to_le_bytes());
        b.push(u8::from(p.drop_last));
        b.extend_from_slice(&p.rank.to_le_bytes());
        b.extend_from_slice(&p.world_size.to_le_bytes());
        let parts = self.part_layout();
        b.extend_from_slice(&parts.slot_bytes.to_le_bytes());
        b.extend_from_slice(&parts.samples_per_part.to_le_bytes());
        let chunk = parts.cut.map_or(0, |c| c.chunk_bytes);
        b.extend_from_slice(&chunk.to_le_bytes());
        // Declared fields (kind = "external"; none for synthetic, whose fields follow from the
        // kind, shape and dtype): count, then each name (length, UTF-8), dtype code, ndims, dims.
        let fields = if d.kind.reads_files() {
            self.fields()
        } else {
            d.fields.clone()
        };
        b.extend_from_slice(&(fields.len() as u32).to_le_bytes());
        for f in &fields {
            b.extend_from_slice(&(f.name.len() as u32).to_le_bytes());
            b.extend_from_slice(f.name.as_bytes());
            b.push(f.dtype.code());
            b.extend_from_slice(&(f.shape.len() as u32).to_le_bytes());
            for dim in &f.shape {
                b.extend_from_slice(&dim.to_le_bytes());
            }
        }
        if d.kind.reads_files() {
            b.push(match d.on_bad_sample {
                crate::OnBadSample::Fail => 0,
                crate::OnBadSample::Skip => 1,
            });
        }
        if let Some(t) = &d.tokens {
            b.extend_from_slice(&(t.files.len() as u32).to_le_bytes());
            for f in &t.files {
                push_path(&mut b, f);
            }
            b.push(t.token_dtype.code());
            b.extend_from_slice(&t.seq_len.to_le_bytes());
            b.extend_from_slice(&t.stride().to_le_bytes());
            b.push(u8::from(t.shift));
        }
        if let Some(n) = &d.npy {
            push_path(&mut b, &n.path);
            match &n.labels {
                Some(l) => {
                    b.push(1);
                    push_path(&mut b, l);
                }
                None => b.push(0),
            }
        }
        if let Some(w) = &d.webdataset {
            b.extend_from_slice(&(w.shards.len() as u32).to_le_bytes());
            for f in &w.shards {
                push_path(&mut b, f);
            }
            b.extend_from_slice(&w.shuffle_buffer.to_le_bytes());
            b.extend_from_slice(&(w.shard_samples.len() as u32).to_le_bytes());
            for n in &w.shard_samples {
                b.extend_from_slice(&n.to_le_bytes());
            }
            b.push(u8::from(w.images));
            match &w.npy {
                Some(n) => {
                    b.push(1);
                    b.extend_from_slice(&(n.field.len() as u32).to_le_bytes());
                    b.extend_from_slice(n.field.as_bytes());
                    b.push(n.dtype.code());
                    b.extend_from_slice(&(n.shape.len() as u32).to_le_bytes());
                    for dim in &n.shape {
                        b.extend_from_slice(&dim.to_le_bytes());
                    }
                }
                None => b.push(0),
            }
        }
        if let Some(f) = &d.imagefolder {
            push_path(&mut b, &f.root);
            b.extend_from_slice(&(f.extensions.len() as u32).to_le_bytes());
            for e in &f.extensions {
                b.extend_from_slice(&(e.len() as u32).to_le_bytes());
                b.extend_from_slice(e.as_bytes());
            }
        }
        if let Some(i) = &d.image {
            b.push(match i.transform {
                ImageTransform::Train => 0,
                ImageTransform::Eval => 1,
            });
            b.extend_from_slice(&i.crop().to_le_bytes());
            b.extend_from_slice(&i.resize().to_le_bytes());
            for v in i.scale().into_iter().chain(i.ratio()) {
                b.extend_from_slice(&v.to_bits().to_le_bytes());
            }
            b.push(u8::from(i.flip()));
            b.push(i.output.dtype().code());
            for v in i.mean().into_iter().chain(i.std()) {
                b.extend_from_slice(&v.to_bits().to_le_bytes());
            }
            b.push(u8::from(i.reduced_decode));
        }
        b
    }

    /// xxh3-64 of [`Config::fingerprint_bytes`].
    pub fn fingerprint(&self) -> u64 {
        xxh3_64(&self.fingerprint_bytes())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{SegmentMode, SlotBytes};
    use crate::{ByteSize, Config};

    #[test]
    fn equal_configs_equal_fingerprints() {
        assert_eq!(
            Config::default().fingerprint(),
            Config::default().fingerprint()
        );
        let parsed = Config::from_toml_str(crate::DEFAULT_CONFIG_TOML, "x").unwrap();
        assert_eq!(parsed.fingerprint(), Config::default().fingerprint());
    }

    #[test]
    fn content_fields_change_it() {
        let base = Config::default().fingerprint();
        type Edit = Box<dyn Fn(&mut Config)>;
        let mut edits: Vec<Edit> = vec![
            Box::new(|c| c.plan.batch_size = 16),
            Box::new(|c| c.plan.seed = 1),
            Box::new(|c| c.dataset.seed = 1),
            Box::new(|c| c.dataset.samples = 100),
            Box::new(|c| c.dataset.sample_shape = vec![256, 255]),
            Box::new(|c| c.dataset.dtype = crate::Dtype::U8),
            Box::new(|c| c.dataset.classes = 10),
            Box::new(|c| c.plan.shuffle = false),
            Box::new(|c| c.plan.start_epoch = 1),
            Box::new(|c| c.plan.drop_last = true),
            Box::new(|c| c.plan.world_size = 2),
            Box::new(|c| c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(64 << 20))),
        ];
        let mut seen = std::collections::HashSet::new();
        for edit in edits.drain(..) {
            let mut c = Config::default();
            edit(&mut c);
            let f = c.fingerprint();
            assert_ne!(f, base);
            assert!(seen.insert(f));
        }
    }

    #[test]
    fn the_version_is_in_the_bytes() {
        // A loader of another payload format (version 2: images only) has another fingerprint
        // for the same config, so the daemon refuses it.
        let bytes = Config::default().fingerprint_bytes();
        assert_eq!(bytes[8..12], 10u32.to_le_bytes());
        let mut v2 = bytes.clone();
        v2[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert_ne!(
            xxhash_rust::xxh3::xxh3_64(&v2),
            Config::default().fingerprint()
        );
    }

    #[test]
    fn ring_only_fields_do_not() {
        let mut e = Config::default();
        e.plan.epochs = 7;
        assert_eq!(
            e.fingerprint(),
            Config::default().fingerprint(),
            "epochs only bound the run"
        );
        let base = Config::default().fingerprint();
        let mut c = Config::default();
        c.ring.name = "other".into();
        c.ring.slots = Some(64);
        c.ring.in_order = false;
        c.ring.mode = SegmentMode::Group;
        c.source = "elsewhere.toml".into();
        assert_eq!(c.fingerprint(), base);
    }
}
