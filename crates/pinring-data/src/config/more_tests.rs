//! Tests of the file kinds' settings, the documented example file and the hints of unknown
//! keys.

mod file_kinds {
    use crate::config::*;
    use crate::dataset::{OnBadSample, WebDatasetNpy, WDS_NPY_DEFAULT_FIELD};

    const TOKENS: &str = r#"
[dataset]
kind = "tokens"
on_bad_sample = "skip"
[dataset.tokens]
files = ["a.bin", "/data/b.bin"]
token_dtype = "u32"
seq_len = 8
shift = true
dtype = "i32"
"#;

    const NPY: &str = r#"
[dataset]
kind = "npy"
[dataset.npy]
path = "x.npy"
dtype = "u8"
shape = [3, 4]
labels = "y.npy"
labels_dtype = "i16"
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(text, "t.toml")
    }

    #[test]
    fn file_kinds_have_fields_from_the_config_alone() {
        let c = parse(TOKENS).unwrap();
        assert_eq!(c.dataset.kind, DatasetKind::Tokens);
        assert_eq!(c.dataset.on_bad_sample, OnBadSample::Skip);
        assert!(!c.samples_resolved(), "the length comes from the files");
        assert_eq!(
            c.fields(),
            [
                Field::new(INPUT_IDS, Dtype::I32, vec![8]),
                Field::new(TARGETS, Dtype::I32, vec![8]),
            ]
        );
        assert_eq!(c.record_bytes(), 64);
        assert_eq!(c.first_field(), (vec![8], Dtype::I32));
        assert_eq!(c.dataset.tokens.as_ref().unwrap().stride(), 8);
        let c = parse(NPY).unwrap();
        assert_eq!(
            c.fields(),
            [
                Field::new("data", Dtype::U8, vec![3, 4]),
                Field::new(LABELS, Dtype::I16, vec![]),
            ]
        );
        assert_eq!(c.record_bytes(), 14);
        assert_eq!(c.sample_bytes(), 12);
        assert!(c.plan().is_err(), "no plan before the length is known");
        for text in [TOKENS, NPY, &NPY.replace("labels = \"y.npy\"\n", "")] {
            let c = parse(text).unwrap();
            let sum: u64 = c.fields().iter().map(Field::sample_bytes).sum();
            assert_eq!(c.record_bytes(), sum);
            assert_eq!(c.sample_bytes(), c.fields()[0].sample_bytes());
        }
    }

    #[test]
    fn a_sample_too_large_is_reported_at_the_key_that_sets_its_size() {
        let cases = [
            (
                TOKENS.replace("seq_len = 8", "seq_len = 4000000000"),
                "dataset.tokens.seq_len = 4000000000 x i32",
            ),
            (
                NPY.replace("shape = [3, 4]", "shape = [100000, 100000]"),
                "dataset.npy.shape = [100000, 100000] x u8",
            ),
            (
                "[dataset]\nkind = \"external\"\nsamples = 4\n\
                 fields = [{ name = \"x\", dtype = \"f64\", shape = [65536, 65536] }]\n"
                    .to_string(),
                "dataset.fields = ",
            ),
            (
                "[dataset]\nsample_shape = [65536, 65536]\n".to_string(),
                "dataset.sample_shape = [65536, 65536] x f32",
            ),
        ];
        for (text, said) in cases {
            let e = parse(&text).unwrap_err().to_string();
            assert!(
                e.contains(said) && e.contains("at most 1 GiB"),
                "{said}: {e}"
            );
        }
    }

    #[test]
    fn the_source_length_becomes_samples_and_is_checked() {
        let mut c = parse(TOKENS).unwrap();
        let unresolved = c.fingerprint();
        c.set_source_len(1000).unwrap();
        assert_eq!(c.dataset.samples, 1000);
        assert_ne!(c.fingerprint(), unresolved);
        assert_eq!(c.plan().unwrap().batches_per_epoch(), 1000u64.div_ceil(32));
        // Stored in the ring and read back: the same config, the same fingerprint.
        let again = parse(&c.to_toml()).unwrap();
        assert_eq!(again, c);
        assert_eq!(again.fingerprint(), c.fingerprint());
        let e = again.clone().set_source_len(999).unwrap_err().to_string();
        assert!(
            e.contains("dataset.samples = 1000") && e.contains("hold 999 samples"),
            "{e}"
        );
        let mut given =
            parse(&NPY.replace("kind = \"npy\"", "kind = \"npy\"\nsamples = 5")).unwrap();
        assert!(given.set_source_len(6).is_err());
        given.set_source_len(5).unwrap();
        let npy = parse(NPY).unwrap();
        assert_eq!(parse(&npy.to_toml()).unwrap(), npy);
    }

    #[test]
    fn keys_of_another_kind_are_refused_by_name_and_kind() {
        let cases: &[(&str, &[&str])] = &[
            (
                &TOKENS.replace("on_bad_sample", "sample_shape = [2]\non_bad_sample"),
                &[
                    "dataset.sample_shape",
                    "kind = \"synthetic\"",
                    "kind = \"tokens\"",
                ],
            ),
            (
                &NPY.replace("kind = \"npy\"", "kind = \"npy\"\nseed = 3"),
                &["dataset.seed", "kind = \"synthetic\"", "kind = \"npy\""],
            ),
            (
                &NPY.replace("kind = \"npy\"", "kind = \"npy\"\nfields = []"),
                &["dataset.fields", "kind = \"external\""],
            ),
            (
                &TOKENS.replace("shift = true", "shift = true\npath = \"x.npy\""),
                &[
                    "dataset.tokens.path",
                    "kind = \"npy\"",
                    "not of kind = \"tokens\"",
                ],
            ),
            (
                &NPY.replace("shape = [3, 4]", "shape = [3, 4]\nseq_len = 4"),
                &["dataset.npy.seq_len", "kind = \"tokens\""],
            ),
            (
                &NPY.replace("kind = \"npy\"", "kind = \"tokens\""),
                &["[dataset.npy]", "kind = \"tokens\""],
            ),
            (
                "[dataset]\nkind = \"synthetic\"\non_bad_sample = \"skip\"\n",
                &["dataset.on_bad_sample", "kind = \"synthetic\""],
            ),
            (
                "[dataset]\nkind = \"tokens\"\n",
                &["[dataset.tokens]", "files"],
            ),
            (
                &NPY.replace("shape = [3, 4]", "shape = [3, 4]\nshap = 1"),
                &["unknown key dataset.npy.shap"],
            ),
            (
                &NPY.replace("dtype = \"u8\"", "dtype = \"bf16\""),
                &["dataset.npy.dtype", "numpy"],
            ),
            (
                &TOKENS.replace("token_dtype = \"u32\"", "token_dtype = \"i64\""),
                &["dataset.tokens.token_dtype", "u16"],
            ),
            (
                &TOKENS.replace("seq_len = 8", "seq_len = 0"),
                &["dataset.tokens.seq_len"],
            ),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            for w in *want {
                assert!(e.contains(w), "{w:?} not in: {e}");
            }
        }
    }

    #[test]
    fn the_fingerprint_covers_what_decides_the_bytes() {
        let mut base = parse(TOKENS).unwrap();
        base.set_source_len(100).unwrap();
        type Edit = Box<dyn Fn(&mut Config)>;
        let tokens = |f: fn(&mut TokensDataset)| -> Edit {
            Box::new(move |c: &mut Config| f(c.dataset.tokens.as_mut().unwrap()))
        };
        let edits: Vec<Edit> = vec![
            tokens(|t| t.files.reverse()),
            tokens(|t| t.files[0] = "./a.bin".into()),
            tokens(|t| t.token_dtype = Dtype::U16),
            tokens(|t| t.seq_len = 9),
            tokens(|t| t.stride = Some(4)),
            tokens(|t| t.shift = false),
            tokens(|t| t.dtype = Dtype::I64),
            Box::new(|c| c.plan.seed = 7),
            Box::new(|c| c.dataset.samples = 101),
            Box::new(|c| c.dataset.on_bad_sample = OnBadSample::Fail),
        ];
        for (k, e) in edits.iter().enumerate() {
            let mut c = base.clone();
            e(&mut c);
            assert_ne!(c.fingerprint(), base.fingerprint(), "edit {k}");
        }
        // The stride in effect: an explicit stride equal to seq_len is the same dataset.
        let mut same = base.clone();
        same.dataset.tokens.as_mut().unwrap().stride = Some(8);
        assert_eq!(same.fingerprint(), base.fingerprint());
        let mut base = parse(NPY).unwrap();
        base.set_source_len(10).unwrap();
        let npy = |f: fn(&mut NpyDataset)| -> Edit {
            Box::new(move |c: &mut Config| f(c.dataset.npy.as_mut().unwrap()))
        };
        let edits: Vec<Edit> = vec![
            npy(|n| n.path = "x2.npy".into()),
            npy(|n| n.field = "x".into()),
            npy(|n| n.dtype = Dtype::I8),
            npy(|n| n.shape = vec![4, 3]),
            npy(|n| n.labels = None),
            npy(|n| n.labels = Some("z.npy".into())),
            npy(|n| n.labels_dtype = Dtype::I64),
            npy(|n| n.labels_shape = vec![1]),
        ];
        for (k, e) in edits.iter().enumerate() {
            let mut c = base.clone();
            e(&mut c);
            assert_ne!(c.fingerprint(), base.fingerprint(), "npy edit {k}");
        }
    }

    const WDS: &str = r#"
[dataset]
kind = "webdataset"
[dataset.webdataset]
shards = ["a.tar", "b.tar"]
"#;

    const FOLDER: &str = r#"
[dataset]
kind = "imagefolder"
[dataset.imagefolder]
root = "train"
[dataset.image]
transform = "eval"
crop = 32
resize = 40
output = "f32"
mean = [0.5, 0.5, 0.5]
"#;

    #[test]
    fn image_kinds_have_images_and_labels_from_the_image_table() {
        let w = parse(WDS).unwrap();
        assert_eq!(w.dataset.kind, DatasetKind::WebDataset);
        assert_eq!(w.dataset.webdataset.as_ref().unwrap().shuffle_buffer, 1000);
        assert_eq!(
            w.fields(),
            vec![
                Field::new(IMAGES, Dtype::U8, vec![224, 224, 3]),
                Field::new(LABELS, Dtype::I64, vec![]),
            ]
        );
        let f = parse(FOLDER).unwrap();
        assert_eq!(
            f.fields(),
            vec![
                Field::new(IMAGES, Dtype::F32, vec![3, 32, 32]),
                Field::new(LABELS, Dtype::I64, vec![]),
            ]
        );
        for c in [&w, &f] {
            let sum: u64 = c.fields().iter().map(Field::sample_bytes).sum();
            assert_eq!(c.record_bytes(), sum);
            assert_eq!(c.sample_bytes(), c.fields()[0].sample_bytes());
            assert_eq!(parse(&c.to_toml()).unwrap(), *c);
        }
        assert_eq!(
            f.dataset.imagefolder.as_ref().unwrap().extensions,
            ["jpg", "jpeg", "png"]
        );
    }

    const WDS_NPY: &str = r#"
[dataset]
kind = "webdataset"
[dataset.webdataset]
shards = ["a.tar", "b.tar"]
npy = { field = "features", dtype = "f32", shape = [16, 8] }
[dataset.image]
crop = 32
"#;

    #[test]
    fn webdataset_npy_members_are_a_declared_field_and_images_optional() {
        let c = parse(WDS_NPY).unwrap();
        let w = c.dataset.webdataset.as_ref().unwrap();
        assert!(w.images);
        assert_eq!(
            c.fields(),
            vec![
                Field::new(IMAGES, Dtype::U8, vec![32, 32, 3]),
                Field::new(LABELS, Dtype::I64, vec![]),
                Field::new("features", Dtype::F32, vec![16, 8]),
            ]
        );
        // The same as a sub-table; the field's name defaults to the extension's.
        let t = parse(&WDS_NPY.replace(
            "npy = { field = \"features\", dtype = \"f32\", shape = [16, 8] }",
            "[dataset.webdataset.npy]\ndtype = \"u8\"\nshape = []",
        ))
        .unwrap();
        assert_eq!(
            t.fields()[2],
            Field::new(WDS_NPY_DEFAULT_FIELD, Dtype::U8, vec![])
        );
        // Features-only shards: no image member, no images field, no [dataset.image].
        let n = parse(
            &WDS_NPY
                .replace("[dataset.image]\ncrop = 32\n", "")
                .replace("shards =", "images = false\nshards ="),
        )
        .unwrap();
        assert!(n.dataset.image.is_none() && !n.dataset.decodes_images());
        assert_eq!(
            n.fields(),
            vec![
                Field::new(LABELS, Dtype::I64, vec![]),
                Field::new("features", Dtype::F32, vec![16, 8]),
            ]
        );
        assert_eq!(n.first_field(), (vec![], Dtype::I64));
        for c in [&c, &t, &n] {
            let sum: u64 = c.fields().iter().map(Field::sample_bytes).sum();
            assert_eq!(c.record_bytes(), sum);
            assert_eq!(c.batch_layout().record_bytes, sum);
            assert_eq!(c.sample_bytes(), c.fields()[0].sample_bytes());
            assert_eq!(parse(&c.to_toml()).unwrap(), *c, "{}", c.to_toml());
        }
        // Without images the npy field may be called images (pre-decoded arrays).
        let i = parse(
            &WDS_NPY
                .replace("[dataset.image]\ncrop = 32\n", "")
                .replace("shards =", "images = false\nshards =")
                .replace("\"features\"", "\"images\""),
        )
        .unwrap();
        assert_eq!(i.fields()[1].name, IMAGES);
    }

    #[test]
    fn bad_webdataset_npy_keys_and_clashing_names_are_refused() {
        let npy_line = "npy = { field = \"features\", dtype = \"f32\", shape = [16, 8] }";
        let no_images = |t: &str| {
            t.replace("[dataset.image]\ncrop = 32\n", "")
                .replace("shards =", "images = false\nshards =")
        };
        for (text, needles) in [
            (
                WDS_NPY.replace("\"features\"", "\"labels\""),
                &["dataset.webdataset.npy.field", "\"labels\"", "must differ"][..],
            ),
            (
                WDS_NPY.replace("\"features\"", "\"images\""),
                &["dataset.webdataset.npy.field", "\"images\"", "must differ"],
            ),
            (
                no_images(WDS_NPY).replace("\"features\"", "\"labels\""),
                &["dataset.webdataset.npy.field", "\"labels\""],
            ),
            (
                WDS_NPY.replace("\"features\"", "\"a b\""),
                &["dataset.webdataset.npy.field", "A-Z"],
            ),
            (
                WDS_NPY.replace("\"f32\"", "\"bf16\""),
                &["dataset.webdataset.npy.dtype", "numpy"],
            ),
            (
                WDS_NPY.replace("[16, 8]", "[16, 0]"),
                &["dataset.webdataset.npy.shape", ">= 1"],
            ),
            (
                WDS_NPY.replace("[16, 8]", &format!("{:?}", [1; MAX_SAMPLE_DIMS + 1])),
                &["dataset.webdataset.npy.shape", "dimensions"],
            ),
            (
                WDS_NPY.replace(npy_line, "npy = { dtype = \"f32\" }"),
                &["[dataset.webdataset]", "shape"],
            ),
            (
                WDS_NPY.replace(
                    npy_line,
                    "npy = { path = \"x.npy\", dtype = \"f32\", shape = [2] }",
                ),
                &["[dataset.webdataset]", "path"],
            ),
            (
                WDS_NPY.replace(npy_line, "npy = \"features\""),
                &["[dataset.webdataset]"],
            ),
            (
                WDS_NPY.replace("shards =", "images = false\nshards ="),
                &["[dataset.image]", "images = false"],
            ),
            (
                WDS_NPY.replace("shards =", "images = 0\nshards ="),
                &["[dataset.webdataset]", "bool"],
            ),
            (
                TOKENS.replace("[dataset.tokens]", "[dataset.tokens]\nimages = false"),
                &["dataset.tokens.images", "[dataset.webdataset]"],
            ),
        ] {
            let e = parse(&text).unwrap_err().to_string();
            for n in needles {
                assert!(e.contains(n), "{e:?} lacks {n:?}\n{text}");
            }
        }
    }

    #[test]
    fn image_keys_of_another_transform_output_or_kind_are_refused() {
        for (text, needles) in [
            (
                FOLDER.replace("crop = 32", "crop = 32\nflip = true"),
                &["dataset.image.flip", "transform = \"train\""][..],
            ),
            (
                WDS.to_string() + "[dataset.image]\nresize = 300\n",
                &["dataset.image.resize", "transform = \"eval\""],
            ),
            (
                WDS.to_string() + "[dataset.image]\nmean = [0.5, 0.5, 0.5]\n",
                &["dataset.image.mean", "u8"],
            ),
            (
                FOLDER.replace("resize = 40", "resize = 20"),
                &["dataset.image.resize", "crop"],
            ),
            (
                FOLDER.replace("kind = \"imagefolder\"", "kind = \"npy\""),
                &["[dataset.imagefolder]", "kind = \"npy\""],
            ),
            (
                WDS.replace("shards = [", "root = \"x\"\nshards = ["),
                &["dataset.webdataset.root", "[dataset.imagefolder]"],
            ),
            (
                "[dataset]\nkind = \"imagefolder\"\n".to_string(),
                &["[dataset.imagefolder]", "root"],
            ),
            (
                WDS.replace("shards = [\"a.tar\", \"b.tar\"]", "shards = []"),
                &["dataset.webdataset.shards"],
            ),
            (
                WDS.to_string() + "[dataset.image]\nscale = [0.5, 0.2]\n",
                &["dataset.image.scale"],
            ),
        ] {
            let e = parse(&text).unwrap_err().to_string();
            for n in needles {
                assert!(e.contains(n), "{e:?} lacks {n:?}");
            }
        }
        let e = parse(&TOKENS.replace("[dataset.tokens]", "[dataset.image]\n[dataset.tokens]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[dataset.image]"), "{e}");
    }

    #[test]
    fn the_fingerprint_covers_the_image_keys() {
        type Edit = Box<dyn Fn(&mut Config)>;
        let mut base = parse(FOLDER).unwrap();
        base.set_source_len(10).unwrap();
        let image = |f: fn(&mut ImageDataset)| -> Edit {
            Box::new(move |c: &mut Config| f(c.dataset.image.as_mut().unwrap()))
        };
        let edits: Vec<Edit> = vec![
            Box::new(|c| c.dataset.imagefolder.as_mut().unwrap().root = "./train".into()),
            Box::new(|c| {
                c.dataset
                    .imagefolder
                    .as_mut()
                    .unwrap()
                    .extensions
                    .pop()
                    .map(drop)
                    .unwrap_or(())
            }),
            image(|i| i.crop = Some(31)),
            image(|i| i.resize = Some(41)),
            image(|i| i.output = ImageOutput::Bf16),
            image(|i| i.mean = Some([0.5, 0.5, 0.4])),
            image(|i| i.std = Some([0.5, 0.5, 0.4])),
            image(|i| i.reduced_decode = true),
            image(|i| i.transform = ImageTransform::Train),
            image(|i| {
                i.transform = ImageTransform::Train;
                i.flip = Some(false)
            }),
            image(|i| {
                i.transform = ImageTransform::Train;
                i.scale = Some([0.5, 1.0])
            }),
            image(|i| {
                i.transform = ImageTransform::Train;
                i.ratio = Some([0.5, 1.0])
            }),
        ];
        for (k, e) in edits.iter().enumerate() {
            let mut c = base.clone();
            e(&mut c);
            assert_ne!(c.fingerprint(), base.fingerprint(), "image edit {k}");
        }
        let mut base = parse(WDS).unwrap();
        base.set_shard_samples(&[4, 6]).unwrap();
        base.set_source_len(10).unwrap();
        let edits: Vec<Edit> = vec![
            Box::new(|c| c.dataset.webdataset.as_mut().unwrap().shards.reverse()),
            Box::new(|c| c.dataset.webdataset.as_mut().unwrap().shuffle_buffer = 7),
            // Same length, other shard sizes: another order.
            Box::new(|c| c.dataset.webdataset.as_mut().unwrap().shard_samples = vec![6, 4]),
            Box::new(|c| c.dataset.webdataset.as_mut().unwrap().shard_samples.clear()),
            // The npy members' field, each of its keys, and images = false.
            Box::new(|c| c.dataset.webdataset.as_mut().unwrap().npy = Some(wds_npy())),
            Box::new(|c| {
                c.dataset.webdataset.as_mut().unwrap().images = false;
                c.dataset.image = None;
            }),
            Box::new(|c| {
                c.dataset.kind = DatasetKind::ImageFolder;
                c.dataset.webdataset = None;
                c.dataset.imagefolder = Some(ImageFolderDataset {
                    root: "a.tar".into(),
                    extensions: vec!["b.tar".into()],
                });
            }),
        ];
        for (k, e) in edits.iter().enumerate() {
            let mut c = base.clone();
            e(&mut c);
            assert_ne!(c.fingerprint(), base.fingerprint(), "webdataset edit {k}");
        }
        let mut base = base.clone();
        base.dataset.webdataset.as_mut().unwrap().npy = Some(wds_npy());
        let npy = |f: fn(&mut WebDatasetNpy)| -> Edit {
            Box::new(move |c: &mut Config| {
                f(c.dataset.webdataset.as_mut().unwrap().npy.as_mut().unwrap())
            })
        };
        let edits: Vec<Edit> = vec![
            npy(|n| n.field = "other".into()),
            npy(|n| n.dtype = Dtype::F16),
            npy(|n| n.shape = vec![8, 16]),
            npy(|n| n.shape = vec![128]),
            Box::new(|c| {
                c.dataset.webdataset.as_mut().unwrap().images = false;
                c.dataset.image = None;
            }),
        ];
        for (k, e) in edits.iter().enumerate() {
            let mut c = base.clone();
            e(&mut c);
            c.validate().unwrap();
            assert_ne!(
                c.fingerprint(),
                base.fingerprint(),
                "webdataset npy edit {k}"
            );
        }
        let mut same = base.clone();
        same.dataset.webdataset.as_mut().unwrap().npy = Some(wds_npy());
        assert_eq!(same.fingerprint(), base.fingerprint());
    }

    fn wds_npy() -> WebDatasetNpy {
        WebDatasetNpy {
            field: "features".into(),
            dtype: Dtype::F32,
            shape: vec![16, 8],
        }
    }

    #[test]
    fn webdataset_plans_follow_the_recorded_shard_sizes() {
        let with = |extra: &str| parse(&format!("{WDS}[plan]\nbatch_size = 2\n{extra}"));
        let mut c = with("world_size = 2\nrank = 1\n").unwrap();
        assert!(c.plan().is_err(), "no plan before the shards are opened");
        assert!(c.shard_order().unwrap().shard_sizes().is_empty());
        c.set_shard_samples(&[4, 7]).unwrap();
        c.set_source_len(11).unwrap();
        let plan = c.plan().unwrap();
        assert_eq!(plan.shard_order().unwrap().shard_sizes(), [4, 7]);
        // Rank 1 has shard 1 (7 samples); rank 0 has 4: padded to the largest.
        assert_eq!((plan.samples_per_rank(), plan.batches_per_epoch()), (7, 4));
        c.plan.drop_last = true;
        let plan = c.plan().unwrap();
        assert_eq!((plan.samples_per_rank(), plan.batches_per_epoch()), (4, 2));
        // The config stored for consumers carries the sizes, so theirs is the same plan.
        let again = parse(&c.to_toml()).unwrap();
        assert_eq!(again, c);
        assert_eq!(again.fingerprint(), c.fingerprint());
        assert_eq!(again.plan().unwrap().shard_order(), plan.shard_order());
        // Recorded (or given) sizes must be the shards'.
        let e = again
            .clone()
            .set_shard_samples(&[5, 6])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dataset.webdataset.shard_samples") && e.contains("[5, 6]"),
            "{e}"
        );
        let e = parse(&WDS.replace("shards = [", "shard_samples = [3, 3, 3]\nshards = ["))
            .unwrap_err()
            .to_string();
        assert!(e.contains("one count per shard (2 shards)"), "{e}");
        let e = c.clone().set_source_len(12).unwrap_err().to_string();
        assert!(e.contains("dataset.samples"), "{e}");
        // Other kinds ignore shard sizes.
        let mut t = parse(TOKENS).unwrap();
        t.set_shard_samples(&[1, 2]).unwrap();
        assert!(t.shard_order().is_none());
    }

    #[test]
    fn webdataset_ranks_without_shards_or_samples_are_refused() {
        // Three ranks, two shards: refused from the config alone, before the shards are opened.
        let e = parse(&format!("{WDS}[plan]\nworld_size = 3\n"))
            .unwrap_err()
            .to_string();
        for needle in [
            "plan.world_size = 3",
            "2 shards",
            "at most 2 ranks",
            "at least 3 shards",
        ] {
            assert!(e.contains(needle), "{e:?} lacks {needle:?}");
        }
        // Rank 1's only shard is empty.
        let mut c = parse(&format!("{WDS}[plan]\nworld_size = 2\nbatch_size = 2\n")).unwrap();
        c.set_shard_samples(&[5, 0]).unwrap();
        let e = c.set_source_len(5).unwrap_err().to_string();
        for needle in [
            "plan.world_size",
            "rank 1 of 2",
            "no sample",
            "drop the empty shards",
        ] {
            assert!(e.contains(needle), "{e:?} lacks {needle:?}");
        }
        // drop_last with the smallest rank below one batch: no batches.
        let mut c = parse(&format!(
            "{WDS}[plan]\nworld_size = 2\nbatch_size = 4\ndrop_last = true\n"
        ))
        .unwrap();
        c.set_shard_samples(&[9, 3]).unwrap();
        let e = c.set_source_len(12).unwrap_err().to_string();
        assert!(e.contains("no batches"), "{e}");
    }

    #[test]
    fn relative_paths_are_resolved_against_the_config_files_directory() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pinring.toml");
        std::fs::write(&p, TOKENS).unwrap();
        let c = Config::load(&p).unwrap();
        assert_eq!(c.resolve_path(Path::new("a.bin")), dir.path().join("a.bin"));
        assert_eq!(
            c.resolve_path(Path::new("/data/b.bin")),
            Path::new("/data/b.bin")
        );
        let c = parse(TOKENS).unwrap();
        assert_eq!(c.resolve_path(Path::new("a.bin")), Path::new("a.bin"));
    }

    #[test]
    fn paths_made_absolute_read_the_same_files_from_anywhere() {
        // From a file: against its directory, and the TOML written out keeps them so.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pinring.toml");
        std::fs::write(&p, TOKENS).unwrap();
        let mut c = Config::load(&p).unwrap();
        c.make_paths_absolute().unwrap();
        let files = [dir.path().join("a.bin"), PathBuf::from("/data/b.bin")];
        assert_eq!(c.dataset.tokens.as_ref().unwrap().files, files);
        let again = parse(&c.to_toml()).unwrap();
        assert_eq!(again.dataset.tokens.as_ref().unwrap().files, files);
        assert_ne!(
            again.fingerprint(),
            Config::load(&p).unwrap().fingerprint(),
            "the fingerprint covers the paths as written"
        );
        // Not from a file (settings given as data): against the working directory.
        let mut c = parse(NPY).unwrap();
        c.make_paths_absolute().unwrap();
        let npy = c.dataset.npy.unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert!(
            npy.path.is_absolute() && npy.path.starts_with(&cwd),
            "{npy:?}"
        );
    }
}

mod example_file {
    /// config/pinring.toml is the documented example: it must stay the built-in default.
    #[test]
    fn the_example_config_is_the_built_in_default() {
        let file = include_str!("../../../../config/pinring.toml");
        assert_eq!(file, crate::config::DEFAULT_CONFIG_TOML);
    }
}

mod hints {
    use crate::config::*;

    fn err(text: &str) -> String {
        Config::from_toml_str(text, "t.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_numpy_or_torch_dtype_name_is_told_pinrings_name() {
        for (given, ours) in [
            ("float32", "f32"),
            ("float16", "f16"),
            ("bfloat16", "bf16"),
            ("torch.bfloat16", "bf16"),
            ("np.float64", "f64"),
            ("int64", "i64"),
            ("long", "i64"),
            ("uint8", "u8"),
            ("int32", "i32"),
            ("half", "f16"),
            ("<f4", "f32"),
        ] {
            let e = err(&format!("[dataset]\ndtype = \"{given}\"\n"));
            assert!(
                e.contains(&format!("pinring calls it \"{ours}\"")),
                "{given}: {e}"
            );
            assert!(e.contains("line 2, column 9"), "{e}");
        }
        // In every table that takes a dtype.
        let e = err(
            "[dataset]\nkind = \"npy\"\n[dataset.npy]\npath = \"x.npy\"\n\
                     dtype = \"float32\"\nshape = [2]\n",
        );
        assert!(e.contains("pinring calls it \"f32\""), "{e}");
        assert!(e.contains("line 5, column"), "{e}");
        // No guess where the libraries disagree, or for what pinring has not.
        for given in ["float", "complex64"] {
            let e = err(&format!("[dataset]\ndtype = \"{given}\"\n"));
            assert!(!e.contains("pinring calls it"), "{e}");
            assert!(e.contains("the dtypes are u8, i32"), "{e}");
        }
    }

    #[test]
    fn a_key_in_the_wrong_table_names_its_table_and_points_at_its_line() {
        let e = err(
            "# data\n[dataset]\nkind = \"tokens\"\nseq_len = 8\n[dataset.tokens]\n\
                     files = [\"a.bin\"]\nseq_len = 8\n",
        );
        assert!(e.contains("seq_len belongs in [dataset.tokens]"), "{e}");
        assert!(e.contains("line 4, column 1"), "{e}");
        let e = err("[dataset]\nbatch_size = 8\n");
        assert!(e.contains("batch_size belongs in [plan]"), "{e}");
        let e = err("batch_size = 8\n");
        assert!(e.contains("batch_size belongs in [plan]"), "{e}");
        let e = err("[plan]\n\nlease_ms = 5\n");
        assert!(
            e.contains("lease_ms belongs in [daemon]") && e.contains("line 3, column 1"),
            "{e}"
        );
        // Keys the dataset's own check refuses: at their line, not at [dataset]'s.
        let e = err(
            "[dataset]\nkind = \"tokens\"\n[dataset.tokens]\nfiles = [\"a.bin\"]\n\
                     seq_len = 8\n  crop = 3\n",
        );
        assert!(
            e.contains("crop belongs in [dataset.image]") && e.contains("line 6, column 3"),
            "{e}"
        );
        let e = err(
            "[dataset]\nkind = \"tokens\"\n\nclasses = 3\n[dataset.tokens]\n\
                     files = [\"a.bin\"]\nseq_len = 8\n",
        );
        assert!(
            e.contains("dataset.classes") && e.contains("line 4, column 1"),
            "{e}"
        );
        let e = err(
            "[dataset]\nkind = \"tokens\"\n[dataset.tokens]\nfiles = \"a.bin\"\n\
                     seq_len = 8\n",
        );
        assert!(e.contains("line 4, column 1"), "{e}");
        let e = err(
            "[dataset]\nkind = \"tokens\"\n[dataset.tokens]\nfiles = [\"a\"]\n\
                     seq_len = 8\nbatch = 3\n",
        );
        assert!(
            e.contains("unknown key dataset.tokens.batch") && e.contains("line 6, column 1"),
            "{e}"
        );
        // Given as data (Python): the same words, no marks left in them.
        let mut de = serde_json::Deserializer::from_str(
            r#"{"dataset": {"kind": "tokens", "tokens": {"files": ["a"], "seq_len": 8, "crop": 3}}}"#,
        );
        let e = Config::from_settings(&mut de, "data")
            .unwrap_err()
            .to_string();
        assert!(e.contains("crop belongs in [dataset.image]"), "{e}");
        assert!(!e.contains('\u{1}'), "{e:?}");
    }

    #[test]
    fn one_shard_string_is_a_list_of_one_and_globs_are_counted_when_expanded() {
        let c = Config::from_toml_str(
            "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = \"a.tar\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            c.dataset.webdataset.as_ref().unwrap().shards,
            [PathBuf::from("a.tar")]
        );
        assert!(
            c.to_toml().contains("shards = [\"a.tar\"]"),
            "{}",
            c.to_toml()
        );
        // Two ranks, one glob: the count is the expansion's, refused only after it.
        let text = "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\n\
                    shards = \"train-*.tar\"\n[plan]\nworld_size = 2\n";
        let mut c = Config::from_toml_str(text, "t").unwrap();
        assert!(c.set_shards(vec!["train-0.tar".into()]).is_err());
        c.set_shards(vec!["train-0.tar".into(), "train-1.tar".into()])
            .unwrap();
        let e = err("[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = 3\n");
        assert!(e.contains("a list of shard paths"), "{e}");
    }

    #[test]
    fn the_expanded_shards_are_what_the_fingerprint_covers() {
        struct Expanded(Vec<PathBuf>);
        impl crate::DatasetOpener for Expanded {
            fn open(&self, _: &Config) -> Result<Option<crate::OpenedDataset>, ConfigError> {
                Ok(Some(crate::OpenedDataset {
                    len: self.0.len() as u64,
                    shard_sizes: Some(vec![1; self.0.len()]),
                    shards: Some(self.0.clone()),
                }))
            }
        }
        let c = Config::from_toml_str(
            "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = \"s-*.tar\"\n\
             [plan]\nbatch_size = 1\n",
            "t",
        )
        .unwrap();
        let two = vec![PathBuf::from("s-0.tar"), PathBuf::from("s-1.tar")];
        let resolve = |c: &Config, opener: &Expanded| {
            crate::Spec::resolve(
                c.clone(),
                &crate::Overrides::default(),
                &crate::HostFacts::default(),
                opener,
            )
        };
        let a = resolve(&c, &Expanded(two.clone())).unwrap();
        assert_eq!(a.config().dataset.webdataset.as_ref().unwrap().shards, two);
        let other = vec![PathBuf::from("s-0.tar"), PathBuf::from("s-2.tar")];
        let b = resolve(&c, &Expanded(other)).unwrap();
        assert_ne!(a.config().fingerprint(), b.config().fingerprint());
        // The same shards named one by one: the same fingerprint as the glob's.
        let named = Config::from_toml_str(
            "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\n\
             shards = [\"s-0.tar\", \"s-1.tar\"]\n[plan]\nbatch_size = 1\n",
            "t",
        )
        .unwrap();
        let named = resolve(&named, &Expanded(two)).unwrap();
        assert_eq!(named.config().fingerprint(), a.config().fingerprint());
    }

    #[test]
    fn a_file_that_sets_nothing_says_so() {
        for text in ["", "# nothing\n\n", "[plan]\n# batch_size = 4\n[dataset]\n"] {
            let c = Config::from_toml_str(text, "empty.toml").unwrap();
            assert!(c.sets_nothing, "{text:?}");
            let w = c.sets_nothing_warning().unwrap();
            assert!(w.contains("empty.toml") && w.contains("default"), "{w}");
        }
        for text in ["[plan]\nbatch_size = 4\n", DEFAULT_CONFIG_TOML] {
            let c = Config::from_toml_str(text, "t").unwrap();
            assert!(!c.sets_nothing && c.sets_nothing_warning().is_none());
        }
        assert!(!Config::default().sets_nothing);
    }

    #[test]
    fn a_config_loaded_by_a_relative_name_resolves_against_an_absolute_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.toml"), "").unwrap();
        let c = Config::load(dir.path().join("p.toml")).unwrap();
        assert_eq!(c.base_dir.as_deref(), Some(dir.path()));
        assert!(c
            .paths_relative_to()
            .contains(&dir.path().display().to_string()));
        let cwd = std::env::current_dir().unwrap();
        let rel = dir.path().join("p.toml");
        if let Ok(rel) = rel.strip_prefix(&cwd) {
            let c = Config::load(rel).unwrap();
            assert!(c.base_dir.unwrap().is_absolute());
        }
    }
}
