//! Administration as an operator meets it: `crescent tenant` and `crescent ssd` against a real
//! `crescent master --multi-tenant` and node, and the same operations on the master's admin HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_testkit::{Proc, ProcCluster};
use std::io::{Read, Write};
use std::path::Path;
use std::process::Output;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_crescent"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn multi_tenant() -> ProcCluster {
    ProcCluster::start(bin(), &["--multi-tenant"], 1, "64MiB")
}

fn crescent(master: &str, args: &[&str], stdin: &[u8]) -> Output {
    crescent_testkit::process::run(bin(), master, args, stdin)
}

/// Runs a command that must succeed; returns its stdout.
fn ok(master: &str, args: &[&str], stdin: &[u8]) -> String {
    let out = crescent(master, args, stdin);
    assert!(out.status.success(), "{args:?} failed: {}", text(&out.stderr));
    text(&out.stdout)
}

/// Runs a command that must fail; returns its stderr.
fn fails(master: &str, args: &[&str]) -> String {
    let out = crescent(master, args, b"");
    assert_eq!(out.status.code(), Some(1), "{args:?} should fail: {}", text(&out.stdout));
    text(&out.stderr)
}

#[test]
fn a_tenant_is_given_a_quota_used_listed_refused_removal_while_full_then_removed() {
    let cluster = multi_tenant();
    let m = &cluster.addr();
    let none = crescent(m, &["tenant", "ls"], b"");
    assert!(none.status.success() && none.stdout.is_empty(), "{}", text(&none.stdout));
    assert!(text(&none.stderr).starts_with("no tenants"), "{}", text(&none.stderr));

    let set = ok(m, &["tenant", "set-quota", "alpha", "10GiB"], b"");
    assert!(set.starts_with("tenant \"alpha\": quota 10.0 GiB requested, "), "{set}");
    assert!(set.contains("effective (quotas are scaled to the mounted memory)"), "{set}");
    ok(m, &["put", "--tenant", "alpha", "k", "-"], b"hello tenant");
    assert_eq!(ok(m, &["get", "--tenant", "alpha", "k"], b""), "hello tenant");

    let table = ok(m, &["tenant", "ls"], b"");
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["TENANT", "QUOTA", "EFFECTIVE", "CHARGED", "OBJECTS", "STATE"]);
    assert!(lines[1].starts_with("alpha   10.0 GiB  "), "{table}");
    assert!(lines[1].ends_with("1        open"), "{table}");
    let listed = json(&ok(m, &["tenant", "ls", "--json"], b""));
    let alpha = &listed["tenants"][0];
    assert_eq!((alpha["tenant"].as_str(), alpha["objects"].as_u64()), (Some("alpha"), Some(1)));
    assert_eq!(alpha["requested_quota"].as_u64(), Some(10 << 30));
    assert!(alpha["charged"].as_u64().unwrap() >= 12, "the object is charged: {alpha}");

    let err = fails(m, &["tenant", "rm", "alpha"]);
    assert!(err.starts_with("TENANT_NOT_EMPTY: tenant \"alpha\" still holds 1 object ("), "{err}");
    assert!(err.ends_with("); `crescent rm --all --tenant alpha` empties it\n"), "{err}");
    assert_eq!(ok(m, &["rm", "--all", "--tenant", "alpha"], b""), "removed 1 object\n");
    assert_eq!(ok(m, &["tenant", "rm", "alpha"], b""), "");
    let refused = crescent(m, &["put", "--tenant", "alpha", "k", "-"], b"again");
    assert_eq!(refused.status.code(), Some(1));
    let err = text(&refused.stderr);
    assert!(err.starts_with("TENANT_NOT_REGISTERED: "), "{err}");
    assert!(err.contains("tenant \"alpha\" is not registered"), "{err}");

    let err = fails(m, &["tenant", "rm", "alpha"]);
    assert_eq!(err, "OBJECT_NOT_FOUND: tenant \"alpha\" has no quota policy: there is nothing to remove\n");
    let err = fails(m, &["tenant", "set-quota", "alpha", "0"]);
    assert!(err.starts_with("INVALID_PARAMS: a quota of 0 bytes admits nothing"), "{err}");
    let out = crescent(m, &["tenant", "set-quota", "alpha", "1XB"], b"");
    assert_eq!(out.status.code(), Some(2), "clap refuses a bad size");
    assert!(text(&out.stderr).contains("invalid size unit"), "{}", text(&out.stderr));
}

/// On a multi-tenant master, a command naming no tenant means `default`, as `--help` says: refused with the
/// tenant named as the user would type it until `default` has a quota, then served like `--tenant default`.
#[test]
fn naming_no_tenant_means_default_on_a_multi_tenant_master() {
    let cluster = multi_tenant();
    let m = &cluster.addr();
    let refused = crescent(m, &["put", "k", "-"], b"early");
    assert_eq!(refused.status.code(), Some(1));
    let err = text(&refused.stderr);
    assert!(err.starts_with("TENANT_NOT_REGISTERED: tenant \"default\" is not registered"), "{err}");
    ok(m, &["tenant", "set-quota", "default", "1GiB"], b"");
    ok(m, &["put", "k", "-"], b"unnamed");
    ok(m, &["put", "--tenant", "default", "k2", "-"], b"named");
    assert_eq!(ok(m, &["get", "--tenant", "default", "k"], b""), "unnamed");
    assert_eq!(ok(m, &["get", "k2"], b""), "named");
    assert_eq!(ok(m, &["ls"], b""), "k\nk2\n");
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("bench.json");
    let args = ["bench", "--phases", "write", "--count", "20", "--value-size", "4KiB", "--json"];
    ok(m, &[&args[..], &[report.to_str().unwrap()]].concat(), b"");
    let phase = json(&std::fs::read_to_string(&report).unwrap());
    assert_eq!((phase["errors"].as_u64(), phase["keys"].as_u64()), (Some(0), Some(20)), "{phase}");
}

#[test]
fn tenant_commands_on_a_single_tenant_master_say_it_needs_multi_tenancy() {
    let up =
        Proc::start(bin(), &["up", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--segment-size", "16MiB"]);
    let m = &up.field("master");
    for args in [&["tenant", "ls"][..], &["tenant", "set-quota", "a", "1MiB"], &["tenant", "rm", "a"]] {
        let err = fails(m, args);
        assert!(err.starts_with("UNAVAILABLE_IN_CURRENT_MODE: the master runs without multi-tenancy"), "{err}");
        assert!(err.contains("--multi-tenant"), "{err}");
    }
    let (status, body) = http(&up.field("admin"), "GET", "/tenants", "");
    assert_eq!(status, 409, "{body}");
    assert_eq!(json(&body)["code"], "UNAVAILABLE_IN_CURRENT_MODE");
}

#[test]
fn ssd_ls_shows_the_registrations_clients_make() {
    let cluster = multi_tenant();
    let m = &cluster.addr();
    let out = crescent(m, &["ssd", "ls"], b"");
    assert!(out.status.success() && out.stdout.is_empty());
    assert_eq!(text(&out.stderr), "no client has registered a local SSD\n");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = cluster.client();
    rt.block_on(async {
        client.local_ssd_register(true).await.unwrap();
        client.local_ssd_report(2 << 30).await.unwrap();
        let err = client.local_ssd_register(true).await.unwrap_err();
        assert_eq!(err.to_string(), format!("client {} already registered a local SSD", client.id()));
    });
    let table = ok(m, &["ssd", "ls"], b"");
    assert_eq!(
        table,
        format!(
            "CLIENT{}  OFFLOADING  CAPACITY  USED\n{}  on          2.0 GiB   0 B\n",
            " ".repeat(client.id().to_string().len() - "CLIENT".len()),
            client.id()
        )
    );
    let listed = json(&ok(m, &["ssd", "ls", "--json"], b""));
    assert_eq!(listed["local_ssd"][0]["client"], client.id().to_string());
    assert_eq!(listed["local_ssd"][0]["total_capacity"], 2u64 << 30);
    let (status, body) = http(&cluster.master.field("admin"), "GET", "/local-ssd", "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["local_ssd"][0]["enable_offloading"], true);
    rt.block_on(async {
        client.local_ssd_set_offloading(false).await.unwrap();
        client.local_ssd_unregister().await.unwrap();
        assert!(client.local_ssd_status(None).await.unwrap().is_empty());
        let err = client.local_ssd_report(1).await.unwrap_err();
        assert_eq!(err.code(), crescent_proto::ErrorCode::SegmentNotFound);
    });
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`); returns the status and the body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let ct = if body.is_empty() { "" } else { "Content-Type: application/json\r\n" };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{ct}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, rest.to_owned())
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"))
}

#[test]
fn the_admin_http_sets_lists_and_removes_tenants_with_status_codes_that_say_why() {
    let cluster = multi_tenant();
    let (m, admin) = (&cluster.addr(), &cluster.master.field("admin"));
    let (status, body) = http(admin, "PUT", "/tenants/beta?quota=1GiB", "");
    assert_eq!(status, 200, "{body}");
    let beta = json(&body);
    assert_eq!((beta["tenant"].as_str(), beta["requested_quota"].as_u64()), (Some("beta"), Some(1 << 30)));
    let (status, body) = http(admin, "PUT", "/tenants/beta", r#"{"quota_bytes": 8388608}"#);
    assert_eq!((status, json(&body)["requested_quota"].as_u64()), (200, Some(8 << 20)), "{body}");
    for (path, body, why) in [
        ("/tenants/beta", "", "no quota"),
        ("/tenants/beta?quota=1XB", "", "invalid size unit"),
        ("/tenants/beta", "{\"quota\": 1}", "quota_bytes"),
        ("/tenants/beta?quota=0", "", "0 bytes admits nothing"),
        ("/tenants/_system?quota=1MiB", "", "reserved prefix"),
    ] {
        let (status, answer) = http(admin, "PUT", path, body);
        assert_eq!(status, 400, "{path} {body}: {answer}");
        let e = json(&answer);
        assert_eq!(e["code"], "INVALID_PARAMS", "{answer}");
        assert!(e["message"].as_str().unwrap().contains(why), "{path}: {answer}");
    }
    ok(m, &["put", "--tenant", "beta", "k", "-"], b"v");
    let (status, body) = http(admin, "GET", "/tenants", "");
    assert_eq!(status, 200);
    let list = json(&body);
    assert_eq!(list["tenants"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(
        (list["tenants"][0]["tenant"].as_str(), list["tenants"][0]["objects"].as_u64()),
        (Some("beta"), Some(1))
    );

    let (status, body) = http(admin, "DELETE", "/tenants/beta", "");
    assert_eq!(status, 409, "{body}");
    let e = json(&body);
    assert_eq!(e["code"], "TENANT_NOT_EMPTY");
    assert!(e["message"].as_str().unwrap().starts_with("tenant \"beta\" still holds 1 object"), "{body}");
    ok(m, &["rm", "--all", "--tenant", "beta"], b"");
    let (status, body) = http(admin, "DELETE", "/tenants/beta", "");
    assert_eq!((status, body.as_str()), (204, ""));
    let (status, body) = http(admin, "DELETE", "/tenants/beta", "");
    assert_eq!(status, 404, "{body}");
    assert_eq!(json(&body)["code"], "OBJECT_NOT_FOUND");
    let (_, body) = http(admin, "GET", "/tenants", "");
    assert_eq!(json(&body)["tenants"], serde_json::json!([]));
    let (status, body) = http(admin, "GET", "/local-ssd", "");
    assert_eq!((status, json(&body)), (200, serde_json::json!({ "local_ssd": [] })));
}

/// `crescent stat` without a key: the tiers of every node as a table and as JSON, the disk tier's objects
/// counted once memory evictions were kept there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stat_without_a_key_shows_each_nodes_memory_and_disk_tier() {
    let master = Proc::start(bin(), &["master", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]);
    let addr = master.field("master");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ssd = dir.path().to_str().unwrap();
    let args = ["node", "--master", &addr, "--listen", "127.0.0.1:0", "--segment-size", "4MiB"];
    let _node = Proc::start(bin(), &[&args[..], &["--ssd-dir", ssd, "--ssd-size", "16MiB"]].concat());
    let table = ok(&addr, &["stat"], b"");
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0][..3], ["NODE", "TIER", "STATUS"], "{table}");
    let memory = rows.iter().find(|r| r[1] == "memory").unwrap_or_else(|| panic!("no memory row: {table}"));
    let disk = rows.iter().find(|r| r[1] == "disk").unwrap_or_else(|| panic!("no disk row: {table}"));
    assert_eq!(memory[0], disk[0], "one node holds both: {table}");
    assert_eq!(memory[3..5], ["4.0", "MiB"], "memory capacity: {table}");
    assert_eq!(disk[3..5], ["16.0", "MiB"], "disk capacity: {table}");

    // Twice what memory holds, in 256 KiB values: the oldest are evicted to the node's disk.
    let client = crescent_client::Client::new(crescent_client::ClientConfig::new(addr.clone()));
    for i in 0..32u64 {
        client.put(&format!("k{i}"), &crescent_testkit::pattern(256 << 10, i)).await.unwrap();
    }
    let disk_json = || {
        let v: serde_json::Value = serde_json::from_str(&ok(&addr, &["stat", "--json"], b"")).unwrap();
        v["disk"][0].clone()
    };
    assert!(
        crescent_testkit::wait_for(std::time::Duration::from_secs(20), || disk_json()["objects"].as_u64() > Some(0)),
        "the disk tier holds evicted objects: {}",
        disk_json()
    );
    let d = disk_json();
    assert_eq!(d["capacity"], 16 << 20, "{d}");
    assert!(d["used"].as_u64().unwrap() >= 256 << 10, "{d}");
    assert!(d["writes"].as_u64().unwrap() >= d["objects"].as_u64().unwrap(), "every object was written: {d}");
    let v: serde_json::Value = serde_json::from_str(&ok(&addr, &["stat", "--json"], b"")).unwrap();
    assert_eq!(v["memory"][0]["capacity"], 4 << 20, "{v}");
    assert_eq!(v["memory"][0]["node"], d["node"], "{v}");
    let table = ok(&addr, &["stat"], b"");
    let disk = table.lines().find(|l| l.split_whitespace().nth(1) == Some("disk")).unwrap().to_owned();
    let objects: u64 = disk.split_whitespace().nth(7).unwrap().parse().unwrap();
    assert!(objects > 0, "the table counts the disk's objects: {table}");
    // /metrics has the tier's series: offloads, capacity, use, and promotions.
    let admin = master.field("admin");
    let m = |name: &str| crescent_testkit::process::metric(&admin, &format!("crescent_master_{name}"));
    assert!(m("disk_offloads_done_total").is_some_and(|n| n >= objects as f64), "{:?}", m("disk_offloads_done_total"));
    assert_eq!(m("disk_capacity_bytes"), Some(f64::from(16u32 << 20)));
    assert!(m("disk_used_bytes").is_some_and(|n| n > 0.0));
    // A read of an object only the disk holds, with memory made free, brings it back to memory.
    let on_disk = (0..32u64)
        .find(|i| {
            let v: serde_json::Value =
                serde_json::from_str(&ok(&addr, &["stat", &format!("k{i}"), "--json"], b"")).unwrap();
            v["replicas"].as_array().is_some_and(|r| r.iter().all(|r| r["tier"] == "disk"))
        })
        .expect("an object only on disk");
    for i in (0..32u64).filter(|&i| i != on_disk) {
        client.remove(&format!("k{i}"), true).await.unwrap();
    }
    assert_eq!(client.get(&format!("k{on_disk}")).await.unwrap(), crescent_testkit::pattern(256 << 10, on_disk));
    let promoted = crescent_testkit::wait_for(std::time::Duration::from_secs(20), || {
        m("disk_promotions_done_total").is_some_and(|n| n >= 1.0)
    });
    assert!(
        promoted,
        "promotions: {:?}, failed {:?}",
        m("disk_promotions_done_total"),
        m("disk_promotions_failed_total")
    );
}
