//! The embedded in-process bus: NATS subject and wildcard semantics, no server.
//!
//! Delivery is lossless and ordered per publisher: each subscription has a bounded queue and a
//! publisher waits when a subscriber's queue is full (back-pressure instead of NATS's slow-consumer
//! drops, which the embedded deployment never needs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::pattern::{validate_subject, Pattern};
use super::{BusError, Message};

struct Sub {
    id: u64,
    pattern: Pattern,
    tx: mpsc::Sender<Message>,
}

struct Inner {
    subs: RwLock<Vec<Sub>>,
    next_id: AtomicU64,
    capacity: usize,
}

/// The in-process bus; clones share one bus.
#[derive(Clone)]
pub struct InProcBus {
    inner: Arc<Inner>,
}

impl InProcBus {
    /// A bus whose subscriptions buffer up to `capacity` messages each.
    pub fn new(capacity: usize) -> Self {
        InProcBus {
            inner: Arc::new(Inner {
                subs: RwLock::new(Vec::new()),
                next_id: AtomicU64::new(1),
                capacity: capacity.max(1),
            }),
        }
    }

    pub async fn publish(&self, subject: &str, payload: Bytes) -> Result<(), BusError> {
        validate_subject(subject)?;
        let subject: Arc<str> = Arc::from(subject);
        // Fast path under the read lock; subscribers whose queue is full are awaited afterwards,
        // in subscription order, so per-publisher ordering holds for every subscriber.
        let mut blocked: Vec<(mpsc::Sender<Message>, Message)> = Vec::new();
        {
            let subs = self.inner.subs.read().map_err(|_| BusError::Poisoned)?;
            for sub in subs.iter() {
                if !sub.pattern.matches(&subject) {
                    continue;
                }
                let msg = Message {
                    subject: subject.clone(),
                    payload: payload.clone(),
                };
                if !blocked.is_empty() {
                    blocked.push((sub.tx.clone(), msg));
                    continue;
                }
                match sub.tx.try_send(msg) {
                    Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
                    Err(mpsc::error::TrySendError::Full(msg)) => {
                        blocked.push((sub.tx.clone(), msg));
                    }
                }
            }
        }
        for (tx, msg) in blocked {
            // A subscription dropped meanwhile is not an error: it unsubscribed.
            let _ = tx.send(msg).await;
        }
        Ok(())
    }

    pub fn subscribe(&self, pattern: &str) -> Result<InProcSubscription, BusError> {
        let pattern = Pattern::parse(pattern)?;
        let (tx, rx) = mpsc::channel(self.inner.capacity);
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.inner
            .subs
            .write()
            .map_err(|_| BusError::Poisoned)?
            .push(Sub { id, pattern, tx });
        Ok(InProcSubscription {
            rx,
            id,
            bus: Arc::downgrade(&self.inner),
        })
    }

    /// Number of live subscriptions (for tests and metrics).
    pub fn subscription_count(&self) -> usize {
        self.inner.subs.read().map(|s| s.len()).unwrap_or(0)
    }
}

/// A subscription on the in-process bus; dropping it unsubscribes.
pub struct InProcSubscription {
    rx: mpsc::Receiver<Message>,
    id: u64,
    bus: std::sync::Weak<Inner>,
}

impl InProcSubscription {
    pub async fn next(&mut self) -> Option<Message> {
        self.rx.recv().await
    }
}

impl Drop for InProcSubscription {
    fn drop(&mut self) {
        if let Some(inner) = self.bus.upgrade() {
            if let Ok(mut subs) = inner.subs.write() {
                subs.retain(|s| s.id != self.id);
            }
        }
    }
}
