//! Paths that are not regular files: a named pipe (FIFO) would block a plain `open()` until a
//! writer came, and no signal ends that wait, so every reader opens without blocking and
//! refuses a FIFO, a socket, a device or a directory by name, at once.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use pinring_sources::webdataset::WdsField;
use pinring_sources::{
    ImageFolder, ImageFolderConfig, ImageFolderError, NpyConfig, NpySource, TokenDtype,
    TokenOutDtype, Tokens, TokensConfig, WdsConfig, WebDataset,
};

fn fifo(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    p
}

fn tokens(files: Vec<PathBuf>) -> TokensConfig {
    TokensConfig {
        files,
        token_dtype: TokenDtype::U16,
        seq_len: 4,
        stride: None,
        shift: false,
        seed: 1,
        dtype: TokenOutDtype::I64,
    }
}

fn npy(path: &Path) -> NpyConfig {
    NpyConfig {
        path: path.to_path_buf(),
        field: "data".into(),
        dtype: None,
        shape: None,
        labels: None,
    }
}

fn shards(shards: Vec<PathBuf>) -> WdsConfig {
    WdsConfig {
        shards,
        fields: vec![WdsField::Cls],
        shuffle_buffer: 8,
        npy: None,
    }
}

/// `err` names `path` and says it is `what`.
fn names(err: &dyn std::error::Error, path: &Path, what: &str) {
    let text = err.to_string();
    assert!(
        text.contains(&path.display().to_string()) && text.contains(what),
        "{text}"
    );
}

#[test]
fn a_fifo_is_refused_by_every_reader_without_waiting_for_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let p = fifo(dir.path(), "pipe");
    // Each open returns (a blocking open would hang this test until its harness timed out).
    names(
        &Tokens::open(&tokens(vec![p.clone()])).unwrap_err(),
        &p,
        "named pipe (FIFO), not a regular file",
    );
    names(
        &NpySource::open(&npy(&p)).unwrap_err(),
        &p,
        "named pipe (FIFO)",
    );
    names(
        &WebDataset::open(&shards(vec![p.clone()])).unwrap_err(),
        &p,
        "named pipe (FIFO)",
    );
    let e = NpySource::open(&NpyConfig {
        labels: Some(p.clone()),
        ..npy(&write_npy(dir.path()))
    })
    .unwrap_err();
    names(&e, &p, "named pipe (FIFO)");
}

#[test]
fn a_directory_a_socket_and_a_device_are_refused_as_data_files() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let e = Tokens::open(&tokens(vec![sub.clone()])).unwrap_err();
    names(&e, &sub, "a directory, not a regular file");
    assert!(e.to_string().contains("dataset.tokens.files"), "{e}");
    names(
        &WebDataset::open(&shards(vec![sub.clone()])).unwrap_err(),
        &sub,
        "a directory",
    );

    let sock = dir.path().join("sock");
    let _listener = UnixListener::bind(&sock).unwrap();
    names(
        &WebDataset::open(&shards(vec![sock.clone()])).unwrap_err(),
        &sock,
        "a socket",
    );
    names(
        &Tokens::open(&tokens(vec![sock.clone()])).unwrap_err(),
        &sock,
        "a socket",
    );

    let null = PathBuf::from("/dev/null");
    names(
        &Tokens::open(&tokens(vec![null.clone()])).unwrap_err(),
        &null,
        "a character device",
    );
    names(
        &NpySource::open(&npy(&null)).unwrap_err(),
        &null,
        "a character device",
    );
}

#[test]
fn an_image_folder_refuses_a_fifo_named_like_an_image_when_it_is_listed() {
    let dir = tempfile::tempdir().unwrap();
    let cls = dir.path().join("cls");
    std::fs::create_dir(&cls).unwrap();
    std::fs::write(cls.join("b.jpg"), b"not decoded here").unwrap();
    let p = fifo(&cls, "a.jpg");
    // A FIFO whose name is no image is not the folder's business (torchvision skips it too).
    fifo(&cls, "notes.txt");
    let cfg = ImageFolderConfig {
        root: dir.path().to_path_buf(),
        extensions: vec!["jpg".into()],
    };
    let e = ImageFolder::open(&cfg).unwrap_err();
    assert!(matches!(e, ImageFolderError::NotAFile { .. }), "{e:?}");
    names(&e, &p, "a named pipe (FIFO), not a regular file");

    // Swapped in after the listing: the read refuses it as a bad sample, at once.
    std::fs::remove_file(&p).unwrap();
    std::fs::write(&p, b"a file at listing time").unwrap();
    let mut src = ImageFolder::open(&cfg).unwrap();
    std::fs::remove_file(&p).unwrap();
    fifo(&cls, "a.jpg");
    let mut bytes = Vec::new();
    let mut label = [0u8; 8];
    let mut out = [
        pinring_sources::FieldBuf::Bytes(&mut bytes),
        pinring_sources::FieldBuf::Fixed(&mut label),
    ];
    use pinring_sources::Source;
    let e = src.read(0, 0, &mut out).unwrap_err();
    names(&e, &p, "a named pipe (FIFO)");
}

/// A small valid .npy file (4 samples of one u8) in `dir`.
fn write_npy(dir: &Path) -> PathBuf {
    let p = dir.join("data.npy");
    let header = "{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }";
    let mut h = header.to_string();
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(h.len() as u16).to_le_bytes());
    bytes.extend_from_slice(h.as_bytes());
    bytes.extend_from_slice(&[1, 2, 3, 4]);
    std::fs::write(&p, bytes).unwrap();
    p
}
