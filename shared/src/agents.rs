//! Per-target actix actors: every managed target is one actor inside the service that owns it.
//! Events are routed to the target's actor (created on first sight); what actors publish goes
//! through one ordered [`Outbox`] per service.

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
    tx: mpsc::UnboundedSender<Event>,
}

impl Outbox {
    /// Queues an event for publishing; returns false when the service is shutting down.
    pub fn send(&self, ev: impl Into<Event>) -> bool {
        self.tx.send(ev.into()).is_ok()
    }
}

/// Waits for a service's publisher task (see [`spawn_publisher`]) to finish.
pub async fn join_publisher(
    publisher: tokio::task::JoinHandle<()>,
) -> Result<(), crate::service::ServiceError> {
    publisher
        .await
        .map_err(|e| crate::service::ServiceError::Other(format!("publisher task: {e}")))
}

/// Starts the publisher task of a service. It publishes the outbox in order and ends when every
/// [`Outbox`] clone is dropped or at shutdown (after draining what is queued), flushing the bus.
pub fn spawn_publisher(ctx: ServiceContext) -> (Outbox, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
    let handle = tokio::spawn(async move {
        loop {
            tokio::select! {
                biased;
                ev = rx.recv() => match ev {
                    // Failures are counted and logged by `publish_event`.
                    Some(ev) => { let _ = ctx.publish_event(&ev).await; }
                    None => break,
                },
                _ = ctx.shutdown.cancelled() => {
                    while let Ok(ev) = rx.try_recv() {
                        let _ = ctx.publish_event(&ev).await;
                    }
                    break;
                }
            }
        }
        if let Err(e) = ctx.bus.flush().await {
            tracing::warn!(service = ctx.name, error = %e, "final flush failed");
        }
    });
    (Outbox { tx }, handle)
}

/// The actors of one service, one per target.
pub struct TargetActors<A>
where
    A: Actor<Context = Context<A>> + Handler<Deliver>,
{
    actors: HashMap<Target, Addr<A>>,
    factory: Box<dyn FnMut(&Target) -> A>,
    gauge: prometheus::IntGauge,
}

impl<A> TargetActors<A>
where
    A: Actor<Context = Context<A>> + Handler<Deliver>,
{
    pub fn new(ctx: &ServiceContext, factory: impl FnMut(&Target) -> A + 'static) -> Self {
        TargetActors {
            actors: HashMap::new(),
            factory: Box::new(factory),
            gauge: ctx.metrics.targets.clone(),
        }
    }

    /// The actor of `target`, started on first use (must run inside an actix system).
    pub fn get_or_start(&mut self, target: &Target) -> &Addr<A> {
        if !self.actors.contains_key(target) {
            let actor = (self.factory)(target);
            self.actors.insert(target.clone(), actor.start());
            self.gauge
                .set(i64::try_from(self.actors.len()).unwrap_or(i64::MAX));
            tracing::debug!(%target, "target actor started");
        }
        &self.actors[target]
    }

    /// Delivers an event to its target's actor.
    pub fn route(&mut self, ev: Event) {
        let target = ev.target().clone();
        self.get_or_start(&target).do_send(Deliver(ev));
    }

    /// Stops `target`'s actor, if it has one ([`Retire`]); an event for it later starts a new one.
    pub fn retire(&mut self, target: &Target)
    where
        A: Handler<Retire>,
    {
        if let Some(addr) = self.actors.remove(target) {
            addr.do_send(Retire);
            self.gauge
                .set(i64::try_from(self.actors.len()).unwrap_or(i64::MAX));
            tracing::debug!(%target, "target actor retired");
        }
    }

    pub fn len(&self) -> usize {
        self.actors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.actors.is_empty()
    }
}

/// The intake loop shared by every service: subscribes to `consumes`, reports ready, and hands
/// each decoded event to `on_event` until shutdown. With nothing to consume it only waits.
async fn intake(
    ctx: &ServiceContext,
    consumes: &[aware_bus_schemas::EventKind],
    mut retire: Option<mpsc::UnboundedReceiver<Target>>,
    mut on: impl FnMut(Intake),
) -> Result<(), crate::service::ServiceError> {
    let mut rx = if consumes.is_empty() {
        None
    } else {
        Some(ctx.subscribe_events(consumes).await?)
    };
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
            }
        },
    }
    ctx.ready.set(false);
    Ok(())
}

/// What the intake loop hands on: an event, or a target whose actor is to stop.
// Handed on at once, never stored: boxing the event would allocate for every event.
#[allow(clippy::large_enum_variant)]
enum Intake {
    Event(aware_bus_schemas::Event),
    Retire(Target),
}

/// The intake loop of a service: routes every decoded event of `consumes` to its target's actor
/// until shutdown. With `sharded`, events of targets outside this instance's shard are skipped.
pub async fn run_actors<A>(
    ctx: &ServiceContext,
    consumes: &[aware_bus_schemas::EventKind],
    sharded: bool,
    actors: &mut TargetActors<A>,
) -> Result<(), crate::service::ServiceError>
where
    A: Actor<Context = Context<A>> + Handler<Deliver>,
{
    intake(ctx, consumes, None, |i| {
        if let Intake::Event(ev) = i {
            if !sharded || ctx.config.shard.owns(ev.target()) {
                actors.route(ev);
            }
        }
    })
    .await
}

/// [`run_actors`], also stopping the actor of every target received on `retire`
/// ([`TargetActors::retire`]).
pub async fn run_actors_retiring<A>(
    ctx: &ServiceContext,
    consumes: &[aware_bus_schemas::EventKind],
    sharded: bool,
    actors: &mut TargetActors<A>,
    retire: mpsc::UnboundedReceiver<Target>,
) -> Result<(), crate::service::ServiceError>
where
    A: Actor<Context = Context<A>> + Handler<Deliver> + Handler<Retire>,
{
    intake(ctx, consumes, Some(retire), |i| match i {
        Intake::Event(ev) => {
            if !sharded || ctx.config.shard.owns(ev.target()) {
                actors.route(ev);
            }
        }
        Intake::Retire(t) => actors.retire(&t),
    })
    .await
}

/// The intake loop of a service without per-target actors: decodes and counts every event of
/// `consumes` (malformed ones as decode errors) until shutdown; with none, it only waits.
pub async fn run_intake(
    ctx: &ServiceContext,
    consumes: &[aware_bus_schemas::EventKind],
) -> Result<(), crate::service::ServiceError> {
    intake(ctx, consumes, None, |i| {
        if let Intake::Event(ev) = i {
            tracing::trace!(service = ctx.name, event = %ev.kind(), target = %ev.target(), step = ev.step(), "received")
        }
    })
    .await
}
