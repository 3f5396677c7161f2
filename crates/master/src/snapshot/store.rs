//! Where snapshots are kept: the [`SnapshotStore`] seam (whole objects by key: put, get, list, delete) and its
//! two implementations, a local directory ([`LocalDirStore`]) and S3 (`S3Store`, feature `s3`, on the
//! `object_store` crate). The store knows nothing of the snapshot format or of the publish protocol
//! ([`super::catalog`]); keys are `/`-separated names of `[A-Za-z0-9._-]` parts, never `.` or `..`.

use bytes::Bytes;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

/// A boxed future as the store's methods return them (boxed so `Arc<dyn SnapshotStore>` works).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The key is not a store key (empty part, `.`/`..`, a character outside `[A-Za-z0-9._-]`).
    #[error("invalid snapshot store key {0:?}")]
    InvalidKey(String),
    /// The store could not be read or written.
    #[error("snapshot store I/O: {0}")]
    Io(String),
    /// The store is misconfigured (bad URL, missing bucket).
    #[error("snapshot store configuration: {0}")]
    Config(String),
}

/// Whole-object storage for snapshots. Implementations must make a `put` visible to later `get`s in full or not
/// at all (a reader never sees half an object).
pub trait SnapshotStore: Send + Sync + 'static {
    /// Stores `bytes` at `key`, replacing what was there.
    fn put<'a>(&'a self, key: &'a str, bytes: Bytes) -> StoreFuture<'a, ()>;
    /// The object at `key`, or `None`.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Bytes>>;
    /// Every key starting with `prefix`, in no particular order.
    fn list<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Vec<String>>;
    /// Deletes `key`; an absent key is not an error.
    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ()>;
    /// Up to `len` bytes of the object at `key` from `offset` (fewer at its end, none past it), or `None` when
    /// there is no object: how a leader sends a snapshot to a standby piece by piece. The default reads the
    /// whole object; the stores read only the range.
    fn get_range<'a>(&'a self, key: &'a str, offset: u64, len: usize) -> StoreFuture<'a, Option<Bytes>> {
        Box::pin(async move {
            let Some(all) = self.get(key).await? else { return Ok(None) };
            let start = usize::try_from(offset).unwrap_or(usize::MAX).min(all.len());
            Ok(Some(all.slice(start..start.saturating_add(len).min(all.len()))))
        })
    }
    /// Where the store is, for logs.
    fn describe(&self) -> String;
}

/// Checks a store key (see the module doc).
pub fn check_key(key: &str) -> Result<(), StoreError> {
    let ok = !key.is_empty()
        && key.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        });
    if ok { Ok(()) } else { Err(StoreError::InvalidKey(key.to_owned())) }
}

fn io(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io(format!("{what} {}: {e}", path.display()))
}

/// Suffix of a file being written (never listed; a crash leaves it behind, the next put of its key replaces it).
const TMP_SUFFIX: &str = ".tmp-write";

/// A snapshot store in a local directory: key `a/b` is the file `DIR/a/b`. A put writes a temporary file,
/// syncs it, renames it over the key and syncs the directory, so a crash leaves the old object or the new one.
#[derive(Debug, Clone)]
pub struct LocalDirStore {
    root: PathBuf,
}

impl LocalDirStore {
    /// A store rooted at `root` (created if absent).
    pub fn new(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(|e| io("create", &root, e))?;
        Ok(Self { root })
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        check_key(key)?;
        Ok(self.root.join(key))
    }

    async fn blocking<T: Send + 'static>(
        f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        tokio::task::spawn_blocking(f).await.map_err(|e| StoreError::Io(format!("blocking task: {e}")))?
    }
}

fn put_file(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    use std::io::Write;
    let dir = path.parent().ok_or_else(|| StoreError::InvalidKey(path.display().to_string()))?;
    std::fs::create_dir_all(dir).map_err(|e| io("create", dir, e))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(TMP_SUFFIX);
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp).map_err(|e| io("create", &tmp, e))?;
    f.write_all(bytes).map_err(|e| io("write", &tmp, e))?;
    f.sync_all().map_err(|e| io("sync", &tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| io("rename", path, e))?;
    // The rename is durable only once the directory is.
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("sync", dir, e))
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("list", dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io("list", dir, e))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| io("stat", &path, e))?;
        if kind.is_dir() {
            walk(root, &path, out)?;
        } else if kind.is_file() {
            let Ok(rel) = path.strip_prefix(root) else { continue };
            let key = rel.to_string_lossy().replace(std::path::MAIN_SEPARATOR, "/");
            if !key.ends_with(TMP_SUFFIX) && check_key(&key).is_ok() {
                out.push(key);
            }
        }
    }
    Ok(())
}

impl SnapshotStore for LocalDirStore {
    fn put<'a>(&'a self, key: &'a str, bytes: Bytes) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let path = self.path(key)?;
            Self::blocking(move || put_file(&path, &bytes)).await
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Bytes>> {
        Box::pin(async move {
            let path = self.path(key)?;
            Self::blocking(move || match std::fs::read(&path) {
                Ok(b) => Ok(Some(Bytes::from(b))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(io("read", &path, e)),
            })
            .await
        })
    }

    fn get_range<'a>(&'a self, key: &'a str, offset: u64, len: usize) -> StoreFuture<'a, Option<Bytes>> {
        Box::pin(async move {
            let path = self.path(key)?;
            Self::blocking(move || {
                use std::io::{Read, Seek, SeekFrom};
                let mut f = match std::fs::File::open(&path) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(io("open", &path, e)),
                };
                f.seek(SeekFrom::Start(offset)).map_err(|e| io("seek", &path, e))?;
                let mut out = Vec::with_capacity(len.min(64 << 20));
                f.take(len as u64).read_to_end(&mut out).map_err(|e| io("read", &path, e))?;
                Ok(Some(Bytes::from(out)))
            })
            .await
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Vec<String>> {
        Box::pin(async move {
            let root = self.root.clone();
            let prefix = prefix.to_owned();
            Self::blocking(move || {
                let mut out = Vec::new();
                walk(&root, &root, &mut out)?;
                out.retain(|k| k.starts_with(&prefix));
                Ok(out)
            })
            .await
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let path = self.path(key)?;
            Self::blocking(move || match std::fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io("delete", &path, e)),
            })
            .await
        })
    }

    fn describe(&self) -> String {
        format!("dir:{}", self.root.display())
    }
}

#[cfg(feature = "s3")]
pub use s3::{S3Options, S3Store};

#[cfg(feature = "s3")]
mod s3 {
    use super::{SnapshotStore, StoreError, StoreFuture, check_key};
    use bytes::Bytes;
    use futures_util::StreamExt;
    use object_store::aws::{AmazonS3, AmazonS3Builder};
    use object_store::path::Path as ObjectPath;
    use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

    /// How to reach an S3 bucket. Unset fields come from the usual AWS environment variables
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`, `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, ...).
    #[derive(Debug, Clone, Default)]
    pub struct S3Options {
        /// `s3://bucket[/prefix]`.
        pub url: String,
        /// An S3-compatible endpoint (`http://127.0.0.1:9000`); `None`: AWS, or `AWS_ENDPOINT`.
        pub endpoint: Option<String>,
        /// Access key id.
        pub access_key_id: Option<String>,
        /// Secret access key.
        pub secret_access_key: Option<String>,
        /// Region.
        pub region: Option<String>,
    }

    /// A snapshot store in an S3 bucket under a prefix (one PUT per object: S3 makes it visible whole).
    #[derive(Debug)]
    pub struct S3Store {
        s3: AmazonS3,
        bucket: String,
        prefix: String,
    }

    fn s3_err(e: object_store::Error) -> StoreError {
        StoreError::Io(e.to_string())
    }

    impl S3Store {
        /// Connects (lazily: nothing is sent until the first call).
        pub fn new(o: &S3Options) -> Result<Self, StoreError> {
            let rest = o
                .url
                .strip_prefix("s3://")
                .ok_or_else(|| StoreError::Config(format!("{:?} is not an s3://bucket[/prefix] URL", o.url)))?;
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let prefix = prefix.trim_matches('/');
            if bucket.is_empty() || (!prefix.is_empty() && check_key(prefix).is_err()) {
                return Err(StoreError::Config(format!("{:?}: bad bucket or prefix", o.url)));
            }
            let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
            if let Some(e) = &o.endpoint {
                // An S3-compatible server on its own address: path-style requests, plain HTTP allowed.
                b = b
                    .with_endpoint(e)
                    .with_allow_http(e.starts_with("http://"))
                    .with_virtual_hosted_style_request(false);
            }
            if let Some(k) = &o.access_key_id {
                b = b.with_access_key_id(k);
            }
            if let Some(k) = &o.secret_access_key {
                b = b.with_secret_access_key(k);
            }
            if let Some(r) = &o.region {
                b = b.with_region(r);
            }
            let s3 = b.build().map_err(|e| StoreError::Config(e.to_string()))?;
            Ok(Self { s3, bucket: bucket.to_owned(), prefix: prefix.to_owned() })
        }

        fn path(&self, key: &str) -> Result<ObjectPath, StoreError> {
            check_key(key)?;
            let full = if self.prefix.is_empty() { key.to_owned() } else { format!("{}/{key}", self.prefix) };
            ObjectPath::parse(&full).map_err(|e| StoreError::InvalidKey(e.to_string()))
        }
    }

    impl SnapshotStore for S3Store {
        fn put<'a>(&'a self, key: &'a str, bytes: Bytes) -> StoreFuture<'a, ()> {
            Box::pin(async move {
                let path = self.path(key)?;
                self.s3.put(&path, PutPayload::from(bytes)).await.map_err(s3_err)?;
                Ok(())
            })
        }

        fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Bytes>> {
            Box::pin(async move {
                let path = self.path(key)?;
                match self.s3.get(&path).await {
                    Ok(r) => Ok(Some(r.bytes().await.map_err(s3_err)?)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(s3_err(e)),
                }
            })
        }

        fn get_range<'a>(&'a self, key: &'a str, offset: u64, len: usize) -> StoreFuture<'a, Option<Bytes>> {
            Box::pin(async move {
                let path = self.path(key)?;
                let size = match self.s3.head(&path).await {
                    Ok(meta) => meta.size,
                    Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(s3_err(e)),
                };
                let (start, end) = (offset.min(size), offset.saturating_add(len as u64).min(size));
                if start == end {
                    return Ok(Some(Bytes::new()));
                }
                match self.s3.get_range(&path, start..end).await {
                    Ok(b) => Ok(Some(b)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(s3_err(e)),
                }
            })
        }

        fn list<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Vec<String>> {
            Box::pin(async move {
                // List the whole store prefix and filter: object_store lists by path segments, not by string
                // prefixes, and snapshot stores hold few objects.
                let root = if self.prefix.is_empty() { None } else { Some(ObjectPath::from(self.prefix.as_str())) };
                let mut stream = self.s3.list(root.as_ref());
                let mut out = Vec::new();
                while let Some(meta) = stream.next().await {
                    let meta = meta.map_err(s3_err)?;
                    let full = meta.location.to_string();
                    let key = if self.prefix.is_empty() {
                        full.as_str()
                    } else {
                        match full.strip_prefix(self.prefix.as_str()).and_then(|k| k.strip_prefix('/')) {
                            Some(k) => k,
                            None => continue,
                        }
                    };
                    if key.starts_with(prefix) {
                        out.push(key.to_owned());
                    }
                }
                Ok(out)
            })
        }

        fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ()> {
            Box::pin(async move {
                let path = self.path(key)?;
                match self.s3.delete(&path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(s3_err(e)),
                }
            })
        }

        fn describe(&self) -> String {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }
}
