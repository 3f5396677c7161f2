//! The HA oplog's stored values (`crescent_ha::oplog::codec`): batch records, durable prefixes, standalone entries
//! and producer views, as a standby or a restarting primary reads them back from etcd or the embedded store.
//!
//! Input: byte 0 is a mode. Bits 0-1 pick the decoder (0 batch record, 1 durable prefix, 2 entry, 3 producer
//! view); with bit 3 set they pick a legacy decoder instead (1 the `/latest` value, anything else a legacy
//! per-entry value); bit 2 wraps the rest under a valid crc32c trailer (records, prefixes, legacy entries), so
//! mutations get past the checksum into the body decoder and the consistency checks.
//! Properties: no panic on any bytes; whatever a decoder accepts encodes back to exactly the bytes it came from
//! (values are canonical, so an exact-bytes txn compare means "equal value"), and a decoded record is consistent
//! (its sequence range matches its entries).
#![no_main]

use crescent_fuzz::{split_first, write_seeds};
use crescent_ha::oplog::codec::{
    DurablePrefix, OpLogBatchRecord, OpLogEntry, decode_legacy_entry, decode_legacy_latest, decode_producer_view,
    encode_legacy_entry, encode_legacy_latest, encode_producer_view,
};
use libfuzzer_sys::fuzz_target;

fn entry(op: u16, tenant: &str, key: &str, payload: &[u8]) -> OpLogEntry {
    OpLogEntry { op, tenant: tenant.into(), key: key.into(), payload: payload.to_vec() }
}

fn seeds() -> Vec<Vec<u8>> {
    let records = [
        OpLogBatchRecord::new(
            3,
            10,
            vec![entry(1, "tenant", "key", b"\0binary"), entry(3, "default", "dead-key", b"")],
        ),
        OpLogBatchRecord::new(1, 1, vec![entry(5, "", "10.0.0.1:9001", &[7; 40])]),
        OpLogBatchRecord::new(u64::MAX, u64::MAX - 2, (0..3).map(|i| entry(i + 1, "t", "k", &[i as u8])).collect()),
    ];
    let mut out = Vec::new();
    for r in records.into_iter().flatten() {
        let bytes = r.encode().unwrap();
        out.push([&[0u8][..], &bytes].concat());
        out.push([&[4u8][..], &bytes[..bytes.len() - 4]].concat());
        for (seq, e) in r.sequenced() {
            out.push([&[2u8][..], &e.encode().unwrap()].concat());
            let legacy = encode_legacy_entry(seq, e).unwrap();
            out.push([&[8u8][..], &legacy].concat());
            out.push([&[12u8][..], &legacy[..legacy.len() - 4]].concat());
        }
    }
    for p in
        [DurablePrefix::ZERO, DurablePrefix { batch_id: 3, last_seq: 11 }, DurablePrefix { batch_id: 0, last_seq: 42 }]
    {
        let bytes = p.encode();
        out.push([&[1u8][..], &bytes].concat());
        out.push([&[5u8][..], &bytes[..bytes.len() - 4]].concat());
    }
    for v in [1u64, 7, u64::MAX] {
        out.push([&[3u8][..], &encode_producer_view(v)].concat());
        out.push([&[9u8][..], &encode_legacy_latest(v)].concat());
    }
    out
}

fuzz_target!(init: write_seeds(seeds), |data: &[u8]| {
    let (mode, rest) = split_first(data);
    let owned;
    let input = if mode & 4 != 0 {
        owned = [rest, &crc32c::crc32c(rest).to_le_bytes()[..]].concat();
        &owned[..]
    } else {
        rest
    };
    if mode & 8 != 0 {
        if mode & 3 == 1 {
            if let Ok(v) = decode_legacy_latest(input) {
                assert_eq!(encode_legacy_latest(v), input, "latest re-encodes identically");
            }
        } else if let Ok((seq, e)) = decode_legacy_entry(input) {
            assert!(seq > 0, "legacy sequence numbers start at 1");
            let again = encode_legacy_entry(seq, &e).expect("an accepted legacy entry encodes");
            assert_eq!(again, input, "legacy entry re-encodes identically");
        }
    } else {
        match mode & 3 {
            0 => {
                if let Ok(r) = OpLogBatchRecord::decode(input) {
                    assert_eq!(r.encode().expect("an accepted record encodes"), input, "record re-encodes identically");
                    assert_eq!(r.last_seq - r.first_seq + 1, r.entries.len() as u64);
                    assert_eq!(r.sequenced().last().map(|(s, _)| s), Some(r.last_seq));
                }
            }
            1 => {
                if let Ok(p) = DurablePrefix::decode(input) {
                    assert_eq!(p.encode(), input, "prefix re-encodes identically");
                }
            }
            2 => {
                if let Ok(e) = OpLogEntry::decode(input) {
                    assert_eq!(e.encode().expect("an accepted entry encodes"), input, "entry re-encodes identically");
                }
            }
            _ => {
                if let Ok(v) = decode_producer_view(input) {
                    assert_eq!(encode_producer_view(v), input, "view re-encodes identically");
                }
            }
        }
    }
});
