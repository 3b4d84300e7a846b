//! Configuration: defaults → file → `AWARE_…` environment (`__` for nesting) → flags, via the
//! `config` crate. Invalid values fail start-up with an error naming the key.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;

use aware_bus_schemas::{subject, EventKind, Target};
use serde::{Deserialize, Serialize};

/// Errors loading or validating configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("configuration key `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// Everything a service (or `aware run all`) is configured with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AppConfig {
    pub bus: BusConfig,
    pub http: HttpConfig,
    pub log: LogConfig,
    pub shard: ShardConfig,
    pub actors: ActorsConfig,
    /// Targets managed from start-up (the Kubernetes controller registers more at run time).
    pub targets: Vec<crate::spec::TargetSpec>,
    pub lifecycle: LifecycleProfile,
    pub learning: LearningConfig,
    /// Sections owned by one service (e.g. `[actuator]`), read with [`AppConfig::section`].
    #[serde(flatten)]
    pub sections: std::collections::BTreeMap<String, serde_json::Value>,
}

/// The learning problem's settings every per-target service agrees on (docs/design.md §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LearningConfig {
    /// Control steps per episode (100 in the paper): the collector numbers steps by it, the
    /// recorder closes episodes by it.
    pub steps_per_episode: u32,
    /// What the learner maximizes: the paper's weighted reward, or the fewest requested
    /// resources within the SLO's error budget (docs/adr/0016-constrained-objective.md).
    pub objective: aware_mdp::Objective,
    /// SIMPPO's virtual agent (docs/adr/0027-mean-field-state.md): each target's state ends
    /// with the mean field of the others on its cluster ([`aware_mdp::MEAN_FIELD_NAMES`]); the
    /// collector computes it, the trainer's networks take the wider state. Off by default.
    pub mean_field: bool,
}

impl Default for LearningConfig {
    fn default() -> Self {
        LearningConfig {
            steps_per_episode: 100,
            objective: aware_mdp::Objective::default(),
            mean_field: false,
        }
    }
}

/// The sections of [`AppConfig`] itself.
pub const CORE_SECTIONS: [&str; 8] = [
    "bus",
    "http",
    "log",
    "shard",
    "actors",
    "targets",
    "lifecycle",
    "learning",
];

/// The sections one service owns, read with [`AppConfig::section`] (each service's type denies
/// unknown keys in its own section).
pub const SERVICE_SECTIONS: [&str; 9] = [
    "actuator",
    "collector",
    "controller",
    "lifecycle_monitor",
    "model_store",
    "recommender",
    "recorder",
    "trainer",
    "trajectory_store",
];

#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusConfig {
    /// `embedded` (in-process bus) or a NATS URL such as `nats://127.0.0.1:4222`; a
    /// comma-separated list for a cluster, tried in the order listed. Credentials may be written into it
    /// (`nats://user:password@host`, `nats://token@host`, percent-encoded) or set in `auth`.
    pub url: String,
    /// Buffer per subscription, messages.
    pub channel_capacity: usize,
    /// How long start-up keeps retrying the first connection.
    pub connect_timeout_ms: u64,
    /// Upper bound of the exponential reconnect backoff.
    pub reconnect_max_delay_ms: u64,
    /// How long a flush (at shutdown, after a registration) waits for the server to confirm what
    /// was published; past it the flush fails, so a service whose NATS server is unreachable
    /// still stops on SIGTERM.
    pub flush_timeout_ms: u64,
    /// Subject prefix of the client's reply inboxes (JetStream and object store replies arrive
    /// there). With per-service permissions each identity gets its own (`_INBOX_<identity>`,
    /// see `aware nats-config`), so no service can read another's replies.
    pub inbox_prefix: String,
    pub jetstream: JetStreamConfig,
    /// Client credentials (at most one method; none when the URL carries them).
    pub auth: BusAuthConfig,
    /// TLS towards the NATS server.
    pub tls: BusTlsConfig,
}

impl std::fmt::Debug for BusConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusConfig")
            .field("url", &crate::bus::redact_url(&self.url))
            .field("channel_capacity", &self.channel_capacity)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("reconnect_max_delay_ms", &self.reconnect_max_delay_ms)
            .field("flush_timeout_ms", &self.flush_timeout_ms)
            .field("inbox_prefix", &self.inbox_prefix)
            .field("jetstream", &self.jetstream)
            .field("auth", &self.auth)
            .field("tls", &self.tls)
            .finish()
    }
}

impl BusConfig {
    /// The `[bus]` section's values; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = &self.url;
        if url != crate::bus::EMBEDDED
            && !["nats://", "tls://", "ws://", "wss://"]
                .iter()
                .any(|p| url.starts_with(p))
        {
            return Err(invalid(
                "bus.url",
                format!(
                    "`{}` is neither `embedded` nor a nats://, tls://, ws:// or wss:// URL",
                    crate::bus::redact_url(url)
                ),
            ));
        }
        self.auth.validate()?;
        self.tls.validate()?;
        if url != crate::bus::EMBEDDED {
            // Credentials in the URL: parsed (and checked against `bus.auth`) as the bus will.
            crate::bus::auth::servers_and_url_credentials(url, &self.auth)
                .map_err(|e| invalid("bus.url", e.to_string()))?;
        }
        let inbox = &self.inbox_prefix;
        if inbox.is_empty()
            || inbox.starts_with('.')
            || inbox.ends_with('.')
            || inbox.contains("..")
            || !inbox
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '$'))
        {
            return Err(invalid(
                "bus.inbox_prefix",
                format!("`{inbox}` is not a subject prefix (letters, digits, `_`, `-`, `$`, dots between tokens)"),
            ));
        }
        if self.channel_capacity == 0 {
            return Err(invalid("bus.channel_capacity", "must be at least 1"));
        }
        // 0 would mean: give up on the first connection at once, reconnect in a busy loop,
        // fail every flush.
        for (key, v) in [
            ("bus.connect_timeout_ms", self.connect_timeout_ms),
            ("bus.reconnect_max_delay_ms", self.reconnect_max_delay_ms),
            ("bus.flush_timeout_ms", self.flush_timeout_ms),
            (
                "bus.jetstream.ack_timeout_ms",
                self.jetstream.ack_timeout_ms,
            ),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if self.jetstream.max_bytes == 0 || self.jetstream.max_bytes < -1 {
            return Err(invalid(
                "bus.jetstream.max_bytes",
                format!(
                    "{} (must be positive, or -1: unlimited)",
                    self.jetstream.max_bytes
                ),
            ));
        }
        if self.jetstream.stream.is_empty()
            || !self
                .jetstream
                .stream
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(
                "bus.jetstream.stream",
                "must be non-empty letters, digits, `-` or `_`",
            ));
        }
        if self.jetstream.state_bucket.is_empty()
            || !self
                .jetstream
                .state_bucket
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(
                "bus.jetstream.state_bucket",
                "must be non-empty letters, digits, `-` or `_`",
            ));
        }
        if self.jetstream.replicas == 0 || self.jetstream.replicas > 5 {
            return Err(invalid("bus.jetstream.replicas", "must be between 1 and 5"));
        }
        let p = self.jetstream.partitions;
        if p == 0 || p > subject::SLOTS {
            return Err(invalid(
                "bus.jetstream.partitions",
                format!(
                    "{p} (must be from 1 to {}, the slots a subject carries)",
                    subject::SLOTS
                ),
            ));
        }
        if self.jetstream.max_bytes > 0 && self.jetstream.max_bytes < i64::from(p) {
            return Err(invalid(
                "bus.jetstream.max_bytes",
                format!(
                    "{} is less than a byte for each of the {p} partitions",
                    self.jetstream.max_bytes
                ),
            ));
        }
        Ok(())
    }

    /// This configuration with every secret masked (`***`): the password or token in `url`,
    /// `auth.password` and `auth.token`. What `aware config` prints.
    pub fn redacted(&self) -> BusConfig {
        let mask = |s: &str| {
            if s.is_empty() {
                String::new()
            } else {
                MASK.to_string()
            }
        };
        BusConfig {
            url: crate::bus::redact_url(&self.url),
            auth: BusAuthConfig {
                password: mask(&self.auth.password),
                token: mask(&self.auth.token),
                ..self.auth.clone()
            },
            ..self.clone()
        }
    }
}

/// What a secret is shown as.
pub const MASK: &str = "***";

/// How a service authenticates to the NATS server: `user` with `password` or `password_file`,
/// `token` or `token_file`, `nkey_seed_file`, or `creds_file` (a user JWT and its NKey seed). The
/// `*_file` forms read the secret from a file (a mounted Kubernetes Secret); surrounding
/// whitespace is trimmed. Empty strings mean unset.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusAuthConfig {
    pub user: String,
    pub password: String,
    pub password_file: String,
    pub token: String,
    pub token_file: String,
    pub nkey_seed_file: String,
    pub creds_file: String,
}

impl std::fmt::Debug for BusAuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mask = |s: &str| if s.is_empty() { "" } else { MASK };
        f.debug_struct("BusAuthConfig")
            .field("user", &self.user)
            .field("password", &mask(&self.password))
            .field("password_file", &self.password_file)
            .field("token", &mask(&self.token))
            .field("token_file", &self.token_file)
            .field("nkey_seed_file", &self.nkey_seed_file)
            .field("creds_file", &self.creds_file)
            .finish()
    }
}

impl BusAuthConfig {
    /// The keys set, as `bus.auth.<key>`.
    pub fn keys_set(&self) -> Vec<&'static str> {
        [
            ("bus.auth.user", &self.user),
            ("bus.auth.password", &self.password),
            ("bus.auth.password_file", &self.password_file),
            ("bus.auth.token", &self.token),
            ("bus.auth.token_file", &self.token_file),
            ("bus.auth.nkey_seed_file", &self.nkey_seed_file),
            ("bus.auth.creds_file", &self.creds_file),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, _)| k)
        .collect()
    }

    /// Refuses contradictory or incomplete combinations, naming the keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let set = |v: &String| !v.is_empty();
        let both = |a: &str, b: &str| {
            invalid(
                &format!("{a}` and `{b}"),
                "both set; set one (the value or the file holding it)",
            )
        };
        if set(&self.password) && set(&self.password_file) {
            return Err(both("bus.auth.password", "bus.auth.password_file"));
        }
        if set(&self.token) && set(&self.token_file) {
            return Err(both("bus.auth.token", "bus.auth.token_file"));
        }
        let has_password = set(&self.password) || set(&self.password_file);
        if set(&self.user) && !has_password {
            return Err(invalid(
                "bus.auth.user",
                "needs `bus.auth.password` or `bus.auth.password_file`",
            ));
        }
        if has_password && !set(&self.user) {
            return Err(invalid(
                "bus.auth.user",
                "is empty, but a password is set (`bus.auth.password` or `bus.auth.password_file`)",
            ));
        }
        let methods: Vec<&str> = [
            ("bus.auth.user", set(&self.user)),
            (
                if set(&self.token) {
                    "bus.auth.token"
                } else {
                    "bus.auth.token_file"
                },
                set(&self.token) || set(&self.token_file),
            ),
            ("bus.auth.nkey_seed_file", set(&self.nkey_seed_file)),
            ("bus.auth.creds_file", set(&self.creds_file)),
        ]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(k, _)| k)
        .collect();
        if methods.len() > 1 {
            return Err(invalid(
                &methods.join("` and `"),
                "contradictory credentials: a connection authenticates one way (user and \
                 password, token, NKey seed or creds file); set one",
            ));
        }
        Ok(())
    }
}

/// TLS towards the NATS server. Without `ca_file` the server's certificate is checked against
/// the system's trust store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusTlsConfig {
    /// Connect only over TLS (as a `tls://` URL does), even when the server does not ask for it.
    pub required: bool,
    /// PEM file of the CA certificate(s) that signed the server's certificate.
    pub ca_file: String,
    /// PEM client certificate, for servers that verify clients (`verify: true`); with `key_file`.
    pub cert_file: String,
    /// PEM private key of `cert_file`.
    pub key_file: String,
}

impl BusTlsConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        match (self.cert_file.is_empty(), self.key_file.is_empty()) {
            (false, true) => Err(invalid(
                "bus.tls.key_file",
                "needed with `bus.tls.cert_file`",
            )),
            (true, false) => Err(invalid(
                "bus.tls.cert_file",
                "needed with `bus.tls.key_file`",
            )),
            _ => Ok(()),
        }
    }
}

impl Default for BusConfig {
    fn default() -> Self {
        BusConfig {
            url: crate::bus::EMBEDDED.to_string(),
            channel_capacity: 65_536,
            connect_timeout_ms: 10_000,
            reconnect_max_delay_ms: 5_000,
            flush_timeout_ms: 5_000,
            inbox_prefix: "_INBOX".to_string(),
            jetstream: JetStreamConfig::default(),
            auth: BusAuthConfig::default(),
            tls: BusTlsConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageKind {
    File,
    Memory,
}

/// The JetStream stream that captures `aware.v1.>` on NATS.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JetStreamConfig {
    pub enabled: bool,
    pub stream: String,
    /// The key-value bucket holding every target's current state: the newest `lifecycle`,
    /// `model`, `embedding` and `target` message per target (key: the message's subject), kept
    /// without an age or size limit, so a restarted service finds its targets' stages, models
    /// and registrations however old and however full the capture stream is.
    pub state_bucket: String,
    /// Retention by age, seconds.
    pub max_age_secs: u64,
    /// Retention by size, bytes (-1: unlimited): the whole capture's, split over its
    /// partitions by the slots each holds.
    pub max_bytes: i64,
    /// How many streams the capture is split into (1 to the 256 slots): partition `k` keeps
    /// the slots `s` with `s mod partitions = k`, in the stream `<stream>_<k>` (one partition:
    /// the stream `<stream>`, capturing `aware.v1.>`). A shard reads only the partitions
    /// holding its slots: `partitions / shard.count` of them when `shard.count` divides
    /// `partitions`, one shared with other shards when `partitions` divides `shard.count`,
    /// all of them otherwise. Fixed for a deployment's life: the streams' subjects follow it
    /// (ADR 0024).
    pub partitions: u32,
    pub storage: StorageKind,
    pub replicas: usize,
    /// Publish every message through JetStream and go on only once the capture stream (and,
    /// for state, the state bucket) has stored it, retrying with the same message id (the
    /// stream drops the repeat) for up to `ack_timeout_ms`. For a NATS cluster: a server cut
    /// off from the others, or a stream between leaders, stores nothing, and a plain publish
    /// would go on and be decided without ever reaching the trajectory store.
    pub ack_publishes: bool,
    /// How long an acknowledged publish is retried before it fails, milliseconds.
    pub ack_timeout_ms: u64,
}

impl Default for JetStreamConfig {
    fn default() -> Self {
        JetStreamConfig {
            enabled: true,
            stream: "AWARE".to_string(),
            state_bucket: "AWARE_STATE".to_string(),
            max_age_secs: 24 * 3600,
            max_bytes: 1 << 30,
            partitions: 1,
            storage: StorageKind::File,
            replicas: 1,
            ack_publishes: false,
            ack_timeout_ms: 10 * 60 * 1000,
        }
    }
}

impl JetStreamConfig {
    /// The partition holding `target`'s messages: its slot modulo the partitions.
    pub fn partition_of(&self, target: &Target) -> u32 {
        subject::slot(target) % self.partitions.max(1)
    }

    /// The name of partition `k`'s stream: `<stream>` alone when there is one partition.
    pub fn partition_stream(&self, k: u32) -> String {
        if self.partitions <= 1 {
            self.stream.clone()
        } else {
            format!("{}_{k}", self.stream)
        }
    }

    /// Every partition's stream name, in partition order.
    pub fn capture_streams(&self) -> Vec<String> {
        (0..self.partitions.max(1))
            .map(|k| self.partition_stream(k))
            .collect()
    }

    /// The slots partition `k` keeps: every `partitions`-th from `k`.
    fn partition_slots(&self, k: u32) -> impl Iterator<Item = u32> {
        (k..subject::SLOTS).step_by(self.partitions.max(1) as usize)
    }

    /// The subjects partition `k`'s stream captures: everything (`aware.v1.>`) when there is
    /// one partition, else every event of each of its slots.
    pub fn partition_subjects(&self, k: u32) -> Vec<String> {
        if self.partitions <= 1 {
            vec![subject::ALL.to_string()]
        } else {
            self.partition_slots(k)
                .map(|s| format!("{}.*.{s}.*.*", subject::PREFIX))
                .collect()
        }
    }

    /// The byte limit of partition `k`'s stream: its share of [`Self::max_bytes`] by the slots
    /// it holds, so that every partition keeps the same span of time (slots spread targets
    /// evenly) also when the partitions do not divide the slots.
    pub fn partition_max_bytes(&self, k: u32) -> i64 {
        if self.max_bytes < 0 || self.partitions <= 1 {
            return self.max_bytes;
        }
        let slots = self.partition_slots(k).count() as i128;
        let share = i128::from(self.max_bytes) * slots / i128::from(subject::SLOTS);
        // At most max_bytes, so it fits.
        i64::try_from(share).unwrap_or(self.max_bytes).max(1)
    }

    /// The partitions holding a slot of `shard`, in order: the only ones it reads.
    pub fn partitions_of(&self, shard: &ShardConfig) -> Vec<u32> {
        let p = self.partitions.max(1);
        let mut ks: Vec<u32> = shard.slots().map(|s| s % p).collect();
        ks.sort_unstable();
        ks.dedup();
        ks
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Address of `/metrics`, `/healthz`, `/readyz` (port 0: any free port, logged at start).
    pub listen: String,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "0.0.0.0:9464".to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`; the level comes from `RUST_LOG` (default `info`).
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
        }
    }
}

/// This instance owns the targets whose stable hash modulo `count` equals `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShardConfig {
    pub index: u32,
    pub count: u32,
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig { index: 0, count: 1 }
    }
}

impl ShardConfig {
    /// Parses `i/N` (the `--shard` flag).
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| invalid("shard", format!("`{s}` is not of the form i/N")))?;
        let index = i
            .trim()
            .parse()
            .map_err(|_| invalid("shard.index", format!("`{i}` is not a number")))?;
        let count = n
            .trim()
            .parse()
            .map_err(|_| invalid("shard.count", format!("`{n}` is not a number")))?;
        let s = ShardConfig { index, count };
        s.validate()?;
        Ok(s)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.count == 0 {
            return Err(invalid("shard.count", "must be at least 1"));
        }
        if self.count > subject::SLOTS {
            return Err(invalid(
                "shard.count",
                format!(
                    "{} is above {}, the slots a subject carries (a shard owns slots)",
                    self.count,
                    subject::SLOTS
                ),
            ));
        }
        if self.index >= self.count {
            return Err(invalid(
                "shard.index",
                format!("{} is not below shard.count {}", self.index, self.count),
            ));
        }
        Ok(())
    }

    /// Whether this shard owns `target`: its subjects' slot ([`subject::slot`], FNV-1a of
    /// `namespace/name` modulo [`subject::SLOTS`]) modulo the count is the index.
    pub fn owns(&self, target: &Target) -> bool {
        subject::slot(target) % self.count.max(1) == self.index
    }

    /// The slots this shard owns: every `count`-th from `index`.
    pub fn slots(&self) -> impl Iterator<Item = u32> {
        (self.index..subject::SLOTS).step_by(self.count.max(1) as usize)
    }

    /// The subscription filters of `kind` for this shard's targets: one per owned slot, or the
    /// whole kind when there is one shard.
    pub fn filters(&self, kind: EventKind) -> Vec<String> {
        if self.count <= 1 {
            vec![subject::kind_filter(kind)]
        } else {
            self.slots()
                .map(|s| subject::slot_filter(kind, s))
                .collect()
        }
    }
}

/// The per-target actors of the recommender, actuator, lifecycle monitor and trainer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActorsConfig {
    /// A deregistered target's actor (its `AwareAutoscaler` deleted and not created again) is
    /// stopped this long after the deregistration, seconds; 0 keeps it while the service runs.
    /// Its events are dropped from then on until it is registered again ([`crate::agents`]).
    pub retire_after_secs: u64,
    /// At most this many targets (actors) per service: an event that would start one more is
    /// refused and counted (`aware_target_refusals_total{reason="max_targets"}`), so a flood of
    /// made-up targets cannot exhaust a service.
    pub max_targets: usize,
    /// Only targets registered by the controller (`target/1`) or listed in `targets` get an
    /// actor in the services that follow registrations (the recommender, actuator, recorder,
    /// lifecycle monitor); events of any other target are refused and counted
    /// (`reason="unregistered"`). For deployments whose targets all come from the controller.
    pub require_registration: bool,
    /// The per-target actors of a process run on this many arbiters (threads with their own event
    /// loop), a target always on the same one (a stable hash of its key); 0: one per core the
    /// process may use (available parallelism). Shared by the services of one process.
    pub arbiters: usize,
}

impl Default for ActorsConfig {
    fn default() -> Self {
        ActorsConfig {
            retire_after_secs: 3600,
            max_targets: 10_000,
            require_registration: false,
            arbiters: 0,
        }
    }
}

/// The dotted keys under `prefix` whose values are null, in order.
fn null_paths(v: &serde_json::Value, prefix: &str) -> Vec<String> {
    match v {
        serde_json::Value::Null => vec![prefix.to_string()],
        serde_json::Value::Object(m) => m
            .iter()
            .flat_map(|(k, v)| null_paths(v, &format!("{prefix}.{k}")))
            .collect(),
        serde_json::Value::Array(a) => a
            .iter()
            .enumerate()
            .flat_map(|(i, v)| null_paths(v, &format!("{prefix}[{i}]")))
            .collect(),
        _ => Vec::new(),
    }
}

/// Every leaf of `v` (a value that is not a non-empty object) with its dotted path.
fn leaves<'a>(
    v: &'a serde_json::Value,
    prefix: &str,
    out: &mut Vec<(String, &'a serde_json::Value)>,
) {
    match v {
        serde_json::Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(child, &path, out);
            }
        }
        _ => out.push((prefix.to_string(), v)),
    }
}

/// `v` with only the leaf at dotted `path` (and the objects above it).
fn only(path: &str, leaf: &serde_json::Value) -> serde_json::Value {
    path.rsplit('.').fold(leaf.clone(), |inner, key| {
        serde_json::Value::Object(std::iter::once((key.to_string(), inner)).collect())
    })
}

/// The dotted path (below the section) of the value that makes a section fail to read as `T`
/// with `error` (serde_json's errors from a value carry no path): the first leaf that, alone in
/// the section, fails with the same error, else the first that fails at all; `None` when no
/// single leaf fails (the section's keys together are at fault).
fn culprit<T: serde::de::DeserializeOwned>(v: &serde_json::Value, error: &str) -> Option<String> {
    let mut all = Vec::new();
    leaves(v, "", &mut all);
    let failing: Vec<(String, String)> = all
        .into_iter()
        .filter(|(path, _)| !path.is_empty())
        .filter_map(|(path, leaf)| {
            serde_json::from_value::<T>(only(&path, leaf))
                .err()
                .map(|e| (path, e.to_string()))
        })
        .collect();
    failing
        .iter()
        .find(|(_, e)| e == error)
        .or_else(|| failing.first())
        .map(|(path, _)| path.clone())
}

/// 64-bit FNV-1a: stable across processes, builds and platforms (unlike `std`'s hasher); the
/// hash of the subjects' slot.
pub use aware_bus_schemas::subject::stable_hash;

/// The lifecycle profile of Algorithm 1. Rewards are per-step means of an episode
/// (r_t ∈ [0, 2] with the reward of docs/design.md §3), so thresholds do not depend on episode length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LifecycleProfile {
    /// Start OFFLINE behind the HPA/VPA fallback (true) or go ONLINE at once.
    pub bootstrap: bool,
    /// OFFLINE → ONLINE when the mean estimated reward reaches this.
    pub t_online: f64,
    /// ONLINE → SERVING when mean ≥ t_serving and std ≤ t_var.
    pub t_serving: f64,
    pub t_var: f64,
    /// Number of recent episodes the decision looks at.
    pub window: usize,
}

impl Default for LifecycleProfile {
    fn default() -> Self {
        LifecycleProfile {
            bootstrap: true,
            t_online: 1.0,
            t_serving: 1.3,
            t_var: 0.15,
            window: 10,
        }
    }
}

/// The configured targets' specs by target ([`AppConfig::spec_index`]).
#[derive(Debug, Clone, Default)]
pub struct SpecIndex {
    specs: std::collections::HashMap<Target, crate::spec::TargetSpec>,
}

impl SpecIndex {
    /// The configured spec of `target`, or the defaults for a target known only from the bus.
    pub fn spec_for(&self, target: &Target) -> crate::spec::TargetSpec {
        self.specs
            .get(target)
            .cloned()
            .unwrap_or_else(|| crate::spec::TargetSpec::new(target))
    }
}

impl AppConfig {
    /// The configured spec of `target`, or the defaults for a target known only from the bus.
    pub fn spec_for(&self, target: &Target) -> crate::spec::TargetSpec {
        self.targets
            .iter()
            .find(|s| s.namespace == target.namespace && s.name == target.name)
            .cloned()
            .unwrap_or_else(|| crate::spec::TargetSpec::new(target))
    }

    /// [`AppConfig::spec_for`] in O(1) per target, for a service that starts an actor per
    /// target (a scan of `targets` for each would be quadratic in the targets).
    pub fn spec_index(&self) -> SpecIndex {
        let mut specs = std::collections::HashMap::with_capacity(self.targets.len());
        for s in &self.targets {
            // The first of a target's specs wins, as in `spec_for`.
            specs.entry(s.target()).or_insert_with(|| s.clone());
        }
        SpecIndex { specs }
    }

    /// Sets section `name` to `value` (as [`AppConfig::section`] reads it back): configuration
    /// built in code, by `aware demo`, the benchmarks and the tests.
    pub fn set_section<T: Serialize>(&mut self, name: &str, value: &T) -> Result<(), ConfigError> {
        let v = serde_json::to_value(value).map_err(|e| invalid(name, e.to_string()))?;
        self.sections.insert(name.to_string(), v);
        Ok(())
    }

    /// The section `name` as `T` (its defaults when absent); errors name the section.
    pub fn section<T: serde::de::DeserializeOwned + Default>(
        &self,
        name: &str,
    ) -> Result<T, ConfigError> {
        match self.sections.get(name) {
            None => Ok(T::default()),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
                // A NaN or an infinity (TOML `nan`, `inf`) arrives as null: name the key.
                let nulls = null_paths(v, name);
                match nulls.first() {
                    Some(key) if e.to_string().contains("null") => invalid(
                        key,
                        "must be a finite number (NaN and infinities are refused)",
                    ),
                    _ => invalid(
                        &culprit::<T>(v, &e.to_string())
                            .map_or_else(|| name.to_string(), |path| format!("{name}.{path}")),
                        e.to_string(),
                    ),
                }
            }),
        }
    }

    /// Top-level values that set nothing but look meant to: a key beginning with a section's
    /// name and `_`, like `bus_url` from `AWARE_BUS_URL` (nested keys need `__`), with what was
    /// probably meant. They are not refused, as other `AWARE_*` variables land there too, but the
    /// services log them at start-up and `aware config` prints them.
    pub fn unused_keys(&self) -> Vec<(String, String)> {
        self.sections
            .iter()
            .filter(|(_, v)| !v.is_object())
            .filter_map(|(key, _)| {
                let section = CORE_SECTIONS
                    .iter()
                    .chain(&SERVICE_SECTIONS)
                    .filter(|s| key.starts_with(&format!("{s}_")))
                    .max_by_key(|s| s.len())?;
                let rest = &key[section.len() + 1..];
                Some((
                    key.clone(),
                    format!(
                        "`{key}` sets nothing: did you mean `{section}.{rest}` (in a file `[{section}] {rest}`, in the environment `AWARE_{}__{}`)?",
                        section.to_uppercase(),
                        rest.to_uppercase()
                    ),
                ))
            })
            .collect()
    }

    /// Checks values the types alone cannot; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // A section no service reads is a typo (`[lifecycle-monitor]`, `[recomender]`) that
        // would otherwise leave every setting in it silently at its default. Top-level scalars
        // are let through: unrelated `AWARE_*` variables in the environment land there.
        for (name, value) in &self.sections {
            if value.is_object() && !SERVICE_SECTIONS.contains(&name.as_str()) {
                return Err(invalid(
                    name,
                    format!(
                        "unknown section; the sections are {}, {}",
                        CORE_SECTIONS.join(", "),
                        SERVICE_SECTIONS.join(", ")
                    ),
                ));
            }
        }
        self.bus.validate()?;
        self.http
            .listen
            .parse::<SocketAddr>()
            .map_err(|e| invalid("http.listen", format!("`{}`: {e}", self.http.listen)))?;
        self.shard.validate()?;
        if self.actors.max_targets == 0 {
            return Err(invalid("actors.max_targets", "must be at least 1"));
        }
        validate_targets(&self.targets)?;
        self.lifecycle.validate()?;
        if self.learning.steps_per_episode == 0 {
            return Err(invalid("learning.steps_per_episode", "must be at least 1"));
        }
        if let Some((key, reason)) = self.learning.objective.problems().into_iter().next() {
            return Err(invalid(&format!("learning.objective.{key}"), reason));
        }
        Ok(())
    }
}

/// The `[[targets]]` entries: names, bounds, weights and SLOs; errors name the entry and key.
fn validate_targets(targets: &[crate::spec::TargetSpec]) -> Result<(), ConfigError> {
    for (i, t) in targets.iter().enumerate() {
        aware_bus_schemas::subject::validate_name("namespace", &t.namespace)
            .map_err(|e| invalid(&format!("targets[{i}].namespace"), e.to_string()))?;
        aware_bus_schemas::subject::validate_name("name", &t.name)
            .map_err(|e| invalid(&format!("targets[{i}].name"), e.to_string()))?;
        if let Some((key, reason)) = t.bounds.problems().into_iter().next() {
            return Err(invalid(&format!("targets[{i}].bounds.{key}"), reason));
        }
        if !(0.0..=1.0).contains(&t.alpha) {
            return Err(invalid(
                &format!("targets[{i}].alpha"),
                format!("{} is outside [0, 1]", t.alpha),
            ));
        }
        // As for a registration: an SLO of NaN, 0 or less would leave the target with a
        // reward no policy can earn, or none.
        for (key, v) in [
            ("latency_p99_ms", t.slo.latency_p99_ms),
            ("throughput_rps", t.slo.throughput_rps),
        ] {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return Err(invalid(
                    &format!("targets[{i}].slo.{key}"),
                    format!("{v} is not a positive number"),
                ));
            }
        }
        if let Some(o) = t
            .slo
            .objective
            .filter(|o| !crate::spec::Slo::valid_objective(*o))
        {
            return Err(invalid(
                &format!("targets[{i}].slo.objective"),
                format!("{o} is not in (0, 1): the fraction of control intervals that must meet the SLO"),
            ));
        }
        if let Some(u) = t
            .fallback
            .hpa_target_cpu_utilization
            .filter(|u| !crate::spec::FallbackOverride::valid_hpa_target(*u))
        {
            return Err(invalid(
                &format!("targets[{i}].fallback.hpa_target_cpu_utilization"),
                format!("{u} is not a target CPU utilization from 0.01 (1 %) to 1 (100 %)"),
            ));
        }
    }
    Ok(())
}

impl LifecycleProfile {
    /// The `[lifecycle]` section's thresholds; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let l = self;
        for (key, v) in [
            ("lifecycle.t_online", l.t_online),
            ("lifecycle.t_serving", l.t_serving),
            ("lifecycle.t_var", l.t_var),
        ] {
            if !v.is_finite() {
                return Err(invalid(key, "must be a finite number"));
            }
        }
        if l.t_var < 0.0 {
            return Err(invalid("lifecycle.t_var", "must not be negative"));
        }
        if l.window == 0 {
            return Err(invalid("lifecycle.window", "must be at least 1"));
        }
        Ok(())
    }
}

/// Where configuration comes from. `env: None` reads the process environment; tests inject a map.
#[derive(Debug, Clone, Default)]
pub struct ConfigSources {
    pub file: Option<PathBuf>,
    pub env: Option<HashMap<String, String>>,
    /// Flag values as (`dotted.key`, value), applied last.
    pub overrides: Vec<(String, String)>,
}

/// Environment variables read as strings, never parsed as numbers or booleans.
const VERBATIM_ENV: &[(&str, &str)] = &[
    ("AWARE_BUS__URL", "bus.url"),
    ("AWARE_BUS__AUTH__USER", "bus.auth.user"),
    ("AWARE_BUS__AUTH__PASSWORD", "bus.auth.password"),
    ("AWARE_BUS__AUTH__TOKEN", "bus.auth.token"),
];

/// The built-in defaults as a configuration layer. Serializing `AppConfig::default()` into the
/// `config` crate's tree sets every key through its path parser, by far the largest cost of a
/// load, so it is done once per process and cloned after.
fn defaults() -> Result<config::Config, ConfigError> {
    static DEFAULTS: OnceLock<config::Config> = OnceLock::new();
    if let Some(d) = DEFAULTS.get() {
        return Ok(d.clone());
    }
    let d = config::Config::try_from(&AppConfig::default())?;
    Ok(DEFAULTS.get_or_init(|| d).clone())
}

/// Loads defaults → file → `AWARE_…` environment → overrides, then validates.
pub fn load(sources: &ConfigSources) -> Result<AppConfig, ConfigError> {
    let mut builder = config::Config::builder().add_source(defaults()?);
    if let Some(path) = &sources.file {
        if !path.exists() {
            return Err(invalid(
                "--config",
                format!("file {} does not exist", path.display()),
            ));
        }
        builder = builder.add_source(config::File::from(path.as_path()).required(true));
    }
    let env = config::Environment::with_prefix("AWARE")
        .prefix_separator("_")
        .separator("__")
        .try_parsing(true)
        .source(sources.env.clone());
    builder = builder.add_source(env);
    // Secrets from the environment are taken as written: parsed as a number, a password such as
    // `007` would lose its zeros.
    for (var, key) in VERBATIM_ENV {
        let value = match &sources.env {
            Some(map) => map.get(*var).cloned(),
            None => std::env::var(var).ok(),
        };
        if let Some(v) = value {
            builder = builder.set_override(*key, v)?;
        }
    }
    for (k, v) in &sources.overrides {
        builder = builder.set_override(k.as_str(), v.as_str())?;
    }
    let cfg: AppConfig = builder.build()?.try_deserialize()?;
    cfg.validate()?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn defaults_load_and_validate() {
        let cfg = load(&ConfigSources {
            env: env(&[]),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(cfg, AppConfig::default());
    }

    #[test]
    fn precedence_defaults_file_env_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("aware.toml");
        std::fs::write(
            &file,
            r#"
[bus]
url = "nats://file:4222"
channel_capacity = 10
[http]
listen = "127.0.0.1:1000"
[lifecycle]
window = 5
[[targets]]
namespace = "shop"
name = "cart"
[[targets]]
namespace = "shop"
name = "search"
limits = { controlled_values = "RequestsOnly", cpu_limit = "UnsetIfLatencySensitive" }
"#,
        )
        .unwrap();
        let cfg = load(&ConfigSources {
            file: Some(file),
            env: env(&[
                ("AWARE_BUS__URL", "nats://env:4222"),
                ("AWARE_HTTP__LISTEN", "127.0.0.1:2000"),
                ("AWARE_BUS__JETSTREAM__MAX_AGE_SECS", "60"),
                ("AWARE_ACTORS__RETIRE_AFTER_SECS", "0"),
            ]),
            overrides: vec![("http.listen".into(), "127.0.0.1:3000".into())],
        })
        .unwrap();
        assert_eq!(cfg.bus.url, "nats://env:4222", "env beats file");
        assert_eq!(cfg.bus.channel_capacity, 10, "file beats defaults");
        assert_eq!(cfg.http.listen, "127.0.0.1:3000", "flags beat env");
        assert_eq!(cfg.bus.jetstream.max_age_secs, 60, "nested env key");
        assert_eq!(cfg.actors.retire_after_secs, 0);
        assert_eq!(AppConfig::default().actors.retire_after_secs, 3600);
        assert_eq!(cfg.lifecycle.window, 5);
        assert_eq!(cfg.lifecycle.t_serving, 1.3, "untouched default kept");
        assert_eq!(cfg.targets.len(), 2);
        assert_eq!(cfg.targets[0].target(), Target::new("shop", "cart"));
        assert_eq!(cfg.targets[0].bounds, crate::spec::Bounds::default());
        assert_eq!(cfg.targets[0].limits, crate::spec::LimitsPolicy::default());
        assert_eq!(
            cfg.targets[1].limits,
            crate::spec::LimitsPolicy {
                controlled_values: crate::spec::ControlledValues::RequestsOnly,
                cpu_limit: crate::spec::CpuLimit::UnsetIfLatencySensitive,
            }
        );
    }

    #[test]
    fn invalid_values_name_the_key() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("AWARE_BUS__CHANNEL_CAPACITY", "lots")],
                "bus.channel_capacity",
            ),
            (
                &[("AWARE_BUS__CHANNEL_CAPACITY", "0")],
                "bus.channel_capacity",
            ),
            (&[("AWARE_BUS__URL", "http://x")], "bus.url"),
            (&[("AWARE_HTTP__LISTEN", "nowhere")], "http.listen"),
            (
                &[("AWARE_SHARD__INDEX", "3"), ("AWARE_SHARD__COUNT", "3")],
                "shard.index",
            ),
            (&[("AWARE_LIFECYCLE__WINDOW", "0")], "lifecycle.window"),
            (&[("AWARE_ACTORS__MAX_TARGETS", "0")], "actors.max_targets"),
            (
                &[("AWARE_ACTORS__RETIRE_AFTER_SECS", "-1")],
                "actors.retire_after_secs",
            ),
            (&[("AWARE_LIFECYCLE__T_VAR", "-1")], "lifecycle.t_var"),
            (
                &[("AWARE_LEARNING__STEPS_PER_EPISODE", "0")],
                "learning.steps_per_episode",
            ),
            (
                &[("AWARE_BUS__JETSTREAM__STORAGE", "tape")],
                "bus.jetstream.storage",
            ),
            (
                &[("AWARE_BUS__RECONNECT_MAX_DELAY_MS", "0")],
                "bus.reconnect_max_delay_ms",
            ),
            (
                &[("AWARE_BUS__CONNECT_TIMEOUT_MS", "0")],
                "bus.connect_timeout_ms",
            ),
            (
                &[("AWARE_BUS__FLUSH_TIMEOUT_MS", "0")],
                "bus.flush_timeout_ms",
            ),
            (
                &[("AWARE_BUS__FLUSH_TIMEOUT_MS", "-5")],
                "bus.flush_timeout_ms",
            ),
            (
                &[("AWARE_BUS__JETSTREAM__MAX_BYTES", "-2")],
                "bus.jetstream.max_bytes",
            ),
            (
                &[("AWARE_BUS__JETSTREAM__MAX_BYTES", "0")],
                "bus.jetstream.max_bytes",
            ),
        ];
        for (vars, key) in cases {
            let err = load(&ConfigSources {
                env: env(vars),
                ..Default::default()
            })
            .unwrap_err()
            .to_string();
            assert!(err.contains(key), "{vars:?}: `{err}` does not name {key}");
        }
    }

    #[test]
    fn service_sections_are_typed_by_their_service() {
        #[derive(Debug, Default, serde::Deserialize, PartialEq)]
        #[serde(default, deny_unknown_fields)]
        struct Section {
            sink: String,
            limit: u32,
        }
        let cfg = load(&ConfigSources {
            env: env(&[
                ("AWARE_ACTUATOR__SINK", "kubernetes"),
                ("AWARE_ACTUATOR__LIMIT", "3"),
            ]),
            ..Default::default()
        })
        .unwrap();
        let s: Section = cfg.section("actuator").unwrap();
        assert_eq!(
            s,
            Section {
                sink: "kubernetes".into(),
                limit: 3
            }
        );
        let none: Section = cfg.section("absent").unwrap();
        assert_eq!(none, Section::default());
        let bad = load(&ConfigSources {
            env: env(&[("AWARE_ACTUATOR__LIMIT", "many")]),
            ..Default::default()
        })
        .unwrap();
        let err = bad.section::<Section>("actuator").unwrap_err().to_string();
        assert!(err.contains("`actuator.limit`"), "{err}");
        // A type error in a nested table or a negative size names the full key.
        #[derive(Debug, Default, serde::Deserialize, PartialEq)]
        #[serde(default, deny_unknown_fields)]
        struct Outer {
            name: String,
            count: u32,
            inner: Section,
        }
        for (vars, key) in [
            (
                &[
                    ("AWARE_RECORDER__NAME", "x"),
                    ("AWARE_RECORDER__INNER__SINK", "y"),
                    ("AWARE_RECORDER__INNER__LIMIT", "-3"),
                ][..],
                "`recorder.inner.limit`",
            ),
            (
                &[
                    ("AWARE_RECORDER__NAME", "x"),
                    ("AWARE_RECORDER__COUNT", "many"),
                ],
                "`recorder.count`",
            ),
        ] {
            let cfg = load(&ConfigSources {
                env: env(vars),
                ..Default::default()
            })
            .unwrap();
            let err = cfg.section::<Outer>("recorder").unwrap_err().to_string();
            assert!(err.contains(key), "{vars:?}: {err}");
        }
    }

    #[test]
    fn spec_for_finds_configured_targets_and_defaults_the_rest() {
        let mut cfg = AppConfig::default();
        let mut spec = crate::spec::TargetSpec::new(&Target::new("shop", "cart"));
        spec.alpha = 0.9;
        cfg.targets.push(spec.clone());
        assert_eq!(cfg.spec_for(&Target::new("shop", "cart")), spec);
        let other = cfg.spec_for(&Target::new("shop", "other"));
        assert_eq!(other.alpha, 0.5);
        assert_eq!(other.name, "other");
        // The index answers the same, the first of two specs of a target winning.
        let mut second = spec.clone();
        second.alpha = 0.1;
        cfg.targets.push(second);
        let index = cfg.spec_index();
        for t in [Target::new("shop", "cart"), Target::new("shop", "other")] {
            assert_eq!(index.spec_for(&t), cfg.spec_for(&t));
        }
        assert_eq!(index.spec_for(&Target::new("shop", "cart")).alpha, 0.9);
    }

    #[test]
    fn a_targets_slo_must_be_a_positive_number() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("aware.toml");
        for (slo, ok) in [
            ("latency_p99_ms = 150.0", true),
            ("throughput_rps = 20.0", true),
            ("latency_p99_ms = nan", false),
            ("latency_p99_ms = 0.0", false),
            ("throughput_rps = -5.0", false),
            ("throughput_rps = inf", false),
            ("latency_p99_ms = 150.0\nobjective = 0.995", true),
            ("objective = 0.0", false),
            ("objective = 1.0", false),
            ("objective = 1.5", false),
            ("objective = nan", false),
        ] {
            std::fs::write(
                &file,
                format!(
                    "[[targets]]\nnamespace = \"shop\"\nname = \"cart\"\n[targets.slo]\n{slo}\n"
                ),
            )
            .unwrap();
            let res = load(&ConfigSources {
                file: Some(file.clone()),
                ..Default::default()
            });
            match (res, ok) {
                (Ok(c), true) => {
                    if slo.contains("objective") {
                        assert_eq!(c.targets[0].slo.objective, Some(0.995));
                    }
                }
                (Err(e), false) => {
                    let key = slo.split(' ').next().unwrap();
                    assert!(
                        e.to_string().contains(&format!("targets[0].slo.{key}")),
                        "{slo}: {e}"
                    );
                }
                (res, _) => panic!("{slo}: {res:?}"),
            }
        }
    }

    #[test]
    fn a_targets_fallback_hpa_target_is_a_whole_percent_from_1_to_100() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("aware.toml");
        for (value, ok) in [
            ("0.35", Some(0.35)),
            ("1.0", Some(1.0)),
            // Rounds to 1 %, as the global setting's rule.
            ("0.005", Some(0.005)),
            ("0.004", None),
            ("0.0", None),
            ("-0.5", None),
            ("1.006", None),
            ("80.0", None),
            ("nan", None),
            ("inf", None),
        ] {
            std::fs::write(
                &file,
                format!(
                    "[[targets]]\nnamespace = \"shop\"\nname = \"cart\"\nfallback.hpa_target_cpu_utilization = {value}\n"
                ),
            )
            .unwrap();
            let res = load(&ConfigSources {
                file: Some(file.clone()),
                ..Default::default()
            });
            match (res, ok) {
                (Ok(c), Some(want)) => {
                    assert_eq!(
                        c.targets[0].fallback.hpa_target_cpu_utilization,
                        Some(want),
                        "{value}"
                    );
                }
                (Err(e), None) => {
                    assert!(
                        e.to_string()
                            .contains("targets[0].fallback.hpa_target_cpu_utilization"),
                        "{value}: {e}"
                    );
                }
                (res, _) => panic!("{value}: {res:?}"),
            }
        }
        // Unset: no override (the recommender's setting applies).
        std::fs::write(
            &file,
            "[[targets]]\nnamespace = \"shop\"\nname = \"cart\"\n",
        )
        .unwrap();
        let c = load(&ConfigSources {
            file: Some(file.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.targets[0].fallback.hpa_target_cpu_utilization, None);
    }

    #[test]
    fn misspelt_keys_and_sections_are_refused_naming_them_and_stray_variables_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let load_file = |text: &str, vars: &[(&str, &str)]| {
            let file = dir.path().join("aware.toml");
            std::fs::write(&file, text).unwrap();
            load(&ConfigSources {
                file: Some(file),
                env: env(vars),
                ..Default::default()
            })
        };
        for (text, vars, named) in [
            // A key no core section has: it would silently leave the embedded bus in use.
            ("[bus]\nurll = \"nats://x:4222\"\n", &[][..], "urll"),
            ("[bus.jetstream]\nmax_age = 60\n", &[], "max_age"),
            ("[learning]\nsteps = 5\n", &[], "steps"),
            ("[lifecycle]\nt_onlin = 1.2\n", &[], "t_onlin"),
            ("", &[("AWARE_ACTORS__RETIRE_AFTER", "5")], "retire_after"),
            // A target's SLO under a wrong name: the target would have none (best-effort).
            (
                "[[targets]]\nnamespace = \"shop\"\nname = \"cart\"\nslo = { latency_p99 = 100 }\n",
                &[],
                "latency_p99",
            ),
            (
                "[[targets]]\nnamespace = \"shop\"\nname = \"cart\"\n[targets.slo]\nobjectiv = 0.99\n",
                &[],
                "objectiv",
            ),
            // A misspelt override: the target would silently keep the global HPA target.
            (
                "[[targets]]\nnamespace = \"shop\"\nname = \"cart\"\n[targets.fallback]\nhpa_target_utilization = 0.35\n",
                &[],
                "hpa_target_utilization",
            ),
            (
                "[[targets]]\nnamespace = \"shop\"\nname = \"cart\"\n[targets.bounds]\nmax_replica = 3\n",
                &[],
                "max_replica",
            ),
            // A misspelt limits policy key: the target would silently keep the default policy.
            (
                "[[targets]]\nnamespace = \"shop\"\nname = \"cart\"\n[targets.limits]\ncontrolled_value = \"RequestsOnly\"\n",
                &[],
                "controlled_value",
            ),
            // A section no service reads.
            (
                "[lifecycle-monitor]\nprobation_episodes = 2\n",
                &[],
                "lifecycle-monitor",
            ),
            ("[recomender]\nseed = 3\n", &[], "recomender"),
            ("", &[("AWARE_TRAINR__SEED", "3")], "trainr"),
        ] {
            let err = load_file(text, vars).unwrap_err().to_string();
            assert!(
                err.contains(named),
                "{text:?} {vars:?}: `{err}` does not name {named}"
            );
        }
        let err = load_file("[recomender]\nseed = 3\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown section") && err.contains("lifecycle_monitor"),
            "{err}"
        );
        // Service sections load (their own types check their keys), and unrelated `AWARE_*`
        // variables (a script's AWARE_BIN) land at the top level as scalars and are ignored.
        let cfg = load_file(
            "[lifecycle_monitor]\nprobation_episodes = 2\n[recommender]\nseed = 3\n",
            &[
                ("AWARE_BIN", "/usr/local/bin/aware"),
                ("AWARE_TRAINER__SEED", "4"),
            ],
        )
        .unwrap();
        assert_eq!(cfg.sections["recommender"]["seed"], 3);
        assert_eq!(cfg.sections["trainer"]["seed"], 4);
        assert!(cfg.unused_keys().is_empty(), "{:?}", cfg.unused_keys());
        // A single `_` where `__` nests: loaded, but reported with what was meant.
        let cfg = load_file(
            "",
            &[
                ("AWARE_BUS_URL", "nats://x:4222"),
                ("AWARE_LIFECYCLE_MONITOR_PROBATION_EPISODES", "2"),
                ("AWARE_BIN", "/usr/local/bin/aware"),
            ],
        )
        .unwrap();
        assert_eq!(cfg.bus.url, "embedded");
        let unused = cfg.unused_keys();
        assert_eq!(unused.len(), 2, "{unused:?}");
        assert_eq!(unused[0].0, "bus_url");
        assert!(unused[0].1.contains("AWARE_BUS__URL"), "{}", unused[0].1);
        assert_eq!(unused[1].0, "lifecycle_monitor_probation_episodes");
        assert!(
            unused[1]
                .1
                .contains("AWARE_LIFECYCLE_MONITOR__PROBATION_EPISODES"),
            "{}",
            unused[1].1
        );
    }

    #[test]
    fn contradictory_or_incomplete_bus_credentials_are_refused_naming_the_keys() {
        for (vars, named) in [
            (
                &[
                    ("AWARE_BUS__AUTH__USER", "a"),
                    ("AWARE_BUS__AUTH__PASSWORD", "b"),
                    ("AWARE_BUS__AUTH__PASSWORD_FILE", "/run/b"),
                ][..],
                &["bus.auth.password", "bus.auth.password_file"][..],
            ),
            (
                &[
                    ("AWARE_BUS__AUTH__TOKEN", "t"),
                    ("AWARE_BUS__AUTH__TOKEN_FILE", "/run/t"),
                ],
                &["bus.auth.token", "bus.auth.token_file"],
            ),
            (&[("AWARE_BUS__AUTH__USER", "a")], &["bus.auth.user"]),
            (&[("AWARE_BUS__AUTH__PASSWORD", "b")], &["bus.auth.user"]),
            (
                &[
                    ("AWARE_BUS__AUTH__TOKEN", "t"),
                    ("AWARE_BUS__AUTH__NKEY_SEED_FILE", "/run/seed"),
                ],
                &["bus.auth.token", "bus.auth.nkey_seed_file"],
            ),
            (
                &[
                    ("AWARE_BUS__AUTH__USER", "a"),
                    ("AWARE_BUS__AUTH__PASSWORD", "b"),
                    ("AWARE_BUS__AUTH__CREDS_FILE", "/run/x.creds"),
                ],
                &["bus.auth.user", "bus.auth.creds_file"],
            ),
            (
                &[
                    ("AWARE_BUS__URL", "nats://a:hunter2@n:4222"),
                    ("AWARE_BUS__AUTH__TOKEN", "t"),
                ],
                &["bus.url", "bus.auth.token"],
            ),
            (
                &[(
                    "AWARE_BUS__URL",
                    "nats://a:hunter2@n1:4222,nats://b:hunter2@n2:4222",
                )],
                &["bus.url"],
            ),
            (
                &[("AWARE_BUS__TLS__CERT_FILE", "/c.pem")],
                &["bus.tls.key_file"],
            ),
            (
                &[("AWARE_BUS__TLS__KEY_FILE", "/k.pem")],
                &["bus.tls.cert_file"],
            ),
        ] {
            let err = load(&ConfigSources {
                env: env(vars),
                ..Default::default()
            })
            .unwrap_err()
            .to_string();
            for key in named {
                assert!(err.contains(key), "{vars:?}: `{err}` does not name {key}");
            }
            assert!(!err.contains("hunter2"), "a secret in `{err}`");
        }
    }

    #[test]
    fn secrets_are_taken_verbatim_from_the_environment_and_never_shown() {
        let cfg = load(&ConfigSources {
            env: env(&[
                ("AWARE_BUS__URL", "nats://n:4222"),
                ("AWARE_BUS__AUTH__USER", "0123"),
                ("AWARE_BUS__AUTH__PASSWORD", "007"),
            ]),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(cfg.bus.auth.user, "0123");
        assert_eq!(cfg.bus.auth.password, "007", "not the number 7");
        let mut cfg = cfg;
        cfg.bus.url = "nats://ann:hunter2@n:4222".into();
        cfg.bus.auth.password = "hunter3".into();
        cfg.bus.auth.token = "hunter4".into();
        let shown = format!(
            "{cfg:?} {:?} {}",
            cfg.bus,
            serde_json::to_string(&cfg.bus.redacted()).unwrap()
        );
        for secret in ["hunter2", "hunter3", "hunter4"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("ann:***@n:4222"), "{shown}");
    }

    #[test]
    fn missing_file_is_an_error() {
        let err = load(&ConfigSources {
            file: Some("/nonexistent/aware.toml".into()),
            env: env(&[]),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("does not exist"));
    }

    #[test]
    fn shard_flag_parses_and_partitions() {
        assert_eq!(
            ShardConfig::parse("1/3").unwrap(),
            ShardConfig { index: 1, count: 3 }
        );
        assert!(ShardConfig::parse("3/3").is_err());
        assert!(ShardConfig::parse("x/3").is_err());
        assert!(ShardConfig::parse("13").is_err());
        assert!(ShardConfig::parse("0/257")
            .unwrap_err()
            .to_string()
            .contains("shard.count"));
        assert!(ShardConfig::parse("255/256").is_ok());
        let shards: Vec<_> = (0..3).map(|i| ShardConfig { index: i, count: 3 }).collect();
        for n in 0..300 {
            let t = Target::new("ns", format!("app-{n}"));
            assert_eq!(shards.iter().filter(|s| s.owns(&t)).count(), 1);
        }
    }

    #[test]
    fn the_capture_partitions_cover_every_slot_once_and_a_shard_reads_only_its_own() {
        let mut js = JetStreamConfig {
            partitions: 4,
            max_bytes: 1000,
            ..Default::default()
        };
        assert_eq!(
            js.capture_streams(),
            vec!["AWARE_0", "AWARE_1", "AWARE_2", "AWARE_3"]
        );
        assert_eq!(js.partition_max_bytes(1), 250);
        let subjects: Vec<Vec<String>> = (0..4).map(|k| js.partition_subjects(k)).collect();
        assert_eq!(subjects[1][..2], ["aware.v1.*.1.*.*", "aware.v1.*.5.*.*"]);
        let mut all: Vec<&String> = subjects.iter().flatten().collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256, "every slot in exactly one partition");
        for n in 0..300 {
            let t = Target::new("ns", format!("app-{n}"));
            let subj = subject::subject(EventKind::Obs, &t).unwrap();
            let k = js.partition_of(&t);
            let slot_token = subj.split('.').nth(3).unwrap();
            assert!(subjects[k as usize].contains(&format!("aware.v1.*.{slot_token}.*.*")));
        }
        let shard = |index, count| ShardConfig { index, count };
        assert_eq!(js.partitions_of(&shard(1, 2)), vec![1, 3]);
        assert_eq!(js.partitions_of(&shard(3, 8)), vec![3]);
        assert_eq!(
            js.partitions_of(&shard(0, 3)),
            vec![0, 1, 2, 3],
            "3 does not divide 4"
        );
        js.partitions = 1;
        assert_eq!(js.capture_streams(), vec!["AWARE"]);
        assert_eq!(js.partition_subjects(0), vec!["aware.v1.>"]);
        assert_eq!(js.partitions_of(&shard(2, 3)), vec![0]);
        let mut bus = BusConfig::default();
        for bad in [0, 257, 512] {
            bus.jetstream.partitions = bad;
            let err = bus.validate().unwrap_err().to_string();
            assert!(err.contains("bus.jetstream.partitions"), "{err}");
        }
        for good in [3, 12, 256] {
            bus.jetstream.partitions = good;
            bus.validate().unwrap();
        }
    }

    #[test]
    fn partitions_that_do_not_divide_the_slots_split_them_and_the_bytes_by_slots() {
        let shard = |index, count| ShardConfig { index, count };
        let js = JetStreamConfig {
            partitions: 3,
            max_bytes: 1 << 30,
            ..Default::default()
        };
        // 256 = 86 + 85 + 85 slots.
        let held: Vec<usize> = (0..3).map(|k| js.partition_subjects(k).len()).collect();
        assert_eq!(held, vec![86, 85, 85]);
        for i in 0..3 {
            assert_eq!(
                js.partitions_of(&shard(i, 3)),
                vec![i],
                "one partition per shard"
            );
        }
        assert_eq!(
            js.partitions_of(&shard(1, 6)),
            vec![1],
            "shared with shard 4 of 6"
        );
        assert_eq!(js.partitions_of(&shard(0, 4)), vec![0, 1, 2]);
        let bytes: Vec<i64> = (0..3).map(|k| js.partition_max_bytes(k)).collect();
        assert_eq!(bytes[0], (1i64 << 30) / 256 * 86);
        assert_eq!(bytes[1], (1i64 << 30) / 256 * 85);
        assert!((1 << 30) - bytes.iter().sum::<i64>() < 3, "{bytes:?}");
        let twelve = JetStreamConfig {
            partitions: 12,
            ..js.clone()
        };
        for n in [1, 2, 3, 4, 6, 12] {
            for i in 0..n {
                assert_eq!(twelve.partitions_of(&shard(i, n)).len(), 12 / n as usize);
            }
        }
    }

    #[test]
    fn a_shard_subscribes_to_the_slots_of_the_targets_it_owns() {
        let one = ShardConfig::default();
        assert_eq!(one.filters(EventKind::Obs), vec!["aware.v1.obs.*.*.*"]);
        let shards: Vec<_> = (0..3).map(|i| ShardConfig { index: i, count: 3 }).collect();
        let slots: Vec<Vec<u32>> = shards.iter().map(|s| s.slots().collect()).collect();
        assert_eq!(slots.iter().map(Vec::len).sum::<usize>(), 256);
        assert_eq!(
            (slots[0].len(), slots[1].len(), slots[2].len()),
            (86, 85, 85)
        );
        for n in 0..300 {
            let t = Target::new("ns", format!("app-{n}"));
            let subj = subject::subject(EventKind::Obs, &t).unwrap();
            for s in &shards {
                let matched = s.filters(EventKind::Obs).iter().any(|f| {
                    crate::bus::pattern::Pattern::parse(f)
                        .unwrap()
                        .matches(&subj)
                });
                assert_eq!(matched, s.owns(&t), "{subj} shard {}", s.index);
            }
        }
    }

    #[test]
    fn stable_hash_is_fnv1a() {
        assert_eq!(stable_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
