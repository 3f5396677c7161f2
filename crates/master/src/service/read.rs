//! The read path: GetReplicaList, ExistKey and batch forms grant leases (group-aware); a reader releases its
//! lease when it has its bytes (ReleaseLeases); Stat looks without leasing.

use super::{Handout, MasterService};
use crate::clock::Timestamp;
use crate::metadata::{Lifecycle, ObjectEntry, ObjectState, Replica, TenantState};
use crescent_proto::{ErrorCode, GetReplicaListResponse, ObjectStat, ReplicaDescriptor, ReplicaStatus};
use std::sync::Arc;

/// The outcome of looking an object up for reading.
enum Lookup {
    Found {
        descriptors: Vec<ReplicaDescriptor>,
        checksum: Option<u64>,
        size: u64,
    },
    NotReady,
    /// Complete replicas exist, all on segments whose nodes cannot be reached now (suspect).
    Unreachable,
    Missing,
}

impl MasterService {
    /// GetReplicaList: readable replicas + lease + checksum. `OBJECT_NOT_FOUND` if absent,
    /// `REPLICA_IS_NOT_READY` while only unfinished replicas exist, `UNAVAILABLE_IN_CURRENT_STATUS` while every
    /// replica is on a node that cannot be reached (suspect; readable again when it answers).
    pub fn get_replica_list(&self, tenant: &str, key: &str) -> Result<GetReplicaListResponse, ErrorCode> {
        let r = self.get_one(tenant, key);
        self.metrics.get_replica_list.record(&r);
        r
    }

    /// BatchGetReplicaList: per key, in input order.
    pub fn batch_get_replica_list(
        &self,
        tenant: &str,
        keys: &[&str],
    ) -> Vec<Result<GetReplicaListResponse, ErrorCode>> {
        let rs = match self.read_tenant(tenant) {
            Err(e) => vec![Err(e); keys.len()],
            Ok(t) => {
                let now = self.clock.now();
                keys.iter().map(|k| self.get_in(t.as_ref(), k, now)).collect()
            }
        };
        self.metrics.get_replica_list.record_all(&rs);
        rs
    }

    /// BatchPrefixLease: the longest run of `keys`, from the first, that is readable now, each looked up and
    /// leased as GetReplicaList does (in one pass, one clock reading); the first key that is not ends the run
    /// and no key after it is looked at or leased. An invalid tenant id is refused; an unknown tenant has no
    /// run.
    pub fn batch_prefix_lease(&self, tenant: &str, keys: &[&str]) -> Result<Vec<GetReplicaListResponse>, ErrorCode> {
        let t = self.read_tenant(tenant)?;
        let now = self.clock.now();
        let run: Vec<GetReplicaListResponse> =
            keys.iter().map_while(|k| self.get_in(t.as_ref(), k, now).ok()).collect();
        self.metrics.prefix_lookups.record(keys.len(), run.len());
        Ok(run)
    }

    fn get_one(&self, tenant: &str, key: &str) -> Result<GetReplicaListResponse, ErrorCode> {
        let t = self.read_tenant(tenant)?;
        self.get_in(t.as_ref(), key, self.clock.now())
    }

    fn get_in(
        &self,
        tenant: Option<&Arc<TenantState>>,
        key: &str,
        now: Timestamp,
    ) -> Result<GetReplicaListResponse, ErrorCode> {
        match self.lookup_and_lease(tenant, key, true, now) {
            Lookup::Found { descriptors, checksum, size } => Ok(GetReplicaListResponse {
                replicas: descriptors,
                lease_ttl_ms: self.config.lease_ttl_ms,
                checksum,
                size,
            }),
            other => Err(other.refusal()),
        }
    }

    /// The replicas a read would be handed now, looked at without a lease, a count in the per-key metrics, a
    /// promotion or a grant: what the admin port's `/query_key` shows (an operator's look must not keep an
    /// object from eviction nor move it). Refused as `get_replica_list` refuses.
    pub fn peek_replicas(&self, tenant: &str, key: &str) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        let t = self.read_tenant(tenant)?.ok_or(ErrorCode::ObjectNotFound)?;
        let entry = t.objects().get(key).ok_or(ErrorCode::ObjectNotFound)?;
        let st = entry.lock();
        if st.lifecycle() != Lifecycle::Active {
            return Err(ErrorCode::ObjectNotFound);
        }
        let found: Vec<ReplicaDescriptor> =
            st.replicas.iter().filter(|r| r.is_readable()).filter_map(Replica::descriptor).collect();
        if found.is_empty() { Err(unreadable(&st).refusal()) } else { Ok(found) }
    }

    /// ExistKey: whether the object has a readable replica (and, if so, a lease is granted). A missing key or
    /// tenant is `false`, not an error; an invalid tenant id is `INVALID_PARAMS`.
    pub fn exist_key(&self, tenant: &str, key: &str) -> Result<bool, ErrorCode> {
        let r = self.read_tenant(tenant).map(|t| self.exists_in(t.as_ref(), key, self.clock.now()));
        self.metrics.exist_key.record(&r);
        r
    }

    /// BatchExistKey: per key, in input order.
    pub fn batch_exist_key(&self, tenant: &str, keys: &[&str]) -> Vec<Result<bool, ErrorCode>> {
        let rs = match self.read_tenant(tenant) {
            Err(e) => vec![Err(e); keys.len()],
            Ok(t) => {
                let now = self.clock.now();
                keys.iter().map(|k| Ok(self.exists_in(t.as_ref(), k, now))).collect()
            }
        };
        self.metrics.exist_key.record_all(&rs);
        rs
    }

    fn exists_in(&self, tenant: Option<&Arc<TenantState>>, key: &str, now: Timestamp) -> bool {
        matches!(self.lookup_and_lease(tenant, key, false, now), Lookup::Found { .. })
    }

    /// Finds readable replicas and grants the lease (from `now`, read once per request); refreshes the whole
    /// group's leases when this member's lease was within half a TTL of expiry or the group's membership
    /// changed.
    fn lookup_and_lease(
        &self,
        tenant: Option<&Arc<TenantState>>,
        key: &str,
        want_descriptors: bool,
        now: Timestamp,
    ) -> Lookup {
        let Some(tenant) = tenant else { return Lookup::Missing };
        let Some(entry) = tenant.objects().get(key) else { return Lookup::Missing };
        let deadline = now.saturating_add(self.lease_ttl());
        let (found, refresh_group) = {
            let mut st = entry.lock();
            if st.lifecycle() != Lifecycle::Active {
                return Lookup::Missing;
            }
            // Segment liveness is not under this lock, so readability is decided on one look: the descriptors
            // handed out (a second look could find the last readable segment gone and answer with no replicas).
            let descriptors: Vec<ReplicaDescriptor> = if want_descriptors {
                self.hand_out(st.replicas.iter().filter(|r| r.is_readable()), Handout::Read)
            } else {
                Vec::new()
            };
            let readable = if want_descriptors { !descriptors.is_empty() } else { st.has_readable() };
            if !readable {
                return unreadable(&st);
            }
            // Found only on a disk tier: bring it back to memory in the background when there is room.
            if want_descriptors && descriptors.iter().all(|d| d.location.is_disk()) {
                self.maybe_promote(tenant, &entry, &st);
            }
            let half = self.config.lease_ttl_ms / 2;
            let near_expiry = st.lease().0 <= now.0.saturating_add(half);
            st.grant_lease(now, deadline);
            let checksum = st.flags.has_checksum().then_some(u64::from(st.checksum));
            (Lookup::Found { descriptors, checksum, size: st.size }, near_expiry)
        };
        if entry.group().is_some() {
            refresh_group_leases(&entry, deadline, refresh_group);
        }
        found
    }
}

impl MasterService {
    /// ReleaseLeases: the caller is done reading `keys`; each object's lease ends when its last reader releases
    /// it. Keys that name nothing (or are malformed) are ignored: a release can only shorten a lease.
    pub fn release_leases(&self, tenant: &str, keys: &[&str]) -> Result<(), ErrorCode> {
        let Some(t) = self.read_tenant(tenant)? else { return Ok(()) };
        let now = self.clock.now();
        for key in keys {
            if let Some(entry) = t.objects().get(key) {
                entry.lock().release_lease(now);
            }
        }
        Ok(())
    }

    /// Stat: an object's size, checksum, replicas (readable or not), lease and pins, without leasing it.
    pub fn stat(&self, tenant: &str, key: &str) -> Result<ObjectStat, ErrorCode> {
        let t = self.read_tenant(tenant)?.ok_or(ErrorCode::ObjectNotFound)?;
        let entry = t.objects().get(key).ok_or(ErrorCode::ObjectNotFound)?;
        let now = self.clock.now();
        let st = entry.lock();
        if st.lifecycle() != Lifecycle::Active {
            return Err(ErrorCode::ObjectNotFound);
        }
        let leased = st.leased(now);
        Ok(ObjectStat {
            size: st.size,
            checksum: st.flags.has_checksum().then_some(u64::from(st.checksum)),
            replicas: st.replicas.iter().filter_map(Replica::descriptor).collect(),
            lease_remaining_ms: if leased { st.lease().0 - now.0 } else { 0 },
            lease_readers: if leased { u32::from(st.readers) } else { 0 },
            soft_pin_remaining_ms: if st.soft_pinned(now) { st.soft_pin().0 - now.0 } else { 0 },
            hard_pinned: st.hard_pinned(),
            writing: st.pending().is_some(),
        })
    }
}

/// Why an active object with no readable replica cannot be read: a write in flight, replicas only on nodes
/// that cannot be reached now, or nothing left.
fn unreadable(st: &ObjectState) -> Lookup {
    let in_flight = st.replicas.iter().any(|r| r.status == ReplicaStatus::Processing && r.is_valid());
    let unreachable = st.replicas.iter().any(|r| r.status == ReplicaStatus::Complete && r.is_valid());
    if in_flight || st.pending().is_some() {
        Lookup::NotReady
    } else if unreachable {
        Lookup::Unreachable
    } else {
        Lookup::Missing
    }
}

impl Lookup {
    /// The refusal a read gets for an object it found nothing to read of.
    fn refusal(&self) -> ErrorCode {
        match self {
            Lookup::NotReady => ErrorCode::ReplicaIsNotReady,
            Lookup::Unreachable => ErrorCode::UnavailableInCurrentStatus,
            Lookup::Missing | Lookup::Found { .. } => ErrorCode::ObjectNotFound,
        }
    }
}

/// Extends every member's lease to `deadline` if `needed` or the membership changed since the last refresh.
/// Group lock first, then each member's lock in canonical key order (one at a time).
fn refresh_group_leases(entry: &Arc<ObjectEntry>, deadline: Timestamp, needed: bool) {
    let Some(group) = entry.group() else { return };
    if !needed && !group.is_dirty() {
        return;
    }
    let members = group.lock();
    group.clear_dirty();
    for m in members.live_sorted() {
        let mut st = m.lock();
        if st.lifecycle() == Lifecycle::Active {
            st.extend_lease(deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::service::MasterConfig;
    use crescent_proto::{ClientId, ReplicateConfig};

    #[test]
    fn a_peek_shows_readable_replicas_without_a_lease_or_a_count() {
        let svc = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1_000))).unwrap();
        svc.mount_segment(ClientId::random(), crescent_testkit::segment("seg", 1 << 20)).unwrap();
        let w = ClientId::random();
        assert_eq!(svc.peek_replicas("", "k"), Err(ErrorCode::ObjectNotFound));
        svc.put_start(w, "", "k", 100, &ReplicateConfig::default()).unwrap();
        assert_eq!(svc.peek_replicas("", "k"), Err(ErrorCode::ReplicaIsNotReady), "still being written");
        svc.put_end(w, "", "k", None).unwrap();
        let peeked = svc.peek_replicas("", "k").unwrap();
        assert_eq!(peeked.len(), 1);
        assert_eq!(peeked[0].location.length(), 100);
        assert!(peeked[0].grant.is_none(), "a look carries no grant");
        let stat = svc.stat("", "k").unwrap();
        assert_eq!((stat.lease_remaining_ms, stat.lease_readers), (0, 0), "a look leases nothing");
        assert_eq!(svc.metrics().get_replica_list.requests.load(std::sync::atomic::Ordering::Relaxed), 0);
        // A read sees the same replicas (and leases them).
        let read = svc.get_replica_list("", "k").unwrap();
        assert_eq!(read.replicas.iter().map(|d| &d.location).collect::<Vec<_>>(), vec![&peeked[0].location]);
        assert!(svc.stat("", "k").unwrap().lease_remaining_ms > 0);
    }

    #[test]
    fn a_read_tenant_is_checked_only_on_a_multi_tenant_master() {
        let single = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1_000))).unwrap();
        assert_eq!(single.check_read_tenant("_bad"), Ok(()), "a single-tenant master reads the default tenant");
        let config = MasterConfig { enable_multi_tenants: true, ..MasterConfig::default() };
        let multi = MasterService::new(config, ManualClock::new(Timestamp(1_000))).unwrap();
        assert_eq!(multi.check_read_tenant("_bad"), Err(ErrorCode::InvalidParams));
        assert_eq!(multi.check_read_tenant("nobody"), Ok(()), "valid, empty");
        assert_eq!(multi.peek_replicas("nobody", "k"), Err(ErrorCode::ObjectNotFound));
        assert_eq!(multi.peek_replicas("_bad", "k"), Err(ErrorCode::InvalidParams));
    }
}
