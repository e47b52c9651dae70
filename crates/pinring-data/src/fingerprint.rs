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
use crate::dataset::{ImageDataset, ImageDecode, ImageTransform};

/// Appends `path` as written (u32 length, bytes).
fn push_path(b: &mut Vec<u8>, path: &Path) {
    let bytes = path.as_os_str().as_bytes();
    b.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    b.extend_from_slice(bytes);
}

/// A field's name (u32 length, UTF-8), dtype code (u8), ndims (u32) and dims (u32 each).
fn push_field(b: &mut Vec<u8>, name: &str, dtype: u8, shape: &[u32]) {
    b.extend_from_slice(&(name.len() as u32).to_le_bytes());
    b.extend_from_slice(name.as_bytes());
    b.push(dtype);
    b.extend_from_slice(&(shape.len() as u32).to_le_bytes());
    for dim in shape {
        b.extend_from_slice(&dim.to_le_bytes());
    }
}

/// `[dataset.image]`'s values in effect (see [`Config::fingerprint_bytes`]).
fn push_image(b: &mut Vec<u8>, i: &ImageDataset, batch_size: u32) {
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
    // Version 11: where the images are decoded, and each sample's share of the arena (0 for
    // decode = "cpu"): both fix the slot's payload format.
    b.push(match i.decode {
        ImageDecode::Cpu => 0,
        ImageDecode::Gpu => 1,
        // Resolved before any ring is made (`Spec::resolve`); hashed apart all the same.
        ImageDecode::Auto => 2,
    });
    b.extend_from_slice(&i.encoded_share(batch_size).unwrap_or(0).to_le_bytes());
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
/// Version 11: `[dataset.image] decode = "gpu"` carries the images encoded in the slots
/// ([`crate::encoded`]): `decode` (u8: 0 cpu, 1 gpu) and each sample's share of the part's
/// arena (u64, 0 for cpu) are hashed after `reduced_decode`.
pub const FINGERPRINT_VERSION: u32 = 11;

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
    /// output dtype code (u8), mean and std (f32 bits, 3 each), reduced_decode (u8), decode (u8;
    /// version 11) and the share of the arena per sample (u64), every value
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
        b.push(d.kind.code());
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
            push_field(&mut b, &f.name, f.dtype.code(), &f.shape);
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
                    push_field(&mut b, &n.field, n.dtype.code(), &n.shape);
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
            push_image(&mut b, i, p.batch_size);
        }
        b
    }

    /// xxh3-64 of [`Config::fingerprint_bytes`].
    pub fn fingerprint(&self) -> u64 {
        xxh3_64(&self.fingerprint_bytes())
    }
}

/// Words of the settings record a daemon stores in its ring beside the fingerprint
/// ([`pinring_ring::layout::SETTINGS_WORDS`]).
pub const SETTINGS_WORDS: usize = pinring_ring::layout::SETTINGS_WORDS;

/// Version of [`Config::settings_record`]'s encoding, its word 0 (0: no record, a ring of an
/// older daemon).
pub const SETTINGS_VERSION: u64 = 1;

/// The record's words (docs/PROTOCOL.md, "Settings record").
mod word {
    pub const VERSION: usize = 0;
    pub const FINGERPRINT_VERSION: usize = 1;
    pub const KIND: usize = 2;
    pub const SAMPLES: usize = 3;
    pub const PATHS: usize = 4;
    pub const FIELDS: usize = 5;
    pub const BATCH_SIZE: usize = 6;
    pub const SEED: usize = 7;
    pub const SHUFFLE: usize = 8;
    pub const DROP_LAST: usize = 9;
    pub const START_EPOCH: usize = 10;
    pub const RANK: usize = 11;
    pub const WORLD_SIZE: usize = 12;
    pub const SLOT_BYTES: usize = 13;
    pub const SAMPLES_PER_PART: usize = 14;
    pub const SHARD_SAMPLES: usize = 15;
}

impl crate::config::DatasetKind {
    /// The fingerprint's code of the kind.
    const fn code(self) -> u8 {
        match self {
            DatasetKind::Synthetic => 0,
            DatasetKind::External => 1,
            DatasetKind::Tokens => 2,
            DatasetKind::Npy => 3,
            DatasetKind::WebDataset => 4,
            DatasetKind::ImageFolder => 5,
        }
    }

    const ALL: [DatasetKind; 6] = [
        DatasetKind::Synthetic,
        DatasetKind::External,
        DatasetKind::Tokens,
        DatasetKind::Npy,
        DatasetKind::WebDataset,
        DatasetKind::ImageFolder,
    ];

    /// The keys that decide a sample's fields, for a message.
    const fn field_keys(self) -> &'static str {
        match self {
            DatasetKind::Synthetic => "dataset.sample_shape, dataset.dtype",
            DatasetKind::External => "dataset.fields",
            DatasetKind::Tokens => "dataset.tokens.seq_len, dataset.tokens.dtype",
            DatasetKind::Npy => "dataset.npy.shape, dtype, field, labels_dtype, labels_shape",
            DatasetKind::WebDataset => {
                "[dataset.image] crop and output, dataset.webdataset.images and npy"
            }
            DatasetKind::ImageFolder => "[dataset.image] crop and output",
        }
    }

    /// The key of the kind's file paths, for a message.
    const fn path_keys(self) -> &'static str {
        match self {
            DatasetKind::Tokens => "dataset.tokens.files",
            DatasetKind::Npy => "dataset.npy.path or dataset.npy.labels",
            DatasetKind::WebDataset => "dataset.webdataset.shards",
            DatasetKind::ImageFolder => "dataset.imagefolder.root",
            DatasetKind::Synthetic | DatasetKind::External => "the dataset's paths",
        }
    }
}

impl Config {
    /// The settings record a daemon stores in its ring beside the fingerprint: the values of
    /// the settings a loader's config most often differs in (the plan's keys, the dataset's
    /// kind and length, the slot size) and hashes of the dataset's paths as written, of its
    /// fields and of its shards' sample counts, so that a loader refused for another
    /// fingerprint can name what differs ([`Config::setting_differences`]).
    pub fn settings_record(&self) -> [u64; SETTINGS_WORDS] {
        let d = &self.dataset;
        let p = &self.plan;
        let mut w = [0u64; SETTINGS_WORDS];
        w[word::VERSION] = SETTINGS_VERSION;
        w[word::FINGERPRINT_VERSION] = u64::from(FINGERPRINT_VERSION);
        w[word::KIND] = u64::from(d.kind.code());
        w[word::SAMPLES] = d.samples;
        let mut paths = Vec::new();
        for (key, path) in self.dataset_paths() {
            paths.extend_from_slice(key.as_bytes());
            push_path(&mut paths, path);
        }
        w[word::PATHS] = xxh3_64(&paths);
        let mut fields = Vec::new();
        for f in self.fields() {
            fields.extend_from_slice(&(f.name.len() as u32).to_le_bytes());
            fields.extend_from_slice(f.name.as_bytes());
            fields.push(f.dtype.code());
            fields.extend_from_slice(&(f.shape.len() as u32).to_le_bytes());
            for dim in &f.shape {
                fields.extend_from_slice(&dim.to_le_bytes());
            }
        }
        w[word::FIELDS] = xxh3_64(&fields);
        w[word::BATCH_SIZE] = u64::from(p.batch_size);
        w[word::SEED] = p.seed;
        w[word::SHUFFLE] = u64::from(p.shuffle);
        w[word::DROP_LAST] = u64::from(p.drop_last);
        w[word::START_EPOCH] = u64::from(p.start_epoch);
        w[word::RANK] = u64::from(p.rank);
        w[word::WORLD_SIZE] = u64::from(p.world_size);
        let parts = self.part_layout();
        w[word::SLOT_BYTES] = parts.slot_bytes;
        w[word::SAMPLES_PER_PART] = u64::from(parts.samples_per_part);
        let shard_samples: Vec<u8> = d
            .webdataset
            .iter()
            .flat_map(|w| w.shard_samples.iter().flat_map(|n| n.to_le_bytes()))
            .collect();
        w[word::SHARD_SAMPLES] = xxh3_64(&shard_samples);
        w
    }

    /// The settings in which this config differs from the one whose record is `theirs` (a
    /// daemon's, [`Config::settings_record`]), each named by its key with both values where the
    /// record holds them ("plan.batch_size: the daemon's 8, this loader's 4"). `None`: `theirs`
    /// is no record (an older daemon's ring). Empty: none of the recorded settings differ, so
    /// another dataset or plan setting does (one the record holds no word for).
    pub fn setting_differences(&self, theirs: &[u64; SETTINGS_WORDS]) -> Option<Vec<String>> {
        if theirs[word::VERSION] != SETTINGS_VERSION {
            return None;
        }
        let mine = self.settings_record();
        let differs = |i: usize| mine[i] != theirs[i];
        let mut out = Vec::new();
        if differs(word::FINGERPRINT_VERSION) {
            out.push(format!(
                "the pinring version (the daemon's build hashes configs with fingerprint version                  {}, this loader's {}): run the loader of the daemon's build",
                theirs[word::FINGERPRINT_VERSION],
                mine[word::FINGERPRINT_VERSION]
            ));
        }
        let their_kind = DatasetKind::ALL
            .into_iter()
            .find(|k| u64::from(k.code()) == theirs[word::KIND]);
        let kind = self.dataset.kind;
        if differs(word::KIND) {
            out.push(format!(
                "dataset.kind (the daemon's {}, this loader's \"{kind}\")",
                their_kind.map_or_else(
                    || format!("kind code {}", theirs[word::KIND]),
                    |k| format!("\"{k}\"")
                ),
            ));
        } else {
            if differs(word::PATHS) {
                out.push(format!(
                    "{} (the daemon reads other files: compare the paths, and where relative, \
                     the folders they are resolved against: {} here)",
                    kind.path_keys(),
                    self.paths_relative_to()
                ));
            }
            if differs(word::FIELDS) {
                out.push(format!(
                    "the sample's fields ({}; this loader's: {})",
                    kind.field_keys(),
                    self.fields()
                        .iter()
                        .map(|f| format!("{} {} {:?}", f.name, f.dtype, f.shape))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if differs(word::SAMPLES) && kind.reads_files() {
                out.push(format!(
                    "the dataset's length (the daemon's {kind} files hold {} samples, the files \
                     this loader opened have {}: it reads other or changed files than the \
                     daemon; its relative paths are resolved against {})",
                    theirs[word::SAMPLES],
                    mine[word::SAMPLES],
                    self.paths_relative_to()
                ));
            } else if differs(word::SAMPLES) {
                out.push(format!(
                    "dataset.samples (the daemon's {}, this loader's {})",
                    theirs[word::SAMPLES],
                    mine[word::SAMPLES]
                ));
            }
            if differs(word::SHARD_SAMPLES) && !differs(word::SAMPLES) {
                out.push(
                    "dataset.webdataset.shard_samples (the shards' sample counts: the loader \
                     reads other or changed shards than the daemon)"
                        .to_string(),
                );
            }
        }
        for (i, key) in [
            (word::BATCH_SIZE, "plan.batch_size"),
            (word::SEED, "plan.seed"),
            (word::SHUFFLE, "plan.shuffle"),
            (word::DROP_LAST, "plan.drop_last"),
            (word::START_EPOCH, "plan.start_epoch"),
            (word::RANK, "plan.rank"),
            (word::WORLD_SIZE, "plan.world_size"),
        ] {
            if differs(i) {
                let show = |v: u64| match i {
                    word::SHUFFLE | word::DROP_LAST => (v != 0).to_string(),
                    _ => v.to_string(),
                };
                out.push(format!(
                    "{key} (the daemon's {}, this loader's {})",
                    show(theirs[i]),
                    show(mine[i])
                ));
            }
        }
        if differs(word::SLOT_BYTES) {
            out.push(format!(
                "ring.slot_bytes (the daemon's slots hold {} bytes, this loader's {}: leave it \
                 \"auto\" in the loader's config to take the daemon's)",
                theirs[word::SLOT_BYTES],
                mine[word::SLOT_BYTES]
            ));
        } else if differs(word::SAMPLES_PER_PART) && out.is_empty() {
            // Follows from the batch size and the fields: named only where they agree.
            out.push(format!(
                "the samples per part (the daemon's {}, this loader's {})",
                theirs[word::SAMPLES_PER_PART],
                mine[word::SAMPLES_PER_PART]
            ));
        }
        Some(out)
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
        assert_eq!(bytes[8..12], 11u32.to_le_bytes());
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

#[cfg(test)]
mod settings_record {
    use crate::Config;

    /// A config of `extra` with a fixed slot size (a loader's "auto" takes the daemon's).
    fn config(extra: &str) -> Config {
        Config::from_toml_str(
            &format!("[ring]\nslot_bytes = \"4MiB\"\n[dataset]\nsamples = 64\n{extra}"),
            "t",
        )
        .unwrap()
    }

    #[test]
    fn the_settings_that_differ_are_named_with_both_values() {
        let daemon = config("[plan]\nbatch_size = 8\n");
        let theirs = daemon.settings_record();
        assert_eq!(
            config("[plan]\nbatch_size = 8\n").setting_differences(&theirs),
            Some(vec![])
        );
        let d = config("[plan]\nbatch_size = 4\nshuffle = false\nseed = 3\n")
            .setting_differences(&theirs)
            .unwrap();
        assert_eq!(
            d,
            [
                "plan.batch_size (the daemon's 8, this loader's 4)",
                "plan.seed (the daemon's 0, this loader's 3)",
                "plan.shuffle (the daemon's true, this loader's false)",
            ]
        );
        let d = config("sample_shape = [3, 4]\n[plan]\nbatch_size = 8\n")
            .setting_differences(&theirs)
            .unwrap();
        assert!(
            d.len() == 1 && d[0].contains("dataset.sample_shape") && d[0].contains("[3, 4]"),
            "{d:?}"
        );
        let d = config("[plan]\nbatch_size = 8\nworld_size = 2\nrank = 1\n")
            .setting_differences(&theirs)
            .unwrap();
        assert_eq!(d.len(), 2, "{d:?}");
        // A dataset key the record has no word for: nothing named, the fingerprint differs.
        let other = config("classes = 7\n[plan]\nbatch_size = 8\n");
        assert_ne!(other.fingerprint(), daemon.fingerprint());
        assert_eq!(other.setting_differences(&theirs), Some(vec![]));
        // An explicit slot size of the loader's that is not the daemon's.
        let d = Config::from_toml_str(
            "[ring]\nslot_bytes = \"8MiB\"\n[dataset]\nsamples = 64\n[plan]\nbatch_size = 8\n",
            "t",
        )
        .unwrap()
        .setting_differences(&theirs)
        .unwrap();
        assert!(d.len() == 1 && d[0].starts_with("ring.slot_bytes"), "{d:?}");
        // No record (an older daemon's ring): nothing to compare.
        assert_eq!(
            daemon.setting_differences(&[0; super::SETTINGS_WORDS]),
            None
        );
    }

    #[test]
    fn file_paths_and_kinds_are_named_by_their_keys() {
        let tokens = |files: &str| {
            Config::from_toml_str(
                &format!(
                    "[dataset]\nkind = \"tokens\"\n[dataset.tokens]\nfiles = {files}\nseq_len = 4\n"
                ),
                "t",
            )
            .unwrap()
        };
        let theirs = tokens("[\"a.bin\"]").settings_record();
        let d = tokens("[\"b.bin\"]").setting_differences(&theirs).unwrap();
        assert!(
            d.len() == 1 && d[0].starts_with("dataset.tokens.files"),
            "{d:?}"
        );
        let d = config("").setting_differences(&theirs).unwrap();
        // (and the slot size, which follows from the fields: a loader's "auto" takes the
        // daemon's)
        assert!(
            d[0].contains("dataset.kind (the daemon's \"tokens\", this loader's \"synthetic\")"),
            "{d:?}"
        );
    }
}
