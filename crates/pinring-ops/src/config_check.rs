//! `pinring config check [FILE | --config FILE] [--ring NAME]`: validates a config file (or the one the lookup
//! finds) and prints the settings a daemon or loader would run on, with the derived sizes and
//! warnings where the ring is larger than this host's last-level cache or available memory.

use pinring_data::ConfigError;
use pinring_exit::Exit;
use pinring_runtime::settings::{self, Overrides};
use std::path::PathBuf;

/// `pinring config` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ConfigCmd {
    /// Validate FILE (or the file the lookup finds) and print the resolved settings.
    Check(CheckArgs),
}

/// `pinring config check` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// Config file; without it, the file the lookup finds for --ring (or the built-in default).
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The config file, named as every other command names it (the same as FILE).
    #[arg(long = "config", value_name = "FILE", conflicts_with = "file")]
    pub config: Option<PathBuf>,
    /// Ring name (overrides ring.name; also picks `<ring>.toml` in the lookup).
    #[arg(long, value_name = "NAME")]
    pub ring: Option<String>,
}

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The config is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// It does not resolve as the daemon would resolve it (its files, the plan, `ring.group`).
    #[error(transparent)]
    Resolve(#[from] pinring_data::ResolveError),
}

impl pinring_exit::Coded for CheckError {
    /// The exit code for this error: the daemon's for the same config (`ResolveError`'s code).
    fn exit(&self) -> pinring_exit::Exit {
        match self {
            CheckError::Resolve(e) => e.exit(),
            CheckError::Config(_) => Exit::Config,
        }
    }
}

/// Runs `pinring config check`: prints the resolved settings to stdout.
pub fn run(args: &CheckArgs) -> Result<(), CheckError> {
    let file = args.config.as_deref().or(args.file.as_deref());
    let origin = settings::locate(file, args.ring.as_deref())?;
    let overrides = Overrides {
        ring: args.ring.clone(),
        ..Default::default()
    };
    let found = settings::find(origin.path(), &overrides)?;
    // The daemon's own resolution (`Spec::resolve`): its files opened and checked against
    // the declared fields (their length is dataset.samples), "auto" resolved as a daemon on
    // this host would (loaders adopt the daemon's values), every rule the daemon checks
    // (ring.group among them), the plan.
    let host = pinring_runtime::host_memory::HostMemory::read();
    let facts = pinring_data::HostFacts {
        gpu_decode: found
            .applied()
            .is_ok_and(|c| pinring_backend::cuda::decode_auto_on_gpu(&c)),
        ..host.facts()
    };
    let resolved = pinring_data::Spec::resolve(
        found.settings,
        &found.overrides,
        &facts,
        &pinring_sources::Files,
    )?;
    let auto = resolved
        .auto()
        .map(|a| a.line(resolved.config(), &host.cache_origin()));
    let plan = resolved.plan();
    let cfg = resolved.config();
    pinring_runtime::outln!("# config OK: {}", cfg.source);
    pinring_runtime::outln!("# found by: {}", origin.describe());
    if let Some(w) = cfg.sets_nothing_warning() {
        pinring_runtime::outln!("# warning: {w}");
    }
    pinring_runtime::outln!("# segment: {}", cfg.segment_path());
    pinring_runtime::outln!(
        "# slot bytes: {} ({} payload max + {} metadata reserve; {}); ring data: {} bytes \
         ({:.1} MiB)",
        cfg.slot_bytes(),
        cfg.part_payload_bytes_max(),
        cfg.meta_reserve_bytes(),
        cfg.parts_described(),
        cfg.ring_bytes(),
        cfg.ring_bytes() as f64 / (1u64 << 20) as f64
    );
    let layout = cfg.batch_layout();
    let fields: Vec<String> = layout
        .fields
        .iter()
        .map(|f| format!("{} {} {:?} at byte {}", f.name, f.dtype, f.shape, f.offset))
        .collect();
    pinring_runtime::outln!(
        "# fields: {} of a {}-byte device buffer per batch; {} bytes per sample, field-major in \
         slots",
        fields.join(", "),
        layout.total_bytes,
        layout.record_bytes
    );
    pinring_runtime::outln!("# host: {}", host.describe());
    if let Some(line) = auto {
        pinring_runtime::outln!("# auto: {line}");
    }
    pinring_runtime::outln!(
        "# placement: {}",
        placement_line(std::path::Path::new("/sys"), cfg)
    );
    for w in cfg.ring_warnings(&facts) {
        pinring_runtime::outln!("# warning: {w}");
    }
    pinring_runtime::outln!(
        "# plan: {} batches per epoch, {} batches in all; fingerprint {:#018x}",
        plan.batches_per_epoch(),
        plan.total_batches(),
        cfg.fingerprint()
    );
    if let Some(order) = plan.shard_order() {
        let p = plan.params();
        pinring_runtime::outln!(
            "# shard order: rank {} of {} holds {} samples in {} of the {} shards; every rank \
             delivers {} samples per epoch ({})",
            p.plan.rank,
            p.plan.world_size,
            order.rank_samples(p.plan.rank, p.plan.world_size),
            order.rank_shards(p.plan.rank, p.plan.world_size),
            order.shards(),
            plan.samples_per_rank(),
            if p.plan.drop_last {
                "truncated to the smallest rank's count"
            } else {
                "padded to the largest rank's count from the start of each rank's order"
            }
        );
    }
    pinring_runtime::out!("{}", cfg.to_toml());
    Ok(())
}

/// Where the daemon of `cfg` would put its ring and threads on this host, without touching the
/// GPU (the device's node needs its PCI bus id, which the daemon reads from the driver at start).
fn placement_line(sys: &std::path::Path, cfg: &pinring_data::Config) -> String {
    let list = |c: &Option<Vec<u32>>| {
        pinring_runtime::numa::cpus(c.as_ref()).map(|c| pinring_runtime::numa::format_list(&c))
    };
    let nodes = pinring_runtime::numa::online_nodes(sys).len();
    let base = if nodes <= 1 {
        "one NUMA node on this host: nothing to place".to_string()
    } else {
        format!(
            "{nodes} NUMA nodes: the daemon reads GPU {}'s node from the driver at start, \
             prefers it for the ring's memory and runs its threads on its CPUs; loaders follow \
             the daemon's CPUs",
            cfg.daemon.device.unwrap_or(0)
        )
    };
    match (list(&cfg.daemon.cpus), list(&cfg.daemon.loader_cpus)) {
        (None, None) => base,
        (d, l) => format!(
            "{base}; daemon.cpus {}, daemon.loader_cpus {}",
            d.as_deref().unwrap_or("(by node)"),
            l.as_deref().unwrap_or("(the daemon's)")
        ),
    }
}
