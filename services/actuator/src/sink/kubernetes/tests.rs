//! The Kubernetes sink against a scripted mock API server (`tower_test::mock::pair`): every
//! request's method, URI (with query), content type and JSON body is checked, and the server
//! answers with Kubernetes-shaped JSON.

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

use std::pin::pin;
use std::time::Duration;

use aware_shared::kube_mock::{get, json_response, patch, serve, Exchange};
use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::json;
use tower_test::mock;

use super::*;

const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const DEPLOY: &str = "/apis/apps/v1/namespaces/shop/deployments/web";
const PATCH_DEPLOY: &str =
    "/apis/apps/v1/namespaces/shop/deployments/web?&fieldManager=aware-actuator";
const SCALE: &str =
    "/apis/apps/v1/namespaces/shop/deployments/web/scale?&fieldManager=aware-actuator";
const PODS: &str = "/api/v1/namespaces/shop/pods?&labelSelector=app%3Dweb";

fn resize_uri(pod: &str) -> String {
    format!("/api/v1/namespaces/shop/pods/{pod}/resize?&fieldManager=aware-actuator")
}

/// Runs `f` against the scripted server and checks the whole script was served.
async fn run<T, F, Fut>(config: KubernetesSinkConfig, script: Vec<Exchange>, f: F) -> T
where
    F: FnOnce(KubernetesSink) -> Fut,
    Fut: Future<Output = T>,
{
    let (client, server) = serve(script);
    let sink = KubernetesSink::new(client, config).unwrap();
    let out = f(sink).await;
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the mock server did not finish")
        .expect("the mock server's assertions");
    out
}

fn fast_retry(config: KubernetesSinkConfig) -> KubernetesSinkConfig {
    KubernetesSinkConfig {
        retry: RetryConfig {
            max_attempts: 3,
            initial_backoff_ms: 1,
            max_backoff_ms: 4,
        },
        ..config
    }
}

fn in_place() -> KubernetesSinkConfig {
    fast_retry(KubernetesSinkConfig::default())
}

fn template_mode() -> KubernetesSinkConfig {
    fast_retry(KubernetesSinkConfig {
        defaults: TargetSinkConfig {
            vertical_mode: VerticalMode::TemplatePatch,
            ..TargetSinkConfig::default()
        },
        ..KubernetesSinkConfig::default()
    })
}

fn target() -> Target {
    Target::new("shop", "web")
}

fn res(replicas: u32, cpu_millicores: u32, memory_mib: u64) -> Resources {
    Resources {
        replicas,
        cpu_millicores,
        memory_bytes: memory_mib * MIB,
    }
}

fn app_container(cpu: &str, memory: &str, cpu_req: &str, memory_req: &str) -> Value {
    json!({
        "name": "app",
        "image": "ghcr.io/example/web:1.4.2",
        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
        "resources": {
            "limits": {"cpu": cpu, "memory": memory},
            "requests": {"cpu": cpu_req, "memory": memory_req}
        },
        "imagePullPolicy": "IfNotPresent"
    })
}

fn sidecar() -> Value {
    json!({
        "name": "log-shipper",
        "image": "fluent/fluent-bit:3.1",
        "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}, "requests": {"cpu": "50m", "memory": "32Mi"}}
    })
}

fn deployment(replicas: i32, containers: Vec<Value>) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": "5c3e7a2e-8d0e-4c1b-9d59-1c1e6a3f0b7d",
            "resourceVersion": "81234",
            "generation": 7,
            "labels": {"app": "web"}
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": containers, "restartPolicy": "Always"}
            }
        },
        "status": {"observedGeneration": 7, "replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas}
    })
}

fn pod(name: &str, containers: Vec<Value>, phase: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "shop",
            "uid": format!("uid-{name}"),
            "resourceVersion": "90001",
            "labels": {"app": "web", "pod-template-hash": "7d9f8b6c5"},
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f8b6c5",
                "uid": "0f9c1b62-3a43-4c59-9a53-6f1f7d0c2e11", "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {"containers": containers, "nodeName": "node-1"},
        "status": {"phase": phase, "qosClass": "Burstable"}
    })
}

fn pod_list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "90010"}, "items": items})
}

fn scale(replicas: i32, before: i32) -> Value {
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": "web", "namespace": "shop", "uid": "5c3e7a2e-8d0e-4c1b-9d59-1c1e6a3f0b7d", "resourceVersion": "81240"},
        "spec": {"replicas": replicas},
        "status": {"replicas": before, "selector": "app=web"}
    })
}

fn status(code: u16, reason: &str, message: &str, details: Value) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code
    })
}

fn conflict() -> Value {
    status(
        409,
        "Conflict",
        "Operation cannot be fulfilled on deployments.apps \"web\": the object has been modified; please apply your changes to the latest version and try again",
        json!({"name": "web", "group": "apps", "kind": "deployments"}),
    )
}

fn unavailable() -> Value {
    status(
        503,
        "ServiceUnavailable",
        "the server is currently unable to handle the request",
        json!({}),
    )
}

fn resources_body(cpu: &str, memory: &str, cpu_req: &str, memory_req: &str) -> Value {
    json!({"limits": {"cpu": cpu, "memory": memory}, "requests": {"cpu": cpu_req, "memory": memory_req}})
}

fn resize_body(container: &str, resources: Value) -> Value {
    json!({"spec": {"containers": [{"name": container, "resources": resources}]}})
}

fn template_body(container: &str, resources: Value) -> Value {
    json!({"spec": {"template": {"spec": {"containers": [{"name": container, "resources": resources}]}}}})
}

fn default_deployment() -> Value {
    deployment(2, vec![app_container("500m", "512Mi", "250m", "256Mi")])
}

#[tokio::test]
async fn scale_request_patches_the_scale_subresource() {
    let at_desired = || {
        pod(
            "web-a",
            vec![app_container("500m", "512Mi", "250m", "256Mi")],
            "Running",
        )
    };
    let script = vec![
        get(DEPLOY, 200, default_deployment()),
        patch(
            SCALE,
            MERGE,
            json!({"spec": {"replicas": 5}}),
            200,
            scale(5, 2),
        ),
        // In-place mode reconciles the pods; they already run the desired limits: no resize.
        get(PODS, 200, pod_list(vec![at_desired()])),
    ];
    let report = run(in_place(), script, |sink| async move {
        sink.apply(&target(), res(5, 500, 512)).await
    })
    .await
    .unwrap();
    assert_eq!(report.in_force, res(5, 500, 512));
    assert!(report.notes.is_empty());
}

#[tokio::test]
async fn in_place_resize_patches_each_live_pod_of_the_named_container() {
    let config = KubernetesSinkConfig {
        defaults: TargetSinkConfig {
            container: Some("app".to_string()),
            ..TargetSinkConfig::default()
        },
        ..in_place()
    };
    let old = || vec![sidecar(), app_container("500m", "512Mi", "250m", "256Mi")];
    let new = || vec![sidecar(), app_container("750m", "768Mi", "375m", "384Mi")];
    let mut terminating = pod("web-old", old(), "Running");
    terminating["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
    let body = resize_body("app", resources_body("750m", "768Mi", "375m", "384Mi"));
    let script = vec![
        get(DEPLOY, 200, deployment(2, old())),
        get(
            PODS,
            200,
            pod_list(vec![
                pod("web-b", old(), "Running"),
                terminating,
                pod("web-a", old(), "Pending"),
                pod("web-done", old(), "Failed"),
            ]),
        ),
        patch(
            &resize_uri("web-a"),
            STRATEGIC,
            body.clone(),
            200,
            pod("web-a", new(), "Pending"),
        ),
        patch(
            &resize_uri("web-b"),
            STRATEGIC,
            body,
            200,
            pod("web-b", new(), "Running"),
        ),
    ];
    let report = run(config, script, |sink| async move {
        sink.apply(&target(), res(2, 750, 768)).await
    })
    .await
    .unwrap();
    assert_eq!(report.in_force, res(2, 750, 768));
    assert!(report.notes.is_empty());
}

#[tokio::test]
async fn template_patch_mode_patches_the_deployment_template() {
    let body = template_body("app", resources_body("2", "1Gi", "1", "512Mi"));
    let after = deployment(3, vec![app_container("2", "1Gi", "1", "512Mi")]);
    let script = vec![
        get(DEPLOY, 200, default_deployment()),
        patch(
            SCALE,
            MERGE,
            json!({"spec": {"replicas": 3}}),
            200,
            scale(3, 2),
        ),
        patch(PATCH_DEPLOY, STRATEGIC, body, 200, after),
    ];
    let report = run(template_mode(), script, |sink| async move {
        sink.apply(&target(), res(3, 2000, 1024)).await
    })
    .await
    .unwrap();
    assert_eq!(report.in_force, res(3, 2000, 1024));
    assert!(report.notes.is_empty());
}

#[tokio::test]
async fn refused_in_place_resize_falls_back_to_a_template_patch() {
    let refusals = [
        // A cluster without the resize subresource.
        status(
            404,
            "NotFound",
            "the server could not find the requested resource",
            json!({}),
        ),
        // A resize the API server does not accept.
        status(
            422,
            "Invalid",
            "Pod \"web-a\" is invalid: spec: Forbidden: Pod QoS is immutable",
            json!({"name": "web-a", "kind": "Pod", "causes": [{"reason": "FieldValueForbidden", "message": "Forbidden: Pod QoS is immutable", "field": "spec"}]}),
        ),
    ];
    for refusal in refusals {
        let code = refusal["code"].as_u64().unwrap();
        let resources = resources_body("750m", "768Mi", "375m", "384Mi");
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            get(
                PODS,
                200,
                pod_list(vec![pod(
                    "web-a",
                    vec![app_container("500m", "512Mi", "250m", "256Mi")],
                    "Running",
                )]),
            ),
            patch(
                &resize_uri("web-a"),
                STRATEGIC,
                resize_body("app", resources.clone()),
                code as u16,
                refusal,
            ),
            patch(
                PATCH_DEPLOY,
                STRATEGIC,
                template_body("app", resources),
                200,
                deployment(2, vec![app_container("750m", "768Mi", "375m", "384Mi")]),
            ),
        ];
        let report = run(in_place(), script, |sink| async move {
            sink.apply(&target(), res(2, 750, 768)).await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(2, 750, 768));
        assert_eq!(report.notes.len(), 1);
        let note = &report.notes[0];
        assert!(
            note.starts_with("in-place resize refused for pod web-a ("),
            "{note}"
        );
        assert!(note.contains(&format!("HTTP {code}")), "{note}");
        assert!(
            note.ends_with("patched the deployment template instead (pods restart)"),
            "{note}"
        );
    }
}

#[tokio::test]
async fn refused_resize_without_fallback_is_an_error() {
    let config = KubernetesSinkConfig {
        defaults: TargetSinkConfig {
            fallback_to_template: false,
            ..TargetSinkConfig::default()
        },
        ..in_place()
    };
    let resources = resources_body("750m", "768Mi", "375m", "384Mi");
    let script = vec![
        get(DEPLOY, 200, default_deployment()),
        get(
            PODS,
            200,
            pod_list(vec![pod(
                "web-a",
                vec![app_container("500m", "512Mi", "250m", "256Mi")],
                "Running",
            )]),
        ),
        patch(
            &resize_uri("web-a"),
            STRATEGIC,
            resize_body("app", resources),
            404,
            status(
                404,
                "NotFound",
                "the server could not find the requested resource",
                json!({}),
            ),
        ),
    ];
    let err = run(config, script, |sink| async move {
        sink.apply(&target(), res(2, 750, 768)).await
    })
    .await
    .unwrap_err();
    assert!(matches!(err, SinkError::Unmanageable { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("the template fallback is disabled"),
        "{err}"
    );
}

#[tokio::test]
async fn a_pod_deleted_before_its_resize_is_skipped() {
    let resources = resources_body("750m", "768Mi", "375m", "384Mi");
    let old = || vec![app_container("500m", "512Mi", "250m", "256Mi")];
    let script = vec![
        get(DEPLOY, 200, default_deployment()),
        get(
            PODS,
            200,
            pod_list(vec![
                pod("web-a", old(), "Running"),
                pod("web-b", old(), "Running"),
            ]),
        ),
        patch(
            &resize_uri("web-a"),
            STRATEGIC,
            resize_body("app", resources.clone()),
            404,
            status(
                404,
                "NotFound",
                "pods \"web-a\" not found",
                json!({"name": "web-a", "kind": "pods"}),
            ),
        ),
        patch(
            &resize_uri("web-b"),
            STRATEGIC,
            resize_body("app", resources),
            200,
            pod(
                "web-b",
                vec![app_container("750m", "768Mi", "375m", "384Mi")],
                "Running",
            ),
        ),
    ];
    let report = run(in_place(), script, |sink| async move {
        sink.apply(&target(), res(2, 750, 768)).await
    })
    .await
    .unwrap();
    assert_eq!(report.in_force, res(2, 750, 768));
    assert!(report.notes.is_empty());
}

#[tokio::test]
async fn no_live_pod_means_a_template_patch() {
    let resources = resources_body("750m", "768Mi", "375m", "384Mi");
    let script = vec![
        get(DEPLOY, 200, default_deployment()),
        get(PODS, 200, pod_list(vec![])),
        patch(
            PATCH_DEPLOY,
            STRATEGIC,
            template_body("app", resources),
            200,
            deployment(2, vec![app_container("750m", "768Mi", "375m", "384Mi")]),
        ),
    ];
    let report = run(in_place(), script, |sink| async move {
        sink.apply(&target(), res(2, 750, 768)).await
    })
    .await
    .unwrap();
    assert_eq!(report.in_force, res(2, 750, 768));
    assert_eq!(
        report.notes,
        vec!["no live pod to resize in place; patched the deployment template instead (pods restart)"]
    );
}

#[tokio::test]
async fn conflict_is_retried_then_succeeds() {
    let body = json!({"spec": {"replicas": 4}});
    let script = vec![
        get(DEPLOY, 200, default_deployment()),
        patch(SCALE, MERGE, body.clone(), 409, conflict()),
        patch(SCALE, MERGE, body, 200, scale(4, 2)),
    ];
    let report = run(template_mode(), script, |sink| async move {
        sink.apply(&target(), res(4, 500, 512)).await
    })
    .await
    .unwrap();
    assert_eq!(report.in_force, res(4, 500, 512));
}

#[tokio::test]
async fn service_unavailable_is_retried_then_succeeds() {
    let body = resize_body("app", resources_body("750m", "768Mi", "375m", "384Mi"));
    let script = vec![
        get(DEPLOY, 503, unavailable()),
        get(DEPLOY, 200, default_deployment()),
        get(
            PODS,
            200,
            pod_list(vec![pod(
                "web-a",
                vec![app_container("500m", "512Mi", "250m", "256Mi")],
                "Running",
            )]),
        ),
        patch(
            &resize_uri("web-a"),
            STRATEGIC,
            body.clone(),
            503,
            unavailable(),
        ),
        patch(
            &resize_uri("web-a"),
            STRATEGIC,
            body.clone(),
            503,
            unavailable(),
        ),
        patch(
            &resize_uri("web-a"),
            STRATEGIC,
            body,
            200,
            pod(
                "web-a",
                vec![app_container("750m", "768Mi", "375m", "384Mi")],
                "Running",
            ),
        ),
    ];
    let report = run(in_place(), script, |sink| async move {
        sink.apply(&target(), res(2, 750, 768)).await
    })
    .await
    .unwrap();
    assert_eq!(report.in_force, res(2, 750, 768));
}

#[tokio::test]
async fn gives_up_after_max_attempts() {
    let body = json!({"spec": {"replicas": 6}});
    let script = vec![
        get(DEPLOY, 200, default_deployment()),
        patch(SCALE, MERGE, body.clone(), 409, conflict()),
        patch(
            SCALE,
            MERGE,
            body.clone(),
            500,
            status(
                500,
                "InternalError",
                "etcdserver: request timed out",
                json!({}),
            ),
        ),
        patch(SCALE, MERGE, body, 409, conflict()),
    ];
    let err = run(template_mode(), script, |sink| async move {
        sink.apply(&target(), res(6, 500, 512)).await
    })
    .await
    .unwrap_err();
    match &err {
        SinkError::RetriesExhausted {
            operation,
            attempts,
            last,
            ..
        } => {
            assert_eq!(operation, "scale deployment");
            assert_eq!(*attempts, 3);
            assert!(matches!(**last, SinkError::Api { code: 409, .. }));
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
    assert_eq!(err.status_code(), Some(409));
    assert!(
        err.to_string().starts_with(
            "scale deployment for shop/web gave up after 3 attempts; last error: scale deployment for shop/web failed: HTTP 409 Conflict: Operation cannot be fulfilled"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn forbidden_is_not_retried() {
    let script = vec![
        get(DEPLOY, 200, default_deployment()),
        patch(
            SCALE,
            MERGE,
            json!({"spec": {"replicas": 3}}),
            403,
            status(
                403,
                "Forbidden",
                "deployments.apps \"web\" is forbidden: User \"system:serviceaccount:aware:actuator\" cannot patch resource \"deployments/scale\" in API group \"apps\" in the namespace \"shop\"",
                json!({"name": "web", "group": "apps", "kind": "deployments"}),
            ),
        ),
    ];
    let err = run(in_place(), script, |sink| async move {
        sink.apply(&target(), res(3, 500, 512)).await
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, SinkError::Api { code: 403, ref reason, .. } if reason == "Forbidden"),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("scale deployment for shop/web failed: HTTP 403 Forbidden"),
        "{err}"
    );
}

#[tokio::test]
async fn missing_deployment_is_not_found() {
    let script = vec![get(
        DEPLOY,
        404,
        status(
            404,
            "NotFound",
            "deployments.apps \"web\" not found",
            json!({"name": "web", "group": "apps", "kind": "deployments"}),
        ),
    )];
    let err = run(in_place(), script, |sink| async move {
        sink.current(&target()).await
    })
    .await
    .unwrap_err();
    assert!(matches!(err, SinkError::NotFound { .. }), "{err:?}");
    assert_eq!(err.to_string(), "shop/web: deployment shop/web not found");
}

#[tokio::test]
async fn zero_values_are_refused_before_any_request() {
    for desired in [res(0, 500, 512), res(2, 0, 512), res(2, 500, 0)] {
        let err = run(in_place(), vec![], |sink| async move {
            sink.apply(&target(), desired).await
        })
        .await
        .unwrap_err();
        assert!(
            matches!(err, SinkError::InvalidValue { value: 0, .. }),
            "{err:?}"
        );
    }
}

#[tokio::test]
async fn empty_selector_is_refused() {
    let mut d = default_deployment();
    d["spec"]["selector"] = json!({});
    let err = run(in_place(), vec![get(DEPLOY, 200, d)], |sink| async move {
        sink.apply(&target(), res(2, 750, 768)).await
    })
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("the deployment selector is empty"),
        "{err}"
    );
}

#[tokio::test]
async fn missing_container_is_refused() {
    let config = KubernetesSinkConfig {
        defaults: TargetSinkConfig {
            container: Some("api".to_string()),
            ..TargetSinkConfig::default()
        },
        ..in_place()
    };
    let err = run(
        config,
        vec![get(DEPLOY, 200, default_deployment())],
        |sink| async move { sink.apply(&target(), res(2, 750, 768)).await },
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "shop/web cannot be managed: the pod template has no container named `api`"
    );
}

#[tokio::test]
async fn current_reads_the_pods_in_place_and_the_template_otherwise() {
    let c = |cpu: &str, mem: &str| vec![app_container(cpu, mem, "100m", "128Mi")];
    let script = vec![
        get(DEPLOY, 200, deployment(3, c("500m", "512Mi"))),
        get(
            PODS,
            200,
            pod_list(vec![
                pod("web-a", c("1", "1Gi"), "Running"),
                pod("web-b", c("500m", "512Mi"), "Running"),
                pod("web-c", c("1000m", "1024Mi"), "Running"),
            ]),
        ),
    ];
    let current = run(in_place(), script, |sink| async move {
        sink.current(&target()).await
    })
    .await
    .unwrap();
    assert_eq!(current, res(3, 1000, 1024));

    let script = vec![get(DEPLOY, 200, deployment(3, c("1.5", "0.5Gi")))];
    let current = run(template_mode(), script, |sink| async move {
        sink.current(&target()).await
    })
    .await
    .unwrap();
    assert_eq!(current, res(3, 1500, 512));
}

#[tokio::test]
async fn per_target_configuration_overrides_the_defaults() {
    let mut config = in_place();
    config.targets.insert(
        "shop/web".to_string(),
        TargetSinkConfig {
            vertical_mode: VerticalMode::TemplatePatch,
            ..TargetSinkConfig::default()
        },
    );
    // Template mode: no pod listing, the template is patched directly.
    let script = vec![
        get(DEPLOY, 200, default_deployment()),
        patch(
            PATCH_DEPLOY,
            STRATEGIC,
            template_body("app", resources_body("750m", "768Mi", "375m", "384Mi")),
            200,
            deployment(2, vec![app_container("750m", "768Mi", "375m", "384Mi")]),
        ),
    ];
    let report = run(config, script, |sink| async move {
        sink.apply(&target(), res(2, 750, 768)).await
    })
    .await
    .unwrap();
    assert_eq!(report.in_force, res(2, 750, 768));
}

#[test]
fn quantities_format_as_kubernetes_quantities() {
    assert_eq!(format_cpu(500), "500m");
    assert_eq!(format_cpu(2000), "2");
    assert_eq!(format_cpu(1), "1m");
    assert_eq!(format_memory(512 * MIB), "512Mi");
    assert_eq!(format_memory(3 * GIB), "3Gi");
    assert_eq!(format_memory(1536 * KIB), "1536Ki");
    assert_eq!(format_memory(536_870_913), "536870913");
}

#[test]
fn quantities_parse_in_base_units() {
    let t = target();
    for (q, m) in [
        ("500m", 500u32),
        ("2", 2000),
        ("1.5", 1500),
        ("250000u", 250),
    ] {
        assert_eq!(cpu_millicores(&t, &Quantity(q.into())).unwrap(), m, "{q}");
    }
    for (q, b) in [
        ("512Mi", 536_870_912u64),
        ("1Gi", 1_073_741_824),
        ("1G", 1_000_000_000),
        ("128974848", 128_974_848),
        ("129e6", 129_000_000),
        ("123Ki", 125_952),
    ] {
        assert_eq!(memory_bytes(&t, &Quantity(q.into())).unwrap(), b, "{q}");
    }
    for bad in ["", "abc", "1Xi", "-1", "1e", "NaN", "inf"] {
        assert!(cpu_millicores(&t, &Quantity(bad.into())).is_err(), "{bad}");
        assert!(memory_bytes(&t, &Quantity(bad.into())).is_err(), "{bad}");
    }
    // Formatting then parsing is the identity.
    for m in [1u32, 128, 999, 1000, 1500, 2048] {
        let t = target();
        assert_eq!(cpu_millicores(&t, &Quantity(format_cpu(m))).unwrap(), m);
    }
    for b in [1u64, 256 * MIB, 3 * GIB, 1536 * KIB, 536_870_913] {
        let t = target();
        assert_eq!(memory_bytes(&t, &Quantity(format_memory(b))).unwrap(), b);
    }
}

#[test]
fn requests_keep_the_request_to_limit_ratio() {
    assert_eq!(scaled_request(Some(500), Some(250), 750), Some(375));
    assert_eq!(scaled_request(Some(1000), Some(1000), 300), Some(300));
    assert_eq!(scaled_request(Some(3), Some(1), 1000), Some(333));
    // Request without a limit: kept, capped at the new limit.
    assert_eq!(scaled_request(None, Some(800), 500), Some(500));
    assert_eq!(scaled_request(None, Some(200), 500), Some(200));
    // No request: none written (Kubernetes defaults it to the limit).
    assert_eq!(scaled_request(Some(500), None, 750), None);
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let r = RetryConfig {
        max_attempts: 10,
        initial_backoff_ms: 100,
        max_backoff_ms: 1000,
    };
    let waits: Vec<u64> = (1..=6).map(|a| r.backoff(a).as_millis() as u64).collect();
    assert_eq!(waits, vec![100, 200, 400, 800, 1000, 1000]);
    assert_eq!(r.backoff(200), Duration::from_millis(1000));
}

#[test]
fn config_deserializes_and_validates() {
    let cfg: KubernetesSinkConfig = serde_json::from_value(json!({
        "defaults": {"vertical_mode": "template_patch", "container": "app"},
        "targets": {"shop/web": {"vertical_mode": "InPlace"}},
        "retry": {"max_attempts": 2}
    }))
    .unwrap();
    assert!(cfg.validate().is_ok());
    assert_eq!(cfg.defaults.vertical_mode, VerticalMode::TemplatePatch);
    assert_eq!(
        cfg.for_target(&target()).vertical_mode,
        VerticalMode::InPlace
    );
    assert!(cfg.for_target(&target()).fallback_to_template);
    assert_eq!(
        cfg.for_target(&Target::new("shop", "api"))
            .container
            .as_deref(),
        Some("app")
    );
    assert_eq!(cfg.retry.initial_backoff_ms, 200);

    let mut bad = cfg.clone();
    bad.retry.max_attempts = 0;
    assert_eq!(bad.validate(), Err(KubernetesSinkConfigError::NoAttempts));
    let mut bad = cfg;
    bad.targets
        .insert("web".to_string(), TargetSinkConfig::default());
    assert_eq!(
        bad.validate(),
        Err(KubernetesSinkConfigError::BadTargetKey("web".to_string()))
    );
}

/// Requests seen by [`serve_accepting`]: method, URI and JSON body.
type Seen = Vec<(Method, String, Value)>;

/// Answers like an API server that accepts every write: the Deployment (at `current`) for a GET,
/// the patched object for a PATCH; records every request's method, URI and JSON body.
fn serve_accepting(current: Resources) -> (Client, tokio::task::JoinHandle<Seen>) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(async move {
        let mut handle = pin!(handle);
        let mut seen = Vec::new();
        let deploy = deployment(
            i32::try_from(current.replicas).unwrap(),
            vec![app_container(
                &format_cpu(current.cpu_millicores),
                &format_memory(current.memory_bytes),
                &format_cpu(current.cpu_millicores / 2),
                &format_memory(current.memory_bytes / 2),
            )],
        );
        while let Some((request, send)) = handle.next_request().await {
            let method = request.method().clone();
            let uri = request.uri().to_string();
            let bytes = request.into_body().collect_bytes().await.unwrap();
            let body: Value = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).unwrap()
            };
            let response = if uri.starts_with(SCALE) {
                scale(body["spec"]["replicas"].as_i64().unwrap() as i32, 1)
            } else {
                deploy.clone()
            };
            seen.push((method, uri, body));
            send.send_response(json_response(200, &response));
        }
        seen
    });
    (Client::new(service, "default"), server)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Whatever an `action` asks for (any integers, 0 and the maxima included) and whatever the
    /// target's bounds, what reaches the API server after the guardrails is a well-formed
    /// Kubernetes quantity inside the bounds: replicas in [min, max], CPU and memory limits in
    /// [min, max], requests never above limits.
    #[test]
    fn no_request_ever_leaves_the_bounds(
        min_r in 1u32..50, span_r in 0u32..200,
        min_c in 1u32..4000, span_c in 0u32..64_000,
        min_m in 1u64..(8 * 1024 * MIB), span_m in 0u64..(256 * 1024 * MIB),
        cur in (proptest::prelude::any::<u32>(), proptest::prelude::any::<u32>(), proptest::prelude::any::<u64>()),
        req in (proptest::prelude::any::<u32>(), proptest::prelude::any::<u32>(), proptest::prelude::any::<u64>()),
    ) {
        use crate::guardrails::{GuardState, GuardrailConfig, Guardrails, StepId};
        let bounds = aware_shared::spec::Bounds {
            min_replicas: min_r,
            max_replicas: min_r + span_r,
            min_cpu_millicores: min_c,
            max_cpu_millicores: min_c + span_c,
            min_memory_bytes: min_m,
            max_memory_bytes: min_m + span_m,
        };
        let mut spec = aware_shared::spec::TargetSpec::new(&target());
        spec.bounds = bounds;
        // The workload runs somewhere in its bounds (the controller refuses bounds that exclude
        // the current allocation).
        let current = Resources {
            replicas: min_r + cur.0 % (span_r + 1),
            cpu_millicores: min_c + cur.1 % (span_c + 1),
            memory_bytes: min_m + cur.2 % (span_m + 1),
        };
        let requested = Resources { replicas: req.0, cpu_millicores: req.1, memory_bytes: req.2 };
        let guards = Guardrails::new(GuardrailConfig::default()).unwrap();
        let d = guards.decide(&spec, &GuardState::default(), current, StepId { episode: 0, step: 1 }, requested, 1);
        proptest::prop_assert!(bounds.clamp_dimensions(d.applied).1.is_empty(), "guarded {:?} outside {:?}", d.applied, bounds);
        if !d.changes(&current) {
            return Ok(());
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let seen = rt.block_on(async {
            let (client, server) = serve_accepting(current);
            let sink = KubernetesSink::new(client, template_mode()).unwrap();
            sink.apply(&target(), d.applied).await.unwrap();
            drop(sink);
            server.await.unwrap()
        });
        let in_bounds_cpu = |q: &Value| {
            let m = aware_shared::quantity::parse_cpu_millicores(q.as_str().unwrap()).unwrap();
            (bounds.min_cpu_millicores..=bounds.max_cpu_millicores).contains(&m)
        };
        let in_bounds_mem = |q: &Value| {
            let b = aware_shared::quantity::parse_memory_bytes(q.as_str().unwrap()).unwrap();
            (bounds.min_memory_bytes..=bounds.max_memory_bytes).contains(&b)
        };
        let mut writes = 0;
        for (method, uri, body) in &seen {
            let text = body.to_string();
            proptest::prop_assert!(!text.contains("NaN") && !text.contains("inf"), "{text}");
            if *method != Method::PATCH {
                continue;
            }
            writes += 1;
            if uri.starts_with(SCALE) {
                let r = body["spec"]["replicas"].as_u64().unwrap();
                proptest::prop_assert!((u64::from(bounds.min_replicas)..=u64::from(bounds.max_replicas)).contains(&r), "replicas {r}");
            } else {
                let res = &body["spec"]["template"]["spec"]["containers"][0]["resources"];
                proptest::prop_assert!(in_bounds_cpu(&res["limits"]["cpu"]), "{res}");
                proptest::prop_assert!(in_bounds_mem(&res["limits"]["memory"]), "{res}");
                let req_cpu = aware_shared::quantity::parse_cpu_millicores(res["requests"]["cpu"].as_str().unwrap()).unwrap();
                let lim_cpu = aware_shared::quantity::parse_cpu_millicores(res["limits"]["cpu"].as_str().unwrap()).unwrap();
                proptest::prop_assert!(req_cpu <= lim_cpu, "{res}");
                let req_m = aware_shared::quantity::parse_memory_bytes(res["requests"]["memory"].as_str().unwrap()).unwrap();
                let lim_m = aware_shared::quantity::parse_memory_bytes(res["limits"]["memory"].as_str().unwrap()).unwrap();
                proptest::prop_assert!(req_m <= lim_m, "{res}");
            }
        }
        proptest::prop_assert!(writes >= 1, "a change was decided but nothing was written");
    }
}
