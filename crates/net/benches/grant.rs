//! What a data-plane grant costs (issue 17 §2): sealing one on the master, checking one on a node, with one
//! secret and during a rotation (two), for a single range and for a batch of 32 ranges on one segment (one grant
//! carried by the first request, named by the others). `cargo bench -p crescent-net --bench grant`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use crescent_net::auth::Keyring;
use crescent_net::grant::{Bearer, GrantOp, HeldGrants};
use crescent_net::host::NodeKeys;
use crescent_proto::transfer::{GrantRange, GrantUse};
use crescent_proto::{ClientId, Principal, SegmentId};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

/// `n` adjacent 4 KiB ranges from 1 GiB on.
fn ranges(n: u64) -> Vec<GrantRange> {
    (0..n).map(|i| GrantRange { offset: (1 << 30) + i * 4096, length: 4096 }).collect()
}

fn grants(c: &mut Criterion) {
    let seg = SegmentId::random();
    let bearer = Bearer::new("tenant:engine-a".parse().unwrap(), Some(ClientId::random()));
    for (name, secrets) in
        [("one secret", "0123456789abcdef-first"), ("rotation", "0123456789abcdef-new\n0123456789abcdef-first")]
    {
        let ring = Keyring::parse(secrets).unwrap();
        let master = ring.host_keys(&Principal::Node(None), None);
        // During a rotation the host holds both credentials, and a grant sealed with the second (old) one
        // costs both keys' checks.
        let node = NodeKeys::derived(std::sync::Arc::new(ring), Principal::Node(None));
        let old = Keyring::parse("0123456789abcdef-first").unwrap().host_keys(&Principal::Node(None), None);
        for n in [1u64, 32] {
            c.bench_function(&format!("seal {n} range(s) ({name})"), |b| {
                b.iter(|| master.seal_grant(GrantOp::Read, &seg, &bearer, black_box(ranges(n)), u64::MAX))
            });
            let g = old.seal_grant(GrantOp::Read, &seg, &bearer, ranges(n), u64::MAX);
            c.bench_function(&format!("check {n} range(s) ({name})"), |b| {
                b.iter(|| {
                    let mut held = HeldGrants::default();
                    for (i, r) in g.ranges.iter().enumerate() {
                        let range = i as u16;
                        let grant = if i == 0 {
                            GrantUse::Carried { slot: 0, range, grant: g.clone() }
                        } else {
                            GrantUse::Held { slot: 0, range }
                        };
                        let checked = held.check(&node, GrantOp::Read, &seg, &bearer, Some(grant), r.offset, 4096, 0);
                        assert!(checked.is_ok());
                    }
                })
            });
        }
    }
}

criterion_group!(benches, grants);
criterion_main!(benches);
