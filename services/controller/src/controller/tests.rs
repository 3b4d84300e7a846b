//! The controller against a scripted mock API server (`tower_test::mock::pair`: every request's
//! method, URI, content type and JSON body is asserted) and the in-process bus (every
//! registration it publishes is decoded and checked).

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use aware_bus_schemas::{
    DecisionSource, Event, EventKind, Lifecycle, Registration, Resources, Schema, Stage, Target,
};
use aware_shared::bus::{Bus, Subscription};
use aware_shared::config::AppConfig;
use aware_shared::kube_mock::{self, get, Exchange};
use aware_shared::service::ServiceContext;
use http::{Method, Request, Response};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tower_test::mock;

use super::*;

const JSON_PATCH: &str = "application/json-patch+json";
const MERGE: &str = "application/merge-patch+json";
const OBJ: &str = "/apis/aware.dev/v1alpha1/namespaces/shop/awareautoscalers/web-aware";
const STATUS: &str = "/apis/aware.dev/v1alpha1/namespaces/shop/awareautoscalers/web-aware/status?&fieldManager=aware-controller";
const DEPLOY: &str = "/apis/apps/v1/namespaces/shop/deployments/web";
const MIB: u64 = 1024 * 1024;

/// A PATCH answered with 200 (the controller's writes all succeed in these scripts).
fn patch(uri: &str, content_type: &'static str, body: Value, response: Value) -> Exchange {
    kube_mock::patch(uri, content_type, body, 200, response)
}

/// Every `lastTransitionTime` replaced by `"<time>"` after checking it is an RFC 3339 time.
fn normalize_times(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k == "lastTransitionTime" {
                    let s = x.as_str().expect("lastTransitionTime is a string");
                    assert!(
                        s.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
                        "lastTransitionTime `{s}` is not RFC 3339"
                    );
                    *x = json!("<time>");
                } else {
                    normalize_times(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(normalize_times),
        _ => {}
    }
}

/// The scripted mock API server, timestamps normalized (see [`normalize_times`]).
fn serve(script: Vec<Exchange>) -> (Client, tokio::task::JoinHandle<()>) {
    kube_mock::serve_normalized(script, normalize_times)
}

struct Fixture {
    shared: Arc<Shared>,
    registrations: Subscription,
    server: tokio::task::JoinHandle<()>,
}

impl Fixture {
    async fn new(script: Vec<Exchange>) -> Fixture {
        let bus = Bus::in_process(1024);
        let registrations = bus.subscribe("aware.v1.target.>").await.unwrap();
        let ctx = ServiceContext::new(
            "controller",
            bus,
            Arc::new(AppConfig::default()),
            CancellationToken::new(),
        )
        .unwrap();
        let (client, server) = serve(script);
        let shared = Shared::new(client, ctx, ControllerConfig::default()).unwrap();
        Fixture {
            shared,
            registrations,
            server,
        }
    }

    /// The next registration published, or None within 200 ms.
    async fn registration(&mut self) -> Option<Registration> {
        let msg = tokio::time::timeout(Duration::from_millis(200), self.registrations.next())
            .await
            .ok()??;
        let ev = aware_bus_schemas::decode_event(EventKind::Target, &msg.payload).unwrap();
        assert_eq!(&*msg.subject, "aware.v1.target.shop.web");
        match ev {
            Event::Registration(r) => Some(r),
            other => panic!("not a registration: {other:?}"),
        }
    }

    /// Waits for the mock server to have served its whole script (and nothing more).
    async fn finish(self) {
        drop(self.shared);
        tokio::time::timeout(Duration::from_secs(5), self.server)
            .await
            .expect("the mock server did not finish")
            .expect("the mock server's assertions");
    }
}

fn object(finalizers: &[&str], spec: Value) -> Value {
    json!({
        "apiVersion": "aware.dev/v1alpha1",
        "kind": "AwareAutoscaler",
        "metadata": {
            "name": "web-aware",
            "namespace": "shop",
            "uid": "9a4c3c2e-0000-4000-8000-000000000001",
            "resourceVersion": "100",
            "generation": 3,
            "finalizers": finalizers,
        },
        "spec": spec,
    })
}

fn spec() -> Value {
    json!({
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        "updatePolicy": {"updateMode": "Off"},
        "constraints": {"minReplicas": 1, "maxReplicas": 10},
        "resourcePolicy": {"containerPolicies": [{
            "containerName": "app",
            "minAllowed": {"cpu": "100m", "memory": "128Mi"},
            "maxAllowed": {"cpu": "2", "memory": "2Gi"},
        }]},
        "slo": {"latencyP99Ms": 200.0},
        "objective": {"alpha": 0.6},
        "lifecycle": {"bootstrap": true, "tOnline": 1.1, "tServing": 1.4, "tVar": 0.1, "window": 5},
    })
}

fn deployment(replicas: i64, cpu: &str, memory: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [
                    {"name": "sidecar", "image": "envoy", "resources": {"limits": {"cpu": "50m", "memory": "64Mi"}}},
                    {"name": "app", "image": "web:1", "resources": {"limits": {"cpu": cpu, "memory": memory}}},
                ]},
            },
        },
    })
}

fn parse(v: Value) -> Arc<AwareAutoscaler> {
    Arc::new(serde_json::from_value(v).unwrap())
}

fn status_body(conditions: Value, extra: Value) -> Value {
    let mut status = json!({"conditions": conditions, "observedGeneration": 3});
    if let (Value::Object(s), Value::Object(e)) = (&mut status, extra) {
        s.extend(e);
    }
    json!({"status": status})
}

#[tokio::test]
async fn create_adds_the_finalizer_then_registers_and_writes_status() {
    let with_finalizer = object(&[FINALIZER], spec());
    let registered = status_body(
        json!([{
            "type": "Registered",
            "status": "True",
            "reason": "Registered",
            "message": "Deployment shop/web registered with the services (recommend-only)",
            "observedGeneration": 3,
            "lastTransitionTime": "<time>",
        }]),
        json!({}),
    );
    let mut f = Fixture::new(vec![
        patch(
            &format!("{OBJ}?"),
            JSON_PATCH,
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
            ]),
            with_finalizer.clone(),
        ),
        get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
        patch(STATUS, MERGE, registered, with_finalizer.clone()),
    ])
    .await;
    // A new object: the finalizer goes on first; nothing is registered before it is there.
    let fresh = object(&[], spec());
    let fresh = {
        let mut v = fresh;
        v["metadata"].as_object_mut().unwrap().remove("finalizers");
        v
    };
    let action = reconcile(parse(fresh), f.shared.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert!(f.registration().await.is_none());

    // The watch delivers it again with the finalizer: registered, status written.
    let action = reconcile(parse(with_finalizer), f.shared.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
    let r = f.registration().await.expect("a registration");
    assert_eq!(r.target, Target::new("shop", "web"));
    assert_eq!(r.generation, 3);
    assert_eq!(r.source, "shop/web-aware");
    let s = r.spec.expect("a spec");
    assert_eq!((s.min_replicas, s.max_replicas), (1, 10));
    assert_eq!((s.min_cpu_millicores, s.max_cpu_millicores), (100, 2000));
    assert_eq!(
        (s.min_memory_bytes, s.max_memory_bytes),
        (128 * MIB, 2048 * MIB)
    );
    assert_eq!(s.slo_latency_p99_ms, Some(200.0));
    assert_eq!(s.alpha, 0.6);
    assert!(s.recommend_only);
    let l = s.lifecycle.expect("the lifecycle profile");
    assert_eq!(
        (l.t_online, l.t_serving, l.t_var, l.window),
        (1.1, 1.4, 0.1, 5)
    );
    assert_eq!(
        f.shared.owner_of(&Target::new("shop", "web")),
        Some(ObjectKey {
            namespace: "shop".into(),
            name: "web-aware".into()
        })
    );
    assert_eq!(f.shared.metrics.managed.get(), 1);
    f.finish().await;
}

#[tokio::test]
async fn a_resync_re_sends_the_registration_without_writing_status_again() {
    let obj = object(&[FINALIZER], spec());
    let mut f = Fixture::new(vec![
        get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
        patch(
            STATUS,
            MERGE,
            status_body(
                json!([{
                    "type": "Registered", "status": "True", "reason": "Registered",
                    "message": "Deployment shop/web registered with the services (recommend-only)",
                    "observedGeneration": 3, "lastTransitionTime": "<time>",
                }]),
                json!({}),
            ),
            obj.clone(),
        ),
        get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
    ])
    .await;
    reconcile(parse(obj.clone()), f.shared.clone())
        .await
        .unwrap();
    assert!(f.registration().await.is_some());
    reconcile(parse(obj), f.shared.clone()).await.unwrap();
    assert!(f.registration().await.is_some(), "re-sent on resync");
    f.finish().await;
}

#[tokio::test]
async fn delete_deregisters_then_releases_the_finalizer() {
    let mut obj = object(&["other.io/keep", FINALIZER], spec());
    obj["metadata"]["deletionTimestamp"] = json!("2026-11-22T21:00:00Z");
    let mut released = obj.clone();
    released["metadata"]["finalizers"] = json!(["other.io/keep"]);
    let mut f = Fixture::new(vec![patch(
        &format!("{OBJ}?"),
        JSON_PATCH,
        json!([
            {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
            {"op": "remove", "path": "/metadata/finalizers/1"},
        ]),
        released,
    )])
    .await;
    // It was managed before.
    f.shared.tracked().owners.insert(
        Target::new("shop", "web"),
        ObjectKey {
            namespace: "shop".into(),
            name: "web-aware".into(),
        },
    );
    let action = reconcile(parse(obj), f.shared.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    let r = f.registration().await.expect("a deregistration");
    assert_eq!(r.target, Target::new("shop", "web"));
    assert!(r.spec.is_none(), "deregistration carries no spec");
    assert_eq!(f.shared.owner_of(&Target::new("shop", "web")), None);
    // Nothing else happens: no call to the Deployment (it keeps its resources).
    f.finish().await;
}

#[tokio::test]
async fn an_invalid_spec_is_reported_and_never_registered() {
    // min > max: the CRD's CEL rule rejects it, but an object admitted by an older CRD can
    // still carry it.
    let mut s = spec();
    s["constraints"] = json!({"minReplicas": 8, "maxReplicas": 2});
    let obj = object(&[FINALIZER], s);
    let mut f = Fixture::new(vec![patch(
        STATUS,
        MERGE,
        status_body(
            json!([{
                "type": "Registered", "status": "False", "reason": "InvalidSpec",
                "message": "invalid bounds: min_replicas 8 above max_replicas 2",
                "observedGeneration": 3, "lastTransitionTime": "<time>",
            }]),
            json!({}),
        ),
        obj.clone(),
    )])
    .await;
    let action = reconcile(parse(obj), f.shared.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert!(f.registration().await.is_none());
    f.finish().await;
}

#[tokio::test]
async fn bounds_that_exclude_the_current_allocation_deregister_a_managed_target() {
    let obj = object(&[FINALIZER], spec());
    let mut f = Fixture::new(vec![
        get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
        patch(
            STATUS,
            MERGE,
            status_body(
                json!([{
                    "type": "Registered", "status": "True", "reason": "Registered",
                    "message": "Deployment shop/web registered with the services (recommend-only)",
                    "observedGeneration": 3, "lastTransitionTime": "<time>",
                }]),
                json!({}),
            ),
            obj.clone(),
        ),
        // Someone gave the app container 4 CPUs, above maxAllowed 2.
        get(DEPLOY, 200, deployment(2, "4", "512Mi")),
        patch(
            STATUS,
            MERGE,
            status_body(
                json!([{
                    "type": "Registered", "status": "False", "reason": "BoundsExcludeCurrent",
                    "message": "the bounds exclude the current allocation: cpu 4000m outside [100m, 2000m]",
                    "observedGeneration": 3, "lastTransitionTime": "<time>",
                }]),
                json!({}),
            ),
            obj.clone(),
        ),
    ])
    .await;
    reconcile(parse(obj.clone()), f.shared.clone())
        .await
        .unwrap();
    assert!(f.registration().await.unwrap().spec.is_some());
    reconcile(parse(obj), f.shared.clone()).await.unwrap();
    let r = f.registration().await.expect("a deregistration");
    assert!(r.spec.is_none());
    assert_eq!(f.shared.metrics.managed.get(), 0);
    f.finish().await;
}

#[tokio::test]
async fn a_missing_deployment_is_reported_and_retried() {
    let obj = object(&[FINALIZER], spec());
    let mut f = Fixture::new(vec![
        get(
            DEPLOY,
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "reason": "NotFound", "code": 404,
                   "message": "deployments.apps \"web\" not found"}),
        ),
        patch(
            STATUS,
            MERGE,
            status_body(
                json!([{
                    "type": "Registered", "status": "False", "reason": "TargetNotFound",
                    "message": "Deployment shop/web does not exist",
                    "observedGeneration": 3, "lastTransitionTime": "<time>",
                }]),
                json!({}),
            ),
            obj.clone(),
        ),
    ])
    .await;
    let action = reconcile(parse(obj), f.shared.clone()).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));
    assert!(f.registration().await.is_none());
    f.finish().await;
}

#[tokio::test]
async fn service_events_become_status_in_one_coalesced_write() {
    let obj = object(&[FINALIZER], spec());
    let registered = json!({
        "type": "Registered", "status": "True", "reason": "Registered",
        "message": "Deployment shop/web registered with the services (recommend-only)",
        "observedGeneration": 3, "lastTransitionTime": "<time>",
    });
    let f = Fixture::new(vec![
        get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
        patch(
            STATUS,
            MERGE,
            status_body(json!([registered.clone()]), json!({})),
            obj.clone(),
        ),
        patch(
            STATUS,
            MERGE,
            status_body(
                json!([registered, {
                    "type": "Applied", "status": "True", "reason": "RecommendOnly",
                    "message": "recorded, not applied (updateMode Off)",
                    "lastTransitionTime": "<time>",
                }]),
                json!({
                    "stage": "online",
                    "recommendation": {"replicas": 4, "cpu": "750m", "memory": "768Mi"},
                    "desiredReplicas": 4,
                    "rewardMean": 1.25,
                    "rewardStd": 0.125,
                }),
            ),
            obj.clone(),
        ),
    ])
    .await;
    reconcile(parse(obj), f.shared.clone()).await.unwrap();
    let t = Target::new("shop", "web");
    let desired = Resources {
        replicas: 4,
        cpu_millicores: 750,
        memory_bytes: 768 * MIB,
    };
    let lifecycle = Event::Lifecycle(Lifecycle {
        schema: Schema::new(),
        target: t.clone(),
        episode: 12,
        step: 99,
        ts_ms: 1,
        stage: Stage::Online,
        previous: Some(Stage::Offline),
        reason: "estimate reached t_online".into(),
        reward_mean: Some(1.25),
        reward_std: Some(0.125),
        window: 5,
        rollback_to: None,
    });
    let action = Event::Action(aware_bus_schemas::Action {
        schema: Schema::new(),
        target: t.clone(),
        episode: 13,
        step: 0,
        ts_ms: 2,
        source: DecisionSource::Rl,
        stage: Stage::Online,
        raw: vec![0.1, 0.2, 0.3],
        current: desired,
        desired,
        model_version: Some(2),
        exploration: true,
        fallback_reason: None,
    });
    let applied = Event::Applied(aware_bus_schemas::Applied {
        schema: Schema::new(),
        target: t.clone(),
        episode: 13,
        step: 0,
        ts_ms: 3,
        outcome: aware_bus_schemas::Outcome::RecommendOnly,
        source: DecisionSource::Rl,
        requested: desired,
        applied: desired,
        clamped: vec![],
        reason: None,
        sink: "kubernetes".into(),
    });
    for ev in [&lifecycle, &action, &applied, &action, &applied] {
        fold_event(&f.shared, ev);
    }
    // An event of a target no object manages changes nothing.
    let mut stranger = lifecycle.clone();
    if let Event::Lifecycle(l) = &mut stranger {
        l.target = Target::new("shop", "other");
    }
    assert_eq!(fold_event(&f.shared, &stranger), None);
    flush_status(&f.shared).await;
    // Nothing changed since: no write.
    fold_event(&f.shared, &action);
    flush_status(&f.shared).await;
    f.finish().await;
}

#[test]
fn the_current_allocation_is_read_from_the_named_container() {
    let d: Deployment = serde_json::from_value(deployment(3, "1500m", "1Gi")).unwrap();
    assert_eq!(
        current_allocation(&d, Some("app")),
        (3, Some(1500), Some(1024 * MIB))
    );
    assert_eq!(current_allocation(&d, None), (3, Some(50), Some(64 * MIB)));
    assert_eq!(current_allocation(&d, Some("nope")), (3, None, None));
}

#[test]
fn configuration_is_validated() {
    assert!(ControllerConfig::default().validate().is_ok());
    let bad = ControllerConfig {
        resync_seconds: 0,
        ..ControllerConfig::default()
    };
    let e = bad.validate().unwrap_err().to_string();
    assert!(e.contains("controller.resync_seconds"), "{e}");
}

/// The controller's service context on an in-process bus, a subscription to its registrations
/// and its shutdown token.
async fn controller_context() -> (ServiceContext, Subscription, CancellationToken) {
    let bus = Bus::in_process(1024);
    let registrations = bus.subscribe("aware.v1.target.>").await.unwrap();
    let shutdown = CancellationToken::new();
    let ctx = ServiceContext::new(
        "controller",
        bus,
        Arc::new(AppConfig::default()),
        shutdown.clone(),
    )
    .unwrap();
    (ctx, registrations, shutdown)
}

async fn next_registration(sub: &mut Subscription) -> Registration {
    let msg = tokio::time::timeout(Duration::from_secs(20), sub.next())
        .await
        .expect("no registration within 20 s")
        .unwrap();
    match aware_bus_schemas::decode_event(EventKind::Target, &msg.payload).unwrap() {
        Event::Registration(r) => r,
        other => panic!("{other:?}"),
    }
}

/// The whole controller (kube runtime: list, watch, finalizer, reconcile, status writer) against
/// a mock API server that answers like one: an object is listed, registered over the bus; then
/// the watch reports it deleted, the target is deregistered and the finalizer removed.
#[tokio::test]
async fn the_running_controller_registers_on_create_and_releases_on_delete() {
    let obj = object(&[FINALIZER], spec());
    let mut deleting = obj.clone();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-11-22T21:00:00Z");
    deleting["metadata"]["resourceVersion"] = json!("101");
    let list = json!({
        "apiVersion": "aware.dev/v1alpha1", "kind": "AwareAutoscalerList",
        "metadata": {"resourceVersion": "100"},
        "items": [obj.clone()],
    });

    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let (release_watch, mut watch_released) = tokio::sync::oneshot::channel::<()>();
    let (finalizer_removed_tx, finalizer_removed) = tokio::sync::oneshot::channel::<Value>();
    let server = tokio::spawn(async move {
        let mut handle = pin!(handle);
        let mut held = Vec::new();
        let mut first_watch = None;
        let mut released = false;
        let mut finalizer_removed_tx = Some(finalizer_removed_tx);
        let respond = |send: tower_test::mock::SendResponse<Response<Body>>, v: &Value| {
            send.send_response(kube_mock::json_response(200, v))
        };
        loop {
            let next = tokio::select! {
                r = handle.next_request() => r,
                _ = &mut watch_released, if first_watch.is_some() && !released => {
                    released = true;
                    // The object is deleted: one MODIFIED event with deletionTimestamp.
                    let send: tower_test::mock::SendResponse<Response<Body>> = first_watch.take().unwrap();
                    let mut line = serde_json::to_vec(&json!({"type": "MODIFIED", "object": deleting})).unwrap();
                    line.push(b'\n');
                    send.send_response(Response::builder().status(200).body(Body::from(line)).unwrap());
                    continue;
                }
            };
            let Some((request, send)) = next else { break };
            let method = request.method().clone();
            let path = request.uri().path().to_string();
            let query = request.uri().query().unwrap_or("").to_string();
            let body = request.into_body().collect_bytes().await.unwrap();
            match (method, path.as_str()) {
                (Method::GET, "/apis/aware.dev/v1alpha1/awareautoscalers")
                    if query.contains("watch=true") =>
                {
                    if first_watch.is_none() && !released {
                        first_watch = Some(send);
                    } else {
                        held.push(send); // later watches stay open and quiet
                    }
                }
                (Method::GET, "/apis/aware.dev/v1alpha1/awareautoscalers") => respond(send, &list),
                (Method::GET, DEPLOY) => respond(send, &deployment(2, "500m", "512Mi")),
                (Method::PATCH, p) if p.ends_with("/status") => respond(send, &obj),
                (Method::PATCH, OBJ) => {
                    let patch: Value = serde_json::from_slice(&body).unwrap();
                    let mut released = deleting.clone();
                    released["metadata"]["finalizers"] = json!([]);
                    respond(send, &released);
                    if let Some(tx) = finalizer_removed_tx.take() {
                        let _ = tx.send(patch);
                    }
                }
                (m, p) => panic!("unexpected request {m} {p}?{query}"),
            }
        }
    });

    let (ctx, mut registrations, shutdown) = controller_context().await;
    let controller = tokio::spawn(run_with_client(ctx, Client::new(service, "default")));
    let r = next_registration(&mut registrations).await;
    assert_eq!(r.target, Target::new("shop", "web"));
    assert!(r.spec.is_some(), "registered on create");
    release_watch.send(()).unwrap();
    let r = next_registration(&mut registrations).await;
    assert!(r.spec.is_none(), "deregistered on delete");
    let patch = tokio::time::timeout(Duration::from_secs(20), finalizer_removed)
        .await
        .expect("the finalizer was never removed")
        .unwrap();
    assert_eq!(
        patch,
        json!([
            {"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ])
    );
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), controller)
        .await
        .expect("the controller did not stop")
        .unwrap()
        .unwrap();
    server.abort();
}

/// The whole controller against an API server that refuses to list AwareAutoscalers (the RBAC
/// of a broken install): every failed list is counted and logged, retried with backoff, and
/// nothing is registered; it still stops on shutdown (within [`SHUTDOWN_GRACE`]).
#[tokio::test]
async fn a_refused_watch_is_counted_and_retried() {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let (lists_tx, mut lists) = tokio::sync::mpsc::unbounded_channel::<String>();
    let server = tokio::spawn(async move {
        let mut handle = pin!(handle);
        while let Some((request, send)) = handle.next_request().await {
            let (method, path) = (request.method().clone(), request.uri().path().to_string());
            assert_eq!(
                (method, path.as_str()),
                (Method::GET, "/apis/aware.dev/v1alpha1/awareautoscalers"),
                "only the list is tried"
            );
            let _ = lists_tx.send(request.uri().to_string());
            send.send_response(kube_mock::json_response(
                403,
                &json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "awareautoscalers.aware.dev is forbidden: User \"system:serviceaccount:aware:aware-controller\" cannot list resource \"awareautoscalers\"",
                    "reason": "Forbidden", "code": 403,
                }),
            ));
        }
    });

    let (ctx, mut registrations, shutdown) = controller_context().await;
    let metrics = ctx.metrics.clone();
    let errors = move || {
        let text = aware_shared::telemetry::render_metrics(std::slice::from_ref(&metrics));
        text.lines()
            .find_map(|l| l.strip_prefix("aware_controller_watch_errors_total"))
            .map(|v| v.trim().rsplit(' ').next().unwrap().parse::<f64>().unwrap())
    };
    let controller = tokio::spawn(run_with_client(ctx, Client::new(service, "default")));
    // Three lists: the first and two retries after backoff.
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(20), lists.recv())
            .await
            .expect("the list was not retried")
            .unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while errors() < Some(2.0) {
        assert!(std::time::Instant::now() < deadline, "{:?}", errors());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(200), registrations.next())
            .await
            .is_err(),
        "nothing registered"
    );
    shutdown.cancel();
    tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(10), controller)
        .await
        .expect("the controller did not stop")
        .unwrap()
        .unwrap();
    server.abort();
}
