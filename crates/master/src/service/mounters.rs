//! Which principal mounted each client id's segments, on a master that authenticates. SEGMENT_MOUNT records
//! it (oplog and snapshots), so a master that replays the log — a promoted standby, a restarted master — knows
//! it before the owner reconnects: the segment's host keys (`server::hosts`) and the owner's client id, which
//! another principal naming it in its hello may not take (`server::claims`), survive a failover.
//!
//! An entry lives while its client id owns a segment in the pool; entries of ids that own none are swept when
//! the table has doubled since the last sweep (O(1) per admission).
//!
//! Lock order: the table's mutex, then (sweeping) the pool's shared lock; nothing takes this mutex under
//! another lock.

use crescent_proto::{ClientId, Principal};
use parking_lot::Mutex;
use std::collections::HashMap;

/// Mounting principals by client id.
#[derive(Debug, Default)]
pub(super) struct Mounters {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    by_client: HashMap<ClientId, Principal>,
    /// Entries after the last sweep: the next waits until the table doubles.
    swept_at: usize,
}

impl Mounters {
    /// Records that `principal` mounts segments in `client`'s name. Refused with the holder when another
    /// principal's segments are mounted in that name (`owns` says whether a client id still owns any).
    pub fn admit(
        &self,
        client: ClientId,
        principal: &Principal,
        owns: impl Fn(ClientId) -> bool,
    ) -> Result<(), Principal> {
        let mut t = self.table.lock();
        if let Some(holder) = t.by_client.get(&client) {
            if holder == principal {
                return Ok(());
            }
            if owns(client) {
                return Err(holder.clone());
            }
        }
        if t.by_client.len() >= 2 * t.swept_at.max(64) {
            t.by_client.retain(|&c, _| owns(c));
            t.swept_at = t.by_client.len();
        }
        t.by_client.insert(client, principal.clone());
        Ok(())
    }

    /// Records a replayed mount's principal (the log is the authority: the last record wins).
    pub fn restore(&self, client: ClientId, principal: Principal) {
        self.table.lock().by_client.insert(client, principal);
    }

    /// The principal that mounted `client`'s segments, if one did.
    pub fn get(&self, client: ClientId) -> Option<Principal> {
        self.table.lock().by_client.get(&client).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_ids_segments_are_one_principals_while_it_owns_any() {
        let m = Mounters::default();
        let (id, a, b) = (ClientId::random(), "node:a".parse().unwrap(), "tenant:b".parse().unwrap());
        assert_eq!(m.admit(id, &a, |_| true), Ok(()));
        assert_eq!(m.admit(id, &a, |_| true), Ok(()), "its own again");
        assert_eq!(m.admit(id, &b, |_| true), Err(a.clone()), "another's while a segment is mounted");
        assert_eq!(m.get(id), Some(a.clone()));
        assert_eq!(m.admit(id, &b, |_| false), Ok(()), "free once the id owns no segment");
        assert_eq!(m.get(id), Some(b.clone()));
        m.restore(id, a.clone());
        assert_eq!(m.get(id), Some(a));
        assert_eq!(m.get(ClientId::random()), None);
    }

    #[test]
    fn ids_that_own_nothing_are_swept_as_the_table_grows() {
        let m = Mounters::default();
        let p: Principal = "node".parse().unwrap();
        let kept = ClientId::random();
        m.admit(kept, &p, |_| true).unwrap();
        for _ in 0..1000 {
            m.admit(ClientId::random(), &p, |c| c == kept).unwrap();
        }
        assert!(m.table.lock().by_client.len() < 200, "swept: {}", m.table.lock().by_client.len());
        assert_eq!(m.get(kept), Some(p));
    }
}
