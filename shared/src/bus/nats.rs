//! The NATS bus (async-nats): reconnect with exponential backoff, publish errors surfaced, and a
//! JetStream stream capturing `aware.v1.>` so external tools can replay recent history.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;

use super::pattern::{validate_subject, Pattern};
use super::{BusError, Message};
use crate::config::{BusConfig, StorageKind};

/// Exponential backoff used for the initial connection and for reconnects.
pub fn backoff(attempt: usize, max: Duration) -> Duration {
    let exp = u32::try_from(attempt.min(16)).unwrap_or(16);
    Duration::from_millis(100u64.saturating_mul(1u64 << exp)).min(max)
}

/// `url` with any credentials masked, for logs and errors: `nats://user:secret@host` →
/// `nats://user:***@host`, `nats://token@host` → `nats://***@host` (each URL of a
/// comma-separated list).
pub fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|one| {
            let (scheme, rest) = match one.find("://") {
                Some(i) => one.split_at(i + 3),
                None => ("", one),
            };
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                None => one.to_string(),
                Some(at) => {
                    let userinfo = &rest[..at];
                    let masked = match userinfo.split_once(':') {
                        Some((user, _)) => format!("{user}:***"),
                        None => "***".to_string(),
                    };
                    format!("{scheme}{masked}{}", &rest[at..])
                }
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn storage(kind: StorageKind) -> jetstream::stream::StorageType {
    match kind {
        StorageKind::File => jetstream::stream::StorageType::File,
        StorageKind::Memory => jetstream::stream::StorageType::Memory,
    }
}

/// The capture's streams, one per partition (`bus.jetstream.partitions`): partition `k`
/// keeps every event of its slots for `max_age_secs`, in its share of `max_bytes` by slots.
pub fn capture_stream_configs(cfg: &BusConfig) -> Vec<jetstream::stream::Config> {
    let js = &cfg.jetstream;
    (0..js.partitions.max(1))
        .map(|k| jetstream::stream::Config {
            name: js.partition_stream(k),
            subjects: js.partition_subjects(k),
            max_age: Duration::from_secs(js.max_age_secs),
            max_bytes: js.partition_max_bytes(k),
            storage: storage(js.storage),
            num_replicas: js.replicas,
            description: Some(if js.partitions <= 1 {
                "AWARE events (aware.v1.>) for replay by external tools".into()
            } else {
                format!(
                    "AWARE events of the slots s with s mod {} = {k}, for replay by external tools",
                    js.partitions
                )
            }),
            ..Default::default()
        })
        .collect()
}

/// The stream of the state bucket (`bus.jetstream.state_bucket`): a JetStream key-value bucket
/// (`KV_<bucket>`, subjects `$KV.<bucket>.>`, one value per key, so `nats kv` reads it) whose
/// keys are the subjects of the state kinds (`lifecycle`, `model`, `embedding`, `target`) and
/// whose values are each subject's newest message. No age or size limit: it holds one message
/// per target and kind.
pub fn state_stream_config(cfg: &BusConfig) -> jetstream::stream::Config {
    let js = &cfg.jetstream;
    let bucket = &js.state_bucket;
    jetstream::stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_age: Duration::ZERO,
        max_bytes: -1,
        storage: storage(js.storage),
        num_replicas: js.replicas,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: jetstream::stream::DiscardPolicy::New,
        description: Some(
            "AWARE: every target's current state (the newest lifecycle, model, embedding and target message per target)".into(),
        ),
        ..Default::default()
    }
}

/// Whether `subject` carries a state kind ([`aware_bus_schemas::EventKind::is_state`]).
pub fn is_state_subject(subject: &str) -> bool {
    subject
        .split('.')
        .nth(2)
        .and_then(aware_bus_schemas::EventKind::from_token)
        .is_some_and(|k| k.is_state())
}

/// The subject of `subject`'s key in the state bucket `bucket`.
pub fn state_key_subject(bucket: &str, subject: &str) -> String {
    format!("$KV.{bucket}.{subject}")
}

/// A connection to a NATS server; clones share it.
#[derive(Clone)]
pub struct NatsBus {
    client: async_nats::Client,
    url: String,
    state: Arc<State>,
}

/// What the clones of one connection share besides the client.
struct State {
    flush_timeout: Duration,
    /// With JetStream on: the configuration the stream is (re)declared with.
    capture: Option<BusConfig>,
    /// The client's connection count when the stream was last declared: after a reconnection
    /// the next publish declares it again, since a server that restarted without its JetStream
    /// storage (memory storage, a lost volume) has none and would capture nothing until every
    /// service restarted. (The client counts a connection before it reports itself connected,
    /// so no publish on the new connection comes first.)
    declared_for: AtomicU64,
    /// When the stream was last (re)declared or tried: at most one try a second.
    last_declare: Mutex<Option<Instant>>,
    /// Messages the client dropped for slow consumers, by subscription.
    slow: crate::slow_consumers::SlowConsumers,
    /// With `bus.jetstream.ack_publishes`: what acknowledged publishes go through.
    acked: Option<Acked>,
}

/// Acknowledged publishes (`bus.jetstream.ack_publishes`).
struct Acked {
    js: jetstream::Context,
    timeout: Duration,
    /// This connection's message ids: a prefix unique to the process and a counter.
    prefix: String,
    next: AtomicU64,
}

impl Acked {
    /// Publishes `payload` on `subject` through JetStream until a stream acknowledges it: each
    /// try carries the same `Nats-Msg-Id`, so a try whose acknowledgement was lost is not
    /// stored twice. Fails after `timeout`.
    async fn publish(
        &self,
        subject: &str,
        extra: &async_nats::HeaderMap,
        payload: Bytes,
    ) -> Result<(), BusError> {
        let id = format!(
            "{}-{}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut attempt = 0usize;
        loop {
            let mut headers = extra.clone();
            headers.insert("Nats-Msg-Id", id.as_str());
            let reason = match self
                .js
                .publish_with_headers(subject.to_string(), headers, payload.clone())
                .await
            {
                Ok(ack) => match ack.await {
                    Ok(_) => return Ok(()),
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            let wait = backoff(attempt, Duration::from_secs(2));
            if tokio::time::Instant::now() + wait > deadline {
                return Err(BusError::Publish {
                    subject: subject.to_string(),
                    reason: format!(
                        "not stored by JetStream within bus.jetstream.ack_timeout_ms ({} ms): {reason}",
                        self.timeout.as_millis()
                    ),
                });
            }
            if attempt == 0 {
                tracing::warn!(subject, error = %reason, "publish not acknowledged by JetStream; retrying until stored");
            }
            attempt += 1;
            tokio::time::sleep(wait).await;
        }
    }
}

impl NatsBus {
    /// Connects, retrying with backoff until `bus.connect_timeout_ms` has elapsed, then makes sure
    /// the JetStream stream exists when `bus.jetstream.enabled`.
    pub async fn connect(cfg: &BusConfig, client_name: &str) -> Result<Self, BusError> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(cfg.connect_timeout_ms);
        let max_delay = Duration::from_millis(cfg.reconnect_max_delay_ms);
        let mut attempt = 0usize;
        let slow = crate::slow_consumers::SlowConsumers::default();
        // Credentials out of the URL or from `bus.auth` (files read once), TLS files checked: a
        // mistake there is reported now, naming the key, instead of after every retry.
        let resolved =
            super::auth::resolve(&cfg.url, &cfg.auth, &cfg.tls).map_err(|e| BusError::Connect {
                url: redact_url(&cfg.url),
                reason: e.to_string(),
            })?;
        let client = loop {
            let opts = async_nats::ConnectOptions::new()
                .name(client_name)
                .custom_inbox_prefix(&cfg.inbox_prefix)
                .subscription_capacity(cfg.channel_capacity)
                .connection_timeout(Duration::from_millis(
                    cfg.connect_timeout_ms.clamp(100, 5_000),
                ))
                .max_reconnects(None)
                // The servers of `bus.url` in the order listed, not shuffled: the first is the
                // one a service prefers (the server on its own machine, docs/operations.md).
                .retain_servers_order()
                .reconnect_delay_callback(move |n| backoff(n, max_delay))
                .event_callback({
                    let slow = slow.clone();
                    move |event| {
                    let slow = slow.clone();
                    async move {
                    match event {
                        async_nats::Event::SlowConsumer(sid) => {
                            slow.record(sid);
                            tracing::warn!(sid, "nats: a subscription's buffer is full: message dropped (slow consumer)");
                        }
                        async_nats::Event::Connected => tracing::info!("nats connected"),
                        async_nats::Event::Disconnected => {
                            tracing::warn!("nats disconnected; reconnecting with backoff")
                        }
                        other => tracing::warn!(event = %other, "nats event"),
                    }
                    }
                    }
                });
            let opts = resolved.apply(opts).map_err(|e| BusError::Connect {
                url: redact_url(&cfg.url),
                reason: e.to_string(),
            })?;
            match opts.connect(resolved.servers.clone()).await {
                Ok(c) => break c,
                // Wrong credentials do not get better by retrying.
                Err(e)
                    if matches!(
                        e.kind(),
                        async_nats::ConnectErrorKind::AuthorizationViolation
                            | async_nats::ConnectErrorKind::Authentication
                    ) =>
                {
                    return Err(BusError::Connect {
                        url: redact_url(&cfg.url),
                        reason: format!(
                            "the server refused the credentials ({}): {e}; check `bus.url` \
                             and `bus.auth`",
                            resolved.method()
                        ),
                    });
                }
                Err(e) => {
                    let wait = backoff(attempt, max_delay);
                    if tokio::time::Instant::now() + wait > deadline {
                        return Err(BusError::Connect {
                            url: redact_url(&cfg.url),
                            reason: e.to_string(),
                        });
                    }
                    tracing::warn!(url = %redact_url(&cfg.url), attempt, error = %e, "nats connect failed; retrying");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
            }
        };
        let acked = (cfg.jetstream.enabled && cfg.jetstream.ack_publishes).then(|| {
            let started = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            Acked {
                js: jetstream::new(client.clone()),
                timeout: Duration::from_millis(cfg.jetstream.ack_timeout_ms),
                prefix: format!("{client_name}-{}-{started:x}", std::process::id()),
                next: AtomicU64::new(0),
            }
        });
        let state = Arc::new(State {
            flush_timeout: Duration::from_millis(cfg.flush_timeout_ms.max(1)),
            capture: cfg.jetstream.enabled.then(|| cfg.clone()),
            declared_for: AtomicU64::new(0),
            last_declare: Mutex::new(None),
            slow,
            acked,
        });
        let bus = NatsBus {
            client,
            url: cfg.url.clone(),
            state,
        };
        if cfg.jetstream.enabled {
            let connects = bus.connects();
            bus.ensure_stream(cfg).await?;
            bus.state.declared_for.store(connects, Ordering::Relaxed);
        }
        Ok(bus)
    }

    /// Creates or updates the streams that capture every AWARE subject (one per partition,
    /// [`capture_stream_configs`]), and the key-value bucket of every target's current state
    /// ([`state_stream_config`]).
    pub async fn ensure_stream(&self, cfg: &BusConfig) -> Result<(), BusError> {
        for capture in capture_stream_configs(cfg) {
            self.ensure(capture, "capture stream").await?;
        }
        self.ensure(state_stream_config(cfg), "state bucket").await
    }

    /// Declares one stream: read first, create when missing, update only when the settings
    /// differ. With per-service permissions every identity may create it but only its owner
    /// (`aware nats-config`: the recorder) may change it.
    async fn ensure(&self, config: jetstream::stream::Config, what: &str) -> Result<(), BusError> {
        let js = jetstream::new(self.client.clone());
        let name = config.name.clone();
        let err = |e: String| BusError::JetStream {
            stream: name.clone(),
            reason: format!(
                "{e} (is JetStream enabled on the server, e.g. `nats-server -js`? \
                 set bus.jetstream.enabled=false to run without replay)"
            ),
        };
        match js.get_stream(&name).await {
            Ok(stream) => {
                let have = &stream.cached_info().config;
                let same = have.subjects == config.subjects
                    && have.max_age == config.max_age
                    && have.max_bytes == config.max_bytes
                    && have.storage == config.storage
                    && have.num_replicas == config.num_replicas
                    // The server reports "unlimited" as -1 however it was asked for.
                    && have.max_messages_per_subject.max(0)
                        == config.max_messages_per_subject.max(0);
                if !same {
                    if let Err(e) = js.update_stream(config).await {
                        // It exists and captures; only its settings stay as they were.
                        tracing::warn!(stream = %name, what, error = %e, "the stream's settings differ from bus.jetstream and cannot be updated (not this identity's to change?); using it as it is");
                    }
                }
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    jetstream::context::GetStreamErrorKind::JetStream(j)
                        if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
                ) =>
            {
                match js.create_stream(config).await {
                    Ok(_) => Ok(()),
                    // Another service created it meanwhile.
                    Err(create) => js
                        .get_stream(&name)
                        .await
                        .map(drop)
                        .map_err(|_| err(create.to_string())),
                }
            }
            Err(e) => Err(err(e.to_string())),
        }
    }

    /// Connections made so far (the first one included).
    fn connects(&self) -> u64 {
        self.client.statistics().connects.load(Ordering::Relaxed)
    }

    /// Declares the capture stream again after a reconnection (see `declared_for`), before the
    /// publish that follows it; a failure is logged and retried a second later at the earliest.
    async fn redeclare_stream(&self) {
        let Some(cfg) = &self.state.capture else {
            return;
        };
        let connects = self.connects();
        if self.state.declared_for.load(Ordering::Relaxed) == connects {
            return;
        }
        {
            let Ok(mut last) = self.state.last_declare.lock() else {
                return;
            };
            if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                return;
            }
            *last = Some(Instant::now());
        }
        match self.ensure_stream(cfg).await {
            Ok(()) => {
                self.state.declared_for.store(connects, Ordering::Relaxed);
                tracing::info!(stream = %cfg.jetstream.stream, "capture stream declared after reconnecting");
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot declare the capture stream after reconnecting; retrying")
            }
        }
    }

    pub async fn publish(&self, subject: &str, payload: Bytes) -> Result<(), BusError> {
        validate_subject(subject)?;
        self.redeclare_stream().await;
        let kv = self
            .state
            .capture
            .as_ref()
            .filter(|_| is_state_subject(subject))
            .map(|cfg| state_key_subject(&cfg.jetstream.state_bucket, subject));
        if let Some(acked) = &self.state.acked {
            let none = async_nats::HeaderMap::new();
            acked.publish(subject, &none, payload.clone()).await?;
            if let Some(kv) = kv {
                acked.publish(&kv, &none, payload).await?;
            }
            return Ok(());
        }
        let err = |e: async_nats::PublishError| BusError::Publish {
            subject: subject.to_string(),
            reason: e.to_string(),
        };
        self.client
            .publish(subject.to_string(), payload.clone())
            .await
            .map_err(err)?;
        // The target's current state, kept apart from the capture's age and size limits.
        if let Some(kv) = kv {
            self.client.publish(kv, payload).await.map_err(err)?;
        }
        Ok(())
    }

    /// Purges the state bucket's key of the state subject `subject` (see
    /// [`super::Bus::forget_state`]): a publish to the key's subject with no payload and the
    /// headers `KV-Operation: PURGE` and `Nats-Rollup: sub`, which makes the stream drop every
    /// earlier value of the key and keep only this marker (what `nats kv purge` does). The
    /// start-up read takes a purged key as known and empty, so the capture does not fill it in.
    /// Without the capture (no bucket) or for a subject that is not state, nothing to do.
    pub async fn forget_state(&self, subject: &str) -> Result<(), BusError> {
        validate_subject(subject)?;
        let Some(cfg) = self
            .state
            .capture
            .as_ref()
            .filter(|_| is_state_subject(subject))
        else {
            return Ok(());
        };
        let key = state_key_subject(&cfg.jetstream.state_bucket, subject);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("KV-Operation", "PURGE");
        headers.insert("Nats-Rollup", "sub");
        if let Some(acked) = &self.state.acked {
            return acked.publish(&key, &headers, Bytes::new()).await;
        }
        self.client
            .publish_with_headers(key, headers, Bytes::new())
            .await
            .map_err(|e| BusError::Publish {
                subject: subject.to_string(),
                reason: e.to_string(),
            })
    }

    pub async fn subscribe(&self, pattern: &str) -> Result<async_nats::Subscriber, BusError> {
        Pattern::parse(pattern)?;
        self.client
            .subscribe(pattern.to_string())
            .await
            .map_err(|e| BusError::Subscribe {
                pattern: pattern.to_string(),
                reason: e.to_string(),
            })
    }

    /// Waits until the server has received everything published, at most `bus.flush_timeout_ms`:
    /// while the server is unreachable the client only reconnects, and an unbounded flush would
    /// keep a stopping service from ever exiting.
    pub async fn flush(&self) -> Result<(), BusError> {
        let reason = match tokio::time::timeout(self.state.flush_timeout, self.client.flush()).await
        {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!(
                "not confirmed within bus.flush_timeout_ms ({} ms): is the server reachable?",
                self.state.flush_timeout.as_millis()
            ),
        };
        Err(BusError::Publish {
            subject: "<flush>".to_string(),
            reason,
        })
    }

    /// The slow-consumer drops of this connection (see [`crate::slow_consumers`]).
    pub fn slow_consumers(&self) -> &crate::slow_consumers::SlowConsumers {
        &self.state.slow
    }

    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The URL as configured, credentials included (use [`Self::redacted_url`] in logs).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL with credentials masked.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// Whether publishes wait until a stream has stored them (`bus.jetstream.ack_publishes`).
    pub fn acks_publishes(&self) -> bool {
        self.state.acked.is_some()
    }

    /// The underlying client, for JetStream consumers and the object store.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }
}

pub(super) async fn next(sub: &mut async_nats::Subscriber) -> Option<Message> {
    sub.next().await.map(|m| Message {
        subject: std::sync::Arc::from(m.subject.as_str()),
        payload: m.payload,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn credentials_never_reach_logs() {
        use super::redact_url;
        assert_eq!(
            redact_url("nats://aware:s3cret@nats:4222"),
            "nats://aware:***@nats:4222"
        );
        assert_eq!(
            redact_url("nats://tok3n@nats:4222/x"),
            "nats://***@nats:4222/x"
        );
        assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(
            redact_url("nats://a:b@n1:4222,nats://a:b@n2:4222"),
            "nats://a:***@n1:4222,nats://a:***@n2:4222"
        );
    }

    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let max = Duration::from_secs(5);
        assert_eq!(backoff(0, max), Duration::from_millis(100));
        assert_eq!(backoff(1, max), Duration::from_millis(200));
        assert_eq!(backoff(3, max), Duration::from_millis(800));
        assert_eq!(backoff(10, max), max);
        assert_eq!(backoff(usize::MAX, max), max);
    }
}
