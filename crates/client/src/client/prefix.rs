//! Prefix lookups that lease what they find: an engine asks how long a run of a prompt's blocks is cached, then
//! reads that run. Asked with `batch_is_exist`, the two steps race eviction and cost two lookups; here the
//! master answers the run and leases it in one step (`BatchPrefixLease`), and the replica lists it answers with
//! are kept for the read that follows, which then needs no lookup of its own and cannot miss those objects
//! while the lease lasts.
//!
//! The kept lists are one-shot: the first batch read whose keys are all in one kept lookup takes it (and its
//! release at the end of the read ends those leases, as a read's own would). A lookup nobody reads lets its
//! leases run out on the master; here it is dropped once its lease has passed, or when newer lookups push it
//! out ([`KEPT_LOOKUPS`]).

use super::{Client, check_key};
use crate::error::ClientError;
use crescent_proto::transfer::Grant;
use crescent_proto::wire::{Batch, MAX_BATCH, WireKey};
use crescent_proto::{ErrorCode, GetReplicaListResponse, MasterRequest, MasterResponse};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most lookups kept for a read at once (an engine reads what it looked up next; more would be leases nobody
/// reads).
pub(crate) const KEPT_LOOKUPS: usize = 64;

/// A prefix lookup's answer, kept for the read that follows it.
#[derive(Debug)]
struct Kept {
    /// The run's keys, each with its replica list.
    lists: HashMap<String, GetReplicaListResponse>,
    /// The grants of the reply (its descriptors may name them by index).
    grants: Vec<Arc<Grant>>,
    /// When the lookup was sent: its leases run from then (reads judge expiry against it).
    sent: Instant,
    /// The shortest lease of the run.
    lease: Duration,
}

/// The lookups kept for reads, newest last. Owned by the client; locked only to add or take one (no I/O under
/// the lock).
#[derive(Debug, Default)]
pub(crate) struct KeptLookups {
    kept: parking_lot::Mutex<VecDeque<Kept>>,
}

/// Replica lists taken for a read: per key in the read's order, the grants they name, and when their leases
/// began.
pub(crate) struct TakenLists {
    pub(crate) lists: Vec<Result<GetReplicaListResponse, ErrorCode>>,
    pub(crate) grants: Vec<Arc<Grant>>,
    pub(crate) sent: Instant,
}

impl KeptLookups {
    fn keep(&self, k: Kept) {
        let mut kept = self.kept.lock();
        let now = Instant::now();
        kept.retain(|old| now.saturating_duration_since(old.sent) < old.lease);
        if kept.len() == KEPT_LOOKUPS {
            kept.pop_front();
        }
        kept.push_back(k);
    }

    /// The kept lookup holding every one of `keys` with at least half its lease left (a read that starts later
    /// looks its keys up afresh rather than risk outliving the lease), taken out of the kept set.
    pub(crate) fn take(&self, keys: &[&str]) -> Option<TakenLists> {
        if keys.is_empty() {
            return None;
        }
        let mut kept = self.kept.lock();
        if kept.is_empty() {
            return None;
        }
        let now = Instant::now();
        let at = kept.iter().rposition(|k| {
            now.saturating_duration_since(k.sent) < k.lease / 2 && keys.iter().all(|key| k.lists.contains_key(*key))
        })?;
        let k = kept.remove(at)?;
        drop(kept);
        let lists = keys.iter().map(|key| k.lists.get(*key).cloned().ok_or(ErrorCode::InternalError)).collect();
        Some(TakenLists { lists, grants: k.grants, sent: k.sent })
    }

    /// Lookups kept now (tests and metrics).
    pub(crate) fn len(&self) -> usize {
        self.kept.lock().len()
    }
}

impl Client {
    /// How many of `keys`, from the first, are cached and readable now: the master leases exactly that run in
    /// the same step, so a [`Client::batch_get_into`] of those keys that follows within the lease finds them
    /// (and, reading the replica lists this call kept, asks the master nothing). The first key that is not
    /// readable (absent, being written, on unreachable nodes, or not a valid key) ends the run; nothing after it
    /// is looked at or leased.
    pub async fn batch_prefix_lease(&self, keys: &[&str]) -> Result<usize, ClientError> {
        let valid = keys.iter().take_while(|k| check_key(k).is_ok()).count().min(MAX_BATCH);
        if valid == 0 {
            return Ok(0);
        }
        let keys = &keys[..valid];
        let req = MasterRequest::BatchPrefixLease {
            tenant: self.tenant(),
            keys: Batch(keys.iter().map(|k| WireKey::from(*k)).collect()),
        };
        let sent = Instant::now();
        let batch = match self.inner.master.call(&req).await? {
            MasterResponse::BatchReplicaList(b) if b.items.len() <= keys.len() => b,
            _ => return Err(ClientError::Code(ErrorCode::InternalError)),
        };
        let run = batch.items.len();
        let mut lists = HashMap::with_capacity(run);
        let mut lease = Duration::MAX;
        for (key, item) in keys.iter().zip(batch.items) {
            let list = item.map_err(ClientError::Code)?;
            lease = lease.min(Duration::from_millis(list.lease_ttl_ms));
            lists.insert((*key).to_owned(), list);
        }
        if run > 0 {
            let grants = batch.grants.into_iter().map(Arc::new).collect();
            self.inner.prefix.keep(Kept { lists, grants, sent, lease });
        }
        Ok(run)
    }

    /// Prefix lookups kept for a read that has not come yet.
    pub fn kept_prefix_lookups(&self) -> usize {
        self.inner.prefix.len()
    }
}
