//! A standby's snapshot from the leader, over the master's RPC port: shared snapshot storage is an option, not a
//! requirement.
//!
//! A standby whose own store holds no snapshot that reaches the log (an empty local `--snapshot-dir`, or one
//! older than the leader's compaction) asks the leader — the master view names its address — for its newest
//! published snapshot, [`SNAPSHOT_CHUNK`] bytes at a time (`FetchSnapshot`: the first request names no id and
//! learns the snapshot's id, size and crc32c; the next ones name that id and the offset reached). A frame is
//! size-limited, a snapshot is not. The standby proves the admin credential the cluster secret derives (the
//! leader serves the request to no other principal: a snapshot holds every tenant's metadata), and uses the
//! bytes only once their size and crc32c match what the leader said and they decode
//! ([`crate::snapshot::catalog::verify_payload`]). If retention deletes the snapshot mid-fetch the leader says
//! so and the standby starts over at its next bootstrap.

use crate::ha::role::SnapshotSource;
use crate::snapshot::catalog::{Catalog, MANIFEST_FORMAT, Manifest, data_key};
use crate::snapshot::store::SnapshotStore;
use bytes::{Bytes, BytesMut};
use crescent_ha::leader::LeaderCoordinator;
use crescent_net::auth::{Credential, Plane};
use crescent_net::tls::TlsClient;
use crescent_proto::rpc::{SNAPSHOT_CHUNK, SnapshotChunk};
use crescent_proto::wire::{Envelope, ErrorFrame, Frame, FrameCodec, Limits, PeerRole};
use crescent_proto::{ErrorCode, MasterReply, MasterRequest, MasterResponse};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::{Decoder, Encoder};

/// How long one step of a fetch (connecting, the hello, one piece) may take.
pub const FETCH_STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// Leader side: the piece of snapshot `id` (`None`: the newest published) at `offset`, and its bytes.
pub(super) async fn serve_chunk(
    store: Option<&dyn SnapshotStore>,
    id: Option<&str>,
    offset: u64,
) -> (MasterReply, Bytes) {
    let refuse = |code, message: String| (Err(ErrorFrame { code, message }), Bytes::new());
    let Some(store) = store else {
        return refuse(ErrorCode::ObjectNotFound, "this master keeps no snapshots".into());
    };
    let catalog = Catalog::new(store);
    let manifest = match id {
        None => catalog.newest_manifest().await,
        Some(id) => catalog.manifest(id).await,
    };
    let m = match manifest {
        Ok(Some(m)) => m,
        Ok(None) => {
            let what = id.map_or("no snapshot is published yet".to_owned(), |id| format!("snapshot {id} is gone"));
            return refuse(ErrorCode::ObjectNotFound, what);
        }
        Err(e) => return refuse(ErrorCode::InternalError, format!("reading the snapshot store: {e}")),
    };
    if offset > m.data_size {
        return refuse(
            ErrorCode::InvalidParams,
            format!("offset {offset} is past snapshot {}'s {}", m.id, m.data_size),
        );
    }
    let bytes = match catalog.read_chunk(&m, offset, SNAPSHOT_CHUNK).await {
        Ok(Some(b)) => b,
        Ok(None) => return refuse(ErrorCode::ObjectNotFound, format!("snapshot {}'s payload is gone", m.id)),
        Err(e) => return refuse(ErrorCode::InternalError, format!("reading snapshot {}: {e}", m.id)),
    };
    let chunk = SnapshotChunk {
        id: m.id,
        batch_id: m.batch_id,
        last_seq: m.last_seq,
        producer_view: m.producer_view,
        size: m.data_size,
        crc32c: m.data_crc32c,
        offset,
    };
    (Ok(MasterResponse::SnapshotChunk(chunk)), bytes)
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No master leads (or the view could not be read).
    #[error("no leader to fetch a snapshot from: {0}")]
    NoLeader(String),
    /// The leader could not be reached or broke the connection.
    #[error("fetching from {leader}: {detail}")]
    Connection {
        /// The leader's address.
        leader: String,
        /// What failed.
        detail: String,
    },
    /// The leader refused (no snapshot, not admin, ...).
    #[error("the leader {leader} refused: {code}: {message}")]
    Refused {
        /// The leader's address.
        leader: String,
        /// Its code.
        code: ErrorCode,
        /// Its words.
        message: String,
    },
    /// What the leader sent does not add up (pieces that contradict each other, more bytes than announced).
    #[error("the leader {leader} sent an inconsistent snapshot: {detail}")]
    Inconsistent {
        /// The leader's address.
        leader: String,
        /// What was wrong.
        detail: String,
    },
}

/// Fetches the newest snapshot of the master at `addr` (`host:port`), proving `credential` when the cluster has a
/// secret and dialling through `tls` when it serves TLS. Returns its manifest (as the leader described it) and
/// its bytes, which the caller must check ([`crate::snapshot::catalog::verify_payload`]) before using them.
pub async fn fetch_snapshot(
    addr: &str,
    credential: Option<&Credential>,
    tls: Option<&TlsClient>,
) -> Result<(Manifest, Bytes), FetchError> {
    let conn_err = |detail: String| FetchError::Connection { leader: addr.to_owned(), detail };
    let step = |what: &'static str| move |_| conn_err(format!("{what} not done within {FETCH_STEP_TIMEOUT:?}"));
    let tcp = tokio::time::timeout(FETCH_STEP_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(step("connect"))?
        .map_err(|e| conn_err(format!("connect: {e}")))?;
    let mut conn = tokio::time::timeout(FETCH_STEP_TIMEOUT, crescent_net::tls::connect(tls, tcp, addr))
        .await
        .map_err(step("TLS handshake"))?
        .map_err(|e| conn_err(format!("TLS: {e}")))?;
    let hello = crescent_net::hello::open(&mut conn, Plane::Control, PeerRole::Admin, None, credential);
    tokio::time::timeout(FETCH_STEP_TIMEOUT, hello)
        .await
        .map_err(step("hello"))?
        .map_err(|e| conn_err(format!("hello: {e}")))?;
    let mut codec = FrameCodec::new(Limits::CONTROL);
    let (mut inbuf, mut outbuf) = (BytesMut::new(), BytesMut::new());
    let mut data = BytesMut::new();
    let mut first: Option<SnapshotChunk> = None;
    for request_id in 1u64.. {
        let offset = data.len() as u64;
        let req = MasterRequest::FetchSnapshot { id: first.as_ref().map(|c| c.id.clone()), offset };
        let frame = Frame::encode(request_id, &req, Bytes::new()).map_err(|e| conn_err(e.to_string()))?;
        codec.encode(frame, &mut outbuf).map_err(|e| conn_err(e.to_string()))?;
        let exchange = async {
            conn.write_all(&outbuf).await?;
            conn.flush().await?;
            outbuf.clear();
            loop {
                if let Some(frame) = codec.decode(&mut inbuf).map_err(std::io::Error::other)? {
                    return Ok::<Frame, std::io::Error>(frame);
                }
                if conn.read_buf(&mut inbuf).await? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
            }
        };
        let frame = tokio::time::timeout(FETCH_STEP_TIMEOUT, exchange)
            .await
            .map_err(step("a snapshot piece"))?
            .map_err(|e| conn_err(format!("piece at {offset}: {e}")))?;
        let Envelope { id, body } = frame.decode::<MasterReply>().map_err(|e| conn_err(e.to_string()))?;
        let inconsistent = |detail: String| FetchError::Inconsistent { leader: addr.to_owned(), detail };
        if id != request_id {
            return Err(inconsistent(format!("reply to request {id}, expected {request_id}")));
        }
        let chunk = match body {
            Ok(MasterResponse::SnapshotChunk(c)) => c,
            Ok(other) => return Err(inconsistent(format!("unexpected reply {other:?}"))),
            Err(e) => {
                return Err(FetchError::Refused { leader: addr.to_owned(), code: e.code, message: e.message });
            }
        };
        let piece = frame.payload;
        if chunk.offset != offset {
            return Err(inconsistent(format!("piece at {}, asked for {offset}", chunk.offset)));
        }
        if let Some(f) = &first
            && (f.id != chunk.id || f.size != chunk.size || f.crc32c != chunk.crc32c)
        {
            return Err(inconsistent(format!(
                "piece of {} ({} bytes) within {} ({} bytes)",
                chunk.id, chunk.size, f.id, f.size
            )));
        }
        if offset.saturating_add(piece.len() as u64) > chunk.size {
            return Err(inconsistent(format!(
                "{} bytes at {offset} run past the announced {}",
                piece.len(),
                chunk.size
            )));
        }
        if piece.is_empty() && offset < chunk.size {
            // The leader's payload ends before its manifest's size: refused at verification (truncated).
            first.get_or_insert(chunk);
            break;
        }
        data.extend_from_slice(&piece);
        let done = data.len() as u64 == chunk.size;
        first.get_or_insert(chunk);
        if done {
            break;
        }
    }
    let Some(c) = first else {
        return Err(FetchError::Inconsistent { leader: addr.to_owned(), detail: "no reply".into() });
    };
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        data_key: data_key(&c.id),
        id: c.id,
        batch_id: c.batch_id,
        last_seq: c.last_seq,
        producer_view: c.producer_view,
        data_size: c.size,
        data_crc32c: c.crc32c,
        created_ms: 0,
    };
    tracing::info!(leader = addr, id = %manifest.id, bytes = data.len(), "fetched the leader's snapshot");
    Ok((manifest, data.freeze()))
}

/// The standby's [`SnapshotSource`]: the current leader (from the coordinator's view), with the admin credential
/// of the cluster secret (if any) and the master's TLS client side.
pub(super) struct LeaderSnapshots {
    pub coordinator: Arc<dyn LeaderCoordinator>,
    pub credential: Option<Credential>,
    pub tls: Option<Arc<TlsClient>>,
    /// This candidate's own address (it never fetches from itself).
    pub own: String,
}

impl SnapshotSource for LeaderSnapshots {
    fn fetch(&self) -> crate::ha::role::FetchFuture<'_> {
        Box::pin(async move {
            let view = self.coordinator.read_view().await.map_err(|e| FetchError::NoLeader(e.to_string()))?;
            let Some(view) = view.filter(|v| v.leader != self.own) else {
                return Err(FetchError::NoLeader("no master leads".into()));
            };
            fetch_snapshot(&view.leader, self.credential.as_ref(), self.tls.as_deref()).await
        })
    }
}
