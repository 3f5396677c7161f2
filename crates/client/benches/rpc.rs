//! Master RPC round trips over loopback TCP (server and client in this process): ExistKey at concurrency 1
//! and batch exists of 128 keys. `cargo bench -p crescent-client --bench rpc`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use crescent_client::master::MasterConnection;
use crescent_master::server::MasterServer;
use crescent_master::service::MasterConfig;
use crescent_proto::wire::{Batch, PeerRole, WireKey};
use crescent_proto::{ClientId, MasterRequest};
use std::time::{Duration, Instant};

fn main() {
    let rt = if std::env::var("RPC_BENCH_CURRENT").is_ok() {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
    };
    rt.block_on(async {
        // Client and server share this runtime: a server connection polling for the next request would hold the
        // very thread the client needs to send it (see `crescent_net::poll`), so the server parks at once.
        let master = MasterServer::builder(MasterConfig::default()).poll_window(Duration::ZERO).start().await.unwrap();
        {
            // Baseline: a bare framed echo over loopback with the same codec.
            use crescent_proto::wire::{Frame, FrameCodec, Limits};
            use futures_util::{SinkExt, StreamExt};
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let a = l.local_addr().unwrap();
            tokio::spawn(async move {
                let (s, _) = l.accept().await.unwrap();
                s.set_nodelay(true).unwrap();
                let mut f = tokio_util::codec::Framed::new(s, FrameCodec::new(Limits::CONTROL));
                while let Some(Ok(x)) = f.next().await {
                    f.send(x).await.unwrap();
                }
            });
            let s = tokio::net::TcpStream::connect(a).await.unwrap();
            s.set_nodelay(true).unwrap();
            let mut f = tokio_util::codec::Framed::new(s, FrameCodec::new(Limits::CONTROL));
            let n = 20_000;
            let t = Instant::now();
            for i in 0..n {
                f.send(Frame::encode(i + 1, &"ping", bytes::Bytes::new()).unwrap()).await.unwrap();
                f.next().await.unwrap().unwrap();
            }
            println!("bare framed echo c=1: {:.0} round trips/s", n as f64 / t.elapsed().as_secs_f64());
        }
        let addr = master.rpc_addr().to_string();
        let conn = MasterConnection::new(&addr, ClientId::random(), PeerRole::Client, 1, Duration::from_secs(10));
        let one = MasterRequest::ExistKey { tenant: String::new(), key: WireKey::from("some-key-0000000001") };
        for _ in 0..1000 {
            conn.call(&one).await.unwrap();
        }
        let n = 20_000;
        let mut lat = Vec::with_capacity(n);
        let t = Instant::now();
        for _ in 0..n {
            let s = Instant::now();
            conn.call(&one).await.unwrap();
            lat.push(s.elapsed().as_micros() as u64);
        }
        let secs = t.elapsed().as_secs_f64();
        lat.sort_unstable();
        println!("exist_key c=1: {:.0} calls/s p50={}us p99={}us", n as f64 / secs, lat[n / 2], lat[n * 99 / 100]);
        let keys = Batch((0..128).map(|i| WireKey::Key(format!("some-key-{i:010}"))).collect());
        let batch = MasterRequest::BatchExistKey { tenant: String::new(), keys };
        let n = 5_000;
        let t = Instant::now();
        for _ in 0..n {
            conn.call(&batch).await.unwrap();
        }
        let secs = t.elapsed().as_secs_f64();
        println!("batch_exist_key(128) c=1: {:.0} keys/s", (n * 128) as f64 / secs);
    });
}
