//! `.npy` sources: files from our own writer and from numpy, compared byte for byte; bad files.

mod common;

use std::path::Path;

use common::{npy_bytes, read, run_python};
use pinring_data::Dtype;
use pinring_sources::{
    NpyConfig, NpyDtype, NpyError, NpySource, Source, SourceConfig, SourceError,
};

/// (descr, dtype, bytes per element)
const DTYPES: [(&str, NpyDtype, usize); 12] = [
    ("|b1", NpyDtype::Bool, 1),
    ("|i1", NpyDtype::Int8, 1),
    ("|u1", NpyDtype::Uint8, 1),
    ("<i2", NpyDtype::Int16, 2),
    ("<u2", NpyDtype::Uint16, 2),
    ("<i4", NpyDtype::Int32, 4),
    ("<u4", NpyDtype::Uint32, 4),
    ("<i8", NpyDtype::Int64, 8),
    ("<u8", NpyDtype::Uint64, 8),
    ("<f2", NpyDtype::Float16, 2),
    ("<f4", NpyDtype::Float32, 4),
    ("<f8", NpyDtype::Float64, 8),
];

fn cfg(path: &Path) -> NpyConfig {
    NpyConfig {
        path: path.to_path_buf(),
        field: "data".into(),
        dtype: None,
        shape: None,
        labels: None,
    }
}

/// Element `i`'s raw bytes for `dtype` (bools 0/1, uint64 below 2^63, arbitrary otherwise).
fn element(dtype: NpyDtype, size: usize, i: usize) -> Vec<u8> {
    let x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    match dtype {
        NpyDtype::Bool => vec![(x >> 60) as u8 & 1],
        NpyDtype::Uint64 => (x >> 1).to_le_bytes().to_vec(),
        _ => x.to_le_bytes()[..size].to_vec(),
    }
}

#[test]
fn own_writer_every_dtype_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let (n, per) = (6usize, 3 * 2);
    for version in [1u8, 2, 3] {
        for (descr, dtype, size) in DTYPES {
            let raw: Vec<Vec<u8>> = (0..n * per).map(|i| element(dtype, size, i)).collect();
            let path = dir.path().join(format!("v{version}_{}.npy", dtype.name()));
            std::fs::write(
                &path,
                npy_bytes(version, descr, false, &[n as u64, 3, 2], &raw.concat()),
            )
            .unwrap();
            let mut c = cfg(&path);
            c.dtype = Some(dtype);
            c.shape = Some(vec![3, 2]);
            let mut src = NpySource::open(&c).unwrap();
            assert_eq!(src.len(), n as u64);
            let f = src.fields()[0].fixed().unwrap();
            assert_eq!(
                (f.name.as_str(), f.dtype, f.shape.clone()),
                ("data", dtype.field_dtype(), vec![3, 2])
            );
            for id in 0..n {
                let want: Vec<u8> = raw[id * per..(id + 1) * per]
                    .iter()
                    .flat_map(|r| r.iter().copied())
                    .collect();
                assert_eq!(
                    read(&mut src, 0, id as u64).unwrap()[0],
                    want,
                    "{descr} v{version} sample {id}"
                );
            }
        }
    }
}

#[test]
fn labels_and_directory_mode() {
    let dir = tempfile::tempdir().unwrap();
    let samples = dir.path().join("samples");
    std::fs::create_dir(&samples).unwrap();
    let mut want = Vec::new();
    // Names whose sorted order differs from creation order; a non-.npy file is ignored.
    for (k, name) in ["b.npy", "a.npy", "c10.npy", "c09.npy"].iter().enumerate() {
        let data: Vec<u8> = (0..8).map(|i| (k * 8 + i) as u8).collect();
        std::fs::write(samples.join(name), npy_bytes(1, "<f4", false, &[2], &data)).unwrap();
        want.push((name.to_string(), data));
    }
    std::fs::write(samples.join("README"), b"not an array").unwrap();
    want.sort();
    let labels = dir.path().join("labels.npy");
    let lab: Vec<u8> = [7u16, 8, 9, 10]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(&labels, npy_bytes(2, "<u2", false, &[4], &lab)).unwrap();
    let mut c = cfg(&samples);
    c.field = "images".into();
    c.labels = Some(labels);
    let mut src = NpySource::open(&c).unwrap();
    assert_eq!(src.len(), 4);
    assert_eq!(src.fields()[1].fixed().unwrap().dtype, Dtype::U16);
    assert_eq!(src.fields()[1].fixed().unwrap().shape, Vec::<u32>::new());
    for (id, (_, data)) in want.iter().enumerate() {
        let got = read(&mut src, 0, id as u64).unwrap();
        assert_eq!(&got[0], data);
        assert_eq!(got[1], (7 + id as u16).to_le_bytes());
    }
}

#[test]
fn numpy_written_files_match_numpy_byte_for_byte() {
    let Some(py) = common::python_numpy("numpy_written_files_match_numpy_byte_for_byte") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    run_python(
        &py,
        r#"
import numpy as np, sys, os
d = sys.argv[1]
rng = np.random.default_rng(5)
names = ['bool', 'uint8', 'int8', 'int16', 'uint16', 'int32', 'uint32', 'int64', 'uint64',
         'float16', 'float32', 'float64']
for name in names:
    dt = np.dtype(name)
    if dt.kind == 'f':
        a = rng.standard_normal((7, 4, 3)).astype(dt)
    elif dt.kind == 'b':
        a = rng.integers(0, 2, (7, 4, 3)).astype(bool)
    else:
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, (7, 4, 3), dtype=dt, endpoint=True)
    for v in [(1, 0), (2, 0), (3, 0)]:
        with open(os.path.join(d, f'{name}_v{v[0]}.npy'), 'wb') as f:
            np.lib.format.write_array(f, a, version=v)
    a.tofile(os.path.join(d, f'{name}.ref'))
np.save(os.path.join(d, 'labels.npy'), np.arange(7, dtype=np.int64) * 3)
np.save(os.path.join(d, 'fortran.npy'), np.asfortranarray(np.zeros((3, 4), dtype=np.float32)))
np.save(os.path.join(d, 'big.npy'), np.zeros(4, dtype='>f4'))
np.save(os.path.join(d, 'complex.npy'), np.zeros(4, dtype=np.complex64))
np.save(os.path.join(d, 'structured.npy'), np.zeros(4, dtype=[('a', '<i4'), ('b', '<f4')]))
np.save(os.path.join(d, 'scalar.npy'), np.float32(1.5))
os.mkdir(os.path.join(d, 'per_sample'))
for i in range(5):
    np.save(os.path.join(d, 'per_sample', f'{i:04d}.npy'), np.full((2, 2), i, dtype=np.uint8))
"#,
        &[dir.path()],
    );
    let d = dir.path();
    for (_, dtype, _) in DTYPES {
        let reference = std::fs::read(d.join(format!("{}.ref", dtype.name()))).unwrap();
        for v in 1..=3 {
            let mut c = cfg(&d.join(format!("{}_v{v}.npy", dtype.name())));
            c.dtype = Some(dtype);
            c.shape = Some(vec![4, 3]);
            c.labels = Some(d.join("labels.npy"));
            let mut src = NpySource::open(&c).unwrap();
            assert_eq!(src.len(), 7);
            let per = reference.len() / 7;
            for id in 0..7 {
                let got = read(&mut src, 0, id).unwrap();
                assert_eq!(
                    got[0],
                    reference[id as usize * per..(id as usize + 1) * per],
                    "{} v{v} {id}",
                    dtype.name()
                );
                assert_eq!(got[1], (id as i64 * 3).to_le_bytes());
            }
        }
    }
    let mut src = NpySource::open(&cfg(&d.join("per_sample"))).unwrap();
    assert_eq!(src.len(), 5);
    for id in 0..5u8 {
        assert_eq!(read(&mut src, 0, u64::from(id)).unwrap()[0], vec![id; 4]);
    }
    let err = |name: &str| NpySource::open(&cfg(&d.join(name))).unwrap_err();
    assert!(matches!(err("fortran.npy"), NpyError::FortranOrder { .. }));
    assert!(matches!(err("big.npy"), NpyError::BigEndian { .. }));
    assert!(matches!(
        err("complex.npy"),
        NpyError::UnsupportedDtype { .. }
    ));
    assert!(matches!(
        err("structured.npy"),
        NpyError::UnsupportedDtype { .. }
    ));
    assert!(matches!(err("scalar.npy"), NpyError::NoSampleAxis { .. }));
    assert!(err("fortran.npy").to_string().contains("fortran.npy"));
}

#[test]
fn truncated_and_mismatched_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let data = vec![1u8; 4 * 10 * 4];
    let full = npy_bytes(1, "<f4", false, &[4, 10], &data);
    let trunc = dir.path().join("trunc.npy");
    std::fs::write(&trunc, &full[..full.len() - 13]).unwrap();
    let e = NpySource::open(&cfg(&trunc)).unwrap_err();
    assert!(matches!(e, NpyError::Truncated { missing: 13, .. }), "{e}");
    assert!(
        e.to_string().contains("trunc.npy") && e.to_string().contains("13 bytes are missing"),
        "{e}"
    );

    let inside_header = dir.path().join("header.npy");
    std::fs::write(&inside_header, &full[..40]).unwrap();
    let e = NpySource::open(&cfg(&inside_header)).unwrap_err();
    assert!(matches!(e, NpyError::Header { .. }), "{e}");

    let trailing = dir.path().join("trailing.npy");
    std::fs::write(&trailing, [full.as_slice(), b"xx"].concat()).unwrap();
    assert!(matches!(
        NpySource::open(&cfg(&trailing)).unwrap_err(),
        NpyError::Trailing { extra: 2, .. }
    ));

    let good = dir.path().join("good.npy");
    std::fs::write(&good, &full).unwrap();
    let mut c = cfg(&good);
    c.shape = Some(vec![5]);
    let e = NpySource::open(&c).unwrap_err();
    assert!(
        matches!(&e, NpyError::ShapeMismatch { found, expected, .. } if found == &[10] && expected == &[5]),
        "{e}"
    );
    assert!(e.to_string().contains("good.npy"));
    let mut c = cfg(&good);
    c.dtype = Some(NpyDtype::Float64);
    let e = NpySource::open(&c).unwrap_err();
    assert!(
        e.to_string().contains("float32") && e.to_string().contains("float64"),
        "{e}"
    );

    let labels = dir.path().join("labels.npy");
    std::fs::write(&labels, npy_bytes(1, "<i8", false, &[3], &[0; 24])).unwrap();
    let mut c = cfg(&good);
    c.labels = Some(labels);
    assert!(matches!(
        NpySource::open(&c).unwrap_err(),
        NpyError::LabelsLen {
            found: 3,
            expected: 4,
            ..
        }
    ));

    let e = NpySource::open(&cfg(&dir.path().join("absent.npy"))).unwrap_err();
    assert!(matches!(e, NpyError::Open { .. }) && e.to_string().contains("absent.npy"));

    // A directory whose files disagree on shape: the odd one is a bad sample, named on read.
    let sub = dir.path().join("mixed");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("0.npy"), npy_bytes(1, "|u1", false, &[2], &[0; 2])).unwrap();
    std::fs::write(sub.join("1.npy"), npy_bytes(1, "|u1", false, &[3], &[0; 3])).unwrap();
    let mut src = NpySource::open(&cfg(&sub)).unwrap();
    assert_eq!(src.len(), 2);
    assert_eq!(src.bad_samples(), [(1, sub.join("1.npy").as_path())]);
    assert_eq!(read(&mut src, 0, 0).unwrap()[0], [0, 0]);
    let e = read(&mut src, 0, 1).unwrap_err();
    assert!(
        matches!(e, SourceError::Npy(NpyError::ShapeMismatch { .. }))
            && e.to_string().contains("1.npy"),
        "{e}"
    );
    // A truncated per-sample file: a bad sample whose error names the file and what is missing.
    let whole = npy_bytes(1, "|u1", false, &[2], &[7; 2]);
    std::fs::write(sub.join("1.npy"), &whole[..whole.len() - 1]).unwrap();
    let mut src = NpySource::open(&cfg(&sub)).unwrap();
    let e = read(&mut src, 0, 1).unwrap_err();
    assert!(
        matches!(e, SourceError::Npy(NpyError::Truncated { missing: 1, .. }))
            && e.to_string().contains("1.npy"),
        "{e}"
    );
    // Every file bad: the open fails.
    std::fs::write(sub.join("0.npy"), b"junk").unwrap();
    let mut c = cfg(&sub);
    c.dtype = Some(NpyDtype::Uint8);
    c.shape = Some(vec![2]);
    assert!(NpySource::open(&c).is_err());

    // uint64: the exact bytes, every value.
    let big = dir.path().join("u64.npy");
    let vals: Vec<u8> = [1u64, u64::MAX]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(&big, npy_bytes(1, "<u8", false, &[2], &vals)).unwrap();
    let mut src = NpySource::open(&cfg(&big)).unwrap();
    assert_eq!(src.fields()[0].fixed().unwrap().dtype, Dtype::U64);
    assert_eq!(read(&mut src, 0, 0).unwrap()[0], 1u64.to_le_bytes());
    assert_eq!(read(&mut src, 0, 1).unwrap()[0], u64::MAX.to_le_bytes());

    // Truncated after open: a per-sample read error naming the file.
    let mut src = NpySource::open(&cfg(&good)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&good)
        .unwrap()
        .set_len(full.len() as u64 - 50)
        .unwrap();
    assert!(read(&mut src, 0, 0).is_ok());
    let e = read(&mut src, 0, 3).unwrap_err();
    assert!(
        matches!(e, SourceError::Npy(NpyError::Read { .. })) && e.to_string().contains("good.npy"),
        "{e}"
    );
    assert!(matches!(
        read(&mut src, 0, 4).unwrap_err(),
        SourceError::OutOfRange { id: 4, len: 4 }
    ));
}

#[test]
fn opens_from_toml() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.npy");
    std::fs::write(
        &p,
        npy_bytes(3, "<i2", false, &[2, 2], &[1, 0, 2, 0, 3, 0, 4, 0]),
    )
    .unwrap();
    let text =
        format!("kind = \"npy\"\npath = {p:?}\nfield = \"x\"\ndtype = \"int16\"\nshape = [2]\n");
    let mut src = toml::from_str::<SourceConfig>(&text)
        .unwrap()
        .open()
        .unwrap();
    assert_eq!(src.fields()[0].name(), "x");
    let got = read(src.as_mut(), 0, 1).unwrap();
    assert_eq!(got[0], [3i16.to_le_bytes(), 4i16.to_le_bytes()].concat());
}

#[test]
fn open_dataset_checks_the_files_against_the_declared_fields() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("x.npy"),
        npy_bytes(1, "<f4", false, &[4, 2], &[0; 32]),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("y.npy"),
        npy_bytes(1, "<i8", false, &[4], &[0; 32]),
    )
    .unwrap();
    let config = |extra: &str| {
        let text = format!(
            "[dataset]\nkind = \"npy\"\n[dataset.npy]\npath = \"x.npy\"\nlabels = \"y.npy\"\n{extra}"
        );
        let p = dir.path().join("pinring.toml");
        std::fs::write(&p, text).unwrap();
        pinring_data::Config::load(&p).unwrap()
    };
    // Relative paths, against the config file's directory.
    let cfg = config("dtype = \"f32\"\nshape = [2]\n");
    let src = pinring_sources::open_dataset(&cfg).unwrap().unwrap();
    assert_eq!(src.len(), 4);
    let fields: Vec<_> = src
        .fields()
        .iter()
        .map(|f| f.fixed().unwrap().clone())
        .collect();
    assert_eq!(fields, cfg.fields());
    // The data's dtype and shape are checked against the file.
    let e = pinring_sources::open_dataset(&config("dtype = \"f64\"\nshape = [2]\n"))
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(e.contains("x.npy") && e.contains("float32"), "{e}");
    let e = pinring_sources::open_dataset(&config("dtype = \"f32\"\nshape = [1, 2]\n"))
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(e.contains("x.npy") && e.contains("[1, 2]"), "{e}");
    // And the labels'.
    let e = pinring_sources::open_dataset(&config(
        "dtype = \"f32\"\nshape = [2]\nlabels_dtype = \"i32\"\n",
    ))
    .unwrap()
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("y.npy") && e.contains("labels_dtype") && e.contains("i64"),
        "{e}"
    );
    // Not a file kind: no source.
    assert!(pinring_sources::open_dataset(&pinring_data::Config::default()).is_none());
}
