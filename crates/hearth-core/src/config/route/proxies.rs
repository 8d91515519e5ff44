//! `[route] trusted_proxies`: the addresses of a fleet's balancers, as single IPs or CIDR
//! blocks (`"10.0.0.5"`, `"10.1.0.0/16"`, `"fd00::/8"`). A balancer carries everyone's traffic,
//! so the bounds a single client address gets (its share of request bodies, the deadline for a
//! silent connection, being closed to make room) would make it everyone's bounds.

use std::fmt;
use std::net::IpAddr;

/// A network: an address and how many of its leading bits count.
/// Why a text is not an address or a CIDR block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CidrError {
    NotAnAddress(String),
    Prefix {
        text: String,
        bits: u8,
    },
    HostBits {
        text: String,
        network: IpAddr,
        prefix: u8,
    },
}

impl std::fmt::Display for CidrError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CidrError::NotAnAddress(s) => {
                write!(f, "{s:?} is not an IP address or a CIDR block (IP/PREFIX)")
            }
            CidrError::Prefix { text, bits } => {
                write!(f, "{text:?}: the prefix must be a number from 0 to {bits}")
            }
            CidrError::HostBits {
                text,
                network,
                prefix,
            } => write!(
                f,
                "{text:?} has bits set past its /{prefix} prefix; the block is {network}/{prefix}"
            ),
        }
    }
}

impl std::error::Error for CidrError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `IP` or `IP/PREFIX`; the bits past the prefix must be zero (`10.1.0.0/16`, not
    /// `10.1.2.3/16`, which would say less than it seems to).
    pub fn parse(s: &str) -> Result<Cidr, CidrError> {
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = ip
            .parse()
            .map_err(|_| CidrError::NotAnAddress(s.to_string()))?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= bits => n,
                _ => {
                    return Err(CidrError::Prefix {
                        text: s.to_string(),
                        bits,
                    })
                }
            },
        };
        let cidr = Cidr { addr, prefix };
        if cidr.network() != addr {
            return Err(CidrError::HostBits {
                text: s.to_string(),
                network: cidr.network(),
                prefix,
            });
        }
        Ok(cidr)
    }

    fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => IpAddr::V4((u32::from(a) & mask32(self.prefix)).into()),
            IpAddr::V6(a) => IpAddr::V6((u128::from(a) & mask128(self.prefix)).into()),
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                u32::from(ip) & mask32(self.prefix) == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                u128::from(ip) & mask128(self.prefix) == u128::from(net)
            }
            _ => false,
        }
    }
}

fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Every trusted network; empty by default (no address is trusted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(pub Vec<Cidr>);

impl TrustedProxies {
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_and_blocks_match_what_they_cover() {
        let t = TrustedProxies(
            ["10.1.0.0/16", "192.0.2.7", "fd00::/8"]
                .iter()
                .map(|s| Cidr::parse(s).unwrap())
                .collect(),
        );
        assert!(t.contains(ip("10.1.255.3")));
        assert!(!t.contains(ip("10.2.0.1")));
        assert!(t.contains(ip("192.0.2.7")));
        assert!(!t.contains(ip("192.0.2.8")));
        assert!(t.contains(ip("fd12::1")));
        assert!(!t.contains(ip("fe80::1")));
        // An IPv4 client of a dual-stack listener arrives as ::ffff:a.b.c.d.
        assert!(t.contains(ip("::ffff:10.1.0.9")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        assert!(!Cidr::parse("0.0.0.0/0").unwrap().contains(ip("::1")));
        assert!(Cidr::parse("::/0").unwrap().contains(ip("::1")));
        assert!(!TrustedProxies::default().contains(ip("127.0.0.1")));
    }

    #[test]
    fn what_is_not_a_network_is_refused_saying_why() {
        for (bad, says) in [
            ("10.1.2.3/16", "10.1.0.0/16"),
            ("10.0.0.0/33", "0 to 32"),
            ("::/129", "0 to 128"),
            ("10.0.0.0/", "prefix"),
            ("10.0.0/8", "not an IP"),
            ("example.com", "not an IP"),
            ("", "not an IP"),
        ] {
            let e = Cidr::parse(bad).unwrap_err();
            assert!(e.to_string().contains(says), "{bad:?}: {e}");
        }
        assert_eq!(
            Cidr::parse("2001:db8::/32").unwrap().to_string(),
            "2001:db8::/32"
        );
    }
}
