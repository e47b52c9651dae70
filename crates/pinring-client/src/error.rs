//! The client's errors: each names the ring, what went wrong and what to do.

use pinring_exit::Exit;
use pinring_ring::RingError;

/// Why a consumer could not attach or get its next batch.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The ring could not be opened or joined (missing, another consumer, no handoff, ...).
    #[error(transparent)]
    Ring(#[from] RingError),
    /// The spec the daemon stored in the ring is not one this version reads, or not valid.
    #[error(transparent)]
    Spec(#[from] pinring_data::StoredSpecError),
    /// The ring holds values no daemon writes (a scribbled segment, or a bug).
    #[error("ring {ring:?}: {what}; restart the daemon (its ring was written by another process)")]
    Corrupt {
        /// Ring name.
        ring: String,
        /// What was wrong.
        what: String,
    },
    /// The requested resume point cannot be served.
    #[error("ring {ring:?}: cannot resume at seq {seq}: {why}")]
    Resume {
        /// Ring name.
        ring: String,
        /// The seq asked for.
        seq: u64,
        /// Why not, and what to do.
        why: String,
    },
    /// A consumer state from another plan.
    #[error("ring {ring:?}: the state was saved under plan fingerprint {saved:#018x}, this ring runs {ring_fingerprint:#018x}: load it into a loader of the same dataset and plan settings (or start fresh)")]
    OtherPlan {
        /// Ring name.
        ring: String,
        /// The state's fingerprint.
        saved: u64,
        /// The ring's fingerprint.
        ring_fingerprint: u64,
    },
    /// The daemon died.
    #[error("ring {ring:?}: its daemon (pid {pid}) is gone, before the batch at seq {seq}; restart it with --start-seq {seq} and attach again")]
    DaemonGone {
        /// Ring name.
        ring: String,
        /// The daemon's pid as the ring records it.
        pid: u32,
        /// The seq the consumer waited for.
        seq: u64,
    },
    /// The daemon stopped before the end of the plan.
    #[error("ring {ring:?}: its daemon stopped (ring {state}) before the batch at seq {seq}; restart it with --start-seq {seq} and attach again")]
    Stopped {
        /// Ring name.
        ring: String,
        /// The ring state.
        state: &'static str,
        /// The seq the consumer waited for.
        seq: u64,
    },
    /// The consumer holds every batch buffer and asks for another: it would wait forever.
    #[error("ring {ring:?}: this consumer holds all {buffers} batch buffers (batches or tensors made from them are still alive) and waits for the batch at seq {seq}, which needs one of them back: drop a batch you keep, or raise daemon.prefetch")]
    AllHeld {
        /// Ring name.
        ring: String,
        /// Buffers of the ring.
        buffers: u32,
        /// The seq waited for.
        seq: u64,
    },
    /// No batch within the caller's timeout.
    #[error("ring {ring:?}: no batch at seq {seq} within {waited_ms} ms (the loaders may be slow or gone: see `pinring status`)")]
    Timeout {
        /// Ring name.
        ring: String,
        /// The seq waited for.
        seq: u64,
        /// How long.
        waited_ms: u64,
    },
    /// The caller's stop check asked to give up a wait (a signal: SIGTERM, Ctrl-C).
    #[error("ring {ring:?}: the wait was interrupted (a stop was requested); nothing was taken")]
    Interrupted {
        /// Ring name.
        ring: String,
    },
    /// An embedded daemon could not start, or failed.
    #[error("{}the embedded daemon: {message}", ring_prefix(ring))]
    Daemon {
        /// Ring name; empty where the daemon failed before its config named one.
        ring: String,
        /// The daemon's message.
        message: String,
        /// The exit code the daemon binary would end with (a bad config is `Config`).
        exit: Exit,
    },
    /// A CUDA call on the consumer's side failed, or CUDA IPC is unavailable.
    #[error("ring {ring:?}: {source}")]
    Backend {
        /// Ring name.
        ring: String,
        /// The backend's error.
        #[source]
        source: pinring_backend::BackendError,
    },
    /// A copy of a batch out of the ring's slots failed on this process's side (the consumer
    /// copies: `daemon.copies = "consumer"`).
    #[error("ring {ring:?}: {what}; the batches after it are not given out: check the GPU (nvidia-smi, the kernel log) and restart the training process, which resumes from its last state")]
    Copy {
        /// Ring name.
        ring: String,
        /// What failed.
        what: String,
    },
}

impl pinring_exit::Coded for ClientError {
    /// The exit code a binary ends with for this error (and the Python exception's class).
    fn exit(&self) -> pinring_exit::Exit {
        match self {
            ClientError::Ring(e) => e.exit(),
            ClientError::Spec(e) => e.exit(),
            ClientError::Corrupt { .. } => Exit::Ring,
            ClientError::Resume { .. } | ClientError::AllHeld { .. } => Exit::Usage,
            ClientError::OtherPlan { .. } => Exit::Refused,
            ClientError::DaemonGone { .. }
            | ClientError::Stopped { .. }
            | ClientError::Timeout { .. } => Exit::PeerDied,
            ClientError::Backend { .. } | ClientError::Copy { .. } => Exit::Backend,
            // Asked for: a stop, not a failure.
            ClientError::Interrupted { .. } => Exit::Ok,
            ClientError::Daemon { exit, .. } => *exit,
        }
    }
}

/// `ring "NAME": `, the start of a message about a ring, or nothing where the name is not known
/// (an embedded daemon whose config could not be read): never `ring "": `.
fn ring_prefix(ring: &str) -> String {
    if ring.is_empty() {
        String::new()
    } else {
        format!("ring {ring:?}: ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_embedded_daemons_error_names_its_ring_only_when_it_is_known() {
        let e = |ring: &str| ClientError::Daemon {
            ring: ring.into(),
            message: "cannot read config file x.toml".into(),
            exit: Exit::Config,
        };
        assert_eq!(
            e("").to_string(),
            "the embedded daemon: cannot read config file x.toml"
        );
        assert_eq!(
            e("gpu0").to_string(),
            "ring \"gpu0\": the embedded daemon: cannot read config file x.toml"
        );
    }
}
