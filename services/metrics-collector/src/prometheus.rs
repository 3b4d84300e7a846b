//! Source `prometheus`: every `collector.prometheus.interval_s` the collector evaluates, for each
//! configured target, a set of instant queries (`GET <url>/api/v1/query`, all at one evaluation
//! time `T`) and publishes one `obs` with the state and reward of the learning problem, the same
//! functions the simulator uses ([`aware_mdp::State::observe`], [`aware_mdp::reward`],
//! [`aware_mdp::slo_preservation`], [`aware_mdp::utilization`]).
//!
//! # Queries
//!
//! Templates expand `$pod` (the `pod_selector`), `$deployment` (the `deployment_selector`),
//! `$window` (the step window as a PromQL duration, `<ms>ms`) and `$window_s` (seconds); the
//! selectors expand `$namespace`, `$name` and `$name_re` (the name as a regular expression). Every
//! query can be replaced through `collector.prometheus.queries.<name>`.
//!
//! | name | default |
//! |---|---|
//! | `cpu_usage_cores` | increase of `container_cpu_usage_seconds_total{$pod}` over the window / `$window_s` |
//! | `memory_working_set_bytes` | `sum(container_memory_working_set_bytes{$pod})` |
//! | `cpu_request_cores` | `avg(kube_pod_container_resource_requests{$pod,resource="cpu"} and on(namespace,pod,container) container_memory_working_set_bytes{$pod})` |
//! | `cpu_request_total_cores` | the same with `sum` |
//! | `memory_request_bytes` | the same as `cpu_request_cores` with `resource="memory"` |
//! | `memory_request_total_bytes` | the same with `sum` |
//! | `replicas` | `sum(kube_deployment_status_replicas{$deployment})` |
//! | `ready_replicas` | `sum(kube_deployment_status_replicas_available{$deployment})` |
//! | `spec_replicas` | `sum(kube_deployment_spec_replicas{$deployment})` (the count in force: `replicas` lags it after a scale; `""` disables it, and `replicas` stands in) |
//! | `pending_replicas` | `sum(kube_pod_status_phase{…,phase="Pending"})` over the Deployment's pods by name (no container label); optional unless the mean field is on |
//! | `request_rate_rps` | increase of `http_requests_total{$deployment}` / `$window_s` |
//! | `throughput_rps` | increase of `http_request_duration_seconds_count{$deployment}` / `$window_s` |
//! | `latency_p50_ms`, `latency_p99_ms` | `1000 * histogram_quantile(q, <increase by le of http_request_duration_seconds_bucket{$deployment}>)` |
//! | `io_util`, `network_util` | none (not exposed by cAdvisor as a utilization; configure a query to use them) |
//! | `pod_sample_time` | `max(timestamp(container_memory_working_set_bytes{$pod}))` |
//! | `deployment_sample_time` | `max(timestamp(kube_deployment_status_replicas{$deployment}))` |
//! | `request_sample_time` | `max(timestamp(http_request_duration_seconds_count{$deployment}))` |
//!
//! Templates may also use `$namespace`, `$name` and `$name_re` directly.
//!
//! # Mean field (`learning.mean_field`)
//!
//! Once per interval, at the same `T`, five cluster-wide queries ([`ClusterQueries`], overridable
//! under the same keys, never disabled): `cluster_cpu_requested_cores` /
//! `cluster_memory_requested_bytes` (kube-state-metrics' requests of the pods not Pending,
//! Succeeded or Failed: what the scheduler has bound), `cluster_cpu_allocatable_cores` /
//! `cluster_memory_allocatable_bytes` (the allocatable of nodes not cordoned) and
//! `cluster_sample_time` (`max(timestamp(kube_node_status_allocatable))`, checked against
//! `staleness_s`). [`add_mean_fields`] ends each complete state with
//! [`aware_mdp::mean_fields`] over the other complete targets of this collector (a shard's
//! own), the cluster's shares and the targets' Pending pods. A cluster query that fails, is
//! stale or reads a non-positive allocatable, or a target without its `pending_replicas`, makes
//! the step incomplete and is named in `missing`.
//!
//! The pod and Deployment metrics are cAdvisor's and kube-state-metrics'. The request metrics are
//! the application's own, under the Prometheus client libraries' conventional names:
//! `http_requests_total` (a counter of the requests received, failed ones included: the offered
//! load) and the histogram `http_request_duration_seconds` of the requests served, both labelled
//! with the target's `namespace` and `deployment` (a relabelling rule of the scrape config
//! usually adds `deployment`). An application exporting other names overrides these queries. The
//! simulator exports the same names and labels (`aware-loadgen`'s `wallclock::render_metrics`).
//!
//! **Counters** are differenced over exactly one step window: `sum(c) - (sum((c offset W) and c)
//! or vector(0))`, divided by the window. This is `rate()` without its extrapolation: `rate()`
//! over a window a few scrapes long extrapolates the sampled span to the window edges, which
//! turns a counter that advances once per step (the simulator) into 0 or 2× the usage depending
//! on scrape phase. The difference form gives the mean of exactly `(T − W, T]` for smooth and
//! stepped counters alike. Series that start inside the window count from zero (a new pod's
//! counter starts at 0); series that vanished inside the window are not counted. So does a
//! series Prometheus first scraped inside the window: the first window after scraping begins
//! counts what the counter held before it (once per series).
//!
//! # Missing and stale metrics
//!
//! A query that fails, returns no sample, a non-finite or negative value, or a zero request
//! (latencies: see below) makes its name *missing*: a NaN never becomes a zero allocation. The three `*_sample_time` queries return the newest sample time of the pod,
//! Deployment and request series; when `T` minus that time exceeds `staleness_s` (or the query
//! returns nothing), every query of that group is missing as well (an empty `*_sample_time`
//! override disables the check of its group). With anything missing the step is published with
//! `complete: false`, `missing: [names]`, an **empty state** and no reward; the raw metrics carry
//! what was read (0 for missing values). A zero state is never published; the recommender skips
//! incomplete observations.
//!
//! `io_util` and `network_util` are only read when a query is configured; without one their state
//! features are 0 (no I/O or network pressure is known).
//!
//! Latencies: when nothing was served in the window, `histogram_quantile` returns NaN; the step is
//! still complete, the latencies are `None`, and a latency SLO counts as fully violated (SP 0) if
//! requests were offered, met (SP 1) if none were.
//!
//! # Numbering
//!
//! Each target's steps are numbered from 0 (`episode = g / steps_per_episode`); a restarted
//! collector resumes every target after its newest `obs` in the JetStream capture
//! ([`crate::resume_points`]), and a target deregistered and registered again continues its own
//! numbering.
//!
//! # Reward and timestamps
//!
//! The `obs` of evaluation `T` carries `ts_ms = T` (the Prometheus evaluation time) and the reward
//! `r = α·SP·2 + (1−α)·(RU_cpu + RU_mem)` of the window `(T − W, T]`, i.e. of the allocation that
//! was in force during the step just observed — the effect of the previous action, like the
//! simulator's observation reward. The first `obs` of a target carries no reward (no action of this
//! loop preceded it), as in the simulator source. `load_change` compares the request rate with the
//! previous evaluation's (0 on the first, or after an evaluation without a request rate).

use std::collections::HashMap;
use std::time::Duration;

use crate::config::{
    PrometheusSourceConfig, PROMETHEUS_CLUSTER_QUERY_NAMES, PROMETHEUS_QUERY_NAMES,
};
use aware_bus_schemas::{Obs, RawMetrics, Schema, Target};
use aware_mdp::{reward, slo_preservation, utilization, State};
use aware_shared::registry::{log_change, Change, Registry};
use aware_shared::service::{ServiceContext, ServiceError};
use aware_shared::spec::TargetSpec;
use futures::StreamExt;
use serde::Deserialize;

use crate::metrics::CollectorMetrics;

/// Queries in flight at once (over all targets).
const CONCURRENCY: usize = 16;

/// Errors of the Prometheus source.
#[derive(Debug, thiserror::Error)]
pub enum PromError {
    #[error("HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("query `{query}`: request failed: {source}")]
    Request {
        query: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("query `{query}`: Prometheus answered {status}: {error_type}: {error}")]
    Api {
        query: String,
        status: u16,
        error_type: String,
        error: String,
    },
    #[error("query `{query}`: unexpected response: {reason}")]
    Decode { query: String, reason: String },
}

/// One sample of an instant-query result.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: HashMap<String, String>,
    /// Evaluation time, Unix seconds.
    pub time_s: f64,
    pub value: f64,
}

#[derive(Deserialize)]
struct ApiResponse {
    status: String,
    #[serde(default)]
    data: Option<ApiData>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct ApiData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct VectorItem {
    #[serde(default)]
    metric: HashMap<String, String>,
    value: (f64, String),
}

/// Parses the body of `/api/v1/query` (vector or scalar results).
pub fn parse_response(query: &str, status: u16, body: &[u8]) -> Result<Vec<Sample>, PromError> {
    let decode = |reason: String| PromError::Decode {
        query: query.to_string(),
        reason,
    };
    let r: ApiResponse = serde_json::from_slice(body).map_err(|e| {
        decode(format!(
            "HTTP {status}, {e}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        ))
    })?;
    if r.status != "success" {
        return Err(PromError::Api {
            query: query.to_string(),
            status,
            error_type: r.error_type.unwrap_or_default(),
            error: r.error.unwrap_or_default(),
        });
    }
    let data = r.data.ok_or_else(|| decode("no `data`".into()))?;
    let value = |s: &str| {
        s.parse::<f64>()
            .map_err(|e| decode(format!("value `{s}`: {e}")))
    };
    match data.result_type.as_str() {
        "vector" => {
            let items: Vec<VectorItem> =
                serde_json::from_value(data.result).map_err(|e| decode(e.to_string()))?;
            items
                .into_iter()
                .map(|i| {
                    Ok(Sample {
                        labels: i.metric,
                        time_s: i.value.0,
                        value: value(&i.value.1)?,
                    })
                })
                .collect()
        }
        "scalar" => {
            let (t, v): (f64, String) =
                serde_json::from_value(data.result).map_err(|e| decode(e.to_string()))?;
            Ok(vec![Sample {
                labels: HashMap::new(),
                time_s: t,
                value: value(&v)?,
            }])
        }
        other => Err(decode(format!(
            "result type `{other}` (an instant vector or scalar is expected)"
        ))),
    }
}

/// Client of the Prometheus HTTP API (instant queries).
#[derive(Debug, Clone)]
pub struct PromClient {
    http: reqwest::Client,
    endpoint: String,
    timeout: Duration,
}

impl PromClient {
    /// A client of the server at `base_url` (`http://host:9090`).
    pub fn new(base_url: &str, timeout: Duration) -> Result<Self, PromError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(PromError::Client)?;
        Ok(PromClient {
            http,
            endpoint: format!("{}/api/v1/query", base_url.trim_end_matches('/')),
            timeout,
        })
    }

    /// Evaluates `promql` at `time_s` (Unix seconds).
    pub async fn query(&self, promql: &str, time_s: f64) -> Result<Vec<Sample>, PromError> {
        let req = |source| PromError::Request {
            query: promql.to_string(),
            source,
        };
        let resp = self
            .http
            .get(&self.endpoint)
            .query(&[
                ("query", promql.to_string()),
                ("time", format!("{time_s:.3}")),
                ("timeout", format!("{}ms", self.timeout.as_millis())),
            ])
            .send()
            .await
            .map_err(req)?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(req)?;
        parse_response(promql, status, &body)
    }
}

fn default_query(name: &str) -> &'static str {
    const CPU: &str = "(sum(container_cpu_usage_seconds_total{$pod}) - (sum((container_cpu_usage_seconds_total{$pod} offset $window) and container_cpu_usage_seconds_total{$pod}) or vector(0))) / $window_s";
    const REQUESTS: &str = "(sum(http_requests_total{$deployment}) - (sum((http_requests_total{$deployment} offset $window) and http_requests_total{$deployment}) or vector(0))) / $window_s";
    const THROUGHPUT: &str = "(sum(http_request_duration_seconds_count{$deployment}) - (sum((http_request_duration_seconds_count{$deployment} offset $window) and http_request_duration_seconds_count{$deployment}) or vector(0))) / $window_s";
    const P50: &str = "1000 * histogram_quantile(0.5, sum by (le) (http_request_duration_seconds_bucket{$deployment}) - (sum by (le) ((http_request_duration_seconds_bucket{$deployment} offset $window) and http_request_duration_seconds_bucket{$deployment}) or 0 * sum by (le) (http_request_duration_seconds_bucket{$deployment})))";
    const P99: &str = "1000 * histogram_quantile(0.99, sum by (le) (http_request_duration_seconds_bucket{$deployment}) - (sum by (le) ((http_request_duration_seconds_bucket{$deployment} offset $window) and http_request_duration_seconds_bucket{$deployment}) or 0 * sum by (le) (http_request_duration_seconds_bucket{$deployment})))";
    // kube-state-metrics' requests of the containers cAdvisor reports (the pods running, as
    // the HPA counts them): a pending pod requests resources but uses none yet.
    const CPU_REQUEST_AVG: &str = "avg(kube_pod_container_resource_requests{$pod,resource=\"cpu\"} and on(namespace,pod,container) container_memory_working_set_bytes{$pod})";
    const CPU_REQUEST_SUM: &str = "sum(kube_pod_container_resource_requests{$pod,resource=\"cpu\"} and on(namespace,pod,container) container_memory_working_set_bytes{$pod})";
    const MEMORY_REQUEST_AVG: &str = "avg(kube_pod_container_resource_requests{$pod,resource=\"memory\"} and on(namespace,pod,container) container_memory_working_set_bytes{$pod})";
    const MEMORY_REQUEST_SUM: &str = "sum(kube_pod_container_resource_requests{$pod,resource=\"memory\"} and on(namespace,pod,container) container_memory_working_set_bytes{$pod})";
    // kube-state-metrics' pod phases carry no container label: the Deployment's pods by name.
    const PENDING: &str = "sum(kube_pod_status_phase{namespace=\"$namespace\",pod=~\"$name_re-([a-z0-9]{5,10}-)?[a-z0-9]{5}\",phase=\"Pending\"})";
    // What the scheduler counts: the requests of the pods bound to a node (not Pending, not
    // finished), over the allocatable of the nodes that take pods (not cordoned).
    const CLUSTER_CPU_REQUESTED: &str = "sum(kube_pod_container_resource_requests{resource=\"cpu\"} unless on(namespace,pod) (kube_pod_status_phase{phase=~\"Pending|Succeeded|Failed\"} == 1))";
    const CLUSTER_MEMORY_REQUESTED: &str = "sum(kube_pod_container_resource_requests{resource=\"memory\"} unless on(namespace,pod) (kube_pod_status_phase{phase=~\"Pending|Succeeded|Failed\"} == 1))";
    const CLUSTER_CPU_ALLOCATABLE: &str = "sum(kube_node_status_allocatable{resource=\"cpu\"} unless on(node) (kube_node_spec_unschedulable == 1))";
    const CLUSTER_MEMORY_ALLOCATABLE: &str = "sum(kube_node_status_allocatable{resource=\"memory\"} unless on(node) (kube_node_spec_unschedulable == 1))";
    match name {
        "cpu_usage_cores" => CPU,
        "memory_working_set_bytes" => "sum(container_memory_working_set_bytes{$pod})",
        "cpu_request_cores" => CPU_REQUEST_AVG,
        "cpu_request_total_cores" => CPU_REQUEST_SUM,
        "memory_request_bytes" => MEMORY_REQUEST_AVG,
        "memory_request_total_bytes" => MEMORY_REQUEST_SUM,
        "replicas" => "sum(kube_deployment_status_replicas{$deployment})",
        "ready_replicas" => "sum(kube_deployment_status_replicas_available{$deployment})",
        "spec_replicas" => "sum(kube_deployment_spec_replicas{$deployment})",
        "pending_replicas" => PENDING,
        "cluster_cpu_requested_cores" => CLUSTER_CPU_REQUESTED,
        "cluster_memory_requested_bytes" => CLUSTER_MEMORY_REQUESTED,
        "cluster_cpu_allocatable_cores" => CLUSTER_CPU_ALLOCATABLE,
        "cluster_memory_allocatable_bytes" => CLUSTER_MEMORY_ALLOCATABLE,
        "cluster_sample_time" => "max(timestamp(kube_node_status_allocatable))",
        "request_rate_rps" => REQUESTS,
        "throughput_rps" => THROUGHPUT,
        "latency_p50_ms" => P50,
        "latency_p99_ms" => P99,
        "pod_sample_time" => "max(timestamp(container_memory_working_set_bytes{$pod}))",
        "deployment_sample_time" => "max(timestamp(kube_deployment_status_replicas{$deployment}))",
        "request_sample_time" => "max(timestamp(http_request_duration_seconds_count{$deployment}))",
        // io_util, network_util: not read unless configured
        _ => "",
    }
}

/// The queries whose freshness each `*_sample_time` query vouches for.
const GROUPS: [(&str, &[&str]); 3] = [
    (
        "pod_sample_time",
        &[
            "cpu_usage_cores",
            "memory_working_set_bytes",
            "cpu_request_cores",
            "cpu_request_total_cores",
            "memory_request_bytes",
            "memory_request_total_bytes",
        ],
    ),
    (
        "deployment_sample_time",
        &[
            "replicas",
            "ready_replicas",
            "spec_replicas",
            "pending_replicas",
        ],
    ),
    (
        "request_sample_time",
        &[
            "request_rate_rps",
            "throughput_rps",
            "latency_p50_ms",
            "latency_p99_ms",
        ],
    ),
];

/// The queries that read the allocation in force (the requests): usable when positive (zero
/// means no request is known).
const ALLOCATION: [&str; 4] = [
    "cpu_request_cores",
    "cpu_request_total_cores",
    "memory_request_bytes",
    "memory_request_total_bytes",
];

/// Escapes a string for a PromQL double-quoted string literal.
fn promql_string(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Escapes a string for an RE2 regular expression.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The PromQL duration of a window: whole milliseconds, at least 1 ms.
fn promql_duration(seconds: f64) -> String {
    format!("{}ms", ((seconds * 1000.0).round() as u64).max(1))
}

/// The expanded queries of one target, by name (disabled optional queries left out).
#[derive(Debug, Clone, PartialEq)]
pub struct TargetQueries {
    pub queries: Vec<(&'static str, String)>,
}

impl TargetQueries {
    /// Expands the configured (or default) templates for `namespace/name`.
    pub fn new(cfg: &PrometheusSourceConfig, namespace: &str, name: &str) -> Self {
        let sel = |template: &str| {
            template
                .replace("$namespace", &promql_string(namespace))
                .replace("$name_re", &promql_string(&regex_escape(name)))
                .replace("$name", &promql_string(name))
        };
        let pod = sel(&cfg.pod_selector);
        let deployment = sel(&cfg.deployment_selector);
        let window = promql_duration(cfg.interval_s);
        let window_s = format!("{}", cfg.interval_s);
        let queries = PROMETHEUS_QUERY_NAMES
            .iter()
            .filter_map(|&n| {
                let template = cfg
                    .queries
                    .get(n)
                    .map(String::as_str)
                    .unwrap_or_else(|| default_query(n));
                (!template.trim().is_empty()).then(|| {
                    (
                        n,
                        sel(template)
                            .replace("$pod", &pod)
                            .replace("$deployment", &deployment)
                            .replace("$window_s", &window_s)
                            .replace("$window", &window),
                    )
                })
            })
            .collect();
        TargetQueries { queries }
    }

    /// The PromQL of a query, if enabled.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.queries
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, q)| q.as_str())
    }
}

/// The cluster-wide queries ([`PROMETHEUS_CLUSTER_QUERY_NAMES`]), evaluated once per interval
/// with `learning.mean_field`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterQueries {
    pub queries: Vec<(&'static str, String)>,
}

impl ClusterQueries {
    /// The configured (or default) cluster queries; none may be disabled.
    pub fn new(cfg: &PrometheusSourceConfig) -> Self {
        let queries = PROMETHEUS_CLUSTER_QUERY_NAMES
            .iter()
            .map(|&n| {
                let q = cfg
                    .queries
                    .get(n)
                    .map(String::as_str)
                    .filter(|q| !q.trim().is_empty())
                    .unwrap_or_else(|| default_query(n));
                (n, q.to_string())
            })
            .collect();
        ClusterQueries { queries }
    }
}

/// The cluster's shares of one evaluation, or the names of the cluster queries that failed,
/// returned nothing, a value that is not a positive finite (allocatable) or non-negative finite
/// (requested) number, or are stale.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterReading {
    /// Σ CPU and memory requests of bound pods over the schedulable nodes' allocatable.
    pub shares: Result<[f64; 2], Vec<String>>,
    /// Query failures (HTTP or API errors).
    pub errors: u32,
}

/// Builds the cluster reading from its query outcomes (pure: no I/O).
pub fn build_cluster_reading(
    outcomes: &HashMap<&'static str, QueryOutcome>,
    time_s: f64,
    staleness_s: f64,
) -> ClusterReading {
    let errors = outcomes
        .values()
        .filter(|o| matches!(o, QueryOutcome::Failed))
        .count() as u32;
    let value = |name: &str| match outcomes.get(name) {
        Some(QueryOutcome::Value(v)) if v.is_finite() => Some(*v),
        _ => None,
    };
    let fresh = value("cluster_sample_time").is_some_and(|ts| time_s - ts <= staleness_s);
    let mut missing: Vec<String> = Vec::new();
    let mut read = |name: &'static str, positive: bool| {
        let v = value(name).filter(|v| if positive { *v > 0.0 } else { *v >= 0.0 });
        if v.is_none() || !fresh {
            missing.push(name.to_string());
        }
        v.unwrap_or(0.0)
    };
    let cpu = read("cluster_cpu_requested_cores", false);
    let memory = read("cluster_memory_requested_bytes", false);
    let cpu_alloc = read("cluster_cpu_allocatable_cores", true);
    let memory_alloc = read("cluster_memory_allocatable_bytes", true);
    if !fresh {
        missing.push("cluster_sample_time".to_string());
    }
    missing.sort();
    ClusterReading {
        shares: if missing.is_empty() {
            Ok([cpu / cpu_alloc, memory / memory_alloc])
        } else {
            Err(missing)
        },
        errors,
    }
}

/// Runs the cluster queries at `time_s`.
pub async fn evaluate_cluster(
    client: &PromClient,
    queries: &ClusterQueries,
    time_s: f64,
    staleness_s: f64,
) -> ClusterReading {
    let outcomes = run_queries(client, &queries.queries, time_s).await;
    build_cluster_reading(&outcomes, time_s, staleness_s)
}

/// Ends each complete evaluation's state with its mean field ([`aware_mdp::mean_fields`]) over
/// the other complete evaluations of the same interval (this collector's targets: a shard sees
/// its own) and the cluster's shares; `previous_cores[i]` is target `i`'s requested cores at the
/// previous interval. A step without what the mean field needs (a cluster query, or the
/// target's `pending_replicas`) is made incomplete naming it: a guessed share never reaches a
/// state.
pub fn add_mean_fields(
    evaluations: &mut [Evaluation],
    previous_cores: &[Option<f64>],
    cluster: &ClusterReading,
) {
    let make_incomplete = |e: &mut Evaluation, names: &[String]| {
        e.state = None;
        e.reward = None;
        e.slo_violation = false;
        e.mean_field = None;
        e.missing.extend(names.iter().cloned());
        e.missing.sort();
        e.missing.dedup();
    };
    for e in evaluations.iter_mut().filter(|e| e.state.is_some()) {
        if let Err(names) = &cluster.shares {
            make_incomplete(e, names);
        } else if e.metrics.pending_replicas.is_none() {
            make_incomplete(e, &["pending_replicas".to_string()]);
        }
    }
    let Ok([cpu_requested, memory_requested]) = cluster.shares else {
        return;
    };
    let complete: Vec<usize> = (0..evaluations.len())
        .filter(|&i| evaluations[i].state.is_some())
        .collect();
    let members: Vec<aware_mdp::Member> = complete
        .iter()
        .map(|&i| {
            let e = &evaluations[i];
            aware_mdp::Member {
                requested_cores: requested_cores(e),
                previous_requested_cores: previous_cores.get(i).copied().flatten(),
                replicas: e.metrics.replicas_in_force(),
                slo_preservation: e.state.map_or(0.0, |s| f64::from(s.slo_preservation)),
                cpu_util: e.metrics.cpu_util,
            }
        })
        .collect();
    let share = aware_mdp::ClusterShare {
        cpu_requested,
        memory_requested,
        pending_replicas: complete
            .iter()
            .map(|&i| evaluations[i].metrics.pending_replicas.unwrap_or(0))
            .sum(),
    };
    for (&i, field) in complete
        .iter()
        .zip(aware_mdp::mean_fields(&members, Some(&share)))
    {
        evaluations[i].mean_field = Some(field);
    }
}

/// Requested cores of a complete evaluation: per-replica CPU request × replicas in force (the
/// simulator's `Prices::cores` of the allocation).
pub fn requested_cores(e: &Evaluation) -> f64 {
    e.metrics.cpu_limit_cores * f64::from(e.metrics.replicas_in_force())
}

/// What one query gave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QueryOutcome {
    /// The value of the single (or summed) sample.
    Value(f64),
    /// No sample.
    Empty,
    /// The request or Prometheus failed (counted, logged).
    Failed,
}

/// Everything one evaluation of one target yields.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// Evaluation time, Unix seconds.
    pub time_s: f64,
    /// The state (`None` when incomplete).
    pub state: Option<State>,
    /// The reward of the observed window (`None` when incomplete).
    pub reward: Option<f64>,
    pub slo_violation: bool,
    pub metrics: RawMetrics,
    /// Missing or stale metric names, sorted.
    pub missing: Vec<String>,
    /// Query failures (HTTP or API errors) in this evaluation.
    pub errors: u32,
    /// The mean field that ends the state, with `learning.mean_field` ([`add_mean_fields`]).
    pub mean_field: Option<[f32; aware_mdp::MEAN_FIELD_DIM]>,
}

/// Builds the evaluation of a target from its query outcomes (pure: no I/O).
pub fn build_evaluation(
    outcomes: &HashMap<&'static str, QueryOutcome>,
    time_s: f64,
    spec: &TargetSpec,
    prev_offered: Option<f64>,
    staleness_s: f64,
) -> Evaluation {
    let mut missing: Vec<String> = Vec::new();
    let errors = outcomes
        .values()
        .filter(|o| matches!(o, QueryOutcome::Failed))
        .count() as u32;
    for (probe, members) in GROUPS {
        let stale = match outcomes.get(probe) {
            None => false, // check disabled
            Some(QueryOutcome::Value(ts)) => !(ts.is_finite() && time_s - ts <= staleness_s),
            Some(_) => true,
        };
        if stale {
            missing.push(probe.to_string());
            // A disabled member (no query) is not missing: it was never read.
            missing.extend(
                members
                    .iter()
                    .filter(|m| outcomes.contains_key(*m))
                    .map(|m| m.to_string()),
            );
        }
    }
    // A value is usable when finite and not negative (a request: positive); a latency may be NaN
    // (nothing served). Anything else would turn into a zero allocation or utilization
    // downstream, so the metric is missing instead.
    let mut get = |name: &'static str, nan_ok: bool| -> Option<f64> {
        let usable = |v: f64| {
            let least_ok = if ALLOCATION.contains(&name) {
                v > 0.0
            } else {
                v >= 0.0
            };
            (v.is_finite() && least_ok) || (nan_ok && v.is_nan())
        };
        match outcomes.get(name) {
            Some(QueryOutcome::Value(v)) if usable(*v) => Some(*v),
            None if matches!(name, "io_util" | "network_util") => Some(0.0),
            _ => {
                missing.push(name.to_string());
                None
            }
        }
    };
    let cpu_usage = get("cpu_usage_cores", false);
    let ws = get("memory_working_set_bytes", false);
    let cpu_request = get("cpu_request_cores", false);
    let cpu_total = get("cpu_request_total_cores", false);
    let mem_request = get("memory_request_bytes", false);
    let mem_total = get("memory_request_total_bytes", false);
    let replicas = get("replicas", false);
    let ready = get("ready_replicas", false);
    // Disabled (no query): the field is absent and `replicas` stands in downstream.
    let spec_replicas = if outcomes.contains_key("spec_replicas") {
        get("spec_replicas", false)
    } else {
        None
    };
    let offered = get("request_rate_rps", false);
    let throughput = get("throughput_rps", false);
    let p50 = get("latency_p50_ms", true);
    let p99 = get("latency_p99_ms", true);
    // Read when it answers; not missing otherwise (only the mean field needs it).
    let pending = match outcomes.get("pending_replicas") {
        Some(QueryOutcome::Value(v)) if v.is_finite() && *v >= 0.0 => Some(*v),
        _ => None,
    };
    let io = get("io_util", false);
    let net = get("network_util", false);
    missing.sort();
    missing.dedup();

    let count = |v: Option<f64>| v.map_or(0, |x| x.round().clamp(0.0, f64::from(u32::MAX)) as u32);
    let cpu_util = utilization(cpu_usage.unwrap_or(0.0), cpu_total.unwrap_or(0.0));
    let memory_util = utilization(ws.unwrap_or(0.0), mem_total.unwrap_or(0.0));
    let finite = |v: Option<f64>| v.filter(|x| x.is_finite());
    let offered_rps = offered.unwrap_or(0.0);
    let throughput_rps = throughput.unwrap_or(0.0);
    // NaN p99: nothing served in the window
    let p99_for_slo = match finite(p99) {
        Some(p) => p,
        None if offered_rps > 0.0 => f64::INFINITY,
        None => 0.0,
    };
    let (sp, violation) = slo_preservation(&spec.slo, p99_for_slo, throughput_rps, offered_rps);
    let metrics = RawMetrics {
        replicas: count(replicas),
        ready_replicas: count(ready),
        cpu_limit_cores: cpu_request.unwrap_or(0.0),
        memory_limit_bytes: mem_request.unwrap_or(0.0),
        cpu_usage_cores: cpu_usage.unwrap_or(0.0),
        memory_working_set_bytes: ws.unwrap_or(0.0),
        cpu_util,
        memory_util,
        io_util: io.unwrap_or(0.0),
        network_util: net.unwrap_or(0.0),
        request_rate_rps: offered_rps,
        throughput_rps,
        latency_p50_ms: finite(p50),
        latency_p99_ms: finite(p99),
        oom_kills: 0,
        spec_replicas: spec_replicas.map(|v| count(Some(v))),
        // Optional (the mean field needs it: `add_mean_fields`).
        pending_replicas: pending.map(|v| count(Some(v))),
    };
    let complete = missing.is_empty();
    let (state, reward_value) = if complete {
        (
            Some(State::observe(&metrics, sp, prev_offered, &spec.bounds)),
            Some(reward(spec.alpha, sp, cpu_util, memory_util)),
        )
    } else {
        (None, None)
    };
    Evaluation {
        time_s,
        state,
        reward: reward_value,
        slo_violation: complete && violation,
        metrics,
        missing,
        errors,
        mean_field: None,
    }
}

/// Runs `queries` at `time_s`, up to [`CONCURRENCY`] at once.
async fn run_queries(
    client: &PromClient,
    queries: &[(&'static str, String)],
    time_s: f64,
) -> HashMap<&'static str, QueryOutcome> {
    futures::stream::iter(queries.iter().map(|(name, q)| async move {
        let outcome = match client.query(q, time_s).await {
            Ok(samples) if samples.is_empty() => QueryOutcome::Empty,
            Ok(samples) if samples.len() == 1 => QueryOutcome::Value(samples[0].value),
            Ok(samples) => {
                tracing::warn!(query = *name, series = samples.len(), promql = %q, "query returned several series: summing them");
                QueryOutcome::Value(samples.iter().map(|s| s.value).sum())
            }
            Err(e) => {
                tracing::warn!(query = *name, error = %e, "Prometheus query failed");
                QueryOutcome::Failed
            }
        };
        (*name, outcome)
    }))
    .buffer_unordered(CONCURRENCY)
    .collect()
    .await
}

/// Runs every query of one target at `time_s` and builds its evaluation.
pub async fn evaluate(
    client: &PromClient,
    queries: &TargetQueries,
    spec: &TargetSpec,
    time_s: f64,
    prev_offered: Option<f64>,
    staleness_s: f64,
) -> Evaluation {
    let outcomes = run_queries(client, &queries.queries, time_s).await;
    build_evaluation(&outcomes, time_s, spec, prev_offered, staleness_s)
}

/// The `obs` of an evaluation (global step `g` of the target).
pub fn to_obs(e: &Evaluation, target: &Target, g: u64, steps_per_episode: u32) -> Obs {
    let spe = u64::from(steps_per_episode.max(1));
    Obs {
        schema: Schema::new(),
        target: target.clone(),
        episode: g / spe,
        step: u32::try_from(g % spe).unwrap_or(0),
        ts_ms: (e.time_s * 1000.0).round() as i64,
        state: e
            .state
            .map(|s| {
                let mut v = s.to_vec();
                v.extend(e.mean_field.iter().flatten());
                v
            })
            .unwrap_or_default(),
        metrics: e.metrics.clone(),
        reward: if g > 0 { e.reward } else { None },
        slo_violation: e.slo_violation,
        complete: e.state.is_some(),
        missing: e.missing.clone(),
    }
}

struct TargetLoop {
    spec: TargetSpec,
    target: Target,
    queries: TargetQueries,
    step: u64,
    prev_offered: Option<f64>,
    /// Requested cores at the previous interval (the mean field's allocation change).
    prev_cores: Option<f64>,
}

fn now_s() -> f64 {
    aware_bus_schemas::now_ms() as f64 / 1000.0
}

/// The targets one collector instance observes: the configured ones and those the controller
/// registers (`target/1`), restricted to this instance's shard.
struct Targets {
    loops: Vec<TargetLoop>,
    registry: Registry,
    /// The next global step of targets not observed now (from the capture at start, or
    /// deregistered): a target observed again continues its numbering.
    resume: HashMap<Target, u64>,
}

impl Targets {
    fn new(
        ctx: &ServiceContext,
        cfg: &PrometheusSourceConfig,
        resume: HashMap<Target, u64>,
    ) -> Result<Self, ServiceError> {
        let mut t = Targets {
            loops: Vec::with_capacity(ctx.config.targets.len()),
            registry: Registry::default(),
            resume,
        };
        for spec in &ctx.config.targets {
            aware_bus_schemas::subject::subject(aware_bus_schemas::EventKind::Obs, &spec.target())?;
            if ctx.config.shard.owns(&spec.target()) {
                t.upsert(cfg, spec.clone());
            }
        }
        Ok(t)
    }

    fn upsert(&mut self, cfg: &PrometheusSourceConfig, spec: TargetSpec) {
        let target = spec.target();
        match self.loops.iter_mut().find(|l| l.target == target) {
            Some(l) => l.spec = spec,
            None => self.loops.push(TargetLoop {
                queries: TargetQueries::new(cfg, &spec.namespace, &spec.name),
                step: self.resume.remove(&target).unwrap_or(0),
                spec,
                target,
                prev_offered: None,
                prev_cores: None,
            }),
        }
    }

    /// Applies a registration; true when the set of observed targets changed.
    fn apply(
        &mut self,
        ctx: &ServiceContext,
        cfg: &PrometheusSourceConfig,
        r: &aware_bus_schemas::Registration,
    ) -> bool {
        if !ctx.config.shard.owns(&r.target) {
            return false;
        }
        let change = self.registry.apply(r);
        log_change(
            crate::NAME,
            &ctx.metrics.registrations,
            &r.target,
            r.generation,
            &change,
        );
        match change {
            Change::Registered {
                spec,
                changed: true,
                ..
            } => {
                self.upsert(cfg, spec);
                true
            }
            Change::Deregistered => {
                let Some(i) = self.loops.iter().position(|l| l.target == r.target) else {
                    return false;
                };
                let l = self.loops.remove(i);
                self.resume.insert(l.target, l.step);
                true
            }
            Change::Registered { .. } | Change::Refused(_) => false,
        }
    }
}

/// Runs the Prometheus source until shutdown.
pub async fn run(
    ctx: ServiceContext,
    cfg: PrometheusSourceConfig,
    spread_fraction: f64,
    metrics: CollectorMetrics,
) -> Result<(), ServiceError> {
    let spread = Duration::from_secs_f64(cfg.interval_s * spread_fraction);
    let spe = ctx.config.learning.steps_per_episode;
    let client = PromClient::new(&cfg.url, Duration::from_millis(cfg.query_timeout_ms))
        .map_err(|e| ServiceError::resource("collector.prometheus", e))?;
    let captured = crate::captured_obs(&ctx).await;
    let resume = crate::resume_points(&captured, spe);
    let mut targets = Targets::new(&ctx, &cfg, resume)?;
    // The mean field (`learning.mean_field`): the cluster's shares, read once per interval.
    let cluster_queries = ctx
        .config
        .learning
        .mean_field
        .then(|| ClusterQueries::new(&cfg));
    let mut registrations = ctx
        .subscribe_events(&[aware_bus_schemas::EventKind::Target])
        .await?;
    if targets.loops.is_empty() {
        tracing::info!("prometheus source: no targets configured; waiting for registrations");
    }
    metrics
        .targets
        .set(i64::try_from(targets.loops.len()).unwrap_or(i64::MAX));
    tracing::info!(url = %cfg.url, targets = targets.loops.len(), interval_s = cfg.interval_s, "collecting from Prometheus");
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(cfg.interval_s));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            ev = registrations.recv() => {
                match ev {
                    Some(aware_bus_schemas::Event::Registration(r)) => {
                        if targets.apply(&ctx, &cfg, &r) {
                            metrics
                                .targets
                                .set(i64::try_from(targets.loops.len()).unwrap_or(i64::MAX));
                        }
                    }
                    Some(_) => {}
                    // The bus subscription ended: shutting down.
                    None => break,
                }
                continue;
            }
            _ = ticker.tick() => {}
        }
        let targets = &mut targets.loops;
        let t = now_s();
        let mut evaluations: Vec<Evaluation> =
            futures::future::join_all(targets.iter().map(|tl| {
                evaluate(
                    &client,
                    &tl.queries,
                    &tl.spec,
                    t,
                    tl.prev_offered,
                    cfg.staleness_s,
                )
            }))
            .await;
        let mut errors = 0u32;
        let own_complete: Vec<bool> = evaluations.iter().map(|e| e.state.is_some()).collect();
        if let Some(cq) = &cluster_queries {
            let reading = evaluate_cluster(&client, cq, t, cfg.staleness_s).await;
            metrics.prom_queries.inc_by(cq.queries.len() as u64);
            metrics.prom_query_errors.inc_by(u64::from(reading.errors));
            errors += reading.errors;
            if let Err(missing) = &reading.shares {
                tracing::warn!(missing = ?missing, "the cluster's shares are missing or stale: every step is incomplete");
            }
            let previous: Vec<Option<f64>> = targets.iter().map(|tl| tl.prev_cores).collect();
            add_mean_fields(&mut evaluations, &previous, &reading);
        }
        let mut all = Vec::with_capacity(targets.len());
        for ((tl, e), own) in targets.iter_mut().zip(&evaluations).zip(own_complete) {
            let queried = tl.queries.queries.len() as u64;
            metrics.prom_queries.inc_by(queried);
            metrics.prom_query_errors.inc_by(u64::from(e.errors));
            errors += e.errors;
            if e.state.is_none() {
                metrics.incomplete_obs.inc();
                tracing::warn!(target = %tl.target, step = tl.step, missing = ?e.missing, "incomplete step: metrics missing or stale");
            }
            all.push(to_obs(e, &tl.target, tl.step, spe));
            tl.prev_offered = (!e.missing.iter().any(|m| m == "request_rate_rps"))
                .then_some(e.metrics.request_rate_rps);
            tl.prev_cores = own.then(|| requested_cores(e));
            tl.step += 1;
        }
        // With acknowledged publishes (ADR 0022) each waits for the stream: up to PUBLISHING at
        // once, spread over `collector.spread_fraction` of the interval.
        crate::publish_spread(&ctx, all, spread).await;
        metrics.steps.inc();
        // ready while Prometheus answers
        ctx.ready.set(errors == 0 || targets.is_empty());
    }
    ctx.ready.set(false);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TargetSpec {
        let mut s = TargetSpec::new(&Target::new("shop", "cart.v2"));
        s.slo.latency_p99_ms = Some(100.0);
        s.alpha = 0.5;
        s
    }

    fn complete_outcomes(t: f64) -> HashMap<&'static str, QueryOutcome> {
        use QueryOutcome::Value;
        HashMap::from([
            ("cpu_usage_cores", Value(1.0)),
            ("memory_working_set_bytes", Value(512.0 * 1048576.0)),
            ("cpu_request_cores", Value(1.0)),
            ("cpu_request_total_cores", Value(2.0)),
            ("memory_request_bytes", Value(1024.0 * 1048576.0)),
            ("memory_request_total_bytes", Value(2048.0 * 1048576.0)),
            ("replicas", Value(2.0)),
            ("ready_replicas", Value(2.0)),
            // a scale 2 → 3 the pods have not caught up with yet
            ("spec_replicas", Value(3.0)),
            ("request_rate_rps", Value(100.0)),
            ("throughput_rps", Value(100.0)),
            ("latency_p50_ms", Value(20.0)),
            ("latency_p99_ms", Value(200.0)),
            ("pod_sample_time", Value(t - 1.0)),
            ("deployment_sample_time", Value(t - 1.0)),
            ("request_sample_time", Value(t - 1.0)),
        ])
    }

    #[test]
    fn templates_expand_and_escape() {
        let mut cfg = PrometheusSourceConfig {
            interval_s: 2.5,
            ..PrometheusSourceConfig::default()
        };
        cfg.queries
            .insert("io_util".into(), "avg(io{$deployment})".into());
        cfg.queries.insert("network_util".into(), " ".into());
        let q = TargetQueries::new(&cfg, "shop", "cart.v2");
        let cpu = q.get("cpu_usage_cores").unwrap();
        assert!(
            cpu.contains(r#"pod=~"cart\\.v2-([a-z0-9]{5,10}-)?[a-z0-9]{5}""#),
            "{cpu}"
        );
        assert!(cpu.contains("offset 2500ms"), "{cpu}");
        assert!(cpu.ends_with("/ 2.5"), "{cpu}");
        assert!(!cpu.contains('$'), "{cpu}");
        assert_eq!(
            q.get("io_util"),
            Some(r#"avg(io{namespace="shop",deployment="cart.v2"})"#)
        );
        assert_eq!(q.get("network_util"), None, "blank override disables");
        assert!(q
            .get("latency_p99_ms")
            .unwrap()
            .starts_with("1000 * histogram_quantile(0.99,"));
        assert_eq!(q.queries.len(), PROMETHEUS_QUERY_NAMES.len() - 1);
    }

    #[test]
    fn parses_vector_scalar_and_errors() {
        let v = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"le":"0.5"},"value":[1700000000.5,"NaN"]},{"metric":{},"value":[1700000000.5,"+Inf"]}]}}"#;
        let s = parse_response("q", 200, v).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].labels.get("le").map(String::as_str), Some("0.5"));
        assert!(s[0].value.is_nan());
        assert_eq!(s[1].value, f64::INFINITY);
        assert_eq!(s[1].time_s, 1_700_000_000.5);
        let sc = br#"{"status":"success","data":{"resultType":"scalar","result":[12.0,"3.25"]}}"#;
        assert_eq!(parse_response("q", 200, sc).unwrap()[0].value, 3.25);
        let err = br#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#;
        let e = parse_response("su(", 400, err).unwrap_err();
        assert!(
            matches!(&e, PromError::Api { status: 400, error_type, .. } if error_type == "bad_data"),
            "{e}"
        );
        assert!(matches!(
            parse_response("q", 502, b"<html>bad gateway</html>"),
            Err(PromError::Decode { .. })
        ));
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(parse_response("q", 200, matrix).is_err());
    }

    #[test]
    fn times_are_read_exactly_as_written() {
        // Found by the `prometheus_response` fuzz target: the default JSON number parser read
        // this time as the float next to the one its digits denote.
        for t in [
            "1755555555555555555555555555555555500000000",
            "1.7555555555555555e42",
        ] {
            let body = format!(
                r#"{{"status":"success","data":{{"resultType":"scalar","result":[{t},"1"]}}}}"#
            );
            let s = parse_response("q", 200, body.as_bytes()).unwrap();
            assert_eq!(
                s[0].time_s.to_bits(),
                t.parse::<f64>().unwrap().to_bits(),
                "{t}"
            );
        }
    }

    #[test]
    fn complete_evaluation_uses_the_simulator_formulas() {
        let t = 1000.0;
        let e = build_evaluation(&complete_outcomes(t), t, &spec(), Some(50.0), 5.0);
        assert!(e.missing.is_empty(), "{:?}", e.missing);
        let s = e.state.unwrap();
        let b = spec().bounds;
        assert!((s.cpu_limit - (1000.0 / b.max_cpu_millicores as f32)).abs() < 1e-6);
        assert_eq!(s.cpu_util, 0.5, "cpu util = usage / total request");
        assert_eq!(s.memory_util, 0.25);
        assert_eq!(s.io_util, 0.0, "io not configured");
        assert_eq!(s.slo_preservation, 0.5, "SP = 100 / 200");
        assert_eq!(s.load_change, 0.5, "load change (100 - 50) / 100");
        assert_eq!(e.reward, Some(0.5 * 0.5 * 2.0 + 0.5 * (0.5 + 0.25)));
        assert!(e.slo_violation);
        assert_eq!(e.metrics.replicas, 2);
        assert_eq!(e.metrics.spec_replicas, Some(3));
        assert_eq!(e.metrics.replicas_in_force(), 3);
        let o = to_obs(&e, &spec().target(), 0, 100);
        assert!(
            o.complete && o.reward.is_none(),
            "first obs carries no reward"
        );
        assert_eq!(o.ts_ms, 1_000_000);
        let o = to_obs(&e, &spec().target(), 103, 100);
        assert_eq!((o.episode, o.step), (1, 3));
        assert_eq!(o.reward, e.reward);
    }

    fn cluster_outcomes(t: f64) -> HashMap<&'static str, QueryOutcome> {
        use QueryOutcome::Value;
        HashMap::from([
            ("cluster_cpu_requested_cores", Value(6.0)),
            ("cluster_memory_requested_bytes", Value(8.0 * GIB)),
            ("cluster_cpu_allocatable_cores", Value(8.0)),
            ("cluster_memory_allocatable_bytes", Value(16.0 * GIB)),
            ("cluster_sample_time", Value(t - 1.0)),
        ])
    }

    const GIB: f64 = 1024.0 * 1048576.0;

    /// The mean field over the complete evaluations of an interval: the others' figures, the
    /// cluster's shares, the Pending replicas of this collector's targets. A step without its
    /// Pending count, or with a cluster query missing or stale, is incomplete and names it.
    #[test]
    fn the_mean_field_ends_each_complete_state() {
        use QueryOutcome::Value;
        let t = 1000.0;
        let eval = |o: &HashMap<&'static str, QueryOutcome>| {
            build_evaluation(o, t, &spec(), Some(50.0), 5.0)
        };
        let mut a = complete_outcomes(t);
        a.insert("pending_replicas", Value(1.0));
        let mut b = a.clone();
        b.insert("cpu_usage_cores", Value(0.5));
        b.insert("pending_replicas", Value(0.0));
        let cluster = build_cluster_reading(&cluster_outcomes(t), t, 5.0);
        assert_eq!(cluster.shares, Ok([0.75, 0.5]));
        let mut evals = vec![
            eval(&a),
            eval(&b),
            eval(&complete_outcomes(t)),
            eval(&HashMap::new()),
        ];
        assert_eq!(evals[0].metrics.pending_replicas, Some(1));
        assert_eq!(evals[2].metrics.pending_replicas, None, "not missing alone");
        assert!(evals[2].state.is_some());
        // a has 3 cores requested (1 core × 3 replicas in force), 1.5 before: a change of 0.5.
        add_mean_fields(&mut evals, &[Some(1.5), None, Some(2.0), None], &cluster);
        let (fa, fb) = (evals[0].mean_field.unwrap(), evals[1].mean_field.unwrap());
        assert_eq!(fa, [0.0, 0.75, 0.5, 1.0 / 6.0, 0.5, 0.25]);
        assert_eq!(fb, [0.5, 0.75, 0.5, 1.0 / 6.0, 0.5, 0.5]);
        assert_eq!(evals[2].state, None);
        assert_eq!(evals[2].missing, ["pending_replicas"]);
        assert_eq!(evals[3].mean_field, None);
        let o = to_obs(&evals[0], &spec().target(), 1, 100);
        assert_eq!(o.state.len(), aware_mdp::state_width(true));
        assert_eq!(o.state[aware_mdp::STATE_DIM..], fa);
        assert!(!to_obs(&evals[2], &spec().target(), 1, 100).complete);

        // A stale cluster reading, a zero allocatable: every step incomplete, naming them.
        let mut stale = cluster_outcomes(t);
        stale.insert("cluster_sample_time", Value(t - 10.0));
        stale.insert("cluster_memory_allocatable_bytes", Value(0.0));
        let reading = build_cluster_reading(&stale, t, 5.0);
        let names = [
            "cluster_cpu_allocatable_cores",
            "cluster_cpu_requested_cores",
            "cluster_memory_allocatable_bytes",
            "cluster_memory_requested_bytes",
            "cluster_sample_time",
        ];
        assert_eq!(reading.shares, Err(names.map(String::from).to_vec()));
        let mut zero = cluster_outcomes(t);
        zero.insert("cluster_cpu_allocatable_cores", Value(0.0));
        zero.insert("cluster_cpu_requested_cores", QueryOutcome::Failed);
        let reading = build_cluster_reading(&zero, t, 5.0);
        assert_eq!(reading.errors, 1);
        assert_eq!(
            reading.shares,
            Err(vec![
                "cluster_cpu_allocatable_cores".to_string(),
                "cluster_cpu_requested_cores".to_string()
            ])
        );
        let mut evals = vec![eval(&a), eval(&b)];
        add_mean_fields(&mut evals, &[None, None], &reading);
        for e in &evals {
            assert!(e.state.is_none() && e.reward.is_none() && e.mean_field.is_none());
            assert!(e
                .missing
                .contains(&"cluster_cpu_requested_cores".to_string()));
        }
    }

    /// The cluster queries: every default, an override taking `$`-free PromQL, a blank
    /// override falling back to the default (none of them may be disabled).
    #[test]
    fn cluster_queries_have_defaults_and_overrides() {
        let mut cfg = PrometheusSourceConfig::default();
        cfg.queries.insert(
            "cluster_cpu_allocatable_cores".into(),
            "sum(kube_node_status_allocatable{resource=\"cpu\",pool=\"apps\"})".into(),
        );
        cfg.queries
            .insert("cluster_memory_allocatable_bytes".into(), " ".into());
        let q = ClusterQueries::new(&cfg);
        assert_eq!(q.queries.len(), PROMETHEUS_CLUSTER_QUERY_NAMES.len());
        let get = |n: &str| q.queries.iter().find(|(k, _)| *k == n).unwrap().1.clone();
        assert!(get("cluster_cpu_allocatable_cores").contains("pool=\"apps\""));
        assert!(get("cluster_memory_allocatable_bytes").contains("resource=\"memory\""));
        assert!(get("cluster_cpu_requested_cores").contains("unless on(namespace,pod)"));
        let t = TargetQueries::new(&cfg, "shop", "cart.v2");
        let pending = t.get("pending_replicas").unwrap();
        assert!(
            pending.contains(r#"namespace="shop",pod=~"cart\\.v2-"#) && !pending.contains('$'),
            "{pending}"
        );
    }

    /// `spec_replicas` disabled (an empty override, so no outcome): the step is complete, the
    /// field absent and the running pods stand in for the count in force, also when the
    /// Deployment series are stale (only what was read is named missing).
    #[test]
    fn a_disabled_spec_replicas_query_leaves_the_field_absent() {
        let t = 1000.0;
        let mut o = complete_outcomes(t);
        o.remove("spec_replicas");
        let e = build_evaluation(&o, t, &spec(), None, 5.0);
        assert!(e.missing.is_empty(), "{:?}", e.missing);
        assert_eq!(e.metrics.spec_replicas, None);
        assert_eq!(e.metrics.replicas_in_force(), 2);
        o.insert("deployment_sample_time", QueryOutcome::Value(t - 6.0));
        let e = build_evaluation(&o, t, &spec(), None, 5.0);
        assert_eq!(
            e.missing,
            vec!["deployment_sample_time", "ready_replicas", "replicas"]
        );
    }

    #[test]
    fn missing_and_stale_metrics_make_the_step_incomplete() {
        let t = 1000.0;
        let mut o = complete_outcomes(t);
        o.insert("memory_working_set_bytes", QueryOutcome::Empty);
        o.insert("throughput_rps", QueryOutcome::Failed);
        let e = build_evaluation(&o, t, &spec(), None, 5.0);
        assert_eq!(
            e.missing,
            vec!["memory_working_set_bytes", "throughput_rps"]
        );
        assert_eq!(e.state, None);
        assert_eq!(e.reward, None);
        assert_eq!(e.errors, 1);
        let obs = to_obs(&e, &spec().target(), 7, 100);
        assert!(!obs.complete && obs.state.is_empty() && obs.reward.is_none());

        let mut o = complete_outcomes(t);
        o.insert("deployment_sample_time", QueryOutcome::Value(t - 6.0));
        let e = build_evaluation(&o, t, &spec(), None, 5.0);
        assert_eq!(
            e.missing,
            vec![
                "deployment_sample_time",
                "ready_replicas",
                "replicas",
                "spec_replicas"
            ]
        );
        assert_eq!(e.state, None);

        let mut o = complete_outcomes(t);
        o.insert("spec_replicas", QueryOutcome::Empty);
        let e = build_evaluation(&o, t, &spec(), None, 5.0);
        assert_eq!(e.missing, vec!["spec_replicas"]);

        let mut o = complete_outcomes(t);
        o.insert("io_util", QueryOutcome::Empty);
        o.insert("latency_p99_ms", QueryOutcome::Value(f64::INFINITY));
        let e = build_evaluation(&o, t, &spec(), None, 5.0);
        assert_eq!(e.missing, vec!["io_util", "latency_p99_ms"]);
    }

    /// NaN, infinite and negative resource metrics (and zero requests) are missing: the obs is
    /// incomplete, names them, and carries no state — never a complete obs whose allocation
    /// reads as zero.
    #[test]
    fn non_finite_and_negative_metrics_make_the_step_incomplete() {
        let t = 1000.0;
        for name in [
            "cpu_usage_cores",
            "memory_working_set_bytes",
            "cpu_request_cores",
            "cpu_request_total_cores",
            "memory_request_bytes",
            "memory_request_total_bytes",
            "replicas",
            "ready_replicas",
            "spec_replicas",
            "request_rate_rps",
            "throughput_rps",
        ] {
            let mut bad = vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0];
            if ALLOCATION.contains(&name) {
                bad.push(0.0);
            }
            for v in bad {
                let mut o = complete_outcomes(t);
                o.insert(name, QueryOutcome::Value(v));
                let e = build_evaluation(&o, t, &spec(), None, 5.0);
                assert_eq!(e.missing, vec![name], "{name} = {v}");
                let obs = to_obs(&e, &spec().target(), 7, 100);
                assert!(!obs.complete && obs.state.is_empty(), "{name} = {v}");
                assert_eq!(obs.missing, vec![name]);
                assert!(obs.reward.is_none());
            }
        }
        // A negative latency is refused too; NaN stays "nothing served".
        let mut o = complete_outcomes(t);
        o.insert("latency_p99_ms", QueryOutcome::Value(-5.0));
        let e = build_evaluation(&o, t, &spec(), None, 5.0);
        assert_eq!(e.missing, vec!["latency_p99_ms"]);
        // Zero usage is a real value.
        let mut o = complete_outcomes(t);
        o.insert("cpu_usage_cores", QueryOutcome::Value(0.0));
        assert!(build_evaluation(&o, t, &spec(), None, 5.0)
            .missing
            .is_empty());
    }

    #[test]
    fn nothing_served_is_complete_with_no_latency() {
        let t = 1000.0;
        let mut o = complete_outcomes(t);
        o.insert("throughput_rps", QueryOutcome::Value(0.0));
        o.insert("latency_p50_ms", QueryOutcome::Value(f64::NAN));
        o.insert("latency_p99_ms", QueryOutcome::Value(f64::NAN));
        let e = build_evaluation(&o, t, &spec(), None, 5.0);
        assert!(e.missing.is_empty());
        assert_eq!(e.metrics.latency_p99_ms, None);
        assert_eq!(
            e.state.unwrap().slo_preservation,
            0.0,
            "offered but nothing served"
        );
        o.insert("request_rate_rps", QueryOutcome::Value(0.0));
        let e = build_evaluation(&o, t, &spec(), None, 5.0);
        assert_eq!(
            e.state.unwrap().slo_preservation,
            1.0,
            "no load, nothing to violate"
        );
    }
}
