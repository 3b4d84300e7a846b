//! The `[collector]` configuration section: where metrics come from (`source`), the Prometheus
//! source's server, selectors and queries, and the simulated cluster. Read with
//! [`CollectorConfig::read`], which refuses unknown keys and nonsensical values naming the key.

use std::path::PathBuf;

use aware_shared::config::{AppConfig, ConfigError};
use serde::{Deserialize, Serialize};

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// Where the metrics collector reads metrics from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// No source: the collector idles (targets are fed by another collector).
    #[default]
    None,
    /// The simulated cluster of `loadgen`, owned by the collector.
    Simulator,
    /// The Prometheus HTTP API (`collector.prometheus`), for every target in `targets`.
    Prometheus,
}

/// How simulated time advances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockMode {
    /// Advance as soon as every target's `applied` for the step has arrived (or the step timeout).
    #[default]
    Lockstep,
    /// One step per `step_seconds` of wall-clock time.
    Wallclock,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CollectorConfig {
    pub source: SourceKind,
    /// The fraction of a step over which its `obs` are spread, each target at a fixed offset
    /// (from a hash of its name), instead of all at once: 0 (all at once) to below 1. Spreading
    /// turns a step's burst into a steady rate, so the decisions do not queue behind it.
    /// Lock-step simulation publishes at once whatever it says.
    pub spread_fraction: f64,
    pub simulator: SimulatorSourceConfig,
    pub prometheus: PrometheusSourceConfig,
}

impl Default for CollectorConfig {
    fn default() -> Self {
        CollectorConfig {
            source: SourceKind::None,
            spread_fraction: 0.0,
            simulator: SimulatorSourceConfig::default(),
            prometheus: PrometheusSourceConfig::default(),
        }
    }
}

/// Names of the collector's Prometheus queries, the keys of `collector.prometheus.queries`
/// (the default PromQL of each is documented in the collector's `prometheus` module).
pub const PROMETHEUS_QUERY_NAMES: [&str; 19] = [
    "cpu_usage_cores",
    "memory_working_set_bytes",
    "cpu_request_cores",
    "cpu_request_total_cores",
    "memory_request_bytes",
    "memory_request_total_bytes",
    "replicas",
    "ready_replicas",
    "spec_replicas",
    "pending_replicas",
    "request_rate_rps",
    "throughput_rps",
    "latency_p50_ms",
    "latency_p99_ms",
    "io_util",
    "network_util",
    "pod_sample_time",
    "deployment_sample_time",
    "request_sample_time",
];

/// Names of the cluster-wide queries of the Prometheus source, evaluated once per interval with
/// `learning.mean_field` (the mean field's cluster shares, docs/adr/0027-mean-field-state.md);
/// also keys of `collector.prometheus.queries`.
pub const PROMETHEUS_CLUSTER_QUERY_NAMES: [&str; 5] = [
    "cluster_cpu_requested_cores",
    "cluster_memory_requested_bytes",
    "cluster_cpu_allocatable_cores",
    "cluster_memory_allocatable_bytes",
    "cluster_sample_time",
];

/// The Prometheus HTTP API as metrics source (source `prometheus`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrometheusSourceConfig {
    /// Base URL of the server (`http://host:9090`); queries go to `<url>/api/v1/query`.
    pub url: String,
    /// Seconds per control step: every target is evaluated once per interval, and counters are
    /// differenced over this window.
    pub interval_s: f64,
    /// A sample older than this at the evaluation time counts as missing.
    pub staleness_s: f64,
    /// Timeout of one query (client side, and sent to Prometheus as the query `timeout`).
    pub query_timeout_ms: u64,
    /// Label matchers of a target's containers (`$namespace`, `$name`, `$name_re` expanded).
    pub pod_selector: String,
    /// Label matchers of a target's Deployment series.
    pub deployment_selector: String,
    /// PromQL overrides by query name (see [`PROMETHEUS_QUERY_NAMES`]); `""` disables an
    /// optional query (`io_util`, `network_util`).
    pub queries: std::collections::BTreeMap<String, String>,
}

impl Default for PrometheusSourceConfig {
    fn default() -> Self {
        PrometheusSourceConfig {
            url: "http://127.0.0.1:9090".into(),
            interval_s: 10.0,
            staleness_s: 30.0,
            query_timeout_ms: 5_000,
            pod_selector: r#"namespace="$namespace",pod=~"$name_re-([a-z0-9]{5,10}-)?[a-z0-9]{5}",container!="",container!="POD""#.into(),
            deployment_selector: r#"namespace="$namespace",deployment="$name""#.into(),
            queries: std::collections::BTreeMap::new(),
        }
    }
}

impl PrometheusSourceConfig {
    /// Checks the section; errors name the key under `collector.prometheus`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self.url.trim_end_matches('/');
        let host = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .map(|rest| rest.split('/').next().unwrap_or(""));
        match host {
            Some(h)
                if !h.is_empty() && !h.contains(char::is_whitespace) && !h.contains(['?', '#']) => {
            }
            _ => {
                return Err(invalid(
                    "collector.prometheus.url",
                    format!(
                        "`{}` is not an http:// or https:// URL with a host",
                        self.url
                    ),
                ))
            }
        }
        for (key, v) in [
            ("collector.prometheus.interval_s", self.interval_s),
            ("collector.prometheus.staleness_s", self.staleness_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(invalid(key, "must be a positive number"));
            }
        }
        if self.query_timeout_ms == 0 {
            return Err(invalid(
                "collector.prometheus.query_timeout_ms",
                "must be at least 1",
            ));
        }
        for name in self.queries.keys() {
            let known = PROMETHEUS_QUERY_NAMES
                .iter()
                .chain(&PROMETHEUS_CLUSTER_QUERY_NAMES);
            if !known.clone().any(|k| k == name) {
                return Err(invalid(
                    &format!("collector.prometheus.queries.{name}"),
                    format!(
                        "unknown query; known: {}",
                        known.copied().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The simulated cluster driven by the collector (source `simulator`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimulatorSourceConfig {
    /// Apps generated reproducibly from `seed` (in namespace `sim`).
    pub apps: usize,
    /// App definitions (YAML or JSON, see loadgen/README.md) added to the generated ones.
    pub app_files: Vec<PathBuf>,
    pub seed: u64,
    pub clock: ClockMode,
    /// Simulated seconds per control step.
    pub step_seconds: f64,
    /// Lock-step: how long to wait for missing `applied` before stepping with the allocation
    /// unchanged for those targets.
    pub step_timeout_ms: u64,
    /// Stop after this many steps (0: run until shutdown).
    pub max_steps: u64,
    /// Fast-forward: the first published observation is global step `start_step` (episode
    /// `start_step / learning.steps_per_episode`); the steps before it run at start with every
    /// allocation held. For resuming where a previous run's recorded history ends.
    pub start_step: u64,
    /// Instability scenarios injected into the simulated apps (paper §2.3), e.g. to exercise
    /// the retraining trigger: each changes one app's workload from a given step on.
    pub injections: Vec<SimInjection>,
    /// A cluster the simulated apps share (`loadgen`'s nodes, ADR 0018): replicas placed by
    /// their requests, Pending when no node has room, contention for unrequested CPU. Unset
    /// (the default): every app has an unlimited cluster to itself.
    pub cluster: Option<SimClusterConfig>,
    /// What a replica without a CPU (memory) limit may use above its request, as a share of the
    /// request (`loadgen`'s `NodeShare::burst_headroom`, ADR 0013): on a shared cluster it comes
    /// from its node's unrequested CPU, split among the replicas that need it. 0 (the default):
    /// nothing beyond the request. Finite, at least 0.
    pub burst_headroom: f64,
    /// Apps that join or leave the simulated cluster during the run (`loadgen`'s presence, at
    /// most one entry per app): before `join_step` and from `leave_step` on, the app has no
    /// Deployment, no replica and no `obs`; it joins with its initial allocation. The others are
    /// there throughout.
    pub presence: Vec<SimPresence>,
}

/// An app joining or leaving the simulated cluster (`loadgen`'s `Presence`, ADR 0028): there
/// during the steps `join_step ≤ s < leave_step`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimPresence {
    /// The app's name (its Deployment name, without the namespace).
    pub target: String,
    /// The first global step it is there (0: from the start).
    #[serde(default)]
    pub join_step: u64,
    /// The first global step it is gone (none: until the end); after `join_step`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leave_step: Option<u64>,
}

/// The shared cluster of the simulator source: identical nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimClusterConfig {
    /// Nodes, named `node-0`, `node-1`, … (≥ 1).
    pub nodes: u32,
    /// Allocatable CPU per node, millicores (> 0).
    pub node_cpu_millicores: u64,
    /// Allocatable memory per node, bytes (> 0).
    pub node_memory_bytes: u64,
    /// Lend requested but idle CPU to bursting replicas, as CFS does (default: only the
    /// unrequested CPU; docs/adr/0018-shared-cluster-in-the-simulator.md).
    #[serde(default)]
    pub lend_idle: bool,
}

/// One scheduled instability scenario of the simulated cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimInjection {
    /// The app's name (its Deployment name, without the namespace).
    pub target: String,
    /// The global step (episode × `learning.steps_per_episode` + step) whose observation first shows
    /// the change.
    pub step: u64,
    /// `file_size`, `table_size`, `float_ops`, `image_dimension`, `json_size` or
    /// `matrix_dimension` (the app's segments of that family get a payload from the larger
    /// set), `load_high_to_low` (load × 0.3) or `load_low_to_high` (load × 3).
    pub scenario: String,
}

impl Default for SimulatorSourceConfig {
    fn default() -> Self {
        SimulatorSourceConfig {
            apps: 5,
            app_files: Vec::new(),
            seed: 1,
            clock: ClockMode::Lockstep,
            step_seconds: 10.0,
            step_timeout_ms: 2_000,
            max_steps: 0,
            start_step: 0,
            injections: Vec::new(),
            cluster: None,
            burst_headroom: 0.0,
            presence: Vec::new(),
        }
    }
}

impl CollectorConfig {
    /// The `[collector]` section of `cfg`, defaults filled in, checked.
    pub fn read(cfg: &AppConfig) -> Result<CollectorConfig, ConfigError> {
        let moved = cfg
            .sections
            .get("collector")
            .and_then(|s| s.get("steps_per_episode"))
            .is_some();
        if moved {
            return Err(invalid(
                "collector.steps_per_episode",
                "moved to learning.steps_per_episode (AWARE_LEARNING__STEPS_PER_EPISODE), which \
                 every service reads",
            ));
        }
        let c: CollectorConfig = cfg.section("collector")?;
        c.validate()?;
        Ok(c)
    }

    /// The `[collector]` section's values; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = self;
        if !(c.simulator.step_seconds.is_finite() && c.simulator.step_seconds > 0.0) {
            return Err(invalid(
                "collector.simulator.step_seconds",
                "must be a positive number",
            ));
        }
        if !(c.spread_fraction.is_finite() && (0.0..1.0).contains(&c.spread_fraction)) {
            return Err(invalid(
                "collector.spread_fraction",
                "must be at least 0 and below 1",
            ));
        }
        if c.simulator.step_timeout_ms == 0 {
            return Err(invalid(
                "collector.simulator.step_timeout_ms",
                "must be at least 1",
            ));
        }
        let h = c.simulator.burst_headroom;
        if !(h.is_finite() && h >= 0.0) {
            return Err(invalid(
                "collector.simulator.burst_headroom",
                "must be a finite number of at least 0",
            ));
        }
        if let Some(cl) = &c.simulator.cluster {
            let checks = [
                ("nodes", u64::from(cl.nodes)),
                ("node_cpu_millicores", cl.node_cpu_millicores),
                ("node_memory_bytes", cl.node_memory_bytes),
            ];
            for (key, v) in checks {
                if v == 0 {
                    return Err(invalid(
                        &format!("collector.simulator.cluster.{key}"),
                        "must be at least 1",
                    ));
                }
            }
        }
        c.prometheus.validate()?;
        if c.source == SourceKind::Simulator
            && c.simulator.apps == 0
            && c.simulator.app_files.is_empty()
        {
            return Err(invalid(
                "collector.simulator.apps",
                "the simulator needs at least one app (apps > 0 or app_files)",
            ));
        }
        Ok(())
    }
}

/// What a process running the metrics collector with no source says at start: its services
/// have nothing to manage unless another collector publishes on the bus, and how to change that.
pub fn nothing_to_manage(cfg: &AppConfig) -> Option<String> {
    // A section that does not read is reported by the collector's start-up itself.
    if CollectorConfig::read(cfg).ok()?.source != SourceKind::None {
        return None;
    }
    let fix = "set collector.source = \"simulator\" (a simulated cluster; AWARE_COLLECTOR__SOURCE=simulator) \
               or \"prometheus\" with [[targets]] and collector.prometheus.url";
    Some(if cfg.bus.url == aware_shared::bus::EMBEDDED {
        format!(
            "nothing to manage: collector.source = none and the bus is embedded, so no metrics \
             will ever arrive; {fix}"
        )
    } else {
        format!(
            "collector.source = none: this process reads no metrics, and its services act only on \
             what another collector publishes on the bus; to manage targets from here, {fix}"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_shared::config::{load, ConfigSources};
    use std::collections::HashMap;

    fn read_env(vars: &[(&str, &str)]) -> Result<CollectorConfig, ConfigError> {
        let env = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>();
        let cfg = load(&ConfigSources {
            env: Some(env),
            ..Default::default()
        })?;
        CollectorConfig::read(&cfg)
    }

    #[test]
    fn prometheus_source_parses() {
        let c = read_env(&[
            ("AWARE_COLLECTOR__SOURCE", "prometheus"),
            ("AWARE_COLLECTOR__PROMETHEUS__URL", "http://prom:9090/"),
            (
                "AWARE_COLLECTOR__PROMETHEUS__QUERIES__IO_UTIL",
                "vector(0.5)",
            ),
        ])
        .unwrap();
        assert_eq!(c.source, SourceKind::Prometheus);
        assert_eq!(c.prometheus.url, "http://prom:9090/");
        assert_eq!(
            c.prometheus.queries.get("io_util").map(String::as_str),
            Some("vector(0.5)")
        );
        assert_eq!(read_env(&[]).unwrap(), CollectorConfig::default());
    }

    #[test]
    fn invalid_values_name_the_key() {
        for (var, value, key) in [
            (
                "AWARE_COLLECTOR__PROMETHEUS__URL",
                "prometheus:9090",
                "collector.prometheus.url",
            ),
            (
                "AWARE_COLLECTOR__PROMETHEUS__URL",
                "http:///api",
                "collector.prometheus.url",
            ),
            (
                "AWARE_COLLECTOR__PROMETHEUS__STALENESS_S",
                "0",
                "collector.prometheus.staleness_s",
            ),
            (
                "AWARE_COLLECTOR__PROMETHEUS__QUERIES__CPU",
                "up",
                "collector.prometheus.queries.cpu",
            ),
            (
                "AWARE_COLLECTOR__SIMULATOR__STEP_TIMEOUT_MS",
                "0",
                "collector.simulator.step_timeout_ms",
            ),
            (
                "AWARE_COLLECTOR__SPREAD_FRACTION",
                "1",
                "collector.spread_fraction",
            ),
            (
                "AWARE_COLLECTOR__SPREAD_FRACTION",
                "-0.1",
                "collector.spread_fraction",
            ),
            (
                "AWARE_COLLECTOR__SIMULATOR__APPS",
                "-1",
                "collector.simulator.apps",
            ),
            (
                "AWARE_COLLECTOR__SIMULATOR__BURST_HEADROOM",
                "-0.5",
                "collector.simulator.burst_headroom",
            ),
            ("AWARE_COLLECTOR__PROMETHEUS__INTERVAL", "5", "interval"),
            ("AWARE_COLLECTOR__SIMULATOR__STEP", "5", "step"),
            (
                "AWARE_COLLECTOR__STEPS_PER_EPISODE",
                "50",
                "learning.steps_per_episode",
            ),
        ] {
            let err = read_env(&[(var, value)]).unwrap_err().to_string();
            assert!(
                err.contains(key),
                "{var}={value}: `{err}` does not name {key}"
            );
        }
    }

    #[test]
    fn a_shared_cluster_reads_and_its_bad_values_name_the_key() {
        let full = [
            ("AWARE_COLLECTOR__SIMULATOR__CLUSTER__NODES", "3"),
            (
                "AWARE_COLLECTOR__SIMULATOR__CLUSTER__NODE_CPU_MILLICORES",
                "8000",
            ),
            (
                "AWARE_COLLECTOR__SIMULATOR__CLUSTER__NODE_MEMORY_BYTES",
                "34359738368",
            ),
        ];
        let c = read_env(&full).unwrap();
        assert_eq!(
            c.simulator.cluster,
            Some(SimClusterConfig {
                nodes: 3,
                node_cpu_millicores: 8000,
                node_memory_bytes: 32 << 30,
                lend_idle: false,
            })
        );
        for (i, key) in ["nodes", "node_cpu_millicores", "node_memory_bytes"]
            .iter()
            .enumerate()
        {
            let mut sets = full.to_vec();
            sets[i].1 = "0";
            let err = read_env(&sets).unwrap_err().to_string();
            assert!(
                err.contains(&format!("collector.simulator.cluster.{key}")),
                "{err}"
            );
        }
        let mut sets = full.to_vec();
        sets.push(("AWARE_COLLECTOR__SIMULATOR__CLUSTER__NODE_GPUS", "1"));
        let err = read_env(&sets).unwrap_err().to_string();
        assert!(
            err.contains("node_gpus"),
            "an unknown key is refused: {err}"
        );
        let err = read_env(&full[..2]).unwrap_err().to_string();
        assert!(
            err.contains("node_memory_bytes"),
            "a missing key is named: {err}"
        );
    }

    /// Both sources compute the mean field: the Prometheus source from the cluster's own
    /// metrics (node allocatable, pod phases and requests).
    #[test]
    fn the_mean_field_is_read_by_either_source() {
        let on = ("AWARE_LEARNING__MEAN_FIELD", "true");
        let c = read_env(&[on, ("AWARE_COLLECTOR__SOURCE", "simulator")]).unwrap();
        assert_eq!(c.source, SourceKind::Simulator);
        let c = read_env(&[
            on,
            ("AWARE_COLLECTOR__SOURCE", "prometheus"),
            ("AWARE_COLLECTOR__PROMETHEUS__URL", "http://127.0.0.1:9090"),
            (
                "AWARE_COLLECTOR__PROMETHEUS__QUERIES__CLUSTER_CPU_ALLOCATABLE_CORES",
                "sum(kube_node_status_allocatable{resource=\"cpu\",pool=\"apps\"})",
            ),
        ])
        .unwrap();
        assert_eq!(c.source, SourceKind::Prometheus);
        let err = read_env(&[
            ("AWARE_COLLECTOR__SOURCE", "prometheus"),
            ("AWARE_COLLECTOR__PROMETHEUS__QUERIES__CLUSTER_CPU", "x"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("collector.prometheus.queries.cluster_cpu")
                && err.contains("cluster_sample_time"),
            "{err}"
        );
    }

    #[test]
    fn a_collector_without_a_source_says_it_has_nothing_to_manage() {
        let cfg = AppConfig::default();
        let note = nothing_to_manage(&cfg).unwrap();
        assert!(note.contains("collector.source"), "{note}");
        let mut cfg = AppConfig::default();
        cfg.sections.insert(
            "collector".into(),
            serde_json::json!({ "source": "simulator" }),
        );
        assert_eq!(nothing_to_manage(&cfg), None);
    }
}
