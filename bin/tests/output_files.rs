//! End to end: the files pinring writes where the user says (`--summary`, the bench's outputs)
//! never follow a link planted by someone else and never replace what is not a regular file.
//! docs/RELIABILITY.md, "Output files".

mod common;

use common::*;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The unprivileged user that plants the links (nobody).
const OTHER_UID: u32 = 65534;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `pinring run` on the fixture's small config, one epoch, writing its summary to `summary`.
fn run_with_summary(fx: &Fixture, summary: &Path) -> (std::process::ExitStatus, String) {
    let child = Command::new(exe(CLI))
        .args(["run", "--ring", &fx.ring, "--backend", "host", "--quiet"])
        .args(["--loaders", "2", "--epochs", "1"])
        .arg("--config")
        .arg(&fx.config)
        .arg("--summary")
        .arg(summary)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(child, "pinring run", LONG)
}

/// A directory anyone may write into (mode 0777, not sticky: the kernel's protection of links
/// in sticky directories does not apply, so the test sees pinring's own behaviour).
fn shared_dir(fx: &Fixture) -> std::path::PathBuf {
    let d = fx.dir.path().join("shared");
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    // The fixture's own directory is 0700; others must reach the shared one through it.
    std::fs::set_permissions(fx.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// `ln -s target link` as the other user.
fn plant_link(target: &Path, link: &Path) {
    let st = Command::new("ln")
        .arg("-s")
        .arg(target)
        .arg(link)
        .uid(OTHER_UID)
        .gid(OTHER_UID)
        .status()
        .unwrap();
    assert!(st.success(), "ln -s as uid {OTHER_UID} failed");
    let meta = std::fs::symlink_metadata(link).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), OTHER_UID);
}

#[test]
fn a_summary_written_as_root_never_follows_a_link_another_user_planted() {
    if !is_root() {
        println!("SKIPPED: needs root to plant links as another uid and run pinring as root");
        return;
    }
    let fx = Fixture::small("out-link");
    let dir = shared_dir(&fx);
    // A root-owned 0600 file elsewhere: what the planted links point at.
    let victim = fx.dir.path().join("root-only");
    std::fs::write(&victim, b"root's secret\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Every temporary name a writer might guess, planted as links to the victim.
    let summary = dir.join("s.json");
    for tmp in ["s.json.tmp", ".s.json.tmp", "s.tmp", "s.json~"] {
        plant_link(&victim, &dir.join(tmp));
    }
    let (status, log) = run_with_summary(&fx, &summary);
    assert_eq!(status.code(), Some(0), "{log}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"root's secret\n");
    let meta = std::fs::symlink_metadata(&summary).unwrap();
    assert!(meta.file_type().is_file());
    let s = pinring_daemon::summary::Summary::read(&summary).unwrap();
    assert_eq!(s.missing, 0, "{s:#?}");

    // The summary's own name planted as a link: refused with exit 9, naming the path; the
    // link and the file it points at are left as they were.
    std::fs::remove_file(&summary).unwrap();
    plant_link(&victim, &summary);
    let (status, log) = run_with_summary(&fx, &summary);
    assert_eq!(status.code(), Some(9), "{log}");
    assert!(
        log.contains(&summary.display().to_string()) && log.contains("symbolic link"),
        "{log}"
    );
    assert!(std::fs::symlink_metadata(&summary)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(&victim).unwrap(), b"root's secret\n");
    // The run itself was fine: it printed its summary.
    assert!(log.contains("delivered"), "{log}");
}

#[test]
fn a_summary_naming_a_device_writes_into_it_and_never_replaces_it() {
    if !is_root() {
        println!("SKIPPED: needs root to make a character device node");
        return;
    }
    let fx = Fixture::small("out-dev");
    // A node of /dev/full (1, 7) in the test's directory, so the host's own is never at risk:
    // every write to it fails with ENOSPC.
    let full = fx.dir.path().join("full");
    nix::sys::stat::mknod(
        &full,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 7),
    )
    .unwrap();
    let (status, log) = run_with_summary(&fx, &full);
    assert_eq!(status.code(), Some(9), "{log}");
    assert!(log.contains(&full.display().to_string()), "{log}");
    let t = std::fs::symlink_metadata(&full).unwrap().file_type();
    assert!(t.is_char_device(), "the device node was replaced");
    // /dev/null takes it and stays what it is.
    let (status, log) = run_with_summary(&fx, Path::new("/dev/null"));
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(std::fs::symlink_metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
}

#[test]
fn a_summary_naming_a_fifo_is_written_into_it_for_the_script_reading_it() {
    let fx = Fixture::small("out-fifo");
    let fifo = fx.dir.path().join("summary.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let (status, log) = run_with_summary(&fx, &fifo);
    assert_eq!(status.code(), Some(0), "{log}");
    let text = reader.join().unwrap();
    let s: pinring_daemon::summary::Summary = serde_json::from_str(&text).unwrap();
    assert_eq!(s.ring, fx.ring);
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn a_daemon_summary_at_a_planted_link_is_refused_with_exit_9_and_nothing_is_written_through_it() {
    let fx = Fixture::small("out-dlink");
    let victim = fx.dir.path().join("victim");
    std::fs::write(&victim, b"keep me\n").unwrap();
    std::os::unix::fs::symlink(&victim, fx.summary_path()).unwrap();
    let mut daemon = fx.daemon(&[]);
    fx.wait_ready(&mut daemon);
    let loader = fx.loader(&fx.config);
    let (status, log) = wait_for(daemon, "daemon", LONG);
    let _ = wait_for(loader, "loader", LONG);
    assert_eq!(status.code(), Some(9), "{log}");
    assert!(log.contains("symbolic link"), "{log}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me\n");
}

#[test]
fn a_summary_under_a_directory_link_another_user_planted_is_refused() {
    if !is_root() {
        println!("SKIPPED: needs root to plant links as another uid and run pinring as root");
        return;
    }
    let fx = Fixture::small("out-dirlink");
    let dir = shared_dir(&fx);
    // A root-only directory elsewhere: where the planted link points.
    let victim = fx.dir.path().join("root-only");
    std::fs::create_dir(&victim).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = dir.join("out");
    plant_link(&victim, &link);
    let summary = link.join("s.json");
    let (status, log) = run_with_summary(&fx, &summary);
    assert_eq!(status.code(), Some(9), "{log}");
    assert!(
        log.contains(&link.display().to_string()) && log.contains("owned by uid 65534"),
        "{log}"
    );
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0, "{log}");
    // The run itself was fine: it printed its summary.
    assert!(log.contains("delivered"), "{log}");
}
