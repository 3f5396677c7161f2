//! Crescent's generic HA machinery, free of master business types: the KV seam ([`kv`]: etcd, embedded redb,
//! in-memory, fault injection) and the batch oplog ([`oplog`]: codecs and `OpLogBatchStorage`).

pub mod kv;
pub mod oplog;

#[cfg(feature = "testing")]
pub mod testing;
