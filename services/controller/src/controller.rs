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
//!
//! An SLO the recommender finds out of reach within the bounds (`action/1`'s `slo_unreachable`)
//! becomes the `SloUnreachable` condition, naming the SLO, the bounds and the allocation the
//! rule needs, and one Kubernetes Event per change of the condition's status (Warning
//! `SloUnreachable`, Normal `SloReachable`), not one per step.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aware_bus_schemas::{Event, EventKind, Outcome, Registration, Resources, Schema, Target};
use aware_shared::config::ConfigError;
use aware_shared::quantity::{format_cpu, format_memory, parse_cpu_millicores, parse_memory_bytes};
use aware_shared::registry::to_registered;
use aware_shared::service::{ServiceContext, ServiceError};
use aware_shared::spec::{Bounds, Slo};
use aware_shared::telemetry::{ServiceMetrics, TelemetryError};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::runtime::{watcher, Controller};
use kube::{Api, Client, Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::crd::{AwareAutoscaler, AwareAutoscalerStatus, CrdError, Recommendation};
use crate::leader::{Elector, LeaderElectionConfig};

/// The finalizer the controller keeps on every object it manages.
pub const FINALIZER: &str = "aware.dev/deregister";
/// Field manager of the controller's writes.
pub const FIELD_MANAGER: &str = "aware-controller";
/// Condition types written by the controller.
pub const REGISTERED: &str = "Registered";
pub const APPLIED: &str = "Applied";
pub const SLO_UNREACHABLE: &str = "SloUnreachable";

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
    /// Reconciliations running at once. Unbounded, a thousand objects created together become a
    /// thousand concurrent requests of one client, more than the API server's priority and
    /// fairness queues for one flow hold: it answers 429 and the reconciles fail and wait for
    /// their retry.
    pub max_concurrent_reconciles: u16,
    /// Leader election among replicas (`[controller.leader_election]`).
    pub leader_election: LeaderElectionConfig,
    /// A deleted object's deregistration stays the target's current state (the state bucket's
    /// key) this long, seconds, then the key is purged: the services have retired the target and
    /// forgotten its data by then (`actors.retire_after_secs`, `trainer.forget_after_secs`,
    /// `trajectory_store.forget_after_secs`), and the bucket does not grow with every target ever
    /// deleted. 0: never. Default 8 days.
    pub forget_deregistered_after_secs: u64,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            namespace: String::new(),
            resync_seconds: 30,
            status_interval_ms: 2000,
            error_requeue_seconds: 10,
            max_concurrent_reconciles: 16,
            leader_election: LeaderElectionConfig::default(),
            forget_deregistered_after_secs: 8 * 24 * 3600,
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
        if self.max_concurrent_reconciles == 0 {
            return bad("max_concurrent_reconciles", "must be at least 1");
        }
        if let Some((key, why)) = self.leader_election.problem() {
            return bad(&format!("leader_election.{key}"), why);
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
    /// Objects whose status changed since the last write (a set: with many targets every event
    /// would otherwise scan the list).
    dirty: HashSet<ObjectKey>,
    /// The generation each managed object was last registered with, and when.
    registered_at: HashMap<ObjectKey, (Option<i64>, tokio::time::Instant)>,
    /// The SLO and bounds each managed object registered, and its reference (for Events).
    registered_spec: HashMap<ObjectKey, (Slo, Bounds, ObjectReference)>,
    /// Kubernetes Events to publish at the next flush.
    events: Vec<(ObjectKey, SloEvent)>,
}

/// The controller's metrics (in the service's registry).
#[derive(Clone)]
pub struct ControllerMetrics {
    pub reconciles: prometheus::IntCounterVec,
    pub status_writes: prometheus::IntCounterVec,
    pub managed: prometheus::IntGauge,
    /// Failures of the list/watch of AwareAutoscalers (each retried with backoff).
    pub watch_errors: prometheus::IntCounter,
    /// 1 while this replica holds the lease (or runs without leader election).
    pub leader: prometheus::IntGauge,
    /// Duration of one reconciliation (finalizer protocol, Deployment read, registration,
    /// status write), whatever its result.
    pub reconcile_duration: prometheus::Histogram,
    /// Changes of the `SloUnreachable` condition, by the Event's reason (`SloUnreachable`,
    /// `SloReachable`).
    pub slo_reach_changes: prometheus::IntCounterVec,
    /// Deregistrations purged from the state bucket (`forget_deregistered_after_secs`).
    pub deregistrations_forgotten: prometheus::IntCounter,
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
            leader: m.gauge(
                "controller_leader",
                "1 while this replica leads (holds the lease, or runs without leader election) and reconciles",
            )?,
            slo_reach_changes: m.counter_vec(
                "controller_slo_reach_changes_total",
                "Changes of the SloUnreachable condition, by reason (SloUnreachable: the SLO cannot be met within the bounds; SloReachable: it can again)",
                &["reason"],
                &[&["SloUnreachable"], &["SloReachable"]],
            )?,
            deregistrations_forgotten: m.counter(
                "controller_deregistrations_forgotten_total",
                "Deregistrations of deleted objects purged from the state bucket after controller.forget_deregistered_after_secs",
            )?,
            reconcile_duration: m.histogram(
                "controller_reconcile_duration_seconds",
                "Duration of one reconciliation of an AwareAutoscaler, whatever its result",
                vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0,
                ],
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
    /// Publishes the Kubernetes Events (`events.k8s.io/v1`).
    recorder: Recorder,
}

impl Shared {
    pub fn new(
        client: Client,
        ctx: ServiceContext,
        config: ControllerConfig,
    ) -> Result<Arc<Self>, ServiceError> {
        let metrics = ControllerMetrics::new(&ctx.metrics)?;
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_string(),
            instance: std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()),
        };
        Ok(Arc::new(Shared {
            recorder: Recorder::new(client.clone(), reporter),
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

/// A Kubernetes Event to publish for a change of the `SloUnreachable` condition.
#[derive(Debug, Clone, PartialEq)]
pub struct SloEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

/// The SLO as a user wrote it, in words.
fn describe_slo(slo: &Slo) -> String {
    match (slo.latency_p99_ms, slo.throughput_rps) {
        (Some(l), Some(t)) => format!("p99 latency <= {l} ms and throughput >= {t} rps"),
        (Some(l), None) => format!("p99 latency <= {l} ms"),
        (None, Some(t)) => format!("throughput >= {t} rps"),
        (None, None) => "the SLO".to_string(),
    }
}

/// The condition message for an unreachable SLO: the SLO, the max bounds, and the allocation
/// the rule needs.
pub fn unreachable_message(needed: Resources, spec: Option<(&Slo, &Bounds)>) -> String {
    let need = format!(
        "the HPA/VPA rule needs {} replicas with {} CPU and {} memory each",
        needed.replicas,
        format_cpu(needed.cpu_millicores),
        format_memory(needed.memory_bytes)
    );
    match spec {
        Some((slo, b)) => format!(
            "{} cannot be met within the bounds (at most {} replicas, {} CPU, {} memory each): {need}",
            describe_slo(slo),
            b.max_replicas,
            format_cpu(b.max_cpu_millicores),
            format_memory(b.max_memory_bytes)
        ),
        None => format!("the SLO cannot be met within the bounds: {need}"),
    }
}

/// Folds an action's `slo_unreachable` (and `slo_judged`: whether its absence is a verdict)
/// into the conditions; returns the Event to publish when the condition's status changed (a
/// first unreachable verdict, or a clearing). A reachable SLO on an object that never had the
/// condition adds nothing, and an action without a verdict (a recommender that has not yet
/// judged a whole window since it started) changes nothing.
pub fn fold_slo_unreachable(
    conditions: &mut Vec<Condition>,
    needed: Option<Resources>,
    judged: bool,
    spec: Option<(&Slo, &Bounds)>,
) -> Option<SloEvent> {
    let was = conditions
        .iter()
        .find(|c| c.type_ == SLO_UNREACHABLE)
        .map(|c| c.status == "True");
    match (needed, was) {
        (Some(needed), was) => {
            let message = unreachable_message(needed, spec);
            set_condition(
                conditions,
                SLO_UNREACHABLE,
                true,
                "SloUnreachable",
                message.clone(),
                None,
            );
            (was != Some(true)).then_some(SloEvent {
                warning: true,
                reason: "SloUnreachable",
                note: message,
            })
        }
        (None, Some(true)) if judged => {
            let message = match spec {
                Some((slo, _)) => format!(
                    "{} is within reach of the bounds again: a whole window without a violation at a bound the rule wanted to exceed",
                    describe_slo(slo)
                ),
                None => "the SLO is within reach of the bounds again".to_string(),
            };
            set_condition(
                conditions,
                SLO_UNREACHABLE,
                false,
                "SloReachable",
                message.clone(),
                None,
            );
            Some(SloEvent {
                warning: false,
                reason: "SloReachable",
                note: message,
            })
        }
        (None, _) => None,
    }
}

/// The allocation of the workload now, per replica: the requests (else, as Kubernetes defaults
/// a missing request, the limits) of the container the policy names, else the first one — the
/// allocation AWARE sets and the bounds constrain are the requests; `None` for what the
/// Deployment does not say.
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
        r.requests
            .as_ref()
            .and_then(|q| q.get(key))
            .or_else(|| r.limits.as_ref().and_then(|l| l.get(key)))
            .map(|q| q.0.clone())
    };
    let cpu = amount("cpu").and_then(|q| parse_cpu_millicores(&q).ok());
    let mem = amount("memory").and_then(|q| parse_memory_bytes(&q).ok());
    (replicas, cpu, mem)
}

/// Why the container the AwareAutoscaler's `containerPolicies` names cannot be sized: it is not
/// in the Deployment's pod template (names the field and the containers there are).
pub fn missing_container(obj: &AwareAutoscaler, d: &Deployment) -> Option<String> {
    let (field, name) = obj.sized_container().ok().flatten()?;
    let names: Vec<&str> = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers.iter().map(|c| c.name.as_str()).collect())
        .unwrap_or_default();
    (!names.contains(&name)).then(|| {
        format!(
            "{field}: the Deployment's pod template has no container `{name}` (its containers: {})",
            names.join(", ")
        )
    })
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
        t.registered_at.remove(&key);
        t.registered_spec.remove(&key);
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
    let resync_every = Duration::from_secs(shared.config.resync_seconds);
    // Registered with this generation less than a resync ago: the event is a change of
    // something else — in practice the controller's own status write, which every watcher sees.
    // Nothing the registration depends on changed (the spec is the generation; the Deployment is
    // read at the resync), so this waits for the resync instead of reading the Deployment again.
    // The returned delay keeps the resync where it was (the event replaced it in the queue).
    let recent = shared.tracked().registered_at.get(&key).copied();
    if let Some((registered_gen, at)) = recent {
        let since = at.elapsed();
        if registered_gen == gen && since + RESYNC_MARGIN < resync_every {
            return Ok(Action::requeue(resync_every - since));
        }
    }
    let resync = Action::requeue(resync_every);
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
                Some(d) => match missing_container(&obj, &d) {
                    Some(why) => Err((
                        "ContainerNotFound",
                        why,
                        Action::requeue(Duration::from_secs(shared.config.error_requeue_seconds)),
                    )),
                    None => match current_allocation(&d, spec.container.as_deref()) {
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
                    },
                },
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
        t.registered_spec
            .insert(key.clone(), (spec.slo, spec.bounds, obj.object_ref(&())));
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
    shared
        .tracked()
        .registered_at
        .insert(key, (gen, tokio::time::Instant::now()));
    Ok(resync)
}

/// A reconcile this close to an object's resync does the resync's work (a timer may fire a
/// little early or late; the resync must not be skipped).
const RESYNC_MARGIN: Duration = Duration::from_secs(1);

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
        t.registered_at.remove(&key);
        t.registered_spec.remove(&key);
        t.events.retain(|(k, _)| k != &key);
        t.dirty.remove(&key);
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
    let timer = shared.metrics.reconcile_duration.start_timer();
    let res = finalizer(&api, FINALIZER, obj, |event| async move {
        match event {
            FinalizerEvent::Apply(o) => apply(o, s).await,
            FinalizerEvent::Cleanup(o) => cleanup(o, s).await,
        }
    })
    .await;
    timer.observe_duration();
    res
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
    let spec = shared
        .tracked()
        .registered_spec
        .get(&key)
        .map(|(slo, bounds, _)| (*slo, *bounds));
    let mut event = None;
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
            event = fold_slo_unreachable(
                &mut s.conditions,
                a.slo_unreachable,
                a.slo_judged,
                spec.as_ref().map(|(slo, b)| (slo, b)),
            );
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
        t.dirty.insert(key.clone());
        if let Some(e) = event {
            tracing::info!(object = %format!("{}/{}", key.namespace, key.name), reason = e.reason, note = %e.note, "SLO reachability changed");
            t.events.push((key.clone(), e));
        }
        Some(key)
    } else {
        None
    }
}

/// Status writes of one flush in flight at once: one at a time, a flush of thousands of objects
/// would take longer than the interval between flushes.
const STATUS_WRITE_CONCURRENCY: usize = 8;

/// Writes every object whose status changed since the last flush.
pub async fn flush_status(shared: &Shared) {
    let dirty = std::mem::take(&mut shared.tracked().dirty);
    futures::stream::iter(dirty)
        .for_each_concurrent(STATUS_WRITE_CONCURRENCY, |key| async move {
            if let Err(e) = write_status(shared, &key).await {
                tracing::warn!(object = %format!("{}/{}", key.namespace, key.name), error = %e, "status write failed");
                // Retried at the next flush.
                shared.tracked().dirty.insert(key);
            }
        })
        .await;
    publish_events(shared).await;
}

/// Publishes the pending Kubernetes Events, after the status that explains them. An Event the
/// API refuses is logged and dropped: the condition still says it.
async fn publish_events(shared: &Shared) {
    let pending: Vec<(ObjectReference, SloEvent)> = {
        let mut t = shared.tracked();
        let events = std::mem::take(&mut t.events);
        events
            .into_iter()
            .filter_map(|(key, e)| {
                let reference = t.registered_spec.get(&key).map(|(_, _, r)| r.clone())?;
                Some((reference, e))
            })
            .collect()
    };
    for (reference, e) in pending {
        shared
            .metrics
            .slo_reach_changes
            .with_label_values(&[e.reason])
            .inc();
        let event = KubeEvent {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.to_string(),
            note: Some(e.note),
            action: "Recommend".to_string(),
            secondary: None,
        };
        if let Err(err) = shared.recorder.publish(&event, &reference).await {
            tracing::warn!(object = ?reference.name, namespace = ?reference.namespace, reason = e.reason, error = %err, "publishing the Kubernetes Event failed");
        }
    }
}

/// The status writer: folds `lifecycle`, `action` and `applied` events into the held status and
/// flushes it every `status_interval_ms`, until shutdown.
pub async fn run_status_writer(shared: Arc<Shared>) -> Result<(), ServiceError> {
    // The status of every target, whatever `shard` says: one leader serves the cluster.
    let mut rx = shared
        .ctx
        .subscribe_events_of(
            &[EventKind::Lifecycle, EventKind::Action, EventKind::Applied],
            aware_shared::config::ShardConfig::default(),
        )
        .await?;
    let mut tick = tokio::time::interval(Duration::from_millis(shared.config.status_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A flush runs beside the folding, so events keep being read while it writes (a long flush
    // would otherwise fill the subscription's buffer and the bus would drop events); a tick
    // while one runs waits for the next.
    let mut flushing: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        tokio::select! {
            _ = shared.ctx.shutdown.cancelled() => break,
            ev = rx.recv() => match ev {
                Some(ev) => { fold_event(&shared, &ev); }
                None => break,
            },
            _ = tick.tick() => {
                if flushing.as_ref().is_none_or(|f| f.is_finished()) {
                    let s = shared.clone();
                    flushing = Some(tokio::spawn(async move { flush_status(&s).await }));
                }
            }
        }
    }
    if let Some(f) = flushing {
        let _ = f.await;
    }
    flush_status(&shared).await;
    Ok(())
}

/// How long after shutdown is requested in-flight reconciles may still run.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs the controller until shutdown: with leader election, only while this replica holds the
/// lease. A lost lease stops reconciling at once and fails the run (the process exits and
/// Kubernetes restarts it as a standby, as client-go's controllers do); a graceful shutdown
/// releases the lease so a standby takes over without waiting for it to expire.
pub async fn run_with_client(ctx: ServiceContext, client: Client) -> Result<(), ServiceError> {
    let config: ControllerConfig = ctx.config.section("controller")?;
    config.validate()?;
    let shared = Shared::new(client.clone(), ctx.clone(), config.clone())?;
    let election = &config.leader_election;
    if !election.enabled() {
        shared.metrics.leader.set(1);
        return run_leading(shared, client).await;
    }
    let namespace = election.namespace().ok_or_else(|| {
        ServiceError::Config(ConfigError::Invalid {
            key: "controller.leader_election.lease_namespace".into(),
            reason: "unset and POD_NAMESPACE is not set: the Lease needs a namespace".into(),
        })
    })?;
    let mut elector = Elector::new(
        client.clone(),
        namespace.clone(),
        election.identity(),
        election.clone(),
    );
    // A standby is healthy: it is ready while it waits for the lease.
    ctx.ready.set(true);
    tracing::info!(lease = %election.lease_name, namespace = %namespace, identity = %elector.identity(), "waiting for the lease");
    if !elector.acquire(&ctx.shutdown).await {
        ctx.ready.set(false);
        return Ok(());
    }
    shared.metrics.leader.set(1);
    tracing::info!(identity = %elector.identity(), "leading: reconciling AwareAutoscalers");
    let outcome = {
        let leading = run_leading(shared.clone(), client);
        tokio::pin!(leading);
        tokio::select! {
            r = &mut leading => Ok(r),
            lost = elector.hold() => Err(lost),
        }
    };
    shared.metrics.leader.set(0);
    match outcome {
        Ok(r) => {
            if let Err(e) = elector.release().await {
                tracing::warn!(error = %e, "releasing the lease failed; the standby takes over when it expires");
            }
            r
        }
        Err(lost) => {
            // The reconciler was dropped with the select: nothing reconciles any more.
            tracing::error!(error = %lost, "lost the lease: stopping");
            ctx.ready.set(false);
            ctx.shutdown.cancel();
            Err(ServiceError::resource("controller.leader_election", lost))
        }
    }
}

/// Purges the state bucket's key of every target whose current state is a deregistration
/// (no spec) published `after_ms` or more before `now_ms`; how many. The time is the
/// controller's own stamp on its deregistration (only the controller may publish `target`).
pub async fn forget_old_deregistrations(
    ctx: &ServiceContext,
    after_ms: i64,
    now_ms: i64,
) -> Result<usize, ServiceError> {
    let state = ctx
        .read_state_once(EventKind::Target)
        .await
        .map_err(|e| ServiceError::resource("controller.forget_deregistered_after_secs", e))?;
    let mut forgotten = 0;
    for ev in state {
        let Event::Registration(r) = ev else { continue };
        if r.spec.is_some() || now_ms.saturating_sub(r.ts_ms) < after_ms {
            continue;
        }
        ctx.bus
            .forget_target_state(EventKind::Target, &r.target)
            .await
            .map_err(|e| ServiceError::resource("controller.forget_deregistered_after_secs", e))?;
        tracing::info!(target = %r.target, deregistered_ms = r.ts_ms, "deregistration forgotten: the target's key is purged from the state bucket");
        forgotten += 1;
    }
    if forgotten > 0 {
        ctx.bus
            .flush()
            .await
            .map_err(|e| ServiceError::resource("controller.forget_deregistered_after_secs", e))?;
    }
    Ok(forgotten)
}

/// While leading: [`forget_old_deregistrations`] every tenth of the delay (between a minute
/// and an hour); a failed pass is logged and tried again at the next.
async fn run_forgetting(shared: Arc<Shared>) {
    let secs = shared.config.forget_deregistered_after_secs;
    if secs == 0 {
        return;
    }
    let after_ms = i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    let every = Duration::from_secs((secs / 10).clamp(60, 3600));
    loop {
        tokio::select! {
            () = shared.ctx.shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match forget_old_deregistrations(&shared.ctx, after_ms, aware_bus_schemas::now_ms()).await {
            Ok(n) => shared.metrics.deregistrations_forgotten.inc_by(n as u64),
            Err(e) => {
                tracing::warn!(error = %e, "cannot purge old deregistrations; trying again later")
            }
        }
    }
}

/// Runs the controller loop (kube runtime) and the status writer until shutdown.
async fn run_leading(shared: Arc<Shared>, client: Client) -> Result<(), ServiceError> {
    let ctx = shared.ctx.clone();
    let config = shared.config.clone();
    let api: Api<AwareAutoscaler> = if config.namespace.is_empty() {
        Api::all(client)
    } else {
        Api::namespaced(client, &config.namespace)
    };
    let writer = tokio::spawn(run_status_writer(shared.clone()));
    // Ends at shutdown (also cancelled when the lease is lost).
    tokio::spawn(run_forgetting(shared.clone()));
    ctx.ready.set(true);
    tracing::info!(namespace = %if config.namespace.is_empty() { "*" } else { config.namespace.as_str() }, resync_s = config.resync_seconds, "controller watching AwareAutoscalers");
    let shutdown = ctx.shutdown.clone();
    let watch_errors = shared.metrics.watch_errors.clone();
    let run = Controller::new(api, watcher::Config::default())
        .with_config(
            kube::runtime::controller::Config::default()
                .concurrency(config.max_concurrent_reconciles),
        )
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
mod tests {
    //! The controller against a scripted mock API server (`tower_test::mock::pair`: every request's
    //! method, URI, content type and JSON body is asserted) and the in-process bus (every
    //! registration it publishes is decoded and checked).

    use std::pin::pin;
    use std::sync::Arc;
    use std::time::Duration;

    use aware_bus_schemas::{
        DecisionSource, Event, EventKind, Lifecycle, Registration, Resources, Schema, Stage, Target,
    };
    use aware_shared::bus::{Bus, Subscription};
    use aware_shared::config::AppConfig;
    use aware_shared::kube_mock::{self, get, Exchange};
    use aware_shared::service::ServiceContext;
    use http::{Method, Request, Response};
    use kube::client::Body;
    use kube::Client;
    use serde_json::{json, Value};
    use tokio_util::sync::CancellationToken;
    use tower_test::mock;

    use super::*;

    const JSON_PATCH: &str = "application/json-patch+json";
    const MERGE: &str = "application/merge-patch+json";
    const OBJ: &str = "/apis/aware.dev/v1alpha1/namespaces/shop/awareautoscalers/web-aware";
    const STATUS: &str = "/apis/aware.dev/v1alpha1/namespaces/shop/awareautoscalers/web-aware/status?&fieldManager=aware-controller";
    const DEPLOY: &str = "/apis/apps/v1/namespaces/shop/deployments/web";
    const MIB: u64 = 1024 * 1024;

    /// A PATCH answered with 200 (the controller's writes all succeed in these scripts).
    fn patch(uri: &str, content_type: &'static str, body: Value, response: Value) -> Exchange {
        kube_mock::patch(uri, content_type, body, 200, response)
    }

    /// Every `lastTransitionTime` replaced by `"<time>"` after checking it is an RFC 3339 time.
    fn normalize_times(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    if k == "lastTransitionTime" {
                        let s = x.as_str().expect("lastTransitionTime is a string");
                        assert!(
                            s.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
                            "lastTransitionTime `{s}` is not RFC 3339"
                        );
                        *x = json!("<time>");
                    } else {
                        normalize_times(x);
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(normalize_times),
            _ => {}
        }
    }

    /// The scripted mock API server, timestamps normalized (see [`normalize_times`]).
    fn serve(script: Vec<Exchange>) -> (Client, tokio::task::JoinHandle<()>) {
        kube_mock::serve_normalized(script, normalize_times)
    }

    struct Fixture {
        shared: Arc<Shared>,
        registrations: Subscription,
        server: tokio::task::JoinHandle<()>,
    }

    impl Fixture {
        async fn new(script: Vec<Exchange>) -> Fixture {
            let bus = Bus::in_process(1024);
            let registrations = bus.subscribe("aware.v1.target.>").await.unwrap();
            let ctx = ServiceContext::new(
                "controller",
                bus,
                Arc::new(AppConfig::default()),
                CancellationToken::new(),
            )
            .unwrap();
            let (client, server) = serve(script);
            let shared = Shared::new(client, ctx, ControllerConfig::default()).unwrap();
            Fixture {
                shared,
                registrations,
                server,
            }
        }

        /// The next registration published, or None within 200 ms.
        async fn registration(&mut self) -> Option<Registration> {
            let msg = tokio::time::timeout(Duration::from_millis(200), self.registrations.next())
                .await
                .ok()??;
            let ev = aware_bus_schemas::decode_event(EventKind::Target, &msg.payload).unwrap();
            assert_eq!(&*msg.subject, "aware.v1.target.196.shop.web");
            match ev {
                Event::Registration(r) => Some(r),
                other => panic!("not a registration: {other:?}"),
            }
        }

        /// Waits for the mock server to have served its whole script (and nothing more).
        async fn finish(self) {
            drop(self.shared);
            tokio::time::timeout(Duration::from_secs(5), self.server)
                .await
                .expect("the mock server did not finish")
                .expect("the mock server's assertions");
        }
    }

    fn object(finalizers: &[&str], spec: Value) -> Value {
        json!({
            "apiVersion": "aware.dev/v1alpha1",
            "kind": "AwareAutoscaler",
            "metadata": {
                "name": "web-aware",
                "namespace": "shop",
                "uid": "9a4c3c2e-0000-4000-8000-000000000001",
                "resourceVersion": "100",
                "generation": 3,
                "finalizers": finalizers,
            },
            "spec": spec,
        })
    }

    fn spec() -> Value {
        json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "updatePolicy": {"updateMode": "Off"},
            "constraints": {"minReplicas": 1, "maxReplicas": 10},
            "resourcePolicy": {"containerPolicies": [{
                "containerName": "app",
                "minAllowed": {"cpu": "100m", "memory": "128Mi"},
                "maxAllowed": {"cpu": "2", "memory": "2Gi"},
            }]},
            "slo": {"latencyP99Ms": 200.0},
            "objective": {"alpha": 0.6},
            "lifecycle": {"bootstrap": true, "tOnline": 1.1, "tServing": 1.4, "tVar": 0.1, "window": 5},
            "fallback": {"hpa": {"targetCPUUtilizationPercentage": 35}},
        })
    }

    fn deployment(replicas: i64, cpu: &str, memory: &str) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [
                        {"name": "sidecar", "image": "envoy", "resources": {"limits": {"cpu": "50m", "memory": "64Mi"}}},
                        {"name": "app", "image": "web:1", "resources": {"limits": {"cpu": cpu, "memory": memory}}},
                    ]},
                },
            },
        })
    }

    fn parse(v: Value) -> Arc<AwareAutoscaler> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn status_body(conditions: Value, extra: Value) -> Value {
        let mut status = json!({"conditions": conditions, "observedGeneration": 3});
        if let (Value::Object(s), Value::Object(e)) = (&mut status, extra) {
            s.extend(e);
        }
        json!({"status": status})
    }

    #[tokio::test]
    async fn create_adds_the_finalizer_then_registers_and_writes_status() {
        let with_finalizer = object(&[FINALIZER], spec());
        let registered = status_body(
            json!([{
                "type": "Registered",
                "status": "True",
                "reason": "Registered",
                "message": "Deployment shop/web registered with the services (recommend-only)",
                "observedGeneration": 3,
                "lastTransitionTime": "<time>",
            }]),
            json!({}),
        );
        let mut f = Fixture::new(vec![
            patch(
                &format!("{OBJ}?"),
                JSON_PATCH,
                json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": null},
                    {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
                ]),
                with_finalizer.clone(),
            ),
            get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
            patch(STATUS, MERGE, registered, with_finalizer.clone()),
        ])
        .await;
        // A new object: the finalizer goes on first; nothing is registered before it is there.
        let fresh = object(&[], spec());
        let fresh = {
            let mut v = fresh;
            v["metadata"].as_object_mut().unwrap().remove("finalizers");
            v
        };
        let action = reconcile(parse(fresh), f.shared.clone()).await.unwrap();
        assert_eq!(action, Action::await_change());
        assert!(f.registration().await.is_none());

        // The watch delivers it again with the finalizer: registered, status written.
        let action = reconcile(parse(with_finalizer), f.shared.clone())
            .await
            .unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(30)));
        let r = f.registration().await.expect("a registration");
        assert_eq!(r.target, Target::new("shop", "web"));
        assert_eq!(r.generation, 3);
        assert_eq!(r.source, "shop/web-aware");
        let s = r.spec.expect("a spec");
        assert_eq!((s.min_replicas, s.max_replicas), (1, 10));
        assert_eq!((s.min_cpu_millicores, s.max_cpu_millicores), (100, 2000));
        assert_eq!(
            (s.min_memory_bytes, s.max_memory_bytes),
            (128 * MIB, 2048 * MIB)
        );
        assert_eq!(s.slo_latency_p99_ms, Some(200.0));
        assert_eq!(s.alpha, 0.6);
        assert!(s.recommend_only);
        // The fallback's HPA target the workload was tuned with, as a fraction.
        assert_eq!(s.fallback_hpa_target_cpu_utilization, Some(0.35));
        let l = s.lifecycle.expect("the lifecycle profile");
        assert_eq!(
            (l.t_online, l.t_serving, l.t_var, l.window),
            (1.1, 1.4, 0.1, 5)
        );
        assert_eq!(
            f.shared.owner_of(&Target::new("shop", "web")),
            Some(ObjectKey {
                namespace: "shop".into(),
                name: "web-aware".into()
            })
        );
        assert_eq!(f.shared.metrics.managed.get(), 1);
        f.finish().await;
    }

    #[tokio::test]
    async fn a_resync_re_sends_the_registration_without_writing_status_again() {
        let obj = object(&[FINALIZER], spec());
        let mut f = Fixture::new(vec![
            get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
            patch(
                STATUS,
                MERGE,
                status_body(
                    json!([{
                        "type": "Registered", "status": "True", "reason": "Registered",
                        "message": "Deployment shop/web registered with the services (recommend-only)",
                        "observedGeneration": 3, "lastTransitionTime": "<time>",
                    }]),
                    json!({}),
                ),
                obj.clone(),
            ),
            get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
        ])
        .await;
        reconcile(parse(obj.clone()), f.shared.clone())
            .await
            .unwrap();
        assert!(f.registration().await.is_some());
        resync_due(&f.shared).await;
        reconcile(parse(obj), f.shared.clone()).await.unwrap();
        assert!(f.registration().await.is_some(), "re-sent on resync");
        f.finish().await;
    }

    /// Old deregistrations are purged from the current state; a recent one, and a target
    /// registered again after its deletion, keep theirs.
    #[tokio::test]
    async fn old_deregistrations_are_forgotten_and_recent_ones_and_registrations_kept() {
        use aware_shared::testkit::registration;
        let ctx = ServiceContext::new(
            "controller",
            Bus::in_process(64),
            Arc::new(AppConfig::default()),
            CancellationToken::new(),
        )
        .unwrap();
        let now = 1_000_000_000_000;
        let day = 86_400_000;
        let (old, recent, back) = (
            Target::new("shop", "old"),
            Target::new("shop", "recent"),
            Target::new("shop", "back"),
        );
        let spec = to_registered(&aware_shared::spec::TargetSpec::new(&back), None);
        for r in [
            registration(&old, now - 9 * day, None),
            registration(&recent, now - day, None),
            registration(&back, now - 20 * day, None),
            registration(&back, now - 19 * day, Some(spec)),
        ] {
            ctx.publish_event(&Event::Registration(r)).await.unwrap();
        }
        let forgotten = forget_old_deregistrations(&ctx, 8 * day, now)
            .await
            .unwrap();
        assert_eq!(forgotten, 1);
        let mut left: Vec<String> = ctx
            .read_state_once(EventKind::Target)
            .await
            .unwrap()
            .iter()
            .map(|e| e.target().name.clone())
            .collect();
        left.sort();
        assert_eq!(left, ["back", "recent"]);
        assert_eq!(
            forget_old_deregistrations(&ctx, 8 * day, now)
                .await
                .unwrap(),
            0,
            "nothing left to forget"
        );
    }

    /// Moves the clock past the resync interval, as the queue's requeue would.
    async fn resync_due(shared: &Shared) {
        tokio::time::pause();
        tokio::time::advance(Duration::from_secs(shared.config.resync_seconds)).await;
        tokio::time::resume();
    }

    /// A watch event of the same generation soon after the registration (the controller's own
    /// status write) makes no API call and sends nothing, and keeps the resync due (a shorter
    /// requeue); a new generation is registered at once.
    #[tokio::test]
    async fn an_event_of_the_same_generation_before_the_resync_calls_nothing() {
        let obj = object(&[FINALIZER], spec());
        let registered = |gen: i64| {
            let mut body = status_body(
                json!([{
                    "type": "Registered", "status": "True", "reason": "Registered",
                    "message": "Deployment shop/web registered with the services (recommend-only)",
                    "observedGeneration": gen, "lastTransitionTime": "<time>",
                }]),
                json!({}),
            );
            body["status"]["observedGeneration"] = json!(gen);
            body
        };
        let mut changed = obj.clone();
        changed["metadata"]["generation"] = json!(4);
        let mut f = Fixture::new(vec![
            get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
            patch(STATUS, MERGE, registered(3), obj.clone()),
            // Only for generation 4.
            get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
            patch(STATUS, MERGE, registered(4), changed.clone()),
        ])
        .await;
        let resync = Action::requeue(Duration::from_secs(f.shared.config.resync_seconds));
        let first = reconcile(parse(obj.clone()), f.shared.clone())
            .await
            .unwrap();
        assert_eq!(first, resync);
        assert!(f.registration().await.is_some());
        let again = reconcile(parse(obj), f.shared.clone()).await.unwrap();
        assert!(f.registration().await.is_none(), "nothing re-sent");
        assert_ne!(again, resync, "the resync stays where it was");
        assert_ne!(again, Action::await_change());
        let new_gen = reconcile(parse(changed), f.shared.clone()).await.unwrap();
        assert_eq!(new_gen, resync);
        assert!(f.registration().await.is_some(), "generation 4 registered");
        f.finish().await;
    }

    #[tokio::test]
    async fn delete_deregisters_then_releases_the_finalizer() {
        let mut obj = object(&["other.io/keep", FINALIZER], spec());
        obj["metadata"]["deletionTimestamp"] = json!("2026-11-22T21:00:00Z");
        let mut released = obj.clone();
        released["metadata"]["finalizers"] = json!(["other.io/keep"]);
        let mut f = Fixture::new(vec![patch(
            &format!("{OBJ}?"),
            JSON_PATCH,
            json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]),
            released,
        )])
        .await;
        // It was managed before.
        f.shared.tracked().owners.insert(
            Target::new("shop", "web"),
            ObjectKey {
                namespace: "shop".into(),
                name: "web-aware".into(),
            },
        );
        let action = reconcile(parse(obj), f.shared.clone()).await.unwrap();
        assert_eq!(action, Action::await_change());
        let r = f.registration().await.expect("a deregistration");
        assert_eq!(r.target, Target::new("shop", "web"));
        assert!(r.spec.is_none(), "deregistration carries no spec");
        assert_eq!(f.shared.owner_of(&Target::new("shop", "web")), None);
        // Nothing else happens: no call to the Deployment (it keeps its resources).
        f.finish().await;
    }

    #[tokio::test]
    async fn an_invalid_spec_is_reported_and_never_registered() {
        // min > max: the CRD's CEL rule rejects it, but an object admitted by an older CRD can
        // still carry it.
        let mut s = spec();
        s["constraints"] = json!({"minReplicas": 8, "maxReplicas": 2});
        let obj = object(&[FINALIZER], s);
        let mut f = Fixture::new(vec![patch(
            STATUS,
            MERGE,
            status_body(
                json!([{
                    "type": "Registered", "status": "False", "reason": "InvalidSpec",
                    "message": "invalid bounds: min_replicas 8 above max_replicas 2",
                    "observedGeneration": 3, "lastTransitionTime": "<time>",
                }]),
                json!({}),
            ),
            obj.clone(),
        )])
        .await;
        let action = reconcile(parse(obj), f.shared.clone()).await.unwrap();
        assert_eq!(action, Action::await_change());
        assert!(f.registration().await.is_none());
        f.finish().await;
    }

    #[tokio::test]
    async fn bounds_that_exclude_the_current_allocation_deregister_a_managed_target() {
        let obj = object(&[FINALIZER], spec());
        let mut f = Fixture::new(vec![
            get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
            patch(
                STATUS,
                MERGE,
                status_body(
                    json!([{
                        "type": "Registered", "status": "True", "reason": "Registered",
                        "message": "Deployment shop/web registered with the services (recommend-only)",
                        "observedGeneration": 3, "lastTransitionTime": "<time>",
                    }]),
                    json!({}),
                ),
                obj.clone(),
            ),
            // Someone gave the app container 4 CPUs, above maxAllowed 2.
            get(DEPLOY, 200, deployment(2, "4", "512Mi")),
            patch(
                STATUS,
                MERGE,
                status_body(
                    json!([{
                        "type": "Registered", "status": "False", "reason": "BoundsExcludeCurrent",
                        "message": "the bounds exclude the current allocation: cpu 4000m outside [100m, 2000m]",
                        "observedGeneration": 3, "lastTransitionTime": "<time>",
                    }]),
                    json!({}),
                ),
                obj.clone(),
            ),
        ])
        .await;
        reconcile(parse(obj.clone()), f.shared.clone())
            .await
            .unwrap();
        assert!(f.registration().await.unwrap().spec.is_some());
        resync_due(&f.shared).await;
        reconcile(parse(obj), f.shared.clone()).await.unwrap();
        let r = f.registration().await.expect("a deregistration");
        assert!(r.spec.is_none());
        assert_eq!(f.shared.metrics.managed.get(), 0);
        f.finish().await;
    }

    #[tokio::test]
    async fn a_missing_deployment_is_reported_and_retried() {
        let obj = object(&[FINALIZER], spec());
        let mut f = Fixture::new(vec![
            get(
                DEPLOY,
                404,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "reason": "NotFound", "code": 404,
                       "message": "deployments.apps \"web\" not found"}),
            ),
            patch(
                STATUS,
                MERGE,
                status_body(
                    json!([{
                        "type": "Registered", "status": "False", "reason": "TargetNotFound",
                        "message": "Deployment shop/web does not exist",
                        "observedGeneration": 3, "lastTransitionTime": "<time>",
                    }]),
                    json!({}),
                ),
                obj.clone(),
            ),
        ])
        .await;
        let action = reconcile(parse(obj), f.shared.clone()).await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(10)));
        assert!(f.registration().await.is_none());
        f.finish().await;
    }

    #[tokio::test]
    async fn service_events_become_status_in_one_coalesced_write() {
        let obj = object(&[FINALIZER], spec());
        let registered = json!({
            "type": "Registered", "status": "True", "reason": "Registered",
            "message": "Deployment shop/web registered with the services (recommend-only)",
            "observedGeneration": 3, "lastTransitionTime": "<time>",
        });
        let f = Fixture::new(vec![
            get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
            patch(
                STATUS,
                MERGE,
                status_body(json!([registered.clone()]), json!({})),
                obj.clone(),
            ),
            patch(
                STATUS,
                MERGE,
                status_body(
                    json!([registered, {
                        "type": "Applied", "status": "True", "reason": "RecommendOnly",
                        "message": "recorded, not applied (updateMode Off)",
                        "lastTransitionTime": "<time>",
                    }]),
                    json!({
                        "stage": "online",
                        "recommendation": {"replicas": 4, "cpu": "750m", "memory": "768Mi"},
                        "desiredReplicas": 4,
                        "rewardMean": 1.25,
                        "rewardStd": 0.125,
                    }),
                ),
                obj.clone(),
            ),
        ])
        .await;
        reconcile(parse(obj), f.shared.clone()).await.unwrap();
        let t = Target::new("shop", "web");
        let desired = Resources {
            replicas: 4,
            cpu_millicores: 750,
            memory_bytes: 768 * MIB,
        };
        let lifecycle = Event::Lifecycle(Lifecycle {
            schema: Schema::new(),
            target: t.clone(),
            episode: 12,
            step: 99,
            ts_ms: 1,
            stage: Stage::Online,
            previous: Some(Stage::Offline),
            reason: "estimate reached t_online".into(),
            reward_mean: Some(1.25),
            reward_std: Some(0.125),
            window: 5,
            rollback_to: None,
        });
        let action = Event::Action(aware_bus_schemas::Action {
            schema: Schema::new(),
            target: t.clone(),
            episode: 13,
            step: 0,
            ts_ms: 2,
            source: DecisionSource::Rl,
            stage: Stage::Online,
            raw: vec![0.1, 0.2, 0.3],
            current: desired,
            desired,
            model_version: Some(2),
            exploration: true,
            fallback_reason: None,
            slo_unreachable: None,
            slo_judged: false,
        });
        let applied = Event::Applied(aware_bus_schemas::Applied {
            schema: Schema::new(),
            target: t.clone(),
            episode: 13,
            step: 0,
            ts_ms: 3,
            outcome: aware_bus_schemas::Outcome::RecommendOnly,
            source: DecisionSource::Rl,
            requested: desired,
            applied: desired,
            clamped: vec![],
            reason: None,
            sink: "kubernetes".into(),
        });
        for ev in [&lifecycle, &action, &applied, &action, &applied] {
            fold_event(&f.shared, ev);
        }
        // An event of a target no object manages changes nothing.
        let mut stranger = lifecycle.clone();
        if let Event::Lifecycle(l) = &mut stranger {
            l.target = Target::new("shop", "other");
        }
        assert_eq!(fold_event(&f.shared, &stranger), None);
        flush_status(&f.shared).await;
        // Nothing changed since: no write.
        fold_event(&f.shared, &action);
        flush_status(&f.shared).await;
        f.finish().await;
    }

    /// [`normalize_times`], and the Event's own time and generated name.
    fn normalize_event(v: &mut Value) {
        normalize_times(v);
        if let Some(t) = v.get_mut("eventTime") {
            let s = t.as_str().expect("eventTime is a string");
            assert!(s.parse::<k8s_openapi::jiff::Timestamp>().is_ok(), "{s}");
            *t = json!("<time>");
        }
        if v.get("eventTime").is_some() {
            let name = &mut v["metadata"]["name"];
            let s = name.as_str().expect("an Event has a name");
            assert!(s.starts_with("web-aware."), "{s}");
            *name = json!("<name>");
        }
    }

    /// The POST of a Kubernetes Event about `web-aware`.
    fn event_post(type_: &str, reason: &str, note: &str) -> Exchange {
        let body = json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "action": "Recommend",
            "eventTime": "<time>",
            "metadata": {"name": "<name>", "namespace": "shop"},
            "note": note,
            "reason": reason,
            "regarding": {
                "apiVersion": "aware.dev/v1alpha1",
                "kind": "AwareAutoscaler",
                "name": "web-aware",
                "namespace": "shop",
                "uid": "9a4c3c2e-0000-4000-8000-000000000001",
            },
            "reportingController": "aware-controller",
            "reportingInstance": "aware-controller",
            "type": type_,
        });
        Exchange {
            method: Method::POST,
            uri: "/apis/events.k8s.io/v1/namespaces/shop/events?".into(),
            content_type: Some("application/json"),
            body: Some(body.clone()),
            status: 201,
            response: body,
            delay: Duration::ZERO,
            arrived: None,
        }
    }

    /// An unreachable SLO on the actions becomes the `SloUnreachable` condition (the SLO, the
    /// bounds, the allocation needed) and one Warning Event; more actions saying the same write
    /// nothing; the verdict clearing sets the condition False with one Normal Event.
    #[tokio::test]
    async fn an_unreachable_slo_becomes_a_condition_and_one_event_per_change() {
        let obj = object(&[FINALIZER], spec());
        let registered = json!({
            "type": "Registered", "status": "True", "reason": "Registered",
            "message": "Deployment shop/web registered with the services (recommend-only)",
            "observedGeneration": 3, "lastTransitionTime": "<time>",
        });
        let unreachable = "p99 latency <= 200 ms cannot be met within the bounds (at most 10 \
                           replicas, 2 CPU, 2Gi memory each): the HPA/VPA rule needs 14 replicas \
                           with 2500m CPU and 768Mi memory each";
        let reachable = "p99 latency <= 200 ms is within reach of the bounds again: a whole \
                         window without a violation at a bound the rule wanted to exceed";
        let at_max = Resources {
            replicas: 10,
            cpu_millicores: 2000,
            memory_bytes: 768 * MIB,
        };
        let extra = json!({
            "stage": "offline",
            "recommendation": {"replicas": 10, "cpu": "2", "memory": "768Mi"},
            "desiredReplicas": 10,
        });
        let slo_condition = |status: &str, reason: &str, message: &str| {
            json!({
                "type": "SloUnreachable", "status": status, "reason": reason,
                "message": message, "lastTransitionTime": "<time>",
            })
        };
        let (client, server) = kube_mock::serve_normalized(
            vec![
                get(DEPLOY, 200, deployment(2, "500m", "512Mi")),
                patch(
                    STATUS,
                    MERGE,
                    status_body(json!([registered.clone()]), json!({})),
                    obj.clone(),
                ),
                patch(
                    STATUS,
                    MERGE,
                    status_body(
                        json!([
                            registered.clone(),
                            slo_condition("True", "SloUnreachable", unreachable)
                        ]),
                        extra.clone(),
                    ),
                    obj.clone(),
                ),
                event_post("Warning", "SloUnreachable", unreachable),
                patch(
                    STATUS,
                    MERGE,
                    status_body(
                        json!([
                            registered,
                            slo_condition("False", "SloReachable", reachable)
                        ]),
                        extra,
                    ),
                    obj.clone(),
                ),
                event_post("Normal", "SloReachable", reachable),
            ],
            normalize_event,
        );
        let bus = Bus::in_process(1024);
        let ctx = ServiceContext::new(
            "controller",
            bus,
            Arc::new(AppConfig::default()),
            CancellationToken::new(),
        )
        .unwrap();
        let shared = Shared::new(client, ctx, ControllerConfig::default()).unwrap();
        reconcile(parse(obj), shared.clone()).await.unwrap();
        let action = |step: u32, needed: Option<Resources>, judged: bool| {
            Event::Action(aware_bus_schemas::Action {
                schema: Schema::new(),
                target: Target::new("shop", "web"),
                episode: 1,
                step,
                ts_ms: i64::from(step),
                source: DecisionSource::Fallback,
                stage: Stage::Offline,
                raw: vec![],
                current: at_max,
                desired: at_max,
                model_version: None,
                exploration: false,
                fallback_reason: None,
                slo_unreachable: needed,
                slo_judged: judged,
            })
        };
        // Reachable before: no condition added.
        fold_event(&shared, &action(0, None, true));
        let needed = Resources {
            replicas: 14,
            cpu_millicores: 2500,
            memory_bytes: 768 * MIB,
        };
        for step in 1..4 {
            fold_event(&shared, &action(step, Some(needed), true));
        }
        flush_status(&shared).await;
        // Still unreachable, the same need: nothing to write, no second Event.
        for step in 4..8 {
            assert_eq!(fold_event(&shared, &action(step, Some(needed), true)), None);
        }
        // A restarted recommender, before its first whole window: no verdict, nothing changes.
        for step in 0..5 {
            assert_eq!(fold_event(&shared, &action(step, None, false)), None);
        }
        flush_status(&shared).await;
        for step in 8..10 {
            fold_event(&shared, &action(step, None, true));
        }
        flush_status(&shared).await;
        fold_event(&shared, &action(10, None, true));
        flush_status(&shared).await;
        // One count per change, as the Events.
        let changes = |reason: &str| {
            shared
                .metrics
                .slo_reach_changes
                .with_label_values(&[reason])
                .get()
        };
        assert_eq!((changes("SloUnreachable"), changes("SloReachable")), (1, 1));
        drop(shared);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the mock server did not finish")
            .expect("the mock server's assertions");
    }

    #[test]
    fn the_current_allocation_is_read_from_the_named_container() {
        let d: Deployment = serde_json::from_value(deployment(3, "1500m", "1Gi")).unwrap();
        assert_eq!(
            current_allocation(&d, Some("app")),
            (3, Some(1500), Some(1024 * MIB))
        );
        assert_eq!(current_allocation(&d, None), (3, Some(50), Some(64 * MIB)));
        assert_eq!(current_allocation(&d, Some("nope")), (3, None, None));
        // The requests are the allocation; the limits stand in for a missing request.
        let mut v = deployment(3, "1500m", "1Gi");
        v["spec"]["template"]["spec"]["containers"][1]["resources"]["requests"] =
            json!({"cpu": "500m"});
        let d: Deployment = serde_json::from_value(v).unwrap();
        assert_eq!(
            current_allocation(&d, Some("app")),
            (3, Some(500), Some(1024 * MIB))
        );
    }

    #[test]
    fn configuration_is_validated() {
        assert!(ControllerConfig::default().validate().is_ok());
        let bad = ControllerConfig {
            resync_seconds: 0,
            ..ControllerConfig::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("controller.resync_seconds"), "{e}");
    }

    /// The controller's service context on an in-process bus, a subscription to its registrations
    /// and its shutdown token.
    async fn controller_context() -> (ServiceContext, Subscription, CancellationToken) {
        let bus = Bus::in_process(1024);
        let registrations = bus.subscribe("aware.v1.target.>").await.unwrap();
        let shutdown = CancellationToken::new();
        let ctx = ServiceContext::new(
            "controller",
            bus,
            Arc::new(AppConfig::default()),
            shutdown.clone(),
        )
        .unwrap();
        (ctx, registrations, shutdown)
    }

    async fn next_registration(sub: &mut Subscription) -> Registration {
        let msg = tokio::time::timeout(Duration::from_secs(20), sub.next())
            .await
            .expect("no registration within 20 s")
            .unwrap();
        match aware_bus_schemas::decode_event(EventKind::Target, &msg.payload).unwrap() {
            Event::Registration(r) => r,
            other => panic!("{other:?}"),
        }
    }

    /// The whole controller (kube runtime: list, watch, finalizer, reconcile, status writer) against
    /// a mock API server that answers like one: an object is listed, registered over the bus; then
    /// the watch reports it deleted, the target is deregistered and the finalizer removed.
    #[tokio::test]
    async fn the_running_controller_registers_on_create_and_releases_on_delete() {
        let obj = object(&[FINALIZER], spec());
        let mut deleting = obj.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-22T21:00:00Z");
        deleting["metadata"]["resourceVersion"] = json!("101");
        let list = json!({
            "apiVersion": "aware.dev/v1alpha1", "kind": "AwareAutoscalerList",
            "metadata": {"resourceVersion": "100"},
            "items": [obj.clone()],
        });

        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let (release_watch, mut watch_released) = tokio::sync::oneshot::channel::<()>();
        let (finalizer_removed_tx, finalizer_removed) = tokio::sync::oneshot::channel::<Value>();
        let server = tokio::spawn(async move {
            let mut handle = pin!(handle);
            let mut held = Vec::new();
            let mut first_watch = None;
            let mut released = false;
            let mut finalizer_removed_tx = Some(finalizer_removed_tx);
            let respond = |send: tower_test::mock::SendResponse<Response<Body>>, v: &Value| {
                send.send_response(kube_mock::json_response(200, v))
            };
            loop {
                let next = tokio::select! {
                    r = handle.next_request() => r,
                    _ = &mut watch_released, if first_watch.is_some() && !released => {
                        released = true;
                        // The object is deleted: one MODIFIED event with deletionTimestamp.
                        let send: tower_test::mock::SendResponse<Response<Body>> = first_watch.take().unwrap();
                        let mut line = serde_json::to_vec(&json!({"type": "MODIFIED", "object": deleting})).unwrap();
                        line.push(b'\n');
                        send.send_response(Response::builder().status(200).body(Body::from(line)).unwrap());
                        continue;
                    }
                };
                let Some((request, send)) = next else { break };
                let method = request.method().clone();
                let path = request.uri().path().to_string();
                let query = request.uri().query().unwrap_or("").to_string();
                let body = request.into_body().collect_bytes().await.unwrap();
                match (method, path.as_str()) {
                    (Method::GET, "/apis/aware.dev/v1alpha1/awareautoscalers")
                        if query.contains("watch=true") =>
                    {
                        if first_watch.is_none() && !released {
                            first_watch = Some(send);
                        } else {
                            held.push(send); // later watches stay open and quiet
                        }
                    }
                    (Method::GET, "/apis/aware.dev/v1alpha1/awareautoscalers") => {
                        respond(send, &list)
                    }
                    (Method::GET, DEPLOY) => respond(send, &deployment(2, "500m", "512Mi")),
                    (Method::PATCH, p) if p.ends_with("/status") => respond(send, &obj),
                    (Method::PATCH, OBJ) => {
                        let patch: Value = serde_json::from_slice(&body).unwrap();
                        let mut released = deleting.clone();
                        released["metadata"]["finalizers"] = json!([]);
                        respond(send, &released);
                        if let Some(tx) = finalizer_removed_tx.take() {
                            let _ = tx.send(patch);
                        }
                    }
                    (m, p) => panic!("unexpected request {m} {p}?{query}"),
                }
            }
        });

        let (ctx, mut registrations, shutdown) = controller_context().await;
        let controller = tokio::spawn(run_with_client(ctx, Client::new(service, "default")));
        let r = next_registration(&mut registrations).await;
        assert_eq!(r.target, Target::new("shop", "web"));
        assert!(r.spec.is_some(), "registered on create");
        release_watch.send(()).unwrap();
        let r = next_registration(&mut registrations).await;
        assert!(r.spec.is_none(), "deregistered on delete");
        let patch = tokio::time::timeout(Duration::from_secs(20), finalizer_removed)
            .await
            .expect("the finalizer was never removed")
            .unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
                {"op": "remove", "path": "/metadata/finalizers/0"},
            ])
        );
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), controller)
            .await
            .expect("the controller did not stop")
            .unwrap()
            .unwrap();
        server.abort();
    }

    /// The whole controller against an API server that refuses to list AwareAutoscalers (the RBAC
    /// of a broken install): every failed list is counted and logged, retried with backoff, and
    /// nothing is registered; it still stops on shutdown (within [`SHUTDOWN_GRACE`]).
    #[tokio::test]
    async fn a_refused_watch_is_counted_and_retried() {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let (lists_tx, mut lists) = tokio::sync::mpsc::unbounded_channel::<String>();
        let server = tokio::spawn(async move {
            let mut handle = pin!(handle);
            while let Some((request, send)) = handle.next_request().await {
                let (method, path) = (request.method().clone(), request.uri().path().to_string());
                assert_eq!(
                    (method, path.as_str()),
                    (Method::GET, "/apis/aware.dev/v1alpha1/awareautoscalers"),
                    "only the list is tried"
                );
                let _ = lists_tx.send(request.uri().to_string());
                send.send_response(kube_mock::json_response(
                    403,
                    &json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "awareautoscalers.aware.dev is forbidden: User \"system:serviceaccount:aware:aware-controller\" cannot list resource \"awareautoscalers\"",
                        "reason": "Forbidden", "code": 403,
                    }),
                ));
            }
        });

        let (ctx, mut registrations, shutdown) = controller_context().await;
        let metrics = ctx.metrics.clone();
        let errors = move || {
            let text = aware_shared::telemetry::render_metrics(std::slice::from_ref(&metrics));
            text.lines()
                .find_map(|l| l.strip_prefix("aware_controller_watch_errors_total"))
                .map(|v| v.trim().rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        };
        let controller = tokio::spawn(run_with_client(ctx, Client::new(service, "default")));
        // Three lists: the first and two retries after backoff.
        for _ in 0..3 {
            tokio::time::timeout(Duration::from_secs(20), lists.recv())
                .await
                .expect("the list was not retried")
                .unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while errors() < Some(2.0) {
            assert!(std::time::Instant::now() < deadline, "{:?}", errors());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(200), registrations.next())
                .await
                .is_err(),
            "nothing registered"
        );
        shutdown.cancel();
        tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(10), controller)
            .await
            .expect("the controller did not stop")
            .unwrap()
            .unwrap();
        server.abort();
    }
}
