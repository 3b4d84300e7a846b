//! The service runtime: context (bus, config, metrics, readiness, shutdown), typed publishing,
//! decoded intake of bus events, and signal handling.

use std::sync::Arc;

use aware_bus_schemas::{self as schemas, subject, BusMessage, Event, EventKind};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::bus::{Bus, BusError};
use crate::config::AppConfig;
use crate::telemetry::{Readiness, ServiceMetrics, TelemetryError};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Encode(#[from] schemas::EncodeError),
    #[error(transparent)]
    Subject(#[from] subject::SubjectError),
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    Other(String),
}

/// Everything a running service needs; cheap to clone.
#[derive(Clone)]
pub struct ServiceContext {
    pub name: &'static str,
    pub bus: Bus,
    pub config: Arc<AppConfig>,
    pub metrics: ServiceMetrics,
    pub ready: Readiness,
    pub shutdown: CancellationToken,
}

impl ServiceContext {
    pub fn new(
        name: &'static str,
        bus: Bus,
        config: Arc<AppConfig>,
        shutdown: CancellationToken,
    ) -> Result<Self, ServiceError> {
        Ok(ServiceContext {
            name,
            bus,
            config,
            metrics: ServiceMetrics::new(name)?,
            ready: Readiness::default(),
            shutdown,
        })
    }

    /// Encodes and publishes a message on its subject, counting it (or the failure).
    pub async fn publish<M: BusMessage>(&self, msg: &M) -> Result<(), ServiceError> {
        let kind = M::KIND.as_str();
        let res = async {
            let subject = subject::subject(M::KIND, msg.target())?;
            let payload = schemas::encode(msg)?;
            self.bus.publish(&subject, Bytes::from(payload)).await?;
            Ok::<_, ServiceError>(())
        }
        .await;
        match &res {
            Ok(()) => self.metrics.messages_out.with_label_values(&[kind]).inc(),
            Err(e) => {
                self.metrics.publish_errors.with_label_values(&[kind]).inc();
                tracing::error!(service = self.name, event = kind, target = %msg.target(), error = %e, "publish failed");
            }
        }
        res
    }

    /// Publishes any event.
    pub async fn publish_event(&self, ev: &Event) -> Result<(), ServiceError> {
        match ev {
            Event::Obs(m) => self.publish(m).await,
            Event::Action(m) => self.publish(m).await,
            Event::Applied(m) => self.publish(m).await,
            Event::Episode(m) => self.publish(m).await,
            Event::Lifecycle(m) => self.publish(m).await,
            Event::Embedding(m) => self.publish(m).await,
            Event::Model(m) => self.publish(m).await,
            Event::Registration(m) => self.publish(m).await,
        }
    }

    /// Subscribes to `kinds` for every target and yields decoded events. Malformed messages are
    /// counted (`decode_errors_total`) and dropped with a warning; they never end the intake.
    ///
    /// For the kinds that carry a target's current state ([`is_state_kind`]: `lifecycle`,
    /// `model`, `embedding`, `target`) on NATS with the JetStream capture on, or on the embedded
    /// bus (which retains them), the newest message of every target comes first, then the live ones: a service that starts (or
    /// restarts) after a target's last stage change, model or registration still learns it. The
    /// live subscription is opened before the snapshot is read and its messages wait until the
    /// snapshot is delivered, so nothing is missed and nothing older overtakes something newer
    /// (a message can arrive twice; every consumer of these kinds is idempotent).
    pub async fn subscribe_events(
        &self,
        kinds: &[EventKind],
    ) -> Result<mpsc::Receiver<Event>, ServiceError> {
        let (tx, rx) = mpsc::channel(self.config.bus.channel_capacity);
        for &kind in kinds {
            let mut sub = self.bus.subscribe(&subject::kind_filter(kind)).await?;
            let snapshot = if is_state_kind(kind) {
                self.last_per_target(kind).await
            } else {
                Vec::new()
            };
            let tx = tx.clone();
            let ctx = self.clone();
            tokio::spawn(async move {
                for (subj, payload) in snapshot {
                    let Some(ev) = ctx.decode(kind, &subj, &payload) else {
                        continue;
                    };
                    if tx.send(ev).await.is_err() {
                        return;
                    }
                }
                loop {
                    let msg = tokio::select! {
                        _ = ctx.shutdown.cancelled() => break,
                        m = sub.next() => match m { Some(m) => m, None => break },
                    };
                    let Some(ev) = ctx.decode(kind, &msg.subject, &msg.payload) else {
                        continue;
                    };
                    if tx.send(ev).await.is_err() {
                        break;
                    }
                }
            });
        }
        Ok(rx)
    }

    /// The newest captured event of `kind` for every target (see [`Self::subscribe_events`]):
    /// what a restarted service reads to restore state before it takes messages. On NATS this
    /// is the JetStream capture (empty with the capture off); on the embedded bus, the newest
    /// message of each state subject published on it so far.
    pub async fn current_state(&self, kind: EventKind) -> Vec<Event> {
        self.last_per_target(kind)
            .await
            .into_iter()
            .filter_map(|(subj, payload)| self.decode(kind, &subj, &payload))
            .collect()
    }

    /// The newest captured message of `kind` for every target (subject, payload), in stream
    /// order (the embedded bus: its retained messages); empty with the capture off, or when the stream cannot be read
    /// (logged: the service then learns state from live messages only).
    async fn last_per_target(&self, kind: EventKind) -> Vec<(String, Bytes)> {
        use futures::StreamExt;
        if let Some(retained) = self.bus.retained(&subject::kind_filter(kind)) {
            return match retained {
                Ok(ms) => ms
                    .into_iter()
                    .map(|m| (m.subject.to_string(), m.payload))
                    .collect(),
                Err(e) => {
                    tracing::warn!(service = self.name, event = kind.as_str(), error = %e, "cannot read the retained state of the embedded bus; live messages only");
                    Vec::new()
                }
            };
        }
        let Bus::Nats(nats) = &self.bus else {
            return Vec::new();
        };
        if !self.config.bus.jetstream.enabled {
            return Vec::new();
        }
        let stream_name = self.config.bus.jetstream.stream.clone();
        let read = async {
            let js = async_nats::jetstream::new(nats.client().clone());
            let stream = js
                .get_stream(&stream_name)
                .await
                .map_err(|e| e.to_string())?;
            let mut consumer = stream
                .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                    filter_subject: subject::kind_filter(kind),
                    deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::LastPerSubject,
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            let pending = consumer
                .info()
                .await
                .map_err(|e| e.to_string())?
                .num_pending;
            let mut out = Vec::new();
            if pending == 0 {
                return Ok(out);
            }
            let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
            while let Some(m) = messages.next().await {
                let m = m.map_err(|e| e.to_string())?;
                let remaining = m.info().map(|i| i.pending).unwrap_or(0);
                out.push((m.subject.to_string(), m.payload.clone()));
                if remaining == 0 {
                    break;
                }
            }
            Ok::<_, String>(out)
        };
        match tokio::time::timeout(std::time::Duration::from_secs(10), read).await {
            Ok(Ok(out)) => {
                if !out.is_empty() {
                    tracing::info!(
                        service = self.name,
                        event = kind.as_str(),
                        targets = out.len(),
                        "current state read from the JetStream capture"
                    );
                }
                out
            }
            Ok(Err(e)) => {
                tracing::warn!(service = self.name, event = kind.as_str(), stream = %stream_name, error = %e, "cannot read the current state from JetStream; live messages only");
                Vec::new()
            }
            Err(_) => {
                tracing::warn!(service = self.name, event = kind.as_str(), stream = %stream_name, "reading the current state from JetStream timed out; live messages only");
                Vec::new()
            }
        }
    }

    /// Like [`Self::subscribe_events`], but on NATS reads the JetStream stream in stream order
    /// from `start_seq` (0: from the oldest message kept) and yields each event with its stream
    /// sequence, so a consumer that persists how far it got resumes without losing anything.
    /// On the embedded bus (nothing to replay) it is a live subscription and sequences are `None`.
    pub async fn subscribe_replay(
        &self,
        kinds: &[EventKind],
        start_seq: u64,
    ) -> Result<mpsc::Receiver<(Event, Option<u64>)>, ServiceError> {
        use futures::StreamExt;
        let (tx, rx) = mpsc::channel(self.config.bus.channel_capacity);
        let nats = match &self.bus {
            Bus::InProc(_) => {
                let mut live = self.subscribe_events(kinds).await?;
                tokio::spawn(async move {
                    while let Some(ev) = live.recv().await {
                        if tx.send((ev, None)).await.is_err() {
                            break;
                        }
                    }
                });
                return Ok(rx);
            }
            Bus::Nats(n) => n.clone(),
        };
        let js_err = |e: String| {
            ServiceError::Bus(BusError::JetStream {
                stream: self.config.bus.jetstream.stream.clone(),
                reason: e,
            })
        };
        let js = async_nats::jetstream::new(nats.client().clone());
        let stream = js
            .get_stream(&self.config.bus.jetstream.stream)
            .await
            .map_err(|e| js_err(e.to_string()))?;
        let deliver_policy = if start_seq > 0 {
            async_nats::jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start_seq,
            }
        } else {
            async_nats::jetstream::consumer::DeliverPolicy::All
        };
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                filter_subject: subject::ALL.to_string(),
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|e| js_err(e.to_string()))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| js_err(e.to_string()))?;
        let kinds: Vec<EventKind> = kinds.to_vec();
        let ctx = self.clone();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    _ = ctx.shutdown.cancelled() => break,
                    m = messages.next() => m,
                };
                let m = match next {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => {
                        tracing::warn!(service = ctx.name, error = %e, "replay consumer error; it resumes by itself");
                        continue;
                    }
                    None => break,
                };
                let Ok(parsed) = subject::parse(m.subject.as_str()) else {
                    continue;
                };
                if !kinds.contains(&parsed.kind) {
                    continue;
                }
                let seq = m.info().ok().map(|i| i.stream_sequence);
                let Some(ev) = ctx.decode(parsed.kind, m.subject.as_str(), &m.payload) else {
                    continue;
                };
                if tx.send((ev, seq)).await.is_err() {
                    break;
                }
            }
        });
        Ok(rx)
    }

    /// Decodes one received message, counting it as received or as a decode error.
    pub fn decode(&self, kind: EventKind, subj: &str, payload: &[u8]) -> Option<Event> {
        let label = kind.as_str();
        let fail = |reason: String| {
            self.metrics.decode_errors.with_label_values(&[label]).inc();
            tracing::warn!(service = self.name, subject = subj, bytes = payload.len(), %reason, "dropping malformed message");
            None
        };
        let parsed = match subject::parse(subj) {
            Ok(p) => p,
            Err(e) => return fail(e.to_string()),
        };
        match schemas::decode_event(kind, payload) {
            Ok(ev) if ev.target() == &parsed.target => {
                self.metrics.messages_in.with_label_values(&[label]).inc();
                Some(ev)
            }
            Ok(ev) => fail(format!(
                "message for {} published on the subject of {}",
                ev.target(),
                parsed.target
            )),
            Err(e) => fail(e.to_string()),
        }
    }
}

/// Kinds whose newest message per target is that target's current state (stage, weights,
/// embedding, registration); [`ServiceContext::subscribe_events`] starts them from a snapshot.
pub fn is_state_kind(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::Lifecycle | EventKind::Model | EventKind::Embedding | EventKind::Target
    )
}

/// Cancels `token` on SIGINT or SIGTERM.
///
/// The handlers are installed before this returns, not when the spawned task is first polled:
/// a signal that arrives right after start-up (a rollout, a test stopping the process as soon
/// as it listens) shuts down cleanly instead of killing the process with the default action.
pub fn cancel_on_signal(token: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let handlers = signal(SignalKind::interrupt())
            .and_then(|int| Ok((int, signal(SignalKind::terminate())?)));
        match handlers {
            Ok((mut int, mut term)) => {
                tokio::spawn(async move {
                    tokio::select! {
                        _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
                        _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
                    }
                    token.cancel();
                });
            }
            Err(e) => tracing::error!(error = %e, "cannot listen for SIGINT and SIGTERM"),
        }
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        match tokio::signal::ctrl_c().await {
            Ok(()) => {
                tracing::info!("SIGINT received, shutting down");
                token.cancel();
            }
            Err(e) => tracing::error!(error = %e, "cannot listen for SIGINT"),
        }
    });
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Set to run [`signal_child`] as the child of
    /// [`a_signal_right_after_start_up_cancels_instead_of_killing`].
    const SIGNAL_CHILD_ENV: &str = "AWARE_TEST_SIGNAL_CHILD";

    /// Installs the handlers and, before yielding once, has `kill` send this process SIGTERM,
    /// then waits for the token. Run alone in its own process: it changes how the process
    /// answers SIGTERM for good.
    #[test]
    #[ignore = "child process of a_signal_right_after_start_up_cancels_instead_of_killing"]
    fn signal_child() {
        assert!(std::env::var_os(SIGNAL_CHILD_ENV).is_some());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let token = CancellationToken::new();
            cancel_on_signal(token.clone());
            let sent = std::process::Command::new("kill")
                .args(["-TERM", &std::process::id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success());
            tokio::time::timeout(Duration::from_secs(10), token.cancelled())
                .await
                .expect("SIGTERM cancels the token");
        });
        println!("signal child: cancelled");
    }

    #[test]
    fn a_signal_right_after_start_up_cancels_instead_of_killing() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "service::tests::signal_child",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(SIGNAL_CHILD_ENV, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("signal child: cancelled"),
            "{:?}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
