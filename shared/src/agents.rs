//! Per-target actix actors: every managed target is one actor inside the service that owns it.
//! Events are routed to the target's actor (created on first sight); what actors publish goes
//! through one ordered [`Outbox`] per service.
//!
//! The actors of a service built with [`TargetActors::spread`] run on the process's arbiters
//! ([`crate::arbiters`]), a target always on the same one: the intake loop sends a target's
//! events to its one mailbox in the order they arrived, its actor handles them in that order on
//! one thread and queues what it publishes in that order, so a target's messages keep their
//! order end to end while different targets run on different cores.

use std::collections::HashMap;

use actix::{Actor, Addr, Context, Handler, Message};
use aware_bus_schemas::{Event, Target};
use tokio::sync::mpsc;

use crate::service::ServiceContext;

/// An event delivered to a target's actor.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Deliver(pub Event);

/// Asks a target's actor to stop: its target was forgotten ([`crate::forget`]).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Retire;

/// Ordered publishing from actors (which cannot await) to the bus.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Outgoing>,
}

/// What the publisher task does, in the order queued. Nearly every item is a publish: boxing the
/// event to shrink the rare forget would allocate once per message.
#[allow(clippy::large_enum_variant)]
enum Outgoing {
    Publish(Event),
    /// [`crate::bus::Bus::forget_target_state`].
    Forget(aware_bus_schemas::EventKind, Target),
}

impl Outbox {
    /// Queues an event for publishing; returns false when the service is shutting down.
    pub fn send(&self, ev: impl Into<Event>) -> bool {
        self.tx.send(Outgoing::Publish(ev.into())).is_ok()
    }

    /// Queues forgetting `target`'s current state of `kind` (after everything queued before it,
    /// so an earlier publish cannot bring it back); false when the service is shutting down.
    pub fn forget_state(&self, kind: aware_bus_schemas::EventKind, target: &Target) -> bool {
        self.tx.send(Outgoing::Forget(kind, target.clone())).is_ok()
    }
}

/// Publishes or forgets one queued item; failures are counted (publishes) and logged.
async fn deliver(ctx: &ServiceContext, item: Outgoing) {
    match item {
        Outgoing::Publish(ev) => {
            let _ = ctx.publish_event(&ev).await;
        }
        Outgoing::Forget(kind, target) => match ctx.bus.forget_target_state(kind, &target).await {
            Ok(()) => {
                tracing::info!(service = ctx.name, event = %kind, %target, "current state forgotten")
            }
            Err(e) => {
                tracing::warn!(service = ctx.name, event = %kind, %target, error = %e, "cannot forget the current state")
            }
        },
    }
}

/// Lanes of an outbox with acknowledged publishes ([`spawn_publisher`]).
pub const LANES: usize = 64;

/// Where the publisher task sends its items: delivered in place (one lane), or to lane tasks
/// by target.
struct Lanes {
    lanes: Vec<mpsc::UnboundedSender<Outgoing>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Lanes {
    fn new(ctx: &ServiceContext, n: usize) -> Self {
        let mut lanes = Lanes {
            lanes: Vec::new(),
            tasks: Vec::new(),
        };
        if n < 2 {
            return lanes;
        }
        for _ in 0..n {
            let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();
            let ctx = ctx.clone();
            lanes.tasks.push(tokio::spawn(async move {
                while let Some(item) = rx.recv().await {
                    deliver(&ctx, item).await;
                }
            }));
            lanes.lanes.push(tx);
        }
        lanes
    }

    /// Delivers `item` in place, or queues it on its target's lane.
    async fn deliver(&mut self, ctx: &ServiceContext, item: Outgoing) {
        if self.lanes.is_empty() {
            return deliver(ctx, item).await;
        }
        let target = match &item {
            Outgoing::Publish(ev) => ev.target(),
            Outgoing::Forget(_, t) => t,
        };
        let lane = aware_bus_schemas::subject::mixed_hash(&target.key()) % self.lanes.len() as u64;
        // A lane ends only when its sender is dropped ([`Lanes::finish`]).
        let _ = self.lanes[lane as usize].send(item);
    }

    /// Waits until every lane has delivered what it was given.
    async fn finish(self) {
        drop(self.lanes);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Waits for a service's publisher task (see [`spawn_publisher`]) to finish.
pub async fn join_publisher(
    publisher: tokio::task::JoinHandle<()>,
) -> Result<(), crate::service::ServiceError> {
    publisher
        .await
        .map_err(|source| crate::service::ServiceError::Task {
            task: "publisher",
            source,
        })
}

/// Starts the publisher task of a service. It publishes the outbox in order and ends when every
/// [`Outbox`] clone is dropped or at shutdown (after draining what is queued), flushing the bus.
///
/// With acknowledged publishes (`bus.jetstream.ack_publishes`, ADR 0022) each publish waits for
/// the stream, and one at a time would wait a round trip per message: the outbox is then split
/// into [`LANES`] lanes by target, each publishing in order, so a target's messages keep their
/// order and different targets' messages are acknowledged concurrently.
pub fn spawn_publisher(ctx: ServiceContext) -> (Outbox, tokio::task::JoinHandle<()>) {
    let stop = ctx.shutdown.clone();
    spawn_publisher_until(ctx, stop)
}

/// [`spawn_publisher`] ending when `stop` is cancelled instead of at the service's shutdown: for
/// a service whose actors still queue messages after the shutdown began (the actuator's sink
/// calls in flight), which cancels `stop` once they are done.
pub fn spawn_publisher_until(
    ctx: ServiceContext,
    stop: tokio_util::sync::CancellationToken,
) -> (Outbox, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();
    let handle = tokio::spawn(async move {
        let lanes_n = if ctx.bus.acks_publishes() { LANES } else { 1 };
        let mut lanes = Lanes::new(&ctx, lanes_n);
        loop {
            tokio::select! {
                biased;
                item = rx.recv() => match item {
                    Some(item) => lanes.deliver(&ctx, item).await,
                    None => break,
                },
                _ = stop.cancelled() => {
                    while let Ok(item) = rx.try_recv() {
                        lanes.deliver(&ctx, item).await;
                    }
                    break;
                }
            }
        }
        lanes.finish().await;
        if let Err(e) = ctx.bus.flush().await {
            tracing::warn!(service = ctx.name, error = %e, "final flush failed");
        }
    });
    (Outbox { tx }, handle)
}

/// The actors of one service, one per target.
///
/// **Retirement** (`actors.retire_after_secs`, 0: off): a target the controller deregistered (its
/// `AwareAutoscaler` deleted) keeps its actor while messages sent before the deletion may still
/// arrive; `retire_after_secs` after the deregistration was received (this service's clock, never
/// the message's `ts_ms`), [`TargetActors::sweep`] stops the
/// actor ([`Retire`]) and frees what it held (the recommender's policy, the monitor's windows).
/// From then on the target is *retired*: its events are counted and dropped, never handed to a
/// new actor (one started from defaults would act on a deleted workload), until a registration
/// creates it again, which starts a fresh actor. A retired target is remembered for
/// `bus.jetstream.max_age_secs` more, as long as the bus can still deliver a message sent before
/// the deletion. A deregistration of a target without an actor, neither configured nor registered
/// here, whose own time is older than the delay (a restarted service reading the bus's retained
/// state) retires it without starting one.
///
/// With [`LateEvents::Record`] (the trajectory recorder, which acts on nothing and must lose no
/// transition) a retired target's events are still counted but handed to a new actor, which is
/// retired again `retire_after_secs` after the last such event started it.
pub struct TargetActors<A>
where
    A: Actor<Context = Context<A>> + Handler<Deliver> + Handler<Retire>,
{
    actors: HashMap<Target, Addr<A>>,
    /// Makes a target's actor and starts it (here, or on its arbiter).
    starter: Starter<A>,
    gauge: prometheus::IntGauge,
    retiring: Option<Retiring>,
    /// Called once for every target that becomes retired, with or without an actor.
    on_retired: Option<RetiredHook>,
    late: LateEvents,
    /// Targets whose latest registration registers them, and the gauges that report them.
    registered: std::collections::HashSet<Target>,
    registered_gauge: prometheus::IntGauge,
    registration_received: prometheus::Gauge,
    /// `actors.max_targets`.
    max_targets: usize,
    /// `actors.require_registration`, in a service whose intake follows registrations
    /// ([`TargetActors::follow_registrations`]): targets in `configured` or `registered` only.
    require_registration: bool,
    follows_registrations: bool,
    configured: std::collections::HashSet<Target>,
    refusals: prometheus::IntCounterVec,
}

/// Makes a target's actor and starts it ([`TargetActors::new`], [`TargetActors::spread`]).
type Starter<A> = Box<dyn FnMut(&Target) -> Addr<A>>;

/// What a service does when one of its targets becomes retired ([`TargetActors::with_on_retired`]).
type RetiredHook = Box<dyn FnMut(&Target)>;

/// What becomes of the events of a retired target ([`TargetActors`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateEvents {
    /// Counted and dropped: no actor acts on a deleted workload (the default).
    Drop,
    /// Counted and handed to a new actor, retired again `retire_after_secs` later.
    Record,
}

/// Deregistered and retired targets (times in Unix milliseconds).
struct Retiring {
    after_ms: i64,
    /// How long a retired target is remembered after its retirement is due.
    remember_ms: i64,
    /// Deregistered targets with an actor: the time of the deregistration.
    deregistered: HashMap<Target, i64>,
    /// Retired targets: until when their events are dropped.
    retired: HashMap<Target, i64>,
    retired_total: prometheus::IntCounter,
    dropped: prometheus::IntCounter,
}

impl Retiring {
    /// Retires `target`, deregistered at `since_ms`: its events are dropped until its retirement
    /// is due plus `remember_ms`, while the bus may still deliver a message sent before.
    fn mark_retired(&mut self, target: Target, since_ms: i64) {
        self.retired.insert(
            target,
            since_ms
                .saturating_add(self.after_ms)
                .saturating_add(self.remember_ms),
        );
    }
}

/// Milliseconds of `secs` seconds, saturating.
fn secs_ms(secs: u64) -> i64 {
    i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX)
}

impl<A> TargetActors<A>
where
    A: Actor<Context = Context<A>> + Handler<Deliver> + Handler<Retire>,
{
    /// The actors of the service of `ctx`, retiring deregistered targets as `ctx.config.actors`
    /// says.
    /// Every actor runs on the service's own thread (see [`TargetActors::spread`]).
    pub fn new(ctx: &ServiceContext, mut factory: impl FnMut(&Target) -> A + 'static) -> Self {
        Self::with_starter(ctx, Box::new(move |t: &Target| factory(t).start()))
    }

    fn with_starter(ctx: &ServiceContext, starter: Starter<A>) -> Self {
        let after = ctx.config.actors.retire_after_secs;
        TargetActors {
            actors: HashMap::new(),
            starter,
            gauge: ctx.metrics.targets.clone(),
            retiring: (after > 0).then(|| Retiring {
                after_ms: secs_ms(after),
                remember_ms: secs_ms(ctx.config.bus.jetstream.max_age_secs),
                deregistered: HashMap::new(),
                retired: HashMap::new(),
                retired_total: ctx.metrics.targets_retired.clone(),
                dropped: ctx.metrics.retired_target_events.clone(),
            }),
            on_retired: None,
            late: LateEvents::Drop,
            registered: std::collections::HashSet::new(),
            registered_gauge: ctx.metrics.registered_targets.clone(),
            registration_received: ctx.metrics.registration_last_received.clone(),
            max_targets: ctx.config.actors.max_targets,
            require_registration: ctx.config.actors.require_registration,
            follows_registrations: false,
            configured: ctx.config.targets.iter().map(|t| t.target()).collect(),
            refusals: ctx.metrics.target_refusals.clone(),
        }
    }

    /// Whether the service's intake hands these actors every registration (`target/1`): only
    /// then does `actors.require_registration` apply ([`run_actors`] sets it from what the
    /// service consumes).
    pub fn follow_registrations(&mut self, on: bool) {
        self.follows_registrations = on;
    }

    /// Whether `ev` may start an actor for its target, which has none: refused (and counted)
    /// past `actors.max_targets`, or, with `actors.require_registration`, for a target neither
    /// registered nor configured.
    fn may_start(&self, ev: &Event) -> bool {
        let target = ev.target();
        let reason = if self.require_registration
            && self.follows_registrations
            && !self.registered.contains(target)
            && !self.configured.contains(target)
        {
            "unregistered"
        } else if self.actors.len() >= self.max_targets {
            "max_targets"
        } else {
            return true;
        };
        let refused = self.refusals.with_label_values(&[reason]);
        if refused.get() == 0 {
            tracing::warn!(%target, event = %ev.kind(), reason, max_targets = self.max_targets, "event refused: it would start an actor for another target (counted in aware_target_refusals_total)");
        } else {
            tracing::debug!(%target, event = %ev.kind(), reason, "event refused");
        }
        refused.inc();
        false
    }

    /// The same, calling `f` once for every target that becomes retired — its actor stopped by
    /// [`TargetActors::sweep`], or an old deregistration read at start-up retiring it without
    /// one — so the service can forget the state it published for it.
    pub fn with_on_retired(mut self, f: impl FnMut(&Target) + 'static) -> Self {
        self.on_retired = Some(Box::new(f));
        self
    }

    /// The same, with `late` for the events of retired targets.
    pub fn with_late_events(mut self, late: LateEvents) -> Self {
        self.late = late;
        self
    }

    /// The actor of `target`, started on first use (must run inside an actix system).
    pub fn get_or_start(&mut self, target: &Target) -> &Addr<A> {
        if !self.actors.contains_key(target) {
            let addr = (self.starter)(target);
            self.actors.insert(target.clone(), addr);
            self.set_gauge();
            tracing::debug!(%target, "target actor started");
        }
        &self.actors[target]
    }

    fn set_gauge(&self) {
        self.gauge
            .set(i64::try_from(self.actors.len()).unwrap_or(i64::MAX));
    }

    /// Delivers an event to its target's actor; see the type's documentation for retired targets.
    pub fn route(&mut self, ev: Event) {
        self.route_at(ev, aware_bus_schemas::now_ms());
    }

    /// [`TargetActors::route`] at the time `now_ms`.
    pub fn route_at(&mut self, ev: Event, now_ms: i64) {
        if self.admit_at(&ev, now_ms) {
            let target = ev.target().clone();
            self.get_or_start(&target).do_send(Deliver(ev));
        }
    }

    /// The retirement bookkeeping of [`TargetActors::route_at`] without the delivery: whether
    /// `ev`, received at `now_ms`, is to be handed to its target's actor
    /// ([`TargetActors::get_or_start`]), for a service that sends its actors another message.
    /// An event whose target has no actor yet is refused past `actors.max_targets`, and, with
    /// `actors.require_registration`, unless the target is registered or configured.
    pub fn admit_at(&mut self, ev: &Event, now_ms: i64) -> bool {
        self.admit_retiring(ev, now_ms)
            && (self.actors.contains_key(ev.target()) || self.may_start(ev))
    }

    fn admit_retiring(&mut self, ev: &Event, now_ms: i64) -> bool {
        // A deregistration of a target this service knows (configured, or registered before this
        // message) is live news whatever the message's time says. Looked up for deregistrations
        // only: every other event passes here too.
        let known = matches!(ev, Event::Registration(r) if r.spec.is_none())
            && (self.configured.contains(ev.target()) || self.registered.contains(ev.target()));
        if let Event::Registration(reg) = ev {
            if reg.spec.is_some() {
                self.registered.insert(reg.target.clone());
            } else {
                self.registered.remove(&reg.target);
            }
            self.registered_gauge
                .set(i64::try_from(self.registered.len()).unwrap_or(i64::MAX));
            self.registration_received.set(now_ms as f64 / 1000.0);
        }
        let Some(r) = self.retiring.as_mut() else {
            return true;
        };
        let target = ev.target();
        let live = self.actors.contains_key(target);
        match ev {
            Event::Registration(reg) if reg.spec.is_some() => {
                // Created (again): a retired target starts afresh.
                r.deregistered.remove(target);
                if r.retired.remove(target).is_some() {
                    tracing::info!(%target, "retired target registered again: a new actor starts");
                }
            }
            Event::Registration(reg) => {
                if r.retired.contains_key(target) {
                    return false; // a repeat (a resync, the bus's retained state)
                }
                if !live && !known && now_ms.saturating_sub(reg.ts_ms) >= r.after_ms {
                    // An old deregistration of a target this service never heard of (a restart
                    // reading the bus's retained state): retired without an actor. Only then is
                    // the sender's time trusted: a forged old stamp for a configured or
                    // registered target must not drop its events at once.
                    r.mark_retired(target.clone(), reg.ts_ms);
                    if let Some(f) = self.on_retired.as_mut() {
                        f(target);
                    }
                    return false;
                }
                // The delay runs on this service's clock from receipt: a deregistration stamped
                // long ago (a skewed or forged `ts_ms`) must not stop a live actor at once.
                r.deregistered.entry(target.clone()).or_insert(now_ms);
            }
            _ if r.retired.contains_key(target) => {
                r.dropped.inc();
                match self.late {
                    LateEvents::Drop => {
                        tracing::debug!(%target, event = %ev.kind(), step = ev.step(), "event of a retired target dropped");
                        return false;
                    }
                    LateEvents::Record => {
                        // Kept, by an actor retired again after the delay.
                        r.retired.remove(target);
                        r.deregistered.insert(target.clone(), now_ms);
                        tracing::info!(%target, event = %ev.kind(), step = ev.step(), "event of a retired target: an actor starts until the delay passes again");
                    }
                }
            }
            _ => {}
        }
        true
    }

    /// Stops the actor of every target deregistered `retire_after_secs` ago or more (their
    /// targets are retired from then on) and forgets retired targets whose time is up; the
    /// targets retired now. The intake loop calls it every [`TargetActors::sweep_every`].
    pub fn sweep(&mut self, now_ms: i64) -> Vec<Target> {
        let Some(r) = self.retiring.as_mut() else {
            return Vec::new();
        };
        r.retired.retain(|_, until| *until > now_ms);
        let due: Vec<Target> = r
            .deregistered
            .iter()
            .filter(|(_, since)| now_ms.saturating_sub(**since) >= r.after_ms)
            .map(|(t, _)| t.clone())
            .collect();
        for t in &due {
            if let Some(since) = r.deregistered.remove(t) {
                r.mark_retired(t.clone(), since);
            }
        }
        for t in &due {
            if let Some(f) = self.on_retired.as_mut() {
                f(t);
            }
            if self.retire(t) {
                if let Some(r) = &self.retiring {
                    r.retired_total.inc();
                }
                tracing::info!(target = %t, "deregistered target retired: its actor stops");
            }
        }
        due
    }

    /// How often the intake loop calls [`TargetActors::sweep`]: a tenth of the retirement delay,
    /// between 100 ms and a minute; `None` when retirement is off.
    pub fn sweep_every(&self) -> Option<std::time::Duration> {
        self.retiring.as_ref().map(|r| {
            std::time::Duration::from_millis(
                u64::try_from(r.after_ms / 10)
                    .unwrap_or(u64::MAX)
                    .clamp(100, 60_000),
            )
        })
    }

    /// Whether `target` is retired: its events are dropped.
    pub fn is_retired(&self, target: &Target) -> bool {
        self.retiring
            .as_ref()
            .is_some_and(|r| r.retired.contains_key(target))
    }

    /// Stops `target`'s actor, if it has one ([`Retire`]); whether it had one. An event for it
    /// later starts a new one unless the target is retired ([`TargetActors::sweep`]).
    pub fn retire(&mut self, target: &Target) -> bool {
        let Some(addr) = self.actors.remove(target) else {
            return false;
        };
        addr.do_send(Retire);
        self.set_gauge();
        tracing::debug!(%target, "target actor retired");
        true
    }

    pub fn len(&self) -> usize {
        self.actors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.actors.is_empty()
    }
}

impl<A> TargetActors<A>
where
    A: Actor<Context = Context<A>> + Handler<Deliver> + Handler<Retire> + Send,
{
    /// [`TargetActors::new`] with the actors spread over the process's arbiters
    /// (`ctx.arbiters`, `actors.arbiters`), each target's on the arbiter of its key
    /// ([`crate::arbiters::ArbiterPool::arbiter_of`]); without arbiters, as `new`. The actor is
    /// made here and moved to its arbiter, where it starts.
    pub fn spread(ctx: &ServiceContext, mut factory: impl FnMut(&Target) -> A + 'static) -> Self {
        match ctx.arbiters.clone() {
            Some(pool) => Self::with_starter(
                ctx,
                Box::new(move |t: &Target| {
                    let actor = factory(t);
                    A::start_in_arbiter(pool.arbiter_of(t), move |_| actor)
                }),
            ),
            None => Self::new(ctx, factory),
        }
    }
}

/// The intake loop shared by every service: subscribes to `consumes`, reports ready, and hands
/// each decoded event to `on_event` until shutdown (and a tick every `tick`, if given). With
/// nothing to consume it only waits.
async fn intake(
    ctx: &ServiceContext,
    consumes: &[aware_bus_schemas::EventKind],
    mut retire: Option<mpsc::UnboundedReceiver<Target>>,
    tick: Option<std::time::Duration>,
    mut on: impl FnMut(Intake),
) -> Result<(), crate::service::ServiceError> {
    let mut rx = if consumes.is_empty() {
        None
    } else {
        Some(ctx.subscribe_events(consumes).await?)
    };
    let mut ticks = tick.map(sweep_ticks);
    ctx.ready.set(true);
    tracing::info!(service = ctx.name, bus = ctx.bus.kind(), "ready");
    match rx.as_mut() {
        None => ctx.shutdown.cancelled().await,
        Some(rx) => loop {
            tokio::select! {
                _ = ctx.shutdown.cancelled() => break,
                ev = rx.recv() => match ev {
                    Some(ev) => on(Intake::Event(ev)),
                    None => break,
                },
                t = async { retire.as_mut()?.recv().await }, if retire.is_some() => match t {
                    Some(t) => on(Intake::Retire(t)),
                    None => retire = None,
                },
                _ = async { ticks.as_mut()?.tick().await; Some(()) }, if ticks.is_some() => {
                    on(Intake::Tick)
                }
            }
        },
    }
    ctx.ready.set(false);
    Ok(())
}

/// The ticks of a loop that calls [`TargetActors::sweep`] every `every`
/// ([`TargetActors::sweep_every`]); a late tick delays the next rather than bursting.
pub fn sweep_ticks(every: std::time::Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval(every);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// What the intake loop hands on: an event, a target whose actor is to stop, or a tick.
// Handed on at once, never stored: boxing the event would allocate for every event.
#[allow(clippy::large_enum_variant)]
enum Intake {
    Event(aware_bus_schemas::Event),
    Retire(Target),
    Tick,
}

/// The intake loop of a service: routes every decoded event of `consumes` for the targets of
/// this instance's shard (its subscriptions carry only their slots,
/// [`ServiceContext::subscribe_events`]) to its target's actor until shutdown, retiring
/// deregistered targets ([`TargetActors::sweep`]).
pub async fn run_actors<A>(
    ctx: &ServiceContext,
    consumes: &[aware_bus_schemas::EventKind],
    actors: &mut TargetActors<A>,
) -> Result<(), crate::service::ServiceError>
where
    A: Actor<Context = Context<A>> + Handler<Deliver> + Handler<Retire>,
{
    run(ctx, consumes, actors, None).await
}

/// [`run_actors`], also stopping the actor of every target received on `retire`
/// ([`TargetActors::retire`]).
pub async fn run_actors_retiring<A>(
    ctx: &ServiceContext,
    consumes: &[aware_bus_schemas::EventKind],
    actors: &mut TargetActors<A>,
    retire: mpsc::UnboundedReceiver<Target>,
) -> Result<(), crate::service::ServiceError>
where
    A: Actor<Context = Context<A>> + Handler<Deliver> + Handler<Retire>,
{
    run(ctx, consumes, actors, Some(retire)).await
}

async fn run<A>(
    ctx: &ServiceContext,
    consumes: &[aware_bus_schemas::EventKind],
    actors: &mut TargetActors<A>,
    retire: Option<mpsc::UnboundedReceiver<Target>>,
) -> Result<(), crate::service::ServiceError>
where
    A: Actor<Context = Context<A>> + Handler<Deliver> + Handler<Retire>,
{
    let tick = actors.sweep_every();
    actors.follow_registrations(consumes.contains(&aware_bus_schemas::EventKind::Target));
    intake(ctx, consumes, retire, tick, |i| match i {
        Intake::Event(ev) => actors.route(ev),
        Intake::Retire(t) => {
            actors.retire(&t);
        }
        Intake::Tick => {
            actors.sweep(aware_bus_schemas::now_ms());
        }
    })
    .await
}

/// The intake loop of a service without per-target actors: decodes and counts every event of
/// `consumes` (malformed ones as decode errors) until shutdown; with none, it only waits.
pub async fn run_intake(
    ctx: &ServiceContext,
    consumes: &[aware_bus_schemas::EventKind],
) -> Result<(), crate::service::ServiceError> {
    intake(ctx, consumes, None, None, |i| {
        if let Intake::Event(ev) = i {
            tracing::trace!(service = ctx.name, event = %ev.kind(), target = %ev.target(), step = ev.step(), "received")
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use actix::ActorContext;
    use aware_bus_schemas::generated::samples;

    use super::*;
    use crate::bus::Bus;
    use crate::config::AppConfig;
    use crate::testkit::registration;

    /// Records what it is handed: (actor number, event kind or "retire").
    struct Probe {
        id: usize,
        log: Arc<Mutex<Vec<(usize, String)>>>,
    }

    impl Actor for Probe {
        type Context = Context<Self>;
    }

    impl Handler<Deliver> for Probe {
        type Result = ();
        fn handle(&mut self, Deliver(ev): Deliver, _: &mut Self::Context) {
            let kind = ev.kind().to_string();
            self.log.lock().unwrap().push((self.id, kind));
        }
    }

    impl Handler<Retire> for Probe {
        type Result = ();
        fn handle(&mut self, _: Retire, ctx: &mut Self::Context) {
            self.log.lock().unwrap().push((self.id, "retire".into()));
            ctx.stop();
        }
    }

    fn obs_of(target: &Target) -> Event {
        let mut ev = samples()
            .into_iter()
            .find(|e| matches!(e, Event::Obs(_)))
            .unwrap();
        if let Event::Obs(o) = &mut ev {
            o.target = target.clone();
        }
        ev
    }

    fn actors(
        retire_after_secs: u64,
        log: &Arc<Mutex<Vec<(usize, String)>>>,
    ) -> (TargetActors<Probe>, ServiceContext) {
        let mut cfg = AppConfig::default();
        cfg.actors.retire_after_secs = retire_after_secs;
        cfg.bus.jetstream.max_age_secs = 100;
        actors_with(cfg, log)
    }

    /// A service context on an in-process bus, configured by `cfg`.
    fn probe_ctx(cfg: AppConfig) -> ServiceContext {
        ServiceContext::new(
            "probe",
            Bus::in_process(16),
            Arc::new(cfg),
            tokio_util::sync::CancellationToken::new(),
        )
        .unwrap()
    }

    /// The actors of a service configured by `cfg`; each new actor logs under the next id.
    fn actors_with(
        cfg: AppConfig,
        log: &Arc<Mutex<Vec<(usize, String)>>>,
    ) -> (TargetActors<Probe>, ServiceContext) {
        let ctx = probe_ctx(cfg);
        let (log, mut next) = (log.clone(), 0);
        let actors = TargetActors::new(&ctx, move |_: &Target| {
            next += 1;
            Probe {
                id: next,
                log: log.clone(),
            }
        });
        (actors, ctx)
    }

    /// What each actor was handed, in its order (actors run concurrently).
    fn by_actor(log: &Arc<Mutex<Vec<(usize, String)>>>) -> Vec<(usize, String)> {
        let mut l = log.lock().unwrap().clone();
        l.sort_by_key(|(id, _)| *id);
        l
    }

    /// Lets the started actors run what was sent to them.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    /// `obs` for 1,000 made-up targets used to start 1,000 actors in every service that takes
    /// them: at most `actors.max_targets` start, the rest are refused and counted; with
    /// `actors.require_registration` none starts for a target neither registered nor configured.
    #[test]
    fn made_up_targets_start_at_most_the_bound_and_unregistered_ones_none() {
        actix_rt::System::new().block_on(async {
            let log = Arc::new(Mutex::new(Vec::new()));
            let mut cfg = AppConfig::default();
            cfg.actors.max_targets = 50;
            let (mut a, ctx) = actors_with(cfg.clone(), &log);
            let refused = |ctx: &ServiceContext, reason: &str| {
                ctx.metrics
                    .target_refusals
                    .with_label_values(&[reason])
                    .get()
            };
            for n in 0..1_000 {
                a.route(obs_of(&Target::new("made", format!("up-{n}"))));
            }
            assert_eq!((a.len(), ctx.metrics.targets.get()), (50, 50));
            assert_eq!(refused(&ctx, "max_targets"), 950);
            // The targets that have an actor still get their events.
            a.route(obs_of(&Target::new("made", "up-0")));
            assert_eq!(refused(&ctx, "max_targets"), 950);
            settle().await;
            assert_eq!(log.lock().unwrap().len(), 51);

            // Registration required: only registered or configured targets get an actor.
            cfg.actors.require_registration = true;
            let configured = Target::new("shop", "cart");
            cfg.targets.push(crate::spec::TargetSpec::new(&configured));
            let (mut a, ctx) = actors_with(cfg, &log);
            a.follow_registrations(true);
            for n in 0..1_000 {
                a.route(obs_of(&Target::new("made", format!("up-{n}"))));
            }
            assert_eq!(a.len(), 0);
            assert_eq!(refused(&ctx, "unregistered"), 1_000);
            a.route(obs_of(&configured));
            let registered = Target::new("shop", "new");
            let spec = crate::registry::to_registered(&ctx.config.spec_for(&registered), None);
            a.route(registration(&registered, 1, Some(spec)).into());
            a.route(obs_of(&registered));
            assert_eq!(a.len(), 2);
            assert_eq!(refused(&ctx, "unregistered"), 1_000);
        });
    }

    /// A live target's deregistration stamped long ago (a skewed or forged `ts_ms`) retires its
    /// actor `retire_after_secs` after it was received, not at once.
    #[test]
    fn a_live_targets_retirement_counts_from_receipt() {
        actix_rt::System::new().block_on(async {
            let log = Arc::new(Mutex::new(Vec::new()));
            let (mut a, _ctx) = actors(10, &log);
            let t = Target::new("shop", "cart");
            let now = 1_000_000_000;
            a.route_at(obs_of(&t), now);
            a.route_at(registration(&t, 0, None).into(), now);
            assert!(a.sweep(now).is_empty(), "not at once");
            assert!(a.sweep(now + 9_999).is_empty());
            assert_eq!(a.sweep(now + 10_000), vec![t.clone()]);
        });
    }

    /// A configured target without an actor yet (no event so far) is not retired at once by a
    /// deregistration stamped long ago (a skewed or forged `ts_ms`): the delay counts from
    /// receipt. An unknown target's old deregistration (a restart's retained state) still is.
    #[test]
    fn a_known_targets_old_deregistration_counts_from_receipt_even_without_an_actor() {
        actix_rt::System::new().block_on(async {
            let log = Arc::new(Mutex::new(Vec::new()));
            let mut cfg = AppConfig::default();
            cfg.actors.retire_after_secs = 10;
            cfg.bus.jetstream.max_age_secs = 100;
            let configured = Target::new("shop", "cart");
            cfg.targets.push(crate::spec::TargetSpec::new(&configured));
            let (mut a, _ctx) = actors_with(cfg, &log);
            let now = 1_000_000_000;
            a.route_at(registration(&configured, 0, None).into(), now);
            assert!(!a.is_retired(&configured), "not at once");
            assert!(a.admit_at(&obs_of(&configured), now + 1));
            assert!(a.sweep(now + 9_999).is_empty());
            assert_eq!(a.sweep(now + 10_000), vec![configured.clone()]);
            // Never heard of: the retained state of a target deleted long ago.
            let unknown = Target::new("shop", "gone");
            a.route_at(registration(&unknown, 0, None).into(), now);
            assert!(a.is_retired(&unknown));
        });
    }

    #[test]
    fn a_deregistered_target_is_retired_after_the_delay_until_it_is_registered_again() {
        actix_rt::System::new().block_on(async {
            let log = Arc::new(Mutex::new(Vec::new()));
            let (mut a, ctx) = actors(10, &log);
            let m = &ctx.metrics;
            let (gone, kept) = (Target::new("shop", "gone"), Target::new("shop", "kept"));
            let spec = crate::registry::to_registered(&ctx.config.spec_for(&gone), None);
            let t0 = 1_000_000;
            a.route_at(
                registration(&gone, t0 - 5_000, Some(spec.clone())).into(),
                t0,
            );
            assert_eq!(m.registered_targets.get(), 1);
            assert_eq!(m.registration_last_received.get(), 1_000.0, "seconds");
            a.route_at(obs_of(&kept), t0);
            a.route_at(registration(&gone, t0, None).into(), t0);
            assert_eq!((a.len(), m.targets.get()), (2, 2));
            assert_eq!(m.registered_targets.get(), 0, "deregistered");
            // A repeated deregistration (a resync) does not move the due time.
            a.route_at(registration(&gone, t0 + 5_000, None).into(), t0 + 5_000);
            assert_eq!(
                m.registration_last_received.get(),
                1_005.0,
                "a repeat counts"
            );
            assert!(a.sweep(t0 + 9_999).is_empty(), "not before the delay");
            assert_eq!(a.sweep(t0 + 10_000), vec![gone.clone()]);
            assert_eq!((a.len(), m.targets.get()), (1, 1));
            assert_eq!(m.targets_retired.get(), 1);
            assert!(a.is_retired(&gone) && !a.is_retired(&kept));
            // Events of the retired target are dropped and start no actor; a repeated
            // deregistration is a no-op.
            a.route_at(obs_of(&gone), t0 + 11_000);
            a.route_at(registration(&gone, t0 + 12_000, None).into(), t0 + 12_000);
            assert_eq!(a.len(), 1);
            assert_eq!(m.retired_target_events.get(), 1);
            settle().await;
            assert_eq!(
                by_actor(&log),
                vec![
                    (1, "target".to_string()),
                    (1, "target".into()),
                    (1, "target".into()),
                    (1, "retire".into()),
                    (2, "obs".into()),
                ]
            );
            // Registered again: a fresh actor, and its events reach it.
            log.lock().unwrap().clear();
            a.route_at(
                registration(&gone, t0 + 20_000, Some(spec)).into(),
                t0 + 20_000,
            );
            a.route_at(obs_of(&gone), t0 + 20_000);
            assert!(!a.is_retired(&gone));
            assert_eq!((a.len(), m.targets.get()), (2, 2));
            assert_eq!(m.registered_targets.get(), 1, "registered again");
            // It is no longer deregistered: no retirement later.
            assert!(a.sweep(t0 + 1_000_000).is_empty());
            settle().await;
            assert_eq!(
                by_actor(&log),
                vec![(3, "target".to_string()), (3, "obs".into())]
            );
        });
    }

    /// The retirement hook runs once per retired target, whether its actor was stopped after
    /// the delay or an old deregistration (a restart's retained state) retired it without one;
    /// not for a target registered again in time, nor for a repeated deregistration.
    #[test]
    fn the_retirement_hook_runs_once_for_every_target_retired() {
        actix_rt::System::new().block_on(async {
            let log = Arc::new(Mutex::new(Vec::new()));
            let (a, ctx) = actors(10, &log);
            let hooked = Arc::new(Mutex::new(Vec::new()));
            let seen = hooked.clone();
            let mut a = a.with_on_retired(move |t: &Target| seen.lock().unwrap().push(t.clone()));
            let (live, back, old) = (
                Target::new("shop", "live"),
                Target::new("shop", "back"),
                Target::new("shop", "old"),
            );
            let spec = crate::registry::to_registered(&ctx.config.spec_for(&back), None);
            let t0 = 1_000_000;
            for t in [&live, &back] {
                a.route_at(obs_of(t), t0);
                a.route_at(registration(t, t0, None).into(), t0);
            }
            a.route_at(registration(&back, t0 + 1, Some(spec)).into(), t0 + 1);
            a.route_at(registration(&old, t0 - 10_000, None).into(), t0);
            assert_eq!(
                *hooked.lock().unwrap(),
                vec![old.clone()],
                "at once, no actor"
            );
            assert!(a.sweep(t0 + 9_999).is_empty());
            assert_eq!(a.sweep(t0 + 10_000), vec![live.clone()]);
            a.route_at(registration(&live, t0 + 11_000, None).into(), t0 + 11_000);
            a.route_at(registration(&old, t0 + 11_000, None).into(), t0 + 11_000);
            a.sweep(t0 + 20_000);
            assert_eq!(*hooked.lock().unwrap(), vec![old, live]);
        });
    }

    /// A forget queued in the outbox runs after what was queued before it: the target's current
    /// state is gone for a later start-up read, and a publish queued after it is kept again.
    #[test]
    fn the_outbox_forgets_state_in_order() {
        actix_rt::System::new().block_on(async {
            let ctx = probe_ctx(AppConfig::default());
            let lifecycle = samples()
                .into_iter()
                .find(|e| e.kind() == aware_bus_schemas::EventKind::Lifecycle)
                .unwrap();
            let target = lifecycle.target().clone();
            let kind = aware_bus_schemas::EventKind::Lifecycle;
            let stages = |ctx: ServiceContext| async move { ctx.current_state(kind).await.len() };
            let (outbox, publisher) = spawn_publisher(ctx.clone());
            assert!(outbox.send(lifecycle.clone()));
            assert!(outbox.forget_state(kind, &target));
            drop(outbox);
            publisher.await.unwrap();
            assert_eq!(stages(ctx.clone()).await, 0, "forgotten after the publish");
            let (outbox, publisher) = spawn_publisher(ctx.clone());
            assert!(outbox.forget_state(kind, &target));
            assert!(outbox.send(lifecycle));
            drop(outbox);
            publisher.await.unwrap();
            assert_eq!(stages(ctx).await, 1, "published after the forget");
        });
    }

    #[test]
    fn an_old_deregistration_retires_without_an_actor_and_is_remembered_for_the_bus_retention() {
        actix_rt::System::new().block_on(async {
            let log = Arc::new(Mutex::new(Vec::new()));
            let (mut a, ctx) = actors(10, &log);
            let t = Target::new("shop", "old");
            let t0 = 1_000_000;
            // A restart reads a deregistration 10 s old from the bus's retained state.
            a.route_at(registration(&t, t0 - 10_000, None).into(), t0);
            assert!(a.is_empty() && a.is_retired(&t));
            assert_eq!(ctx.metrics.targets_retired.get(), 0, "no actor was stopped");
            a.route_at(obs_of(&t), t0);
            assert!(a.is_empty());
            // Remembered until the retirement's due time plus the bus's retention (100 s).
            a.sweep(t0 + 99_999);
            assert!(a.is_retired(&t));
            a.sweep(t0 + 100_000);
            assert!(!a.is_retired(&t));
            a.route_at(obs_of(&t), t0 + 100_000);
            assert_eq!(a.len(), 1);
            assert_eq!(ctx.metrics.retired_target_events.get(), 1);
            settle().await;
            assert_eq!(*log.lock().unwrap(), vec![(1, "obs".to_string())]);
        });
    }

    #[test]
    fn recording_late_events_starts_an_actor_retired_again_after_the_delay() {
        actix_rt::System::new().block_on(async {
            let log = Arc::new(Mutex::new(Vec::new()));
            let (a, ctx) = actors(10, &log);
            let mut a = a.with_late_events(LateEvents::Record);
            let m = &ctx.metrics;
            let t = Target::new("shop", "gone");
            let t0 = 1_000_000;
            a.route_at(obs_of(&t), t0);
            a.route_at(registration(&t, t0, None).into(), t0);
            assert_eq!(a.sweep(t0 + 10_000), vec![t.clone()]);
            assert!(a.is_empty() && a.is_retired(&t));
            // A late event is counted and kept, by a new actor...
            a.route_at(obs_of(&t), t0 + 50_000);
            assert!(a.admit_at(&obs_of(&t), t0 + 51_000), "no longer retired");
            assert_eq!((a.len(), m.retired_target_events.get()), (1, 1));
            assert!(!a.is_retired(&t));
            // ...retired again the delay after it started, not at the first deregistration's
            // due time.
            assert!(a.sweep(t0 + 59_999).is_empty());
            assert_eq!(a.sweep(t0 + 60_000), vec![t.clone()]);
            assert_eq!((a.len(), m.targets_retired.get()), (0, 2));
            assert!(a.is_retired(&t));
            // A repeated deregistration still changes nothing.
            a.route_at(registration(&t, t0 + 61_000, None).into(), t0 + 61_000);
            assert!(a.is_empty());
            settle().await;
            assert_eq!(
                by_actor(&log),
                vec![
                    (1, "obs".to_string()),
                    (1, "target".into()),
                    (1, "retire".into()),
                    (2, "obs".into()),
                    (2, "retire".into()),
                ]
            );
            // The default drops it, as before.
            let (mut d, ctx) = actors(10, &log);
            d.route_at(registration(&t, t0 - 20_000, None).into(), t0);
            assert!(!d.admit_at(&obs_of(&t), t0));
            assert_eq!((d.len(), ctx.metrics.retired_target_events.get()), (0, 1));
        });
    }

    #[test]
    fn with_retirement_off_a_deregistered_target_keeps_its_actor() {
        actix_rt::System::new().block_on(async {
            let log = Arc::new(Mutex::new(Vec::new()));
            let (mut a, ctx) = actors(0, &log);
            assert_eq!(a.sweep_every(), None);
            let t = Target::new("shop", "old");
            a.route_at(registration(&t, 0, None).into(), 1_000_000_000);
            assert!(a.sweep(2_000_000_000).is_empty());
            a.route_at(obs_of(&t), 2_000_000_000);
            assert_eq!(a.len(), 1);
            assert_eq!(ctx.metrics.retired_target_events.get(), 0);
        });
    }

    /// Records, per handled event, its target, its step and the thread that handled it, and
    /// queues the event on the outbox, if it has one; counts its own drops.
    struct Spot {
        log: Arc<Mutex<Vec<(Target, u32, std::thread::ThreadId)>>>,
        outbox: Option<Outbox>,
        dropped: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Actor for Spot {
        type Context = Context<Self>;
    }

    impl Handler<Deliver> for Spot {
        type Result = ();
        fn handle(&mut self, Deliver(ev): Deliver, _: &mut Self::Context) {
            // A little work, so that the arbiters run side by side.
            let t0 = std::time::Instant::now();
            while t0.elapsed() < std::time::Duration::from_micros(20) {
                std::hint::spin_loop();
            }
            let entry = (ev.target().clone(), ev.step(), std::thread::current().id());
            self.log.lock().unwrap().push(entry);
            if let Some(outbox) = &self.outbox {
                outbox.send(ev);
            }
        }
    }

    impl Handler<Retire> for Spot {
        type Result = ();
        fn handle(&mut self, _: Retire, ctx: &mut Self::Context) {
            ctx.stop();
        }
    }

    impl Drop for Spot {
        fn drop(&mut self) {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    type SpotLog = Arc<Mutex<Vec<(Target, u32, std::thread::ThreadId)>>>;

    /// Spread actors of a context with `arbiters` arbiters, on an in-process bus.
    fn spots(
        arbiters: usize,
    ) -> (
        TargetActors<Spot>,
        ServiceContext,
        crate::arbiters::ArbiterPool,
        SpotLog,
        Arc<std::sync::atomic::AtomicUsize>,
        tokio::task::JoinHandle<()>,
    ) {
        let pool = crate::arbiters::ArbiterPool::start(arbiters).unwrap();
        let ctx = ServiceContext::new(
            "probe",
            Bus::in_process(64),
            Arc::new(AppConfig::default()),
            tokio_util::sync::CancellationToken::new(),
        )
        .unwrap()
        .with_arbiters(Some(pool.clone()));
        let (outbox, publisher) = spawn_publisher(ctx.clone());
        let log: SpotLog = Arc::default();
        let dropped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (l, d) = (log.clone(), dropped.clone());
        let actors = TargetActors::spread(&ctx, move |_: &Target| Spot {
            log: l.clone(),
            outbox: Some(outbox.clone()),
            dropped: d.clone(),
        });
        (actors, ctx, pool, log, dropped, publisher)
    }

    fn obs_at(target: &Target, step: u32) -> Event {
        let mut ev = obs_of(target);
        if let Event::Obs(o) = &mut ev {
            o.step = step;
        }
        ev
    }

    /// Waits until `log` holds `n` entries (or ten seconds passed); its length.
    async fn wait_for(log: &SpotLog, n: usize) -> usize {
        for _ in 0..1_000 {
            if log.lock().unwrap().len() >= n {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        log.lock().unwrap().len()
    }

    /// With two arbiters the actors of different targets run on two threads other than the
    /// intake's, each target's always on the thread of its arbiter; every target's events are
    /// handled, and published through the outbox, in the order they were routed, while the
    /// targets' events were interleaved.
    #[test]
    fn spread_actors_run_on_their_targets_arbiter_and_keep_each_targets_order() {
        actix_rt::System::new().block_on(async {
            let (mut a, ctx, pool, log, _, publisher) = spots(2);
            let mut sub = ctx
                .bus
                .subscribe(&aware_bus_schemas::subject::kind_filter(
                    aware_bus_schemas::EventKind::Obs,
                ))
                .await
                .unwrap();
            let targets: Vec<Target> = (0..40)
                .map(|i| Target::new("shop", format!("t-{i}")))
                .collect();
            let steps = 100u32;
            for step in 0..steps {
                for t in &targets {
                    a.route(obs_at(t, step));
                }
            }
            let total = targets.len() * steps as usize;
            assert_eq!(wait_for(&log, total).await, total);
            let log = log.lock().unwrap().clone();
            let here = std::thread::current().id();
            let mut thread_of: HashMap<Target, std::thread::ThreadId> = HashMap::new();
            let mut next: HashMap<Target, u32> = HashMap::new();
            for (t, step, thread) in &log {
                assert_ne!(*thread, here, "an actor ran on the intake's thread");
                assert_eq!(
                    *thread_of.entry(t.clone()).or_insert(*thread),
                    *thread,
                    "{t} moved"
                );
                let want = next.entry(t.clone()).or_insert(0);
                assert_eq!(*step, *want, "{t} out of order");
                *want += 1;
            }
            // One thread per arbiter: targets of the same arbiter share it, the others do not.
            let mut by_arbiter: HashMap<usize, std::collections::HashSet<std::thread::ThreadId>> =
                HashMap::new();
            for (t, thread) in &thread_of {
                by_arbiter
                    .entry(crate::arbiters::arbiter_index(t, pool.len()))
                    .or_default()
                    .insert(*thread);
            }
            assert_eq!(by_arbiter.len(), 2, "the targets use both arbiters");
            assert!(by_arbiter.values().all(|s| s.len() == 1));
            assert_ne!(by_arbiter[&0], by_arbiter[&1]);
            // The outbox publishes each target's events in its order.
            let mut published: HashMap<Target, u32> = HashMap::new();
            for _ in 0..total {
                let m = tokio::time::timeout(std::time::Duration::from_secs(10), sub.next())
                    .await
                    .unwrap()
                    .unwrap();
                let ev = aware_bus_schemas::decode_any(&m.payload).unwrap();
                let want = published.entry(ev.target().clone()).or_insert(0);
                assert_eq!(ev.step(), *want, "{} published out of order", ev.target());
                *want += 1;
            }
            assert!(published.values().all(|n| *n == steps));
            ctx.shutdown.cancel();
            drop(a);
            join_publisher(publisher).await.unwrap();
            assert!(pool.stop(std::time::Duration::from_secs(10)).await);
        });
    }

    /// Stopping the arbiters ends their threads and drops every actor on them (with what they
    /// hold), also while they are still alive and addressed; a second stop is a no-op, and an
    /// event routed afterwards reaches no actor (and blocks nothing).
    #[test]
    fn stopping_the_arbiters_drops_every_actor_and_ends_their_threads() {
        actix_rt::System::new().block_on(async {
            let (mut a, ctx, pool, log, dropped, publisher) = spots(3);
            let targets: Vec<Target> = (0..30)
                .map(|i| Target::new("shop", format!("s-{i}")))
                .collect();
            for t in &targets {
                a.route(obs_at(t, 0));
            }
            assert_eq!(wait_for(&log, targets.len()).await, targets.len());
            assert_eq!(pool.alive(), 3);
            assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 0);
            assert!(pool.stop(std::time::Duration::from_secs(10)).await);
            assert_eq!(pool.alive(), 0, "every arbiter thread ended");
            assert_eq!(
                dropped.load(std::sync::atomic::Ordering::SeqCst),
                targets.len(),
                "every actor dropped with its arbiter"
            );
            assert!(pool.stop(std::time::Duration::from_secs(1)).await);
            a.route(obs_at(&targets[0], 1));
            assert_eq!(log.lock().unwrap().len(), targets.len());
            ctx.shutdown.cancel();
            drop(a);
            join_publisher(publisher).await.unwrap();
        });
    }

    /// What the launched probe service's actors handled: (target, step, thread).
    static LAUNCHED: std::sync::OnceLock<SpotLog> = std::sync::OnceLock::new();

    /// A service whose per-target actors are spread ([`TargetActors::spread`]): the recommender's
    /// and the actuator's intake, with actors that record where they ran.
    fn probe_service(
        ctx: ServiceContext,
    ) -> futures::future::LocalBoxFuture<'static, Result<(), crate::service::ServiceError>> {
        Box::pin(async move {
            let (_outbox, publisher) = spawn_publisher(ctx.clone());
            let log = LAUNCHED.get_or_init(Arc::default).clone();
            let dropped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut actors = TargetActors::spread(&ctx, move |_: &Target| Spot {
                log: log.clone(),
                outbox: None,
                dropped: dropped.clone(),
            });
            run_actors(&ctx, &[aware_bus_schemas::EventKind::Obs], &mut actors).await?;
            drop(actors);
            join_publisher(publisher).await
        })
    }

    /// The launcher starts `actors.arbiters` arbiters for the services of its process, their
    /// actors run there (not on the services' thread), and once the services have ended at
    /// shutdown the arbiters' threads have ended too.
    #[test]
    fn the_launcher_spreads_actors_over_its_arbiters_and_stops_them_at_shutdown() {
        actix_rt::System::new().block_on(async {
            let mut cfg = AppConfig::default();
            cfg.actors.arbiters = 2;
            cfg.http.listen = "127.0.0.1:0".into();
            let bus = Bus::in_process(256);
            let shutdown = tokio_util::sync::CancellationToken::new();
            let entry = crate::launcher::ServiceEntry {
                name: "probe",
                main: probe_service,
                notice: None,
                sharded: true,
            };
            let running =
                crate::launcher::start_on(bus.clone(), Arc::new(cfg), &[entry], shutdown.clone())
                    .await
                    .unwrap();
            let pool = running.arbiters().cloned().unwrap();
            assert_eq!((pool.len(), pool.alive()), (2, 2));
            for _ in 0..500 {
                if running.contexts[0].ready.get() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            let targets: Vec<Target> = (0..20)
                .map(|i| Target::new("shop", format!("l-{i}")))
                .collect();
            for t in &targets {
                let Event::Obs(o) = obs_at(t, 0) else {
                    unreachable!()
                };
                let subj =
                    aware_bus_schemas::subject::subject(aware_bus_schemas::EventKind::Obs, t)
                        .unwrap();
                bus.publish(&subj, aware_bus_schemas::encode(&o).unwrap().into())
                    .await
                    .unwrap();
            }
            let log = LAUNCHED.get_or_init(Arc::default).clone();
            assert_eq!(wait_for(&log, targets.len()).await, targets.len());
            let here = std::thread::current().id();
            let threads: std::collections::HashSet<_> =
                log.lock().unwrap().iter().map(|(_, _, th)| *th).collect();
            assert!(
                !threads.contains(&here),
                "an actor ran on the services' thread"
            );
            assert_eq!(threads.len(), 2, "both arbiters ran actors");
            shutdown.cancel();
            running.join().await.unwrap();
            assert_eq!(pool.alive(), 0, "the arbiters stopped with the services");
        });
    }

    /// Outside the launcher (no arbiters) `spread` starts the actors on the caller's thread.
    #[test]
    fn without_arbiters_spread_actors_run_on_the_callers_thread() {
        actix_rt::System::new().block_on(async {
            let ctx = probe_ctx(AppConfig::default());
            let (outbox, _publisher) = spawn_publisher(ctx.clone());
            let log: SpotLog = Arc::default();
            let (l, dropped) = (
                log.clone(),
                Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            );
            let mut a = TargetActors::spread(&ctx, move |_: &Target| Spot {
                log: l.clone(),
                outbox: Some(outbox.clone()),
                dropped: dropped.clone(),
            });
            a.route(obs_at(&Target::new("shop", "cart"), 0));
            assert_eq!(wait_for(&log, 1).await, 1);
            assert_eq!(log.lock().unwrap()[0].2, std::thread::current().id());
        });
    }

    #[test]
    fn the_sweep_runs_a_tenth_of_the_delay_apart_within_bounds() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let every = |secs| actors(secs, &log).0.sweep_every();
        let ms = std::time::Duration::from_millis;
        assert_eq!(every(1), Some(ms(100)));
        assert_eq!(every(30), Some(ms(3_000)));
        assert_eq!(every(3600), Some(ms(60_000)));
    }
}
