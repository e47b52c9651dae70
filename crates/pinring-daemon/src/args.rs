//! The daemon's command line: [`DaemonArgs`] (clap), what it says over the config
//! ([`DaemonArgs::overrides`]) and how the daemon runs ([`RunOptions`]), and the `--backend`
//! parser. The embedding API is [`RunOptions`] with a resolved spec, not these flags.

use crate::sink::SinkKind;
use pinring_backend::BackendKind;
use std::path::PathBuf;

/// Daemon settings (from flags).
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonArgs {
    /// Config file (TOML). Without it, the built-in synthetic config.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Ring name (overrides ring.name).
    #[arg(long, value_name = "NAME")]
    pub ring: Option<String>,
    /// GPU backend: cuda, host (ordinary memory), or auto (cuda when a driver and device exist).
    #[arg(long, default_value = "auto", value_parser = parse_backend_kind)]
    pub backend: BackendKind,
    /// CUDA device ordinal (overrides daemon.device and $PINRING_DEVICE; default 0).
    #[arg(long)]
    pub device: Option<usize>,
    /// What consumes uploaded batches.
    #[arg(long, value_enum, default_value = "discard")]
    pub sink: SinkKind,
    /// Epochs to run (overrides plan.epochs); 0: every epoch until stopped (the service's).
    #[arg(long)]
    pub epochs: Option<u32>,
    /// Permission of the ring's segment (overrides ring.mode): 0600, this user only, or 0660,
    /// this user and the ring's group (ring.group, else the daemon's own group), so a trainer
    /// of that group can attach.
    #[arg(long, value_name = "MODE")]
    pub ring_mode: Option<pinring_data::config::SegmentMode>,
    /// Deliver batches in any order (overrides ring.in_order = true).
    #[arg(long)]
    pub unordered: bool,
    /// First seq to deliver (resume a run; the summary's resume_seq).
    #[arg(long, default_value_t = 0)]
    pub start_seq: u64,
    /// Batch buffers: whole batches uploaded ahead of the sink (1 to 256), or with --sink
    /// consumer ahead of or held by the training process (2 to 64). Overrides daemon.prefetch.
    /// Default: enough for 64 MiB in flight, 4 to 128 (at most 64 with --sink consumer).
    /// (`--upload-buffers` is its former name.)
    #[arg(long, value_name = "N", alias = "upload-buffers",
          value_parser = clap::value_parser!(u32).range(*pinring_data::config::BATCH_BUFFERS.start() as i64..=*pinring_data::config::BATCH_BUFFERS.end() as i64))]
    pub prefetch: Option<u32>,
    /// In order: how many parts waiting past the first one not yet READY the daemon looks at
    /// for one to upload ahead (its batch is held back until every earlier one went to the
    /// sink). 0 uploads in seq order only. Default: 16 from 256 KiB slots up, 0 below (small
    /// parts go up as runs of consecutive slots, which a part taken out of turn breaks). Not
    /// used with --zero-copy or when the consumer copies (their slots stay the daemon's until
    /// delivery).
    #[arg(long, value_name = "N")]
    pub look_ahead: Option<u32>,
    /// Write a JSON summary here at exit.
    #[arg(long, value_name = "PATH")]
    pub summary: Option<PathBuf>,
    /// Replace whatever is at the ring's path unless a live daemon holds it: a file that is not
    /// a ring, a ring of another layout version, a FIFO or a link. Without it only a stale ring
    /// (its daemon gone) is replaced. Another user's file is never replaced.
    #[arg(long)]
    pub replace: bool,
    /// Leave the ring's memory unregistered (pageable baseline).
    #[arg(long, conflicts_with = "zero_copy")]
    pub no_register: bool,
    /// Zero-copy: register the ring with DEVICEMAP and let the sink's kernel read each batch in
    /// its slot through the mapped device address (no upload); the slot is freed after the sink.
    #[arg(long)]
    pub zero_copy: bool,
    /// Running as a service: metrics endpoint, log level.
    #[command(flatten)]
    pub service: crate::service::DaemonServiceArgs,
}

impl DaemonArgs {
    /// What the flags say over the config's settings, named as flags (`--epochs 5`); the
    /// environment's are added where the settings are read.
    pub fn overrides(&self) -> pinring_runtime::settings::Overrides {
        pinring_runtime::settings::Overrides {
            ring: self.ring.clone(),
            epochs: self.epochs,
            ring_mode: self.ring_mode,
            unordered: self.unordered,
            spelling: pinring_runtime::settings::Spelling::Flags,
            ..Default::default()
        }
    }

    /// How the daemon runs its spec, as the flags say.
    pub fn options(&self) -> RunOptions {
        RunOptions {
            backend: self.backend,
            device: self.device,
            sink: self.sink,
            start_seq: self.start_seq,
            prefetch: self.prefetch,
            look_ahead: self.look_ahead,
            replace: self.replace,
            no_register: self.no_register,
            zero_copy: self.zero_copy,
            service: self.service.clone(),
            embedded: false,
            address: None,
        }
    }
}

/// How a daemon runs a resolved spec ([`crate::serve`]): what is not a setting of the config
/// (the backend, the sink, where to start, registration), from the daemon's flags
/// ([`DaemonArgs::options`]) or from the code that embeds the daemon in a training process
/// (pinring-client's `EmbeddedDaemon`).
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// `--backend`.
    pub backend: BackendKind,
    /// `--device`: over `daemon.device` (and `$PINRING_DEVICE`); `None`: the spec's, else 0.
    pub device: Option<usize>,
    /// `--sink`.
    pub sink: SinkKind,
    /// `--start-seq`.
    pub start_seq: u64,
    /// `--prefetch`: over `daemon.prefetch`.
    pub prefetch: Option<u32>,
    /// `--look-ahead`.
    pub look_ahead: Option<u32>,
    /// `--replace`.
    pub replace: bool,
    /// `--no-register`.
    pub no_register: bool,
    /// `--zero-copy`.
    pub zero_copy: bool,
    /// The service's flags (metrics endpoint, log level).
    pub service: crate::service::DaemonServiceArgs,
    /// Runs inside the training process (pinring-client's `EmbeddedDaemon`): the consumer
    /// sink's buffers are shared with this process's consumer, not exported through CUDA IPC,
    /// and messages name options as `pinring.EmbeddedDaemon`'s keywords.
    pub embedded: bool,
    /// Make the ring anonymous (a memfd, no name in /dev/shm; pinring-ring's
    /// `Segment::create_anonymous`) and publish where it can be opened here once it exists.
    pub address: Option<std::sync::Arc<std::sync::OnceLock<PathBuf>>>,
}

impl RunOptions {
    /// How the daemon's messages name its options: its flags, or, embedded in a Python
    /// process, the keyword arguments of `pinring.EmbeddedDaemon` (`start_seq=8`).
    pub fn spelling(&self) -> pinring_runtime::settings::Spelling {
        if self.embedded {
            pinring_runtime::settings::Spelling::Keywords
        } else {
            pinring_runtime::settings::Spelling::Flags
        }
    }
}

/// Parts the daemon looks at past the first not READY, in order (`--look-ahead`), from
/// [`LOOK_AHEAD_FROM`] slots up.
pub const DEFAULT_LOOK_AHEAD: u32 = 16;

/// The smallest slot the daemon looks ahead for by default. Below it a part's copy is so short
/// that consecutive slots go up as one copy, and a part taken out of turn breaks the run: with
/// 64 KiB slots in 1024, looking ahead took the pipeline from 38-39 to 28-29 GB/s on the H200,
/// where from 256 KiB up it changed nothing at the default ring and lifted 4 MiB slots in 16.
pub const LOOK_AHEAD_FROM: u64 = 256 * 1024;

/// The look-ahead for a run: the flag's, or the default for its slot size.
pub fn look_ahead(flag: Option<u32>, slot_bytes: u64) -> u32 {
    flag.unwrap_or(if slot_bytes >= LOOK_AHEAD_FROM {
        DEFAULT_LOOK_AHEAD
    } else {
        0
    })
}

/// Parses `--backend`.
pub fn parse_backend_kind(s: &str) -> Result<BackendKind, String> {
    s.parse::<BackendKind>().map_err(|e| e.to_string())
}
