//! Tenant quota accounts and the effective-quota formula.
//!
//! An account is two atomics: `charged` (bit 63 = admission closed, bits 0..62 = bytes) and `effective`.
//! Charging is a lock-free CAS that never lets `charged` exceed `effective`; a failed charge or release changes
//! nothing. Policies (requested quotas) are control-plane state in [`QuotaPolicies`]; recomputing effective
//! quotas from capacity writes only the accounts.

use crescent_proto::{ErrorCode, TenantId};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

const CLOSED: u64 = 1 << 63;
const BYTES: u64 = CLOSED - 1;

/// Why a charge or release failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// Admission is closed (no policy: unregistered or orphan tenant).
    #[error("tenant not registered")]
    NotRegistered,
    /// `charged + bytes` would exceed the effective quota by `deficit`.
    #[error("tenant quota exceeded by {deficit} bytes")]
    Exceeded {
        /// Bytes over the quota.
        deficit: u64,
    },
    /// A release larger than the charge (a bookkeeping bug; nothing changed).
    #[error("quota release exceeds the charge")]
    Mismatch,
}

impl QuotaError {
    /// The wire code.
    pub fn code(&self) -> ErrorCode {
        match self {
            QuotaError::NotRegistered => ErrorCode::TenantNotRegistered,
            QuotaError::Exceeded { .. } => ErrorCode::TenantQuotaExceeded,
            QuotaError::Mismatch => ErrorCode::InternalError,
        }
    }
}

/// One tenant's quota account. Stable for the tenant's lifetime; shared by every object of the tenant.
#[derive(Debug)]
pub struct QuotaAccount {
    charged: AtomicU64,
    effective: AtomicU64,
}

impl QuotaAccount {
    /// An account with admission closed and no quota.
    pub fn closed() -> Self {
        Self { charged: AtomicU64::new(CLOSED), effective: AtomicU64::new(0) }
    }

    /// An open account with an effectively unlimited quota (single-tenant mode).
    pub fn unlimited() -> Self {
        Self { charged: AtomicU64::new(0), effective: AtomicU64::new(BYTES) }
    }

    /// Bytes charged.
    pub fn charged(&self) -> u64 {
        self.charged.load(Ordering::Acquire) & BYTES
    }

    /// The effective quota.
    pub fn effective(&self) -> u64 {
        self.effective.load(Ordering::Acquire)
    }

    /// Whether writes are refused.
    pub fn is_closed(&self) -> bool {
        self.charged.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Admission probe: fails only if admission is closed.
    pub fn admit(&self) -> Result<(), QuotaError> {
        if self.is_closed() { Err(QuotaError::NotRegistered) } else { Ok(()) }
    }

    /// Charges `bytes` if that keeps `charged ≤ effective`.
    pub fn try_charge(&self, bytes: u64) -> Result<(), QuotaError> {
        let mut cur = self.charged.load(Ordering::Acquire);
        loop {
            if cur & CLOSED != 0 {
                return Err(QuotaError::NotRegistered);
            }
            if bytes == 0 {
                return Ok(());
            }
            let charged = cur & BYTES;
            let effective = self.effective();
            let next =
                charged.checked_add(bytes).filter(|n| *n <= BYTES).ok_or(QuotaError::Exceeded { deficit: bytes })?;
            if next > effective {
                return Err(QuotaError::Exceeded { deficit: next - effective });
            }
            match self.charged.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Charges `bytes` without a quota check (settling a write whose charge was admitted earlier).
    pub fn force_charge(&self, bytes: u64) {
        self.charged.fetch_add(bytes & BYTES, Ordering::AcqRel);
    }

    /// Releases `bytes`; works on closed (orphan) accounts so they drain.
    pub fn release(&self, bytes: u64) -> Result<(), QuotaError> {
        let mut cur = self.charged.load(Ordering::Acquire);
        loop {
            let charged = cur & BYTES;
            if bytes > charged {
                return Err(QuotaError::Mismatch);
            }
            match self.charged.compare_exchange_weak(cur, cur - bytes, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Sets the effective quota and opens or closes admission.
    pub fn set_policy(&self, effective: u64, open: bool) {
        self.effective.store(effective.min(BYTES), Ordering::Release);
        if open {
            self.charged.fetch_and(BYTES, Ordering::AcqRel);
        } else {
            self.charged.fetch_or(CLOSED, Ordering::AcqRel);
        }
    }
}

/// The largest requested quota accepted (2^63 − 1).
pub const MAX_QUOTA: u64 = BYTES;

/// Requested quotas of the tenants that have a policy.
#[derive(Debug, Default, Clone)]
pub struct QuotaPolicies {
    requested: BTreeMap<TenantId, u64>,
}

impl QuotaPolicies {
    /// Sets a tenant's requested quota (1..=2^63−1).
    pub fn upsert(&mut self, tenant: TenantId, bytes: u64) -> Result<(), ErrorCode> {
        if bytes == 0 || bytes > MAX_QUOTA {
            return Err(ErrorCode::InvalidParams);
        }
        self.requested.insert(tenant, bytes);
        Ok(())
    }

    /// Removes a tenant's policy; false if it had none.
    pub fn remove(&mut self, tenant: &TenantId) -> bool {
        self.requested.remove(tenant).is_some()
    }

    /// A tenant's requested quota.
    pub fn requested(&self, tenant: &TenantId) -> Option<u64> {
        self.requested.get(tenant).copied()
    }

    /// Tenants with a policy.
    pub fn tenants(&self) -> impl Iterator<Item = &TenantId> {
        self.requested.keys()
    }

    /// Effective quotas for `capacity`: each request when Σ requests ≤ capacity; otherwise ⌊cap·req/Σ⌋ plus
    /// one byte each for the largest remainders (ties by tenant id) so the shares sum exactly to capacity.
    pub fn effective(&self, capacity: u64) -> BTreeMap<TenantId, u64> {
        let total: u128 = self.requested.values().map(|&r| u128::from(r)).sum();
        if total <= u128::from(capacity) {
            return self.requested.clone();
        }
        let cap = u128::from(capacity);
        let mut shares: Vec<(&TenantId, u64, u128)> = self
            .requested
            .iter()
            .map(|(t, &r)| {
                let num = cap * u128::from(r);
                (t, (num / total) as u64, num % total)
            })
            .collect();
        let assigned: u64 = shares.iter().map(|s| s.1).sum();
        let mut leftover = capacity - assigned;
        let mut order: Vec<usize> = (0..shares.len()).collect();
        order.sort_by(|&a, &b| shares[b].2.cmp(&shares[a].2).then_with(|| shares[a].0.cmp(shares[b].0)));
        for i in order {
            if leftover == 0 {
                break;
            }
            shares[i].1 += 1;
            leftover -= 1;
        }
        shares.into_iter().map(|(t, q, _)| (t.clone(), q)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TenantId {
        TenantId::new(s).unwrap()
    }

    #[test]
    fn charges_never_exceed_the_quota_and_failures_change_nothing() {
        let a = QuotaAccount::closed();
        assert_eq!(a.try_charge(0), Err(QuotaError::NotRegistered));
        a.set_policy(100, true);
        a.try_charge(80).unwrap();
        assert_eq!(a.try_charge(30), Err(QuotaError::Exceeded { deficit: 10 }));
        assert_eq!(a.charged(), 80);
        assert_eq!(a.release(81), Err(QuotaError::Mismatch));
        a.release(80).unwrap();
        a.set_policy(0, false);
        assert_eq!(a.admit(), Err(QuotaError::NotRegistered));
        a.set_policy(5, true);
        assert!(a.try_charge(u64::MAX).is_err());
    }

    #[test]
    fn concurrent_charges_respect_the_quota() {
        let a = std::sync::Arc::new(QuotaAccount::closed());
        a.set_policy(10_000, true);
        let ok = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        if a.try_charge(7).is_ok() {
                            ok.fetch_add(7, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(a.charged(), ok.load(Ordering::Relaxed));
        assert!(a.charged() <= 10_000 && a.charged() > 10_000 - 7);
    }

    #[test]
    fn effective_quota_formula() {
        let mut p = QuotaPolicies::default();
        assert_eq!(p.upsert(t("a"), 0), Err(ErrorCode::InvalidParams));
        assert_eq!(p.upsert(t("a"), MAX_QUOTA + 1), Err(ErrorCode::InvalidParams));
        p.upsert(t("a"), 200).unwrap();
        p.upsert(t("b"), 400).unwrap();
        let e = p.effective(1000);
        assert_eq!((e[&t("a")], e[&t("b")]), (200, 400));
        let e = p.effective(300);
        assert_eq!((e[&t("a")], e[&t("b")]), (100, 200));
        let mut q = QuotaPolicies::default();
        q.upsert(t("a"), 100).unwrap();
        q.upsert(t("b"), 200).unwrap();
        let e = q.effective(150);
        assert_eq!((e[&t("a")], e[&t("b")]), (50, 100));
        // Remainders: 3 equal tenants over 10 bytes → 4,3,3 by tenant id.
        let mut r = QuotaPolicies::default();
        for n in ["x", "y", "z"] {
            r.upsert(t(n), 10).unwrap();
        }
        let e = r.effective(10);
        assert_eq!((e[&t("x")], e[&t("y")], e[&t("z")]), (4, 3, 3));
        assert_eq!(e.values().sum::<u64>(), 10);
    }
}
