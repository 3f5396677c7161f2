//! `LocalSsdManager`: per-client local SSD registrations.
//!
//! A client's local SSD is an object store the client manages itself, not an address range the master allocates
//! from, so it lives here and not in the segment pool. The master only tracks who registered, how much capacity
//! they report, how much is used by replicas it knows of, and whether offloading to them is enabled.

use crescent_proto::{ClientId, ErrorCode};
use parking_lot::RwLock;
use std::collections::HashMap;

/// Why a local SSD operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocalSsdError {
    /// The client already registered its SSD.
    #[error("client {0} already registered a local SSD")]
    AlreadyRegistered(ClientId),
    /// The client has no registration.
    #[error("client {0} has no local SSD registration")]
    NotRegistered(ClientId),
    /// A negative capacity or a release larger than the usage.
    #[error("invalid local SSD accounting: {0}")]
    Invalid(&'static str),
}

impl LocalSsdError {
    /// The wire code.
    pub fn code(&self) -> ErrorCode {
        match self {
            LocalSsdError::AlreadyRegistered(_) => ErrorCode::SegmentAlreadyExists,
            LocalSsdError::NotRegistered(_) => ErrorCode::SegmentNotFound,
            LocalSsdError::Invalid(_) => ErrorCode::InvalidParams,
        }
    }
}

/// One client's registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LocalSsdRecord {
    /// Whether the master may queue offloads to this client.
    pub enable_offloading: bool,
    /// Capacity the client reported, in bytes.
    pub total_capacity: u64,
    /// Bytes held by LOCAL_DISK replicas the master knows of (runtime only; rebuilt from metadata on restore).
    pub used: u64,
}

impl LocalSsdRecord {
    /// `(total − min(used, total)) / total`, 1.0 when no capacity is reported (nothing known to be full).
    pub fn free_ratio(&self) -> f64 {
        if self.total_capacity == 0 {
            return 1.0;
        }
        (self.total_capacity - self.used.min(self.total_capacity)) as f64 / self.total_capacity as f64
    }
}

/// The owner of every client's local SSD registration.
#[derive(Debug, Default)]
pub struct LocalSsdManager {
    clients: RwLock<HashMap<ClientId, LocalSsdRecord>>,
}

impl LocalSsdManager {
    /// An empty manager.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a client's SSD.
    pub fn register(&self, client: ClientId, enable_offloading: bool) -> Result<(), LocalSsdError> {
        self.register_with(client, enable_offloading, |_| {})
    }

    /// [`LocalSsdManager::register`], calling `changed` with the new record under the lock that orders changes
    /// (where the oplog entry is committed).
    pub fn register_with(
        &self,
        client: ClientId,
        enable_offloading: bool,
        changed: impl FnOnce(&LocalSsdRecord),
    ) -> Result<(), LocalSsdError> {
        let mut m = self.clients.write();
        if m.contains_key(&client) {
            return Err(LocalSsdError::AlreadyRegistered(client));
        }
        let r = m.entry(client).or_insert(LocalSsdRecord { enable_offloading, ..LocalSsdRecord::default() });
        changed(r);
        Ok(())
    }

    /// Removes a registration, returning it (`None` if there was none: unregistering is idempotent).
    pub fn unregister(&self, client: ClientId) -> Option<LocalSsdRecord> {
        self.unregister_with(client, || {})
    }

    /// [`LocalSsdManager::unregister`], calling `changed` under the lock when a registration went.
    pub fn unregister_with(&self, client: ClientId, changed: impl FnOnce()) -> Option<LocalSsdRecord> {
        let mut m = self.clients.write();
        let gone = m.remove(&client);
        if gone.is_some() {
            changed();
        }
        gone
    }

    /// Records a new capacity report; returns `(previous, current)`.
    pub fn report_capacity(&self, client: ClientId, bytes: i64) -> Result<(u64, u64), LocalSsdError> {
        self.report_capacity_with(client, bytes, |_| {})
    }

    /// [`LocalSsdManager::report_capacity`], calling `changed` under the lock when the capacity differs from
    /// the last report (clients report periodically: an unchanged report changes nothing).
    pub fn report_capacity_with(
        &self,
        client: ClientId,
        bytes: i64,
        changed: impl FnOnce(&LocalSsdRecord),
    ) -> Result<(u64, u64), LocalSsdError> {
        let bytes = u64::try_from(bytes).map_err(|_| LocalSsdError::Invalid("negative capacity"))?;
        let mut m = self.clients.write();
        let r = m.get_mut(&client).ok_or(LocalSsdError::NotRegistered(client))?;
        let prev = std::mem::replace(&mut r.total_capacity, bytes);
        if prev != bytes {
            changed(r);
        }
        Ok((prev, bytes))
    }

    /// Adds to (positive) or releases from (negative) the used bytes. A release larger than the usage fails
    /// without changing anything.
    pub fn adjust_used(&self, client: ClientId, delta: i64) -> Result<u64, LocalSsdError> {
        let mut m = self.clients.write();
        let r = m.get_mut(&client).ok_or(LocalSsdError::NotRegistered(client))?;
        let next = if delta >= 0 {
            r.used.saturating_add(delta.unsigned_abs())
        } else {
            r.used.checked_sub(delta.unsigned_abs()).ok_or(LocalSsdError::Invalid("release exceeds usage"))?
        };
        r.used = next;
        Ok(next)
    }

    /// Enables or disables offloading to a client.
    pub fn set_offloading(&self, client: ClientId, enabled: bool) -> Result<(), LocalSsdError> {
        self.set_offloading_with(client, enabled, |_| {})
    }

    /// [`LocalSsdManager::set_offloading`], calling `changed` under the lock when the flag changed.
    pub fn set_offloading_with(
        &self,
        client: ClientId,
        enabled: bool,
        changed: impl FnOnce(&LocalSsdRecord),
    ) -> Result<(), LocalSsdError> {
        let mut m = self.clients.write();
        let r = m.get_mut(&client).ok_or(LocalSsdError::NotRegistered(client))?;
        if std::mem::replace(&mut r.enable_offloading, enabled) != enabled {
            changed(r);
        }
        Ok(())
    }

    /// A client's registration.
    pub fn get(&self, client: ClientId) -> Option<LocalSsdRecord> {
        self.clients.read().get(&client).copied()
    }

    /// Whether a client is registered.
    pub fn is_registered(&self, client: ClientId) -> bool {
        self.clients.read().contains_key(&client)
    }

    /// Σ reported capacity over all clients.
    pub fn total_capacity(&self) -> u64 {
        self.clients.read().values().map(|r| r.total_capacity).sum()
    }

    /// Persistent state (registrations, offloading flags, capacities; usage is runtime-only).
    pub fn snapshot(&self) -> Vec<(ClientId, LocalSsdRecord)> {
        let mut v: Vec<_> = self.clients.read().iter().map(|(c, r)| (*c, *r)).collect();
        v.sort_by_key(|(c, _)| *c);
        v
    }

    /// Replaces all state with a snapshot's; usage restarts at 0 (re-added as metadata is restored).
    pub fn restore(&self, records: Vec<(ClientId, LocalSsdRecord)>) {
        let m = records.into_iter().map(|(c, r)| (c, LocalSsdRecord { used: 0, ..r })).collect();
        *self.clients.write() = m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_lifecycle() {
        let m = LocalSsdManager::new();
        let c = ClientId::random();
        assert_eq!(m.report_capacity(c, 10), Err(LocalSsdError::NotRegistered(c)));
        m.register(c, true).unwrap();
        assert_eq!(m.register(c, false).unwrap_err().code(), ErrorCode::SegmentAlreadyExists);
        assert_eq!(m.report_capacity(c, -1).unwrap_err().code(), ErrorCode::InvalidParams);
        assert_eq!(m.report_capacity(c, 1000).unwrap(), (0, 1000));
        assert_eq!(m.report_capacity(c, 2000).unwrap(), (1000, 2000));
        assert_eq!(m.adjust_used(c, 500).unwrap(), 500);
        assert_eq!(m.adjust_used(c, -600).unwrap_err().code(), ErrorCode::InvalidParams);
        assert_eq!(m.get(c).unwrap().used, 500, "a failed release changes nothing");
        assert!((m.get(c).unwrap().free_ratio() - 0.75).abs() < 1e-9);
        m.set_offloading(c, false).unwrap();
        assert!(!m.get(c).unwrap().enable_offloading);
        assert_eq!(m.total_capacity(), 2000);
        assert_eq!(m.unregister(c).map(|r| r.total_capacity), Some(2000));
        assert_eq!(m.unregister(c), None);
        assert!(!m.is_registered(c));
    }

    #[test]
    fn snapshot_keeps_registrations_and_resets_usage() {
        let m = LocalSsdManager::new();
        let c = ClientId::random();
        m.register(c, true).unwrap();
        m.report_capacity(c, 100).unwrap();
        m.adjust_used(c, 40).unwrap();
        let snap = m.snapshot();
        let m2 = LocalSsdManager::new();
        m2.restore(snap);
        let r = m2.get(c).unwrap();
        assert_eq!((r.enable_offloading, r.total_capacity, r.used), (true, 100, 0));
    }
}
