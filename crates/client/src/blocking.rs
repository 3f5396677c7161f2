//! A blocking facade over [`Client`] for callers without an async runtime (scripts, bindings).

use crate::client::{Client, ClientConfig};
use crate::error::ClientError;
use crescent_proto::{ObjectStat, ReplicateConfig};

/// A blocking client: owns a small tokio runtime and runs each call to completion on it.
pub struct BlockingClient {
    rt: tokio::runtime::Runtime,
    client: Client,
}

impl std::fmt::Debug for BlockingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingClient").field("client", &self.client).finish()
    }
}

impl BlockingClient {
    /// A client for `config` with its own single-threaded runtime: each call is driven on the calling thread
    /// (threads calling at once take turns driving the sockets), so a reply never waits for another thread to
    /// be woken.
    pub fn new(config: ClientConfig) -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        Ok(Self { rt, client: Client::new(config) })
    }

    /// The async client inside.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// See [`Client::put`].
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), ClientError> {
        self.rt.block_on(self.client.put(key, value))
    }

    /// See [`Client::put_from`].
    pub fn put_from(&self, key: &str, value: &[u8], cfg: &ReplicateConfig) -> Result<(), ClientError> {
        self.rt.block_on(self.client.put_from(key, value, cfg))
    }

    /// See [`Client::put_bytes`].
    pub fn put_bytes(&self, key: &str, value: bytes::Bytes, cfg: &ReplicateConfig) -> Result<(), ClientError> {
        self.rt.block_on(self.client.put_bytes(key, value, cfg))
    }

    /// See [`Client::batch_put_from`].
    pub fn batch_put_from(&self, items: &[(&str, &[u8])], cfg: &ReplicateConfig) -> Vec<Result<(), ClientError>> {
        self.rt.block_on(self.client.batch_put_from(items, cfg))
    }

    /// See [`Client::get`].
    pub fn get(&self, key: &str) -> Result<Vec<u8>, ClientError> {
        self.rt.block_on(self.client.get(key))
    }

    /// See [`Client::get_into`].
    pub fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<usize, ClientError> {
        self.rt.block_on(self.client.get_into(key, buf))
    }

    /// See [`Client::batch_get_into`].
    pub fn batch_get_into(&self, items: &mut [(&str, &mut [u8])]) -> Vec<Result<usize, ClientError>> {
        self.rt.block_on(self.client.batch_get_into(items))
    }

    /// See [`Client::is_exist`].
    pub fn is_exist(&self, key: &str) -> Result<bool, ClientError> {
        self.rt.block_on(self.client.is_exist(key))
    }

    /// See [`Client::batch_is_exist`].
    pub fn batch_is_exist(&self, keys: &[&str]) -> Vec<Result<bool, ClientError>> {
        self.rt.block_on(self.client.batch_is_exist(keys))
    }

    /// See [`Client::get_size`].
    pub fn get_size(&self, key: &str) -> Result<u64, ClientError> {
        self.rt.block_on(self.client.get_size(key))
    }

    /// See [`Client::stat`].
    pub fn stat(&self, key: &str) -> Result<ObjectStat, ClientError> {
        self.rt.block_on(self.client.stat(key))
    }

    /// See [`Client::remove`].
    pub fn remove(&self, key: &str, force: bool) -> Result<(), ClientError> {
        self.rt.block_on(self.client.remove(key, force))
    }

    /// See [`Client::batch_remove`].
    pub fn batch_remove(&self, keys: &[&str], force: bool) -> Vec<Result<(), ClientError>> {
        self.rt.block_on(self.client.batch_remove(keys, force))
    }

    /// See [`Client::batch_replica_clear`].
    pub fn batch_replica_clear(&self, keys: &[&str], segment: &str) -> Result<Vec<String>, ClientError> {
        self.rt.block_on(self.client.batch_replica_clear(keys, segment))
    }

    /// See [`Client::remove_all`].
    pub fn remove_all(&self, force: bool) -> Result<u64, ClientError> {
        self.rt.block_on(self.client.remove_all(force))
    }

    /// See [`Client::list_keys`].
    pub fn list_keys(&self, prefix: &str, limit: u32) -> Result<Vec<String>, ClientError> {
        self.rt.block_on(self.client.list_keys(prefix, limit))
    }

    /// See [`Client::list_keys_page`].
    pub fn list_keys_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<crescent_proto::KeyPage, ClientError> {
        self.rt.block_on(self.client.list_keys_page(prefix, after, limit))
    }
}
