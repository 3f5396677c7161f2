//! TLS material for tests: a cluster CA and one certificate for 127.0.0.1 and localhost (`crescent certs`'s).

use crescent_net::tls::{Tls, TlsFiles};
use std::path::PathBuf;

/// A test cluster's TLS: its files (in a directory removed when this is dropped) and both sides loaded, the
/// servers requiring client certificates.
pub struct TestTls {
    /// The directory holding the files.
    pub dir: PathBuf,
    /// `cert`, `key`, `ca` and `client_ca` (the same CA).
    pub files: TlsFiles,
    /// The files loaded: server side (client certificates required) and client side (presenting the certificate).
    pub tls: Tls,
}

impl Drop for TestTls {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Fresh material (a new CA each call: two calls make two clusters that do not trust each other).
pub fn tls() -> TestTls {
    let dir = std::env::temp_dir().join(format!("crescent-tls-{}", crescent_proto::ClientId::random()));
    let names = ["127.0.0.1".to_owned(), "localhost".to_owned()];
    let f = crescent_net::tls::certgen::write(&dir, &names).unwrap_or_else(|e| panic!("writing TLS material: {e}"));
    let files = TlsFiles {
        cert: Some(f.cert),
        key: Some(f.key),
        ca: Some(f.ca.clone()),
        client_ca: Some(f.ca),
        server_name: None,
    };
    let tls = Tls::load(&files).unwrap_or_else(|e| panic!("loading TLS material: {e}"));
    TestTls { dir, files, tls }
}
