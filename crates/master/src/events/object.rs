//! The events of an object's state, built under its lock (by the service and by the eviction kernel).

use super::{EventKind, KvEvent, Location, RemoveCause, Replicas};
use crate::metadata::{ObjectEntry, ObjectState, TenantState, Tier};
use crescent_proto::ReplicaStatus;

/// The stored event of `entry` as `st` holds it, or its removed event (for `cause`) when nothing is readable.
pub(crate) fn state_event(tenant: &TenantState, entry: &ObjectEntry, st: &ObjectState, cause: RemoveCause) -> KvEvent {
    let replicas: Replicas = st
        .replicas
        .iter()
        .filter(|r| r.status == ReplicaStatus::Complete)
        .filter_map(|r| {
            let region = r.buffer.region()?;
            Some(Location { segment: (**region.name()).into(), tier: tier_name(r.tier) })
        })
        .collect();
    if replicas.is_empty() {
        return removed_event(tenant, entry, st, cause);
    }
    KvEvent {
        kind: EventKind::Stored,
        id: 0,
        tenant: tenant.id().as_str().into(),
        key: entry.key().into(),
        group: entry.group().map(|g| (**g.name()).into()),
        medium: medium(replicas.iter().map(|l| l.tier)),
        size: st.size,
        replicas,
        cause: None,
    }
}

/// The removed event of `entry` (its replicas as `st` held them before).
pub(crate) fn removed_event(
    tenant: &TenantState,
    entry: &ObjectEntry,
    st: &ObjectState,
    cause: RemoveCause,
) -> KvEvent {
    KvEvent {
        kind: EventKind::Removed,
        id: 0,
        tenant: tenant.id().as_str().into(),
        key: entry.key().into(),
        group: entry.group().map(|g| (**g.name()).into()),
        medium: medium(st.replicas.iter().map(|r| tier_name(r.tier))),
        size: st.size,
        replicas: Replicas::new(),
        cause: Some(cause),
    }
}

fn tier_name(t: Tier) -> &'static str {
    match t {
        Tier::Memory => "memory",
        Tier::Nof => "nof",
        Tier::Disk => "disk",
    }
}

/// The original's medium of a set of tiers: `cpu` with any memory (or NoF) copy, `disk` with only disk ones.
fn medium<'a>(tiers: impl IntoIterator<Item = &'a str>) -> &'static str {
    let mut any = false;
    for t in tiers {
        if t != "disk" {
            return "cpu";
        }
        any = true;
    }
    if any { "disk" } else { "cpu" }
}
