//! Loopback data-plane throughput, all in one run so the ratios are comparable:
//!
//! * raw TCP: a plain tokio socket pair moving `--raw-gib` GiB (default 4) in 4 MiB writes, over 1 and 4
//!   streams, with default sockets and with the transfer layer's socket options (TCP_NODELAY, 4 MiB buffers);
//! * the transfer layer (server + pooled client, 4 lanes, 1 MiB stripes): `write`, `read_into` (zero-copy into
//!   a caller buffer) and `read` (allocating) of 4 KiB, 1 MiB and 4 MiB objects at concurrency 1 and 8, each for
//!   `--secs` seconds (default 2): MiB/s, ops/s and p50/p99 latency per operation;
//! * the same-process memcpy path, for reference.
//!
//! `cargo bench -p crescent-transfer --bench loopback [-- --secs S --raw-gib G --lanes N --stripe-kib K
//! --sizes-kib 4,1024,4096]` (`--raw-gib 0` skips the raw runs). Prints one line per case.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use bytes::Bytes;
use crescent_proto::SegmentId;
use crescent_transfer::{SegmentMemory, SegmentRegistry, TransferClient, TransferConfig, TransferServer};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Each concurrent task owns a disjoint region of the segment this large.
const REGION: usize = 64 * MIB;
const MAX_CONCURRENCY: usize = 8;

struct Args {
    secs: f64,
    raw_gib: usize,
    lanes: usize,
    stripe_kib: u64,
    sizes_kib: Vec<usize>,
}

fn args() -> Args {
    let mut a = Args { secs: 2.0, raw_gib: 4, lanes: 4, stripe_kib: 1024, sizes_kib: vec![4, 1024, 4096] };
    let argv: Vec<String> = std::env::args().collect();
    for w in argv.windows(2) {
        match w[0].as_str() {
            "--secs" => a.secs = w[1].parse().expect("--secs S"),
            "--raw-gib" => a.raw_gib = w[1].parse().expect("--raw-gib G"),
            "--lanes" => a.lanes = w[1].parse().expect("--lanes N"),
            "--stripe-kib" => a.stripe_kib = w[1].parse().expect("--stripe-kib K"),
            "--sizes-kib" => {
                a.sizes_kib =
                    w[1].split(',').filter(|s| !s.is_empty()).map(|s| s.parse().expect("--sizes-kib 4,1024")).collect()
            }
            _ => {}
        }
    }
    a
}

fn mib_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / MIB as f64 / d.as_secs_f64()
}

fn fmt_size(n: usize) -> String {
    if n >= MIB { format!("{}MiB", n / MIB) } else { format!("{}KiB", n / KIB) }
}

async fn connect(addr: std::net::SocketAddr, tuned: bool) -> TcpStream {
    if !tuned {
        return TcpStream::connect(addr).await.unwrap();
    }
    let s = TcpSocket::new_v4().unwrap();
    s.set_send_buffer_size(4 << 20).unwrap();
    s.set_recv_buffer_size(4 << 20).unwrap();
    s.set_nodelay(true).unwrap();
    s.connect(addr).await.unwrap()
}

/// Moves `total` bytes over `streams` socket pairs in 4 MiB writes; returns MiB/s.
async fn raw(total: usize, streams: usize, tuned: bool) -> f64 {
    let listener = if tuned {
        let s = TcpSocket::new_v4().unwrap();
        s.set_send_buffer_size(4 << 20).unwrap();
        s.set_recv_buffer_size(4 << 20).unwrap();
        s.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        s.listen(64).unwrap()
    } else {
        TcpListener::bind("127.0.0.1:0").await.unwrap()
    };
    let addr = listener.local_addr().unwrap();
    let per_stream = total / streams;
    let receivers = tokio::spawn(async move {
        let mut tasks = Vec::new();
        for _ in 0..streams {
            let (mut s, _) = listener.accept().await.unwrap();
            if tuned {
                s.set_nodelay(true).unwrap();
            }
            tasks.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 4 * MIB];
                let mut got = 0;
                while got < per_stream {
                    let n = s.read(&mut buf).await.unwrap();
                    assert!(n > 0);
                    got += n;
                }
                s.write_all(b"k").await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let mut senders = Vec::new();
    for _ in 0..streams {
        senders.push(connect(addr, tuned).await);
    }
    let start = Instant::now();
    let tasks: Vec<_> = senders
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let chunk = vec![0x5au8; 4 * MIB];
                let mut sent = 0;
                while sent < per_stream {
                    let n = chunk.len().min(per_stream - sent);
                    s.write_all(&chunk[..n]).await.unwrap();
                    sent += n;
                }
                let mut ack = [0u8; 1];
                s.read_exact(&mut ack).await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed();
    receivers.await.unwrap();
    mib_per_s(per_stream * streams, elapsed)
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Write,
    ReadInto,
    Read,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::ReadInto => "read_into",
            Op::Read => "read",
        }
    }
}

struct Result_ {
    mib_s: f64,
    ops_s: f64,
    p50: Duration,
    p99: Duration,
}

/// Prints one case's line (`what`: `transfer` or `local`).
fn report(what: &str, op: Op, size: usize, conc: usize, r: &Result_) {
    println!(
        "{what:<9} {:<9} size={:<6} conc={conc}: {:>9.1} MiB/s {:>9.0} ops/s  p50 {:>8.1?}  p99 {:>8.1?}",
        op.name(),
        fmt_size(size),
        r.mib_s,
        r.ops_s,
        r.p50,
        r.p99
    );
}

/// Runs `op` on `size`-byte objects from `conc` tasks for `secs`; each task cycles over its own region.
async fn run(
    c: &TransferClient,
    endpoint: &str,
    segment: SegmentId,
    op: Op,
    size: usize,
    conc: usize,
    secs: f64,
) -> Result_ {
    let slots = (REGION / size).min(1024);
    let deadline = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let tasks: Vec<_> = (0..conc)
        .map(|t| {
            let (c, endpoint) = (c.clone(), endpoint.to_owned());
            tokio::spawn(async move {
                let payload = Bytes::from(vec![t as u8 ^ 0xa5; size]);
                let mut buf = vec![0u8; size];
                let mut lat = Vec::new();
                let mut i = 0usize;
                let begin = Instant::now();
                while begin.elapsed() < deadline {
                    let offset = (t * REGION + (i % slots) * size) as u64;
                    let t0 = Instant::now();
                    match op {
                        Op::Write => c.write(&endpoint, segment, offset, payload.clone()).await.unwrap(),
                        Op::ReadInto => c.read_into(&endpoint, segment, offset, &mut buf).await.unwrap(),
                        Op::Read => {
                            let b = c.read(&endpoint, segment, offset, size as u64).await.unwrap();
                            assert_eq!(b.len(), size);
                        }
                    }
                    lat.push(t0.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed();
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    Result_ {
        mib_s: mib_per_s(lat.len() * size, elapsed),
        ops_s: lat.len() as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
    }
}

fn main() {
    let args = args();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        println!(
            "# loopback 127.0.0.1, {} CPUs, tokio multi-thread runtime ({} workers)",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        let total = args.raw_gib << 30;
        let raw_cases = if args.raw_gib == 0 { vec![] } else { vec![false, true] };
        for tuned in raw_cases {
            for streams in [1, 4] {
                let r = raw(total, streams, tuned).await;
                let label = if tuned { "nodelay+4MiB-buffers" } else { "default-sockets" };
                println!(
                    "raw       streams={streams} {label:<21} {} GiB in 4 MiB writes: {r:>9.1} MiB/s",
                    args.raw_gib
                );
            }
        }

        if args.sizes_kib.is_empty() {
            return; // raw TCP only (`--sizes-kib ""`), e.g. beside scripts/bench-cluster.sh
        }
        // A hosting node and a client in the same process, but the client's registry is empty, so every
        // transfer crosses the loopback socket.
        let segments = SegmentRegistry::new();
        let segment = SegmentId::random();
        let mem = Arc::new(SegmentMemory::anonymous((REGION * MAX_CONCURRENCY) as u64).unwrap());
        mem.lease_mut(0, mem.len()).unwrap().fill(0); // fault the pages in up front
        segments.register(segment, mem.clone());
        let server = TransferServer::bind("127.0.0.1:0".parse().unwrap(), segments.clone()).unwrap().spawn().unwrap();
        let endpoint = server.local_addr().to_string();
        let config = TransferConfig {
            lanes_per_peer: args.lanes,
            stripe_size: args.stripe_kib << 10,
            write_stripe_size: args.stripe_kib << 10,
            ..TransferConfig::default()
        };
        println!(
            "# transfer layer: lanes_per_peer={} stripe_size={} KiB, {:.1} s per case",
            config.lanes_per_peer,
            config.stripe_size >> 10,
            args.secs
        );
        let client = TransferClient::new(config, SegmentRegistry::new());
        for size in args.sizes_kib.iter().map(|k| k * KIB) {
            for conc in [1, 8] {
                for op in [Op::Write, Op::ReadInto, Op::Read] {
                    let r = run(&client, &endpoint, segment, op, size, conc, args.secs).await;
                    report("transfer", op, size, conc, &r);
                }
            }
        }
        println!("# sockets open to the server: {} (bounded by lanes_per_peer)", client.open_connections(&endpoint));

        // Same-process memcpy path: the client hosts the segment itself.
        let local = TransferClient::new(TransferConfig::default(), segments);
        for size in [4 * KIB, 4 * MIB] {
            for op in [Op::Write, Op::ReadInto] {
                let r = run(&local, "unused:1", segment, op, size, 1, args.secs / 2.0).await;
                report("local", op, size, 1, &r);
            }
        }
        server.shutdown().await;
    });
}
