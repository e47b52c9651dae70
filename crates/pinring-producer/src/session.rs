//! [`Session`]: one seat in one ring's loader table, and the claim loop.

use crate::part::{LabelSource, PartBuffers, PartGuard, PlanFailed};
use pinring_data::{BatchLayout, BatchMeta, Config, Plan, Spec, StoredSpecError};
use pinring_exit::{Coded, Exit};
use pinring_ring::failure::{ERR_META, ERR_PLAN};
use pinring_ring::layout::{align_up, META_ALIGN};
use pinring_ring::{
    futex, ring_state, Access, Claim, CommitError, LoaderRing, ProcessId, RingError, Seat,
    SlotWriter,
};
use std::borrow::Borrow;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest single wait for a free slot (between two looks at the stop check, the deadline and
/// the daemon).
const MAX_WAIT: Duration = Duration::from_millis(100);
/// How often a busy loader checks that its daemon is still running (an idle one checks on every
/// wait that times out).
const DAEMON_CHECK_EVERY: Duration = Duration::from_millis(250);

/// Why a session could not join, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Ring error.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// The plan the ring's end seq asks for cannot be made from this config.
    #[error("config {source_name}: {source}")]
    Plan {
        /// Config source.
        source_name: String,
        /// The error.
        #[source]
        source: pinring_data::PlanError,
    },
    /// The config differs from the daemon's.
    #[error("ring {ring:?}: this loader's config ({source_name}, fingerprint {mine:#018x}) describes another dataset or plan than the daemon's (fingerprint {theirs:#018x}); they differ in {differs}: start the loader with the daemon's config file{hint}")]
    Mismatch {
        /// The settings that differ, each with both values where the ring's settings record
        /// holds them; "another dataset or plan setting" where it names none.
        differs: Box<str>,
        /// More on the cause, when known (a file dataset of another length).
        hint: Box<str>,
        /// Ring name.
        ring: String,
        /// Config source.
        source_name: String,
        /// Our fingerprint.
        mine: u64,
        /// The ring's.
        theirs: u64,
    },
    /// The spec the ring stores cannot be adopted.
    #[error(transparent)]
    StoredSpec(#[from] StoredSpecError),
    /// A loader joining with no config of its own found a ring that stores no spec.
    #[error("ring {ring:?} stores no spec to adopt (its daemon hands no batches to a training process): give the loader the daemon's config")]
    NoStoredSpec {
        /// Ring name.
        ring: String,
    },
    /// The daemon died.
    #[error("ring {ring:?}: its daemon (pid {pid}) is gone; restart the daemon, then the loaders")]
    DaemonGone {
        /// Ring name.
        ring: String,
        /// Daemon pid.
        pid: u32,
    },
}

impl Coded for SessionError {
    fn exit(&self) -> Exit {
        match self {
            SessionError::Ring(e) => e.exit(),
            SessionError::Plan { .. } => Exit::Config,
            SessionError::Mismatch { .. } => Exit::Refused,
            SessionError::StoredSpec(e) => e.exit(),
            SessionError::NoStoredSpec { .. } => Exit::Config,
            SessionError::DaemonGone { .. } => Exit::PeerDied,
        }
    }
}

/// The ring a session joined, with the config it joined with (its "auto" slot size adopted from
/// the ring) and that config's batch layout. Shared (`Arc`) with whatever must keep the mapping
/// alive beyond the session, such as the Python fields viewing a claimed slot.
#[derive(Debug)]
pub struct Joined {
    /// The mapped ring, in the loader's role.
    pub ring: LoaderRing,
    /// The config, checked against the ring's fingerprint.
    pub cfg: Config,
    /// Its batch layout (fields, part sizes).
    pub layout: BatchLayout,
    /// Where a part's metadata labels come from (the labels rule, [`crate::part`]).
    pub(crate) labels: LabelSource,
}

impl Joined {
    /// Encodes `meta` into `buf` and writes it into the slot after a payload of `payload_len`
    /// bytes (at the next [`META_ALIGN`] boundary, within the config's metadata reserve).
    /// Returns what to commit: `(payload_len, meta_len, error)`, with [`ERR_META`] and no bytes
    /// when the payload did not fit (`fits` false) or the metadata does not.
    pub(crate) fn write_meta(
        &self,
        slot: &mut SlotWriter<'_>,
        meta: &BatchMeta,
        payload_len: usize,
        fits: bool,
        buf: &mut Vec<u8>,
    ) -> (u64, u64, u32) {
        let meta_off = align_up(payload_len as u64, META_ALIGN).unwrap_or(u64::MAX) as usize;
        let room = slot
            .len()
            .saturating_sub(meta_off)
            .min(self.cfg.meta_reserve_bytes() as usize);
        buf.resize(room, 0);
        match meta.encode_into(buf) {
            Ok(n) if fits && slot.write(meta_off, &buf[..n]).is_ok() => {
                (payload_len as u64, n as u64, 0)
            }
            Ok(_) => (0, 0, ERR_META),
            Err(e) => {
                tracing::error!(ring = %self.cfg.ring.name, seq = meta.seq, "{e}");
                (0, 0, ERR_META)
            }
        }
    }

    /// Commits a filled part and keeps the claiming seat's books (batches, bytes, busy time since
    /// `started`, heartbeat). A commit refused because the daemon took the slot back abandons it
    /// (the daemon keeps a slot taken from a live loader out of use until it sees that, or the
    /// loader's exit) and returns `Reclaimed`.
    pub(crate) fn commit(
        &self,
        claim: Claim,
        payload_len: u64,
        meta_len: u64,
        sample_count: u32,
        error: u32,
        started: Instant,
    ) -> Result<(), CommitError> {
        let ring = &self.ring;
        let (seat, slot, ticket) = (claim.seat(), claim.slot(), claim.ticket());
        match ring.commit(claim, payload_len, meta_len, sample_count, error) {
            Ok(()) => {
                ring.record_commit(seat, payload_len, started.elapsed().as_nanos() as u64);
                Ok(())
            }
            Err(e @ CommitError::Reclaimed { .. }) => {
                ring.abandon(seat, slot, ticket);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

/// What [`Session::claim`] found.
#[derive(Debug)]
pub enum Next {
    /// A FREE slot, claimed: make the part of its seq and commit it.
    Part(Claim),
    /// The daemon ended the run (the ring is draining or closed, and its daemon is gone).
    Ended,
    /// The stop check asked to give up.
    Stopped,
    /// The deadline passed with no free slot.
    TimedOut,
}

/// One seat in one ring's loader table. Leaves the table on drop (or [`Session::leave`]).
#[derive(Debug)]
pub struct Session {
    joined: Arc<Joined>,
    plan: Plan,
    seat: Seat,
    /// Where the next claim starts looking.
    hint: u32,
    /// Loaders attached, counted again with each look at the daemon, and at least
    /// [`Session::expect_peers`]'s: each keeps to its own share of the slots where it can
    /// (`LoaderRing::try_claim_preferring`).
    share: u32,
    /// How many loaders the caller starts together ([`Session::expect_peers`]); 0: unknown.
    peers: u32,
    /// [`Session::keep_to_batches`]'s `(residue, modulus)`: only batches `b` with
    /// `b % modulus == residue` are claimed.
    only: Option<(u64, u64)>,
    last_daemon_check: Instant,
    left: bool,
}

impl Session {
    /// Joins ring `cfg.ring.name`: waits up to `wait` for a live daemon's READY ring (giving up,
    /// `Ok(None)`, as soon as `stop` says so; it is asked at least every 100 ms), checks `cfg`
    /// against it ([`Session::check_ring`]) and takes a seat in the loader table. A file kind's
    /// `cfg` must have its source opened (its length recorded) first, as the daemon did.
    pub fn join(
        cfg: Config,
        wait: Duration,
        stop: impl Fn() -> bool,
    ) -> Result<Option<Session>, SessionError> {
        Session::join_at(cfg, None, wait, stop)
    }

    /// [`Session::join`]; with `at`, the anonymous ring there (its daemon's
    /// `/proc/<pid>/fd/<fd>`) instead of the one named in /dev/shm.
    pub fn join_at(
        cfg: Config,
        at: Option<&std::path::Path>,
        wait: Duration,
        stop: impl Fn() -> bool,
    ) -> Result<Option<Session>, SessionError> {
        let Some(ring) = Session::open(&cfg.ring.name, at, wait, stop)? else {
            return Ok(None);
        };
        Session::take_seat(ring, cfg)
    }

    /// Joins ring `name` (at `at`, as [`Session::join_at`]) with the spec its daemon stored in
    /// it (`pinring_data::Spec::adopt`): nothing read from a file, nothing resolved again. A ring that stores
    /// none (its daemon's sink is not a training process) is [`SessionError::NoStoredSpec`].
    pub fn join_adopting(
        name: &str,
        at: Option<&std::path::Path>,
        wait: Duration,
        stop: impl Fn() -> bool,
    ) -> Result<Option<Session>, SessionError> {
        let Some(ring) = Session::open(name, at, wait, stop)? else {
            return Ok(None);
        };
        let Some(spec) = stored_spec(&ring)? else {
            return Err(SessionError::NoStoredSpec { ring: name.into() });
        };
        let (cfg, _, _) = spec.into_parts();
        Session::take_seat(ring, cfg)
    }

    /// Waits for ring `name` (at `at`) as [`Session::join_at`] says, and joins it as a loader.
    fn open(
        name: &str,
        at: Option<&std::path::Path>,
        wait: Duration,
        stop: impl Fn() -> bool,
    ) -> Result<Option<LoaderRing>, SessionError> {
        // A loader started before its daemon (by hand, or with --wait-for-daemon) says at once
        // which ring it waits for and how to start it.
        let tell = |w: &pinring_ring::Waiting| tracing::info!(ring = %w.name, "{w}");
        let Some(ring) =
            pinring_ring::attach_at_unless(name, at, Access::ReadWrite, wait, stop, tell)?
        else {
            return Ok(None);
        };
        Ok(Some(LoaderRing::join(ring)?))
    }

    /// Checks `cfg` against the joined `ring` ([`Session::check_ring`]) and takes a seat in its
    /// loader table.
    fn take_seat(ring: LoaderRing, mut cfg: Config) -> Result<Option<Session>, SessionError> {
        let plan = Session::check_ring(&mut cfg, &ring)?;
        let seat = ring.attach_loader(ProcessId::current())?;
        let layout = cfg.batch_layout();
        let labels = LabelSource::of(&cfg, &layout);
        let hint = u32::from(seat.index) % ring.geometry().slot_count;
        let share = ring.attached_loaders();
        Ok(Some(Session {
            joined: Arc::new(Joined {
                ring,
                cfg,
                layout,
                labels,
            }),
            plan,
            seat,
            hint,
            share,
            peers: 0,
            only: None,
            last_daemon_check: Instant::now(),
            left: false,
        }))
    }

    /// Checks an attached ring against a loader's config and makes the plan the daemon's seqs
    /// come from: a config whose slot size is "auto" adopts the size (and count) the daemon
    /// resolved and published (the part layout, the seq -> samples mapping, follows from it
    /// identically on both sides); the fingerprints must match (`Mismatch`); the plan covers
    /// every seq up to the ring's end seq (the daemon decides how many epochs run).
    pub fn check_ring(cfg: &mut Config, ring: &LoaderRing) -> Result<Plan, SessionError> {
        let g = ring.geometry();
        if cfg.adopt_slot_bytes(g.slot_bytes, g.slot_count) {
            tracing::debug!(ring = %cfg.ring.name, slot_bytes = g.slot_bytes, slots = g.slot_count, "ring.slot_bytes = \"auto\": adopted the daemon's slot size");
        }
        let theirs = ring.fingerprint();
        adopt_decode(cfg, theirs);
        if cfg.fingerprint() != theirs {
            // The daemon's settings record names what differs; without a record (an older
            // daemon's ring) or where it names nothing, the files' length is the likeliest.
            let (differs, hint) = match cfg.setting_differences(&ring.settings_record()) {
                Some(d) if !d.is_empty() => (d.join("; "), String::new()),
                _ => (
                    "another dataset or plan setting".to_string(),
                    length_hint(cfg, ring),
                ),
            };
            return Err(SessionError::Mismatch {
                differs: differs.into_boxed_str(),
                hint: hint.into_boxed_str(),
                ring: cfg.ring.name.clone(),
                source_name: cfg.source.clone(),
                mine: cfg.fingerprint(),
                theirs,
            });
        }
        let end_seq = ring.end_seq();
        plan_covering(cfg, end_seq)
    }

    /// The ring, config and layout this session joined with.
    pub fn joined(&self) -> &Arc<Joined> {
        &self.joined
    }

    /// The ring.
    pub fn ring(&self) -> &LoaderRing {
        &self.joined.ring
    }

    /// The config, as checked against the ring.
    pub fn config(&self) -> &Config {
        &self.joined.cfg
    }

    /// The plan covering every seq of the ring.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The part seq `seq` names: its batch, epoch and place, and its sample ids into `out`.
    pub fn part_into(
        &mut self,
        seq: u64,
        out: &mut Vec<u64>,
    ) -> Result<pinring_data::Part, pinring_data::PlanError> {
        self.plan.part_into(seq, out)
    }

    /// The part `claim`'s seq names, as a guard that writes, commits or fails it (and gives it
    /// back if dropped with neither), its sample ids in `bufs` (reused from the last part's
    /// [`crate::Done`], or new). `joined` is this session's [`Session::joined`], held as the
    /// guard needs it (`&Joined`, or an `Arc` for a part that outlives the call). A seq the plan
    /// cannot make is committed failed (`ERR_PLAN`: the daemon reports it) and its error
    /// returned.
    pub fn part<J: Borrow<Joined>>(
        &mut self,
        joined: J,
        claim: Claim,
        mut bufs: PartBuffers,
    ) -> Result<PartGuard<J>, PlanFailed> {
        assert!(
            std::ptr::eq(joined.borrow(), &*self.joined),
            "a part is made with its own session's ring"
        );
        let started = Instant::now();
        match self.plan.part_into(claim.seq(), bufs.samples_mut()) {
            Ok(part) => Ok(PartGuard::new(joined, claim, part, bufs, started)),
            Err(e) => {
                tracing::error!(ring = %self.joined.cfg.ring.name, seq = claim.seq(), "cannot make this batch: {e}");
                let committed = self.joined.commit(claim, 0, 0, 0, ERR_PLAN, started);
                Err(PlanFailed {
                    error: e,
                    committed,
                })
            }
        }
    }

    /// This session's seat in the loader table.
    pub fn seat(&self) -> Seat {
        self.seat
    }

    /// Claims a FREE slot: the part its seq names is this session's to make and commit.
    ///
    /// Waits (on the ring's work futex, at most 100 ms at a time) until a slot is free, the
    /// daemon ends the run ([`Next::Ended`]), `deadline` passes ([`Next::TimedOut`]) or `stop`
    /// says to give up ([`Next::Stopped`]). `stop` is asked before every wait, so at least every
    /// 100 ms while waiting, and never when a slot is free at once: a caller may do its own
    /// periodic work in it (a service's watchdog, Python's signal handlers). A ring that is not
    /// READY is believed ended only once its daemon is gone too (any process that maps the
    /// ring can write its state). A daemon that dies is `DaemonGone`.
    pub fn claim(
        &mut self,
        deadline: Option<Instant>,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Next, SessionError> {
        let past = |deadline: Option<Instant>| deadline.is_some_and(|d| Instant::now() >= d);
        loop {
            let ring = &self.joined.ring;
            if ring.state() != ring_state::READY {
                match self.confirm_end(&mut || stop() || past(deadline))? {
                    EndCheck::Ended => return Ok(Next::Ended),
                    EndCheck::Resumed => continue,
                    EndCheck::Stopped if past(deadline) => return Ok(Next::TimedOut),
                    EndCheck::Stopped => return Ok(Next::Stopped),
                }
            }
            if self.last_daemon_check.elapsed() >= DAEMON_CHECK_EVERY {
                self.check_daemon()?;
            }
            let ring = &self.joined.ring;
            // Acquire: pairs with the daemon's Release bump after it frees a slot, so a slot
            // freed after this load makes the wait below return at once.
            let seen = ring.work_seen();
            if let Some((residue, modulus)) = self.only {
                let per_batch = self.plan.parts_per_batch().max(1);
                let wanted = |seq: u64| (seq / per_batch) % modulus == residue;
                if let Some(claim) = ring.try_claim_where(self.seat, &wanted) {
                    return Ok(Next::Part(claim));
                }
            } else if let Some(mut claim) =
                ring.try_claim_preferring(self.seat, self.share, self.hint)
            {
                self.hint = (claim.slot() + 1) % ring.geometry().slot_count;
                if self.peers > 0 && claim.foreign() {
                    claim.forget_pages();
                }
                return Ok(Next::Part(claim));
            }
            if past(deadline) {
                return Ok(Next::TimedOut);
            }
            if stop() {
                return Ok(Next::Stopped);
            }
            let slice = deadline.map_or(MAX_WAIT, |d| {
                d.saturating_duration_since(Instant::now()).min(MAX_WAIT)
            });
            let t = Instant::now();
            let woke = ring.wait_for_work(seen, slice);
            self.note_wait(t.elapsed().as_nanos() as u64);
            if woke == futex::Wake::TimedOut {
                self.check_daemon()?;
            }
        }
    }

    /// Says that `n` loaders are started together with this one (a DataLoader's workers), so
    /// it keeps to its own `1 / n` of the slots from its first claim, instead of taking any free
    /// slot until the others have joined and been counted (at the next look at the daemon,
    /// 250 ms on). Which slots a loader writes decides which pages of the ring it touches, and
    /// so its share of them in its PSS. The preference never decides whether a slot is taken:
    /// a loader whose own slots are all busy fills another's, and then, once the part is
    /// committed, drops its pages of that slot (`LoaderRing::forget_slot_pages`), so only its own
    /// slots stay in its resident memory. The next write to a dropped slot faults its pages in
    /// again, which is why only loaders started together do this (the DataLoader's workers,
    /// whose memory a user compares with torch's), not every loader.
    pub fn expect_peers(&mut self, n: u32) {
        self.peers = n;
        self.share = self.share.max(n);
    }

    /// Claims only the parts of batches `b` with `b % modulus == residue`, lowest seq first
    /// (`LoaderRing::try_claim_where`): the batches of one stream, where each loader makes its
    /// own (an iterable dataset's workers, whose batches interleave round-robin as torch's
    /// DataLoader interleaves them). Parts of other batches are left to their own loaders; a
    /// batch whose loader is gone waits for it, so the caller must restart it or end the run.
    ///
    /// # Panics
    /// If `modulus` is 0 or `residue >= modulus`.
    pub fn keep_to_batches(&mut self, residue: u64, modulus: u64) {
        assert!(residue < modulus, "residue {residue} of modulus {modulus}");
        self.only = Some((residue, modulus));
    }

    /// Leaves the loader table. A part still claimed can no longer be committed (the daemon
    /// takes its slot back and has the part made elsewhere).
    pub fn leave(mut self) {
        self.detach();
    }

    fn detach(&mut self) {
        if !self.left {
            self.left = true;
            self.joined.ring.detach_loader(self.seat);
        }
    }

    /// `DaemonGone` if the ring's daemon no longer holds its lock (it exited or died); counts
    /// the loaders attached again.
    fn check_daemon(&mut self) -> Result<(), SessionError> {
        self.last_daemon_check = Instant::now();
        let ring = &self.joined.ring;
        if !ring.daemon_alive()? {
            return Err(SessionError::DaemonGone {
                ring: ring.name().to_string(),
                pid: ring.daemon().pid,
            });
        }
        self.share = ring.attached_loaders().max(self.peers);
        Ok(())
    }

    /// The ring says it is draining or closed. Only the daemon may end a run, and any process
    /// that maps the ring can write its state, so a loader believes it when the daemon's lock is
    /// gone too (a daemon exits right after it closes the ring). `stop` is asked at least every
    /// 100 ms.
    fn confirm_end(&self, stop: &mut dyn FnMut() -> bool) -> Result<EndCheck, RingError> {
        let ring = &self.joined.ring;
        loop {
            if stop() {
                return Ok(EndCheck::Stopped);
            }
            if !ring.daemon_alive()? {
                return Ok(EndCheck::Ended);
            }
            let seen = ring.work_seen();
            if ring.state() == ring_state::READY {
                return Ok(EndCheck::Resumed);
            }
            ring.wait_for_work(seen, MAX_WAIT);
        }
    }

    /// Books `ns` of waiting for a free slot and refreshes this seat's heartbeat.
    fn note_wait(&self, ns: u64) {
        self.joined.ring.record_wait(self.seat, ns);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.detach();
    }
}

/// What [`Session::confirm_end`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndCheck {
    /// The daemon ended the run.
    Ended,
    /// The ring is READY again (the daemon restored a scribbled header): carry on.
    Resumed,
    /// `stop` asked to give up first.
    Stopped,
}

/// `[dataset.image] decode = "auto"` in a loader's own config: the daemon resolved it for its
/// host, so the loader takes the resolution whose fingerprint is the ring's ("cpu" if neither
/// is, and the mismatch is reported as any other).
fn adopt_decode(cfg: &mut Config, theirs: u64) {
    let Some(image) = cfg.dataset.image.as_ref() else {
        return;
    };
    if image.decode != pinring_data::ImageDecode::Auto {
        return;
    }
    let mut gpu = cfg.clone();
    if let Some(i) = gpu.dataset.image.as_mut() {
        i.resolve_decode(true);
    }
    let on_gpu = gpu.fingerprint() == theirs;
    if let Some(i) = cfg.dataset.image.as_mut() {
        i.resolve_decode(on_gpu);
    }
    tracing::debug!(ring = %cfg.ring.name, on_gpu, "[dataset.image] decode = \"auto\": adopted the daemon's");
}

/// The spec the ring's daemon stored in it, adopted (`Spec::adopt`); `None`: a ring with no
/// handoff area (its daemon's sink is not a training process) stores none.
pub fn stored_spec(ring: &LoaderRing) -> Result<Option<Spec>, StoredSpecError> {
    Spec::adopt_from(ring).transpose()
}

/// Why a file dataset's fingerprint may differ: the daemon's source has another length than this
/// loader's (known when the daemon stored its config in the ring, `--sink consumer`), or a
/// general note that the files' length is part of the fingerprint.
fn length_hint(cfg: &Config, ring: &LoaderRing) -> String {
    if !cfg.dataset.kind.reads_files() {
        return String::new();
    }
    let shard_samples = |c: &Config| {
        c.dataset
            .webdataset
            .as_ref()
            .map(|w| w.shard_samples.clone())
            .unwrap_or_default()
    };
    let theirs = stored_spec(ring)
        .ok()
        .flatten()
        .map(|s| (s.config().dataset.samples, shard_samples(s.config())));
    let mine = shard_samples(cfg);
    match theirs {
        Some((n, _)) if n != cfg.dataset.samples => format!(
            "; the daemon's {} dataset has {n} samples, the files this loader opened have {}: \
             the loader reads other or changed files than the daemon (relative paths are \
             resolved against the config file's directory)",
            cfg.dataset.kind, cfg.dataset.samples
        ),
        Some((_, shards)) if shards != mine => format!(
            "; the daemon's shards hold {shards:?} samples, the shards this loader opened hold \
             {mine:?} (the plan's shard order follows them): the loader reads other or changed \
             shards than the daemon"
        ),
        _ if !mine.is_empty() => format!(
            " (the {} files' length, {} samples here, and the shards' sample counts, {mine:?} \
             here, are part of it: a loader reading other or changed files than the daemon \
             differs)",
            cfg.dataset.kind, cfg.dataset.samples
        ),
        _ => format!(
            " (the {} files' length, {} samples here, is part of it: a loader reading other or \
             changed files than the daemon differs)",
            cfg.dataset.kind, cfg.dataset.samples
        ),
    }
}

/// The plan of `cfg` with enough epochs to cover every seq below `end_seq`.
fn plan_covering(cfg: &mut Config, end_seq: u64) -> Result<Plan, SessionError> {
    let plan_err = |cfg: &Config, source| SessionError::Plan {
        source_name: cfg.source.clone(),
        source,
    };
    // Seqs are parts: an epoch has batches_per_epoch * parts_per_batch of them.
    let plan = cfg.plan().map_err(|e| plan_err(cfg, e))?;
    let per_epoch = (plan.batches_per_epoch() * plan.parts_per_batch()).max(1);
    let epochs = end_seq.div_ceil(per_epoch).clamp(1, u64::from(u32::MAX)) as u32;
    cfg.plan.epochs = epochs;
    cfg.plan().map_err(|e| plan_err(cfg, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinring_data::ImageDecode;

    fn auto_config() -> Config {
        Config::from_toml_str(
            "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = [\"s.tar\"]\n\
             [dataset.image]\ndecode = \"auto\"\nencoded_bytes = \"1MiB\"\n\
             [plan]\nbatch_size = 4\n",
            "test",
        )
        .unwrap()
    }

    fn decode(cfg: &Config) -> ImageDecode {
        cfg.dataset.image.as_ref().unwrap().decode
    }

    /// A loader's own config with decode = "auto" takes whichever resolution the daemon's
    /// fingerprint says, and "cpu" (then reported as a mismatch) when it says neither.
    #[test]
    fn a_loader_adopts_the_daemons_decode_resolution() {
        for gpu in [true, false] {
            let mut daemon = auto_config();
            daemon.dataset.image.as_mut().unwrap().resolve_decode(gpu);
            let mut loader = auto_config();
            adopt_decode(&mut loader, daemon.fingerprint());
            assert_eq!(decode(&loader), decode(&daemon));
            assert_eq!(loader.fingerprint(), daemon.fingerprint());
        }
        let mut loader = auto_config();
        adopt_decode(&mut loader, 1);
        assert_eq!(decode(&loader), ImageDecode::Cpu);
    }
}
