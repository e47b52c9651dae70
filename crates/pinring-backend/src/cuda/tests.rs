//! Runs only where a GPU is usable: elsewhere it prints `SKIPPED: <reason>`, or fails with
//! `PINRING_REQUIRE_GPU=1` ([`crate::testing`]).

use super::*;
use crate::buf::AlignedBuf;
use crate::checksum::checksum;
use crate::{select, BackendKind};
use crate::{BufferHandoff, CopyEngine, DeviceKernels, Placement, UploadJob};
use std::time::Duration;

/// `n` pseudo-random bytes from `seed` (an xorshift stream): test data whose every byte counts.
pub(super) fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn gpu_smoke() {
    if crate::testing::gpu().is_none() {
        return;
    }
    if let Ok(path) = std::env::var("PINRING_PTX_OUT") {
        std::fs::write(path, ptx::PTX.to_bytes()).unwrap();
    }
    println!("probe: {:?}", crate::cuda_available());
    let sel = select(BackendKind::Auto, 0).unwrap();
    println!("auto: {}", sel.reason);
    assert_eq!(sel.backend.name(), "cuda");
    let e = CudaBackend::new(64).unwrap_err();
    println!("device 64: {e}");
    assert!(matches!(e, BackendError::NoSuchDevice { device: 64, .. }));

    let b = CudaBackend::new(0).unwrap();
    println!("{} cc {:?}", b.describe(), b.compute_capability());

    // A "ring" of 64 MiB, registered in 16 MiB chunks with DEVICEMAP.
    const RING: usize = 64 << 20;
    let ring = AlignedBuf::new(RING, "test ring").unwrap();
    let content = pattern(1, RING);
    // SAFETY: `content` has RING bytes; the ring is not shared yet.
    unsafe { ring.write_from(0, content.as_ptr(), RING) };
    // SAFETY: `ring` outlives `reg` (dropped explicitly below).
    let reg = unsafe { b.register_chunked(ring.as_mut_ptr(), RING, true, 16 << 20) }.unwrap();
    assert!(reg.registered());
    assert_eq!(reg.chunks(), 4);
    println!("registered {} bytes in {:.6} s", reg.bytes(), reg.seconds());
    let dptr = b
        .mapped_device_ptr(ring.as_ptr().wrapping_add(4096))
        .unwrap();
    assert_ne!(dptr, 0);
    let e = b.mapped_device_ptr(content.as_ptr()).unwrap_err();
    println!("unregistered mapped_device_ptr: {e}");
    // SAFETY: as above; this must fail (already registered) and leave `reg` intact.
    let e = unsafe { b.register(ring.as_mut_ptr(), RING, false) }.unwrap_err();
    println!("double register: {e}");

    // Uploads from the registered ring, on another thread (fresh thread: no current ctx).
    let up = b.uploader(4, 16 << 20, Placement::Separate).unwrap();
    let ring_addr = ring.as_ptr() as usize;
    let content_ref = &content;
    std::thread::scope(|s| {
        s.spawn(|| {
            let lens = [16 << 20, (1 << 20) + 3, 5, 8, 4096, 7, (16 << 20) - 1, 1];
            let mut tag = 0u64;
            for round in 0..3usize {
                let mut expect = Vec::new();
                for (i, &len) in lens.iter().enumerate().skip(round % 2).step_by(2) {
                    let buffer = expect.len() % 4;
                    let off = (i * 5 * 4096 + round * 8 * 4096) % (RING - len);
                    let job = UploadJob {
                        tag,
                        src: (ring_addr + off) as *const u8,
                        len,
                        buffer,
                        dst_offset: 0,
                        decode: None,
                    };
                    // SAFETY: the ring outlives the scope and is not written during it.
                    unsafe { up.submit(job) }.unwrap();
                    expect.push((tag, buffer, off, len));
                    tag += 1;
                }
                for &(t, buffer, off, len) in &expect {
                    let c = up
                        .completions()
                        .recv_timeout(Duration::from_secs(30))
                        .unwrap();
                    assert_eq!((c.tag, c.buffer, c.len), (t, buffer, len));
                    c.result.unwrap();
                    let got = up.checksum(buffer, 0, len).unwrap();
                    let want = checksum(&content_ref[off..off + len]);
                    assert_eq!(got, want, "tag {t} len {len}");
                    println!(
                        "tag {t}: {len} bytes in {:?}, checksum ok",
                        c.completed - c.submitted
                    );
                }
            }
            // Pageable source works too (staged by the driver).
            let plain = pattern(7, 1000);
            let job = UploadJob {
                tag: 999,
                src: plain.as_ptr(),
                len: plain.len(),
                buffer: 1,
                dst_offset: 0,
                decode: None,
            };
            // SAFETY: `plain` outlives the completion received next.
            unsafe { up.submit(job) }.unwrap();
            // Busy check races with the copy; either answer is fine, it must not be wrong.
            match up.checksum(1, 0, plain.len()) {
                Err(BackendError::BufferBusy { .. }) => println!("busy while in flight: ok"),
                other => println!("checksum right after submit: {other:?}"),
            }
            let c = up
                .completions()
                .recv_timeout(Duration::from_secs(30))
                .unwrap();
            assert_eq!(c.tag, 999);
            c.result.unwrap();
            assert_eq!(up.checksum(1, 0, plain.len()).unwrap(), checksum(&plain));
        });
    });
    drop(up);

    // compute: sin in place, read back with a raw copy.
    let cu = b.cuda_uploader(1, 1 << 20, Placement::Separate).unwrap();
    let xs: Vec<f32> = (0..(1 << 18))
        .map(|i| (i as f32 / (1 << 18) as f32) * 6.0 - 3.0)
        .collect();
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    let cu = cu;
    let job = UploadJob {
        tag: 1,
        src: bytes.as_ptr(),
        len: bytes.len(),
        buffer: 0,
        dst_offset: 0,
        decode: None,
    };
    // SAFETY: `bytes` outlives the completion received next.
    unsafe { cu.submit(job) }.unwrap();
    cu.completions()
        .recv_timeout(Duration::from_secs(30))
        .unwrap()
        .result
        .unwrap();
    assert_eq!(cu.checksum(0, 0, bytes.len()).unwrap(), checksum(&bytes));
    cu.compute(0, bytes.len()).unwrap();
    let mut back = vec![0u8; bytes.len()];
    {
        let st = cu.kernel_state.lock().unwrap();
        let src = cu.buffers[0].slice().slice(..back.len());
        kernels::read_back(&cu.kernel_stream, &src, &mut back, &st.done).unwrap();
    }
    let mut max_err = 0f32;
    for (x, c) in xs.iter().zip(back.chunks_exact(4)) {
        let y = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        max_err = max_err.max((y - x.sin()).abs());
    }
    println!("sin.approx max abs error {max_err:e}");
    assert!(max_err < 1e-4);
    drop(cu);

    for registered in [true, false] {
        let gbps = b.raw_h2d_gbps(256 << 20, 20, registered).unwrap();
        println!("raw H2D 256 MiB x20 registered={registered}: {gbps:.1} GB/s");
    }
    drop(reg);
    drop(ring);
}

#[test]
fn a_buffer_being_read_refuses_uploads() {
    if crate::testing::gpu().is_none() {
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    let up = b.cuda_uploader(1, 64, Placement::Separate).unwrap();
    let src = pattern(3, 8);
    let job = UploadJob {
        tag: 0,
        src: src.as_ptr(),
        len: src.len(),
        buffer: 0,
        dst_offset: 0,
        decode: None,
    };
    {
        // What `checksum` and `compute` hold while their kernel runs.
        let (_, reading) = up.begin_read("checksum", 0, 0, src.len()).unwrap();
        // SAFETY: refused before any copy is enqueued (the buffer is being read).
        let err = unsafe { up.submit(job) }.unwrap_err();
        assert!(matches!(err, BackendError::BufferBusy { .. }), "{err}");
        println!("submit during a read: {err}");
        drop(reading);
    }
    // The refused submit backed out: the same upload goes through once the read is over.
    // SAFETY: `src` outlives the completion received next.
    unsafe { up.submit(job) }.unwrap();
    let c = up
        .completions()
        .recv_timeout(Duration::from_secs(30))
        .unwrap();
    c.result.unwrap();
    assert_eq!(up.checksum(0, 0, src.len()).unwrap(), checksum(&src));

    // The other way round, deterministically: with an upload pending (as `submit` leaves it
    // until the completion thread has seen the copy finish) both readers are refused.
    up.guards.begin_upload(0).unwrap();
    for r in [
        up.checksum(0, 0, src.len()).map(|_| ()),
        up.compute(0, src.len()),
    ] {
        let err = r.unwrap_err();
        assert!(matches!(err, BackendError::BufferBusy { .. }), "{err}");
    }
    up.guards.end_upload(0);
    assert_eq!(up.checksum(0, 0, src.len()).unwrap(), checksum(&src));
}

#[test]
fn cudarc_context_is_set_up_as_documented() {
    if crate::testing::gpu().is_none() {
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    // No CudaSlice of this context may carry event tracking (docs/ARCHITECTURE.md).
    assert!(!b.context().is_event_tracking());
    let up = b.cuda_uploader(2, 4096, Placement::Separate).unwrap();
    assert!(!b.context().is_managing_stream_synchronization());
    for i in 0..2 {
        assert_eq!(up.buffer_device_ptr(i), Some(up.buffers[i].ptr()));
        assert_ne!(up.buffers[i].ptr(), 0);
    }
    assert_eq!(up.buffer_device_ptr(2), None);
    // The JIT log fetched after a failed load names the problem; the embedded PTX loads (and is
    // unloaded again) without an error.
    let bad =
        c".version 7.8\n.target sm_80\n.address_size 64\n.visible .entry broken( { bogus; }\n";
    let log = raw::jit_error_log(b.context(), bad);
    println!("JIT log for broken PTX: {log}");
    assert!(!log.is_empty());
    let log = raw::jit_error_log(b.context(), ptx::PTX);
    println!("JIT error log for the embedded PTX (expected empty): {log:?}");
    // The kernels load through cudarc and work on a fresh uploader.
    let data = pattern(9, 4096);
    let job = UploadJob {
        tag: 7,
        src: data.as_ptr(),
        len: data.len(),
        buffer: 1,
        dst_offset: 0,
        decode: None,
    };
    // SAFETY: `data` outlives the completion received next.
    unsafe { up.submit(job) }.unwrap();
    let c = up
        .completions()
        .recv_timeout(Duration::from_secs(30))
        .unwrap();
    c.result.unwrap();
    assert_eq!(up.checksum(1, 0, data.len()).unwrap(), checksum(&data));
    assert_eq!(up.checksum(1, 0, 13).unwrap(), checksum(&data[..13]));
    // A range inside the buffer (a field of a batch): its own checksum, partial last word too.
    assert_eq!(
        up.checksum(1, 256, 1003).unwrap(),
        checksum(&data[256..1259])
    );
    assert_eq!(up.checksum(1, 4088, 8).unwrap(), checksum(&data[4088..]));
    // Unaligned or past the end: refused before any kernel runs.
    assert!(up.checksum(1, 4, 8).is_err());
    assert!(up.checksum(1, 4088, 16).is_err());
}

#[test]
fn a_group_of_copies_into_one_buffer_is_one_upload_with_one_completion() {
    if crate::testing::gpu().is_none() {
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    let up = b.cuda_uploader(2, 1 << 16, Placement::Separate).unwrap();
    let data = pattern(11, 8192);
    // A part's copies: a field's chunk, an empty copy (a byte part's other field) and the next
    // field's chunk at its aligned place.
    let job = |tag: u64, from: usize, len: usize, dst_offset: usize| UploadJob {
        tag,
        src: data[from..].as_ptr(),
        len,
        buffer: 1,
        dst_offset,
        decode: None,
    };
    let jobs = [
        job(5, 0, 5000, 0),
        job(6, 5000, 0, 5120),
        job(7, 5000, 3192, 5120),
    ];
    // SAFETY: `data` outlives the completion received next.
    let n = unsafe { up.submit_group(&jobs) }.unwrap();
    assert_eq!(n, 1, "one completion announced for the group");
    let c = up
        .completions()
        .recv_timeout(Duration::from_secs(30))
        .unwrap();
    c.result.unwrap();
    assert_eq!((c.tag, c.buffer, c.len), (5, 1, 8192));
    assert!(up.completions().try_recv().is_err(), "one completion only");
    assert_eq!(up.checksum(1, 0, 5000).unwrap(), checksum(&data[..5000]));
    assert_eq!(up.checksum(1, 5120, 3192).unwrap(), checksum(&data[5000..]));
    // Copies into two buffers are refused before anything is queued: no upload is pending on
    // either buffer afterwards (a read would be refused with BufferBusy otherwise).
    let mixed = [
        jobs[0],
        UploadJob {
            buffer: 0,
            ..jobs[2]
        },
    ];
    // SAFETY: refused before any copy is enqueued.
    let e = unsafe { up.submit_group(&mixed) }.unwrap_err();
    assert!(e.to_string().contains("one buffer"), "{e}");
    assert_eq!(up.checksum(1, 0, 5000).unwrap(), checksum(&data[..5000]));
    up.checksum(0, 0, 8).unwrap();
    // An empty group queues nothing and announces no completion.
    // SAFETY: no job, no source.
    assert_eq!(unsafe { up.submit_group(&[]) }.unwrap(), 0);
}

/// Receives the completions of groups `from..to`, in order, each `len` bytes into buffer `i`
/// with tag `i`, and checks the buffer's checksum against `want(i)`.
/// Group `i` as one copy of `data`'s `i`-th chunk of `len` bytes, tagged `i`, to the start of
/// buffer `i`.
fn whole_chunk(data: &[u8], len: usize) -> impl Fn(usize) -> [UploadJob; 1] + Copy + '_ {
    move |i| {
        [UploadJob {
            tag: i as u64,
            src: data[i * len..].as_ptr(),
            len,
            buffer: i,
            dst_offset: 0,
            decode: None,
        }]
    }
}

/// The checksum of `data`'s `i`-th chunk of `len` bytes.
fn chunk_checksum(data: &[u8], len: usize) -> impl Fn(usize) -> u64 + Copy + '_ {
    move |i| checksum(&data[i * len..(i + 1) * len])
}

fn receive_whole(
    up: &CudaUploader,
    from: usize,
    to: usize,
    len: usize,
    want: impl Fn(usize) -> u64,
) {
    for i in from..to {
        let c = up
            .completions()
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("completion of group {i}: {e}"));
        c.result.unwrap();
        assert_eq!((c.tag, c.buffer, c.len), (i as u64, i, len));
        assert_eq!(up.checksum(i, 0, len).unwrap(), want(i), "group {i}");
    }
}

#[test]
fn a_small_source_ring_gets_an_event_per_quarter_of_its_slots_without_a_flush() {
    if crate::testing::gpu().is_none() {
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    const SLOT: usize = 64 << 10;
    const SLOTS: usize = 16;
    let up = b.cuda_uploader(128, SLOT, Placement::Separate).unwrap();
    up.set_source_ring(SLOTS);
    let span = SLOTS / crate::SIGNAL_SPAN_DIVISOR;
    assert_eq!(
        up.event_groups.load(std::sync::atomic::Ordering::Relaxed),
        span
    );
    let data = pattern(29, SLOTS * SLOT);
    let group = |i: usize| {
        [UploadJob {
            tag: i as u64,
            src: data[i * SLOT..].as_ptr(),
            len: SLOT,
            buffer: i,
            dst_offset: 0,
            decode: None,
        }]
    };
    let want = |i: usize| checksum(&data[i * SLOT..(i + 1) * SLOT]);
    // A quarter of the ring is signalled by its last group's event: no flush, while the rest
    // of the ring is still free to fill.
    for i in 0..span {
        // SAFETY: `data` outlives every completion received below.
        unsafe { up.submit_group_deferred(&group(i)) }.unwrap();
    }
    receive_whole(&up, 0, span, SLOT, want);
    // A larger ring keeps the engine's own count.
    up.set_source_ring(4096);
    assert_eq!(
        up.event_groups.load(std::sync::atomic::Ordering::Relaxed),
        uploader::EVENT_GROUPS
    );
    up.set_source_ring(1);
    assert_eq!(
        up.event_groups.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn deferred_groups_complete_at_a_full_run_or_a_flush_and_land_whole() {
    if crate::testing::gpu().is_none() {
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    const SLOT: usize = 64 << 10;
    let groups = uploader::EVENT_GROUPS + 3;
    // Buffers enough for an event per EVENT_GROUPS groups (at most half the buffers).
    let up = b
        .cuda_uploader(2 * uploader::EVENT_GROUPS, SLOT, Placement::Separate)
        .unwrap();
    assert_eq!(up.event_buffers, uploader::EVENT_GROUPS);
    let data = pattern(23, groups * SLOT);
    // Group i: a large copy (the copy stream) and a 32-byte one (the small-copy stream, as a
    // batch's labels), into buffer i, the small one right after the large one.
    let big = SLOT - 4096;
    let group = |i: usize| {
        let at = i * SLOT;
        [
            UploadJob {
                tag: i as u64,
                src: data[at..].as_ptr(),
                len: big,
                buffer: i,
                dst_offset: 0,
                decode: None,
            },
            UploadJob {
                tag: i as u64,
                src: data[at + SLOT - 32..].as_ptr(),
                len: 32,
                buffer: i,
                dst_offset: big,
                decode: None,
            },
        ]
    };
    let want = |i: usize| {
        let at = i * SLOT;
        let mut w = data[at..at + big].to_vec();
        w.extend_from_slice(&data[at + SLOT - 32..at + SLOT]);
        checksum(&w)
    };
    let receive = |from: usize, to: usize| receive_whole(&up, from, to, big + 32, want);
    // A full run of deferred groups is signalled by the last one's event: no flush needed.
    for i in 0..uploader::EVENT_GROUPS {
        // SAFETY: `data` outlives every completion received below.
        assert_eq!(unsafe { up.submit_group_deferred(&group(i)) }.unwrap(), 1);
    }
    receive(0, uploader::EVENT_GROUPS);
    // Fewer groups than a run: `flush` signals them.
    for i in uploader::EVENT_GROUPS..groups - 1 {
        // SAFETY: as above.
        unsafe { up.submit_group_deferred(&group(i)) }.unwrap();
    }
    up.flush().unwrap();
    receive(uploader::EVENT_GROUPS, groups - 1);
    assert!(
        up.completions().try_recv().is_err(),
        "one completion per group"
    );
    // Nothing unsignalled: a flush queues nothing.
    up.flush().unwrap();
    // An unflushed group when the uploader is dropped: the drop signals and waits for it,
    // so `data` may go after it.
    // SAFETY: as above; the drop below waits for the copy.
    unsafe { up.submit_group_deferred(&group(groups - 1)) }.unwrap();
    drop(up);
}

#[test]
fn an_event_covers_at_most_half_the_buffers() {
    if crate::testing::gpu().is_none() {
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    const SLOT: usize = 64 << 10;
    // 8 buffers: an event per 4 groups into 4 buffers, so 4 more can be filled while its
    // copies run.
    let up = b.cuda_uploader(8, SLOT, Placement::Separate).unwrap();
    assert_eq!(up.event_buffers, 4);
    let data = pattern(31, 8 * SLOT);
    let (group, want) = (whole_chunk(&data, SLOT), chunk_checksum(&data, SLOT));
    // Four deferred groups complete with no flush; the next four too.
    for i in 0..8 {
        // SAFETY: `data` outlives every completion received below.
        unsafe { up.submit_group_deferred(&group(i)) }.unwrap();
        if i % 4 == 3 {
            receive_whole(&up, i - 3, i + 1, SLOT, want);
        }
    }
    // Parts of one batch (six groups into buffer 0) count as one buffer: the event comes with
    // the group that makes four buffers, the ninth group, and completes all nine, no flush.
    const PART: usize = 8 << 10;
    let jobs: Vec<(usize, usize)> = (0..6)
        .map(|k| (0, k * PART))
        .chain((1..4).map(|b| (b, 0)))
        .collect();
    for (i, &(buffer, dst_offset)) in jobs.iter().enumerate() {
        let job = [UploadJob {
            tag: 100 + i as u64,
            src: data[i * PART..].as_ptr(),
            len: PART,
            buffer,
            dst_offset,
            decode: None,
        }];
        // SAFETY: as above.
        unsafe { up.submit_group_deferred(&job) }.unwrap();
    }
    for (i, &(buffer, _)) in jobs.iter().enumerate() {
        let c = up
            .completions()
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("completion of group {i}: {e}"));
        c.result.unwrap();
        assert_eq!((c.tag, c.buffer, c.len), (100 + i as u64, buffer, PART));
    }
    assert_eq!(
        up.checksum(0, 0, 6 * PART).unwrap(),
        checksum(&data[..6 * PART]),
        "the batch's six parts"
    );
}

#[test]
fn parts_of_a_mebibyte_share_an_event_per_four_and_complete_by_looks() {
    if crate::testing::gpu().is_none() {
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    const PART: usize = uploader::LARGE_GROUP_BYTES;
    let runs = uploader::LARGE_EVENT_BYTES / PART;
    assert!(runs > 1, "a run of parts shares one event");
    let groups = runs + 1;
    let up = b.cuda_uploader(groups, PART, Placement::Separate).unwrap();
    let data = pattern(29, groups * PART);
    let (group, want) = (whole_chunk(&data, PART), chunk_checksum(&data, PART));
    let receive = |from: usize, to: usize| receive_whole(&up, from, to, PART, want);
    // A run of 4 MiB of 1 MiB parts gets its event with its last part: all complete, no flush.
    for i in 0..runs {
        // SAFETY: `data` outlives every completion received below.
        assert_eq!(unsafe { up.submit_group_deferred(&group(i)) }.unwrap(), 1);
    }
    receive(0, runs);
    // Its event comes back for reuse: one event for the whole run.
    up.free_events
        .recv_timeout(Duration::from_secs(30))
        .expect("the run's event comes back for reuse");
    assert!(up.free_events.try_recv().is_err());
    // A part short of a run: the flush signals it.
    // SAFETY: as above.
    unsafe { up.submit_group_deferred(&group(runs)) }.unwrap();
    up.flush().unwrap();
    receive(runs, groups);
}

#[test]
fn parts_from_consecutive_slots_into_contiguous_buffers_land_whole_through_runs() {
    if crate::testing::gpu().is_none() {
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    // 64 KiB parts in slots 68 KiB apart, registered in 1 MiB chunks: slots 0 to 14 lie in the
    // first chunk, slot 15 straddles the boundary (its copy is cut in two there), and 16 on
    // are a second run.
    const PART: usize = 64 << 10;
    const STRIDE: usize = PART + 4096;
    const SLOTS: usize = 40;
    let up = b.cuda_uploader(SLOTS, PART, Placement::Contiguous).unwrap();
    for i in 1..SLOTS {
        assert_eq!(up.device_ptr(i) - up.device_ptr(i - 1), PART as u64);
    }
    let e = up.export(3).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("device buffer 3") && msg.contains("Placement::Separate"),
        "{msg}"
    );
    let ring = AlignedBuf::new(SLOTS * STRIDE, "test ring").unwrap();
    let content = pattern(31, SLOTS * STRIDE);
    // SAFETY: `content` has as many bytes as the ring, which is not shared.
    unsafe { ring.write_from(0, content.as_ptr(), content.len()) };
    // SAFETY: `ring` outlives `reg` (dropped explicitly at the end).
    let reg =
        unsafe { b.register_chunked(ring.as_mut_ptr(), SLOTS * STRIDE, false, 1 << 20) }.unwrap();
    let part = |slot: usize, buffer: usize, len: usize| {
        [UploadJob {
            tag: slot as u64,
            src: ring.as_ptr().wrapping_add(slot * STRIDE),
            len,
            buffer,
            dst_offset: 0,
            decode: None,
        }]
    };
    let check = |pairs: &[(usize, usize, usize)]| {
        up.flush().unwrap();
        for &(slot, buffer, len) in pairs {
            let c = up
                .completions()
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("completion of slot {slot}: {e}"));
            c.result.unwrap();
            assert_eq!((c.tag, c.buffer, c.len), (slot as u64, buffer, len));
            let want = checksum(&content[slot * STRIDE..slot * STRIDE + len]);
            assert_eq!(up.checksum(buffer, 0, len).unwrap(), want, "slot {slot}");
        }
    };
    // Slot k into buffer k: runs of 15 and 24 around the straddling slot.
    let pairs: Vec<_> = (0..SLOTS).map(|k| (k, k, PART)).collect();
    for &(slot, buffer, len) in &pairs {
        // SAFETY: the ring outlives every completion, received by `check`.
        unsafe { up.submit_group_deferred(&part(slot, buffer, len)) }.unwrap();
    }
    check(&pairs);
    // Against the ring's order (descending buffers), wrapped buffers, and a short part ending
    // a run of three: single copies and runs in one set of held copies.
    let pairs = [
        (20, 5, PART),
        (21, 4, PART),
        (22, 3, PART),
        (30, 38, PART),
        (31, 39, PART),
        (32, 0, PART),
        (1, 10, PART),
        (2, 11, PART),
        (3, 12, PART),
        (4, 13, PART),
        (5, 14, 1000),
    ];
    for &(slot, buffer, len) in &pairs {
        // SAFETY: as above.
        unsafe { up.submit_group_deferred(&part(slot, buffer, len)) }.unwrap();
    }
    check(&pairs);
    drop(up);
    drop(reg);
}

/// Copies as rows, timed on the GPU: rows of 16, 64 and 256 KiB from the slots of a registered
/// 64 MiB ring (slots 4 KiB longer than a row, as a ring's are) into 64 buffers side by side,
/// one copy per driver call against two-dimensional copies of 4, 16 and 64 rows, with an event
/// every 16 rows. Prints GB/s and the issuing thread's CPU per row (its calls only). A
/// measurement, not a check: `cargo test -p pinring-backend --release --lib copy_rows --
/// --ignored --nocapture` on a GPU host.
#[test]
#[ignore = "a measurement for GPU hosts"]
fn copy_rows() {
    if crate::testing::gpu().is_none() {
        return;
    }
    let cpu = || nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
    let b = CudaBackend::new(0).unwrap();
    const RING: usize = 64 << 20;
    const BUFFERS: usize = 64;
    let ring = AlignedBuf::new(RING, "row ring").unwrap();
    // SAFETY: `ring` outlives `reg` (dropped explicitly below).
    let reg = unsafe { b.register_chunked(ring.as_mut_ptr(), RING, false, RING) }.unwrap();
    let stream = b.new_stream("rows").unwrap();
    let event = raw::Event::new(&b.ctx).unwrap();
    for row in [16usize << 10, 64 << 10, 256 << 10] {
        let stride = row + 4096;
        let slots = RING / stride;
        let bufs = uploader::DeviceBuffer::carve(&stream, BUFFERS, row, row).unwrap();
        let n = ((16usize << 30) / row).min(400_000);
        for height in [1usize, 4, 16, 64] {
            let (mut slot, mut buf, mut done, mut since_event) = (0, 0, 0, 0);
            let mut calls = Duration::ZERO;
            let t0 = std::time::Instant::now();
            while done < n {
                let rows = height.min(slots - slot).min(BUFFERS - buf).min(n - done);
                let src = ring.as_ptr().wrapping_add(slot * stride);
                let c0 = cpu();
                let dst = bufs[buf].ptr();
                // Every row's source lies in the registered ring and its destination in buffer
                // `buf + r` (the buffers are `row` apart in one allocation); both outlive the
                // copies, which the stream's synchronisation below waits for.
                let r = if height == 1 {
                    // SAFETY: as above, one row.
                    unsafe { raw::memcpy_htod_async(dst, src, row, &stream) }
                } else {
                    // SAFETY: as above, for each of the `rows` rows.
                    unsafe {
                        raw::memcpy_htod_2d_async(
                            dst,
                            src as usize,
                            stride,
                            row,
                            row,
                            rows,
                            &stream,
                        )
                    }
                };
                r.unwrap();
                since_event += rows;
                if since_event >= 16 {
                    event.record(&stream).unwrap();
                    since_event = 0;
                }
                calls += Duration::from(cpu()) - Duration::from(c0);
                done += rows;
                slot = (slot + rows) % slots;
                buf = (buf + rows) % BUFFERS;
            }
            stream.synchronize().unwrap();
            let secs = t0.elapsed().as_secs_f64();
            println!(
                "rows of {:>3} KiB, {height:>2} per copy: {:6.2} GB/s, {:.2} us of CPU per row",
                row >> 10,
                (row * n) as f64 / secs / 1e9,
                calls.as_secs_f64() * 1e6 / n as f64
            );
        }
    }
    drop(reg);
}

/// Copy patterns, timed on the GPU: what the copy engine and the driver give for one copy per
/// slot of a registered 64 MiB ring, with an event after every `k`-th copy, a thread that waits
/// on the events, and at most `bound` copies in flight. A measurement, not a check: `cargo test
/// -p pinring-backend --release --lib copy_patterns -- --ignored --nocapture` on a GPU host.
#[test]
#[ignore = "a measurement for GPU hosts"]
fn copy_patterns() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    if crate::testing::gpu().is_none() {
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    const RING: usize = 64 << 20;
    let ring = AlignedBuf::new(RING, "pattern ring").unwrap();
    // SAFETY: `ring` outlives `reg` (dropped explicitly below).
    let reg = unsafe { b.register_chunked(ring.as_mut_ptr(), RING, false, RING) }.unwrap();
    let stream = b.new_stream("patterns").unwrap();
    let dev = uploader::DeviceBuffer::alloc(&stream, 68 << 20).unwrap();
    // PATTERN_LABELS=1: a second copy of 32 bytes per slot, from the slot's end (a batch's
    // labels); PATTERN_BUFS=N: slot i goes to buffer i % N, each its own allocation.
    // PATTERN_LABELS=2: the 32-byte copies on a second stream, which the first waits for
    // before each of its events; 3: the second copy is 4 KiB.
    let mode: u8 = std::env::var("PATTERN_LABELS").map_or(0, |v| v.parse().unwrap());
    let labels = mode > 0;
    let side = b.new_stream("patterns side").unwrap();
    let side_done = raw::Event::new(&b.ctx).unwrap();
    let small = if mode == 3 { 4096 } else { 32 };
    let nbufs: usize = std::env::var("PATTERN_BUFS").map_or(0, |v| v.parse().unwrap());
    // PATTERN_BATCH=m: m copies per cuMemcpyBatchAsync call (issued early at an event).
    let batch: usize = std::env::var("PATTERN_BATCH").map_or(0, |v| v.parse().unwrap());
    if batch > 0 {
        assert!(
            raw::has_memcpy_batch(),
            "the driver has no cuMemcpyBatchAsync"
        );
    }
    let (mut dsts, mut srcs, mut lens) = (Vec::new(), Vec::new(), Vec::new());
    let done = raw::Event::new(&b.ctx).unwrap();
    let sizes: Vec<usize> = std::env::var("PATTERN_SIZES")
        .map(|v| {
            v.split(',')
                .map(|x| x.parse::<usize>().unwrap() << 10)
                .collect()
        })
        .unwrap_or(vec![64 << 10, 256 << 10, 1 << 20, 4 << 20]);
    // (event every k copies, waiter: 0 none, 1 blocking sync, 2 query polling; copies in flight)
    let variants: Vec<(usize, u8, usize)> = std::env::var("PATTERN_VARIANTS")
        .map(|v| {
            v.split(' ')
                .map(|t| {
                    let f: Vec<usize> = t.split(':').map(|x| x.parse().unwrap()).collect();
                    (f[0], f[1] as u8, f[2])
                })
                .collect()
        })
        .unwrap_or(vec![(0, 0, 0), (1, 0, 0), (1, 1, 64), (1, 1, 16)]);
    for slot in sizes {
        let slots = RING / slot;
        let bufs: Vec<uploader::DeviceBuffer> = (0..nbufs)
            .map(|_| uploader::DeviceBuffer::alloc(&stream, slot + 4096).unwrap())
            .collect();
        let n = ((8usize << 30) / slot).min(60_000);
        for &(k, waiter, bound) in &variants {
            let events: Vec<raw::Event> = (0..(bound / k.max(1)).max(1) + 1)
                .map(|_| raw::Event::new(&b.ctx).unwrap())
                .collect();
            let completed = AtomicUsize::new(0);
            let submitted = AtomicUsize::new(0);
            let mut submit = Duration::ZERO;
            let t0 = std::time::Instant::now();
            std::thread::scope(|s| {
                if waiter > 0 {
                    s.spawn(|| {
                        raw::make_current(&b.ctx).unwrap();
                        let mut e_i = 0;
                        let mut covered = 0;
                        while covered < n {
                            // Event e_i covers copies up to min((e_i+1)*k, n).
                            let upto = ((e_i + 1) * k).min(n);
                            while submitted.load(Ordering::Acquire) < upto {
                                std::hint::spin_loop();
                            }
                            let e = &events[e_i % events.len()];
                            if waiter == 1 {
                                e.synchronize().unwrap();
                            } else {
                                while !e.query() {
                                    std::thread::yield_now();
                                }
                            }
                            covered = upto;
                            completed.store(upto, Ordering::Release);
                            e_i += 1;
                        }
                    });
                }
                for i in 0..n {
                    if waiter > 0 {
                        while i >= completed.load(Ordering::Acquire) + bound {
                            std::hint::spin_loop();
                        }
                    }
                    let src = (i % slots) * slot;
                    let dst = (i % 64) * slot % (64 << 20);
                    let t = std::time::Instant::now();
                    let (d, dst) = match bufs.get(i % nbufs.max(1)) {
                        Some(d) => (d, 0),
                        None => (&dev, dst),
                    };
                    let len = if labels { slot - small } else { slot };
                    let event_due = k > 0 && ((i + 1) % k == 0 || i + 1 == n);
                    if batch > 0 {
                        dsts.push(d.ptr() + dst as u64);
                        srcs.push(ring.as_ptr() as u64 + src as u64);
                        lens.push(len);
                        if dsts.len() == batch || event_due || i + 1 == n {
                            // SAFETY: as for the single copies below.
                            unsafe {
                                raw::memcpy_htod_batch_async(
                                    &mut dsts, &mut srcs, &mut lens, 0, &stream,
                                )
                            }
                            .unwrap();
                            dsts.clear();
                            srcs.clear();
                            lens.clear();
                        }
                    } else {
                        // SAFETY: the ring and the device buffers outlive every copy
                        // (synchronized below); the ring is not written during the run.
                        unsafe {
                            d.copy_in_async(dst, ring.as_ptr().wrapping_add(src), len, &stream)
                        }
                        .unwrap();
                    }
                    if labels {
                        // SAFETY: as above; the label bytes end the slot.
                        unsafe {
                            d.copy_in_async(
                                dst + slot,
                                ring.as_ptr().wrapping_add(src + slot - small),
                                small,
                                if mode == 2 { &side } else { &stream },
                            )
                        }
                        .unwrap();
                    }
                    if event_due {
                        if mode == 2 {
                            side_done.record(&side).unwrap();
                            side_done.wait_on(&stream).unwrap();
                        }
                        events[(i / k) % events.len()].record(&stream).unwrap();
                    }
                    submit += t.elapsed();
                    submitted.store(i + 1, Ordering::Release);
                }
                side_done.record(&side).unwrap();
                side_done.wait_on(&stream).unwrap();
                done.record(&stream).unwrap();
                done.synchronize().unwrap();
            });
            let secs = t0.elapsed().as_secs_f64();
            println!(
                "{:>6} KiB event every {k:>2} waiter {waiter} in flight {bound:>3}: {:6.2} GB/s  submit {:5.2} us/copy",
                slot >> 10,
                (n * slot) as f64 / secs / 1e9,
                submit.as_secs_f64() / n as f64 * 1e6
            );
        }
    }
    drop(reg);
}

/// The decoder's resampling is the CPU path's bit for bit on the same decoded pixels: lossless
/// PNGs through the loaders' pipeline against the kernels over the same RGB pixels, for train
/// and eval boxes, an integer box of the output's size (a plain copy), boxes on the image's far
/// edges, an upscale and a flip, in every output dtype.
#[test]
fn gpu_resampling_is_the_cpu_paths_bit_for_bit() {
    use pinring_image::{Float, Output, Pipeline, SampleSpec, Transform};
    if crate::testing::gpu().is_none() {
        return;
    }
    let cases = super::resample_cases::cases();
    let b = CudaBackend::new(0).unwrap();
    let outputs = [
        Output::U8Hwc,
        Output::imagenet(Float::F16),
        Output::imagenet(Float::Bf16),
        Output::imagenet(Float::F32),
    ];
    let mut checked = 0;
    for output in outputs {
        let spec = SampleSpec {
            transform: Transform::TRAIN_DEFAULT,
            output,
            reduced_decode: false,
        };
        let sb = spec.sample_bytes();
        let up = b.cuda_uploader(1, sb, Placement::Contiguous).unwrap();
        up.set_decoder(spec).unwrap();
        let mut cpu = Pipeline::new(spec).unwrap();
        let mut want = vec![0u8; sb];
        for case in &cases {
            let (w, h) = case.size;
            for &(crop, flip) in &case.boxes {
                cpu.process_planned(&case.png, crop, flip, &mut want)
                    .unwrap();
                let got = up.resample_raster(
                    &case.rgb,
                    (w, h),
                    [crop.left, crop.top, crop.width, crop.height],
                    flip,
                );
                let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                assert_eq!(
                    differ, 0,
                    "{output:?}, {w}x{h}, box {crop:?}, flip {flip}: {differ} bytes differ"
                );
                checked += 1;
            }
        }
    }
    println!("{checked} samples equal bit for bit");
}

/// The cuda engine decodes an encoded chunk (decode = "gpu"): nvJPEG and the resize kernel give
/// each JPEG's sample within 1.0 level (mean absolute difference) of the loaders' CPU pipeline
/// for the same box, whatever its size and subsampling; bytes that are no image go to the CPU
/// and are reported; a substituted sample is zeros.
#[test]
fn gpu_decode_matches_the_cpu_pipeline() {
    use crate::Decode;
    use pinring_data::{write_sample, ArenaCursor, EncodedEntry, FLAG_FLIP, FLAG_ZEROS};
    use pinring_image::{synth, Output, Pipeline, SampleKey, SampleSpec, Transform};
    if crate::testing::gpu().is_none() {
        return;
    }
    let jpeg = |w: u32, h: u32, seed: u64, sampling: jpeg_encoder::SamplingFactor| {
        let pixels = synth::photo(w, h, seed, 8);
        let mut buf = Vec::new();
        let mut e = jpeg_encoder::Encoder::new(&mut buf, 90);
        e.set_sampling_factor(sampling);
        e.encode(&pixels, w as u16, h as u16, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        buf
    };
    use jpeg_encoder::SamplingFactor as S;
    let spec = SampleSpec {
        transform: Transform::TRAIN_DEFAULT,
        output: Output::U8Hwc,
        reduced_decode: false,
    };
    let sb = spec.sample_bytes();
    let files = [
        jpeg(500, 375, 1, S::F_2_2),
        jpeg(375, 500, 2, S::F_2_1),
        jpeg(640, 480, 3, S::F_1_1),
        jpeg(230, 230, 4, S::F_2_2),
        jpeg(1200, 900, 5, S::F_2_2),
        b"no image here".to_vec(),
    ];
    let n = files.len() + 1;
    let share = 512 << 10;
    let mut chunk = vec![0u8; n * (64 + share)];
    let mut cursor = ArenaCursor::new(n, share as u64);
    let mut want = vec![0u8; n * sb];
    let mut pipeline = Pipeline::new(spec).unwrap();
    for (k, bytes) in files.iter().enumerate() {
        let key = SampleKey {
            seed: 3,
            epoch: 1,
            sample_id: k as u64,
        };
        let (w, h) = match pipeline.process(bytes, key, &mut want[k * sb..(k + 1) * sb]) {
            Ok(a) => (a.width, a.height),
            Err(_) => (64, 64),
        };
        let (crop, flip) = spec.transform.plan(w, h, key);
        let entry = EncodedEntry {
            flags: if flip { FLAG_FLIP } else { 0 },
            file: 1,
            member: k as u64,
            width: w,
            height: h,
            crop: [crop.left, crop.top, crop.width, crop.height],
            ..EncodedEntry::default()
        };
        write_sample(&mut chunk, &mut cursor, k, entry, bytes).unwrap();
    }
    let zeros = EncodedEntry {
        flags: FLAG_ZEROS,
        ..EncodedEntry::default()
    };
    write_sample(&mut chunk, &mut cursor, n - 1, zeros, &[]).unwrap();
    let b = CudaBackend::new(0).unwrap();
    let up = b.cuda_uploader(1, n * sb, Placement::Contiguous).unwrap();
    up.set_decoder(spec).unwrap();
    let job = UploadJob {
        tag: 9,
        src: chunk.as_ptr(),
        len: chunk.len(),
        buffer: 0,
        dst_offset: 0,
        decode: Some(Decode {
            samples: n as u32,
            dst_len: n * sb,
        }),
    };
    // SAFETY: `chunk` outlives the completion received below and is not written meanwhile.
    unsafe { up.submit(job) }.unwrap();
    let c = up
        .completions()
        .recv_timeout(Duration::from_secs(30))
        .unwrap();
    c.result.unwrap();
    // Device memory: read back on the copy stream (`read_host` reads host buffers only).
    let mut got = vec![0u8; n * sb];
    let whole = up.buffers[0].slice().slice(0..n * sb);
    up.copy_stream.memcpy_dtoh(&whole, &mut got).unwrap();
    up.copy_stream.synchronize().unwrap();
    let faults = up.take_decode_faults();
    let counts = up.decode_counts();
    println!(
        "faults {faults:?}; counts {counts:?}; batch error {:?}",
        up.last_decode_error()
    );
    for k in 0..files.len() - 1 {
        let (g, w) = (&got[k * sb..(k + 1) * sb], &want[k * sb..(k + 1) * sb]);
        let mad = g
            .iter()
            .zip(w)
            .map(|(&a, &b)| (a as f64 - b as f64).abs())
            .sum::<f64>()
            / sb as f64;
        println!("sample {k}: mean abs difference {mad:.3}");
        assert!(mad <= 1.0, "sample {k}: mean abs difference {mad}");
    }
    assert_eq!(faults.iter().map(|f| f.sample).collect::<Vec<_>>(), [5]);
    assert!(
        got[(n - 2) * sb..].iter().all(|&v| v == 0),
        "the bad and the zeros samples"
    );
    assert_eq!((counts.gpu, counts.cpu_not_jpeg, counts.failed), (5, 1, 1));
}

/// The cuda engine's decode rate alone: parts of 64 synthetic 500×375 q90 JPEGs (4:2:0), 224²
/// u8 output, decoded from registered memory as the daemon decodes them, submitted back to back;
/// prints images/s and the calling thread's CPU seconds per second. A measurement, not a check:
/// run with `--ignored` on a GPU host.
#[test]
#[ignore = "a benchmark for GPU hosts"]
fn gpu_decode_rate() {
    use crate::Decode;
    use pinring_data::{write_sample, ArenaCursor, EncodedEntry, FLAG_FLIP};
    use pinring_image::{synth, Output, SampleKey, SampleSpec, Transform};
    if crate::testing::gpu().is_none() {
        return;
    }
    let spec = SampleSpec {
        transform: Transform::TRAIN_DEFAULT,
        output: Output::U8Hwc,
        reduced_decode: false,
    };
    let sb = spec.sample_bytes();
    let (per_part, parts) = (64usize, 16usize);
    let share = 160 << 10;
    let part_bytes = per_part * (64 + share);
    let ring = AlignedBuf::new(parts * part_bytes, "decode ring").unwrap();
    let b = CudaBackend::new(0).unwrap();
    let mut chunk = vec![0u8; part_bytes];
    for p in 0..parts {
        let mut cursor = ArenaCursor::new(per_part, share as u64);
        for k in 0..per_part {
            let id = (p * per_part + k) as u64;
            let pixels = synth::photo(500, 375, id, 8);
            let mut bytes = Vec::new();
            jpeg_encoder::Encoder::new(&mut bytes, 90)
                .encode(&pixels, 500, 375, jpeg_encoder::ColorType::Rgb)
                .unwrap();
            let key = SampleKey {
                seed: 1,
                epoch: 0,
                sample_id: id,
            };
            let (crop, flip) = spec.transform.plan(500, 375, key);
            let entry = EncodedEntry {
                flags: if flip { FLAG_FLIP } else { 0 },
                width: 500,
                height: 375,
                crop: [crop.left, crop.top, crop.width, crop.height],
                ..EncodedEntry::default()
            };
            write_sample(&mut chunk, &mut cursor, k, entry, &bytes).unwrap();
        }
        // SAFETY: the ring is ours and not shared; the part lies inside it.
        unsafe { ring.write_from(p * part_bytes, chunk.as_ptr(), part_bytes) };
    }
    // SAFETY: `ring` outlives `reg` (dropped at the end, after the uploader).
    let reg = unsafe { b.register_chunked(ring.as_mut_ptr(), parts * part_bytes, false, 1 << 30) }
        .unwrap();
    let up = b.cuda_uploader(4, 256 * sb, Placement::Contiguous).unwrap();
    up.set_decoder(spec).unwrap();
    let thread_cpu = || {
        let mut ru = std::mem::MaybeUninit::<nix::libc::rusage>::zeroed();
        // SAFETY: RUSAGE_THREAD fills the struct.
        unsafe { nix::libc::getrusage(nix::libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
        // SAFETY: filled above.
        let ru = unsafe { ru.assume_init() };
        let t = |v: nix::libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
        t(ru.ru_utime) + t(ru.ru_stime)
    };
    for round in 0..3 {
        let (t0, c0) = (std::time::Instant::now(), thread_cpu());
        let mut submitted = 0;
        for i in 0..64 {
            let p = i % parts;
            let job = UploadJob {
                tag: i as u64,
                src: ring.as_ptr().wrapping_add(p * part_bytes),
                len: part_bytes,
                buffer: i % 4,
                dst_offset: (i / 4 % 4) * per_part * sb,
                decode: Some(Decode {
                    samples: per_part as u32,
                    dst_len: per_part * sb,
                }),
            };
            // SAFETY: the ring outlives every completion, received below; nothing writes it.
            unsafe { up.submit(job) }.unwrap();
            submitted += 1;
            while submitted > 8 {
                up.completions()
                    .recv_timeout(Duration::from_secs(30))
                    .unwrap()
                    .result
                    .unwrap();
                submitted -= 1;
            }
        }
        while submitted > 0 {
            up.completions()
                .recv_timeout(Duration::from_secs(30))
                .unwrap()
                .result
                .unwrap();
            submitted -= 1;
        }
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "round {round}: {:.0} images/s, the submitting thread {:.2} CPU s/s; counts {:?}",
            (64 * per_part) as f64 / dt,
            (thread_cpu() - c0) / dt,
            up.decode_counts()
        );
    }
    drop(up);
    drop(reg);
}
