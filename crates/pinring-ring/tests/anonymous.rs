//! Anonymous rings (a memfd, never named in /dev/shm): another handle opens one through its
//! creator's `/proc/<pid>/fd/<fd>`, `find_anonymous` finds it by its label, nothing of it is
//! ever in /dev/shm, and its memory goes with the last handle.

mod common;

use common::{opts, T};
use pinring_ring::{
    find_anonymous, object_path, Access, CreateOptions, DaemonRing, Ring, RingError,
};
use std::path::Path;

fn anonymous(tag: &str) -> (CreateOptions, common::Unlink) {
    let (mut o, guard) = opts(tag, 64);
    o.anonymous = true;
    (o, guard)
}

#[test]
fn an_anonymous_ring_is_opened_at_its_creators_descriptor_and_never_named() {
    let (o, _guard) = anonymous("anon-open");
    let ring = DaemonRing::create(&o).unwrap();
    let at = ring.segment().path();
    assert!(ring.segment().is_anonymous());
    assert!(
        at.starts_with(format!("/proc/{}/fd/", std::process::id())),
        "{}",
        at.display()
    );
    assert!(!object_path(&o.name).exists(), "nothing in /dev/shm");
    // Another handle sees the same memory: a loader's attach, by the path.
    let other = Ring::open_at(&o.name, Some(&at), Access::ReadWrite, T).unwrap();
    assert_eq!(other.geometry().slot_count, 4);
    assert_eq!(other.daemon().pid, std::process::id());
    assert!(other.daemon_alive().unwrap(), "the creator's lock is seen");
    other.check_file().unwrap();
    // Its name is not a ring in /dev/shm.
    assert!(matches!(
        Ring::open(&o.name, Access::ReadOnly, T),
        Err(RingError::NotFound { .. })
    ));
    // Found by its label, under this process.
    let found = find_anonymous();
    let mine: Vec<_> = found
        .iter()
        .filter(|a| a.name == o.name && a.pid == std::process::id())
        .collect();
    assert_eq!(mine.len(), 1, "{found:?}");
    // The daemon's end unlinks nothing (there is no name), and the handles go.
    ring.unlink().unwrap();
    drop(other);
    drop(ring);
    assert!(!find_anonymous().iter().any(|a| a.name == o.name));
    assert!(!object_path(&o.name).exists());
}

#[test]
fn a_path_that_is_not_that_rings_memfd_is_refused() {
    let (o, _guard) = anonymous("anon-wrong");
    let ring = DaemonRing::create(&o).unwrap();
    let at = ring.segment().path();
    // The right descriptor under another ring's name.
    assert!(matches!(
        Ring::open_at("t-other-name", Some(&at), Access::ReadOnly, T),
        Err(RingError::NotFound { .. })
    ));
    // A descriptor of this process that is not a ring at all (its standard input), and a path
    // that does not exist.
    for bad in [
        Path::new("/proc/self/fd/0"),
        Path::new("/proc/self/fd/99999"),
    ] {
        let e = Ring::open_at(&o.name, Some(bad), Access::ReadOnly, T).unwrap_err();
        assert!(matches!(e, RingError::NotFound { .. }), "{e}");
    }
}
