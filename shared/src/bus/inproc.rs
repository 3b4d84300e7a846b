//! The embedded in-process bus: NATS subject and wildcard semantics, no server.
//!
//! Delivery is lossless and ordered per publisher: each subscription has a bounded queue and a
//! publisher waits when a subscriber's queue is full (back-pressure instead of NATS's slow-consumer
//! drops, which the embedded deployment never needs).
//!
//! A bus built [`InProcBus::with_retained`] keeps the newest message of every subject matching
//! its retained patterns ([`InProcBus::last_per_subject`]): the embedded counterpart of reading
//! the JetStream capture with `DeliverPolicy::LastPerSubject`, so a service that subscribes after
//! a target's last stage change, model or registration still learns it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

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
    /// Subjects whose newest message is kept.
    retain: Vec<Pattern>,
    /// Subject → (publish sequence, payload) of the newest message, for retained subjects.
    last: Mutex<HashMap<Arc<str>, (u64, Bytes)>>,
    next_seq: AtomicU64,
}

/// The in-process bus; clones share one bus.
#[derive(Clone)]
pub struct InProcBus {
    inner: Arc<Inner>,
}

impl InProcBus {
    /// A bus whose subscriptions buffer up to `capacity` messages each.
    pub fn new(capacity: usize) -> Self {
        InProcBus::build(capacity, Vec::new())
    }

    /// A bus that also keeps the newest message of every subject matching one of `patterns`.
    pub fn with_retained(capacity: usize, patterns: &[String]) -> Result<Self, BusError> {
        let retain = patterns
            .iter()
            .map(|p| Pattern::parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(InProcBus::build(capacity, retain))
    }

    fn build(capacity: usize, retain: Vec<Pattern>) -> Self {
        InProcBus {
            inner: Arc::new(Inner {
                subs: RwLock::new(Vec::new()),
                next_id: AtomicU64::new(1),
                capacity: capacity.max(1),
                retain,
                last: Mutex::new(HashMap::new()),
                next_seq: AtomicU64::new(1),
            }),
        }
    }

    /// The newest message of every retained subject matching `pattern`, oldest first (publish
    /// order); empty on a bus that retains nothing.
    pub fn last_per_subject(&self, pattern: &str) -> Result<Vec<Message>, BusError> {
        let pattern = Pattern::parse(pattern)?;
        let last = self.inner.last.lock().map_err(|_| BusError::Poisoned)?;
        let mut out: Vec<(u64, Message)> = last
            .iter()
            .filter(|(subject, _)| pattern.matches(subject))
            .map(|(subject, (seq, payload))| {
                (
                    *seq,
                    Message {
                        subject: subject.clone(),
                        payload: payload.clone(),
                    },
                )
            })
            .collect();
        out.sort_by_key(|(seq, _)| *seq);
        Ok(out.into_iter().map(|(_, m)| m).collect())
    }

    /// Drops the retained message of `subject` (a target forgotten: its state is not read at
    /// the next start). Nothing retained is not an error.
    pub fn forget_retained(&self, subject: &str) -> Result<(), BusError> {
        validate_subject(subject)?;
        self.inner
            .last
            .lock()
            .map_err(|_| BusError::Poisoned)?
            .remove(subject);
        Ok(())
    }

    pub async fn publish(&self, subject: &str, payload: Bytes) -> Result<(), BusError> {
        validate_subject(subject)?;
        let subject: Arc<str> = Arc::from(subject);
        if self.inner.retain.iter().any(|p| p.matches(&subject)) {
            // Kept before delivery: a subscriber that subscribes, then reads the retained
            // messages, sees every message in one or the other (possibly both).
            let seq = self.inner.next_seq.fetch_add(1, Ordering::Relaxed);
            self.inner
                .last
                .lock()
                .map_err(|_| BusError::Poisoned)?
                .insert(subject.clone(), (seq, payload.clone()));
        }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::from(s.to_owned())
    }

    #[tokio::test]
    async fn retained_subjects_keep_their_newest_message_in_publish_order() {
        let bus = InProcBus::with_retained(4, &["s.*.*".to_string()]).unwrap();
        bus.publish("s.a.x", b("1")).await.unwrap();
        bus.publish("s.b.x", b("2")).await.unwrap();
        bus.publish("other.a.x", b("3")).await.unwrap();
        bus.publish("s.a.x", b("4")).await.unwrap();
        let got: Vec<(String, Bytes)> = bus
            .last_per_subject("s.*.*")
            .unwrap()
            .into_iter()
            .map(|m| (m.subject.to_string(), m.payload))
            .collect();
        // Newest per subject, oldest first: s.b.x (seq 2) before s.a.x (seq 4).
        assert_eq!(
            got,
            vec![("s.b.x".into(), b("2")), ("s.a.x".into(), b("4"))]
        );
        // A narrower filter; a subject never retained is not there.
        assert_eq!(bus.last_per_subject("s.a.*").unwrap().len(), 1);
        assert!(bus.last_per_subject("other.>").unwrap().is_empty());
        assert!(bus.last_per_subject("a..b").is_err());
        // Without retained patterns nothing is kept, and delivery is unchanged.
        let plain = InProcBus::new(4);
        let mut sub = plain.subscribe("s.>").unwrap();
        plain.publish("s.a.x", b("1")).await.unwrap();
        assert_eq!(sub.next().await.unwrap().payload, b("1"));
        assert!(plain.last_per_subject(">").unwrap().is_empty());
        assert!(InProcBus::with_retained(4, &["a.>.b".to_string()]).is_err());
        // A forgotten subject's message is dropped; the others stay; forgetting twice is fine.
        bus.forget_retained("s.a.x").unwrap();
        bus.forget_retained("s.a.x").unwrap();
        let left: Vec<String> = bus
            .last_per_subject("s.*.*")
            .unwrap()
            .into_iter()
            .map(|m| m.subject.to_string())
            .collect();
        assert_eq!(left, vec!["s.b.x".to_string()]);
        assert!(
            bus.forget_retained("s.*.x").is_err(),
            "a subject, not a pattern"
        );
    }
}
