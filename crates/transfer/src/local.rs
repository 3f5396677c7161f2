//! Local lanes: the data plane between a client and a storage node on the same host, over a Unix socket.
//!
//! Over loopback TCP every payload byte pays for the TCP stack on both sides; a Unix stream socket carries the
//! same frames with a plain copy in and out of the kernel (measured on the 2-vCPU VM, one 1 MiB message at a
//! time: ~6 GB/s against ~2 GB/s over loopback TCP). A storage node listens on an abstract Unix socket named
//! after the endpoint it advertises; a client dialling that endpoint tries the name first and, if nothing
//! answers it (another host, or a node without local lanes), dials TCP. Abstract names live in the network
//! namespace, as the TCP endpoint does, so a name that answers is the node that endpoint reaches, and it
//! vanishes with its process (no stale file to clean up). The connection then says hello exactly as over TCP:
//! with a cluster secret the node and the client prove themselves to each other, and every transfer needs its
//! grant. No TLS: there is no network to protect, so a node serving TLS (whose clients may authenticate by
//! certificate alone) does not offer local lanes.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use tokio::net::{UnixListener, UnixStream};

/// The abstract socket name of the local lanes of a node advertising `endpoint`.
fn name(endpoint: &str) -> String {
    format!("crescent-data:{endpoint}")
}

/// The address of the local lanes of a node advertising `endpoint` (for tools and tests that dial them raw).
pub fn local_lane_address(endpoint: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(name(endpoint))
}

/// Listens for local lanes of a node advertising `endpoint` (in use: another live process on this host
/// advertises the same endpoint, or this one already listens).
pub(crate) fn bind(endpoint: &str) -> io::Result<UnixListener> {
    let listener = std::os::unix::net::UnixListener::bind_addr(&local_lane_address(endpoint)?)?;
    listener.set_nonblocking(true)?;
    UnixListener::from_std(listener)
}

/// Sizes an accepted or dialled local lane's socket buffers: a Unix stream sender may have at most its send
/// buffer in flight (the default, ~208 KiB, would take a 2 MiB stripe through ten wake-ups of the reader).
pub(crate) fn size_buffers(sock: &impl std::os::fd::AsFd) -> io::Result<()> {
    rustix::net::sockopt::set_socket_send_buffer_size(sock, crate::net::SOCKET_BUFFER as usize)?;
    rustix::net::sockopt::set_socket_recv_buffer_size(sock, crate::net::SOCKET_BUFFER as usize)?;
    Ok(())
}

/// A local lane to the node advertising `endpoint`, or `None` when no node on this host listens under that
/// name. Never waits: a listener whose backlog is full counts as absent for this lane (it goes over TCP).
pub(crate) fn connect(endpoint: &str) -> io::Result<Option<UnixStream>> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let Ok(name) = SocketAddrUnix::new_abstract_name(name(endpoint).as_bytes()) else {
        return Ok(None);
    };
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    match rustix::net::connect(&fd, &name) {
        Ok(()) => {}
        Err(rustix::io::Errno::CONNREFUSED | rustix::io::Errno::NOENT | rustix::io::Errno::AGAIN) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    size_buffers(&fd)?;
    UnixStream::from_std(std::os::unix::net::UnixStream::from(fd)).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_answers_only_while_its_listener_lives() {
        let endpoint = format!("127.0.0.1:{}", std::process::id());
        assert!(connect(&endpoint).unwrap().is_none(), "nothing listens yet");
        let listener = bind(&endpoint).unwrap();
        assert!(bind(&endpoint).is_err(), "one listener per endpoint on a host");
        let lane = connect(&endpoint).unwrap().expect("the listener answers");
        let (_, _) = listener.accept().await.unwrap();
        drop(lane);
        drop(listener);
        assert!(connect(&endpoint).unwrap().is_none(), "gone with its listener");
        assert!(connect("127.0.0.2:1").unwrap().is_none(), "another endpoint's name is another socket");
    }
}
