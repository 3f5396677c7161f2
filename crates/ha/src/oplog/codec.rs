//! Byte encodings of the oplog: entries, batch records, the durable prefix, the producer view, and the key layout.
//!
//! Batch record and durable prefix values are `postcard(body) ++ crc32c(postcard(body))` (little-endian). The body
//! starts with its schema version, so a reader can refuse a newer schema before decoding the rest. Decoders check
//! size first, then the checksum, then the schema, then the body, then the record's own consistency, and finally
//! that the bytes are the canonical encoding of what they decoded to (so equal records have equal bytes and an
//! exact-bytes compare in a txn means "equal value").

use serde::{Deserialize, Serialize};

/// The schema version of batch records and durable prefixes this build writes and reads.
pub const SCHEMA_VERSION: u32 = 1;
/// Most bytes in an entry's tenant.
pub const MAX_TENANT_LEN: usize = 256;
/// Most bytes in an entry's key (Crescent's object-key limit).
pub const MAX_ENTRY_KEY_LEN: usize = 4096;
/// Most bytes in an entry's payload (an entry must fit in one batch under etcd's 1.5 MiB request limit).
pub const MAX_ENTRY_PAYLOAD_LEN: usize = 1 << 20;
/// Most bytes in a standalone encoded entry (its limits plus varints).
pub const MAX_ENTRY_BYTES: usize = 3 + 15 + MAX_TENANT_LEN + MAX_ENTRY_KEY_LEN + MAX_ENTRY_PAYLOAD_LEN;
/// Most bytes in an encoded batch record (etcd's default request limit).
pub const MAX_RECORD_BYTES: usize = crate::kv::ETCD_MAX_REQUEST_BYTES;
/// Most entries a decoder accepts in one batch record.
pub const MAX_RECORD_ENTRIES: usize = 65_536;
/// Most bytes in an encoded durable prefix.
pub const MAX_PREFIX_BYTES: usize = 64;
/// Bytes of the checksum trailer.
pub const CHECKSUM_LEN: usize = 4;
/// Most bytes in a cluster id.
pub const MAX_CLUSTER_ID_LEN: usize = 128;
/// Digits of a batch id in its key (enough for `u64::MAX`, so key order is numeric order).
pub const BATCH_ID_WIDTH: usize = 20;

/// Why an entry is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Operation type 0 is reserved (it would hide a zeroed or missing field).
    #[error("operation type 0 is reserved")]
    ZeroOp,
    /// The tenant is too long.
    #[error("tenant is {0} bytes, the limit is {MAX_TENANT_LEN}")]
    TenantTooLong(usize),
    /// The key is too long.
    #[error("key is {0} bytes, the limit is {MAX_ENTRY_KEY_LEN}")]
    KeyTooLong(usize),
    /// The payload is too large.
    #[error("payload is {0} bytes, the limit is {MAX_ENTRY_PAYLOAD_LEN}")]
    PayloadTooLarge(usize),
}

/// Why bytes are not a valid batch record, durable prefix or producer view.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// Shorter than the smallest valid value.
    #[error("value is truncated ({0} bytes)")]
    Truncated(usize),
    /// Longer than the largest valid value.
    #[error("value is {len} bytes, the limit is {max}")]
    TooLarge {
        /// Bytes found.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The checksum trailer does not match the body.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// The trailer's value.
        stored: u32,
        /// The body's crc32c.
        computed: u32,
    },
    /// A schema version this build does not read.
    #[error("unsupported schema version {0}")]
    UnsupportedSchema(u32),
    /// The body does not decode.
    #[error("malformed body: {0}")]
    Malformed(String),
    /// Bytes follow the body.
    #[error("{0} bytes follow the body")]
    TrailingBytes(usize),
    /// The bytes decode, but are not the canonical encoding of what they decode to.
    #[error("not the canonical encoding")]
    NonCanonical,
    /// The fields contradict each other (sequence range, ids).
    #[error("inconsistent record: {0}")]
    Inconsistent(String),
    /// An entry breaks a limit.
    #[error("entry {index}: {error}")]
    Entry {
        /// Position of the entry in the batch.
        index: usize,
        /// What is wrong with it.
        error: EntryError,
    },
    /// Too many entries.
    #[error("{0} entries, the limit is {MAX_RECORD_ENTRIES}")]
    TooManyEntries(usize),
}

/// One logical oplog entry. Its sequence number is not stored: it is the batch's `first_seq` plus its index.
/// The operation type and payload are opaque here (the master defines them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpLogEntry {
    /// Operation type (the master's numbering; 0 is reserved).
    pub op: u16,
    /// Tenant the entry belongs to.
    pub tenant: String,
    /// The object key (or other subject) the entry is about.
    pub key: String,
    /// Operation-specific bytes.
    pub payload: Vec<u8>,
}

impl OpLogEntry {
    /// Checks the entry's limits.
    pub fn validate(&self) -> Result<(), EntryError> {
        if self.op == 0 {
            return Err(EntryError::ZeroOp);
        }
        if self.tenant.len() > MAX_TENANT_LEN {
            return Err(EntryError::TenantTooLong(self.tenant.len()));
        }
        if self.key.len() > MAX_ENTRY_KEY_LEN {
            return Err(EntryError::KeyTooLong(self.key.len()));
        }
        if self.payload.len() > MAX_ENTRY_PAYLOAD_LEN {
            return Err(EntryError::PayloadTooLarge(self.payload.len()));
        }
        Ok(())
    }

    /// The entry's standalone bytes (postcard, the same bytes it has inside a batch record), validated first.
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        self.validate().map_err(|error| CodecError::Entry { index: 0, error })?;
        postcard::to_stdvec(self).map_err(|e| CodecError::Malformed(e.to_string()))
    }

    /// Decodes and checks standalone entry bytes (canonical encoding only).
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        if bytes.len() > MAX_ENTRY_BYTES {
            return Err(CodecError::TooLarge { len: bytes.len(), max: MAX_ENTRY_BYTES });
        }
        let e: OpLogEntry = take_all(bytes)?;
        if e.encode()? != bytes {
            return Err(CodecError::NonCanonical);
        }
        Ok(e)
    }

    /// An upper bound of the entry's encoded size inside a batch record (for sizing batches before encoding).
    pub fn encoded_len_bound(&self) -> usize {
        // op varint (≤ 3) + three length varints (≤ 5 each) + the bytes.
        3 + 15 + self.tenant.len() + self.key.len() + self.payload.len()
    }
}

/// Bytes of a batch record besides its entries, at most (schema, ids and seqs as varints, entry count, checksum).
pub const RECORD_OVERHEAD_BOUND: usize = 5 + 3 * 10 + 5 + CHECKSUM_LEN;

#[derive(Serialize)]
struct RecordBodyRef<'a> {
    schema_version: u32,
    batch_id: u64,
    first_seq: u64,
    last_seq: u64,
    entries: &'a [OpLogEntry],
}

#[derive(Deserialize)]
struct RecordBody {
    schema_version: u32,
    batch_id: u64,
    first_seq: u64,
    last_seq: u64,
    entries: Vec<OpLogEntry>,
}

/// One physical batch: a non-empty run of entries with consecutive sequence numbers, stored as one value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpLogBatchRecord {
    /// The batch's id (≥ 1, one more than the previous batch's).
    pub batch_id: u64,
    /// Sequence number of the first entry (≥ 1).
    pub first_seq: u64,
    /// Sequence number of the last entry (`first_seq + entries.len() - 1`).
    pub last_seq: u64,
    /// The entries, in sequence order.
    pub entries: Vec<OpLogEntry>,
}

impl OpLogBatchRecord {
    /// A batch of `entries` numbered from `first_seq`, validated.
    pub fn new(batch_id: u64, first_seq: u64, entries: Vec<OpLogEntry>) -> Result<Self, CodecError> {
        let n = u64::try_from(entries.len()).map_err(|_| CodecError::TooManyEntries(entries.len()))?;
        let last_seq = n
            .checked_sub(1)
            .and_then(|d| first_seq.checked_add(d))
            .ok_or_else(|| CodecError::Inconsistent("no entries, or the sequence range overflows".into()))?;
        let record = Self { batch_id, first_seq, last_seq, entries };
        record.validate()?;
        Ok(record)
    }

    /// Checks ids, the sequence range and every entry.
    pub fn validate(&self) -> Result<(), CodecError> {
        if self.batch_id == 0 {
            return Err(CodecError::Inconsistent("batch id 0 is reserved".into()));
        }
        if self.first_seq == 0 {
            return Err(CodecError::Inconsistent("sequence numbers start at 1".into()));
        }
        if self.entries.is_empty() {
            return Err(CodecError::Inconsistent("a batch has at least one entry".into()));
        }
        if self.entries.len() > MAX_RECORD_ENTRIES {
            return Err(CodecError::TooManyEntries(self.entries.len()));
        }
        let span = self.last_seq.checked_sub(self.first_seq).and_then(|d| d.checked_add(1));
        if span != u64::try_from(self.entries.len()).ok() {
            return Err(CodecError::Inconsistent(format!(
                "seqs {}..={} do not match {} entries",
                self.first_seq,
                self.last_seq,
                self.entries.len()
            )));
        }
        for (index, e) in self.entries.iter().enumerate() {
            e.validate().map_err(|error| CodecError::Entry { index, error })?;
        }
        Ok(())
    }

    /// The sequence number of each entry, in order.
    pub fn sequenced(&self) -> impl Iterator<Item = (u64, &OpLogEntry)> {
        (self.first_seq..).zip(self.entries.iter())
    }

    /// The durable prefix that ends with this batch.
    pub fn prefix(&self) -> DurablePrefix {
        DurablePrefix { batch_id: self.batch_id, last_seq: self.last_seq }
    }

    /// The record's bytes (validated first; an encoding over [`MAX_RECORD_BYTES`] is refused).
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        self.validate()?;
        let body = RecordBodyRef {
            schema_version: SCHEMA_VERSION,
            batch_id: self.batch_id,
            first_seq: self.first_seq,
            last_seq: self.last_seq,
            entries: &self.entries,
        };
        let out = seal(&body)?;
        if out.len() > MAX_RECORD_BYTES {
            return Err(CodecError::TooLarge { len: out.len(), max: MAX_RECORD_BYTES });
        }
        Ok(out)
    }

    /// Decodes and fully checks a record.
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        let body = open(bytes, MAX_RECORD_BYTES)?;
        let b: RecordBody = take_all(body)?;
        debug_assert_eq!(b.schema_version, SCHEMA_VERSION);
        let record = Self { batch_id: b.batch_id, first_seq: b.first_seq, last_seq: b.last_seq, entries: b.entries };
        record.validate()?;
        if record.encode()? != bytes {
            return Err(CodecError::NonCanonical);
        }
        Ok(record)
    }
}

#[derive(Serialize)]
struct LegacyBodyRef<'a> {
    schema_version: u32,
    seq: u64,
    entry: &'a OpLogEntry,
}

#[derive(Deserialize)]
struct LegacyBody {
    schema_version: u32,
    seq: u64,
    entry: OpLogEntry,
}

/// Most bytes in an encoded legacy per-entry value (an entry plus schema, sequence and checksum).
pub const MAX_LEGACY_ENTRY_BYTES: usize = MAX_ENTRY_BYTES + 5 + 10 + CHECKSUM_LEN;

/// The value of a legacy per-entry key `/oplog/<cluster>/<seq, 20 digits>`:
/// `postcard({schema_version, seq, entry}) ++ crc32c LE`. The sequence is stored as well as implied by the key so
/// a value copied under the wrong key is caught.
pub fn encode_legacy_entry(seq: u64, entry: &OpLogEntry) -> Result<Vec<u8>, CodecError> {
    if seq == 0 {
        return Err(CodecError::Inconsistent("sequence numbers start at 1".into()));
    }
    entry.validate().map_err(|error| CodecError::Entry { index: 0, error })?;
    seal(&LegacyBodyRef { schema_version: SCHEMA_VERSION, seq, entry })
}

/// Decodes and fully checks a legacy per-entry value; returns its sequence number and entry.
pub fn decode_legacy_entry(bytes: &[u8]) -> Result<(u64, OpLogEntry), CodecError> {
    let body = open(bytes, MAX_LEGACY_ENTRY_BYTES)?;
    let b: LegacyBody = take_all(body)?;
    debug_assert_eq!(b.schema_version, SCHEMA_VERSION);
    if encode_legacy_entry(b.seq, &b.entry)? != bytes {
        return Err(CodecError::NonCanonical);
    }
    Ok((b.seq, b.entry))
}

/// The legacy `/latest` value: the last written sequence number as a canonical decimal (`0` allowed).
pub fn encode_legacy_latest(seq: u64) -> Vec<u8> {
    seq.to_string().into_bytes()
}

/// Decodes a legacy `/latest` value, refusing anything but its canonical decimal form.
pub fn decode_legacy_latest(bytes: &[u8]) -> Result<u64, CodecError> {
    if bytes.is_empty() {
        return Err(CodecError::Truncated(0));
    }
    if bytes.len() > 20 {
        return Err(CodecError::TooLarge { len: bytes.len(), max: 20 });
    }
    if !bytes.iter().all(u8::is_ascii_digit) {
        return Err(CodecError::Malformed("latest is not a decimal".into()));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| CodecError::Malformed(e.to_string()))?;
    let v: u64 = text.parse().map_err(|e: std::num::ParseIntError| CodecError::Malformed(e.to_string()))?;
    if encode_legacy_latest(v) != bytes {
        return Err(CodecError::NonCanonical);
    }
    Ok(v)
}

#[derive(Serialize, Deserialize)]
struct PrefixBody {
    schema_version: u32,
    batch_id: u64,
    last_seq: u64,
}

/// The durable boundary: every entry with sequence in `[1, last_seq]` is durable, and batch `batch_id` holds
/// `last_seq` (`{0, 0}` is the empty log).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DurablePrefix {
    /// The batch holding `last_seq` (0: none yet).
    pub batch_id: u64,
    /// The last durable sequence number (0: none yet).
    pub last_seq: u64,
}

impl DurablePrefix {
    /// The empty log.
    pub const ZERO: DurablePrefix = DurablePrefix { batch_id: 0, last_seq: 0 };

    /// The prefix's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let body = PrefixBody { schema_version: SCHEMA_VERSION, batch_id: self.batch_id, last_seq: self.last_seq };
        // Three integers always serialize; an error here would be a postcard bug, so fall back to an empty value
        // that every decoder refuses rather than panic.
        seal(&body).unwrap_or_default()
    }

    /// Decodes and checks a prefix.
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        let body = open(bytes, MAX_PREFIX_BYTES)?;
        let b: PrefixBody = take_all(body)?;
        let prefix = Self { batch_id: b.batch_id, last_seq: b.last_seq };
        if prefix.batch_id > 0 && prefix.last_seq == 0 {
            return Err(CodecError::Inconsistent("a batch holds at least one entry".into()));
        }
        if prefix.encode() != bytes {
            return Err(CodecError::NonCanonical);
        }
        Ok(prefix)
    }
}

/// The producer-view value: a canonical decimal (no sign, no leading zeros, > 0).
pub fn encode_producer_view(view: u64) -> Vec<u8> {
    view.to_string().into_bytes()
}

/// Decodes a producer-view value, refusing anything but its canonical decimal form.
pub fn decode_producer_view(bytes: &[u8]) -> Result<u64, CodecError> {
    if bytes.is_empty() {
        return Err(CodecError::Truncated(0));
    }
    if bytes.len() > 20 {
        return Err(CodecError::TooLarge { len: bytes.len(), max: 20 });
    }
    if !bytes.iter().all(u8::is_ascii_digit) {
        return Err(CodecError::Malformed("producer view is not a decimal".into()));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| CodecError::Malformed(e.to_string()))?;
    let v: u64 = text.parse().map_err(|e: std::num::ParseIntError| CodecError::Malformed(e.to_string()))?;
    if v == 0 {
        return Err(CodecError::Inconsistent("producer view 0 is reserved".into()));
    }
    if encode_producer_view(v) != bytes {
        return Err(CodecError::NonCanonical);
    }
    Ok(v)
}

/// postcard body plus crc32c trailer.
fn seal<T: Serialize>(body: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = postcard::to_stdvec(body).map_err(|e| CodecError::Malformed(e.to_string()))?;
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Checks size, checksum and schema version; returns the body.
fn open(bytes: &[u8], max: usize) -> Result<&[u8], CodecError> {
    if bytes.len() > max {
        return Err(CodecError::TooLarge { len: bytes.len(), max });
    }
    let Some(split) = bytes.len().checked_sub(CHECKSUM_LEN) else {
        return Err(CodecError::Truncated(bytes.len()));
    };
    let (body, trailer) = bytes.split_at(split);
    let mut crc = [0u8; CHECKSUM_LEN];
    crc.copy_from_slice(trailer);
    let stored = u32::from_le_bytes(crc);
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(CodecError::Checksum { stored, computed });
    }
    // The version leads the body: refuse another schema before trying to decode this one's layout.
    let (version, _) = postcard::take_from_bytes::<u32>(body).map_err(|_| CodecError::Truncated(bytes.len()))?;
    if version != SCHEMA_VERSION {
        return Err(CodecError::UnsupportedSchema(version));
    }
    Ok(body)
}

/// Decodes a whole body, refusing trailing bytes.
fn take_all<'de, T: Deserialize<'de>>(body: &'de [u8]) -> Result<T, CodecError> {
    let (v, rest) = postcard::take_from_bytes::<T>(body).map_err(|e| CodecError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CodecError::TrailingBytes(rest.len()));
    }
    Ok(v)
}

/// Why a cluster id cannot name an oplog namespace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cluster id {0:?} must be 1..=128 characters of [A-Za-z0-9_.-]")]
pub struct ClusterIdError(pub String);

/// The oplog's key layout under `/oplog/<cluster>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpLogKeys {
    root: String,
}

impl OpLogKeys {
    /// The layout of `cluster` (`[A-Za-z0-9_.-]{1,128}`).
    pub fn new(cluster: &str) -> Result<Self, ClusterIdError> {
        let ok = !cluster.is_empty()
            && cluster.len() <= MAX_CLUSTER_ID_LEN
            && cluster.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !ok {
            return Err(ClusterIdError(cluster.to_owned()));
        }
        Ok(Self { root: format!("/oplog/{cluster}/") })
    }

    /// `/oplog/<cluster>/durable_prefix`.
    pub fn durable_prefix(&self) -> Vec<u8> {
        format!("{}durable_prefix", self.root).into_bytes()
    }

    /// `/oplog/<cluster>/producer_view`: the view (leader epoch) allowed to write batches.
    pub fn producer_view(&self) -> Vec<u8> {
        format!("{}producer_view", self.root).into_bytes()
    }

    /// `/oplog/<cluster>/batches/`.
    pub fn batches_prefix(&self) -> Vec<u8> {
        format!("{}batches/", self.root).into_bytes()
    }

    /// `/oplog/<cluster>/batches/<id, 20 digits>`.
    pub fn batch(&self, batch_id: u64) -> Vec<u8> {
        format!("{}batches/{batch_id:0width$}", self.root, width = BATCH_ID_WIDTH).into_bytes()
    }

    /// Legacy `/oplog/<cluster>/latest`: the last sequence the per-entry writer wrote.
    pub fn legacy_latest(&self) -> Vec<u8> {
        format!("{}latest", self.root).into_bytes()
    }

    /// Legacy per-entry key `/oplog/<cluster>/<seq, 20 digits>` (the same padding as batch ids).
    pub fn legacy_entry(&self, seq: u64) -> Vec<u8> {
        format!("{}{seq:0width$}", self.root, width = BATCH_ID_WIDTH).into_bytes()
    }

    /// The range `[begin, end)` of legacy entry keys with sequence in `(after, upto]` (empty when `after >= upto`).
    /// The end stops below `/oplog/<cluster>/:` (`:` follows `9`), so `batches/`, `latest`, `durable_prefix`,
    /// `producer_view` and `snapshot/` never fall inside.
    pub fn legacy_entries_between(&self, after: u64, upto: u64) -> (Vec<u8>, Vec<u8>) {
        let digits_end = format!("{}:", self.root).into_bytes();
        if after >= upto {
            return (digits_end.clone(), digits_end);
        }
        // `after < upto`, so `after + 1` cannot overflow.
        let begin = self.legacy_entry(after + 1);
        let end = match upto.checked_add(1) {
            Some(e) => self.legacy_entry(e),
            None => digits_end,
        };
        (begin, end)
    }

    /// The sequence number a legacy entry key names, or `None` for any other key.
    pub fn parse_legacy_entry(&self, key: &[u8]) -> Option<u64> {
        let digits = key.strip_prefix(self.root.as_bytes())?;
        if digits.len() != BATCH_ID_WIDTH || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    }

    /// The range `[begin, end)` of batch keys with ids greater than `after` (empty when `after` is `u64::MAX`).
    pub fn batches_after(&self, after: u64) -> (Vec<u8>, Vec<u8>) {
        let end = crate::kv::prefix_end(&self.batches_prefix());
        match after.checked_add(1) {
            Some(first) => (self.batch(first), end),
            None => (end.clone(), end),
        }
    }

    /// The batch id a key names, or `None` for anything else under `batches/` (sidecars, other suffixes).
    pub fn parse_batch(&self, key: &[u8]) -> Option<u64> {
        let prefix = self.batches_prefix();
        let digits = key.strip_prefix(prefix.as_slice())?;
        if digits.len() != BATCH_ID_WIDTH || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn entry(op: u16, tenant: &str, key: &str, payload: &[u8]) -> OpLogEntry {
        OpLogEntry { op, tenant: tenant.into(), key: key.into(), payload: payload.to_vec() }
    }

    fn golden_record() -> OpLogBatchRecord {
        OpLogBatchRecord::new(3, 10, vec![entry(1, "tenant", "key", b"\0binary"), entry(3, "default", "dead-key", b"")])
            .unwrap()
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn record_golden_bytes() {
        let bytes = golden_record().encode().unwrap();
        assert_eq!(hex(&bytes), GOLDEN_RECORD);
        assert_eq!(OpLogBatchRecord::decode(&bytes).unwrap(), golden_record());
    }

    #[test]
    fn prefix_golden_bytes() {
        let p = DurablePrefix { batch_id: 3, last_seq: 11 };
        assert_eq!(hex(&p.encode()), GOLDEN_PREFIX);
        assert_eq!(DurablePrefix::decode(&p.encode()).unwrap(), p);
        assert_eq!(hex(&DurablePrefix::ZERO.encode()), GOLDEN_PREFIX_ZERO);
    }

    // schema 1, batch 3, seqs 10..=11, 2 entries: [op 1, "tenant", "key", "\0binary"], [op 3, "default", "dead-key", ""], crc32c LE.
    const GOLDEN_RECORD: &str =
        "01030a0b02010674656e616e74036b6579070062696e617279030764656661756c7408646561642d6b657900edcd9bc9";
    // schema 1, batch 3, last seq 11, crc32c LE.
    const GOLDEN_PREFIX: &str = "01030ba6324b68";
    const GOLDEN_PREFIX_ZERO: &str = "010000043125c5";

    #[test]
    fn keys_layout_and_order() {
        let k = OpLogKeys::new("c-1.x_y").unwrap();
        assert_eq!(k.batch(7), b"/oplog/c-1.x_y/batches/00000000000000000007".to_vec());
        assert_eq!(k.batch(u64::MAX), b"/oplog/c-1.x_y/batches/18446744073709551615".to_vec());
        assert_eq!(k.durable_prefix(), b"/oplog/c-1.x_y/durable_prefix".to_vec());
        assert_eq!(k.producer_view(), b"/oplog/c-1.x_y/producer_view".to_vec());
        assert!(k.batch(9) < k.batch(10) && k.batch(99) < k.batch(100));
        let (b, e) = k.batches_after(7);
        assert_eq!(b, k.batch(8));
        assert_eq!(e, b"/oplog/c-1.x_y/batches0".to_vec());
        let (b, e) = k.batches_after(u64::MAX);
        assert_eq!(b, e);
        assert_eq!(k.parse_batch(&k.batch(42)), Some(42));
        assert_eq!(k.parse_batch(b"/oplog/c-1.x_y/batches/00000000000000000042.meta"), None);
        assert_eq!(k.parse_batch(b"/oplog/c-1.x_y/batches/sidecar"), None);
        assert_eq!(k.parse_batch(b"/oplog/other/batches/00000000000000000042"), None);
        for bad in ["", "a/b", "a b", "é", &"x".repeat(129)] {
            assert!(OpLogKeys::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn record_rejects_corruption_truncation_and_schema() {
        let bytes = golden_record().encode().unwrap();
        for cut in 0..bytes.len() {
            assert!(OpLogBatchRecord::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(OpLogBatchRecord::decode(&b).is_err(), "flip at {i}");
        }
        // A body under a valid checksum but with another schema.
        let mut body = bytes[..bytes.len() - CHECKSUM_LEN].to_vec();
        body[0] = 2;
        let crc = crc32c::crc32c(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(OpLogBatchRecord::decode(&body), Err(CodecError::UnsupportedSchema(2)));
        // Trailing bytes under a valid checksum.
        let mut body = bytes[..bytes.len() - CHECKSUM_LEN].to_vec();
        body.push(0);
        let crc = crc32c::crc32c(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(OpLogBatchRecord::decode(&body), Err(CodecError::TrailingBytes(1)));
        assert!(matches!(OpLogBatchRecord::decode(&vec![0; MAX_RECORD_BYTES + 1]), Err(CodecError::TooLarge { .. })));
    }

    #[test]
    fn record_rejects_inconsistent_fields() {
        let good = golden_record();
        let reseal = |r: &OpLogBatchRecord| {
            let body = RecordBodyRef {
                schema_version: SCHEMA_VERSION,
                batch_id: r.batch_id,
                first_seq: r.first_seq,
                last_seq: r.last_seq,
                entries: &r.entries,
            };
            seal(&body).unwrap()
        };
        let mut r = good.clone();
        r.last_seq = 12;
        assert!(matches!(OpLogBatchRecord::decode(&reseal(&r)), Err(CodecError::Inconsistent(_))));
        let mut r = good.clone();
        r.batch_id = 0;
        assert!(matches!(OpLogBatchRecord::decode(&reseal(&r)), Err(CodecError::Inconsistent(_))));
        let mut r = good.clone();
        r.entries[1].op = 0;
        assert_eq!(
            OpLogBatchRecord::decode(&reseal(&r)),
            Err(CodecError::Entry { index: 1, error: EntryError::ZeroOp })
        );
        let mut r = good;
        r.entries.clear();
        assert!(OpLogBatchRecord::decode(&reseal(&r)).is_err());
        assert!(OpLogBatchRecord::new(1, u64::MAX, vec![entry(1, "", "", b""); 2]).is_err());
        assert!(OpLogBatchRecord::new(1, 1, vec![]).is_err());
    }

    #[test]
    fn record_rejects_non_canonical_varints() {
        // The prefix {0,0} body is [1, 0, 0]; an overlong zero (0x80 0x00) decodes to the same value.
        let mut body = vec![1u8, 0x80, 0x00, 0x00];
        let crc = crc32c::crc32c(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(DurablePrefix::decode(&body), Err(CodecError::NonCanonical));
    }

    #[test]
    fn entry_golden_bytes_and_round_trip() {
        let e = entry(1, "tenant", "key", b"\0binary");
        let bytes = e.encode().unwrap();
        assert_eq!(hex(&bytes), "010674656e616e74036b6579070062696e617279");
        assert_eq!(OpLogEntry::decode(&bytes).unwrap(), e);
        for cut in 0..bytes.len() {
            assert!(OpLogEntry::decode(&bytes[..cut]).is_err());
        }
        assert_eq!(OpLogEntry::decode(&[bytes.as_slice(), &[0]].concat()), Err(CodecError::TrailingBytes(1)));
        // op 1 as an overlong varint.
        assert_eq!(OpLogEntry::decode(&[&[0x81, 0x00][..], &bytes[1..]].concat()), Err(CodecError::NonCanonical));
        assert!(matches!(OpLogEntry::decode(&[0, 0, 0, 0]), Err(CodecError::Entry { error: EntryError::ZeroOp, .. })));
        // Invalid UTF-8 in the key.
        assert!(matches!(OpLogEntry::decode(&[1, 0, 1, 0xff, 0]), Err(CodecError::Malformed(_))));
    }

    #[test]
    fn entry_limits() {
        assert_eq!(entry(0, "", "", b"").validate(), Err(EntryError::ZeroOp));
        assert!(entry(1, &"t".repeat(MAX_TENANT_LEN), &"k".repeat(MAX_ENTRY_KEY_LEN), b"").validate().is_ok());
        assert_eq!(entry(1, &"t".repeat(MAX_TENANT_LEN + 1), "", b"").validate(), Err(EntryError::TenantTooLong(257)));
        assert_eq!(entry(1, "", &"k".repeat(MAX_ENTRY_KEY_LEN + 1), b"").validate(), Err(EntryError::KeyTooLong(4097)));
        let big = vec![0u8; MAX_ENTRY_PAYLOAD_LEN + 1];
        assert_eq!(entry(1, "", "", &big).validate(), Err(EntryError::PayloadTooLarge(big.len())));
        let e = entry(7, "tenant", "key", &[1; 300]);
        let r = OpLogBatchRecord::new(1, 1, vec![e.clone()]).unwrap();
        assert!(r.encode().unwrap().len() <= e.encoded_len_bound() + RECORD_OVERHEAD_BOUND);
    }

    #[test]
    fn prefix_rejects_bad_values() {
        let bytes = DurablePrefix { batch_id: 9, last_seq: 1024 }.encode();
        for cut in 0..bytes.len() {
            assert!(DurablePrefix::decode(&bytes[..cut]).is_err());
        }
        let mut b = bytes.clone();
        b[1] ^= 1;
        assert!(matches!(DurablePrefix::decode(&b), Err(CodecError::Checksum { .. })));
        let bad = seal(&PrefixBody { schema_version: 1, batch_id: 2, last_seq: 0 }).unwrap();
        assert!(matches!(DurablePrefix::decode(&bad), Err(CodecError::Inconsistent(_))));
        let v2 = seal(&PrefixBody { schema_version: 2, batch_id: 2, last_seq: 5 }).unwrap();
        assert_eq!(DurablePrefix::decode(&v2), Err(CodecError::UnsupportedSchema(2)));
        assert!(matches!(DurablePrefix::decode(&[0; 65]), Err(CodecError::TooLarge { .. })));
    }

    // schema 1, seq 10, entry [op 1, "tenant", "key", "\0binary"]; then crc32c LE (computed independently).
    const GOLDEN_LEGACY_ENTRY: &str = "010a010674656e616e74036b6579070062696e617279";
    const GOLDEN_LEGACY_ENTRY_FULL: &str = "010a010674656e616e74036b6579070062696e617279a875f8f1";

    #[test]
    fn legacy_entry_golden_bytes_and_rejections() {
        let e = entry(1, "tenant", "key", b"\0binary");
        let bytes = encode_legacy_entry(10, &e).unwrap();
        let body = &bytes[..bytes.len() - CHECKSUM_LEN];
        assert_eq!(hex(body), GOLDEN_LEGACY_ENTRY);
        assert_eq!(hex(&bytes), GOLDEN_LEGACY_ENTRY_FULL);
        assert_eq!(decode_legacy_entry(&bytes).unwrap(), (10, e.clone()));
        for cut in 0..bytes.len() {
            assert!(decode_legacy_entry(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(decode_legacy_entry(&b).is_err(), "flip at {i}");
        }
        let mut v2 = body.to_vec();
        v2[0] = 2;
        let crc = crc32c::crc32c(&v2);
        v2.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_legacy_entry(&v2), Err(CodecError::UnsupportedSchema(2)));
        assert!(encode_legacy_entry(0, &e).is_err());
        assert!(encode_legacy_entry(1, &entry(0, "", "", b"")).is_err());
        // An overlong seq varint under a valid checksum decodes but is not canonical.
        let mut long = vec![1u8, 0x8a, 0x00];
        long.extend_from_slice(&body[2..]);
        let crc = crc32c::crc32c(&long);
        long.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_legacy_entry(&long), Err(CodecError::NonCanonical));
    }

    #[test]
    fn legacy_keys_and_latest() {
        let k = OpLogKeys::new("c").unwrap();
        assert_eq!(k.legacy_entry(7), b"/oplog/c/00000000000000000007".to_vec());
        assert_eq!(k.legacy_latest(), b"/oplog/c/latest".to_vec());
        assert_eq!(k.parse_legacy_entry(&k.legacy_entry(42)), Some(42));
        for other in [k.legacy_latest(), k.durable_prefix(), k.producer_view(), k.batch(1)] {
            assert_eq!(k.parse_legacy_entry(&other), None);
            let (b, e) = k.legacy_entries_between(0, u64::MAX);
            assert!(!(other >= b && other < e), "{:?} inside the legacy range", String::from_utf8_lossy(&other));
        }
        let (b, e) = k.legacy_entries_between(3, 5);
        assert_eq!((b, e), (k.legacy_entry(4), k.legacy_entry(6)));
        let (b, e) = k.legacy_entries_between(5, 5);
        assert_eq!(b, e);
        let (_, e) = k.legacy_entries_between(0, u64::MAX);
        assert_eq!(e, b"/oplog/c/:".to_vec());
        assert_eq!(encode_legacy_latest(0), b"0".to_vec());
        assert_eq!(decode_legacy_latest(b"0"), Ok(0));
        assert_eq!(decode_legacy_latest(b"18446744073709551615"), Ok(u64::MAX));
        for bad in [&b""[..], b"-1", b"07", b"7x", b" 7", b"8.0", b"18446744073709551616", b"+7"] {
            assert!(decode_legacy_latest(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn producer_view_is_canonical_decimal() {
        assert_eq!(encode_producer_view(7), b"7".to_vec());
        assert_eq!(decode_producer_view(b"7"), Ok(7));
        assert_eq!(decode_producer_view(b"18446744073709551615"), Ok(u64::MAX));
        for bad in [&b""[..], b"0", b"-1", b"07", b"7x", b" 7", b"8.0", b"18446744073709551616", b"+7"] {
            assert!(decode_producer_view(bad).is_err(), "{bad:?}");
        }
    }
}
