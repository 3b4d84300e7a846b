//! The container an AwareAutoscaler's `resourcePolicy.containerPolicies` names is the one the
//! actuator sizes, on the real API server: the name travels from the custom resource through the
//! controller's registration (`spec.container` of `target/1`) to the actuator, whose Kubernetes
//! sink resizes that container of every pod (`pods/resize`) and of the template (a template
//! patch), and leaves the pods' other container as it is — although the actuator's own choice
//! (no `container` setting: the template's first container) is the other one. A name the
//! Deployment does not have is refused: the controller does not register the target
//! (`ContainerNotFound`, naming the field) and the sink refuses it before any write. The sink
//! writes the decided requests and the limits the policy derives (the container's limit:request
//! ratio by default; with `RequestsOnly` and no CPU limit, the CPU limit deleted and the memory
//! limit kept).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use aware_shared::bus::Bus;
use aware_shared::config::BusConfig;
use aware_tests::kube::{KubeCluster, KubeOptions};
use aware_tests::{scrape, NatsServer};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::{
    aas_resource, act_until, actuator_identity, assert_controller_calls_succeeded,
    assert_no_refusal_logged, controller_config, controller_identity, create_namespace, from_json,
    install_chart_identities, kubelet_reports_resources, registered_condition, registration_where,
    replica_sets, running_pods, start_actuator, start_controller, wait_object, APP_NS, MIB,
};

/// Deployment `cart` with two containers: `app` first (500m / 256Mi, requests half) and
/// `sidecar` second (200m / 128Mi, requests half).
fn two_container_deployment() -> Deployment {
    let container = |name: &str, cpu: &str, mem: &str, cpu_req: &str, mem_req: &str| {
        serde_json::json!({
            "name": name,
            "image": format!("registry.example/{name}:1"),
            "resources": {
                "requests": { "cpu": cpu_req, "memory": mem_req },
                "limits": { "cpu": cpu, "memory": mem }
            }
        })
    };
    from_json(serde_json::json!({
        "metadata": { "name": "cart", "labels": { "app": "cart" } },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "app": "cart" } },
            "template": {
                "metadata": { "labels": { "app": "cart" } },
                "spec": { "containers": [
                    container("app", "500m", "256Mi", "250m", "128Mi"),
                    container("sidecar", "200m", "128Mi", "100m", "64Mi"),
                ] }
            }
        }
    }))
}

/// An AwareAutoscaler for `cart` whose one container policy names `container`.
fn autoscaler_naming(container: &str) -> kube::api::DynamicObject {
    from_json(serde_json::json!({
        "apiVersion": "aware.dev/v1alpha1",
        "kind": "AwareAutoscaler",
        "metadata": { "name": "cart-aware" },
        "spec": {
            "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "cart" },
            "updatePolicy": { "updateMode": "Auto" },
            "constraints": { "minReplicas": 1, "maxReplicas": 5 },
            "resourcePolicy": { "containerPolicies": [{
                "containerName": container,
                "minAllowed": { "cpu": "50m", "memory": "32Mi" },
                "maxAllowed": { "cpu": "1", "memory": "1Gi" }
            }] }
        }
    }))
}

/// (CPU limit, memory limit, CPU request, memory request) of container `name` of a pod spec.
fn resources_of(spec: Option<&PodSpec>, name: &str) -> [String; 4] {
    let c = spec
        .and_then(|s| s.containers.iter().find(|c| c.name == name))
        .unwrap_or_else(|| panic!("container {name}"));
    let r = c.resources.clone().unwrap_or_default();
    let q = |m: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
             k: &str| {
        m.as_ref()
            .and_then(|m| m.get(k))
            .map(|q| q.0.clone())
            .unwrap_or_default()
    };
    [
        q(&r.limits, "cpu"),
        q(&r.limits, "memory"),
        q(&r.requests, "cpu"),
        q(&r.requests, "memory"),
    ]
}

fn strings(v: [&str; 4]) -> [String; 4] {
    v.map(String::from)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actuator_sizes_the_container_the_policies_name_and_only_it() {
    use aware_actuator::sink::{
        KubernetesSink, KubernetesSinkConfig, LimitsRule, Sink, SinkError, TargetSinkConfig,
        VerticalMode,
    };
    use aware_bus_schemas::{Outcome, Resources, Target};
    use aware_shared::spec::{ControlledValues, CpuLimit, LimitsPolicy};

    let t0 = Instant::now();
    let cluster = KubeCluster::start(KubeOptions { nodes: 1 }).await.unwrap();
    let nats = NatsServer::start().unwrap();
    let bus_cfg = BusConfig {
        url: nats.url(),
        ..BusConfig::default()
    };
    let bus = Bus::connect(&bus_cfg, "kube-e2e").await.unwrap();
    let mut applied = bus.subscribe("aware.v1.applied.>").await.unwrap();
    let mut registrations = bus.subscribe("aware.v1.target.>").await.unwrap();

    let admin = cluster.admin_client().await.unwrap();
    install_chart_identities(&cluster, &admin).await;
    create_namespace(&admin, APP_NS).await;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), APP_NS);
    deployments
        .create(&PostParams::default(), &two_container_deployment())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), APP_NS);
    let cart_pods = running_pods(&pods, "cart", 2).await;
    for p in &cart_pods {
        kubelet_reports_resources(&admin, p).await;
    }

    let (controller_kubeconfig, _) = controller_identity(&cluster).await;
    let (actuator_kubeconfig, actuator_client) = actuator_identity(&cluster, "cart").await;
    let config = controller_config(cluster.dir(), &nats.url());
    let (controller, controller_addr) = start_controller(&config, &controller_kubeconfig);
    // No `container` setting: left to itself the actuator would size `app`, the first one.
    let (actuator, actuator_addr) =
        start_actuator(cluster.dir(), &nats.url(), &actuator_kubeconfig);

    let aas: Api<kube::api::DynamicObject> =
        Api::namespaced_with(admin.clone(), APP_NS, &aas_resource());
    aas.create(&PostParams::default(), &autoscaler_naming("sidecar"))
        .await
        .unwrap();
    let r = registration_where(&mut registrations, 30, |r| {
        r.target.key() == "shop/cart" && r.spec.is_some()
    })
    .await
    .expect("shop/cart registered");
    let spec = r.spec.unwrap();
    assert_eq!(
        spec.container.as_deref(),
        Some("sidecar"),
        "the registration carries the named container"
    );
    assert_eq!(
        spec.limits,
        Some(LimitsPolicy::default()),
        "and the limits policy (the default: limits keep their ratio to the requests)"
    );
    // Acting only once the actuator holds the registration: a step decided before would size
    // the actuator's own choice (`app`) with the configured bounds.
    let deadline = Instant::now() + Duration::from_secs(30);
    while scrape(
        actuator_addr,
        "aware_registrations_total",
        &[("change", "registered")],
    )
    .unwrap_or(0.0)
        < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "the actuator did not apply the registration within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // In place: the sidecar's requests 100m / 64Mi → 200m / 128Mi (the guardrails' steps of at
    // least 100m and 128Mi, from what the sidecar runs with), its limits at the 2:1 ratio, on
    // both pods; `app` keeps its resources, no pod is replaced.
    let res = |replicas, cpu_millicores, memory_mib: u64| Resources {
        replicas,
        cpu_millicores,
        memory_bytes: memory_mib * MIB,
    };
    let template_before = deployments
        .get("cart")
        .await
        .unwrap()
        .spec
        .unwrap()
        .template;
    let uids: BTreeSet<String> = cart_pods
        .iter()
        .map(|p| p.metadata.uid.clone().unwrap())
        .collect();
    let mut step = 0;
    let a = act_until(
        &bus,
        &mut applied,
        &mut step,
        "cart",
        res(2, 200, 128),
        |a| a.outcome == Outcome::Applied,
    )
    .await;
    assert_eq!(a.applied, res(2, 200, 128), "{a:?}");
    assert_eq!(a.reason, None, "no fallback to a template patch: {a:?}");
    let resized = running_pods(&pods, "cart", 2).await;
    for p in &resized {
        assert!(
            uids.contains(p.metadata.uid.as_ref().unwrap()),
            "pod replaced"
        );
        assert_eq!(
            resources_of(p.spec.as_ref(), "sidecar"),
            strings(["400m", "256Mi", "200m", "128Mi"]),
            "the named container is resized, its limit:request ratio kept"
        );
        assert_eq!(
            resources_of(p.spec.as_ref(), "app"),
            strings(["500m", "256Mi", "250m", "128Mi"]),
            "the other container is untouched"
        );
        kubelet_reports_resources(&admin, p).await;
    }
    let d = deployments.get("cart").await.unwrap();
    assert_eq!(
        serde_json::to_value(&d.spec.as_ref().unwrap().template).unwrap(),
        serde_json::to_value(&template_before).unwrap(),
        "an in-place resize leaves the template alone"
    );
    // The allocation in force is the named container's, as its kubelet reports it.
    let cart = Target::new(APP_NS, "cart");
    let reader =
        KubernetesSink::new(actuator_client.clone(), KubernetesSinkConfig::default()).unwrap();
    assert_eq!(
        reader.current_with(&cart, Some("sidecar")).await.unwrap(),
        res(2, 200, 128)
    );
    assert_eq!(
        reader.current(&cart).await.unwrap(),
        res(2, 250, 128),
        "without a registered name the sink reads its own choice, the first container"
    );

    // Template patch (the sink in-process, the actuator's token): the template's sidecar
    // changes, its `app` does not; the pods roll onto a new ReplicaSet.
    let patcher = KubernetesSink::new(
        actuator_client.clone(),
        KubernetesSinkConfig {
            defaults: TargetSinkConfig {
                vertical_mode: VerticalMode::TemplatePatch,
                ..TargetSinkConfig::default()
            },
            ..KubernetesSinkConfig::default()
        },
    )
    .unwrap();
    let report = patcher
        .apply_with(&cart, res(2, 300, 192), Some("sidecar"))
        .await
        .unwrap();
    assert_eq!(report.in_force, res(2, 300, 192));
    let d = deployments.get("cart").await.unwrap();
    let template = d.spec.as_ref().unwrap().template.spec.as_ref();
    assert_eq!(
        resources_of(template, "sidecar"),
        strings(["600m", "384Mi", "300m", "192Mi"])
    );
    assert_eq!(
        resources_of(template, "app"),
        strings(["500m", "256Mi", "250m", "128Mi"])
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while replica_sets(&admin, "cart")
        .await
        .iter()
        .filter(|(_, n)| *n > 0)
        .count()
        != 1
        || replica_sets(&admin, "cart").await.len() != 2
    {
        assert!(Instant::now() < deadline, "no rollout within 120 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // RequestsOnly without a CPU limit, on the real API server: the requests are written, the
    // sidecar's CPU limit is deleted (a strategic-merge `null`) and its memory limit kept.
    let rule = LimitsRule {
        policy: LimitsPolicy {
            controlled_values: ControlledValues::RequestsOnly,
            cpu_limit: CpuLimit::Unset,
        },
        latency_sensitive: false,
    };
    let report = patcher
        .apply_limited(&cart, res(2, 350, 256), Some("sidecar"), rule)
        .await
        .unwrap();
    assert_eq!(report.in_force, res(2, 350, 256));
    let d = deployments.get("cart").await.unwrap();
    let template = d.spec.as_ref().unwrap().template.spec.as_ref();
    assert_eq!(
        resources_of(template, "sidecar"),
        strings(["", "384Mi", "350m", "256Mi"]),
        "no CPU limit, the memory limit kept, the requests decided"
    );
    assert_eq!(
        resources_of(template, "app"),
        strings(["500m", "256Mi", "250m", "128Mi"])
    );
    // Held: applying it again writes nothing (the Deployment controller's own status writes
    // move the resourceVersion: compared is what clients write).
    patcher
        .apply_limited(&cart, res(2, 350, 256), Some("sidecar"), rule)
        .await
        .unwrap();
    assert_eq!(
        super::what_clients_write(&deployments.get("cart").await.unwrap()),
        super::what_clients_write(&d),
        "nothing written"
    );

    // A name the Deployment does not have: refused by the sink before any write (the replicas
    // asked for are not applied either), with an error naming the field.
    let before = deployments.get("cart").await.unwrap();
    let err = patcher
        .apply_with(&cart, res(3, 500, 256), Some("ghost"))
        .await
        .unwrap_err();
    assert!(matches!(err, SinkError::Unmanageable { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("no container `ghost`")
            && msg.contains("spec.resourcePolicy.containerPolicies[].containerName")
            && msg.contains("its containers: app, sidecar"),
        "{msg}"
    );
    assert_eq!(
        super::what_clients_write(&deployments.get("cart").await.unwrap()),
        super::what_clients_write(&before),
        "nothing written"
    );

    // ... and not registered by the controller: `Registered` False, `ContainerNotFound`, naming
    // the field; the target is deregistered on the bus.
    aas.patch(
        "cart-aware",
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({ "spec": { "resourcePolicy": { "containerPolicies": [{
            "containerName": "ghost",
            "minAllowed": { "cpu": "50m", "memory": "32Mi" },
            "maxAllowed": { "cpu": "1", "memory": "1Gi" }
        }] } } }),
        ),
    )
    .await
    .unwrap();
    let v = wait_object(&aas, "cart-aware", 30, "ContainerNotFound", |v| {
        registered_condition(v).is_some_and(|c| c["reason"] == "ContainerNotFound")
    })
    .await;
    let c = registered_condition(&v).unwrap();
    assert_eq!(c["status"], "False");
    assert_eq!(
        c["message"],
        "spec.resourcePolicy.containerPolicies[0].containerName: the Deployment's pod template \
         has no container `ghost` (its containers: app, sidecar)"
    );
    registration_where(&mut registrations, 30, |r| {
        r.target.key() == "shop/cart" && r.spec.is_none()
    })
    .await
    .expect("shop/cart deregistered");

    assert_controller_calls_succeeded(&controller, controller_addr);
    assert_no_refusal_logged("actuator", &actuator.stderr());
    eprintln!(
        "container policies e2e: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
