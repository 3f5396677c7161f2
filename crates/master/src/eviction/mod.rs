//! The eviction kernel: one census + selection + commit protocol behind every trigger (high watermark,
//! allocation failure, tenant quota).
//!
//! 1. **Census**: copy object handles in bounded chunks under shared route locks; read each object's summary
//!    under its own lock, briefly (never two locks at once).
//! 2. **Select** with no lock held: candidates are objects with evictable memory (complete, unpinned by
//!    refcount, on a live segment), not hard-pinned, lease expired; oldest lease first; soft-pinned objects
//!    only after all others, and only if allowed.
//! 3. **Commit** each candidate: singleton → its object lock; explicit group → the group lock, then every
//!    member's lock in key order (the whole group is skipped if any member holds a lease). Everything is
//!    revalidated under the locks. Emptied objects are retired and matched-unlinked; buffers and quota are
//!    released after the locks are dropped.
//!
//! Counts are objects (the original's unit, for the watermark trigger) and bytes (the quota trigger's unit).

use crate::clock::Timestamp;
use crate::metadata::{GroupEntry, Lifecycle, ObjectEntry, ObjectState, Replica, TenantState};
use crescent_proto::TenantId;
use smallvec::SmallVec;
use std::collections::HashSet;
use std::sync::Arc;

/// Which objects an eviction round may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionScope {
    /// Every tenant (selection is tenant-blind; each object's bytes are released to its own tenant).
    All,
    /// One tenant (quota-triggered eviction never touches other tenants).
    Tenant(TenantId),
}

/// How much to evict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EvictionTarget {
    /// Evict `ceil(base × target)` non-soft-pinned objects (oldest lease first); if that falls short of
    /// `ceil(base × lower)`, continue with soft-pinned ones (when allowed). `base` = objects with evictable
    /// memory that are not hard-pinned.
    Fraction {
        /// Primary fraction.
        target: f64,
        /// Minimum fraction, reached with soft-pinned objects if needed.
        lower: f64,
    },
    /// Evict until at least this many replica bytes are freed.
    Bytes(u64),
}

/// What a round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionReport {
    /// Objects with evictable memory that are not hard-pinned.
    pub base: u64,
    /// Of those, with an expired lease.
    pub candidates: u64,
    /// Objects evicted (each member of a group counts).
    pub objects: u64,
    /// Replica bytes freed.
    pub bytes: u64,
    /// Candidates that failed revalidation at commit (leased meanwhile, group member leased, ...).
    pub skipped: u64,
}

struct Candidate {
    tenant: usize,
    entry: Arc<ObjectEntry>,
    lease: Timestamp,
}

/// Whether the object may lose its memory replicas now.
fn eligible(st: &ObjectState, now: Timestamp, allow_soft: bool) -> bool {
    st.lifecycle == Lifecycle::Active
        && !st.hard_pinned
        && !st.leased(now)
        && (allow_soft || !st.soft_pinned(now))
        && st.evictable_memory_bytes() > 0
}

/// Takes the evictable memory replicas; retires the object if nothing valid remains. Returns the replicas
/// taken (and the retired object's leftovers) and whether the object was retired.
fn strip(tenant: &TenantState, st: &mut ObjectState) -> (SmallVec<[Replica; 1]>, bool) {
    let (taken, keep): (SmallVec<[Replica; 1]>, SmallVec<[Replica; 1]>) =
        std::mem::take(&mut st.replicas).into_iter().partition(|r| r.memory && r.refcnt == 0 && r.is_readable());
    st.replicas = keep;
    tenant.resettle(st);
    if st.replicas.iter().any(Replica::is_valid) {
        return (taken, false);
    }
    let mut all = taken;
    all.extend(tenant.retire(st));
    (all, true)
}

fn bytes_of(replicas: &[Replica]) -> u64 {
    replicas.iter().filter(|r| r.memory).map(|r| r.buffer.size()).sum()
}

struct Committer<'a> {
    tenants: &'a [Arc<TenantState>],
    now: Timestamp,
    groups_done: HashSet<*const GroupEntry>,
    report: EvictionReport,
}

impl Committer<'_> {
    /// Evicts one candidate (its whole group for a member). Returns objects evicted.
    fn commit(&mut self, c: &Candidate, allow_soft: bool) -> u64 {
        let tenant = &self.tenants[c.tenant];
        match c.entry.group() {
            None => {
                let mut st = c.entry.lock();
                if !eligible(&st, self.now, allow_soft) {
                    self.report.skipped += 1;
                    return 0;
                }
                let (freed, retired) = strip(tenant, &mut st);
                drop(st);
                if retired {
                    tenant.detach(&c.entry);
                }
                self.report.objects += 1;
                self.report.bytes += bytes_of(&freed);
                drop(freed);
                1
            }
            Some(group) => {
                if !self.groups_done.insert(Arc::as_ptr(group)) {
                    return 0;
                }
                self.commit_group(tenant, group, allow_soft)
            }
        }
    }

    fn commit_group(&mut self, tenant: &TenantState, group: &Arc<GroupEntry>, allow_soft: bool) -> u64 {
        let mut members_guard = group.lock();
        let members = members_guard.live_sorted();
        let mut freed: Vec<SmallVec<[Replica; 1]>> = Vec::new();
        let mut retired: Vec<&Arc<ObjectEntry>> = Vec::new();
        {
            let mut guards: Vec<_> = members.iter().map(|m| m.lock()).collect();
            if guards.iter().any(|st| st.lifecycle == Lifecycle::Active && st.leased(self.now)) {
                self.report.skipped += 1;
                return 0;
            }
            for (m, st) in members.iter().zip(guards.iter_mut()) {
                if !eligible(st, self.now, allow_soft) {
                    continue;
                }
                let (f, r) = strip(tenant, st);
                freed.push(f);
                if r {
                    retired.push(m);
                }
            }
        }
        for m in retired {
            tenant.detach_locked(m, group, &mut members_guard);
        }
        drop(members_guard);
        let n = freed.len() as u64;
        self.report.objects += n;
        self.report.bytes += freed.iter().map(|f| bytes_of(f)).sum::<u64>();
        n
    }
}

/// Runs one eviction round over `tenants`.
pub fn run(
    tenants: &[Arc<TenantState>],
    target: EvictionTarget,
    now: Timestamp,
    allow_evict_soft_pinned: bool,
    census_chunk: usize,
) -> EvictionReport {
    let mut report = EvictionReport::default();
    let mut normal: Vec<Candidate> = Vec::new();
    let mut soft: Vec<Candidate> = Vec::new();
    for (ti, t) in tenants.iter().enumerate() {
        t.objects().visit_chunks(census_chunk, |chunk| {
            for entry in chunk {
                let (in_base, candidate, soft_pinned, lease) = {
                    let st = entry.lock();
                    let in_base =
                        st.lifecycle == Lifecycle::Active && !st.hard_pinned && st.evictable_memory_bytes() > 0;
                    (in_base, in_base && !st.leased(now), st.soft_pinned(now), st.lease)
                };
                report.base += u64::from(in_base);
                if candidate {
                    report.candidates += 1;
                    let c = Candidate { tenant: ti, entry, lease };
                    if soft_pinned { soft.push(c) } else { normal.push(c) }
                }
            }
        });
    }
    normal.sort_unstable_by_key(|c| c.lease);
    soft.sort_unstable_by_key(|c| c.lease);
    let mut k = Committer { tenants, now, groups_done: HashSet::new(), report };
    let mut evicted = 0u64;
    match target {
        EvictionTarget::Fraction { target, lower } => {
            let base = k.report.base as f64;
            let n1 = (base * target.max(0.0)).ceil() as u64;
            let n2 = (base * lower.max(0.0)).ceil() as u64;
            let mut rest = normal.iter();
            for c in rest.by_ref() {
                if evicted >= n1 {
                    break;
                }
                evicted += k.commit(c, false);
            }
            if evicted < n2 {
                for c in rest {
                    if evicted >= n2 {
                        break;
                    }
                    evicted += k.commit(c, false);
                }
                if allow_evict_soft_pinned {
                    for c in &soft {
                        if evicted >= n2 {
                            break;
                        }
                        evicted += k.commit(c, true);
                    }
                }
            }
        }
        EvictionTarget::Bytes(goal) => {
            let passes: &[(&[Candidate], bool)] =
                if allow_evict_soft_pinned { &[(&normal, false), (&soft, true)] } else { &[(&normal, false)] };
            'outer: for (list, allow_soft) in passes {
                for c in list.iter() {
                    if k.report.bytes >= goal {
                        break 'outer;
                    }
                    k.commit(c, *allow_soft);
                }
            }
        }
    }
    k.report
}
