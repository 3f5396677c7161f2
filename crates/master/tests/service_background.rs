//! The background loop runs the steppable housekeeping on its own and stops when its handle is dropped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::clock::SystemClock;
use crescent_master::service::{MasterConfig, MasterService};
use crescent_proto::{ClientId, ReplicateConfig};
use crescent_testkit::wait_for;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[test]
fn background_loop_evicts_over_the_watermark_and_stops_on_drop() {
    let svc = Arc::new(MasterService::new(MasterConfig::default(), Arc::new(SystemClock::new())).unwrap());
    svc.mount_segment(ClientId::random(), spec("s", 100 * 1024)).unwrap();
    let w = ClientId::random();
    for i in 0..95 {
        let k = format!("k{i}");
        svc.put_start(w, "", &k, 1024, &ReplicateConfig::default()).unwrap();
        svc.put_end(w, "", &k, None).unwrap();
    }
    let bg = svc.spawn_background().unwrap();
    let m = svc.metrics();
    assert!(
        wait_for(Duration::from_secs(30), || m.evicted_objects.load(Ordering::Relaxed) >= 10
            && m.background_ticks.load(Ordering::Relaxed) > 0),
        "the loop evicted over the watermark and reports its ticks"
    );
    drop(bg);
    let ticks = svc.metrics().background_ticks.load(Ordering::Relaxed);
    // Joined on drop: no tick can happen any more.
    for _ in 0..1000 {
        std::thread::yield_now();
    }
    assert_eq!(svc.metrics().background_ticks.load(Ordering::Relaxed), ticks);
    assert_eq!(Arc::strong_count(&svc), 1, "the loop released its handle on the service");
}
