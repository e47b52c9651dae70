//! Never panic on any input: the `.npy` header parser and the tar indexer on random bytes,
//! truncations and bit flips of valid files (proptest, a few seconds in a debug build).

mod common;

use std::io::Cursor;

use common::npy_bytes;
use pinring_sources::npy::NpyHeader;
use pinring_sources::webdataset::index_tar;
use proptest::prelude::*;

fn valid_npy() -> Vec<Vec<u8>> {
    vec![
        npy_bytes(1, "<f4", false, &[3, 2], &[0; 24]),
        npy_bytes(2, "|u1", false, &[5], &[1; 5]),
        npy_bytes(3, "<i8", true, &[1, 4], &[2; 32]),
    ]
}

fn valid_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (i, name) in [
        "a.jpg",
        "a.cls",
        &format!("{}/b.png", "d".repeat(150)),
        "b.cls",
    ]
    .iter()
    .enumerate()
    {
        let data = vec![i as u8; 100 * i + 3];
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data.as_slice()).unwrap();
    }
    b.into_inner().unwrap()
}

fn index(bytes: &[u8]) -> bool {
    index_tar("fuzz.tar", Cursor::new(bytes), bytes.len() as u64).is_ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn npy_header_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = NpyHeader::parse("fuzz.npy", &bytes);
        let mut with_magic = b"\x93NUMPY\x01\x00".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = NpyHeader::parse("fuzz.npy", &with_magic);
    }

    #[test]
    fn npy_header_text_mutations(
        text in "\\{[ '\"a-z_:,()\\[\\]0-9TrueFalsL<>|]{0,80}\\}?",
        version in 1u8..4,
    ) {
        let mut b = b"\x93NUMPY".to_vec();
        b.push(version);
        b.push(0);
        if version == 1 {
            b.extend_from_slice(&(text.len() as u16).to_le_bytes());
        } else {
            b.extend_from_slice(&(text.len() as u32).to_le_bytes());
        }
        b.extend_from_slice(text.as_bytes());
        let _ = NpyHeader::parse("fuzz.npy", &b);
    }

    #[test]
    fn npy_truncations_and_bit_flips(which in 0usize..3, cut in any::<prop::sample::Index>(),
                                      flips in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..8), 0..4)) {
        let mut b = valid_npy()[which].clone();
        for (i, bit) in flips {
            let i = i.index(b.len());
            b[i] ^= 1 << bit;
        }
        let _ = NpyHeader::parse("fuzz.npy", &b);
        let cut = cut.index(b.len() + 1);
        let r = NpyHeader::parse("fuzz.npy", &b[..cut]);
        // A cut inside the header is always an error.
        if cut < 64 {
            prop_assert!(r.is_err());
        }
    }

    #[test]
    fn tar_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        index(&bytes);
    }

    #[test]
    fn tar_truncations_and_bit_flips(cut in any::<prop::sample::Index>(),
                                      flips in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..8), 0..6)) {
        let mut b = valid_tar();
        let at = cut.index(b.len() + 1);
        // A strict prefix of the archive never indexes: it is cut inside a member, between
        // members, or inside the end-of-archive marker.
        prop_assert_eq!(index(&b[..at]), at == b.len(), "cut at {}", at);
        for (i, bit) in flips {
            // Mostly in headers, where a flip matters.
            let i = i.index(b.len());
            b[i] ^= 1 << bit;
        }
        index(&b);
        index(&b[..cut.index(b.len() + 1)]);
    }

    #[test]
    fn tar_header_fields_garbled(block in 0usize..4, field in prop::sample::select(vec![(100usize, 8usize), (124, 12), (148, 8), (156, 1), (257, 8), (0, 100)]),
                                  junk in proptest::collection::vec(any::<u8>(), 12)) {
        let mut b = valid_tar();
        // Header blocks of the first members sit at known offsets for these sizes.
        let starts = [0usize, 1024, 2048, 3584];
        let (off, len) = field;
        let at = starts[block] + off;
        if at + len <= b.len() {
            b[at..at + len].copy_from_slice(&junk[..len.min(12)].iter().cycle().take(len).copied().collect::<Vec<_>>());
        }
        index(&b);
    }
}

#[test]
fn valid_inputs_parse() {
    for b in valid_npy() {
        NpyHeader::parse("ok.npy", &b).unwrap();
    }
    let t = valid_tar();
    let m = index_tar("ok.tar", Cursor::new(&t), t.len() as u64).unwrap();
    assert_eq!(m.len(), 4);
    assert_eq!(
        &t[m[2].offset as usize..][..m[2].size as usize],
        vec![2u8; 203].as_slice()
    );
    assert!(m[2].path.ends_with("/b.png") && m[2].path.len() > 150);
}
