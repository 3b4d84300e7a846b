//! A real QuestDB server for tests and benchmarks (feature `testing`): the `org.questdb:questdb`
//! jar that `tests/questdb/install.sh` puts in `$HOME/.cache/aware-rs/questdb-<version>/`, run
//! with the machine's `java` on free loopback ports (HTTP, ILP/TCP and PostgreSQL wire) over a
//! data root of its own. [`QuestDbServer`] kills the server when dropped — also while a panicking
//! test unwinds — and removes a temporary root.
//!
//! The server is started the way QuestDB's own launcher does (`-p questdb.jar -m
//! io.questdb/io.questdb.ServerMain -d <root>` with its `--add-exports`), with a small heap and
//! two worker threads: the machines it runs on have two cores shared with the build. Its settings
//! go to `<root>/conf/server.conf`, its log to `<root>/log/questdb.log`.

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The QuestDB release `tests/questdb/install.sh` installs (a test checks they agree).
pub const QUESTDB_VERSION: &str = "9.3.4";

/// Environment variable naming the QuestDB jar (default: the install script's cache path).
pub const JAR_ENV: &str = "AWARE_QUESTDB_JAR";
/// Environment variable naming the `java` binary (default: `$JAVA_HOME/bin/java`, else `java`).
pub const JAVA_ENV: &str = "AWARE_JAVA";

/// How long a start waits for the server to answer SQL over HTTP.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, thiserror::Error)]
pub enum QuestDbServerError {
    #[error(
        "the QuestDB jar {} is missing: run `bash tests/questdb/install.sh` (or set {JAR_ENV})",
        jar.display()
    )]
    NotInstalled { jar: PathBuf },
    #[error("cannot find a free loopback port: {0}")]
    Port(#[source] std::io::Error),
    #[error("data root {}: {source}", path.display())]
    Root {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start `{java}` (QuestDB needs Java 17 or newer; set {JAVA_ENV}): {source}")]
    Spawn {
        java: String,
        #[source]
        source: std::io::Error,
    },
    #[error("QuestDB exited ({status}) before it answered on port {http_port}; its log ends with:\n{log}")]
    Exited {
        status: std::process::ExitStatus,
        http_port: u16,
        log: String,
    },
    #[error("QuestDB did not answer SQL on http://127.0.0.1:{http_port} within {secs} s; its log ends with:\n{log}")]
    NotReady {
        http_port: u16,
        secs: u64,
        log: String,
    },
}

/// How to run the server.
#[derive(Debug, Clone)]
pub struct QuestDbServerOptions {
    /// Maximum Java heap (`-Xmx`); QuestDB keeps its data off-heap in mapped files.
    pub heap_mb: u32,
    /// Native memory QuestDB may allocate (`ram.usage.limit.bytes`).
    pub ram_limit_mb: u32,
    /// Threads of the shared worker pool (network, queries, WAL apply).
    pub workers: u32,
    /// Levels written to `<root>/log/questdb.log` (QuestDB's `w.file.level`).
    pub log_levels: &'static str,
    /// Size of the file pages QuestDB allocates ahead when appending to a column (table and
    /// WAL, and symbol-map index), in KiB; `None` keeps QuestDB's defaults (16 MiB per table
    /// column and per symbol map, 1 MiB per WAL column), which take gigabytes of disk for the
    /// many small tables of a test run.
    pub append_page_kib: Option<u32>,
    /// QuestDB's development mode (`dev.mode.enabled`), which allows `ALTER TABLE … SUSPEND WAL`
    /// (a test's way to suspend a table as a failed WAL apply does).
    pub dev_mode: bool,
}

impl Default for QuestDbServerOptions {
    fn default() -> Self {
        Self {
            heap_mb: 384,
            ram_limit_mb: 2048,
            workers: 2,
            log_levels: "INFO,ERROR,CRITICAL,ADVISORY",
            append_page_kib: Some(256),
            dev_mode: false,
        }
    }
}

/// The server's ports on 127.0.0.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuestDbPorts {
    /// REST: `/exec` SQL and ILP over HTTP (`/write`), the store's URL.
    pub http: u16,
    /// ILP over TCP.
    pub ilp: u16,
    /// PostgreSQL wire protocol.
    pub pg: u16,
}

impl QuestDbPorts {
    /// Three free loopback ports (bound together, then released).
    pub fn free() -> Result<Self, QuestDbServerError> {
        let bind = || TcpListener::bind("127.0.0.1:0").map_err(QuestDbServerError::Port);
        let (a, b, c) = (bind()?, bind()?, bind()?);
        let port = |l: &TcpListener| {
            l.local_addr()
                .map(|a| a.port())
                .map_err(QuestDbServerError::Port)
        };
        Ok(Self {
            http: port(&a)?,
            ilp: port(&b)?,
            pg: port(&c)?,
        })
    }
}

/// A running QuestDB; see the module documentation.
pub struct QuestDbServer {
    child: Option<Child>,
    root: PathBuf,
    /// Removed on drop when the server made it.
    owns_root: bool,
    ports: QuestDbPorts,
    opts: QuestDbServerOptions,
}

impl std::fmt::Debug for QuestDbServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuestDbServer")
            .field("root", &self.root)
            .field("ports", &self.ports)
            .field("running", &self.child.is_some())
            .finish_non_exhaustive()
    }
}

/// The jar: `$AWARE_QUESTDB_JAR`, else the install script's cache path.
pub fn questdb_jar() -> PathBuf {
    if let Some(jar) = std::env::var_os(JAR_ENV) {
        return PathBuf::from(jar);
    }
    let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    home.join(".cache/aware-rs")
        .join(format!("questdb-{QUESTDB_VERSION}"))
        .join(format!("questdb-{QUESTDB_VERSION}.jar"))
}

/// The `java` binary: `$AWARE_JAVA`, else `$JAVA_HOME/bin/java`, else `java` on `PATH`.
pub fn java_binary() -> String {
    if let Ok(java) = std::env::var(JAVA_ENV) {
        return java;
    }
    if let Some(home) = std::env::var_os("JAVA_HOME") {
        let java = Path::new(&home).join("bin/java");
        if java.is_file() {
            return java.display().to_string();
        }
    }
    "java".to_owned()
}

/// `<root>/conf/server.conf`: every listener on loopback, telemetry and the minimal health
/// server off, bounded memory and threads, small append pages unless told otherwise.
fn server_conf(ports: QuestDbPorts, o: &QuestDbServerOptions) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "http.bind.to=127.0.0.1:{}", ports.http);
    let _ = writeln!(s, "line.tcp.net.bind.to=127.0.0.1:{}", ports.ilp);
    let _ = writeln!(s, "pg.net.bind.to=127.0.0.1:{}", ports.pg);
    // The health-check server would take a fourth port; nothing here uses it.
    s.push_str("http.min.enabled=false\n");
    s.push_str("line.udp.enabled=false\n");
    s.push_str("telemetry.enabled=false\n");
    let _ = writeln!(s, "shared.worker.count={}", o.workers);
    let _ = writeln!(s, "wal.apply.worker.count={}", o.workers);
    let _ = writeln!(
        s,
        "ram.usage.limit.bytes={}",
        u64::from(o.ram_limit_mb) << 20
    );
    if o.dev_mode {
        s.push_str("dev.mode.enabled=true\n");
    }
    s
}

/// `<root>/conf/log.conf`: the log goes to a file in the root, not to the test's output.
fn log_conf(root: &Path, o: &QuestDbServerOptions) -> String {
    format!(
        "writers=file\n\
         w.file.class=io.questdb.log.LogFileWriter\n\
         w.file.location={}\n\
         w.file.level={}\n",
        log_path(root).display(),
        o.log_levels
    )
}

fn log_path(root: &Path) -> PathBuf {
    root.join("log/questdb.log")
}

/// The last `lines` lines of the server's log and of the JVM's own output, after the last 20
/// critical and error lines before them (the cause of a failure is often older than the tail).
fn log_tail(root: &Path, lines: usize) -> String {
    let mut out = String::new();
    for path in [root.join("log/jvm.log"), log_path(root)] {
        if let Ok(text) = std::fs::read_to_string(&path) {
            let all: Vec<&str> = text.lines().collect();
            let from = all.len().saturating_sub(lines);
            let _ = writeln!(out, "--- {}", path.display());
            let serious: Vec<&&str> = all[..from]
                .iter()
                .filter(|l| {
                    let mut words = l.split(' ');
                    matches!(words.nth(1), Some("C" | "E"))
                })
                .collect();
            if !serious.is_empty() {
                let _ = writeln!(out, "(critical and error lines before the tail)");
                for l in &serious[serious.len().saturating_sub(20)..] {
                    let _ = writeln!(out, "{l}");
                }
                let _ = writeln!(out, "(tail)");
            }
            for l in &all[from..] {
                let _ = writeln!(out, "{l}");
            }
        }
    }
    out
}

impl QuestDbServer {
    /// Starts a server with the default options over a fresh temporary data root.
    pub fn start() -> Result<Self, QuestDbServerError> {
        Self::start_with(QuestDbServerOptions::default())
    }

    /// Starts a server over a fresh temporary data root.
    pub fn start_with(opts: QuestDbServerOptions) -> Result<Self, QuestDbServerError> {
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let root = std::env::temp_dir().join(format!(
            "aware-questdb-{}-{}-{}",
            std::process::id(),
            aware_bus_schemas::now_ms(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        Self::start_in(root, true, opts)
    }

    /// Starts a server over `root` (created when missing; kept on drop unless `owns_root`).
    pub fn start_in(
        root: PathBuf,
        owns_root: bool,
        opts: QuestDbServerOptions,
    ) -> Result<Self, QuestDbServerError> {
        let mut server = Self {
            child: None,
            root,
            owns_root,
            ports: QuestDbPorts::free()?,
            opts,
        };
        server.spawn()?;
        Ok(server)
    }

    /// The store's URL: `http://127.0.0.1:<http port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.http)
    }

    pub fn ports(&self) -> QuestDbPorts {
        self.ports
    }

    /// The data root (`db/` holds the tables).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The end of the server's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.root, lines)
    }

    /// Kills the server at once (SIGKILL: no shutdown work, as in a crash) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts it again over the same root on the same ports.
    pub fn restart(&mut self) -> Result<(), QuestDbServerError> {
        self.kill();
        self.spawn()
    }

    fn spawn(&mut self) -> Result<(), QuestDbServerError> {
        let jar = questdb_jar();
        if !jar.is_file() {
            return Err(QuestDbServerError::NotInstalled { jar });
        }
        let root_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| QuestDbServerError::Root { path, source }
        };
        let conf = self.root.join("conf");
        let log_dir = self.root.join("log");
        std::fs::create_dir_all(&conf).map_err(root_err(&conf))?;
        std::fs::create_dir_all(&log_dir).map_err(root_err(&log_dir))?;
        let server_conf_path = conf.join("server.conf");
        std::fs::write(&server_conf_path, server_conf(self.ports, &self.opts))
            .map_err(root_err(&server_conf_path))?;
        let log_conf_path = conf.join("log.conf");
        std::fs::write(&log_conf_path, log_conf(&self.root, &self.opts))
            .map_err(root_err(&log_conf_path))?;
        let jvm_log_path = log_dir.join("jvm.log");
        let jvm_log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&jvm_log_path)
            .map_err(root_err(&jvm_log_path))?;
        let jvm_err = jvm_log.try_clone().map_err(root_err(&jvm_log_path))?;

        let java = java_binary();
        let child = Command::new(&java)
            .arg(format!("-Xms{}m", self.opts.heap_mb.min(64)))
            .arg(format!("-Xmx{}m", self.opts.heap_mb))
            .args([
                "-XX:+UseParallelGC",
                "-XX:ParallelGCThreads=2",
                "-XX:CICompilerCount=2",
                "-ea",
                "-Dnoebug",
                "--add-exports",
                "java.base/jdk.internal.math=io.questdb",
                "--add-exports",
                "java.base/jdk.internal.vm=io.questdb",
                "-p",
            ])
            .arg(&jar)
            .args(["-m", "io.questdb/io.questdb.ServerMain", "-d"])
            .arg(&self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::from(jvm_log))
            .stderr(Stdio::from(jvm_err))
            .spawn()
            .map_err(|source| QuestDbServerError::Spawn {
                java: java.clone(),
                source,
            })?;
        self.child = Some(child);
        self.wait_ready()
    }

    /// Waits until `SELECT 1` answers over HTTP; fails early when the process exits.
    fn wait_ready(&mut self) -> Result<(), QuestDbServerError> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(2)))
            .build()
            .into();
        let url = format!("{}/exec", self.url());
        let start = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(QuestDbServerError::Exited {
                        status,
                        http_port: self.ports.http,
                        log: log_tail(&self.root, 40),
                    });
                }
            }
            let answered = agent
                .get(&url)
                .query("query", "SELECT 1")
                .call()
                .map(|r| r.status().is_success())
                .unwrap_or(false);
            if answered {
                tracing::info!(
                    url = %self.url(),
                    root = %self.root.display(),
                    ms = start.elapsed().as_millis() as u64,
                    "questdb is up"
                );
                return Ok(());
            }
            if start.elapsed() >= READY_TIMEOUT {
                let log = log_tail(&self.root, 40);
                self.kill();
                return Err(QuestDbServerError::NotReady {
                    http_port: self.ports.http,
                    secs: READY_TIMEOUT.as_secs(),
                    log,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for QuestDbServer {
    fn drop(&mut self) {
        self.kill();
        if self.owns_root {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_version_is_the_one_the_install_script_installs() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/questdb/install.sh");
        let text = std::fs::read_to_string(&script).unwrap();
        assert!(
            text.lines()
                .any(|l| l.trim() == format!("version=\"{QUESTDB_VERSION}\"")),
            "{} does not install QuestDB {QUESTDB_VERSION}",
            script.display()
        );
    }

    #[test]
    fn the_server_listens_on_loopback_only() {
        let ports = QuestDbPorts {
            http: 1,
            ilp: 2,
            pg: 3,
        };
        let conf = server_conf(ports, &QuestDbServerOptions::default());
        assert!(conf.contains("http.bind.to=127.0.0.1:1\n"), "{conf}");
        assert!(
            conf.contains("line.tcp.net.bind.to=127.0.0.1:2\n"),
            "{conf}"
        );
        assert!(conf.contains("pg.net.bind.to=127.0.0.1:3\n"), "{conf}");
        assert!(conf.contains("http.min.enabled=false\n"), "{conf}");
        assert!(conf.contains("line.udp.enabled=false\n"), "{conf}");
    }

    /// The server answers SQL on its HTTP port and takes connections on its ILP and PG ports;
    /// when the test holding it panics, unwinding kills the process and removes its root.
    #[test]
    fn a_started_server_answers_and_a_panic_removes_everything() {
        let (tx, rx) = std::sync::mpsc::channel();
        let outcome = std::thread::spawn(move || {
            let server = QuestDbServer::start().unwrap();
            tx.send((server.root().to_path_buf(), server.ports()))
                .unwrap();
            let body = ureq::get(format!("{}/exec", server.url()))
                .query("query", "SELECT build()")
                .call()
                .unwrap()
                .into_body()
                .read_to_string()
                .unwrap();
            assert!(
                body.contains(&format!("QuestDB {QUESTDB_VERSION}")),
                "{body}"
            );
            for port in [server.ports().ilp, server.ports().pg] {
                std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            }
            panic!("the test fails while it holds the server");
        })
        .join();
        let (root, ports) = rx.recv().unwrap();
        let msg = outcome
            .expect_err("the thread panicked")
            .downcast::<&str>()
            .map(|m| m.to_string())
            .unwrap_or_else(|_| "a check failed".to_owned());
        assert_eq!(msg, "the test fails while it holds the server");
        assert!(!root.exists(), "{} left behind", root.display());
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", ports.http)).is_err(),
            "the server still listens after the panic"
        );
    }
}
