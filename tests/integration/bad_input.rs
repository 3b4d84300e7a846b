//! Bad input changes nothing, or is at least counted: messages the NATS client drops for a slow
//! consumer are counted for the service that consumes them.

use std::sync::Arc;
use std::time::Duration;

use aware_bus_schemas::{subject, Event, EventKind};
use aware_shared::bus::Bus;
use aware_shared::config::AppConfig;
use aware_shared::service::ServiceContext;
use aware_tests::NatsServer;

/// A service that takes no messages (its buffer of `bus.channel_capacity` = 4 fills at once)
/// while 500 `obs` arrive: the client drops what does not fit and reports each drop; they are
/// counted in the service's `aware_bus_slow_consumer_drops_total{event="obs"}` (they used to be
/// counted nowhere), and nothing else is attributed to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_drops_are_counted_for_the_service() {
    let server = NatsServer::start().unwrap();
    let mut cfg = AppConfig::default();
    cfg.bus.url = server.url();
    cfg.bus.channel_capacity = 4;
    cfg.bus.jetstream.enabled = false;
    let bus = Bus::connect(&cfg.bus, "slow").await.unwrap();
    let ctx = ServiceContext::new(
        "recorder",
        bus.clone(),
        Arc::new(cfg.clone()),
        tokio_util::sync::CancellationToken::new(),
    )
    .unwrap();
    let _held = ctx.subscribe_events(&[EventKind::Obs]).await.unwrap();
    let publisher = Bus::connect(&cfg.bus, "publisher").await.unwrap();
    let obs = aware_bus_schemas::generated::samples()
        .into_iter()
        .find(|e| matches!(e, Event::Obs(_)))
        .unwrap();
    let subj = subject::subject(obs.kind(), obs.target()).unwrap();
    let bytes = aware_bus_schemas::encode_event(&obs).unwrap();
    for _ in 0..500 {
        publisher
            .publish(&subj, bytes.clone().into())
            .await
            .unwrap();
    }
    publisher.flush().await.unwrap();
    let drops = ctx.metrics.slow_consumer_drops.with_label_values(&["obs"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while drops.get() < 100 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} drops counted",
            drops.get()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // At most what was sent, less what the two buffers (the client's and the service's) hold.
    assert!(drops.get() <= 500 - 4, "{}", drops.get());
    assert_eq!(
        ctx.metrics
            .slow_consumer_drops
            .with_label_values(&["action"])
            .get(),
        0
    );
    let Bus::Nats(nats) = &bus else {
        panic!("a NATS bus")
    };
    assert_eq!(nats.slow_consumers().unattributed(), 0);
}
