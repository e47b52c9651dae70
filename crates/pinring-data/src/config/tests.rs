//! Tests of the settings: parsing, defaults, checks, geometry and "auto".

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_str(text, "test.toml")
}

#[test]
fn default_toml_equals_default() {
    let c = parse(DEFAULT_CONFIG_TOML).unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.source, "test.toml");
    Config::default().validate().unwrap();
    assert_eq!(parse("").unwrap(), Config::default());
}

#[test]
fn to_toml_roundtrips() {
    let mut c = Config::default();
    c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(64 << 20));
    c.ring.mode = SegmentMode::Group;
    assert_eq!(parse(&c.to_toml()).unwrap(), c);
    assert_eq!(
        parse(&Config::default().to_toml()).unwrap(),
        Config::default()
    );
}

#[test]
fn derived_sizes() {
    let c = Config::default();
    assert_eq!(c.sample_bytes(), 128 * 128 * 4);
    assert_eq!(
        c.record_bytes(),
        128 * 128 * 4 + 8,
        "images and an i64 label"
    );
    assert_eq!(c.batch_payload_bytes_max(), 32 * (128 * 128 * 4 + 8));
    assert_eq!(c.meta_reserve_bytes() % META_RESERVE_ALIGN, 0);
    assert!(c.meta_reserve_bytes() >= max_encoded_len(32, 2));
    assert_eq!(c.slot_bytes() % SLOT_ALIGN, 0);
    assert!(c.slot_bytes() >= c.batch_payload_bytes_max() + c.meta_reserve_bytes());
    assert_eq!(c.slot_bytes(), (2 << 20) + 4096);
    assert_eq!(c.ring_bytes(), 16 * c.slot_bytes());
    assert_eq!(c.segment_path(), "/dev/shm/pinring.default");
}

#[test]
fn fields_record_and_batch_layout() {
    let c = Config::default();
    let fields = c.fields();
    let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, [IMAGES, LABELS]);
    assert_eq!(fields[0], Field::new(IMAGES, Dtype::F32, vec![128, 128]));
    assert_eq!(fields[1], Field::new(LABELS, Dtype::I64, vec![]));
    for shape in [vec![3, 5], vec![7], vec![128, 128], vec![]] {
        for dtype in Dtype::ALL {
            let mut c = Config::default();
            c.dataset.sample_shape = shape.clone();
            c.dataset.dtype = dtype;
            let sum: u64 = c.fields().iter().map(Field::sample_bytes).sum();
            assert_eq!(c.record_bytes(), sum, "{shape:?} {dtype}");
            assert_eq!(c.batch_layout().record_bytes, sum);
        }
    }
    // 32 x 128 x 128 f32 images (2 MiB), then 32 i64 labels.
    let l = c.batch_layout();
    assert_eq!(l.batch_size, 32);
    assert_eq!(l.fields[0].shape, vec![32, 128, 128]);
    assert_eq!((l.fields[0].offset, l.fields[0].bytes), (0, 2 << 20));
    assert_eq!(l.fields[1].shape, vec![32]);
    assert_eq!((l.fields[1].offset, l.fields[1].bytes), (2 << 20, 256));
    assert_eq!(l.total_bytes, (2 << 20) + 256);
}

#[test]
fn unknown_keys_are_errors_with_file_and_key() {
    let e = parse("[ring]\nnmae = \"x\"\n").unwrap_err().to_string();
    assert!(
        e.contains("test.toml") && e.contains("nmae") && e.contains("line 2"),
        "{e}"
    );
    let e = parse("[rnig]\n").unwrap_err().to_string();
    assert!(e.contains("rnig"), "{e}");
    let e = parse("[plan]\nbatch_size = \"big\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch_size"), "{e}");
}

#[test]
fn parses_values() {
    let c = parse(
        "[ring]\nslot_bytes = \"16MiB\"\nmode = \"0660\"\nname = \"a_b-1\"\n\
         [dataset]\ndtype = \"bf16\"\nsample_shape = [3, 224, 224]\n",
    )
    .unwrap();
    assert_eq!(c.ring.slot_bytes, SlotBytes::Fixed(ByteSize(16 << 20)));
    assert_eq!(c.ring.mode.bits(), 0o660);
    assert_eq!(c.dataset.dtype, Dtype::Bf16);
    assert_eq!(c.sample_bytes(), 3 * 224 * 224 * 2);
    let c = parse("[ring]\nslot_bytes = 16777216\n").unwrap();
    assert_eq!(c.slot_bytes(), 16 << 20);
    let e = parse("[ring]\nmode = \"0777\"\n").unwrap_err().to_string();
    assert!(e.contains("0600") && e.contains("0660"), "{e}");
    let e = parse("[dataset]\ndtype = \"f8\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("f8"), "{e}");
    let e = parse("[dataset]\nkind = \"imagenet\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("synthetic"), "{e}");
}

fn invalid_key(c: &Config) -> &'static str {
    match c.validate() {
        Err(ConfigError::Invalid { key, .. }) => key,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn validation_names_keys() {
    let base = Config::default();
    let mut c = base.clone();
    c.ring.name = "bad/name".into();
    assert_eq!(invalid_key(&c), "ring.name");
    c.ring.name = "x".repeat(65);
    assert_eq!(invalid_key(&c), "ring.name");
    c.ring.name = String::new();
    assert_eq!(invalid_key(&c), "ring.name");
    let mut c = base.clone();
    c.ring.slots = Some(1);
    assert_eq!(invalid_key(&c), "ring.slots");
    c.ring.slots = Some(4097);
    assert_eq!(invalid_key(&c), "ring.slots");
    let mut c = base.clone();
    c.dataset.samples = 0;
    assert_eq!(invalid_key(&c), "dataset.samples");
    let mut c = base.clone();
    c.dataset.sample_shape = vec![0, 3];
    assert_eq!(invalid_key(&c), "dataset.sample_shape");
    c.dataset.sample_shape = vec![1 << 20, 1 << 10];
    assert_eq!(invalid_key(&c), "dataset.sample_shape");
    let mut c = base.clone();
    c.dataset.classes = 0;
    assert_eq!(invalid_key(&c), "dataset.classes");
    let mut c = base.clone();
    c.plan.batch_size = 0;
    assert_eq!(invalid_key(&c), "plan.batch_size");
    let mut c = base.clone();
    c.plan.epochs = 0;
    assert_eq!(invalid_key(&c), "plan.epochs");
    let mut c = base.clone();
    c.plan.world_size = 0;
    assert_eq!(invalid_key(&c), "plan.world_size");
    let mut c = base.clone();
    c.plan.rank = 1;
    assert_eq!(invalid_key(&c), "plan.rank");
    let msg = c.validate().unwrap_err().to_string();
    assert!(
        msg.contains("<built-in defaults>") && msg.contains("world_size"),
        "{msg}"
    );
    let mut c = base.clone();
    c.plan.drop_last = true;
    c.plan.batch_size = 20_000;
    assert_eq!(invalid_key(&c), "plan.batch_size");
}

#[test]
fn daemon_section_and_group() {
    let c = parse(
        "[ring]\nmode = \"0660\"\ngroup = \"video\"\n\
         [daemon]\nlease_ms = 500\nreap_interval_ms = 50\non_bad_batch = \"skip\"\n",
    )
    .unwrap();
    assert_eq!(c.ring.group.as_deref(), Some("video"));
    assert_eq!(c.daemon.lease_ms, 500);
    assert_eq!(c.daemon.reap_interval_ms, 50);
    assert_eq!(c.daemon.on_bad_batch, BadBatchPolicy::Skip);
    assert_eq!(parse(&c.to_toml()).unwrap(), c);
    // Not part of the fingerprint: they do not change batch contents.
    assert_eq!(c.fingerprint(), Config::default().fingerprint());
    let e = parse("[ring]\ngroup = \"video\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("ring.group") && e.contains("0660"), "{e}");
    let e = parse("[ring]\nmode = \"0660\"\ngroup = \"a b\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("ring.group"), "{e}");
    let e = parse("[daemon]\nlease_ms = 1\n").unwrap_err().to_string();
    assert!(e.contains("daemon.lease_ms"), "{e}");
    let e = parse("[daemon]\nreap_interval_ms = 5000\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("daemon.reap_interval_ms") && e.contains("1000"),
        "{e}"
    );
    let e = parse("[daemon]\non_bad_batch = \"ignore\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("on_bad_batch"), "{e}");
}

#[test]
fn explicit_slot_smaller_than_a_batch_cuts_parts_and_smaller_than_a_sample_cuts_bytes() {
    let mut c = Config::default();
    // Smaller than a batch: parts.
    c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(1 << 20));
    c.validate().unwrap();
    assert_eq!(c.parts_per_batch(), 3);
    assert_eq!(c.part_layout().cut, None);
    // Smaller than one sample (64 KiB of images) with its metadata: byte parts of the most
    // whole pages of images that fit with the label and the metadata, 2 per sample.
    c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(64 << 10));
    c.validate().unwrap();
    let l = c.part_layout();
    let cut = l.cut.unwrap();
    assert_eq!((cut.field_bytes, cut.chunk_bytes), (64 << 10, 60 << 10));
    assert_eq!((l.samples_per_part, l.parts_per_batch), (1, 64));
    assert!(c.cut_need(cut.chunk_bytes, 8) <= 64 << 10);
    assert!(c.cut_need(cut.chunk_bytes + SLOT_ALIGN, 8) > 64 << 10);
    assert_eq!(c.part_payload_bytes_max(), (60 << 10) + 8);
    let smallest = round_up(c.part_need(1), SLOT_ALIGN);
    c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(smallest));
    c.validate().unwrap();
    assert_eq!(c.slot_bytes(), smallest);
    assert_eq!(c.parts_per_batch(), 32);
    assert_eq!(c.part_layout().cut, None);
    // A slot too small for a byte part beside the other fields and the metadata (an npy
    // sample whose labels field is 64 KiB beside 100 KiB of data): refused, with the fix.
    let dir = tempfile::tempdir().unwrap();
    let mut c = npy_config(&dir, &[25600], &[16384]);
    c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(64 << 10));
    let e = c.validate().unwrap_err().to_string();
    let least = round_up(c.cut_need(8, 64 << 10), SLOT_ALIGN);
    assert!(
        e.contains("ring.slot_bytes")
            && e.contains("too small")
            && e.contains("byte parts")
            && e.contains(&format!("at least {least}")),
        "{e}"
    );
    c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(least));
    c.validate().unwrap();
    assert!(c.part_layout().cut.unwrap().chunk_bytes >= 8);
}

/// An npy config (not opened: 10 samples declared) whose data field is `shape` of f32 and
/// whose labels are `labels_shape` of f32.
fn npy_config(dir: &tempfile::TempDir, shape: &[u32], labels_shape: &[u32]) -> Config {
    let text = format!(
        "[dataset]\nkind = \"npy\"\nsamples = 10\n[dataset.npy]\npath = \"{}\"\n\
         field = \"data\"\ndtype = \"f32\"\nshape = {shape:?}\nlabels = \"{}\"\n\
         labels_dtype = \"f32\"\nlabels_shape = {labels_shape:?}\n[plan]\nbatch_size = 2\n",
        dir.path().join("x.npy").display(),
        dir.path().join("y.npy").display(),
    );
    Config::from_toml_str(&text, "t").unwrap()
}

#[test]
fn the_parts_are_described_in_words() {
    assert_eq!(
        sized(32, MIB as u32).parts_described(),
        "8 part(s) of up to 4 samples per batch"
    );
    assert_eq!(
        sized(2, 24 * MIB as u32).parts_described(),
        "12 byte parts per batch (6 per sample, 4194304 bytes of its largest field each)"
    );
}

#[test]
fn a_producer_of_whole_samples_is_refused_with_the_sizes_and_the_fix() {
    let c = sized(1, 24 * MIB as u32);
    let e = c
        .whole_samples_only("pinring.Producer")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pinring.Producer writes whole samples")
            && e.contains(&format!("one sample of {} bytes", 24 * MIB + 8))
            && e.contains(&format!("{} bytes of its largest field", 4 * MIB))
            && e.contains("6 byte parts")
            && e.contains("smaller samples")
            && e.contains(&format!(
                "at least {}",
                round_up(c.part_need(1), SLOT_ALIGN)
            )),
        "{e}"
    );
    sized(32, MIB as u32)
        .whole_samples_only("pinring.Producer")
        .unwrap();
}

#[test]
fn a_kind_that_cannot_cut_a_sample_keeps_whole_samples_and_refuses_a_smaller_slot() {
    // kind = "external" (Python producers write whole samples): a 24 MiB sample with
    // "auto" is one sample per part in a slot of its own size, as before byte parts.
    let text = "[dataset]\nkind = \"external\"\nfields = [{ name = \"images\", dtype = \"u8\", \
                shape = [25165824] }, { name = \"labels\", dtype = \"i64\" }]\n\
                [plan]\nbatch_size = 2\n";
    let c = Config::from_toml_str(text, "t").unwrap();
    let l = c.part_layout();
    assert_eq!((l.samples_per_part, l.parts_per_batch, l.cut), (1, 2, None));
    assert!(l.slot_bytes > 24 * MIB);
    // An explicit slot smaller than one sample: refused, naming the sample's size, what the
    // slot must hold, and the fixes.
    let text = format!("{text}[ring]\nslot_bytes = \"4MiB\"\n");
    let e = Config::from_toml_str(&text, "t").unwrap_err().to_string();
    let one = c.part_need(1);
    assert!(
        e.contains("ring.slot_bytes")
            && e.contains("too small")
            && e.contains(&format!("one sample of {} bytes", 24 * MIB + 8))
            && e.contains(&one.to_string())
            && e.contains("kind = \"external\" cannot make part of a sample")
            && e.contains(&format!("at least {}", round_up(one, SLOT_ALIGN)))
            && e.contains("smaller samples"),
        "{e}"
    );
    // A sample no slot holds: only smaller samples help.
    let text = "[dataset]\nkind = \"external\"\nfields = [{ name = \"images\", dtype = \"u8\", \
                shape = [1073741824] }]\n";
    let e = Config::from_toml_str(text, "t").unwrap_err().to_string();
    assert!(
        e.contains("dataset.fields = 1073741824 bytes a sample")
            && e.contains("more than the largest slot")
            && e.contains("cannot make part of a sample")
            && e.contains("use smaller samples"),
        "{e}"
    );
}

#[test]
fn an_unaligned_slot_size_names_the_aligned_sizes_around_it() {
    let e = parse("[ring]\nslot_bytes = 3000000\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ring.slot_bytes = 3000000")
            && e.contains("not a multiple of 4096")
            && e.contains("use 2998272 or 3002368"),
        "{e}"
    );
    // Rounding down would be too small for one sample: only the size above is offered.
    let one = Config::default().part_need(1);
    let e = parse(&format!("[ring]\nslot_bytes = {}\n", one + 1))
        .unwrap_err()
        .to_string();
    let up = round_up(one + 1, SLOT_ALIGN);
    assert!(e.contains(&format!("use {up}, or")), "{e}");
    parse(&format!("[ring]\nslot_bytes = {up}\n")).unwrap();
}

#[test]
fn a_slot_over_the_largest_is_refused_with_the_limit() {
    let e = parse("[ring]\nslot_bytes = \"2GiB\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ring.slot_bytes = 2147483648")
            && e.contains("more than the largest slot")
            && e.contains(&MAX_SLOT_BYTES.to_string()),
        "{e}"
    );
    parse("[ring]\nslot_bytes = \"1GiB\"\n").unwrap();
}

#[test]
fn a_batch_larger_than_the_largest_slot_is_cut_into_parts() {
    // 100000 samples of 64 KiB: a 6.5 GB batch, in parts no larger than the largest slot.
    let c = parse("[plan]\nbatch_size = 100000\n").unwrap();
    assert!(c.parts_per_batch() > 1);
    assert!(c.slot_bytes() <= MAX_SLOT_BYTES);
    // Also with an explicit slot size.
    let c = parse("[ring]\nslot_bytes = \"1GiB\"\n[plan]\nbatch_size = 100000\n").unwrap();
    assert_eq!(c.slot_bytes(), MAX_SLOT_BYTES);
    assert!(c.parts_per_batch() > 1);
    // One sample that no slot holds (1 GiB): cut into 256 byte parts of 4 MiB, in slots of
    // 4 MiB + 4 KiB.
    let c = parse(
        "[dataset]\nsample_shape = [1073741824]\ndtype = \"u8\"\nsamples = 4\n\
         [plan]\nbatch_size = 1\n",
    )
    .unwrap();
    let l = c.part_layout();
    let cut = l.cut.unwrap();
    assert_eq!((cut.field_bytes, cut.chunk_bytes), (1 << 30, 4 * MIB));
    assert_eq!((l.samples_per_part, l.parts_per_batch), (1, 256));
    assert_eq!(l.slot_bytes, 4 * MIB + 4096);
    assert_eq!(c.plan().unwrap().total_seqs(), 256 * 4 * 2);
}

#[test]
fn the_slot_limits_are_the_segment_layouts() {
    assert_eq!(SLOT_ALIGN, pinring_ring::layout::SLOT_ALIGN as u64);
    assert_eq!(MAX_SLOT_BYTES, pinring_ring::layout::MAX_SLOT_BYTES);
    assert_eq!(MAX_SLOTS, pinring_ring::layout::MAX_SLOTS);
    let mut c = Config::default();
    c.ring.slots = Some(MAX_SLOTS);
    c.validate().unwrap();
    c.ring.slots = Some(MAX_SLOTS + 1);
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("ring.slots") && e.contains(&MAX_SLOTS.to_string()),
        "{e}"
    );
}

fn layout(c: &Config) -> (u32, u32, u64) {
    let l = c.part_layout();
    (l.samples_per_part, l.parts_per_batch, l.slot_bytes)
}

#[test]
fn a_batch_that_fits_a_slot_is_one_part() {
    let c = Config::default();
    assert_eq!(layout(&c), (32, 1, (2 << 20) + 4096));
    assert_eq!(c.plan_params().samples_per_part, 32);
    assert_eq!(c.meta_reserve_bytes(), round_up(max_encoded_len(32, 2), 64));
    let mut c = Config::default();
    c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(16 << 20));
    assert_eq!(layout(&c), (32, 1, 16 << 20));
}

#[test]
fn a_small_explicit_slot_cuts_the_batch_into_even_parts() {
    // 32 samples of 64 KiB (+ 8 bytes of label); a 1 MiB slot holds 15 with their metadata:
    // 3 parts of 11.
    let mut c = Config::default();
    c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(1 << 20));
    assert_eq!(c.max_samples_in(1 << 20), 15);
    assert_eq!(layout(&c), (11, 3, 1 << 20));
    assert_eq!(c.part_payload_bytes_max(), 11 * (65536 + 8));
    assert_eq!(c.meta_reserve_bytes(), round_up(max_encoded_len(11, 2), 64));
    assert!(c.part_need(11) <= 1 << 20);
    // Exactly one sample per slot.
    c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(65536 + 4096));
    assert_eq!(layout(&c), (1, 32, 65536 + 4096));
}

#[test]
fn auto_cuts_a_batch_over_4_mib_into_parts_of_at_most_4_mib_of_images() {
    // 100000 samples of 64 KiB images and an 8-byte label: 64 samples at most per part (their
    // images are 4 MiB; the labels ride along).
    let mut c = Config::default();
    c.plan.batch_size = 100_000;
    let (spp, parts, slot) = layout(&c);
    assert_eq!(parts, 100_000u32.div_ceil(64));
    assert_eq!(spp, 100_000u32.div_ceil(parts));
    assert!(u64::from(spp) * c.sample_bytes() <= AUTO_PART_PAYLOAD_BYTES);
    assert!(slot % SLOT_ALIGN == 0);
    assert_eq!(slot, round_up(c.part_need(spp), SLOT_ALIGN));
    assert!(u64::from(spp) * u64::from(parts) >= 100_000);
}

/// A config of `batch` samples of `sample` bytes (u8).
fn sized(batch: u32, sample: u32) -> Config {
    let mut c = Config::default();
    c.dataset.sample_shape = vec![sample];
    c.dataset.dtype = Dtype::U8;
    c.plan.batch_size = batch;
    c.validate().unwrap();
    c
}

const MIB: u64 = 1 << 20;

#[test]
fn auto_puts_a_small_batch_whole_in_one_slot() {
    // The default: 32 x 64 KiB = 2 MiB; a 300 MiB cache aims at a 128 MiB ring.
    let c = Config::default();
    let a = c.auto_ring(Some(300 * MIB));
    assert_eq!(a.slot_bytes, 2 * MIB + 4096);
    assert_eq!(c.parts_per_batch(), 1);
    assert_eq!(a.target_bytes, 128 * MIB);
    assert_eq!(a.slots, 64, "128 MiB / (2 MiB + 4 KiB), rounded");
    // 4 MiB of images (and 32 bytes of labels) is still one part.
    let c = sized(4, MIB as u32);
    assert_eq!(c.batch_payload_bytes_max(), 4 * MIB + 32);
    assert_eq!(layout(&c), (4, 1, 4 * MIB + 4096));
    // One byte more a sample is two parts.
    let c2 = sized(4, MIB as u32 + 1);
    assert_eq!(layout(&c2), (2, 2, 2 * MIB + 4096));
    // A small cache: target cache / 2, and never fewer than 16 slots.
    let a = c.auto_ring(Some(32 * MIB));
    assert_eq!((a.target_bytes, a.slots), (16 * MIB, AUTO_MIN_SLOTS));
}

#[test]
fn auto_cuts_the_seed_workload_into_8_parts_of_4_samples() {
    // 32 MiB batches of 32 x 1 MiB samples on a host with a 300 MiB L3: four samples' images
    // are 4 MiB, and their labels ride along in the same slot.
    let mut c = sized(32, MIB as u32);
    let a = c.auto_ring(Some(300 * MIB));
    assert_eq!(layout(&c), (4, 8, 4 * MIB + 4096));
    assert_eq!(a.slot_bytes, 4 * MIB + 4096);
    assert_eq!(a.slots, 32, "128 MiB / (4 MiB + 4 KiB), rounded");
    assert_eq!(a.target_bytes, 128 * MIB);
    let fp = c.fingerprint();
    let r = c.resolve_auto(Some(300 * MIB));
    assert_eq!(r, a);
    assert_eq!(
        c.ring.slot_bytes,
        SlotBytes::Fixed(ByteSize(4 * MIB + 4096))
    );
    assert_eq!(c.ring.slots, Some(32));
    assert_eq!(layout(&c), (4, 8, 4 * MIB + 4096));
    assert_eq!(c.fingerprint(), fp, "resolving keeps the fingerprint");
    c.validate().unwrap();
    assert!(c.ring_bytes() <= 150 * MIB);
}

#[test]
fn auto_with_an_unknown_cache_aims_at_32_mib() {
    let c = sized(32, MIB as u32 - 8);
    let a = c.auto_ring(None);
    assert_eq!(a.target_bytes, AUTO_RING_FALLBACK_BYTES);
    assert_eq!(a.slot_bytes, 4 * MIB + 4096);
    assert_eq!(a.slots, AUTO_MIN_SLOTS, "32 MiB / 4 MiB is 8, at least 16");
    let c = sized(4, 64 << 10);
    let a = c.auto_ring(None);
    assert_eq!(a.slot_bytes, 256 * 1024 + 4096);
    assert_eq!(a.slots, 126, "32 MiB / 260 KiB, rounded");
    // A huge cache stops at 128 MiB; tiny slots stop at the most slots.
    let c = sized(1, 1);
    assert_eq!(c.auto_ring(Some(1 << 40)).slots, MAX_SLOTS);
}

#[test]
fn auto_keeps_explicit_values() {
    // An explicit slot count is kept.
    let mut c = sized(32, MIB as u32 - 8);
    c.ring.slots = Some(6);
    let a = c.resolve_auto(Some(300 * MIB));
    assert_eq!((a.slots, a.slot_bytes), (6, 4 * MIB + 4096));
    // An explicit slot size keeps its own layout; its unset count is auto's for its size.
    let mut c = sized(32, MIB as u32);
    c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(16 * MIB));
    let before = (layout(&c), c.fingerprint());
    let a = c.resolve_auto(Some(300 * MIB));
    assert_eq!((a.slots, a.slot_bytes), (DEFAULT_SLOTS, 16 * MIB));
    assert_eq!((layout(&c), c.fingerprint()), before);
    assert_eq!(layout(&c), (11, 3, 16 * MIB));
    // A small explicit slot gets the ring "auto" would give for the cache, not 16 slots.
    for (cache, slots) in [(300 * MIB, 512), (16 * MIB, 32), (MIB, AUTO_MIN_SLOTS)] {
        let mut c = sized(4, 60_000);
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(256 << 10));
        let a = c.resolve_auto(Some(cache));
        assert_eq!(
            (a.slots, a.slot_bytes, a.slot_bytes_auto),
            (slots, 256 << 10, false)
        );
        assert_eq!(c.ring.slots, Some(slots));
    }
    // A sample over 4 MiB: byte parts of 4 MiB, 2 per sample, the second 1 MiB.
    let c = sized(4, 5 * MIB as u32);
    assert_eq!(layout(&c), (1, 8, 4 * MIB + 4096));
    let cut = c.part_layout().cut.unwrap();
    assert_eq!((cut.chunk_bytes, cut.range(1).len), (4 * MIB, MIB));
    // Just over 4 MiB, a whole sample still fits the slot of a 4 MiB byte part: whole.
    let c = sized(4, 4 * MIB as u32 + 64);
    assert_eq!(layout(&c), (1, 4, 4 * MIB + 4096));
    assert_eq!(c.part_layout().cut, None);
}

#[test]
fn the_default_ring_fits_half_a_small_cache_in_smaller_parts() {
    let default = Config::default();
    // 64 KiB samples, 32 a batch: the most whole samples that fit the cap, evened out.
    for (cache, samples, parts) in [
        (300 * MIB, 32, 1),
        (32 * MIB, 11, 3),
        (16 * MIB, 7, 5),
        // 256 KiB parts at the least: a 4 MiB ring is over half a 4 MiB cache.
        (4 * MIB, 3, 11),
    ] {
        let mut c = default.clone();
        let a = c.resolve_auto(Some(cache));
        assert_eq!(
            (layout(&c).0, layout(&c).1),
            (samples, parts),
            "cache {cache}"
        );
        assert!(a.slots >= AUTO_MIN_SLOTS);
        if cache >= 16 * MIB {
            assert!(c.ring_bytes() <= cache / 2, "cache {cache}");
        }
        c.validate().unwrap();
    }
    // An unknown cache keeps the usual slot (the fallback's 32 MiB holds 16 of them).
    let a = default.auto_ring(None);
    assert_eq!((a.slot_bytes, a.slots), (2 * MIB + 4096, 16));
}

#[test]
fn a_loader_adopting_the_resolved_slot_size_gets_the_same_layout_and_fingerprint() {
    // The daemon resolves; a loader with "auto" adopts the ring's slot size and count.
    for (batch, sample) in [
        (32, 1 << 20),
        (32, 65536),
        (1000, 100_000),
        (100_000, 100),
        (7, 3 << 20),
        (100, (1 << 20) - 100),
        (300, 12_345),
        (4096, 4097),
        (4, 5 << 20),
        (1, 24 << 20),
        (3, (4 << 20) + 64),
        (2, (4 << 20) + 4000),
        (1, 1 << 30),
    ] {
        // A large cache keeps the usual parts; small ones may cut smaller parts.
        for cache in [300 * MIB, 16 * MIB, 4 * MIB] {
            let mut daemon = sized(batch, sample);
            let loader = daemon.clone();
            daemon.resolve_auto(Some(cache));
            let mut adopted = loader.clone();
            assert!(adopted.adopt_slot_bytes(daemon.slot_bytes(), daemon.slots()));
            assert_eq!(layout(&adopted), layout(&daemon), "{batch} x {sample}");
            if cache == 300 * MIB {
                assert_eq!(layout(&adopted), layout(&loader), "{batch} x {sample}");
            }
            assert_eq!(adopted.fingerprint(), daemon.fingerprint());
            assert_eq!(adopted.slots(), daemon.slots());
            adopted.validate().unwrap();
        }
    }
    // An explicit slot size is not replaced: a different one is a fingerprint mismatch.
    let mut c = sized(32, MIB as u32);
    c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(8 * MIB));
    assert!(!c.adopt_slot_bytes(4 * MIB + 4096, 32));
    assert_ne!(c.fingerprint(), sized(32, MIB as u32).fingerprint());
}

#[test]
fn the_fingerprint_covers_the_part_layout() {
    let a = Config::default();
    let mut b = Config::default();
    b.ring.slot_bytes = SlotBytes::Fixed(ByteSize(1 << 20));
    assert_ne!(a.fingerprint(), b.fingerprint());
    // Samples per part, the byte part size (none), then the (empty) list of declared fields.
    let bytes = b.fingerprint_bytes();
    let n = bytes.len();
    assert_eq!(bytes[n - 16..n - 12], 11u32.to_le_bytes());
    assert_eq!(bytes[n - 12..n - 4], 0u64.to_le_bytes());
    assert_eq!(bytes[n - 4..], 0u32.to_le_bytes());
    // Byte parts of another size are another layout.
    let mut c = sized(1, 24 * MIB as u32);
    let auto = c.fingerprint();
    let bytes = c.fingerprint_bytes();
    let n = bytes.len();
    assert_eq!(bytes[n - 12..n - 4], (4 * MIB).to_le_bytes());
    c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(2 * MIB));
    assert_ne!(c.fingerprint(), auto);
}

#[test]
fn load_from_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pinring.toml");
    std::fs::write(&p, "[plan]\nepochs = 5\n").unwrap();
    let c = Config::load(&p).unwrap();
    assert_eq!(c.plan.epochs, 5);
    assert_eq!(c.source, p.display().to_string());
    std::fs::write(&p, "[plan]\nrank = 3\n").unwrap();
    let e = Config::load(&p).unwrap_err().to_string();
    assert!(e.contains("pinring.toml") && e.contains("plan.rank"), "{e}");
    let missing = dir.path().join("nope.toml");
    let e = Config::load(&missing).unwrap_err().to_string();
    assert!(e.contains("nope.toml"), "{e}");
}

const EXTERNAL: &str = r#"
[dataset]
kind = "external"
samples = 100
fields = [
  { name = "x", dtype = "u8", shape = [3, 4] },
  { name = "y", dtype = "bool" },
  { name = "z", dtype = "f64", shape = [2] },
]
"#;

#[test]
fn external_samples_have_the_fields_they_declare() {
    let c = Config::from_toml_str(EXTERNAL, "t").unwrap();
    assert_eq!(c.dataset.kind, DatasetKind::External);
    let names: Vec<String> = c.fields().into_iter().map(|f| f.name).collect();
    assert_eq!(names, ["x", "y", "z"]);
    assert_eq!(c.fields()[1], Field::new("y", Dtype::Bool, vec![]));
    assert_eq!(c.record_bytes(), 12 + 1 + 16);
    assert_eq!(c.sample_bytes(), 12);
    assert_eq!(c.first_field(), (vec![3, 4], Dtype::U8));
    // The fields survive the round trip through TOML (the ring stores its config so).
    let again = Config::from_toml_str(&c.to_toml(), "t2").unwrap();
    assert_eq!(again.fields(), c.fields());
    assert_eq!(again.fingerprint(), c.fingerprint());
    // Another field shape, dtype, name or order is another dataset.
    let mut other = c.clone();
    other.dataset.fields[2].shape = vec![3];
    assert_ne!(other.fingerprint(), c.fingerprint());
    let mut other = c.clone();
    other.dataset.fields[0].name = "w".into();
    assert_ne!(other.fingerprint(), c.fingerprint());
    let mut other = c.clone();
    other.dataset.fields.swap(0, 1);
    assert_ne!(other.fingerprint(), c.fingerprint());
}

#[test]
fn external_fields_are_checked() {
    let with = |edit: &dyn Fn(&mut Config)| {
        let mut c = Config::from_toml_str(EXTERNAL, "t").unwrap();
        edit(&mut c);
        c.validate().unwrap_err().to_string()
    };
    let e = with(&|c| c.dataset.fields.clear());
    assert!(
        e.contains("dataset.fields") && e.contains("needs 1 to"),
        "{e}"
    );
    let e = with(&|c| c.dataset.fields[1].name = "x".into());
    assert!(
        e.contains("[1] name \"x\"") && e.contains("must differ"),
        "{e}"
    );
    let e = with(&|c| c.dataset.fields[0].name = "a b".into());
    assert!(e.contains("1 to 64 characters"), "{e}");
    let e = with(&|c| c.dataset.fields[2].shape = vec![2, 0]);
    assert!(
        e.contains("\"z\" shape [2, 0]") && e.contains(">= 1"),
        "{e}"
    );
    let e = with(&|c| c.dataset.fields[0].shape = vec![1 << 15, 1 << 15, 2]);
    assert!(e.contains("at most 1 GiB"), "{e}");
    // Synthetic samples have their own fields.
    let e = with(&|c| c.dataset.kind = DatasetKind::Synthetic);
    assert!(e.contains("only kind = \"external\""), "{e}");
    // An unknown key inside a field is refused by name.
    let bad = EXTERNAL.replace("dtype = \"bool\"", "dtype = \"bool\", shap = [2]");
    let e = Config::from_toml_str(&bad, "t").unwrap_err().to_string();
    assert!(e.contains("shap"), "{e}");
}

/// `"auto"` for a ring that carries its images encoded: parts of up to 32 MiB (a batch of 256
/// at 256 KiB an image in 2 or 3 parts, not 18 of 15), two batches' parts in the ring and at
/// least 8 slots, whatever the cache; no cache warning (the decoder reads the bytes once).
#[test]
fn auto_sizes_an_encoded_ring_for_the_decoders_batches_not_the_cache() {
    let c = Config::from_toml_str(
        "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = [\"s.tar\"]\n\
         [dataset.image]\ndecode = \"gpu\"\n[plan]\nbatch_size = 256\n",
        "t",
    )
    .unwrap();
    let parts = c.parts_per_batch();
    assert!((2..=3).contains(&parts), "{parts} parts");
    assert!(c.slot_bytes() <= AUTO_ENCODED_PART_PAYLOAD_BYTES + (1 << 20));
    for cache in [Some(16 * MIB), Some(300 * MIB), None] {
        let a = c.auto_ring(cache);
        assert_eq!(
            a.slots,
            (parts * 2).max(AUTO_ENCODED_MIN_SLOTS),
            "{cache:?}"
        );
        let mut r = c.clone();
        r.resolve_auto(cache);
        let host = crate::HostFacts {
            cache_bytes: cache,
            cache_level: 3,
            ..Default::default()
        };
        assert!(
            r.ring_warnings(&host).is_empty(),
            "{:?}",
            r.ring_warnings(&host)
        );
    }
    let mut pixels = c.clone();
    pixels.dataset.image.as_mut().unwrap().decode = crate::ImageDecode::Cpu;
    assert!(pixels.parts_per_batch() > parts, "pixel parts stay 4 MiB");
}
