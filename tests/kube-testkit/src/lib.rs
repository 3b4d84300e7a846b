//! A real Kubernetes control plane for the end-to-end tests and `aware bench kube`: etcd,
//! kube-apiserver (RBAC, a service-account issuer and signing key, certificates generated here),
//! kube-controller-manager, kube-scheduler and kwok faking a few nodes, each a child process on
//! free loopback ports.
//!
//! The binaries are the ones `tests/k8s/build.sh` builds from the pinned Go module (the README's
//! test command runs it and exports `AWARE_K8S_BIN`; without that variable the harness runs the
//! script itself, which answers at once when its cache is complete). Nothing is shared between
//! clusters: each has its own temporary directory (certificates, kubeconfigs, etcd's data, the
//! components' logs), removed when the [`KubeCluster`] is dropped — also while a test panics, when
//! the tail of every component's log is printed first. Every component runs in its own process
//! group, killed on drop; a watchdog shell kills them and removes the directory if the test
//! process dies without dropping the cluster (a SIGKILL, a timeout's kill).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use aware_shared::testkit::free_port;

/// Why the control plane could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("tests/k8s/build.sh failed ({0}); run `bash tests/k8s/build.sh` to see why")]
    Build(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate generation: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("no free port: {0}")]
    Port(#[from] aware_shared::testkit::HarnessError),
    #[error("cannot start {bin}: {source}")]
    Spawn {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{component} exited ({status}) while starting; its log ends with:\n{log}")]
    Exited {
        component: String,
        status: std::process::ExitStatus,
        log: String,
    },
    #[error("{what} not reached within {secs} s; the components' logs end with:\n{logs}")]
    NotReady {
        what: String,
        secs: u64,
        logs: String,
    },
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("TokenRequest for {namespace}/{name} returned no token")]
    NoToken { namespace: String, name: String },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> KubeError {
    let what = what.into();
    move |source| KubeError::Io { what, source }
}

/// How long a component may take to become ready: the machines are small and shared.
const READY_WITHIN: Duration = Duration::from_secs(180);

/// The service network; its first address is the `kubernetes` Service, named in the serving
/// certificate as in-cluster clients would use it.
const SERVICE_CIDR: &str = "10.96.0.0/16";
const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";

/// The annotation kwok selects the nodes it fakes by.
pub const KWOK_NODE_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// The directory of the control-plane binaries: `$AWARE_K8S_BIN`, else what `tests/k8s/build.sh`
/// prints (it builds them once into its cache).
pub fn bin_dir() -> Result<PathBuf, KubeError> {
    if let Some(dir) = std::env::var_os("AWARE_K8S_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../k8s/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(io(format!("run {}", script.display())))?;
    if !out.status.success() {
        return Err(KubeError::Build(out.status.to_string()));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout.lines().last().unwrap_or_default().trim();
    if dir.is_empty() {
        return Err(KubeError::Build("it printed no directory".into()));
    }
    Ok(PathBuf::from(dir))
}

/// What to start.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// Fake nodes kwok keeps Ready (each 32 CPUs, 256 GiB, 110 pods).
    pub nodes: usize,
}

impl Default for KubeOptions {
    fn default() -> Self {
        KubeOptions { nodes: 3 }
    }
}

/// One component process, in its own process group, its output in `log`.
struct Component {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Component {
    fn kill(&mut self) {
        // The whole group: a component that forked dies with its children.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last `lines` lines of its log.
    fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// An error if it has exited.
    fn check_alive(&mut self) -> Result<(), KubeError> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(KubeError::Exited {
                component: self.name.to_string(),
                status,
                log: self.tail(40),
            }),
            _ => Ok(()),
        }
    }
}

/// Paths of the generated credentials.
struct Pki {
    ca_cert: PathBuf,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    sa_public: PathBuf,
    sa_private: PathBuf,
}

/// A running control plane; everything stops and its directory is removed on drop.
pub struct KubeCluster {
    components: Vec<Component>,
    /// Kills the components and removes the directory if the test process dies without
    /// dropping the cluster (killed by a signal, or `process::exit`).
    watchdog: Option<Child>,
    server: String,
    admin_kubeconfig: PathBuf,
    ca_cert: PathBuf,
    bin_dir: PathBuf,
    nodes: Vec<String>,
    started_in: Duration,
    // Last: removed after the components are killed.
    dir: tempfile::TempDir,
}

impl KubeCluster {
    /// Starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok, creates
    /// `opts.nodes` fake nodes and waits until the API server is ready, the nodes are Ready and
    /// the controller manager has created the `default` ServiceAccount.
    pub async fn start(opts: KubeOptions) -> Result<KubeCluster, KubeError> {
        let t0 = Instant::now();
        let bin_dir = bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("aware-kube-")
            .tempdir()
            .map_err(io("temporary directory"))?;
        let pki = write_pki(dir.path())?;
        let mut cluster = KubeCluster {
            components: Vec::new(),
            watchdog: None,
            server: String::new(),
            admin_kubeconfig: dir.path().join("admin.kubeconfig"),
            ca_cert: pki.ca_cert.clone(),
            bin_dir,
            nodes: Vec::new(),
            started_in: Duration::ZERO,
            dir,
        };

        cluster.spawn_watchdog()?;

        let etcd_port = free_port()?;
        let etcd_peer_port = free_port()?;
        let etcd_data = cluster.dir.path().join("etcd");
        let etcd_args = vec![
            "--name=aware-test".to_string(),
            format!("--data-dir={}", etcd_data.display()),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
            format!("--initial-cluster=aware-test=http://127.0.0.1:{etcd_peer_port}"),
            // A test's data need not survive a power cut.
            "--unsafe-no-fsync=true".to_string(),
            "--log-level=warn".to_string(),
        ];
        cluster.spawn("etcd", &etcd_args)?;
        let etcd_addr = std::net::SocketAddr::from(([127, 0, 0, 1], etcd_port));
        cluster
            .wait_for("etcd /health", || {
                let ok = matches!(
                    aware_shared::probe::http_get(etcd_addr, "/health"),
                    Ok((200, body)) if body.contains("\"true\"")
                );
                async move { ok }
            })
            .await?;

        let api_port = free_port()?;
        cluster.server = format!("https://127.0.0.1:{api_port}");
        let p = |path: &Path| path.display().to_string();
        let api_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".to_string(),
            "--advertise-address=127.0.0.1".to_string(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", p(&cluster.dir.path().join("apiserver"))),
            format!("--tls-cert-file={}", p(&pki.serving_cert)),
            format!("--tls-private-key-file={}", p(&pki.serving_key)),
            format!("--client-ca-file={}", p(&pki.ca_cert)),
            "--authorization-mode=Node,RBAC".to_string(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            format!("--service-account-key-file={}", p(&pki.sa_public)),
            format!("--service-account-signing-key-file={}", p(&pki.sa_private)),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            // The `kubernetes` Service's endpoints would be 127.0.0.1, which Endpoints refuse.
            "--endpoint-reconciler-type=none".to_string(),
            "--allow-privileged=true".to_string(),
            "--profiling=false".to_string(),
        ];
        cluster.spawn("kube-apiserver", &api_args)?;
        write_kubeconfig(
            &cluster.admin_kubeconfig,
            &cluster.server,
            &pki.ca_cert,
            &User::Certificate {
                cert: cluster.dir.path().join("admin.crt"),
                key: cluster.dir.path().join("admin.key"),
            },
        )?;
        let admin = cluster.admin_client().await?;
        cluster
            .wait_for("kube-apiserver /readyz", || {
                let admin = admin.clone();
                async move {
                    let req = http::Request::get("/readyz").body(Vec::new());
                    match req {
                        Ok(req) => admin
                            .request_text(req)
                            .await
                            .is_ok_and(|b| b.trim() == "ok"),
                        Err(_) => false,
                    }
                }
            })
            .await?;

        // The controller manager and the scheduler with their own identities, which the API
        // server's default RBAC bindings authorize; their HTTPS endpoints are not needed.
        for name in ["kube-controller-manager", "kube-scheduler"] {
            let (cert, key) = (
                cluster.dir.path().join(format!("{name}.crt")),
                cluster.dir.path().join(format!("{name}.key")),
            );
            write_kubeconfig(
                &cluster.dir.path().join(format!("{name}.kubeconfig")),
                &cluster.server,
                &pki.ca_cert,
                &User::Certificate { cert, key },
            )?;
        }
        let kcm_kubeconfig = cluster
            .dir
            .path()
            .join("kube-controller-manager.kubeconfig");
        let kcm_args = vec![
            format!("--kubeconfig={}", p(&kcm_kubeconfig)),
            format!("--service-account-private-key-file={}", p(&pki.sa_private)),
            format!("--root-ca-file={}", p(&pki.ca_cert)),
            // Each controller calls the API server with its own ServiceAccount, as in a cluster.
            "--use-service-account-credentials=true".to_string(),
            "--leader-elect=false".to_string(),
            "--secure-port=0".to_string(),
            "--profiling=false".to_string(),
        ];
        cluster.spawn("kube-controller-manager", &kcm_args)?;
        let sched_kubeconfig = cluster.dir.path().join("kube-scheduler.kubeconfig");
        let sched_args = vec![
            format!("--kubeconfig={}", p(&sched_kubeconfig)),
            "--leader-elect=false".to_string(),
            "--secure-port=0".to_string(),
            "--profiling=false".to_string(),
        ];
        cluster.spawn("kube-scheduler", &sched_args)?;

        let kwok_config = cluster.dir.path().join("kwok.yaml");
        write_kwok_config(&cluster.bin_dir, &kwok_config)?;
        let kwok_port = free_port()?;
        let kwok_args = vec![
            format!("--kubeconfig={}", p(&cluster.admin_kubeconfig)),
            format!("--config={}", p(&kwok_config)),
            "--manage-all-nodes=false".to_string(),
            format!(
                "--manage-nodes-with-annotation-selector={}={}",
                KWOK_NODE_ANNOTATION.0, KWOK_NODE_ANNOTATION.1
            ),
            "--node-lease-duration-seconds=40".to_string(),
            format!("--server-address=127.0.0.1:{kwok_port}"),
        ];
        cluster.spawn("kwok", &kwok_args)?;

        let nodes: Api<Node> = Api::all(admin.clone());
        for i in 0..opts.nodes {
            let name = format!("kwok-node-{i}");
            nodes
                .create(&PostParams::default(), &fake_node(&name)?)
                .await?;
            cluster.nodes.push(name);
        }
        let want = opts.nodes;
        cluster
            .wait_for("every fake node Ready", || {
                let nodes = nodes.clone();
                async move {
                    let Ok(list) = nodes.list(&ListParams::default()).await else {
                        return false;
                    };
                    list.items.iter().filter(|n| node_ready(n)).count() >= want
                }
            })
            .await?;
        let default_sa: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
        cluster
            .wait_for("the controller manager's `default` ServiceAccount", || {
                let sa = default_sa.clone();
                async move { matches!(sa.get_opt("default").await, Ok(Some(_))) }
            })
            .await?;
        cluster.started_in = t0.elapsed();
        Ok(cluster)
    }

    /// Starts `bin_dir/name args…` in its own process group, output to `<dir>/<name>.log`.
    fn spawn(&mut self, name: &'static str, args: &[String]) -> Result<(), KubeError> {
        use std::os::unix::process::CommandExt;
        let bin = self.bin_dir.join(name);
        let log = self.dir.path().join(format!("{name}.log"));
        let out = std::fs::File::create(&log).map_err(io(format!("create {}", log.display())))?;
        let err = out.try_clone().map_err(io("clone log file"))?;
        let child = Command::new(&bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|source| KubeError::Spawn {
                bin: bin.display().to_string(),
                source,
            })?;
        // The watchdog's list of process groups to kill.
        let pgids = self.dir.path().join("pgids");
        let mut list = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&pgids)
            .map_err(io(format!("open {}", pgids.display())))?;
        std::io::Write::write_all(&mut list, format!("{}\n", child.id()).as_bytes())
            .map_err(io(format!("write {}", pgids.display())))?;
        self.components.push(Component { name, child, log });
        Ok(())
    }

    /// A shell that waits for this process to die, then kills every process group listed in
    /// `<dir>/pgids` and removes the directory. Dropping the cluster kills it first.
    fn spawn_watchdog(&mut self) -> Result<(), KubeError> {
        use std::os::unix::process::CommandExt;
        const SCRIPT: &str = r#"while kill -0 "$1" 2>/dev/null; do sleep 1; done
for g in $(cat "$2/pgids" 2>/dev/null); do kill -s KILL -- "-$g" 2>/dev/null; done
rm -rf "$2""#;
        let child = Command::new("sh")
            .args(["-c", SCRIPT, "aware-kube-watchdog"])
            .arg(std::process::id().to_string())
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|source| KubeError::Spawn {
                bin: "sh".into(),
                source,
            })?;
        self.watchdog = Some(child);
        Ok(())
    }

    /// Polls `ready` every 100 ms until it holds; fails when a component exits or after
    /// [`READY_WITHIN`].
    async fn wait_for<F, Fut>(&mut self, what: &str, ready: F) -> Result<(), KubeError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            for c in &mut self.components {
                c.check_alive()?;
            }
            if ready().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(KubeError::NotReady {
                    what: what.to_string(),
                    secs: READY_WITHIN.as_secs(),
                    logs: self.logs(20),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last `lines` lines of every component's log, each under its name.
    pub fn logs(&self, lines: usize) -> String {
        self.components
            .iter()
            .map(|c| format!("--- {} ---\n{}", c.name, c.tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The API server's URL (`https://127.0.0.1:<port>`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The CA that signed the API server's serving certificate (PEM file).
    pub fn ca_cert(&self) -> &Path {
        &self.ca_cert
    }

    /// A kubeconfig of a cluster administrator (client certificate in `system:masters`), for
    /// kubectl, helm and processes under test.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// The directory of the binaries (kubectl, helm, …) this cluster runs.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// Names of the fake nodes.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The cluster's temporary directory (certificates, kubeconfigs, etcd's data, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Name and process id of every running component, in start order.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.components
            .iter()
            .map(|c| (c.name, c.child.id()))
            .collect()
    }

    /// How long [`KubeCluster::start`] took until everything was ready.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// A client with the administrator's credentials.
    pub async fn admin_client(&self) -> Result<kube::Client, KubeError> {
        client_from(&self.admin_kubeconfig).await
    }

    /// A token of ServiceAccount `namespace/name` from the TokenRequest API, valid for an hour.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<String, KubeError> {
        let sas: Api<ServiceAccount> = Api::namespaced(self.admin_client().await?, namespace);
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: Some(3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let resp = sas
            .create_token_request(name, &PostParams::default(), &req)
            .await?;
        resp.status
            .map(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| KubeError::NoToken {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
    }

    /// Writes a kubeconfig that authenticates with `token` into the cluster's directory and
    /// returns its path (for processes that run as a ServiceAccount).
    pub fn token_kubeconfig(&self, file_name: &str, token: &str) -> Result<PathBuf, KubeError> {
        let path = self.dir.path().join(file_name);
        write_kubeconfig(
            &path,
            &self.server,
            &self.ca_cert,
            &User::Token(token.to_string()),
        )?;
        Ok(path)
    }

    /// A client that authenticates with `token`.
    pub async fn token_client(&self, token: &str) -> Result<kube::Client, KubeError> {
        let path = self.token_kubeconfig(&format!("token-{}.kubeconfig", free_port()?), token)?;
        client_from(&path).await
    }

    /// A command running `bin_dir/name` (kubectl, helm) against this cluster as administrator.
    pub fn command(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(name));
        cmd.env("KUBECONFIG", &self.admin_kubeconfig)
            .env("HELM_CACHE_HOME", self.dir.path().join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.path().join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.path().join("helm/data"));
        cmd
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "kube harness: the test panicked; the components' logs end with:\n{}",
                self.logs(30)
            );
        }
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        // Reverse start order: the clients go before the API server, the API server before etcd.
        while let Some(mut c) = self.components.pop() {
            c.kill();
        }
    }
}

/// Whether a node's Ready condition is True.
pub fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn client_from(kubeconfig: &Path) -> Result<kube::Client, KubeError> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// A node kwok manages (by its annotation), with room for many pods.
fn fake_node(name: &str) -> Result<Node, KubeError> {
    let capacity = serde_json::json!({ "cpu": "32", "memory": "256Gi", "pods": "110" });
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": { KWOK_NODE_ANNOTATION.0: KWOK_NODE_ANNOTATION.1, "node.alpha.kubernetes.io/ttl": "0" },
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok"
            }
        },
        "status": {
            "allocatable": capacity,
            "capacity": capacity,
            "nodeInfo": { "kubeletVersion": "fake", "kubeProxyVersion": "fake", "architecture": "amd64", "operatingSystem": "linux" }
        }
    }))?)
}

/// kwok's stage configs as build.sh copied them from the pinned kwok module: nodes become Ready
/// and keep their lease, pods become Running, complete and are deleted as a kubelet would.
fn write_kwok_config(bin_dir: &Path, path: &Path) -> Result<(), KubeError> {
    let stages = bin_dir.join("../kwok-stages");
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&stages)
        .map_err(io(format!("read {}", stages.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    entries.sort();
    let mut text = String::new();
    for e in entries {
        text.push_str("---\n");
        text.push_str(&std::fs::read_to_string(&e).map_err(io(format!("read {}", e.display())))?);
        text.push('\n');
    }
    std::fs::write(path, text).map_err(io(format!("write {}", path.display())))
}

enum User {
    Certificate { cert: PathBuf, key: PathBuf },
    Token(String),
}

/// A kubeconfig (JSON, which every kubeconfig reader accepts) for one cluster and one user.
fn write_kubeconfig(path: &Path, server: &str, ca: &Path, user: &User) -> Result<(), KubeError> {
    let user = match user {
        User::Certificate { cert, key } => serde_json::json!({
            "client-certificate": cert, "client-key": key
        }),
        User::Token(t) => serde_json::json!({ "token": t }),
    };
    let kc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "aware-test", "cluster": { "server": server, "certificate-authority": ca } }],
        "users": [{ "name": "aware-test", "user": user }],
        "contexts": [{ "name": "aware-test", "context": { "cluster": "aware-test", "user": "aware-test", "namespace": "default" } }],
        "current-context": "aware-test"
    });
    let text = serde_json::to_string_pretty(&kc)?;
    std::fs::write(path, text).map_err(io(format!("write {}", path.display())))
}

/// A CA; the API server's serving certificate; client certificates for the administrator, the
/// controller manager and the scheduler; the service-account signing key pair. Written to `dir`.
fn write_pki(dir: &Path) -> Result<Pki, KubeError> {
    let write = |name: &str, text: String| -> Result<PathBuf, KubeError> {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(io(format!("write {}", path.display())))?;
        Ok(path)
    };
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.distinguished_name
        .push(DnType::CommonName, "aware test Kubernetes CA");
    let ca_cert = ca.self_signed(&ca_key)?;

    let leaf = |sans: Vec<String>,
                cn: &str,
                org: Option<&str>,
                usage: ExtendedKeyUsagePurpose|
     -> Result<(Certificate, KeyPair), KubeError> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(sans)?;
        p.distinguished_name.push(DnType::CommonName, cn);
        if let Some(o) = org {
            p.distinguished_name.push(DnType::OrganizationName, o);
        }
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![usage];
        let cert = p.signed_by(&key, &ca_cert, &ca_key)?;
        Ok((cert, key))
    };

    let sans = [
        "127.0.0.1",
        "localhost",
        KUBERNETES_SERVICE_IP,
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    .map(String::from)
    .to_vec();
    let (serving, serving_key) = leaf(
        sans,
        "kube-apiserver",
        None,
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    for (file, cn, org) in [
        ("admin", "aware-test-admin", Some("system:masters")),
        (
            "kube-controller-manager",
            "system:kube-controller-manager",
            None,
        ),
        ("kube-scheduler", "system:kube-scheduler", None),
    ] {
        let (cert, key) = leaf(Vec::new(), cn, org, ExtendedKeyUsagePurpose::ClientAuth)?;
        write(&format!("{file}.crt"), cert.pem())?;
        write(&format!("{file}.key"), key.serialize_pem())?;
    }
    let sa = KeyPair::generate()?;
    Ok(Pki {
        ca_cert: write("ca.crt", ca_cert.pem())?,
        serving_cert: write("apiserver.crt", serving.pem())?,
        serving_key: write("apiserver.key", serving_key.serialize_pem())?,
        sa_public: write("sa.pub", sa.public_key_pem())?,
        sa_private: write("sa.key", sa.serialize_pem())?,
    })
}
