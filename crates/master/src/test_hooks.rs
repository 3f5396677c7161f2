//! Points where a unit test runs code in the middle of an operation, on the operation's own thread, to replay
//! an interleaving deterministically (compiled into test builds only).

use std::cell::RefCell;

type Hook = Box<dyn FnMut()>;

thread_local! {
    static AFTER_WRITE_TENANT: RefCell<Option<Hook>> = RefCell::new(None);
    static BEFORE_EVICTION_COMMIT: RefCell<Option<Hook>> = RefCell::new(None);
    static AFTER_EVICTION_UNLOCK: RefCell<Option<Hook>> = RefCell::new(None);
    static AFTER_UNMOUNT: RefCell<Option<Hook>> = RefCell::new(None);
    static BEFORE_ROOM_GATE: RefCell<Option<Hook>> = RefCell::new(None);
}

fn fire(slot: &'static std::thread::LocalKey<RefCell<Option<Hook>>>) {
    // Taken out first: the hook may itself run the operation that calls this point.
    let hook = slot.with(|h| h.borrow_mut().take());
    if let Some(mut f) = hook {
        f();
    }
}

/// Runs `f` (once) right after a write on this thread has resolved its tenant.
pub fn set_after_write_tenant(f: impl FnMut() + 'static) {
    AFTER_WRITE_TENANT.with(|h| *h.borrow_mut() = Some(Box::new(f)));
}

/// Runs `f` (once) between an eviction round's census and its first commit on this thread.
pub fn set_before_eviction_commit(f: impl FnMut() + 'static) {
    BEFORE_EVICTION_COMMIT.with(|h| *h.borrow_mut() = Some(Box::new(f)));
}

pub(crate) fn after_write_tenant() {
    fire(&AFTER_WRITE_TENANT);
}

pub(crate) fn before_eviction_commit() {
    fire(&BEFORE_EVICTION_COMMIT);
}

/// Runs `f` (once) right after an eviction on this thread released an evicted object's lock.
pub fn set_after_eviction_unlock(f: impl FnMut() + 'static) {
    AFTER_EVICTION_UNLOCK.with(|h| *h.borrow_mut() = Some(Box::new(f)));
}

/// Runs `f` (once) right after an unmount on this thread took the segment out of the pool.
pub fn set_after_unmount(f: impl FnMut() + 'static) {
    AFTER_UNMOUNT.with(|h| *h.borrow_mut() = Some(Box::new(f)));
}

pub(crate) fn after_eviction_unlock() {
    fire(&AFTER_EVICTION_UNLOCK);
}

pub(crate) fn after_unmount() {
    fire(&AFTER_UNMOUNT);
}

/// Runs `f` (once) when a write on this thread found no room and is about to wait for the eviction gate.
pub fn set_before_room_gate(f: impl FnMut() + 'static) {
    BEFORE_ROOM_GATE.with(|h| *h.borrow_mut() = Some(Box::new(f)));
}

pub(crate) fn before_room_gate() {
    fire(&BEFORE_ROOM_GATE);
}
