//! Hosts made of Linux network namespaces, for tests that spread services over machines: each
//! host is a namespace with its own address on one bridge in the test's namespace, so its
//! processes talk to the others over a real network path, and the test cuts a host off (its
//! link down: the others and the test lose it, it keeps its own loopback) and restores it.
//! Needs root (CAP_NET_ADMIN) and `ip` from iproute2; everything made is removed on drop.
//!
//! [`NatsCluster`] runs one nats-server per host, clustered with JetStream, as a user running
//! AWARE across machines would.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why hosts or their cluster could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    #[error("`ip {args}` failed ({status}): {stderr} (hosts need root and iproute2)")]
    Ip {
        args: String,
        status: String,
        stderr: String,
    },
    #[error("cannot run `{what}`: {source}")]
    Spawn {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("nats-server of host {host} not listening on {addr} after {secs} s; log:\n{log}")]
    NotListening {
        host: usize,
        addr: String,
        secs: u64,
        log: String,
    },
}

fn ip(args: &[&str]) -> Result<(), HostsError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|source| HostsError::Spawn {
            what: format!("ip {}", args.join(" ")),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(HostsError::Ip {
        args: args.join(" "),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// `count` hosts on one bridge: host i is the namespace [`Hosts::netns`] with the address
/// [`Hosts::addr`] (10.123.N.i+1/24, N from the process id, the bridge at .254).
pub struct Hosts {
    id: u32,
    count: usize,
    subnet: u8,
}

impl Hosts {
    pub fn create(count: usize) -> Result<Hosts, HostsError> {
        let pid = std::process::id();
        // Interface names hold 15 bytes: `awv` + 5 digits + `h` + the host.
        let id = pid % 100_000;
        let subnet = u8::try_from(pid % 250).unwrap_or(0);
        let hosts = Hosts {
            id,
            count: 0,
            subnet,
        };
        let bridge = hosts.bridge();
        // What a killed earlier run with the same id left behind.
        let _ = ip(&["link", "del", &bridge]);
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        let mut hosts = hosts;
        ip(&[
            "addr",
            "add",
            &format!("10.123.{subnet}.254/24"),
            "dev",
            &bridge,
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        for i in 0..count {
            let ns = hosts.netns(i);
            let (outer, inner) = (hosts.link(i), format!("awp{id}h{i}"));
            let _ = ip(&["netns", "del", &ns]);
            ip(&["netns", "add", &ns])?;
            hosts.count = i + 1;
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &outer, "master", &bridge, "up"])?;
            ip(&["-n", &ns, "link", "set", &inner, "name", "eth0"])?;
            let cidr = format!("{}/24", hosts.addr(i));
            ip(&["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    fn bridge(&self) -> String {
        format!("awb{}", self.id)
    }

    /// The host's end of its link, in the test's namespace: down is the host cut off.
    fn link(&self, i: usize) -> String {
        format!("awv{}h{i}", self.id)
    }

    pub fn count(&self) -> usize {
        self.count
    }

    pub fn netns(&self, i: usize) -> String {
        format!("aw{}h{i}", self.id)
    }

    pub fn addr(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 123, self.subnet, u8::try_from(i + 1).unwrap_or(u8::MAX))
    }

    /// `program` to be run on host `i`.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns(i)]).arg(program);
        cmd
    }

    /// Cuts host `i` off the network: its link goes down, so neither the other hosts nor the
    /// test reach it, nor it them; what runs on it keeps running and keeps its loopback.
    pub fn cut(&self, i: usize) -> Result<(), HostsError> {
        ip(&["link", "set", &self.link(i), "down"])
    }

    /// Puts host `i` back on the network.
    pub fn restore(&self, i: usize) -> Result<(), HostsError> {
        ip(&["link", "set", &self.link(i), "up"])
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for i in 0..self.count {
            // The pair goes with either end; the namespace itself lasts while a process is in it.
            let _ = ip(&["link", "del", &self.link(i)]);
            let _ = ip(&["netns", "del", &self.netns(i)]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}

/// One nats-server per host, clustered (routes to every host, JetStream with each host's own
/// store), client port 4222, cluster port 6222. Killed on drop.
pub struct NatsCluster {
    servers: Vec<Child>,
    addrs: Vec<Ipv4Addr>,
}

impl NatsCluster {
    /// Starts the servers, each with its configuration, store and log under `dir/h<i>/`, and
    /// waits until each listens. Routes and clients are pinged every second, so a cut host is
    /// noticed within seconds rather than the default minutes.
    pub fn start(hosts: &Hosts, dir: &Path) -> Result<NatsCluster, HostsError> {
        let bin = aware_shared::testkit::find_binary("NATS_SERVER_BIN", "nats-server");
        let addrs: Vec<Ipv4Addr> = (0..hosts.count()).map(|i| hosts.addr(i)).collect();
        let routes = addrs
            .iter()
            .map(|a| format!("\"nats-route://{a}:6222\""))
            .collect::<Vec<_>>()
            .join(", ");
        let mut cluster = NatsCluster {
            servers: Vec::new(),
            addrs: addrs.clone(),
        };
        for (i, addr) in addrs.iter().enumerate() {
            let home = dir.join(format!("h{i}"));
            std::fs::create_dir_all(home.join("js"))?;
            let conf = home.join("nats.conf");
            std::fs::write(
                &conf,
                format!(
                    "server_name: h{i}\nlisten: \"{addr}:4222\"\n\
                     ping_interval: \"1s\"\nping_max: 3\n\
                     jetstream {{ store_dir: \"{js}\" }}\n\
                     cluster {{\n  name: aware\n  listen: \"{addr}:6222\"\n  \
                     routes: [{routes}]\n}}\n",
                    js = home.join("js").display(),
                ),
            )?;
            let log = std::fs::File::create(home.join("nats.log"))?;
            let child = hosts
                .command(i, &bin)
                .arg("-c")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|source| HostsError::Spawn {
                    what: format!("{bin} on host {i}"),
                    source,
                })?;
            cluster.servers.push(child);
        }
        for (i, addr) in addrs.iter().enumerate() {
            let deadline = Instant::now() + Duration::from_secs(20);
            let sock = std::net::SocketAddr::from((*addr, 4222));
            while std::net::TcpStream::connect_timeout(&sock, Duration::from_millis(200)).is_err() {
                if Instant::now() > deadline {
                    return Err(HostsError::NotListening {
                        host: i,
                        addr: sock.to_string(),
                        secs: 20,
                        log: std::fs::read_to_string(dir.join(format!("h{i}/nats.log")))
                            .unwrap_or_default(),
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(cluster)
    }

    /// The client URL of host `i`'s server.
    pub fn url(&self, i: usize) -> String {
        format!("nats://{}:4222", self.addrs[i])
    }

    /// Every server's URL, host `i`'s first: what a service on host `i` connects with.
    pub fn urls_from(&self, i: usize) -> String {
        let mut urls = vec![self.url(i)];
        urls.extend(
            (0..self.addrs.len())
                .filter(|&j| j != i)
                .map(|j| self.url(j)),
        );
        urls.join(",")
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for s in &mut self.servers {
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}
