//! Services in-process on the embedded bus: /metrics parsed with a real exposition parser,
//! /healthz, /readyz, malformed messages counted and dropped without killing the actor.

use std::time::Duration;

use aware_bus_schemas::{encode, generated::samples, Episode, Event, EventKind, Stage, Target};
use aware_shared::bus::Bus;
use aware_shared::config::{AppConfig, LifecycleProfile};
use aware_tests::{http_get, metric, msgpack_field, parse_metrics};
use bytes::Bytes;

fn episode(target: &Target, n: u64, estimate: f64) -> Episode {
    let Some(Event::Episode(mut e)) = samples()
        .into_iter()
        .find(|e| e.kind() == EventKind::Episode)
    else {
        panic!("sample")
    };
    e.target = target.clone();
    e.episode = n;
    e.stage = Stage::Offline;
    e.policy_estimate = Some(estimate);
    e
}

#[actix_rt::test]
async fn metrics_health_and_malformed_messages() {
    let target = Target::new("shop", "cart");
    let mut cfg = AppConfig::default();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.targets = vec![aware_shared::spec::TargetSpec::new(&target)];
    cfg.lifecycle = LifecycleProfile {
        window: 2,
        t_online: 1.0,
        ..LifecycleProfile::default()
    };
    let data = tempfile::tempdir().unwrap();
    crate::set_recorder(
        &mut cfg,
        serde_json::json!({ "sqlite_path": data.path().join("t.db").display().to_string() }),
    );
    let bus = Bus::in_process(1024);
    let (mut lifecycle, running, shutdown) =
        crate::start_services(bus.clone(), cfg, "aware.v1.lifecycle.*.*.*").await;
    let addr = running.http_addr;

    // Readiness: every service subscribed.
    let get = move |path: &'static str| {
        tokio::task::spawn_blocking(move || http_get(addr, path).unwrap())
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (code, body) = get("/readyz").await.unwrap();
        if code == 200 {
            for s in aware_cli::SERVICES {
                assert!(body.contains(&format!("{}: ready", s.name)), "{body}");
            }
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not ready: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get("/healthz").await.unwrap().0, 200);

    // The lifecycle monitor announces the configured target OFFLINE (bootstrapping).
    let first = tokio::time::timeout(Duration::from_secs(5), lifecycle.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        msgpack_field(&first.payload, "stage").unwrap().as_str(),
        Some("offline")
    );

    // Garbage, a wrong schema and a target mismatch are counted and dropped...
    let subj = "aware.v1.episode.184.shop.cart";
    bus.publish(subj, Bytes::from_static(b"\xc1garbage"))
        .await
        .unwrap();
    let wrong_kind = encode(
        &samples()
            .into_iter()
            .find_map(|e| match e {
                Event::Obs(o) => Some(o),
                _ => None,
            })
            .unwrap(),
    )
    .unwrap();
    bus.publish(subj, Bytes::from(wrong_kind)).await.unwrap();
    let other_target = encode(&episode(&Target::new("shop", "other"), 1, 2.0)).unwrap();
    bus.publish(subj, Bytes::from(other_target)).await.unwrap();
    // ...and the actor keeps working: two good episodes take the agent ONLINE.
    for n in 1..=2 {
        let ep = encode(&episode(&target, n, 1.5)).unwrap();
        bus.publish(subj, Bytes::from(ep)).await.unwrap();
    }
    let next = tokio::time::timeout(Duration::from_secs(5), lifecycle.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        msgpack_field(&next.payload, "stage").unwrap().as_str(),
        Some("online")
    );
    assert_eq!(
        msgpack_field(&next.payload, "previous").unwrap().as_str(),
        Some("offline")
    );

    let (code, text) = get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    let scrape = parse_metrics(&text);
    let lm = [("service", "lifecycle-monitor")];
    let with = |event: &'static str| -> Vec<(&str, &str)> {
        let mut l = lm.to_vec();
        l.push(("event", event));
        l
    };
    assert_eq!(
        metric(&scrape, "aware_decode_errors_total", &with("episode")),
        Some(3.0)
    );
    assert_eq!(
        metric(&scrape, "aware_messages_in_total", &with("episode")),
        Some(2.0)
    );
    assert_eq!(
        metric(&scrape, "aware_messages_out_total", &with("lifecycle")),
        Some(2.0)
    );
    assert_eq!(metric(&scrape, "aware_targets", &lm), Some(1.0));
    // Every service exposes its counters.
    for s in aware_cli::SERVICES {
        assert!(
            metric(
                &scrape,
                "aware_messages_in_total",
                &[("service", s.name), ("event", "obs")]
            )
            .is_some(),
            "{} has no counters",
            s.name
        );
    }
    // The recommender saw the lifecycle messages.
    assert_eq!(
        metric(
            &scrape,
            "aware_messages_in_total",
            &[("service", "recommender"), ("event", "lifecycle")]
        ),
        Some(2.0)
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), running.join())
        .await
        .expect("services stop on shutdown")
        .unwrap();
}
