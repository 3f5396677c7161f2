//! Client-local SSD registrations over the service: the RPC face of [`crate::local_ssd::LocalSsdManager`].
//!
//! With an oplog every change of a registration is logged (LOCAL_SSD_SET with the whole record, LOCAL_SSD_REMOVE),
//! committed under the manager's lock that orders the changes, so a restarted or promoted master restores the
//! registrations (`MasterService::restore_replayed`). A capacity report that changes nothing logs nothing.

use super::MasterService;
use crate::ha::payload::{ClientRef, LocalSsdEntry};
use crate::ha::{MasterEntry, Slot};
use crate::local_ssd::{LocalSsdError, LocalSsdRecord};
use crescent_proto::{ClientId, ErrorCode, LocalSsdInfo};

/// Commits `client`'s registration as it now stands (if the master logs). A refusal (the writer stopped for good)
/// fails the request that made the change.
fn log_set(slot: Option<Slot<'_>>, client: ClientId, r: &LocalSsdRecord) -> Result<(), ErrorCode> {
    let Some(slot) = slot else { return Ok(()) };
    let entry = LocalSsdEntry {
        client: *client.0.as_bytes(),
        enable_offloading: r.enable_offloading,
        total_capacity: r.total_capacity,
    };
    slot.commit(MasterEntry::LocalSsdSet(entry), None).map(drop)
}

impl MasterService {
    /// Registers `client`'s local SSD (`SEGMENT_ALREADY_EXISTS` if it has one). The client joins the liveness
    /// monitor: a client that falls silent loses its registration with its segments.
    pub fn register_local_ssd(&self, client: ClientId, enable_offloading: bool) -> Result<(), ErrorCode> {
        let slot = self.reserve_oplog()?;
        let mut logged = Ok(());
        self.local_ssd
            .register_with(client, enable_offloading, |r| logged = log_set(slot, client, r))
            .map_err(|e| e.code())?;
        self.ping(client);
        logged
    }

    /// Drops `client`'s registration; unregistering one that has none is OK.
    pub fn unregister_local_ssd(&self, client: ClientId) -> Result<(), ErrorCode> {
        let slot = self.reserve_oplog()?;
        let mut logged = Ok(());
        self.local_ssd.unregister_with(client, || {
            if let Some(slot) = slot {
                let entry = MasterEntry::LocalSsdRemove(ClientRef { client: *client.0.as_bytes() });
                logged = slot.commit(entry, None).map(drop);
            }
        });
        logged
    }

    /// Drops the registration of a client whose liveness expired (logged; if the log refuses the entry now,
    /// dropped all the same: a failover would restore it and expire it again).
    pub(super) fn expire_local_ssd(&self, client: ClientId) {
        if let Err(e) = self.unregister_local_ssd(client) {
            tracing::warn!(%client, error = %e, "expired client's local SSD registration dropped unlogged");
            self.local_ssd.unregister(client);
        }
    }

    /// Records the capacity `client` reports for its SSD (`SEGMENT_NOT_FOUND` without a registration,
    /// `INVALID_PARAMS` above `i64::MAX`).
    pub fn report_local_ssd(&self, client: ClientId, capacity: u64) -> Result<(), ErrorCode> {
        let bytes = i64::try_from(capacity).map_err(|_| ErrorCode::InvalidParams)?;
        let slot = self.reserve_oplog()?;
        let mut logged = Ok(());
        self.local_ssd
            .report_capacity_with(client, bytes, |r| logged = log_set(slot, client, r))
            .map_err(|e| e.code())?;
        logged
    }

    /// Enables or disables offloading to `client`'s SSD (`SEGMENT_NOT_FOUND` without a registration).
    pub fn set_local_ssd_offloading(&self, client: ClientId, enabled: bool) -> Result<(), ErrorCode> {
        let slot = self.reserve_oplog()?;
        let mut logged = Ok(());
        self.local_ssd
            .set_offloading_with(client, enabled, |r| logged = log_set(slot, client, r))
            .map_err(|e| e.code())?;
        logged
    }

    /// One client's registration (`SEGMENT_NOT_FOUND` without one) or every registration (`None`), sorted by
    /// client id.
    pub fn local_ssd_status(&self, client: Option<ClientId>) -> Result<Vec<LocalSsdInfo>, ErrorCode> {
        let info = |client, r: crate::local_ssd::LocalSsdRecord| LocalSsdInfo {
            client,
            enable_offloading: r.enable_offloading,
            total_capacity: r.total_capacity,
            used: r.used,
        };
        match client {
            Some(c) => {
                let r = self.local_ssd.get(c).ok_or_else(|| LocalSsdError::NotRegistered(c).code())?;
                Ok(vec![info(c, r)])
            }
            None => Ok(self.local_ssd.snapshot().into_iter().map(|(c, r)| info(c, r)).collect()),
        }
    }
}
