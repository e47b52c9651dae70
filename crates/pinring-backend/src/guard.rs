//! The per-buffer guard both upload engines share, and the checks of an upload job.
//!
//! Each device buffer has a `pending` count (uploads submitted and not yet complete) and a
//! `readers` count (calls reading it now). An upload increments `pending`, then checks `readers`
//! is 0 (else it backs out: `BufferBusy`); a reader increments `readers`, then checks `pending` is
//! 0 (else it backs out: `BufferBusy`). Both sides use SeqCst, so of two racing calls at least one
//! sees the other's increment (the store-load pattern): a copy into a buffer and a read of it are
//! never in flight together, even if a caller got the protocol wrong. Whoever observes an upload
//! complete decrements `pending` (SeqCst, which includes Release) after the copy, so a reader that
//! sees 0 also sees every byte copied. Each backend says in its module docs when its uploads
//! complete and how long its readers hold the count.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::host::check_range;
use crate::{BackendError, UploadJob};

/// Checks a job against the uploader's geometry before anything is queued: the buffer index,
/// the destination range inside the buffer, and a source for a non-empty copy.
pub(crate) fn check_job(
    job: &UploadJob,
    count: usize,
    buffer_bytes: usize,
) -> Result<(), BackendError> {
    check_range("submit", job.buffer, 0, 0, count, buffer_bytes)?;
    let (offset, len, buffer) = (job.dst_offset, job.dst_len(), job.buffer);
    if offset.checked_add(len).is_none_or(|end| end > buffer_bytes) {
        return Err(BackendError::InvalidArgument {
            call: "submit",
            what: format!(
                "{len} bytes at offset {offset} end past the device buffer size of \
                 {buffer_bytes} bytes (buffer {buffer}); the destination must lie inside the buffer"
            ),
        });
    }
    if job.len > 0 && job.src.is_null() {
        return Err(BackendError::InvalidArgument {
            call: "submit",
            what: format!(
                "null source pointer for {} bytes (tag {})",
                job.len, job.tag
            ),
        });
    }
    Ok(())
}

/// The per-buffer counts that keep uploads into a device buffer and reads of it apart (module
/// docs).
#[derive(Debug)]
pub(crate) struct Guards {
    /// Uploads submitted into each buffer and not yet observed complete.
    pending: Vec<AtomicUsize>,
    /// Reads of each buffer in progress.
    readers: Vec<AtomicUsize>,
}

impl Guards {
    pub(crate) fn new(buffers: usize) -> Self {
        Self {
            pending: (0..buffers).map(|_| AtomicUsize::new(0)).collect(),
            readers: (0..buffers).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    /// Announces an upload into `buffer`, then looks for readers: `BufferBusy` (and the upload
    /// withdrawn) if the buffer is being read. `buffer` is in range (checked by the caller).
    pub(crate) fn begin_upload(&self, buffer: usize) -> Result<(), BackendError> {
        self.pending[buffer].fetch_add(1, Ordering::SeqCst);
        let readers = self.readers[buffer].load(Ordering::SeqCst);
        if readers != 0 {
            self.pending[buffer].fetch_sub(1, Ordering::SeqCst);
            return Err(BackendError::BufferBusy {
                call: "submit",
                buffer,
                pending: readers,
            });
        }
        Ok(())
    }

    /// Ends an upload begun with [`Guards::begin_upload`]: it has completed on the device, or it
    /// was withdrawn after the copy was waited for.
    pub(crate) fn end_upload(&self, buffer: usize) {
        self.pending[buffer].fetch_sub(1, Ordering::SeqCst);
    }

    /// Announces a reader of `buffer`, then looks for pending uploads: `BufferBusy` (and the
    /// reader withdrawn) if an upload into it has not completed. `buffer` is in range.
    pub(crate) fn begin_read(
        &self,
        call: &'static str,
        buffer: usize,
    ) -> Result<Reading<'_>, BackendError> {
        let readers = &self.readers[buffer];
        readers.fetch_add(1, Ordering::SeqCst);
        let pending = self.pending[buffer].load(Ordering::SeqCst);
        if pending != 0 {
            readers.fetch_sub(1, Ordering::SeqCst);
            return Err(BackendError::BufferBusy {
                call,
                buffer,
                pending,
            });
        }
        Ok(Reading { readers })
    }
}

/// A read of one device buffer in progress; dropping it ends the read. Keep it until the
/// kernel reading the buffer has been waited for.
#[derive(Debug)]
#[must_use = "the read ends when this is dropped"]
pub(crate) struct Reading<'a> {
    readers: &'a AtomicUsize,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.readers.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    //! The guard protocol itself; `cuda/tests.rs` and `host.rs` run it through real uploaders.

    use super::*;

    fn busy(r: Result<impl std::fmt::Debug, BackendError>) -> bool {
        matches!(r, Err(BackendError::BufferBusy { .. }))
    }

    #[test]
    fn a_buffer_being_read_refuses_uploads() {
        let g = Guards::new(2);
        let reading = g.begin_read("checksum", 0).unwrap();
        assert!(busy(g.begin_upload(0)));
        assert_eq!(
            g.pending[0].load(Ordering::SeqCst),
            0,
            "the refused upload backs out"
        );
        // Other buffers are not affected.
        g.begin_upload(1).unwrap();
        g.end_upload(1);
        drop(reading);
        assert_eq!(g.readers[0].load(Ordering::SeqCst), 0);
        g.begin_upload(0).unwrap();
        g.end_upload(0);
    }

    #[test]
    fn a_buffer_with_an_upload_pending_refuses_readers() {
        let g = Guards::new(2);
        g.begin_upload(0).unwrap();
        assert!(busy(g.begin_read("compute", 0)));
        assert_eq!(
            g.readers[0].load(Ordering::SeqCst),
            0,
            "the refused read backs out"
        );
        drop(g.begin_read("compute", 1).unwrap());
        g.end_upload(0);
        let reading = g.begin_read("compute", 0).unwrap();
        // Readers share a buffer.
        let second = g.begin_read("checksum", 0).unwrap();
        assert_eq!(g.readers[0].load(Ordering::SeqCst), 2);
        drop((reading, second));
        assert_eq!(g.readers[0].load(Ordering::SeqCst), 0);
    }

    #[test]
    fn racing_uploads_and_reads_never_overlap() {
        use std::sync::atomic::AtomicBool;
        let g = Guards::new(1);
        // Set while a read or an upload holds the buffer; the other side must never see it.
        let (reading, uploading) = (AtomicBool::new(false), AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..20_000 {
                    if let Ok(r) = g.begin_read("checksum", 0) {
                        reading.store(true, Ordering::SeqCst);
                        assert!(!uploading.load(Ordering::SeqCst), "read during an upload");
                        reading.store(false, Ordering::SeqCst);
                        drop(r);
                    }
                }
            });
            s.spawn(|| {
                for _ in 0..20_000 {
                    if g.begin_upload(0).is_ok() {
                        uploading.store(true, Ordering::SeqCst);
                        assert!(!reading.load(Ordering::SeqCst), "upload during a read");
                        uploading.store(false, Ordering::SeqCst);
                        g.end_upload(0);
                    }
                }
            });
        });
        assert_eq!(g.pending[0].load(Ordering::SeqCst), 0);
        assert_eq!(g.readers[0].load(Ordering::SeqCst), 0);
    }
}
