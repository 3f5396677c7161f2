//! Issue 17, as an attacker on loopback would try it against a `crescent up` started with a cluster secret:
//! unauthenticated peers on either plane, tenants reaching for each other's objects, a node credential acting
//! as a client, an unmount in another client's name, the admin HTTP without the admin credential; and a
//! secret rotated under load without a failed request.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use crescent_client::{Client, ClientConfig, ClientError};
use crescent_net::auth::{Credential, CredentialSource, Keyring};
use crescent_proto::transfer::TransferRequest;
use crescent_proto::wire::{Envelope, ErrorFrame, Frame, Head, Hello, HelloReply, PeerRole};
use crescent_proto::{ClientId, ErrorCode, MasterRequest, ReplicaLocation, SegmentId};
use crescent_testkit::{Proc, eventually};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const S1: &str = "the first secret of this test cluster";
const S2: &str = "the second secret of this test cluster";
const DEADLINE: Duration = Duration::from_secs(30);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_crescent"))
}

/// A secret file (mode 600) holding `text`.
fn write_secret(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

struct Cluster {
    up: Proc,
    secret: PathBuf,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        write_secret(&secret, S1);
        let s = secret.to_str().unwrap();
        let up = Proc::start(
            bin(),
            &[
                "up",
                "--listen",
                "127.0.0.1:0",
                "--secret-file",
                s,
                "--multi-tenant",
                "--segment-size",
                "16MiB",
                "--prefault",
                "false",
            ],
        );
        Self { up, secret, dir }
    }

    fn master(&self) -> String {
        self.up.field("master")
    }

    fn credential(&self, principal: &str, secret: &str) -> Credential {
        Keyring::parse(secret).unwrap().credential(principal.parse().unwrap())
    }

    fn client(&self, principal: &str, tenant: &str) -> Client {
        self.client_with(Some(self.credential(principal, S1)), tenant)
    }

    fn client_with(&self, credential: Option<Credential>, tenant: &str) -> Client {
        let mut c = ClientConfig::new(self.master()).with_credential(credential.map(CredentialSource::from));
        c.tenant = tenant.into();
        Client::new(c.with_request_timeout(Duration::from_secs(5)))
    }

    fn metric(&self, name: &str) -> u64 {
        let text = http(&self.up.field("admin"), "GET", "/metrics", None).1;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("crescent_master_{name}_total ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    }
}

/// A call's error code (`OK` for a success).
fn code<T>(r: Result<T, ClientError>) -> ErrorCode {
    r.map_or_else(|e| e.code(), |_| ErrorCode::Ok)
}

/// A blocking HTTP/1.0 request: (status, body).
fn http(addr: &str, method: &str, path: &str, bearer: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let auth = bearer.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(s, "{method} {path} HTTP/1.0\r\nHost: x\r\nContent-Length: 0\r\n{auth}\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// Where `key`'s first replica lives.
async fn replica_of(c: &Client, key: &str) -> (String, SegmentId, u64, u64) {
    let stat = c.stat(key).await.unwrap();
    match &stat.replicas[0].location {
        ReplicaLocation::Memory { segment_id, offset, length, endpoint } => {
            (endpoint.to_string(), *segment_id, *offset, *length)
        }
        other => panic!("unexpected replica {other:?}"),
    }
}

/// Sends a hello without credential and then `request` (with `payload`) on a raw socket to the node at
/// `endpoint`, as a script would — over TCP, or over the node's local lanes (its Unix socket) when `local`;
/// returns the hello's refusal.
async fn raw_attempt(endpoint: &str, local: bool, request: &TransferRequest, payload: &[u8]) -> ErrorFrame {
    let mut s: Box<dyn Raw> = if local {
        let addr = crescent_transfer::local_lane_address(endpoint).unwrap();
        let s = std::os::unix::net::UnixStream::connect_addr(&addr).expect("the node serves local lanes");
        s.set_nonblocking(true).unwrap();
        Box::new(tokio::net::UnixStream::from_std(s).unwrap())
    } else {
        Box::new(TcpStream::connect(endpoint).await.unwrap())
    };
    let hello = Head::encode(0, &Hello::new(PeerRole::Client, None), 0).unwrap();
    let req = Head::encode(1, request, payload.len()).unwrap();
    // Pipelined behind the hello, as an attacker who does not wait for an answer would.
    let mut bytes = hello.as_bytes().to_vec();
    bytes.extend_from_slice(req.as_bytes());
    bytes.extend_from_slice(payload);
    let _ = s.write_all(&bytes).await;
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, s.read_to_end(&mut reply)).await;
    assert!(reply.len() > 8, "the server said nothing");
    let frame = Frame { header: Bytes::copy_from_slice(&reply[8..]), payload: Bytes::new() };
    let env: Envelope<HelloReply> = frame.decode().unwrap();
    assert_eq!(env.id, 0);
    let refusal = env.body.unwrap_err();
    // Nothing after the refusal: the request got no answer of its own.
    let len = u32::from_be_bytes(reply[..4].try_into().unwrap()) as usize;
    assert_eq!(reply.len(), 4 + len, "only the refusal came back, no reply to the request");
    refusal
}

/// A raw byte stream, TCP or Unix.
trait Raw: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> Raw for T {}

#[tokio::test]
async fn unauthenticated_peers_are_refused_on_both_planes_and_the_victims_bytes_are_unchanged() {
    let c = Cluster::start();
    let admin = c.client("admin", "");
    admin.set_tenant_quota("v", 8 << 20).await.unwrap();
    let victim = c.client("tenant:v", "v");
    let value: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
    victim.put("victim", &value).await.unwrap();
    let (endpoint, segment, offset, length) = replica_of(&victim, "victim").await;

    // A raw WRITE at the victim's offset, and a raw READ of it: refused at the hello, over TCP and over the
    // node's local lanes alike.
    for local in [false, true] {
        let write = TransferRequest::Write { segment, offset, grant: None };
        let refusal = raw_attempt(&endpoint, local, &write, &vec![0xEE; length as usize]).await;
        assert_eq!(refusal.code, ErrorCode::AuthenticationFailed, "local {local}: {}", refusal.message);
        let read = TransferRequest::Read { segment, offset, length, grant: None };
        assert_eq!(raw_attempt(&endpoint, local, &read, &[]).await.code, ErrorCode::AuthenticationFailed);
    }

    // The master likewise: no credential, or one of another cluster.
    let e = c.client_with(None, "v").get("victim").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::AuthenticationFailed, "{e}");
    let foreign = c.credential("tenant:v", "a secret of some other cluster");
    let e = c.client_with(Some(foreign), "v").get("victim").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::AuthenticationFailed, "{e}");
    assert!(c.metric("auth_failures") >= 2, "the master counts its refusals");

    assert_eq!(victim.get("victim").await.unwrap(), value, "the victim's bytes are unchanged");
}

/// A refused transfer's code.
fn refused<T: std::fmt::Debug>(r: Result<T, crescent_transfer::TransferError>) -> ErrorCode {
    match r {
        Err(crescent_transfer::TransferError::Refused(code)) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn an_authenticated_client_touches_only_the_ranges_the_master_granted_it() {
    use crescent_client::master::MasterConnection;
    use crescent_client::tickets::MasterTickets;
    use crescent_net::grant::{Bearer, GrantOp, unix_ms};
    use crescent_proto::rpc::MasterResponse;
    use crescent_proto::transfer::{Grant, GrantRange, GrantRef};
    use crescent_proto::wire::{Batch, WireKey};
    use crescent_transfer::{BatchWrite, Place, RangeGrant, SegmentRegistry, TransferClient, TransferConfig};
    let own_grant = |g: &Option<GrantRef>| match g {
        Some(GrantRef::Own(g)) => RangeGrant::own(g.clone()),
        other => panic!("a single object's reply carries its own grants, not {other:?}"),
    };

    let c = Cluster::start();
    let admin = c.client("admin", "");
    for t in ["a", "v"] {
        admin.set_tenant_quota(t, 8 << 20).await.unwrap();
    }
    let victim = c.client("tenant:v", "v");
    let value: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
    victim.put("victim", &value).await.unwrap();
    let (endpoint, segment, offset, length) = replica_of(&victim, "victim").await;

    // The attacker: a tenant of its own, with a real credential, a master connection and a data-plane client
    // under one client id, as a client library would have.
    let me = ClientId::random();
    let cred = c.credential("tenant:a", S1);
    let master_as = |id: ClientId, cred: &Credential| {
        Arc::new(
            MasterConnection::new(&c.master(), id, PeerRole::Client, 1, DEADLINE)
                .with_credential(Some(cred.clone().into())),
        )
    };
    let master = master_as(me, &cred);
    // Over the node's local lanes (its Unix socket: the attacker is on its host), or over TCP; each lane proves
    // a ticket the master seals for the client id and credential.
    let data_over = |id: ClientId, cred: &Credential, local_lanes: bool| {
        let tickets = MasterTickets::new(master_as(id, cred), cred.clone().into(), id);
        let config = TransferConfig {
            tickets: Some(Arc::new(tickets)),
            client_id: Some(id),
            io_timeout: DEADLINE,
            local_lanes,
            ..TransferConfig::default()
        };
        TransferClient::new(config, SegmentRegistry::default())
    };
    let data = |id: ClientId, cred: &Credential| data_over(id, cred, true);
    let t = data(me, &cred);
    // Its own put: the master grants exactly the 4 KiB it allocated.
    let key = || WireKey::Key("mine".into());
    let start =
        MasterRequest::PutStart { client: me, tenant: "a".into(), key: key(), size: 4096, config: Default::default() };
    let Ok(MasterResponse::Replicas(mine)) = master.call(&start).await else { panic!("put start failed") };
    let (mine_seg, mine_off) = match &mine[0].location {
        ReplicaLocation::Memory { segment_id, offset, .. } => (*segment_id, *offset),
        other => panic!("unexpected replica {other:?}"),
    };
    let write_grant = own_grant(&mine[0].grant);
    assert_eq!(write_grant.grant.ranges, vec![GrantRange { offset: mine_off, length: 4096 }]);
    let own = Place::new(mine_seg, Some(write_grant.clone()));
    t.write(&endpoint, own.clone(), mine_off, Bytes::from(vec![7u8; 4096])).await.unwrap();

    let junk = Bytes::from(vec![0xEE; length as usize]);
    // No grant at all, over either kind of lane.
    for tt in [&t, &data_over(me, &cred, false)] {
        assert_eq!(refused(tt.write(&endpoint, segment, offset, junk.clone()).await), ErrorCode::PermissionDenied);
        assert_eq!(refused(tt.read(&endpoint, segment, offset, length).await), ErrorCode::PermissionDenied);
    }
    // Its own grant, used on the victim's range.
    let at_victim = Place::new(segment, Some(write_grant.clone()));
    assert_eq!(refused(t.write(&endpoint, at_victim, offset, junk.clone()).await), ErrorCode::PermissionDenied);
    // A grant altered to cover the victim's range.
    let widened = Grant { ranges: vec![GrantRange { offset, length }], ..(*write_grant.grant).clone() };
    let forged = Place::new(segment, Some(RangeGrant::own(widened)));
    assert_eq!(refused(t.write(&endpoint, forged, offset, junk.clone()).await), ErrorCode::PermissionDenied);
    // Its grant replayed by another client id of the same tenant, and by another tenant's credential.
    let other = data(ClientId::random(), &cred);
    let four_k = Bytes::from(vec![1u8; 4096]);
    assert_eq!(
        refused(other.write(&endpoint, own.clone(), mine_off, four_k.clone()).await),
        ErrorCode::PermissionDenied
    );
    let b = data(me, &c.credential("tenant:b", S1));
    assert_eq!(refused(b.write(&endpoint, own.clone(), mine_off, four_k.clone()).await), ErrorCode::PermissionDenied);
    // A write grant does not read, and a read grant does not write.
    assert_eq!(refused(t.read(&endpoint, own, mine_off, 4096).await), ErrorCode::PermissionDenied);
    let write = crescent_proto::write_id(&mine);
    let end = MasterRequest::PutEnd { client: me, tenant: "a".into(), key: key(), checksum: None, write };
    master.call(&end).await.unwrap();
    let get = MasterRequest::GetReplicaList { tenant: "a".into(), key: key() };
    let Ok(MasterResponse::ReplicaList(list)) = master.call(&get).await else { panic!("get failed") };
    let read_grant = own_grant(&list.replicas[0].grant);
    let readable = Place::new(mine_seg, Some(read_grant.clone()));
    assert_eq!(t.read(&endpoint, readable.clone(), mine_off, 4096).await.unwrap(), vec![7u8; 4096]);
    assert_eq!(
        refused(t.write(&endpoint, readable.clone(), mine_off, four_k.clone()).await),
        ErrorCode::PermissionDenied
    );
    // Its read grant on the victim's range.
    let peek = Place::new(segment, Some(read_grant));
    assert_eq!(refused(t.read(&endpoint, peek, offset, length).await), ErrorCode::PermissionDenied);
    // An expired grant, correctly sealed (the test holds the secret): refused as expired.
    let ring = Keyring::parse(S1).unwrap();
    let bearer = Bearer::new("tenant:a".parse().unwrap(), Some(me));
    let node = ring.host_keys(&"node".parse().unwrap(), None);
    let range = vec![GrantRange { offset: mine_off, length: 4096 }];
    let stale = node.seal_grant(GrantOp::Write, &mine_seg, &bearer, range, unix_ms() - 1);
    let expired = Place::new(mine_seg, Some(RangeGrant::own(stale)));
    assert_eq!(refused(t.write(&endpoint, expired, mine_off, four_k.clone()).await), ErrorCode::GrantExpired);

    assert_eq!(victim.get("victim").await.unwrap(), value, "the victim's bytes are unchanged");
    assert_eq!(t.read(&endpoint, readable, mine_off, 4096).await.unwrap(), vec![7u8; 4096], "and its own too");
    // A batch's write grant: one for the batch's ranges on the segment, each descriptor pointing into it.
    let keys: Vec<(WireKey, u64)> = (0..3).map(|i| (WireKey::Key(format!("b{i}")), 4096)).collect();
    let start = MasterRequest::BatchPutStart {
        client: me,
        tenant: "a".into(),
        items: Batch(keys.clone()),
        config: Default::default(),
        group_ids: None,
        upsert: false,
    };
    let Ok(MasterResponse::BatchReplicas(batch)) = master.call(&start).await else { panic!("batch start failed") };
    assert_eq!(batch.grants.len(), 1, "one grant for the batch's ranges on the one segment");
    let shared = Arc::new(batch.grants[0].clone());
    let mut writes = Vec::new();
    for (k, item) in batch.items.iter().enumerate() {
        let d = &item.as_ref().expect("started")[0];
        let (ReplicaLocation::Memory { segment_id, offset, length, .. }, Some(GrantRef::Shared { grant: 0, range })) =
            (&d.location, &d.grant)
        else {
            panic!("unexpected descriptor {d:?}");
        };
        assert_eq!((*range as usize, shared.ranges[k]), (k, GrantRange { offset: *offset, length: *length }));
        let grant = Some(RangeGrant::new(shared.clone(), k as u16));
        writes.push(BatchWrite { segment: *segment_id, grant, offset: *offset, data: &four_k[..] });
    }
    // Each of its ranges, named by index, on the victim's range: refused, in a batch and alone.
    let mut hostile = writes.clone();
    for w in &mut hostile {
        (w.segment, w.offset) = (segment, offset);
    }
    for r in t.write_batch(&endpoint, &hostile).await {
        assert_eq!(refused(r), ErrorCode::PermissionDenied);
    }
    let at_victim = Place::new(segment, hostile[1].grant.clone());
    assert_eq!(refused(t.write(&endpoint, at_victim, offset, junk.clone()).await), ErrorCode::PermissionDenied);
    // One range's index on another of its ranges, and an index past its ranges.
    let mut swapped = writes[0].clone();
    swapped.grant = Some(RangeGrant::new(shared.clone(), 1));
    let mut past = writes[0].clone();
    past.grant = Some(RangeGrant::new(shared.clone(), 3));
    for r in t.write_batch(&endpoint, &[swapped, past]).await {
        assert_eq!(refused(r), ErrorCode::PermissionDenied);
    }
    // Used as granted, it writes all three.
    assert!(t.write_batch(&endpoint, &writes).await.iter().all(Result::is_ok));
    let revoke = MasterRequest::BatchPutRevoke {
        client: me,
        tenant: "a".into(),
        keys: Batch(
            keys.into_iter()
                .zip(&batch.items)
                .map(|((k, _), d)| (k, d.as_ref().map_or(0, |d| crescent_proto::write_id(d))))
                .collect(),
        ),
    };
    master.call(&revoke).await.unwrap();

    assert_eq!(victim.get("victim").await.unwrap(), value, "the victim's bytes are still unchanged");
    // Batches go through grants as well.
    let a = c.client("tenant:a", "a");
    let items: Vec<(String, Vec<u8>)> = (0..8).map(|i| (format!("batch-{i}"), vec![i as u8; 3000])).collect();
    let refs: Vec<(&str, &[u8])> = items.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
    assert!(a.batch_put_from(&refs, &Default::default()).await.iter().all(Result::is_ok));
    let mut bufs = vec![vec![0u8; 3000]; 8];
    let mut reads: Vec<(&str, &mut [u8])> =
        items.iter().zip(bufs.iter_mut()).map(|((k, _), b)| (k.as_str(), b.as_mut_slice())).collect();
    assert!(a.batch_get_into(&mut reads).await.iter().all(|r| r.as_ref().is_ok_and(|n| *n == 3000)));
    assert!(bufs.iter().enumerate().all(|(i, b)| b.iter().all(|x| *x == i as u8)));
}

#[tokio::test]
async fn a_tenant_reaches_its_own_objects_only() {
    let c = Cluster::start();
    let admin = c.client("admin", "");
    for t in ["a", "b"] {
        admin.set_tenant_quota(t, 8 << 20).await.unwrap();
    }
    let b = c.client("tenant:b", "b");
    b.put("secret-b", b"bbbb").await.unwrap();
    let a = c.client("tenant:a", "a");
    a.put("mine", b"aaaa").await.unwrap();
    assert_eq!(a.get("mine").await.unwrap(), b"aaaa");

    // Tenant a's credential with tenant b's name.
    let a_as_b = c.client_with(Some(c.credential("tenant:a", S1)), "b");
    assert_eq!(code(a_as_b.get("secret-b").await), ErrorCode::PermissionDenied);
    assert_eq!(code(a_as_b.stat("secret-b").await), ErrorCode::PermissionDenied);
    assert_eq!(code(a_as_b.list_keys("", 10).await), ErrorCode::PermissionDenied);
    assert_eq!(code(a_as_b.put("planted", b"x").await), ErrorCode::PermissionDenied);
    assert_eq!(code(a_as_b.remove("secret-b", true).await), ErrorCode::PermissionDenied);
    assert_eq!(code(a_as_b.remove_all(true).await), ErrorCode::PermissionDenied);
    assert_eq!(code(a.set_tenant_quota("a", 1 << 30).await), ErrorCode::PermissionDenied, "admin only");
    assert_eq!(code(a.list_tenants().await), ErrorCode::PermissionDenied);

    assert_eq!(b.get("secret-b").await.unwrap(), b"bbbb", "b's object survived");
    assert_eq!(b.list_keys("", 10).await.unwrap(), vec!["secret-b".to_owned()], "nothing planted");
    assert!(c.metric("permission_denied") >= 8);
}

#[tokio::test]
async fn a_node_credential_serves_segments_but_is_no_client_and_unmounts_only_its_own() {
    use crescent_client::master::MasterConnection;
    let c = Cluster::start();
    let admin = c.client("admin", "");
    admin.set_tenant_quota("t", 8 << 20).await.unwrap();
    let t = c.client("tenant:t", "t");
    t.put("k", b"value").await.unwrap();
    let (_, segment, _, _) = replica_of(&t, "k").await;

    let conn = |principal: &str| {
        MasterConnection::new(&c.master(), ClientId::random(), PeerRole::Node, 1, DEADLINE)
            .with_credential(Some(c.credential(principal, S1).into()))
    };
    let node = conn("node");
    let me = ClientId::random();
    // Requests in another client's name (the up's node owns the segment): refused before anything happens.
    let unmount = MasterRequest::UnmountSegment { client: me, segment };
    assert_eq!(code(node.call(&unmount).await), ErrorCode::PermissionDenied);
    let get = MasterRequest::GetReplicaList { tenant: "t".into(), key: crescent_proto::wire::WireKey::Key("k".into()) };
    assert_eq!(code(node.call(&get).await), ErrorCode::PermissionDenied, "a node reads no object");
    // A tenant's client in another client's name.
    let tenant = conn("tenant:t");
    assert_eq!(code(tenant.call(&unmount).await), ErrorCode::PermissionDenied);

    assert_eq!(t.get("k").await.unwrap(), b"value", "the segment and its object are still there");
}

#[tokio::test]
async fn a_node_holding_only_its_credential_serves_under_tickets_and_grants() {
    use crescent_client::master::MasterConnection;
    use crescent_proto::MasterResponse;
    let c = Cluster::start();
    c.client("admin", "").set_tenant_quota("t", 64 << 20).await.unwrap();
    // A second node, given its own credential (`node:n2`, of which the embedded node knows nothing) and no
    // cluster secret (none in its environment either).
    let cred_file = c.dir.path().join("node.credential");
    write_secret(&cred_file, &c.credential("node:n2", S1).to_text());
    let node = Proc::start(
        bin(),
        &[
            "node",
            "--master",
            &c.master(),
            "--listen",
            "127.0.0.1:0",
            "--segment-size",
            "16MiB",
            "--prefault",
            "false",
            "--credential-file",
            cred_file.to_str().unwrap(),
        ],
    );
    let endpoint = node.field("node");
    // Objects land on both nodes; every one on the new node went through its tickets and grants.
    let t = c.client("tenant:t", "t");
    let mut on_new_node = Vec::new();
    for i in 0..32 {
        let key = format!("k{i}");
        let value = vec![i as u8; 70_000];
        t.put(&key, &value).await.unwrap();
        if replica_of(&t, &key).await.0 == endpoint {
            on_new_node.push((key, value));
        }
    }
    assert!(!on_new_node.is_empty(), "no object landed on the credential-only node");
    for (key, value) in &on_new_node {
        assert_eq!(&t.get(key).await.unwrap(), value);
    }
    // A ticket is sealed for its client: the master issues one only to the client id the connection claimed.
    let (_, segment, _, _) = replica_of(&t, &on_new_node[0].0).await;
    let (me, other) = (ClientId::random(), ClientId::random());
    let conn = MasterConnection::new(&c.master(), me, PeerRole::Client, 1, DEADLINE)
        .with_credential(Some(c.credential("tenant:t", S1).into()));
    let ticket = MasterRequest::DataTicket { segment };
    let Ok(MasterResponse::Ticket(sealed)) = conn.call(&ticket).await else { panic!("no ticket") };
    assert_eq!(sealed.host, "node:n2", "sealed for the node's own credential");
    let anon = MasterConnection::new(&c.master(), other, PeerRole::Client, 1, DEADLINE)
        .with_credential(Some(c.credential("tenant:u", S1).into()));
    assert_eq!(
        code(anon.call(&MasterRequest::DataTicket { segment: SegmentId::random() }).await),
        ErrorCode::SegmentNotFound
    );
    // The node's credential opens nothing at the master beyond a node's rights.
    let as_node = c.client_with(Some(c.credential("node:n2", S1)), "t");
    assert_eq!(code(as_node.get(&on_new_node[0].0).await), ErrorCode::PermissionDenied);
    assert_eq!(code(as_node.list_tenants().await), ErrorCode::PermissionDenied);
}

/// A memory segment whose endpoint nobody serves (nothing listens on port 1).
fn unserved_segment(id: SegmentId, name: &str) -> crescent_proto::SegmentSpec {
    crescent_proto::SegmentSpec {
        id,
        name: name.into(),
        base: 1 << 30,
        size: 1 << 20,
        endpoint: "127.0.0.1:1".into(),
        kind: crescent_proto::SegmentKind::Memory,
        host_id: String::new(),
    }
}

#[tokio::test]
async fn a_client_id_is_its_first_principals_and_another_cannot_act_in_its_name() {
    use crescent_client::master::MasterConnection;
    let c = Cluster::start();
    let conn = |principal: &str, id: ClientId| {
        MasterConnection::new(&c.master(), id, PeerRole::Node, 1, DEADLINE)
            .with_credential(Some(c.credential(principal, S1).into()))
    };
    // A storage node (client id `victim`) mounts a segment, then its connection closes (a reconnect, say).
    let victim = ClientId::random();
    let segment = SegmentId::random();
    let spec = unserved_segment(segment, "victim-seg");
    let node = conn("node", victim);
    node.call(&MasterRequest::MountSegment { client: victim, spec }).await.unwrap();
    let status = |s: SegmentId| MasterRequest::SegmentStatus { segment: s };
    assert!(node.call(&status(segment)).await.is_ok());
    let failures = c.metric("auth_failures");

    // A tenant's client names the node's id in its hello: its MAC is good, but the id is the node's.
    let squatter = conn("tenant:default", victim);
    let unmount = MasterRequest::UnmountSegment { client: victim, segment };
    let e = squatter.call(&unmount).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::PermissionDenied);
    assert!(e.to_string().contains("held by another principal"), "{e}");
    assert_eq!(code(squatter.call(&MasterRequest::Ping { client: victim }).await), ErrorCode::PermissionDenied);
    drop(node);
    // Still the node's after its connection closed: the master tracks the client until its TTL.
    let squatter = conn("tenant:default", victim);
    assert_eq!(code(squatter.call(&unmount).await), ErrorCode::PermissionDenied);
    assert!(c.metric("auth_failures") >= failures + 2, "each squatting hello counts as a failed authentication");

    // The node itself reconnects under its id and still owns its segment.
    let node = conn("node", victim);
    node.call(&unmount).await.unwrap();
    assert_eq!(code(node.call(&status(segment)).await), ErrorCode::SegmentNotFound, "the owner unmounted it");
}

/// Waits until `/metrics` shows `name` at `at_least` or more.
async fn await_metric(c: &Cluster, name: &str, at_least: u64) {
    assert!(eventually(DEADLINE, || async { c.metric(name) >= at_least }).await, "{name} never reached {at_least}");
}

#[tokio::test]
async fn a_tenants_unreachable_report_is_believed_only_when_the_masters_own_probe_fails() {
    use crescent_client::master::MasterConnection;
    use crescent_proto::wire::Batch;
    use crescent_proto::{MasterResponse, SegmentStatus};
    let c = Cluster::start();
    c.client("admin", "").set_tenant_quota("t", 8 << 20).await.unwrap();
    let t = c.client("tenant:t", "t");
    t.put("k", b"value").await.unwrap();
    let (_, live, _, _) = replica_of(&t, "k").await;
    let conn = |principal: &str, id: ClientId| {
        MasterConnection::new(&c.master(), id, PeerRole::Node, 1, DEADLINE)
            .with_credential(Some(c.credential(principal, S1).into()))
    };
    let status = |conn: MasterConnection, segment| async move {
        match conn.call(&MasterRequest::SegmentStatus { segment }).await.unwrap() {
            MasterResponse::Status(s) => s,
            other => panic!("{other:?}"),
        }
    };
    // A segment whose node is gone: nothing listens at its endpoint.
    let dead = SegmentId::random();
    let owner = ClientId::random();
    let spec = unserved_segment(dead, "dead-node");
    conn("node", owner).call(&MasterRequest::MountSegment { client: owner, spec }).await.unwrap();

    // A tenant reports both. The live node answers the master's probe: the report is refuted and the segment
    // stays in service; the dead one does not: confirmed, suspect.
    let me = ClientId::random();
    let report = MasterRequest::ReportUnreachable { client: me, segments: Batch(vec![live, dead]) };
    conn("tenant:t", me).call(&report).await.unwrap();
    await_metric(&c, "unreachable_refuted", 1).await;
    await_metric(&c, "unreachable_confirmed", 1).await;
    assert_eq!(status(conn("admin", ClientId::random()), live).await, SegmentStatus::Ok);
    assert_eq!(status(conn("admin", ClientId::random()), dead).await, SegmentStatus::Suspect);
    assert_eq!(t.get("k").await.unwrap(), b"value");
    t.put("k2", b"still placed").await.unwrap();
    assert_eq!(c.metric("unreachable_refuted"), 1, "one probe per report");
}

#[tokio::test]
async fn the_admin_http_changes_state_only_with_the_admin_credential() {
    let c = Cluster::start();
    let addr = c.up.field("admin");
    let put = |bearer: Option<&str>| http(&addr, "PUT", "/tenants/x?quota=1MiB", bearer);
    assert_eq!(put(None).0, 401);
    let tenant_key = c.credential("tenant:x", S1).token();
    assert_eq!(put(Some(&tenant_key)).0, 401, "a tenant's key is not the admin's");
    let admin_key = c.credential("admin", S1).token();
    assert_eq!(put(Some(&admin_key)).0, 200);
    assert_eq!(http(&addr, "DELETE", "/tenants/x", None).0, 401);
    assert_eq!(http(&addr, "GET", "/tenants", None).0, 200, "reads stay open to scrapers");
    assert!(c.metric("auth_failures") >= 3);
}

/// The original's admin routes (`/get_all_keys`, `/query_key`, ...) are reads and gated as `/keys` is: answered
/// without a credential (the admin port binds loopback; `/keys` is open to scrapers), per tenant as
/// `/keys?tenant=` answers, a bearer token changing nothing and counting no failure; no other method reaches
/// them, so nothing changes state through them.
#[tokio::test]
async fn the_original_admin_routes_are_gated_like_keys() {
    let c = Cluster::start();
    let addr = c.up.field("admin");
    c.client("admin", "").set_tenant_quota("t", 8 << 20).await.unwrap();
    c.client("tenant:t", "t").put("k", b"v").await.unwrap();
    let failures = c.metric("auth_failures");
    let tenant_key = c.credential("tenant:t", S1).token();
    let bearers = [None, Some("not-a-key"), Some(tenant_key.as_str())];
    for bearer in bearers {
        let (status, body) = http(&addr, "GET", "/keys?tenant=t", bearer);
        assert_eq!((status, body.contains(r#"["k"]"#)), (200, true), "/keys: {body}");
    }
    for (path, status, shows) in [
        ("/get_all_keys?tenant=t", 200, "k\n"),
        ("/query_key?key=k&tenant=t", 200, r#""size_":1,"#),
        ("/batch_query_keys?keys=k&tenant=t", 200, r#"{"k":{"ok":true,"#),
        ("/get_all_segments", 200, "127.0.0.1:"),
        ("/get_segments_detail", 200, r#"{"total_segments":1,"#),
        ("/query_key?key=k", 404, "OBJECT_NOT_FOUND"),
        ("/get_all_keys", 200, ""),
        ("/query_key?key=k&tenant=_bad", 400, "invalid tenant"),
        ("/get_all_keys?tenant=_bad", 400, "invalid tenant"),
    ] {
        for bearer in bearers {
            let (got, body) = http(&addr, "GET", path, bearer);
            assert_eq!(got, status, "{path} with {bearer:?}: {body}");
            assert!(body.contains(shows), "{path} with {bearer:?}: {body}");
        }
        for method in ["POST", "PUT", "DELETE"] {
            assert_eq!(http(&addr, method, path, None).0, 405, "{method} {path}");
        }
    }
    assert_eq!(http(&addr, "GET", "/get_all_keys", None).1, "", "the default tenant holds nothing");
    assert_eq!(c.metric("auth_failures"), failures, "reads ask for no credential, as /keys does");
}

#[tokio::test]
async fn a_secret_rotated_under_load_loses_no_request() {
    let c = Arc::new(Cluster::start());
    let admin = c.client("admin", "");
    admin.set_tenant_quota("load", 64 << 20).await.unwrap();
    // The load: each round a fresh client (new connections, so every round authenticates anew) puts and
    // reads back one object; which secret its credential derives from is switched mid-run.
    let use_new = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let load = {
        let (c, use_new, stop, done) = (c.clone(), use_new.clone(), stop.clone(), done.clone());
        tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let secret = if use_new.load(Ordering::Relaxed) { S2 } else { S1 };
                let client = c.client_with(Some(c.credential("tenant:load", secret)), "load");
                let key = format!("k{}", i % 64);
                let value = i.to_le_bytes();
                let r = async {
                    client.put(&key, &value).await.or_else(|e| match e.code() {
                        ErrorCode::ObjectAlreadyExists => Ok(()),
                        _ => Err(e),
                    })?;
                    client.get(&key).await.map(|_| ())
                }
                .await;
                if let Err(e) = r {
                    failures.push(format!("round {i} ({secret:?}): {e}"));
                }
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            failures
        })
    };
    let rounds_past = |n: u64| {
        let done = done.clone();
        async move {
            let start = done.load(Ordering::Relaxed);
            assert!(
                eventually(DEADLINE, || {
                    let d = done.clone();
                    async move { d.load(Ordering::Relaxed) >= start + n }
                })
                .await
            );
        }
    };
    rounds_past(20).await;
    // 1. Both secrets valid (old still current), every server reloads.
    write_secret(&c.secret, &format!("{S1}\n{S2}"));
    hang_up(&c.up);
    let new_cred = c.credential("tenant:load", S2);
    assert!(
        eventually(DEADLINE, || {
            let cl = c.client_with(Some(new_cred.clone()), "load");
            async move { cl.list_keys("", 1).await.is_ok() }
        })
        .await,
        "the new secret is accepted once reloaded"
    );
    rounds_past(20).await;
    // 2. Clients move to the new credentials.
    use_new.store(true, Ordering::Relaxed);
    rounds_past(20).await;
    // 3. Only the new secret is left.
    write_secret(&c.secret, S2);
    hang_up(&c.up);
    let old_cred = c.credential("tenant:load", S1);
    assert!(
        eventually(DEADLINE, || {
            let cl = c.client_with(Some(old_cred.clone()), "load");
            async move { cl.list_keys("", 1).await.map_err(|e| e.code()) == Err(ErrorCode::AuthenticationFailed) }
        })
        .await,
        "the old secret is refused once retired"
    );
    rounds_past(20).await;
    stop.store(true, Ordering::Relaxed);
    let failures = load.await.unwrap();
    assert!(failures.is_empty(), "{} requests failed during the rotation: {failures:?}", failures.len());
    // The node's own master connection follows too: a new segment client still gets replicas.
    let fresh = c.client_with(Some(c.credential("tenant:load", S2)), "load");
    fresh.put("after", b"rotation").await.unwrap();
    assert_eq!(fresh.get("after").await.unwrap(), b"rotation");
}

/// SIGHUP: the servers reload their secret file.
fn hang_up(p: &Proc) {
    let pid = rustix::process::Pid::from_raw(p.pid() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
}

#[test]
fn an_unauthenticated_server_refuses_a_public_address_unless_insecure() {
    let out = std::process::Command::new(bin())
        .args(["master", "--listen", "0.0.0.0:0", "--admin", "127.0.0.1:0"])
        .env_remove("CRESCENT_SECRET")
        .env_remove("CRESCENT_SECRET_FILE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without authentication") && err.contains("--insecure"), "{err}");
    let out = std::process::Command::new(bin())
        .args(["node", "--master", "127.0.0.1:1", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--insecure"));
}
