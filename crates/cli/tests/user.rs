//! The CLI as a user meets it: the README's quick start exactly as written, and the answers a user gets when
//! a command cannot do what it was asked. Each test runs the real binary against a real `crescent up`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_testkit::Proc;
use std::path::Path;
use std::process::{Command, Output};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_crescent"))
}

/// `crescent up` on free loopback ports, with `extra` flags.
fn up(extra: &[&str]) -> Proc {
    let mut args = vec!["up", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    Proc::start(bin(), &args)
}

/// Runs `crescent args…` against the master of `cluster`, with `stdin` as its input.
fn crescent(cluster: &Proc, args: &[&str], stdin: &[u8]) -> Output {
    crescent_testkit::process::run(bin(), &cluster.field("master"), args, stdin)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The commands of the README's "With `up` running" block, in order, comments stripped. The block's first
/// line defines `crescent` as a `cargo run` of this very binary; the test defines it as the binary itself.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    let after = readme.split("With `up` running").nth(1).expect("the README's quick start");
    let block = after.split("```sh").nth(1).unwrap().split("```").next().unwrap();
    block
        .lines()
        .map(|l| l.split(" # ").next().unwrap().trim().to_owned())
        .filter(|l| !l.is_empty() && !l.starts_with("crescent()"))
        .collect()
}

#[test]
fn the_readme_quick_start_works_as_written() {
    let cluster = up(&[]);
    let admin = cluster.field("admin");
    let commands = readme_commands();
    let expected = ["crescent put", "crescent get", "crescent stat", "crescent ls", "crescent rm", "crescent bench"];
    for (line, start) in commands.iter().zip(expected) {
        assert!(line.contains(start), "README quick start changed: {line:?} where `{start} …` was expected");
    }
    assert!(commands.last().unwrap().starts_with("curl"), "{commands:?}");
    let preamble = format!("crescent() {{ {:?} \"$@\"; }}", bin());
    for line in &commands {
        // The README's `up` listens on the default ports; this one on free ports.
        let line = line.replace("127.0.0.1:9003", &admin);
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("{preamble}\nset -o pipefail\n{line}"))
            .env("CRESCENT_MASTER", cluster.field("master"))
            .output()
            .unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "`{line}` failed: {stderr}");
        let word = line.split_whitespace().nth(if line.starts_with("echo") { 3 } else { 1 }).unwrap_or("");
        match word {
            "get" => assert_eq!(stdout, "hello\n", "{line}"),
            "stat" => {
                assert!(stdout.contains("key       \"greeting\"") && stdout.contains("size      6 B"), "{stdout}");
                assert!(stdout.contains("lease     none"), "stat takes no lease: {stdout}");
            }
            "ls" => assert_eq!(stdout, "greeting\n", "{line}"),
            "rm" => assert!(stderr.is_empty(), "rm right after get and stat: {stderr}"),
            "bench" => {
                for phase in ["write", "read", "dedup"] {
                    assert!(stdout.lines().any(|l| l.starts_with(phase)), "no {phase} row: {stdout}");
                }
                assert!(!stdout.contains("errors:"), "the bench met errors: {stdout}");
                assert!(stderr.contains("removed the benchmark's"), "{stderr}");
            }
            "-s" => assert!(stdout.contains("crescent_master_requests_total{op=\"put_start\"}"), "{stdout}"),
            _ => assert!(stdout.is_empty(), "`{line}` printed {stdout:?}"),
        }
    }
    // The bench cleaned up after itself: nothing is left.
    let out = crescent(&cluster, &["ls"], b"");
    assert_eq!(text(&out.stdout), "");
}

#[test]
fn put_replaces_a_value_and_if_absent_keeps_it_and_says_so() {
    let cluster = up(&["--segment-size", "16MiB"]);
    assert!(crescent(&cluster, &["put", "k", "-"], b"one").status.success());
    assert!(crescent(&cluster, &["put", "k", "-"], b"two").status.success());
    assert_eq!(crescent(&cluster, &["get", "k"], b"").stdout, b"two", "put replaces");
    let kept = crescent(&cluster, &["put", "--if-absent", "k", "-"], b"three");
    assert!(kept.status.success());
    assert_eq!(text(&kept.stderr), "key \"k\" already exists; its value was kept (--if-absent)\n");
    assert_eq!(crescent(&cluster, &["get", "k"], b"").stdout, b"two");
    let fresh = crescent(&cluster, &["put", "--if-absent", "new", "-"], b"x");
    assert!(fresh.status.success() && fresh.stderr.is_empty(), "{}", text(&fresh.stderr));
}

#[test]
fn fewer_replicas_than_asked_and_an_ignored_tenant_are_said_out_loud() {
    let cluster = up(&["--segment-size", "16MiB"]);
    let out = crescent(&cluster, &["put", "--replicas", "2", "k", "-"], b"v");
    assert!(out.status.success());
    assert_eq!(text(&out.stderr), "stored 1 replica of the 2 asked: only 1 node had room\n");
    let out = crescent(&cluster, &["get", "--tenant", "bob", "k"], b"");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.starts_with("UNAVAILABLE_IN_CURRENT_MODE: "), "{err}");
    assert!(err.contains("runs without multi-tenancy, so --tenant \"bob\" would be ignored"), "{err}");
    // The default tenant, named, is fine.
    assert_eq!(crescent(&cluster, &["get", "k", "--tenant", "default"], b"").stdout, b"v");
}

#[test]
fn rm_of_a_leased_object_says_for_how_long_and_how_to_force_it() {
    let cluster = up(&["--segment-size", "16MiB"]);
    assert!(crescent(&cluster, &["put", "held", "-"], b"v").status.success());
    // A reader that has not released its lease: an existence check leases the object (as a read would).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = crescent_client::Client::new(crescent_client::ClientConfig::new(cluster.field("master")));
    assert!(rt.block_on(client.is_exist("held")).unwrap());
    let out = crescent(&cluster, &["rm", "held"], b"");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.starts_with("OBJECT_HAS_LEASE: key \"held\" is leased for another "), "{err}");
    assert!(err.contains(" s by 1 reader that has not released it; `crescent rm --force held` removes it"), "{err}");
    assert!(crescent(&cluster, &["rm", "--force", "held"], b"").status.success());
    let gone = crescent(&cluster, &["get", "held"], b"");
    assert!(text(&gone.stderr).starts_with("OBJECT_NOT_FOUND"), "{}", text(&gone.stderr));
}

#[test]
fn rm_all_says_what_it_removed_and_what_it_skipped_and_why() {
    let cluster = up(&["--segment-size", "16MiB", "--prefault", "false"]);
    for k in ["a", "b", "held"] {
        assert!(crescent(&cluster, &["put", k, "-"], b"v").status.success());
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = crescent_client::Client::new(crescent_client::ClientConfig::new(cluster.field("master")));
    assert!(rt.block_on(client.is_exist("held")).unwrap(), "a reader holds a lease on it");
    let out = crescent(&cluster, &["rm", "--all"], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "removed 2 objects; skipped 1 leased by readers (--force removes them)\n");
    let out = crescent(&cluster, &["rm", "--all", "--force"], b"");
    assert_eq!(text(&out.stdout), "removed 1 object\n");
    assert_eq!(text(&crescent(&cluster, &["ls"], b"").stdout), "");
}

#[test]
fn stat_reads_like_a_table_or_json_and_ls_says_when_it_was_cut_short() {
    let cluster = up(&["--segment-size", "16MiB"]);
    let value = vec![7u8; 1536];
    assert!(crescent(&cluster, &["put", "k", "-"], &value).status.success());
    let table = text(&crescent(&cluster, &["stat", "k"], b"").stdout);
    let crc = crc32c::crc32c(&value);
    assert!(table.contains("size      1.5 KiB\n"), "{table}");
    assert!(table.contains(&format!("checksum  {crc:#010x} (crc32c)\n")), "{table}");
    assert!(table.contains("replicas  1\n  #") && table.contains(": 1.5 KiB, memory on 127.0.0.1:"), "{table}");
    let json: serde_json::Value =
        serde_json::from_slice(&crescent(&cluster, &["stat", "--json", "k"], b"").stdout).unwrap();
    assert_eq!((json["size"].as_u64(), json["checksum"].as_u64()), (Some(1536), Some(u64::from(crc))));
    assert_eq!(json["lease_remaining_ms"], 0);
    for i in 0..3 {
        assert!(crescent(&cluster, &["put", &format!("p{i}"), "-"], b"v").status.success());
    }
    let cut = crescent(&cluster, &["ls", "--prefix", "p", "--limit", "2"], b"");
    assert_eq!(text(&cut.stdout).lines().count(), 2);
    assert_eq!(text(&cut.stderr), "(the first 2 keys; more match: raise --limit)\n");
    let all = crescent(&cluster, &["ls", "--prefix", "p", "--json"], b"");
    let json: serde_json::Value = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!((json["keys"].as_array().unwrap().len(), json["truncated"].as_bool()), (3, Some(false)));
}

#[test]
fn a_missing_config_file_and_a_misspelt_key_are_told_apart() {
    let out = Command::new(bin()).args(["--config", "/nonexistent/crescent.toml", "ls"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).starts_with("FILE_NOT_FOUND: reading /nonexistent/crescent.toml"),
        "{}",
        text(&out.stderr)
    );
    let path = std::env::temp_dir().join(format!("crescent-user-test-{}.toml", std::process::id()));
    std::fs::write(&path, "[node]\nsegment_sise = \"1GiB\"\n").unwrap();
    let out = Command::new(bin()).args(["--config", path.to_str().unwrap(), "ls"]).output().unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.starts_with("INVALID_PARAMS: ") && err.contains("unknown field `segment_sise`"), "{err}");
}

#[test]
fn every_error_names_its_subject_and_its_limit_or_cause() {
    let cluster = up(&["--segment-size", "16MiB"]);
    let err = |args: &[&str], stdin: &[u8]| {
        let out = crescent(&cluster, args, stdin);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        text(&out.stderr)
    };
    assert_eq!(err(&["get", "nothere"], b""), "OBJECT_NOT_FOUND: key \"nothere\" not found\n");
    assert_eq!(err(&["rm", "nothere"], b""), "OBJECT_NOT_FOUND: key \"nothere\" not found\n");
    let long = "x".repeat(5000);
    assert_eq!(err(&["put", &long, "-"], b"v"), "INVALID_KEY: object key is 5000 bytes, the limit is 4096\n");
    // (The master says the same to a raw peer: cluster.rs.)
    let out = Command::new(bin()).args(["get", "k"]).env("CRESCENT_MASTER", "127.0.0.1:1").output().unwrap();
    assert_eq!(text(&out.stderr), "RPC_FAIL: cannot reach the master at 127.0.0.1:1: connection refused\n");
}

#[test]
fn a_put_that_cannot_fit_says_why_and_evicts_nothing_and_one_that_fits_stays() {
    let cluster = up(&["--segment-size", "64MiB"]);
    for i in 0..20 {
        assert!(crescent(&cluster, &["put", &format!("k{i}"), "-"], &vec![i as u8; 1 << 20]).status.success());
    }
    let big = vec![7u8; 60 << 20];
    let out = crescent(&cluster, &["put", "big", "-"], &big);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "NO_AVAILABLE_HANDLE: no room for key \"big\": an object of 60.0 MiB cannot stay under the eviction \
         watermark: 90% of the cluster's 64.0 MiB is 57.6 MiB\n"
    );
    let keys = crescent(&cluster, &["ls"], b"");
    assert_eq!(text(&keys.stdout).lines().count(), 20, "nothing was evicted for it");
    // 50 MiB fits once older objects go; it is readable right after, byte for byte.
    let fits = vec![9u8; 50 << 20];
    assert!(crescent(&cluster, &["put", "big", "-"], &fits).status.success());
    assert!(crescent(&cluster, &["get", "big"], b"").stdout == fits);
}

#[test]
fn a_group_is_put_together_and_removed_whole() {
    let cluster = up(&["--segment-size", "16MiB", "--prefault", "false"]);
    for k in ["a", "b"] {
        assert!(crescent(&cluster, &["put", "--group", "G", k, "-"], b"member").status.success());
    }
    assert!(crescent(&cluster, &["put", "c", "-"], b"solo").status.success());
    let out = crescent(&cluster, &["rm", "--group", "G"], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "removed group \"G\": 2 members\n");
    assert_eq!(text(&crescent(&cluster, &["get", "a"], b"").stderr), "OBJECT_NOT_FOUND: key \"a\" not found\n");
    assert_eq!(crescent(&cluster, &["get", "c"], b"").stdout, b"solo");
    let again = crescent(&cluster, &["rm", "--group", "G"], b"");
    assert_eq!(text(&again.stderr), "OBJECT_NOT_FOUND: no group \"G\"\n");
}
