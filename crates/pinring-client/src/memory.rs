//! The memory a consumer reads batches from: host buffers inside the ring's mapping, or a CUDA
//! device's buffers opened through IPC handles.

use crate::{ClientError, Location};
use pinring_backend::{BackendError, BufferExport};
use pinring_ring::handoff::backend_code;
use pinring_ring::ConsumerRing;

/// The batch buffers, as this process reaches them.
#[derive(Debug)]
pub enum Memory {
    /// Host backend: buffer `i` at `ptrs[i]` in the ring's mapping.
    Host {
        /// Addresses.
        ptrs: Vec<u64>,
        /// Bytes per buffer.
        buffer_bytes: u64,
    },
    /// CUDA, the daemon in this process (embedded mode): its upload engine's buffers and events,
    /// reached directly.
    Local {
        /// The daemon's upload engine.
        uploader: Engine,
        /// CUDA device ordinal.
        device: u32,
        /// Bytes per buffer.
        buffer_bytes: u64,
    },
    /// The consumer copies (`daemon.copies = "consumer"`): its own buffers, filled by its own
    /// engine out of the ring's slots (crate::copier).
    Own(Box<crate::copier::Copier>),
    /// CUDA: the daemon's device buffers, opened through their IPC handles.
    Cuda {
        /// The opened buffers and events.
        imported: pinring_backend::cuda::ipc::Imported,
        /// Bytes per buffer.
        buffer_bytes: u64,
    },
}

impl Memory {
    /// Opens the ring's buffers.
    pub(crate) fn open(
        ring: &ConsumerRing,
        plan: &pinring_data::Plan,
        layout: &pinring_data::BatchLayout,
        decoder: Option<crate::copier::DecodeOnCopy>,
    ) -> Result<Memory, ClientError> {
        let hg = ring.geometry().handoff.ok_or_else(|| {
            ClientError::Ring(pinring_ring::RingError::NoHandoff {
                name: ring.name().into(),
            })
        })?;
        let (backend, device) = ring.handoff_backend();
        if hg.part_slots > 0 {
            let cuda = match backend {
                backend_code::HOST => None,
                backend_code::CUDA => Some(device),
                other => {
                    return Err(ClientError::Corrupt {
                        ring: ring.name().into(),
                        what: format!(
                            "handoff backend code {other} is not one this consumer opens"
                        ),
                    })
                }
            };
            return crate::copier::Copier::open(
                ring,
                cuda,
                hg.buffers,
                hg.buffer_bytes,
                plan,
                layout,
                decoder,
            )
            .map(|c| Memory::Own(Box::new(c)));
        }
        match backend {
            backend_code::HOST => Ok(Memory::Host {
                ptrs: (0..hg.buffers)
                    .map(|i| ring.host_buffer_ptr(i).map_or(0, |p| p as u64))
                    .collect(),
                buffer_bytes: hg.buffer_bytes,
            }),
            backend_code::CUDA if ring.daemon().pid == std::process::id() => {
                let generation = ring.generation();
                let uploader = pinring_backend::engines::engine(generation).ok_or_else(|| {
                    ClientError::Corrupt {
                        ring: ring.name().into(),
                        what: "the ring's daemon runs in this process, but no upload engine of \
                               this process serves it"
                            .into(),
                    }
                })?;
                Ok(Memory::Local {
                    uploader: Engine(uploader),
                    device,
                    buffer_bytes: hg.buffer_bytes,
                })
            }
            backend_code::CUDA => {
                let exports: Vec<BufferExport> = (0..hg.buffers)
                    .map(|i| {
                        let [mem, ready_event, release_event] = ring.buffer_handles(i);
                        BufferExport {
                            mem,
                            ready_event,
                            release_event,
                        }
                    })
                    .collect();
                let device = device as usize;
                let imported = pinring_backend::cuda::ipc::Imported::open(device, &exports)
                    .map_err(|source| ClientError::Backend {
                        ring: ring.name().into(),
                        source,
                    })?;
                Ok(Memory::Cuda {
                    imported,
                    buffer_bytes: hg.buffer_bytes,
                })
            }
            other => Err(ClientError::Corrupt {
                ring: ring.name().into(),
                what: format!("handoff backend code {other} is not one this consumer opens"),
            }),
        }
    }

    /// Address of buffer `i`.
    pub fn ptr(&self, i: u32) -> u64 {
        match self {
            Memory::Host { ptrs, .. } => ptrs[i as usize],
            Memory::Cuda { imported, .. } => imported.device_ptr(i as usize),
            Memory::Local { uploader, .. } => uploader.0.device_ptr(i as usize),
            Memory::Own(c) => c.engine().device_ptr(i as usize),
        }
    }

    /// Bytes per buffer.
    pub fn buffer_bytes(&self) -> u64 {
        match self {
            Memory::Host { buffer_bytes, .. }
            | Memory::Cuda { buffer_bytes, .. }
            | Memory::Local { buffer_bytes, .. } => *buffer_bytes,
            Memory::Own(c) => c.engine().buffer_bytes() as u64,
        }
    }

    /// Where the buffers are.
    pub fn location(&self) -> Location {
        match self {
            Memory::Host { .. } => Location::Host,
            Memory::Cuda { imported, .. } => Location::Cuda(imported.device() as u32),
            Memory::Local { device, .. } => Location::Cuda(*device),
            Memory::Own(c) => c.location(),
        }
    }

    /// Makes `stream` wait until buffer `i`'s batch is there (host: it already is).
    ///
    /// `stream` must be 0 (the legacy default stream), 2 (per-thread default) or a live stream of
    /// the device's primary context (`torch.cuda.current_stream().cuda_stream`).
    pub(crate) fn wait_ready(&self, i: u32, stream: u64) -> Result<(), BackendError> {
        match self {
            Memory::Host { .. } => Ok(()),
            // SAFETY: the caller's contract above (the Python layer passes torch's current
            // stream of this device, or 0).
            Memory::Cuda { imported, .. } => unsafe { imported.wait_ready(i as usize, stream) },
            // SAFETY: as above.
            Memory::Local { uploader, .. } => unsafe {
                uploader.0.local_wait_ready(i as usize, stream)
            },
            // SAFETY: as above.
            Memory::Own(c) => unsafe { c.engine().local_wait_ready(i as usize, stream) },
        }
    }

    /// Records buffer `i`'s release after the work on `stream` (host: reads are done).
    pub(crate) fn record_release(&self, i: u32, stream: u64) -> Result<(), BackendError> {
        match self {
            Memory::Host { .. } => Ok(()),
            // SAFETY: as for `wait_ready`: the stream the batch was last used on, of this
            // device's primary context, or 0.
            Memory::Cuda { imported, .. } => unsafe { imported.record_release(i as usize, stream) },
            // SAFETY: as above.
            Memory::Local { uploader, .. } => unsafe {
                uploader.0.local_record_release(i as usize, stream)
            },
            // SAFETY: as above.
            Memory::Own(c) => unsafe { c.engine().local_record_release(i as usize, stream) },
        }
    }
}

/// The upload engine of a daemon in this process.
pub struct Engine(std::sync::Arc<dyn pinring_backend::Uploader>);

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("buffers", &self.0.buffer_count())
            .field("buffer_bytes", &self.0.buffer_bytes())
            .finish()
    }
}
