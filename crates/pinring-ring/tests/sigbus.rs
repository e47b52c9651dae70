//! SIGBUS on a truncated segment (docs/RELIABILITY.md): contained in the segment's creator,
//! exit 4 in any other process. A binary of its own: the test forks children, and a child
//! holds copies of the parent's open files (and so their locks) until it execs, which would
//! disturb tests that watch ring locks if they ran in the same process.

use pinring_ring::{object_path, Access, CreateOptions, DaemonRing, Ring, RingError};

mod common;

use common::{Unlink, T};

fn opts(tag: &str) -> (CreateOptions, Unlink) {
    common::opts(&format!("sigbus-{tag}"), 100)
}

/// The child half of the SIGBUS tests: maps a ring (as its creator, or opening the parent's),
/// truncates it, and touches a page past the new end.
/// - The creator (a daemon) survives the fault: its mapping now holds zeros, it is marked
///   truncated, `check_file` fails, and the name is gone. The child exits 0 once it checked all
///   of that (a failed check panics: 101).
/// - Any other process never returns from the read: the handler ends it with exit 4.
fn sigbus_child(name: &str, create: bool) {
    if create {
        let o = CreateOptions {
            name: name.to_string(),
            ..opts("unused").0
        };
        let ring = DaemonRing::create(&o).unwrap();
        truncate(name);
        assert!(!ring.truncated_here());
        let v = ring.slot_view(3).seq;
        after_the_fault(v, ring.truncated_here(), ring.check_file(), name);
    } else {
        let ring = Ring::open(name, Access::ReadWrite, T).unwrap();
        truncate(name);
        assert!(!ring.truncated_here());
        let v = ring.slot_view(3).seq;
        panic!("read {v} from a truncated page without a fault");
    }
}

fn truncate(name: &str) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(object_path(name))
        .unwrap()
        .set_len(0)
        .unwrap();
}

/// The creator, after its read of a truncated page: it read the zero pages put over the mapping,
/// knows it, and its check of the file fails (and removes the name).
fn after_the_fault(v: u64, truncated: bool, checked: Result<(), RingError>, name: &str) {
    assert_eq!(v, 0, "the zero pages put over the mapping");
    assert!(truncated);
    let e = checked.unwrap_err();
    assert!(matches!(e, RingError::SizeMismatch { .. }), "{e}");
    assert!(!object_path(name).exists(), "the creator removes the name");
    std::process::exit(0);
}

fn run_sigbus_child(name: &str, mode: &str) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_fault_on_a_truncated_ring_is_contained_in_its_creator_and_exits_4_elsewhere",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PINRING_TEST_SIGBUS_CHILD", name)
        .env("PINRING_TEST_SIGBUS_MODE", mode)
        .output()
        .unwrap()
}

#[test]
fn a_fault_on_a_truncated_ring_is_contained_in_its_creator_and_exits_4_elsewhere() {
    if let Ok(name) = std::env::var("PINRING_TEST_SIGBUS_CHILD") {
        let create = std::env::var("PINRING_TEST_SIGBUS_MODE").as_deref() == Ok("create");
        sigbus_child(&name, create);
        return;
    }
    // The creator: contained, the name removed.
    let (o, _u) = opts("sigbus");
    let out = run_sigbus_child(&o.name, "create");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{:?}: {err}", out.status);
    assert!(
        err.contains("was truncated") && err.contains(&o.name) && err.contains("summary"),
        "{err}"
    );
    assert!(!object_path(&o.name).exists());
    // Another process (a loader) on this process's ring: exit 4 from the handler; the name
    // stays (only its creator removes it).
    let (o, _u) = opts("sigbus-peer");
    let daemon = DaemonRing::create(&o).unwrap();
    let out = run_sigbus_child(&o.name, "open");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{:?}: {err}", out.status);
    assert!(
        err.contains("was truncated") && err.contains("exiting with code 4"),
        "{err}"
    );
    assert!(object_path(&o.name).exists());
    // This process's own mapping is truncated too: it is dropped without being read.
    drop(daemon);
}
