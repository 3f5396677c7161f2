//! The framed wire protocol shared by both planes (see `docs/protocol.md`).
//!
//! ```text
//! frame   := length:u32be  header_len:u32be  header[header_len]  payload[length - 4 - header_len]
//! header  := postcard(Envelope<T>)   — request id + a small typed message
//! payload := raw bytes (object data), never passed through serde
//! ```
//! The length is checked against the connection's limit *before* any buffer is reserved; a header must fit
//! in the frame; anything else is [`WireError::Malformed`]. A connection opens with [`Hello`] answered by a
//! [`HelloReply`] (request id 0). Request ids start at 1; after the hello a server frame with id 0 carries an
//! [`ErrorFrame`] and the connection closes.

use crate::error::ErrorCode;
use crate::ids::ClientId;
use crate::key::MAX_KEY_LEN;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::de::{DeserializeOwned, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::marker::PhantomData;
use tokio_util::codec::{Decoder, Encoder};

/// First bytes of every `Hello`.
pub const MAGIC: [u8; 4] = *b"CRSC";
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 7;
/// The oldest version this build accepts (3 added authentication to the hello, 4 data-plane tickets, 5 grants
/// shared by a batch's ranges, 6 the disk tier: disk segments and replicas, `ReplicateConfig::offload`, disk tasks;
/// 7 names the write a PutEnd or PutRevoke finishes).
pub const MIN_PROTOCOL_VERSION: u16 = 7;
/// Most items accepted in one batch request.
pub const MAX_BATCH: usize = 65_536;
/// Largest frame header accepted (a batch of keys travels in the header; the frame limit bounds it too).
pub const MAX_HEADER: usize = 16 << 20;
/// Largest header accepted on the data plane (a transfer request is a few dozen bytes).
pub const MAX_DATA_HEADER: usize = 4 << 10;
/// Largest hello frame accepted before a connection is established.
pub const MAX_HELLO_FRAME: usize = 64 << 10;
/// Bytes before the header: frame length (u32) + header length (u32).
pub const FRAME_PREFIX: usize = 8;

/// Capability flags exchanged in the hello; a connection uses the intersection.
pub mod caps {
    /// Object checksums (crc32c) travel with writes and replica lists.
    pub const CRC32C: u64 = 1 << 0;
    /// Batch requests.
    pub const BATCH: u64 = 1 << 1;
    /// Large transfers may be striped over several connections.
    pub const STRIPING: u64 = 1 << 2;
    /// On a storage node's local lane (a peer on its host): `TransferRequest::Locate`, the client copying the
    /// bytes itself between the two processes' memory.
    pub const LOCAL_COPY: u64 = 1 << 3;
    /// Everything this build supports.
    pub const ALL: u64 = CRC32C | BATCH | STRIPING | LOCAL_COPY;
}

/// Per-connection limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Largest frame (header + payload) accepted.
    pub max_frame: u32,
}

impl Limits {
    /// Control plane: small messages and batches of descriptors.
    pub const CONTROL: Limits = Limits { max_frame: 16 << 20 };
    /// Data plane: transfers up to 64 MiB per frame plus a header.
    pub const DATA: Limits = Limits { max_frame: (64 << 20) + (64 << 10) };
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Socket error.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The peer announced a frame beyond the limit (nothing was allocated for it).
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge {
        /// Announced length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The frame's structure is wrong (header longer than the frame, bad hello, ...).
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    /// The header did not decode as the expected message.
    #[error("undecodable header: {0}")]
    Decode(String),
    /// The peer speaks no version we accept.
    #[error("unsupported protocol version {0}")]
    Version(u16),
    /// The connection closed.
    #[error("connection closed")]
    Closed,
}

impl WireError {
    /// The wire code reported for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            WireError::Io(_) | WireError::Closed => ErrorCode::RpcFail,
            WireError::FrameTooLarge { .. } | WireError::Malformed(_) | WireError::Decode(_) => {
                ErrorCode::InvalidParams
            }
            WireError::Version(_) => ErrorCode::InvalidVersion,
        }
    }
}

/// One frame: an encoded header and a raw payload.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frame {
    /// postcard-encoded [`Envelope`].
    pub header: Bytes,
    /// Raw payload (object bytes), possibly empty.
    pub payload: Bytes,
}

/// A request id and a typed message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// Pairs a response with its request (multiplexing and pipelining).
    pub id: u64,
    /// The message.
    pub body: T,
}

impl Frame {
    /// Encodes `body` under request id `id` with `payload`.
    pub fn encode<T: Serialize>(id: u64, body: &T, payload: Bytes) -> Result<Frame, WireError> {
        let header = postcard::to_stdvec(&Envelope { id, body }).map_err(|e| WireError::Decode(e.to_string()))?;
        if header.len() > MAX_HEADER {
            return Err(WireError::Malformed("header too long"));
        }
        Ok(Frame { header: Bytes::from(header), payload })
    }

    /// Decodes the header as `Envelope<T>`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<Envelope<T>, WireError> {
        postcard::from_bytes(&self.header).map_err(|e| WireError::Decode(e.to_string()))
    }

    /// The request id alone (the header's leading field), for routing a reply before its body type is known.
    pub fn request_id(&self) -> Result<u64, WireError> {
        #[derive(Deserialize)]
        struct IdOnly {
            id: u64,
        }
        postcard::take_from_bytes::<IdOnly>(&self.header)
            .map(|(v, _)| v.id)
            .map_err(|e| WireError::Decode(e.to_string()))
    }

    /// Total bytes on the wire.
    pub fn wire_len(&self) -> usize {
        FRAME_PREFIX + self.header.len() + self.payload.len()
    }
}

/// The 8-byte prefix of a frame with this header and payload length (for vectored writes that send the
/// payload straight from segment memory).
pub fn frame_prefix(header_len: usize, payload_len: usize) -> Result<[u8; FRAME_PREFIX], WireError> {
    if header_len > MAX_HEADER {
        return Err(WireError::Malformed("header too long"));
    }
    let header = u32::try_from(header_len).map_err(|_| WireError::Malformed("header too long"))?;
    let total = u32::try_from(4 + header_len + payload_len).map_err(|_| WireError::Malformed("frame too long"))?;
    let mut out = [0u8; FRAME_PREFIX];
    out[..4].copy_from_slice(&total.to_be_bytes());
    out[4..].copy_from_slice(&header.to_be_bytes());
    Ok(out)
}

/// A frame's shape as its prefix announces it, checked against the connection's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameShape {
    /// Bytes of the encoded [`Envelope`].
    pub header_len: usize,
    /// Raw payload bytes after the header.
    pub payload_len: usize,
}

impl FrameShape {
    /// Checks a frame's announced length (the prefix's first field) against `max_frame` before anything is read
    /// or reserved for it; returns the bytes after the header-length field.
    pub fn check_len(len: u32, max_frame: usize) -> Result<usize, WireError> {
        let len = len as usize;
        if len > max_frame {
            return Err(WireError::FrameTooLarge { len, max: max_frame });
        }
        len.checked_sub(4).ok_or(WireError::Malformed("frame shorter than its header length"))
    }

    /// Splits the `body` bytes that follow the header-length field into header and payload.
    pub fn split(body: usize, header_len: u32) -> Result<FrameShape, WireError> {
        let header_len = header_len as usize;
        let payload_len = body.checked_sub(header_len).ok_or(WireError::Malformed("header longer than the frame"))?;
        Ok(FrameShape { header_len, payload_len })
    }
}

/// Room for a frame prefix and a usual header on the stack (a data-plane request header is at most ~80 bytes
/// with a grant slot it names; one carrying a grant of many ranges is encoded on the heap).
pub const HEAD_CAP: usize = 192;

/// A frame's prefix and header, for frames whose payload is written from elsewhere (segment or caller memory) in
/// the same vectored write: on the stack unless the header is larger than [`HEAD_CAP`] allows.
pub struct Head {
    buf: HeadBuf,
}

enum HeadBuf {
    Inline([u8; HEAD_CAP], usize),
    Heap(Vec<u8>),
}

impl Head {
    /// Encodes `Envelope { id, body }` as a header for a frame carrying `payload_len` payload bytes.
    pub fn encode<T: Serialize>(id: u64, body: &T, payload_len: usize) -> Result<Head, WireError> {
        let envelope = Envelope { id, body };
        let mut buf = [0u8; HEAD_CAP];
        let buf = match postcard::to_slice(&envelope, &mut buf[FRAME_PREFIX..]) {
            Ok(header) => {
                let header_len = header.len();
                buf[..FRAME_PREFIX].copy_from_slice(&frame_prefix(header_len, payload_len)?);
                HeadBuf::Inline(buf, FRAME_PREFIX + header_len)
            }
            Err(postcard::Error::SerializeBufferFull) => {
                let header = postcard::to_stdvec(&envelope).map_err(|e| WireError::Decode(e.to_string()))?;
                let mut out = Vec::with_capacity(FRAME_PREFIX + header.len());
                out.extend_from_slice(&frame_prefix(header.len(), payload_len)?);
                out.extend_from_slice(&header);
                HeadBuf::Heap(out)
            }
            Err(e) => return Err(WireError::Decode(e.to_string())),
        };
        Ok(Head { buf })
    }

    /// The encoded prefix and header.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.buf {
            HeadBuf::Inline(buf, len) => &buf[..*len],
            HeadBuf::Heap(buf) => buf,
        }
    }
}

/// Codec for [`Frame`]s with a maximum frame length enforced before allocation.
#[derive(Debug)]
pub struct FrameCodec {
    max: usize,
}

impl FrameCodec {
    /// A codec enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        Self { max: limits.max_frame as usize }
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = WireError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, WireError> {
        let Some(prefix) = src.first_chunk::<FRAME_PREFIX>() else {
            // The length alone is checked as soon as it is in, so an oversized frame is refused at once.
            if let Some(len) = src.first_chunk::<4>() {
                FrameShape::check_len(u32::from_be_bytes(*len), self.max)?;
            }
            return Ok(None);
        };
        let len: [u8; 4] = [prefix[0], prefix[1], prefix[2], prefix[3]];
        let header_len = u32::from_be_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]);
        let shape = FrameShape::split(FrameShape::check_len(u32::from_be_bytes(len), self.max)?, header_len)?;
        let total = FRAME_PREFIX + shape.header_len + shape.payload_len;
        if src.len() < total {
            // Within the limit: room for the rest of the frame, so it lands in one buffer.
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(FRAME_PREFIX);
        let header = src.split_to(shape.header_len).freeze();
        let payload = src.split_to(shape.payload_len).freeze();
        Ok(Some(Frame { header, payload }))
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = WireError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), WireError> {
        let len = 4 + frame.header.len() + frame.payload.len();
        if len > self.max {
            return Err(WireError::FrameTooLarge { len, max: self.max });
        }
        dst.reserve(4 + len);
        dst.put_slice(&frame_prefix(frame.header.len(), frame.payload.len())?);
        dst.put_slice(&frame.header);
        dst.put_slice(&frame.payload);
        Ok(())
    }
}

/// Who opens a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerRole {
    /// A client library instance.
    Client,
    /// A storage node.
    Node,
    /// An admin tool.
    Admin,
}

/// The first frame of every connection (request id 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`MAGIC`].
    pub magic: [u8; 4],
    /// Newest version the peer speaks.
    pub version: u16,
    /// Oldest version the peer speaks.
    pub min_version: u16,
    /// Capability flags ([`caps`]).
    pub capabilities: u64,
    /// Who is connecting.
    pub role: PeerRole,
    /// The connecting client, if it has an identity.
    pub client_id: Option<ClientId>,
    /// The principal the peer will prove it speaks for, when it has a credential.
    pub auth: Option<AuthHello>,
}

/// Size of the nonces and MACs of the authenticated hello (HMAC-SHA256).
pub const AUTH_LEN: usize = 32;

/// The client's half of an authenticated hello: who it claims to be and its fresh nonce.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthHello {
    /// The principal's text form (`admin`, `node`, `node:NAME`, `tenant:NAME`).
    pub principal: String,
    /// Random per connection, so the server's proof cannot be replayed to another client.
    pub nonce: [u8; AUTH_LEN],
    /// On the data plane: the expiry (Unix ms) of the ticket the peer proves (its session key derives from
    /// it); `None` on the control plane, where the peer proves its credential itself.
    pub ticket_expires_ms: Option<u64>,
}

/// The client's proof (request id 0, after a [`HelloAck`] with a challenge): HMAC of the handshake under its
/// credential's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloProof {
    /// The MAC.
    pub mac: [u8; AUTH_LEN],
}

/// The server's answer to a [`HelloProof`]: its own proof that it holds the cluster's secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthAck {
    /// The server's MAC of the handshake.
    pub mac: [u8; AUTH_LEN],
}

/// The reply to a [`HelloProof`] (request id 0): the server's proof, or why authentication failed.
pub type AuthReply = Result<AuthAck, ErrorFrame>;

impl Hello {
    /// This build's hello.
    pub fn new(role: PeerRole, client_id: Option<ClientId>) -> Self {
        Self {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            min_version: MIN_PROTOCOL_VERSION,
            capabilities: caps::ALL,
            role,
            client_id,
            auth: None,
        }
    }

    /// The server's answer: the highest common version and the common capabilities.
    pub fn negotiate(&self, limits: Limits) -> Result<HelloAck, WireError> {
        if self.magic != MAGIC {
            return Err(WireError::Malformed("bad magic"));
        }
        let version = self.version.min(PROTOCOL_VERSION);
        if version < self.min_version.max(MIN_PROTOCOL_VERSION) {
            return Err(WireError::Version(self.version));
        }
        Ok(HelloAck { version, capabilities: self.capabilities & caps::ALL, limits, challenge: None })
    }
}

/// The server's reply to [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloAck {
    /// The version both sides use.
    pub version: u16,
    /// The capabilities both sides have.
    pub capabilities: u64,
    /// The server's limits.
    pub limits: Limits,
    /// The server's nonce when it authenticates peers: the client answers with a [`HelloProof`].
    pub challenge: Option<[u8; AUTH_LEN]>,
}

/// The reply to a [`Hello`] (request id 0): the negotiated parameters or why the connection is refused.
pub type HelloReply = Result<HelloAck, ErrorFrame>;

/// The body of an error frame: sent for a malformed or refused frame before the connection closes, as the
/// reply to a request that cannot be decoded, and as a failed request's reply (what failed and why, naming its
/// subject: the key, the segment, the limit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorFrame {
    /// What went wrong.
    pub code: ErrorCode,
    /// Human-readable detail.
    pub message: String,
}

impl ErrorFrame {
    /// A frame with no detail beyond its code.
    pub fn bare(code: ErrorCode) -> Self {
        Self { code, message: String::new() }
    }
}

impl std::fmt::Display for ErrorFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.message.is_empty() {
            f.write_str(self.code.name())
        } else {
            write!(f, "{}: {}", self.code.name(), self.message)
        }
    }
}

/// A key as received: oversized keys are recognised from their length prefix and never allocated, so one bad
/// key in a batch fails only its own slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireKey {
    /// A key within the length limit (may still be empty: the receiver validates).
    Key(String),
    /// A key of this many bytes, over [`MAX_KEY_LEN`]; its bytes were skipped.
    TooLong(usize),
}

impl WireKey {
    /// The key, or `INVALID_KEY` for an oversized one.
    pub fn as_str(&self) -> Result<&str, ErrorCode> {
        match self {
            WireKey::Key(k) => Ok(k),
            WireKey::TooLong(_) => Err(ErrorCode::InvalidKey),
        }
    }
}

impl From<&str> for WireKey {
    fn from(s: &str) -> Self {
        WireKey::Key(s.to_owned())
    }
}

impl Serialize for WireKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            WireKey::Key(k) => s.serialize_str(k),
            // Never produced by a sender; encode as an over-long placeholder would waste bytes, so send "".
            WireKey::TooLong(_) => s.serialize_str(""),
        }
    }
}

impl<'de> Deserialize<'de> for WireKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = WireKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<WireKey, E> {
                Ok(if v.len() > MAX_KEY_LEN { WireKey::TooLong(v.len()) } else { WireKey::Key(v.to_owned()) })
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<WireKey, E> {
                self.visit_str(v)
            }
        }
        d.deserialize_str(V)
    }
}

/// A batch: at most [`MAX_BATCH`] items; a longer length prefix is refused before any item is allocated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Batch<T>(pub Vec<T>);

impl<T> Batch<T> {
    /// Wraps a vector (senders check the length themselves; receivers enforce it).
    pub fn new(v: Vec<T>) -> Self {
        Self(v)
    }
}

impl<T> Default for Batch<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Batch<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Batch<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a sequence of at most {MAX_BATCH} items")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Batch<T>, A::Error> {
                let hint = seq.size_hint().unwrap_or(0);
                if hint > MAX_BATCH {
                    return Err(serde::de::Error::custom(format!("batch of {hint} exceeds {MAX_BATCH}")));
                }
                let mut v = Vec::with_capacity(hint);
                while let Some(x) = seq.next_element()? {
                    if v.len() == MAX_BATCH {
                        return Err(serde::de::Error::custom("batch too long"));
                    }
                    v.push(x);
                }
                Ok(Batch(v))
            }
        }
        d.deserialize_seq(V(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(frame: Frame, limits: Limits) -> Result<Option<Frame>, WireError> {
        let mut codec = FrameCodec::new(limits);
        let mut buf = BytesMut::new();
        codec.encode(frame, &mut buf)?;
        codec.decode(&mut buf)
    }

    #[test]
    fn frames_round_trip_with_raw_payloads() {
        let f = Frame::encode(7, &"hello", Bytes::from_static(b"\x00\x01payload")).unwrap();
        let back = roundtrip(f.clone(), Limits::CONTROL).unwrap().unwrap();
        assert_eq!(back, f);
        assert_eq!(back.decode::<String>().unwrap(), Envelope { id: 7, body: "hello".to_string() });
        assert_eq!(back.request_id().unwrap(), 7);
        let big = Frame::encode(u64::MAX - 1, &(), Bytes::new()).unwrap();
        assert_eq!(big.request_id().unwrap(), u64::MAX - 1);
        assert_eq!(f.wire_len(), FRAME_PREFIX + f.header.len() + 9);
    }

    #[test]
    fn heads_fit_the_largest_data_request_and_announce_their_payload() {
        let id = crate::SegmentId::random();
        let grant = crate::transfer::GrantUse::Held { slot: u8::MAX, range: u16::MAX };
        let req = crate::transfer::TransferRequest::Read {
            segment: id,
            offset: u64::MAX,
            length: u64::MAX,
            grant: Some(grant),
        };
        let head = Head::encode(u64::MAX, &req, 1 << 26).unwrap();
        assert!(head.as_bytes().len() <= HEAD_CAP * 3 / 4, "{}", head.as_bytes().len());
        let len = u32::from_be_bytes(head.as_bytes()[..4].try_into().unwrap());
        let body = FrameShape::check_len(len, usize::MAX).unwrap();
        let header_len = u32::from_be_bytes(head.as_bytes()[4..8].try_into().unwrap());
        let shape = FrameShape::split(body, header_len).unwrap();
        assert_eq!(shape, FrameShape { header_len: head.as_bytes().len() - FRAME_PREFIX, payload_len: 1 << 26 });
        assert!(matches!(FrameShape::check_len(3, 1024), Err(WireError::Malformed(_))));
        assert!(matches!(FrameShape::check_len(2048, 1024), Err(WireError::FrameTooLarge { len: 2048, max: 1024 })));
        assert!(matches!(FrameShape::split(10, 11), Err(WireError::Malformed(_))));
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let mut codec = FrameCodec::new(Limits::CONTROL);
        let mut buf = BytesMut::new();
        codec.encode(Frame::encode(1, &1u32, Bytes::from_static(b"abc")).unwrap(), &mut buf).unwrap();
        let whole = buf.split();
        let mut part = BytesMut::from(&whole[..5]);
        assert!(codec.decode(&mut part).unwrap().is_none());
        part.extend_from_slice(&whole[5..]);
        assert!(codec.decode(&mut part).unwrap().is_some());
    }

    #[test]
    fn oversized_and_malformed_frames_are_refused_before_allocation() {
        let mut codec = FrameCodec::new(Limits { max_frame: 1024 });
        let mut buf = BytesMut::from(&u32::MAX.to_be_bytes()[..]);
        assert!(
            matches!(codec.decode(&mut buf), Err(WireError::FrameTooLarge { len, .. }) if len == u32::MAX as usize)
        );
        assert!(buf.capacity() < 1024, "nothing reserved for the announced frame");
        // Header length larger than the frame.
        let mut buf = BytesMut::new();
        buf.put_u32(6);
        buf.put_u32(100);
        buf.put_u16(0);
        assert!(matches!(codec.decode(&mut buf), Err(WireError::Malformed(_))));
        // Frame too short to hold a header length.
        let mut buf = BytesMut::new();
        buf.put_u32(3);
        buf.put_slice(&[0, 0, 0]);
        assert!(matches!(codec.decode(&mut buf), Err(WireError::Malformed(_))));
        // Encoding over the limit is refused too.
        let big = Frame { header: Bytes::new(), payload: Bytes::from(vec![0u8; 2048]) };
        assert!(matches!(codec.encode(big, &mut BytesMut::new()), Err(WireError::FrameTooLarge { .. })));
        // A header that does not decode as the expected type.
        let f = Frame { header: Bytes::from_static(&[0xff, 0xff, 0xff]), payload: Bytes::new() };
        assert!(matches!(f.decode::<String>(), Err(WireError::Decode(_))));
    }

    #[test]
    fn hello_negotiates_version_and_capabilities() {
        let h = Hello::new(PeerRole::Client, None);
        let ack = h.negotiate(Limits::CONTROL).unwrap();
        assert_eq!((ack.version, ack.capabilities), (PROTOCOL_VERSION, caps::ALL));
        let newer = Hello {
            version: PROTOCOL_VERSION + 5,
            min_version: PROTOCOL_VERSION,
            capabilities: 1 << 40 | caps::CRC32C,
            ..h.clone()
        };
        let ack = newer.negotiate(Limits::CONTROL).unwrap();
        assert_eq!((ack.version, ack.capabilities), (PROTOCOL_VERSION, caps::CRC32C));
        let future = Hello { version: PROTOCOL_VERSION + 5, min_version: PROTOCOL_VERSION + 1, ..h.clone() };
        assert!(matches!(future.negotiate(Limits::CONTROL), Err(WireError::Version(_))));
        let bad = Hello { magic: *b"HTTP", ..h };
        assert_eq!(bad.negotiate(Limits::CONTROL).unwrap_err().code(), ErrorCode::InvalidParams);
    }

    #[test]
    fn oversized_keys_fail_only_their_slot_and_batches_are_bounded() {
        let keys = vec!["ok".to_string(), "k".repeat(MAX_KEY_LEN + 1), String::new()];
        let bytes = postcard::to_stdvec(&keys).unwrap();
        let back: Batch<WireKey> = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.0[0], WireKey::Key("ok".into()));
        assert_eq!(back.0[1], WireKey::TooLong(MAX_KEY_LEN + 1));
        assert_eq!(back.0[1].as_str(), Err(ErrorCode::InvalidKey));
        assert_eq!(back.0[2], WireKey::Key(String::new()));
        // A length prefix beyond MAX_BATCH is refused without reading the items.
        let mut evil = Vec::new();
        let mut n = MAX_BATCH as u64 + 1;
        while n >= 0x80 {
            evil.push((n as u8) | 0x80);
            n >>= 7;
        }
        evil.push(n as u8);
        assert!(postcard::from_bytes::<Batch<u8>>(&evil).is_err());
        // A huge claimed length with no data behind it fails cleanly too.
        assert!(postcard::from_bytes::<Batch<u8>>(&[0xff, 0xff, 0x03]).is_err());
    }
}
