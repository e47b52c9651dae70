//! Token files: every window compared with a reference cut from the concatenated stream.

mod common;

use std::path::PathBuf;

use common::{read, run_python};
use pinring_sources::{
    Source, SourceConfig, SourceError, TokenDtype, TokenOutDtype, Tokens, TokensConfig, TokensError,
};

/// Writes `sizes.len()` files of the given token counts (values `mul * i + add`, wrapping to
/// the dtype) and returns their paths and the whole stream.
fn write_files(
    dir: &std::path::Path,
    sizes: &[usize],
    dtype: TokenDtype,
) -> (Vec<PathBuf>, Vec<u32>) {
    let mut stream = Vec::new();
    let mut paths = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        let mut bytes = Vec::new();
        for _ in 0..n {
            let i = stream.len() as u32;
            let v = match dtype {
                TokenDtype::U16 => i.wrapping_mul(40_503) & 0xFFFF,
                TokenDtype::U32 => i.wrapping_mul(2_654_435_761) >> 1,
            };
            match dtype {
                TokenDtype::U16 => bytes.extend_from_slice(&(v as u16).to_le_bytes()),
                TokenDtype::U32 => bytes.extend_from_slice(&v.to_le_bytes()),
            }
            stream.push(v);
        }
        let p = dir.join(format!("part{k}.bin"));
        std::fs::write(&p, bytes).unwrap();
        paths.push(p);
    }
    (paths, stream)
}

fn config(files: Vec<PathBuf>, token_dtype: TokenDtype, seq_len: u32) -> TokensConfig {
    TokensConfig {
        files,
        token_dtype,
        seq_len,
        stride: None,
        shift: false,
        seed: 7,
        dtype: TokenOutDtype::I64,
    }
}

fn expect(tokens: &[u32], dtype: TokenOutDtype) -> Vec<u8> {
    let mut out = Vec::new();
    for &t in tokens {
        match dtype {
            TokenOutDtype::I64 => out.extend_from_slice(&i64::from(t).to_le_bytes()),
            TokenOutDtype::I32 => out.extend_from_slice(&(t as i32).to_le_bytes()),
        }
    }
    out
}

/// Checks every sample of `epoch` against the stream.
fn check_all(src: &mut Tokens, stream: &[u32], cfg: &TokensConfig, epoch: u32) {
    let seq = cfg.seq_len as usize;
    let stride = cfg.stride.unwrap_or(cfg.seq_len) as u64;
    let offset = src.epoch_offset(epoch);
    assert!(offset < stride);
    for id in 0..src.len() {
        let start = (offset + id * stride) as usize;
        let got = read(src, epoch, id).unwrap();
        assert_eq!(
            got[0],
            expect(&stream[start..start + seq], cfg.dtype),
            "input_ids of {id}"
        );
        assert_eq!(
            got[1],
            expect(&stream[start + 1..start + seq + 1], cfg.dtype),
            "targets of {id}"
        );
    }
}

#[test]
fn windows_cross_file_boundaries_u16_and_u32() {
    for dtype in [TokenDtype::U16, TokenDtype::U32] {
        for out in [TokenOutDtype::I64, TokenOutDtype::I32] {
            let dir = tempfile::tempdir().unwrap();
            // Small files, an empty one and a one-token one: windows span several files.
            let (files, stream) = write_files(dir.path(), &[5, 0, 1, 13, 7, 40], dtype);
            let mut cfg = config(files, dtype, 8);
            cfg.dtype = out;
            let mut src = Tokens::open(&cfg).unwrap();
            assert_eq!(src.total_tokens(), 66);
            // stride = seq_len: (66 - 9) / 8 + 1 windows.
            assert_eq!(src.len(), (66 - 9) / 8 + 1);
            let f = src.fields()[0].fixed().unwrap().clone();
            assert_eq!(f.name, "input_ids");
            assert_eq!(f.shape, vec![8]);
            assert_eq!(f.dtype, out.dtype());
            check_all(&mut src, &stream, &cfg, 0);
        }
    }
}

#[test]
fn strides_and_shifted_epochs_keep_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let (files, stream) = write_files(dir.path(), &[100, 57, 3], TokenDtype::U16);
    for stride in [1u32, 5, 6, 7, 11] {
        for shift in [false, true] {
            let mut cfg = config(files.clone(), TokenDtype::U16, 6);
            cfg.stride = Some(stride);
            cfg.shift = shift;
            let mut src = Tokens::open(&cfg).unwrap();
            let max_offset = if shift { u64::from(stride) - 1 } else { 0 };
            assert_eq!(src.len(), (160 - max_offset - 7) / u64::from(stride) + 1);
            let mut offsets = std::collections::BTreeSet::new();
            for epoch in 0..8 {
                offsets.insert(src.epoch_offset(epoch));
                check_all(&mut src, &stream, &cfg, epoch);
                // The last window of every epoch fits.
                let last = src.window_start(epoch, src.len() - 1);
                assert!(last + 7 <= 160);
            }
            if !shift || stride == 1 {
                assert_eq!(offsets.len(), 1);
            } else {
                assert!(offsets.len() > 1, "epochs should see shifted windows");
            }
        }
    }
}

#[test]
fn numpy_written_tokens_read_back() {
    let Some(py) = common::python_numpy("numpy_written_tokens_read_back") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.bin");
    let b = dir.path().join("b.bin");
    run_python(
        &py,
        "import numpy as np, sys\n\
         t = (np.arange(3001, dtype=np.uint64) * 7919 % 50257).astype(np.uint16)\n\
         t[:1234].tofile(sys.argv[1]); t[1234:].tofile(sys.argv[2])",
        &[&a, &b],
    );
    let stream: Vec<u32> = (0..3001u64).map(|i| (i * 7919 % 50257) as u32).collect();
    let cfg = config(vec![a, b], TokenDtype::U16, 64);
    let mut src = Tokens::open(&cfg).unwrap();
    check_all(&mut src, &stream, &cfg, 0);
}

#[test]
fn u32_token_above_i32_max_is_a_per_sample_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big.bin");
    let mut bytes = Vec::new();
    for v in [1u32, 2, 3, u32::MAX, 5, 6, 7, 8, 9] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(&p, bytes).unwrap();
    let mut cfg = config(vec![p], TokenDtype::U32, 2);
    cfg.dtype = TokenOutDtype::I32;
    let mut src = Tokens::open(&cfg).unwrap();
    assert!(read(&mut src, 0, 0).is_ok());
    let err = read(&mut src, 0, 1).unwrap_err();
    assert!(
        matches!(
            err,
            SourceError::Tokens(TokensError::Overflow {
                offset: 12,
                value: u32::MAX,
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("big.bin"), "{err}");
    assert!(read(&mut src, 0, 3).is_ok(), "the source stays usable");
}

#[test]
fn bad_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("odd.bin");
    std::fs::write(&odd, [0u8; 7]).unwrap();
    let err = Tokens::open(&config(vec![odd], TokenDtype::U16, 2)).unwrap_err();
    assert!(matches!(err, TokensError::Size { bytes: 7, .. }), "{err}");
    assert!(err.to_string().contains("odd.bin"), "{err}");

    let missing = dir.path().join("missing.bin");
    let err = Tokens::open(&config(vec![missing], TokenDtype::U16, 2)).unwrap_err();
    assert!(matches!(err, TokensError::Open { .. }), "{err}");
    assert!(err.to_string().contains("missing.bin"), "{err}");

    let short = dir.path().join("short.bin");
    std::fs::write(&short, [0u8; 8]).unwrap();
    let err = Tokens::open(&config(vec![short], TokenDtype::U16, 4)).unwrap_err();
    assert!(
        matches!(err, TokensError::TooShort { tokens: 4, need: 5 }),
        "{err}"
    );

    let err = Tokens::open(&config(vec![], TokenDtype::U16, 4)).unwrap_err();
    assert!(
        matches!(err, TokensError::Param { key: "files", .. }),
        "{err}"
    );
}

#[test]
fn file_truncated_after_open_is_a_per_sample_error() {
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = write_files(dir.path(), &[50, 50], TokenDtype::U16);
    let mut src = Tokens::open(&config(files.clone(), TokenDtype::U16, 9)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&files[1])
        .unwrap()
        .set_len(10)
        .unwrap();
    let last = src.len() - 1;
    let err = read(&mut src, 0, last).unwrap_err();
    assert!(
        matches!(err, SourceError::Tokens(TokensError::Read { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("part1.bin"), "{err}");
    assert!(read(&mut src, 0, 0).is_ok());
}

#[test]
fn opens_from_toml() {
    let dir = tempfile::tempdir().unwrap();
    let (files, stream) = write_files(dir.path(), &[30], TokenDtype::U32);
    let text = format!(
        "kind = \"tokens\"\nfiles = [{:?}]\ntoken_dtype = \"u32\"\nseq_len = 4\nstride = 5\nshift = true\nseed = 3\ndtype = \"i32\"\n",
        files[0]
    );
    let cfg: SourceConfig = toml::from_str(&text).unwrap();
    let SourceConfig::Tokens(tc) = &cfg else {
        panic!("{cfg:?}")
    };
    assert_eq!(tc.stride, Some(5));
    let mut src = cfg.open().unwrap();
    assert_eq!(src.len(), (30 - 4 - 5) / 5 + 1);
    let mut direct = Tokens::open(tc).unwrap();
    let start = direct.window_start(2, 1) as usize;
    let got = read(src.as_mut(), 2, 1).unwrap();
    assert_eq!(
        got[0],
        expect(&stream[start..start + 4], TokenOutDtype::I32)
    );
    assert_eq!(read(&mut direct, 2, 1).unwrap(), got);
    assert!(toml::from_str::<SourceConfig>(
        "kind = \"tokens\"\nfiles = []\nseq_len = 4\nbogus = 1\n"
    )
    .is_err());
}
