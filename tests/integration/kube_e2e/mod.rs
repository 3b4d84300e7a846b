//! End-to-end tests on a real Kubernetes control plane (etcd, kube-apiserver with RBAC,
//! kube-controller-manager, kube-scheduler, kwok's fake nodes: `aware_tests::kube`), built from
//! the pinned Go module by `tests/k8s/build.sh`.

mod bench;

use std::time::{Duration, Instant};

use aware_tests::kube::{KubeCluster, KubeOptions};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use std::net::SocketAddr;

use aware_shared::bus::Bus;
use aware_shared::config::BusConfig;
use aware_tests::{scrape, wait_ready, NatsServer, Proc};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

mod chart_monitoring;
mod container_policies;
mod whole_loop;

fn from_json<T: k8s_openapi::serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// The HTTP status of a refused call; panics when the call succeeded or failed otherwise.
fn refused_with<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> u16 {
    match r {
        Err(kube::Error::Api(s)) => s.code,
        other => panic!("expected the API server to refuse the call, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_runs_on_kwok_nodes_and_rbac_confines_a_service_account() {
    let cluster = KubeCluster::start(KubeOptions::default()).await.unwrap();
    eprintln!("control plane ready in {:.1?}", cluster.started_in());
    let admin = cluster.admin_client().await.unwrap();
    let ns = "e2e";
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({ "metadata": { "name": ns } })),
        )
        .await
        .unwrap();

    // Deployment → ReplicaSet (controller manager) → Pods → scheduled on kwok nodes (scheduler)
    // → Running (kwok's pod stages).
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    deployments
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({
                "metadata": { "name": "web" },
                "spec": {
                    "replicas": 2,
                    "selector": { "matchLabels": { "app": "web" } },
                    "template": {
                        "metadata": { "labels": { "app": "web" } },
                        "spec": { "containers": [{
                            "name": "web",
                            "image": "registry.example/web:1",
                            "resources": { "requests": { "cpu": "250m", "memory": "128Mi" } }
                        }] }
                    }
                }
            })),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(120);
    let running = loop {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap();
        let running: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && p.metadata.deletion_timestamp.is_none()
            })
            .collect();
        if running.len() == 2 {
            break running;
        }
        assert!(
            Instant::now() < deadline,
            "{} of 2 pods Running after 120 s",
            running.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for p in &running {
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        assert!(
            node.as_ref().is_some_and(|n| cluster.nodes().contains(n)),
            "pod {:?} on {node:?}, not on a kwok node",
            p.metadata.name
        );
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "ReplicaSet");
    }
    let rs = Api::<ReplicaSet>::namespaced(admin.clone(), ns)
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    assert_eq!(rs.items.len(), 1, "one ReplicaSet of the Deployment");
    assert_eq!(
        rs.items[0].metadata.owner_references.as_ref().unwrap()[0].name,
        "web"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d = deployments.get("web").await.unwrap();
        let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
        if ready == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Deployment reports {ready} ready replicas"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A ServiceAccount that may only read pods of its namespace, with a TokenRequest token.
    Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({ "metadata": { "name": "reader" } })),
        )
        .await
        .unwrap();
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({
                "metadata": { "name": "pod-reader" },
                "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"] }]
            })),
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({
                "metadata": { "name": "reader-reads-pods" },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader" },
                "subjects": [{ "kind": "ServiceAccount", "name": "reader", "namespace": ns }]
            })),
        )
        .await
        .unwrap();
    let token = cluster.service_account_token(ns, "reader").await.unwrap();
    let reader = cluster.token_client(&token).await.unwrap();

    let review = Api::<SelfSubjectReview>::all(reader.clone())
        .create(&PostParams::default(), &from_json(serde_json::json!({})))
        .await
        .unwrap();
    let user = review.status.and_then(|s| s.user_info).unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:e2e:reader")
    );

    // Within its role (the authorizer's cache may lag the new binding by a moment).
    let reader_pods: Api<Pod> = Api::namespaced(reader.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    let listed = loop {
        match reader_pods.list(&ListParams::default()).await {
            Ok(l) => break l,
            Err(e) if Instant::now() < deadline => {
                eprintln!("reader cannot list pods yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the reader cannot list the pods its role allows: {e}"),
        }
    };
    assert_eq!(listed.items.len(), 2);

    // Outside it: refused by the real authorizer.
    let code = refused_with(
        Api::<Secret>::namespaced(reader.clone(), ns)
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(code, 403, "reading Secrets");
    let code = refused_with(
        Api::<Deployment>::namespaced(reader.clone(), ns)
            .delete("web", &DeleteParams::default())
            .await,
    );
    assert_eq!(code, 403, "deleting the Deployment");
    let code = refused_with(
        Api::<Pod>::namespaced(reader.clone(), "default")
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(code, 403, "listing pods of another namespace");
    let code = refused_with(
        reader_pods
            .delete(
                running[0].metadata.name.as_deref().unwrap(),
                &DeleteParams::default(),
            )
            .await,
    );
    assert_eq!(code, 403, "deleting a pod it may only read");
    // An invalid token is not authenticated at all.
    let forged = cluster.token_client(&format!("{token}x")).await.unwrap();
    let code = refused_with(
        Api::<Pod>::namespaced(forged, ns)
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(code, 401, "a token with a broken signature");
    assert!(deployments.get_opt("web").await.unwrap().is_some());
}

/// A test that panics with a cluster running leaves no process and no directory behind.
#[test]
fn a_panicking_test_leaves_nothing_running() {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let cluster = KubeCluster::start(KubeOptions { nodes: 1 }).await.unwrap();
            tx.send((cluster.pids(), cluster.dir().to_path_buf()))
                .unwrap();
            panic!("a test failing with the control plane up");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread panicked");
    let (pids, dir) = rx.recv().unwrap();
    assert_eq!(
        pids.len(),
        5,
        "etcd, apiserver, controller manager, scheduler, kwok: {pids:?}"
    );
    for (name, pid) in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{name} (pid {pid}) still runs"
        );
    }
    assert!(!dir.exists(), "{} not removed", dir.display());
}

/// Runs `cmd`, panicking with its output when it fails; returns its stdout.
fn run(mut cmd: std::process::Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl get` of every listable resource type (namespaced ones in `namespace`, or cluster-wide
/// with `None` and in every namespace) with extra `args`: the objects' `kind/name`s, events left
/// out (the server writes them about deleted objects for a while).
fn every_object(cluster: &KubeCluster, namespace: Option<&str>, args: &[&str]) -> Vec<String> {
    let mut types = cluster.command("kubectl");
    types.args(["api-resources", "--verbs=list", "-o", "name"]);
    if namespace.is_some() {
        types.arg("--namespaced=true");
    }
    let types: Vec<String> = run(types)
        .lines()
        .filter(|t| !t.starts_with("events"))
        .map(str::to_string)
        .collect();
    let mut get = cluster.command("kubectl");
    get.args(["get", &types.join(","), "-o", "name", "--ignore-not-found"]);
    match namespace {
        Some(ns) => get.args(["-n", ns]),
        None => get.arg("-A"),
    };
    get.args(args);
    run(get).lines().map(str::to_string).collect()
}

/// The chart installs on the real API server (its CRD with the CEL rules accepted, RBAC,
/// Services, StatefulSets, NetworkPolicies, PDBs) and `helm uninstall` removes all of it — with
/// `persistence.deleteOnUninstall` also the StatefulSets' volume claims — but the CRD, which Helm
/// never deletes (a chart's CRDs outlive it, so that uninstalling cannot delete every
/// AwareAutoscaler of the cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_and_uninstall_of_the_chart() {
    let cluster = KubeCluster::start(KubeOptions { nodes: 2 }).await.unwrap();
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../helm/aware");
    let ns = "aware-system";
    let mut install = cluster.command("helm");
    install.args(["install", "aware"]).arg(&chart).args([
        "--namespace",
        ns,
        "--create-namespace",
        "--timeout",
        "120s",
        // The StatefulSets' volume claims (JetStream's and QuestDB's data) go too.
        "--set",
        "nats.persistence.deleteOnUninstall=true",
        "--set",
        "questdb.persistence.deleteOnUninstall=true",
    ]);
    run(install);
    let mut status = cluster.command("helm");
    status.args(["status", "aware", "-n", ns, "-o", "json"]);
    let status: serde_json::Value = serde_json::from_str(&run(status)).unwrap();
    assert_eq!(status["info"]["status"], "deployed", "{status}");

    // The CRD is served: the API server compiled its schema and CEL rules.
    let mut established = cluster.command("kubectl");
    established.args([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/awareautoscalers.aware.dev",
    ]);
    run(established);
    let installed = every_object(&cluster, None, &["-l", "app.kubernetes.io/instance=aware"]);
    for want in [
        "clusterrole.rbac.authorization.k8s.io/aware-controller",
        "clusterrole.rbac.authorization.k8s.io/aware-actuator",
        "role.rbac.authorization.k8s.io/aware-controller-leader-election",
        "rolebinding.rbac.authorization.k8s.io/aware-controller-leader-election",
        "deployment.apps/aware-controller",
        "statefulset.apps/aware-nats",
        "statefulset.apps/aware-recommender",
        "statefulset.apps/aware-metrics-collector",
        "statefulset.apps/aware-actuator",
        "statefulset.apps/aware-trajectory-recorder",
        "statefulset.apps/aware-lifecycle-monitor",
        "statefulset.apps/aware-meta-learner-trainer",
        "networkpolicy.networking.k8s.io/aware-default-deny",
        "poddisruptionbudget.policy/aware-nats",
    ] {
        assert!(
            installed.iter().any(|o| o == want),
            "{want} not installed; the release has:\n{}",
            installed.join("\n")
        );
    }
    // The CEL rules' table (the one the controller's CEL emulation is tested with): its good
    // object is accepted, and each bad one is refused by the real server with its rule's message.
    let client = cluster.admin_client().await.unwrap();
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client, ns, &aas_resource());
    let table: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../services/controller/testdata/cel-cases.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let named = |mut v: serde_json::Value, name: &str| {
        v["metadata"] = serde_json::json!({ "name": name, "namespace": ns });
        v
    };
    let good = named(table["good"].clone(), "ok");
    api.create(&PostParams::default(), &from_json(good.clone()))
        .await
        .unwrap();
    let bad = table["bad"].as_array().unwrap();
    assert!(bad.len() >= 10, "the table covers every rule");
    for (i, case) in bad.iter().enumerate() {
        let (pointer, message) = (
            case["pointer"].as_str().unwrap(),
            case["message"].as_str().unwrap(),
        );
        let mut obj = named(good.clone(), &format!("bad-{i}"));
        *obj.pointer_mut(pointer).unwrap() = case["value"].clone();
        match api.create(&PostParams::default(), &from_json(obj)).await {
            Err(kube::Error::Api(s)) => assert!(
                s.code == 422 && s.message.contains(message),
                "{pointer} = {}: refused, but not with `{message}`: {s:?}",
                case["value"]
            ),
            other => panic!("{pointer} = {} accepted: {other:?}", case["value"]),
        }
    }
    api.delete("ok", &DeleteParams::default()).await.unwrap();

    // `helm upgrade` with a changed value rolls it out.
    let mut upgrade = cluster.command("helm");
    upgrade.args(["upgrade", "aware"]).arg(&chart).args([
        "--namespace",
        ns,
        "--reuse-values",
        "--timeout",
        "120s",
        "--set",
        "controller.resyncSeconds=45",
    ]);
    run(upgrade);
    let mut status = cluster.command("helm");
    status.args(["status", "aware", "-n", ns, "-o", "json"]);
    let status: serde_json::Value = serde_json::from_str(&run(status)).unwrap();
    assert_eq!(
        (&status["info"]["status"], &status["version"]),
        (&serde_json::json!("deployed"), &serde_json::json!(2)),
        "{status}"
    );
    let mut env = cluster.command("kubectl");
    env.args([
        "get",
        "deployment/aware-controller",
        "-n",
        ns,
        "-o",
        "jsonpath={.spec.template.spec.containers[0].env[?(@.name==\"AWARE_CONTROLLER__RESYNC_SECONDS\")].value}",
    ]);
    assert_eq!(
        run(env).trim(),
        "45",
        "the upgraded value reaches the controller"
    );

    let mut uninstall = cluster.command("helm");
    uninstall.args([
        "uninstall",
        "aware",
        "-n",
        ns,
        "--wait",
        "--timeout",
        "120s",
    ]);
    run(uninstall);
    // What the release made goes with it, also what its controllers made (pods, the
    // StatefulSets' volume claims): labelled objects anywhere, and anything in its namespace but
    // what every namespace has.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let labelled = every_object(&cluster, None, &["-l", "app.kubernetes.io/instance=aware"]);
        let in_namespace: Vec<String> = every_object(&cluster, Some(ns), &[])
            .into_iter()
            .filter(|o| o != "configmap/kube-root-ca.crt" && o != "serviceaccount/default")
            .collect();
        if labelled.is_empty() && in_namespace.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind after uninstall: {labelled:?} {in_namespace:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut crd = cluster.command("kubectl");
    crd.args(["get", "crd/awareautoscalers.aware.dev", "-o", "name"]);
    assert_eq!(
        run(crd).trim(),
        "customresourcedefinition.apiextensions.k8s.io/awareautoscalers.aware.dev"
    );
}

// ---------------------------------------------------------------------------------------------
// The controller and the actuator with the chart's RBAC.

/// The namespace the chart's identities are rendered into (as `helm install -n` would).
const RELEASE_NS: &str = "aware-system";
/// The namespace of the workloads.
const APP_NS: &str = "shop";

fn chart_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../helm/aware")
}

/// Creates namespace `name` as administrator.
async fn create_namespace(admin: &kube::Client, name: &str) {
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({ "metadata": { "name": name } })),
        )
        .await
        .unwrap();
}

/// Installs the chart's CRD (from `crds/`, as `helm install` does) and, rendered by `helm
/// template` into [`RELEASE_NS`], exactly the chart's ServiceAccounts, ClusterRoles,
/// ClusterRoleBindings, Roles and RoleBindings (the controller's Lease) of the controller and the
/// actuator — nothing else of the chart.
async fn install_chart_identities(cluster: &KubeCluster, admin: &kube::Client) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use k8s_openapi::serde::Deserialize;

    let mut crd = cluster.command("kubectl");
    crd.arg("create")
        .arg("-f")
        .arg(chart_dir().join("crds/awareautoscalers.aware.dev.yaml"));
    run(crd);
    let mut established = cluster.command("kubectl");
    established.args([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/awareautoscalers.aware.dev",
    ]);
    run(established);

    create_namespace(admin, RELEASE_NS).await;
    let mut template = cluster.command("helm");
    template
        .args(["template", "aware"])
        .arg(chart_dir())
        .args(["--namespace", RELEASE_NS]);
    let rendered = run(template);
    let mut created = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&rendered) {
        let v = serde_json::Value::deserialize(doc).unwrap();
        let component = v["metadata"]["labels"]["app.kubernetes.io/component"].as_str();
        if !matches!(component, Some("controller" | "actuator")) {
            continue;
        }
        let pp = PostParams::default();
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "ServiceAccount" => {
                Api::<ServiceAccount>::namespaced(admin.clone(), RELEASE_NS)
                    .create(&pp, &from_json(v.clone()))
                    .await
                    .unwrap();
            }
            "ClusterRole" => {
                Api::<ClusterRole>::all(admin.clone())
                    .create(&pp, &from_json(v.clone()))
                    .await
                    .unwrap();
            }
            "ClusterRoleBinding" => {
                Api::<ClusterRoleBinding>::all(admin.clone())
                    .create(&pp, &from_json(v.clone()))
                    .await
                    .unwrap();
            }
            "Role" => {
                Api::<Role>::namespaced(admin.clone(), RELEASE_NS)
                    .create(&pp, &from_json(v.clone()))
                    .await
                    .unwrap();
            }
            "RoleBinding" => {
                Api::<RoleBinding>::namespaced(admin.clone(), RELEASE_NS)
                    .create(&pp, &from_json(v.clone()))
                    .await
                    .unwrap();
            }
            _ => continue,
        }
        created.push(format!(
            "{kind}/{}",
            v["metadata"]["name"].as_str().unwrap()
        ));
    }
    created.sort();
    assert_eq!(
        created,
        [
            "ClusterRole/aware-actuator",
            "ClusterRole/aware-controller",
            "ClusterRoleBinding/aware-actuator",
            "ClusterRoleBinding/aware-controller",
            "Role/aware-controller-leader-election",
            "RoleBinding/aware-controller-leader-election",
            "ServiceAccount/aware-actuator",
            "ServiceAccount/aware-controller",
        ],
        "the chart's identities of the controller and the actuator"
    );
}

/// A TokenRequest token of the chart's ServiceAccount `aware-<component>`, once the authorizer
/// has seen its binding (`probe` succeeds with it); the token's kubeconfig and a client.
async fn chart_identity(
    cluster: &KubeCluster,
    component: &str,
    probe: impl Fn(kube::Client) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>,
) -> (std::path::PathBuf, kube::Client) {
    let token = cluster
        .service_account_token(RELEASE_NS, &format!("aware-{component}"))
        .await
        .unwrap();
    let kubeconfig = cluster
        .token_kubeconfig(&format!("{component}.kubeconfig"), &token)
        .unwrap();
    let client = cluster.token_client(&token).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !probe(client.clone()).await {
        assert!(
            Instant::now() < deadline,
            "the {component}'s binding is not in effect after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (kubeconfig, client)
}

/// The chart's controller identity, once it may list AwareAutoscalers.
async fn controller_identity(cluster: &KubeCluster) -> (std::path::PathBuf, kube::Client) {
    chart_identity(cluster, "controller", |c| {
        Box::pin(async move {
            Api::<kube::api::DynamicObject>::all_with(c, &aas_resource())
                .list(&ListParams::default())
                .await
                .is_ok()
        })
    })
    .await
}

/// The chart's actuator identity, once it may read the Deployment `deployment` in [`APP_NS`].
async fn actuator_identity(
    cluster: &KubeCluster,
    deployment: &'static str,
) -> (std::path::PathBuf, kube::Client) {
    chart_identity(cluster, "actuator", move |c| {
        Box::pin(async move {
            Api::<Deployment>::namespaced(c, APP_NS)
                .get(deployment)
                .await
                .is_ok()
        })
    })
    .await
}

/// A Deployment `name` in [`APP_NS`] with container `app` (limits 500m / 256Mi, requests half).
/// What a client other than the Deployment controller can change on a Deployment: its spec (with
/// the generation, which every spec write bumps), labels and annotations. Not the
/// resourceVersion, nor the `deployment.kubernetes.io/` annotations: the Deployment controller's
/// own writes (status as a rollout progresses, the revision annotation) move them at any moment,
/// with nothing written by the services.
fn what_clients_write(d: &Deployment) -> serde_json::Value {
    let annotations: std::collections::BTreeMap<&String, &String> = d
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with("deployment.kubernetes.io/"))
        .collect();
    serde_json::json!({
        "generation": d.metadata.generation,
        "labels": d.metadata.labels,
        "annotations": annotations,
        "spec": d.spec,
    })
}

fn deployment(name: &str, replicas: i32) -> Deployment {
    from_json(serde_json::json!({
        "metadata": { "name": name, "labels": { "app": name } },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {
                        "requests": { "cpu": "250m", "memory": "128Mi" },
                        "limits": { "cpu": "500m", "memory": "256Mi" }
                    }
                }] }
            }
        }
    }))
}

/// Waits until `n` live pods with label `app=<app>` are Running (on kwok nodes); returns them.
async fn running_pods(pods: &Api<Pod>, app: &str, n: usize) -> Vec<Pod> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let list = pods
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .unwrap();
        let running: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .collect();
        let total_live = running.len();
        if total_live == n {
            return running;
        }
        assert!(
            Instant::now() < deadline,
            "{total_live} of {n} pods of {app} Running after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn aas_resource() -> kube::discovery::ApiResource {
    kube::discovery::ApiResource {
        group: "aware.dev".into(),
        version: "v1alpha1".into(),
        api_version: "aware.dev/v1alpha1".into(),
        kind: "AwareAutoscaler".into(),
        plural: "awareautoscalers".into(),
    }
}

/// An AwareAutoscaler `<target>-aware` for Deployment `target` as a user writes it.
fn autoscaler(target: &str, update_mode: &str, max_replicas: u32) -> kube::api::DynamicObject {
    from_json(serde_json::json!({
        "apiVersion": "aware.dev/v1alpha1",
        "kind": "AwareAutoscaler",
        "metadata": { "name": format!("{target}-aware") },
        "spec": {
            "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": target },
            "updatePolicy": { "updateMode": update_mode },
            "constraints": { "minReplicas": 1, "maxReplicas": max_replicas },
            "resourcePolicy": { "containerPolicies": [{
                "containerName": "app",
                "minAllowed": { "cpu": "100m", "memory": "64Mi" },
                "maxAllowed": { "cpu": "2", "memory": "2Gi" }
            }] }
        }
    }))
}

/// Polls `api.get(name)` until `ok` holds for its JSON (100 ms steps, up to `secs`).
async fn wait_object(
    api: &Api<kube::api::DynamicObject>,
    name: &str,
    secs: u64,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let v = match api.get_opt(name).await.unwrap() {
            Some(o) => serde_json::to_value(&o).unwrap(),
            None => serde_json::Value::Null,
        };
        if ok(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: {what} not reached within {secs} s; the object is:\n{v:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `Registered` condition of an AwareAutoscaler's JSON.
fn registered_condition(v: &serde_json::Value) -> Option<&serde_json::Value> {
    v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Registered")
}

/// The first registration on the bus for which `want` holds, within `secs`; `None` if none.
async fn registration_where(
    sub: &mut aware_shared::bus::Subscription,
    secs: u64,
    want: impl Fn(&aware_bus_schemas::Registration) -> bool,
) -> Option<aware_bus_schemas::Registration> {
    use aware_bus_schemas::{Event, EventKind};
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let m = tokio::time::timeout_at(deadline, sub.next()).await.ok()??;
        if let Event::Registration(r) =
            aware_bus_schemas::decode_event(EventKind::Target, &m.payload).unwrap()
        {
            if want(&r) {
                return Some(r);
            }
        }
    }
}

/// The controller's config: the bus, a free HTTP port, fast resyncs and status flushes.
fn controller_config(dir: &std::path::Path, bus_url: &str) -> std::path::PathBuf {
    let path = dir.join("controller.toml");
    std::fs::write(
        &path,
        format!(
            "[bus]\nurl = \"{bus_url}\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
             [controller]\nresync_seconds = 3\nstatus_interval_ms = 200\nerror_requeue_seconds = 1\n"
        ),
    )
    .unwrap();
    path
}

/// Starts `aware-controller` with `kubeconfig` (the chart's controller ServiceAccount token)
/// and waits until it is ready.
fn start_controller(config: &std::path::Path, kubeconfig: &std::path::Path) -> (Proc, SocketAddr) {
    let p = Proc::spawn(
        "aware-controller",
        &["--config", config.to_str().unwrap()],
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("RUST_LOG", "info"),
        ],
    );
    let addr = p.http_addr();
    wait_ready(addr);
    (p, addr)
}

/// A service's log mentions no refused API call (403, Unauthorized).
fn assert_no_refusal_logged(who: &str, log: &str) {
    for refusal in [
        "forbidden",
        "Forbidden",
        "code: 403",
        "HTTP 403",
        "Unauthorized",
    ] {
        assert!(
            !log.contains(refusal),
            "the {who}'s log mentions `{refusal}`:\n{log}"
        );
    }
}

/// The controller's API calls all succeeded: no failed reconcile, list/watch or status write,
/// and no refusal in its log.
fn assert_controller_calls_succeeded(p: &Proc, addr: SocketAddr) {
    let stderr = p.stderr();
    for (name, labels) in [
        (
            "aware_controller_reconciles_total",
            &[("result", "error")][..],
        ),
        ("aware_controller_watch_errors_total", &[][..]),
        (
            "aware_controller_status_writes_total",
            &[("result", "error")][..],
        ),
    ] {
        assert_eq!(
            scrape(addr, name, labels),
            Some(0.0),
            "{name}{labels:?}; the controller's log:\n{stderr}"
        );
    }
    assert!(
        scrape(
            addr,
            "aware_controller_status_writes_total",
            &[("result", "ok")]
        )
        .is_some_and(|n| n >= 1.0),
        "no status write; the controller's log:\n{stderr}"
    );
    assert_no_refusal_logged("controller", &stderr);
}

/// The controller as a process with the token of the chart's controller ServiceAccount: an
/// AwareAutoscaler for a Deployment running on kwok nodes is registered (finalizer, status,
/// `Registered` condition, the registration on the bus); a lifecycle event on the bus reaches
/// its status; a controller killed mid-flight loses nothing when restarted (an object created
/// and one changed while it was down are registered, the status it wrote stays); deleting the
/// Deployment of a managed object deregisters it (`TargetNotFound`); deleting an object
/// deregisters its target and releases the finalizer, leaving the workload as it is. Every call
/// the controller makes succeeds with the chart's ClusterRole; calls outside it are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_with_the_charts_rbac_registers_restarts_and_releases() {
    use aware_bus_schemas::{Event, EventKind, Stage};
    use k8s_openapi::api::rbac::v1::ClusterRole;

    let t0 = Instant::now();
    let cluster = KubeCluster::start(KubeOptions { nodes: 2 }).await.unwrap();
    let nats = NatsServer::start().unwrap();
    let bus_cfg = BusConfig {
        url: nats.url(),
        ..BusConfig::default()
    };
    let bus = Bus::connect(&bus_cfg, "kube-e2e").await.unwrap();
    let mut registrations = bus.subscribe("aware.v1.target.>").await.unwrap();

    let admin = cluster.admin_client().await.unwrap();
    install_chart_identities(&cluster, &admin).await;
    create_namespace(&admin, APP_NS).await;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), APP_NS);
    for (name, replicas) in [("web", 2), ("api", 1)] {
        deployments
            .create(&PostParams::default(), &deployment(name, replicas))
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), APP_NS);
    running_pods(&pods, "web", 2).await;
    running_pods(&pods, "api", 1).await;

    let (kubeconfig, controller_client) = controller_identity(&cluster).await;
    let config = controller_config(cluster.dir(), &nats.url());
    let (mut controller, addr) = start_controller(&config, &kubeconfig);

    // Created → registered: finalizer, Registered condition of this generation, the
    // registration (with its spec) on the bus.
    let aas: Api<kube::api::DynamicObject> =
        Api::namespaced_with(admin.clone(), APP_NS, &aas_resource());
    aas.create(&PostParams::default(), &autoscaler("web", "Auto", 10))
        .await
        .unwrap();
    let v = wait_object(&aas, "web-aware", 30, "registered", |v| {
        registered_condition(v).is_some_and(|c| c["status"] == "True")
    })
    .await;
    assert_eq!(
        v["metadata"]["finalizers"],
        serde_json::json!(["aware.dev/deregister"])
    );
    assert_eq!(
        v["status"]["observedGeneration"],
        v["metadata"]["generation"]
    );
    let c = registered_condition(&v).unwrap();
    assert_eq!(c["reason"], "Registered");
    assert_eq!(c["observedGeneration"], v["metadata"]["generation"]);
    assert!(c["message"].as_str().unwrap().contains("shop/web"), "{c}");
    let r = registration_where(&mut registrations, 30, |r| r.target.key() == "shop/web")
        .await
        .expect("the registration of shop/web on the bus");
    assert_eq!(r.source, "shop/web-aware");
    let spec = r.spec.expect("a registration, not a deregistration");
    assert_eq!(spec.max_replicas, 10);
    assert_eq!(spec.fallback_hpa_target_cpu_utilization, None);

    // A lifecycle event of the services reaches the status (the status writer's patch).
    let Some(Event::Lifecycle(mut lifecycle)) = aware_bus_schemas::generated::samples()
        .into_iter()
        .find(|e| e.kind() == EventKind::Lifecycle)
    else {
        unreachable!()
    };
    lifecycle.target = aware_bus_schemas::Target::new(APP_NS, "web");
    lifecycle.stage = Stage::Online;
    let subj =
        aware_bus_schemas::subject::subject(EventKind::Lifecycle, &lifecycle.target).unwrap();
    bus.publish(
        &subj,
        aware_bus_schemas::encode_event(&Event::Lifecycle(lifecycle))
            .unwrap()
            .into(),
    )
    .await
    .unwrap();
    bus.flush().await.unwrap();
    wait_object(&aas, "web-aware", 30, "stage online", |v| {
        v["status"]["stage"] == "online"
    })
    .await;
    let mut get = cluster.command("kubectl");
    get.args(["get", "aas", "-n", APP_NS]);
    let table = run(get);
    assert!(
        table.contains("web-aware") && table.contains("online"),
        "{table}"
    );

    // The recommender finds the SLO out of reach: the `SloUnreachable` condition and one
    // Warning Event, written with the chart's RBAC; more steps saying so add no Event; the
    // verdict clearing sets the condition False with one Normal Event.
    slo_unreachable_becomes_a_condition_and_events(&bus, &admin, &aas).await;
    assert_controller_calls_succeeded(&controller, addr);

    // Killed mid-flight; while it is down an object is created and another changed.
    controller.child.kill().unwrap();
    controller.child.wait().unwrap();
    aas.create(&PostParams::default(), &autoscaler("api", "Off", 5))
        .await
        .unwrap();
    aas.patch(
        "web-aware",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            // With the HPA target the workload was tuned with, for the fallback: the API server
            // keeps it (the CRD's schema has it) and the registration carries it.
            serde_json::json!({ "spec": {
                "constraints": { "maxReplicas": 8 },
                "fallback": { "hpa": { "targetCPUUtilizationPercentage": 35 } },
            } }),
        ),
    )
    .await
    .unwrap();
    let (controller, addr) = start_controller(&config, &kubeconfig);
    let v = wait_object(&aas, "api-aware", 30, "registered after the restart", |v| {
        registered_condition(v).is_some_and(|c| c["status"] == "True")
    })
    .await;
    assert_eq!(
        v["metadata"]["finalizers"],
        serde_json::json!(["aware.dev/deregister"])
    );
    assert!(
        registered_condition(&v).unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("recommend-only"),
        "{v:#}"
    );
    let v = wait_object(&aas, "web-aware", 30, "generation 2 observed", |v| {
        v["status"]["observedGeneration"] == 2
    })
    .await;
    assert_eq!(
        v["status"]["stage"], "online",
        "the status written before the restart stays"
    );
    // Both registrations (the new object's, the changed one's) went out after the restart.
    let mut seen = std::collections::BTreeMap::new();
    while seen.len() < 2 {
        let r = registration_where(&mut registrations, 30, |r| {
            r.spec.is_some() && (r.target.key() == "shop/api" || r.generation == 2)
        })
        .await
        .expect("both registrations sent after the restart");
        let s = r.spec.as_ref();
        let max = s.map(|s| s.max_replicas);
        let hpa_target = s.and_then(|s| s.fallback_hpa_target_cpu_utilization);
        seen.insert(r.target.key(), (r.generation, max, hpa_target));
    }
    assert_eq!(seen["shop/web"], (2, Some(8), Some(0.35)));
    assert_eq!(seen["shop/api"], (1, Some(5), None));

    // Calls outside the controller's ClusterRole are refused by the server.
    let code = refused_with(
        Api::<Deployment>::namespaced(controller_client.clone(), APP_NS)
            .delete("web", &DeleteParams::default())
            .await,
    );
    assert_eq!(code, 403, "deleting a Deployment");
    let code = refused_with(
        Api::<Deployment>::namespaced(controller_client.clone(), APP_NS)
            .patch(
                "web",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({ "spec": { "replicas": 3 } })),
            )
            .await,
    );
    assert_eq!(code, 403, "patching a Deployment");
    let code = refused_with(
        Api::<Secret>::namespaced(controller_client.clone(), RELEASE_NS)
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(code, 403, "reading Secrets");
    let code = refused_with(
        Api::<kube::api::DynamicObject>::namespaced_with(
            controller_client.clone(),
            APP_NS,
            &aas_resource(),
        )
        .create(&PostParams::default(), &autoscaler("other", "Off", 3))
        .await,
    );
    assert_eq!(code, 403, "creating an AwareAutoscaler");
    let code = refused_with(
        Api::<ClusterRole>::all(controller_client.clone())
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(code, 403, "reading ClusterRoles");

    // The Deployment of a managed object deleted: deregistered, `TargetNotFound`.
    deployments
        .delete("api", &DeleteParams::default())
        .await
        .unwrap();
    registration_where(&mut registrations, 30, |r| {
        r.target.key() == "shop/api" && r.spec.is_none()
    })
    .await
    .expect("the deregistration of shop/api");
    let v = wait_object(&aas, "api-aware", 30, "TargetNotFound", |v| {
        registered_condition(v).is_some_and(|c| c["reason"] == "TargetNotFound")
    })
    .await;
    assert_eq!(registered_condition(&v).unwrap()["status"], "False");

    // Deleted: deregistered on the bus, finalizer released, the workload left as it was.
    let before = deployments.get("web").await.unwrap();
    aas.delete("web-aware", &DeleteParams::default())
        .await
        .unwrap();
    registration_where(&mut registrations, 30, |r| {
        r.target.key() == "shop/web" && r.spec.is_none()
    })
    .await
    .expect("the deregistration of shop/web");
    wait_object(&aas, "web-aware", 30, "gone (finalizer released)", |v| {
        v.is_null()
    })
    .await;
    let after = deployments.get("web").await.unwrap();
    assert_eq!(
        serde_json::to_value(&after.spec).unwrap(),
        serde_json::to_value(&before.spec).unwrap(),
        "the workload keeps its resources"
    );
    assert_eq!(
        after.metadata.generation, before.metadata.generation,
        "the workload was not touched"
    );
    assert_controller_calls_succeeded(&controller, addr);
    eprintln!("controller end-to-end test: {:.1?}", t0.elapsed());
}

/// The `SloUnreachable` condition of an AwareAutoscaler's JSON.
fn slo_condition(v: &serde_json::Value) -> Option<&serde_json::Value> {
    v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "SloUnreachable")
}

/// The Events (`events.k8s.io/v1`) about `web-aware` with `reason`.
async fn events_about_web(
    admin: &kube::Client,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), APP_NS);
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web-aware")
        })
        .collect()
}

/// Publishes `shop/web` actions saying the SLO is out of reach, then reachable again, and
/// checks the condition and the Events the controller writes for them.
async fn slo_unreachable_becomes_a_condition_and_events(
    bus: &Bus,
    admin: &kube::Client,
    aas: &Api<kube::api::DynamicObject>,
) {
    let at_max = aware_bus_schemas::Resources {
        replicas: 10,
        cpu_millicores: 2000,
        memory_bytes: 512 * MIB,
    };
    let needed = aware_bus_schemas::Resources {
        replicas: 14,
        ..at_max
    };
    let action = |step: u32, slo_unreachable| {
        let (a, _) = step_events("web", step, at_max);
        match a {
            aware_bus_schemas::Event::Action(mut a) => {
                a.slo_unreachable = slo_unreachable;
                aware_bus_schemas::Event::Action(a)
            }
            _ => unreachable!(),
        }
    };
    for step in 0..3 {
        publish_event(bus, action(step, Some(needed))).await;
    }
    let v = wait_object(aas, "web-aware", 30, "SloUnreachable True", |v| {
        slo_condition(v).is_some_and(|c| c["status"] == "True")
    })
    .await;
    let c = slo_condition(&v).unwrap();
    assert_eq!(c["reason"], "SloUnreachable");
    let message = c["message"].as_str().unwrap();
    assert!(
        message.contains("at most 10 replicas, 2 CPU, 2Gi memory each")
            && message.contains("needs 14 replicas with 2 CPU and 512Mi memory each"),
        "{message}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while events_about_web(admin, "SloUnreachable").await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "no SloUnreachable Event within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Still out of reach for more steps: no second Event, nor a repeat counted on the first.
    for step in 3..8 {
        publish_event(bus, action(step, Some(needed))).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let warnings = events_about_web(admin, "SloUnreachable").await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let w = &warnings[0];
    assert_eq!(w.type_.as_deref(), Some("Warning"));
    assert_eq!(w.note.as_deref(), Some(message));
    assert_eq!(w.reporting_controller.as_deref(), Some("aware-controller"));
    assert!(w.series.is_none(), "published once: {w:?}");

    publish_event(bus, action(8, None)).await;
    let v = wait_object(aas, "web-aware", 30, "SloUnreachable False", |v| {
        slo_condition(v).is_some_and(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(slo_condition(&v).unwrap()["reason"], "SloReachable");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let normal = events_about_web(admin, "SloReachable").await;
        if let [e] = &normal[..] {
            assert_eq!(e.type_.as_deref(), Some("Normal"));
            break;
        }
        assert!(normal.is_empty(), "{normal:?}");
        assert!(
            Instant::now() < deadline,
            "no SloReachable Event within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(events_about_web(admin, "SloUnreachable").await.len(), 1);
}

/// Starts `aware-controller` replica `name` (its `POD_NAME`, the Lease in [`RELEASE_NS`] from
/// `POD_NAMESPACE`, as the chart sets them) with leader election on; waits until it is ready
/// (a standby is ready too).
fn start_replica(
    config: &std::path::Path,
    kubeconfig: &std::path::Path,
    name: &str,
) -> (Proc, SocketAddr) {
    let p = Proc::spawn(
        "aware-controller",
        &["--config", config.to_str().unwrap()],
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("RUST_LOG", "info"),
            ("POD_NAME", name),
            ("POD_NAMESPACE", RELEASE_NS),
        ],
    );
    let addr = p.http_addr();
    wait_ready(addr);
    (p, addr)
}

/// The holder of the controller's Lease (`aware-controller` in [`RELEASE_NS`]), if any.
async fn lease_holder(admin: &kube::Client) -> Option<String> {
    use k8s_openapi::api::coordination::v1::Lease;
    Api::<Lease>::namespaced(admin.clone(), RELEASE_NS)
        .get_opt("aware-controller")
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty())
}

/// Waits (up to `secs`) until exactly `leader` of `replicas` leads: the Lease names it, its
/// `aware_controller_leader` is 1 and every other's 0.
async fn wait_sole_leader(
    admin: &kube::Client,
    replicas: &[(&str, SocketAddr)],
    leader: Option<&str>,
    secs: u64,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let holder = lease_holder(admin).await;
        let gauges: Vec<(&str, Option<f64>)> = replicas
            .iter()
            .map(|(n, a)| (*n, scrape(*a, "aware_controller_leader", &[])))
            .collect();
        if let Some(h) = &holder {
            let only_it = gauges
                .iter()
                .all(|(n, g)| *g == Some(if n == h { 1.0 } else { 0.0 }));
            if only_it && replicas.iter().any(|(n, _)| n == h) && leader.is_none_or(|l| l == h) {
                return h.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no sole leader within {secs} s: Lease holder {holder:?}, leader gauges {gauges:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates `<target>-aware` and returns how long after `since` it was registered (condition
/// `Registered` true and its registration on the bus).
async fn registered_after(
    aas: &Api<kube::api::DynamicObject>,
    registrations: &mut aware_shared::bus::Subscription,
    target: &str,
    since: Instant,
) -> Duration {
    aas.create(&PostParams::default(), &autoscaler(target, "Auto", 4))
        .await
        .unwrap();
    wait_object(aas, &format!("{target}-aware"), 40, "registered", |v| {
        registered_condition(v).is_some_and(|c| c["status"] == "True")
    })
    .await;
    let key = format!("{APP_NS}/{target}");
    registration_where(registrations, 10, |r| {
        r.target.key() == key && r.spec.is_some()
    })
    .await
    .unwrap_or_else(|| panic!("the registration of {key} on the bus"));
    since.elapsed()
}

/// Two `aware-controller` replicas with the chart's controller identity (its ClusterRole and the
/// Role on `leases`) elect one leader on the Lease: only it reconciles (the standby registers
/// nothing). The leader SIGKILLed, the standby takes the Lease once the record has stayed
/// unchanged for the lease duration and registers a new AwareAutoscaler within 15 s of the kill.
/// A leader stopped with SIGTERM releases the Lease and a new standby takes over at its next
/// attempt. A leader whose Lease is taken from it stops and exits with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_elect_one_leader_and_fail_over() {
    let cluster = KubeCluster::start(KubeOptions { nodes: 1 }).await.unwrap();
    let nats = NatsServer::start().unwrap();
    let bus_cfg = BusConfig {
        url: nats.url(),
        ..BusConfig::default()
    };
    let bus = Bus::connect(&bus_cfg, "kube-e2e").await.unwrap();
    let mut registrations = bus.subscribe("aware.v1.target.>").await.unwrap();
    let admin = cluster.admin_client().await.unwrap();
    install_chart_identities(&cluster, &admin).await;
    create_namespace(&admin, APP_NS).await;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), APP_NS);
    for name in ["web", "api", "db"] {
        deployments
            .create(&PostParams::default(), &deployment(name, 1))
            .await
            .unwrap();
    }
    let (kubeconfig, _) = chart_identity(&cluster, "controller", |c| {
        Box::pin(async move {
            use k8s_openapi::api::coordination::v1::Lease;
            // Both bindings in effect: AwareAutoscalers listed, the Lease readable (404, not 403).
            Api::<kube::api::DynamicObject>::all_with(c.clone(), &aas_resource())
                .list(&ListParams::default())
                .await
                .is_ok()
                && Api::<Lease>::namespaced(c, RELEASE_NS)
                    .get_opt("aware-controller")
                    .await
                    .is_ok()
        })
    })
    .await;
    let config = controller_config(cluster.dir(), &nats.url());
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("[controller.leader_election]\nmode = \"on\"\n");
    std::fs::write(&config, text).unwrap();

    let a = start_replica(&config, &kubeconfig, "controller-a");
    let b = start_replica(&config, &kubeconfig, "controller-b");
    let leader = wait_sole_leader(
        &admin,
        &[("controller-a", a.1), ("controller-b", b.1)],
        None,
        30,
    )
    .await;
    let (mut leader_proc, standby, standby_name) = if leader == "controller-a" {
        (a, b, "controller-b")
    } else {
        (b, a, "controller-a")
    };

    // Registered by the leader only.
    let aas: Api<kube::api::DynamicObject> =
        Api::namespaced_with(admin.clone(), APP_NS, &aas_resource());
    registered_after(&aas, &mut registrations, "web", Instant::now()).await;
    let reconciled = |addr| {
        scrape(
            addr,
            "aware_controller_reconciles_total",
            &[("result", "registered")],
        )
    };
    assert!(reconciled(leader_proc.1).is_some_and(|n| n >= 1.0));
    assert_eq!(reconciled(standby.1), Some(0.0), "the standby reconciled");
    assert_eq!(
        scrape(standby.1, "aware_controller_managed_targets", &[]),
        Some(0.0)
    );
    assert_controller_calls_succeeded(&leader_proc.0, leader_proc.1);

    // SIGKILL: no release; the standby waits for the record to expire.
    leader_proc.0.child.kill().unwrap();
    let killed = Instant::now();
    leader_proc.0.child.wait().unwrap();
    let failover = registered_after(&aas, &mut registrations, "api", killed).await;
    eprintln!("leader SIGKILLed: the standby registered a new AwareAutoscaler {failover:.1?} after the kill");
    assert!(
        failover < Duration::from_secs(15),
        "failover took {failover:?}"
    );
    wait_sole_leader(&admin, &[(standby_name, standby.1)], Some(standby_name), 5).await;
    assert_controller_calls_succeeded(&standby.0, standby.1);

    // A new standby; the leader stopped gracefully releases the Lease.
    let c = start_replica(&config, &kubeconfig, "controller-c");
    wait_sole_leader(
        &admin,
        &[(standby_name, standby.1), ("controller-c", c.1)],
        Some(standby_name),
        10,
    )
    .await;
    let mut old = standby;
    let stopped = Instant::now();
    let status = old
        .0
        .terminate(Duration::from_secs(15))
        .expect("the leader stops on SIGTERM");
    assert!(status.success(), "{status:?}; log:\n{}", old.0.stderr());
    assert!(
        old.0.stderr().contains("released the lease"),
        "{}",
        old.0.stderr()
    );
    let handover = registered_after(&aas, &mut registrations, "db", stopped).await;
    eprintln!("leader SIGTERMed: the standby registered a new AwareAutoscaler {handover:.1?} after the signal");
    // Without the release the standby would wait the full lease duration (10 s).
    assert!(
        handover < Duration::from_secs(8),
        "handover took {handover:?}"
    );
    wait_sole_leader(&admin, &[("controller-c", c.1)], Some("controller-c"), 5).await;

    // The Lease taken from the leader (another holder written): it stops reconciling and exits
    // with an error, for Kubernetes to restart it as a standby.
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), RELEASE_NS);
    let mut lease = leases.get("aware-controller").await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("intruder".into());
    spec.lease_duration_seconds = Some(3600);
    leases
        .replace("aware-controller", &PostParams::default(), &lease)
        .await
        .unwrap();
    let mut c = c;
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = c.0.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the controller kept running without the lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !status.success(),
        "a lost lease must fail the process: {status:?}"
    );
    assert!(c.0.stderr().contains("lost the lease"), "{}", c.0.stderr());
}

const MIB: u64 = 1024 * 1024;

/// Step `step` of episode 0 of `shop/<target>`: the recommender's action asking for `desired`
/// and the collector's `obs` (the actuator decides only for a step the collector reported).
fn step_events(
    target: &str,
    step: u32,
    desired: aware_bus_schemas::Resources,
) -> (aware_bus_schemas::Event, aware_bus_schemas::Event) {
    use aware_bus_schemas::{Event, EventKind};
    let samples = aware_bus_schemas::generated::samples();
    let Some(Event::Action(mut a)) = samples
        .iter()
        .find(|e| e.kind() == EventKind::Action)
        .cloned()
    else {
        unreachable!()
    };
    let Some(Event::Obs(mut o)) = samples.into_iter().find(|e| e.kind() == EventKind::Obs) else {
        unreachable!()
    };
    let t = aware_bus_schemas::Target::new(APP_NS, target);
    a.target = t.clone();
    a.episode = 0;
    a.step = step;
    a.ts_ms = 1_000 * i64::from(step);
    a.desired = desired;
    a.slo_unreachable = None;
    o.target = t;
    o.episode = 0;
    o.step = step;
    o.ts_ms = a.ts_ms;
    (Event::Action(a), Event::Obs(o))
}

async fn publish_event(bus: &Bus, ev: aware_bus_schemas::Event) {
    let subj = aware_bus_schemas::subject::subject(ev.kind(), ev.target()).unwrap();
    let bytes = aware_bus_schemas::encode_event(&ev).unwrap();
    bus.publish(&subj, bytes.into()).await.unwrap();
    bus.flush().await.unwrap();
}

/// Sends steps of `shop/<target>` asking for `desired` until the actuator's `applied` for one
/// satisfies `want` (registrations travel on their own subject: the first steps may be decided
/// before the controller's registration arrived); returns that `applied`.
async fn act_until(
    bus: &Bus,
    applied: &mut aware_shared::bus::Subscription,
    step: &mut u32,
    target: &str,
    desired: aware_bus_schemas::Resources,
    want: impl Fn(&aware_bus_schemas::Applied) -> bool,
) -> aware_bus_schemas::Applied {
    use aware_bus_schemas::{Event, EventKind};
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        *step += 1;
        let (action, obs) = step_events(target, *step, desired);
        publish_event(bus, action).await;
        publish_event(bus, obs).await;
        let wait = tokio::time::Instant::now() + Duration::from_secs(10);
        while let Ok(Some(m)) = tokio::time::timeout_at(wait, applied.next()).await {
            if let Event::Applied(a) =
                aware_bus_schemas::decode_event(EventKind::Applied, &m.payload).unwrap()
            {
                if a.target.name == target && a.step == *step {
                    if want(&a) {
                        return a;
                    }
                    eprintln!("step {step}: {a:?}; sending another step");
                    break;
                }
            }
        }
    }
    panic!("no decision for {target} as expected within 60 s");
}

/// (CPU limit, memory limit, CPU request, memory request) of container `app` of a pod spec.
fn app_resources(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> [String; 4] {
    let c = spec
        .and_then(|s| s.containers.iter().find(|c| c.name == "app"))
        .expect("container app");
    let r = c.resources.as_ref().expect("resources");
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

/// The ReplicaSets of Deployment `app` with their desired replicas, by name.
async fn replica_sets(admin: &kube::Client, app: &str) -> Vec<(ReplicaSet, i32)> {
    Api::<ReplicaSet>::namespaced(admin.clone(), APP_NS)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|rs| {
            let n = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            (rs, n)
        })
        .collect()
}

/// Plays the kubelet's part for in-place resize, which kwok's pod stages do not: a kubelet
/// that supports resize reports, for each running container, the resources it runs with
/// (`status.containerStatuses[].resources`, and what it admitted in `allocatedResources`), and
/// after a resize of the pod's spec it reports the new ones, drops the `PodResize*` conditions
/// and records the pod's generation as observed. The API server refuses `pods/resize` for a pod
/// whose running containers report no resources ("Pod running on node without support for
/// resize").
async fn kubelet_reports_resources(admin: &kube::Client, pod: &Pod) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), APP_NS);
    let spec = pod.spec.as_ref().unwrap();
    let status = pod.status.clone().unwrap();
    let statuses: Vec<serde_json::Value> = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .map(|cs| {
            let r = spec
                .containers
                .iter()
                .find(|c| c.name == cs.name)
                .and_then(|c| c.resources.clone())
                .unwrap_or_default();
            let mut v = serde_json::to_value(&cs).unwrap();
            v["allocatedResources"] = serde_json::to_value(&r.requests).unwrap();
            v["resources"] = serde_json::json!({ "limits": r.limits, "requests": r.requests });
            v
        })
        .collect();
    let conditions: Vec<serde_json::Value> = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !c.type_.starts_with("PodResize"))
        .map(|c| serde_json::to_value(c).unwrap())
        .collect();
    let mut patch = serde_json::json!({
        "status": { "conditions": conditions, "containerStatuses": statuses }
    });
    if let Some(g) = pod.metadata.generation {
        patch["status"]["observedGeneration"] = g.into();
    }
    pods.patch_status(
        pod.metadata.name.as_deref().unwrap(),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(patch),
    )
    .await
    .unwrap();
}

type Edit = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A client layer that runs another client's edit (once) right before the first PATCH of
/// `path` leaves: the edit lands between the caller's read and its write, on the real server.
#[derive(Clone)]
struct EditBeforePatch {
    path: String,
    edit: std::sync::Arc<std::sync::Mutex<Option<Edit>>>,
}

impl<S> tower::Layer<S> for EditBeforePatch {
    type Service = EditBeforePatchService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        EditBeforePatchService {
            inner,
            hook: self.clone(),
        }
    }
}

struct EditBeforePatchService<S> {
    inner: S,
    hook: EditBeforePatch,
}

impl<S> tower::Service<http::Request<kube::client::Body>> for EditBeforePatchService<S>
where
    S: tower::Service<http::Request<kube::client::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> S::Future {
        if req.method() == http::Method::PATCH && req.uri().path() == self.hook.path {
            let edit = self.hook.edit.lock().unwrap().take();
            if let Some(edit) = edit {
                tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(edit));
            }
        }
        self.inner.call(req)
    }
}

/// Starts `aware-actuator` (Kubernetes sink) with `kubeconfig` (the chart's actuator
/// ServiceAccount token) and waits until it is ready.
fn start_actuator(
    dir: &std::path::Path,
    bus_url: &str,
    kubeconfig: &std::path::Path,
) -> (Proc, SocketAddr) {
    let config = dir.join("actuator.toml");
    std::fs::write(
        &config,
        format!(
            "[bus]\nurl = \"{bus_url}\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
             [actuator]\nsink = \"kubernetes\"\n"
        ),
    )
    .unwrap();
    let p = Proc::spawn(
        "aware-actuator",
        &["--config", config.to_str().unwrap()],
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("RUST_LOG", "info"),
        ],
    );
    let addr = p.http_addr();
    wait_ready(addr);
    (p, addr)
}

/// The actuator (as a process, and its Kubernetes sink in-process) with the token of the
/// chart's actuator ServiceAccount, fed by the controller's registrations: a horizontal change
/// through the scale subresource that the ReplicaSet and the pods (kwok) follow; a vertical
/// change through `pods/resize` (no restart, no new ReplicaSet; the test completes the resize
/// as the kubelet would); `updateMode: Off` changes nothing; a vertical change through a
/// template patch rolls the pods onto a new ReplicaSet. Every call succeeds with the chart's
/// ClusterRole; calls outside it are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actuator_with_the_charts_rbac_scales_resizes_and_rolls() {
    use aware_actuator::sink::{
        KubernetesSink, KubernetesSinkConfig, Sink, TargetSinkConfig, VerticalMode,
    };
    use aware_bus_schemas::{Outcome, Resources, Target};

    let t0 = Instant::now();
    let cluster = KubeCluster::start(KubeOptions { nodes: 2 }).await.unwrap();
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
    for name in ["web", "api"] {
        deployments
            .create(&PostParams::default(), &deployment(name, 2))
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), APP_NS);
    running_pods(&pods, "web", 2).await;
    let api_pods = running_pods(&pods, "api", 2).await;

    let (controller_kubeconfig, _) = controller_identity(&cluster).await;
    let (actuator_kubeconfig, actuator_client) = actuator_identity(&cluster, "web").await;
    let config = controller_config(cluster.dir(), &nats.url());
    let (controller, controller_addr) = start_controller(&config, &controller_kubeconfig);
    let (actuator, actuator_addr) =
        start_actuator(cluster.dir(), &nats.url(), &actuator_kubeconfig);

    let aas: Api<kube::api::DynamicObject> =
        Api::namespaced_with(admin.clone(), APP_NS, &aas_resource());
    aas.create(&PostParams::default(), &autoscaler("web", "Auto", 10))
        .await
        .unwrap();
    registration_where(&mut registrations, 30, |r| {
        r.target.key() == "shop/web" && r.spec.is_some()
    })
    .await
    .expect("shop/web registered");

    // Horizontal: 2 → 4 through the scale subresource; the ReplicaSet and the pods follow.
    let before = deployments.get("web").await.unwrap();
    let mut step = 0;
    let res = |replicas, cpu_millicores, memory_mib: u64| Resources {
        replicas,
        cpu_millicores,
        memory_bytes: memory_mib * MIB,
    };
    let a = act_until(
        &bus,
        &mut applied,
        &mut step,
        "web",
        res(4, 250, 128),
        |a| a.outcome == Outcome::Applied,
    )
    .await;
    assert_eq!(a.applied, res(4, 250, 128), "{a:?}");
    let d = deployments.get("web").await.unwrap();
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(4));
    assert_eq!(
        serde_json::to_value(&d.spec.as_ref().unwrap().template).unwrap(),
        serde_json::to_value(&before.spec.as_ref().unwrap().template).unwrap(),
        "a horizontal change leaves the template alone"
    );
    let web_pods = running_pods(&pods, "web", 4).await;
    let rs = replica_sets(&admin, "web").await;
    assert_eq!(rs.len(), 1, "still one ReplicaSet");
    assert_eq!(rs[0].1, 4, "the ReplicaSet follows the scale");
    for p in &web_pods {
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        assert!(node.is_some_and(|n| cluster.nodes().contains(&n)));
    }

    // Vertical, in place: requests 250m / 128Mi → 375m / 192Mi (the guardrails' 50 % step) on
    // every pod through `pods/resize`, the limits with them at the container's 2:1 ratio (500m /
    // 256Mi → 750m / 384Mi); the pods are not replaced and the template is not touched.
    let uids: std::collections::BTreeSet<String> = web_pods
        .iter()
        .map(|p| p.metadata.uid.clone().unwrap())
        .collect();
    for p in &web_pods {
        kubelet_reports_resources(&admin, p).await;
    }
    let a = act_until(
        &bus,
        &mut applied,
        &mut step,
        "web",
        res(4, 375, 192),
        |a| a.outcome == Outcome::Applied,
    )
    .await;
    assert_eq!(a.applied, res(4, 375, 192), "{a:?}");
    assert_eq!(a.reason, None, "no fallback to a template patch: {a:?}");
    let resized = running_pods(&pods, "web", 4).await;
    for p in &resized {
        assert!(
            uids.contains(p.metadata.uid.as_ref().unwrap()),
            "pod replaced"
        );
        assert_eq!(
            app_resources(p.spec.as_ref()),
            ["750m", "384Mi", "375m", "192Mi"].map(String::from),
            "the requests decided, the limits at the limit:request ratio"
        );
    }
    // In force is what the kubelets report running: the old values until they have applied
    // the resize, then the new ones.
    let web_target = Target::new(APP_NS, "web");
    let reader =
        KubernetesSink::new(actuator_client.clone(), KubernetesSinkConfig::default()).unwrap();
    assert_eq!(reader.current(&web_target).await.unwrap(), res(4, 250, 128));
    for p in &resized {
        kubelet_reports_resources(&admin, p).await;
    }
    assert_eq!(reader.current(&web_target).await.unwrap(), res(4, 375, 192));
    for p in running_pods(&pods, "web", 4).await {
        let st = p.status.as_ref().unwrap();
        let cs = &st.container_statuses.as_ref().unwrap()[0];
        let limits = cs
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap();
        assert_eq!(
            limits["cpu"].0, "750m",
            "kubelet status of {:?}",
            p.metadata.name
        );
        assert_eq!(cs.restart_count, 0);
    }
    let d = deployments.get("web").await.unwrap();
    assert_eq!(
        app_resources(d.spec.as_ref().unwrap().template.spec.as_ref()),
        ["500m", "256Mi", "250m", "128Mi"].map(String::from),
        "an in-place resize leaves the template alone"
    );
    assert_eq!(replica_sets(&admin, "web").await.len(), 1, "no rollout");

    // updateMode Off: recorded, nothing applied.
    aas.patch(
        "web-aware",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            serde_json::json!({ "spec": { "updatePolicy": { "updateMode": "Off" } } }),
        ),
    )
    .await
    .unwrap();
    // The new mode reaches the actuator through the controller and the bus, after the patch: an
    // action for the allocation in force changes nothing in either mode, so it probes until the
    // actuator answers recommend-only.
    act_until(
        &bus,
        &mut applied,
        &mut step,
        "web",
        res(4, 375, 192),
        |a| a.outcome == Outcome::RecommendOnly,
    )
    .await;
    let before = deployments.get("web").await.unwrap();
    let pods_before: Vec<String> = running_pods(&pods, "web", 4)
        .await
        .iter()
        .map(|p| p.metadata.resource_version.clone().unwrap())
        .collect();
    let a = act_until(
        &bus,
        &mut applied,
        &mut step,
        "web",
        res(6, 1000, 512),
        |a| a.outcome == Outcome::RecommendOnly,
    )
    .await;
    assert_eq!(
        a.applied,
        res(4, 375, 192),
        "the allocation in force is reported: {a:?}"
    );
    let after = deployments.get("web").await.unwrap();
    assert_eq!(
        what_clients_write(&after),
        what_clients_write(&before),
        "the Deployment was not written"
    );
    let pods_after: Vec<String> = running_pods(&pods, "web", 4)
        .await
        .iter()
        .map(|p| p.metadata.resource_version.clone().unwrap())
        .collect();
    assert_eq!(pods_before, pods_after, "no pod was written");

    // Template patch (the sink in-process, same token): a rollout onto a new ReplicaSet.
    let sink = KubernetesSink::new(
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
    let api_target = Target::new(APP_NS, "api");
    assert_eq!(sink.current(&api_target).await.unwrap(), res(2, 250, 128));
    let report = sink.apply(&api_target, res(2, 500, 256)).await.unwrap();
    assert_eq!(report.in_force, res(2, 500, 256));
    let old_uids: std::collections::BTreeSet<String> = api_pods
        .iter()
        .map(|p| p.metadata.uid.clone().unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let rs = replica_sets(&admin, "api").await;
        let live = running_pods(&pods, "api", 2).await;
        let rolled = rs.len() == 2
            && rs.iter().filter(|(_, n)| *n == 0).count() == 1
            && live.iter().all(|p| {
                !old_uids.contains(p.metadata.uid.as_ref().unwrap())
                    && app_resources(p.spec.as_ref())
                        == ["1", "512Mi", "500m", "256Mi"].map(String::from)
            });
        if rolled {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no rollout onto a new ReplicaSet: {:?}",
            rs.iter()
                .map(|(r, n)| (r.metadata.name.clone(), *n))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(sink.current(&api_target).await.unwrap(), res(2, 500, 256));
    // Idempotent: applying what is in force writes nothing.
    let rv = deployments
        .get("api")
        .await
        .unwrap()
        .metadata
        .resource_version;
    sink.apply(&api_target, res(2, 500, 256)).await.unwrap();
    assert_eq!(
        deployments
            .get("api")
            .await
            .unwrap()
            .metadata
            .resource_version,
        rv
    );

    // A concurrent edit: another client changes the container's CPU request (and adds an
    // environment variable) between the sink's read and its template patch. The server refuses
    // the patch computed from the stale read (409, its resourceVersion precondition); the sink
    // reads again and keeps the new limit:request ratio (1 of 250m → 3 for 750m; from the stale
    // read it would be 1500m), and the other client's edit stays.
    let admin_edit = admin.clone();
    let layer = EditBeforePatch {
        path: format!("/apis/apps/v1/namespaces/{APP_NS}/deployments/api"),
        edit: std::sync::Arc::new(std::sync::Mutex::new(Some(Box::pin(async move {
            Api::<Deployment>::namespaced(admin_edit, APP_NS)
                .patch(
                    "api",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Strategic(serde_json::json!({
                        "spec": { "template": { "spec": { "containers": [{
                            "name": "app",
                            "env": [{ "name": "EDITED_BY", "value": "someone-else" }],
                            "resources": { "requests": { "cpu": "250m" } }
                        }] } } }
                    })),
                )
                .await
                .unwrap();
        }) as Edit))),
    };
    let kc = kube::config::Kubeconfig::read_from(&actuator_kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let racing_client = kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&layer)
        .build();
    let racing_sink = KubernetesSink::new(racing_client, sink.config().clone()).unwrap();
    let report = racing_sink
        .apply(&api_target, res(2, 750, 384))
        .await
        .unwrap();
    assert_eq!(report.in_force, res(2, 750, 384));
    assert!(
        layer.edit.lock().unwrap().is_none(),
        "the concurrent edit ran"
    );
    let d = deployments.get("api").await.unwrap();
    let template = d.spec.as_ref().unwrap().template.spec.as_ref();
    assert_eq!(
        app_resources(template),
        ["3", "768Mi", "750m", "384Mi"].map(String::from),
        "the limits follow the ratio of the edited Deployment, not of the stale read"
    );
    let env = template.unwrap().containers[0]
        .env
        .clone()
        .unwrap_or_default();
    assert!(
        env.iter().any(|e| e.name == "EDITED_BY"),
        "the other client's edit was overwritten: {env:?}"
    );

    // Outside the actuator's ClusterRole: refused.
    let code = refused_with(
        Api::<Deployment>::namespaced(actuator_client.clone(), APP_NS)
            .delete("web", &DeleteParams::default())
            .await,
    );
    assert_eq!(code, 403, "deleting a Deployment");
    let code = refused_with(
        Api::<Secret>::namespaced(actuator_client.clone(), APP_NS)
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(code, 403, "reading Secrets");
    let code = refused_with(
        Api::<Pod>::namespaced(actuator_client.clone(), APP_NS)
            .delete(
                resized[0].metadata.name.as_deref().unwrap(),
                &DeleteParams::default(),
            )
            .await,
    );
    assert_eq!(code, 403, "deleting a pod");
    let code = refused_with(
        Api::<kube::api::DynamicObject>::namespaced_with(
            actuator_client.clone(),
            APP_NS,
            &aas_resource(),
        )
        .list(&ListParams::default())
        .await,
    );
    assert_eq!(code, 403, "reading AwareAutoscalers");

    // The AwareAutoscaler deleted: the finalizer is released, the actuator rejects what still
    // arrives and the workload keeps its last applied resources (4 replicas, requests 375m /
    // 192Mi).
    aas.delete("web-aware", &DeleteParams::default())
        .await
        .unwrap();
    wait_object(&aas, "web-aware", 30, "gone (finalizer released)", |v| {
        v.is_null()
    })
    .await;
    let before = deployments.get("web").await.unwrap();
    let a = act_until(
        &bus,
        &mut applied,
        &mut step,
        "web",
        res(6, 1000, 512),
        |a| a.outcome == Outcome::Rejected,
    )
    .await;
    assert!(
        a.reason
            .as_deref()
            .is_some_and(|r| r.contains("deregistered")),
        "{a:?}"
    );
    let after = deployments.get("web").await.unwrap();
    assert_eq!(
        what_clients_write(&after),
        what_clients_write(&before),
        "the Deployment was not written after the deletion"
    );
    assert_eq!(after.spec.as_ref().unwrap().replicas, Some(4));
    for p in running_pods(&pods, "web", 4).await {
        assert_eq!(
            app_resources(p.spec.as_ref()),
            ["750m", "384Mi", "375m", "192Mi"].map(String::from)
        );
    }

    // Every call of the actuator process succeeded.
    let log = actuator.stderr();
    assert_eq!(
        scrape(
            actuator_addr,
            "aware_actuator_sink_errors_total",
            &[("sink", "kubernetes")]
        ),
        Some(0.0),
        "the actuator's log:\n{log}"
    );
    assert!(
        scrape(
            actuator_addr,
            "aware_actuator_decisions_total",
            &[("outcome", "applied")]
        )
        .is_some_and(|n| n >= 2.0),
        "the actuator's log:\n{log}"
    );
    assert_no_refusal_logged("actuator", &log);
    assert_controller_calls_succeeded(&controller, controller_addr);

    // The Deployment of a managed target deleted: the actuator rejects the step (the sink finds
    // no Deployment, or the controller has deregistered the target) and keeps running.
    aas.create(&PostParams::default(), &autoscaler("api", "Auto", 10))
        .await
        .unwrap();
    registration_where(&mut registrations, 30, |r| {
        r.target.key() == "shop/api" && r.spec.is_some()
    })
    .await
    .expect("shop/api registered");
    deployments
        .delete("api", &DeleteParams::default())
        .await
        .unwrap();
    let a = act_until(
        &bus,
        &mut applied,
        &mut step,
        "api",
        res(3, 1500, 768),
        |a| a.outcome == Outcome::Rejected,
    )
    .await;
    assert!(
        a.reason
            .as_deref()
            .is_some_and(|r| r.contains("not found") || r.contains("deregistered")),
        "{a:?}"
    );
    assert_eq!(
        aware_tests::http_get(actuator_addr, "/readyz").unwrap().0,
        200,
        "the actuator keeps running"
    );
    eprintln!("actuator end-to-end test: {:.1?}", t0.elapsed());
}
