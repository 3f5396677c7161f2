//! Grants for the data plane: the master seals, into each reply that leads to a transfer, the capability for
//! exactly the ranges it hands out (see `crescent_net::grant`).
//!
//! Puts get a write grant per allocated replica range, valid for the write window
//! (`MasterConfig::grant_write_window_ms`); gets get a read grant per readable range, valid while the lease
//! holds. The service knows nothing of grants: they are sealed here, at the network edge, for the bearer the
//! connection's hello proved, after the service answered.

use super::hosts::Hosts;
use crate::service::{MasterConfig, MasterService};
use crescent_net::grant::{Bearer, GrantOp, SKEW_MS};
use crescent_net::host::HostKeys;
use crescent_proto::rpc::{GetReplicaListResponse, MasterReply, MasterResponse};
use crescent_proto::{ReplicaDescriptor, ReplicaLocation, SegmentId};
use std::sync::Arc;
use std::time::Duration;

/// Seals grants into `reply` (put and get replies; others are left alone) for `bearer`, each with the keys of
/// its segment's host (`server::hosts`), write grants living the service's write window, read grants the lease.
/// The service already holds each range handed out, once freed, out of reuse for longer than its grant can be
/// honoured (`MasterService::hand_out`), even if the object is removed before the grant is sealed. A range whose
/// host is unknown here gets no grant (its node refuses the transfer until its host reconnects).
pub fn seal(svc: &MasterService, hosts: &Hosts, bearer: &Bearer, reply: &mut MasterReply) {
    let write_window = Duration::from_millis(svc.config().grant_write_window_ms);
    let epoch = svc.epoch_ms();
    // Replicas of one reply often share segments: the last one's keys are kept.
    let mut last: Option<(SegmentId, Option<Arc<HostKeys>>)> = None;
    let mut sealed = |op: GrantOp, r: &mut ReplicaDescriptor, ttl: Duration| {
        let (ReplicaLocation::Memory { segment_id, offset, length, .. }
        | ReplicaLocation::Nof { segment_id, offset, length, .. }) = &r.location
        else {
            return; // a local-disk replica: no node serves it
        };
        let keys = match &last {
            Some((s, keys)) if s == segment_id => keys.clone(),
            _ => {
                let keys = hosts.of_segment(svc, *segment_id).map(|(_, k)| k);
                last = Some((*segment_id, keys.clone()));
                keys
            }
        };
        r.grant = keys.map(|k| k.seal_grant_for(op, segment_id, bearer, *offset, *length, ttl, epoch));
    };
    match reply {
        Ok(MasterResponse::Replicas(replicas)) => {
            replicas.iter_mut().for_each(|r| sealed(GrantOp::Write, r, write_window));
        }
        Ok(MasterResponse::BatchReplicas(items)) => {
            items.iter_mut().flatten().flatten().for_each(|r| sealed(GrantOp::Write, r, write_window));
        }
        Ok(MasterResponse::ReplicaList(list)) => reads(list, &mut sealed),
        Ok(MasterResponse::BatchReplicaList(items)) => {
            items.iter_mut().flatten().for_each(|list| reads(list, &mut sealed));
        }
        _ => {}
    }
}

/// Read grants for a replica list's readable replicas, living the lease.
fn reads(list: &mut GetReplicaListResponse, sealed: &mut impl FnMut(GrantOp, &mut ReplicaDescriptor, Duration)) {
    let lease = Duration::from_millis(list.lease_ttl_ms);
    list.replicas.iter_mut().for_each(|r| sealed(GrantOp::Read, r, lease));
}

/// `config` as a master sealing grants runs it: freed space held out of reuse for the write-grant window plus
/// the clock slack (unless configured longer), so no live write grant covers space given to another object.
pub fn hold_for_grants(config: &mut MasterConfig) {
    let needed = config.grant_write_window_ms.saturating_add(2 * SKEW_MS);
    config.write_hold_ms = config.write_hold_ms.max(needed);
}
