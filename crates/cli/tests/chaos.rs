//! The fault campaign (`scripts/chaos.sh`), run briefly: a real etcd, three master candidates, three storage
//! nodes and a recorded workload under random faults (kill -9 and SIGSTOP of the leader, a standby and a node,
//! etcd stopped, restarted and filled to NOSPACE), then the history checker. The run must find no violation:
//! no torn or foreign value, no value back after an acknowledged removal, no value older than an acknowledged
//! overwrite, no server panic. A missing etcd fails the test (the script exits 2), never skips it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

/// Seconds of load and faults (the campaign's setup, healing and final sweep come on top).
const SECONDS: &str = "25";
/// The fault schedule's seed (the schedule's timing still varies with the machine's load).
const SEED: &str = "34";

/// The number after `label` on the line of `text` that starts with it (`history: 123 operations` → 123).
fn count(text: &str, label: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{text}"))
}

/// Runs the campaign with `env` on top of the common settings; returns its stdout, failing on a failed run.
fn campaign(seed: &str, env: &[(&str, &str)]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/chaos.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args([SECONDS, seed])
        .env("CRESCENT_BIN", env!("CARGO_BIN_EXE_crescent"))
        .env("CHAOS_BIN", env!("CARGO_BIN_EXE_crescent-chaos"))
        // A shorter gap than the default, so a short run still sees several kinds of fault.
        .env("CHAOS_GAP", "2")
        .env_remove("CHAOS_DIR")
        .env_remove("CHAOS_FAULTS")
        .env_remove("CHAOS_AUTH")
        .env_remove("CRESCENT_SECRET_FILE")
        .env_remove("CRESCENT_SECRET")
        .envs(env.iter().copied())
        .output()
        .expect("run scripts/chaos.sh");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the campaign failed ({}):\n{stdout}\n--- stderr ---\n{stderr}", out.status);
    assert_eq!(count(&stdout, "violations: "), 0, "{stdout}");
    assert!(count(&stdout, "history: ") > 500, "too few operations to mean anything:\n{stdout}");
    assert!(count(&stdout, "faults injected: ") >= 3, "too few faults:\n{stdout}");
    assert!(count(&stdout, "  gets with a value checked: ") > 100, "{stdout}");
    assert!(stdout.contains("chaos: passed"), "{stdout}");
    stdout.into_owned()
}

#[test]
fn a_short_fault_campaign_finds_no_violation() {
    campaign(SEED, &[]);
}

/// The production set-up: a cluster secret, a credential per node, every transfer on sealed grants that a
/// node refuses once it has honoured a newer master term's (a stalled leader's late writes are fenced there).
/// Larger segments: freed space waits out the write grants' window before reuse.
#[test]
fn a_short_fault_campaign_with_authentication_finds_no_violation() {
    let stdout = campaign("43", &[("CHAOS_AUTH", "1"), ("CHAOS_SEGMENT", "64MiB")]);
    assert!(!stdout.contains("PERMISSION_DENIED"), "the workload's credential was refused:\n{stdout}");
}
