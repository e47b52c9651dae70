//! Prometheus metrics of a daemon, served over HTTP on a local address (`--metrics-listen
//! 127.0.0.1:9464`; off by default).
//!
//! Why an endpoint in the daemon rather than a node_exporter textfile: a scrape then reads the
//! live counters at scrape time (no writer loop, no file to go stale when the daemon dies: a dead
//! daemon is a failed scrape, which is the alert one wants), the latency histograms live in the
//! daemon's memory anyway, and nothing but the daemon is needed. The listener is one thread
//! serving one short request at a time, whose head (parsed by `httparse`) must arrive within 2 s
//! in all; it binds where it is told (keep it on 127.0.0.1 and let the local Prometheus agent
//! scrape it).

use crate::histogram::Histogram;
use pinring_observe::{ConsumerView, Snapshot};
use pinring_ring::DaemonRing;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the daemon measures itself, beside the ring's counters.
#[derive(Debug, Default)]
pub struct DaemonMetrics {
    /// Seconds registering the ring (f64 bits).
    registration_seconds_bits: AtomicU64,
    /// From a loader's commit to the end of the batch's upload.
    pub commit_to_upload_done: Histogram,
    /// From upload submission to its completion.
    pub upload: Histogram,
    /// From a loader's claim to its commit (producing the batch).
    pub fill: Histogram,
    /// Images the daemon's engine decoded, per way (`[dataset.image] decode = "gpu"` where the
    /// daemon copies); none where it decodes nothing.
    decoded: std::sync::Mutex<Option<pinring_backend::DecodeCounts>>,
}

impl DaemonMetrics {
    /// Records the registration time.
    pub fn set_registration_seconds(&self, s: f64) {
        self.registration_seconds_bits.store(s.to_bits(), Relaxed);
    }

    /// The registration time.
    pub fn registration_seconds(&self) -> f64 {
        f64::from_bits(self.registration_seconds_bits.load(Relaxed))
    }

    /// Records the engine's decode counts (the latest, whole).
    pub fn set_decoded(&self, counts: pinring_backend::DecodeCounts) {
        *self.decoded.lock().unwrap_or_else(|e| e.into_inner()) = Some(counts);
    }

    fn decoded(&self) -> Option<pinring_backend::DecodeCounts> {
        *self.decoded.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn line(out: &mut String, name: &str, kind: &str, help: &str, labels: &str, value: impl ToString) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name}{{{labels}}} {}", value.to_string());
}

/// The metrics in Prometheus text format (version 0.0.4).
pub fn render(ring: &DaemonRing, m: &DaemonMetrics) -> String {
    let s = Snapshot::take(&ring.snapshot());
    let l = format!("ring=\"{}\"", s.ring);
    let mut out = String::new();
    ring_counters(&mut out, ring, m, &s, &l);
    fault_counters(&mut out, &s, &l);
    if let Some(cv) = &s.consumer {
        consumer(&mut out, cv, &l);
    }
    stage_times(&mut out, &s, &l);
    if let Some(counts) = m.decoded() {
        let name = "pinring_images_decoded_total";
        let _ = writeln!(out, "# HELP {name} Images the daemon's engine decoded (decode = \"gpu\"), by way: gpu (nvJPEG), cpu (the host engine), cpu_not_jpeg, cpu_unsupported, cpu_components, cpu_batch_failed (on the CPU, by reason), failed (zeros).");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (way, n) in counts.named() {
            let _ = writeln!(out, "{name}{{{l},way=\"{way}\"}} {n}");
        }
    }
    m.commit_to_upload_done.render(
        &mut out,
        "pinring_commit_to_upload_done_seconds",
        "From a loader's commit to the end of the batch's upload.",
        &l,
    );
    m.upload.render(
        &mut out,
        "pinring_upload_seconds",
        "From upload submission to completion.",
        &l,
    );
    m.fill.render(
        &mut out,
        "pinring_loader_fill_seconds",
        "From a loader's claim of a slot to its commit.",
        &l,
    );
    out
}

/// The ring's state and size, and what went in and out of it, as the snapshot `s` has it.
fn ring_counters(out: &mut String, ring: &DaemonRing, m: &DaemonMetrics, s: &Snapshot, l: &str) {
    let state = ring.state();
    line(
        out,
        "pinring_ring_state",
        "gauge",
        "Ring state: 0 INIT, 1 READY, 2 DRAINING, 3 CLOSED.",
        l,
        state,
    );
    line(
        out,
        "pinring_ring_bytes",
        "gauge",
        "Bytes of the ring's data area.",
        l,
        ring.geometry().data_bytes(),
    );
    line(
        out,
        "pinring_registration_seconds",
        "gauge",
        "Seconds spent registering the ring with the GPU.",
        l,
        m.registration_seconds(),
    );
    line(
        out,
        "pinring_batches_committed_total",
        "counter",
        "Batches committed into the ring by loaders.",
        l,
        s.committed,
    );
    line(
        out,
        "pinring_bad_samples_skipped_total",
        "counter",
        "Unreadable samples loaders replaced with zeros (dataset.on_bad_sample = \"skip\").",
        l,
        s.bad_samples_skipped,
    );
    line(
        out,
        "pinring_batches_delivered_total",
        "counter",
        "Batches uploaded and delivered to the consumer.",
        l,
        s.delivered,
    );
    line(
        out,
        "pinring_bytes_committed_total",
        "counter",
        "Payload bytes committed into the ring by loaders.",
        l,
        s.bytes_in,
    );
    line(
        out,
        "pinring_bytes_uploaded_total",
        "counter",
        "Payload bytes uploaded out of the ring.",
        l,
        s.bytes_out,
    );
}

/// The faults the daemon counted and what it sees of its loaders now.
fn fault_counters(out: &mut String, s: &Snapshot, l: &str) {
    line(
        out,
        "pinring_reclaimed_slots_total",
        "counter",
        "Slots taken back from dead loaders.",
        l,
        s.reclaimed,
    );
    line(
        out,
        "pinring_leases_expired_total",
        "counter",
        "Claims that outlived the lease (slots taken back from hung loaders).",
        l,
        s.leases_expired,
    );
    line(
        out,
        "pinring_hung_loaders",
        "gauge",
        "Live loaders now holding a slot past the lease, or a quarantined one.",
        l,
        s.hung_loaders,
    );
    line(
        out,
        "pinring_quarantined_slots",
        "gauge",
        "Slots now out of use because a hung loader may still write into them.",
        l,
        s.quarantined,
    );
    line(
        out,
        "pinring_stalled_seconds",
        "gauge",
        "Seconds the ring has had work left and no loader attached (0: not stalled; set once it lasted daemon.idle_warn_ms).",
        l,
        s.stalled.map_or(0.0, |st| st.seconds),
    );
    line(
        out,
        "pinring_corrupt_descriptors_total",
        "counter",
        "Slot descriptors found in a state the daemon never left them in.",
        l,
        s.corrupt_descriptors,
    );
    line(
        out,
        "pinring_rejected_batches_total",
        "counter",
        "Batches the daemon refused to upload.",
        l,
        s.rejected,
    );
    line(
        out,
        "pinring_loaders_attached",
        "gauge",
        "Loaders in the ring's loader table.",
        l,
        s.loaders.len(),
    );
}

/// The trainer's end, for a ring whose daemon hands batches to a consumer.
fn consumer(out: &mut String, cv: &ConsumerView, l: &str) {
    // Which path the consumer's batches take: one series per value, 1 for the ring's.
    let _ = writeln!(out, "# HELP pinring_consumer_copies Who copies the batches handed to the training process onto the GPU (daemon.copies): 1 for this ring's value.");
    let _ = writeln!(out, "# TYPE pinring_consumer_copies gauge");
    for who in ["consumer", "daemon"] {
        let _ = writeln!(
            out,
            "pinring_consumer_copies{{{l},copies=\"{who}\"}} {}",
            u8::from(cv.copies == who)
        );
    }
    line(
        out,
        "pinring_consumer_attached",
        "gauge",
        "1 while a training process is attached as the ring's consumer.",
        l,
        u8::from(cv.attached),
    );
    line(
        out,
        "pinring_consumer_batches_taken_total",
        "counter",
        "Batches the consumers took.",
        l,
        cv.taken,
    );
    line(
        out,
        "pinring_consumer_buffers_waiting",
        "gauge",
        "Batches handed over and not taken yet.",
        l,
        cv.waiting,
    );
    line(
        out,
        "pinring_consumer_buffers_held",
        "gauge",
        "Batch buffers the consumer holds.",
        l,
        cv.held,
    );
}

/// Where time went (waits and work by stage), the figures that failed their check, and the
/// slots by state.
fn stage_times(out: &mut String, s: &Snapshot, l: &str) {
    let _ = writeln!(out, "# HELP pinring_wait_seconds_total Seconds each stage waited for the next: daemon = had a free device buffer and nothing READY; loaders = found no FREE slot (summed over loaders).");
    let _ = writeln!(out, "# TYPE pinring_wait_seconds_total counter");
    let _ = writeln!(
        out,
        "pinring_wait_seconds_total{{{l},stage=\"daemon\"}} {}",
        s.daemon_wait_seconds
    );
    let _ = writeln!(
        out,
        "pinring_wait_seconds_total{{{l},stage=\"loaders\"}} {}",
        s.loader_wait_seconds
    );
    let _ = writeln!(out, "# HELP pinring_busy_seconds_total Seconds each stage worked: loaders = producing batches (summed); upload = uploads in flight (summed).");
    let _ = writeln!(out, "# TYPE pinring_busy_seconds_total counter");
    let _ = writeln!(
        out,
        "pinring_busy_seconds_total{{{l},stage=\"loaders\"}} {}",
        s.loader_busy_seconds
    );
    let _ = writeln!(
        out,
        "pinring_busy_seconds_total{{{l},stage=\"upload\"}} {}",
        s.upload_seconds
    );
    // Figures only loaders report are checked against what the daemon saw before they are
    // served (pinring_observe::checked_loader_figures); one that failed is served bounded, and named
    // here, so an alert can tell a scribbled ring from a slow pipeline.
    let _ = writeln!(out, "# HELP pinring_untrusted_figure Figures the loaders report through the ring that are impossible for what the daemon saw (another process wrote into the ring): 1 for each such figure, served bounded to what could be true.");
    let _ = writeln!(out, "# TYPE pinring_untrusted_figure gauge");
    for figure in [
        "loader_wait_seconds",
        "loader_busy_seconds",
        "bad_samples_skipped",
    ] {
        let bad = u8::from(s.untrusted.iter().any(|u| u == figure));
        let _ = writeln!(
            out,
            "pinring_untrusted_figure{{{l},figure=\"{figure}\"}} {bad}"
        );
    }
    let _ = writeln!(out, "# HELP pinring_slots Slots by state (occupancy).");
    let _ = writeln!(out, "# TYPE pinring_slots gauge");
    let c = s.slots;
    for (name, v) in [
        ("idle", c.idle),
        ("free", c.free),
        ("claimed", c.claimed),
        ("ready", c.ready),
        ("uploading", c.uploading),
        ("invalid", c.invalid),
    ] {
        let _ = writeln!(out, "pinring_slots{{{l},state=\"{name}\"}} {v}");
    }
}

/// Binds the listener (at daemon start, so a bad address fails before the ring is made).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
}

/// Serves `/metrics` on `listener` from a background thread for the rest of the process.
pub fn serve(
    listener: TcpListener,
    ring: Arc<DaemonRing>,
    metrics: Arc<DaemonMetrics>,
) -> std::io::Result<()> {
    let name = ring.name().to_string();
    serve_on(listener, name, move || render(&ring, &metrics))
}

/// The listener's thread: answers one request at a time, `/metrics` with `metrics()`.
fn serve_on(
    listener: TcpListener,
    ring: String,
    metrics: impl Fn() -> String + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("pinring-metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(stream) => {
                        if let Err(e) = answer(stream, &ring, &metrics) {
                            tracing::debug!(ring = %ring, "metrics request failed: {e}");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(ring = %ring, "metrics listener: accept failed: {e}")
                    }
                }
            }
        })
        .map(|_| ())
}

/// How long a request has, in all, to arrive (and its answer to be taken).
const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// The largest request head read.
const MAX_HEAD: usize = 8192;

/// Reads one request head (parsed by `httparse`) and answers it.
fn answer(mut stream: TcpStream, ring: &str, metrics: &impl Fn() -> String) -> std::io::Result<()> {
    // A client that sends nothing, or trickles its request a byte at a time, must not hold the
    // only serving thread: the whole head must arrive within the deadline, not each read.
    let deadline = Instant::now() + REQUEST_DEADLINE;
    stream.set_write_timeout(Some(REQUEST_DEADLINE))?;
    let mut req = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    let request = loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut head = httparse::Request::new(&mut headers);
        match head.parse(&req) {
            Ok(httparse::Status::Complete(_)) => {
                let (method, path) = (head.method.unwrap_or(""), head.path.unwrap_or(""));
                break Some((method.to_string(), path.to_string()));
            }
            Ok(httparse::Status::Partial) if req.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) | Err(_) => break None,
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the request did not arrive within {REQUEST_DEADLINE:?}"),
            ));
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break None;
        }
        req.extend_from_slice(&buf[..n]);
    };
    let (status, kind, body) = match request.as_ref().map(|(m, p)| (m.as_str(), p.as_str())) {
        Some(("GET", "/metrics")) => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics(),
        ),
        Some(("GET", "/")) => (
            "200 OK",
            "text/plain; charset=utf-8",
            format!("pinring daemon of ring {ring}: metrics at /metrics\n"),
        ),
        Some(("GET", _)) => (
            "404 Not Found",
            "text/plain",
            "not found; try /metrics\n".into(),
        ),
        Some(_) => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served\n".into(),
        ),
        None => (
            "400 Bad Request",
            "text/plain",
            "not an HTTP request; send GET /metrics\n".into(),
        ),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server answering `/metrics` with one line, and its address.
    fn server() -> SocketAddr {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        serve_on(listener, "r".into(), || "pinring_up 1\n".to_string()).unwrap();
        addr
    }

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut conn = TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn get_metrics_answers_the_text_and_anything_else_is_refused() {
        let addr = server();
        let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{ok}"
        );
        assert!(ok.ends_with("\r\n\r\npinring_up 1\n"), "{ok}");
        let root = get(addr, "GET / HTTP/1.0\r\n\r\n");
        assert!(
            root.starts_with("HTTP/1.1 200 OK\r\n")
                && root.ends_with("pinring daemon of ring r: metrics at /metrics\n"),
            "{root}"
        );
        let missing = get(addr, "GET /other HTTP/1.0\r\n\r\n");
        assert!(
            missing.starts_with("HTTP/1.1 404 Not Found\r\n"),
            "{missing}"
        );
        let post = get(addr, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
        assert!(
            post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{post}"
        );
        let junk = get(addr, "\x01\x02 nonsense\r\n\r\n");
        assert!(junk.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{junk}");
    }

    #[test]
    fn a_client_that_trickles_its_request_does_not_hold_the_endpoint() {
        let addr = server();
        // A client that sends a byte every 200 ms and never ends its request: each read returns
        // well within a per-read timeout.
        let mut slow = TcpStream::connect(addr).unwrap();
        std::thread::spawn(move || {
            for b in b"GET /metrics HTTP/1.1\r\nX-Slow: "
                .iter()
                .chain([b'a'; 4096].iter())
            {
                if slow.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        // Connections are accepted in the order they were made: the slow one is served first.
        let t = Instant::now();
        let answer = get(addr, "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(answer.ends_with("pinring_up 1\n"), "{answer}");
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "a trickling client held the metrics endpoint for {:?}",
            t.elapsed()
        );
    }
}
