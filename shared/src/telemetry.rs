//! Telemetry: `tracing` honouring `RUST_LOG`, one prometheus registry per service (its only place
//! for metrics), and the `/metrics`, `/healthz`, `/readyz` HTTP endpoints.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use aware_bus_schemas::EventKind;
use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio_util::sync::CancellationToken;

use crate::config::LogFormat;

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("tracing: {0}")]
    Tracing(String),
    #[error("metrics registry: {0}")]
    Prometheus(#[from] prometheus::Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// Installs the global tracing subscriber (`RUST_LOG`, default `info`), logging to stderr.
pub fn init_tracing(format: LogFormat) -> Result<(), TelemetryError> {
    init_tracing_at(format, "info")
}

/// [`init_tracing`] with another filter where `RUST_LOG` is unset (`aware demo` logs warnings
/// only, so its live table is not buried under the services' info lines).
pub fn init_tracing_at(format: LogFormat, default_filter: &str) -> Result<(), TelemetryError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let res = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    res.map_err(|e| TelemetryError::Tracing(e.to_string()))
}

/// The metrics of one service. Every metric of a service is registered here.
#[derive(Clone)]
pub struct ServiceMetrics {
    registry: Registry,
    service: &'static str,
    /// Messages received, by event kind.
    pub messages_in: IntCounterVec,
    /// Messages published, by event kind.
    pub messages_out: IntCounterVec,
    /// Messages dropped because they could not be decoded, by event kind.
    pub decode_errors: IntCounterVec,
    /// Publishes that failed, by event kind.
    pub publish_errors: IntCounterVec,
    /// Targets with a live actor in this service.
    pub targets: IntGauge,
    /// Controller registrations (`target/1`) applied, by change: registered (new or changed),
    /// deregistered, refused (invalid spec; what was in force stays). Repeats are not counted.
    pub registrations: IntCounterVec,
    /// Deregistered targets whose actor was stopped ([`crate::agents::TargetActors::sweep`]).
    pub targets_retired: IntCounter,
    /// Events of retired targets: dropped, or (the recorder) recorded by a new actor.
    pub retired_target_events: IntCounter,
    /// Targets whose latest registration registers them (not deregistered), among those this
    /// service's actors route ([`crate::agents::TargetActors`]).
    pub registered_targets: IntGauge,
    /// When this service last received a registration (Unix seconds; 0: never). The controller
    /// re-sends every registration each `controller.resync_seconds`, so with targets registered
    /// a long silence means the controller is gone.
    pub registration_last_received: Gauge,
    /// Events refused because they would start an actor for one more target, by reason:
    /// `max_targets` (`actors.max_targets` reached), `unregistered`
    /// (`actors.require_registration` and the target is not registered).
    pub target_refusals: IntCounterVec,
    /// Messages the NATS client dropped because this service's subscription buffer was full
    /// (a slow consumer), by event kind ([`crate::slow_consumers`]).
    pub slow_consumer_drops: IntCounterVec,
    /// Failed reads of the current state at start-up (the JetStream capture), by event kind;
    /// each is retried ([`crate::service::ServiceContext::current_state`]).
    pub state_read_failures: IntCounterVec,
    /// 1 while the current state of an event kind is not read yet after a failed read (the
    /// service is not ready), 0 once read.
    pub state_unread: IntGaugeVec,
    /// Targets of this shard whose newest message of an event kind the last start-up read of
    /// the current state found ([`crate::service::ServiceContext::current_state`]).
    pub state_restored: IntGaugeVec,
    /// How long the last start-up read of an event kind's current state took, retries
    /// included, seconds.
    pub state_read_seconds: GaugeVec,
    /// Messages a JetStream replay read, by stream (a partition of the capture), before
    /// keeping this shard's ([`crate::service::ServiceContext::subscribe_replay`]).
    pub replay_read: IntCounterVec,
    /// Messages a partition of the capture discarded (its `max_bytes` or `max_age_secs`)
    /// before a replay that still needed them read them, by stream: what the trajectory store
    /// lost.
    pub replay_discarded: IntCounterVec,
    /// The time span a partition of the capture holds (now − its oldest message), by stream, as
    /// a replay last checked it.
    pub capture_span: GaugeVec,
}

impl ServiceMetrics {
    pub fn new(service: &'static str) -> Result<Self, TelemetryError> {
        let labels = std::iter::once(("service".to_string(), service.to_string())).collect();
        let registry = Registry::new_custom(Some("aware".to_string()), Some(labels))?;
        let r = &registry;
        let by_event = |name: &str, help: &str| -> Result<IntCounterVec, TelemetryError> {
            registered(r, IntCounterVec::new(Opts::new(name, help), &["event"])?)
        };
        let messages_in = by_event("messages_in_total", "Bus messages received, by event kind")?;
        let messages_out = by_event(
            "messages_out_total",
            "Bus messages published, by event kind",
        )?;
        let decode_errors = by_event(
            "decode_errors_total",
            "Malformed bus messages counted and dropped, by event kind",
        )?;
        let publish_errors = by_event("publish_errors_total", "Failed publishes, by event kind")?;
        let slow_consumer_drops = by_event(
            "bus_slow_consumer_drops_total",
            "Messages the NATS client dropped because the service's subscription buffer (bus.channel_capacity) was full, by event kind",
        )?;
        let state_read_failures = by_event(
            "state_read_failures_total",
            "Failed reads of the current state (the JetStream capture's newest message per target) at start-up, by event kind; retried while the service stays not ready",
        )?;
        let state_unread = registered(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "state_unread",
                    "1 while an event kind's current state could not be read yet (the service is not ready), 0 once read",
                ),
                &["event"],
            )?,
        )?;
        let state_restored = registered(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "state_restored_targets",
                    "Targets of this shard whose newest message of an event kind the last start-up read of the current state found",
                ),
                &["event"],
            )?,
        )?;
        let state_read_seconds = registered(
            r,
            GaugeVec::new(
                Opts::new(
                    "state_read_seconds",
                    "How long the last start-up read of an event kind's current state took, retries included",
                ),
                &["event"],
            )?,
        )?;
        let replay_read = registered(
            r,
            IntCounterVec::new(
                Opts::new(
                    "replay_messages_read_total",
                    "Messages a JetStream replay read, by stream (a partition of the capture), before keeping this shard's",
                ),
                &["stream"],
            )?,
        )?;
        let replay_discarded = registered(
            r,
            IntCounterVec::new(
                Opts::new(
                    "replay_discarded_messages_total",
                    "Messages a partition of the capture discarded (max_bytes, max_age_secs) before the replay that needed them read them, by stream",
                ),
                &["stream"],
            )?,
        )?;
        let capture_span = registered(
            r,
            GaugeVec::new(
                Opts::new(
                    "capture_span_seconds",
                    "The time span a partition of the capture holds (now minus its oldest message), by stream, as the replay last checked",
                ),
                &["stream"],
            )?,
        )?;
        let targets = registered(
            r,
            IntGauge::new("targets", "Targets with a live actor in this service")?,
        )?;
        let registrations = registered(
            r,
            IntCounterVec::new(
                Opts::new(
                    "registrations_total",
                    "Controller registrations applied, by change (registered or changed, deregistered, refused)",
                ),
                &["change"],
            )?,
        )?;
        for change in ["registered", "deregistered", "refused"] {
            registrations.with_label_values(&[change]);
        }
        let targets_retired = registered(
            r,
            IntCounter::new(
                "targets_retired_total",
                "Deregistered targets whose actor was stopped after actors.retire_after_secs",
            )?,
        )?;
        let retired_target_events = registered(
            r,
            IntCounter::new(
                "retired_target_events_total",
                "Events of retired (deregistered) targets: dropped (the recorder records them)",
            )?,
        )?;
        let registered_targets = registered(
            r,
            IntGauge::new(
                "registered_targets",
                "Targets whose latest controller registration registers them (not deregistered)",
            )?,
        )?;
        let registration_last_received = registered(
            r,
            Gauge::new(
                "registration_last_received_timestamp_seconds",
                "When the last controller registration was received (Unix seconds; 0: never)",
            )?,
        )?;
        let target_refusals = registered(
            r,
            IntCounterVec::new(
                Opts::new(
                    "target_refusals_total",
                    "Events refused rather than start an actor for another target, by reason (max_targets, unregistered)",
                ),
                &["reason"],
            )?,
        )?;
        for reason in ["max_targets", "unregistered"] {
            target_refusals.with_label_values(&[reason]);
        }
        // Pre-create every label so a scrape shows zeros instead of missing series.
        for kind in EventKind::ALL {
            for c in [
                &messages_in,
                &messages_out,
                &decode_errors,
                &publish_errors,
                &slow_consumer_drops,
                &state_read_failures,
            ] {
                c.with_label_values(&[kind.as_str()]);
            }
            if kind.is_state() {
                state_unread.with_label_values(&[kind.as_str()]);
            }
        }
        Ok(ServiceMetrics {
            registry,
            service,
            messages_in,
            messages_out,
            decode_errors,
            publish_errors,
            targets,
            registrations,
            targets_retired,
            retired_target_events,
            registered_targets,
            registration_last_received,
            target_refusals,
            slow_consumer_drops,
            state_read_failures,
            state_unread,
            state_restored,
            state_read_seconds,
            replay_read,
            replay_discarded,
            capture_span,
        })
    }

    pub fn service(&self) -> &'static str {
        self.service
    }

    /// The registry, for service-specific metrics registered by the service's own metrics module.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Registers `metric` in this service's registry (its name gets the `aware_` prefix and the
    /// `service` label) and hands it back.
    pub fn register<M: Collector + Clone + 'static>(&self, metric: M) -> Result<M, TelemetryError> {
        registered(&self.registry, metric)
    }

    /// A registered counter.
    pub fn counter(&self, name: &str, help: &str) -> Result<IntCounter, TelemetryError> {
        self.register(IntCounter::new(name, help)?)
    }

    /// A registered counter with `labels`, the series of every label-value tuple of `zeroed`
    /// created at 0, so a scrape (and an alert's `rate`) sees them before their first increment.
    pub fn counter_vec<V: AsRef<[&'static str]>>(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        zeroed: &[V],
    ) -> Result<IntCounterVec, TelemetryError> {
        let c = self.register(IntCounterVec::new(Opts::new(name, help), labels)?)?;
        for values in zeroed {
            c.get_metric_with_label_values(values.as_ref())?;
        }
        Ok(c)
    }

    /// A registered integer gauge.
    pub fn gauge(&self, name: &str, help: &str) -> Result<IntGauge, TelemetryError> {
        self.register(IntGauge::new(name, help)?)
    }

    /// A registered integer gauge with `labels`.
    pub fn gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntGaugeVec, TelemetryError> {
        self.register(IntGaugeVec::new(Opts::new(name, help), labels)?)
    }

    /// A registered floating-point gauge.
    pub fn float_gauge(&self, name: &str, help: &str) -> Result<Gauge, TelemetryError> {
        self.register(Gauge::new(name, help)?)
    }

    /// A registered histogram with `buckets`.
    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        buckets: Vec<f64>,
    ) -> Result<Histogram, TelemetryError> {
        self.register(Histogram::with_opts(
            HistogramOpts::new(name, help).buckets(buckets),
        )?)
    }
}

/// Registers `metric` in `registry` and hands it back.
fn registered<M: Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> Result<M, TelemetryError> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// Readiness of one service: set once it is subscribed and connected, and not blocked by
/// anything it cannot do yet ([`Readiness::block`]: a reason `/readyz` gives).
#[derive(Clone, Default)]
pub struct Readiness(Arc<ReadinessInner>);

#[derive(Default)]
struct ReadinessInner {
    ready: AtomicBool,
    blockers: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
}

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.ready.store(ready, Ordering::SeqCst);
    }

    /// Set ([`Readiness::set`]) and nothing blocks it.
    pub fn get(&self) -> bool {
        self.0.ready.load(Ordering::SeqCst) && self.blockers().is_empty()
    }

    /// Not ready while `key` is blocked, for `reason` (replaces an earlier reason of `key`).
    pub fn block(&self, key: impl Into<String>, reason: impl Into<String>) {
        self.locked().insert(key.into(), reason.into());
    }

    /// `key` no longer blocks readiness.
    pub fn unblock(&self, key: &str) {
        self.locked().remove(key);
    }

    /// What blocks readiness: (key, reason), by key.
    pub fn blockers(&self) -> Vec<(String, String)> {
        self.locked()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, String>> {
        // A panic while holding the lock leaves a map that is still whole.
        self.0.blockers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the HTTP endpoints report on.
#[derive(Clone)]
pub struct HttpState {
    pub metrics: Vec<ServiceMetrics>,
    pub ready: Vec<(String, Readiness)>,
    pub bus: Option<crate::bus::Bus>,
}

/// The Prometheus text exposition of every registry in `metrics`.
pub fn render_metrics(metrics: &[ServiceMetrics]) -> String {
    let mut families = Vec::new();
    for m in metrics {
        families.extend(m.registry.gather());
    }
    let mut buf = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&families, &mut buf) {
        tracing::error!(error = %e, "encoding metrics failed");
    }
    String::from_utf8(buf).unwrap_or_default()
}

fn readiness_report(state: &HttpState) -> (bool, String) {
    let mut ok = true;
    let mut body = String::new();
    if let Some(bus) = &state.bus {
        let c = bus.is_connected();
        ok &= c;
        body.push_str(&format!(
            "bus {}: {}\n",
            bus.kind(),
            if c { "connected" } else { "disconnected" }
        ));
    }
    for (name, r) in &state.ready {
        ok &= r.get();
        let blockers = r.blockers();
        if blockers.is_empty() {
            body.push_str(&format!(
                "{name}: {}\n",
                if r.get() { "ready" } else { "starting" }
            ));
        }
        for (key, reason) in blockers {
            body.push_str(&format!("{name}: not ready: {key}: {reason}\n"));
        }
    }
    (ok, body)
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listen` until `shutdown`; returns the bound
/// address (useful with port 0) once listening.
pub async fn serve_http(
    listen: &str,
    state: HttpState,
    shutdown: CancellationToken,
) -> Result<SocketAddr, TelemetryError> {
    use axum::http::StatusCode;
    use axum::routing::get;

    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| TelemetryError::Bind {
            addr: listen.to_string(),
            source,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|source| TelemetryError::Bind {
            addr: listen.to_string(),
            source,
        })?;
    let metrics_state = state.clone();
    let ready_state = state;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let s = metrics_state.clone();
                async move {
                    (
                        [("content-type", "text/plain; version=0.0.4")],
                        render_metrics(&s.metrics),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let s = ready_state.clone();
                async move {
                    let (ok, body) = readiness_report(&s);
                    let code = if ok {
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    (code, body)
                }
            }),
        );
    tokio::spawn(async move {
        let res = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = res {
            tracing::error!(error = %e, "http server failed");
        }
    });
    tracing::info!(%addr, "serving /metrics /healthz /readyz");
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_is_set_and_unblocked_and_the_report_says_what_blocks_it() {
        let r = Readiness::default();
        assert!(!r.get());
        r.set(true);
        assert!(r.get());
        r.block("state:model", "cannot read");
        r.block("state:model", "cannot read it still");
        assert!(!r.get());
        let state = HttpState {
            metrics: Vec::new(),
            ready: vec![("recommender".to_string(), r.clone())],
            bus: None,
        };
        let (ok, body) = readiness_report(&state);
        assert!(!ok);
        assert_eq!(
            body,
            "recommender: not ready: state:model: cannot read it still\n"
        );
        r.unblock("state:model");
        assert!(r.get());
        let (ok, body) = readiness_report(&state);
        assert!(ok);
        assert_eq!(body, "recommender: ready\n");
    }

    #[test]
    fn exposition_has_per_event_counters() {
        let m = ServiceMetrics::new("recommender").unwrap();
        m.messages_in.with_label_values(&["obs"]).inc_by(3);
        m.decode_errors.with_label_values(&["obs"]).inc();
        let text = render_metrics(&[m]);
        assert!(
            text.contains("aware_messages_in_total{event=\"obs\",service=\"recommender\"} 3"),
            "{text}"
        );
        assert!(text.contains("aware_decode_errors_total{event=\"obs\",service=\"recommender\"} 1"));
        assert!(
            text.contains("aware_messages_out_total{event=\"model\",service=\"recommender\"} 0")
        );
    }

    #[test]
    fn a_services_own_metrics_are_registered_prefixed_labelled_and_zeroed() {
        let m = ServiceMetrics::new("trainer").unwrap();
        let c = m.counter("x_total", "x").unwrap();
        let v = m
            .counter_vec("errors_total", "e", &["op"], &[&["read"], &["write"]])
            .unwrap();
        let g = m.gauge("depth", "d").unwrap();
        let gv = m.gauge_vec("held_seconds", "h", &["target"]).unwrap();
        let f = m.float_gauge("last_seconds", "l").unwrap();
        let h = m.histogram("took_seconds", "t", vec![0.1, 1.0]).unwrap();
        c.inc();
        v.with_label_values(&["read"]).inc_by(2);
        g.set(4);
        gv.with_label_values(&["ns/a"]).set(5);
        f.set(1.5);
        h.observe(0.5);
        let text = render_metrics(std::slice::from_ref(&m));
        for line in [
            "aware_x_total{service=\"trainer\"} 1",
            "aware_errors_total{op=\"read\",service=\"trainer\"} 2",
            // created at 0 before its first increment
            "aware_errors_total{op=\"write\",service=\"trainer\"} 0",
            "aware_depth{service=\"trainer\"} 4",
            "aware_held_seconds{target=\"ns/a\",service=\"trainer\"} 5",
            "aware_last_seconds{service=\"trainer\"} 1.5",
            "aware_took_seconds_bucket{service=\"trainer\",le=\"1\"} 1",
            "aware_took_seconds_bucket{service=\"trainer\",le=\"0.1\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        // A name registered twice, or a zeroed series of the wrong arity, is an error.
        assert!(m.counter("x_total", "again").is_err());
        assert!(m
            .counter_vec("bad_total", "b", &["op"], &[&["a", "b"]])
            .is_err());
    }
}
