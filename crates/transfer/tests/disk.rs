//! The SSD tier's node side: block devices, disk segments, and disk segments served on the data plane.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::Bytes;
use common::{KIB, MIB, pattern};
use crescent_proto::transfer::{TransferRequest, TransferResponse};
use crescent_proto::wire::{Envelope, Hello, HelloReply, PeerRole, frame_prefix};
use crescent_proto::{ErrorCode, SegmentId};
use crescent_testkit::eventually;
use crescent_transfer::disk::{
    AlignedBuf, BLOCK, BlockDevice, DATA_FILE, DeviceError, DiskConfig, DiskError, DiskSegment, FaultyDevice,
    FileDevice, MemoryDevice,
};
use crescent_transfer::{
    BatchRead, MAX_TRANSFER, SegmentMemory, SegmentRegistry, TransferClient, TransferConfig, TransferServer,
    TransferServerHandle,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A fresh directory on the target's filesystem (the repository's disk, not a tmpfs).
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn segment(device: impl BlockDevice, config: DiskConfig) -> DiskSegment {
    DiskSegment::new(Arc::new(device), config).unwrap()
}

/// Fills the whole disk with `pattern(size, seed)`, in writes of varied sizes.
async fn fill(disk: &DiskSegment, seed: u64) -> Vec<u8> {
    let data = pattern(disk.size() as usize, seed);
    let mut at = 0usize;
    for (i, chunk) in [BLOCK, 3 * BLOCK, 64 * KIB, MIB, 5 * BLOCK].iter().cycle().enumerate() {
        if at >= data.len() {
            break;
        }
        let n = (*chunk).min(data.len() - at);
        disk.write(at as u64, AlignedBuf::copy_from(&data[at..at + n]).unwrap())
            .await
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
        at += n;
    }
    data
}

/// Reads of every shape: aligned and not, within a block, across blocks, whole MiBs, the last byte.
async fn check_reads(disk: &DiskSegment, data: &[u8], what: &str) {
    let size = data.len() as u64;
    let mut cases =
        vec![(0, 1), (0, BLOCK), (1, BLOCK), (4095, 2), (4097, 3 * BLOCK + 5), (12_345, MIB), (size - 1, 1)];
    cases.extend([(size - BLOCK as u64, BLOCK), (0, size as usize), (7, 0), (size, 0)]);
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..40 {
        let offset = rng.u64(0..size);
        cases.push((offset, rng.usize(0..=(size - offset).min(300 * KIB as u64) as usize)));
    }
    for (offset, len) in cases {
        let got = disk.read(offset, len).await.unwrap_or_else(|e| panic!("{what}: read {offset}+{len}: {e}"));
        assert_eq!(got.len(), len, "{what}: {offset}+{len}");
        let at = offset as usize;
        assert!(*got == data[at..at + len], "{what}: bytes of {offset}+{len}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_segments_round_trip_every_shape_of_range() {
    let dir = scratch();
    let file = FileDevice::create(dir.path(), 8 * MIB as u64).unwrap();
    let buffered = FileDevice::create_buffered(&dir.path().join("buffered"), 8 * MIB as u64).unwrap();
    assert!(!buffered.is_direct() && buffered.describe().starts_with("buffered file "), "{}", buffered.describe());
    let devices: Vec<Arc<dyn BlockDevice>> =
        vec![Arc::new(MemoryDevice::new(8 * MIB as u64).unwrap()), Arc::new(file), Arc::new(buffered)];
    for device in devices {
        let what = device.describe();
        let disk = DiskSegment::new(device, DiskConfig::default()).unwrap();
        assert_eq!(disk.size(), 8 * MIB as u64);
        let data = fill(&disk, 11).await;
        check_reads(&disk, &data, &what).await;
        // A short write pads its last block with zeros.
        disk.write(MIB as u64, AlignedBuf::copy_from(b"short").unwrap()).await.unwrap();
        assert_eq!(&*disk.read(MIB as u64, BLOCK).await.unwrap(), &[b"short".as_slice(), &[0; BLOCK - 5]].concat()[..]);
        // A buffer read from is reused by the next read it fits (no fresh pages to fault in each time).
        let first = disk.read(2 * MIB as u64, MIB).await.unwrap().as_ptr();
        let again = disk.read((2 * MIB + BLOCK) as u64, MIB - 10).await.unwrap();
        assert_eq!(again.as_ptr(), first, "{what}: the buffer was not reused");
        assert!(*again == data[2 * MIB + BLOCK..3 * MIB + BLOCK - 10], "{what}");
        let stats = disk.stats();
        assert!(stats.writes > 0 && stats.reads >= 45 && stats.errors == 0, "{what}: {stats:?}");
        assert_eq!(stats.write_bytes, 8 * MIB as u64 + BLOCK as u64, "{what}: whole blocks written");
    }
}

#[tokio::test]
async fn bad_ranges_get_typed_errors() {
    let disk = segment(MemoryDevice::new(64 * KIB as u64).unwrap(), DiskConfig::default());
    let block = || AlignedBuf::zeroed(BLOCK).unwrap();
    assert_eq!(disk.write(1, block()).await.unwrap_err(), DiskError::Unaligned(1));
    assert_eq!(disk.write(64 * KIB as u64, block()).await.unwrap_err(), DiskError::OutOfRange);
    // Padded to a block, a 1-byte write at the last block's start still fits; one block further does not.
    disk.write(60 * KIB as u64, AlignedBuf::zeroed(1).unwrap()).await.unwrap();
    assert_eq!(disk.read(64 * KIB as u64 - 1, 2).await.unwrap_err(), DiskError::OutOfRange);
    assert_eq!(disk.read(u64::MAX, 2).await.unwrap_err(), DiskError::OutOfRange);
    assert_eq!(disk.read(0, usize::MAX).await.unwrap_err(), DiskError::OutOfRange);
    assert_eq!(DiskError::Unaligned(1).code(), ErrorCode::InvalidParams);
    assert_eq!(DiskError::OutOfRange.code(), ErrorCode::InvalidParams);
    let mem = SegmentMemory::anonymous(64 * KIB as u64).unwrap();
    assert_eq!(disk.copy_in(&mem, 0, 10, 3).await.unwrap_err(), DiskError::Unaligned(3));
    assert_eq!(disk.copy_in(&mem, 60 * KIB as u64, 8 * KIB as u64, 0).await.unwrap_err(), DiskError::OutOfRange);
    assert_eq!(disk.copy_out(0, 8 * KIB as u64, &mem, 60 * KIB as u64).await.unwrap_err(), DiskError::OutOfRange);
    let _held = mem.lease_mut(0, 10).unwrap();
    assert_eq!(disk.copy_in(&mem, 0, 10, 0).await.unwrap_err(), DiskError::Busy);
    assert_eq!(disk.copy_out(0, 10, &mem, 5).await.unwrap_err(), DiskError::Busy);
    assert_eq!(disk.stats().errors, 0, "refusals are not device errors");
}

/// `/work` is ext4: the file is read and written with O_DIRECT there (and says so).
#[test]
fn the_file_device_uses_o_direct_on_this_machines_disk() {
    let dir = scratch();
    let dev = FileDevice::create(dir.path(), MIB as u64).unwrap();
    assert!(dev.is_direct(), "{}", dev.describe());
    assert_eq!(dev.describe(), format!("O_DIRECT file {}", dir.path().join(DATA_FILE).display()));
    assert_eq!(std::fs::metadata(dev.path()).unwrap().len(), MIB as u64);
    // O_DIRECT really is on: a file offset that is not sector-aligned is refused by the kernel (once the
    // blocks are written: reading an unwritten extent is answered with zeros before any alignment check).
    let mut buf = AlignedBuf::zeroed(2 * BLOCK).unwrap();
    dev.write_at(buf.padded(), 0).unwrap();
    let e = dev.read_at(&mut buf.padded_mut()[..BLOCK], 1).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    dev.read_at(&mut buf.padded_mut()[..BLOCK], BLOCK as u64).unwrap();
}

#[test]
fn the_file_device_refuses_bad_sizes_and_directories() {
    let dir = scratch();
    for size in [0, 4097, MIB as u64 + 1] {
        assert!(matches!(FileDevice::create(dir.path(), size), Err(DeviceError::BadSize(s)) if s == size), "{size}");
    }
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let inside = file.join("disk");
    let e = FileDevice::create(&inside, MIB as u64).unwrap_err();
    assert!(matches!(&e, DeviceError::Dir { path, .. } if *path == inside), "{e:?}");
    assert!(e.to_string().contains(&inside.display().to_string()), "{e}");
    // Created when missing.
    let nested = dir.path().join("a/b/c");
    FileDevice::create(&nested, MIB as u64).unwrap();
    assert!(nested.join(DATA_FILE).exists());
}

/// A restarted node's disk reads as zeros: nothing from before is served.
#[tokio::test]
async fn creating_the_file_device_wipes_what_it_held() {
    let dir = scratch();
    let size = 2 * MIB as u64;
    {
        let disk = segment(FileDevice::create(dir.path(), size).unwrap(), DiskConfig::default());
        fill(&disk, 3).await;
        assert!(disk.read(0, 16).await.unwrap().iter().any(|&b| b != 0));
    }
    // Grown meanwhile, as an old file of another size would be.
    std::fs::OpenOptions::new().write(true).open(dir.path().join(DATA_FILE)).unwrap().set_len(2 * size).unwrap();
    let disk = segment(FileDevice::create(dir.path(), size).unwrap(), DiskConfig::default());
    assert!(disk.read(0, size as usize).await.unwrap().iter().all(|&b| b == 0), "old bytes served after a restart");
    assert_eq!(std::fs::metadata(dir.path().join(DATA_FILE)).unwrap().len(), size);
}

/// Two nodes cannot share a directory: the second is refused (naming the file) without wiping the first's data.
#[tokio::test]
async fn a_second_opener_of_the_directory_is_refused() {
    let dir = scratch();
    let first = segment(FileDevice::create(dir.path(), MIB as u64).unwrap(), DiskConfig::default());
    let data = fill(&first, 5).await;
    let path: PathBuf = dir.path().join(DATA_FILE);
    match FileDevice::create(dir.path(), MIB as u64) {
        Err(DeviceError::Locked { path: p }) => assert_eq!(p, path),
        other => panic!("second opener: {other:?}"),
    }
    let e = FileDevice::create(dir.path(), MIB as u64).unwrap_err().to_string();
    assert!(e.contains(&path.display().to_string()), "{e}");
    assert!(*first.read(0, MIB).await.unwrap() == data[..], "the refused opener wiped the file");
    drop(first);
    FileDevice::create(dir.path(), MIB as u64).unwrap();
}

/// However many submit at once, at most `queue_depth` operations are queued or in flight, and the others wait
/// without blocking the runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_depth_bounds_operations_in_flight() {
    let device = Arc::new(FaultyDevice::new(MemoryDevice::new(MIB as u64).unwrap()));
    let disk = Arc::new(DiskSegment::new(device.clone(), DiskConfig { io_threads: 2, queue_depth: 4 }).unwrap());
    device.pause(true);
    let reads: Vec<_> = (0..32u64)
        .map(|i| {
            let disk = disk.clone();
            tokio::spawn(async move { disk.read(i * 7 * KIB as u64, 5 * KIB).await.map(|b| b.len()) })
        })
        .collect();
    assert!(eventually(Duration::from_secs(10), || async { disk.stats().in_flight == 4 }).await, "{:?}", disk.stats());
    // The two threads hold one call each; the others wait in the queue or for a slot.
    assert!(eventually(Duration::from_secs(10), || async { device.reads() == 2 }).await);
    // The runtime is free meanwhile.
    tokio::task::yield_now().await;
    assert_eq!(disk.stats().in_flight, 4);
    device.pause(false);
    for r in reads {
        assert_eq!(r.await.unwrap().unwrap(), 5 * KIB);
    }
    let stats = disk.stats();
    assert_eq!((stats.reads, stats.max_in_flight, stats.in_flight, stats.queue_depth), (32, 4, 0, 4), "{stats:?}");
}

#[tokio::test]
async fn an_injected_device_error_is_reported_and_the_next_call_succeeds() {
    let device = Arc::new(FaultyDevice::new(MemoryDevice::new(MIB as u64).unwrap()));
    let disk = DiskSegment::new(device.clone(), DiskConfig::default()).unwrap();
    disk.write(0, AlignedBuf::copy_from(&pattern(64 * KIB, 1)).unwrap()).await.unwrap();
    device.fail_reads_at(8 * KIB as u64..8 * KIB as u64 + 1);
    let e = disk.read(10 * KIB as u64, 100).await.unwrap_err();
    assert!(matches!(&e, DiskError::Io { op: "read", message, .. } if message.contains("injected EIO")), "{e:?}");
    assert_eq!(e.code(), ErrorCode::FileReadFail);
    assert_eq!(&*disk.read(0, 100).await.unwrap(), &pattern(64 * KIB, 1)[..100]);
    device.fail_next_writes(1);
    let e = disk.write(0, AlignedBuf::zeroed(1).unwrap()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::FileWriteFail);
    disk.write(0, AlignedBuf::zeroed(1).unwrap()).await.unwrap();
    assert_eq!(disk.stats().errors, 2);
}

/// Offload and promotion: memory → disk → memory, each returning the crc32c of the bytes it moved.
#[tokio::test]
async fn copy_in_and_copy_out_move_the_bytes_and_return_their_crc() {
    let dir = scratch();
    let disk = segment(FileDevice::create(dir.path(), 4 * MIB as u64).unwrap(), DiskConfig::default());
    let mem = SegmentMemory::anonymous(4 * MIB as u64).unwrap();
    let data = pattern(4 * MIB, 9);
    mem.write_at(0, &data).unwrap();
    let mut at = 0u64;
    for (src, len) in [(0u64, 1u64), (5, 4096), (4099, 4097), (100_000, MIB as u64), (7, 300_001)] {
        let crc = disk.copy_in(&mem, src, len, at).await.unwrap();
        let bytes = &data[src as usize..(src + len) as usize];
        assert_eq!(crc, crc32c::crc32c(bytes), "copy_in {src}+{len}");
        let back = 3 * MIB as u64 - 1;
        assert_eq!(disk.copy_out(at, len, &mem, back).await.unwrap(), crc, "copy_out {src}+{len}");
        let mut got = vec![0; len as usize];
        mem.read_at(back, &mut got).unwrap();
        assert!(got == bytes, "round trip of {src}+{len}");
        at += len.div_ceil(BLOCK as u64) * BLOCK as u64;
    }
}

/// The memory range is leased only while copied out: the disk write does not hold it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_in_releases_the_memory_range_before_the_disk_write() {
    let device = Arc::new(FaultyDevice::new(MemoryDevice::new(MIB as u64).unwrap()));
    let disk = Arc::new(DiskSegment::new(device.clone(), DiskConfig::default()).unwrap());
    let mem = Arc::new(SegmentMemory::anonymous(MIB as u64).unwrap());
    mem.write_at(0, &pattern(64 * KIB, 4)).unwrap();
    device.pause(true);
    let copy = tokio::spawn({
        let (disk, mem) = (disk.clone(), mem.clone());
        async move { disk.copy_in(&mem, 0, 64 * KIB as u64, 0).await }
    });
    assert!(eventually(Duration::from_secs(10), || async { device.writes() == 1 }).await);
    // The disk write is under way (held by the pause); the range is free to be rewritten.
    mem.lease_mut(0, 64 * KIB as u64).expect("the copy still holds the memory range").fill(0);
    device.pause(false);
    assert_eq!(copy.await.unwrap().unwrap(), crc32c::crc32c(&pattern(64 * KIB, 4)));
    assert!(*disk.read(0, 64 * KIB).await.unwrap() == pattern(64 * KIB, 4)[..]);
}

/// Dropping a disk segment stops its threads (they held the device; it is released once they are gone).
#[tokio::test]
async fn dropping_a_disk_segment_stops_its_threads() {
    let device: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MIB as u64).unwrap());
    let disk = DiskSegment::new(device.clone(), DiskConfig { io_threads: 3, queue_depth: 8 }).unwrap();
    disk.read(0, 10).await.unwrap();
    assert_eq!(Arc::strong_count(&device), 5);
    drop(disk);
    assert_eq!(Arc::strong_count(&device), 1, "an I/O thread outlived its segment");
}

/// A process hosting a disk segment (a real `O_DIRECT` file, faults injectable) behind a running transfer
/// server with local lanes.
struct DiskNode {
    segments: SegmentRegistry,
    segment: SegmentId,
    disk: Arc<DiskSegment>,
    device: Arc<FaultyDevice<FileDevice>>,
    server: TransferServerHandle,
    endpoint: String,
    data: Vec<u8>,
    _dir: tempfile::TempDir,
}

async fn disk_node(size: u64) -> DiskNode {
    let dir = scratch();
    let device = Arc::new(FaultyDevice::new(FileDevice::create(dir.path(), size).unwrap()));
    let disk = Arc::new(DiskSegment::new(device.clone(), DiskConfig::default()).unwrap());
    let data = fill(&disk, 21).await;
    let segments = SegmentRegistry::new();
    let segment = SegmentId::random();
    segments.register_disk(segment, disk.clone());
    let server = TransferServer::bind("127.0.0.1:0".parse().unwrap(), segments.clone()).unwrap();
    let endpoint = server.local_addr().to_string();
    let server = server.with_local_lanes(Some(endpoint.clone())).spawn().unwrap();
    DiskNode { segments, segment, disk, device, server, endpoint, data, _dir: dir }
}

fn tcp_client() -> TransferClient {
    TransferClient::new(TransferConfig { local_lanes: false, ..TransferConfig::default() }, SegmentRegistry::new())
}

/// A disk segment is read like a memory one: over TCP, over local lanes (large ranges `Locate`d: read into a
/// buffer the node keeps, copied by the client itself), and by a client sharing the node's registry (which
/// must not take the disk segment for memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_segment_is_read_over_tcp_and_local_lanes() {
    let n = disk_node(8 * MIB as u64).await;
    let local = TransferClient::new(TransferConfig::default(), SegmentRegistry::new());
    let same_process = TransferClient::new(TransferConfig::default(), n.segments.clone());
    let cases = [
        (0u64, 1u64),
        (5, 4096),
        (4095, 70_000),
        (12_345, 3 * MIB as u64),
        (0, 8 * MIB as u64),
        (8 * MIB as u64 - 1, 1),
    ];
    for (name, client) in [("tcp", tcp_client()), ("local", local), ("same process", same_process)] {
        let before = n.server.stats();
        for (offset, len) in cases {
            let got = client
                .read(&n.endpoint, n.segment, offset, len)
                .await
                .unwrap_or_else(|e| panic!("{name} {offset}+{len}: {e}"));
            assert!(got[..] == n.data[offset as usize..(offset + len) as usize], "{name}: bytes of {offset}+{len}");
        }
        let after = n.server.stats();
        let located = after.located - before.located;
        assert_eq!(located > 0, name != "tcp", "{name}: large ranges located on local lanes only: {after:?}");
        assert_eq!(after.disk_errors, 0);
    }
    assert!(n.disk.stats().reads > 0);
}

/// An injected disk error answers `FILE_READ_FAIL` on a live connection, which then serves a good read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_disk_answers_an_error_and_the_same_connection_serves_on() {
    let n = disk_node(MIB as u64).await;
    n.device.fail_reads_at(64 * KIB as u64..64 * KIB as u64 + 1);
    let mut s = common::raw_connect(n.server.local_addr()).await;
    let read = |offset, length| TransferRequest::Read { segment: n.segment, offset, length, grant: None };
    common::send(&mut s, 1, &read(60 * KIB as u64, 8 * KIB as u64), &[]).await;
    let (env, payload) = common::recv::<TransferResponse>(&mut s).await.unwrap();
    assert_eq!((env.id, env.body, payload.len()), (1, TransferResponse::Error(ErrorCode::FileReadFail), 0));
    let good = 128 * KIB + 100;
    common::send(&mut s, 2, &read(good as u64, 200 * KIB as u64), &[]).await;
    let (env, payload) = common::recv::<TransferResponse>(&mut s).await.unwrap();
    assert_eq!((env.id, env.body), (2, TransferResponse::Data));
    assert!(payload == n.data[good..good + 200 * KIB], "the good read after the failed one");
    let stats = n.server.stats();
    assert_eq!((stats.accepted, stats.open, stats.malformed, stats.disk_errors), (1, 1, 0, 1), "{stats:?}");
    // The client sees the code (and its lane stays pooled).
    let c = tcp_client();
    let e = c.read(&n.endpoint, n.segment, 64 * KIB as u64, 10).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::FileReadFail, "{e}");
    assert!(c.read(&n.endpoint, n.segment, 0, 10).await.unwrap()[..] == n.data[..10]);
    assert_eq!(n.server.stats().disk_errors, 2);
    // A Locate of a failing range answers the code too.
    let local = TransferClient::new(TransferConfig::default(), SegmentRegistry::new());
    let e = local.read(&n.endpoint, n.segment, 0, 512 * KIB as u64).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::FileReadFail, "{e}");
    n.device.heal();
    assert!(local.read(&n.endpoint, n.segment, 0, 512 * KIB as u64).await.unwrap()[..] == n.data[..512 * KIB]);
}

/// Only the node writes its disk: a WRITE (its payload skipped, the connection kept) or a write-`Locate` of a
/// disk segment is refused with `INVALID_PARAMS`, and the disk is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_a_disk_segment_are_refused() {
    let n = disk_node(2 * MIB as u64).await;
    let mut s = common::raw_connect(n.server.local_addr()).await;
    let write = TransferRequest::Write { segment: n.segment, offset: 0, grant: None };
    common::send(&mut s, 1, &write, &[7; 10_000]).await;
    let (env, _) = common::recv::<TransferResponse>(&mut s).await.unwrap();
    assert_eq!((env.id, env.body), (1, TransferResponse::Error(ErrorCode::InvalidParams)));
    let read = TransferRequest::Read { segment: n.segment, offset: 0, length: 10_000, grant: None };
    common::send(&mut s, 2, &read, &[]).await;
    let (env, payload) = common::recv::<TransferResponse>(&mut s).await.unwrap();
    assert_eq!((env.id, env.body), (2, TransferResponse::Data));
    assert!(payload == n.data[..10_000]);
    let local = TransferClient::new(TransferConfig::default(), SegmentRegistry::new());
    for (name, client) in [("tcp", tcp_client()), ("local", local)] {
        for len in [100, MIB] {
            let e = client.write(&n.endpoint, n.segment, 0, Bytes::from(vec![9; len])).await.unwrap_err();
            assert_eq!(e.code(), ErrorCode::InvalidParams, "{name}, {len} B: {e}");
        }
    }
    assert!(*n.disk.read(0, 2 * MIB).await.unwrap() == n.data[..], "a refused write changed the disk");
    assert_eq!(n.server.stats().located, 0, "no disk range located for writing");
}

/// Sends `Envelope { id, body }` (no payload) on any stream.
async fn send_on<S: AsyncWrite + Unpin, T: serde::Serialize>(s: &mut S, id: u64, body: &T) {
    let header = postcard::to_stdvec(&Envelope { id, body }).unwrap();
    let mut buf = frame_prefix(header.len(), 0).unwrap().to_vec();
    buf.extend_from_slice(&header);
    s.write_all(&buf).await.unwrap();
}

/// Reads one payload-less frame's `Envelope<T>` from any stream.
async fn recv_on<S: AsyncRead + Unpin, T: serde::de::DeserializeOwned>(s: &mut S) -> Envelope<T> {
    let mut prefix = [0u8; 8];
    s.read_exact(&mut prefix).await.unwrap();
    let len = u32::from_be_bytes(prefix[..4].try_into().unwrap()) as usize;
    let header_len = u32::from_be_bytes(prefix[4..].try_into().unwrap()) as usize;
    assert_eq!(len, 4 + header_len, "a frame with a payload");
    let mut header = vec![0u8; header_len];
    s.read_exact(&mut header).await.unwrap();
    postcard::from_bytes(&header).unwrap()
}

/// A local lane keeps at most `2 * MAX_TRANSFER` bytes of disk ranges read for its peer's copies until it says
/// `Release`; a `Locate` past that is answered `NO_AVAILABLE_HANDLE` (carry it over the lane), one for writing is
/// refused `INVALID_PARAMS`, and the lane serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_lane_stages_a_bounded_amount_of_disk_ranges() {
    let n = disk_node(MAX_TRANSFER).await;
    let addr = crescent_transfer::local_lane_address(&n.endpoint).unwrap();
    let std = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    std.set_nonblocking(true).unwrap();
    let mut s = tokio::net::UnixStream::from_std(std).unwrap();
    send_on(&mut s, 0, &Hello::new(PeerRole::Client, None)).await;
    recv_on::<_, HelloReply>(&mut s).await.body.unwrap();
    let locate =
        |offset, length, write| TransferRequest::Locate { segment: n.segment, offset, length, write, grant: None };
    let mut answers = Vec::new();
    for (id, req) in [
        locate(0, MAX_TRANSFER, false),
        locate(0, MAX_TRANSFER, false),
        locate(0, 1, false),
        locate(0, BLOCK as u64, true),
        TransferRequest::Release,
        locate(0, 1, false),
        locate(0, 10, true),
    ]
    .into_iter()
    .enumerate()
    {
        send_on(&mut s, id as u64 + 1, &req).await;
        answers.push(recv_on::<_, TransferResponse>(&mut s).await.body);
    }
    let located = |r: &TransferResponse| matches!(r, TransferResponse::Located(_));
    assert!(located(&answers[0]) && located(&answers[1]), "{answers:?}");
    let refused = TransferResponse::Error(ErrorCode::InvalidParams);
    assert_eq!(answers[2], TransferResponse::Error(ErrorCode::NoAvailableHandle), "staged past the bound");
    assert_eq!(answers[3], refused, "a disk range located for writing");
    assert_eq!(answers[4], TransferResponse::Released);
    assert!(located(&answers[5]), "after the release: {answers:?}");
    assert_eq!(answers[6], refused);
    assert_eq!(n.server.stats().located, 3);
}

/// A batch on one local lane asking for more disk bytes than a node stages for one run until its Release: the
/// ranges past the bound are carried over the lane (READs), and every one arrives intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_past_what_a_node_stages_for_one_run_is_read_whole() {
    const RANGES: usize = 80;
    const LEN: usize = 2 * MIB;
    let n = disk_node(8 * MIB as u64).await;
    let one_lane =
        TransferClient::new(TransferConfig { lanes_per_peer: 1, ..TransferConfig::default() }, SegmentRegistry::new());
    // A first read opens the local lane (its runs then take whole objects).
    one_lane.read(&n.endpoint, n.segment, 0, LEN as u64).await.unwrap();
    let offsets: Vec<u64> = (0..RANGES).map(|i| (i * 4099 * 17 % (6 * MIB)) as u64).collect();
    let mut bufs = vec![vec![0u8; LEN]; RANGES];
    let mut items: Vec<BatchRead<'_>> = bufs
        .iter_mut()
        .zip(&offsets)
        .map(|(buf, &offset)| BatchRead { segment: n.segment, grant: None, offset, buf })
        .collect();
    let before = n.server.stats();
    let results = one_lane.read_batch_checksummed(&n.endpoint, &mut items).await;
    for (i, r) in results.iter().enumerate() {
        assert!(r.is_ok(), "range {i}: {r:?}");
    }
    for (buf, &offset) in bufs.iter().zip(&offsets) {
        assert!(buf[..] == n.data[offset as usize..offset as usize + LEN], "bytes at {offset}");
    }
    let located = n.server.stats().located - before.located;
    assert!(located > 0 && (located as usize) < RANGES, "some located, the rest carried: {located}");
}
