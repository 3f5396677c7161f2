//! The README's main command works.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use assert_cmd::Command;

#[test]
fn demo_runs_and_reports_a_summary() {
    let out = Command::cargo_bin("crescent")
        .unwrap()
        .args(["demo", "--objects", "3000", "--segment-size", "64MiB", "--replicas", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(v["objects_written"], 3000);
    // 6 segments × 64 MiB hold ~680 two-replica objects of 576 KiB: eviction must have happened.
    assert!(v["evicted"].as_u64().unwrap() > 0);
    // Two replicas on distinct names, one node lost: every resident object keeps a readable replica
    // unless both replicas were on that node, which distinct-name placement allows (two segments per host).
    assert!(v["readable_after_node_loss"].as_u64().unwrap() > 0);
}

#[test]
fn bad_arguments_fail_cleanly() {
    let out = Command::cargo_bin("crescent").unwrap().args(["demo", "--policy", "nope"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown policy"));
}
