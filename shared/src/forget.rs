//! Forgetting deleted targets: what a service keeps of a target (the recorder's trajectories, the
//! trainer's checkpoints) is deleted once the target has been deregistered (its `AwareAutoscaler`
//! deleted and not created again) for a grace period.
//!
//! A service follows `target/1` ([`run`]): a deregistration *marks* the target with the time
//! the service received it (its own clock, never the sender's `ts_ms`: a skewed clock or a
//! forged old timestamp must not delete data at once), a registration clears the mark (resyncs
//! and repeated deregistrations change nothing). Marks are
//! kept where the data is ([`Forgetting::mark`]), so a restart, or a bus that no longer retains the
//! deregistration (JetStream keeps messages `bus.jetstream.max_age_secs`), does not reset the
//! grace period. Once a mark is older than the grace period the service deletes the target's
//! data ([`Forgetting::forget`], which removes the mark too). Before forgetting, every
//! registration already received is applied, so a target created again in time keeps its data.
//! A failed store write is counted and tried again [`RETRY_MS`] later.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aware_bus_schemas::{Event, Registration, Target};
use tokio::sync::mpsc;

use crate::service::ServiceContext;

/// How long a failed write (mark or forget) waits before it is tried again, milliseconds.
pub const RETRY_MS: i64 = 30_000;

/// Where a service keeps its marks and its targets' data. Called on the blocking pool.
pub trait Forgetting: Send + Sync + 'static {
    /// The store's error (logged and counted; the operation is tried again later).
    type Error: std::error::Error + Send + Sync + 'static;
    /// Every stored mark: the target and the time of its deregistration (Unix milliseconds).
    fn marks(&self) -> Result<Vec<(Target, i64)>, Self::Error>;
    /// Stores `target`'s mark (`Some`, replacing any earlier one) or clears it (`None`).
    fn mark(&self, target: &Target, since_ms: Option<i64>) -> Result<(), Self::Error>;
    /// Deletes everything kept of `target`, its mark included; how many items (rows, versions)
    /// went. Nothing to delete is not an error.
    fn forget(&self, target: &Target) -> Result<u64, Self::Error>;
    /// The state kinds this service publishes whose current state ([`crate::bus::Bus::forget_state`])
    /// goes with the target's data: forgotten first, so a restarted service never reads a
    /// forgotten target's model back. None by default.
    fn state_kinds(&self) -> &'static [aware_bus_schemas::EventKind] {
        &[]
    }
}

/// A failed operation of [`run`] on the blocking pool.
#[derive(Debug, thiserror::Error)]
enum Failed<E: std::error::Error + 'static> {
    #[error(transparent)]
    Store(E),
    #[error("blocking task: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// A service's metrics of forgetting (registered by the service under its own names).
#[derive(Clone)]
pub struct ForgetMetrics {
    /// Targets forgotten.
    pub targets: prometheus::IntCounter,
    /// Items ([`Forgetting::forget`]'s count) deleted.
    pub items: prometheus::IntCounter,
    /// Marked targets waiting for their grace period.
    pub waiting: prometheus::IntGauge,
    /// Failed store operations, by `op`: `marks`, `mark`, `forget`.
    pub errors: prometheus::IntCounterVec,
}

/// Deregistered targets waiting for the grace period (times in Unix milliseconds).
#[derive(Debug)]
pub struct Deregistrations {
    after_ms: i64,
    /// Marked targets and the time of their deregistration.
    marks: HashMap<Target, i64>,
    /// Marks not yet stored (`None`: a clear).
    unsaved: HashMap<Target, Option<i64>>,
    /// When a store write waiting for a retry may be tried again.
    retry_at: HashMap<Target, i64>,
}

impl Deregistrations {
    /// With the grace period `after` and the marks stored before a restart.
    pub fn new(after: Duration, marks: Vec<(Target, i64)>) -> Self {
        Deregistrations {
            after_ms: i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
            marks: marks.into_iter().collect(),
            unsaved: HashMap::new(),
            retry_at: HashMap::new(),
        }
    }

    /// Folds in a registration received at `now_ms` (the receiver's clock): a deregistration
    /// marks a target not yet marked with `now_ms`, a registration clears its mark. Resyncs and
    /// repeats change nothing (a repeated deregistration keeps the first mark).
    pub fn on_registration(&mut self, r: &Registration, now_ms: i64) {
        let t = &r.target;
        if r.spec.is_none() {
            if !self.marks.contains_key(t) {
                self.marks.insert(t.clone(), now_ms);
                self.unsaved.insert(t.clone(), Some(now_ms));
            }
        } else if self.marks.remove(t).is_some() {
            self.unsaved.insert(t.clone(), None);
            self.retry_at.remove(t);
        }
    }

    fn due_at(&self, target: &Target, since: i64) -> i64 {
        since
            .saturating_add(self.after_ms)
            .max(self.retry_at.get(target).copied().unwrap_or(i64::MIN))
    }

    /// The marked targets whose grace period is over at `now`, in `(namespace, name)` order.
    pub fn due(&self, now: i64) -> Vec<Target> {
        let mut due: Vec<Target> = self
            .marks
            .iter()
            .filter(|(t, &since)| self.due_at(t, since) <= now)
            .map(|(t, _)| t.clone())
            .collect();
        due.sort();
        due
    }

    /// How long until the next check: the earliest due time, sooner while a mark waits to be
    /// stored, at most an hour.
    pub fn next_check(&self, now: i64) -> Duration {
        let mut at = now.saturating_add(3_600_000);
        if !self.unsaved.is_empty() {
            at = at.min(now.saturating_add(RETRY_MS));
        }
        for (t, &since) in &self.marks {
            at = at.min(self.due_at(t, since));
        }
        Duration::from_millis(u64::try_from(at.saturating_sub(now)).unwrap_or(0))
    }

    /// Marked targets.
    pub fn len(&self) -> usize {
        self.marks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }
}

async fn blocking<T: Send + 'static, E: std::error::Error + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, Failed<E>> {
    tokio::task::spawn_blocking(f).await?.map_err(Failed::Store)
}

/// Follows `registrations` (a `target/1` subscription) and forgets targets deregistered longer
/// than `after` ago, until shutdown. `on_registration` sees every registration first (the
/// recorder frees a deregistered target's resume floor there); `on_forgotten` every target
/// forgotten (the trainer stops its actor).
pub async fn run<F: Forgetting>(
    ctx: ServiceContext,
    backend: Arc<F>,
    after: Duration,
    mut registrations: mpsc::Receiver<Event>,
    metrics: ForgetMetrics,
    mut on_registration: impl FnMut(&Registration) + Send,
    mut on_forgotten: impl FnMut(&Target) + Send,
) {
    let mut attempt = 0usize;
    let marks = loop {
        let b = backend.clone();
        match blocking(move || b.marks()).await {
            Ok(m) => break m,
            Err(e) => {
                metrics.errors.with_label_values(&["marks"]).inc();
                tracing::error!(service = ctx.name, error = %e, attempt, "cannot read the deregistration marks; retrying");
            }
        }
        let wait = crate::bus::backoff(attempt, Duration::from_secs(30));
        attempt += 1;
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    };
    tracing::info!(
        service = ctx.name,
        marked = marks.len(),
        forget_after_s = after.as_secs(),
        "forgetting deleted targets"
    );
    let mut d = Deregistrations::new(after, marks);
    let mut take = |d: &mut Deregistrations, ev: Event| {
        if let Event::Registration(r) = ev {
            on_registration(&r);
            d.on_registration(&r, aware_bus_schemas::now_ms());
        }
    };
    loop {
        metrics
            .waiting
            .set(i64::try_from(d.len()).unwrap_or(i64::MAX));
        let wait = d.next_check(aware_bus_schemas::now_ms());
        tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            ev = registrations.recv() => match ev {
                Some(ev) => take(&mut d, ev),
                None => break,
            },
            _ = tokio::time::sleep(wait) => {}
        }
        // Every registration already received first: a target created again is not forgotten.
        while let Ok(ev) = registrations.try_recv() {
            take(&mut d, ev);
        }
        save_marks(&ctx, &backend, &metrics, &mut d).await;
        let now = aware_bus_schemas::now_ms();
        for target in d.due(now) {
            if let Err(e) = forget_state(&ctx, backend.state_kinds(), &target).await {
                metrics.errors.with_label_values(&["forget_state"]).inc();
                d.retry_at
                    .insert(target.clone(), now.saturating_add(RETRY_MS));
                tracing::warn!(service = ctx.name, target = %target, error = %e, "cannot forget the target's current state; retrying later");
                continue;
            }
            let (b, t) = (backend.clone(), target.clone());
            match blocking(move || b.forget(&t)).await {
                Ok(items) => {
                    metrics.targets.inc();
                    metrics.items.inc_by(items);
                    let since = d.marks.remove(&target).unwrap_or_default();
                    d.unsaved.remove(&target);
                    d.retry_at.remove(&target);
                    tracing::info!(service = ctx.name, target = %target, deregistered_ms = since, items, "forgot a deleted target");
                    on_forgotten(&target);
                }
                Err(e) => {
                    metrics.errors.with_label_values(&["forget"]).inc();
                    d.retry_at
                        .insert(target.clone(), now.saturating_add(RETRY_MS));
                    tracing::warn!(service = ctx.name, target = %target, error = %e, "forgetting failed; retrying later");
                }
            }
        }
    }
}

/// Forgets `target`'s current state of each of `kinds` (idempotent: done again when the
/// forgetting is retried).
async fn forget_state(
    ctx: &ServiceContext,
    kinds: &[aware_bus_schemas::EventKind],
    target: &Target,
) -> Result<(), crate::bus::BusError> {
    for &kind in kinds {
        ctx.bus.forget_target_state(kind, target).await?;
    }
    if !kinds.is_empty() {
        ctx.bus.flush().await?;
    }
    Ok(())
}

/// Stores the marks not yet stored; a failed write is counted and kept for the next check.
async fn save_marks<F: Forgetting>(
    ctx: &ServiceContext,
    backend: &Arc<F>,
    metrics: &ForgetMetrics,
    d: &mut Deregistrations,
) {
    let pending: Vec<(Target, Option<i64>)> = d.unsaved.drain().collect();
    for (target, since) in pending {
        let (b, t) = (backend.clone(), target.clone());
        match blocking(move || b.mark(&t, since)).await {
            Ok(()) => {
                tracing::info!(service = ctx.name, target = %target, deregistered_ms = ?since, "deregistration mark stored");
            }
            Err(e) => {
                metrics.errors.with_label_values(&["mark"]).inc();
                tracing::warn!(service = ctx.name, target = %target, error = %e, "cannot store the deregistration mark; retrying");
                d.unsaved.insert(target, since);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(target: &Target, ts_ms: i64, registered: bool) -> Registration {
        let spec = aware_bus_schemas::RegisteredSpec {
            min_replicas: 1,
            max_replicas: 10,
            min_cpu_millicores: 100,
            max_cpu_millicores: 1_000,
            min_memory_bytes: 64 << 20,
            max_memory_bytes: 1 << 30,
            slo_latency_p99_ms: Some(100.0),
            slo_throughput_rps: None,
            alpha: 0.5,
            recommend_only: false,
            lifecycle: None,
            container: None,
            limits: None,
            slo_objective: None,
            fallback_hpa_target_cpu_utilization: None,
        };
        crate::testkit::registration(target, ts_ms, registered.then_some(spec))
    }

    /// A deregistration stamped long ago (a sender's skewed clock, a forged message) is marked
    /// when received: nothing is due before the grace period has passed on the receiver's clock.
    /// (The mark used to be the message's `ts_ms`: due at once.)
    #[test]
    fn the_grace_period_counts_from_receipt_not_from_the_senders_clock() {
        let a = Target::new("ns", "a");
        let mut d = Deregistrations::new(Duration::from_secs(600), vec![]);
        let received = 1_000_000_000;
        d.on_registration(&reg(&a, 0, false), received);
        assert_eq!(d.marks[&a], received);
        assert!(d.due(received).is_empty());
        assert!(d.due(received + 599_999).is_empty());
        assert_eq!(d.due(received + 600_000), vec![a.clone()]);
        // A stamp in the future is no shortcut either way.
        let b = Target::new("ns", "b");
        d.on_registration(&reg(&b, i64::MAX, false), received);
        assert_eq!(d.marks[&b], received);
    }

    #[test]
    fn marks_follow_registrations_and_fall_due_after_the_grace_period() {
        let (a, b, c) = (
            Target::new("ns", "a"),
            Target::new("ns", "b"),
            Target::new("ns", "c"),
        );
        // c was marked before a restart (loaded from the store).
        let mut d = Deregistrations::new(Duration::from_secs(10), vec![(c.clone(), 500)]);
        assert_eq!(d.due(10_499), Vec::<Target>::new());
        assert_eq!(
            d.due(10_500),
            vec![c.clone()],
            "a loaded mark keeps its time"
        );
        // Registrations and resyncs of a target never deregistered change nothing.
        d.on_registration(&reg(&a, 1_000, true), 1_000);
        d.on_registration(&reg(&a, 2_000, true), 2_000);
        assert!(d.unsaved.is_empty() && !d.marks.contains_key(&a));
        // a is deregistered, received at 3 s; the same deregistration again (a bus replay), or
        // another one, is a no-op.
        d.on_registration(&reg(&a, 2_900, false), 3_000);
        assert_eq!(d.unsaved.remove(&a), Some(Some(3_000)), "a mark to store");
        d.on_registration(&reg(&a, 2_900, false), 3_500);
        d.on_registration(&reg(&a, 3_400, false), 3_500);
        assert!(d.unsaved.is_empty(), "a repeated deregistration");
        // b is deregistered, then registered again: its mark is cleared.
        d.on_registration(&reg(&b, 4_000, false), 4_000);
        d.on_registration(&reg(&b, 5_000, true), 5_000);
        assert_eq!(d.unsaved.get(&b), Some(&None), "a clear to store");
        assert!(!d.marks.contains_key(&b));
        assert_eq!(d.len(), 2);
        assert_eq!(d.due(12_999), vec![c.clone()]);
        assert_eq!(d.due(13_000), vec![a.clone(), c.clone()]);
        assert_eq!(d.next_check(12_000), Duration::ZERO, "c is overdue");
        d.unsaved.clear();
        d.marks.remove(&c);
        assert_eq!(
            d.next_check(12_000),
            Duration::from_secs(1),
            "a is due at 13 s"
        );
        // A failed forget of a waits RETRY_MS.
        d.retry_at.insert(a.clone(), 13_000 + RETRY_MS);
        assert!(d.due(13_000).is_empty());
        assert_eq!(
            d.next_check(13_000),
            Duration::from_millis(RETRY_MS as u64),
            "the retry"
        );
        d.marks.clear();
        assert!(d.is_empty());
        assert_eq!(
            d.next_check(0),
            Duration::from_secs(3_600),
            "nothing marked"
        );
        d.unsaved.insert(a.clone(), None);
        assert_eq!(
            d.next_check(0),
            Duration::from_millis(RETRY_MS as u64),
            "a mark waiting to be stored"
        );
    }
}
