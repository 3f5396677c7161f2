//! Client-local SSD registrations over the service: the RPC face of [`crate::local_ssd::LocalSsdManager`].

use super::MasterService;
use crate::local_ssd::LocalSsdError;
use crescent_proto::{ClientId, ErrorCode, LocalSsdInfo};

impl MasterService {
    /// Registers `client`'s local SSD (`SEGMENT_ALREADY_EXISTS` if it has one). The client joins the liveness
    /// monitor: a client that falls silent loses its registration with its segments.
    pub fn register_local_ssd(&self, client: ClientId, enable_offloading: bool) -> Result<(), ErrorCode> {
        self.local_ssd.register(client, enable_offloading).map_err(|e| e.code())?;
        self.ping(client);
        Ok(())
    }

    /// Drops `client`'s registration; unregistering one that has none is OK.
    pub fn unregister_local_ssd(&self, client: ClientId) {
        self.local_ssd.unregister(client);
    }

    /// Records the capacity `client` reports for its SSD (`SEGMENT_NOT_FOUND` without a registration,
    /// `INVALID_PARAMS` above `i64::MAX`).
    pub fn report_local_ssd(&self, client: ClientId, capacity: u64) -> Result<(), ErrorCode> {
        let bytes = i64::try_from(capacity).map_err(|_| ErrorCode::InvalidParams)?;
        self.local_ssd.report_capacity(client, bytes).map(|_| ()).map_err(|e| e.code())
    }

    /// Enables or disables offloading to `client`'s SSD (`SEGMENT_NOT_FOUND` without a registration).
    pub fn set_local_ssd_offloading(&self, client: ClientId, enabled: bool) -> Result<(), ErrorCode> {
        self.local_ssd.set_offloading(client, enabled).map_err(|e| e.code())
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
