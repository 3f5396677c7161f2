//! The hello handshake every connection starts with: the client sends [`Hello`] under request id 0, the
//! server answers with a [`HelloReply`] (the negotiated version, capabilities and its limits, or why it refuses
//! the connection) under id 0 too. Both sides read the other's hello frame under [`MAX_HELLO_FRAME`] whatever
//! the connection's later limit, so a peer that has not introduced itself cannot make anyone reserve more.
//!
//! Each side reads exactly the hello frame and nothing after it, so requests a client pipelines behind its
//! hello stay in the socket for the connection's own reader.

use crate::frame::{self, ShapeError};
use crescent_proto::ClientId;
use crescent_proto::wire::{
    Envelope, ErrorFrame, Head, Hello, HelloAck, HelloReply, Limits, MAX_HELLO_FRAME, PeerRole, WireError,
};
use serde::de::DeserializeOwned;
use std::io;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long a server waits for a new connection's hello once it is accepted.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The socket failed, or closed mid-hello.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// The other side broke the protocol (a server answered such a client with a refusal before closing).
    #[error(transparent)]
    Protocol(WireError),
    /// The server refused this client.
    #[error("refused: {}: {}", .0.code, .0.message)]
    Refused(ErrorFrame),
    /// The hello did not complete in time.
    #[error("hello timed out")]
    Timeout,
}

/// Client side: sends this build's hello for `role` (and `client`, if it has an identity) and reads the
/// server's answer. The caller bounds the wait (connecting usually has a deadline of its own).
pub async fn open<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    role: PeerRole,
    client: Option<ClientId>,
) -> Result<HelloAck, HandshakeError> {
    let hello = Head::encode(0, &Hello::new(role, client), 0).map_err(HandshakeError::Protocol)?;
    io.write_all(hello.as_bytes()).await?;
    io.flush().await?;
    match read_hello_frame::<_, HelloReply>(io).await? {
        Some(Ok(ack)) => Ok(ack),
        Some(Err(refusal)) => Err(HandshakeError::Refused(refusal)),
        None => Err(HandshakeError::Io(io::ErrorKind::UnexpectedEof.into())),
    }
}

/// Server side: reads a new connection's hello and answers it with `limits`, all within `deadline`; `Ok(None)` when
/// the peer left without sending a byte. A hello that breaks the protocol (too large, undecodable, wrong magic
/// or version) is returned as [`HandshakeError::Protocol`] with nothing written yet, so the server can count
/// it before the peer learns of it; the server then answers it with [`refuse`].
pub async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    limits: Limits,
    deadline: Duration,
) -> Result<Option<Hello>, HandshakeError> {
    let handshake = async {
        let Some(hello) = read_hello_frame::<_, Hello>(io).await? else {
            return Ok(None);
        };
        let ack = hello.negotiate(limits).map_err(HandshakeError::Protocol)?;
        let reply = Head::encode(0, &HelloReply::Ok(ack), 0).map_err(HandshakeError::Protocol)?;
        io.write_all(reply.as_bytes()).await?;
        io.flush().await?;
        Ok(Some(hello))
    };
    tokio::time::timeout(deadline, handshake).await.map_err(|_| HandshakeError::Timeout)?
}

/// Server side: answers a hello that broke the protocol with why, and closes the connection gracefully.
pub async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S, e: &WireError) {
    let reply: HelloReply = Err(ErrorFrame { code: e.code(), message: e.to_string() });
    frame::refuse(io, &[], &reply).await;
}

/// Reads one hello-sized frame with no payload and decodes its body; `Ok(None)` on a clean end of stream
/// before its first byte.
async fn read_hello_frame<S: AsyncRead + Unpin, T: DeserializeOwned>(io: &mut S) -> Result<Option<T>, HandshakeError> {
    let mut first = [0u8; 1];
    if io.read(&mut first).await? == 0 {
        return Ok(None);
    }
    let mut reader = (&first[..]).chain(&mut *io);
    let shape = match frame::read_shape(&mut reader, MAX_HELLO_FRAME).await {
        Ok(shape) => shape,
        Err(ShapeError::Io(e)) => return Err(e.into()),
        Err(ShapeError::Wire(e)) => return Err(HandshakeError::Protocol(e)),
    };
    if shape.payload_len != 0 {
        return Err(HandshakeError::Protocol(WireError::Malformed("hello carries a payload")));
    }
    let mut header = vec![0u8; shape.header_len];
    reader.read_exact(&mut header).await?;
    let env: Envelope<T> =
        postcard::from_bytes(&header).map_err(|e| HandshakeError::Protocol(WireError::Decode(e.to_string())))?;
    if env.id != 0 {
        return Err(HandshakeError::Protocol(WireError::Malformed("a hello travels under request id 0")));
    }
    Ok(Some(env.body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crescent_proto::ErrorCode;

    #[tokio::test]
    async fn a_client_and_a_server_agree_and_pipelined_bytes_stay_unread() {
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let id = ClientId::random();
        let (ack, hello) = tokio::join!(
            async {
                let ack = open(&mut client, PeerRole::Node, Some(id)).await.unwrap();
                client.write_all(b"next").await.unwrap();
                ack
            },
            answer(&mut server, Limits::DATA, Duration::from_secs(10))
        );
        let hello = hello.unwrap().unwrap();
        assert_eq!((hello.role, hello.client_id), (PeerRole::Node, Some(id)));
        assert_eq!(ack.limits, Limits::DATA);
        let mut next = [0u8; 4];
        server.read_exact(&mut next).await.unwrap();
        assert_eq!(&next, b"next", "the server read the hello and nothing after it");
    }

    #[tokio::test]
    async fn bad_hellos_are_refused_with_a_reason_and_silence_times_out() {
        // Wrong magic: the client is told why.
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let bad = Hello { magic: *b"HTTP", ..Hello::new(PeerRole::Client, None) };
        client.write_all(Head::encode(0, &bad, 0).unwrap().as_bytes()).await.unwrap();
        let served = answer(&mut server, Limits::CONTROL, Duration::from_secs(10)).await;
        let Err(HandshakeError::Protocol(e)) = served else { panic!("{served:?}") };
        let (_, reply) = tokio::join!(refuse(&mut server, &e), async move {
            read_hello_frame::<_, HelloReply>(&mut client).await.unwrap().unwrap()
        });
        assert_eq!(reply.unwrap_err().code, ErrorCode::InvalidParams);
        // A frame announced beyond the hello limit is refused on its length alone.
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        client.write_all(&(16u32 << 20).to_be_bytes()).await.unwrap();
        let served = answer(&mut server, Limits::CONTROL, Duration::from_secs(10)).await;
        assert!(matches!(served, Err(HandshakeError::Protocol(WireError::FrameTooLarge { .. }))), "{served:?}");
        // A peer that connects and says nothing.
        let (_client, mut server) = tokio::io::duplex(1 << 16);
        let served = answer(&mut server, Limits::CONTROL, Duration::from_millis(20)).await;
        assert!(matches!(served, Err(HandshakeError::Timeout)), "{served:?}");
        // A peer that leaves at once.
        let (client, mut server) = tokio::io::duplex(1 << 16);
        drop(client);
        assert!(answer(&mut server, Limits::CONTROL, Duration::from_secs(10)).await.unwrap().is_none());
    }
}
