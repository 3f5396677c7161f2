//! Grants for the data plane: the master seals, into each reply that leads to a transfer, the capability for
//! exactly the ranges it hands out (see `crescent_net::grant`).
//!
//! Puts get a write grant per allocated replica range, valid for the write window
//! (`MasterConfig::grant_write_window_ms`); gets get a read grant per readable range, valid while the lease
//! holds. The service knows nothing of grants: they are sealed here, at the network edge, for the bearer the
//! connection's hello proved, after the service answered.

use crate::service::MasterConfig;
use crescent_net::auth::Keyring;
use crescent_net::grant::{Bearer, GrantOp, SKEW_MS};
use crescent_proto::rpc::{GetReplicaListResponse, MasterReply, MasterResponse};
use crescent_proto::transfer::Grant;
use crescent_proto::{ReplicaDescriptor, ReplicaLocation};
use std::time::Duration;

/// Seals grants into `reply` (put and get replies; others are left alone) for `bearer`, write grants living
/// `write_window`.
pub fn seal(keyring: &Keyring, bearer: &Bearer, write_window: Duration, reply: &mut MasterReply) {
    let writes = |replicas: &mut Vec<ReplicaDescriptor>| {
        for r in replicas {
            r.grant = grant(keyring, GrantOp::Write, bearer, &r.location, write_window);
        }
    };
    let reads = |list: &mut GetReplicaListResponse| {
        let lease = Duration::from_millis(list.lease_ttl_ms);
        for r in &mut list.replicas {
            r.grant = grant(keyring, GrantOp::Read, bearer, &r.location, lease);
        }
    };
    match reply {
        Ok(MasterResponse::Replicas(replicas)) => writes(replicas),
        Ok(MasterResponse::BatchReplicas(items)) => items.iter_mut().flatten().for_each(writes),
        Ok(MasterResponse::ReplicaList(list)) => reads(list),
        Ok(MasterResponse::BatchReplicaList(items)) => items.iter_mut().flatten().for_each(reads),
        _ => {}
    }
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
