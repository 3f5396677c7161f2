//! The etcd backend (`etcd-client`, etcd 3.4's v3 API): value compares, `create_revision == 0` for key-absent.

use super::{HaKvBackend, KvCompare, KvError, KvFuture, KvLimits, KvPair, KvTxn, RangePage, TxnOutcome};
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KvClient, Txn, TxnOp};
use std::time::Duration;

/// Largest response accepted from etcd (a range page of batch records).
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct EtcdKvConfig {
    /// Client endpoints, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Deadline of one request; past it a write's outcome is ambiguous.
    pub request_timeout: Duration,
    /// Deadline for establishing a connection.
    pub connect_timeout: Duration,
    /// Limits the server enforces (checked here first so an oversized request fails before it is sent).
    pub limits: KvLimits,
}

impl EtcdKvConfig {
    /// Defaults for `endpoints`: 5 s request and connect timeouts (as the original), etcd's default limits.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            limits: KvLimits::ETCD_DEFAULT,
        }
    }
}

/// A [`HaKvBackend`] on etcd. Cheap to clone (the client is shared).
#[derive(Clone)]
pub struct EtcdKv {
    client: KvClient,
    limits: KvLimits,
}

impl std::fmt::Debug for EtcdKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdKv").field("limits", &self.limits).finish_non_exhaustive()
    }
}

/// Whether a failed call may have had an effect (writes) or certainly had none (reads).
#[derive(Clone, Copy)]
enum Call {
    Read,
    Write,
}

fn map_err(e: etcd_client::Error, call: Call) -> KvError {
    use etcd_client::Error as E;
    let msg = e.to_string();
    let refused = match &e {
        E::GRpcStatus(status) => match classify(i32::from(status.code()), status.message()) {
            Status::Refused => true,
            Status::Exhausted => return KvError::Exhausted(msg),
            Status::Transient => false,
        },
        E::InvalidArgs(_) | E::InvalidUri(_) | E::EndpointError(_) | E::InvalidMetadataValue(_) => true,
        _ => false,
    };
    if refused {
        return KvError::Rejected(msg);
    }
    match call {
        // A read that failed changed nothing: retrying is safe.
        Call::Read => KvError::Unavailable(msg),
        // A write that failed after it may have left this process could have been applied.
        Call::Write => KvError::Ambiguous(msg),
    }
}

/// What a gRPC status from etcd means for a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// The server refused the request itself: the same request can never succeed.
    Refused,
    /// Out of space (the NOSPACE alarm) or too many requests: it passes once space is freed or load drops.
    Exhausted,
    /// Unavailable, deadline, cancelled, unknown, ...: the connection or the server may come back.
    Transient,
}

/// Classifies a gRPC status code (numbered as in the gRPC spec, so no direct tonic dependency is needed) and
/// message from etcd.
fn classify(code: i32, message: &str) -> Status {
    const INVALID_ARGUMENT: i32 = 3;
    const NOT_FOUND: i32 = 5;
    const ALREADY_EXISTS: i32 = 6;
    const PERMISSION_DENIED: i32 = 7;
    const RESOURCE_EXHAUSTED: i32 = 8;
    const FAILED_PRECONDITION: i32 = 9;
    const OUT_OF_RANGE: i32 = 11;
    const UNIMPLEMENTED: i32 = 12;
    const UNAUTHENTICATED: i32 = 16;
    match code {
        // gRPC's own "received message larger than max" is RESOURCE_EXHAUSTED too, and a retry of the same
        // request cannot help; etcd's "database space exceeded" and "too many requests" pass.
        RESOURCE_EXHAUSTED if message.contains("larger than max") => Status::Refused,
        RESOURCE_EXHAUSTED => Status::Exhausted,
        INVALID_ARGUMENT | NOT_FOUND | ALREADY_EXISTS | PERMISSION_DENIED | FAILED_PRECONDITION | OUT_OF_RANGE
        | UNIMPLEMENTED | UNAUTHENTICATED => Status::Refused,
        _ => Status::Transient,
    }
}

impl EtcdKv {
    /// Connects to etcd.
    pub async fn connect(config: EtcdKvConfig) -> Result<Self, KvError> {
        let opts =
            ConnectOptions::new().with_timeout(config.request_timeout).with_connect_timeout(config.connect_timeout);
        let client = Client::connect(&config.endpoints, Some(opts))
            .await
            .map_err(|e| KvError::Unavailable(format!("connect {:?}: {e}", config.endpoints)))?;
        // Range pages of full batches run to several MiB; tonic's default 4 MiB receive limit would refuse them.
        let client = client.kv_client().max_decoding_message_size(MAX_RESPONSE_BYTES);
        Ok(Self { client, limits: config.limits })
    }
}

impl HaKvBackend for EtcdKv {
    fn get<'a>(&'a self, key: &'a [u8]) -> KvFuture<'a, Option<Vec<u8>>> {
        // The client's methods take `&mut self`; clones share one channel.
        let mut c = self.client.clone();
        Box::pin(async move {
            let mut resp = c.get(key, None).await.map_err(|e| map_err(e, Call::Read))?;
            Ok(resp.take_kvs().into_iter().next().map(|kv| kv.into_key_value().1))
        })
    }

    fn put<'a>(&'a self, key: &'a [u8], value: &'a [u8]) -> KvFuture<'a, ()> {
        let mut c = self.client.clone();
        Box::pin(async move {
            self.limits.check_put(key, value)?;
            c.put(key, value, None).await.map_err(|e| map_err(e, Call::Write))?;
            Ok(())
        })
    }

    fn range<'a>(&'a self, begin: &'a [u8], end: &'a [u8], limit: usize) -> KvFuture<'a, RangePage> {
        let mut c = self.client.clone();
        Box::pin(async move {
            if !end.is_empty() && begin >= end {
                return Ok(RangePage::default());
            }
            let opts =
                if end.is_empty() { GetOptions::new().with_from_key() } else { GetOptions::new().with_range(end) };
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let mut resp = c.get(begin, Some(opts.with_limit(limit))).await.map_err(|e| map_err(e, Call::Read))?;
            let more = resp.more();
            let kvs = resp
                .take_kvs()
                .into_iter()
                .map(|kv| {
                    let (key, value) = kv.into_key_value();
                    KvPair { key, value }
                })
                .collect();
            Ok(RangePage { kvs, more })
        })
    }

    fn txn<'a>(&'a self, txn: &'a KvTxn) -> KvFuture<'a, TxnOutcome> {
        let mut c = self.client.clone();
        Box::pin(async move {
            self.limits.check_txn(txn)?;
            let compares: Vec<Compare> = txn
                .compares
                .iter()
                .map(|cmp| match cmp {
                    KvCompare::ValueEquals(k, v) => Compare::value(k.clone(), CompareOp::Equal, v.clone()),
                    // A key that does not exist has create_revision 0.
                    KvCompare::KeyAbsent(k) => Compare::create_revision(k.clone(), CompareOp::Equal, 0),
                })
                .collect();
            let puts: Vec<TxnOp> = txn.puts.iter().map(|p| TxnOp::put(p.key.clone(), p.value.clone(), None)).collect();
            let resp = c.txn(Txn::new().when(compares).and_then(puts)).await.map_err(|e| map_err(e, Call::Write))?;
            Ok(if resp.succeeded() { TxnOutcome::Succeeded } else { TxnOutcome::CompareFailed })
        })
    }

    fn supports_txn(&self) -> bool {
        true
    }

    fn limits(&self) -> KvLimits {
        self.limits
    }

    fn delete_range<'a>(&'a self, begin: &'a [u8], end: &'a [u8]) -> KvFuture<'a, u64> {
        let mut c = self.client.clone();
        Box::pin(async move {
            if !end.is_empty() && begin >= end {
                return Ok(0);
            }
            let opts = if end.is_empty() {
                DeleteOptions::new().with_from_key()
            } else {
                DeleteOptions::new().with_range(end)
            };
            let resp = c.delete(begin, Some(opts)).await.map_err(|e| map_err(e, Call::Write))?;
            Ok(u64::try_from(resp.deleted()).unwrap_or(0))
        })
    }

    fn revision<'a>(&'a self) -> KvFuture<'a, u64> {
        let mut c = self.client.clone();
        Box::pin(async move {
            // Any read's header carries the store's revision; counting one key reads nothing back.
            let resp = c
                .get(&b"\0"[..], Some(GetOptions::new().with_count_only()))
                .await
                .map_err(|e| map_err(e, Call::Read))?;
            Ok(resp.header().map_or(0, |h| u64::try_from(h.revision()).unwrap_or(0)))
        })
    }

    fn compact<'a>(&'a self, revision: u64) -> KvFuture<'a, ()> {
        let mut c = self.client.clone();
        Box::pin(async move {
            let Ok(rev) = i64::try_from(revision) else {
                return Err(KvError::Rejected(format!("revision {revision} is out of etcd's range")));
            };
            if rev <= 0 {
                return Ok(());
            }
            match c.compact(rev, None).await {
                Ok(_) => Ok(()),
                // Someone (etcd's own auto-compaction, another master) already compacted past it: nothing to do.
                Err(e) if e.to_string().contains("required revision has been compacted") => Ok(()),
                Err(e) => Err(map_err(e, Call::Write)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_exhaustion_passes_but_oversized_messages_and_refusals_do_not() {
        assert_eq!(classify(8, "etcdserver: mvcc: database space exceeded"), Status::Exhausted);
        assert_eq!(classify(8, "etcdserver: too many requests"), Status::Exhausted);
        assert_eq!(classify(8, "grpc: received message larger than max (2000000 vs. 1572864)"), Status::Refused);
        assert_eq!(classify(3, "etcdserver: request is too large"), Status::Refused);
        assert_eq!(classify(14, "transport is closing"), Status::Transient);
        assert_eq!(classify(4, "context deadline exceeded"), Status::Transient);
    }
}
