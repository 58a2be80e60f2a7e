//! "Nodes" on one machine: a Linux network namespace per node, each with a veth link to a bridge in a "switch"
//! namespace of its own, so that ranks on different nodes talk over a real (virtual) Ethernet link that a test can
//! take down. Nothing touches the host's own network namespace: deleting the namespaces (the [`Net`]'s Drop, also
//! on panic) removes the links and the bridge with them. Needs root (or CAP_SYS_ADMIN) and iproute2's `ip`;
//! [`Net::new`] says why not otherwise, and the test fails naming what it needs (root, iproute2's `ip`).
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Every namespace made here is called `rn50t-PID-N-…` (PID: the test process), so that tests running in
/// parallel never clash and leftovers of a killed test process can be recognised and removed.
const PREFIX: &str = "rn50t-";

/// One node: its namespace, its end of the link, the switch's end, and its address.
pub struct Node {
    pub ns: String,
    /// The node's interface on the job's network (what GLOO_SOCKET_IFNAME names): `vethI`.
    pub ifname: String,
    /// The switch's end of that link (in the switch namespace): `portI`.
    pub port: String,
    pub addr: Ipv4Addr,
}

/// A bridge and `n` nodes on 10.200.X.0/24 (X picked at random, unused on this host): node i is 10.200.X.(i+1).
pub struct Net {
    pub switch: String,
    pub nodes: Vec<Node>,
    /// Every namespace created so far (removed by Drop).
    created: Vec<String>,
}

/// Runs `ip ARGS…`; its stderr as the error.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip_output(args: &[&str]) -> String {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Panics on a failed `ip` command (setting up after the first namespace worked must not fail).
fn must(args: &[&str]) {
    if let Err(e) = ip(args) {
        panic!("{e}");
    }
}

/// Removes namespaces left by test processes that no longer run (killed before their Drop).
fn remove_stale() {
    for line in ip_output(&["netns", "list"]).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            kill_all_in(name);
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// SIGKILLs every process in namespace `ns` (only this test's processes live there).
pub fn kill_all_in(ns: &str) {
    for pid in ip_output(&["netns", "pids", ns]).split_whitespace() {
        if let Ok(pid) = pid.parse::<i32>() {
            // SAFETY: plain kill(2) of a process in a namespace this test created.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// A third octet X for 10.200.X.0/24 (and the decoys' 10.201.X.0/24) that no address or route of this host uses (tried from a random start).
fn free_subnet(salt: usize) -> u8 {
    let used = format!(
        "{}\n{}",
        ip_output(&["-4", "addr", "show"]),
        ip_output(&["-4", "route", "show", "table", "all"])
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize);
    let start = (std::process::id() as usize * 31 + salt * 97 + nanos) % 256;
    (0..256)
        .map(|i| ((start + i) % 256) as u8)
        .find(|x| {
            !used.contains(&format!("10.200.{x}.")) && !used.contains(&format!("10.201.{x}."))
        })
        .expect("every 10.200.X.0/24 or 10.201.X.0/24 is in use on this host")
}

impl Net {
    /// A switch and `n` nodes. With `decoy`, each node first gets a second interface, `decoyI` (listed before
    /// `vethI`: a lower index), up, on another subnet (10.201.X.0/24), linked to an unbridged port: a network that
    /// reaches no other node. Err(why) when namespaces cannot be made here (not root, no `ip`): the test fails with it.
    pub fn new(n: usize, decoy: bool) -> Result<Net, String> {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let id = COUNT.fetch_add(1, Ordering::SeqCst);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(
                "not root: creating network namespaces needs root (CI runs as root)".into(),
            );
        }
        remove_stale();
        let name = |what: &str| format!("{PREFIX}{}-{id}-{what}", std::process::id());
        let switch = name("sw");
        ip(&["netns", "add", &switch])
            .map_err(|e| format!("cannot create a network namespace: {e}"))?;
        let mut net = Net {
            switch: switch.clone(),
            nodes: Vec::new(),
            created: vec![switch.clone()],
        };
        let x = free_subnet(id);
        must(&["-n", &switch, "link", "add", "br0", "type", "bridge"]);
        must(&["-n", &switch, "link", "set", "br0", "up"]);
        for i in 0..n {
            let ns = name(&format!("n{i}"));
            must(&["netns", "add", &ns]);
            net.created.push(ns.clone());
            must(&["-n", &ns, "link", "set", "lo", "up"]);
            if decoy {
                let (d, dp) = (format!("decoy{i}"), format!("dport{i}"));
                let peer = ["link", "add", &dp, "type", "veth", "peer", "name", &d];
                must(&[&["-n", &switch][..], &peer, &["netns", &ns]].concat());
                must(&["-n", &switch, "link", "set", &dp, "up"]);
                let a = format!("10.201.{x}.{}/24", i + 1);
                must(&["-n", &ns, "addr", "add", &a, "dev", &d]);
                must(&["-n", &ns, "link", "set", &d, "up"]);
            }
            let (ifname, port) = (format!("veth{i}"), format!("port{i}"));
            let peer = [
                "link", "add", &port, "type", "veth", "peer", "name", &ifname,
            ];
            must(&[&["-n", &switch][..], &peer, &["netns", &ns]].concat());
            must(&["-n", &switch, "link", "set", &port, "master", "br0"]);
            must(&["-n", &switch, "link", "set", &port, "up"]);
            let addr = Ipv4Addr::new(10, 200, x, i as u8 + 1);
            must(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &ifname,
            ]);
            must(&["-n", &ns, "link", "set", &ifname, "up"]);
            net.nodes.push(Node {
                ns,
                ifname,
                port,
                addr,
            });
        }
        Ok(net)
    }

    /// `ip netns exec NODE PROGRAM` (add the program's arguments and environment).
    pub fn command(&self, node: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.nodes[node].ns, program]);
        c
    }

    /// Node 0's address and `port`: the job's --master.
    pub fn master(&self, port: u16) -> String {
        format!("{}:{port}", self.nodes[0].addr)
    }

    /// Takes node `i`'s link down at the switch: the cable pulled (the node keeps its address and route; what it
    /// sends is lost, and nothing reaches it).
    pub fn unplug(&self, i: usize) {
        must(&[
            "-n",
            &self.switch,
            "link",
            "set",
            &self.nodes[i].port,
            "down",
        ]);
    }

    /// SIGKILLs every process of node `i`: the node crashed.
    pub fn crash(&self, i: usize) {
        kill_all_in(&self.nodes[i].ns);
    }

    /// Runs `ip ARGS…` inside node `i`'s namespace.
    pub fn ip_in(&self, i: usize, args: &[&str]) {
        must(&[&["-n", self.nodes[i].ns.as_str()][..], args].concat());
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.created.iter().rev() {
            kill_all_in(ns);
            // The processes just killed may hold the namespace a moment longer; deleting its name is enough.
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("warning: {e}");
            }
        }
    }
}
