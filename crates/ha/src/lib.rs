//! Generic HA machinery, free of Crescent business types.
//!
//! This crate will own (see `docs/architecture.md` and the oplog RFC): `kv` — the `HaKvBackend` trait (get, put,
//! range, txn with value compare / key-absent) with an etcd and an embedded implementation; `oplog` — batch
//! record and durable-prefix codecs, `OpLogBatchStorage`, the `OrderedOpLogWriter` and batch reader; `leader` —
//! `LeaderCoordinator` (etcd lease + create-if-absent view key, and a single-node coordinator for embedded mode).
//! Nothing is implemented yet; the master's metadata layer is being shaped so Reserve/Commit slot in later.
