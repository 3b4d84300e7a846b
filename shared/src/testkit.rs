//! Real servers for tests and benchmarks: starts a `nats-server` (JetStream enabled) on a free
//! loopback port and stops it on drop.

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
        let bin = find_binary("NATS_SERVER_BIN", "nats-server");
        std::fs::create_dir_all(&store).map_err(HarnessError::TempDir)?;
        let child = Command::new(&bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
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
