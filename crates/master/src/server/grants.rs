//! Grants for the data plane: the master seals, into each reply that leads to a transfer, the capability for
//! exactly the ranges it hands out (see `crescent_net::grant`).
//!
//! Puts get write grants for their allocated replica ranges, valid for the write window
//! (`MasterConfig::grant_write_window_ms`); gets get read grants for their readable ranges, valid while the lease
//! holds. A single object's reply gets a grant per range; a batch reply one grant per segment and operation,
//! listing that segment's ranges in the reply (a new one every `MAX_GRANT_RANGES`), which its descriptors point
//! into — so a batch costs a seal here and a check at the node per segment, not per object. The service knows
//! nothing of grants: they are sealed here, at the network edge, for the bearer the connection's hello proved,
//! after the service answered.

use super::hosts::Hosts;
use crate::service::{MasterConfig, MasterService};
use crescent_net::grant::{Bearer, GrantOp, SKEW_MS};
use crescent_net::host::HostKeys;
use crescent_proto::rpc::{MasterReply, MasterResponse};
use crescent_proto::transfer::{Grant, GrantRange, GrantRef, MAX_GRANT_RANGES};
use crescent_proto::{ReplicaDescriptor, ReplicaLocation, SegmentId};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Seals grants into `reply` (put and get replies; others are left alone) for `bearer`, each with the keys of
/// its segment's host (`server::hosts`), write grants living the service's write window, read grants the lease.
/// The service already holds each range handed out, once freed, out of reuse for longer than its grant can be
/// honoured (`MasterService::hand_out`), even if the object is removed before the grant is sealed. A range whose
/// host is unknown here gets no grant (its node refuses the transfer until its host reconnects).
pub fn seal(svc: &MasterService, hosts: &Hosts, bearer: &Bearer, reply: &mut MasterReply) {
    let write_window = Duration::from_millis(svc.config().grant_write_window_ms);
    let mut sealer = Sealer { svc, hosts, bearer, epoch: svc.epoch_ms(), last: None };
    match reply {
        Ok(MasterResponse::Replicas(replicas)) => {
            replicas.iter_mut().for_each(|r| sealer.own(GrantOp::Write, r, write_window));
        }
        // A node's copy and move tasks: their targets are written under write grants, as a put's.
        Ok(MasterResponse::ReplicaTasks(tasks)) => {
            for t in tasks.iter_mut() {
                t.targets.iter_mut().for_each(|r| sealer.own(GrantOp::Write, r, write_window));
            }
        }
        Ok(MasterResponse::ReplicaList(list)) => {
            let lease = Duration::from_millis(list.lease_ttl_ms);
            list.replicas.iter_mut().for_each(|r| sealer.own(GrantOp::Read, r, lease));
        }
        Ok(MasterResponse::BatchReplicas(batch)) => {
            let mut shared = Shared::default();
            for r in batch.items.iter_mut().flatten().flatten() {
                sealer.share(&mut shared, GrantOp::Write, r, write_window);
            }
            batch.grants = shared.seal(&sealer);
        }
        Ok(MasterResponse::BatchReplicaList(batch)) => {
            let mut shared = Shared::default();
            for list in batch.items.iter_mut().flatten() {
                let lease = Duration::from_millis(list.lease_ttl_ms);
                list.replicas.iter_mut().for_each(|r| sealer.share(&mut shared, GrantOp::Read, r, lease));
            }
            batch.grants = shared.seal(&sealer);
        }
        _ => {}
    }
}

/// What one reply's grants are sealed for, and the last segment's host keys (a reply's replicas often share
/// segments).
struct Sealer<'a> {
    svc: &'a MasterService,
    hosts: &'a Hosts,
    bearer: &'a Bearer,
    epoch: u64,
    last: Option<(SegmentId, Option<Arc<HostKeys>>)>,
}

impl Sealer<'_> {
    /// A node-served replica's segment and range, and its host's keys (if the host is known).
    fn range_of(&mut self, r: &ReplicaDescriptor) -> Option<(SegmentId, GrantRange, Arc<HostKeys>)> {
        let (ReplicaLocation::Memory { segment_id, offset, length, .. }
        | ReplicaLocation::Nof { segment_id, offset, length, .. }) = &r.location
        else {
            return None; // a local-disk replica: no node serves it
        };
        let keys = match &self.last {
            Some((s, keys)) if s == segment_id => keys.clone(),
            _ => {
                let keys = self.hosts.of_segment(self.svc, *segment_id).map(|(_, k)| k);
                self.last = Some((*segment_id, keys.clone()));
                keys
            }
        };
        Some((*segment_id, GrantRange { offset: *offset, length: *length }, keys?))
    }

    /// Seals `r`'s own grant.
    fn own(&mut self, op: GrantOp, r: &mut ReplicaDescriptor, ttl: Duration) {
        r.grant = self.range_of(r).map(|(segment, range, keys)| {
            GrantRef::Own(keys.seal_grant_for(op, &segment, self.bearer, vec![range], ttl, self.epoch))
        });
    }

    /// Points `r` into the batch's grant for its segment and operation (adding its range to it).
    fn share(&mut self, shared: &mut Shared, op: GrantOp, r: &mut ReplicaDescriptor, ttl: Duration) {
        r.grant = self.range_of(r).map(|(segment, range, keys)| shared.add(op, segment, ttl, range, keys));
    }
}

/// A batch reply's grants as they fill: one open per segment, operation and life.
#[derive(Default)]
struct Shared {
    pending: Vec<Pending>,
    open: HashMap<(SegmentId, GrantOp, Duration), usize>,
}

/// One grant of a batch, to be sealed once all its ranges are known.
struct Pending {
    op: GrantOp,
    segment: SegmentId,
    ttl: Duration,
    keys: Arc<HostKeys>,
    ranges: Vec<GrantRange>,
}

impl Shared {
    /// Adds `range` to the open grant for `(segment, op, ttl)` (opening one if there is none or it is full).
    fn add(
        &mut self,
        op: GrantOp,
        segment: SegmentId,
        ttl: Duration,
        range: GrantRange,
        keys: Arc<HostKeys>,
    ) -> GrantRef {
        let key = (segment, op, ttl);
        let open = self.open.get(&key).copied().filter(|&i| self.pending[i].ranges.len() < MAX_GRANT_RANGES);
        let index = open.unwrap_or_else(|| {
            self.pending.push(Pending { op, segment, ttl, keys, ranges: Vec::new() });
            self.open.insert(key, self.pending.len() - 1);
            self.pending.len() - 1
        });
        let ranges = &mut self.pending[index].ranges;
        ranges.push(range);
        // Both fit: at most `MAX_GRANT_RANGES` ranges, and a reply holds far fewer than 2^32 grants.
        GrantRef::Shared { grant: index as u32, range: (ranges.len() - 1) as u32 }
    }

    /// Seals every grant, in index order.
    fn seal(self, sealer: &Sealer<'_>) -> Vec<Grant> {
        self.pending
            .into_iter()
            .map(|p| p.keys.seal_grant_for(p.op, &p.segment, sealer.bearer, p.ranges, p.ttl, sealer.epoch))
            .collect()
    }
}

/// `config` as a master sealing grants runs it: freed space held out of reuse for the write-grant window plus
/// the clock slack (unless configured longer), so no live write grant covers space given to another object.
pub fn hold_for_grants(config: &mut MasterConfig) {
    let needed = config.grant_write_window_ms.saturating_add(2 * SKEW_MS);
    config.write_hold_ms = config.write_hold_ms.max(needed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crescent_net::auth::Keyring;

    #[test]
    fn a_batch_shares_one_grant_per_segment_operation_and_life_of_at_most_the_most_ranges() {
        let keys =
            Arc::new(Keyring::parse("0123456789abcdef-grants").unwrap().host_keys(&"node".parse().unwrap(), None));
        let (a, b, life) = (SegmentId::random(), SegmentId::random(), Duration::from_secs(5));
        let range = |i: u64| GrantRange { offset: i << 12, length: 4096 };
        let mut shared = Shared::default();
        let mut add = |op, seg, ttl, i| shared.add(op, seg, ttl, range(i), keys.clone());
        let on_a: Vec<GrantRef> = (0..MAX_GRANT_RANGES as u64 + 2).map(|i| add(GrantOp::Read, a, life, i)).collect();
        assert_eq!(on_a[0], GrantRef::Shared { grant: 0, range: 0 });
        assert_eq!(on_a[MAX_GRANT_RANGES - 1], GrantRef::Shared { grant: 0, range: MAX_GRANT_RANGES as u32 - 1 });
        assert_eq!(
            on_a[MAX_GRANT_RANGES],
            GrantRef::Shared { grant: 1, range: 0 },
            "a full grant is followed by a new one"
        );
        assert_eq!(add(GrantOp::Read, b, life, 0), GrantRef::Shared { grant: 2, range: 0 }, "another segment");
        assert_eq!(add(GrantOp::Write, a, life, 0), GrantRef::Shared { grant: 3, range: 0 }, "another operation");
        assert_eq!(
            add(GrantOp::Read, a, Duration::from_secs(9), 0),
            GrantRef::Shared { grant: 4, range: 0 },
            "another life"
        );
        assert_eq!(add(GrantOp::Read, a, life, 999), GrantRef::Shared { grant: 1, range: 2 }, "back to the open one");
        let sizes: Vec<usize> = shared.pending.iter().map(|p| p.ranges.len()).collect();
        assert_eq!(sizes, vec![MAX_GRANT_RANGES, 3, 1, 1, 1]);
    }
}
