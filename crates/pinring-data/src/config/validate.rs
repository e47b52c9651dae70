//! The checks of a config's settings: every value range, the fields, the files of the file
//! kinds, the image transform ([`Config::validate`]). The ring's geometry is checked in
//! `geometry.rs`.

use super::*;

impl Config {
    /// Checks every value range; call again after applying overrides.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_ring()?;
        self.validate_daemon()?;
        self.validate_fields()?;
        self.validate_files()?;
        self.validate_samples()?;
        self.validate_plan()?;
        self.validate_geometry()
    }

    /// The seeds (TOML's integers), the ring's name, slots and group.
    fn validate_ring(&self) -> Result<(), ConfigError> {
        // A config is written as TOML (for loaders, consumers, the ring), whose integers are
        // signed 64-bit: a seed given as data (Python) above that could not be written out.
        for (key, seed) in [
            ("plan.seed", self.plan.seed),
            ("dataset.seed", self.dataset.seed),
        ] {
            if seed > i64::MAX as u64 {
                return Err(self.invalid(
                    key,
                    seed,
                    "0 to 9223372036854775807 (2^63 - 1): a config is written as TOML, whose \
                     integers are signed 64-bit; pass a smaller seed",
                ));
            }
        }
        let r = &self.ring;
        // The one rule for ring names, shared with the segment code.
        if pinring_ring::segment::validate_name(&r.name).is_err() {
            return Err(self.invalid(
                "ring.name",
                format!("{:?}", r.name),
                "1 to 64 characters from A-Z a-z 0-9 _ -",
            ));
        }
        if !(MIN_SLOTS..=MAX_SLOTS).contains(&self.slots()) {
            return Err(self.invalid(
                "ring.slots",
                self.slots(),
                format!("must be between {MIN_SLOTS} and {MAX_SLOTS}"),
            ));
        }
        if let Some(group) = &r.group {
            let ok = (1..=32).contains(&group.len())
                && group
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            if !ok {
                return Err(self.invalid(
                    "ring.group",
                    format!("{group:?}"),
                    "a group name of 1 to 32 characters from A-Z a-z 0-9 _ - .",
                ));
            }
            if r.mode != SegmentMode::Group {
                return Err(self.invalid(
                    "ring.group",
                    format!("{group:?}"),
                    "a group only makes sense with ring.mode = \"0660\"; set the mode or remove the group",
                ));
            }
        }
        Ok(())
    }

    /// `[daemon]`'s values.
    fn validate_daemon(&self) -> Result<(), ConfigError> {
        let dm = &self.daemon;
        if dm.lease_ms < MIN_LEASE_MS {
            return Err(self.invalid(
                "daemon.lease_ms",
                dm.lease_ms,
                format!("must be at least {MIN_LEASE_MS}"),
            ));
        }
        if !REAP_INTERVAL_MS.contains(&dm.reap_interval_ms) {
            return Err(self.invalid(
                "daemon.reap_interval_ms",
                dm.reap_interval_ms,
                format!(
                    "must be between {} and {} (dead loaders are noticed within this time)",
                    REAP_INTERVAL_MS.start(),
                    REAP_INTERVAL_MS.end()
                ),
            ));
        }
        if !IDLE_WARN_MS.contains(&dm.idle_warn_ms) {
            return Err(self.invalid(
                "daemon.idle_warn_ms",
                dm.idle_warn_ms,
                format!(
                    "must be between {} and {} (how long a ring with work left may have no \
                     loader before the daemon warns)",
                    IDLE_WARN_MS.start(),
                    IDLE_WARN_MS.end()
                ),
            ));
        }
        for (key, cpus) in [
            ("daemon.cpus", &dm.cpus),
            ("daemon.loader_cpus", &dm.loader_cpus),
        ] {
            if let Some(list) = cpus {
                if list.is_empty() || list.iter().any(|&c| c >= 1024) {
                    return Err(self.invalid(
                        key,
                        format!("{list:?}"),
                        "a list of one or more CPU numbers below 1024 (leave it out to place \
                         by the GPU's NUMA node)",
                    ));
                }
            }
        }
        if let Some(p) = dm.prefetch {
            if !BATCH_BUFFERS.contains(&p) {
                return Err(self.invalid(
                    "daemon.prefetch",
                    p,
                    format!(
                        "must be between {} and {} batch buffers ({} to {} for a ring that \
                         hands its batches to a training process: one is the trainer's current \
                         batch, the rest are uploaded ahead)",
                        BATCH_BUFFERS.start(),
                        BATCH_BUFFERS.end(),
                        PREFETCH.start(),
                        PREFETCH.end()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The dataset's sample count, sample shape, sample size and classes.
    fn validate_samples(&self) -> Result<(), ConfigError> {
        let d = &self.dataset;
        // A file kind learns its length when its source is opened.
        let unresolved = d.kind.reads_files() && d.samples == 0;
        if !unresolved && (d.samples == 0 || d.samples > MAX_PLAN_SAMPLES) {
            return Err(self.invalid(
                "dataset.samples",
                d.samples,
                format!("must be between 1 and {MAX_PLAN_SAMPLES}"),
            ));
        }
        if !d.kind.reads_files() && d.sample_shape.len() > MAX_SAMPLE_DIMS {
            return Err(self.invalid(
                "dataset.sample_shape",
                format!("{:?}", d.sample_shape),
                format!("at most {MAX_SAMPLE_DIMS} dimensions"),
            ));
        }
        if !d.kind.reads_files() && d.sample_shape.contains(&0) {
            return Err(self.invalid(
                "dataset.sample_shape",
                format!("{:?}", d.sample_shape),
                "every dimension must be >= 1",
            ));
        }
        let sb = self.sample_bytes_checked();
        if !matches!(sb, Some(1..=MAX_SAMPLE_BYTES)) {
            let (key, value) = self.first_field_setting();
            return Err(self.invalid(
                key,
                value,
                "one sample's first field (product of dims x dtype size) must be at most 1 GiB",
            ));
        }
        if d.classes == 0 {
            return Err(self.invalid("dataset.classes", 0, "must be >= 1"));
        }
        Ok(())
    }

    /// The plan's values, a webdataset's shards against them, and the plan they make where the
    /// dataset's length (and a webdataset's shard sizes) are known.
    fn validate_plan(&self) -> Result<(), ConfigError> {
        let d = &self.dataset;
        // A file kind learns its length when its source is opened.
        let unresolved = d.kind.reads_files() && d.samples == 0;
        let p = &self.plan;
        if p.batch_size == 0 {
            return Err(self.invalid("plan.batch_size", 0, "must be >= 1"));
        }
        if p.epochs == 0 {
            return Err(self.invalid("plan.epochs", 0, "must be >= 1"));
        }
        if p.world_size == 0 {
            return Err(self.invalid("plan.world_size", 0, "must be >= 1"));
        }
        if p.rank >= p.world_size {
            return Err(self.invalid(
                "plan.rank",
                p.rank,
                format!("must be less than plan.world_size ({})", p.world_size),
            ));
        }
        if let Some(w) = d
            .webdataset
            .as_ref()
            .filter(|_| d.kind == DatasetKind::WebDataset)
            // A glob's shards are counted when it is expanded ([`Config::set_shards`]).
            .filter(|w| !w.shards.iter().any(|p| crate::dataset::is_glob(p)))
        {
            // Known from the config alone: refused before the shards are opened.
            if (w.shards.len() as u64) < u64::from(p.world_size) {
                let e = PlanError::TooFewShards {
                    shards: w.shards.len() as u64,
                    world_size: p.world_size,
                };
                return Err(self.invalid("plan.world_size", p.world_size, e.to_string()));
            }
            if !w.shard_samples.is_empty() && w.shard_samples.len() != w.shards.len() {
                return Err(self.invalid(
                    "dataset.webdataset.shard_samples",
                    format!("{:?}", w.shard_samples),
                    format!(
                        "one count per shard ({} shards): leave it out, it is recorded from the \
                         shards when they are opened",
                        w.shards.len()
                    ),
                ));
            }
        }
        // The shard order needs the shards' sizes too.
        let unresolved = unresolved
            || d.kind == DatasetKind::WebDataset
                && d.webdataset
                    .as_ref()
                    .is_none_or(|w| w.shard_samples.is_empty());
        if !unresolved {
            self.validate_cut()?;
        }
        match self.plan() {
            _ if unresolved => {}
            Ok(_) => {}
            Err(
                e @ (PlanError::TooFewShards { world_size, .. }
                | PlanError::EmptyRank { world_size, .. }),
            ) => {
                return Err(self.invalid("plan.world_size", world_size, e.to_string()));
            }
            Err(PlanError::InvalidParam {
                key,
                value,
                allowed,
            }) => {
                return Err(self.invalid(key, value, allowed));
            }
            Err(e @ PlanError::Empty { .. }) => {
                return Err(self.invalid("plan.batch_size", p.batch_size, format!("{e}")));
            }
            Err(e @ PlanError::SeqOutOfRange { .. }) => {
                return Err(self.invalid("plan", "?", e.to_string()));
            }
        }
        Ok(())
    }

    /// Byte parts ([`Config::part_layout`]): a slot must hold a byte part of at least 8 bytes
    /// with the sample's other fields and its metadata.
    pub(super) fn validate_cut(&self) -> Result<(), ConfigError> {
        let Some(cut) = self.part_layout().cut else {
            return Ok(());
        };
        if cut.chunk_bytes == 0 {
            let (_, others) = self.cut_sizes();
            let least = round_up(self.cut_need(8, others), SLOT_ALIGN);
            return Err(self.invalid(
                "ring.slot_bytes",
                self.ring.slot_bytes,
                format!(
                    "too small: one sample ({} bytes, all its fields) does not fit, so it is cut \
                     into byte parts, and a slot must hold a byte part of its largest field with \
                     its other fields ({others} bytes) and its metadata; use \"auto\" or at least \
                     {least}",
                    self.record_bytes()
                ),
            ));
        }
        Ok(())
    }

    /// `dataset.fields`: declared for `kind = "external"` (1 to [`MAX_FIELDS`] fields with
    /// distinct names, shapes of at most [`MAX_SAMPLE_DIMS`] dimensions >= 1, at most 1 GiB per
    /// sample over all fields), and absent for the other kinds.
    pub(super) fn validate_fields(&self) -> Result<(), ConfigError> {
        let d = &self.dataset;
        if d.kind != DatasetKind::External {
            if !d.fields.is_empty() {
                return Err(self.invalid(
                    "dataset.fields",
                    format!("{} fields", d.fields.len()),
                    "only kind = \"external\" declares its fields (synthetic samples have images \
                     and labels); remove dataset.fields",
                ));
            }
            return Ok(());
        }
        if d.fields.is_empty() || d.fields.len() > MAX_FIELDS {
            return Err(self.invalid(
                "dataset.fields",
                format!("{} fields", d.fields.len()),
                format!(
                    "kind = \"external\" needs 1 to {MAX_FIELDS} fields, each {{ name = \"images\", \
                     dtype = \"u8\", shape = [224, 224, 3] }}"
                ),
            ));
        }
        let mut total = 0u64;
        for (i, f) in d.fields.iter().enumerate() {
            if !valid_field_name(&f.name) {
                return Err(self.invalid(
                    "dataset.fields",
                    format!("[{i}] name {:?}", f.name),
                    "a field name is 1 to 64 characters from A-Z a-z 0-9 _ - .",
                ));
            }
            if d.fields[..i].iter().any(|g| g.name == f.name) {
                return Err(self.invalid(
                    "dataset.fields",
                    format!("[{i}] name {:?}", f.name),
                    "field names must differ; rename one of the two",
                ));
            }
            if f.shape.len() > MAX_SAMPLE_DIMS || f.shape.contains(&0) {
                return Err(self.invalid(
                    "dataset.fields",
                    format!("[{i}] {:?} shape {:?}", f.name, f.shape),
                    format!(
                        "at most {MAX_SAMPLE_DIMS} dimensions, each >= 1 ([] is one value per sample)"
                    ),
                ));
            }
            total = total.saturating_add(f.sample_bytes());
        }
        if total > MAX_SAMPLE_BYTES {
            return Err(self.invalid(
                "dataset.fields",
                format!("{total} bytes per sample"),
                "one sample (all its fields) must be at most 1 GiB",
            ));
        }
        Ok(())
    }

    /// `[dataset.tokens]` / `[dataset.npy]`: present for their kind only, with values in range
    /// (the files themselves are checked when the source is opened).
    pub(super) fn validate_files(&self) -> Result<(), ConfigError> {
        let d = &self.dataset;
        for (given, owner, key) in [
            (d.tokens.is_some(), DatasetKind::Tokens, "dataset.tokens"),
            (d.npy.is_some(), DatasetKind::Npy, "dataset.npy"),
            (
                d.webdataset.is_some(),
                DatasetKind::WebDataset,
                "dataset.webdataset",
            ),
            (
                d.imagefolder.is_some(),
                DatasetKind::ImageFolder,
                "dataset.imagefolder",
            ),
        ] {
            if given != (d.kind == owner) {
                return Err(self.invalid(
                    key,
                    if given { "a table" } else { "no table" },
                    format!(
                        "[{key}] is given exactly when dataset.kind = \"{owner}\" (this dataset \
                         has kind = \"{}\")",
                        d.kind
                    ),
                ));
            }
        }
        if let Some(t) = &d.tokens {
            self.validate_tokens(t)?;
        }
        if let Some(n) = &d.npy {
            self.validate_npy(n)?;
        }
        if d.image.is_some() != d.decodes_images() {
            return Err(self.invalid(
                "dataset.image",
                if d.image.is_some() {
                    "a table"
                } else {
                    "no table"
                },
                format!(
                    "[dataset.image] belongs to dataset.kind = \"webdataset\" and \
                     \"imagefolder\", and not beside dataset.webdataset.images = false (this \
                     dataset has kind = \"{}\")",
                    d.kind
                ),
            ));
        }
        if let Some(w) = &d.webdataset {
            self.validate_webdataset(w)?;
        }
        if let Some(f) = &d.imagefolder {
            self.validate_imagefolder(f)?;
        }
        if let Some(i) = &d.image {
            self.validate_image(i)?;
        }
        Ok(())
    }

    /// `[dataset.tokens]`'s values.
    fn validate_tokens(&self, t: &TokensDataset) -> Result<(), ConfigError> {
        if t.files.is_empty() || t.files.iter().any(|f| f.as_os_str().is_empty()) {
            return Err(self.invalid(
                "dataset.tokens.files",
                format!("{:?}", t.files),
                "one or more token files (paths relative to the config file's directory, or \
                 absolute), read as one stream in this order",
            ));
        }
        if !matches!(t.token_dtype, Dtype::U16 | Dtype::U32) {
            return Err(self.invalid(
                "dataset.tokens.token_dtype",
                t.token_dtype,
                "\"u16\" or \"u32\" (the files' little-endian token type)",
            ));
        }
        if !matches!(t.dtype, Dtype::I64 | Dtype::I32) {
            return Err(self.invalid(
                "dataset.tokens.dtype",
                t.dtype,
                "\"i64\" or \"i32\" (the dtype of input_ids and targets)",
            ));
        }
        if t.seq_len == 0 {
            return Err(self.invalid("dataset.tokens.seq_len", 0, "must be >= 1"));
        }
        if t.stride == Some(0) {
            return Err(self.invalid(
                "dataset.tokens.stride",
                0,
                "must be >= 1 (leave it out for seq_len)",
            ));
        }

        Ok(())
    }

    /// `[dataset.npy]`'s values.
    fn validate_npy(&self, n: &NpyDataset) -> Result<(), ConfigError> {
        if n.path.as_os_str().is_empty() {
            return Err(self.invalid(
                "dataset.npy.path",
                "\"\"",
                "a .npy file (samples on the first axis) or a directory of per-sample .npy files",
            ));
        }
        if !valid_field_name(&n.field) || (n.labels.is_some() && n.field == LABELS) {
            return Err(self.invalid(
                "dataset.npy.field",
                format!("{:?}", n.field),
                "1 to 64 characters from A-Z a-z 0-9 _ - ., and not \"labels\" when \
                 dataset.npy.labels is given",
            ));
        }
        for (key, dtype) in [
            ("dataset.npy.dtype", n.dtype),
            ("dataset.npy.labels_dtype", n.labels_dtype),
        ] {
            if dtype == Dtype::Bf16 {
                return Err(self.invalid(
                    key,
                    dtype,
                    "a dtype numpy has: u8, i8, i16, u16, i32, u32, i64, u64, f16, f32, f64, \
                     bool",
                ));
            }
        }
        for (key, shape) in [
            ("dataset.npy.shape", &n.shape),
            ("dataset.npy.labels_shape", &n.labels_shape),
        ] {
            if !dims_ok(shape) {
                return Err(self.invalid(
                    key,
                    format!("{shape:?}"),
                    format!(
                        "the shape of one sample: at most {MAX_SAMPLE_DIMS} dimensions, each \
                         >= 1 ([] is one value per sample)"
                    ),
                ));
            }
        }

        Ok(())
    }

    /// `[dataset.webdataset]`'s values.
    fn validate_webdataset(&self, w: &WebDatasetDataset) -> Result<(), ConfigError> {
        if w.shards.is_empty() || w.shards.iter().any(|f| f.as_os_str().is_empty()) {
            return Err(self.invalid(
                "dataset.webdataset.shards",
                format!("{:?}", w.shards),
                "one or more tar shards (paths relative to the config file's directory, or \
                 absolute), in order",
            ));
        }
        if let Some(n) = &w.npy {
            let taken = if w.images {
                "\"labels\" or \"images\" (the kind's other fields)"
            } else {
                "\"labels\" (the kind's other field)"
            };
            if !valid_field_name(&n.field) || n.field == LABELS || (w.images && n.field == IMAGES) {
                return Err(self.invalid(
                    "dataset.webdataset.npy.field",
                    format!("{:?}", n.field),
                    format!(
                        "1 to 64 characters from A-Z a-z 0-9 _ - ., and not {taken}: field \
                         names must differ"
                    ),
                ));
            }
            if n.dtype == Dtype::Bf16 {
                return Err(self.invalid(
                    "dataset.webdataset.npy.dtype",
                    n.dtype,
                    "a dtype numpy has: u8, i8, i16, u16, i32, u32, i64, u64, f16, f32, f64, \
                     bool",
                ));
            }
            if !dims_ok(&n.shape) {
                return Err(self.invalid(
                    "dataset.webdataset.npy.shape",
                    format!("{:?}", n.shape),
                    format!(
                        "the shape of each .npy member: at most {MAX_SAMPLE_DIMS} dimensions, \
                         each >= 1 ([] is one value per sample)"
                    ),
                ));
            }
        }

        Ok(())
    }

    /// `[dataset.imagefolder]`'s values.
    fn validate_imagefolder(&self, f: &ImageFolderDataset) -> Result<(), ConfigError> {
        if f.root.as_os_str().is_empty() {
            return Err(self.invalid(
                "dataset.imagefolder.root",
                "\"\"",
                "the directory that holds one subdirectory per class",
            ));
        }
        if f.extensions.is_empty()
            || f.extensions
                .iter()
                .any(|e| e.trim_start_matches('.').is_empty())
        {
            return Err(self.invalid(
                "dataset.imagefolder.extensions",
                format!("{:?}", f.extensions),
                "one or more file extensions such as \"jpg\" (default jpg, jpeg, png)",
            ));
        }

        Ok(())
    }

    /// `[dataset.image]`: values in range, and no key of the other transform or output.
    pub(super) fn validate_image(&self, i: &ImageDataset) -> Result<(), ConfigError> {
        let t = i.transform.as_str();
        let other = match i.transform {
            ImageTransform::Train => [("dataset.image.resize", i.resize.is_some())].to_vec(),
            ImageTransform::Eval => [
                ("dataset.image.scale", i.scale.is_some()),
                ("dataset.image.ratio", i.ratio.is_some()),
                ("dataset.image.flip", i.flip.is_some()),
            ]
            .to_vec(),
        };
        if let Some((key, _)) = other.iter().find(|(_, given)| *given) {
            return Err(self.invalid(
                key,
                "given",
                format!(
                    "a key of transform = \"{}\", and this table has transform = \"{t}\": \
                     remove it",
                    if t == "train" { "eval" } else { "train" }
                ),
            ));
        }
        if i.output == ImageOutput::U8 {
            for (key, given) in [
                ("dataset.image.mean", i.mean.is_some()),
                ("dataset.image.std", i.std.is_some()),
            ] {
                if given {
                    return Err(self.invalid(
                        key,
                        "given",
                        "a key of the normalised outputs (output = \"f16\", \"bf16\" or \
                         \"f32\"); output = \"u8\" is unnormalised: remove it",
                    ));
                }
            }
        }
        if i.decode == ImageDecode::Cpu && i.encoded_bytes.is_some() {
            return Err(self.invalid(
                "dataset.image.encoded_bytes",
                "given",
                "the budget of compressed images a batch carries with decode = \"gpu\"; with \
                 decode = \"cpu\" the loaders write pixels: remove it",
            ));
        }
        if i.decode != ImageDecode::Cpu && i.reduced_decode {
            return Err(self.invalid(
                "dataset.image.reduced_decode",
                true,
                format!(
                    "a shortcut of the loaders' CPU decoder; with decode = \"{}\" the JPEGs \
                     are decoded at full size where the batch is copied: remove it, or set \
                     decode = \"cpu\"",
                    i.decode.as_str()
                ),
            ));
        }
        if let Some(share) = i.encoded_share(self.plan.batch_size) {
            if share < MIN_ENCODED_SHARE {
                return Err(self.invalid(
                    "dataset.image.encoded_bytes",
                    i.encoded_bytes.map_or(0, |b| b.0),
                    format!(
                        "at least {MIN_ENCODED_SHARE} bytes per sample of a batch ({} for \
                         plan.batch_size = {})",
                        MIN_ENCODED_SHARE.saturating_mul(u64::from(self.plan.batch_size)),
                        self.plan.batch_size
                    ),
                ));
            }
        }
        let crop = i.crop();
        if crop == 0 || crop > MAX_IMAGE_SIDE {
            return Err(self.invalid(
                "dataset.image.crop",
                crop,
                format!("the output's side in pixels: 1 to {MAX_IMAGE_SIDE}"),
            ));
        }
        if i.transform == ImageTransform::Eval && i.resize() < crop {
            return Err(self.invalid(
                "dataset.image.resize",
                i.resize(),
                format!("the shorter side after resizing, at least crop ({crop})"),
            ));
        }
        let [lo, hi] = i.scale();
        if !(lo > 0.0 && lo <= hi && hi <= 1.0) {
            return Err(self.invalid(
                "dataset.image.scale",
                format!("[{lo}, {hi}]"),
                "[min, max] with 0 < min <= max <= 1 (fractions of the image's area)",
            ));
        }
        let [lo, hi] = i.ratio();
        if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
            return Err(self.invalid(
                "dataset.image.ratio",
                format!("[{lo}, {hi}]"),
                "[min, max] with 0 < min <= max (aspect ratios w/h)",
            ));
        }
        if i.std().iter().any(|s| !(s.is_finite() && *s != 0.0)) {
            return Err(self.invalid(
                "dataset.image.std",
                format!("{:?}", i.std()),
                "three finite, non-zero values (R, G, B on the 0..1 scale)",
            ));
        }
        if i.mean().iter().any(|m| !m.is_finite()) {
            return Err(self.invalid(
                "dataset.image.mean",
                format!("{:?}", i.mean()),
                "three finite values (R, G, B on the 0..1 scale)",
            ));
        }
        Ok(())
    }

    /// The key that sets the size of a sample's first field for this kind, and its value as the
    /// size check words it (`dataset.tokens.seq_len = 4000000000 x u16`), so that a sample too
    /// large is reported at the key the user wrote.
    pub(super) fn first_field_setting(&self) -> (&'static str, String) {
        let d = &self.dataset;
        match d.kind {
            DatasetKind::Synthetic => (
                "dataset.sample_shape",
                format!("{:?} x {}", d.sample_shape, d.dtype),
            ),
            DatasetKind::External => (
                "dataset.fields",
                d.fields.first().map_or_else(String::new, |f| {
                    format!(
                        "[{{ name = {:?}, shape = {:?} x {} }}, ...]",
                        f.name, f.shape, f.dtype
                    )
                }),
            ),
            DatasetKind::Tokens => match &d.tokens {
                Some(t) => (
                    "dataset.tokens.seq_len",
                    format!("{} x {}", t.seq_len, t.dtype),
                ),
                None => ("dataset.tokens", String::new()),
            },
            DatasetKind::Npy => match &d.npy {
                Some(n) => ("dataset.npy.shape", format!("{:?} x {}", n.shape, n.dtype)),
                None => ("dataset.npy", String::new()),
            },
            DatasetKind::WebDataset | DatasetKind::ImageFolder => match &d.image {
                Some(i) => {
                    let (dtype, shape) = i.images();
                    (
                        "dataset.image.crop",
                        format!("{} ({shape:?} x {dtype})", i.crop()),
                    )
                }
                None => ("dataset.image", String::new()),
            },
        }
    }

    pub(super) fn sample_bytes_checked(&self) -> Option<u64> {
        let d = &self.dataset;
        match d.kind {
            DatasetKind::Synthetic => {}
            DatasetKind::External => return d.fields.first().map(Field::sample_bytes),
            DatasetKind::Tokens
            | DatasetKind::Npy
            | DatasetKind::WebDataset
            | DatasetKind::ImageFolder => return self.file_field_bytes().map(|(first, _)| first),
        }
        d.sample_shape
            .iter()
            .try_fold(d.dtype.size_of() as u64, |acc, &x| {
                acc.checked_mul(u64::from(x))
            })
    }
}

/// A sample's shape as the file kinds take it: at most MAX_SAMPLE_DIMS dimensions, each >= 1.
fn dims_ok(shape: &[u32]) -> bool {
    shape.len() <= MAX_SAMPLE_DIMS && !shape.contains(&0)
}
