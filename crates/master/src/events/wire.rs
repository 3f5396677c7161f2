//! The original's KV event wire format (its `KvEventPublisher`, RFC #1527 with the vLLM/SGLang legacy fields
//! and `object_key` on, its defaults), so a consumer written for it reads this stream unchanged.
//!
//! A message is three frames: an empty topic, the message sequence (u64 big-endian), and a msgpack payload
//! `[timestamp_ms, [event, ...], dp_rank]`. An event is a map, in this order: `event_id`, `timestamp`,
//! `event_type` (`stored` / `removed`), `type` (`BlockStored` / `BlockRemoved`), `model_name`, `block_size`,
//! `additional_salt`, `lora_name` (nil: a storage pool does not know them), `tenant_id`, `backend_id`,
//! `group_id`, `medium` (`cpu` / `disk`), `dp_rank` (nil), `object_key`, `seq_hashes` and `block_hashes` (the
//! key read as a decimal or `0x` hex u64 block hash, or empty), then for a stored event `base_block_idx` 0 and
//! nil `parent_hash`, `token_ids`, `parent_block_hash`, for a removed one a nil `base_block_idx`. Crescent adds,
//! after those (consumers skip keys they do not know): `size` and `replicas` (`[{segment, tier}]`) on stored
//! events, `cause` on removed ones.

use super::{EventKind, KvEvent};
use rmp::encode;

/// The key of an object read as a block hash, as the original reads it (`ParseSeqHashFromObjectKey`): the whole
/// key is a decimal u64, or `0x`/`0X` and a hex u64.
pub fn parse_seq_hash(key: &str) -> Option<u64> {
    let (digits, radix) = match key.strip_prefix("0x").or_else(|| key.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (key, 10),
    };
    // One pass, digits only (`from_str_radix` would take a leading `+`, which the original's check refuses); no
    // overflow check while the digits cannot overflow (19 decimal, 15 hex), which most block hashes are not past.
    if digits.is_empty() {
        return None;
    }
    let safe = if radix == 10 { 19 } else { 15 };
    let mut acc = 0u64;
    for (i, b) in digits.bytes().enumerate() {
        let d = u64::from(char::from(b).to_digit(radix)?);
        acc = if i < safe { acc * u64::from(radix) + d } else { acc.checked_mul(u64::from(radix))?.checked_add(d)? };
    }
    Some(acc)
}

/// Appends the payload of one message to `out` and returns how many of its keys are not block hashes. `out` is
/// the publisher's buffer, whose allocation is taken back for the next message once the socket has sent this one
/// (no fresh pages per message).
pub fn encode_payload_into(
    out: &mut bytes::BytesMut,
    events: &[KvEvent],
    backend_id: &str,
    timestamp_ms: i64,
) -> usize {
    use bytes::BufMut;
    let mut unparsed = 0;
    // Writes into a BytesMut cannot fail.
    let _ = write_payload(&mut out.writer(), events, backend_id, timestamp_ms, &mut unparsed);
    unparsed
}

fn write_payload<W: std::io::Write>(
    out: &mut W,
    events: &[KvEvent],
    backend_id: &str,
    timestamp_ms: i64,
    unparsed: &mut usize,
) -> std::io::Result<()> {
    encode::write_array_len(out, 3)?;
    write_int(out, timestamp_ms)?;
    encode::write_array_len(out, events.len() as u32)?;
    let runs = BatchRuns::new(backend_id, timestamp_ms)?;
    for e in events {
        let hash = parse_seq_hash(&e.key);
        if hash.is_none() {
            *unparsed += 1;
        }
        write_event(out, e, hash, &runs)?;
    }
    // The batch's dp_rank: a storage pool has no DP context.
    encode::write_uint(out, 0)?;
    Ok(())
}

/// An event's fields between its variable values, encoded once per message: every event of a message shares its
/// timestamp and backend, and has one of two kinds and one of two media. Writing a run is one copy where the
/// fields one by one were a dozen small writes (most of an event's encoding time).
struct BatchRuns {
    /// After `event_id`'s value, up to `tenant_id`'s key, per kind (stored, removed): `timestamp`,
    /// `event_type`, `type`, the unknown fields, the `tenant_id` key.
    after_id: [Vec<u8>; 2],
    /// After the tenant: `backend_id` and its value, the `group_id` key.
    after_tenant: Vec<u8>,
    /// After the group, per medium (`cpu`, `disk`): `medium` and its value, `dp_rank` nil, the `object_key` key.
    after_group: [Vec<u8>; 2],
}

impl BatchRuns {
    fn new(backend_id: &str, timestamp_ms: i64) -> std::io::Result<Self> {
        let after_id = |stored: bool| -> std::io::Result<Vec<u8>> {
            let mut run = Vec::with_capacity(128);
            field(&mut run, "timestamp")?;
            write_int(&mut run, timestamp_ms)?;
            field(&mut run, "event_type")?;
            encode::write_str(&mut run, if stored { "stored" } else { "removed" })?;
            field(&mut run, "type")?;
            encode::write_str(&mut run, if stored { "BlockStored" } else { "BlockRemoved" })?;
            run.extend_from_slice(&constants().unknown);
            field(&mut run, "tenant_id")?;
            Ok(run)
        };
        let mut after_tenant = Vec::with_capacity(32 + backend_id.len());
        field(&mut after_tenant, "backend_id")?;
        encode::write_str(&mut after_tenant, backend_id)?;
        field(&mut after_tenant, "group_id")?;
        let after_group = |medium: &str| -> std::io::Result<Vec<u8>> {
            let mut run = Vec::with_capacity(48);
            write_after_group(&mut run, medium)?;
            Ok(run)
        };
        Ok(Self {
            after_id: [after_id(true)?, after_id(false)?],
            after_tenant,
            after_group: [after_group("cpu")?, after_group("disk")?],
        })
    }
}

/// `medium` and its value, `dp_rank` nil, the `object_key` key: what follows an event's group.
fn write_after_group<W: std::io::Write>(out: &mut W, medium: &str) -> std::io::Result<()> {
    field(out, "medium")?;
    optional_str(out, Some(medium))?;
    field(out, "dp_rank")?;
    encode::write_nil(out)?;
    field(out, "object_key")
}

fn write_event<W: std::io::Write>(
    out: &mut W,
    e: &KvEvent,
    hash: Option<u64>,
    runs: &BatchRuns,
) -> std::io::Result<()> {
    let stored = e.kind == EventKind::Stored;
    let c = constants();
    // 13 base fields, 2 legacy, object_key; stored: 3 + 1 legacy, removed: 1; Crescent's: 2 stored, 1 removed.
    let fields = 13 + 2 + 1 + if stored { 4 + 2 } else { 1 + 1 };
    encode::write_map_len(out, fields)?;
    out.write_all(&c.event_id)?;
    encode::write_uint(out, e.id)?;
    out.write_all(&runs.after_id[usize::from(!stored)])?;
    encode::write_str(out, &e.tenant)?;
    out.write_all(&runs.after_tenant)?;
    optional_str(out, e.group.as_deref())?;
    match e.medium {
        "cpu" => out.write_all(&runs.after_group[0])?,
        "disk" => out.write_all(&runs.after_group[1])?,
        other => write_after_group(out, other)?,
    }
    encode::write_str(out, &e.key)?;
    out.write_all(&c.seq_hashes)?;
    encode::write_array_len(out, u32::from(hash.is_some()))?;
    if let Some(h) = hash {
        encode::write_uint(out, h)?;
    }
    out.write_all(&c.block_hashes)?;
    encode::write_array_len(out, u32::from(hash.is_some()))?;
    if let Some(h) = hash {
        // The original packs the hash as an int64 here.
        write_int(out, h as i64)?;
    }
    if stored {
        out.write_all(&c.stored_tail)?;
        out.write_all(&c.size)?;
        encode::write_uint(out, e.size)?;
        out.write_all(&c.replicas)?;
        encode::write_array_len(out, e.replicas.len() as u32)?;
        for r in &e.replicas {
            encode::write_map_len(out, 2)?;
            out.write_all(&c.segment)?;
            encode::write_str(out, &r.segment)?;
            out.write_all(&c.tier)?;
            encode::write_str(out, r.tier)?;
        }
    } else {
        out.write_all(&c.removed_tail)?;
        out.write_all(&c.cause)?;
        encode::write_str(out, e.cause.map_or("removed", |c| c.name()))?;
    }
    Ok(())
}

/// The runs of fields whose values never change, encoded once.
struct Constants {
    /// `model_name`, `block_size`, `additional_salt`, `lora_name`: nil.
    unknown: Vec<u8>,
    /// A stored event's `base_block_idx` 0 and nil `parent_hash`, `token_ids`, `parent_block_hash`.
    stored_tail: Vec<u8>,
    /// A removed event's nil `base_block_idx`.
    removed_tail: Vec<u8>,
    /// The keys written between variable values, each encoded once.
    event_id: Vec<u8>,
    seq_hashes: Vec<u8>,
    block_hashes: Vec<u8>,
    size: Vec<u8>,
    replicas: Vec<u8>,
    segment: Vec<u8>,
    tier: Vec<u8>,
    cause: Vec<u8>,
}

fn constants() -> &'static Constants {
    static C: std::sync::OnceLock<Constants> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        let nils = |names: &[&str]| {
            let mut out = Vec::new();
            for n in names {
                let _ = field(&mut out, n);
                let _ = encode::write_nil(&mut out);
            }
            out
        };
        let mut stored_tail = Vec::new();
        let _ = field(&mut stored_tail, "base_block_idx");
        let _ = encode::write_uint(&mut stored_tail, 0);
        stored_tail.extend(nils(&["parent_hash", "token_ids", "parent_block_hash"]));
        let key = |name: &str| {
            let mut out = Vec::new();
            let _ = field(&mut out, name);
            out
        };
        Constants {
            unknown: nils(&["model_name", "block_size", "additional_salt", "lora_name"]),
            stored_tail,
            removed_tail: nils(&["base_block_idx"]),
            event_id: key("event_id"),
            seq_hashes: key("seq_hashes"),
            block_hashes: key("block_hashes"),
            size: key("size"),
            replicas: key("replicas"),
            segment: key("segment"),
            tier: key("tier"),
            cause: key("cause"),
        }
    })
}

fn field<W: std::io::Write>(out: &mut W, name: &str) -> std::io::Result<()> {
    Ok(encode::write_str(out, name)?)
}

fn optional_str<W: std::io::Write>(out: &mut W, s: Option<&str>) -> std::io::Result<()> {
    match s {
        Some(s) if !s.is_empty() => Ok(encode::write_str(out, s)?),
        _ => encode::write_nil(out),
    }
}

/// A signed integer in the form the original's packer gives it: non-negative values as unsigned.
fn write_int<W: std::io::Write>(out: &mut W, v: i64) -> std::io::Result<()> {
    match u64::try_from(v) {
        Ok(u) => encode::write_uint(out, u).map(drop).map_err(Into::into),
        Err(_) => encode::write_sint(out, v).map(drop).map_err(Into::into),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Location, RemoveCause};

    #[test]
    fn keys_read_as_block_hashes_as_the_original_reads_them() {
        assert_eq!(parse_seq_hash("12345"), Some(12345));
        assert_eq!(parse_seq_hash("0x2a"), Some(42));
        assert_eq!(parse_seq_hash("0XFF"), Some(255));
        assert_eq!(parse_seq_hash("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_seq_hash("0xffffffffffffffff"), Some(u64::MAX));
        assert_eq!(parse_seq_hash("0x0000000000000000001"), Some(1), "leading zeros");
        assert_eq!(parse_seq_hash("1234567890123456789"), Some(1_234_567_890_123_456_789));
        for bad in [
            "",
            "not-a-hash",
            "123abc",
            "0x",
            "+5",
            "0x+5",
            "18446744073709551616",
            "99999999999999999999",
            "0x10000000000000000",
            " 1",
            "1 ",
            "0x1g",
            "١٢",
        ] {
            assert_eq!(parse_seq_hash(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_payload_is_the_originals_array_with_crescents_fields_after() {
        let stored = KvEvent {
            kind: EventKind::Stored,
            id: 9,
            tenant: "default".into(),
            key: "0x10".into(),
            group: None,
            medium: "cpu",
            size: 100,
            replicas: [Location { segment: "10.0.0.1:7000".into(), tier: "memory" }].into_iter().collect(),
            cause: None,
        };
        let removed = KvEvent {
            kind: EventKind::Removed,
            key: "prompt-a".into(),
            group: Some("g".into()),
            replicas: Default::default(),
            cause: Some(RemoveCause::Evicted),
            ..stored.clone()
        };
        let mut bytes = bytes::BytesMut::new();
        let unparsed = encode_payload_into(&mut bytes, &[stored, removed], "pool-a", 1_700_000_000_000);
        assert_eq!(unparsed, 1);
        let v = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let root = v.as_array().unwrap();
        assert_eq!(root.len(), 3);
        assert_eq!(root[0].as_u64(), Some(1_700_000_000_000));
        assert_eq!(root[2].as_u64(), Some(0));
        let events = root[1].as_array().unwrap();
        let get = |e: &rmpv::Value, k: &str| {
            e.as_map().unwrap().iter().find(|(key, _)| key.as_str() == Some(k)).map(|(_, v)| v.clone())
        };
        let names = |e: &rmpv::Value| -> Vec<String> {
            e.as_map().unwrap().iter().map(|(k, _)| k.as_str().unwrap().to_owned()).collect()
        };
        assert_eq!(
            names(&events[0])[..16],
            [
                "event_id",
                "timestamp",
                "event_type",
                "type",
                "model_name",
                "block_size",
                "additional_salt",
                "lora_name",
                "tenant_id",
                "backend_id",
                "group_id",
                "medium",
                "dp_rank",
                "object_key",
                "seq_hashes",
                "block_hashes"
            ]
        );
        assert_eq!(get(&events[0], "event_type").unwrap().as_str(), Some("stored"));
        assert_eq!(get(&events[0], "seq_hashes").unwrap().as_array().unwrap()[0].as_u64(), Some(16));
        assert_eq!(get(&events[0], "base_block_idx").unwrap().as_u64(), Some(0));
        assert!(get(&events[0], "parent_hash").unwrap().is_nil());
        assert_eq!(get(&events[0], "size").unwrap().as_u64(), Some(100));
        assert!(get(&events[0], "group_id").unwrap().is_nil());
        assert_eq!(get(&events[1], "type").unwrap().as_str(), Some("BlockRemoved"));
        assert_eq!(get(&events[1], "group_id").unwrap().as_str(), Some("g"));
        assert!(get(&events[1], "seq_hashes").unwrap().as_array().unwrap().is_empty());
        assert!(get(&events[1], "base_block_idx").unwrap().is_nil());
        assert_eq!(get(&events[1], "cause").unwrap().as_str(), Some("evicted"));
        assert_eq!(get(&events[1], "event_id").unwrap().as_u64(), Some(9));
        assert_eq!(events[0].as_map().unwrap().len(), 22);
        assert_eq!(events[1].as_map().unwrap().len(), 18);
    }
}
