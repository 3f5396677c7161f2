//! A fault-injecting wrapper for tests: scheduled failures, delays, "applied but reported ambiguous" writes and
//! racing writers, each triggered by the next call of a kind, the N-th call overall, or every call of a kind.

use super::{HaKvBackend, KvError, KvFuture, KvLimits, KvTxn, RangePage, TxnOutcome};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// The kinds of backend call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvOp {
    /// [`HaKvBackend::get`].
    Get,
    /// [`HaKvBackend::put`].
    Put,
    /// [`HaKvBackend::range`].
    Range,
    /// [`HaKvBackend::txn`].
    Txn,
    /// [`HaKvBackend::delete_range`].
    DeleteRange,
}

impl KvOp {
    fn index(self) -> usize {
        match self {
            KvOp::Get => 0,
            KvOp::Put => 1,
            KvOp::Range => 2,
            KvOp::Txn => 3,
            KvOp::DeleteRange => 4,
        }
    }
}

/// What happens to a call a fault is triggered on.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Return this error without reaching the inner backend.
    Fail(KvError),
    /// Wait this long, then make the call.
    Delay(Duration),
    /// Make the call (so a write is applied), then report [`KvError::Ambiguous`]: the unknown-outcome case.
    ApplyThenAmbiguous,
    /// Put this key and value into the inner backend first (a racing writer), then make the call.
    PutFirst(Vec<u8>, Vec<u8>),
    /// Answer as if nothing were stored (a get finds no key, a range an empty page) without reaching the inner
    /// backend: a deleted or never-written key. Puts and txns it is triggered on proceed normally.
    Absent,
    /// Add a permit to `entered` (the test learns the call arrived), wait for a permit of `release`, then make
    /// the call: holds a call in flight exactly as long as a test wants, with no timing involved.
    Block {
        /// Gets one permit when the call arrives.
        entered: Arc<tokio::sync::Semaphore>,
        /// The call proceeds once it takes one permit from here.
        release: Arc<tokio::sync::Semaphore>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Next(KvOp),
    NthCall(u64),
    Every(KvOp),
}

#[derive(Debug, Default)]
struct State {
    calls: u64,
    calls_by_op: [u64; 5],
    rules: Vec<(Trigger, Fault)>,
}

/// Wraps a backend and injects scheduled faults. Share it as `Arc<FaultyKv<_>>` to schedule faults while the code
/// under test holds the same backend.
#[derive(Debug)]
pub struct FaultyKv<B> {
    inner: B,
    state: Mutex<State>,
}

impl<B: HaKvBackend> FaultyKv<B> {
    /// Wraps `inner` with no faults scheduled.
    pub fn new(inner: B) -> Self {
        Self { inner, state: Mutex::new(State::default()) }
    }

    /// The wrapped backend (calls to it bypass the faults).
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Applies `fault` to the next call of kind `op` only.
    pub fn inject_next(&self, op: KvOp, fault: Fault) {
        self.state.lock().rules.push((Trigger::Next(op), fault));
    }

    /// Applies `fault` to the `n`-th call overall (1-based, counted since the wrapper was made).
    pub fn inject_nth_call(&self, n: u64, fault: Fault) {
        self.state.lock().rules.push((Trigger::NthCall(n), fault));
    }

    /// Applies `fault` to every call of kind `op` until [`FaultyKv::clear`].
    pub fn inject_every(&self, op: KvOp, fault: Fault) {
        self.state.lock().rules.push((Trigger::Every(op), fault));
    }

    /// Drops every scheduled fault.
    pub fn clear(&self) {
        self.state.lock().rules.clear();
    }

    /// Calls of kind `op` made so far.
    pub fn calls(&self, op: KvOp) -> u64 {
        self.state.lock().calls_by_op[op.index()]
    }

    /// Calls of every kind made so far.
    pub fn total_calls(&self) -> u64 {
        self.state.lock().calls
    }

    /// Counts the call and takes the fault it triggers, if any (the lock is released before anything awaits).
    fn take_fault(&self, op: KvOp) -> Option<Fault> {
        let mut s = self.state.lock();
        s.calls += 1;
        s.calls_by_op[op.index()] += 1;
        let n = s.calls;
        let i = s.rules.iter().position(|(t, _)| match *t {
            Trigger::Next(o) | Trigger::Every(o) => o == op,
            Trigger::NthCall(k) => k == n,
        })?;
        if matches!(s.rules[i].0, Trigger::Every(_)) { Some(s.rules[i].1.clone()) } else { Some(s.rules.remove(i).1) }
    }

    async fn run<'a, T: Send + 'a>(&'a self, op: KvOp, call: KvFuture<'a, T>) -> Result<T, KvError> {
        let fault = self.take_fault(op);
        self.run_with(fault, op, call).await
    }

    async fn run_with<'a, T: Send + 'a>(
        &'a self,
        fault: Option<Fault>,
        op: KvOp,
        call: KvFuture<'a, T>,
    ) -> Result<T, KvError> {
        match fault {
            None | Some(Fault::Absent) => call.await,
            Some(Fault::Fail(e)) => Err(e),
            Some(Fault::Delay(d)) => {
                tokio::time::sleep(d).await;
                call.await
            }
            Some(Fault::ApplyThenAmbiguous) => {
                call.await?;
                Err(KvError::Ambiguous(format!("injected: {op:?} applied, reported ambiguous")))
            }
            Some(Fault::Block { entered, release }) => {
                entered.add_permits(1);
                // A closed semaphore also releases the call.
                if let Ok(p) = release.acquire().await {
                    p.forget();
                }
                call.await
            }
            Some(Fault::PutFirst(k, v)) => {
                self.inner.put(&k, &v).await?;
                call.await
            }
        }
    }
}

impl<B: HaKvBackend> HaKvBackend for FaultyKv<B> {
    fn get<'a>(&'a self, key: &'a [u8]) -> KvFuture<'a, Option<Vec<u8>>> {
        Box::pin(async move {
            match self.take_fault(KvOp::Get) {
                Some(Fault::Absent) => Ok(None),
                fault => self.run_with(fault, KvOp::Get, self.inner.get(key)).await,
            }
        })
    }

    fn put<'a>(&'a self, key: &'a [u8], value: &'a [u8]) -> KvFuture<'a, ()> {
        Box::pin(self.run(KvOp::Put, self.inner.put(key, value)))
    }

    fn range<'a>(&'a self, begin: &'a [u8], end: &'a [u8], limit: usize) -> KvFuture<'a, RangePage> {
        Box::pin(async move {
            match self.take_fault(KvOp::Range) {
                Some(Fault::Absent) => Ok(RangePage::default()),
                fault => self.run_with(fault, KvOp::Range, self.inner.range(begin, end, limit)).await,
            }
        })
    }

    fn txn<'a>(&'a self, txn: &'a KvTxn) -> KvFuture<'a, TxnOutcome> {
        Box::pin(self.run(KvOp::Txn, self.inner.txn(txn)))
    }

    fn supports_txn(&self) -> bool {
        self.inner.supports_txn()
    }

    fn limits(&self) -> KvLimits {
        self.inner.limits()
    }

    fn delete_range<'a>(&'a self, begin: &'a [u8], end: &'a [u8]) -> KvFuture<'a, u64> {
        Box::pin(self.run(KvOp::DeleteRange, self.inner.delete_range(begin, end)))
    }

    fn revision<'a>(&'a self) -> KvFuture<'a, u64> {
        self.inner.revision()
    }

    fn compact<'a>(&'a self, revision: u64) -> KvFuture<'a, ()> {
        self.inner.compact(revision)
    }
}

/// Shared backends are backends (so `Arc<dyn HaKvBackend>` can be wrapped and passed around).
impl<T: HaKvBackend + ?Sized> HaKvBackend for Arc<T> {
    fn get<'a>(&'a self, key: &'a [u8]) -> KvFuture<'a, Option<Vec<u8>>> {
        (**self).get(key)
    }

    fn put<'a>(&'a self, key: &'a [u8], value: &'a [u8]) -> KvFuture<'a, ()> {
        (**self).put(key, value)
    }

    fn range<'a>(&'a self, begin: &'a [u8], end: &'a [u8], limit: usize) -> KvFuture<'a, RangePage> {
        (**self).range(begin, end, limit)
    }

    fn txn<'a>(&'a self, txn: &'a KvTxn) -> KvFuture<'a, TxnOutcome> {
        (**self).txn(txn)
    }

    fn supports_txn(&self) -> bool {
        (**self).supports_txn()
    }

    fn limits(&self) -> KvLimits {
        (**self).limits()
    }

    fn delete_range<'a>(&'a self, begin: &'a [u8], end: &'a [u8]) -> KvFuture<'a, u64> {
        (**self).delete_range(begin, end)
    }

    fn revision<'a>(&'a self) -> KvFuture<'a, u64> {
        (**self).revision()
    }

    fn compact<'a>(&'a self, revision: u64) -> KvFuture<'a, ()> {
        (**self).compact(revision)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::kv::{KvCompare, KvPair, MemoryKv};
    use std::time::Instant;

    fn put_txn(k: &[u8]) -> KvTxn {
        KvTxn {
            compares: vec![KvCompare::KeyAbsent(k.to_vec())],
            puts: vec![KvPair { key: k.to_vec(), value: b"v".to_vec() }],
        }
    }

    #[tokio::test]
    async fn nth_call_and_every_call_triggers() {
        let kv = FaultyKv::new(MemoryKv::new());
        kv.inject_nth_call(3, Fault::Fail(KvError::Unavailable("third".into())));
        assert!(kv.get(b"a").await.is_ok());
        assert!(kv.put(b"a", b"1").await.is_ok());
        assert_eq!(kv.get(b"a").await, Err(KvError::Unavailable("third".into())));
        assert!(kv.get(b"a").await.is_ok(), "an N-th-call fault fires once");
        kv.inject_every(KvOp::Range, Fault::Fail(KvError::Unavailable("always".into())));
        for _ in 0..3 {
            assert!(kv.range(b"", b"", 0).await.is_err());
        }
        assert!(kv.get(b"a").await.is_ok(), "other kinds are unaffected");
        kv.clear();
        assert!(kv.range(b"", b"", 0).await.is_ok());
        assert_eq!((kv.calls(KvOp::Get), kv.calls(KvOp::Range), kv.total_calls()), (4, 4, 9));
    }

    #[tokio::test]
    async fn delay_then_call_and_racing_put() {
        let kv = FaultyKv::new(MemoryKv::new());
        kv.inject_next(KvOp::Txn, Fault::Delay(Duration::from_millis(30)));
        let start = Instant::now();
        assert_eq!(kv.txn(&put_txn(b"a")).await.unwrap(), TxnOutcome::Succeeded);
        assert!(start.elapsed() >= Duration::from_millis(30));
        // A racing writer creates the key just before our create-if-absent.
        kv.inject_next(KvOp::Txn, Fault::PutFirst(b"b".to_vec(), b"other".to_vec()));
        assert_eq!(kv.txn(&put_txn(b"b")).await.unwrap(), TxnOutcome::CompareFailed);
        assert_eq!(kv.get(b"b").await.unwrap(), Some(b"other".to_vec()));
        // Applied, then reported ambiguous.
        kv.inject_next(KvOp::Txn, Fault::ApplyThenAmbiguous);
        assert!(kv.txn(&put_txn(b"c")).await.unwrap_err().is_ambiguous());
        assert_eq!(kv.get(b"c").await.unwrap(), Some(b"v".to_vec()));
    }
}
