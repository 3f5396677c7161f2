//! A node that cannot listen on its address says why, typed: callers that picked the port themselves (the Python
//! package's stores) pick another on `AddrInUse`, which a refusal in words would hide.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::ClientError;
use crescent_node::{NodeConfig, StorageNode};
use crescent_proto::ErrorCode;

#[tokio::test]
async fn a_port_in_use_is_a_listen_error_of_kind_addr_in_use() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap();
    // No master is reached: the bind comes first.
    let mut config = NodeConfig::new("127.0.0.1:1".to_owned(), 1 << 20);
    config.prefault = crescent_node::Prefault::Off;
    config.listen = addr;
    let Err(e) = StorageNode::start(config).await else { panic!("a node started on a port in use") };
    match &e {
        ClientError::Listen { addr: tried, source } => {
            assert_eq!(*tried, addr);
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        }
        other => panic!("not a listen error: {other:?}"),
    }
    assert_eq!(e.code(), ErrorCode::InternalError);
    assert!(e.to_string().starts_with(&format!("cannot listen on {addr}: ")), "{e}");
}
