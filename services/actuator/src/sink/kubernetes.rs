//! The Kubernetes sink (kube-rs): applies allocations to a Deployment.
//!
//! - **Replicas** through the Deployment's `scale` subresource: `PATCH
//!   /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale`, JSON merge patch
//!   `{"spec":{"replicas":N}}`; skipped when `spec.replicas` already is N.
//! - **CPU and memory limits**, per target ([`VerticalMode`]):
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
//!     /apis/apps/v1/namespaces/{ns}/deployments/{name}`), which rolls the pods.
//! - **Container**: the configured name, else the first container of the pod template.
//! - **Requests** keep the container's request/limit ratio per resource (so a Guaranteed pod stays
//!   Guaranteed and a Burstable one stays Burstable: in-place resize cannot change the QoS class):
//!   new request = round(new limit × old request / old limit), at most the new limit. A request
//!   without a limit is kept, capped at the new limit; a missing request stays missing (Kubernetes
//!   then defaults it to the limit).
//! - **Quantities**: CPU as whole cores (`"2"`) or millicores (`"500m"`), memory as `Gi`/`Mi`/`Ki`
//!   when exact, else bytes. Values are integers (never NaN); zero values are refused with
//!   [`SinkError::InvalidValue`] before any request.
//! - **Retries**: 409 Conflict, 429 Too Many Requests, 5xx and transport errors are retried with
//!   exponential backoff up to `retry.max_attempts` attempts ([`RetryConfig`]); other 4xx are not.
//!   (429 is the API server's "retry later" and is retried too, as in kube-rs's own retry policy.)
//! - **Allocation in force** ([`Sink::current`]): replicas from the Deployment's `spec.replicas`;
//!   CPU and memory limits from the template container, or in `InPlace` mode from the live pods'
//!   container specs (the value most pods have; ties go to the first pod in name order). A missing
//!   limit reads as 0 ("unknown" to the guardrails).
//!
//! RBAC: `get` on `deployments`, `patch` on `deployments` and `deployments/scale`, `list` on `pods`
//! and `patch` on `pods/resize`.

use std::collections::BTreeMap;
use std::future::Future;
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
use tracing::{debug, info, warn};

use super::{validate_desired, ApplyReport, Sink, SinkError};

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
}

impl Default for KubernetesSinkConfig {
    fn default() -> Self {
        KubernetesSinkConfig {
            field_manager: "aware-actuator".to_string(),
            defaults: TargetSinkConfig::default(),
            targets: BTreeMap::new(),
            retry: RetryConfig::default(),
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
}

impl KubernetesSinkConfig {
    pub fn validate(&self) -> Result<(), KubernetesSinkConfigError> {
        if self.retry.max_attempts == 0 {
            return Err(KubernetesSinkConfigError::NoAttempts);
        }
        if self.field_manager.is_empty() {
            return Err(KubernetesSinkConfigError::EmptyFieldManager);
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

    fn current<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, Result<Resources, SinkError>> {
        Box::pin(self.read_current(target))
    }

    fn apply<'a>(
        &'a self,
        target: &'a Target,
        desired: Resources,
    ) -> BoxFuture<'a, Result<ApplyReport, SinkError>> {
        Box::pin(self.apply_desired(target, desired))
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

/// The managed container of a pod spec: its index and the container.
fn select_container<'c>(
    target: &Target,
    containers: &'c [Container],
    name: Option<&str>,
    whose: &str,
) -> Result<&'c Container, SinkError> {
    let found = match name {
        Some(n) => containers.iter().find(|c| c.name == n),
        None => containers.first(),
    };
    found.ok_or_else(|| SinkError::Unmanageable {
        target: target.key(),
        why: match name {
            Some(n) => format!("{whose} has no container named `{n}`"),
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
        Ok(KubernetesSink { client, config })
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
            if !retryable {
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

    async fn get_deployment(
        &self,
        target: &Target,
    ) -> Result<(Api<Deployment>, DeploymentSpec), SinkError> {
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
        Ok((api, spec))
    }

    /// Live pods of the Deployment (not being deleted, not finished), sorted by name.
    async fn live_pods(
        &self,
        target: &Target,
        spec: &DeploymentSpec,
    ) -> Result<(Api<Pod>, Vec<Pod>), SinkError> {
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
        Ok((api, pods))
    }

    async fn read_current(&self, target: &Target) -> Result<Resources, SinkError> {
        let cfg = self.config.for_target(target);
        let (_, spec) = self.get_deployment(target).await?;
        let replicas = replicas_of(target, &spec)?;
        let template = template_containers(&spec);
        let container = select_container(
            target,
            template,
            cfg.container.as_deref(),
            "the pod template",
        )?;
        let (mut cpu, mut memory) = limits_of(target, container)?;
        if cfg.vertical_mode == VerticalMode::InPlace {
            let (_, pods) = self.live_pods(target, &spec).await?;
            let mut values = Vec::with_capacity(pods.len());
            for pod in &pods {
                if let Some(c) = pod_container(pod, &container.name) {
                    values.push(limits_of(target, c)?);
                }
            }
            if let Some(v) = most_common(&values) {
                (cpu, memory) = v;
            }
        }
        Ok(Resources {
            replicas,
            cpu_millicores: cpu,
            memory_bytes: memory,
        })
    }

    async fn apply_desired(
        &self,
        target: &Target,
        desired: Resources,
    ) -> Result<ApplyReport, SinkError> {
        validate_desired(target, &desired)?;
        let cfg = self.config.for_target(target);
        let (deployments, spec) = self.get_deployment(target).await?;
        let template = template_containers(&spec);
        let container = select_container(
            target,
            template,
            cfg.container.as_deref(),
            "the pod template",
        )?
        .clone();

        let mut notes = Vec::new();
        let replicas = self
            .apply_replicas(target, &deployments, &spec, desired.replicas)
            .await?;

        let (cpu, memory) = match cfg.vertical_mode {
            VerticalMode::TemplatePatch => {
                self.patch_template(target, &deployments, &container, desired)
                    .await?
            }
            VerticalMode::InPlace => {
                match self
                    .resize_in_place(target, &spec, &container, desired)
                    .await?
                {
                    InPlace::Done(v) => v,
                    InPlace::Refused(why) if cfg.fallback_to_template => {
                        let note = format!(
                            "{why}; patched the deployment template instead (pods restart)"
                        );
                        warn!(target = %target, note = %note, "in-place resize fallback");
                        notes.push(note);
                        self.patch_template(target, &deployments, &container, desired)
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

    /// Strategic merge patch of the template container's resources; returns the limits in force.
    async fn patch_template(
        &self,
        target: &Target,
        deployments: &Api<Deployment>,
        container: &Container,
        desired: Resources,
    ) -> Result<(u32, u64), SinkError> {
        if limits_of(target, container)? == (desired.cpu_millicores, desired.memory_bytes) {
            return Ok((desired.cpu_millicores, desired.memory_bytes));
        }
        let resources = resources_patch(target, container, desired)?;
        let patch = Patch::Strategic(json!({
            "spec": { "template": { "spec": { "containers": [
                { "name": container.name, "resources": resources }
            ] } } }
        }));
        let pp = self.patch_params();
        let deployment = self
            .call(target, "patch deployment template", || {
                deployments.patch(&target.name, &pp, &patch)
            })
            .await?;
        let spec = deployment.spec.unwrap_or_default();
        let after = select_container(
            target,
            template_containers(&spec),
            Some(&container.name),
            "the patched pod template",
        )?;
        let limits = limits_of(target, after)?;
        info!(
            target = %target,
            container = %container.name,
            cpu_millicores = limits.0,
            memory_bytes = limits.1,
            "patched the pod template"
        );
        Ok(limits)
    }

    /// Resizes every live pod whose container differs from `desired`.
    async fn resize_in_place(
        &self,
        target: &Target,
        spec: &DeploymentSpec,
        template_container: &Container,
        desired: Resources,
    ) -> Result<InPlace, SinkError> {
        let (pods_api, pods) = self.live_pods(target, spec).await?;
        let name = &template_container.name;
        let want = (desired.cpu_millicores, desired.memory_bytes);
        let pp = self.patch_params();
        let mut values = Vec::with_capacity(pods.len());
        for pod in &pods {
            let Some(pod_name) = pod.metadata.name.as_deref() else {
                continue;
            };
            let Some(container) = pod_container(pod, name) else {
                return Err(SinkError::Unmanageable {
                    target: target.key(),
                    why: format!("pod {pod_name} has no container named `{name}`"),
                });
            };
            if limits_of(target, container)? == want {
                values.push(want);
                continue;
            }
            let resources = resources_patch(target, container, desired)?;
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
                        .map(|c| limits_of(target, c))
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
    /// The limits in force on the pods.
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

/// A container's (CPU millicores, memory bytes) limits; 0 when a limit is missing.
fn limits_of(target: &Target, c: &Container) -> Result<(u32, u64), SinkError> {
    let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
    let get = |key: &str| limits.and_then(|l| l.get(key));
    let cpu = get("cpu")
        .map(|q| cpu_millicores(target, q))
        .transpose()?
        .unwrap_or(0);
    let memory = get("memory")
        .map(|q| memory_bytes(target, q))
        .transpose()?
        .unwrap_or(0);
    Ok((cpu, memory))
}

/// The `resources` patch of a container for `desired`: limits, and requests keeping the
/// request/limit ratio (see the module documentation).
fn resources_patch(target: &Target, c: &Container, desired: Resources) -> Result<Value, SinkError> {
    let res = c.resources.as_ref();
    let get = |which: Option<&BTreeMap<String, Quantity>>, key: &str| {
        which.and_then(|m| m.get(key)).cloned()
    };
    let limits = res.and_then(|r| r.limits.as_ref());
    let requests = res.and_then(|r| r.requests.as_ref());

    let old_cpu_limit = get(limits, "cpu")
        .map(|q| cpu_millicores(target, &q))
        .transpose()?;
    let old_cpu_request = get(requests, "cpu")
        .map(|q| cpu_millicores(target, &q))
        .transpose()?;
    let old_mem_limit = get(limits, "memory")
        .map(|q| memory_bytes(target, &q))
        .transpose()?;
    let old_mem_request = get(requests, "memory")
        .map(|q| memory_bytes(target, &q))
        .transpose()?;

    let mut limit_map = Map::new();
    limit_map.insert(
        "cpu".into(),
        Value::String(format_cpu(desired.cpu_millicores)),
    );
    limit_map.insert(
        "memory".into(),
        Value::String(format_memory(desired.memory_bytes)),
    );
    let mut request_map = Map::new();
    if let Some(r) = scaled_request(
        old_cpu_limit.map(u64::from),
        old_cpu_request.map(u64::from),
        u64::from(desired.cpu_millicores),
    ) {
        let r = u32::try_from(r).unwrap_or(desired.cpu_millicores);
        request_map.insert("cpu".into(), Value::String(format_cpu(r)));
    }
    if let Some(r) = scaled_request(old_mem_limit, old_mem_request, desired.memory_bytes) {
        request_map.insert("memory".into(), Value::String(format_memory(r)));
    }
    let mut out = Map::new();
    out.insert("limits".into(), Value::Object(limit_map));
    if !request_map.is_empty() {
        out.insert("requests".into(), Value::Object(request_map));
    }
    Ok(Value::Object(out))
}

/// The new request for a new limit (see the module documentation).
pub fn scaled_request(
    old_limit: Option<u64>,
    old_request: Option<u64>,
    new_limit: u64,
) -> Option<u64> {
    let request = old_request?;
    match old_limit {
        Some(limit) if limit > 0 => {
            let scaled = (u128::from(new_limit) * u128::from(request) + u128::from(limit) / 2)
                / u128::from(limit);
            Some(u64::try_from(scaled).unwrap_or(u64::MAX).min(new_limit))
        }
        _ => Some(request.min(new_limit)),
    }
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
mod tests;
