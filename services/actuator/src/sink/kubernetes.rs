//! The Kubernetes sink (kube-rs): applies allocations to a Deployment.
//!
//! - **Replicas** through the Deployment's `scale` subresource: `PATCH
//!   /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale`, JSON merge patch
//!   `{"spec":{"replicas":N}}`; skipped when `spec.replicas` already is N.
//! - **CPU and memory requests and limits**, per target ([`VerticalMode`]):
//!   - `InPlace` (default): for every live pod of the Deployment (listed with the Deployment's
//!     selector; pods being deleted or finished are skipped) whose container differs, `PATCH
//!     /api/v1/namespaces/{ns}/pods/{pod}/resize`, strategic merge patch of the container's
//!     resources. No restart. Pods created later (a scale-up, a replacement) start from the
//!     template's values and are resized by the next `apply`, which therefore reconciles every pod
//!     and should be called every step (it sends nothing when everything already matches). When
//!     the API refuses the resize as unsupported or infeasible (404 without the pod being gone —
//!     the cluster has no `resize` subresource —, 405, or 422 Invalid, e.g. a change of QoS
//!     class), or when there is no live pod to resize, the sink falls back to a template patch
//!     (unless `fallback_to_template` is off) and says so in [`ApplyReport::notes`].
//!   - `TemplatePatch`: strategic merge patch of the Deployment's pod template (`PATCH
//!     /apis/apps/v1/namespaces/{ns}/deployments/{name}`), which rolls the pods. The patch
//!     carries the `metadata.resourceVersion` of the read it was computed from (the new requests
//!     depend on the container as read): when another client changed the Deployment in between,
//!     the API server refuses it with 409 Conflict and the sink waits (the retry backoff), reads
//!     the Deployment again and recomputes, up to `retry.max_attempts` reads, rather than
//!     overwrite that edit. The vertical change is applied before the replicas (a scale moves
//!     the `resourceVersion` on, which would make the template patch's precondition fail).
//! - **Container**: the one the target's registration names (the AwareAutoscaler's
//!   `resourcePolicy.containerPolicies`, carried as `TargetSpec::container`); with none (no
//!   policy, or a `*` policy) the configured `container`, else the first container of the pod
//!   template. Only that container is patched (template and pods alike); the others are left as
//!   they are. A named container missing from the template (or from a live pod) is refused with
//!   [`SinkError::Unmanageable`] naming where the name came from, and nothing is patched.
//! - **Requests and limits**: the allocation applied is the requests (what the scheduler packs
//!   and the user pays for); the limits follow from them by the target's limits policy
//!   ([`LimitsRule`], from its registration: `aware_mdp::LimitsPolicy`). With
//!   `RequestsAndLimits` (the default) each limit keeps the container's limit:request ratio as
//!   read, `round(new request × limit / request)` (so a Guaranteed pod stays Guaranteed and a
//!   Burstable one Burstable: in-place resize cannot change the QoS class), and a resource
//!   without a limit keeps none; with `RequestsOnly` the limits are left as they are and a
//!   request above one is capped at it (Kubernetes refuses a request above its limit). A CPU
//!   limit the policy removes (`cpu_limit`: `Unset`, or `UnsetIfLatencySensitive` for a target
//!   whose SLO has a latency objective) is written as `null`, which deletes it; an in-place
//!   resize that would change the QoS class that way is refused by the API server and falls back
//!   to a template patch like any refused resize. Requests are always written, so a container
//!   whose request was missing gets one.
//! - **Quantities**: CPU as whole cores (`"2"`) or millicores (`"500m"`), memory as `Gi`/`Mi`/`Ki`
//!   when exact, else bytes. Values are integers (never NaN); zero values are refused with
//!   [`SinkError::InvalidValue`] before any request.
//! - **Retries**: 409 Conflict, 429 Too Many Requests, 5xx and transport errors are retried with
//!   exponential backoff up to `retry.max_attempts` attempts ([`RetryConfig`]); other 4xx are not.
//!   (Only the template patch has a precondition; a 409 there means "read again", see above.)
//!   (429 is the API server's "retry later" and is retried too, as in kube-rs's own retry policy.)
//! - **Allocation in force** ([`Sink::current`]): replicas from the Deployment's `spec.replicas`;
//!   CPU and memory requests (a missing request is its limit, as Kubernetes reads it) from the
//!   template container, or in `InPlace` mode from the live pods
//!   (the value most pods have; ties go to the first pod in name order): what each pod's kubelet
//!   reports its container runs with (`status.containerStatuses[].resources`), else — a kubelet
//!   without in-place resize reports nothing — the pod's container spec. (After a resize the
//!   spec holds the new values at once, the status only once the kubelet has applied them, and
//!   never when it finds them infeasible.) A missing request and limit read as 0 ("unknown" to
//!   the guardrails).
//!
//! - **One read per decision**: [`KubernetesSink::read`] reads the Deployment (and, in `InPlace`
//!   mode, lists its live pods: the requests in force are theirs) and gives the allocation in force
//!   the decision is made from; [`KubernetesSink::apply_read`] applies from that same read (the
//!   template patch's `resourceVersion` precondition is that read's; only a 409 reads again). A
//!   decision is thus 1 read (+1 pod list in `InPlace` mode) and its writes. [`Sink::apply`]
//!   alone is a read and an `apply_read`.
//! - **Concurrency**: at most `max_concurrent_calls` holders of a [`KubernetesSink::slot`] (a
//!   decision, or one [`Sink::current`] / [`Sink::apply`]) make requests at once, each one request
//!   at a time; the others wait for a slot in order of arrival, so a burst of decisions queues in
//!   the actuator instead of drawing 429s from the API server's priority and fairness.
//!
//! RBAC: `get` on `deployments`, `patch` on `deployments` and `deployments/scale`, `list` on `pods`
//! and `patch` on `pods/resize`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aware_bus_schemas::{Resources, Target};
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ListParams, Patch, PatchParams};
use kube::core::{Selector, Status};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use thiserror::Error;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

use super::{validate_desired, ApplyReport, LimitsRule, Sink, SinkError};
use aware_mdp::ContainerResources;

/// How CPU and memory changes reach the pods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerticalMode {
    /// `pods/resize` on every pod (no restart), falling back to `TemplatePatch` when refused.
    #[default]
    #[serde(alias = "InPlace")]
    InPlace,
    /// Patch the Deployment's pod template (rolls the pods).
    #[serde(alias = "TemplatePatch")]
    TemplatePatch,
}

/// Settings of one target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TargetSinkConfig {
    pub vertical_mode: VerticalMode,
    /// Container whose resources are managed; the first container of the template when unset.
    pub container: Option<String>,
    /// In `InPlace` mode, patch the template when the API refuses the resize.
    pub fallback_to_template: bool,
}

impl Default for TargetSinkConfig {
    fn default() -> Self {
        TargetSinkConfig {
            vertical_mode: VerticalMode::InPlace,
            container: None,
            fallback_to_template: true,
        }
    }
}

/// Retries of 409, 429, 5xx and transport errors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts per request, including the first (at least 1).
    pub max_attempts: u32,
    /// Wait before the second attempt; doubles for each further attempt.
    pub initial_backoff_ms: u64,
    /// Upper bound of the wait.
    pub max_backoff_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 5,
            initial_backoff_ms: 200,
            max_backoff_ms: 5_000,
        }
    }
}

impl RetryConfig {
    /// The wait after failed attempt number `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u64
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u64::MAX);
        Duration::from_millis(
            self.initial_backoff_ms
                .saturating_mul(factor)
                .min(self.max_backoff_ms),
        )
    }
}

/// Configuration of the Kubernetes sink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesSinkConfig {
    /// `fieldManager` of every patch.
    pub field_manager: String,
    /// Settings of targets not listed in `targets`.
    pub defaults: TargetSinkConfig,
    /// Per-target settings, keyed by `namespace/name` (replace `defaults` for that target).
    pub targets: BTreeMap<String, TargetSinkConfig>,
    pub retry: RetryConfig,
    /// Decisions whose API requests may be in flight at once (each makes its requests one after
    /// the other, so this bounds the requests in flight too); more wait in the actuator instead
    /// of overflowing the API server's priority-and-fairness queues (429s).
    pub max_concurrent_calls: u16,
}

impl Default for KubernetesSinkConfig {
    fn default() -> Self {
        KubernetesSinkConfig {
            field_manager: "aware-actuator".to_string(),
            defaults: TargetSinkConfig::default(),
            targets: BTreeMap::new(),
            retry: RetryConfig::default(),
            max_concurrent_calls: 32,
        }
    }
}

/// A Kubernetes sink setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KubernetesSinkConfigError {
    #[error("sink.retry.max_attempts must be at least 1")]
    NoAttempts,
    #[error("sink.field_manager must not be empty")]
    EmptyFieldManager,
    #[error("sink.targets key `{0}` is not `namespace/name`")]
    BadTargetKey(String),
    #[error("sink.max_concurrent_calls must be at least 1")]
    NoConcurrentCalls,
}

impl KubernetesSinkConfig {
    pub fn validate(&self) -> Result<(), KubernetesSinkConfigError> {
        if self.retry.max_attempts == 0 {
            return Err(KubernetesSinkConfigError::NoAttempts);
        }
        if self.field_manager.is_empty() {
            return Err(KubernetesSinkConfigError::EmptyFieldManager);
        }
        if self.max_concurrent_calls == 0 {
            return Err(KubernetesSinkConfigError::NoConcurrentCalls);
        }
        for key in self.targets.keys() {
            match key.split_once('/') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {}
                _ => return Err(KubernetesSinkConfigError::BadTargetKey(key.clone())),
            }
        }
        Ok(())
    }

    /// The settings of `target`.
    pub fn for_target(&self, target: &Target) -> &TargetSinkConfig {
        self.targets.get(&target.key()).unwrap_or(&self.defaults)
    }
}

/// Applies allocations to Deployments through the Kubernetes API.
#[derive(Clone)]
pub struct KubernetesSink {
    client: Client,
    config: KubernetesSinkConfig,
    /// `max_concurrent_calls` slots, shared by every target (see [`KubernetesSink::slot`]).
    slots: Arc<Semaphore>,
}

/// One read of a target ([`KubernetesSink::read`]): the allocation in force, and what applying
/// a decision made from it needs (the Deployment's spec and `resourceVersion`, the managed
/// container, the live pods in `InPlace` mode).
#[derive(Debug, Clone)]
pub struct TargetState {
    /// The allocation in force: replicas and the requests (see the module documentation).
    pub in_force: Resources,
    /// The managed container's requests and limits in the pod template: where its limits, and
    /// their ratio to the requests, come from.
    pub container_resources: ContainerResources,
    spec: DeploymentSpec,
    version: Option<String>,
    container: Container,
    /// The live pods, sorted by name; listed only in `InPlace` mode.
    pods: Option<Vec<Pod>>,
}

impl std::fmt::Debug for KubernetesSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesSink")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Sink for KubernetesSink {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn current_with<'a>(
        &'a self,
        target: &'a Target,
        container: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Resources, SinkError>> {
        Box::pin(async move {
            let _slot = self.slot().await;
            Ok(self.read(target, container).await?.in_force)
        })
    }

    fn apply_limited<'a>(
        &'a self,
        target: &'a Target,
        desired: Resources,
        container: Option<&'a str>,
        rule: LimitsRule,
    ) -> BoxFuture<'a, Result<ApplyReport, SinkError>> {
        Box::pin(async move {
            validate_desired(target, &desired)?;
            let _slot = self.slot().await;
            let state = self.read(target, container).await?;
            self.apply_read(target, &state, desired, rule).await
        })
    }
}

/// A failed API call: the sink error and, for API errors, the server's `Status`.
struct CallError {
    error: SinkError,
    status: Option<Box<Status>>,
}

impl From<CallError> for SinkError {
    fn from(e: CallError) -> Self {
        e.error
    }
}

/// Which container of the pod template is sized, and who chose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice<'a> {
    /// Named by the target's registration (the AwareAutoscaler's `containerPolicies`).
    Registered(&'a str),
    /// The sink's `container` setting for the target.
    Configured(&'a str),
    /// The first container of the pod template.
    First,
    /// The container sized at the first read (a read again looks for the same one).
    Sized(&'a str),
}

impl<'a> Choice<'a> {
    fn new(registered: Option<&'a str>, cfg: &'a TargetSinkConfig) -> Self {
        match (registered, cfg.container.as_deref()) {
            (Some(n), _) => Choice::Registered(n),
            (None, Some(n)) => Choice::Configured(n),
            (None, None) => Choice::First,
        }
    }

    fn name(self) -> Option<&'a str> {
        match self {
            Choice::Registered(n) | Choice::Configured(n) | Choice::Sized(n) => Some(n),
            Choice::First => None,
        }
    }

    /// Where a name came from, for an error that names it.
    fn origin(self) -> &'static str {
        match self {
            Choice::Registered(_) => {
                "named by the AwareAutoscaler's spec.resourcePolicy.containerPolicies[].containerName"
            }
            Choice::Configured(_) => "named by the actuator's kubernetes `container` setting",
            Choice::First => "the pod template's first container",
            Choice::Sized(_) => "the container sized when the Deployment was first read",
        }
    }
}

/// The managed container of a pod spec.
fn select_container<'c>(
    target: &Target,
    containers: &'c [Container],
    choice: Choice<'_>,
    whose: &str,
) -> Result<&'c Container, SinkError> {
    let found = match choice.name() {
        Some(n) => containers.iter().find(|c| c.name == n),
        None => containers.first(),
    };
    found.ok_or_else(|| SinkError::Unmanageable {
        target: target.key(),
        why: match choice.name() {
            Some(n) => format!(
                "{whose} has no container `{n}` ({}; its containers: {})",
                choice.origin(),
                containers
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => format!("{whose} has no containers"),
        },
    })
}

impl KubernetesSink {
    pub fn new(
        client: Client,
        config: KubernetesSinkConfig,
    ) -> Result<Self, KubernetesSinkConfigError> {
        config.validate()?;
        let slots = Arc::new(Semaphore::new(usize::from(config.max_concurrent_calls)));
        Ok(KubernetesSink {
            client,
            config,
            slots,
        })
    }

    pub fn config(&self) -> &KubernetesSinkConfig {
        &self.config
    }

    fn patch_params(&self) -> PatchParams {
        PatchParams {
            field_manager: Some(self.config.field_manager.clone()),
            ..PatchParams::default()
        }
    }

    /// Runs one API request with the retry policy.
    async fn call<T, F, Fut>(
        &self,
        target: &Target,
        operation: &str,
        request: F,
    ) -> Result<T, CallError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        self.call_with(target, operation, true, request).await
    }

    /// Runs one API request with the retry policy; a 409 Conflict is retried only with
    /// `retry_conflicts` (a request with a `resourceVersion` precondition fails the same way
    /// every time: its caller reads again instead).
    async fn call_with<T, F, Fut>(
        &self,
        target: &Target,
        operation: &str,
        retry_conflicts: bool,
        mut request: F,
    ) -> Result<T, CallError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let retry = &self.config.retry;
        let mut attempt = 1u32;
        loop {
            let err = match request().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let (error, status, retryable) = classify(target, operation, err);
            let conflict = status.as_ref().is_some_and(|s| s.code == 409);
            if !retryable || (conflict && !retry_conflicts) {
                return Err(CallError { error, status });
            }
            if attempt >= retry.max_attempts {
                warn!(target = %target, operation, attempts = attempt, error = %error, "giving up");
                return Err(CallError {
                    error: SinkError::RetriesExhausted {
                        target: target.key(),
                        operation: operation.to_string(),
                        attempts: attempt,
                        last: Box::new(error),
                    },
                    status,
                });
            }
            let delay = retry.backoff(attempt);
            warn!(
                target = %target,
                operation,
                attempt,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                error = %error,
                "retrying"
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// The Deployment's API, spec and `resourceVersion`.
    async fn get_deployment(
        &self,
        target: &Target,
    ) -> Result<(Api<Deployment>, DeploymentSpec, Option<String>), SinkError> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &target.namespace);
        let deployment = self
            .call(target, "get deployment", || api.get(&target.name))
            .await
            .map_err(|e| match e.error.status_code() {
                Some(404) => SinkError::NotFound {
                    target: target.key(),
                    what: format!("deployment {}", target.key()),
                },
                _ => e.error,
            })?;
        let spec = deployment.spec.ok_or_else(|| SinkError::Unmanageable {
            target: target.key(),
            why: "the deployment has no spec".to_string(),
        })?;
        Ok((api, spec, deployment.metadata.resource_version))
    }

    /// Live pods of the Deployment (not being deleted, not finished), sorted by name.
    async fn live_pods(
        &self,
        target: &Target,
        spec: &DeploymentSpec,
    ) -> Result<Vec<Pod>, SinkError> {
        let selector =
            Selector::try_from(spec.selector.clone()).map_err(|e| SinkError::Unmanageable {
                target: target.key(),
                why: format!("unusable deployment selector: {e}"),
            })?;
        if selector.selects_all() {
            return Err(SinkError::Unmanageable {
                target: target.key(),
                why: "the deployment selector is empty (it would select every pod)".to_string(),
            });
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &target.namespace);
        let params = ListParams::default().labels_from(&selector);
        let list = self.call(target, "list pods", || api.list(&params)).await?;
        let mut pods: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                p.metadata.deletion_timestamp.is_none()
                    && !matches!(phase, Some("Succeeded" | "Failed"))
            })
            .collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }

    /// Waits for one of the `max_concurrent_calls` slots: while it is held, the holder's API
    /// requests (made one after the other) are the only ones it has in flight.
    pub async fn slot(&self) -> OwnedSemaphorePermit {
        // The semaphore is never closed, so acquiring cannot fail; were it closed, the call would
        // go ahead unbounded rather than never.
        loop {
            if let Ok(p) = self.slots.clone().acquire_owned().await {
                return p;
            }
        }
    }

    /// The state of `target` a decision is made from and applied to: one read of the Deployment
    /// and, in `InPlace` mode (the allocation in force is what the pods' kubelets report), one
    /// list of its live pods.
    pub async fn read(
        &self,
        target: &Target,
        registered: Option<&str>,
    ) -> Result<TargetState, SinkError> {
        let cfg = self.config.for_target(target);
        let choice = Choice::new(registered, cfg);
        let (_, spec, version) = self.get_deployment(target).await?;
        let replicas = replicas_of(target, &spec)?;
        let template = template_containers(&spec);
        let container = select_container(target, template, choice, "the pod template")?.clone();
        let container_resources = resources_of(target, &container)?;
        let (mut cpu, mut memory) = requests_in(&container_resources);
        let pods = if cfg.vertical_mode == VerticalMode::InPlace {
            let pods = self.live_pods(target, &spec).await?;
            let mut values = Vec::with_capacity(pods.len());
            for pod in &pods {
                if let Some(running) = running_requests(target, pod, &container.name)? {
                    values.push(running);
                } else if let Some(c) = pod_container(pod, &container.name) {
                    values.push(requests_of(target, c)?);
                }
            }
            if let Some(v) = most_common(&values) {
                (cpu, memory) = v;
            }
            Some(pods)
        } else {
            None
        };
        Ok(TargetState {
            in_force: Resources {
                replicas,
                cpu_millicores: cpu,
                memory_bytes: memory,
            },
            container_resources,
            spec,
            version,
            container,
            pods,
        })
    }

    /// Applies `desired` (the requests) to `target` from `state`, the [`KubernetesSink::read`]
    /// the decision was made from, with the limits `rule` derives: no read again, except the
    /// template patch's after a 409 Conflict (its precondition is the `resourceVersion` of
    /// `state`).
    pub async fn apply_read(
        &self,
        target: &Target,
        state: &TargetState,
        desired: Resources,
        rule: LimitsRule,
    ) -> Result<ApplyReport, SinkError> {
        validate_desired(target, &desired)?;
        let cfg = self.config.for_target(target);
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), &target.namespace);
        let container = &state.container;

        // The vertical change goes first: the template patch's precondition is the read's
        // `resourceVersion`, which a scale would have moved on (a sure 409 Conflict and a read
        // again while the Deployment controller writes the status of the scale).
        let mut notes = Vec::new();
        let (cpu, memory) = match cfg.vertical_mode {
            VerticalMode::TemplatePatch => {
                self.patch_template(target, container, state.version.clone(), desired, rule)
                    .await?
            }
            VerticalMode::InPlace => {
                let listed;
                let pods = match &state.pods {
                    Some(p) => p.as_slice(),
                    None => {
                        listed = self.live_pods(target, &state.spec).await?;
                        listed.as_slice()
                    }
                };
                match self
                    .resize_in_place(target, pods, container, desired, rule)
                    .await?
                {
                    InPlace::Done(v) => v,
                    InPlace::Refused(why) if cfg.fallback_to_template => {
                        let note = format!(
                            "{why}; patched the deployment template instead (pods restart)"
                        );
                        warn!(target = %target, note = %note, "in-place resize fallback");
                        notes.push(note);
                        self.patch_template(target, container, state.version.clone(), desired, rule)
                            .await?
                    }
                    InPlace::Refused(why) => {
                        return Err(SinkError::Unmanageable {
                            target: target.key(),
                            why: format!("{why}, and the template fallback is disabled"),
                        })
                    }
                }
            }
        };
        let replicas = self
            .apply_replicas(target, &deployments, &state.spec, desired.replicas)
            .await?;
        let in_force = Resources {
            replicas,
            cpu_millicores: cpu,
            memory_bytes: memory,
        };
        info!(
            target = %target,
            replicas = in_force.replicas,
            cpu_millicores = in_force.cpu_millicores,
            memory_bytes = in_force.memory_bytes,
            notes = notes.len(),
            "applied"
        );
        Ok(ApplyReport { in_force, notes })
    }

    async fn apply_replicas(
        &self,
        target: &Target,
        deployments: &Api<Deployment>,
        spec: &DeploymentSpec,
        desired: u32,
    ) -> Result<u32, SinkError> {
        let current = replicas_of(target, spec)?;
        if current == desired {
            return Ok(current);
        }
        let n = i32::try_from(desired).map_err(|_| SinkError::InvalidValue {
            target: target.key(),
            dimension: "replicas",
            value: u64::from(desired),
            why: "above the Kubernetes maximum (2^31 - 1)",
        })?;
        let patch = Patch::Merge(json!({ "spec": { "replicas": n } }));
        let pp = self.patch_params();
        let scale = self
            .call(target, "scale deployment", || {
                deployments.patch_scale(&target.name, &pp, &patch)
            })
            .await?;
        let after = scale.spec.and_then(|s| s.replicas).unwrap_or(n);
        info!(target = %target, from = current, to = after, "scaled");
        u32::try_from(after).map_err(|_| SinkError::Transport {
            target: target.key(),
            operation: "scale deployment".to_string(),
            message: format!("the API reported {after} replicas"),
        })
    }

    /// Strategic merge patch of the template container's resources; returns the requests in
    /// force.
    ///
    /// The new limits are computed from the container as read (they keep its limit:request
    /// ratio, or its limits), so the patch carries the `resourceVersion` of that read as a precondition: when
    /// another client changed the Deployment in between, the API server answers 409 Conflict and
    /// the sink reads the Deployment again and recomputes (up to `retry.max_attempts` reads),
    /// instead of overwriting that edit with values computed from a stale read.
    async fn patch_template(
        &self,
        target: &Target,
        container: &Container,
        version: Option<String>,
        desired: Resources,
        rule: LimitsRule,
    ) -> Result<(u32, u64), SinkError> {
        const OPERATION: &str = "patch deployment template";
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), &target.namespace);
        let retry = &self.config.retry;
        let (mut container, mut version) = (container.clone(), version);
        let mut attempt = 1u32;
        loop {
            if holds(target, &container, desired, rule)? {
                return requests_of(target, &container);
            }
            let resources = resources_patch(target, &container, desired, rule)?;
            let mut body = json!({
                "spec": { "template": { "spec": { "containers": [
                    { "name": container.name, "resources": resources }
                ] } } }
            });
            if let Some(v) = &version {
                body["metadata"] = json!({ "resourceVersion": v });
            }
            let patch = Patch::Strategic(body);
            let pp = self.patch_params();
            let err = match self
                .call_with(target, OPERATION, false, || {
                    deployments.patch(&target.name, &pp, &patch)
                })
                .await
            {
                Ok(deployment) => {
                    let spec = deployment.spec.unwrap_or_default();
                    let after = select_container(
                        target,
                        template_containers(&spec),
                        Choice::Sized(&container.name),
                        "the patched pod template",
                    )?;
                    let requests = requests_of(target, after)?;
                    info!(
                        target = %target,
                        container = %container.name,
                        cpu_millicores = requests.0,
                        memory_bytes = requests.1,
                        "patched the pod template"
                    );
                    return Ok(requests);
                }
                Err(e) => e,
            };
            if err.error.status_code() != Some(409) {
                return Err(err.error);
            }
            if attempt >= retry.max_attempts {
                warn!(target = %target, operation = OPERATION, attempts = attempt, "giving up: the deployment kept changing");
                return Err(SinkError::RetriesExhausted {
                    target: target.key(),
                    operation: OPERATION.to_string(),
                    attempts: attempt,
                    last: Box::new(err.error),
                });
            }
            // Wait before reading again: a Deployment that changed under the patch is usually
            // being written by its controller (status of a rollout or a scale), and an immediate
            // read-and-patch runs into the next of those writes.
            let delay = retry.backoff(attempt);
            warn!(
                target = %target,
                operation = OPERATION,
                attempt,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "the deployment changed since it was read: reading it again"
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
            let (_, spec, v) = self.get_deployment(target).await?;
            container = select_container(
                target,
                template_containers(&spec),
                Choice::Sized(&container.name),
                "the pod template",
            )?
            .clone();
            version = v;
        }
    }

    /// Resizes every pod of `pods` (the live pods as read) whose container differs from
    /// `desired` (the requests) and the limits `rule` derives from them and that container.
    async fn resize_in_place(
        &self,
        target: &Target,
        pods: &[Pod],
        template_container: &Container,
        desired: Resources,
        rule: LimitsRule,
    ) -> Result<InPlace, SinkError> {
        let pods_api: Api<Pod> = Api::namespaced(self.client.clone(), &target.namespace);
        let name = &template_container.name;
        let pp = self.patch_params();
        let mut values = Vec::with_capacity(pods.len());
        for pod in pods {
            let Some(pod_name) = pod.metadata.name.as_deref() else {
                continue;
            };
            let Some(container) = pod_container(pod, name) else {
                return Err(SinkError::Unmanageable {
                    target: target.key(),
                    why: format!("pod {pod_name} has no container named `{name}`"),
                });
            };
            let want = {
                let r = rule
                    .resolve(desired, &resources_of(target, container)?)
                    .requests;
                (r.cpu_millicores, r.memory_bytes)
            };
            if holds(target, container, desired, rule)? {
                values.push(want);
                continue;
            }
            let resources = resources_patch(target, container, desired, rule)?;
            let patch = Patch::Strategic(json!({
                "spec": { "containers": [ { "name": name, "resources": resources } ] }
            }));
            let operation = format!("resize pod {pod_name}");
            match self
                .call(target, &operation, || {
                    pods_api.patch_resize(pod_name, &pp, &patch)
                })
                .await
            {
                Ok(resized) => {
                    let after = pod_container(&resized, name)
                        .map(|c| requests_of(target, c))
                        .transpose()?
                        .unwrap_or(want);
                    debug!(target = %target, pod = pod_name, cpu_millicores = after.0, memory_bytes = after.1, "resized in place");
                    values.push(after);
                }
                Err(e) if pod_gone(&e, pod_name) => {
                    debug!(target = %target, pod = pod_name, "pod disappeared before its resize");
                }
                Err(e) if resize_refused(&e) => {
                    return Ok(InPlace::Refused(format!(
                        "in-place resize refused for pod {pod_name} ({})",
                        e.error
                    )));
                }
                Err(e) => return Err(e.error),
            }
        }
        match most_common(&values) {
            Some(v) => {
                info!(target = %target, pods = values.len(), "resized pods in place");
                Ok(InPlace::Done(v))
            }
            None => Ok(InPlace::Refused(
                "no live pod to resize in place".to_string(),
            )),
        }
    }
}

enum InPlace {
    /// The requests in force on the pods.
    Done((u32, u64)),
    /// Why the resize could not be done in place.
    Refused(String),
}

/// Sorts a `kube::Error` into a sink error, the API `Status` if any, and whether to retry.
fn classify(
    target: &Target,
    operation: &str,
    err: kube::Error,
) -> (SinkError, Option<Box<Status>>, bool) {
    match err {
        kube::Error::Api(status) => {
            let code = status.code;
            let retryable = code == 409 || code == 429 || code >= 500;
            (
                SinkError::Api {
                    target: target.key(),
                    operation: operation.to_string(),
                    code,
                    reason: status.reason.clone(),
                    message: status.message.clone(),
                },
                Some(status),
                retryable,
            )
        }
        kube::Error::HyperError(e) => (transport(target, operation, e.to_string()), None, true),
        kube::Error::Service(e) => (transport(target, operation, e.to_string()), None, true),
        other => (transport(target, operation, other.to_string()), None, false),
    }
}

fn transport(target: &Target, operation: &str, message: String) -> SinkError {
    SinkError::Transport {
        target: target.key(),
        operation: operation.to_string(),
        message,
    }
}

/// A 404 naming the pod itself: the pod was deleted between the list and the resize.
fn pod_gone(e: &CallError, pod: &str) -> bool {
    e.status
        .as_ref()
        .is_some_and(|s| s.code == 404 && s.details.as_ref().is_some_and(|d| d.name == pod))
}

/// The API does not support or accept the in-place resize (see the module documentation).
fn resize_refused(e: &CallError) -> bool {
    matches!(
        e.error,
        SinkError::Api {
            code: 404 | 405 | 422,
            ..
        }
    )
}

fn replicas_of(target: &Target, spec: &DeploymentSpec) -> Result<u32, SinkError> {
    // Kubernetes defaults an unset `spec.replicas` to 1.
    let r = spec.replicas.unwrap_or(1);
    u32::try_from(r).map_err(|_| SinkError::Unmanageable {
        target: target.key(),
        why: format!("the deployment has {r} replicas"),
    })
}

fn template_containers(spec: &DeploymentSpec) -> &[Container] {
    spec.template
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
}

fn pod_container<'p>(pod: &'p Pod, name: &str) -> Option<&'p Container> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == name)
}

/// The most common value (ties: the first to reach the count, in order).
fn most_common(values: &[(u32, u64)]) -> Option<(u32, u64)> {
    let mut best: Option<((u32, u64), usize)> = None;
    for v in values {
        let n = values.iter().filter(|w| *w == v).count();
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((*v, n));
        }
    }
    best.map(|(v, _)| v)
}

/// A container's requests and limits (requests as Kubernetes reads them: a missing request is
/// its limit), for [`LimitsPolicy::resolve`].
fn resources_of(target: &Target, c: &Container) -> Result<ContainerResources, SinkError> {
    let r = c.resources.as_ref();
    resources_in(
        target,
        r.and_then(|r| r.requests.as_ref()),
        r.and_then(|r| r.limits.as_ref()),
    )
}

fn resources_in(
    target: &Target,
    requests: Option<&BTreeMap<String, Quantity>>,
    limits: Option<&BTreeMap<String, Quantity>>,
) -> Result<ContainerResources, SinkError> {
    Ok(ContainerResources {
        cpu_request_millicores: entry(requests, "cpu")
            .map(|q| cpu_millicores(target, q))
            .transpose()?,
        cpu_limit_millicores: entry(limits, "cpu")
            .map(|q| cpu_millicores(target, q))
            .transpose()?,
        memory_request_bytes: entry(requests, "memory")
            .map(|q| memory_bytes(target, q))
            .transpose()?,
        memory_limit_bytes: entry(limits, "memory")
            .map(|q| memory_bytes(target, q))
            .transpose()?,
    })
}

fn entry<'m>(map: Option<&'m BTreeMap<String, Quantity>>, key: &str) -> Option<&'m Quantity> {
    map.and_then(|m| m.get(key))
}

/// The (CPU millicores, memory bytes) requests of a container's resources; a missing request is
/// its limit (Kubernetes' default), 0 when both are missing ("unknown" to the guardrails).
fn requests_in(r: &ContainerResources) -> (u32, u64) {
    (
        r.cpu_request_millicores
            .or(r.cpu_limit_millicores)
            .unwrap_or(0),
        r.memory_request_bytes.or(r.memory_limit_bytes).unwrap_or(0),
    )
}

/// A container's (CPU millicores, memory bytes) requests (see [`requests_in`]).
fn requests_of(target: &Target, c: &Container) -> Result<(u32, u64), SinkError> {
    Ok(requests_in(&resources_of(target, c)?))
}

/// The requests a pod's container runs with as its kubelet reports them
/// (`status.containerStatuses[].resources`): after an in-place resize the spec holds the new
/// values at once, the status only when the kubelet has applied them (never, when it finds the
/// resize infeasible). `None` when the kubelet reports nothing (one without in-place resize).
fn running_requests(
    target: &Target,
    pod: &Pod,
    name: &str,
) -> Result<Option<(u32, u64)>, SinkError> {
    let reported = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == name))
        .and_then(|c| c.resources.as_ref());
    reported
        .map(|r| {
            resources_in(target, r.requests.as_ref(), r.limits.as_ref()).map(|r| requests_in(&r))
        })
        .transpose()
}

/// True when the container already has what `desired` resolves to under `rule`: its requests,
/// and its limits as the policy keeps or sets them.
fn holds(
    target: &Target,
    c: &Container,
    desired: Resources,
    rule: LimitsRule,
) -> Result<bool, SinkError> {
    let now = resources_of(target, c)?;
    let want = rule.resolve(desired, &now);
    let requests = (want.requests.cpu_millicores, want.requests.memory_bytes);
    Ok(requests_in(&now) == requests
        && now.cpu_limit_millicores == want.limits.cpu_millicores
        && now.memory_limit_bytes == want.limits.memory_bytes)
}

/// The `resources` patch of a container for `desired` (the requests): the requests, and the
/// limits the target's policy derives from them and from the container as read (see the module
/// documentation). A limit the policy removes is written as `null` (a strategic merge patch
/// deletes the key); one the container lacks and keeps lacking is not mentioned.
fn resources_patch(
    target: &Target,
    c: &Container,
    desired: Resources,
    rule: LimitsRule,
) -> Result<Value, SinkError> {
    let now = resources_of(target, c)?;
    let want = rule.resolve(desired, &now);
    let mut requests = Map::new();
    requests.insert(
        "cpu".into(),
        Value::String(format_cpu(want.requests.cpu_millicores)),
    );
    requests.insert(
        "memory".into(),
        Value::String(format_memory(want.requests.memory_bytes)),
    );
    let mut limits = Map::new();
    match (want.limits.cpu_millicores, now.cpu_limit_millicores) {
        (Some(l), _) => {
            limits.insert("cpu".into(), Value::String(format_cpu(l)));
        }
        (None, Some(_)) => {
            limits.insert("cpu".into(), Value::Null);
        }
        (None, None) => {}
    }
    match (want.limits.memory_bytes, now.memory_limit_bytes) {
        (Some(l), _) => {
            limits.insert("memory".into(), Value::String(format_memory(l)));
        }
        (None, Some(_)) => {
            limits.insert("memory".into(), Value::Null);
        }
        (None, None) => {}
    }
    let mut out = Map::new();
    if !limits.is_empty() {
        out.insert("limits".into(), Value::Object(limits));
    }
    out.insert("requests".into(), Value::Object(requests));
    Ok(Value::Object(out))
}

pub use aware_shared::quantity::{format_cpu, format_memory};

fn bad_quantity(target: &Target, what: &str, q: &Quantity) -> SinkError {
    SinkError::Unmanageable {
        target: target.key(),
        why: format!("unreadable {what} quantity `{}`", q.0),
    }
}

fn cpu_millicores(target: &Target, q: &Quantity) -> Result<u32, SinkError> {
    aware_shared::quantity::parse_cpu_millicores(&q.0).map_err(|_| bad_quantity(target, "cpu", q))
}

fn memory_bytes(target: &Target, q: &Quantity) -> Result<u64, SinkError> {
    aware_shared::quantity::parse_memory_bytes(&q.0).map_err(|_| bad_quantity(target, "memory", q))
}

#[cfg(test)]
mod tests {
    //! The Kubernetes sink against a scripted mock API server (`tower_test::mock::pair`): every
    //! request's method, URI (with query), content type and JSON body is checked, and the server
    //! answers with Kubernetes-shaped JSON.

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    const GIB: u64 = 1024 * MIB;

    use std::pin::pin;
    use std::time::Duration;

    use aware_shared::kube_mock::{get, json_response, patch, serve, Exchange};
    use http::{Method, Request, Response};
    use kube::client::Body;
    use serde_json::json;
    use tower_test::mock;

    use super::*;

    const MERGE: &str = "application/merge-patch+json";
    const STRATEGIC: &str = "application/strategic-merge-patch+json";
    const DEPLOY: &str = "/apis/apps/v1/namespaces/shop/deployments/web";
    const PATCH_DEPLOY: &str =
        "/apis/apps/v1/namespaces/shop/deployments/web?&fieldManager=aware-actuator";
    const SCALE: &str =
        "/apis/apps/v1/namespaces/shop/deployments/web/scale?&fieldManager=aware-actuator";
    const PODS: &str = "/api/v1/namespaces/shop/pods?&labelSelector=app%3Dweb";

    fn resize_uri(pod: &str) -> String {
        format!("/api/v1/namespaces/shop/pods/{pod}/resize?&fieldManager=aware-actuator")
    }

    /// Runs `f` against the scripted server and checks the whole script was served.
    async fn run<T, F, Fut>(config: KubernetesSinkConfig, script: Vec<Exchange>, f: F) -> T
    where
        F: FnOnce(KubernetesSink) -> Fut,
        Fut: Future<Output = T>,
    {
        let (client, server) = serve(script);
        let sink = KubernetesSink::new(client, config).unwrap();
        let out = f(sink).await;
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the mock server did not finish")
            .expect("the mock server's assertions");
        out
    }

    fn fast_retry(config: KubernetesSinkConfig) -> KubernetesSinkConfig {
        KubernetesSinkConfig {
            retry: RetryConfig {
                max_attempts: 3,
                initial_backoff_ms: 1,
                max_backoff_ms: 4,
            },
            ..config
        }
    }

    fn in_place() -> KubernetesSinkConfig {
        fast_retry(KubernetesSinkConfig::default())
    }

    fn template_mode() -> KubernetesSinkConfig {
        fast_retry(KubernetesSinkConfig {
            defaults: TargetSinkConfig {
                vertical_mode: VerticalMode::TemplatePatch,
                ..TargetSinkConfig::default()
            },
            ..KubernetesSinkConfig::default()
        })
    }

    fn target() -> Target {
        Target::new("shop", "web")
    }

    fn res(replicas: u32, cpu_millicores: u32, memory_mib: u64) -> Resources {
        Resources {
            replicas,
            cpu_millicores,
            memory_bytes: memory_mib * MIB,
        }
    }

    fn app_container(cpu: &str, memory: &str, cpu_req: &str, memory_req: &str) -> Value {
        json!({
            "name": "app",
            "image": "ghcr.io/example/web:1.4.2",
            "ports": [{"containerPort": 8080, "protocol": "TCP"}],
            "resources": {
                "limits": {"cpu": cpu, "memory": memory},
                "requests": {"cpu": cpu_req, "memory": memory_req}
            },
            "imagePullPolicy": "IfNotPresent"
        })
    }

    fn sidecar() -> Value {
        json!({
            "name": "log-shipper",
            "image": "fluent/fluent-bit:3.1",
            "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}, "requests": {"cpu": "50m", "memory": "32Mi"}}
        })
    }

    fn deployment(replicas: i32, containers: Vec<Value>) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web",
                "namespace": "shop",
                "uid": "5c3e7a2e-8d0e-4c1b-9d59-1c1e6a3f0b7d",
                "resourceVersion": "81234",
                "generation": 7,
                "labels": {"app": "web"}
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": containers, "restartPolicy": "Always"}
                }
            },
            "status": {"observedGeneration": 7, "replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas}
        })
    }

    fn pod(name: &str, containers: Vec<Value>, phase: &str) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "shop",
                "uid": format!("uid-{name}"),
                "resourceVersion": "90001",
                "labels": {"app": "web", "pod-template-hash": "7d9f8b6c5"},
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f8b6c5",
                    "uid": "0f9c1b62-3a43-4c59-9a53-6f1f7d0c2e11", "controller": true, "blockOwnerDeletion": true
                }]
            },
            "spec": {"containers": containers, "nodeName": "node-1"},
            "status": {"phase": phase, "qosClass": "Burstable"}
        })
    }

    fn pod_list(items: Vec<Value>) -> Value {
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "90010"}, "items": items})
    }

    fn scale(replicas: i32, before: i32) -> Value {
        json!({
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {"name": "web", "namespace": "shop", "uid": "5c3e7a2e-8d0e-4c1b-9d59-1c1e6a3f0b7d", "resourceVersion": "81240"},
            "spec": {"replicas": replicas},
            "status": {"replicas": before, "selector": "app=web"}
        })
    }

    fn status(code: u16, reason: &str, message: &str, details: Value) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": details,
            "code": code
        })
    }

    fn conflict() -> Value {
        status(
            409,
            "Conflict",
            "Operation cannot be fulfilled on deployments.apps \"web\": the object has been modified; please apply your changes to the latest version and try again",
            json!({"name": "web", "group": "apps", "kind": "deployments"}),
        )
    }

    fn unavailable() -> Value {
        status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
            json!({}),
        )
    }

    fn resources_body(cpu: &str, memory: &str, cpu_req: &str, memory_req: &str) -> Value {
        json!({"limits": {"cpu": cpu, "memory": memory}, "requests": {"cpu": cpu_req, "memory": memory_req}})
    }

    fn resize_body(container: &str, resources: Value) -> Value {
        json!({"spec": {"containers": [{"name": container, "resources": resources}]}})
    }

    /// The template patch, conditional on the `resourceVersion` of [`deployment`]'s read.
    fn template_body(container: &str, resources: Value) -> Value {
        template_body_at("81234", container, resources)
    }

    fn template_body_at(version: &str, container: &str, resources: Value) -> Value {
        json!({
            "metadata": {"resourceVersion": version},
            "spec": {"template": {"spec": {"containers": [{"name": container, "resources": resources}]}}}
        })
    }

    fn default_deployment() -> Value {
        deployment(2, vec![app_container("500m", "512Mi", "250m", "256Mi")])
    }

    #[tokio::test]
    async fn scale_request_patches_the_scale_subresource() {
        let at_desired = || {
            pod(
                "web-a",
                vec![app_container("500m", "512Mi", "250m", "256Mi")],
                "Running",
            )
        };
        // One read (the Deployment, and its pods: in-place mode reads the limits in force from
        // them), then the scale; the pods already run the desired limits: no resize.
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            get(PODS, 200, pod_list(vec![at_desired()])),
            patch(
                SCALE,
                MERGE,
                json!({"spec": {"replicas": 5}}),
                200,
                scale(5, 2),
            ),
        ];
        let report = run(in_place(), script, |sink| async move {
            sink.apply(&target(), res(5, 250, 256)).await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(5, 250, 256));
        assert!(report.notes.is_empty());
    }

    #[tokio::test]
    async fn in_place_resize_patches_each_live_pod_of_the_named_container() {
        let config = KubernetesSinkConfig {
            defaults: TargetSinkConfig {
                container: Some("app".to_string()),
                ..TargetSinkConfig::default()
            },
            ..in_place()
        };
        let old = || vec![sidecar(), app_container("500m", "512Mi", "250m", "256Mi")];
        let new = || vec![sidecar(), app_container("750m", "768Mi", "375m", "384Mi")];
        let mut terminating = pod("web-old", old(), "Running");
        terminating["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        let body = resize_body("app", resources_body("750m", "768Mi", "375m", "384Mi"));
        let script = vec![
            get(DEPLOY, 200, deployment(2, old())),
            get(
                PODS,
                200,
                pod_list(vec![
                    pod("web-b", old(), "Running"),
                    terminating,
                    pod("web-a", old(), "Pending"),
                    pod("web-done", old(), "Failed"),
                ]),
            ),
            patch(
                &resize_uri("web-a"),
                STRATEGIC,
                body.clone(),
                200,
                pod("web-a", new(), "Pending"),
            ),
            patch(
                &resize_uri("web-b"),
                STRATEGIC,
                body,
                200,
                pod("web-b", new(), "Running"),
            ),
        ];
        let report = run(config, script, |sink| async move {
            sink.apply(&target(), res(2, 375, 384)).await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(2, 375, 384));
        assert!(report.notes.is_empty());
    }

    /// The template patch goes before the scale: its precondition is the read's
    /// `resourceVersion`, which the scale would move on (a sure 409 from a real API server).
    #[tokio::test]
    async fn template_patch_mode_patches_the_deployment_template() {
        let body = template_body("app", resources_body("2", "1Gi", "1", "512Mi"));
        let after = deployment(2, vec![app_container("2", "1Gi", "1", "512Mi")]);
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            patch(PATCH_DEPLOY, STRATEGIC, body, 200, after),
            patch(
                SCALE,
                MERGE,
                json!({"spec": {"replicas": 3}}),
                200,
                scale(3, 2),
            ),
        ];
        let report = run(template_mode(), script, |sink| async move {
            sink.apply(&target(), res(3, 1000, 512)).await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(3, 1000, 512));
        assert!(report.notes.is_empty());
    }

    /// Another client changed the Deployment between the sink's read and its template patch
    /// (here the container's requests): the server refuses the patch (409, its precondition
    /// failed) and the sink reads again and recomputes the limits from what it reads now (their
    /// ratio to the requests), instead of overwriting that edit with values computed from the
    /// stale read.
    #[tokio::test]
    async fn a_template_patch_after_a_concurrent_edit_reads_again_and_recomputes() {
        let edited = |replicas| {
            let mut d = deployment(
                replicas,
                vec![app_container("500m", "512Mi", "400m", "128Mi")],
            );
            d["metadata"]["resourceVersion"] = json!("81240");
            d
        };
        // The edited ratios: CPU 500m:400m (5:4), memory 512Mi:128Mi (4:1).
        let after = deployment(2, vec![app_container("625m", "2Gi", "500m", "512Mi")]);
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            patch(
                PATCH_DEPLOY,
                STRATEGIC,
                template_body("app", resources_body("1", "1Gi", "500m", "512Mi")),
                409,
                conflict(),
            ),
            get(DEPLOY, 200, edited(2)),
            patch(
                PATCH_DEPLOY,
                STRATEGIC,
                template_body_at(
                    "81240",
                    "app",
                    resources_body("625m", "2Gi", "500m", "512Mi"),
                ),
                200,
                after,
            ),
        ];
        let report = run(template_mode(), script, |sink| async move {
            sink.apply(&target(), res(2, 500, 512)).await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(2, 500, 512));
    }

    /// A Deployment that changes before every patch: the sink gives up after
    /// `retry.max_attempts` reads.
    #[tokio::test]
    async fn a_template_patch_gives_up_when_the_deployment_keeps_changing() {
        let mut script = vec![get(DEPLOY, 200, default_deployment())];
        for i in 0..3 {
            if i > 0 {
                script.push(get(DEPLOY, 200, default_deployment()));
            }
            script.push(patch(
                PATCH_DEPLOY,
                STRATEGIC,
                template_body("app", resources_body("1", "1Gi", "500m", "512Mi")),
                409,
                conflict(),
            ));
        }
        let err = run(template_mode(), script, |sink| async move {
            sink.apply(&target(), res(2, 500, 512)).await
        })
        .await
        .unwrap_err();
        assert!(
            matches!(&err, SinkError::RetriesExhausted { attempts: 3, last, .. } if last.status_code() == Some(409)),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn refused_in_place_resize_falls_back_to_a_template_patch() {
        let refusals = [
            // A cluster without the resize subresource.
            status(
                404,
                "NotFound",
                "the server could not find the requested resource",
                json!({}),
            ),
            // A resize the API server does not accept.
            status(
                422,
                "Invalid",
                "Pod \"web-a\" is invalid: spec: Forbidden: Pod QoS is immutable",
                json!({"name": "web-a", "kind": "Pod", "causes": [{"reason": "FieldValueForbidden", "message": "Forbidden: Pod QoS is immutable", "field": "spec"}]}),
            ),
        ];
        for refusal in refusals {
            let code = refusal["code"].as_u64().unwrap();
            let resources = resources_body("750m", "768Mi", "375m", "384Mi");
            let script = vec![
                get(DEPLOY, 200, default_deployment()),
                get(
                    PODS,
                    200,
                    pod_list(vec![pod(
                        "web-a",
                        vec![app_container("500m", "512Mi", "250m", "256Mi")],
                        "Running",
                    )]),
                ),
                patch(
                    &resize_uri("web-a"),
                    STRATEGIC,
                    resize_body("app", resources.clone()),
                    code as u16,
                    refusal,
                ),
                patch(
                    PATCH_DEPLOY,
                    STRATEGIC,
                    template_body("app", resources),
                    200,
                    deployment(2, vec![app_container("750m", "768Mi", "375m", "384Mi")]),
                ),
            ];
            let report = run(in_place(), script, |sink| async move {
                sink.apply(&target(), res(2, 375, 384)).await
            })
            .await
            .unwrap();
            assert_eq!(report.in_force, res(2, 375, 384));
            assert_eq!(report.notes.len(), 1);
            let note = &report.notes[0];
            assert!(
                note.starts_with("in-place resize refused for pod web-a ("),
                "{note}"
            );
            assert!(note.contains(&format!("HTTP {code}")), "{note}");
            assert!(
                note.ends_with("patched the deployment template instead (pods restart)"),
                "{note}"
            );
        }
    }

    #[tokio::test]
    async fn refused_resize_without_fallback_is_an_error() {
        let config = KubernetesSinkConfig {
            defaults: TargetSinkConfig {
                fallback_to_template: false,
                ..TargetSinkConfig::default()
            },
            ..in_place()
        };
        let resources = resources_body("750m", "768Mi", "375m", "384Mi");
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            get(
                PODS,
                200,
                pod_list(vec![pod(
                    "web-a",
                    vec![app_container("500m", "512Mi", "250m", "256Mi")],
                    "Running",
                )]),
            ),
            patch(
                &resize_uri("web-a"),
                STRATEGIC,
                resize_body("app", resources),
                404,
                status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                    json!({}),
                ),
            ),
        ];
        let err = run(config, script, |sink| async move {
            sink.apply(&target(), res(2, 375, 384)).await
        })
        .await
        .unwrap_err();
        assert!(matches!(err, SinkError::Unmanageable { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("the template fallback is disabled"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_pod_deleted_before_its_resize_is_skipped() {
        let resources = resources_body("750m", "768Mi", "375m", "384Mi");
        let old = || vec![app_container("500m", "512Mi", "250m", "256Mi")];
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            get(
                PODS,
                200,
                pod_list(vec![
                    pod("web-a", old(), "Running"),
                    pod("web-b", old(), "Running"),
                ]),
            ),
            patch(
                &resize_uri("web-a"),
                STRATEGIC,
                resize_body("app", resources.clone()),
                404,
                status(
                    404,
                    "NotFound",
                    "pods \"web-a\" not found",
                    json!({"name": "web-a", "kind": "pods"}),
                ),
            ),
            patch(
                &resize_uri("web-b"),
                STRATEGIC,
                resize_body("app", resources),
                200,
                pod(
                    "web-b",
                    vec![app_container("750m", "768Mi", "375m", "384Mi")],
                    "Running",
                ),
            ),
        ];
        let report = run(in_place(), script, |sink| async move {
            sink.apply(&target(), res(2, 375, 384)).await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(2, 375, 384));
        assert!(report.notes.is_empty());
    }

    #[tokio::test]
    async fn no_live_pod_means_a_template_patch() {
        let resources = resources_body("750m", "768Mi", "375m", "384Mi");
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            get(PODS, 200, pod_list(vec![])),
            patch(
                PATCH_DEPLOY,
                STRATEGIC,
                template_body("app", resources),
                200,
                deployment(2, vec![app_container("750m", "768Mi", "375m", "384Mi")]),
            ),
        ];
        let report = run(in_place(), script, |sink| async move {
            sink.apply(&target(), res(2, 375, 384)).await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(2, 375, 384));
        assert_eq!(
            report.notes,
            vec!["no live pod to resize in place; patched the deployment template instead (pods restart)"]
        );
    }

    #[tokio::test]
    async fn conflict_is_retried_then_succeeds() {
        let body = json!({"spec": {"replicas": 4}});
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            patch(SCALE, MERGE, body.clone(), 409, conflict()),
            patch(SCALE, MERGE, body, 200, scale(4, 2)),
        ];
        let report = run(template_mode(), script, |sink| async move {
            sink.apply(&target(), res(4, 250, 256)).await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(4, 250, 256));
    }

    #[tokio::test]
    async fn service_unavailable_is_retried_then_succeeds() {
        let body = resize_body("app", resources_body("750m", "768Mi", "375m", "384Mi"));
        let script = vec![
            get(DEPLOY, 503, unavailable()),
            get(DEPLOY, 200, default_deployment()),
            get(
                PODS,
                200,
                pod_list(vec![pod(
                    "web-a",
                    vec![app_container("500m", "512Mi", "250m", "256Mi")],
                    "Running",
                )]),
            ),
            patch(
                &resize_uri("web-a"),
                STRATEGIC,
                body.clone(),
                503,
                unavailable(),
            ),
            patch(
                &resize_uri("web-a"),
                STRATEGIC,
                body.clone(),
                503,
                unavailable(),
            ),
            patch(
                &resize_uri("web-a"),
                STRATEGIC,
                body,
                200,
                pod(
                    "web-a",
                    vec![app_container("750m", "768Mi", "375m", "384Mi")],
                    "Running",
                ),
            ),
        ];
        let report = run(in_place(), script, |sink| async move {
            sink.apply(&target(), res(2, 375, 384)).await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(2, 375, 384));
    }

    #[tokio::test]
    async fn gives_up_after_max_attempts() {
        let body = json!({"spec": {"replicas": 6}});
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            patch(SCALE, MERGE, body.clone(), 409, conflict()),
            patch(
                SCALE,
                MERGE,
                body.clone(),
                500,
                status(
                    500,
                    "InternalError",
                    "etcdserver: request timed out",
                    json!({}),
                ),
            ),
            patch(SCALE, MERGE, body, 409, conflict()),
        ];
        let err = run(template_mode(), script, |sink| async move {
            sink.apply(&target(), res(6, 250, 256)).await
        })
        .await
        .unwrap_err();
        match &err {
            SinkError::RetriesExhausted {
                operation,
                attempts,
                last,
                ..
            } => {
                assert_eq!(operation, "scale deployment");
                assert_eq!(*attempts, 3);
                assert!(matches!(**last, SinkError::Api { code: 409, .. }));
            }
            other => panic!("expected RetriesExhausted, got {other:?}"),
        }
        assert_eq!(err.status_code(), Some(409));
        assert!(
            err.to_string().starts_with(
                "scale deployment for shop/web gave up after 3 attempts; last error: scale deployment for shop/web failed: HTTP 409 Conflict: Operation cannot be fulfilled"
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn forbidden_is_not_retried() {
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            get(PODS, 200, pod_list(vec![])),
            patch(
                SCALE,
                MERGE,
                json!({"spec": {"replicas": 3}}),
                403,
                status(
                    403,
                    "Forbidden",
                    "deployments.apps \"web\" is forbidden: User \"system:serviceaccount:aware:actuator\" cannot patch resource \"deployments/scale\" in API group \"apps\" in the namespace \"shop\"",
                    json!({"name": "web", "group": "apps", "kind": "deployments"}),
                ),
            ),
        ];
        let err = run(in_place(), script, |sink| async move {
            sink.apply(&target(), res(3, 250, 256)).await
        })
        .await
        .unwrap_err();
        assert!(
            matches!(err, SinkError::Api { code: 403, ref reason, .. } if reason == "Forbidden"),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("scale deployment for shop/web failed: HTTP 403 Forbidden"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn missing_deployment_is_not_found() {
        let script = vec![get(
            DEPLOY,
            404,
            status(
                404,
                "NotFound",
                "deployments.apps \"web\" not found",
                json!({"name": "web", "group": "apps", "kind": "deployments"}),
            ),
        )];
        let err = run(in_place(), script, |sink| async move {
            sink.current(&target()).await
        })
        .await
        .unwrap_err();
        assert!(matches!(err, SinkError::NotFound { .. }), "{err:?}");
        assert_eq!(err.to_string(), "shop/web: deployment shop/web not found");
    }

    #[tokio::test]
    async fn zero_values_are_refused_before_any_request() {
        for desired in [res(0, 250, 256), res(2, 0, 256), res(2, 250, 0)] {
            let err = run(in_place(), vec![], |sink| async move {
                sink.apply(&target(), desired).await
            })
            .await
            .unwrap_err();
            assert!(
                matches!(err, SinkError::InvalidValue { value: 0, .. }),
                "{err:?}"
            );
        }
    }

    #[tokio::test]
    async fn empty_selector_is_refused() {
        let mut d = default_deployment();
        d["spec"]["selector"] = json!({});
        let err = run(in_place(), vec![get(DEPLOY, 200, d)], |sink| async move {
            sink.apply(&target(), res(2, 375, 384)).await
        })
        .await
        .unwrap_err();
        assert!(
            err.to_string().contains("the deployment selector is empty"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn missing_container_is_refused() {
        let config = KubernetesSinkConfig {
            defaults: TargetSinkConfig {
                container: Some("api".to_string()),
                ..TargetSinkConfig::default()
            },
            ..in_place()
        };
        let err = run(
            config,
            vec![get(DEPLOY, 200, default_deployment())],
            |sink| async move { sink.apply(&target(), res(2, 375, 384)).await },
        )
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "shop/web cannot be managed: the pod template has no container `api` \
             (named by the actuator's kubernetes `container` setting; its containers: app)"
        );
    }

    #[tokio::test]
    async fn current_reads_the_pods_in_place_and_the_template_otherwise() {
        // The requests vary, the limits do not: the allocation in force is the requests.
        let c = |cpu: &str, mem: &str| vec![app_container("4", "4Gi", cpu, mem)];
        let script = vec![
            get(DEPLOY, 200, deployment(3, c("500m", "512Mi"))),
            get(
                PODS,
                200,
                pod_list(vec![
                    pod("web-a", c("1", "1Gi"), "Running"),
                    pod("web-b", c("500m", "512Mi"), "Running"),
                    pod("web-c", c("1000m", "1024Mi"), "Running"),
                ]),
            ),
        ];
        let current = run(in_place(), script, |sink| async move {
            sink.current(&target()).await
        })
        .await
        .unwrap();
        assert_eq!(current, res(3, 1000, 1024));

        // What the kubelets report running wins over the specs: two pods resized in their spec
        // to 1 / 1Gi, of which the kubelet has applied none yet (one reports the old values, the
        // other nothing: its kubelet has no in-place resize, its spec counts).
        let mut a = pod("web-a", c("1", "1Gi"), "Running");
        a["status"]["containerStatuses"] = json!([{
            "name": "app", "ready": true, "restartCount": 0, "image": "web", "imageID": "",
            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "4", "memory": "4Gi"}}
        }]);
        let mut b = pod("web-b", c("1", "1Gi"), "Running");
        b["status"]["containerStatuses"] = json!([{
            "name": "app", "ready": true, "restartCount": 0, "image": "web", "imageID": "",
            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "4", "memory": "4Gi"}}
        }]);
        let script = vec![
            get(DEPLOY, 200, deployment(3, c("500m", "512Mi"))),
            get(
                PODS,
                200,
                pod_list(vec![a, b, pod("web-c", c("1", "1Gi"), "Running")]),
            ),
        ];
        let current = run(in_place(), script, |sink| async move {
            sink.current(&target()).await
        })
        .await
        .unwrap();
        assert_eq!(current, res(3, 500, 512));

        let script = vec![get(DEPLOY, 200, deployment(3, c("1.5", "0.5Gi")))];
        let current = run(template_mode(), script, |sink| async move {
            sink.current(&target()).await
        })
        .await
        .unwrap();
        assert_eq!(current, res(3, 1500, 512));
    }

    #[tokio::test]
    async fn per_target_configuration_overrides_the_defaults() {
        let mut config = in_place();
        config.targets.insert(
            "shop/web".to_string(),
            TargetSinkConfig {
                vertical_mode: VerticalMode::TemplatePatch,
                ..TargetSinkConfig::default()
            },
        );
        // Template mode: no pod listing, the template is patched directly.
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            patch(
                PATCH_DEPLOY,
                STRATEGIC,
                template_body("app", resources_body("750m", "768Mi", "375m", "384Mi")),
                200,
                deployment(2, vec![app_container("750m", "768Mi", "375m", "384Mi")]),
            ),
        ];
        let report = run(config, script, |sink| async move {
            sink.apply(&target(), res(2, 375, 384)).await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(2, 375, 384));
    }

    /// The registration names the sidecar (the AwareAutoscaler's `containerPolicies`): the
    /// template patch carries that container only, although the sink's own setting names `app`.
    #[tokio::test]
    async fn the_registered_container_is_sized_over_the_configured_one() {
        let config = KubernetesSinkConfig {
            defaults: TargetSinkConfig {
                vertical_mode: VerticalMode::TemplatePatch,
                container: Some("app".to_string()),
                ..TargetSinkConfig::default()
            },
            ..in_place()
        };
        let app = || app_container("500m", "512Mi", "250m", "256Mi");
        let mut resized = sidecar();
        resized["resources"] = resources_body("200m", "128Mi", "100m", "64Mi");
        let script = vec![
            get(DEPLOY, 200, deployment(2, vec![app(), sidecar()])),
            patch(
                PATCH_DEPLOY,
                STRATEGIC,
                template_body(
                    "log-shipper",
                    resources_body("200m", "128Mi", "100m", "64Mi"),
                ),
                200,
                deployment(2, vec![app(), resized]),
            ),
        ];
        let report = run(config, script, |sink| async move {
            sink.apply_with(&target(), res(2, 100, 64), Some("log-shipper"))
                .await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(2, 100, 64));
    }

    /// In place: each live pod's named container is resized, the pod's other container is not
    /// in the patch; the allocation in force is read from the named container too.
    #[tokio::test]
    async fn in_place_resize_of_the_registered_container() {
        let old = || vec![app_container("500m", "512Mi", "250m", "256Mi"), sidecar()];
        let mut resized = sidecar();
        resized["resources"] = resources_body("200m", "128Mi", "100m", "64Mi");
        let new = vec![app_container("500m", "512Mi", "250m", "256Mi"), resized];
        let script = vec![
            get(DEPLOY, 200, deployment(1, old())),
            get(PODS, 200, pod_list(vec![pod("web-a", old(), "Running")])),
            get(DEPLOY, 200, deployment(1, old())),
            get(PODS, 200, pod_list(vec![pod("web-a", old(), "Running")])),
            patch(
                &resize_uri("web-a"),
                STRATEGIC,
                resize_body(
                    "log-shipper",
                    resources_body("200m", "128Mi", "100m", "64Mi"),
                ),
                200,
                pod("web-a", new, "Running"),
            ),
        ];
        let (current, report) = run(in_place(), script, |sink| async move {
            let current = sink.current_with(&target(), Some("log-shipper")).await;
            let report = sink
                .apply_with(&target(), res(1, 100, 64), Some("log-shipper"))
                .await;
            (current, report)
        })
        .await;
        assert_eq!(current.unwrap(), res(1, 50, 32));
        assert_eq!(report.unwrap().in_force, res(1, 100, 64));
    }

    /// A registered container the Deployment does not have: refused before anything is
    /// patched (not even the replicas), with an error naming the field the name came from.
    #[tokio::test]
    async fn a_registered_container_missing_from_the_deployment_is_refused() {
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            get(DEPLOY, 200, default_deployment()),
        ];
        let (current, applied) = run(in_place(), script, |sink| async move {
            let current = sink.current_with(&target(), Some("sidecar")).await;
            let applied = sink
                .apply_with(&target(), res(5, 375, 384), Some("sidecar"))
                .await;
            (current, applied)
        })
        .await;
        for err in [current.unwrap_err(), applied.unwrap_err()] {
            assert!(matches!(err, SinkError::Unmanageable { .. }), "{err:?}");
            assert_eq!(
                err.to_string(),
                "shop/web cannot be managed: the pod template has no container `sidecar` \
                 (named by the AwareAutoscaler's spec.resourcePolicy.containerPolicies[].containerName; \
                 its containers: app)"
            );
        }
    }

    #[test]
    fn quantities_format_as_kubernetes_quantities() {
        assert_eq!(format_cpu(500), "500m");
        assert_eq!(format_cpu(2000), "2");
        assert_eq!(format_cpu(1), "1m");
        assert_eq!(format_memory(512 * MIB), "512Mi");
        assert_eq!(format_memory(3 * GIB), "3Gi");
        assert_eq!(format_memory(1536 * KIB), "1536Ki");
        assert_eq!(format_memory(536_870_913), "536870913");
    }

    #[test]
    fn quantities_parse_in_base_units() {
        let t = target();
        for (q, m) in [
            ("500m", 500u32),
            ("2", 2000),
            ("1.5", 1500),
            ("250000u", 250),
        ] {
            assert_eq!(cpu_millicores(&t, &Quantity(q.into())).unwrap(), m, "{q}");
        }
        for (q, b) in [
            ("512Mi", 536_870_912u64),
            ("1Gi", 1_073_741_824),
            ("1G", 1_000_000_000),
            ("128974848", 128_974_848),
            ("129e6", 129_000_000),
            ("123Ki", 125_952),
        ] {
            assert_eq!(memory_bytes(&t, &Quantity(q.into())).unwrap(), b, "{q}");
        }
        for bad in ["", "abc", "1Xi", "-1", "1e", "NaN", "inf"] {
            assert!(cpu_millicores(&t, &Quantity(bad.into())).is_err(), "{bad}");
            assert!(memory_bytes(&t, &Quantity(bad.into())).is_err(), "{bad}");
        }
        // Formatting then parsing is the identity.
        for m in [1u32, 128, 999, 1000, 1500, 2048] {
            let t = target();
            assert_eq!(cpu_millicores(&t, &Quantity(format_cpu(m))).unwrap(), m);
        }
        for b in [1u64, 256 * MIB, 3 * GIB, 1536 * KIB, 536_870_913] {
            let t = target();
            assert_eq!(memory_bytes(&t, &Quantity(format_memory(b))).unwrap(), b);
        }
    }

    fn container_with(resources: Value) -> Container {
        serde_json::from_value(json!({"name": "app", "resources": resources})).unwrap()
    }

    const REQUESTS_ONLY: LimitsRule = LimitsRule {
        policy: aware_mdp::LimitsPolicy {
            controlled_values: aware_mdp::ControlledValues::RequestsOnly,
            cpu_limit: aware_mdp::CpuLimit::Controlled,
        },
        latency_sensitive: false,
    };

    /// The patch carries the requests and the limits the policy derives from the container as
    /// read: the ratio kept, limits kept, a removed limit as `null`, an absent one not mentioned.
    #[test]
    fn the_patch_writes_requests_and_the_policys_limits() {
        let t = target();
        let ratio_two = container_with(resources_body("500m", "512Mi", "250m", "256Mi"));
        let desired = res(2, 300, 200);
        assert_eq!(
            resources_patch(&t, &ratio_two, desired, LimitsRule::default()).unwrap(),
            resources_body("600m", "400Mi", "300m", "200Mi")
        );
        assert_eq!(
            resources_patch(&t, &ratio_two, desired, REQUESTS_ONLY).unwrap(),
            resources_body("500m", "512Mi", "300m", "200Mi")
        );
        let unset_if = LimitsRule {
            policy: aware_mdp::LimitsPolicy {
                cpu_limit: aware_mdp::CpuLimit::UnsetIfLatencySensitive,
                ..aware_mdp::LimitsPolicy::default()
            },
            latency_sensitive: true,
        };
        assert_eq!(
            resources_patch(&t, &ratio_two, desired, unset_if).unwrap(),
            json!({"limits": {"cpu": null, "memory": "400Mi"}, "requests": {"cpu": "300m", "memory": "200Mi"}})
        );
        // Not latency-sensitive: the CPU limit stays.
        let not_latency = LimitsRule {
            latency_sensitive: false,
            ..unset_if
        };
        assert_eq!(
            resources_patch(&t, &ratio_two, desired, not_latency).unwrap(),
            resources_body("600m", "400Mi", "300m", "200Mi")
        );
        // No CPU limit to remove, no memory limit to keep: only the requests.
        let requests_only = container_with(json!({"requests": {"cpu": "250m", "memory": "256Mi"}}));
        assert_eq!(
            resources_patch(&t, &requests_only, desired, unset_if).unwrap(),
            json!({"requests": {"cpu": "300m", "memory": "200Mi"}})
        );
        // Limits without requests: ratio 1 (Kubernetes defaults the request to the limit).
        let limits_only = container_with(json!({"limits": {"cpu": "1", "memory": "1Gi"}}));
        assert_eq!(
            resources_patch(&t, &limits_only, desired, LimitsRule::default()).unwrap(),
            resources_body("300m", "200Mi", "300m", "200Mi")
        );
        assert_eq!(requests_of(&t, &limits_only).unwrap(), (1000, 1024 * MIB));
        // What the container already has is held: nothing to write.
        let held = container_with(resources_body("600m", "400Mi", "300m", "200Mi"));
        assert!(holds(&t, &held, desired, LimitsRule::default()).unwrap());
        assert!(!holds(&t, &held, desired, unset_if).unwrap());
        let unlimited_cpu = container_with(
            json!({"limits": {"memory": "400Mi"}, "requests": {"cpu": "300m", "memory": "200Mi"}}),
        );
        assert!(holds(&t, &unlimited_cpu, desired, unset_if).unwrap());
    }

    /// Template-patch mode: the Deployment's container gets the decided requests and the
    /// policy's limits (RequestsOnly with no CPU limit for a latency-sensitive target: the CPU
    /// limit is removed, the memory limit kept).
    #[tokio::test]
    async fn template_patch_writes_requests_and_limits_by_the_policy() {
        let rule = LimitsRule {
            policy: aware_mdp::LimitsPolicy {
                controlled_values: aware_mdp::ControlledValues::RequestsOnly,
                cpu_limit: aware_mdp::CpuLimit::UnsetIfLatencySensitive,
            },
            latency_sensitive: true,
        };
        let written = json!({"limits": {"cpu": null, "memory": "512Mi"}, "requests": {"cpu": "400m", "memory": "384Mi"}});
        let mut after_container = app_container("1", "512Mi", "400m", "384Mi");
        after_container["resources"] =
            json!({"limits": {"memory": "512Mi"}, "requests": {"cpu": "400m", "memory": "384Mi"}});
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            patch(
                PATCH_DEPLOY,
                STRATEGIC,
                template_body("app", written),
                200,
                deployment(2, vec![after_container.clone()]),
            ),
            // Applied again: the Deployment holds it, nothing is written.
            get(DEPLOY, 200, deployment(2, vec![after_container])),
        ];
        let (first, again) = run(template_mode(), script, |sink| async move {
            let first = sink
                .apply_limited(&target(), res(2, 400, 384), None, rule)
                .await;
            let again = sink
                .apply_limited(&target(), res(2, 400, 384), None, rule)
                .await;
            (first, again)
        })
        .await;
        assert_eq!(first.unwrap().in_force, res(2, 400, 384));
        assert_eq!(again.unwrap().in_force, res(2, 400, 384));
    }

    /// In-place mode: every live pod is resized to the decided requests and the policy's limits
    /// (RequestsAndLimits keeping the 1:2 ratio for memory, no CPU limit at all).
    #[tokio::test]
    async fn in_place_resize_writes_requests_and_limits_by_the_policy() {
        let rule = LimitsRule {
            policy: aware_mdp::LimitsPolicy {
                controlled_values: aware_mdp::ControlledValues::RequestsAndLimits,
                cpu_limit: aware_mdp::CpuLimit::Unset,
            },
            latency_sensitive: false,
        };
        let old = || vec![app_container("500m", "512Mi", "250m", "256Mi")];
        let new_resources =
            json!({"limits": {"memory": "768Mi"}, "requests": {"cpu": "300m", "memory": "384Mi"}});
        let mut new_container = app_container("1", "1Gi", "1", "1Gi");
        new_container["resources"] = new_resources;
        let written = resize_body(
            "app",
            json!({"limits": {"cpu": null, "memory": "768Mi"}, "requests": {"cpu": "300m", "memory": "384Mi"}}),
        );
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            get(
                PODS,
                200,
                pod_list(vec![
                    pod("web-a", old(), "Running"),
                    pod("web-b", vec![new_container.clone()], "Running"),
                ]),
            ),
            patch(
                &resize_uri("web-a"),
                STRATEGIC,
                written,
                200,
                pod("web-a", vec![new_container], "Running"),
            ),
        ];
        let report = run(in_place(), script, |sink| async move {
            sink.apply_limited(&target(), res(2, 300, 384), None, rule)
                .await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(2, 300, 384));
        assert!(report.notes.is_empty());
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let r = RetryConfig {
            max_attempts: 10,
            initial_backoff_ms: 100,
            max_backoff_ms: 1000,
        };
        let waits: Vec<u64> = (1..=6).map(|a| r.backoff(a).as_millis() as u64).collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(r.backoff(200), Duration::from_millis(1000));
    }

    #[test]
    fn config_deserializes_and_validates() {
        let cfg: KubernetesSinkConfig = serde_json::from_value(json!({
            "defaults": {"vertical_mode": "template_patch", "container": "app"},
            "targets": {"shop/web": {"vertical_mode": "InPlace"}},
            "retry": {"max_attempts": 2}
        }))
        .unwrap();
        assert!(cfg.validate().is_ok());
        assert_eq!(cfg.defaults.vertical_mode, VerticalMode::TemplatePatch);
        assert_eq!(
            cfg.for_target(&target()).vertical_mode,
            VerticalMode::InPlace
        );
        assert!(cfg.for_target(&target()).fallback_to_template);
        assert_eq!(
            cfg.for_target(&Target::new("shop", "api"))
                .container
                .as_deref(),
            Some("app")
        );
        assert_eq!(cfg.retry.initial_backoff_ms, 200);

        let mut bad = cfg.clone();
        bad.retry.max_attempts = 0;
        assert_eq!(bad.validate(), Err(KubernetesSinkConfigError::NoAttempts));
        let mut bad = cfg.clone();
        bad.max_concurrent_calls = 0;
        assert_eq!(
            bad.validate(),
            Err(KubernetesSinkConfigError::NoConcurrentCalls)
        );
        let mut bad = cfg;
        bad.targets
            .insert("web".to_string(), TargetSinkConfig::default());
        assert_eq!(
            bad.validate(),
            Err(KubernetesSinkConfigError::BadTargetKey("web".to_string()))
        );
    }

    /// A decision reads once: in-place mode reads the Deployment and lists its pods (the limits
    /// in force are what the pods run), and a replicas change applied from that read is one
    /// scale call, with no second read or list.
    #[tokio::test]
    async fn a_replicas_change_is_applied_from_the_decisions_read() {
        let running = || {
            pod(
                "web-a",
                vec![app_container("500m", "512Mi", "250m", "256Mi")],
                "Running",
            )
        };
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            get(PODS, 200, pod_list(vec![running()])),
            patch(
                SCALE,
                MERGE,
                json!({"spec": {"replicas": 3}}),
                200,
                scale(3, 2),
            ),
        ];
        let report = run(in_place(), script, |sink| async move {
            let _slot = sink.slot().await;
            let state = sink.read(&target(), None).await.unwrap();
            assert_eq!(state.in_force, res(2, 250, 256));
            sink.apply_read(&target(), &state, res(3, 250, 256), LimitsRule::default())
                .await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(3, 250, 256));
    }

    /// In template-patch mode no pod is listed, and the template patch applied from the
    /// decision's read carries that read's `resourceVersion` (81234) without reading again.
    #[tokio::test]
    async fn a_template_patch_is_applied_from_the_decisions_read() {
        let after = deployment(2, vec![app_container("1", "1Gi", "500m", "512Mi")]);
        let script = vec![
            get(DEPLOY, 200, default_deployment()),
            patch(
                PATCH_DEPLOY,
                STRATEGIC,
                template_body("app", resources_body("1", "1Gi", "500m", "512Mi")),
                200,
                after,
            ),
        ];
        let report = run(template_mode(), script, |sink| async move {
            let state = sink.read(&target(), None).await.unwrap();
            assert_eq!(state.in_force, res(2, 250, 256));
            sink.apply_read(&target(), &state, res(2, 500, 512), LimitsRule::default())
                .await
        })
        .await
        .unwrap();
        assert_eq!(report.in_force, res(2, 500, 512));
    }

    /// A burst of 12 calls with `max_concurrent_calls` 3 against an API server that takes 50 ms
    /// per request: at most 3 requests are ever in flight, and every call completes.
    #[tokio::test]
    async fn a_burst_has_at_most_max_concurrent_calls_in_flight() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let (flight, top) = (in_flight.clone(), peak.clone());
        let server = tokio::spawn(async move {
            let mut handle = pin!(handle);
            let mut answering = Vec::new();
            while let Some((_request, send)) = handle.next_request().await {
                let now = flight.fetch_add(1, Ordering::SeqCst) + 1;
                top.fetch_max(now, Ordering::SeqCst);
                let flight = flight.clone();
                answering.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    flight.fetch_sub(1, Ordering::SeqCst);
                    send.send_response(json_response(200, &default_deployment()));
                }));
            }
            for a in answering {
                a.await.unwrap();
            }
        });
        let config = KubernetesSinkConfig {
            max_concurrent_calls: 3,
            ..template_mode()
        };
        let sink = KubernetesSink::new(Client::new(service, "default"), config).unwrap();
        let t = target();
        let calls = (0..12).map(|_| sink.current(&t));
        let read = futures::future::join_all(calls).await;
        assert_eq!(read.len(), 12);
        for r in read {
            assert_eq!(r.unwrap(), res(2, 250, 256));
        }
        drop(sink);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(peak.load(Ordering::SeqCst), 3);
    }

    /// Requests seen by [`serve_accepting`]: method, URI and JSON body.
    type Seen = Vec<(Method, String, Value)>;

    /// Answers like an API server that accepts every write: the Deployment (at `current`) for a GET,
    /// the patched object for a PATCH; records every request's method, URI and JSON body.
    fn serve_accepting(current: Resources) -> (Client, tokio::task::JoinHandle<Seen>) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let mut handle = pin!(handle);
            let mut seen = Vec::new();
            let deploy = deployment(
                i32::try_from(current.replicas).unwrap(),
                vec![app_container(
                    &format_cpu(current.cpu_millicores.saturating_mul(2)),
                    &format_memory(current.memory_bytes.saturating_mul(2)),
                    &format_cpu(current.cpu_millicores),
                    &format_memory(current.memory_bytes),
                )],
            );
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().clone();
                let uri = request.uri().to_string();
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body: Value = if bytes.is_empty() {
                    Value::Null
                } else {
                    serde_json::from_slice(&bytes).unwrap()
                };
                let response = if uri.starts_with(SCALE) {
                    scale(body["spec"]["replicas"].as_i64().unwrap() as i32, 1)
                } else {
                    deploy.clone()
                };
                seen.push((method, uri, body));
                send.send_response(json_response(200, &response));
            }
            seen
        });
        (Client::new(service, "default"), server)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Whatever an `action` asks for (any integers, 0 and the maxima included), whatever the
        /// target's bounds and limits policy, what reaches the API server after the guardrails is
        /// a well-formed Kubernetes quantity: replicas and requests in [min, max] (a request only
        /// below its min when a limit the policy keeps is lower), never a request above its limit.
        #[test]
        fn no_request_ever_leaves_the_bounds(
            min_r in 1u32..50, span_r in 0u32..200,
            min_c in 1u32..4000, span_c in 0u32..64_000,
            min_m in 1u64..(8 * 1024 * MIB), span_m in 0u64..(256 * 1024 * MIB),
            cur in (proptest::prelude::any::<u32>(), proptest::prelude::any::<u32>(), proptest::prelude::any::<u64>()),
            req in (proptest::prelude::any::<u32>(), proptest::prelude::any::<u32>(), proptest::prelude::any::<u64>()),
            only in proptest::prelude::any::<bool>(), cpu_rule in 0usize..3, latency in proptest::prelude::any::<bool>(),
        ) {
            use crate::guardrails::{GuardState, GuardrailConfig, Guardrails, StepId};
            let bounds = aware_shared::spec::Bounds {
                min_replicas: min_r,
                max_replicas: min_r + span_r,
                min_cpu_millicores: min_c,
                max_cpu_millicores: min_c + span_c,
                min_memory_bytes: min_m,
                max_memory_bytes: min_m + span_m,
            };
            let mut spec = aware_shared::spec::TargetSpec::new(&target());
            spec.bounds = bounds;
            spec.slo.latency_p99_ms = latency.then_some(200.0);
            spec.limits = aware_mdp::LimitsPolicy {
                controlled_values: if only {
                    aware_mdp::ControlledValues::RequestsOnly
                } else {
                    aware_mdp::ControlledValues::RequestsAndLimits
                },
                cpu_limit: [
                    aware_mdp::CpuLimit::Controlled,
                    aware_mdp::CpuLimit::UnsetIfLatencySensitive,
                    aware_mdp::CpuLimit::Unset,
                ][cpu_rule],
            };
            // The workload runs somewhere in its bounds (the controller refuses bounds that exclude
            // the current allocation), with limits twice its requests.
            let current = Resources {
                replicas: min_r + cur.0 % (span_r + 1),
                cpu_millicores: min_c + cur.1 % (span_c + 1),
                memory_bytes: min_m + cur.2 % (span_m + 1),
            };
            let container = aware_mdp::ContainerResources {
                cpu_request_millicores: Some(current.cpu_millicores),
                cpu_limit_millicores: Some(current.cpu_millicores * 2),
                memory_request_bytes: Some(current.memory_bytes),
                memory_limit_bytes: Some(current.memory_bytes * 2),
            };
            let requested = Resources { replicas: req.0, cpu_millicores: req.1, memory_bytes: req.2 };
            let guards = Guardrails::new(GuardrailConfig::default()).unwrap();
            let d = guards.decide_within(&spec, &GuardState::default(), current, StepId { episode: 0, step: 1 }, requested, 1, &container);
            let (_, out) = bounds.clamp_dimensions(d.applied);
            proptest::prop_assert!(out.iter().all(|dim| d.clamped.iter().any(|c| c == dim)), "guarded {:?} outside {:?} unexplained", d.applied, bounds);
            if !only {
                proptest::prop_assert!(out.is_empty(), "guarded {:?} outside {:?}", d.applied, bounds);
            }
            if !d.changes(&current) {
                return Ok(());
            }
            let rule = crate::sink::LimitsRule::of(&spec);
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let seen = rt.block_on(async {
                let (client, server) = serve_accepting(current);
                let sink = KubernetesSink::new(client, template_mode()).unwrap();
                sink.apply_limited(&target(), d.applied, None, rule).await.unwrap();
                drop(sink);
                server.await.unwrap()
            });
            let mut writes = 0;
            for (method, uri, body) in &seen {
                let text = body.to_string();
                proptest::prop_assert!(!text.contains("NaN") && !text.contains("inf"), "{text}");
                if *method != Method::PATCH {
                    continue;
                }
                writes += 1;
                if uri.starts_with(SCALE) {
                    let r = body["spec"]["replicas"].as_u64().unwrap();
                    proptest::prop_assert!((u64::from(bounds.min_replicas)..=u64::from(bounds.max_replicas)).contains(&r), "replicas {r}");
                } else {
                    let res = &body["spec"]["template"]["spec"]["containers"][0]["resources"];
                    let req_cpu = aware_shared::quantity::parse_cpu_millicores(res["requests"]["cpu"].as_str().unwrap()).unwrap();
                    let req_m = aware_shared::quantity::parse_memory_bytes(res["requests"]["memory"].as_str().unwrap()).unwrap();
                    proptest::prop_assert_eq!((req_cpu, req_m), (d.applied.cpu_millicores, d.applied.memory_bytes), "{}", res);
                    match res["limits"]["cpu"].as_str() {
                        Some(l) => {
                            let lim_cpu = aware_shared::quantity::parse_cpu_millicores(l).unwrap();
                            proptest::prop_assert!(req_cpu <= lim_cpu, "{res}");
                        }
                        None => proptest::prop_assert!(spec.limits.unsets_cpu_limit(latency), "{res}"),
                    }
                    let lim_m = aware_shared::quantity::parse_memory_bytes(res["limits"]["memory"].as_str().unwrap()).unwrap();
                    proptest::prop_assert!(req_m <= lim_m, "{res}");
                }
            }
            proptest::prop_assert!(writes >= 1, "a change was decided but nothing was written");
        }
    }
}
