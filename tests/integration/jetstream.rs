//! NATS specifics: the JetStream stream that captures `aware.v1.>` for replay by external tools
//! (and the embedded bus's counterpart of its current state),
//! and publish errors that reach the caller.

use std::time::Duration;

use aware_bus_schemas::{encode_event, generated::samples, subject};
use aware_shared::bus::{Bus, BusError};
use aware_shared::config::BusConfig;
use aware_tests::{msgpack_field, NatsServer};
use bytes::Bytes;

fn cfg(url: String, max_age_secs: u64) -> BusConfig {
    let mut c = BusConfig {
        url,
        ..BusConfig::default()
    };
    c.jetstream.max_age_secs = max_age_secs;
    c.jetstream.stream = "AWARE".into();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_captures_every_event_for_replay() {
    let server = NatsServer::start().unwrap();
    let bus = Bus::connect(&cfg(server.url(), 120), "js-test")
        .await
        .unwrap();
    // A second service connecting with the same settings is idempotent.
    let _other = Bus::connect(&cfg(server.url(), 120), "js-test-2")
        .await
        .unwrap();

    let events = samples();
    for ev in &events {
        let subj = subject::subject(ev.kind(), ev.target()).unwrap();
        bus.publish(&subj, Bytes::from(encode_event(ev).unwrap()))
            .await
            .unwrap();
    }
    // Not captured: outside aware.v1.>.
    bus.publish("other.subject", Bytes::from_static(b"x"))
        .await
        .unwrap();
    bus.flush().await.unwrap();

    // An external tool with a plain NATS client replays the history.
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream("AWARE").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let info = stream.info().await.unwrap();
        if info.state.messages == events.len() as u64 || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let info = stream.info().await.unwrap().clone();
    assert_eq!(info.config.subjects, vec!["aware.v1.>".to_string()]);
    assert_eq!(info.config.max_age, Duration::from_secs(120));
    assert_eq!(info.state.messages, events.len() as u64);
    for (seq, ev) in (1u64..).zip(&events) {
        let m = stream.get_raw_message(seq).await.unwrap();
        assert_eq!(
            m.subject.as_str(),
            subject::subject(ev.kind(), ev.target()).unwrap()
        );
        let schema = msgpack_field(&m.payload, "schema").unwrap();
        assert_eq!(schema.as_str().unwrap(), format!("{}/1", ev.kind()));
    }

    // Retention follows the configuration on the next start.
    let _updated = Bus::connect(&cfg(server.url(), 60), "js-test-3")
        .await
        .unwrap();
    let info = stream.info().await.unwrap();
    assert_eq!(info.config.max_age, Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_disabled_needs_no_stream() {
    let server = NatsServer::start().unwrap();
    let mut c = cfg(server.url(), 120);
    c.jetstream.enabled = false;
    let bus = Bus::connect(&c, "no-js").await.unwrap();
    bus.publish("aware.v1.obs.ns.app", Bytes::from_static(b"x"))
        .await
        .unwrap();
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    assert!(js.get_stream("AWARE").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_errors_are_returned_not_swallowed() {
    let server = NatsServer::start().unwrap();
    let bus = Bus::connect(&cfg(server.url(), 120), "errors")
        .await
        .unwrap();
    // nats-server's default max_payload is 1 MiB.
    let too_big = Bytes::from(vec![0u8; 2 * 1024 * 1024]);
    let err = bus
        .publish("aware.v1.model.ns.app", too_big)
        .await
        .unwrap_err();
    assert!(matches!(err, BusError::Publish { .. }), "{err}");
    assert!(err.to_string().contains("aware.v1.model.ns.app"));
}

/// With `bus.jetstream.ack_publishes` a publish returns once the stream has stored the message,
/// each message stored once; with no stream to store it, it is retried and then fails, naming
/// the setting that bounds the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_publishes_return_once_stored_and_fail_when_nothing_stores() {
    let server = NatsServer::start().unwrap();
    let mut c = cfg(server.url(), 120);
    c.jetstream.ack_publishes = true;
    c.jetstream.ack_timeout_ms = 1_500;
    let bus = Bus::connect(&c, "acked").await.unwrap();
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let held = || async {
        let mut s = js.get_stream("AWARE").await.unwrap();
        s.info().await.unwrap().state.messages
    };
    for n in 1..=3u64 {
        bus.publish("aware.v1.obs.1.ns.app", Bytes::from_static(b"x"))
            .await
            .unwrap();
        // Stored before the publish returned: no waiting for the capture.
        assert_eq!(held().await, n);
    }

    js.delete_stream("AWARE").await.unwrap();
    let started = std::time::Instant::now();
    let err = bus
        .publish("aware.v1.obs.1.ns.app", Bytes::from_static(b"x"))
        .await
        .unwrap_err();
    assert!(matches!(err, BusError::Publish { .. }), "{err}");
    assert!(
        err.to_string().contains("bus.jetstream.ack_timeout_ms"),
        "{err}"
    );
    assert!(started.elapsed() >= Duration::from_millis(500), "retried");
}

/// With acknowledged publishes the outbox publishes in lanes by target: 40 targets × 25 `obs`
/// queued at once are all stored once, each target's in the order queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_outbox_keeps_each_targets_order() {
    use aware_bus_schemas::{Event, EventKind, Target};
    use aware_shared::config::AppConfig;
    use aware_shared::service::ServiceContext;
    use futures::StreamExt;

    let server = NatsServer::start().unwrap();
    let mut bus_cfg = cfg(server.url(), 120);
    bus_cfg.jetstream.ack_publishes = true;
    let bus = Bus::connect(&bus_cfg, "lanes").await.unwrap();
    let app = AppConfig {
        bus: bus_cfg,
        ..AppConfig::default()
    };
    let ctx = ServiceContext::new(
        "lanes",
        bus,
        std::sync::Arc::new(app),
        tokio_util::sync::CancellationToken::new(),
    )
    .unwrap();
    let (outbox, publisher) = aware_shared::agents::spawn_publisher(ctx.clone());
    let Some(Event::Obs(sample)) = samples().into_iter().find(|e| e.kind() == EventKind::Obs)
    else {
        unreachable!()
    };
    let (targets, steps) = (40u32, 25u32);
    for step in 0..steps {
        for t in 0..targets {
            let mut o = sample.clone();
            o.target = Target::new("ns", format!("app-{t}"));
            o.step = step;
            assert!(outbox.send(o));
        }
    }
    drop(outbox);
    aware_shared::agents::join_publisher(publisher)
        .await
        .unwrap();

    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let stream = js.get_stream("AWARE").await.unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut seen: std::collections::HashMap<String, Vec<u32>> = Default::default();
    for _ in 0..targets * steps {
        let m = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("every message stored")
            .unwrap()
            .unwrap();
        let Event::Obs(o) = aware_bus_schemas::decode_event(EventKind::Obs, &m.payload).unwrap()
        else {
            unreachable!()
        };
        seen.entry(o.target.name.clone()).or_default().push(o.step);
    }
    assert_eq!(seen.len(), targets as usize);
    let in_order: Vec<u32> = (0..steps).collect();
    assert!(seen.values().all(|s| *s == in_order), "{seen:?}");
    let info = js.get_stream("AWARE").await.unwrap().cached_info().clone();
    assert_eq!(
        info.state.messages,
        u64::from(targets * steps),
        "stored once"
    );
}

async fn next_stage(
    rx: &mut tokio::sync::mpsc::Receiver<aware_bus_schemas::Event>,
) -> (String, u64, aware_bus_schemas::Stage) {
    match tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("an event within 20 s")
        .unwrap()
    {
        aware_bus_schemas::Event::Lifecycle(l) => (l.target.name.clone(), l.episode, l.stage),
        other => panic!("{other:?}"),
    }
}

fn lifecycle(
    name: &str,
    episode: u64,
    stage: aware_bus_schemas::Stage,
) -> aware_bus_schemas::Event {
    use aware_bus_schemas::{Event, EventKind, Target};
    let Some(Event::Lifecycle(mut l)) = samples()
        .into_iter()
        .find(|e| e.kind() == EventKind::Lifecycle)
    else {
        unreachable!()
    };
    l.target = Target::new("shop", name);
    l.episode = episode;
    l.stage = stage;
    Event::Lifecycle(l)
}

async fn publish(bus: &Bus, ev: aware_bus_schemas::Event) {
    let subj = subject::subject(ev.kind(), ev.target()).unwrap();
    bus.publish(&subj, Bytes::from(encode_event(&ev).unwrap()))
        .await
        .unwrap();
    bus.flush().await.unwrap();
}

/// Stages of two targets, `a` ending SERVING at episode 20 and `b` OFFLINE at episode 2.
async fn publish_stages(bus: &Bus) {
    use aware_bus_schemas::Stage;
    publish(bus, lifecycle("a", 1, Stage::Offline)).await;
    publish(bus, lifecycle("a", 9, Stage::Online)).await;
    publish(bus, lifecycle("b", 2, Stage::Offline)).await;
    publish(bus, lifecycle("a", 20, Stage::Serving)).await;
}

/// A late service `ctx` reads every target's newest stage as its current state and gets it
/// first from `subscribe_events` (in publish order, never an older one), then live messages.
async fn assert_late_start_from_current_state(
    ctx: &aware_shared::service::ServiceContext,
    bus: &Bus,
) {
    use aware_bus_schemas::{Event, EventKind, Stage};
    let current: Vec<_> = ctx
        .current_state(EventKind::Lifecycle)
        .await
        .into_iter()
        .map(|ev| match ev {
            Event::Lifecycle(l) => (l.target.name.clone(), l.episode, l.stage),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        current,
        vec![
            ("b".into(), 2, Stage::Offline),
            ("a".into(), 20, Stage::Serving)
        ]
    );
    // Not a state kind: nothing.
    assert!(ctx.current_state(EventKind::Obs).await.is_empty());
    let mut rx = ctx.subscribe_events(&[EventKind::Lifecycle]).await.unwrap();
    // The snapshot: the newest per target, in stream order.
    assert_eq!(next_stage(&mut rx).await, ("b".into(), 2, Stage::Offline));
    assert_eq!(next_stage(&mut rx).await, ("a".into(), 20, Stage::Serving));
    // Then live.
    publish(bus, lifecycle("b", 30, Stage::Online)).await;
    assert_eq!(next_stage(&mut rx).await, ("b".into(), 30, Stage::Online));
}

/// A service that starts after targets changed stage learns every target's current stage from
/// the capture first (the newest per target, never an older one), then live messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_subscribers_start_from_every_targets_current_state() {
    use aware_shared::config::AppConfig;
    use aware_shared::service::ServiceContext;

    let server = NatsServer::start().unwrap();
    let bus_cfg = cfg(server.url(), 120);
    let bus = Bus::connect(&bus_cfg, "js-state").await.unwrap();
    publish_stages(&bus).await;
    aware_tests::wait_captured(&server.url(), "AWARE", 4).await;
    let app = AppConfig {
        bus: bus_cfg.clone(),
        ..AppConfig::default()
    };
    let late_bus = Bus::connect(&bus_cfg, "js-state-late").await.unwrap();
    let ctx = ServiceContext::new(
        "late",
        late_bus,
        std::sync::Arc::new(app),
        tokio_util::sync::CancellationToken::new(),
    )
    .unwrap();
    assert_late_start_from_current_state(&ctx, &bus).await;
}

/// The same on the embedded bus, which retains the newest message of every state subject
/// (`Bus::in_process`): no capture, no server.
#[tokio::test]
async fn on_the_embedded_bus_late_subscribers_start_from_the_current_state() {
    use aware_shared::service::ServiceContext;

    let bus = Bus::in_process(16);
    publish_stages(&bus).await;
    let obs = samples()
        .into_iter()
        .find(|e| e.kind() == aware_bus_schemas::EventKind::Obs)
        .unwrap();
    publish(&bus, obs).await;
    let ctx = ServiceContext::new(
        "late",
        bus.clone(),
        std::sync::Arc::new(aware_shared::config::AppConfig::default()),
        tokio_util::sync::CancellationToken::new(),
    )
    .unwrap();
    assert_late_start_from_current_state(&ctx, &bus).await;
}

/// A service that cannot read its targets' current state at start-up (here the capture stream
/// is gone: deleted, or a server restarted without its JetStream storage) does not go on with
/// live messages only: it is not ready, says why (`/readyz`'s reason, a metric, a log), retries,
/// and reads the state once the stream is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_cannot_read_its_start_up_state_is_not_ready_and_says_why() {
    use aware_bus_schemas::EventKind;
    use aware_shared::config::AppConfig;
    use aware_shared::service::ServiceContext;

    let server = NatsServer::start().unwrap();
    let bus_cfg = cfg(server.url(), 120);
    let bus = Bus::connect(&bus_cfg, "js-unread").await.unwrap();
    let late_bus = Bus::connect(&bus_cfg, "js-unread-late").await.unwrap();
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.delete_stream("AWARE").await.unwrap();

    let app = AppConfig {
        bus: bus_cfg.clone(),
        ..AppConfig::default()
    };
    let ctx = ServiceContext::new(
        "late",
        late_bus,
        std::sync::Arc::new(app),
        tokio_util::sync::CancellationToken::new(),
    )
    .unwrap();
    ctx.ready.set(true);
    let reader = tokio::spawn({
        let ctx = ctx.clone();
        async move { ctx.current_state(EventKind::Lifecycle).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while ctx.ready.blockers().is_empty() {
        assert!(std::time::Instant::now() < deadline, "never blocked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!ctx.ready.get());
    let blockers = ctx.ready.blockers();
    assert_eq!(blockers.len(), 1, "{blockers:?}");
    let (key, reason) = &blockers[0];
    assert_eq!(key, "state:lifecycle");
    assert!(
        reason.contains("cannot read the current lifecycle state")
            && reason.contains("get the stream of the JetStream stream `AWARE`")
            && reason.contains("retrying in"),
        "{reason}"
    );
    let unread = || {
        ctx.metrics
            .state_unread
            .with_label_values(&["lifecycle"])
            .get()
    };
    assert_eq!(unread(), 1);
    assert!(
        ctx.metrics
            .state_read_failures
            .with_label_values(&["lifecycle"])
            .get()
            >= 1
    );
    assert!(!reader.is_finished(), "it keeps trying");

    // The stream is back with the targets' stages: the read succeeds and the service is ready.
    let aware_shared::bus::Bus::Nats(nats) = &bus else {
        panic!("a NATS bus")
    };
    nats.ensure_stream(&bus_cfg).await.unwrap();
    publish_stages(&bus).await;
    aware_tests::wait_captured(&server.url(), "AWARE", 4).await;
    let current = tokio::time::timeout(Duration::from_secs(40), reader)
        .await
        .expect("read once the stream is back")
        .unwrap();
    assert_eq!(current.len(), 2, "{current:?}");
    assert!(ctx.ready.blockers().is_empty());
    assert!(ctx.ready.get());
    assert_eq!(unread(), 0);
    // What the read found and how long it took, retries included.
    assert_eq!(
        ctx.metrics
            .state_restored
            .with_label_values(&["lifecycle"])
            .get(),
        2
    );
    let took = ctx
        .metrics
        .state_read_seconds
        .with_label_values(&["lifecycle"])
        .get();
    assert!(took >= 1.0 && took.is_finite(), "{took}");
}

/// Every target's current state outlives the capture's retention: the state bucket
/// (`bus.jetstream.state_bucket`, a JetStream key-value bucket, no age or size limit) keeps the
/// newest stage of each target after the capture stream has aged everything out, and a late
/// service reads it from there. `nats kv` tools read it too: one key per subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_current_state_outlives_the_captures_retention() {
    use aware_bus_schemas::{Event, EventKind, Stage};
    use aware_shared::config::AppConfig;
    use aware_shared::service::ServiceContext;

    let server = NatsServer::start().unwrap();
    let bus_cfg = cfg(server.url(), 1);
    let bus = Bus::connect(&bus_cfg, "js-kept").await.unwrap();
    publish_stages(&bus).await;
    bus.flush().await.unwrap();

    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let kv = js.get_key_value("AWARE_STATE").await.unwrap();
    let newest = kv
        .get("aware.v1.lifecycle.233.shop.a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        msgpack_field(&newest, "episode").unwrap().as_u64(),
        Some(20)
    );
    let mut capture = js.get_stream("AWARE").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while capture.info().await.unwrap().state.messages > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the capture never aged out"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let state = js.get_stream("KV_AWARE_STATE").await.unwrap();
    let info = state.cached_info();
    assert_eq!(info.config.max_messages_per_subject, 1);
    assert_eq!(info.config.max_age, Duration::ZERO);
    assert_eq!(info.state.messages, 2, "one value per target: {info:?}");

    let app = AppConfig {
        bus: bus_cfg.clone(),
        ..AppConfig::default()
    };
    let late_bus = Bus::connect(&bus_cfg, "js-kept-late").await.unwrap();
    let ctx = ServiceContext::new(
        "late",
        late_bus,
        std::sync::Arc::new(app),
        tokio_util::sync::CancellationToken::new(),
    )
    .unwrap();
    let current: Vec<_> = ctx
        .current_state(EventKind::Lifecycle)
        .await
        .into_iter()
        .map(|ev| match ev {
            Event::Lifecycle(l) => (l.target.name.clone(), l.episode, l.stage),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        current,
        vec![
            ("b".into(), 2, Stage::Offline),
            ("a".into(), 20, Stage::Serving)
        ]
    );
    // A kind that is not state is not kept: the aged-out capture has nothing.
    assert!(ctx.current_state(EventKind::Obs).await.is_empty());
}

/// The capture fills in the current state of targets the state bucket lacks (state published
/// before the bucket existed), and only then: while the bucket is older than everything the
/// capture holds, every publish wrote both and the capture is not read. Here a stage written to
/// the capture alone after the bucket was made (a raw publish, not through the bus) is not
/// taken; once the bucket is made again after it, it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capture_fills_in_only_state_older_than_the_bucket() {
    use aware_bus_schemas::Stage;

    let server = NatsServer::start().unwrap();
    let bus_cfg = cfg(server.url(), 120);
    let bus = Bus::connect(&bus_cfg, "js-fill").await.unwrap();
    publish(&bus, lifecycle("a", 3, Stage::Online)).await;
    let raw = async_nats::connect(server.url()).await.unwrap();
    let c = lifecycle("c", 5, Stage::Offline);
    raw.publish(
        subject::subject(c.kind(), c.target()).unwrap(),
        Bytes::from(encode_event(&c).unwrap()),
    )
    .await
    .unwrap();
    raw.flush().await.unwrap();
    aware_tests::wait_captured(&server.url(), "AWARE", 2).await;

    let read = || late_stages(&bus_cfg);
    assert_eq!(
        read().await,
        vec![("a".into(), 3)],
        "the capture is not read"
    );

    // The bucket made again (empty) after the capture's messages: both come from the capture.
    let js = async_nats::jetstream::new(raw.clone());
    js.delete_stream("KV_AWARE_STATE").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let aware_shared::bus::Bus::Nats(nats) = &bus else {
        panic!("a NATS bus")
    };
    nats.ensure_stream(&bus_cfg).await.unwrap();
    assert_eq!(
        read().await,
        vec![("a".into(), 3), ("c".into(), 5)],
        "state older than the bucket is filled in from the capture"
    );
}

/// A forgotten target's state (`Bus::forget_state`: a purge of its key) is not read back at
/// start, not even from a capture older than the bucket, which still holds its messages; `nats
/// kv` sees the key as purged. Other targets are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_targets_state_is_not_read_back() {
    use aware_bus_schemas::{EventKind, Stage};

    let server = NatsServer::start().unwrap();
    let bus_cfg = cfg(server.url(), 120);
    let bus = Bus::connect(&bus_cfg, "js-forget").await.unwrap();
    publish(&bus, lifecycle("a", 3, Stage::Online)).await;
    publish(&bus, lifecycle("b", 4, Stage::Offline)).await;
    let subject_a = subject::subject(
        EventKind::Lifecycle,
        &aware_bus_schemas::Target::new("shop", "a"),
    )
    .unwrap();
    bus.forget_state(&subject_a).await.unwrap();
    bus.flush().await.unwrap();
    aware_tests::wait_captured(&server.url(), "AWARE", 2).await;

    let raw = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(raw);
    let kv = js.get_key_value("AWARE_STATE").await.unwrap();
    assert!(kv.get(&subject_a).await.unwrap().is_none(), "purged");
    let read = || late_stages(&bus_cfg);
    assert_eq!(read().await, vec![("b".into(), 4)]);

    // With the capture older than the bucket (made again, then `a` forgotten again): the
    // capture fills in `b`, not `a`.
    js.delete_stream("KV_AWARE_STATE").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let aware_shared::bus::Bus::Nats(nats) = &bus else {
        panic!("a NATS bus")
    };
    nats.ensure_stream(&bus_cfg).await.unwrap();
    bus.forget_state(&subject_a).await.unwrap();
    bus.flush().await.unwrap();
    assert_eq!(read().await, vec![("b".into(), 4)]);
}

/// An upgrade across the slot token (ADR 0021): a state key an older release wrote
/// (`aware.v1.lifecycle.<ns>.<name>`) is read at start for a target without a key in the new
/// layout, a newer key wins over it, and forgetting the target purges both, so neither comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_keys_of_the_layout_before_the_slot_are_read_and_forgotten() {
    use aware_bus_schemas::{EventKind, Stage, Target};

    let server = NatsServer::start().unwrap();
    let bus_cfg = cfg(server.url(), 120);
    let bus = Bus::connect(&bus_cfg, "js-upgrade").await.unwrap();
    // The bucket exists (made by the first publish); `b` has a key in the new layout.
    publish(&bus, lifecycle("b", 4, Stage::Offline)).await;
    let raw = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(raw);
    let kv = js.get_key_value("AWARE_STATE").await.unwrap();
    // What an older release left: `a` only in the old layout, `b` in both (the old one older).
    for (name, episode, stage) in [("a", 7, Stage::Serving), ("b", 1, Stage::Online)] {
        let ev = lifecycle(name, episode, stage);
        let old = subject::unslotted_subject(EventKind::Lifecycle, ev.target()).unwrap();
        kv.put(&old, Bytes::from(encode_event(&ev).unwrap()))
            .await
            .unwrap();
    }
    assert_eq!(
        late_stages(&bus_cfg).await,
        vec![("a".into(), 7), ("b".into(), 4)]
    );
    bus.forget_target_state(EventKind::Lifecycle, &Target::new("shop", "a"))
        .await
        .unwrap();
    bus.flush().await.unwrap();
    assert_eq!(late_stages(&bus_cfg).await, vec![("b".into(), 4)]);
    let old_a =
        subject::unslotted_subject(EventKind::Lifecycle, &Target::new("shop", "a")).unwrap();
    assert!(kv.get(&old_a).await.unwrap().is_none(), "purged");
}

/// A sharded service reads only its own targets' state at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_reads_only_its_targets_state_at_start() {
    use aware_bus_schemas::{Event, EventKind, Stage};
    use aware_shared::config::{AppConfig, ShardConfig};
    use aware_shared::service::ServiceContext;

    let server = NatsServer::start().unwrap();
    let bus_cfg = cfg(server.url(), 120);
    let bus = Bus::connect(&bus_cfg, "js-shards").await.unwrap();
    let names: Vec<String> = (0..12).map(|i| format!("app-{i}")).collect();
    for n in &names {
        publish(&bus, lifecycle(n, 1, Stage::Offline)).await;
    }
    let mut seen = Vec::new();
    for index in 0..3 {
        let shard = ShardConfig { index, count: 3 };
        let app = AppConfig {
            bus: bus_cfg.clone(),
            shard,
            ..AppConfig::default()
        };
        let ctx = ServiceContext::new(
            "late",
            Bus::connect(&bus_cfg, "js-shard").await.unwrap(),
            std::sync::Arc::new(app),
            tokio_util::sync::CancellationToken::new(),
        )
        .unwrap();
        for ev in ctx.current_state(EventKind::Lifecycle).await {
            let Event::Lifecycle(l) = ev else {
                panic!("{ev:?}")
            };
            assert!(shard.owns(&l.target), "{} in shard {index}", l.target);
            seen.push(l.target.name);
        }
    }
    seen.sort();
    let mut want = names.clone();
    want.sort();
    assert_eq!(seen, want, "every target read by exactly one shard");
}

/// The stages a service starting now reads as its current state (`current_state`), as
/// (target name, episode), sorted.
async fn late_stages(bus_cfg: &BusConfig) -> Vec<(String, u64)> {
    use aware_bus_schemas::{Event, EventKind};
    use aware_shared::config::AppConfig;
    use aware_shared::service::ServiceContext;
    let app = AppConfig {
        bus: bus_cfg.clone(),
        ..AppConfig::default()
    };
    let late = Bus::connect(bus_cfg, "js-late").await.unwrap();
    let ctx = ServiceContext::new(
        "late",
        late,
        std::sync::Arc::new(app),
        tokio_util::sync::CancellationToken::new(),
    )
    .unwrap();
    let mut stages: Vec<(String, u64)> = ctx
        .current_state(EventKind::Lifecycle)
        .await
        .into_iter()
        .map(|ev| match ev {
            Event::Lifecycle(l) => (l.target.name.clone(), l.episode),
            other => panic!("{other:?}"),
        })
        .collect();
    stages.sort();
    stages
}

/// The controller's purge of old deregistrations on nats-server: the state bucket's key goes, so
/// a service starting later reads no state for the deleted target; a recent deregistration and a
/// registered target keep theirs, and the purge holds against the capture.
#[tokio::test]
async fn the_controller_forgets_old_deregistrations_in_the_state_bucket() {
    use aware_bus_schemas::{Event, EventKind, Target};
    use aware_shared::config::AppConfig;
    use aware_shared::service::ServiceContext;
    use aware_shared::testkit::registration;

    let server = NatsServer::start().unwrap();
    let bus_cfg = cfg(server.url(), 120);
    let app = std::sync::Arc::new(AppConfig {
        bus: bus_cfg.clone(),
        ..AppConfig::default()
    });
    let context = |bus: Bus, name: &'static str| {
        ServiceContext::new(
            name,
            bus,
            app.clone(),
            tokio_util::sync::CancellationToken::new(),
        )
        .unwrap()
    };
    let controller = context(
        Bus::connect(&bus_cfg, "controller").await.unwrap(),
        "controller",
    );
    let now = aware_bus_schemas::now_ms();
    let day = 86_400_000;
    let (old, recent, kept) = (
        Target::new("shop", "old"),
        Target::new("shop", "recent"),
        Target::new("shop", "kept"),
    );
    let spec =
        aware_shared::registry::to_registered(&aware_shared::spec::TargetSpec::new(&kept), None);
    for r in [
        registration(&old, now - 9 * day, None),
        registration(&recent, now - day, None),
        registration(&kept, now - 30 * day, Some(spec)),
    ] {
        publish(&controller.bus, Event::Registration(r)).await;
    }
    aware_tests::wait_captured(&server.url(), "AWARE", 3).await;
    let n = aware_controller::controller::forget_old_deregistrations(&controller, 8 * day, now)
        .await
        .unwrap();
    assert_eq!(n, 1);
    let late = context(Bus::connect(&bus_cfg, "late").await.unwrap(), "late");
    let mut left: Vec<String> = late
        .current_state(EventKind::Target)
        .await
        .iter()
        .map(|e| e.target().name.clone())
        .collect();
    left.sort();
    assert_eq!(left, ["kept", "recent"]);
}
