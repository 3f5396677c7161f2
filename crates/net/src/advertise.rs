//! The address a server tells others to reach it at. A server listening on an unspecified address
//! (`0.0.0.0`, `::`) cannot advertise that: no other host can connect to it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};

/// The address to advertise for a server bound to `bound`: `advertise` when given (an IP or a host name,
/// resolved once), else `bound` itself unless its IP is unspecified, else this host's primary address
/// ([`primary_ip`]), with `bound`'s port.
pub fn advertised(bound: SocketAddr, advertise: Option<&str>) -> std::io::Result<SocketAddr> {
    let ip = match advertise {
        Some(host) => resolve(host)?,
        None if bound.ip().is_unspecified() => primary_ip(bound.is_ipv6()),
        None => bound.ip(),
    };
    Ok(SocketAddr::new(ip, bound.port()))
}

/// `host` as an IP: itself when it is one, else its first resolved address.
fn resolve(host: &str) -> std::io::Result<IpAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ip);
    }
    (host, 0).to_socket_addrs()?.map(|a| a.ip()).next().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, format!("advertised host {host:?} has no address"))
    })
}

/// This host's primary address: the source address the kernel picks for a route to a public address (a UDP
/// `connect` only chooses the route; nothing is sent), else the first non-loopback address the host name
/// resolves to, else loopback.
pub fn primary_ip(v6: bool) -> IpAddr {
    let (any, public): (IpAddr, SocketAddr) = if v6 {
        (
            Ipv6Addr::UNSPECIFIED.into(),
            SocketAddr::from((Ipv6Addr::new(0x2001, 0x4860, 0x4860, 0, 0, 0, 0, 0x8888), 53)),
        )
    } else {
        (Ipv4Addr::UNSPECIFIED.into(), SocketAddr::from(([8, 8, 8, 8], 53)))
    };
    let routed = UdpSocket::bind((any, 0))
        .and_then(|s| s.connect(public).and_then(|()| s.local_addr()))
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified() && !ip.is_loopback());
    routed.or_else(|| host_name_ip(v6)).unwrap_or(if v6 {
        Ipv6Addr::LOCALHOST.into()
    } else {
        Ipv4Addr::LOCALHOST.into()
    })
}

/// The first non-loopback address of the right family this host's name resolves to.
fn host_name_ip(v6: bool) -> Option<IpAddr> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    (name.trim(), 0)
        .to_socket_addrs()
        .ok()?
        .map(|a| a.ip())
        .find(|ip| ip.is_ipv6() == v6 && !ip.is_loopback() && !ip.is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_concrete_or_given_address_is_kept_and_an_unspecified_one_replaced() {
        let bound: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        assert_eq!(advertised(bound, None).ok(), Some(bound));
        let any: SocketAddr = "0.0.0.0:7000".parse().unwrap();
        let a = advertised(any, None).ok();
        assert!(a.is_some_and(|a| !a.ip().is_unspecified() && a.port() == 7000), "{a:?}");
        assert_eq!(advertised(any, Some("10.1.2.3")).ok(), "10.1.2.3:7000".parse().ok());
        assert_eq!(advertised(any, Some("localhost")).ok().map(|a| a.ip().is_loopback()), Some(true));
    }
}
