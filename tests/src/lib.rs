//! Helpers for the integration tests: locating the built binaries, running them as child
//! processes, plain HTTP GETs and Prometheus exposition parsing, schema-agnostic MessagePack.

/// The real Kubernetes control plane (its own crate, which `aware bench kube` uses too).
pub use aware_kube_testkit as kube;
pub mod hosts;
pub mod kube_sim;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub use aware_shared::probe::http_get;
pub use aware_shared::testkit::{free_port, NatsServer};

/// The per-target services besides the collector, each run once per shard.
pub const SHARDED: [&str; 5] = [
    "aware-recommender",
    "aware-actuator",
    "aware-trajectory-recorder",
    "aware-lifecycle-monitor",
    "aware-meta-learner-trainer",
];

/// Path of a workspace binary (`aware`, `aware-recommender`, …) next to the test binary.
/// The README's test command builds them first (`cargo build --workspace --bins`).
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/integration-<hash> → target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .map(PathBuf::from)
        .unwrap_or_default();
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} not built: run `cargo build --workspace --bins` first (the README's test command does)",
        path.display()
    );
    path
}

/// A child process whose stdout lines are collected in the background; killed on drop.
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub stderr_path: PathBuf,
}

impl Proc {
    /// Starts `bin args…` with extra environment variables; stderr goes to a temp file.
    pub fn spawn(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        Self::start(Command::new(bin_path(bin)), bin, args, env)
    }

    /// [`Proc::spawn`] on host `host` of `hosts` (in its network namespace).
    pub fn spawn_on(
        hosts: &hosts::Hosts,
        host: usize,
        bin: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Proc {
        Self::start(hosts.command(host, bin_path(bin)), bin, args, env)
    }

    fn start(mut cmd: Command, bin: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let stderr_path = std::env::temp_dir().join(format!(
            "aware-test-{}-{}.stderr",
            std::process::id(),
            free_port().unwrap_or(0)
        ));
        let stderr = std::fs::File::create(&stderr_path).unwrap_or_else(|e| panic!("{e}"));
        cmd.args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("stdout"));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            lines: rx,
            stderr_path,
        }
    }

    /// The next stdout line containing `needle`, within `timeout`.
    pub fn wait_line(&self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(std::time::Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return Some(l),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }

    /// All stdout lines received so far.
    pub fn drain_lines(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// The HTTP address announced on stdout (`aware: listening on http://ADDR`).
    pub fn http_addr(&self) -> SocketAddr {
        let line = self
            .wait_line("listening on http://", Duration::from_secs(30))
            .unwrap_or_else(|| panic!("no listening line; stderr:\n{}", self.stderr()));
        let addr = line.rsplit("http://").next().unwrap_or_default().trim();
        addr.parse()
            .unwrap_or_else(|e| panic!("bad address `{addr}`: {e}"))
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Sends SIGTERM and waits up to `timeout` for the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr_path);
    }
}

/// Parses a Prometheus text exposition with a real parser.
pub fn parse_metrics(text: &str) -> prometheus_parse::Scrape {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).unwrap_or_else(|e| panic!("unparsable exposition: {e}"))
}

/// The value of a sample with the given name and labels (counter, gauge or untyped).
pub fn metric(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .and_then(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => Some(v),
            _ => None,
        })
}

/// The value of `name` with `labels` in the `/metrics` of the service listening on `addr`; none
/// while it does not answer or does not have the sample.
pub fn scrape(addr: std::net::SocketAddr, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let (_, text) = http_get(addr, "/metrics").ok()?;
    metric(&parse_metrics(&text), name, labels)
}

/// Waits until the service listening on `addr` answers `/readyz` with 200; panics after 30 s.
pub fn wait_ready(addr: std::net::SocketAddr) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if let Ok((200, _)) = http_get(addr, "/readyz") {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("{addr} not ready");
}

/// Top-level field names of a MessagePack map, read without the project's types.
pub fn msgpack_keys(bytes: &[u8]) -> Vec<String> {
    let v =
        rmpv::decode::read_value(&mut &bytes[..]).unwrap_or_else(|e| panic!("not msgpack: {e}"));
    v.as_map()
        .unwrap_or_else(|| panic!("not a map: {v}"))
        .iter()
        .filter_map(|(k, _)| k.as_str().map(str::to_string))
        .collect()
}

/// A field of a MessagePack map, read without the project's types.
pub fn msgpack_field(bytes: &[u8], key: &str) -> Option<rmpv::Value> {
    let v = rmpv::decode::read_value(&mut &bytes[..]).ok()?;
    v.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v.clone())
}

/// Waits (up to 20 s) until the JetStream stream `stream` on the server at `url` holds at least
/// `at_least` messages: the capture is asynchronous to the publish. Panics otherwise.
pub async fn wait_captured(url: &str, stream: &str, at_least: u64) {
    let client = async_nats::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    let mut s = async_nats::jetstream::new(client)
        .get_stream(stream)
        .await
        .unwrap_or_else(|e| panic!("stream {stream}: {e}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let held = s
            .info()
            .await
            .unwrap_or_else(|e| panic!("stream {stream} info: {e}"))
            .state
            .messages;
        if held >= at_least {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "stream {stream} holds {held} messages after 20 s, expected {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every event the capture stream `AWARE` on the server at `url` holds, in stream order, with
/// its stream sequence (each subject parsed and each payload decoded, or the test fails).
pub async fn capture(url: &str) -> Vec<(u64, aware_bus_schemas::Event)> {
    capture_of(url, "AWARE").await
}

/// Every event the stream `name` on the server at `url` holds, in stream order, with its
/// stream sequence (each subject parsed and each payload decoded, or the test fails).
pub async fn capture_of(url: &str, name: &str) -> Vec<(u64, aware_bus_schemas::Event)> {
    use futures::StreamExt;
    let client = async_nats::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    let js = async_nats::jetstream::new(client);
    let mut stream = js
        .get_stream(name)
        .await
        .unwrap_or_else(|e| panic!("stream {name}: {e}"));
    let info = stream
        .info()
        .await
        .unwrap_or_else(|e| panic!("stream {name} info: {e}"))
        .state
        .clone();
    let (first, last) = (info.first_sequence, info.last_sequence);
    let mut out = Vec::new();
    // The next sequence wanted. An ordered consumer of a replicated stream whose leader just
    // changed has been seen to pass over a message, or to stall: the reading is opened again
    // from the one wanted when it passes over one the stream holds or is silent for 5 s.
    let mut wanted = first.max(1);
    let mut reopened = 0;
    'read: while wanted <= last {
        assert!(reopened < 20, "reading {name} stalls at {wanted} of {last}");
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                filter_subject: String::new(),
                deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: wanted,
                },
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("consumer on {name}: {e}"));
        let mut messages = consumer
            .messages()
            .await
            .unwrap_or_else(|e| panic!("read {name}: {e}"));
        loop {
            let m = match tokio::time::timeout(Duration::from_secs(5), messages.next()).await {
                Ok(Some(Ok(m))) => m,
                Ok(Some(Err(_))) | Ok(None) | Err(_) => {
                    reopened += 1;
                    continue 'read;
                }
            };
            let seq = m
                .info()
                .unwrap_or_else(|e| panic!("message info: {e}"))
                .stream_sequence;
            if seq > wanted && stream.get_raw_message(wanted).await.is_ok() {
                reopened += 1;
                continue 'read;
            }
            let parsed = aware_bus_schemas::subject::parse(&m.subject)
                .unwrap_or_else(|e| panic!("captured subject: {e}"));
            let ev = aware_bus_schemas::decode_event(parsed.kind, &m.payload)
                .unwrap_or_else(|e| panic!("captured {}: {e}", m.subject));
            out.push((seq, ev));
            wanted = seq + 1;
            if seq >= last {
                break 'read;
            }
        }
    }
    out
}

/// What the capture holds for one target, for checks of "decided exactly once".
#[derive(Default)]
pub struct Captured {
    /// (episode, step) → stream sequence of its first `obs`.
    pub obs: std::collections::BTreeMap<(u64, u32), u64>,
    /// (episode, step) → `action`s captured for it.
    pub actions: std::collections::BTreeMap<(u64, u32), u32>,
    /// (stage, previous) of every `lifecycle`.
    pub stages: Vec<(aware_bus_schemas::Stage, Option<aware_bus_schemas::Stage>)>,
}

/// [`capture`] gathered per target.
pub async fn capture_by_target(
    url: &str,
) -> std::collections::BTreeMap<aware_bus_schemas::Target, Captured> {
    capture_by_target_in(url, &["AWARE".to_string()]).await
}

/// [`capture_of`] each of `streams` (the capture's partitions), gathered per target: a target's
/// sequences are those of its partition's stream.
pub async fn capture_by_target_in(
    url: &str,
    streams: &[String],
) -> std::collections::BTreeMap<aware_bus_schemas::Target, Captured> {
    use aware_bus_schemas::Event;
    let mut out: std::collections::BTreeMap<aware_bus_schemas::Target, Captured> =
        std::collections::BTreeMap::new();
    let mut events = Vec::new();
    for name in streams {
        events.extend(capture_of(url, name).await);
    }
    for (seq, ev) in events {
        let c = out.entry(ev.target().clone()).or_default();
        match ev {
            Event::Obs(o) => {
                c.obs.entry((o.episode, o.step)).or_insert(seq);
            }
            Event::Action(a) => *c.actions.entry((a.episode, a.step)).or_default() += 1,
            Event::Lifecycle(l) => c.stages.push((l.stage, l.previous)),
            _ => {}
        }
    }
    out
}
