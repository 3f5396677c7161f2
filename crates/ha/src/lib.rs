//! Crescent's generic HA machinery, free of master business types: the KV seam ([`kv`]: etcd, embedded redb,
//! in-memory, fault injection) and the oplog ([`oplog`]: codecs, `OpLogBatchStorage` with the legacy layout and
//! the cutover, the ordered writer and its metrics, the applier seam, and the standby reader and follower).

pub mod kv;
pub mod leader;
pub mod oplog;

#[cfg(feature = "testing")]
pub mod testing;
