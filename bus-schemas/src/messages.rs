//! The seven messages of docs/design.md §2 (contract), plus `target`: the controller's registrations.
//!
//! Every message is a MessagePack map with named fields and carries `schema` (`"<kind>/<version>"`),
//! `target {namespace, name}`, `episode`, `step` and `ts_ms` (Unix epoch milliseconds).
//! Readers ignore fields they do not know, so adding an optional field is compatible; removing or
//! changing a field bumps the schema version.

use std::fmt;
use std::marker::PhantomData;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The Kubernetes object an event is about (a Deployment managed by AWARE).
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub struct Target {
    pub namespace: String,
    pub name: String,
}

impl Target {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// `namespace/name`, the key used for sharding and logs.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The event kinds, i.e. the `<event>` token of a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    Obs,
    Action,
    Applied,
    Episode,
    Lifecycle,
    Embedding,
    Model,
    Target,
}

impl EventKind {
    pub const ALL: [EventKind; 8] = [
        EventKind::Obs,
        EventKind::Action,
        EventKind::Applied,
        EventKind::Episode,
        EventKind::Lifecycle,
        EventKind::Embedding,
        EventKind::Model,
        EventKind::Target,
    ];

    /// Whether the newest message of this kind per target is that target's current state
    /// (stage, weights, embedding, registration) rather than one event of a stream: a consumer
    /// starts such kinds from a snapshot, and a bus retains their newest message per subject.
    pub const fn is_state(self) -> bool {
        matches!(
            self,
            EventKind::Lifecycle | EventKind::Model | EventKind::Embedding | EventKind::Target
        )
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            EventKind::Obs => "obs",
            EventKind::Action => "action",
            EventKind::Applied => "applied",
            EventKind::Episode => "episode",
            EventKind::Lifecycle => "lifecycle",
            EventKind::Embedding => "embedding",
            EventKind::Model => "model",
            EventKind::Target => "target",
        }
    }

    pub fn from_token(token: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == token)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Implemented by every bus message: its kind and schema identifier.
pub trait BusMessage: Serialize + for<'de> Deserialize<'de> + Clone + fmt::Debug {
    const KIND: EventKind;
    /// Schema version of this message type.
    const VERSION: u32;
    /// `"<kind>/<version>"`, the value of the `schema` field.
    const SCHEMA: &'static str;
    fn target(&self) -> &Target;
    fn episode(&self) -> u64;
    fn step(&self) -> u32;
    fn ts_ms(&self) -> i64;
}

/// The `schema` field: serializes as the message's `"<kind>/<version>"` string and refuses any
/// other value on decode.
pub struct Schema<M>(PhantomData<fn() -> M>);

impl<M> Schema<M> {
    pub const fn new() -> Self {
        Schema(PhantomData)
    }
}
impl<M> Default for Schema<M> {
    fn default() -> Self {
        Self::new()
    }
}
impl<M> Clone for Schema<M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Schema<M> {}
impl<M> PartialEq for Schema<M> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<M: BusMessage> fmt::Debug for Schema<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(M::SCHEMA)
    }
}
impl<M: BusMessage> Serialize for Schema<M> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(M::SCHEMA)
    }
}
impl<'de, M: BusMessage> Deserialize<'de> for Schema<M> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        if s == M::SCHEMA {
            Ok(Schema::new())
        } else {
            Err(serde::de::Error::custom(format_args!(
                "schema `{s}` where `{}` was expected",
                M::SCHEMA
            )))
        }
    }
}
impl<M: BusMessage> JsonSchema for Schema<M> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        format!("Schema_{}", M::KIND.as_str()).into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "const": M::SCHEMA,
            "description": "Message kind and schema version."
        })
    }
}

/// Lifecycle stage of an agent (paper Algorithm 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Agent created, profile not yet applied.
    Initialized,
    /// Bootstrapping: the HPA/VPA fallback drives, the RL policy trains offline.
    Offline,
    /// The RL policy drives with exploration and keeps training.
    Online,
    /// The RL policy drives with frozen weights and no exploration.
    Serving,
}

impl Stage {
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Initialized => "initialized",
            Stage::Offline => "offline",
            Stage::Online => "online",
            Stage::Serving => "serving",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which policy produced an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecisionSource {
    /// The rule-based HPA (replicas) + VPA (CPU/memory) fallback.
    Fallback,
    /// The RL base-learner.
    Rl,
}

/// A concrete allocation for a target ([`aware_mdp::Allocation`]) and the raw measurements behind
/// a state vector: defined once with the learning problem, their wire form and JSON Schema
/// unchanged.
pub use aware_mdp::{ControlledValues, CpuLimit, LimitsPolicy, RawMetrics, Resources};

/// `obs/1`: the state at step t and the reward of the action taken at t−1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Obs {
    pub schema: Schema<Obs>,
    pub target: Target,
    pub episode: u64,
    pub step: u32,
    pub ts_ms: i64,
    /// Normalized state vector: the target's 9 features (`aware_mdp::STATE_NAMES`), then, with
    /// `learning.mean_field`, 6 about the others on its cluster (`aware_mdp::MEAN_FIELD_NAMES`:
    /// others_allocation_change, cluster_cpu_requested, cluster_memory_requested,
    /// cluster_pending, others_slo_preservation, others_cpu_util). Empty in an incomplete obs.
    pub state: Vec<f32>,
    /// The measurements the state was computed from.
    pub metrics: RawMetrics,
    /// Reward of the previous action (`None` on the first step of an episode).
    pub reward: Option<f64>,
    /// The SLO (p99 latency or throughput) was violated during the step.
    pub slo_violation: bool,
    /// False when metrics were missing or stale: no action is taken on an incomplete step.
    pub complete: bool,
    /// Names of the metrics that were missing or stale.
    pub missing: Vec<String>,
}

/// `action/1`: the recommendation for step t.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Action {
    pub schema: Schema<Action>,
    pub target: Target,
    pub episode: u64,
    pub step: u32,
    pub ts_ms: i64,
    pub source: DecisionSource,
    pub stage: Stage,
    /// Raw policy output in [-1, 1] per dimension (replicas, CPU, memory); empty for the fallback.
    pub raw: Vec<f32>,
    /// The allocation in force when the action was decided (from the step's `obs`).
    pub current: Resources,
    /// The concrete allocation the raw action maps to.
    pub desired: Resources,
    /// Version of the RL weights that produced the action.
    pub model_version: Option<u64>,
    /// Exploration noise was added.
    pub exploration: bool,
    /// Why the fallback acted although the stage is RL-driven (NaN state, missing model, …).
    pub fallback_reason: Option<String>,
    /// Set while the target's SLO cannot be met within its bounds: the allocation the fallback's
    /// rule (HPA replicas, VPA CPU and memory, before the bounds clamp them) says it would need.
    /// `desired` stays inside the bounds. Absent while the SLO is reachable, or the target has
    /// none. Added to `action/1` without a version bump, like `target/1`'s `container`: an
    /// action without it reads as absent and encodes as before, and a reader that does not know
    /// the field ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_unreachable: Option<Resources>,
    /// The recommender has judged reachability: a whole window of steps since it started (or
    /// the target has no SLO), so an absent `slo_unreachable` means reachable. False while it
    /// has not (just started or restarted): an absent `slo_unreachable` then says nothing, and
    /// a reader keeps the verdict it had. Added with `slo_unreachable`, absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub slo_judged: bool,
}

/// Outcome of an action at the actuator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Applied to the sink (possibly clamped).
    Applied,
    /// Recorded only: the target is in recommend-only mode (`updateMode: Off`).
    RecommendOnly,
    /// Not applied; `reason` says why.
    Rejected,
}

/// `applied/1`: what the actuator did with an action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Applied {
    pub schema: Schema<Applied>,
    pub target: Target,
    pub episode: u64,
    pub step: u32,
    pub ts_ms: i64,
    pub outcome: Outcome,
    pub source: DecisionSource,
    /// The allocation the action asked for.
    pub requested: Resources,
    /// The allocation in force after this decision (after clamping; unchanged when rejected).
    pub applied: Resources,
    /// Dimensions that were clamped to bounds or guardrails (`replicas`, `cpu`, `memory`).
    pub clamped: Vec<String>,
    pub reason: Option<String>,
    /// `simulator` or `kubernetes`.
    pub sink: String,
}

/// `episode/1`: summary of a finished episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Episode {
    pub schema: Schema<Episode>,
    pub target: Target,
    pub episode: u64,
    /// Last step of the episode.
    pub step: u32,
    pub ts_ms: i64,
    pub steps: u32,
    pub total_reward: f64,
    pub mean_reward: f64,
    pub slo_violations: u32,
    pub cpu_util_mean: f64,
    pub memory_util_mean: f64,
    pub rl_steps: u32,
    pub fallback_steps: u32,
    /// Stage the agent was in for most of the episode.
    pub stage: Stage,
    /// Off-policy estimate of the RL policy's episode reward on this episode's states, when the
    /// trainer has one (drives OFFLINE → ONLINE).
    pub policy_estimate: Option<f64>,
    /// RL steps that acted with exploration noise (the actions' `exploration`); absent when
    /// unknown (an episode rebuilt from the trajectory store, or from a recorder before this
    /// field). `Some(0)` with `rl_steps > 0` is a noise-free evaluation episode.
    #[serde(default)]
    pub exploring_steps: Option<u32>,
    /// Mean over the episode's steps of the requested cores in force (replicas × CPU request,
    /// what the user pays for), and of the requested memory in GiB (2^30 bytes). Absent when
    /// unknown (an episode rebuilt from the trajectory store, or from a recorder before these
    /// fields). Added to `episode/1` without a version bump, like `target/1`'s `slo_objective`:
    /// an episode without them reads as absent, a reader that does not know them ignores them,
    /// and they are left out of the encoding when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_cores_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_gib_mean: Option<f64>,
}

/// `lifecycle/1`: a change of lifecycle stage (Algorithm 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Lifecycle {
    pub schema: Schema<Lifecycle>,
    pub target: Target,
    pub episode: u64,
    pub step: u32,
    pub ts_ms: i64,
    pub stage: Stage,
    pub previous: Option<Stage>,
    /// Human-readable reason of the transition.
    pub reason: String,
    /// Mean and standard deviation of the rewards in the window that decided.
    pub reward_mean: Option<f64>,
    pub reward_std: Option<f64>,
    /// Number of episodes in that window.
    pub window: u32,
    /// ONLINE → SERVING after a retraining that settled below what the policy earned before it
    /// (the lifecycle monitor's `rebaseline_rollback`): the base-learner version in force when
    /// the target started retraining. The trainer resumes from that checkpoint and republishes
    /// it as a new version, which the recommenders load as usual. Absent otherwise.
    #[serde(default)]
    pub rollback_to: Option<u64>,
}

impl Lifecycle {
    /// Whether the target retrains after this message: ONLINE entered from SERVING (Algorithm 1's
    /// retraining trigger), as opposed to ONLINE entered from OFFLINE (learning for the first
    /// time). `was` is the answer before this message; it is kept while the target stays ONLINE
    /// (an announcement ONLINE → ONLINE) and ends when it leaves ONLINE.
    pub fn retraining(&self, was: bool) -> bool {
        match (self.stage, self.previous) {
            (Stage::Online, Some(Stage::Serving)) => true,
            (Stage::Online, Some(Stage::Online)) => was,
            _ => false,
        }
    }
}

/// `embedding/1`: the meta-learner's workload embedding for a target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Embedding {
    pub schema: Schema<Embedding>,
    pub target: Target,
    pub episode: u64,
    pub step: u32,
    pub ts_ms: i64,
    pub model_version: u64,
    pub embedding: Vec<f32>,
    /// Number of episodes in the bundle the embedding was computed from.
    pub episodes_used: u32,
}

/// Which network a `model` message announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    BaseLearner,
    MetaLearner,
}

/// `model/1`: new weights are available in the model store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Model {
    pub schema: Schema<Model>,
    pub target: Target,
    pub episode: u64,
    pub step: u32,
    pub ts_ms: i64,
    pub kind: ModelKind,
    pub version: u64,
    /// Location in the model store (`file://…` or `nats-object://bucket/key`).
    pub uri: String,
    /// Hex SHA-256 of the stored bytes.
    pub sha256: String,
    pub size_bytes: u64,
    pub trained_steps: u64,
    /// The trainer's off-policy estimate of this policy's mean per-step reward on the target's
    /// recorded states (critic-based evaluation); drives OFFLINE → ONLINE in the lifecycle monitor.
    #[serde(default)]
    pub policy_estimate: Option<f64>,
    /// Mean per-step reward the behaviour (fallback) policy earned on the same data, for comparison.
    #[serde(default)]
    pub behaviour_reward: Option<f64>,
}

/// Per-target lifecycle profile of Algorithm 1 carried by a registration (per-step mean rewards).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RegisteredLifecycle {
    pub bootstrap: bool,
    pub t_online: f64,
    pub t_serving: f64,
    pub t_var: f64,
    pub window: u32,
}

/// What the services need to manage a registered target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RegisteredSpec {
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub min_cpu_millicores: u32,
    pub max_cpu_millicores: u32,
    pub min_memory_bytes: u64,
    pub max_memory_bytes: u64,
    pub slo_latency_p99_ms: Option<f64>,
    pub slo_throughput_rps: Option<f64>,
    /// Weight of SLO preservation in the reward (objective.alpha).
    pub alpha: f64,
    /// `updateMode: Off`: recommend, record, never apply.
    pub recommend_only: bool,
    /// The lifecycle profile; absent = the services' configured default.
    pub lifecycle: Option<RegisteredLifecycle>,
    /// The container of the Deployment's pods whose CPU and memory the actuator sizes: the one
    /// the AwareAutoscaler's `resourcePolicy.containerPolicies` names. Absent (no policy, or a
    /// `*` policy) = the actuator's own choice: its `container` setting, else the pod
    /// template's first container. Added to `target/1` without a version bump: a message
    /// without it reads as absent, a reader that does not know it ignores it, and it is left
    /// out of the encoding when absent (such a registration encodes as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// How the limits follow the requested allocation: `controlled_values` (`RequestsAndLimits`:
    /// limits keep the workload's limit:request ratio; `RequestsOnly`: limits stay as the workload
    /// has them) and `cpu_limit` (`Controlled`, `UnsetIfLatencySensitive`, `Unset`). Absent = the
    /// default policy (`RequestsAndLimits`, `UnsetIfLatencySensitive`). Added to `target/1` without a version
    /// bump, like `container`: a registration without it reads as absent, a reader that does not
    /// know it ignores it, and it is left out of the encoding when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsPolicy>,
    /// The SLO objective: the fraction of control intervals that must meet the SLO, in (0, 1)
    /// (`1 - slo_objective` is the error budget). Absent = the default, 0.99. Added to
    /// `target/1` without a version bump, like `container`: a registration without it reads as
    /// absent, a reader that does not know it ignores it, and it is left out of the encoding
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_objective: Option<f64>,
    /// The target's own HPA target CPU utilization for the recommender's HPA/VPA fallback, a
    /// fraction from 0.01 to 1 (the AwareAutoscaler's
    /// `spec.fallback.hpa.targetCPUUtilizationPercentage` / 100). Absent = the recommender's
    /// `fallback.hpa.target_cpu_utilization`. Added to `target/1` without a version bump, like
    /// `container`: a registration without it reads as absent, a reader that does not know it
    /// ignores it, and it is left out of the encoding when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_hpa_target_cpu_utilization: Option<f64>,
}

/// `target/1`: the controller registers a target with the services (spec present) or
/// deregisters it (spec absent: services stop managing it and the workload keeps its last
/// applied resources). Registrations are re-sent periodically; receivers keep the newest
/// `generation` per target and treat repeats as no-ops.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Registration {
    pub schema: Schema<Registration>,
    pub target: Target,
    pub episode: u64,
    pub step: u32,
    pub ts_ms: i64,
    /// `metadata.generation` of the custom resource (deregistrations carry the last one seen).
    pub generation: u64,
    /// The custom resource, `namespace/name`.
    pub source: String,
    pub spec: Option<RegisteredSpec>,
}

macro_rules! bus_message {
    ($t:ty, $kind:expr, $schema:literal) => {
        impl BusMessage for $t {
            const KIND: EventKind = $kind;
            const VERSION: u32 = 1;
            const SCHEMA: &'static str = $schema;
            fn target(&self) -> &Target {
                &self.target
            }
            fn episode(&self) -> u64 {
                self.episode
            }
            fn step(&self) -> u32 {
                self.step
            }
            fn ts_ms(&self) -> i64 {
                self.ts_ms
            }
        }
    };
}

bus_message!(Obs, EventKind::Obs, "obs/1");
bus_message!(Action, EventKind::Action, "action/1");
bus_message!(Applied, EventKind::Applied, "applied/1");
bus_message!(Episode, EventKind::Episode, "episode/1");
bus_message!(Lifecycle, EventKind::Lifecycle, "lifecycle/1");
bus_message!(Embedding, EventKind::Embedding, "embedding/1");
bus_message!(Model, EventKind::Model, "model/1");
bus_message!(Registration, EventKind::Target, "target/1");

/// Any bus message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Event {
    Obs(Obs),
    Action(Action),
    Applied(Applied),
    Episode(Episode),
    Lifecycle(Lifecycle),
    Embedding(Embedding),
    Model(Model),
    Registration(Registration),
}

macro_rules! event_dispatch {
    ($self:ident, $m:ident => $e:expr) => {
        match $self {
            Event::Obs($m) => $e,
            Event::Action($m) => $e,
            Event::Applied($m) => $e,
            Event::Episode($m) => $e,
            Event::Lifecycle($m) => $e,
            Event::Embedding($m) => $e,
            Event::Model($m) => $e,
            Event::Registration($m) => $e,
        }
    };
}

impl Event {
    pub fn kind(&self) -> EventKind {
        match self {
            Event::Obs(_) => EventKind::Obs,
            Event::Action(_) => EventKind::Action,
            Event::Applied(_) => EventKind::Applied,
            Event::Episode(_) => EventKind::Episode,
            Event::Lifecycle(_) => EventKind::Lifecycle,
            Event::Embedding(_) => EventKind::Embedding,
            Event::Model(_) => EventKind::Model,
            Event::Registration(_) => EventKind::Target,
        }
    }
    pub fn target(&self) -> &Target {
        event_dispatch!(self, m => &m.target)
    }
    pub fn episode(&self) -> u64 {
        event_dispatch!(self, m => m.episode)
    }
    pub fn step(&self) -> u32 {
        event_dispatch!(self, m => m.step)
    }
    pub fn ts_ms(&self) -> i64 {
        event_dispatch!(self, m => m.ts_ms)
    }
}

macro_rules! event_from {
    ($($v:ident),*) => {$(
        impl From<$v> for Event {
            fn from(m: $v) -> Self {
                Event::$v(m)
            }
        }
    )*};
}
event_from!(
    Obs,
    Action,
    Applied,
    Episode,
    Lifecycle,
    Embedding,
    Model,
    Registration
);

/// Current time as Unix epoch milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
