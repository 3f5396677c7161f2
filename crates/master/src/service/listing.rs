//! Key listings (ListKeys, ListKeysPage, the admin `/keys`): pages of readable keys in byte order after a
//! cursor, bounded by a count and a byte budget, found without collecting the rest of the index. Where a
//! listing runs (off the request workers, one at a time) is the server's business (`server::lister`).
//!
//! A page is the smallest keys after the cursor: a scan keeps a bounded ordered set of candidates (the index
//! is hash-ordered, so every page visits every key, but locks and keeps only the few that may enter the
//! set). A key present and readable for a whole listing is on exactly one page: each page holds every
//! readable key in `(cursor, next]`, and the next page starts after `next`.

use super::MasterService;
use crate::metadata::{Lifecycle, ObjectEntry};
use crescent_proto::wire::Limits;
use crescent_proto::{ErrorCode, KeyPage};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A scan rests as long as it worked after each slice of this much work: a listing takes at most about half
/// a CPU however many follow one another, and never long enough at a stretch for the requests sharing its
/// CPU (and its cgroup's share of the CPUs) to wait behind it.
pub const LISTING_PACE: Duration = Duration::from_millis(1);

/// The key bytes one RPC reply may carry: half a control frame, leaving the envelope, the per-key length
/// prefixes and the cursor far inside the frame limit.
pub const LIST_REPLY_BYTES: usize = Limits::CONTROL.max_frame as usize / 2;

/// What a key costs in a page's byte budget: its bytes and a generous length prefix.
fn key_cost(key: &str) -> usize {
    key.len() + 4
}

/// An entry ordered by its key (keys are immutable, so the order never changes under the set).
struct ByKey(Arc<ObjectEntry>);

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}

impl Eq for ByKey {}

impl PartialOrd for ByKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.key().cmp(other.0.key())
    }
}

/// The page being gathered: the smallest readable keys seen after the cursor, one more than the page holds
/// (so a full page knows that more follow), within the byte budget.
struct Gather<'a> {
    after: Option<&'a str>,
    limit: usize,
    max_bytes: usize,
    set: BTreeSet<ByKey>,
    bytes: usize,
    /// The smallest key dropped for want of room: every readable key seen below it is in `set`, so the page
    /// is complete up to its last key, and keys from here on belong to later pages.
    horizon: Option<Arc<ObjectEntry>>,
    /// When the scan last rested.
    rested: Instant,
}

impl Gather<'_> {
    /// Whether `key` (which has the prefix) may enter the page.
    fn admits(&self, key: &str) -> bool {
        self.after.is_none_or(|a| key > a)
            && self.horizon.as_ref().is_none_or(|h| key < h.key())
            && (self.set.len() <= self.limit || self.set.last().is_some_and(|m| key < m.0.key()))
    }

    /// Takes the readable entries of a chunk (each object lock held only to look), then rests if its slice
    /// of work is done (no lock is held here).
    fn take(&mut self, chunk: Vec<Arc<ObjectEntry>>) {
        self.gather(chunk);
        let worked = self.rested.elapsed();
        if worked >= LISTING_PACE {
            std::thread::sleep(worked);
            self.rested = Instant::now();
        }
    }

    fn gather(&mut self, chunk: Vec<Arc<ObjectEntry>>) {
        for e in chunk {
            if !self.admits(e.key()) {
                continue;
            }
            let readable = {
                let st = e.lock();
                st.lifecycle() == Lifecycle::Active && st.has_readable()
            };
            if !readable {
                continue;
            }
            let cost = key_cost(e.key());
            if !self.set.insert(ByKey(e)) {
                continue;
            }
            self.bytes += cost;
            // Over a bound: drop the largest keys (never the last one: a page holds at least one key).
            while self.set.len() > self.limit.saturating_add(1) || (self.bytes > self.max_bytes && self.set.len() > 1) {
                let Some(ByKey(dropped)) = self.set.pop_last() else { break };
                self.bytes -= key_cost(dropped.key());
                self.horizon = Some(dropped);
            }
        }
    }

    fn into_page(self) -> KeyPage {
        // Every key left out sorts after the page's last: one beyond the count, or dropped for want of room.
        let more = self.set.len() > self.limit || self.horizon.is_some();
        let keys: Vec<String> = self.set.into_iter().take(self.limit).map(|e| e.0.key().to_owned()).collect();
        let next = if more { keys.last().cloned() } else { None };
        KeyPage { keys, next }
    }
}

impl MasterService {
    /// Keys of a tenant's objects that have a readable replica and start with `prefix`, sorted, at most
    /// `limit`, and at most [`LIST_REPLY_BYTES`] of them (the first page of [`MasterService::list_keys_page`];
    /// the request of clients from before paging).
    pub fn list_keys(&self, tenant: &str, prefix: &str, limit: usize) -> Result<Vec<String>, ErrorCode> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        Ok(self.list_keys_page(tenant, prefix, None, limit, LIST_REPLY_BYTES)?.keys)
    }

    /// One page of a listing: the readable keys of `tenant` that start with `prefix` and sort strictly after
    /// `after`, in byte order, at most `limit` and `max_bytes` of key bytes (at least one key if any);
    /// `next` says where the following page starts; `limit` 0 is `INVALID_PARAMS`. It visits the whole index
    /// (callers run it off the request path).
    pub fn list_keys_page(
        &self,
        tenant: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<KeyPage, ErrorCode> {
        if limit == 0 {
            return Err(ErrorCode::InvalidParams);
        }
        let Some(t) = self.read_tenant(tenant)? else { return Ok(KeyPage::default()) };
        let mut page =
            Gather { after, limit, max_bytes, set: BTreeSet::new(), bytes: 0, horizon: None, rested: Instant::now() };
        // Only the prefix is checked under the route lock (a bounded compare); the rest with no lock held.
        t.objects().visit_matching(self.config.census_chunk, |key| key.starts_with(prefix), |c| page.take(c));
        Ok(page.into_page())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::service::MasterConfig;
    use crescent_proto::{ClientId, ReplicateConfig};

    fn service(keys: &[String]) -> MasterService {
        let svc = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1_000))).unwrap();
        svc.mount_segment(ClientId::random(), crescent_testkit::segment("seg", 64 << 20)).unwrap();
        let w = ClientId::random();
        for k in keys {
            svc.put_start(w, "", k, 1, &ReplicateConfig::default()).unwrap();
            svc.put_end(w, "", k, None).unwrap();
        }
        svc
    }

    /// Every page of a listing, cursor to cursor.
    fn pages(svc: &MasterService, prefix: &str, limit: usize, max_bytes: usize) -> Vec<KeyPage> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = svc.list_keys_page("", prefix, after.as_deref(), limit, max_bytes).unwrap();
            after = page.next.clone();
            out.push(page);
            if after.is_none() {
                return out;
            }
        }
    }

    #[test]
    fn pages_list_every_readable_key_once_in_order_within_both_bounds() {
        let keys: Vec<String> =
            (0..2_000).map(|i| format!("k{:04}{}", (i * 7919) % 2_000, "x".repeat(i % 40))).collect();
        let svc = service(&keys);
        let w = ClientId::random();
        // Being written: not readable, not listed.
        svc.put_start(w, "", "k-writing", 1, &ReplicateConfig::default()).unwrap();
        let mut want: Vec<String> = keys.clone();
        want.sort();
        for (limit, max_bytes) in [(1, usize::MAX), (7, usize::MAX), (100, 600), (5_000, 1_000), (5_000, usize::MAX)] {
            let pages = pages(&svc, "k", limit, max_bytes);
            for p in &pages {
                assert!(p.keys.len() <= limit && !p.keys.is_empty(), "{limit} {max_bytes}");
                let bytes: usize = p.keys.iter().map(|k| key_cost(k)).sum();
                assert!(bytes <= max_bytes || p.keys.len() == 1);
                if let Some(next) = &p.next {
                    assert_eq!(Some(next), p.keys.last(), "the cursor is the page's last key");
                }
            }
            let got: Vec<String> = pages.into_iter().flat_map(|p| p.keys).collect();
            assert_eq!(got, want, "limit {limit}, {max_bytes} bytes");
        }
        let first = svc.list_keys("", "k000", 3).unwrap();
        assert_eq!(first, want.iter().filter(|k| k.starts_with("k000")).take(3).cloned().collect::<Vec<_>>());
        assert!(svc.list_keys("", "", 0).unwrap().is_empty());
        assert_eq!(svc.list_keys_page("", "", None, 0, 100).unwrap_err(), ErrorCode::InvalidParams);
        // After the last key: an empty, complete page.
        let last = svc.list_keys_page("", "", Some(want.last().unwrap()), 10, 1 << 20).unwrap();
        assert_eq!(last, KeyPage::default());
    }

    #[test]
    fn a_key_present_for_the_whole_listing_is_listed_once_whatever_changes_around_it() {
        let stable: Vec<String> = (0..3_000).map(|i| format!("s{i:05}")).collect();
        let svc = service(&stable);
        let w = ClientId::random();
        let mut listed = Vec::new();
        let mut after: Option<String> = None;
        let mut round = 0;
        loop {
            let page = svc.list_keys_page("", "", after.as_deref(), 97, usize::MAX).unwrap();
            listed.extend(page.keys.iter().filter(|k| k.starts_with('s')).cloned());
            // Between pages, keys come and go on both sides of the cursor (and grow the index's tables).
            for i in 0..300 {
                let k = format!("c{round}-{i}");
                svc.put_start(w, "", &k, 1, &ReplicateConfig::default()).unwrap();
                svc.put_end(w, "", &k, None).unwrap();
                let z = format!("z{round}-{i}");
                svc.put_start(w, "", &z, 1, &ReplicateConfig::default()).unwrap();
                svc.put_end(w, "", &z, None).unwrap();
                if round > 0 {
                    svc.remove("", &format!("z{}-{i}", round - 1), true).unwrap();
                }
            }
            round += 1;
            after = page.next;
            if after.is_none() {
                break;
            }
        }
        assert_eq!(listed, stable, "each stable key once, in order");
        let distinct: BTreeSet<&String> = listed.iter().collect();
        assert_eq!(distinct.len(), listed.len());
    }
}
