//! One conformance suite, run against the in-process bus and against NATS (a real nats-server):
//! identical subject and wildcard semantics.

use std::time::Duration;

use aware_shared::bus::{Bus, BusError, Subscription};
use aware_shared::config::BusConfig;
use aware_tests::NatsServer;
use bytes::Bytes;

const QUIET: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_secs(5);

async fn recv(sub: &mut Subscription) -> (String, Bytes) {
    let m = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("message within 5 s")
        .expect("subscription open");
    (m.subject.to_string(), m.payload)
}

async fn assert_quiet(sub: &mut Subscription) {
    if let Ok(Some(m)) = tokio::time::timeout(QUIET, sub.next()).await {
        panic!("unexpected message on {}", m.subject);
    }
}

async fn publish(bus: &Bus, subject: &str, payload: &'static [u8]) {
    bus.publish(subject, Bytes::from_static(payload))
        .await
        .expect("publish");
    bus.flush().await.expect("flush");
}

pub async fn exact_subject(bus: Bus) {
    let mut sub = bus.subscribe("aware.v1.obs.ns.app").await.unwrap();
    bus.flush().await.unwrap();
    publish(&bus, "aware.v1.obs.ns.other", b"no").await;
    publish(&bus, "aware.v1.obs.ns.app", b"yes").await;
    assert_eq!(
        recv(&mut sub).await,
        ("aware.v1.obs.ns.app".into(), Bytes::from_static(b"yes"))
    );
    assert_quiet(&mut sub).await;
}

pub async fn star_matches_exactly_one_token(bus: Bus) {
    let mut sub = bus.subscribe("aware.v1.*.ns.app").await.unwrap();
    bus.flush().await.unwrap();
    publish(&bus, "aware.v1.obs.ns.app", b"1").await;
    publish(&bus, "aware.v1.action.ns.app", b"2").await;
    publish(&bus, "aware.v1.obs.x.ns.app", b"too deep").await;
    publish(&bus, "aware.v1.ns.app", b"too shallow").await;
    assert_eq!(recv(&mut sub).await.1, Bytes::from_static(b"1"));
    assert_eq!(recv(&mut sub).await.1, Bytes::from_static(b"2"));
    assert_quiet(&mut sub).await;
}

pub async fn tail_matches_one_or_more_tokens(bus: Bus) {
    let mut sub = bus.subscribe("aware.v1.>").await.unwrap();
    bus.flush().await.unwrap();
    publish(&bus, "aware.v1", b"zero tokens").await;
    publish(&bus, "aware.v1.obs", b"1").await;
    publish(&bus, "aware.v1.obs.ns.app", b"3").await;
    publish(&bus, "aware.v2.obs.ns.app", b"other version").await;
    assert_eq!(recv(&mut sub).await.1, Bytes::from_static(b"1"));
    assert_eq!(recv(&mut sub).await.1, Bytes::from_static(b"3"));
    assert_quiet(&mut sub).await;
}

pub async fn fan_out_to_every_matching_subscription(bus: Bus) {
    let mut a = bus.subscribe("aware.v1.episode.*.*").await.unwrap();
    let mut b = bus.subscribe("aware.v1.>").await.unwrap();
    let mut c = bus.subscribe("aware.v1.episode.ns.app").await.unwrap();
    let mut none = bus.subscribe("aware.v1.model.*.*").await.unwrap();
    bus.flush().await.unwrap();
    publish(&bus, "aware.v1.episode.ns.app", b"e").await;
    for s in [&mut a, &mut b, &mut c] {
        assert_eq!(recv(s).await.1, Bytes::from_static(b"e"));
    }
    assert_quiet(&mut none).await;
}

pub async fn order_is_kept_per_publisher(bus: Bus) {
    let mut sub = bus.subscribe("aware.v1.obs.*.*").await.unwrap();
    bus.flush().await.unwrap();
    let n = 5_000u32;
    let publisher = bus.clone();
    let task = tokio::spawn(async move {
        for i in 0..n {
            publisher
                .publish("aware.v1.obs.ns.app", Bytes::from(i.to_be_bytes().to_vec()))
                .await
                .unwrap();
        }
        publisher.flush().await.unwrap();
    });
    for i in 0..n {
        let (_, p) = recv(&mut sub).await;
        assert_eq!(u32::from_be_bytes(p[..4].try_into().unwrap()), i);
    }
    task.await.unwrap();
}

pub async fn dropping_a_subscription_unsubscribes(bus: Bus) {
    let sub = bus.subscribe("aware.v1.obs.*.*").await.unwrap();
    let mut keep = bus.subscribe("aware.v1.obs.*.*").await.unwrap();
    bus.flush().await.unwrap();
    drop(sub);
    if let Bus::InProc(b) = &bus {
        assert_eq!(b.subscription_count(), 1);
    }
    // Publishing still works and reaches the remaining subscription.
    publish(&bus, "aware.v1.obs.ns.app", b"after").await;
    assert_eq!(recv(&mut keep).await.1, Bytes::from_static(b"after"));
}

pub async fn invalid_subjects_are_rejected(bus: Bus) {
    for bad in [
        "",
        "aware..obs",
        "aware.v1.*",
        "aware.v1.>",
        "has space.x",
        ".lead",
        "trail.",
    ] {
        let err = bus
            .publish(bad, Bytes::from_static(b"x"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, BusError::InvalidSubject { .. }),
            "{bad}: {err}"
        );
    }
    for bad in ["", "a..b", "a.>.b", "a b"] {
        assert!(
            matches!(
                bus.subscribe(bad).await,
                Err(BusError::InvalidSubject { .. })
            ),
            "{bad}"
        );
    }
}

pub async fn payloads_arrive_byte_exact(bus: Bus) {
    let mut sub = bus.subscribe("aware.v1.model.ns.app").await.unwrap();
    bus.flush().await.unwrap();
    let big: Vec<u8> = (0..256 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    bus.publish("aware.v1.model.ns.app", Bytes::from(big.clone()))
        .await
        .unwrap();
    bus.publish("aware.v1.model.ns.app", Bytes::new())
        .await
        .unwrap();
    bus.flush().await.unwrap();
    assert_eq!(recv(&mut sub).await.1.to_vec(), big);
    assert!(recv(&mut sub).await.1.is_empty());
}

async fn nats_bus() -> (NatsServer, Bus) {
    let server = NatsServer::start().expect("nats-server");
    let cfg = BusConfig {
        url: server.url(),
        ..BusConfig::default()
    };
    let bus = Bus::connect(&cfg, "conformance").await.expect("connect");
    assert_eq!(bus.kind(), "nats");
    (server, bus)
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod in_process {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(aware_shared::bus::Bus::in_process(1024)).await;
                }
            )*
        }
        mod nats {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let (_server, bus) = super::nats_bus().await;
                    super::$name(bus).await;
                }
            )*
        }
    };
}

conformance!(
    exact_subject,
    star_matches_exactly_one_token,
    tail_matches_one_or_more_tokens,
    fan_out_to_every_matching_subscription,
    order_is_kept_per_publisher,
    dropping_a_subscription_unsubscribes,
    invalid_subjects_are_rejected,
    payloads_arrive_byte_exact,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_back_pressure_loses_nothing() {
    // A queue of 4 and 10,000 messages: the publisher waits for the slow subscriber.
    let bus = Bus::in_process(4);
    let mut sub = bus.subscribe("aware.v1.obs.*.*").await.unwrap();
    let publisher = bus.clone();
    let task = tokio::spawn(async move {
        for i in 0..10_000u32 {
            publisher
                .publish("aware.v1.obs.ns.app", Bytes::from(i.to_be_bytes().to_vec()))
                .await
                .unwrap();
        }
    });
    for i in 0..10_000u32 {
        if i % 1000 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (_, p) = recv(&mut sub).await;
        assert_eq!(u32::from_be_bytes(p[..4].try_into().unwrap()), i);
    }
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_connect_fails_with_a_clear_error_after_retrying() {
    let port = aware_tests::free_port().unwrap();
    let cfg = BusConfig {
        url: format!("nats://127.0.0.1:{port}"),
        connect_timeout_ms: 700,
        ..BusConfig::default()
    };
    let t0 = std::time::Instant::now();
    let err = Bus::connect(&cfg, "nobody-home")
        .await
        .err()
        .expect("no server");
    assert!(matches!(err, BusError::Connect { .. }), "{err}");
    assert!(err.to_string().contains(&port.to_string()));
    // It retried with backoff (100 + 200 ms …) rather than failing at once.
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_reconnects_after_a_server_restart() {
    let server = NatsServer::start().unwrap();
    let port = server.port();
    let cfg = BusConfig {
        url: server.url(),
        reconnect_max_delay_ms: 200,
        ..BusConfig::default()
    };
    let bus = Bus::connect(&cfg, "reconnect").await.unwrap();
    let mut sub = bus.subscribe("aware.v1.obs.*.*").await.unwrap();
    bus.flush().await.unwrap();
    publish(&bus, "aware.v1.obs.ns.app", b"before").await;
    assert_eq!(recv(&mut sub).await.1, Bytes::from_static(b"before"));

    let keep_dir = tempfile::tempdir().unwrap();
    let store_copy = keep_dir.path().join("js");
    drop(server); // kills the server (its directory is removed too)
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while bus.is_connected() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!bus.is_connected(), "client noticed the server going away");
    let _restarted = NatsServer::start_on(port, store_copy).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !bus.is_connected() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(bus.is_connected(), "client reconnected");
    // The subscription is re-established by the client after reconnecting.
    publish(&bus, "aware.v1.obs.ns.app", b"after").await;
    assert_eq!(recv(&mut sub).await.1, Bytes::from_static(b"after"));
    // The new server started without the old one's JetStream storage: the first publish after
    // reconnecting declared the capture stream again, and it captured that message.
    let js = async_nats::jetstream::new(
        async_nats::connect(format!("nats://127.0.0.1:{port}"))
            .await
            .unwrap(),
    );
    let mut stream = js
        .get_stream(&cfg.jetstream.stream)
        .await
        .expect("the capture stream is declared again");
    let state = stream.info().await.unwrap().state.clone();
    assert_eq!(state.messages, 1, "{state:?}");
    let m = stream.get_raw_message(state.last_sequence).await.unwrap();
    assert_eq!(
        (m.subject.as_str(), m.payload.as_ref()),
        ("aware.v1.obs.ns.app", b"after".as_ref())
    );
}
