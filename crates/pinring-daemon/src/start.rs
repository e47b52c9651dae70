//! Start-up: load the plan, create and register the ring, start the upload engine and the sink
//! thread, hand every slot its first seq, and set the ring READY.

use super::{cpu_seconds, recovery, Core, Daemon, DaemonError, RunOptions, Sequencer};
use crate::ring_wake::Doorbell;
use crate::sink;
use crossbeam_channel::unbounded;
use pinring_backend::{Backend, Placement, Uploader};
use pinring_data::config::PREFETCH;
use pinring_data::Spec;
use pinring_ring::{ring_state, CreateOptions, DaemonRing};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Daemon {
    /// Starts the daemon on a resolved spec, as `args` say: its plan and layout are the spec's.
    pub(super) fn start(args: &RunOptions, spec: Spec) -> Result<Daemon, DaemonError> {
        let consumer = args.sink == sink::SinkKind::Consumer;
        // A ring that hands batches to a training process stores the spec, for whoever joins
        // it to adopt (`Spec::adopt`).
        let stored = if consumer {
            spec.to_stored()?
        } else {
            Vec::new()
        };
        let (cfg, plan, layout) = spec.into_parts();
        let end_seq = plan.total_seqs();
        let parts = plan.parts_per_batch();
        check_start(args, &cfg, parts, end_seq)?;
        let service =
            crate::service::DaemonService::start(&args.service, &cfg.ring.name, cfg.ring_bytes())
                .map_err(|source| DaemonError::Service {
                ring: cfg.ring.name.clone(),
                source,
            })?;
        warn_of_host_memory(&cfg);
        // --device, else daemon.device (which $PINRING_DEVICE overrides), else 0.
        let device = args
            .device
            .unwrap_or(cfg.daemon.device.map_or(0, |d| d as usize));
        tracing::info!(device, "device");
        // The training process copies each batch out of its slots itself, in its own CUDA
        // context: a second context copying on the GPU would be time-sliced against the
        // trainer's (docs/ARCHITECTURE.md, "Who copies for an attached trainer"). Embedded, the
        // daemon's context is the trainer's, so the daemon copies.
        let consumer_copies = consumer
            && !args.embedded
            && !args.zero_copy
            && cfg.daemon.copies == pinring_data::Copies::Consumer;
        let (selected, located) = find_backend(args, device, consumer_copies)?;
        tracing::info!(backend = located.name, reason = %located.reason, "backend selected");
        let prefer = place_near_device(&cfg, &located);
        let (buffer_bytes, buffers) = upload_buffers(args, &cfg, &layout, consumer)?;
        let handoff = consumer.then(|| pinring_ring::handoff::HandoffSpec {
            buffers: buffers as u32,
            buffer_bytes,
            spec: stored,
            host: located.name == "host",
            device: device as u32,
            // A consumer that copies reads each batch's slots in the part table.
            part_slots: consumer_copies.then_some(parts).map_or(0, saturating_u32),
        });
        let ring = create_ring(args, &cfg, end_seq, handoff)?;
        drop(prefer); // the ring's pages are in; the daemon's later allocations are the kernel's
        let registration = register_ring(args, &ring, selected.as_ref())?;
        let registration_seconds = registration.as_ref().map_or(0.0, |r| r.seconds());
        if let Some(r) = &registration {
            tracing::info!(ring = %cfg.ring.name, bytes = r.bytes(), seconds = r.seconds(), registered = r.registered(), "ring memory registered");
        }
        let uploader = make_uploader(
            args,
            &cfg,
            &ring,
            selected.as_ref(),
            (consumer, consumer_copies),
            (buffers, buffer_bytes),
        )?;
        decode_on_copy(&cfg, &*uploader, consumer_copies)?;
        let doorbell = ring_doorbell(&ring, &uploader, consumer && args.embedded);
        let sink = start_sink(args, &cfg, &layout, &uploader, &doorbell)?;
        let slots = cfg.slots() as usize;
        let look_ahead = look_ahead(args, &cfg, consumer_copies);
        let quiet_in_flight =
            super::quiet_in_flight(uploader.buffer_count(), uploader.buffer_bytes());
        let now = Instant::now();
        // The stages first: their books are sized from the settings, which `Run` then keeps.
        let mut d = Daemon {
            up: super::Uploads::new(
                slots,
                buffers,
                parts,
                args.start_seq / parts,
                look_ahead > 0,
            ),
            intake: Default::default(),
            drain: Default::default(),
            recovery: recovery::Recovery::new(
                slots,
                Duration::from_millis(cfg.daemon.reap_interval_ms),
                Duration::from_millis(cfg.daemon.lease_ms),
                cfg.daemon.on_bad_batch,
                Duration::from_millis(cfg.daemon.idle_warn_ms),
            ),
            delivery: super::Delivery {
                sink,
                handoff_books: Default::default(),
            },
            core: Core {
                uploader,
                service,
                registration,
                sequencer: Sequencer::new(slots, args.start_seq, end_seq, cfg.ring.in_order),
                tally: super::Tally::new(now),
                unpublished: Default::default(),
                now: super::PassClock::read(),
                ids: Default::default(),
                ring,
                run: super::Run {
                    backend_name: located.name.to_string(),
                    backend_reason: located.reason.clone(),
                    plan,
                    layout,
                    meta_reserve: cfg.meta_reserve_bytes() as usize,
                    sample_bytes: cfg.sample_bytes(),
                    parts,
                    zero_copy: args.zero_copy,
                    consumer_copies,
                    look_ahead,
                    holds_own_buffers: args.embedded,
                    quiet_in_flight,
                    cfg,
                },
            },
        };
        d.go_ready(args.start_seq, end_seq, registration_seconds)?;
        Ok(d)
    }
}

/// A count as a `u32`, saturated (a part table's row, which the ring's checks bound anyway).
fn saturating_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// How many waiting parts past one not READY the daemon looks at, in order (`--look-ahead`).
/// Parts are taken ahead only where each batch's slots are freed once its copies complete:
/// zero-copy slots and a consumer's lent slots stay the daemon's until their batch is
/// delivered, and a batch held back for its turn never would be.
fn look_ahead(args: &RunOptions, cfg: &pinring_data::Config, consumer_copies: bool) -> usize {
    if cfg.ring.in_order && !args.zero_copy && !consumer_copies {
        crate::args::look_ahead(args.look_ahead, cfg.slot_bytes()) as usize
    } else {
        0
    }
}

/// Refuses a start the plan cannot make: --zero-copy with batches cut into parts, a start seq
/// inside a batch or past the plan's end.
fn check_start(
    args: &RunOptions,
    cfg: &pinring_data::Config,
    parts: u64,
    end_seq: u64,
) -> Result<(), DaemonError> {
    if parts > 1 && args.zero_copy {
        return Err(DaemonError::Config(pinring_data::ConfigError::Invalid {
            source_name: cfg.source.clone(),
            key: "ring.slot_bytes",
            value: cfg.ring.slot_bytes.to_string(),
            allowed: format!(
                "--zero-copy reads each batch in its one slot, but this slot size cuts a batch \
                 into {parts} parts; use a slot that holds a whole batch (\"auto\" for \
                 batches of up to 4 MiB payload) or run without --zero-copy"
            ),
        }));
    }
    if args.start_seq % parts != 0 {
        return Err(DaemonError::StartSeqInBatch {
            ring: cfg.ring.name.clone(),
            start_seq: args.start_seq,
            parts,
            spelling: args.spelling(),
        });
    }
    if args.start_seq > end_seq {
        return Err(DaemonError::StartSeq {
            ring: cfg.ring.name.clone(),
            start_seq: args.start_seq,
            end_seq,
            source_name: cfg.source.clone(),
            spelling: args.spelling(),
        });
    }
    Ok(())
}

/// Logs what the host's memory says of a ring this size.
fn warn_of_host_memory(cfg: &pinring_data::Config) {
    for w in cfg.ring_warnings(&pinring_runtime::host_memory::HostMemory::read().facts()) {
        tracing::warn!("{w}");
    }
}

/// The backend on `device`: selected (its context opened) where the daemon copies, else only
/// located.
fn find_backend(
    args: &RunOptions,
    device: usize,
    consumer_copies: bool,
) -> Result<(Option<pinring_backend::Selected>, pinring_backend::Located), DaemonError> {
    // A daemon that copies nothing opens no context on the GPU (no device memory, nothing
    // scheduled there, untouched by a fault in the trainer's context): it only finds the
    // device, for the consumer and for the ring's NUMA placement.
    Ok(if consumer_copies {
        (None, pinring_backend::locate(args.backend, device)?)
    } else {
        let s = pinring_backend::select(args.backend, device)?;
        let l = pinring_backend::Located {
            name: s.backend.name(),
            reason: s.reason.clone(),
            pci_bus_id: s.backend.pci_bus_id(),
        };
        (Some(s), l)
    })
}

/// Pins this thread (and so every thread it starts) to the device's NUMA node and prefers that
/// node for the ring's pages while it is made and prefaulted (until the guard drops).
fn place_near_device(
    cfg: &pinring_data::Config,
    located: &pinring_backend::Located,
) -> Option<pinring_runtime::numa::PreferNode> {
    // On the GPU's NUMA node: this thread (and so every thread it starts), and the ring's
    // pages while it is made and prefaulted below.
    let placement = pinring_runtime::numa::plan(
        std::path::Path::new("/sys"),
        located.pci_bus_id.as_deref(),
        pinring_runtime::numa::cpus(cfg.daemon.cpus.as_ref()).as_deref(),
    );
    tracing::info!(ring = %cfg.ring.name, "placement: {}", placement.note);
    if !placement.cpus.is_empty() {
        if let Err(e) = pinring_runtime::numa::pin_this_thread(&placement.cpus) {
            tracing::warn!(ring = %cfg.ring.name, error = %e, "cannot pin the daemon's threads; they run where the kernel puts them");
        }
    }
    pinring_runtime::numa::prefer_node(placement.node)
        .map_err(|e| tracing::warn!(ring = %cfg.ring.name, error = %e, "cannot prefer the GPU's node for the ring's memory"))
        .ok()
}

/// The device batch buffers: their size and how many.
fn upload_buffers(
    args: &RunOptions,
    cfg: &pinring_data::Config,
    layout: &pinring_data::BatchLayout,
    consumer: bool,
) -> Result<(u64, usize), DaemonError> {
    // One device buffer per batch, sized for a whole batch: each field one tensor at its
    // aligned offset, where the parts' chunks of that field land.
    // Enough buffers to keep the copy engine busy while completions travel back: with small
    // batches, a handful of uploads in flight drain faster than a completion round trip.
    // Handed to a consumer, they are its prefetch depth: one name, `daemon.prefetch` and
    // `--prefetch`, for every sink.
    // Handed over, buffers are whole pages, so that on the host backend (buffers side by
    // side in the ring) every buffer and so every field starts aligned.
    let buffer_bytes = if consumer {
        layout.total_bytes.max(1).next_multiple_of(4096)
    } else {
        layout.total_bytes.max(1)
    };
    if consumer && args.prefetch.is_none() {
        // The config's value is the one used: a Config error names the key.
        cfg.check_consumer_prefetch()?;
    }
    let buffers = match args.prefetch.or(cfg.daemon.prefetch) {
        Some(n) if consumer && !PREFETCH.contains(&n) => {
            return Err(DaemonError::Prefetch {
                ring: cfg.ring.name.clone(),
                value: n,
            });
        }
        Some(n) => n as usize,
        None if consumer => default_upload_buffers(buffer_bytes).min(*PREFETCH.end() as usize),
        None => default_upload_buffers(buffer_bytes),
    };
    Ok((buffer_bytes, buffers))
}

/// Registers the ring's data area with the backend where the daemon copies (the consumer that
/// copies registers it in its own process); the ring is unlinked if that fails.
fn register_ring(
    args: &RunOptions,
    ring: &DaemonRing,
    selected: Option<&pinring_backend::Selected>,
) -> Result<Option<pinring_backend::Registration>, DaemonError> {
    // The consumer that copies registers the ring in its own process; the daemon reads no
    // slot on the GPU.
    Ok(
        if let Some(selected) = selected.filter(|_| !args.no_register) {
            let span = ring.registration_span();
            // SAFETY: the data area is a live shared mapping owned by `ring`, which outlives the
            // guard: in `Daemon::start` the guard is declared after the ring (so drops first),
            // and in `Daemon` the field order drops the registration before the ring.
            let reg = unsafe { selected.backend.register(span.0, span.1, args.zero_copy) };
            match reg {
                Ok(r) => Some(r),
                Err(e) => {
                    let _ = ring.unlink();
                    return Err(e.into());
                }
            }
        } else {
            None
        },
    )
}

/// The upload engine, its buffers exported to a consumer where one takes them; the ring is
/// unlinked if that fails.
fn make_uploader(
    args: &RunOptions,
    cfg: &pinring_data::Config,
    ring: &Arc<DaemonRing>,
    selected: Option<&pinring_backend::Selected>,
    (consumer, consumer_copies): (bool, bool),
    (buffers, buffer_bytes): (usize, u64),
) -> Result<Arc<dyn Uploader>, DaemonError> {
    let made = match (selected, ring.host_buffer_ptr(0).filter(|_| consumer)) {
        // Consumer copies: the engine is never given a copy; a host engine of page-sized
        // buffers keeps the main loop's books without device memory or a GPU stream.
        (None, _) => {
            pinring_backend::HostBackend::new().uploader(buffers, 4096, Placement::Contiguous)
        }
        // SAFETY: the handoff area holds `buffers` host buffers of `buffer_bytes` each (a
        // multiple of the page size), side by side from this page-aligned address, inside
        // the ring's mapping, which outlives the uploader (the daemon drops its uploader
        // before its ring). Only the uploader touches them in this process.
        (Some(_), Some(base)) => unsafe {
            pinring_backend::HostBackend::new().uploader_in(base, buffers, buffer_bytes as usize)
        },
        // A consumer in another process opens the buffers through CUDA IPC, a handle per
        // allocation; every other sink takes them side by side, for copies in runs.
        (Some(selected), None) => selected.backend.uploader(
            buffers,
            buffer_bytes as usize,
            if consumer && !args.embedded {
                Placement::Separate
            } else {
                Placement::Contiguous
            },
        ),
    };
    match made.and_then(|u| {
        if consumer {
            export_buffers(ring, &*u, buffers, args.embedded, consumer_copies)?;
        }
        Ok(u)
    }) {
        Ok(u) => {
            u.set_source_ring(cfg.slots() as usize);
            Ok(Arc::from(u))
        }
        Err(e) => {
            let _ = ring.unlink();
            Err(e.into())
        }
    }
}

/// Starts the sink thread, which takes each batch from the device buffers.
fn start_sink(
    args: &RunOptions,
    cfg: &pinring_data::Config,
    layout: &pinring_data::BatchLayout,
    uploader: &Arc<dyn Uploader>,
    doorbell: &Doorbell,
) -> Result<super::delivery::SinkLink, DaemonError> {
    let (sink_tx, sink_jobs) = unbounded();
    let (sink_done_tx, sink_rx) = unbounded();
    let sink_thread = {
        let up = Arc::clone(uploader);
        let synth = cfg.synthetic();
        let fields = layout.clone();
        let kind = args.sink;
        let bell = doorbell.clone();
        std::thread::Builder::new()
            .name("pinring-sink".into())
            .spawn(move || sink::run(kind, up, synth, fields, sink_jobs, sink_done_tx, bell))
            .map_err(|e| DaemonError::Internal {
                ring: cfg.ring.name.clone(),
                what: format!("cannot start the sink thread: {e}"),
            })?
    };
    Ok(super::delivery::SinkLink {
        kind: args.sink,
        tx: Some(sink_tx),
        rx: sink_rx,
        thread: Some(sink_thread),
        pending: 0,
    })
}

impl Daemon {
    /// Hands every slot its first seq and sets the ring READY; tells the service manager.
    fn go_ready(
        &mut self,
        start_seq: u64,
        end_seq: u64,
        registration_seconds: f64,
    ) -> Result<(), DaemonError> {
        let slots = self.core.run.cfg.slots() as usize;
        for slot in 0..slots as u32 {
            self.core.hand_out(slot);
        }
        self.core.tally.started = Instant::now();
        self.core.tally.cpu_at_ready = cpu_seconds();
        self.core.tally.threads_at_ready = super::finish::thread_cpu();
        self.core.tally.preempted_at_ready = super::finish::preemptions();
        self.core.ring.set_state(ring_state::READY);
        tracing::info!(
            ring = %self.core.run.cfg.ring.name,
            path = %pinring_ring::object_path(&self.core.run.cfg.ring.name).display(),
            slots = slots,
            slot_bytes = self.core.run.cfg.slot_bytes(),
            batches = end_seq - start_seq,
            in_order = self.core.run.cfg.ring.in_order,
            sink = self.delivery.sink.kind.name(),
            "ring ready"
        );
        if let Err(source) = self
            .core
            .service
            .ready(&self.core.ring, registration_seconds)
        {
            let _ = self.core.ring.unlink();
            return Err(DaemonError::Service {
                ring: self.core.run.cfg.ring.name.clone(),
                source,
            });
        }
        Ok(())
    }
}

/// Creates the ring (anonymous where the embedding process gave an address, which it is told).
fn create_ring(
    args: &RunOptions,
    cfg: &pinring_data::Config,
    end_seq: u64,
    handoff: Option<pinring_ring::handoff::HandoffSpec>,
) -> Result<Arc<DaemonRing>, DaemonError> {
    let ring = Arc::new(DaemonRing::create(&CreateOptions {
        name: cfg.ring.name.clone(),
        slots: cfg.slots(),
        slot_bytes: cfg.slot_bytes(),
        mode: cfg.ring.mode.bits(),
        group: cfg.ring.group.clone(),
        fingerprint: cfg.fingerprint(),
        settings: cfg.settings_record(),
        start_seq: args.start_seq,
        end_seq,
        in_order: cfg.ring.in_order,
        replace: args.replace,
        handoff,
        anonymous: args.address.is_some(),
    })?);
    if let Some(address) = &args.address {
        // The embedding process's consumer and workers open the ring there.
        let _ = address.set(ring.segment().path());
    }
    Ok(ring)
}

/// The doorbell the main loop sleeps on, rung by the upload engine's completion thread too;
/// an embedded consumer's engine registered for its process to find.
fn ring_doorbell(
    ring: &Arc<DaemonRing>,
    uploader: &Arc<dyn Uploader>,
    embedded_consumer: bool,
) -> Doorbell {
    if embedded_consumer {
        pinring_backend::engines::register(ring.generation(), uploader);
    }
    let doorbell = Doorbell::new(Arc::clone(ring));
    // The upload engine's completion thread rings the doorbell itself after sending
    // completions, so the main loop sleeps on one futex word for everything.
    {
        let bell = doorbell.clone();
        uploader.set_completion_hook(Arc::new(move || bell.ring()));
    }
    doorbell
}

/// Writes each buffer's exported handles (CUDA IPC; nothing on the host backend) into its
/// descriptor and marks the handoff exported, before the ring is READY. Embedded, the buffers
/// are shared with this process's consumer instead (no IPC, no handles in the ring). When the
/// consumer copies, its buffers are its own: there is nothing to export.
fn export_buffers(
    ring: &DaemonRing,
    uploader: &dyn Uploader,
    buffers: usize,
    embedded: bool,
    consumer_copies: bool,
) -> Result<(), pinring_backend::BackendError> {
    for i in (0..buffers).filter(|_| !consumer_copies) {
        if embedded {
            uploader.share_local(i)?;
            continue;
        }
        if let Some(x) = uploader.export(i)? {
            ring.store_buffer_handles(i as u32, &x.mem, &x.ready_event, &x.release_event);
        }
    }
    ring.mark_exported();
    Ok(())
}

/// Batch buffers the daemon uses without `--prefetch` or `daemon.prefetch`: enough to keep 64 MiB of uploads
/// in flight (4 to 128 buffers of `buffer_bytes`, a whole batch each), so the copy engine stays
/// busy while completions travel back. At small batches the count decides instead: 128, so that
/// two events of 64 parts each (the upload engine's) are in flight with buffers to spare (64
/// KiB slots: 29-32 GB/s with 128, 27-29 with 64, 23-25 with 256, docs/BENCHMARKS.md, "Every
/// event looked at"). `pinring bench`'s reference pipeline uses the same number.
pub fn default_upload_buffers(buffer_bytes: u64) -> usize {
    (64u64 << 20).div_ceil(buffer_bytes.max(1)).clamp(4, 128) as usize
}

/// A ring that carries its images encoded, copied by this daemon: its engine decodes them.
fn decode_on_copy(
    cfg: &pinring_data::Config,
    uploader: &dyn Uploader,
    consumer_copies: bool,
) -> Result<(), DaemonError> {
    match cfg.decoder_spec() {
        Some(spec) if !consumer_copies => Ok(uploader.set_decoder(spec)?),
        _ => Ok(()),
    }
}
