//! The bus: one API, two implementations with identical subject semantics — NATS and an
//! in-process bus for the embedded default. Both pass the same conformance suite
//! (`tests/src/bus_conformance.rs`).

pub mod auth;
mod inproc;
mod nats;
pub mod pattern;
pub mod permissions;

use std::sync::Arc;

use bytes::Bytes;

pub use inproc::{InProcBus, InProcSubscription};
pub use nats::{
    backoff, is_state_subject, redact_url, state_key_subject, state_stream_config, NatsBus,
};

use crate::config::BusConfig;

/// A message received from the bus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub subject: Arc<str>,
    pub payload: Bytes,
}

/// Bus errors; publish errors are always returned to the caller, never swallowed.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("invalid {what} `{subject}`: {reason}")]
    InvalidSubject {
        subject: String,
        what: &'static str,
        reason: &'static str,
    },
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("publish to `{subject}` failed: {reason}")]
    Publish { subject: String, reason: String },
    #[error("subscribe to `{pattern}` failed: {reason}")]
    Subscribe { pattern: String, reason: String },
    #[error("JetStream stream `{stream}`: {reason}")]
    JetStream { stream: String, reason: String },
    #[error("in-process bus lock poisoned")]
    Poisoned,
}

/// A bus handle; clones share the connection.
#[derive(Clone)]
pub enum Bus {
    InProc(InProcBus),
    Nats(NatsBus),
}

/// `bus.url` value selecting the embedded in-process bus.
pub const EMBEDDED: &str = "embedded";

impl Bus {
    /// The embedded in-process bus. It keeps the newest message of every state subject
    /// ([`aware_bus_schemas::EventKind::is_state`]: lifecycle, model, embedding, target), the embedded
    /// counterpart of the JetStream capture's last message per subject.
    pub fn in_process(capacity: usize) -> Self {
        let state: Vec<String> = aware_bus_schemas::EventKind::ALL
            .into_iter()
            .filter(|k| k.is_state())
            .map(aware_bus_schemas::subject::kind_filter)
            .collect();
        match InProcBus::with_retained(capacity, &state) {
            Ok(b) => Bus::InProc(b),
            // The kind filters are valid patterns (tested); never drop the bus over it.
            Err(_) => Bus::InProc(InProcBus::new(capacity)),
        }
    }

    /// Connects to the bus named by `cfg.url`: `embedded` or a `nats://` URL.
    pub async fn connect(cfg: &BusConfig, client_name: &str) -> Result<Self, BusError> {
        if cfg.url == EMBEDDED {
            Ok(Bus::in_process(cfg.channel_capacity))
        } else {
            Ok(Bus::Nats(NatsBus::connect(cfg, client_name).await?))
        }
    }

    pub async fn publish(&self, subject: &str, payload: Bytes) -> Result<(), BusError> {
        match self {
            Bus::InProc(b) => b.publish(subject, payload).await,
            Bus::Nats(b) => b.publish(subject, payload).await,
        }
    }

    /// Forgets the current state kept under the state subject `subject` (a deleted target's
    /// stage, model or embedding, once the service that publishes it has forgotten the target):
    /// on NATS a purge of its key in the state bucket, on the embedded bus its retained message.
    /// A later start-up read does not restore it. Live subscribers see nothing.
    pub async fn forget_state(&self, subject: &str) -> Result<(), BusError> {
        match self {
            Bus::InProc(b) => b.forget_retained(subject),
            Bus::Nats(b) => b.forget_state(subject).await,
        }
    }

    /// [`Bus::forget_state`] of `target`'s current state of `kind`, under its subject and under
    /// the unslotted one of older releases; nothing to do for a target whose names form no
    /// subject (it never had state on the bus).
    pub async fn forget_target_state(
        &self,
        kind: aware_bus_schemas::EventKind,
        target: &aware_bus_schemas::Target,
    ) -> Result<(), BusError> {
        use aware_bus_schemas::subject;
        let (Ok(slotted), Ok(unslotted)) = (
            subject::subject(kind, target),
            subject::unslotted_subject(kind, target),
        ) else {
            return Ok(());
        };
        // The key of a release before the slot token too, which the start-up read still takes
        // (ADR 0021): purged, it cannot bring the target back.
        self.forget_state(&slotted).await?;
        self.forget_state(&unslotted).await
    }

    pub async fn subscribe(&self, pattern: &str) -> Result<Subscription, BusError> {
        match self {
            Bus::InProc(b) => Ok(Subscription::InProc(b.subscribe(pattern)?)),
            Bus::Nats(b) => Ok(Subscription::Nats(b.subscribe(pattern).await?)),
        }
    }

    /// Whether a publish returns only once a stream has stored the message (ADR 0022).
    pub fn acks_publishes(&self) -> bool {
        matches!(self, Bus::Nats(b) if b.acks_publishes())
    }

    /// Waits until everything published so far has been handed to the transport.
    pub async fn flush(&self) -> Result<(), BusError> {
        match self {
            Bus::InProc(_) => Ok(()),
            Bus::Nats(b) => b.flush().await,
        }
    }

    /// On the embedded bus, the newest retained message of every subject matching `pattern`,
    /// oldest first; `None` on NATS (whose capture is read through JetStream).
    pub fn retained(&self, pattern: &str) -> Option<Result<Vec<Message>, BusError>> {
        match self {
            Bus::InProc(b) => Some(b.last_per_subject(pattern)),
            Bus::Nats(_) => None,
        }
    }

    pub fn is_connected(&self) -> bool {
        match self {
            Bus::InProc(_) => true,
            Bus::Nats(b) => b.is_connected(),
        }
    }

    /// `embedded` or `nats`.
    pub fn kind(&self) -> &'static str {
        match self {
            Bus::InProc(_) => "embedded",
            Bus::Nats(_) => "nats",
        }
    }
}

/// A subscription; dropping it unsubscribes.
pub enum Subscription {
    InProc(InProcSubscription),
    Nats(async_nats::Subscriber),
}

impl Subscription {
    /// The next message, or `None` when the bus is closed.
    pub async fn next(&mut self) -> Option<Message> {
        match self {
            Subscription::InProc(s) => s.next().await,
            Subscription::Nats(s) => nats::next(s).await,
        }
    }

    /// The messages as a stream, ending when the bus is closed (to merge subscriptions).
    pub fn into_stream(self) -> impl futures::Stream<Item = Message> + Send + Unpin {
        Box::pin(futures::stream::unfold(self, |mut s| async move {
            s.next().await.map(|m| (m, s))
        }))
    }
}
