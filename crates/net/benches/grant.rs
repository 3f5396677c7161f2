//! What a data-plane grant costs (issue 17 §2): sealing one on the master, checking one on a node, with one
//! secret and during a rotation (two). `cargo bench -p crescent-net --bench grant`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use crescent_net::auth::Keyring;
use crescent_net::grant::{Bearer, GrantOp};
use crescent_net::host::NodeKeys;
use crescent_proto::{ClientId, Principal, SegmentId};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn grants(c: &mut Criterion) {
    let seg = SegmentId::random();
    let bearer = Bearer::new("tenant:engine-a".parse().unwrap(), Some(ClientId::random()));
    for (name, secrets) in
        [("one secret", "0123456789abcdef-first"), ("rotation", "0123456789abcdef-new\n0123456789abcdef-first")]
    {
        let ring = Keyring::parse(secrets).unwrap();
        let master = ring.host_keys(&Principal::Node(None), None);
        c.bench_function(&format!("seal ({name})"), |b| {
            b.iter(|| master.seal_grant(GrantOp::Read, &seg, &bearer, black_box(1 << 30), 4096, u64::MAX))
        });
        // During a rotation the host holds both credentials, and a grant sealed with the second (old) one
        // costs both keys' checks.
        let node = NodeKeys::derived(std::sync::Arc::new(ring), Principal::Node(None));
        let old = Keyring::parse("0123456789abcdef-first").unwrap().host_keys(&Principal::Node(None), None);
        let g = old.seal_grant(GrantOp::Read, &seg, &bearer, 1 << 30, 4096, u64::MAX);
        c.bench_function(&format!("check ({name})"), |b| {
            b.iter(|| node.check_grant(GrantOp::Read, &seg, &bearer, Some(black_box(&g)), 1 << 30, 4096, 0))
        });
    }
}

criterion_group!(benches, grants);
criterion_main!(benches);
