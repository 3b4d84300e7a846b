//! Per-service identities on a real nats-server running the configuration `aware nats-config`
//! generates (the table of `aware_shared::bus::permissions`): the six services, each as its own
//! process and identity, run the control loop (models through the JetStream object store), the
//! controller's identity registers a target, and every forged publication is refused by the
//! server: not delivered to a subscriber allowed to see it, and reported to the forger as a
//! permissions violation.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aware_bus_schemas::{subject, EventKind, Target};
use aware_shared::bus::permissions::Identity;
use aware_shared::bus::Bus;
use aware_shared::config::{AppConfig, BusConfig};
use aware_tests::{scrape, NatsServer, Proc};
use bytes::Bytes;

const BUCKET: &str = "perm-models";

fn password(id: Identity) -> String {
    format!("pw-{}-0123", id.name())
}

/// nats-server with the generated authorization block, each identity's password in the
/// environment as the chart provides it.
fn server() -> NatsServer {
    let mut cfg = AppConfig::default();
    cfg.sections.insert(
        "model_store".into(),
        serde_json::json!({ "backend": "jetstream", "bucket": BUCKET }),
    );
    let conf = aware_cli::nats_config::with_passwords(&cfg).unwrap();
    let env: Vec<(String, String)> = Identity::ALL
        .into_iter()
        .map(|id| (id.password_variable(), password(id)))
        .collect();
    NatsServer::start_with_config(&conf, &env).unwrap()
}

/// The settings a service of identity `id` connects with.
fn env_of(id: Identity) -> Vec<(String, String)> {
    vec![
        ("AWARE_BUS__AUTH__USER".into(), id.name().to_string()),
        ("AWARE_BUS__AUTH__PASSWORD".into(), password(id)),
        ("AWARE_BUS__INBOX_PREFIX".into(), id.inbox_prefix()),
    ]
}

fn bus_cfg(server: &NatsServer, id: Identity) -> BusConfig {
    let mut c = BusConfig {
        url: server.url(),
        inbox_prefix: id.inbox_prefix(),
        ..BusConfig::default()
    };
    c.auth.user = id.name().into();
    c.auth.password = password(id);
    c
}

/// A plain client of identity `id` (what an attacker holding its credentials has), and the
/// permissions violations the server reports to it.
async fn raw_client(
    server: &NatsServer,
    id: Identity,
) -> (async_nats::Client, Arc<Mutex<Vec<String>>>) {
    let violations = Arc::new(Mutex::new(Vec::new()));
    let seen = violations.clone();
    let client = async_nats::ConnectOptions::with_user_and_password(id.name().into(), password(id))
        .custom_inbox_prefix(id.inbox_prefix())
        .event_callback(move |event| {
            let seen = seen.clone();
            async move {
                let text = event.to_string();
                if text.to_lowercase().contains("permissions violation") {
                    seen.lock().unwrap().push(text);
                }
            }
        })
        .connect(server.url())
        .await
        .unwrap();
    (client, violations)
}

/// Every subject the observer (the read-only `watch` identity, allowed `aware.v1.>`) received.
struct Observer {
    subjects: Arc<Mutex<Vec<String>>>,
    _bus: Bus,
}

impl Observer {
    async fn start(server: &NatsServer) -> Observer {
        let mut c = bus_cfg(server, Identity::Watch);
        c.jetstream.enabled = false;
        let bus = Bus::connect(&c, "observer").await.unwrap();
        let mut sub = bus.subscribe(subject::ALL).await.unwrap();
        bus.flush().await.unwrap();
        let subjects = Arc::new(Mutex::new(Vec::new()));
        let out = subjects.clone();
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                out.lock().unwrap().push(m.subject.to_string());
            }
        });
        Observer {
            subjects,
            _bus: bus,
        }
    }

    fn saw(&self, subj: &str) -> bool {
        self.subjects.lock().unwrap().iter().any(|s| s == subj)
    }

    fn saw_kind(&self, kind: EventKind) -> bool {
        let prefix = format!("aware.v1.{}.", kind.as_str());
        self.subjects
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.starts_with(&prefix) && !s.contains(".forged."))
    }

    async fn wait_for(&self, subj: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.saw(subj) {
            assert!(Instant::now() < deadline, "{subj} never delivered");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// `forger` publishes `kind` for a made-up target; then `owner` publishes the same kind for
/// another, and once the observer has that one, the forged one must not have been delivered
/// (each forged message was flushed, so the server had already dealt with it).
async fn forged_is_refused(
    server: &NatsServer,
    observer: &Observer,
    forger: Identity,
    owner: Identity,
    kind: EventKind,
    case: &str,
) {
    let (client, violations) = raw_client(server, forger).await;
    let forged = subject::subject(kind, &Target::new("forged", case)).unwrap();
    client
        .publish(forged.clone(), Bytes::from_static(b"forged"))
        .await
        .unwrap();
    client.flush().await.unwrap();
    let (owner_client, owner_violations) = raw_client(server, owner).await;
    let sentinel = subject::subject(kind, &Target::new("sentinel", case)).unwrap();
    owner_client
        .publish(sentinel.clone(), Bytes::from_static(b"legit"))
        .await
        .unwrap();
    owner_client.flush().await.unwrap();
    observer.wait_for(&sentinel).await;
    assert!(
        !observer.saw(&forged),
        "{case}: {forged} by {} was delivered",
        forger.name()
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while violations.lock().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "{case}: no permissions violation reported"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let v = violations.lock().unwrap().join("; ");
    assert!(v.contains(&forged), "{case}: {v}");
    assert!(owner_violations.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_publications_are_refused_and_each_service_runs_as_its_own_identity() {
    let server = server();
    let observer = Observer::start(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("aware.toml");
    std::fs::write(
        &config,
        format!(
            "[bus]\nurl = \"{url}\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
             [lifecycle]\nbootstrap = false\n\
             [learning]\nsteps_per_episode = 20\n\
             [collector]\nsource = \"simulator\"\n\
             [collector.simulator]\napps = 2\nseed = 5\nmax_steps = 3000\n\
             [trajectory_store]\nsqlite_path = \"{db}\"\n[recorder]\nbatch = 16\n\
             [model_store]\nbackend = \"jetstream\"\nbucket = \"{BUCKET}\"\n\
             [trainer]\ntrain_every_transitions = 40\ngradient_steps = 20\nbatch_size = 32\n\
             min_transitions = 32\npoll_ms = 50\n",
            url = server.url(),
            db = dir.path().join("t.db").display(),
        ),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let mut procs = Vec::new();
    for (bin, id) in [
        ("aware-lifecycle-monitor", Identity::LifecycleMonitor),
        ("aware-meta-learner-trainer", Identity::Trainer),
        ("aware-trajectory-recorder", Identity::Recorder),
        ("aware-actuator", Identity::Actuator),
        ("aware-recommender", Identity::Recommender),
        ("aware-metrics-collector", Identity::Collector),
    ] {
        let env = env_of(id);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let p = Proc::spawn(bin, &["--config", cfg], &env);
        let addr = p.http_addr();
        procs.push((bin, p, addr));
    }

    // The controller's identity registers a target (the controller itself needs a cluster).
    let controller = Bus::connect(&bus_cfg(&server, Identity::Controller), "controller")
        .await
        .unwrap();
    let registered = Target::new("shop", "cart");
    let reg = aware_shared::testkit::registration(&registered, 1, None);
    controller
        .publish(
            &subject::subject(EventKind::Target, &registered).unwrap(),
            Bytes::from(aware_bus_schemas::encode(&reg).unwrap()),
        )
        .await
        .unwrap();
    controller.flush().await.unwrap();

    // The loop runs: every kind is published by its owner and consumed; the recommender loads a
    // model the trainer wrote to the object store.
    let recommender = procs[4].2;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let missing: Vec<EventKind> = EventKind::ALL
            .into_iter()
            .filter(|k| *k != EventKind::Embedding && !observer.saw_kind(*k))
            .collect();
        let loaded =
            scrape(recommender, "aware_recommender_models_loaded_total", &[]).unwrap_or(0.0);
        if missing.is_empty() && loaded >= 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not seen: {missing:?}, models loaded {loaded}; stderr:\n{}",
            procs
                .iter()
                .map(|(b, p, _)| format!("== {b}\n{}", p.stderr()))
                .collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The attacks of issue 35, each by an identity that does not own the event.
    for (forger, owner, kind, case) in [
        (
            Identity::Collector,
            Identity::Recommender,
            EventKind::Action,
            "action-by-collector",
        ),
        (
            Identity::Actuator,
            Identity::Recommender,
            EventKind::Action,
            "action-by-actuator",
        ),
        (
            Identity::Recommender,
            Identity::Controller,
            EventKind::Target,
            "registration-by-recommender",
        ),
        (
            Identity::Collector,
            Identity::Controller,
            EventKind::Target,
            "deregistration-by-collector",
        ),
        (
            Identity::Trainer,
            Identity::LifecycleMonitor,
            EventKind::Lifecycle,
            "serving-by-trainer",
        ),
        (
            Identity::Recommender,
            Identity::LifecycleMonitor,
            EventKind::Lifecycle,
            "serving-by-recommender",
        ),
        (
            Identity::Recommender,
            Identity::Trainer,
            EventKind::Model,
            "model-by-recommender",
        ),
        (
            Identity::LifecycleMonitor,
            Identity::Trainer,
            EventKind::Model,
            "model-by-lifecycle-monitor",
        ),
        (
            Identity::Recorder,
            Identity::Collector,
            EventKind::Obs,
            "obs-by-recorder",
        ),
        (
            Identity::Collector,
            Identity::Actuator,
            EventKind::Applied,
            "applied-by-collector",
        ),
        (
            Identity::Watch,
            Identity::Recorder,
            EventKind::Episode,
            "episode-by-watch",
        ),
    ] {
        forged_is_refused(&server, &observer, forger, owner, kind, case).await;
    }

    // Nobody but the trainer writes the model store, and nobody deletes or purges the capture.
    let (collector, violations) = raw_client(&server, Identity::Collector).await;
    let js = async_nats::jetstream::new(collector.clone());
    let _ = tokio::time::timeout(Duration::from_secs(2), js.delete_stream("AWARE")).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), js.delete_object_store(BUCKET)).await;
    collector
        .publish(format!("$O.{BUCKET}.M.forged"), Bytes::from_static(b"{}"))
        .await
        .unwrap();
    // Nor writes a state kind's key it does not publish.
    collector
        .publish(
            "$KV.AWARE_STATE.aware.v1.lifecycle.208.sim.forged",
            Bytes::from_static(b"{}"),
        )
        .await
        .unwrap();
    // Nor reads another identity's replies.
    let _inbox = collector
        .subscribe(format!("{}.>", Identity::Recorder.inbox_prefix()))
        .await
        .unwrap();
    collector.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let v = violations.lock().unwrap().join("\n");
    for refused in [
        "$JS.API.STREAM.DELETE.AWARE".to_string(),
        format!("$JS.API.STREAM.DELETE.OBJ_{BUCKET}"),
        format!("$O.{BUCKET}.M.forged"),
        "$KV.AWARE_STATE.aware.v1.lifecycle.208.sim.forged".to_string(),
        format!("{}.>", Identity::Recorder.inbox_prefix()),
    ] {
        assert!(v.contains(&refused), "{refused} not refused: {v}");
    }
    let admin = async_nats::ConnectOptions::with_user_and_password(
        Identity::Recorder.name().into(),
        password(Identity::Recorder),
    )
    .custom_inbox_prefix(Identity::Recorder.inbox_prefix())
    .connect(server.url())
    .await
    .unwrap();
    let js = async_nats::jetstream::new(admin);
    assert!(
        js.get_stream("AWARE").await.is_ok(),
        "the capture stream survived"
    );
    // Each state kind's publisher kept its targets' state in the state bucket.
    use futures::StreamExt;
    let state = js.get_key_value("AWARE_STATE").await.unwrap();
    for kind in ["lifecycle", "model", "target"] {
        let keys: Vec<String> = state
            .keys()
            .await
            .unwrap()
            .filter_map(|k| async move { k.ok() })
            .collect()
            .await;
        assert!(
            keys.iter()
                .any(|k| k.starts_with(&format!("aware.v1.{kind}."))),
            "no {kind} kept: {keys:?}"
        );
    }

    // Every service did all it needed within its permissions.
    for (bin, p, _) in &procs {
        let log = p.stderr();
        assert!(
            !log.to_lowercase().contains("permissions violation"),
            "{bin} hit a permissions violation:\n{log}"
        );
    }
    for (_, mut p, _) in procs {
        p.terminate(Duration::from_secs(10));
    }
}
