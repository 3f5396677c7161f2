//! The hello handshake every connection starts with: the client sends [`Hello`] under request id 0, the
//! server answers with a [`HelloReply`] (the negotiated version, capabilities and its limits, or why it refuses
//! the connection) under id 0 too. Both sides read the other's hello frame under [`MAX_HELLO_FRAME`] whatever
//! the connection's later limit, so a peer that has not introduced itself cannot make anyone reserve more.
//!
//! Each side reads exactly the hello frame and nothing after it, so requests a client pipelines behind its
//! hello stay in the socket for the connection's own reader.

use crate::auth::{self, AuthFailure, Credential, Keyring, Plane, SecretId};
use crate::frame::{self, ShapeError};
use crate::host::NodeKeys;
use crescent_proto::wire::{
    AuthAck, AuthHello, AuthReply, Envelope, ErrorFrame, FRAME_PREFIX, Hello, HelloAck, HelloProof, HelloReply, Limits,
    MAX_HELLO_FRAME, PeerRole, WireError, frame_prefix,
};
use crescent_proto::{ClientId, ErrorCode, Principal};
use serde::Serialize;
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
    /// The server refused this client (or, with `AUTHENTICATION_FAILED`, did not prove itself to it).
    #[error("refused: {}: {}", .0.code, .0.message)]
    Refused(ErrorFrame),
    /// Server side: the peer did not authenticate; it has been told why and the connection closed.
    #[error("{0}")]
    Unauthenticated(AuthFailure),
    /// The hello did not complete in time.
    #[error("hello timed out")]
    Timeout,
}

/// A peer the server admitted: its hello and, when the server authenticates, the principal it proved.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The peer's hello.
    pub hello: Hello,
    /// Who it proved it is (`None` on a server without a keyring).
    pub principal: Option<Principal>,
    /// On the master: the secret the peer's credential derives from (its grants and tickets use the same).
    pub secret: Option<SecretId>,
}

/// What a server checks a peer's proof against.
#[derive(Debug, Clone, Copy)]
pub enum Verifier<'a> {
    /// The master's: the cluster secret; a peer proves its own credential.
    Secret(&'a Keyring),
    /// A host of segments': its own keys; a peer proves a ticket the master issued it for this host.
    Host(&'a NodeKeys),
}

/// Client side: sends this build's hello for `role` (and `client`, if it has an identity) to a server of `plane`,
/// proves `credential` (to a storage node: a ticket) when it has one, and reads the server's answer. A client with a
/// credential refuses a server that does not prove the same key back (the master derives it from the cluster
/// secret, a host from its ticket key). The caller bounds the wait (connecting usually has a deadline of its own).
pub async fn open<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    plane: Plane,
    role: PeerRole,
    client: Option<ClientId>,
    credential: Option<&Credential>,
) -> Result<HelloAck, HandshakeError> {
    let mut hello = Hello::new(role, client);
    if let Some(cred) = credential {
        hello.auth = Some(AuthHello {
            principal: cred.principal().to_string(),
            nonce: auth::nonce()?,
            ticket_expires_ms: cred.ticket_expires_ms(),
        });
    }
    let frame = encode(&hello)?;
    io.write_all(&frame).await?;
    io.flush().await?;
    let ack = match read_hello_frame::<_, HelloReply>(io).await? {
        Some((Ok(ack), _)) => ack,
        Some((Err(refusal), _)) => return Err(HandshakeError::Refused(refusal)),
        None => return Err(HandshakeError::Io(io::ErrorKind::UnexpectedEof.into())),
    };
    let Some(cred) = credential else { return Ok(ack) };
    let Some(challenge) = ack.challenge else {
        return Err(unproven("the server does not authenticate (it runs without a cluster secret)"));
    };
    let transcript = auth::transcript(plane, &frame[FRAME_PREFIX..], &challenge);
    io.write_all(&encode(&HelloProof { mac: cred.client_mac(&transcript) })?).await?;
    io.flush().await?;
    match read_hello_frame::<_, AuthReply>(io).await? {
        Some((Ok(AuthAck { mac }), _)) if cred.verify_server(&transcript, &mac) => Ok(ack),
        Some((Ok(_), _)) => Err(unproven("the server's proof is wrong: it does not hold this cluster's secret")),
        Some((Err(refusal), _)) => Err(HandshakeError::Refused(refusal)),
        None => Err(HandshakeError::Io(io::ErrorKind::UnexpectedEof.into())),
    }
}

fn unproven(why: &str) -> HandshakeError {
    HandshakeError::Refused(ErrorFrame { code: ErrorCode::AuthenticationFailed, message: why.to_owned() })
}

/// Server side: reads a new connection's hello and answers it with `limits`, all within `deadline`; `Ok(None)`
/// when the peer left without sending a byte. With a verifier the peer must prove a credential of the keyring
/// (the master) or a ticket for this host (a storage node): one that does not is refused (`AUTHENTICATION_FAILED`, the connection closed) and returned as
/// [`HandshakeError::Unauthenticated`]. A hello that breaks the protocol (too large, undecodable, wrong magic or
/// version) is returned as [`HandshakeError::Protocol`] with nothing written yet, so the server can count it
/// before the peer learns of it; the server then answers it with [`refuse`].
pub async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    plane: Plane,
    limits: Limits,
    deadline: Duration,
    verifier: Option<Verifier<'_>>,
) -> Result<Option<Admitted>, HandshakeError> {
    let handshake = async {
        let Some((hello, header)) = read_hello_frame::<_, Hello>(io).await? else {
            return Ok(None);
        };
        let mut ack = hello.negotiate(limits).map_err(HandshakeError::Protocol)?;
        let Some(verifier) = verifier else {
            io.write_all(&encode(&HelloReply::Ok(ack))?).await?;
            io.flush().await?;
            return Ok(Some(Admitted { hello, principal: None, secret: None }));
        };
        let (principal, ticket) = match admit_principal(&hello, verifier) {
            Ok(p) => p,
            Err(why) => return Err(refuse_auth(io, why).await),
        };
        let challenge = auth::nonce()?;
        ack.challenge = Some(challenge);
        io.write_all(&encode(&HelloReply::Ok(ack))?).await?;
        io.flush().await?;
        let Some((HelloProof { mac }, _)) = read_hello_frame::<_, HelloProof>(io).await? else {
            return Err(HandshakeError::Io(io::ErrorKind::UnexpectedEof.into()));
        };
        let transcript = auth::transcript(plane, &header, &challenge);
        let verified = match (verifier, ticket) {
            (Verifier::Secret(ring), _) => auth::verify_client(ring, &principal, &transcript, &mac)
                .map(|(proof, secret)| (proof, Some(secret)))
                .ok_or_else(|| AuthFailure::BadProof(principal.clone())),
            (Verifier::Host(keys), expires) => {
                let client = hello.client_id.unwrap_or(ClientId::from_u64_pair(0, 0));
                let now = crate::grant::unix_ms();
                keys.verify_ticket(&principal, client, expires.unwrap_or(0), &transcript, &mac, now)
                    .map(|proof| (proof, None))
            }
        };
        let (proof, secret) = match verified {
            Ok(v) => v,
            Err(why) => return Err(refuse_auth(io, why).await),
        };
        io.write_all(&encode(&AuthReply::Ok(AuthAck { mac: proof.0 }))?).await?;
        io.flush().await?;
        Ok(Some(Admitted { hello, principal: Some(principal), secret }))
    };
    tokio::time::timeout(deadline, handshake).await.map_err(|_| HandshakeError::Timeout)?
}

/// The principal a hello claims, if it claims a valid one, and its ticket's expiry; a ticket where a credential
/// belongs (the master) or a credential where a ticket does (a host) is refused before any proof.
fn admit_principal(hello: &Hello, verifier: Verifier<'_>) -> Result<(Principal, Option<u64>), AuthFailure> {
    let claim = hello.auth.as_ref().ok_or(AuthFailure::Missing)?;
    let principal =
        claim.principal.parse().map_err(|_| AuthFailure::BadPrincipal(claim.principal.chars().take(64).collect()))?;
    match (verifier, claim.ticket_expires_ms) {
        (Verifier::Secret(_), Some(_)) => {
            Err(AuthFailure::WrongProof("a ticket is for storage nodes: prove a credential to the master"))
        }
        (Verifier::Host(_), None) => Err(AuthFailure::WrongProof(
            "this storage node admits lanes that prove a data-plane ticket from the master, not a credential",
        )),
        (_, expires) => Ok((principal, expires)),
    }
}

/// Tells the peer why it is not admitted and closes; the failure is what the server counts.
async fn refuse_auth<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S, why: AuthFailure) -> HandshakeError {
    // `HelloReply` and `AuthReply` encode their `Err` alike, so this answers whichever the peer awaits.
    let reply: HelloReply = Err(ErrorFrame { code: ErrorCode::AuthenticationFailed, message: why.to_string() });
    frame::refuse(io, &[], &reply).await;
    HandshakeError::Unauthenticated(why)
}

/// Server side: answers a hello that broke the protocol with why, and closes the connection gracefully.
pub async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S, e: &WireError) {
    let reply: HelloReply = Err(ErrorFrame { code: e.code(), message: e.to_string() });
    frame::refuse(io, &[], &reply).await;
}

/// A hello-stage frame (request id 0, no payload): prefix and header.
fn encode<T: Serialize>(body: &T) -> Result<Vec<u8>, HandshakeError> {
    let header = postcard::to_stdvec(&Envelope { id: 0, body })
        .map_err(|e| HandshakeError::Protocol(WireError::Decode(e.to_string())))?;
    if FRAME_PREFIX + header.len() > MAX_HELLO_FRAME {
        return Err(HandshakeError::Protocol(WireError::Malformed("hello too large")));
    }
    let mut frame = frame_prefix(header.len(), 0).map_err(HandshakeError::Protocol)?.to_vec();
    frame.extend_from_slice(&header);
    Ok(frame)
}

/// Reads one hello-sized frame with no payload and decodes its body (returned with the header's bytes, which
/// the authenticated hello MACs); `Ok(None)` on a clean end of stream before its first byte.
async fn read_hello_frame<S: AsyncRead + Unpin, T: DeserializeOwned>(
    io: &mut S,
) -> Result<Option<(T, Vec<u8>)>, HandshakeError> {
    let mut first = [0u8; 1];
    if io.read(&mut first).await? == 0 {
        return Ok(None);
    }
    let mut reader = (&first[..]).chain(&mut *io);
    let shape = match frame::read_shape(&mut reader, MAX_HELLO_FRAME).await {
        Ok(shape) => shape,
        Err(ShapeError::Io(e)) => return Err(e.into()),
        // A TLS record (handshake 0x16 or alert 0x15, then version 3.x) reads as a frame of 350+ MB.
        Err(ShapeError::Wire(WireError::FrameTooLarge { .. })) if matches!(first[0], 0x15 | 0x16) => {
            return Err(HandshakeError::Protocol(WireError::Malformed(
                "the peer speaks TLS and this end does not: configure TLS on both (--tls-* / CRESCENT_TLS_*)",
            )));
        }
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
    Ok(Some((env.body, header)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crescent_proto::{ErrorCode, TenantId};

    #[tokio::test]
    async fn a_client_and_a_server_agree_and_pipelined_bytes_stay_unread() {
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let id = ClientId::random();
        let (ack, hello) = tokio::join!(
            async {
                let ack = open(&mut client, Plane::Control, PeerRole::Node, Some(id), None).await.unwrap();
                client.write_all(b"next").await.unwrap();
                ack
            },
            answer(&mut server, Plane::Control, Limits::DATA, Duration::from_secs(10), None)
        );
        let admitted = hello.unwrap().unwrap();
        assert_eq!((admitted.hello.role, admitted.hello.client_id), (PeerRole::Node, Some(id)));
        assert_eq!(admitted.principal, None);
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
        client.write_all(&encode(&bad).unwrap()).await.unwrap();
        let served = answer(&mut server, Plane::Control, Limits::CONTROL, Duration::from_secs(10), None).await;
        let Err(HandshakeError::Protocol(e)) = served else { panic!("{served:?}") };
        let (_, reply) = tokio::join!(refuse(&mut server, &e), async move {
            read_hello_frame::<_, HelloReply>(&mut client).await.unwrap().unwrap().0
        });
        assert_eq!(reply.unwrap_err().code, ErrorCode::InvalidParams);
        // A frame announced beyond the hello limit is refused on its length alone.
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        client.write_all(&(16u32 << 20).to_be_bytes()).await.unwrap();
        let served = answer(&mut server, Plane::Control, Limits::CONTROL, Duration::from_secs(10), None).await;
        assert!(matches!(served, Err(HandshakeError::Protocol(WireError::FrameTooLarge { .. }))), "{served:?}");
        // A peer that connects and says nothing.
        let (_client, mut server) = tokio::io::duplex(1 << 16);
        let served = answer(&mut server, Plane::Control, Limits::CONTROL, Duration::from_millis(20), None).await;
        assert!(matches!(served, Err(HandshakeError::Timeout)), "{served:?}");
        // A peer that leaves at once.
        let (client, mut server) = tokio::io::duplex(1 << 16);
        drop(client);
        assert!(
            answer(&mut server, Plane::Control, Limits::CONTROL, Duration::from_secs(10), None)
                .await
                .unwrap()
                .is_none()
        );
    }

    fn ring(secret: &str) -> Keyring {
        Keyring::parse(secret).unwrap()
    }

    /// Runs one handshake: the client's outcome and the server's.
    async fn handshake(
        cred: Option<&Credential>,
        server_ring: Option<&Keyring>,
    ) -> (Result<HelloAck, HandshakeError>, Result<Option<Admitted>, HandshakeError>) {
        handshake_on(Plane::Control, Plane::Control, cred, server_ring.map(Verifier::Secret)).await
    }

    /// A handshake a client meant for a `to` server, answered by a `by` server.
    async fn handshake_on(
        to: Plane,
        by: Plane,
        cred: Option<&Credential>,
        verifier: Option<Verifier<'_>>,
    ) -> (Result<HelloAck, HandshakeError>, Result<Option<Admitted>, HandshakeError>) {
        handshake_as(ClientId::random(), to, by, cred, verifier).await
    }

    /// A handshake of client `id`.
    async fn handshake_as(
        id: ClientId,
        to: Plane,
        by: Plane,
        cred: Option<&Credential>,
        verifier: Option<Verifier<'_>>,
    ) -> (Result<HelloAck, HandshakeError>, Result<Option<Admitted>, HandshakeError>) {
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        tokio::join!(
            open(&mut client, to, PeerRole::Client, Some(id), cred),
            answer(&mut server, by, Limits::CONTROL, Duration::from_secs(10), verifier)
        )
    }

    #[tokio::test]
    async fn a_handshake_meant_for_one_kind_of_server_fails_at_the_other() {
        // What a relay achieves: a client talking to a storage node (or to whatever took its address) has its
        // hello and proof passed on to the master. The master's transcript names the control plane: refused.
        let secrets = ring("a cluster secret of some length");
        let cred = secrets.credential(Principal::Admin);
        let master = Some(Verifier::Secret(&secrets));
        let (client, server) = handshake_on(Plane::Data, Plane::Control, Some(&cred), master).await;
        assert_eq!(refused_code(client), ErrorCode::AuthenticationFailed);
        assert!(matches!(server, Err(HandshakeError::Unauthenticated(AuthFailure::BadProof(Principal::Admin)))));
        let (client, server) = handshake_on(Plane::Data, Plane::Data, Some(&cred), master).await;
        client.unwrap();
        assert_eq!(server.unwrap().unwrap().principal, Some(Principal::Admin));
    }

    #[tokio::test]
    async fn a_host_admits_a_ticket_for_itself_and_nothing_else() {
        let secrets = ring("a cluster secret of some length");
        let tenant = Principal::Tenant(TenantId::new("a").unwrap());
        let cred = secrets.credential(tenant.clone());
        let host = NodeKeys::fixed(secrets.credential(Principal::Node(None)));
        let id = ClientId::random();
        let keys = secrets.host_keys(&Principal::Node(None), None);
        let ticket =
            cred.open_ticket(&secrets.issue_ticket(&Principal::Node(None), &keys, &tenant, None, id).unwrap(), id);
        let at_host = Some(Verifier::Host(&host));
        let (client, server) = handshake_as(id, Plane::Data, Plane::Data, Some(&ticket), at_host).await;
        client.unwrap();
        let admitted = server.unwrap().unwrap();
        assert_eq!((admitted.principal, admitted.secret), (Some(tenant.clone()), None));
        // The client's own credential is no ticket: refused before any proof, and told why.
        let (client, server) = handshake_as(id, Plane::Data, Plane::Data, Some(&cred), at_host).await;
        assert_eq!(refused_code(client), ErrorCode::AuthenticationFailed);
        assert!(matches!(server, Err(HandshakeError::Unauthenticated(AuthFailure::WrongProof(_)))), "{server:?}");
        // The ticket named by another client id, shown to another host, or to the master: refused.
        let (client, _) = handshake_as(ClientId::random(), Plane::Data, Plane::Data, Some(&ticket), at_host).await;
        assert_eq!(refused_code(client), ErrorCode::AuthenticationFailed);
        let other = NodeKeys::fixed(secrets.credential(Principal::Admin));
        let (client, _) = handshake_as(id, Plane::Data, Plane::Data, Some(&ticket), Some(Verifier::Host(&other))).await;
        assert_eq!(refused_code(client), ErrorCode::AuthenticationFailed);
        let (client, server) =
            handshake_as(id, Plane::Control, Plane::Control, Some(&ticket), Some(Verifier::Secret(&secrets))).await;
        assert_eq!(refused_code(client), ErrorCode::AuthenticationFailed);
        assert!(matches!(server, Err(HandshakeError::Unauthenticated(AuthFailure::WrongProof(_)))), "{server:?}");
        // A server without the ticket key cannot pose as the host: the client refuses it.
        let (client, _) = handshake_as(id, Plane::Data, Plane::Data, Some(&ticket), None).await;
        assert_eq!(refused_code(client), ErrorCode::AuthenticationFailed, "a server that does not authenticate");
    }

    fn refused_code<T: std::fmt::Debug>(r: Result<T, HandshakeError>) -> ErrorCode {
        match r {
            Err(HandshakeError::Refused(f)) => f.code,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_credential_of_the_cluster_is_proven_both_ways_and_names_its_principal() {
        let secrets = ring("a cluster secret of some length");
        let tenant = Principal::Tenant(TenantId::new("a").unwrap());
        let cred = secrets.credential(tenant.clone());
        let (client, server) = handshake(Some(&cred), Some(&secrets)).await;
        client.unwrap();
        assert_eq!(server.unwrap().unwrap().principal, Some(tenant));
    }

    #[tokio::test]
    async fn peers_without_a_valid_credential_are_refused_and_told_why() {
        let secrets = ring("a cluster secret of some length");
        // No credential at all.
        let (client, server) = handshake(None, Some(&secrets)).await;
        assert_eq!(refused_code(client), ErrorCode::AuthenticationFailed);
        assert!(matches!(server, Err(HandshakeError::Unauthenticated(AuthFailure::Missing))), "{server:?}");
        // A credential of another cluster: the proof fails.
        let foreign = ring("another cluster's secret!").credential(Principal::Admin);
        let (client, server) = handshake(Some(&foreign), Some(&secrets)).await;
        assert_eq!(refused_code(client), ErrorCode::AuthenticationFailed);
        assert!(matches!(server, Err(HandshakeError::Unauthenticated(AuthFailure::BadProof(Principal::Admin)))));
        // A server without the secret cannot pose as the cluster: the client refuses it.
        let cred = secrets.credential(Principal::Node(None));
        let (client, server) = handshake(Some(&cred), None).await;
        assert_eq!(refused_code(client), ErrorCode::AuthenticationFailed);
        assert!(server.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_recorded_proof_does_not_open_another_connection() {
        // An eavesdropper replays a legitimate client's hello and proof bytes: the server's fresh nonce makes
        // the old proof wrong.
        let secrets = ring("a cluster secret of some length");
        let cred = secrets.credential(Principal::Admin);
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let hello = Hello {
            auth: Some(AuthHello { principal: "admin".into(), nonce: [1; 32], ticket_expires_ms: None }),
            ..Hello::new(PeerRole::Client, None)
        };
        let hello_frame = encode(&hello).unwrap();
        let served = tokio::spawn(async move {
            let at_master = Some(Verifier::Secret(&secrets));
            answer(&mut server, Plane::Control, Limits::CONTROL, Duration::from_secs(10), at_master).await
        });
        client.write_all(&hello_frame).await.unwrap();
        let (reply, _) = read_hello_frame::<_, HelloReply>(&mut client).await.unwrap().unwrap();
        let first = reply.unwrap().challenge.unwrap();
        // Pretend the recorded session saw another nonce: its proof is for that one.
        let recorded = cred.client_mac(&auth::transcript(Plane::Control, &hello_frame[FRAME_PREFIX..], &[9; 32]));
        assert_ne!(first, [9; 32]);
        client.write_all(&encode(&HelloProof { mac: recorded }).unwrap()).await.unwrap();
        let (reply, _) = read_hello_frame::<_, AuthReply>(&mut client).await.unwrap().unwrap();
        assert_eq!(reply.unwrap_err().code, ErrorCode::AuthenticationFailed);
        assert!(matches!(served.await.unwrap(), Err(HandshakeError::Unauthenticated(AuthFailure::BadProof(_)))));
    }

    #[tokio::test]
    async fn during_a_rotation_credentials_of_both_secrets_are_admitted() {
        let old = ring("the old secret of the cluster");
        let new = ring("the new secret of the cluster");
        let both = ring("the new secret of the cluster\nthe old secret of the cluster");
        for cred in [old.credential(Principal::Node(None)), new.credential(Principal::Node(None))] {
            let (client, server) = handshake(Some(&cred), Some(&both)).await;
            client.unwrap();
            assert_eq!(server.unwrap().unwrap().principal, Some(Principal::Node(None)));
        }
        let (client, _) = handshake(Some(&old.credential(Principal::Node(None))), Some(&new)).await;
        assert_eq!(refused_code(client), ErrorCode::AuthenticationFailed, "once retired, the old one is refused");
    }
}
