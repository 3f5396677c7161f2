//! Writer numbers: a `u32` stands for the `ClientId` that wrote an object, so each replica can carry its writer
//! in the four bytes of padding it already had (`Replica::writer`) instead of 16 more bytes per object.
//!
//! The numbering is process-wide: a number means the same client in every service of the process, for the
//! process's life (numbers are never reused), so an object's record can be written from its replicas by code
//! that holds no service (the eviction log, snapshots). Each distinct writer costs one table entry (~40 B) for
//! the process's life. Number 0 is "unknown" (an object restored from a log or snapshot that did not record its
//! writer, or the table is full): it never matches a caller.

use crescent_proto::ClientId;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::OnceLock;

/// The number of a writer not known (never matches a caller).
pub const UNKNOWN: u32 = 0;

#[derive(Default)]
struct Table {
    numbers: HashMap<ClientId, u32>,
    /// `clients[n - 1]` is number `n`'s client.
    clients: Vec<ClientId>,
}

fn table() -> &'static RwLock<Table> {
    static TABLE: OnceLock<RwLock<Table>> = OnceLock::new();
    TABLE.get_or_init(RwLock::default)
}

/// The number of `client`, given one on first sight ([`UNKNOWN`] if all 2³² − 1 are taken). The table's lock is
/// a leaf (taken under an object lock by PutEnd).
pub fn number(client: ClientId) -> u32 {
    if let Some(n) = table().read().numbers.get(&client) {
        return *n;
    }
    let mut t = table().write();
    if let Some(n) = t.numbers.get(&client) {
        return *n;
    }
    let Ok(n) = u32::try_from(t.clients.len() + 1) else { return UNKNOWN };
    if n == u32::MAX {
        return UNKNOWN;
    }
    t.clients.push(client);
    t.numbers.insert(client, n);
    n
}

/// The number of `client` if it has one (a caller that never wrote has none: it owns nothing).
pub fn lookup(client: ClientId) -> Option<u32> {
    table().read().numbers.get(&client).copied()
}

/// The client number `n` stands for (`None` for [`UNKNOWN`] or a number never given).
pub fn client(n: u32) -> Option<ClientId> {
    let i = usize::try_from(n.checked_sub(1)?).ok()?;
    table().read().clients.get(i).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_keeps_its_number_and_numbers_map_back() {
        let (a, b) = (ClientId::random(), ClientId::random());
        assert_eq!(lookup(a), None, "no number before its first write");
        let (na, nb) = (number(a), number(b));
        assert_ne!(na, UNKNOWN);
        assert_ne!(na, nb);
        assert_eq!(number(a), na, "stable");
        assert_eq!(lookup(a), Some(na));
        assert_eq!((client(na), client(nb)), (Some(a), Some(b)));
        assert_eq!(client(UNKNOWN), None);
        assert_eq!(client(u32::MAX), None);
    }
}
