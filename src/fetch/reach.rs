//! Which addresses a fetch may connect to ([`Reach`]), and the resolver every connection goes
//! through: a name is resolved here and the addresses out of reach are dropped before a
//! connection is tried, so the lookup that is checked is the one that is used (a name that
//! resolves elsewhere the second time, DNS rebinding, gains nothing).

use super::FetchError;
use futures::future::BoxFuture;
use hyper_util::client::legacy::connect::dns::Name;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::task::{Context, Poll};

/// Which addresses image URLs may lead to (`--image-fetch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Reach {
    /// None: an `http(s)` image URL is refused; images come as data URLs.
    Off,
    /// Public addresses only: not loopback, private, link-local (cloud metadata), shared
    /// (carrier-grade NAT), multicast, documentation or reserved ranges.
    #[default]
    Public,
    /// Any address, private networks and loopback included: for a trusted network.
    Any,
}

impl Reach {
    /// Whether a connection to `ip` is allowed.
    pub fn allows(self, ip: IpAddr) -> bool {
        match self {
            Self::Off => false,
            Self::Public => is_public(ip),
            Self::Any => true,
        }
    }

    /// The addresses `host` resolved to that are within reach; an error when none is.
    fn keep(self, host: &str, found: Vec<SocketAddr>) -> Result<Vec<SocketAddr>, FetchError> {
        let Some(&first) = found.first() else {
            return Err(FetchError::Resolve {
                host: host.to_string(),
                reason: "no address".into(),
            });
        };
        let kept: Vec<SocketAddr> = found.into_iter().filter(|a| self.allows(a.ip())).collect();
        if kept.is_empty() {
            return Err(FetchError::OutOfReach {
                host: host.to_string(),
                address: first.ip(),
            });
        }
        Ok(kept)
    }
}

/// Whether `ip` is a public address: one any host on the internet may reach.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_public_v4(ip),
        IpAddr::V6(ip) => is_public_v6(ip),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let special = a == 0 // "this network"
        || a == 10
        || a == 127
        || a >= 224 // multicast, reserved, broadcast
        || (a == 100 && (64..128).contains(&b)) // shared address space (carrier-grade NAT)
        || (a == 169 && b == 254) // link-local: cloud metadata services live here
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 168)
        || (a == 192 && b == 0 && (c == 0 || c == 2)) // protocol assignments, documentation
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || (a == 198 && b == 51 && c == 100)
        || (a == 203 && b == 0 && c == 113);
    !special
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if ip.is_unspecified() || ip.is_loopback() {
        return false;
    }
    if let Some(v4) = embedded_v4(ip) {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    let special = (s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] & 0xff00) == 0xff00 // multicast
        || (s[0] == 0x2001 && s[1] < 0x0200) // protocol assignments, Teredo included
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x3fff && s[1] < 0x1000) // documentation
        || (s[0] == 0x0100 && s[1..4] == [0, 0, 0]) // discard-only
        || (s[0] == 0x0064 && s[1] == 0xff9b && s[2] == 0x0001); // local-use NAT64
    !special
}

/// The IPv4 address an IPv6 one carries and is routed to: mapped (`::ffff:a.b.c.d`),
/// compatible (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:aabb:ccdd::`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0; 6] || (s[0] == 0x0064 && s[1] == 0xff9b && s[2..6] == [0; 4]) {
        return Some(low());
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

/// The resolver of the fetch client: the system's, with the addresses out of reach dropped.
#[derive(Debug, Clone, Copy)]
pub(super) struct GuardedResolver {
    pub reach: Reach,
}

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = FetchError;
    type Future = BoxFuture<'static, Result<Self::Response, FetchError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), FetchError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let reach = self.reach;
        Box::pin(async move {
            let host = name.as_str();
            let found =
                tokio::net::lookup_host((host, 0))
                    .await
                    .map_err(|e| FetchError::Resolve {
                        host: host.to_string(),
                        reason: e.to_string(),
                    })?;
            Ok(reach.keep(host, found.collect())?.into_iter())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_addresses_are_told_from_the_rest() {
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "100.128.0.1",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
        for special in [
            "0.0.0.0",
            "10.1.2.3",
            "127.0.0.1",
            "100.64.0.1",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "192.0.2.1",
            "198.18.0.1",
            "203.0.113.9",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::127.0.0.1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
            "64:ff9b:1::1",
            "2002:a00:1::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "2001::1",
            "100::1",
        ] {
            assert!(!is_public(special.parse().unwrap()), "{special}");
        }
    }

    #[test]
    fn a_name_out_of_reach_is_refused_and_a_mixed_one_keeps_its_public_addresses() {
        let at = |ip: &str| SocketAddr::new(ip.parse().unwrap(), 0);
        let error = Reach::Public
            .keep("intranet", vec![at("10.0.0.7")])
            .unwrap_err();
        assert!(error.to_string().contains("10.0.0.7"), "{error}");
        let kept = Reach::Public
            .keep("mixed", vec![at("127.0.0.1"), at("8.8.4.4")])
            .unwrap();
        assert_eq!(kept, vec![at("8.8.4.4")]);
        assert_eq!(
            Reach::Any.keep("lo", vec![at("127.0.0.1")]).unwrap().len(),
            1
        );
    }

    #[tokio::test]
    async fn the_resolver_drops_loopback_unless_any_address_is_allowed() {
        use tower_service::Service;
        let name: Name = "localhost".parse().unwrap();
        let refused = GuardedResolver {
            reach: Reach::Public,
        }
        .call(name.clone())
        .await
        .unwrap_err();
        assert!(
            matches!(refused, FetchError::OutOfReach { .. }),
            "{refused}"
        );
        let found = GuardedResolver { reach: Reach::Any }
            .call(name)
            .await
            .unwrap();
        assert!(found.into_iter().all(|a| a.ip().is_loopback()));
    }
}
