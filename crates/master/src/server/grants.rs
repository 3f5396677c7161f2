//! Grants for the data plane: the master seals, into each reply that leads to a transfer, the capability for
//! exactly the ranges it hands out (see `crescent_net::grant`).
//!
//! Puts get a write grant per allocated replica range, valid for the write window
//! (`MasterConfig::grant_write_window_ms`); gets get a read grant per readable range, valid while the lease
//! holds. The service knows nothing of grants: they are sealed here, at the network edge, for the bearer the
//! connection's hello proved, after the service answered.

use crate::service::{MasterConfig, MasterService};
use crescent_net::auth::Keyring;
use crescent_net::grant::{Bearer, GrantOp, SKEW_MS};
use crescent_proto::rpc::{GetReplicaListResponse, MasterReply, MasterResponse};
use crescent_proto::transfer::Grant;
use crescent_proto::{ReplicaDescriptor, ReplicaLocation};
use std::time::Duration;

/// Seals grants into `reply` (put and get replies; others are left alone) for `bearer`, write grants living
/// the service's write window, read grants the lease. The service already holds each range handed out, once
/// freed, out of reuse for longer than its grant can be honoured (`MasterService::hand_out`), even if the
/// object is removed before the grant is sealed.
pub fn seal(svc: &MasterService, keyring: &Keyring, bearer: &Bearer, reply: &mut MasterReply) {
    let write_window = Duration::from_millis(svc.config().grant_write_window_ms);
    let sealed = |op: GrantOp, r: &mut ReplicaDescriptor, ttl: Duration| {
        r.grant = grant(keyring, op, bearer, &r.location, ttl);
    };
    let writes = |replicas: &mut Vec<ReplicaDescriptor>| {
        replicas.iter_mut().for_each(|r| sealed(GrantOp::Write, r, write_window));
    };
    match reply {
        Ok(MasterResponse::Replicas(replicas)) => writes(replicas),
        Ok(MasterResponse::BatchReplicas(items)) => items.iter_mut().flatten().for_each(writes),
        Ok(MasterResponse::ReplicaList(list)) => reads(list, &sealed),
        Ok(MasterResponse::BatchReplicaList(items)) => {
            items.iter_mut().flatten().for_each(|list| reads(list, &sealed));
        }
        _ => {}
    }
}

/// Read grants for a replica list's readable replicas, living the lease.
fn reads(list: &mut GetReplicaListResponse, sealed: &impl Fn(GrantOp, &mut ReplicaDescriptor, Duration)) {
    let lease = Duration::from_millis(list.lease_ttl_ms);
    list.replicas.iter_mut().for_each(|r| sealed(GrantOp::Read, r, lease));
}

/// A grant for `op` on one replica's range (none for a local-disk replica: no node serves it).
pub fn grant(
    keyring: &Keyring,
    op: GrantOp,
    bearer: &Bearer,
    location: &ReplicaLocation,
    ttl: Duration,
) -> Option<Grant> {
    match location {
        ReplicaLocation::Memory { segment_id, offset, length, .. }
        | ReplicaLocation::Nof { segment_id, offset, length, .. } => {
            Some(keyring.seal_grant_for(op, segment_id, bearer, *offset, *length, ttl))
        }
        ReplicaLocation::LocalDisk { .. } => None,
    }
}

/// `config` as a master sealing grants runs it: freed space held out of reuse for the write-grant window plus
/// the clock slack (unless configured longer), so no live write grant covers space given to another object.
pub fn hold_for_grants(config: &mut MasterConfig) {
    let needed = config.grant_write_window_ms.saturating_add(2 * SKEW_MS);
    config.write_hold_ms = config.write_hold_ms.max(needed);
}
