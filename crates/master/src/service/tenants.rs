//! Tenant quota administration (multi-tenant mode).

use super::MasterService;
use crate::metadata::{QuotaAccount, TenantState};
use crescent_proto::{ErrorCode, SegmentKind, TenantId};
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
        let mut p = self.policies.lock();
        p.upsert(id.clone(), bytes)?;
        self.tenants.get_or_insert_with(&id, || TenantState::new(id.clone(), QuotaAccount::closed()));
        self.apply_quotas(&p);
        Ok(())
    }

    /// Deletes a tenant's policy: `OBJECT_NOT_FOUND` without one, `TENANT_NOT_EMPTY` while it holds objects or
    /// charges. An empty tenant is unregistered.
    pub fn delete_tenant_quota(&self, tenant: &str) -> Result<(), ErrorCode> {
        self.require_multi_tenant()?;
        let id = Self::tenant_id(tenant)?;
        let mut p = self.policies.lock();
        if p.requested(&id).is_none() {
            return Err(ErrorCode::ObjectNotFound);
        }
        if let Some(t) = self.tenants.get(&id) {
            if !t.objects().is_empty() || t.quota().charged() != 0 {
                return Err(ErrorCode::TenantNotEmpty);
            }
            self.tenants.remove_if_match(&t);
        }
        p.remove(&id);
        self.apply_quotas(&p);
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
        let mut p = self.policies.lock();
        for id in next.tenants() {
            self.tenants.get_or_insert_with(id, || TenantState::new(id.clone(), QuotaAccount::closed()));
        }
        *p = next;
        self.apply_quotas(&p);
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
                }
            })
            .collect();
        Some(out)
    }

    /// One tenant's quota snapshot.
    pub fn tenant_quota(&self, tenant: &str) -> Option<TenantQuotaSnapshot> {
        let id = TenantId::new(tenant).ok()?;
        self.tenant_quotas()?.into_iter().find(|s| s.tenant_id == id.as_str())
    }
}
