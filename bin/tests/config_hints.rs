//! `pinring config check` on the mistakes a new user makes in a config: each refused with a hint
//! that points at the real fix (the key's table and line, pinring's name of a dtype, the folder a
//! relative path was resolved against, what a shard that is a directory is), every dataset file
//! checked to be a regular file at check time, shard globs expanded, and a file that sets nothing
//! said to do so.

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};

/// `pinring config check FILE` run in `cwd`: (exit code, stdout, stderr).
fn check_in(cwd: &Path, file: &Path) -> (Option<i32>, String, String) {
    let child = Command::new(exe(CLI))
        .args(["config", "check"])
        .arg(file)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn check(fx: &Fixture) -> (Option<i32>, String, String) {
    check_in(fx.dir.path(), &fx.config)
}

/// A `.npy` file (version 1.0) of u8 `shape`, zeros.
fn npy_u8(shape: &[u64]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut dict = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': {shape_text}, }}");
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(out.len() + shape.iter().product::<u64>() as usize, 0);
    out
}

/// Tar shards `wds/shard-<i>.tar`, `n` samples each (an empty `.png` member is enough to count:
/// config check reads headers only), and a file that is not a shard beside them.
fn shards(dir: &Path, count: usize, n: usize) {
    std::fs::create_dir_all(dir.join("wds")).unwrap();
    for s in 0..count {
        let file = std::fs::File::create(dir.join(format!("wds/shard-{s}.tar"))).unwrap();
        let mut b = tar::Builder::new(file);
        for k in 0..n {
            for (name, data) in [
                (format!("s{s}-{k}.png"), &b"png"[..]),
                (format!("s{s}-{k}.cls"), &b"1"[..]),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, &name, data).unwrap();
            }
        }
        b.into_inner().unwrap();
    }
    std::fs::write(dir.join("wds/README.txt"), "not a shard").unwrap();
}

const WDS: &str = "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = SHARDS\n\
                   [dataset.image]\ncrop = 8\n[plan]\nbatch_size = 2\n";

#[test]
fn every_dataset_file_is_checked_to_be_a_regular_file_at_check_time() {
    // npy labels that are a directory, and a data file that is a FIFO: refused by config check,
    // naming the file and what it is (the loaders' own open, reached at check time).
    let fx = Fixture::new(
        "hints-npy",
        "[dataset]\nkind = \"npy\"\n[dataset.npy]\npath = \"x.npy\"\ndtype = \"u8\"\n\
         shape = [4]\nlabels = \"y.npy\"\nlabels_dtype = \"u8\"\n[plan]\nbatch_size = 2\n",
    );
    std::fs::write(fx.dir.path().join("x.npy"), npy_u8(&[6, 4])).unwrap();
    std::fs::create_dir(fx.dir.path().join("y.npy")).unwrap();
    let (code, _, err) = check(&fx);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("y.npy") && err.contains("a directory, not a regular file"),
        "{err}"
    );
    std::fs::remove_dir(fx.dir.path().join("y.npy")).unwrap();
    std::fs::write(fx.dir.path().join("y.npy"), npy_u8(&[6])).unwrap();
    let (code, out, err) = check(&fx);
    assert_eq!(code, Some(0), "{out}{err}");
    std::fs::remove_file(fx.dir.path().join("x.npy")).unwrap();
    nix::unistd::mkfifo(
        &fx.dir.path().join("x.npy"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let (code, _, err) = check(&fx);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("x.npy") && err.contains("named pipe (FIFO), not a regular file"),
        "{err}"
    );
}

#[test]
fn a_shard_that_is_a_directory_says_so_and_how_to_name_its_shards() {
    let fx = Fixture::new("hints-shard-dir", &WDS.replace("SHARDS", "[\"wds\"]"));
    shards(fx.dir.path(), 2, 3);
    let (code, _, err) = check(&fx);
    assert_eq!(code, Some(3), "{err}");
    for needle in [
        "shard wds",
        "is a directory, not a tar file",
        "dataset.webdataset.shards",
        "\"wds/*.tar\"",
    ] {
        assert!(err.contains(needle), "{err} lacks {needle:?}");
    }
    assert!(!err.contains("not a valid tar file"), "{err}");
}

#[test]
fn shard_globs_are_expanded_sorted_and_one_string_is_one_entry() {
    let fx = Fixture::new(
        "hints-glob",
        &WDS.replace("SHARDS", "[\"wds/shard-*.tar\"]"),
    );
    shards(fx.dir.path(), 12, 2);
    let (code, out, err) = check(&fx);
    assert_eq!(code, Some(0), "{out}{err}");
    // Sorted lexicographically: shard-10 before shard-2.
    let want: Vec<String> = {
        let mut v: Vec<String> = (0..12).map(|s| format!("wds/shard-{s}.tar")).collect();
        v.sort();
        v
    };
    let listed = format!(
        "shards = [\n{}]",
        want.iter()
            .map(|s| format!("    \"{s}\",\n"))
            .collect::<String>()
    );
    assert!(out.contains(&listed), "{out} lacks {listed}");
    assert!(out.contains("samples = 24"), "{out}");
    // The same as one string.
    std::fs::write(&fx.config, WDS.replace("SHARDS", "\"wds/shard-*.tar\"")).unwrap();
    let (code, out2, err) = check(&fx);
    assert_eq!(code, Some(0), "{out2}{err}");
    assert!(out2.contains(&listed), "{out2}");
    let fingerprint = |o: &str| {
        o.lines()
            .find(|l| l.starts_with("# plan:"))
            .and_then(|l| l.split("fingerprint ").nth(1))
            .map(str::to_string)
    };
    assert_eq!(fingerprint(&out), fingerprint(&out2));
    assert!(fingerprint(&out).is_some(), "{out}");
    // One shard more matched: another fingerprint (the expanded list is hashed).
    shards(fx.dir.path(), 13, 2);
    let (code, out3, err) = check(&fx);
    assert_eq!(code, Some(0), "{out3}{err}");
    assert_ne!(fingerprint(&out3), fingerprint(&out));
    // A glob that matches nothing names the pattern and the folder it was resolved against.
    std::fs::write(&fx.config, WDS.replace("SHARDS", "[\"wds/train-*.tar\"]")).unwrap();
    let (code, _, err) = check(&fx);
    assert_eq!(code, Some(3), "{err}");
    let folder = fx.dir.path().display().to_string();
    for needle in ["wds/train-*.tar", "matches no file", folder.as_str()] {
        assert!(err.contains(needle), "{err} lacks {needle:?}");
    }
}

#[test]
fn a_relative_path_that_cannot_be_opened_names_the_folder_it_was_resolved_against() {
    let fx = Fixture::new(
        "hints-rel",
        "[dataset]\nkind = \"tokens\"\n[dataset.tokens]\nfiles = [\"data/train.bin\"]\n\
         seq_len = 8\n",
    );
    // The config named relative to the working directory: its folder is still named whole.
    let (code, _, err) = check_in(fx.dir.path(), Path::new("pinring.toml"));
    assert_eq!(code, Some(3), "{err}");
    let want = format!("data/train.bin (relative to {}", fx.dir.path().display());
    assert!(err.contains(&want), "{err} lacks {want:?}");
    assert!(err.contains("No such file"), "{err}");
    // Run from another folder: the config's folder, not the working directory.
    let elsewhere = tempfile::tempdir().unwrap();
    let (code, _, err) = check_in(elsewhere.path(), &fx.config);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains(&want), "{err} lacks {want:?}");
}

#[test]
fn a_numpy_or_torch_dtype_name_is_told_pinrings_name() {
    for (given, ours) in [
        ("float32", "f32"),
        ("torch.bfloat16", "bf16"),
        ("int64", "i64"),
        ("uint8", "u8"),
        ("float16", "f16"),
    ] {
        let fx = Fixture::new(
            &format!("hints-dtype-{ours}"),
            &format!("[dataset]\nsample_shape = [4]\ndtype = \"{given}\"\n"),
        );
        let (code, _, err) = check(&fx);
        assert_eq!(code, Some(3), "{err}");
        let hint = format!("pinring calls it \"{ours}\"");
        assert!(err.contains(&hint), "{err} lacks {hint:?}");
        assert!(err.contains("line 3, column 9"), "{err}");
    }
}

#[test]
fn a_key_in_the_wrong_table_names_its_table_and_points_at_its_line() {
    // seq_len under [dataset] instead of [dataset.tokens].
    let fx = Fixture::new(
        "hints-table",
        "# training data\n[dataset]\nkind = \"tokens\"\n\n  seq_len = 8\n[dataset.tokens]\n\
         files = [\"t.bin\"]\n",
    );
    let (code, _, err) = check(&fx);
    assert_eq!(code, Some(3), "{err}");
    for needle in [
        "seq_len belongs in [dataset.tokens]",
        "line 5, column 3",
        "5 |   seq_len = 8",
    ] {
        assert!(err.contains(needle), "{err} lacks {needle:?}");
    }
    // A key of the table of another kind, found by the dataset's own check: at its line too.
    std::fs::write(
        &fx.config,
        "[dataset]\nkind = \"tokens\"\n[dataset.tokens]\nfiles = [\"t.bin\"]\nseq_len = 8\n\
         shards = [\"a.tar\"]\n",
    )
    .unwrap();
    let (code, _, err) = check(&fx);
    assert_eq!(code, Some(3), "{err}");
    for needle in ["shards belongs in [dataset.webdataset]", "line 6, column 1"] {
        assert!(err.contains(needle), "{err} lacks {needle:?}");
    }
    // A synthetic key beside a file kind: at its line, not at [dataset]'s.
    std::fs::write(
        &fx.config,
        "[dataset]\nkind = \"tokens\"\nsample_shape = [4]\n[dataset.tokens]\n\
         files = [\"t.bin\"]\nseq_len = 8\n",
    )
    .unwrap();
    let (code, _, err) = check(&fx);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("line 3, column 1") && err.contains("dataset.sample_shape"),
        "{err}"
    );
    // A plan key under [ring].
    std::fs::write(&fx.config, "[ring]\nbatch_size = 8\n").unwrap();
    let (code, _, err) = check(&fx);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("batch_size belongs in [plan]") && err.contains("line 2, column 1"),
        "{err}"
    );
}

#[test]
fn a_config_file_that_sets_nothing_is_said_to() {
    let fx = Fixture::new(
        "hints-empty",
        "# my training run\n\n[plan]\n# batch_size = 64\n",
    );
    let (code, out, err) = check(&fx);
    assert_eq!(code, Some(0), "{out}{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("# warning:") && l.contains("sets nothing"))
        .unwrap_or_else(|| panic!("no warning that the file sets nothing:\n{out}"));
    assert!(
        line.contains("pinring.toml") && line.contains("default"),
        "{line}"
    );
    // A file that sets one key is not warned about.
    std::fs::write(&fx.config, "[plan]\nbatch_size = 64\n").unwrap();
    let (code, out, err) = check(&fx);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!out.contains("sets nothing"), "{out}");
}
