//! Messages the NATS client dropped because a subscription's buffer (`bus.channel_capacity`
//! messages) was full: a consumer slower than what it is sent. The client reports each drop as
//! `Event::SlowConsumer(sid)` on its connection; the subscriptions a service opens are attributed
//! to it, so each drop is counted in that service's `aware_bus_slow_consumer_drops_total{event}`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The drops of one connection, by subscription; clones share them.
#[derive(Clone, Default)]
pub struct SlowConsumers {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    by_sid: Mutex<HashMap<u64, prometheus::IntCounter>>,
    /// Drops on subscriptions no service claimed (a tool's, or one whose id was not found).
    unattributed: AtomicU64,
}

impl SlowConsumers {
    /// Counts one message dropped on subscription `sid`.
    pub fn record(&self, sid: u64) {
        if let Ok(by_sid) = self.inner.by_sid.lock() {
            if let Some(c) = by_sid.get(&sid) {
                c.inc();
                return;
            }
        }
        self.inner.unattributed.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the drops of subscription `sid` in `counter` from now on.
    pub fn attribute(&self, sid: u64, counter: prometheus::IntCounter) {
        if let Ok(mut by_sid) = self.inner.by_sid.lock() {
            by_sid.insert(sid, counter);
        }
    }

    /// Drops on subscriptions no service claimed.
    pub fn unattributed(&self) -> u64 {
        self.inner.unattributed.load(Ordering::Relaxed)
    }
}

/// The client's id of a subscription, which async-nats (0.51) shows only in its `Debug` form
/// (`Subscriber { sid: 3, … }`); `None` if that form ever changes (the drops of such a
/// subscription are then counted as unattributed, never lost).
pub fn sid_of(sub: &async_nats::Subscriber) -> Option<u64> {
    let text = format!("{sub:?}");
    let rest = &text[text.find("sid: ")? + 5..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}
