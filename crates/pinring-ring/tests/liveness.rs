//! Liveness from the kernel (docs/RELIABILITY.md, "liveness"): header scribbles, reused loader
//! entries, racing daemons, files that are not rings and other users' rings (SIGBUS on a truncated
//! segment is in sigbus.rs: its test forks, and a forked child holds this binary's ring locks
//! until it execs). One process plays several roles through separate handles, each an open
//! file description of its own, as separate processes would.

use pinring_ring::layout::ring_state;
use pinring_ring::segment::{clean_if_stale, Cleaning};
use pinring_ring::{
    object_path, Access, CreateOptions, DaemonRing, LoaderRing, ProcessId, Ring, RingError,
};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Barrier};

mod common;

use common::{Unlink, T};

fn opts(tag: &str) -> (CreateOptions, Unlink) {
    common::opts(&format!("live-{tag}"), 100)
}

#[test]
fn header_scribbles_do_not_make_a_live_daemon_look_dead_and_the_daemon_restores_them() {
    let (o, _u) = opts("scribble");
    let daemon = DaemonRing::create(&o).unwrap();
    daemon.set_state(ring_state::READY);
    // A rogue: any process that maps the ring read-write, through no role.
    let rogue = Ring::open(&o.name, Access::ReadWrite, T).unwrap();
    let h = rogue.header();
    h.daemon_pid.store(u32::MAX - 7, Relaxed);
    h.daemon_start_time.store(1, Relaxed);
    h.state.store(ring_state::CLOSED, Relaxed);
    h.end_seq.store(3, Relaxed);

    // Everyone else asks the kernel: the daemon lives.
    let viewer = Ring::open(&o.name, Access::ReadOnly, T).unwrap();
    assert!(viewer.daemon_alive().unwrap());
    assert_eq!(
        clean_if_stale(&o.name, true).unwrap(),
        Cleaning::Live {
            daemon_pid: u32::MAX - 7
        }
    );
    assert!(object_path(&o.name).exists(), "clean kept the live ring");
    let err = DaemonRing::create(&o).unwrap_err();
    assert!(matches!(err, RingError::HeldByLiveDaemon { .. }), "{err}");

    // The daemon notices and puts its own fields back.
    let mut changed = daemon.repair_header();
    changed.sort();
    assert_eq!(
        changed,
        ["daemon_pid", "daemon_start_time", "end_seq", "state"]
    );
    assert_eq!(h.state.load(Relaxed), ring_state::READY);
    assert_eq!(h.daemon_pid.load(Relaxed), std::process::id());
    assert_eq!(h.end_seq.load(Relaxed), 100);
    assert_eq!(daemon.snapshot().health.header_repairs, 1);
    assert!(daemon.repair_header().is_empty(), "nothing left to repair");
    // A state the daemon set itself is not a scribble.
    daemon.set_state(ring_state::DRAINING);
    assert!(daemon.repair_header().is_empty());

    // Once the daemon is gone, its ring is stale whatever the header says.
    drop(daemon);
    assert!(!viewer.daemon_alive().unwrap());
    h.daemon_pid.store(std::process::id(), Relaxed);
    assert!(matches!(
        clean_if_stale(&o.name, true).unwrap(),
        Cleaning::Stale { removed: true, .. }
    ));
    assert!(!object_path(&o.name).exists());
}

#[test]
fn a_reused_loader_entry_never_strands_the_dead_occupants_slot() {
    let (o, _u) = opts("reuse");
    let daemon = DaemonRing::create(&o).unwrap();
    daemon.set_state(ring_state::READY);
    // Loader A takes entry 0, claims slot 1, and dies.
    let a = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let seat_a = a.attach_loader(ProcessId::current()).unwrap();
    daemon.assign(1, 42);
    let claim = a.try_claim(seat_a, 1).unwrap();
    assert_eq!(claim.slot(), 1);
    drop(a);
    // Before the daemon's next reap pass, loader B takes over the same entry.
    let b = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let seat_b = b.attach_loader(ProcessId::current()).unwrap();
    assert_eq!(seat_b.index, seat_a.index, "the entry was reused");
    assert_ne!(seat_b.tenure, seat_a.tenure);
    // The dead claim is recognised at once (no lease wait), and B's own claims are not.
    assert_eq!(daemon.reclaim_if_owner_dead(1), Some(42));
    let again = b.try_claim(seat_b, 1).unwrap();
    assert_eq!(again.seq(), 42);
    assert_eq!(daemon.reclaim_if_owner_dead(1), None);
    assert_eq!(daemon.reap_dead_loaders(), 0, "B occupies the entry");
    drop(b);
    assert_eq!(daemon.reap_dead_loaders(), 1);
    assert_eq!(daemon.reclaim_if_owner_dead(1), Some(42));
}

#[test]
fn a_loader_entry_marked_empty_by_a_rogue_is_not_given_to_a_second_loader() {
    let (o, _u) = opts("steal");
    let _daemon = DaemonRing::create(&o).unwrap();
    let a = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let seat_a = a.attach_loader(ProcessId::current()).unwrap();
    // A rogue scribbles over the live loader's entry (through no role: a raw mapping).
    let rogue = Ring::open(&o.name, Access::ReadWrite, T).unwrap();
    let e = rogue.loader(seat_a.index as usize);
    e.state.store(0, Relaxed);
    e.pid.store(0, Relaxed);
    let b = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let seat_b = b.attach_loader(ProcessId::current()).unwrap();
    assert_ne!(seat_b.index, seat_a.index);
}

#[test]
fn daemons_racing_to_replace_a_stale_ring_end_with_exactly_one_owner() {
    let (o, _u) = opts("race");
    for round in 0..20 {
        // A daemon dies: its ring stays, its lock goes.
        drop(DaemonRing::create(&o).unwrap());
        let n = 6;
        let barrier = Arc::new(Barrier::new(n));
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let (o, b) = (o.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    b.wait();
                    DaemonRing::create(&o)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let winners: Vec<&DaemonRing> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        assert!(winners[0].segment().still_named().unwrap(), "round {round}");
        for r in &results {
            if let Err(e) = r {
                assert!(
                    matches!(
                        e,
                        RingError::HeldByLiveDaemon { .. } | RingError::Contended { .. }
                    ),
                    "round {round}: {e}"
                );
            }
        }
    }
}

#[test]
fn files_that_are_not_rings_are_replaced_only_with_replace() {
    let (mut o, _u) = opts("garbage");
    let path = object_path(&o.name);
    for (what, bytes) in [("empty", vec![]), ("garbage", vec![0x5au8; 16384])] {
        std::fs::write(&path, &bytes).unwrap();
        o.replace = false;
        let err = DaemonRing::create(&o).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, RingError::NotARing { .. }), "{what}: {msg}");
        assert!(msg.contains("--replace"), "{what}: {msg}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{what}: untouched");
        assert!(matches!(
            clean_if_stale(&o.name, true).unwrap(),
            Cleaning::Kept(_)
        ));
        o.replace = true;
        let ring = DaemonRing::create(&o).unwrap();
        assert!(ring.segment().still_named().unwrap(), "{what}");
        drop(ring);
    }
}

#[test]
fn a_fifo_or_a_link_at_the_ring_path_is_refused_at_once() {
    let (mut o, _u) = opts("fifo");
    let path = object_path(&o.name);
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    for access in [Access::ReadOnly, Access::ReadWrite] {
        let err = Ring::open(&o.name, access, T).unwrap_err();
        assert!(matches!(err, RingError::NotRegular { .. }), "{err}");
        assert!(err.to_string().contains("a FIFO"), "{err}");
    }
    let err = DaemonRing::create(&o).unwrap_err();
    assert!(err.to_string().contains("a FIFO") && err.to_string().contains("--replace"));
    assert!(matches!(
        clean_if_stale(&o.name, true).unwrap(),
        Cleaning::Kept(_)
    ));
    std::fs::remove_file(&path).unwrap();

    let target = format!("/dev/shm/.t-live-target-{}", std::process::id());
    std::fs::write(&target, vec![0u8; 8192]).unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let err = Ring::open(&o.name, Access::ReadOnly, T).unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    let err = DaemonRing::create(&o).unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    o.replace = true;
    let ring = DaemonRing::create(&o).unwrap();
    assert!(ring.segment().still_named().unwrap());
    assert_eq!(
        std::fs::read(&target).unwrap(),
        vec![0u8; 8192],
        "the link's target was never written"
    );
    let _ = std::fs::remove_file(&target);
}

#[test]
fn another_users_ring_is_refused_to_loaders_unless_its_group_admits_them() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: changing a ring's owner needs root");
        return;
    }
    let (o, _u) = opts("foreign");
    let _daemon = DaemonRing::create(&o).unwrap();
    let path = object_path(&o.name);
    let nobody = nix::unistd::Uid::from_raw(65534);
    nix::unistd::chown(&path, Some(nobody), Some(nix::unistd::Gid::from_raw(65534))).unwrap();
    let err = Ring::open(&o.name, Access::ReadWrite, T).unwrap_err();
    assert!(matches!(err, RingError::ForeignRing { .. }), "{err}");
    assert!(err.to_string().contains("ring.group"), "{err}");
    // Read-only views (status) still work.
    Ring::open(&o.name, Access::ReadOnly, T).unwrap();
    // Group rw and a group this process is in: admitted.
    nix::unistd::chown(&path, None, Some(nix::unistd::getegid())).unwrap();
    nix::sys::stat::fchmodat(
        nix::fcntl::AT_FDCWD,
        &path,
        nix::sys::stat::Mode::from_bits_truncate(0o660),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
    .unwrap();
    Ring::open(&o.name, Access::ReadWrite, T).unwrap();
}
