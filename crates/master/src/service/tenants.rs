//! Tenant quota administration (multi-tenant mode).

use super::MasterService;
use crate::metadata::{QuotaAccount, TenantState};
use crescent_proto::{ErrorCode, SegmentKind, TenantId, TenantInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One tenant's quota as reported to admins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantQuotaSnapshot {
    /// The tenant.
    pub tenant_id: String,
    /// Requested quota (0 for orphans).
    pub requested_quota_bytes: u64,
    /// Effective quota after scaling to capacity.
    pub effective_quota_bytes: u64,
    /// Bytes charged.
    pub charged_bytes: u64,
    /// Writes refused (no policy).
    pub admission_closed: bool,
    /// Charged beyond the effective quota.
    pub over_quota: bool,
    /// Has a policy.
    pub has_explicit_policy: bool,
    /// Objects the tenant holds.
    #[serde(default)]
    pub objects: u64,
}

impl From<TenantQuotaSnapshot> for TenantInfo {
    fn from(s: TenantQuotaSnapshot) -> Self {
        TenantInfo {
            tenant: s.tenant_id,
            requested_quota: s.requested_quota_bytes,
            effective_quota: s.effective_quota_bytes,
            charged: s.charged_bytes,
            objects: s.objects,
            admission_closed: s.admission_closed,
            over_quota: s.over_quota,
            has_policy: s.has_explicit_policy,
        }
    }
}

/// How long a tenant teardown waits for the operations already admitted (each holds the tenant for one
/// service call, microseconds).
const TEARDOWN_DRAIN: std::time::Duration = std::time::Duration::from_millis(100);

/// Waits until no operation holds `t`: spins briefly, then sleeps in short steps, up to `limit`.
fn drain(t: &TenantState, limit: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    let mut spins = 0u32;
    while t.inflight() > 0 {
        if start.elapsed() >= limit {
            return false;
        }
        spins += 1;
        if spins < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
    true
}

impl MasterService {
    fn require_multi_tenant(&self) -> Result<(), ErrorCode> {
        if self.config.enable_multi_tenants { Ok(()) } else { Err(ErrorCode::UnavailableInCurrentMode) }
    }

    fn tenant_id(tenant: &str) -> Result<TenantId, ErrorCode> {
        TenantId::new(tenant).map_err(|_| ErrorCode::InvalidParams)
    }

    /// Sets a tenant's requested quota (registering the tenant) and recomputes effective quotas.
    pub fn upsert_tenant_quota(&self, tenant: &str, bytes: u64) -> Result<(), ErrorCode> {
        self.require_multi_tenant()?;
        let id = Self::tenant_id(tenant)?;
        let slot = self.reserve_oplog()?;
        let mut p = self.policies.lock();
        p.upsert(id.clone(), bytes)?;
        self.tenants.get_or_insert_with(&id, || TenantState::new(id.clone(), QuotaAccount::closed()));
        self.apply_quotas(&p);
        if let Some(slot) = slot {
            let quota = crate::ha::payload::TenantQuota { bytes };
            slot.commit(crate::ha::MasterEntry::TenantQuotaSet { tenant: id.to_string(), quota }, None)?;
        }
        Ok(())
    }

    /// Deletes a tenant's policy: `OBJECT_NOT_FOUND` without one, `TENANT_NOT_EMPTY` while it holds objects or
    /// charges. An empty tenant is torn down as the RFC orders it: admission closed (new writes are refused),
    /// the operations already admitted drained (waited for, briefly: if they do not finish, or leave objects,
    /// the tenant is reopened and the delete refused), unregistered (only this instance: a tenant re-created
    /// under the name meanwhile is not touched), then its policy released.
    pub fn delete_tenant_quota(&self, tenant: &str) -> Result<(), ErrorCode> {
        self.require_multi_tenant()?;
        let id = Self::tenant_id(tenant)?;
        let slot = self.reserve_oplog()?;
        let mut p = self.policies.lock();
        if p.requested(&id).is_none() {
            return Err(ErrorCode::ObjectNotFound);
        }
        if let Some(t) = self.tenants.get(&id) {
            // Not even closed for a tenant visibly in use.
            if !t.objects().is_empty() || t.quota().charged() != 0 || !t.close() {
                return Err(ErrorCode::TenantNotEmpty);
            }
            let drained = drain(&t, TEARDOWN_DRAIN);
            if !drained || !t.objects().is_empty() || t.quota().charged() != 0 {
                t.reopen();
                return Err(ErrorCode::TenantNotEmpty);
            }
            self.tenants.remove_if_match(&t);
            t.mark_removed();
        }
        p.remove(&id);
        self.apply_quotas(&p);
        if let Some(slot) = slot {
            slot.commit(crate::ha::MasterEntry::TenantRemove { tenant: id.to_string() }, None)?;
        }
        Ok(())
    }

    /// Replaces the whole policy set (a reload). Tenants left without a policy become orphans: readable and
    /// removable, not writable.
    pub fn apply_tenant_policies(&self, policies: &BTreeMap<String, u64>) -> Result<(), ErrorCode> {
        self.require_multi_tenant()?;
        let mut next = crate::metadata::QuotaPolicies::default();
        for (t, q) in policies {
            next.upsert(Self::tenant_id(t)?, *q)?;
        }
        let slot = self.reserve_oplog()?;
        // The whole set is one entry: one too large for the log is refused before anything changes.
        let entry = slot.as_ref().map(|_| {
            let policies = policies.iter().map(|(t, q)| (t.clone(), *q)).collect();
            crate::ha::MasterEntry::TenantPolicies(crate::ha::payload::TenantPolicies { policies })
        });
        if let Some(e) = &entry
            && let Err(why) = e.encode().validate()
        {
            tracing::warn!(tenants = policies.len(), error = %why, "tenant policy set refused: too large for one log entry");
            return Err(ErrorCode::InvalidParams);
        }
        let mut p = self.policies.lock();
        for id in next.tenants() {
            self.tenants.get_or_insert_with(id, || TenantState::new(id.clone(), QuotaAccount::closed()));
        }
        *p = next;
        self.apply_quotas(&p);
        if let (Some(slot), Some(entry)) = (slot, entry) {
            slot.commit(entry, None)?;
        }
        Ok(())
    }

    /// Recomputes effective quotas from the memory capacity mounted now (after mount/unmount/expiry).
    pub(super) fn recompute_quotas(&self) {
        if self.config.enable_multi_tenants {
            let p = self.policies.lock();
            self.apply_quotas(&p);
        }
    }

    /// Writes effective quotas into accounts; called with the policy lock held (serialises recomputations).
    fn apply_quotas(&self, p: &crate::metadata::QuotaPolicies) {
        let capacity: u64 = self
            .pool
            .segments()
            .iter()
            .filter(|s| matches!(s.spec.kind, SegmentKind::Memory | SegmentKind::Cxl))
            .map(|s| s.spec.size)
            .sum();
        let effective = p.effective(capacity);
        for t in self.tenants.all() {
            match effective.get(t.id()) {
                Some(&q) => t.quota().set_policy(q, true),
                None => t.quota().set_policy(0, false),
            }
        }
    }

    /// Quota snapshots of tenants with a policy or a charge, sorted by id (`None` in single-tenant mode).
    pub fn tenant_quotas(&self) -> Option<Vec<TenantQuotaSnapshot>> {
        if !self.config.enable_multi_tenants {
            return None;
        }
        let p = self.policies.lock();
        let out = self
            .tenants
            .all()
            .iter()
            .filter(|t| p.requested(t.id()).is_some() || t.quota().charged() > 0 || !t.objects().is_empty())
            .map(|t| {
                let q = t.quota();
                TenantQuotaSnapshot {
                    tenant_id: t.id().to_string(),
                    requested_quota_bytes: p.requested(t.id()).unwrap_or(0),
                    effective_quota_bytes: q.effective(),
                    charged_bytes: q.charged(),
                    admission_closed: q.is_closed(),
                    over_quota: q.charged() > q.effective(),
                    has_explicit_policy: p.requested(t.id()).is_some(),
                    objects: t.objects().len() as u64,
                }
            })
            .collect();
        Some(out)
    }

    /// Every tenant with a policy or objects, as the wire reports it (`UNAVAILABLE_IN_CURRENT_MODE` in
    /// single-tenant mode).
    pub fn list_tenants(&self) -> Result<Vec<TenantInfo>, ErrorCode> {
        let all = self.tenant_quotas().ok_or(ErrorCode::UnavailableInCurrentMode)?;
        Ok(all.into_iter().map(TenantInfo::from).collect())
    }

    /// One tenant's quota snapshot.
    pub fn tenant_quota(&self, tenant: &str) -> Option<TenantQuotaSnapshot> {
        let id = TenantId::new(tenant).ok()?;
        self.tenant_quotas()?.into_iter().find(|s| s.tenant_id == id.as_str())
    }
}

#[cfg(test)]
mod teardown_tests {
    #![allow(clippy::unwrap_used)]
    use crate::clock::{ManualClock, Timestamp};
    use crate::service::{MasterConfig, MasterService};
    use crate::test_hooks;
    use crescent_proto::{ClientId, ErrorCode, ReplicateConfig, SegmentKind};
    use std::sync::Arc;

    fn master() -> Arc<MasterService> {
        let config = MasterConfig { enable_multi_tenants: true, ..MasterConfig::default() };
        let svc = Arc::new(MasterService::new(config, ManualClock::new(Timestamp(1))).unwrap());
        svc.mount_segment(ClientId::random(), crescent_testkit::segment("s", 1 << 24)).unwrap();
        svc.upsert_tenant_quota("t", 1 << 20).unwrap();
        svc
    }

    /// The interleaving that leaked before teardown had a lifecycle: a write resolves its tenant, the tenant
    /// is deleted and re-created, the write goes on. Now the delete is refused while the write holds the
    /// tenant, and the write lands in the tenant that is registered.
    #[test]
    fn a_delete_between_a_writes_tenant_lookup_and_its_publication_is_refused() {
        let svc = master();
        let during = svc.clone();
        let seen = Arc::new(parking_lot::Mutex::new(None));
        let seen2 = seen.clone();
        test_hooks::set_after_write_tenant(move || {
            let deleted = during.delete_tenant_quota("t");
            during.upsert_tenant_quota("t", 1 << 20).unwrap();
            *seen2.lock() = Some(deleted);
        });
        let w = ClientId::random();
        svc.put_start(w, "t", "k", 4096, &ReplicateConfig::default()).unwrap();
        svc.put_end(w, "t", "k", None).unwrap();
        assert_eq!(*seen.lock(), Some(Err(ErrorCode::TenantNotEmpty)), "the delete waited, then refused");
        assert_eq!(svc.get_replica_list("t", "k").unwrap().size, 4096, "the object is reachable");
        let audit = svc.audit();
        assert!(audit.quota_mismatches.is_empty(), "{audit:?}");
        assert_eq!(svc.pool().usage(SegmentKind::Memory).used, audit.replica_bytes);
        // Once the write is done the tenant is deleted normally (after its object goes).
        svc.remove("t", "k", true).unwrap();
        svc.delete_tenant_quota("t").unwrap();
        assert_eq!(svc.put_start(w, "t", "k", 1, &ReplicateConfig::default()), Err(ErrorCode::TenantNotRegistered));
    }

    /// A handle kept across a teardown cannot act: the instance it names is removed, and the tenant re-created
    /// under the name is another instance.
    #[test]
    fn a_stale_tenant_handle_never_acts_on_a_recreated_tenant() {
        let svc = master();
        let id = crescent_proto::TenantId::new("t").unwrap();
        let old = svc.tenants.get(&id).unwrap();
        svc.delete_tenant_quota("t").unwrap();
        svc.upsert_tenant_quota("t", 1 << 20).unwrap();
        let new = svc.tenants.get(&id).unwrap();
        assert_ne!(old.instance(), new.instance());
        assert_eq!(old.lifecycle(), crate::metadata::TenantLifecycle::Removed);
        assert!(old.enter(true).is_none(), "the old instance admits nothing");
        assert!(new.enter(true).is_some());
    }
}
