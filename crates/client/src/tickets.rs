//! The data-plane tickets of one client (`crescent_net::host`): fetched from the master the first time a lane
//! to a host needs one, kept until a quarter of their life is left, dropped when a host refuses one.

use crate::master::MasterConnection;
use crescent_net::auth::{Credential, CredentialSource};
use crescent_net::grant::unix_ms;
use crescent_net::host::TICKET_TTL;
use crescent_proto::{ClientId, MasterRequest, MasterResponse, SegmentId};
use crescent_transfer::{Tickets, TransferError};
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Tickets by host endpoint, from the master this client talks to.
pub struct MasterTickets {
    master: Arc<MasterConnection>,
    /// What the client proves to the master: the key its tickets are sealed for.
    credential: CredentialSource,
    client: ClientId,
    /// Opened tickets by endpoint (a leaf lock, held only to look up or insert).
    cache: Mutex<HashMap<String, Credential>>,
}

impl std::fmt::Debug for MasterTickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MasterTickets({} cached, keys redacted)", self.cache.lock().len())
    }
}

impl MasterTickets {
    /// The tickets of the client `client` whose master connection `master` proves `credential`.
    pub fn new(master: Arc<MasterConnection>, credential: CredentialSource, client: ClientId) -> Self {
        Self { master, credential, client, cache: Mutex::default() }
    }

    /// A cached ticket for `endpoint` with more than a quarter of its life left.
    fn cached(&self, endpoint: &str) -> Option<Credential> {
        let fresh_until = unix_ms().saturating_add(TICKET_TTL.as_millis() as u64 / 4);
        let cache = self.cache.lock();
        cache.get(endpoint).filter(|t| t.ticket_expires_ms().is_some_and(|e| e > fresh_until)).cloned()
    }

    async fn fetch(&self, endpoint: &str, segment: SegmentId) -> Result<Credential, TransferError> {
        let req = MasterRequest::DataTicket { segment };
        let sealed = self
            .master
            .call_expect(&req, |r| if let MasterResponse::Ticket(t) = r { Some(t) } else { None })
            .await
            .map_err(|e| {
                tracing::debug!(endpoint, %segment, error = %e, "no data-plane ticket");
                TransferError::Refused(e.code())
            })?;
        let ticket = self.credential.current().open_ticket(&sealed, self.client);
        let mut cache = self.cache.lock();
        // Endpoints come and go with the cluster; the map never outgrows it by much.
        if cache.len() >= 4096 {
            cache.clear();
        }
        cache.insert(endpoint.to_owned(), ticket.clone());
        Ok(ticket)
    }
}

impl Tickets for MasterTickets {
    fn ticket<'a>(&'a self, endpoint: &'a str, segment: SegmentId) -> BoxFuture<'a, Result<Credential, TransferError>> {
        Box::pin(async move {
            match self.cached(endpoint) {
                Some(t) => Ok(t),
                None => self.fetch(endpoint, segment).await,
            }
        })
    }

    fn forget(&self, endpoint: &str) {
        self.cache.lock().remove(endpoint);
    }
}
