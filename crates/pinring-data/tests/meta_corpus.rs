//! The batch-metadata decoder and its validation against the plan, on hostile input: a replayed
//! corpus (tests/corpus/meta/) and mutations of valid encodings (proptest).

use pinring_data::{BatchIndices, BatchMeta, Dtype};
use proptest::prelude::*;

const LIMIT: usize = 4096;

/// A valid part's metadata, its plan entry, and its images' and whole record's bytes per sample
/// (8 x 8 f32 images and an i64 label).
fn valid() -> (BatchMeta, BatchIndices, u64, u64) {
    let indices = BatchIndices {
        seq: 9,
        epoch: 1,
        index_in_epoch: 3,
        samples: vec![4, 8, 15, 16, 23, 42],
    };
    let meta = BatchMeta::new(
        &indices,
        vec![1, 2, 3, 4, 5, 6],
        vec![8, 8],
        Dtype::F32,
        264,
    );
    (meta, indices, 256, 264)
}

#[test]
fn every_corpus_input_is_rejected_without_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/meta");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("bin") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let got = BatchMeta::decode(&bytes, LIMIT);
        assert!(got.is_err(), "{} decoded: {got:?}", path.display());
        n += 1;
    }
    assert!(n >= 10, "corpus missing ({n} files in {})", dir.display());
}

#[test]
fn a_valid_encoding_decodes_and_validates() {
    let (meta, indices, sb, rb) = valid();
    let mut buf = vec![0u8; LIMIT];
    let n = meta.encode_into(&mut buf).unwrap();
    let back = BatchMeta::decode(&buf[..n], LIMIT).unwrap();
    back.validate_against(&indices, None, sb, rb * indices.samples.len() as u64)
        .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Flip, overwrite, truncate: the decoder never panics, and whatever it accepts is checked
    /// against the plan, which passes only if it still describes exactly the planned batch.
    #[test]
    fn mutated_encodings_never_panic_and_never_validate_wrongly(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
        limit in 0usize..=LIMIT,
    ) {
        let (meta, indices, sb, rb) = valid();
        let mut buf = vec![0u8; 512];
        let n = meta.encode_into(&mut buf).unwrap();
        let mut bytes = buf[..n].to_vec();
        for (at, v) in edits {
            let i = at % bytes.len();
            bytes[i] = v;
        }
        bytes.truncate(cut % (bytes.len() + 1));
        if let Ok(decoded) = BatchMeta::decode(&bytes, limit) {
            if decoded.validate_against(&indices, None, sb, rb * indices.samples.len() as u64).is_ok() {
                prop_assert_eq!(decoded.seq, meta.seq);
                prop_assert_eq!(&decoded.sample_ids, &meta.sample_ids);
                prop_assert_eq!(decoded.payload_bytes, meta.payload_bytes);
                prop_assert_eq!(&decoded.sample_shape, &meta.sample_shape);
            }
        }
    }
}
