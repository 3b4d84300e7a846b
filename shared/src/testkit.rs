//! Real servers for tests and benchmarks: starts a `nats-server` (JetStream enabled) or a
//! `prometheus` on a free loopback port and stops it on drop.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("cannot find a free port: {0}")]
    Port(std::io::Error),
    #[error("cannot start `{bin}` ({source}); install it with `apt-get install -y nats-server`")]
    Spawn {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{bin}` did not accept connections on port {port} within {secs} s")]
    NotReady { bin: String, port: u16, secs: u64 },
    #[error("temporary directory: {0}")]
    TempDir(std::io::Error),
    #[error("cannot start `{bin}` ({source}); install it with `apt-get install -y prometheus`")]
    SpawnPrometheus {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{bin}` on port {port} did not report ready on /-/ready within {secs} s")]
    PrometheusNotReady { bin: String, port: u16, secs: u64 },
}

/// The binary named by `$env_var`, else `name` on `PATH`, else Debian's `/usr/sbin` or `/usr/bin`.
pub fn find_binary(env_var: &str, name: &str) -> String {
    if let Ok(b) = std::env::var(env_var) {
        return b;
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    if on_path {
        return name.to_string();
    }
    for dir in ["/usr/sbin", "/usr/bin", "/usr/local/bin"] {
        let candidate = std::path::Path::new(dir).join(name);
        if candidate.is_file() {
            return candidate.display().to_string();
        }
    }
    name.to_string()
}

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> Result<u16, HarnessError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(HarnessError::Port)?;
    Ok(l.local_addr().map_err(HarnessError::Port)?.port())
}

/// Waits until something accepts TCP connections on `127.0.0.1:port`.
pub fn wait_for_port(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A running `nats-server` with JetStream, on its own free port and storage directory.
pub struct NatsServer {
    child: Child,
    port: u16,
    store: PathBuf,
    _dir: Option<TempDirGuard>,
}

/// Removes a directory on drop.
pub struct TempDirGuard(pub PathBuf);

impl Drop for TempDirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl NatsServer {
    /// Starts `nats-server` (or `$NATS_SERVER_BIN`) with a fresh JetStream store directory.
    pub fn start() -> Result<Self, HarnessError> {
        let dir = std::env::temp_dir().join(format!(
            "aware-nats-{}-{}",
            std::process::id(),
            free_port()?
        ));
        std::fs::create_dir_all(&dir).map_err(HarnessError::TempDir)?;
        let mut s = Self::start_with_store(dir.clone())?;
        s._dir = Some(TempDirGuard(dir));
        Ok(s)
    }

    /// Starts a server on a new free port over an existing store directory.
    pub fn start_with_store(store: PathBuf) -> Result<Self, HarnessError> {
        Self::start_on(free_port()?, store)
    }

    /// Starts a server on `port` over `store` (to test a restart on the same address).
    pub fn start_on(port: u16, store: PathBuf) -> Result<Self, HarnessError> {
        Self::spawn(port, store, None, &[])
    }

    /// Starts a server with the configuration file text `conf` (authorization, TLS, …; its
    /// `$VARIABLES` read from `env`), on a free port with a fresh JetStream store. The address,
    /// port and store given on the command line take precedence over the file.
    pub fn start_with_config(conf: &str, env: &[(String, String)]) -> Result<Self, HarnessError> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("aware-nats-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(HarnessError::TempDir)?;
        let guard = TempDirGuard(dir.clone());
        let conf_path = dir.join("nats.conf");
        std::fs::write(&conf_path, conf).map_err(HarnessError::TempDir)?;
        let mut s = Self::spawn(port, dir.join("store"), Some(conf_path), env)?;
        s._dir = Some(guard);
        Ok(s)
    }

    fn spawn(
        port: u16,
        store: PathBuf,
        conf: Option<PathBuf>,
        env: &[(String, String)],
    ) -> Result<Self, HarnessError> {
        let bin = find_binary("NATS_SERVER_BIN", "nats-server");
        std::fs::create_dir_all(&store).map_err(HarnessError::TempDir)?;
        let mut cmd = Command::new(&bin);
        if let Some(conf) = &conf {
            cmd.arg("-c").arg(conf);
        }
        // A configured server logs next to its configuration (shown when it does not start).
        let log = conf
            .as_ref()
            .and_then(|c| Some(c.parent()?.join("nats.log")));
        let stderr = match &log {
            Some(path) => Stdio::from(std::fs::File::create(path).map_err(HarnessError::TempDir)?),
            None => Stdio::null(),
        };
        let child = cmd
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&store)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|source| HarnessError::Spawn {
                bin: bin.clone(),
                source,
            })?;
        let server = NatsServer {
            child,
            port,
            store,
            _dir: None,
        };
        if !wait_for_port(port, Duration::from_secs(10)) {
            if let Some(text) = log.and_then(|p| std::fs::read_to_string(p).ok()) {
                eprintln!("nats-server log:\n{text}");
            }
            return Err(HarnessError::NotReady {
                bin,
                port,
                secs: 10,
            });
        }
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn store(&self) -> &std::path::Path {
        &self.store
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `prometheus` on its own free port and temporary storage, scraping `targets`
/// (`host:port` serving `/metrics`) every `scrape_interval`.
pub struct PrometheusServer {
    child: Child,
    port: u16,
    _dir: TempDirGuard,
}

impl PrometheusServer {
    /// Starts `prometheus` (or `$PROMETHEUS_BIN`) with a generated configuration and waits until
    /// `/-/ready` answers 200.
    pub fn start(targets: &[String], scrape_interval: Duration) -> Result<Self, HarnessError> {
        Self::start_with_rules(targets, scrape_interval, &[])
    }

    /// [`PrometheusServer::start`], also loading the rule files `rules` (evaluated every scrape
    /// interval).
    pub fn start_with_rules(
        targets: &[String],
        scrape_interval: Duration,
        rules: &[PathBuf],
    ) -> Result<Self, HarnessError> {
        let bin = find_binary("PROMETHEUS_BIN", "prometheus");
        let port = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("aware-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(dir.join("data")).map_err(HarnessError::TempDir)?;
        let guard = TempDirGuard(dir.clone());
        let interval = format!("{}ms", scrape_interval.as_millis().max(1));
        let list = targets
            .iter()
            .map(|t| format!("\"{t}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let rule_files: String = if rules.is_empty() {
            " []\n".into()
        } else {
            std::iter::once("\n".to_string())
                .chain(rules.iter().map(|r| format!("  - \"{}\"\n", r.display())))
                .collect()
        };
        let config = format!(
            "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  evaluation_interval: {interval}\nrule_files:{rule_files}scrape_configs:\n  - job_name: aware\n    honor_labels: true\n    static_configs:\n      - targets: [{list}]\n"
        );
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).map_err(HarnessError::TempDir)?;
        let log =
            std::fs::File::create(dir.join("prometheus.log")).map_err(HarnessError::TempDir)?;
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|source| HarnessError::SpawnPrometheus {
                bin: bin.clone(),
                source,
            })?;
        let server = PrometheusServer {
            child,
            port,
            _dir: guard,
        };
        let secs = 30;
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if http_status(port, "/-/ready") == Some(200) {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(HarnessError::PrometheusNotReady { bin, port, secs })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Base URL of the HTTP API (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Prometheus' own log (stderr), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.0.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status code of `GET path` on `127.0.0.1:port` (HTTP/1.0), or `None` when unreachable.
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// A `target/1` message of `target` at `ts_ms` as the controller sends it (generation 1, source
/// the target's `namespace/name`): a registration with `spec`, a deregistration without.
pub fn registration(
    target: &aware_bus_schemas::Target,
    ts_ms: i64,
    spec: Option<aware_bus_schemas::RegisteredSpec>,
) -> aware_bus_schemas::Registration {
    aware_bus_schemas::Registration {
        schema: aware_bus_schemas::Schema::new(),
        target: target.clone(),
        episode: 0,
        step: 0,
        ts_ms,
        generation: 1,
        source: target.to_string(),
        spec,
    }
}
