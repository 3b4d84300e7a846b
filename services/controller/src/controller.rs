//! The controller: watches `AwareAutoscaler` objects, registers their targets with the services
//! over the bus (`target/1`), keeps a finalizer so that deleting an object deregisters its target
//! first (the workload keeps its last applied resources), and writes status from the services'
//! `lifecycle`, `action` and `applied` events.
//!
//! Status has one writer: the controller keeps the whole status of every object in memory and
//! sends it as one merge patch of `/status`, so the reconciler's conditions and the event-driven
//! fields never overwrite each other. Event-driven changes are coalesced and written at most once
//! per `status_interval_ms` per object (every step of every target would otherwise be an API
//! call); lifecycle changes go out at the next flush too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aware_bus_schemas::{Event, EventKind, Outcome, Registration, Schema, Target};
use aware_shared::config::ConfigError;
use aware_shared::quantity::{format_cpu, format_memory, parse_cpu_millicores, parse_memory_bytes};
use aware_shared::registry::to_registered;
use aware_shared::service::{ServiceContext, ServiceError};
use aware_shared::telemetry::{ServiceMetrics, TelemetryError};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::runtime::{watcher, Controller};
use kube::{Api, Client, Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::crd::{AwareAutoscaler, AwareAutoscalerStatus, CrdError, Recommendation};

/// The finalizer the controller keeps on every object it manages.
pub const FINALIZER: &str = "aware.dev/deregister";
/// Field manager of the controller's writes.
pub const FIELD_MANAGER: &str = "aware-controller";
/// Condition types written by the controller.
pub const REGISTERED: &str = "Registered";
pub const APPLIED: &str = "Applied";

/// The `[controller]` configuration section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// Namespace to watch; empty: every namespace.
    pub namespace: String,
    /// Every object is reconciled (and its registration re-sent) at least this often, so a
    /// service that started after the controller learns every target.
    pub resync_seconds: u64,
    /// Event-driven status changes are written at most this often per object.
    pub status_interval_ms: u64,
    /// Retry delay after a failed reconciliation.
    pub error_requeue_seconds: u64,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            namespace: String::new(),
            resync_seconds: 30,
            status_interval_ms: 2000,
            error_requeue_seconds: 10,
        }
    }
}

impl ControllerConfig {
    /// Problems with the values, as `(key, reason)`.
    pub fn validate(&self) -> Result<(), ServiceError> {
        let bad = |key: &str, why: &str| {
            Err(ServiceError::Config(ConfigError::Invalid {
                key: format!("controller.{key}"),
                reason: why.to_string(),
            }))
        };
        if self.resync_seconds == 0 {
            return bad("resync_seconds", "must be at least 1");
        }
        if self.status_interval_ms == 0 {
            return bad("status_interval_ms", "must be at least 1");
        }
        if self.error_requeue_seconds == 0 {
            return bad("error_requeue_seconds", "must be at least 1");
        }
        Ok(())
    }
}

/// Why a reconciliation failed (it is retried).
#[derive(Debug, Error)]
pub enum ControllerError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("bus: {0}")]
    Bus(#[from] ServiceError),
    #[error("the object has no namespace or name")]
    Unnamed,
}

/// The object a target belongs to: `namespace/name` of the `AwareAutoscaler`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Default)]
struct Tracked {
    /// target → the object managing it.
    owners: HashMap<Target, ObjectKey>,
    /// The status the controller wants each object to have.
    status: HashMap<ObjectKey, AwareAutoscalerStatus>,
    /// Objects whose status changed since the last write.
    dirty: Vec<ObjectKey>,
}

/// The controller's metrics (in the service's registry).
#[derive(Clone)]
pub struct ControllerMetrics {
    pub reconciles: prometheus::IntCounterVec,
    pub status_writes: prometheus::IntCounterVec,
    pub managed: prometheus::IntGauge,
    /// Failures of the list/watch of AwareAutoscalers (each retried with backoff).
    pub watch_errors: prometheus::IntCounter,
}

impl ControllerMetrics {
    pub fn new(m: &ServiceMetrics) -> Result<Self, TelemetryError> {
        // Every result at 0 from the start, so a scrape (and an alert's rate) sees the series.
        Ok(ControllerMetrics {
            reconciles: m.counter_vec(
                "controller_reconciles_total",
                "Reconciliations by result (registered, invalid, target_missing, deregistered, error)",
                &["result"],
                &[
                    &["registered"],
                    &["invalid"],
                    &["target_missing"],
                    &["deregistered"],
                    &["error"],
                ],
            )?,
            status_writes: m.counter_vec(
                "controller_status_writes_total",
                "Status patches by result (ok, error)",
                &["result"],
                &[&["ok"], &["error"]],
            )?,
            managed: m.gauge(
                "controller_managed_targets",
                "Targets registered with the services",
            )?,
            watch_errors: m.counter(
                "controller_watch_errors_total",
                "Failed lists or watches of AwareAutoscalers (API server unreachable, RBAC), each retried with backoff",
            )?,
        })
    }
}

/// What the reconciler and the status writer share.
pub struct Shared {
    pub client: Client,
    pub ctx: ServiceContext,
    pub config: ControllerConfig,
    pub metrics: ControllerMetrics,
    tracked: Mutex<Tracked>,
}

impl Shared {
    pub fn new(
        client: Client,
        ctx: ServiceContext,
        config: ControllerConfig,
    ) -> Result<Arc<Self>, ServiceError> {
        let metrics = ControllerMetrics::new(&ctx.metrics)?;
        Ok(Arc::new(Shared {
            client,
            ctx,
            config,
            metrics,
            tracked: Mutex::new(Tracked::default()),
        }))
    }

    fn tracked(&self) -> std::sync::MutexGuard<'_, Tracked> {
        // The data stays consistent even if a holder panicked: every update is one assignment.
        self.tracked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The object managing `target`, if any.
    pub fn owner_of(&self, target: &Target) -> Option<ObjectKey> {
        self.tracked().owners.get(target).cloned()
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Sets a condition, keeping its transition time when its status does not change.
fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" }.to_string();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now();
            }
            c.status = status;
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message,
            observed_generation: generation,
            last_transition_time: now(),
        }),
    }
}

/// The allocation of the workload now, per replica (limits, else requests, of the container the
/// policy names, else the first one); `None` for what the Deployment does not say.
pub fn current_allocation(
    d: &Deployment,
    container: Option<&str>,
) -> (u32, Option<u32>, Option<u64>) {
    let spec = d.spec.as_ref();
    let replicas = spec
        .and_then(|s| s.replicas)
        .and_then(|r| u32::try_from(r).ok())
        .unwrap_or(1);
    let containers = spec
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers.as_slice())
        .unwrap_or_default();
    let c = match container {
        Some(name) if name != crate::crd::ALL_CONTAINERS => {
            containers.iter().find(|c| c.name == name)
        }
        _ => containers.first(),
    };
    let amount = |key: &str| {
        let r = c.and_then(|c| c.resources.as_ref())?;
        r.limits
            .as_ref()
            .and_then(|l| l.get(key))
            .or_else(|| r.requests.as_ref().and_then(|q| q.get(key)))
            .map(|q| q.0.clone())
    };
    let cpu = amount("cpu").and_then(|q| parse_cpu_millicores(&q).ok());
    let mem = amount("memory").and_then(|q| parse_memory_bytes(&q).ok());
    (replicas, cpu, mem)
}

fn key_of(obj: &AwareAutoscaler) -> Result<ObjectKey, ControllerError> {
    Ok(ObjectKey {
        namespace: obj.namespace().ok_or(ControllerError::Unnamed)?,
        name: obj.meta().name.clone().ok_or(ControllerError::Unnamed)?,
    })
}

fn target_of(obj: &AwareAutoscaler) -> Result<Target, ControllerError> {
    Ok(Target::new(
        obj.namespace().ok_or(ControllerError::Unnamed)?,
        obj.spec.scale_target_ref.name.clone(),
    ))
}

fn generation(obj: &AwareAutoscaler) -> u64 {
    obj.meta()
        .generation
        .and_then(|g| u64::try_from(g).ok())
        .unwrap_or(0)
}

async fn publish_registration(
    shared: &Shared,
    obj: &AwareAutoscaler,
    spec: Option<aware_bus_schemas::RegisteredSpec>,
) -> Result<(), ControllerError> {
    let key = key_of(obj)?;
    let msg = Registration {
        schema: Schema::new(),
        target: target_of(obj)?,
        episode: 0,
        step: 0,
        ts_ms: aware_bus_schemas::now_ms(),
        generation: generation(obj),
        source: format!("{}/{}", key.namespace, key.name),
        spec,
    };
    shared.ctx.publish(&msg).await?;
    Ok(())
}

/// Writes the status the controller holds for `key` (one merge patch of `/status`).
async fn write_status(shared: &Shared, key: &ObjectKey) -> Result<(), kube::Error> {
    let status = shared.tracked().status.get(key).cloned();
    let Some(status) = status else { return Ok(()) };
    let api: Api<AwareAutoscaler> = Api::namespaced(shared.client.clone(), &key.namespace);
    let res = api
        .patch_status(
            &key.name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await;
    let label = if res.is_ok() { "ok" } else { "error" };
    shared
        .metrics
        .status_writes
        .with_label_values(&[label])
        .inc();
    res.map(|_| ())
}

/// Updates the held status of `key` with `f`; returns whether anything changed.
fn update_status(
    shared: &Shared,
    key: &ObjectKey,
    seed: Option<&AwareAutoscalerStatus>,
    f: impl FnOnce(&mut AwareAutoscalerStatus),
) -> bool {
    let mut t = shared.tracked();
    let entry = t
        .status
        .entry(key.clone())
        .or_insert_with(|| seed.cloned().unwrap_or_default());
    let before = entry.clone();
    f(entry);
    entry != &before
}

/// Why a target is not managed: (condition reason, message, when to look again).
type Problem = (&'static str, String, Action);

/// The object cannot be managed: deregister what an older generation registered, report the
/// reason in the `Registered` condition.
async fn not_managing(
    shared: &Shared,
    obj: &AwareAutoscaler,
    key: ObjectKey,
    target: Target,
    gen: Option<i64>,
    (reason, message, action): Problem,
) -> Result<Action, ControllerError> {
    tracing::warn!(object = %format!("{}/{}", key.namespace, key.name), %target, reason, %message, "not managing the target");
    shared
        .metrics
        .reconciles
        .with_label_values(&[if reason == "TargetNotFound" {
            "target_missing"
        } else {
            "invalid"
        }])
        .inc();
    // Whatever was registered before (an older, valid generation) stops being managed.
    let was_managed = {
        let mut t = shared.tracked();
        let was = t.owners.get(&target) == Some(&key);
        if was {
            t.owners.remove(&target);
        }
        was
    };
    if was_managed {
        publish_registration(shared, obj, None).await?;
    }
    let changed = update_status(shared, &key, obj.status.as_ref(), |s| {
        set_condition(&mut s.conditions, REGISTERED, false, reason, message, gen);
        s.observed_generation = gen;
    });
    if changed {
        write_status(shared, &key).await?;
    }
    shared.metrics.managed.set(managed_count(shared));
    Ok(action)
}

/// Apply: validate, register, record the owner, write conditions. Requeued after
/// `resync_seconds`, which re-sends the registration.
async fn apply(obj: Arc<AwareAutoscaler>, shared: Arc<Shared>) -> Result<Action, ControllerError> {
    let key = key_of(&obj)?;
    let target = target_of(&obj)?;
    let gen = obj.meta().generation;
    let resync = Action::requeue(Duration::from_secs(shared.config.resync_seconds));
    let checked = match obj.target_spec() {
        Err(e) => Err(("InvalidSpec", e.to_string(), Action::await_change())),
        Ok(spec) => {
            let deployments: Api<Deployment> =
                Api::namespaced(shared.client.clone(), &key.namespace);
            match deployments.get_opt(&target.name).await? {
                None => Err((
                    "TargetNotFound",
                    format!(
                        "Deployment {}/{} does not exist",
                        target.namespace, target.name
                    ),
                    Action::requeue(Duration::from_secs(shared.config.error_requeue_seconds)),
                )),
                Some(d) => {
                    let container = obj
                        .spec
                        .resource_policy
                        .as_ref()
                        .and_then(|p| p.container_policies.first())
                        .map(|p| p.container_name.as_str());
                    match current_allocation(&d, container) {
                        (replicas, Some(cpu), Some(mem)) => obj
                            .validate_against(aware_bus_schemas::Resources {
                                replicas,
                                cpu_millicores: cpu,
                                memory_bytes: mem,
                            })
                            .map(|()| spec)
                            .map_err(|e: CrdError| {
                                (
                                    "BoundsExcludeCurrent",
                                    e.to_string(),
                                    Action::await_change(),
                                )
                            }),
                        _ => Ok(spec),
                    }
                }
            }
        }
    };
    let spec = match checked {
        Ok(spec) => spec,
        Err(problem) => return not_managing(&shared, &obj, key, target, gen, problem).await,
    };
    let lifecycle = obj.lifecycle_profile().ok();
    publish_registration(
        &shared,
        &obj,
        Some(to_registered(&spec, lifecycle.as_ref())),
    )
    .await?;
    {
        let mut t = shared.tracked();
        // A target moved to another object (or renamed): the new owner wins.
        t.owners.retain(|_, owner| owner != &key);
        t.owners.insert(target.clone(), key.clone());
    }
    shared.metrics.managed.set(managed_count(&shared));
    shared
        .metrics
        .reconciles
        .with_label_values(&["registered"])
        .inc();
    let changed = update_status(&shared, &key, obj.status.as_ref(), |s| {
        set_condition(
            &mut s.conditions,
            REGISTERED,
            true,
            "Registered",
            format!(
                "Deployment {} registered with the services ({})",
                target,
                if spec.update_mode == aware_shared::spec::UpdateMode::Off {
                    "recommend-only"
                } else {
                    "auto"
                }
            ),
            gen,
        );
        s.observed_generation = gen;
    });
    if changed {
        write_status(&shared, &key).await?;
    }
    Ok(resync)
}

fn managed_count(shared: &Shared) -> i64 {
    i64::try_from(shared.tracked().owners.len()).unwrap_or(i64::MAX)
}

/// Cleanup (the object is being deleted): deregister, forget. The finalizer is removed after.
async fn cleanup(
    obj: Arc<AwareAutoscaler>,
    shared: Arc<Shared>,
) -> Result<Action, ControllerError> {
    let key = key_of(&obj)?;
    let target = target_of(&obj)?;
    publish_registration(&shared, &obj, None).await?;
    shared.ctx.bus.flush().await.map_err(ServiceError::from)?;
    {
        let mut t = shared.tracked();
        if t.owners.get(&target) == Some(&key) {
            t.owners.remove(&target);
        }
        t.status.remove(&key);
        t.dirty.retain(|k| k != &key);
    }
    shared.metrics.managed.set(managed_count(&shared));
    shared
        .metrics
        .reconciles
        .with_label_values(&["deregistered"])
        .inc();
    tracing::info!(object = %format!("{}/{}", key.namespace, key.name), %target, "deleted: target deregistered, workload left at its last applied resources");
    Ok(Action::await_change())
}

/// One reconciliation of one object (the finalizer protocol around [`apply`]/[`cleanup`]).
pub async fn reconcile(
    obj: Arc<AwareAutoscaler>,
    shared: Arc<Shared>,
) -> Result<Action, kube::runtime::finalizer::Error<ControllerError>> {
    let ns = obj
        .namespace()
        .ok_or(kube::runtime::finalizer::Error::UnnamedObject)?;
    let api: Api<AwareAutoscaler> = Api::namespaced(shared.client.clone(), &ns);
    let s = shared.clone();
    finalizer(&api, FINALIZER, obj, |event| async move {
        match event {
            FinalizerEvent::Apply(o) => apply(o, s).await,
            FinalizerEvent::Cleanup(o) => cleanup(o, s).await,
        }
    })
    .await
}

fn error_policy(
    obj: Arc<AwareAutoscaler>,
    err: &kube::runtime::finalizer::Error<ControllerError>,
    shared: Arc<Shared>,
) -> Action {
    shared
        .metrics
        .reconciles
        .with_label_values(&["error"])
        .inc();
    tracing::warn!(object = %obj.name_any(), error = %err, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(shared.config.error_requeue_seconds))
}

/// Folds one service event into the held status; returns the object whose status changed.
pub fn fold_event(shared: &Shared, ev: &Event) -> Option<ObjectKey> {
    let key = shared.owner_of(ev.target())?;
    let changed = update_status(shared, &key, None, |s| match ev {
        Event::Lifecycle(l) => {
            s.stage = Some(l.stage);
            s.reward_mean = l.reward_mean.filter(|v| v.is_finite());
            s.reward_std = l.reward_std.filter(|v| v.is_finite());
        }
        Event::Action(a) => {
            s.recommendation = Some(Recommendation {
                replicas: a.desired.replicas,
                cpu: format_cpu(a.desired.cpu_millicores),
                memory: format_memory(a.desired.memory_bytes),
            });
            s.desired_replicas = Some(a.desired.replicas);
            if s.stage.is_none() {
                s.stage = Some(a.stage);
            }
        }
        Event::Applied(a) => {
            let (ok, reason) = match a.outcome {
                Outcome::Applied => (true, "Applied"),
                Outcome::RecommendOnly => (true, "RecommendOnly"),
                Outcome::Rejected => (false, "Rejected"),
            };
            let message = match (&a.reason, a.outcome) {
                (Some(r), _) => r.clone(),
                (None, Outcome::RecommendOnly) => "recorded, not applied (updateMode Off)".into(),
                (None, _) => format!(
                    "{} replicas, {} CPU, {} memory",
                    a.applied.replicas,
                    format_cpu(a.applied.cpu_millicores),
                    format_memory(a.applied.memory_bytes)
                ),
            };
            set_condition(&mut s.conditions, APPLIED, ok, reason, message, None);
        }
        _ => {}
    });
    if changed {
        let mut t = shared.tracked();
        if !t.dirty.contains(&key) {
            t.dirty.push(key.clone());
        }
        Some(key)
    } else {
        None
    }
}

/// Writes every object whose status changed since the last flush.
pub async fn flush_status(shared: &Shared) {
    let dirty = std::mem::take(&mut shared.tracked().dirty);
    for key in dirty {
        if let Err(e) = write_status(shared, &key).await {
            tracing::warn!(object = %format!("{}/{}", key.namespace, key.name), error = %e, "status write failed");
            // Retried at the next flush.
            let mut t = shared.tracked();
            if !t.dirty.contains(&key) {
                t.dirty.push(key);
            }
        }
    }
}

/// The status writer: folds `lifecycle`, `action` and `applied` events into the held status and
/// flushes it every `status_interval_ms`, until shutdown.
pub async fn run_status_writer(shared: Arc<Shared>) -> Result<(), ServiceError> {
    let mut rx = shared
        .ctx
        .subscribe_events(&[EventKind::Lifecycle, EventKind::Action, EventKind::Applied])
        .await?;
    let mut tick = tokio::time::interval(Duration::from_millis(shared.config.status_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shared.ctx.shutdown.cancelled() => break,
            ev = rx.recv() => match ev {
                Some(ev) => { fold_event(&shared, &ev); }
                None => break,
            },
            _ = tick.tick() => flush_status(&shared).await,
        }
    }
    flush_status(&shared).await;
    Ok(())
}

/// How long after shutdown is requested in-flight reconciles may still run.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs the controller loop (kube runtime) and the status writer until shutdown.
pub async fn run_with_client(ctx: ServiceContext, client: Client) -> Result<(), ServiceError> {
    let config: ControllerConfig = ctx.config.section("controller")?;
    config.validate()?;
    let shared = Shared::new(client.clone(), ctx.clone(), config.clone())?;
    let api: Api<AwareAutoscaler> = if config.namespace.is_empty() {
        Api::all(client)
    } else {
        Api::namespaced(client, &config.namespace)
    };
    let writer = tokio::spawn(run_status_writer(shared.clone()));
    ctx.ready.set(true);
    tracing::info!(namespace = %if config.namespace.is_empty() { "*" } else { config.namespace.as_str() }, resync_s = config.resync_seconds, "controller watching AwareAutoscalers");
    let shutdown = ctx.shutdown.clone();
    let watch_errors = shared.metrics.watch_errors.clone();
    let run = Controller::new(api, watcher::Config::default())
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, shared.clone())
        .for_each(|res| {
            match res {
                Ok((obj, _)) => tracing::debug!(object = %obj, "reconciled"),
                // Without the watch nothing new is seen: created, changed and deleted objects
                // wait (a deleted one stays Terminating behind the finalizer).
                Err(kube::runtime::controller::Error::QueueError(e)) => {
                    watch_errors.inc();
                    tracing::warn!(error = %e, "listing or watching AwareAutoscalers failed; retrying with backoff");
                }
                // Reconcile failures are counted and logged by `error_policy`.
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
            futures::future::ready(())
        });
    // The graceful shutdown waits for in-flight reconciles, and kube-runtime holds the reconcile
    // runner until the first list has succeeded: with that list failing (RBAC, an unreachable
    // API server) it would wait for ever and the pod would only stop when killed. So the wait is
    // bounded.
    let deadline = {
        let shutdown = ctx.shutdown.clone();
        async move {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        }
    };
    tokio::select! {
        () = run => {}
        () = deadline => tracing::warn!(grace_s = SHUTDOWN_GRACE.as_secs(), "the controller did not stop in time (its first list never succeeded, or a reconcile hangs); stopping anyway"),
    }
    ctx.ready.set(false);
    ctx.shutdown.cancel();
    writer.await.map_err(|source| ServiceError::Task {
        task: "status writer",
        source,
    })??;
    Ok(())
}

/// Runs the service with the in-cluster (or kubeconfig) client.
pub async fn run(ctx: ServiceContext) -> Result<(), ServiceError> {
    let client = Client::try_default()
        .await
        .map_err(|e| ServiceError::resource("kubernetes client", e))?;
    run_with_client(ctx, client).await
}

#[cfg(test)]
mod tests;
