//! WebDataset shards: written with the `tar` crate and with Python's `tarfile`, read back
//! member for member; bad samples; truncated shards; the per-rank epoch order (proptest).

mod common;

use std::collections::BTreeSet;
use std::io::Cursor;
use std::path::{Path, PathBuf};

use common::{npy_bytes, read, run_python};
use pinring_sources::npy::NpyDtype;
use pinring_sources::webdataset::{
    epoch_order_for, index_tar, rank_stream, split_key, NpyProblem, WdsField,
};
use pinring_sources::{
    Source, SourceConfig, SourceError, SourceField, WdsConfig, WdsError, WdsNpy, WebDataset,
};
use proptest::prelude::*;

/// Deterministic content of member `name`.
fn content(name: &str) -> Vec<u8> {
    let n = name.bytes().map(usize::from).sum::<usize>() % 1500 + 1;
    (0..n).map(|i| (i * 31 + name.len()) as u8).collect()
}

fn write_tar(path: &Path, members: &[(String, Vec<u8>)]) {
    let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data.as_slice()).unwrap();
    }
    b.into_inner().unwrap();
}

fn cfg(shards: Vec<PathBuf>, fields: Vec<WdsField>) -> WdsConfig {
    WdsConfig {
        shards,
        fields,
        shuffle_buffer: 8,
        npy: None,
    }
}

/// A shard of samples `keys`, each with `.jpg` (or `.png` for odd ones), `.cls` and `.json`.
fn sample_members(keys: &[String]) -> Vec<(String, Vec<u8>)> {
    let mut m = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let img = if i % 2 == 0 {
            format!("{k}.jpg")
        } else {
            format!("{k}.PNG")
        };
        m.push((img.clone(), content(&img)));
        m.push((format!("{k}.cls"), format!(" {}\n", i * 7).into_bytes()));
        m.push((format!("{k}.json"), content(&format!("{k}.json"))));
    }
    m
}

#[test]
fn tar_crate_shards_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut shards = Vec::new();
    let mut expect = Vec::new();
    for s in 0..3 {
        let keys: Vec<String> = (0..4 + s).map(|i| format!("train/s{s}/{i:06}")).collect();
        let p = dir.path().join(format!("shard-{s}.tar"));
        let mut members = sample_members(&keys);
        // A member with no dot, a directory-like name and an unrequested extension: skipped.
        members.insert(0, ("README".into(), b"hello".to_vec()));
        members.push((format!("{}.txt", keys[keys.len() - 1]), b"x".to_vec()));
        write_tar(&p, &members);
        for (i, k) in keys.iter().enumerate() {
            let img = if i % 2 == 0 {
                format!("{k}.jpg")
            } else {
                format!("{k}.PNG")
            };
            expect.push((
                k.clone(),
                content(&img),
                (i * 7) as i64,
                content(&format!("{k}.json")),
            ));
        }
        shards.push(p);
    }
    let mut src = WebDataset::open(&cfg(
        shards,
        vec![WdsField::Image, WdsField::Cls, WdsField::Json],
    ))
    .unwrap();
    assert_eq!(src.len(), expect.len() as u64);
    assert_eq!(src.shard_sizes(), &[4, 5, 6]);
    // Through the trait too: the loader records them as dataset.webdataset.shard_samples.
    assert_eq!(Source::shard_sizes(&src), Some(&[4u64, 5, 6][..]));
    assert!(src.bad_samples().is_empty());
    // The README of each shard is reported, not a sample.
    let unowned: Vec<(u64, &str, u64)> = src
        .unowned_members()
        .iter()
        .map(|u| (u.count, u.member.as_str(), u.offset))
        .collect();
    assert_eq!(unowned, [(1, "README", 512); 3]);
    let names: Vec<&str> = src.fields().iter().map(|f| f.name()).collect();
    assert_eq!(names, ["images", "labels", "json"]);
    for (id, (key, img, label, json)) in expect.iter().enumerate() {
        assert_eq!(src.key(id as u64).unwrap().0, key);
        let got = read(&mut src, 0, id as u64).unwrap();
        assert_eq!(&got[0], img, "image of {key}");
        assert_eq!(got[1], label.to_le_bytes(), "label of {key}");
        assert_eq!(&got[2], json, "json of {key}");
    }
}

#[test]
fn python_tarfile_shards_read_back() {
    let Some(py) = common::python("python_tarfile_shards_read_back") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // GNU and PAX archives, with paths longer than ustar's 100 bytes and keys with dots in
    // directory names.
    let out = run_python(
        &py,
        r#"
import tarfile, io, sys, os
d = sys.argv[1]
def content(name):
    n = sum(name.encode()) % 1500 + 1
    return bytes(((i * 31 + len(name.encode())) % 256) for i in range(n))
for fmt, fname in [(tarfile.GNU_FORMAT, 'gnu.tar'), (tarfile.PAX_FORMAT, 'pax.tar'), (tarfile.USTAR_FORMAT, 'ustar.tar')]:
    with tarfile.open(os.path.join(d, fname), 'w', format=fmt) as t:
        for i in range(5):
            long = 'x' * 120 if fmt != tarfile.USTAR_FORMAT else 'short'
            key = f'v1.2/{long}/sample{i:04d}'
            for ext, data in [('jpeg', content(f'{key}.jpeg')), ('cls', f'{i + 100}'.encode())]:
                info = tarfile.TarInfo(f'{key}.{ext}')
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            print(key)
"#,
        &[dir.path()],
    );
    let keys: Vec<&str> = out.lines().collect();
    let shards = ["gnu.tar", "pax.tar", "ustar.tar"]
        .map(|n| dir.path().join(n))
        .to_vec();
    let mut src = WebDataset::open(&cfg(shards, vec![WdsField::Image, WdsField::Cls])).unwrap();
    assert_eq!(src.len(), 15);
    for (id, key) in keys.iter().enumerate() {
        assert_eq!(src.key(id as u64).unwrap().0, *key);
        let got = read(&mut src, 0, id as u64).unwrap();
        assert_eq!(got[0], content(&format!("{key}.jpeg")));
        assert_eq!(got[1], (id as i64 % 5 + 100).to_le_bytes());
    }
}

#[test]
fn bad_samples_are_typed_per_sample_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.tar");
    let members: Vec<(String, Vec<u8>)> = vec![
        ("a.jpg".into(), b"A".to_vec()),
        ("a.cls".into(), b"1".to_vec()),
        ("b.jpg".into(), b"B".to_vec()), // no .cls
        ("c.jpg".into(), b"C".to_vec()),
        ("c.png".into(), b"C2".to_vec()), // two images
        ("c.cls".into(), b"2".to_vec()),
        ("d.cls".into(), b"3".to_vec()), // no image
        ("e.jpg".into(), b"E".to_vec()),
        ("e.cls".into(), b"seven".to_vec()), // not an integer
        ("f.jpg".into(), b"F".to_vec()),
        ("f.cls".into(), b"-4".to_vec()),
    ];
    write_tar(&p, &members);
    let mut src = WebDataset::open(&cfg(vec![p], vec![WdsField::Image, WdsField::Cls])).unwrap();
    assert_eq!(src.len(), 6);
    let bad: Vec<u64> = src.bad_samples().iter().map(|(id, _)| *id).collect();
    assert_eq!(bad, [1, 2, 3]);
    assert_eq!(read(&mut src, 0, 0).unwrap()[1], 1i64.to_le_bytes());
    let e = read(&mut src, 0, 1).unwrap_err();
    assert!(
        matches!(&e, SourceError::WebDataset(WdsError::Incomplete { key, missing: "cls", .. }) if key == "b"),
        "{e}"
    );
    assert!(e.to_string().contains("bad.tar"), "{e}");
    let e = read(&mut src, 0, 2).unwrap_err();
    assert!(
        matches!(&e, SourceError::WebDataset(WdsError::Duplicate { member, .. }) if member == "c.png"),
        "{e}"
    );
    let e = read(&mut src, 0, 3).unwrap_err();
    assert!(
        matches!(
            e,
            SourceError::WebDataset(WdsError::Incomplete {
                missing: "image",
                ..
            })
        ),
        "{e}"
    );
    let e = read(&mut src, 0, 4).unwrap_err();
    assert!(
        matches!(&e, SourceError::WebDataset(WdsError::Cls { member, text, .. }) if member == "e.cls" && text == "seven"),
        "{e}"
    );
    assert_eq!(read(&mut src, 0, 5).unwrap()[1], (-4i64).to_le_bytes());
    assert!(matches!(
        read(&mut src, 0, 6).unwrap_err(),
        SourceError::OutOfRange { id: 6, len: 6 }
    ));
}

#[test]
fn truncated_and_missing_shards_fail_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("full.tar");
    let keys: Vec<String> = (0..3).map(|i| format!("k{i}")).collect();
    write_tar(&p, &sample_members(&keys));
    let full = std::fs::read(&p).unwrap();
    // The tar crate ends the archive with the marker alone: two zero blocks.
    assert!(full[full.len() - 1024..].iter().all(|&b| b == 0));
    let index = index_tar(
        "full.tar",
        std::fs::File::open(&p).unwrap(),
        full.len() as u64,
    )
    .unwrap();
    // Where each member's data ends, padded to a block: a cut there is between whole members.
    let ends: Vec<(String, usize)> = index
        .iter()
        .map(|m| {
            (
                m.path.clone(),
                (m.offset + m.size).next_multiple_of(512) as usize,
            )
        })
        .collect();
    // Every cut, on a block boundary or not, fails the open with a typed error naming the shard:
    // none opens with fewer samples.
    let cuts = (0..full.len())
        .step_by(97)
        .chain((0..full.len()).step_by(512));
    for cut in cuts {
        let t = dir.path().join("cut.tar");
        std::fs::write(&t, &full[..cut]).unwrap();
        let e = WebDataset::open(&cfg(vec![t], vec![WdsField::Image, WdsField::Cls]))
            .map(|s| s.len())
            .expect_err(&format!("the shard cut at {cut} of {} opened", full.len()));
        assert!(
            matches!(
                e,
                WdsError::Truncated { .. }
                    | WdsError::Corrupt { .. }
                    | WdsError::NoEndMarker { .. }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("cut.tar"), "{e}");
    }
    // Cut between whole members, or inside the marker: NoEndMarker, naming the last member,
    // where the shard ends, and the fix.
    let mut boundaries: Vec<(String, usize, u64)> =
        ends.iter().map(|(m, end)| (m.clone(), *end, 0)).collect();
    boundaries.push(("k2.json".into(), full.len() - 512, 512));
    boundaries.push(("k2.json".into(), full.len() - 100, 924));
    boundaries.push((String::new(), 0, 0));
    for (member, cut, tail) in boundaries {
        let t = dir.path().join("cut.tar");
        std::fs::write(&t, &full[..cut]).unwrap();
        let e = WebDataset::open(&cfg(vec![t], vec![WdsField::Image])).unwrap_err();
        assert!(
            matches!(&e, WdsError::NoEndMarker { member: m, offset, tail: z, .. }
                if *m == member && *offset == cut as u64 && *z == tail),
            "cut at {cut}: {e:?}"
        );
        let text = e.to_string();
        for needle in [
            "cut.tar".to_string(),
            format!("byte offset {cut}"),
            "end-of-archive marker".into(),
            "copy (or download) the shard again".into(),
            if member.is_empty() {
                "before any member".into()
            } else {
                format!("after member {member:?}")
            },
        ] {
            assert!(text.contains(&needle), "{text} lacks {needle}");
        }
    }
    // Bytes after the marker (a tar record's padding, or anything) are ignored, as tar does.
    let t = dir.path().join("padded.tar");
    let mut padded = full.clone();
    padded.extend_from_slice(&[0; 8192]);
    padded.extend_from_slice(b"not a header");
    std::fs::write(&t, &padded).unwrap();
    assert_eq!(
        WebDataset::open(&cfg(vec![t], vec![WdsField::Image]))
            .unwrap()
            .len(),
        3
    );
    // Cut inside the first member's data: Truncated, naming the member and offset.
    let t = dir.path().join("cut.tar");
    std::fs::write(&t, &full[..512 + 10]).unwrap();
    let e = WebDataset::open(&cfg(vec![t], vec![WdsField::Image])).unwrap_err();
    assert!(
        matches!(&e, WdsError::Truncated { member, offset: 512, .. } if member == "k0.jpg"),
        "{e}"
    );
    let e = WebDataset::open(&cfg(
        vec![dir.path().join("nope.tar")],
        vec![WdsField::Image],
    ))
    .unwrap_err();
    assert!(matches!(e, WdsError::Open { .. }) && e.to_string().contains("nope.tar"));
}

#[test]
fn a_zeroed_header_between_members_is_corrupt_not_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("full.tar");
    let keys: Vec<String> = (0..3).map(|i| format!("k{i}")).collect();
    write_tar(&p, &sample_members(&keys));
    let mut bytes = std::fs::read(&p).unwrap();
    let index = index_tar("full.tar", Cursor::new(&bytes), bytes.len() as u64).unwrap();
    // Zero the header of k1.PNG: tar's end-of-archive marker would be this block and the next,
    // and the next is k1.PNG's data, so the members from k1 on would be lost.
    let k1 = index.iter().find(|m| m.path == "k1.PNG").unwrap().offset as usize;
    bytes[k1 - 512..k1].fill(0);
    std::fs::write(&p, &bytes).unwrap();
    let e = WebDataset::open(&cfg(vec![p], vec![WdsField::Image])).unwrap_err();
    assert!(
        matches!(&e, WdsError::Corrupt { member, offset, .. } if member == "k0.json" && *offset == k1 as u64 - 512),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("full.tar")
            && text.contains(&format!("byte offset {k1}"))
            && text.contains("second zero block"),
        "{text}"
    );
}

#[test]
fn members_of_no_sample_are_skipped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.tar");
    let mut members = sample_members(&["a".into(), "b".into()]);
    // Between two samples, inside one (between its members), and after the last: none of them
    // splits or changes a sample.
    members.insert(3, ("README".into(), b"about".to_vec()));
    members.insert(1, ("meta/__index__".into(), b"{}".to_vec()));
    members.push(("dir/._b.jpg".into(), b"AppleDouble".to_vec()));
    write_tar(&p, &members);
    let q = dir.path().join("clean.tar");
    write_tar(&q, &sample_members(&["c".into()]));
    let len = std::fs::metadata(&p).unwrap().len();
    let index = index_tar("s.tar", std::fs::File::open(&p).unwrap(), len).unwrap();
    let mut src = WebDataset::open(&cfg(
        vec![q, p.clone()],
        vec![WdsField::Image, WdsField::Cls, WdsField::Json],
    ))
    .unwrap();
    assert_eq!(src.shard_sizes(), &[1, 2]);
    assert!(src.bad_samples().is_empty());
    for (id, (key, label)) in [(1u64, ("a", 0i64)), (2, ("b", 7))] {
        assert_eq!(src.key(id).unwrap().0, key);
        assert_eq!(read(&mut src, 0, id).unwrap()[1], label.to_le_bytes());
    }
    let u = src.unowned_members();
    assert_eq!(u.len(), 1, "{u:?}");
    let first = index.iter().find(|m| m.path == "meta/__index__").unwrap();
    assert_eq!(
        (
            u[0].shard.as_str(),
            u[0].count,
            u[0].member.as_str(),
            u[0].offset
        ),
        (
            p.display().to_string().as_str(),
            3,
            "meta/__index__",
            first.offset
        )
    );
    let text = u[0].to_string();
    for needle in [
        p.display().to_string(),
        "3 members belong to no sample".into(),
        format!("\"meta/__index__\" at byte offset {}", first.offset),
        "key.ext".into(),
    ] {
        assert!(text.contains(&needle), "{text} lacks {needle}");
    }
}

#[test]
fn python_tarfile_shards_end_with_the_marker_and_report_members_of_no_sample() {
    let Some(py) = common::python("python_tarfile_shards_end_with_the_marker") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    run_python(
        &py,
        r#"
import tarfile, io, sys, os
d = sys.argv[1]
with tarfile.open(os.path.join(d, 'py.tar'), 'w', format=tarfile.GNU_FORMAT) as t:
    for name, data in [('LICENSE', b'cc-by'), ('s0.jpg', b'J0'), ('s0.cls', b'3'),
                       ('s1.jpg', b'J1'), ('s1.cls', b'4'), ('s1', b'no extension')]:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
"#,
        &[dir.path()],
    );
    let p = dir.path().join("py.tar");
    let full = std::fs::read(&p).unwrap();
    // tarfile pads the archive to a record of 20 blocks after the marker.
    assert_eq!(full.len() % 10240, 0);
    let src =
        WebDataset::open(&cfg(vec![p.clone()], vec![WdsField::Image, WdsField::Cls])).unwrap();
    assert_eq!(src.len(), 2);
    let u = src.unowned_members();
    assert_eq!(
        (u.len(), u[0].count, u[0].member.as_str()),
        (1, 2, "LICENSE"),
        "{u:?}"
    );
    let index = index_tar("py.tar", Cursor::new(&full), full.len() as u64).unwrap();
    let last = index.last().unwrap();
    assert_eq!(last.path, "s1");
    let end = (last.offset + last.size).next_multiple_of(512) as usize;
    // Cut right after the last member (the marker and the padding gone), or inside the marker.
    for (cut, tail) in [(end, 0u64), (end + 512, 512)] {
        let t = dir.path().join("cut.tar");
        std::fs::write(&t, &full[..cut]).unwrap();
        let e = WebDataset::open(&cfg(vec![t], vec![WdsField::Image, WdsField::Cls])).unwrap_err();
        assert!(
            matches!(&e, WdsError::NoEndMarker { member, offset, tail: z, .. }
                if member == "s1" && *offset == cut as u64 && *z == tail),
            "{e:?}"
        );
    }
    // Cut inside the record's padding, after the marker: whole.
    let t = dir.path().join("cut.tar");
    std::fs::write(&t, &full[..end + 1024 + 512]).unwrap();
    assert_eq!(
        WebDataset::open(&cfg(vec![t], vec![WdsField::Image, WdsField::Cls]))
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn opens_from_toml_and_splits_keys_as_webdataset() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.tar");
    write_tar(&p, &sample_members(&["x".into(), "y".into()]));
    let text = format!("kind = \"webdataset\"\nshards = [{p:?}]\nfields = [\"cls\"]\n");
    let SourceConfig::WebDataset(c) = toml::from_str::<SourceConfig>(&text).unwrap() else {
        panic!("not a webdataset section")
    };
    assert_eq!(c.shuffle_buffer, 1000);
    assert_eq!(c.fields, [WdsField::Cls]);
    let src = SourceConfig::WebDataset(c).open().unwrap();
    assert_eq!(src.len(), 2);
    assert_eq!(
        split_key("a/b.c/key.seg.PNG"),
        Some(("a/b.c/key", "seg.png".to_string()))
    );
    assert_eq!(split_key("dir/.hidden"), None);
    assert_eq!(split_key("noext"), None);
}

/// The config of `.cls` and `.npy` members, the latter `f32` arrays of shape `[2, 3]` into the
/// field `feat` (with an image first when `image`).
fn npy_cfg(shards: Vec<PathBuf>, image: bool) -> WdsConfig {
    let mut fields = vec![WdsField::Cls, WdsField::Npy];
    if image {
        fields.insert(0, WdsField::Image);
    }
    WdsConfig {
        npy: Some(WdsNpy {
            field: "feat".into(),
            dtype: NpyDtype::Float32,
            shape: vec![2, 3],
        }),
        ..cfg(shards, fields)
    }
}

/// 24 bytes of sample `i`'s `f32` array.
fn feat(i: usize) -> Vec<u8> {
    (0..6)
        .flat_map(|k| ((i * 10 + k) as f32 * 0.5 - 3.0).to_le_bytes())
        .collect()
}

#[test]
fn npy_members_are_read_exactly_into_the_declared_field() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.tar");
    let mut members = Vec::new();
    for i in 0..6usize {
        let k = format!("k{i}");
        members.push((format!("{k}.jpg"), content(&k)));
        members.push((format!("{k}.cls"), i.to_string().into_bytes()));
        // Header versions 1.0, 2.0 and 3.0; '<' and '=' byte orders.
        let descr = if i % 2 == 0 { "<f4" } else { "=f4" };
        let v = (i % 3) as u8 + 1;
        members.push((
            format!("{k}.NPY"),
            npy_bytes(v, descr, false, &[2, 3], &feat(i)),
        ));
        // A json member beside them: not asked for, ignored.
        members.push((format!("{k}.json"), b"{}".to_vec()));
    }
    write_tar(&p, &members);
    let mut src = WebDataset::open(&npy_cfg(vec![p], true)).unwrap();
    let names: Vec<&str> = src.fields().iter().map(|f| f.name()).collect();
    assert_eq!(names, ["images", "labels", "feat"]);
    let SourceField::Fixed(f) = &src.fields()[2] else {
        panic!("the npy field is fixed");
    };
    assert_eq!(
        (f.dtype, f.shape.as_slice()),
        (pinring_data::Dtype::F32, &[2u32, 3][..])
    );
    assert_eq!(src.len(), 6);
    for i in 0..6usize {
        let got = read(&mut src, 0, i as u64).unwrap();
        assert_eq!(got[0], content(&format!("k{i}")), "image of {i}");
        assert_eq!(got[1], (i as i64).to_le_bytes(), "label of {i}");
        assert_eq!(got[2], feat(i), "array of {i}");
    }
}

#[test]
fn bad_npy_members_are_typed_per_sample_errors_naming_shard_member_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.tar");
    let good = npy_bytes(1, "<f4", false, &[2, 3], &feat(0));
    let mut truncated = good.clone();
    truncated.truncate(good.len() - 5);
    let mut long = good.clone();
    long.push(0);
    let mut corrupt = good.clone();
    corrupt[1] = b'X'; // no \x93NUMPY magic
    let cut_header = good[..40].to_vec(); // ends inside the header
    let samples: Vec<(&str, Vec<u8>)> = vec![
        ("good", good.clone()),
        ("dtype", npy_bytes(1, "<f8", false, &[2, 3], &[0; 48])),
        ("shape", npy_bytes(1, "<f4", false, &[3, 2], &feat(0))),
        ("scalar", npy_bytes(1, "<f4", false, &[], &[0; 4])),
        ("big", npy_bytes(1, ">f4", false, &[2, 3], &feat(0))),
        ("fortran", npy_bytes(1, "<f4", true, &[2, 3], &feat(0))),
        ("corrupt", corrupt),
        ("cut", cut_header),
        ("truncated", truncated),
        ("long", long),
        ("empty", Vec::new()),
        ("last", good.clone()),
    ];
    let mut members = Vec::new();
    for (i, (k, npy)) in samples.iter().enumerate() {
        members.push((format!("{k}.cls"), i.to_string().into_bytes()));
        members.push((format!("{k}.npy"), npy.clone()));
    }
    write_tar(&p, &members);
    let len = std::fs::metadata(&p).unwrap().len();
    let index = index_tar("bad.tar", std::fs::File::open(&p).unwrap(), len).unwrap();
    let offset_of = |member: &str| index.iter().find(|m| m.path == member).unwrap().offset;
    let mut src = WebDataset::open(&npy_cfg(vec![p.clone()], false)).unwrap();
    assert_eq!(src.len(), samples.len() as u64);
    assert!(
        src.bad_samples().is_empty(),
        "npy members are checked when read"
    );
    let err = |src: &mut WebDataset, id: u64| -> (String, NpyProblem, String) {
        let e = read(src, 0, id).unwrap_err();
        let text = e.to_string();
        let SourceError::WebDataset(WdsError::Npy {
            shard,
            member,
            offset,
            problem,
        }) = e
        else {
            panic!("sample {id}: not an npy error: {e:?}");
        };
        assert_eq!(shard, p.display().to_string());
        assert_eq!(
            offset,
            offset_of(&member),
            "{member}: the member's data offset"
        );
        for needle in [
            p.display().to_string(),
            format!("{member:?}"),
            format!("byte offset {offset}"),
            "dataset.on_bad_sample".into(),
        ] {
            assert!(text.contains(&needle), "{text} lacks {needle}");
        }
        (member, problem, text)
    };
    let (m, problem, text) = err(&mut src, 1);
    assert_eq!(m, "dtype.npy");
    assert_eq!(
        problem,
        NpyProblem::Dtype {
            found: "float64".into(),
            expected: "float32"
        }
    );
    assert!(
        text.contains("float64") && text.contains("float32"),
        "{text}"
    );
    let (_, problem, text) = err(&mut src, 2);
    assert_eq!(
        problem,
        NpyProblem::Shape {
            found: vec![3, 2],
            expected: vec![2, 3]
        }
    );
    assert!(text.contains("[3, 2]") && text.contains("[2, 3]"), "{text}");
    let (_, problem, _) = err(&mut src, 3);
    assert!(matches!(problem, NpyProblem::Shape { found, .. } if found.is_empty()));
    let (_, problem, _) = err(&mut src, 4);
    assert!(
        matches!(&problem, NpyProblem::Dtype { found, .. } if found.contains(">f4") && found.contains("big-endian")),
        "{problem:?}"
    );
    let (_, problem, _) = err(&mut src, 5);
    assert!(
        matches!(&problem, NpyProblem::Header { problem, .. } if problem.contains("Fortran")),
        "{problem:?}"
    );
    // Corrupt headers: the offset of the problem is in the shard (the magic: the member's start).
    let (m, problem, _) = err(&mut src, 6);
    assert!(
        matches!(&problem, NpyProblem::Header { offset, problem } if *offset == offset_of(&m) && problem.contains("magic")),
        "{problem:?}"
    );
    let (_, problem, _) = err(&mut src, 7);
    assert!(
        matches!(&problem, NpyProblem::Header { problem, .. } if problem.contains("ends inside the header")),
        "{problem:?}"
    );
    let (_, problem, text) = err(&mut src, 8);
    let need = good.len() as u64;
    assert_eq!(
        problem,
        NpyProblem::Size {
            found: need - 5,
            expected: need
        }
    );
    assert!(text.contains("truncated"), "{text}");
    let (_, problem, _) = err(&mut src, 9);
    assert_eq!(
        problem,
        NpyProblem::Size {
            found: need + 1,
            expected: need
        }
    );
    let (_, problem, _) = err(&mut src, 10);
    assert!(matches!(problem, NpyProblem::Header { .. }), "{problem:?}");
    // The source stays usable: the good samples around the bad ones read exactly.
    for id in [0u64, 11] {
        let got = read(&mut src, 0, id).unwrap();
        assert_eq!(got[0], (id as i64).to_le_bytes());
        assert_eq!(got[1], feat(0));
    }
}

#[test]
fn a_declared_npy_field_must_be_asked_for_and_named_apart() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.tar");
    write_tar(&p, &sample_members(&["x".into()]));
    let mut c = npy_cfg(vec![p.clone()], true);
    c.fields = vec![WdsField::Image, WdsField::Cls];
    let e = WebDataset::open(&c).unwrap_err();
    assert!(
        matches!(e, WdsError::Param { key: "npy", .. }) && e.to_string().contains("\"npy\""),
        "{e}"
    );
    for clash in ["labels", "images"] {
        let mut c = npy_cfg(vec![p.clone()], true);
        c.npy.as_mut().unwrap().field = clash.into();
        let e = WebDataset::open(&c).unwrap_err();
        assert!(
            matches!(
                e,
                WdsError::Param {
                    key: "npy.field",
                    ..
                }
            ) && e.to_string().contains(clash)
                && e.to_string().contains("must differ"),
            "{e}"
        );
    }
    // Without a declared array the npy member stays encoded bytes named "npy".
    let c = cfg(vec![p], vec![WdsField::Npy]);
    let src = WebDataset::open(&c).unwrap();
    assert_eq!(src.fields(), &[SourceField::Encoded { name: "npy".into() }]);
}

#[test]
fn epoch_order_examples() {
    // Shards of 3, 2, 4 samples: ids 0..3, 3..5, 5..9. World 2: rank 0 has shards 0 and 2.
    let sizes = [3u64, 2, 4];
    let r0: BTreeSet<u64> = rank_stream(&sizes, 1, 0, 0, 2).into_iter().collect();
    assert_eq!(r0, [0, 1, 2, 5, 6, 7, 8].into_iter().collect());
    assert_eq!(rank_stream(&sizes, 1, 0, 1, 2), vec![3, 4]);
    // Without a buffer the stream keeps each shard's member order.
    let s = epoch_order_for(&sizes, 1, 0, 0, 1, 0);
    for w in [0u64, 3, 5] {
        let i = s.iter().position(|&x| x == w).unwrap();
        assert_eq!(s[i + 1], w + 1);
    }
    // Different epochs or seeds give different orders (with overwhelming probability).
    let big = [50u64; 8];
    let a = epoch_order_for(&big, 1, 0, 0, 1, 16);
    assert_ne!(a, epoch_order_for(&big, 1, 1, 0, 1, 16));
    assert_ne!(a, epoch_order_for(&big, 2, 0, 0, 1, 16));
    assert_eq!(a, epoch_order_for(&big, 1, 0, 0, 1, 16));
    // More ranks than shards: the extra ranks get nothing.
    assert!(epoch_order_for(&[5], 0, 0, 1, 2, 4).is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn rank_orders_are_disjoint_cover_and_bounded(
        sizes in proptest::collection::vec(0u64..40, 0..12),
        world in 1u32..6,
        buffer in 0usize..50,
        seed in any::<u64>(),
        epoch in 0u32..1000,
    ) {
        let total: u64 = sizes.iter().sum();
        let mut seen = vec![false; total as usize];
        for rank in 0..world {
            let order = epoch_order_for(&sizes, seed, epoch, rank, world, buffer);
            prop_assert_eq!(&order, &epoch_order_for(&sizes, seed, epoch, rank, world, buffer));
            let stream = rank_stream(&sizes, seed, epoch, rank, world);
            prop_assert_eq!(order.len(), stream.len());
            for (q, &id) in order.iter().enumerate() {
                prop_assert!(id < total);
                prop_assert!(!seen[id as usize], "id {} delivered twice", id);
                seen[id as usize] = true;
                // Never more than buffer - 1 places ahead of its streaming position.
                let p = stream.iter().position(|&x| x == id).unwrap();
                prop_assert!(q + buffer.max(1) > p, "id {} at {} streamed at {}", id, q, p);
            }
        }
        prop_assert!(seen.iter().all(|&s| s), "every sample is delivered");
    }
}
