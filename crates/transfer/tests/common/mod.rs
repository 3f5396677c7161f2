//! Shared test helpers: a hosting node on 127.0.0.1:0, data patterns, and raw-frame I/O for hostile peers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use crescent_proto::SegmentId;
use crescent_proto::wire::{Envelope, Hello, HelloReply, PeerRole, frame_prefix};
use crescent_transfer::{SegmentMemory, SegmentRegistry, TransferServer, TransferServerHandle};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use crescent_testkit::pattern;

pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;

/// A process hosting one segment behind a running transfer server.
pub struct Node {
    pub segments: SegmentRegistry,
    pub segment: SegmentId,
    pub mem: Arc<SegmentMemory>,
    pub server: TransferServerHandle,
    pub addr: SocketAddr,
    pub endpoint: String,
}

pub fn node(size: u64) -> Node {
    node_on(SegmentMemory::anonymous(size).unwrap(), Duration::ZERO)
}

/// A node whose idle connections (and dry sockets mid-payload) poll before parking.
#[allow(dead_code)] // not every test binary uses it
pub fn polling_node(size: u64) -> Node {
    node_on(SegmentMemory::anonymous(size).unwrap(), Duration::from_micros(50))
}

/// A node whose segment is memfd-backed (its large reads go out with sendfile).
#[allow(dead_code)] // not every test binary uses it
pub fn memfd_node(size: u64) -> Node {
    node_on(SegmentMemory::memfd("crescent-test", size).unwrap(), Duration::ZERO)
}

/// A node serving TLS with `tls`'s server side (anonymous or memfd-backed).
#[allow(dead_code)] // not every test binary uses it
pub fn tls_node(size: u64, memfd: bool, tls: &crescent_net::tls::Tls) -> Node {
    let mem = if memfd { SegmentMemory::memfd("crescent-test", size) } else { SegmentMemory::anonymous(size) };
    node_with(mem.unwrap(), Duration::ZERO, tls.server.clone())
}

/// A node that also serves local lanes (a Unix socket named after its endpoint), as storage nodes do; with
/// `tls` it is asked to, but does not.
#[allow(dead_code)] // not every test binary uses it
pub fn local_node(size: u64, memfd: bool, tls: Option<Arc<crescent_net::tls::TlsServer>>) -> Node {
    let mem = if memfd { SegmentMemory::memfd("crescent-test", size) } else { SegmentMemory::anonymous(size) };
    node_built(mem.unwrap(), Duration::ZERO, tls, true)
}

fn node_on(mem: SegmentMemory, poll: Duration) -> Node {
    node_with(mem, poll, None)
}

fn node_with(mem: SegmentMemory, poll: Duration, tls: Option<Arc<crescent_net::tls::TlsServer>>) -> Node {
    node_built(mem, poll, tls, false)
}

fn node_built(
    mem: SegmentMemory,
    poll: Duration,
    tls: Option<Arc<crescent_net::tls::TlsServer>>,
    local_lanes: bool,
) -> Node {
    let segments = SegmentRegistry::new();
    let segment = SegmentId::random();
    let mem = Arc::new(mem);
    segments.register(segment, mem.clone());
    let server = TransferServer::bind("127.0.0.1:0".parse().unwrap(), segments.clone()).unwrap();
    let endpoint = server.local_addr().to_string();
    let server =
        server.with_poll_window(poll).with_tls(tls).with_local_lanes(local_lanes.then_some(endpoint)).spawn().unwrap();
    let addr = server.local_addr();
    Node { segments, segment, mem, server, addr, endpoint: addr.to_string() }
}

/// Sends a frame with `header` bytes as given (possibly garbage) and `payload`.
pub async fn send_raw(stream: &mut TcpStream, header: &[u8], payload: &[u8]) {
    let mut buf = frame_prefix(header.len(), payload.len()).unwrap().to_vec();
    buf.extend_from_slice(header);
    buf.extend_from_slice(payload);
    stream.write_all(&buf).await.unwrap();
}

/// Sends `Envelope { id, body }` with `payload`.
pub async fn send<T: Serialize>(stream: &mut TcpStream, id: u64, body: &T, payload: &[u8]) {
    let header = postcard::to_stdvec(&Envelope { id, body }).unwrap();
    send_raw(stream, &header, payload).await;
}

/// Reads one frame: `None` at end of stream; otherwise the raw header and the payload.
pub async fn recv_raw(stream: &mut TcpStream) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut prefix = [0u8; 8];
    match stream.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
        Err(e) => panic!("read failed: {e}"),
    }
    let len = u32::from_be_bytes(prefix[..4].try_into().unwrap()) as usize;
    let header_len = u32::from_be_bytes(prefix[4..].try_into().unwrap()) as usize;
    let mut header = vec![0u8; header_len];
    stream.read_exact(&mut header).await.unwrap();
    let mut payload = vec![0u8; len - 4 - header_len];
    stream.read_exact(&mut payload).await.unwrap();
    Some((header, payload))
}

/// Reads one frame and decodes its header as `Envelope<T>`.
pub async fn recv<T: DeserializeOwned>(stream: &mut TcpStream) -> Option<(Envelope<T>, Vec<u8>)> {
    let (header, payload) = recv_raw(stream).await?;
    Some((postcard::from_bytes(&header).unwrap(), payload))
}

/// Whether the server closed the connection (EOF or reset, no further frame).
pub async fn closed(stream: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(stream.read(&mut b).await, Ok(0) | Err(_))
}

/// A raw connection that has completed the hello.
pub async fn raw_connect(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    send(&mut s, 0, &Hello::new(PeerRole::Client, None), &[]).await;
    let (env, payload) = recv::<HelloReply>(&mut s).await.unwrap();
    assert_eq!(env.id, 0);
    assert!(payload.is_empty());
    env.body.unwrap();
    s
}
