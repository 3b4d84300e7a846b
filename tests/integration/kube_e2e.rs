//! End-to-end tests on a real Kubernetes control plane (etcd, kube-apiserver with RBAC,
//! kube-controller-manager, kube-scheduler, kwok's fake nodes: `aware_tests::kube`), built from
//! the pinned Go module by `tests/k8s/build.sh`.

use std::time::{Duration, Instant};

use aware_tests::kube::{KubeCluster, KubeOptions};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

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
        "deployment.apps/aware-controller",
        "statefulset.apps/aware-nats",
        "statefulset.apps/aware-recommender",
        "networkpolicy.networking.k8s.io/aware-default-deny",
        "poddisruptionbudget.policy/aware-nats",
    ] {
        assert!(
            installed.iter().any(|o| o == want),
            "{want} not installed; the release has:\n{}",
            installed.join("\n")
        );
    }
    // An AwareAutoscaler is accepted, and one that breaks a CEL rule is refused with its message.
    let client = cluster.admin_client().await.unwrap();
    let aas = kube::discovery::ApiResource {
        group: "aware.dev".into(),
        version: "v1alpha1".into(),
        api_version: "aware.dev/v1alpha1".into(),
        kind: "AwareAutoscaler".into(),
        plural: "awareautoscalers".into(),
    };
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client, ns, &aas);
    let object = |name: &str, min: u32, max: u32| -> kube::api::DynamicObject {
        from_json(serde_json::json!({
            "apiVersion": "aware.dev/v1alpha1",
            "kind": "AwareAutoscaler",
            "metadata": { "name": name },
            "spec": {
                "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "web" },
                "constraints": { "minReplicas": min, "maxReplicas": max }
            }
        }))
    };
    api.create(&PostParams::default(), &object("ok", 1, 5))
        .await
        .unwrap();
    let refused = api
        .create(&PostParams::default(), &object("bad", 6, 5))
        .await;
    match refused {
        Err(kube::Error::Api(s)) => assert!(
            s.message
                .contains("constraints.minReplicas must not exceed constraints.maxReplicas"),
            "{s:?}"
        ),
        other => panic!("minReplicas > maxReplicas accepted: {other:?}"),
    }
    api.delete("ok", &DeleteParams::default()).await.unwrap();

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
