//! CUDA IPC between two processes. Runs only where a GPU is usable: elsewhere it prints
//! `SKIPPED: <reason>`, or fails with `PINRING_REQUIRE_GPU=1` ([`crate::testing`]).
//!
//! The consumer is this test executable again, started (fork and exec, through
//! `std::process::Command`) with [`CHILD_ENV`] set so that only [`ipc_consumer_child`] runs;
//! it gets the handles as hex on stdin and reports on stdout, one `IPC-CHILD ` line per step.

use crate::cuda::tests::pattern;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use cudarc::driver::DevicePtrMut;

use super::raw::testing::{copy_dtod_async, launch_gate};
use super::Imported;
use crate::buf::AlignedBuf;
use crate::checksum::checksum;
use crate::cuda::{CudaBackend, CudaUploader};
use crate::{
    Backend, BackendError, BufferExport, BufferHandoff, CopyEngine, DeviceKernels, Placement,
    UploadJob,
};

/// Set (to anything) in the child's environment: run as the consumer.
const CHILD_ENV: &str = "PINRING_IPC_TEST_CHILD";
/// The child's test, as libtest names it.
const CHILD_TEST: &str = "cuda::ipc::tests::ipc_consumer_child";
/// Starts every line of the child's protocol on stdout (libtest writes there too).
const PREFIX: &str = "IPC-CHILD ";
const BUFFERS: usize = 2;
const BYTES: usize = 1 << 20;
/// How long the parent waits for each step of the child.
const STEP: Duration = Duration::from_secs(60);

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Exports as one line: each buffer's [`BufferExport::to_bytes`] in hex, space-separated.
fn exports_line(exports: &[BufferExport]) -> String {
    exports
        .iter()
        .map(|e| to_hex(&e.to_bytes()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn parse_exports(line: &str) -> Vec<BufferExport> {
    line.split_whitespace()
        .map(|h| {
            let bytes: [u8; BufferExport::BYTES] = from_hex(h).try_into().expect("192 bytes");
            BufferExport::from_bytes(&bytes)
        })
        .collect()
}

/// A flag a stream waits for ([`launch_gate`]); it lives for the whole program, as the driver
/// thread that runs the gate may outlive a failed test.
fn gate() -> &'static AtomicBool {
    Box::leak(Box::new(AtomicBool::new(false)))
}

/// Opens a gate when dropped, so a failing test never leaves a stream held (for the gate's 120
/// s limit) behind it.
struct OpenOnDrop(&'static AtomicBool);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The consumer process; killed if the test fails before it exits.
struct Consumer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Consumer {
    fn spawn(exports: &[BufferExport]) -> Self {
        let exe = std::env::current_exe().expect("the test executable's path");
        let mut child = Command::new(exe)
            .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the consumer process");
        let mut stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The harness prints "test NAME ... " without a newline before the test's own
                // output, so the first step shares its line: look for the prefix anywhere.
                if let Some(step) = line.find(PREFIX).map(|at| &line[at + PREFIX.len()..]) {
                    if tx.send(step.to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        writeln!(stdin, "{}", exports_line(exports)).expect("writing the handles");
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// Waits for the child's next step, which must start with `what`; returns the line.
    fn expect(&mut self, what: &str) -> String {
        match self.lines.recv_timeout(STEP) {
            Ok(line) if line.starts_with(what) => {
                println!("consumer: {line}");
                line
            }
            Ok(line) => panic!("the consumer said {line:?} where {what:?} was expected"),
            Err(RecvTimeoutError::Timeout) => panic!("no {what:?} from the consumer in {STEP:?}"),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait();
                panic!("the consumer exited before {what:?}: {status:?} (its stderr is above)")
            }
        }
    }

    fn say(&mut self, what: &str) {
        writeln!(self.stdin, "{what}").expect("writing to the consumer");
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        // On a failure: let the consumer open its gate and record its release first, so no copy
        // of ours is left waiting for a release from a killed process; kill it only after that.
        let _ = writeln!(self.stdin, "go");
        for _ in 0..100 {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn submit(up: &CudaUploader, tag: u64, src: &[u8], buffer: usize) {
    submit_raw(up, tag, src.as_ptr(), src.len(), buffer);
}

fn submit_raw(up: &CudaUploader, tag: u64, src: *const u8, len: usize, buffer: usize) {
    let job = UploadJob {
        tag,
        src,
        len,
        buffer,
        dst_offset: 0,
        decode: None,
    };
    // SAFETY: every caller keeps `src..src+len` alive and unwritten until the job's completion,
    // which it receives before returning, or until the uploader's drop (which waits for the
    // copy) when it fails first: the source is declared before the uploader.
    unsafe { up.submit(job) }.unwrap();
}

fn complete(up: &CudaUploader, tag: u64) {
    let c = up
        .completions()
        .recv_timeout(STEP)
        .unwrap_or_else(|e| panic!("no completion for tag {tag}: {e}"));
    assert_eq!(c.tag, tag);
    c.result.unwrap();
}

#[test]
fn a_consumer_process_reads_batches_in_place_and_holds_off_the_next_copy() {
    if crate::testing::gpu().is_none() {
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    // Batches A and B in page-locked memory: the copy stream is held below (by a gate, then by
    // the consumer's release), and a copy from pageable memory may wait for the stream inside
    // `submit` (the driver stages it), which would hold up the test itself. Declared before the
    // uploader, so they outlive its drop, which waits for every copy.
    let (a, b2) = (pattern(1, BYTES), pattern(2, BYTES));
    let batches = AlignedBuf::new(2 * BYTES, "batches A and B").unwrap();
    // SAFETY: `batches` is private and has 2 * BYTES bytes.
    unsafe { batches.write_from(0, a.as_ptr(), BYTES) };
    // SAFETY: as above.
    unsafe { batches.write_from(BYTES, b2.as_ptr(), BYTES) };
    // SAFETY: `batches` outlives `_pinned` (declared after it, so dropped before it).
    let _pinned = unsafe { b.register(batches.as_mut_ptr(), 2 * BYTES, false) }.unwrap();
    let (at_a, at_b) = (batches.as_ptr(), batches.as_ptr().wrapping_add(BYTES));
    let up = b
        .cuda_uploader(BUFFERS, BYTES, Placement::Separate)
        .unwrap();
    let exports: Vec<BufferExport> = (0..BUFFERS)
        .map(|i| up.export(i).unwrap().expect("cuda exports its buffers"))
        .collect();
    assert_eq!(
        up.export(0).unwrap(),
        Some(exports[0]),
        "export is made once"
    );
    assert_ne!(exports[0].mem, exports[1].mem);
    let e = Imported::open(0, &exports).unwrap_err();
    assert!(matches!(e, BackendError::IpcOwnExport { buffer: 0 }), "{e}");
    println!("opening in the exporting process: {e}");

    // Phase 1, wait_ready: batch A's copy is held on the copy stream until the consumer has
    // queued its read of buffer 0 behind the ready event; a read that did not wait would see
    // the buffer's zeros.
    let hold = OpenOnDrop(gate());
    launch_gate(&up.ctx, up.copy_stream.cu_stream(), hold.0).unwrap();
    submit_raw(&up, 1, at_a, BYTES, 0);
    up.record_ready(0).unwrap();
    let mut consumer = Consumer::spawn(&exports);
    consumer.expect("opened");
    consumer.expect("phase1 queued");
    std::thread::sleep(Duration::from_millis(300));
    drop(hold);
    complete(&up, 1);
    consumer.expect("phase1 ok");

    // Phase 2, wait_release: the consumer holds its read of batch A behind a gate of its own
    // and records the release after it; batch B's copy into buffer 0 must wait for it.
    consumer.expect("phase2 queued");
    up.wait_release(0, true).unwrap();
    submit_raw(&up, 2, at_b, BYTES, 0);
    up.record_ready(0).unwrap();
    match up.completions().recv_timeout(Duration::from_millis(500)) {
        Err(_) => println!("batch B's copy waits for the consumer's release: ok"),
        Ok(c) => panic!(
            "batch B's copy (tag {}) completed before the consumer released buffer 0",
            c.tag
        ),
    }
    consumer.say("go");
    complete(&up, 2);
    consumer.expect("phase2 ok");
    assert_eq!(up.checksum(0, 0, BYTES).unwrap(), checksum(&b2));
    let status = consumer.child.wait().unwrap();
    assert!(status.success(), "consumer: {status}");

    // The consumer is gone: its release is not waited for (its context is gone with it).
    up.wait_release(0, false).unwrap();
    submit_raw(&up, 3, at_a, BYTES, 0);
    complete(&up, 3);
    assert_eq!(up.checksum(0, 0, BYTES).unwrap(), checksum(&a));
}

/// The consumer's side of the test above; does nothing unless started by it.
#[test]
fn ipc_consumer_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let say = |what: &str| println!("{PREFIX}{what}");
    let mut stdin = std::io::stdin().lock().lines();
    let mut next_line = move || stdin.next().expect("a line from the parent").unwrap();
    let exports = parse_exports(&next_line());
    assert_eq!(exports.len(), BUFFERS);

    let imported = Imported::open(0, &exports).unwrap();
    assert_eq!(imported.buffer_count(), BUFFERS);
    assert_ne!(imported.device_ptr(0), 0);
    // Legacy IPC handles open once per process and device: a second import is refused clearly.
    let dup = Imported::open(0, &exports).unwrap_err();
    assert!(
        matches!(
            dup,
            BackendError::IpcAlreadyOpen {
                buffer: 0,
                device: 0
            }
        ),
        "{dup}"
    );
    say(&format!("opened; a second open of the same handles: {dup}"));

    let ctx = std::sync::Arc::clone(imported.context());
    let stream = ctx.new_stream().unwrap();
    let raw = stream.cu_stream();
    let s = raw as u64;
    let mut scratch = stream.alloc_zeros::<u8>(BYTES).unwrap();
    let dst = {
        let (p, _record) = scratch.device_ptr_mut(&stream);
        p
    };
    let read = |what: &str| {
        // SAFETY: `dst` is `scratch` (BYTES long, alive to the end of this test) and the source
        // is imported buffer 0 (BYTES long, open until `imported` drops at the end); `stream`
        // is a live stream of the imported context, synchronized below before either goes.
        unsafe { copy_dtod_async(&ctx, dst, imported.device_ptr(0), BYTES, raw) }
            .unwrap_or_else(|e| panic!("{what}: cuMemcpyDtoDAsync: {e:?}"));
    };

    // Phase 1: wait for the ready event, read, release.
    // SAFETY: `s` is a live stream of the device's primary context (`stream`, alive to the end).
    unsafe { imported.wait_ready(0, s) }.unwrap();
    read("phase 1");
    // SAFETY: as above.
    unsafe { imported.record_release(0, s) }.unwrap();
    say("phase1 queued");
    let got = stream.clone_dtoh(&scratch).unwrap();
    stream.synchronize().unwrap();
    assert!(
        got == pattern(1, BYTES),
        "the consumer read buffer 0 before batch A had landed"
    );
    say("phase1 ok");

    // Phase 2: read the same batch again, held back by a gate, and release after it.
    let go = gate();
    launch_gate(&ctx, raw, go).unwrap();
    read("phase 2");
    // SAFETY: as above.
    unsafe { imported.record_release(0, s) }.unwrap();
    say("phase2 queued");
    assert_eq!(next_line(), "go");
    go.store(true, Ordering::Release);
    let got = stream.clone_dtoh(&scratch).unwrap();
    stream.synchronize().unwrap();
    assert!(
        got == pattern(1, BYTES),
        "the daemon's next copy overwrote buffer 0 before the consumer released it"
    );
    say("phase2 ok");
    drop(scratch);
    drop(stream);
    drop(imported);
}

#[test]
fn the_exporting_side_of_ipc() {
    if crate::testing::gpu().is_none() {
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    let up = b.cuda_uploader(2, 4096, Placement::Separate).unwrap();
    // Before a buffer is exported there is nothing to record or wait for.
    up.record_ready(1).unwrap();
    up.wait_release(1, true).unwrap();
    for i in 0..2 {
        assert_eq!(up.device_ptr(i), up.buffers[i].ptr());
    }
    let e = up.export(2).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    assert!(up.record_ready(2).is_err());
    assert!(up.wait_release(2, true).is_err());
    let x = up.export(1).unwrap().unwrap();
    assert!(super::registry::EXPORTED.contains(None, &x.mem));
    // Recording and waiting with nobody on the other side: a wait on a release never recorded
    // is satisfied at once, so uploads keep flowing.
    let src = pattern(5, 4096);
    up.wait_release(1, true).unwrap();
    submit(&up, 1, &src, 1);
    up.record_ready(1).unwrap();
    complete(&up, 1);
    up.wait_release(1, true).unwrap();
    up.wait_release(1, false).unwrap();
    submit(&up, 2, &src, 1);
    complete(&up, 2);
    assert_eq!(up.checksum(1, 0, 4096).unwrap(), checksum(&src));
    drop(up);
    assert!(
        !super::registry::EXPORTED.contains(None, &x.mem),
        "a dropped uploader's handles are no longer this process's exports"
    );
}
