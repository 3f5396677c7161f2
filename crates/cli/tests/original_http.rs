//! The original Mooncake master's admin HTTP API on Crescent's admin port (`server::admin_compat`), asserted
//! against what the original answers. A real `crescent master` and `crescent node`, keys put with the CLI and
//! the client, requests over plain HTTP/1.0 (no chunked bodies to undo).
//!
//! The oracle: `mooncake_master` 0.3.13.post1 (`/work/mc-venv`, `--rpc_port=50151 --metrics_host=127.0.0.1
//! --metrics_port=9153`), a `MooncakeDistributedStore` set up with `setup("127.0.0.1", "P2PHANDSHAKE",
//! 64 << 20, 16 << 20, "tcp", "", "127.0.0.1:50151")`, curl on the metrics port (2026-12-05). `Date` and
//! `Server: cinatra` headers left out; `(status) | Content-Type`, then the body:
//!
//! --- no segment mounted, no key
//! GET /get_all_segments
//!   200 OK | text/plain; version=0.0.4
//!   (empty body)
//! GET /get_segments_detail
//!   200 OK | application/json; charset=utf-8
//!   {"total_segments":0,"segments":[]}
//! GET /query_key?key=k1
//!   404 Not Found | application/json; charset=utf-8
//!   {"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}
//! GET /query_key?key=
//!   404 Not Found | application/json; charset=utf-8
//!   {"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}
//! GET /query_key
//!   404 Not Found | application/json; charset=utf-8
//!   {"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}
//! GET /batch_query_keys?keys=k1
//!   200 OK | application/json; charset=utf-8
//!   {"success":true,"data":{"k1":{"ok":false,"error":"OBJECT_NOT_FOUND","values":null,"disk_values":null,"local_disk_values":null,"nof_values":null}}}
//! GET /batch_query_keys
//!   400 Bad Request | application/json; charset=utf-8
//!   {"success":false,"error":"No keys provided. Use ?keys=key1,key2,..."}
//! GET /batch_query_keys?keys=
//!   400 Bad Request | application/json; charset=utf-8
//!   {"success":false,"error":"No keys provided. Use ?keys=key1,key2,..."}
//! GET /get_all_keys
//!   200 OK | text/plain; version=0.0.4
//!   (empty body)
//! --- one store (64 MiB segment) holding k1 (5 B), k2 (4 KiB), "a,b", "sp ace&x=y"
//! GET /get_all_segments
//!   200 OK | text/plain; version=0.0.4
//!   127.0.0.1:13491
//! GET /get_segments_detail
//!   200 OK | application/json; charset=utf-8
//!   {"total_segments":1,"segments":[{"segment_name":"127.0.0.1:13491","segment_id":"5281565883643836599-2753241528305726093","client_id":"4127068981114620190-14965762827853209757","base_address":"0x7f2de2000000","size_bytes":67108864,"size_human":"0.0625 GiB","te_endpoint":"127.0.0.1:15816","protocol":"tcp","status":"OK","allocator_used_bytes":4111,"allocator_capacity_bytes":67108864,"allocator_usage_percent":6.1258673667907715E-3}]}
//! GET /query_key?key=k1
//!   200 OK | application/json; charset=utf-8
//!   {"success":true,"data":[{"size_":5,"buffer_address_":139835041906688,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}]}
//! GET /query_key?key=k2
//!   200 OK | application/json; charset=utf-8
//!   {"success":true,"data":[{"size_":4096,"buffer_address_":139835041906693,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}]}
//! GET /query_key?key=missing
//!   404 Not Found | application/json; charset=utf-8
//!   {"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}
//! GET /query_key?key=
//!   404 Not Found | application/json; charset=utf-8
//!   {"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}
//! GET /query_key
//!   404 Not Found | application/json; charset=utf-8
//!   {"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}
//! GET /query_key?key=sp%20ace%26x%3Dy
//!   404 Not Found | application/json; charset=utf-8
//!   {"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}
//! GET /query_key?key=a,b
//!   200 OK | application/json; charset=utf-8
//!   {"success":true,"data":[{"size_":5,"buffer_address_":139835041910789,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}]}
//! GET /batch_query_keys?keys=k1,missing
//!   200 OK | application/json; charset=utf-8
//!   {"success":true,"data":{"k1":{"ok":true,"error":null,"values":[{"size_":5,"buffer_address_":139835041906688,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}],"disk_values":null,"local_disk_values":null,"nof_values":null},"missing":{"ok":false,"error":"OBJECT_NOT_FOUND","values":null,"disk_values":null,"local_disk_values":null,"nof_values":null}}}
//! GET /batch_query_keys?keys=k1,k1
//!   200 OK | application/json; charset=utf-8
//!   {"success":true,"data":{"k1":{"ok":true,"error":null,"values":[{"size_":5,"buffer_address_":139835041906688,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}],"disk_values":null,"local_disk_values":null,"nof_values":null}}}
//! GET /batch_query_keys?keys=k1,,k2
//!   200 OK | application/json; charset=utf-8
//!   {"success":true,"data":{"":{"ok":false,"error":"OBJECT_NOT_FOUND","values":null,"disk_values":null,"local_disk_values":null,"nof_values":null},"k1":{"ok":true,"error":null,"values":[{"size_":5,"buffer_address_":139835041906688,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}],"disk_values":null,"local_disk_values":null,"nof_values":null},"k2":{"ok":true,"error":null,"values":[{"size_":4096,"buffer_address_":139835041906693,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}],"disk_values":null,"local_disk_values":null,"nof_values":null}}}
//! GET /batch_query_keys?keys=a%2Cb
//!   200 OK | application/json; charset=utf-8
//!   {"success":true,"data":{"a":{"ok":false,"error":"OBJECT_NOT_FOUND","values":null,"disk_values":null,"local_disk_values":null,"nof_values":null},"b":{"ok":false,"error":"OBJECT_NOT_FOUND","values":null,"disk_values":null,"local_disk_values":null,"nof_values":null}}}
//! GET /batch_query_keys?keys=sp%20ace%26x%3Dy
//!   200 OK | application/json; charset=utf-8
//!   {"success":true,"data":{"sp ace&x=y":{"ok":true,"error":null,"values":[{"size_":5,"buffer_address_":139835041910794,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}],"disk_values":null,"local_disk_values":null,"nof_values":null}}}
//! GET /batch_query_keys?keys=sp+ace%26x%3Dy
//!   200 OK | application/json; charset=utf-8
//!   {"success":true,"data":{"sp ace&x=y":{"ok":true,"error":null,"values":[{"size_":5,"buffer_address_":139835041910794,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}],"disk_values":null,"local_disk_values":null,"nof_values":null}}}
//! GET /get_all_keys
//!   200 OK | text/plain; version=0.0.4
//!   k2
//!   a,b
//!   k1
//!   sp ace&x=y
//! GET /get_all_keys?limit=1
//!   200 OK | text/plain; version=0.0.4
//!   k2
//!   a,b
//!   k1
//!   sp ace&x=y
//! GET /nonexistent
//!   404 Not Found | -
//!   404 Not Found
//! --- a second store (1 GiB segment, empty) mounted
//! GET /get_all_segments
//!   200 OK | text/plain; version=0.0.4
//!   127.0.0.1:13310
//!   127.0.0.1:13491
//! GET /get_segments_detail
//!   200 OK | application/json; charset=utf-8
//!   {"total_segments":2,"segments":[{"segment_name":"127.0.0.1:13310","segment_id":"8812819667159537557-5107136429770913958","client_id":"17600399811437566866-16075535316774265006","base_address":"0x7f1f47000000","size_bytes":1073741824,"size_human":"1 GiB","te_endpoint":"127.0.0.1:15041","protocol":"tcp","status":"OK","allocator_used_bytes":0,"allocator_capacity_bytes":1073741824,"allocator_usage_percent":0E0},{"segment_name":"127.0.0.1:13491","segment_id":"5281565883643836599-2753241528305726093","client_id":"4127068981114620190-14965762827853209757","base_address":"0x7f2de2000000","size_bytes":67108864,"size_human":"0.0625 GiB","te_endpoint":"127.0.0.1:15816","protocol":"tcp","status":"OK","allocator_used_bytes":4111,"allocator_capacity_bytes":67108864,"allocator_usage_percent":6.1258673667907715E-3}]}
//! GET /query_key?key=<5000 x 'k'>
//!   404 Not Found | application/json; charset=utf-8
//!   {"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}
//! GET /query_key?key=k1&tenant=other
//!   200 OK | application/json; charset=utf-8
//!   {"success":true,"data":[{"size_":5,"buffer_address_":139835041906688,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}]}
//! GET /query_key?key=k1&key=k2
//!   200 OK | application/json; charset=utf-8
//!   {"success":true,"data":[{"size_":5,"buffer_address_":139835041906688,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}]}
//! --- other methods and paths
//! POST /get_all_keys, HEAD /get_all_keys, GET /nonexistent
//!   404 Not Found | (none)
//!   404 Not Found
//!
//! Crescent answers the same shapes (the tests below compare each body's shape, field by field and type by
//! type, with the recorded one, and the error bodies byte for byte), with these documented differences:
//! `/get_all_keys` is one page in byte order (`limit`, `cursor`, `x-next-cursor`; the original's order is its
//! hash map's); `/query_key` refuses a missing, empty or over-long key with 400 (the original looked the empty
//! key up: 404) and percent-decodes its key (the original did not, so `sp%20ace%26x%3Dy` was not found there);
//! a float is written `0.006125867366790771`, not `6.1258673667907715E-3` (the same JSON number); an unknown
//! method on a known path is 405, not 404.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_testkit::{Proc, ProcCluster};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_crescent"))
}

const TEXT: &str = "text/plain; version=0.0.4";
const JSON: &str = "application/json; charset=utf-8";

/// Recorded on the original (see the header).
const ORIGINAL_DETAIL: &str = r#"{"total_segments":1,"segments":[{"segment_name":"127.0.0.1:13491","segment_id":"5281565883643836599-2753241528305726093","client_id":"4127068981114620190-14965762827853209757","base_address":"0x7f2de2000000","size_bytes":67108864,"size_human":"0.0625 GiB","te_endpoint":"127.0.0.1:15816","protocol":"tcp","status":"OK","allocator_used_bytes":4111,"allocator_capacity_bytes":67108864,"allocator_usage_percent":6.1258673667907715E-3}]}"#;
const ORIGINAL_NO_SEGMENTS: &str = r#"{"total_segments":0,"segments":[]}"#;
const ORIGINAL_QUERY: &str = r#"{"success":true,"data":[{"size_":5,"buffer_address_":139835041906688,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}]}"#;
const ORIGINAL_NOT_FOUND: &str = r#"{"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}"#;
const ORIGINAL_BATCH: &str = r#"{"success":true,"data":{"k1":{"ok":true,"error":null,"values":[{"size_":5,"buffer_address_":139835041906688,"protocol_":"tcp","transport_endpoint_":"127.0.0.1:15816"}],"disk_values":null,"local_disk_values":null,"nof_values":null},"missing":{"ok":false,"error":"OBJECT_NOT_FOUND","values":null,"disk_values":null,"local_disk_values":null,"nof_values":null}}}"#;
const ORIGINAL_BATCH_MISS: &str = r#"{"success":true,"data":{"k1":{"ok":false,"error":"OBJECT_NOT_FOUND","values":null,"disk_values":null,"local_disk_values":null,"nof_values":null}}}"#;
const ORIGINAL_NO_KEYS: &str = r#"{"success":false,"error":"No keys provided. Use ?keys=key1,key2,..."}"#;

/// An answer: status, headers (names lower-cased), body.
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// Asserts the status and content type, then returns the body.
    fn expect(&self, status: u16, content_type: &str) -> &str {
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(self.header("content-type"), Some(content_type), "{}", self.body);
        &self.body
    }
}

/// A GET over HTTP/1.0 (so the body comes whole, never chunked).
fn get(addr: &str, path: &str) -> Answer {
    request(addr, "GET", path)
}

fn request(addr: &str, method: &str, path: &str) -> Answer {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    write!(s, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer { status, headers, body: body.to_owned() }
}

/// A JSON value's shape: objects keep their field names, arrays the shape of their first element, scalars
/// become their type (`int` and `float` told apart, as the original's writer tells them apart).
fn shape(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value as V;
    match v {
        V::Null => "null".into(),
        V::Bool(_) => "bool".into(),
        V::Number(n) if n.is_f64() => "float".into(),
        V::Number(_) => "int".into(),
        V::String(_) => "string".into(),
        V::Array(a) => V::Array(a.first().map(shape).into_iter().collect()),
        V::Object(o) => V::Object(o.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
    }
}

fn parse(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap()
}

/// Field names of a JSON object in the order the body writes them (serde_json's map sorts them).
fn field_order(body: &str, fields: &[&str]) -> Vec<usize> {
    fields.iter().map(|f| body.find(&format!("\"{f}\":")).unwrap_or_else(|| panic!("no {f} in {body}"))).collect()
}

fn put_cli(master: &str, key: &str, value: &[u8]) {
    let out = crescent_testkit::process::run(bin(), master, &["put", key, "-"], value);
    assert!(out.status.success(), "put {key}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn with_no_segment_the_answers_are_the_originals_empty_ones() {
    let master = Proc::start(bin(), &["master", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]);
    let admin = master.field("admin");
    assert_eq!(get(&admin, "/get_all_segments").expect(200, TEXT), "");
    assert_eq!(get(&admin, "/get_segments_detail").expect(200, JSON), ORIGINAL_NO_SEGMENTS);
    assert_eq!(get(&admin, "/get_all_keys").expect(200, TEXT), "");
    assert_eq!(get(&admin, "/query_key?key=k1").expect(404, JSON), ORIGINAL_NOT_FOUND);
    assert_eq!(get(&admin, "/batch_query_keys?keys=k1").expect(200, JSON), ORIGINAL_BATCH_MISS);
    assert_eq!(get(&admin, "/batch_query_keys").expect(400, JSON), ORIGINAL_NO_KEYS);
    assert_eq!(get(&admin, "/batch_query_keys?keys=").expect(400, JSON), ORIGINAL_NO_KEYS);
}

#[test]
fn segments_and_keys_answer_in_the_originals_shapes() {
    let cluster = ProcCluster::start(bin(), &[], 1, "64MiB");
    let (m, admin) = (cluster.addr(), cluster.master.field("admin"));
    let endpoint = cluster.nodes[0].field("node");
    put_cli(&m, "k1", b"hello");
    put_cli(&m, "k2", &[b'x'; 4096]);
    put_cli(&m, "a,b", b"comma");
    put_cli(&m, "sp ace&x=y", b"weird");

    // Segments: the node's one segment, named by its endpoint as the original names a store's.
    assert_eq!(get(&admin, "/get_all_segments").expect(200, TEXT), format!("{endpoint}\n"));
    let detail = get(&admin, "/get_segments_detail");
    let body = detail.expect(200, JSON);
    let v = detail.json();
    assert_eq!(shape(&v), shape(&parse(ORIGINAL_DETAIL)), "{body}");
    let fields = [
        "segment_name",
        "segment_id",
        "client_id",
        "base_address",
        "size_bytes",
        "size_human",
        "te_endpoint",
        "protocol",
        "status",
        "allocator_used_bytes",
        "allocator_capacity_bytes",
        "allocator_usage_percent",
    ];
    let at = field_order(body, &fields);
    assert!(at.windows(2).all(|w| w[0] < w[1]), "fields in the original's order: {body}");
    assert!(body.starts_with(r#"{"total_segments":1,"segments":[{"segment_name":"#), "{body}");
    let seg = &v["segments"][0];
    assert_eq!(seg["segment_name"], endpoint.as_str());
    assert_eq!(seg["te_endpoint"], endpoint.as_str());
    assert_eq!((seg["size_bytes"].as_u64(), seg["size_human"].as_str()), (Some(64 << 20), Some("0.0625 GiB")));
    assert_eq!((seg["protocol"].as_str(), seg["status"].as_str()), (Some("tcp"), Some("OK")));
    for id in ["segment_id", "client_id"] {
        let text = seg[id].as_str().unwrap();
        let halves: Vec<&str> = text.split('-').collect();
        assert!(halves.len() == 2 && halves.iter().all(|h| h.parse::<u64>().is_ok()), "{id} {text}: HIGH-LOW");
    }
    let base = u64::from_str_radix(seg["base_address"].as_str().unwrap().strip_prefix("0x").unwrap(), 16).unwrap();
    let (used, cap) =
        (seg["allocator_used_bytes"].as_u64().unwrap(), seg["allocator_capacity_bytes"].as_u64().unwrap());
    assert_eq!(cap, 64 << 20);
    assert!(used >= 5 + 4096 + 5 + 5, "the four values are allocated: {used}");
    let percent = seg["allocator_usage_percent"].as_f64().unwrap();
    assert!((percent - used as f64 / cap as f64 * 100.0).abs() < 1e-9, "{percent}");

    // One key: its memory replica, at an address inside the segment.
    let q = get(&admin, "/query_key?key=k1");
    assert_eq!(shape(&parse(q.expect(200, JSON))), shape(&parse(ORIGINAL_QUERY)), "{}", q.body);
    let d = &q.json()["data"][0];
    assert_eq!((d["size_"].as_u64(), d["protocol_"].as_str()), (Some(5), Some("tcp")));
    assert_eq!(d["transport_endpoint_"], endpoint.as_str());
    let addr = d["buffer_address_"].as_u64().unwrap();
    assert!((base..base + cap).contains(&addr), "{addr:#x} in the segment at {base:#x}");
    assert!(q.body.starts_with(r#"{"success":true,"data":[{"size_":5,"buffer_address_":"#), "{}", q.body);
    assert_eq!(get(&admin, "/query_key?key=k2").json()["data"][0]["size_"], 4096);
    assert_eq!(get(&admin, "/query_key?key=a,b").json()["data"][0]["size_"], 5);
    // Decoded here (the original did not decode this parameter, and answered 404), `+` as a space.
    let odd = get(&admin, "/query_key?key=sp%20ace%26x%3Dy");
    assert_eq!(odd.expect(200, JSON), get(&admin, "/query_key?key=sp+ace%26x%3Dy").body);
    assert_eq!(odd.json()["data"][0]["size_"], 5);
    assert_eq!(get(&admin, "/query_key?key=missing").expect(404, JSON), ORIGINAL_NOT_FOUND);

    // Bad input: 400 with the original's error body and a message saying what is wrong.
    for (path, code, why) in [
        ("/query_key", -600, "no key given"),
        ("/query_key?key=", -600, "object key is empty"),
        (&format!("/query_key?key={}", "k".repeat(5000)), -400, "the limit is 4096"),
    ] {
        let a = get(&admin, path);
        let e = parse(a.expect(400, JSON));
        assert_eq!((e["success"].as_bool(), e["error_code"].as_i64()), (Some(false), Some(code)), "{path}: {}", a.body);
        assert!(e["error_message"].as_str().unwrap().contains(why), "{path}: {}", a.body);
        assert_eq!(shape(&e), shape(&parse(ORIGINAL_NOT_FOUND)), "{path}");
    }
    // A single-tenant master reads the default tenant whatever is named (as its reads do).
    assert_eq!(get(&admin, "/query_key?key=k1&tenant=other").expect(200, JSON), q.body);

    // Batches: one entry per distinct key, in key order, the misses as the original writes them.
    let b = get(&admin, "/batch_query_keys?keys=k1,missing");
    let body = b.expect(200, JSON);
    assert_eq!(shape(&parse(body)), shape(&parse(ORIGINAL_BATCH)), "{body}");
    let k1 = &q.json()["data"];
    assert_eq!(b.json()["data"]["k1"]["values"], *k1, "the same replica as /query_key");
    let missing = r#""missing":{"ok":false,"error":"OBJECT_NOT_FOUND","values":null,"disk_values":null,"local_disk_values":null,"nof_values":null}"#;
    assert!(body.ends_with(&format!("{missing}}}}}")), "{body}");
    assert!(
        body.starts_with(r#"{"success":true,"data":{"k1":{"ok":true,"error":null,"values":[{"size_":5,"#),
        "{body}"
    );
    let twice = get(&admin, "/batch_query_keys?keys=k1,k1").json();
    assert_eq!(twice["data"].as_object().unwrap().len(), 1);
    let gap = get(&admin, "/batch_query_keys?keys=k1,,k2").json();
    let keys: Vec<&String> = gap["data"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["", "k1", "k2"]);
    assert_eq!(gap["data"][""]["error"], "OBJECT_NOT_FOUND");
    assert_eq!(gap["data"]["k2"]["values"][0]["size_"], 4096);
    // Decoded, then split at commas (so "a,b" cannot be asked for in a batch, as in the original).
    let split = get(&admin, "/batch_query_keys?keys=a%2Cb").json();
    assert_eq!((split["data"]["a"]["ok"].as_bool(), split["data"]["b"]["ok"].as_bool()), (Some(false), Some(false)));
    let spaced = get(&admin, "/batch_query_keys?keys=sp+ace%26x%3Dy").json();
    assert_eq!(spaced["data"]["sp ace&x=y"]["ok"], true);
    assert_eq!(get(&admin, "/batch_query_keys").expect(400, JSON), ORIGINAL_NO_KEYS);
    let long = get(&admin, &format!("/batch_query_keys?keys=k1,{}", "k".repeat(5000)));
    assert!(long.expect(400, JSON).contains("the limit is 4096"), "{}", long.body);

    // All keys, a line each (byte order here; the original's was its hash map's), no cursor: nothing follows.
    let all = get(&admin, "/get_all_keys");
    assert_eq!(all.expect(200, TEXT), "a,b\nk1\nk2\nsp ace&x=y\n");
    assert_eq!(all.header("x-next-cursor"), None);
    assert_eq!(request(&admin, "POST", "/get_all_keys").status, 405);
}

/// Walks `/get_all_keys` with `limit`, following `x-next-cursor`; returns every key and the number of pages.
fn walk(admin: &str, limit: usize) -> (Vec<String>, usize) {
    let (mut keys, mut pages, mut cursor) = (Vec::new(), 0, None::<String>);
    loop {
        let path = match &cursor {
            None => format!("/get_all_keys?limit={limit}"),
            Some(c) => format!("/get_all_keys?limit={limit}&cursor={c}"),
        };
        let a = get(admin, &path);
        let body = a.expect(200, TEXT);
        pages += 1;
        let page: Vec<String> = body.lines().map(str::to_owned).collect();
        assert!(page.len() <= limit, "{path}: {} keys", page.len());
        keys.extend(page);
        match a.header("x-next-cursor") {
            Some(next) => cursor = Some(next.to_owned()),
            None => return (keys, pages),
        }
        assert!(pages < 1000, "the walk ends");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_all_keys_pages_walk_every_key_once_and_bad_limits_are_refused() {
    let cluster = ProcCluster::start(bin(), &[], 1, "64MiB");
    let admin = cluster.master.field("admin");
    let client = cluster.client();
    // Keys a header cannot carry as they are, to prove the cursor's encoding.
    let mut want: Vec<String> = (0..37).map(|i| format!("key {i:02}&é=?%,/#")).collect();
    want.extend(["a".to_owned(), "z+plus".to_owned(), "tab\there".to_owned()]);
    for k in &want {
        client.put(k, b"v").await.unwrap();
    }
    want.sort();
    for limit in [1, 4, 10, 40, 41] {
        let (keys, pages) = tokio::task::spawn_blocking({
            let admin = admin.clone();
            move || walk(&admin, limit)
        })
        .await
        .unwrap();
        assert_eq!(keys, want, "limit {limit}: every key once, in order");
        assert_eq!(pages, want.len().div_ceil(limit), "limit {limit}");
    }
    let a = tokio::task::spawn_blocking({
        let admin = admin.clone();
        move || {
            let first = get(&admin, "/get_all_keys?limit=2");
            let over = get(&admin, "/get_all_keys?limit=999999999999");
            let bad: Vec<(String, Answer)> =
                ["/get_all_keys?limit=0", "/get_all_keys?limit=ten", "/get_all_keys?limit=-1", "/get_all_keys?cursor="]
                    .into_iter()
                    .map(|p| (p.to_owned(), get(&admin, p)))
                    .chain(std::iter::once((
                        "long cursor".to_owned(),
                        get(&admin, &format!("/get_all_keys?cursor={}", "c".repeat(5000))),
                    )))
                    .collect();
            (first, over, bad)
        }
    })
    .await
    .unwrap();
    let (first, over, bad) = a;
    assert_eq!(first.expect(200, TEXT), format!("{}\n{}\n", want[0], want[1]));
    let next = first.header("x-next-cursor").unwrap();
    assert!(next.bytes().all(|b| b.is_ascii_graphic()), "{next}");
    // Over the maximum: clamped (as /keys clamps), every key here.
    assert_eq!(over.expect(200, TEXT).lines().count(), want.len());
    assert_eq!(over.header("x-next-cursor"), None);
    for (path, a) in bad {
        let e = parse(a.expect(400, JSON));
        assert_eq!(e["success"], false, "{path}");
        assert_eq!(e["error_code"], -600, "{path}: {}", a.body);
        assert!(!e["error_message"].as_str().unwrap().is_empty(), "{path}");
    }
}
