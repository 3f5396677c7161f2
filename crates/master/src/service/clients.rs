//! The client table: liveness deadlines, remount state and hosts of the clients the master has heard from.

use crate::clock::Timestamp;
use crescent_proto::{ClientId, ClientStatus};
use parking_lot::Mutex;
use std::collections::HashMap;

#[derive(Debug, Clone)]
struct ClientRecord {
    deadline: Timestamp,
    /// Set by remount: the master has the client's full segment list.
    remounted: bool,
    host: Option<String>,
}

/// Liveness of every tracked client.
#[derive(Debug, Default)]
pub(super) struct ClientTable {
    clients: Mutex<HashMap<ClientId, ClientRecord>>,
}

impl ClientTable {
    /// Refreshes (or starts) a client's TTL; returns its status.
    pub fn touch(&self, client: ClientId, deadline: Timestamp) -> ClientStatus {
        let mut m = self.clients.lock();
        let joined = !m.contains_key(&client);
        let r = m.entry(client).or_insert(ClientRecord { deadline, remounted: false, host: None });
        r.deadline = r.deadline.max(deadline);
        let status = if r.remounted { ClientStatus::Ok } else { ClientStatus::NeedRemount };
        drop(m);
        if joined {
            tracing::info!(%client, "client joined");
        }
        status
    }

    /// Marks a client remounted (and alive until `deadline`).
    pub fn mark_remounted(&self, client: ClientId, deadline: Timestamp) {
        let mut m = self.clients.lock();
        let r = m.entry(client).or_insert(ClientRecord { deadline, remounted: true, host: None });
        r.remounted = true;
        r.deadline = r.deadline.max(deadline);
    }

    /// Records the host a client's segments live on.
    pub fn set_host(&self, client: ClientId, host: &str) {
        if host.is_empty() {
            return;
        }
        if let Some(r) = self.clients.lock().get_mut(&client) {
            r.host = Some(host.to_owned());
        }
    }

    /// The client's host, if known.
    pub fn host(&self, client: ClientId) -> Option<String> {
        self.clients.lock().get(&client).and_then(|r| r.host.clone())
    }

    /// Removes and returns the clients whose deadline passed.
    pub fn take_expired(&self, now: Timestamp) -> Vec<ClientId> {
        let mut m = self.clients.lock();
        let expired: Vec<ClientId> = m.iter().filter(|(_, r)| r.deadline <= now).map(|(c, _)| *c).collect();
        for c in &expired {
            m.remove(c);
        }
        expired
    }

    /// Whether `client` is tracked.
    pub fn contains(&self, client: ClientId) -> bool {
        self.clients.lock().contains_key(&client)
    }

    /// Number of tracked clients.
    pub fn len(&self) -> usize {
        self.clients.lock().len()
    }
}
