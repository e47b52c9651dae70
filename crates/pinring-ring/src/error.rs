//! Errors of the ring protocol. Each message names the ring (and its file), the problem, and what
//! to do about it.

use std::path::PathBuf;

/// What can go wrong creating, opening or using a ring.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The ring name is not usable as a segment name.
    #[error("ring name {name:?} is invalid: use 1-64 characters from A-Z a-z 0-9 _ -")]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// slot count / slot size out of range.
    #[error("ring {name:?}: {slots} slots of {slot_bytes} bytes is not a valid geometry: slots must be 1..={max_slots}, slot bytes a multiple of 4096 up to 1 GiB")]
    InvalidGeometry {
        /// Ring name.
        name: String,
        /// Slots asked for.
        slots: u32,
        /// Slot bytes asked for.
        slot_bytes: u64,
        /// Largest slot count.
        max_slots: u32,
    },
    /// The handoff area asked for is out of range.
    #[error("ring {name:?}: a handoff of {buffers} batch buffers of {buffer_bytes} bytes with a stored spec of {spec_len} bytes is out of range (1 to 64 buffers, a spec of at most 64 KiB); lower daemon.prefetch or the batch size")]
    InvalidHandoff {
        /// Ring name.
        name: String,
        /// Buffers asked for.
        buffers: u32,
        /// Bytes per buffer.
        buffer_bytes: u64,
        /// Config text length.
        spec_len: u64,
    },
    /// A writing role taken on a ring opened read-only.
    #[error("ring {name:?} was opened read-only, so {role} cannot write into it: open it with Access::ReadWrite")]
    ReadOnlyRole {
        /// Ring name.
        name: String,
        /// The role ("a loader", "a consumer").
        role: &'static str,
    },
    /// A consumer attached to a ring whose daemon hands nothing over.
    #[error("ring {name:?} hands no batches to a consumer: its daemon runs another sink; start the daemon with --sink consumer")]
    NoHandoff {
        /// Ring name.
        name: String,
    },
    /// Another consumer is attached.
    #[error("ring {name:?} already has a consumer (pid {pid}): a ring feeds one training process; stop that one first, or give this one its own ring")]
    ConsumerPresent {
        /// Ring name.
        name: String,
        /// The consumer's pid as it recorded it (informational).
        pid: u32,
    },
    /// No segment with that name exists.
    #[error(
        "ring {name:?} does not exist ({path}): start pinring-daemon for it first, or check the ring name"
    )]
    NotFound {
        /// Ring name.
        name: String,
        /// Segment file.
        path: PathBuf,
    },
    /// No segment with that name appeared within the wait for it.
    #[error(
        "ring {name:?} does not exist ({path}): waited {} for it to appear; {}, or check the \
         ring name",
        seconds(*.wait_ms),
        start_daemon(.name)
    )]
    NeverAppeared {
        /// Ring name.
        name: String,
        /// Segment file.
        path: PathBuf,
        /// The wait, in milliseconds.
        wait_ms: u64,
    },
    /// A live daemon already owns the ring.
    #[error("ring {name:?} ({path}) is held by a running daemon (pid {pid}): stop it first, or pick another ring name")]
    HeldByLiveDaemon {
        /// Ring name.
        name: String,
        /// Segment file.
        path: PathBuf,
        /// The live daemon's pid.
        pid: u32,
    },
    /// The segment belongs to another user.
    #[error("ring {name:?} ({path}) is {kind}, not a ring segment: {fix}")]
    NotRegular {
        /// Ring name.
        name: String,
        /// Path.
        path: PathBuf,
        /// What the file is.
        kind: &'static str,
        /// What to do.
        fix: &'static str,
    },
    #[error("ring {name:?} ({path}) kept changing while this daemon tried to take the name (another daemon or a cleaner is working on it): try again, or pick another ring name")]
    Contended {
        /// Ring name.
        name: String,
        /// Path.
        path: PathBuf,
    },
    #[error("ring {name:?} ({path}) was made by a pinring of layout version {found} (this build speaks {expected}), whose daemon may still be running: stop that daemon, or start this one with --replace")]
    OtherVersionPresent {
        /// Ring name.
        name: String,
        /// Path.
        path: PathBuf,
        /// Version found.
        found: u32,
        /// Version of this build.
        expected: u32,
    },
    #[error("ring {name:?} ({path}) belongs to uid {owner} (mode {mode:04o}, gid {gid}), and uid {me} is neither its owner nor admitted by its group: run the loader as uid {owner}, or give the daemon ring.mode = \"0660\" and a ring.group this user belongs to")]
    ForeignRing {
        /// Ring name.
        name: String,
        /// Path.
        path: PathBuf,
        /// Owner uid.
        owner: u32,
        /// Owner gid.
        gid: u32,
        /// Mode bits.
        mode: u32,
        /// This process's uid.
        me: u32,
    },
    #[error("ring {name:?} ({path}) is owned by uid {owner}, not by this process (uid {me}): remove it as its owner or as root, or pick another ring name")]
    ForeignOwner {
        /// Ring name.
        name: String,
        /// Segment file.
        path: PathBuf,
        /// Owner uid of the file.
        owner: u32,
        /// Our effective uid.
        me: u32,
    },
    /// This process may not open the segment (another user's, mode 0600/0660).
    #[error("ring {name:?} ({path}): permission denied for uid {uid}: the segment is private to its daemon's user (or group with ring.mode = \"0660\" and ring.group); run as that user or add this user to the ring's group")]
    PermissionDenied {
        /// Ring name.
        name: String,
        /// Segment file.
        path: PathBuf,
        /// Our effective uid.
        uid: u32,
    },
    /// The segment's name now refers to another file, or to none.
    #[error("ring {name:?} ({path}) was replaced or removed behind the daemon's back (the name no longer refers to the mapped segment): stopping rather than uploading from a segment no loader can reach; find who touched it, then restart the daemon")]
    Replaced {
        /// Ring name.
        name: String,
        /// Segment file.
        path: PathBuf,
    },
    /// `ring.group` names no group.
    #[error("ring {name:?}: ring.group {group:?} is not a group on this machine: create it (groupadd) or fix ring.group")]
    UnknownGroup {
        /// Ring name.
        name: String,
        /// Group name.
        group: String,
    },
    /// /dev/shm cannot hold the segment.
    #[error("ring {name:?}: asked for {asked} bytes ({asked_mib} MiB) but {dir} has only {available} bytes ({available_mib} MiB) free: use fewer or smaller slots, free space in {dir}, or enlarge it (mount -o remount,size=...)")]
    NoSpace {
        /// Ring name.
        name: String,
        /// Directory backing POSIX shared memory.
        dir: String,
        /// Bytes the segment needs.
        asked: u64,
        /// Same in MiB.
        asked_mib: u64,
        /// Bytes free.
        available: u64,
        /// Same in MiB.
        available_mib: u64,
    },
    /// An anonymous ring's memory could not be reserved.
    #[error("ring {name:?}: an anonymous ring of {asked} bytes ({asked_mib} MiB) could not be reserved ({source}): it takes memory, not /dev/shm space; free memory, raise this process's cgroup memory limit, or make the ring smaller (ring.slots, ring.slot_bytes)")]
    NoMemory {
        /// Ring name.
        name: String,
        /// Bytes the segment needs.
        asked: u64,
        /// Same in MiB.
        asked_mib: u64,
        /// What fallocate said.
        source: nix::Error,
    },
    /// The file is not a pinring segment.
    #[error("ring {name:?} ({path}) is not a pinring segment (bad magic {found:#018x}): {fix}")]
    NotARing {
        /// Ring name.
        name: String,
        /// Segment file.
        path: PathBuf,
        /// Magic found.
        found: u64,
        /// What to do.
        fix: &'static str,
    },
    /// The segment is of another layout version.
    #[error("ring {name:?} ({path}) has layout version {found}, this build speaks version {expected}: run daemon and loaders of the same pinring release")]
    VersionMismatch {
        /// Ring name.
        name: String,
        /// Segment file.
        path: PathBuf,
        /// Version found.
        found: u32,
        /// Version expected.
        expected: u32,
    },
    /// The segment never finished initialising.
    #[error("ring {name:?} ({path}) did not finish initialising within {waited_ms} ms (its daemon may have died while creating it): restart the daemon, which replaces the stale segment")]
    NotInitialised {
        /// Ring name.
        name: String,
        /// Segment file.
        path: PathBuf,
        /// How long we waited.
        waited_ms: u64,
    },
    /// The file is shorter or longer than its header says.
    #[error("ring {name:?} ({path}) is {actual} bytes but its header says {expected}: the segment was truncated or replaced; restart the daemon")]
    SizeMismatch {
        /// Ring name.
        name: String,
        /// Segment file.
        path: PathBuf,
        /// Size from the header.
        expected: u64,
        /// Size of the file.
        actual: u64,
    },
    /// A header field holds an impossible value.
    #[error("ring {name:?} ({path}) has a corrupt header: {what}; restart the daemon, which replaces the segment")]
    CorruptHeader {
        /// Ring name.
        name: String,
        /// Segment file.
        path: PathBuf,
        /// Which field and value.
        what: String,
    },
    /// The ring did not become ready in time.
    #[error("ring {name:?} did not become ready within {waited_ms} ms (state {state}): is its daemon running and healthy?")]
    NotReady {
        /// Ring name.
        name: String,
        /// How long we waited.
        waited_ms: u64,
        /// State seen last.
        state: &'static str,
    },
    /// The loader table is full.
    #[error(
        "ring {name:?}: this handle already holds a loader seat: open the ring once per loader"
    )]
    AlreadyAttached {
        /// Ring name.
        name: String,
    },
    #[error("ring {name:?} already has {max} loaders attached: stop a loader first (the table holds {max})")]
    LoaderTableFull {
        /// Ring name.
        name: String,
        /// Table size.
        max: usize,
    },
    /// A system call failed.
    #[error("ring {name:?} ({path}): {call} failed: {source}")]
    Sys {
        /// Ring name.
        name: String,
        /// Segment file.
        path: PathBuf,
        /// The call.
        call: &'static str,
        /// errno.
        #[source]
        source: nix::Error,
    },
}

/// Why a loader's commit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    /// The slot was taken back while this loader held it (it was too slow or presumed dead).
    #[error("slot {slot} (seq {seq}) was reclaimed by the daemon before this loader committed it; the batch will be made again")]
    Reclaimed {
        /// Slot index.
        slot: u32,
        /// Seq the loader made.
        seq: u64,
    },
    /// Lengths do not fit the slot.
    #[error("slot {slot}: payload of {payload} bytes plus {meta} bytes of metadata does not fit in {slot_bytes} bytes")]
    TooLarge {
        /// Slot index.
        slot: u32,
        /// Payload bytes.
        payload: u64,
        /// Metadata bytes.
        meta: u64,
        /// Slot capacity.
        slot_bytes: u64,
    },
}

/// Why a READY slot was refused by the daemon (a buggy or hostile writer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotFault {
    /// The descriptor's seq is not the one the daemon assigned.
    #[error("slot {slot}: carries seq {found}, but seq {expected} was assigned to it")]
    WrongSeq {
        /// Slot index.
        slot: u32,
        /// Seq assigned.
        expected: u64,
        /// Seq found.
        found: u64,
    },
    /// Payload or metadata length out of the slot.
    #[error("slot {slot} (seq {seq}): payload {payload} bytes + metadata {meta} bytes overflow the {slot_bytes}-byte slot")]
    BadLength {
        /// Slot index.
        slot: u32,
        /// Seq.
        seq: u64,
        /// Payload length claimed.
        payload: u64,
        /// Metadata length claimed.
        meta: u64,
        /// Slot capacity.
        slot_bytes: u64,
    },
    /// The loader committed an error instead of a batch.
    #[error("slot {slot} (seq {seq}): the loader reported error code {code}{}", loader_code_meaning(*code))]
    LoaderError {
        /// Slot index.
        slot: u32,
        /// Seq.
        seq: u64,
        /// Error code.
        code: u32,
    },
    /// The slot changed state under the daemon.
    #[error("slot {slot}: state word changed while the daemon was taking it ({raw:#x})")]
    Raced {
        /// Slot index.
        slot: u32,
        /// Word seen.
        raw: u64,
    },
}

/// What a loader's error code means (pinring-ring's `failure::ERR_PLAN`, `ERR_META`, `ERR_SAMPLE`).
fn loader_code_meaning(code: u32) -> &'static str {
    match code {
        1 => " (it cannot make this part of the plan)",
        2 => " (the part's metadata does not fit the slot)",
        3 => {
            " (a sample of the part cannot be read and dataset.on_bad_sample = \"fail\": the \
             loader's log names the file and the problem)"
        }
        _ => "",
    }
}

impl pinring_exit::Coded for RingError {
    fn exit(&self) -> pinring_exit::Exit {
        use pinring_exit::Exit;
        match self {
            // Another loader or consumer holds what this one asked for: refused, not broken.
            RingError::LoaderTableFull { .. } | RingError::ConsumerPresent { .. } => Exit::Refused,
            // `ring.group` names no group of this host: a config error.
            RingError::UnknownGroup { .. } => Exit::Config,
            _ => Exit::Ring,
        }
    }
}

impl pinring_exit::Coded for CommitError {
    fn exit(&self) -> pinring_exit::Exit {
        pinring_exit::Exit::Ring
    }
}

impl pinring_exit::Coded for SlotFault {
    /// A slot holding something that must not be used.
    fn exit(&self) -> pinring_exit::Exit {
        pinring_exit::Exit::Ring
    }
}

/// How a ring's daemon is started, for messages.
pub(crate) fn start_daemon(name: &str) -> String {
    format!(
        "start its daemon (pinring-daemon --ring {name} ..., or systemctl start \
         pinring-daemon@{name})"
    )
}

/// `ms` as seconds for messages: "30 s", "0.3 s".
pub(crate) fn seconds(ms: u64) -> String {
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{} s", ms as f64 / 1000.0)
    }
}
