//! AWARE integration tests (one binary). They start real servers (`nats-server`) on free ports.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod alerts;
mod bad_input;
mod bootstrap_loop;
mod bus_conformance;
mod bus_permissions;
mod bus_security;
mod chaos;
mod control_loop;
mod defence;
mod demo;
mod docs;
mod forged_models;
mod hosts;
mod jetstream;
mod kube_e2e;
mod loop_nats;
mod meta_loop;
mod model_store_nats;
mod prometheus_source;
mod registration;
mod rl_loop;
mod run_all;
mod service_http;
mod shards;
mod wire_schemas;

/// Sets the `[recorder]` and `[trajectory_store]` sections from one map of `settings`: the
/// store's keys (`sqlite_path`, `keep_transitions`, …) go to the store's section, the others to
/// the recorder's.
pub(crate) fn set_recorder(cfg: &mut aware_shared::config::AppConfig, settings: serde_json::Value) {
    const STORE_KEYS: [&str; 6] = [
        "backend",
        "sqlite_path",
        "questdb_url",
        "questdb_table_prefix",
        "keep_transitions",
        "forget_after_secs",
    ];
    let (mut recorder, mut store) = (serde_json::Map::new(), serde_json::Map::new());
    for (k, v) in settings.as_object().cloned().unwrap_or_default() {
        if STORE_KEYS.contains(&k.as_str()) {
            store.insert(k, v);
        } else {
            recorder.insert(k, v);
        }
    }
    cfg.sections.insert("recorder".into(), recorder.into());
    cfg.sections.insert("trajectory_store".into(), store.into());
}

/// Subscribes to `subject` on `bus`, then starts the six services on it with `cfg`; returns the
/// subscription, the running services and their shutdown token.
pub(crate) async fn start_services(
    bus: aware_shared::bus::Bus,
    cfg: aware_shared::config::AppConfig,
    subject: &str,
) -> (
    aware_shared::bus::Subscription,
    aware_shared::launcher::Running,
    tokio_util::sync::CancellationToken,
) {
    let sub = bus.subscribe(subject).await.unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = aware_shared::launcher::start_on(
        bus,
        std::sync::Arc::new(cfg),
        &aware_cli::SERVICES,
        shutdown.clone(),
    )
    .await
    .unwrap();
    (sub, running, shutdown)
}

/// Reads the counters and gauges of `service` (one of `running`'s) by name: `None` for a metric
/// it does not have (of a labelled one, its first series). It keeps the service's registry, so
/// it still answers after `running.join()`.
pub(crate) fn metrics_of(
    running: &aware_shared::launcher::Running,
    service: &str,
) -> impl Fn(&str) -> Option<f64> {
    let read = series_of(running, service);
    move |name| read(name, None)
}

/// [`metrics_of`] for labelled series: the value of `name`'s series with exactly `labels`
/// (besides the service's own `service` label).
pub(crate) fn labelled_metrics_of(
    running: &aware_shared::launcher::Running,
    service: &str,
) -> impl Fn(&str, &[(&str, &str)]) -> Option<f64> {
    let read = series_of(running, service);
    move |name, labels| read(name, Some(labels))
}

/// Label pairs of a series, besides `service`.
type Labels<'a> = &'a [(&'a str, &'a str)];

/// The reader behind [`metrics_of`] (`labels` `None`: the first series) and
/// [`labelled_metrics_of`].
fn series_of(
    running: &aware_shared::launcher::Running,
    service: &str,
) -> impl Fn(&str, Option<Labels>) -> Option<f64> {
    let registry = running
        .contexts
        .iter()
        .find(|c| c.name == service)
        .unwrap_or_else(|| panic!("{service} runs"))
        .metrics
        .registry()
        .clone();
    move |name, labels| {
        let families = registry.gather();
        let f = families.iter().find(|f| f.name() == name)?;
        let m = f.get_metric().iter().find(|m| {
            let Some(labels) = labels else {
                return true;
            };
            let have: Vec<(&str, &str)> = m
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .filter(|(n, _)| *n != "service")
                .collect();
            have.len() == labels.len() && labels.iter().all(|l| have.contains(l))
        })?;
        match f.get_field_type() {
            prometheus::proto::MetricType::GAUGE => Some(m.get_gauge().get_value()),
            _ => Some(m.get_counter().get_value()),
        }
    }
}

/// Polls `metric` of a service until it equals `want`, failing after `within`.
pub(crate) async fn wait_for_metric(
    metric: &impl Fn(&str) -> Option<f64>,
    name: &str,
    want: f64,
    within: std::time::Duration,
) {
    let deadline = tokio::time::Instant::now() + within;
    while metric(name) != Some(want) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} = {:?}, not {want}, after {within:?}",
            metric(name)
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Waits (at most 10 s) until every service of `running` is ready: subscribed, so a message
/// published now reaches them.
pub(crate) async fn wait_ready(running: &aware_shared::launcher::Running) {
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while !running.contexts.iter().all(|c| c.ready.get()) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("services ready");
}

/// The next message on `sub` decoded as an event (by its subject's kind); panics with `what()`
/// (the wait's goal and the state so far) once `deadline` passes.
pub(crate) async fn next_event(
    sub: &mut aware_shared::bus::Subscription,
    deadline: tokio::time::Instant,
    what: impl FnOnce() -> String,
) -> aware_bus_schemas::Event {
    let m = tokio::time::timeout_at(deadline, sub.next())
        .await
        .unwrap_or_else(|_| panic!("{}", what()))
        .unwrap();
    let p = aware_bus_schemas::subject::parse(&m.subject).unwrap();
    aware_bus_schemas::decode_event(p.kind, &m.payload).unwrap()
}
