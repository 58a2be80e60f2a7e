//! Network-interface diagnostics for multi-node jobs: this host's interfaces, and the sentences that explain a
//! rendezvous or Gloo connection set-up that cannot work (a MASTER_ADDR that is not rank 0's, a GLOO_SOCKET_IFNAME
//! that is missing, down or without an address, the address Gloo bound to when connecting failed).
//!
//! Kept apart from [`crate::group`], which only calls these: nothing here touches c10d. The public items are
//! re-exported from `group` (their path for other crates and the tests).
use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};

/// Whether `addr` (MASTER_ADDR) names this host's loopback, without resolving it.
fn is_loopback(addr: &str) -> bool {
    addr == "localhost" || addr.starts_with("127.") || addr == "::1"
}

/// This host's name (gethostname), or "?" when it cannot be read.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates within it (or truncates).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "?".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// A network interface of this host: its name, whether it is up (and has a carrier), and its IP addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub up: bool,
    pub running: bool,
    pub addrs: Vec<IpAddr>,
}

/// This host's network interfaces (getifaddrs), in the kernel's order; empty if they cannot be read.
pub fn interfaces() -> Vec<Interface> {
    let mut out: Vec<Interface> = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list that is freed once below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is null or points to a sockaddr of the family it names.
        let addr = unsafe { sockaddr_ip(ifa.ifa_addr) };
        let (up, running) = (
            ifa.ifa_flags & libc::IFF_UP as u32 != 0,
            ifa.ifa_flags & libc::IFF_RUNNING as u32 != 0,
        );
        match out.iter_mut().find(|i| i.name == name) {
            Some(i) => i.addrs.extend(addr),
            None => out.push(Interface {
                name,
                up,
                running,
                addrs: addr.into_iter().collect(),
            }),
        }
    }
    // SAFETY: the list from getifaddrs above, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The IP address in a sockaddr (None for other families and null).
///
/// # Safety
/// `sa` is null or points to a valid sockaddr of the family in its sa_family.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    match i32::from((*sa).sa_family) {
        libc::AF_INET => {
            let sin = &*(sa as *const libc::sockaddr_in);
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                sin.sin_addr.s_addr,
            ))))
        }
        libc::AF_INET6 => {
            let sin6 = &*(sa as *const libc::sockaddr_in6);
            Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

/// "lo 127.0.0.1, eth0 10.1.2.3, ib0 (down)": the interfaces and their addresses (IPv6 link-local left out).
pub fn describe_interfaces(ifs: &[Interface]) -> String {
    let all: Vec<String> = ifs
        .iter()
        .map(|i| {
            let mut s = i.name.clone();
            for a in &i.addrs {
                let link_local = matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
                if !link_local {
                    s.push_str(&format!(" {a}"));
                }
            }
            if !i.up {
                s.push_str(" (down)");
            } else if !i.running {
                s.push_str(" (no carrier)");
            }
            s
        })
        .collect();
    if all.is_empty() {
        "none found".into()
    } else {
        all.join(", ")
    }
}

/// Why rank 0 cannot serve the store at `addr` (MASTER_ADDR): none of the addresses it names is this host's.
/// None when it is one of them, a loopback or wildcard address, or when it does not resolve (the store says
/// so). `ProcessGroup::init` skips this with RN50_MASTER_ADDR_CHECK=0 (an address that reaches rank 0's host
/// through NAT or a virtual IP).
pub fn master_addr_problem(addr: &str, port: u16, ifs: &[Interface]) -> Option<String> {
    let ips: Vec<IpAddr> = (addr, port)
        .to_socket_addrs()
        .ok()?
        .map(|a| a.ip())
        .collect();
    let local = |ip: &IpAddr| {
        ip.is_loopback() || ip.is_unspecified() || ifs.iter().any(|i| i.addrs.contains(ip))
    };
    if ips.is_empty() || ips.iter().any(local) {
        return None;
    }
    let named = if ips.len() == 1 && ips[0].to_string() == addr {
        addr.to_string()
    } else {
        let list: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        format!("{addr} ({})", list.join(", "))
    };
    Some(format!(
        "MASTER_ADDR {named} is not an address of this host (rank 0 serves the rendezvous store): interfaces: \
         {}; start rank 0 on the master node, or give --master / MASTER_ADDR one of this host's addresses \
         (RN50_MASTER_ADDR_CHECK=0 when the address reaches this host through NAT or a virtual IP)",
        describe_interfaces(ifs)
    ))
}

/// Why Gloo cannot use the interfaces in `ifnames` (GLOO_SOCKET_IFNAME, comma-separated): one that does not
/// exist, is down, or has no IP address. None when every one can be used (or none is named).
pub fn ifname_problem(ifnames: &str, ifs: &[Interface]) -> Option<String> {
    let problems: Vec<String> = ifnames
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .filter_map(|n| match ifs.iter().find(|i| i.name == n) {
            None => Some(format!("{n} is not an interface of this host")),
            Some(i) if !i.up => Some(format!("{n} is down")),
            Some(i) if !i.running => Some(format!("{n} has no carrier (its link is down)")),
            Some(i) if i.addrs.is_empty() => Some(format!("{n} has no IP address")),
            Some(_) => None,
        })
        .collect();
    (!problems.is_empty()).then(|| {
        format!(
            "GLOO_SOCKET_IFNAME={ifnames}: {} (interfaces: {})",
            problems.join("; "),
            describe_interfaces(ifs)
        )
    })
}

/// This host's address on the route to `addr:port` (the source address the kernel would pick; no packet is
/// sent), or None when `addr` does not resolve or has no route.
pub(crate) fn route_source(addr: &str, port: u16) -> Option<String> {
    if is_loopback(addr) {
        return Some("127.0.0.1".into());
    }
    let target = (addr, port).to_socket_addrs().ok()?.next()?;
    let any: std::net::SocketAddr = match target {
        std::net::SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        std::net::SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = std::net::UdpSocket::bind(any).ok()?;
    socket.connect(target).ok()?;
    Some(socket.local_addr().ok()?.ip().to_string())
}

/// What Gloo bound to, for a failed connection set-up: the GLOO_SOCKET_IFNAME interfaces and their addresses,
/// `host` (the address chosen by [`route_source`]), or the address this host's name resolves to (which, on a
/// node with several networks, may be the wrong one). Starts with a space: it is appended to c10d's error.
pub(crate) fn gloo_binding(ifnames: &str, host: &str, ifs: &[Interface]) -> String {
    if !ifnames.is_empty() {
        let named: Vec<String> = ifnames
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| match ifs.iter().find(|i| i.name == n) {
                Some(i) => describe_interfaces(std::slice::from_ref(i)),
                None => n.to_string(),
            })
            .collect();
        return format!(
            " (Gloo used GLOO_SOCKET_IFNAME={ifnames}: {}; every other rank must reach that address)",
            named.join(", ")
        );
    }
    if !host.is_empty() {
        return format!(
            " (Gloo used {host}, this host's address on the way to the master; set GLOO_SOCKET_IFNAME to the \
             interface that reaches the other nodes: interfaces: {})",
            describe_interfaces(ifs)
        );
    }
    let name = hostname();
    let resolved: Vec<String> = (name.as_str(), 0)
        .to_socket_addrs()
        .map(|a| a.map(|a| a.ip().to_string()).collect())
        .unwrap_or_default();
    format!(
        " (Gloo used the address this host's name {name} resolves to: {}; set GLOO_SOCKET_IFNAME to the interface \
         that reaches the other nodes: interfaces: {})",
        if resolved.is_empty() {
            "none".to_string()
        } else {
            resolved.join(", ")
        },
        describe_interfaces(ifs)
    )
}

#[cfg(test)]
mod tests {
    //! The crate-private helpers; the public checks are tested in tests/suite/multinode_args.rs.
    use super::*;

    fn iface(name: &str, addrs: &[&str]) -> Interface {
        Interface {
            name: name.into(),
            up: true,
            running: true,
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn loopback_master_addrs_route_from_loopback() {
        for lo in ["localhost", "127.0.0.1", "127.1.2.3", "::1"] {
            assert!(is_loopback(lo), "{lo}");
            assert_eq!(
                route_source(lo, 29500).as_deref(),
                Some("127.0.0.1"),
                "{lo}"
            );
        }
        assert!(!is_loopback("10.0.0.1"));
        assert_eq!(route_source("no-such-host.invalid", 29500), None);
    }

    #[test]
    fn gloo_binding_names_what_gloo_used() {
        let ifs = [iface("lo", &["127.0.0.1"]), iface("eth0", &["10.1.2.3"])];
        // GLOO_SOCKET_IFNAME: each named interface with its addresses, an unknown one by its name.
        assert_eq!(
            gloo_binding("eth0, nosuch0", "", &ifs),
            " (Gloo used GLOO_SOCKET_IFNAME=eth0, nosuch0: eth0 10.1.2.3, nosuch0; every other rank must reach \
             that address)"
        );
        // The address on the route to the master, and the interfaces to choose from instead.
        assert_eq!(
            gloo_binding("", "10.1.2.3", &ifs),
            " (Gloo used 10.1.2.3, this host's address on the way to the master; set GLOO_SOCKET_IFNAME to the \
             interface that reaches the other nodes: interfaces: lo 127.0.0.1, eth0 10.1.2.3)"
        );
        // Neither: the host name's addresses.
        let by_name = gloo_binding("", "", &ifs);
        assert!(
            by_name.starts_with(&format!(
                " (Gloo used the address this host's name {} resolves to: ",
                hostname()
            )),
            "{by_name}"
        );
    }
}
