//! Image folders: order and labels against a Python reimplementation of torchvision's
//! `find_classes` / `make_dataset`, and the bytes of each file.

mod common;

use std::path::{Path, PathBuf};

use common::{read, run_python};
use pinring_sources::{ImageFolder, ImageFolderConfig, ImageFolderError, SourceConfig};

const FILES: [&str; 14] = [
    "cat/b.jpg",
    "cat/A.JPG",
    "cat/c.txt",
    "cat/sub/x.png",
    "cat/sub-dir/y.jpeg",
    "cat/sub/deeper/z.jpg",
    "cat/sub0/w.Png",
    "dog/1.png",
    "dog/10.png",
    "dog/2.png",
    "dog/notes.md",
    "Zebra/q.jpeg",
    "Zebra/q.jpeg.bak",
    "stray.jpg",
];

fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in FILES {
        let p = dir.path().join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("bytes of {f}")).unwrap();
    }
    // A symlinked directory inside a class is followed, as os.walk(followlinks=True) does.
    std::os::unix::fs::symlink(dir.path().join("dog"), dir.path().join("cat/linked")).unwrap();
    dir
}

fn cfg(root: &Path) -> ImageFolderConfig {
    ImageFolderConfig {
        root: root.to_path_buf(),
        extensions: vec!["jpg".into(), "jpeg".into(), "png".into()],
    }
}

#[test]
fn order_and_labels_follow_torchvision() {
    let dir = tree();
    let root = dir.path();
    let mut src = ImageFolder::open(&cfg(root)).unwrap();
    let classes: Vec<String> = src
        .classes()
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    assert_eq!(classes, ["Zebra", "cat", "dog"]);
    let got: Vec<(String, u32)> = src
        .samples()
        .iter()
        .map(|(p, l)| {
            (
                p.strip_prefix(root).unwrap().to_string_lossy().into_owned(),
                *l,
            )
        })
        .collect();
    let want: Vec<(String, u32)> = [
        ("Zebra/q.jpeg", 0),
        ("cat/A.JPG", 1),
        ("cat/b.jpg", 1),
        ("cat/linked/1.png", 1),
        ("cat/linked/10.png", 1),
        ("cat/linked/2.png", 1),
        ("cat/sub/x.png", 1),
        ("cat/sub-dir/y.jpeg", 1),
        ("cat/sub/deeper/z.jpg", 1),
        ("cat/sub0/w.Png", 1),
        ("dog/1.png", 2),
        ("dog/10.png", 2),
        ("dog/2.png", 2),
    ]
    .iter()
    .map(|(p, l)| (p.to_string(), *l))
    .collect();
    assert_eq!(got, want);
    for (id, (path, label)) in want.iter().enumerate() {
        let f = read(&mut src, 0, id as u64).unwrap();
        assert_eq!(f[0], std::fs::read(root.join(path)).unwrap());
        assert_eq!(f[1], i64::from(*label).to_le_bytes());
    }
    if let Some(py) = common::python("order_and_labels_follow_torchvision") {
        let out = run_python(
            &py,
            r#"
import os, sys
IMG = ('.jpg', '.jpeg', '.png')
directory = sys.argv[1]
classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
for idx, target_class in enumerate(classes):
    target_dir = os.path.join(directory, target_class)
    for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
        for fname in sorted(fnames):
            if fname.lower().endswith(IMG):
                print(f'{os.path.join(root, fname)}\t{idx}')
"#,
            &[root],
        );
        let py: Vec<(PathBuf, u32)> = out
            .lines()
            .map(|l| {
                let (p, i) = l.split_once('\t').unwrap();
                (PathBuf::from(p), i.parse().unwrap())
            })
            .collect();
        assert_eq!(src.samples(), py.as_slice());
    }
}

#[test]
fn empty_classes_missing_roots_and_vanished_files() {
    let dir = tree();
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let e = ImageFolder::open(&cfg(dir.path())).unwrap_err();
    assert!(
        matches!(e, ImageFolderError::EmptyClass { .. }) && e.to_string().contains("empty"),
        "{e}"
    );
    let mut c = cfg(dir.path());
    c.extensions.push("md".into());
    c.extensions.push("bak".into());
    std::fs::write(dir.path().join("empty/readme.MD"), "x").unwrap();
    let mut src = ImageFolder::open(&c).unwrap();
    assert_eq!(src.classes().len(), 4);
    let e = ImageFolder::open(&cfg(&dir.path().join("absent"))).unwrap_err();
    assert!(
        matches!(e, ImageFolderError::List { .. }) && e.to_string().contains("absent"),
        "{e}"
    );
    let flat = tempfile::tempdir().unwrap();
    std::fs::write(flat.path().join("a.jpg"), "x").unwrap();
    assert!(matches!(
        ImageFolder::open(&cfg(flat.path())).unwrap_err(),
        ImageFolderError::NoClasses { .. }
    ));
    // A file removed after open: a per-sample error naming it; the rest still read.
    std::fs::remove_file(dir.path().join("Zebra/q.jpeg")).unwrap();
    let e = read(&mut src, 0, 0).unwrap_err();
    assert!(e.to_string().contains("q.jpeg"), "{e}");
    assert!(read(&mut src, 0, 2).is_ok());
}

#[test]
fn opens_from_toml() {
    let dir = tree();
    let text = format!(
        "kind = \"imagefolder\"\nroot = {:?}\nextensions = [\"PNG\"]\n",
        dir.path()
    );
    let src = toml::from_str::<SourceConfig>(&text).unwrap().open();
    // Zebra has no png: torchvision refuses an empty class too.
    assert!(src.is_err());
    std::fs::remove_dir_all(dir.path().join("Zebra")).unwrap();
    let src = toml::from_str::<SourceConfig>(&text)
        .unwrap()
        .open()
        .unwrap();
    assert_eq!(src.len(), 8);
}

#[test]
fn open_dataset_decodes_the_images_into_the_declared_field() {
    use pinring_sources::{FieldBuf, SourceError};
    let dir = tree();
    let text = "[dataset]\nkind = \"imagefolder\"\n[dataset.imagefolder]\nroot = \".\"\n\
                [dataset.image]\ntransform = \"eval\"\ncrop = 8\nresize = 10\noutput = \"bf16\"\n";
    let p = dir.path().join("pinring.toml");
    std::fs::write(&p, text).unwrap();
    let cfg = pinring_data::Config::load(&p).unwrap();
    let mut src = pinring_sources::open_dataset(&cfg).unwrap().unwrap();
    // The image field is the fixed one the config declares: bf16 [3, 8, 8], then the labels.
    let fields: Vec<_> = src
        .fields()
        .iter()
        .map(|f| f.fixed().unwrap().clone())
        .collect();
    assert_eq!(fields, cfg.fields());
    assert_eq!(fields[0].sample_bytes(), 3 * 8 * 8 * 2);
    // These files are text, not images: a per-sample error naming the file and the problem,
    // and the source stays usable.
    let (mut img, mut label) = (vec![0u8; 384], [0u8; 8]);
    for (id, class) in [(0, "Zebra"), (1, "cat")] {
        let e = src
            .read(
                0,
                id,
                &mut [FieldBuf::Fixed(&mut img), FieldBuf::Fixed(&mut label)],
            )
            .unwrap_err();
        assert!(matches!(e, SourceError::Image { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("image file") && msg.contains(class) && msg.contains("not a JPEG or PNG"),
            "{msg}"
        );
    }
}
