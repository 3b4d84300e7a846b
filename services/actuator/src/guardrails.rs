//! Guardrails: what the actuator may apply for an action (pure and synchronous).
//!
//! [`Guardrails::decide`] turns a requested allocation into a [`Decision`] from the target's
//! [`TargetSpec`] (bounds and update mode), the allocation in force, the per-target
//! [`GuardState`] (last applied step, last change of each dimension) and the time. The rules, in
//! the order they are checked:
//!
//! 1. **Invalid bounds** (`Bounds::problems` non-empty, e.g. min above max) → `Rejected`: nothing
//!    sensible can be applied, and clamping into an empty range is undefined.
//! 2. **Stale step**: an action whose `(episode, step)` is not after the last applied one (older, or
//!    a redelivered duplicate) → `Rejected`, the allocation in force is kept. (The actuator only
//!    asks about the step the collector reported last, so this keeps one decision per step; see
//!    `service::TargetActuator`.)
//! 3. **Guarded allocation**, per dimension (the bounds first lowered to the actuator's hard
//!    ceilings `max_replicas`, `max_cpu_millicores`, `max_memory_bytes`, whatever the
//!    configuration or a registration says): the requested value is first limited to the maximum
//!    change per step around the value in force ([`StepLimit`]), then clamped into the bounds (the
//!    bounds are the user's hard constraints and win over the step limit when the value in force is
//!    outside them); a dimension still in its cooldown, or asked for a CPU/memory change smaller
//!    than its minimum change, keeps its value in force (unless that value is outside the bounds,
//!    which are enforced at once). Zero and absurd requests end up at a bound.
//! 4. **Recommend-only** (`UpdateMode::Off`) → `RecommendOnly`: nothing is applied (`applied` is the
//!    allocation in force); the guarded allocation is still computed and reported in
//!    `recommended`, `clamped` and `reason`.
//! 5. Otherwise → `Applied` with the guarded allocation.
//!
//! 6. **Requests within limits** ([`Guardrails::decide_within`], given the managed container as
//!    the workload has it): the allocation is the requests, and Kubernetes refuses a pod whose
//!    request exceeds its limit. Where the target's limits policy keeps a limit (`RequestsOnly`
//!    leaves the limits as they are), a request above it is lowered to it, even below a lower
//!    bound: no invalid pod spec is ever written. (`RequestsAndLimits` scales each limit with its
//!    request, never below it.)
//!
//! Every dimension changed by a rule is listed in `clamped` (`replicas`, `cpu`, `memory`, the names
//! of `applied.clamped`) and explained in `reason`.
//!
//! After the sink has applied a decision, the caller records it with [`GuardState::record`]; the
//! state is not changed by [`Guardrails::decide`], so a sink failure leaves it untouched.
//!
//! # Defaults ([`GuardrailConfig::default`])
//!
//! Each limit is `max(min, ratio × value in force)` (`<dim>_up_ratio`/`<dim>_up_min…`, same for
//! `down`); cooldowns are `<dim>_cooldown_ms` and `shared_vertical_cooldown`; a CPU or memory
//! change smaller than `<dim>_min_change_ratio` of the value in force keeps the value in force.
//!
//! | dimension | up per step | down per step | cooldown | minimum change |
//! |---|---|---|---|---|
//! | replicas | max(4, 100 %) | max(1, 50 %) | none | none |
//! | CPU limit | max(100 m, 50 %) | max(100 m, 50 %) | none (shared with memory when set) | none |
//! | memory limit | max(128 MiB, 50 %) | max(128 MiB, 50 %) | none (shared with CPU when set) | none |
//!
//! Why: the replica scale-up limit is the HPA's default scale-up policy (`max(4 pods, 100 %)`);
//! halving at most per step keeps a mis-step (or a noisy RL action) from dropping most of the
//! capacity at once, and the HPA relies on a stabilization window for the same reason. Vertical
//! changes are bounded to ±50 % per step. They have no cooldown by default: the Kubernetes sink
//! resizes pods in place (`vertical_mode = in_place`), which restarts nothing, and on the simulated
//! cluster a cooldown cost the converged policy and retraining reward
//! (docs/adr/0007-no-vertical-cooldown.md).
//! A cluster that patches the template (`template_patch`, or the in-place fallback) restarts the
//! pods on every vertical change: set `cpu_cooldown_ms` / `memory_cooldown_ms` (e.g. 60000; a
//! CPU change then starts the memory cooldown too, both restart the same pods). The
//! absolute minimum step (`*_min*` fields) lets small allocations move at all (50 % of 128 m is only
//! 64 m). Near the lower bounds these limits are tighter than the largest step of the loadgen's
//! default action map (±4 replicas, ±480 m, ±704 MiB), so a full-strength RL action there is clamped
//! and reported; relax `cpu_up_min_millicores` / `memory_up_min_bytes` to give the policy its full
//! range.
//!
//! A value in force of zero CPU or memory means "unknown" (e.g. a container without a limit): the
//! step limit does not apply to that dimension, only the bounds. A clock that went backwards (e.g. a
//! new simulated run) ends a cooldown.

use std::fmt;

use aware_bus_schemas::{Outcome, Resources};
use aware_mdp::ContainerResources;
use aware_shared::spec::{Bounds, TargetSpec, UpdateMode};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The three dimensions of an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dimension {
    Replicas,
    Cpu,
    Memory,
}

impl Dimension {
    pub const ALL: [Dimension; 3] = [Dimension::Replicas, Dimension::Cpu, Dimension::Memory];

    /// The name used in `applied.clamped`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dimension::Replicas => "replicas",
            Dimension::Cpu => "cpu",
            Dimension::Memory => "memory",
        }
    }

    const fn index(self) -> usize {
        match self {
            Dimension::Replicas => 0,
            Dimension::Cpu => 1,
            Dimension::Memory => 2,
        }
    }

    const fn unit(self) -> &'static str {
        match self {
            Dimension::Replicas => "",
            Dimension::Cpu => "m",
            Dimension::Memory => " B",
        }
    }

    fn get(self, r: &Resources) -> u64 {
        match self {
            Dimension::Replicas => u64::from(r.replicas),
            Dimension::Cpu => u64::from(r.cpu_millicores),
            Dimension::Memory => r.memory_bytes,
        }
    }

    /// Sets the dimension; `v` always comes from a range whose ends fit the field's type.
    fn set(self, r: &mut Resources, v: u64) {
        match self {
            Dimension::Replicas => r.replicas = u32::try_from(v).unwrap_or(u32::MAX),
            Dimension::Cpu => r.cpu_millicores = u32::try_from(v).unwrap_or(u32::MAX),
            Dimension::Memory => r.memory_bytes = v,
        }
    }

    fn bounds(self, b: &Bounds) -> (u64, u64) {
        match self {
            Dimension::Replicas => (u64::from(b.min_replicas), u64::from(b.max_replicas)),
            Dimension::Cpu => (
                u64::from(b.min_cpu_millicores),
                u64::from(b.max_cpu_millicores),
            ),
            Dimension::Memory => (b.min_memory_bytes, b.max_memory_bytes),
        }
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Maximum change of one dimension in one step: `max(min, ratio × value in force)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLimit {
    /// Fraction of the value in force (0.5 = 50 %). For a decrease, at most 1.
    pub ratio: f64,
    /// Absolute change always allowed (replicas, millicores or bytes).
    pub min: u64,
}

impl StepLimit {
    /// The allowed change from `current` (rounded up for an increase, down for a decrease).
    pub fn allowance(&self, current: u64, up: bool) -> u64 {
        // `as` saturates (and maps NaN to 0); the ratio is validated finite and non-negative.
        let scaled = current as f64 * self.ratio;
        let scaled = if up { scaled.ceil() } else { scaled.floor() };
        (scaled as u64).max(self.min)
    }
}

const MIB: u64 = 1024 * 1024;

/// Guardrail settings (the actuator's `guardrails` configuration section). Flat on purpose: a
/// configuration that sets one field keeps the defaults of all the others.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuardrailConfig {
    /// Replicas may grow by `max(replicas_up_min, replicas_up_ratio × current)` per step.
    pub replicas_up_ratio: f64,
    pub replicas_up_min: u32,
    /// Replicas may shrink by `max(replicas_down_min, replicas_down_ratio × current)` per step.
    pub replicas_down_ratio: f64,
    pub replicas_down_min: u32,
    pub cpu_up_ratio: f64,
    pub cpu_up_min_millicores: u32,
    pub cpu_down_ratio: f64,
    pub cpu_down_min_millicores: u32,
    pub memory_up_ratio: f64,
    pub memory_up_min_bytes: u64,
    pub memory_down_ratio: f64,
    pub memory_down_min_bytes: u64,
    /// Minimum time between two changes of a dimension, milliseconds (0 = none).
    pub replicas_cooldown_ms: u64,
    pub cpu_cooldown_ms: u64,
    pub memory_cooldown_ms: u64,
    /// A CPU change also starts the memory cooldown and vice versa (both restart the pods unless
    /// resized in place).
    pub shared_vertical_cooldown: bool,
    /// A CPU (memory) change smaller than this fraction of the value in force is not applied:
    /// the value in force is kept (0 = every change applies). The VPA updater's update threshold
    /// (10 %) for the same reason: a continuous policy's action moves a little at every step, and
    /// each vertical change restarts the pods unless resized in place, so without it a rolling
    /// restart is superseded before it completes.
    pub cpu_min_change_ratio: f64,
    pub memory_min_change_ratio: f64,
    /// Hard ceilings: no target's bounds, whether configured or registered, take a dimension
    /// above them (a registration asking for more is clamped here), so no message can make the
    /// actuator apply more. At least 1.
    pub max_replicas: u32,
    pub max_cpu_millicores: u32,
    pub max_memory_bytes: u64,
}

impl Default for GuardrailConfig {
    fn default() -> Self {
        GuardrailConfig {
            replicas_up_ratio: 1.0,
            replicas_up_min: 4,
            replicas_down_ratio: 0.5,
            replicas_down_min: 1,
            cpu_up_ratio: 0.5,
            cpu_up_min_millicores: 100,
            cpu_down_ratio: 0.5,
            cpu_down_min_millicores: 100,
            memory_up_ratio: 0.5,
            memory_up_min_bytes: 128 * MIB,
            memory_down_ratio: 0.5,
            memory_down_min_bytes: 128 * MIB,
            replicas_cooldown_ms: 0,
            cpu_cooldown_ms: 0,
            memory_cooldown_ms: 0,
            shared_vertical_cooldown: true,
            cpu_min_change_ratio: 0.0,
            memory_min_change_ratio: 0.0,
            max_replicas: 1000,
            max_cpu_millicores: 64_000,
            max_memory_bytes: 256 * 1024 * MIB,
        }
    }
}

/// A guardrail setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GuardrailConfigError {
    #[error("guardrails.{dimension}_{direction}_ratio is {value}: must be finite and at least 0")]
    InvalidRatio {
        dimension: Dimension,
        direction: &'static str,
        value: f64,
    },
    #[error("guardrails.{dimension}_down_ratio is {value}: a decrease cannot exceed 1 (100 %)")]
    DownRatioAboveOne { dimension: Dimension, value: f64 },
    #[error("guardrails.{dimension}_min_change_ratio is {value}: must be finite and in [0, 1)")]
    InvalidMinChange { dimension: Dimension, value: f64 },
    #[error("guardrails.{key} is 0: the ceiling must be at least 1")]
    ZeroCeiling { key: &'static str },
}

impl GuardrailConfig {
    /// The step limits of `d`: (increase, decrease).
    pub fn limits(&self, d: Dimension) -> (StepLimit, StepLimit) {
        let (ur, um, dr, dm) = match d {
            Dimension::Replicas => (
                self.replicas_up_ratio,
                u64::from(self.replicas_up_min),
                self.replicas_down_ratio,
                u64::from(self.replicas_down_min),
            ),
            Dimension::Cpu => (
                self.cpu_up_ratio,
                u64::from(self.cpu_up_min_millicores),
                self.cpu_down_ratio,
                u64::from(self.cpu_down_min_millicores),
            ),
            Dimension::Memory => (
                self.memory_up_ratio,
                self.memory_up_min_bytes,
                self.memory_down_ratio,
                self.memory_down_min_bytes,
            ),
        };
        (
            StepLimit { ratio: ur, min: um },
            StepLimit { ratio: dr, min: dm },
        )
    }

    /// The cooldown of `d`, milliseconds.
    pub fn cooldown_ms(&self, d: Dimension) -> u64 {
        match d {
            Dimension::Replicas => self.replicas_cooldown_ms,
            Dimension::Cpu => self.cpu_cooldown_ms,
            Dimension::Memory => self.memory_cooldown_ms,
        }
    }

    /// The smallest relative change of `d` that applies (0 for replicas: every change does).
    pub fn min_change_ratio(&self, d: Dimension) -> f64 {
        match d {
            Dimension::Replicas => 0.0,
            Dimension::Cpu => self.cpu_min_change_ratio,
            Dimension::Memory => self.memory_min_change_ratio,
        }
    }

    /// The ceiling of `d` (`max_replicas`, `max_cpu_millicores`, `max_memory_bytes`).
    pub fn ceiling(&self, d: Dimension) -> u64 {
        match d {
            Dimension::Replicas => u64::from(self.max_replicas),
            Dimension::Cpu => u64::from(self.max_cpu_millicores),
            Dimension::Memory => self.max_memory_bytes,
        }
    }

    /// `b` with every maximum (and a minimum above it) lowered to the ceilings.
    pub fn capped(&self, b: &Bounds) -> Bounds {
        let max_replicas = b.max_replicas.min(self.max_replicas);
        let max_cpu_millicores = b.max_cpu_millicores.min(self.max_cpu_millicores);
        let max_memory_bytes = b.max_memory_bytes.min(self.max_memory_bytes);
        Bounds {
            min_replicas: b.min_replicas.min(max_replicas),
            max_replicas,
            min_cpu_millicores: b.min_cpu_millicores.min(max_cpu_millicores),
            max_cpu_millicores,
            min_memory_bytes: b.min_memory_bytes.min(max_memory_bytes),
            max_memory_bytes,
        }
    }

    /// Checks the ratios (finite, non-negative, decrease at most 100 %, minimum change below
    /// 100 %) and the ceilings (at least 1).
    pub fn validate(&self) -> Result<(), GuardrailConfigError> {
        for (key, d) in [
            ("max_replicas", Dimension::Replicas),
            ("max_cpu_millicores", Dimension::Cpu),
            ("max_memory_bytes", Dimension::Memory),
        ] {
            if self.ceiling(d) == 0 {
                return Err(GuardrailConfigError::ZeroCeiling { key });
            }
        }
        for d in [Dimension::Cpu, Dimension::Memory] {
            let value = self.min_change_ratio(d);
            if !(value.is_finite() && (0.0..1.0).contains(&value)) {
                return Err(GuardrailConfigError::InvalidMinChange {
                    dimension: d,
                    value,
                });
            }
        }
        for d in Dimension::ALL {
            let (up, down) = self.limits(d);
            for (direction, s) in [("up", up), ("down", down)] {
                if !s.ratio.is_finite() || s.ratio < 0.0 {
                    return Err(GuardrailConfigError::InvalidRatio {
                        dimension: d,
                        direction,
                        value: s.ratio,
                    });
                }
            }
            if down.ratio > 1.0 {
                return Err(GuardrailConfigError::DownRatioAboveOne {
                    dimension: d,
                    value: down.ratio,
                });
            }
        }
        Ok(())
    }
}

/// Position of an action in a target's history: episodes, then steps within an episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StepId {
    pub episode: u64,
    pub step: u32,
}

impl fmt::Display for StepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "episode {} step {}", self.episode, self.step)
    }
}

/// What the guardrails remember about one target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuardState {
    /// The last step whose decision was applied.
    pub last_applied: Option<StepId>,
    /// When each dimension last changed (`Dimension` order), epoch milliseconds.
    pub last_change_ms: [Option<i64>; 3],
}

impl GuardState {
    /// Records an applied decision: `before` was in force before it, `after` is in force now (as
    /// reported by the sink). Starts the cooldown of every dimension that changed.
    pub fn record(&mut self, step: StepId, before: Resources, after: Resources, now_ms: i64) {
        self.last_applied = Some(self.last_applied.map_or(step, |s| s.max(step)));
        for d in Dimension::ALL {
            if d.get(&before) != d.get(&after) {
                self.last_change_ms[d.index()] = Some(now_ms);
            }
        }
    }

    /// When `d` last changed, for cooldown purposes (with a shared vertical cooldown, the later of
    /// the CPU and memory changes).
    fn last_change(&self, d: Dimension, shared_vertical: bool) -> Option<i64> {
        let own = self.last_change_ms[d.index()];
        match d {
            Dimension::Cpu | Dimension::Memory if shared_vertical => {
                let cpu = self.last_change_ms[Dimension::Cpu.index()];
                let mem = self.last_change_ms[Dimension::Memory.index()];
                cpu.max(mem)
            }
            _ => own,
        }
    }
}

/// What the guardrails decided for one action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    /// The allocation in force after the decision (the allocation in force when not applied).
    pub applied: Resources,
    /// The guarded allocation (what `Auto` applies; for `RecommendOnly` the recommendation; for
    /// `Rejected` the allocation in force).
    pub recommended: Resources,
    /// Dimensions changed by a bound, a step limit, a cooldown or the minimum change (`replicas`,
    /// `cpu`, `memory`).
    pub clamped: Vec<String>,
    /// Why the outcome is not a plain application of the request, or what was clamped and why.
    pub reason: Option<String>,
}

impl Decision {
    /// True when applying the decision changes the allocation in force.
    pub fn changes(&self, current: &Resources) -> bool {
        self.outcome == Outcome::Applied && self.applied != *current
    }
}

/// The guardrails of the actuator (one per service; the state is per target).
#[derive(Debug, Clone)]
pub struct Guardrails {
    config: GuardrailConfig,
}

impl Guardrails {
    /// Guardrails with a validated configuration.
    pub fn new(config: GuardrailConfig) -> Result<Self, GuardrailConfigError> {
        config.validate()?;
        Ok(Guardrails { config })
    }

    pub fn config(&self) -> &GuardrailConfig {
        &self.config
    }

    /// Decides what to do with `requested` for `step`, given the target's spec and state, the
    /// allocation in force and the time (epoch milliseconds). See the module documentation.
    pub fn decide(
        &self,
        spec: &TargetSpec,
        state: &GuardState,
        current: Resources,
        step: StepId,
        requested: Resources,
        now_ms: i64,
    ) -> Decision {
        let problems = spec.bounds.problems();
        if !problems.is_empty() {
            let list: Vec<String> = problems
                .iter()
                .map(|(key, why)| format!("{key}: {why}"))
                .collect();
            return rejected(
                current,
                format!("invalid bounds for the target: {}", list.join("; ")),
            );
        }
        let bounds = self.config.capped(&spec.bounds);
        if let Some(last) = state.last_applied {
            if step < last {
                return rejected(
                    current,
                    format!("stale action: {step} is older than the last applied {last}"),
                );
            }
            if step == last {
                return rejected(
                    current,
                    format!("duplicate action: {step} was already applied"),
                );
            }
        }

        let mut guarded = requested;
        let mut clamped = Vec::new();
        let mut notes = Vec::new();
        for d in Dimension::ALL {
            let (value, note) = self.guard_dimension(d, &bounds, state, current, requested, now_ms);
            d.set(&mut guarded, value);
            if let Some(note) = note {
                clamped.push(d.as_str().to_string());
                notes.push(note);
            }
        }

        match spec.update_mode {
            UpdateMode::Off => {
                let mut reason = format!(
                    "recommend-only (update mode Off): recommends {}",
                    show(&guarded)
                );
                if !notes.is_empty() {
                    reason.push_str("; ");
                    reason.push_str(&notes.join("; "));
                }
                Decision {
                    outcome: Outcome::RecommendOnly,
                    applied: current,
                    recommended: guarded,
                    clamped,
                    reason: Some(reason),
                }
            }
            UpdateMode::Auto => Decision {
                outcome: Outcome::Applied,
                applied: guarded,
                recommended: guarded,
                clamped,
                reason: (!notes.is_empty()).then(|| notes.join("; ")),
            },
        }
    }

    /// [`Guardrails::decide`], then each request kept at most the limit the target's limits
    /// policy keeps or sets for it, given the managed container as the workload has it (`now`;
    /// rule 6 of the module documentation).
    #[allow(clippy::too_many_arguments)]
    pub fn decide_within(
        &self,
        spec: &TargetSpec,
        state: &GuardState,
        current: Resources,
        step: StepId,
        requested: Resources,
        now_ms: i64,
        now: &ContainerResources,
    ) -> Decision {
        let mut d = self.decide(spec, state, current, step, requested, now_ms);
        if d.outcome == Outcome::Rejected {
            return d;
        }
        let resolved = spec
            .limits
            .resolve(d.recommended, now, spec.slo.latency_sensitive());
        if resolved.capped.is_empty() {
            return d;
        }
        let mut notes = Vec::new();
        for (name, asked, limit, unit) in [
            (
                "cpu",
                u64::from(d.recommended.cpu_millicores),
                u64::from(resolved.requests.cpu_millicores),
                "m",
            ),
            (
                "memory",
                d.recommended.memory_bytes,
                resolved.requests.memory_bytes,
                " B",
            ),
        ] {
            if resolved.capped.contains(&name) {
                notes.push(format!(
                    "{name}: request {asked}{unit} lowered to the limit {limit}{unit} the limits policy keeps (a request above its limit is refused by Kubernetes)"
                ));
                if !d.clamped.iter().any(|c| c == name) {
                    d.clamped.push(name.to_string());
                }
            }
        }
        d.recommended = resolved.requests;
        if d.outcome == Outcome::Applied {
            d.applied = resolved.requests;
        }
        let notes = notes.join("; ");
        d.reason = Some(match d.reason.take() {
            Some(r) => format!("{r}; {notes}"),
            None => notes,
        });
        d
    }

    /// The guarded value of one dimension and, when a rule changed the request, why.
    fn guard_dimension(
        &self,
        d: Dimension,
        bounds: &Bounds,
        state: &GuardState,
        current: Resources,
        requested: Resources,
        now_ms: i64,
    ) -> (u64, Option<String>) {
        let cur = d.get(&current);
        let req = d.get(&requested);
        let (lo, hi) = d.bounds(bounds);
        let unit = d.unit();

        // Cooldown: keep the value in force (when it is within the bounds).
        let cooldown_ms = self.config.cooldown_ms(d);
        if req != cur && cooldown_ms > 0 && (lo..=hi).contains(&cur) {
            if let Some(last) = state.last_change(d, self.config.shared_vertical_cooldown) {
                let elapsed = now_ms.saturating_sub(last);
                if (0..i64::try_from(cooldown_ms).unwrap_or(i64::MAX)).contains(&elapsed) {
                    let left = cooldown_ms.saturating_sub(elapsed.unsigned_abs());
                    return (
                        cur,
                        Some(format!(
                            "{d}: cooldown, kept {cur}{unit} instead of {req}{unit} ({} ms left of {cooldown_ms} ms)",
                            left
                        )),
                    );
                }
            }
        }

        // Minimum change: a small move keeps the value in force (when it is known and within
        // the bounds).
        let min_change = self.config.min_change_ratio(d);
        if req != cur && min_change > 0.0 && cur > 0 && (lo..=hi).contains(&cur) {
            let change = req.abs_diff(cur) as f64 / cur as f64;
            if change < min_change {
                return (
                    cur,
                    Some(format!(
                        "{d}: below the minimum change, kept {cur}{unit} instead of {req}{unit} ({:.1}% < {:.1}%)",
                        change * 100.0,
                        min_change * 100.0
                    )),
                );
            }
        }

        // Step limit around the value in force (not for an unknown CPU/memory value of 0).
        let (up, down) = self.config.limits(d);
        let mut value = req;
        let mut note = None;
        if cur > 0 || d == Dimension::Replicas {
            let max_up = cur.saturating_add(up.allowance(cur, true));
            let max_down = cur.saturating_sub(down.allowance(cur, false));
            if req > max_up {
                value = max_up;
                note = Some(format!(
                    "{d}: step limit, {req}{unit} requested, at most {max_up}{unit} from {cur}{unit}"
                ));
            } else if req < max_down {
                value = max_down;
                note = Some(format!(
                    "{d}: step limit, {req}{unit} requested, at least {max_down}{unit} from {cur}{unit}"
                ));
            }
        }

        // Bounds, which win over the step limit.
        let bounded = value.clamp(lo, hi);
        if bounded != value {
            let which = if bounded == lo { "min" } else { "max" };
            let bound_note = format!(
                "{d}: {value}{unit} clamped to the {which} bound {bounded}{unit}{}",
                if value != req {
                    format!(" (requested {req}{unit})")
                } else {
                    String::new()
                }
            );
            note = Some(bound_note);
        }
        (bounded, note)
    }
}

fn rejected(current: Resources, reason: String) -> Decision {
    Decision {
        outcome: Outcome::Rejected,
        applied: current,
        recommended: current,
        clamped: Vec::new(),
        reason: Some(reason),
    }
}

fn show(r: &Resources) -> String {
    format!(
        "{} replicas, {}m CPU, {} B memory",
        r.replicas, r.cpu_millicores, r.memory_bytes
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_bus_schemas::Target;
    use proptest::prelude::*;

    fn spec() -> TargetSpec {
        TargetSpec::new(&Target::new("default", "web"))
    }

    fn res(replicas: u32, cpu: u32, mem_mib: u64) -> Resources {
        Resources {
            replicas,
            cpu_millicores: cpu,
            memory_bytes: mem_mib * MIB,
        }
    }

    fn guards() -> Guardrails {
        Guardrails::new(GuardrailConfig::default()).unwrap()
    }

    /// The defaults with the 60 s vertical cooldown a template-patching cluster wants.
    fn cooled() -> Guardrails {
        Guardrails::new(GuardrailConfig {
            cpu_cooldown_ms: 60_000,
            memory_cooldown_ms: 60_000,
            ..GuardrailConfig::default()
        })
        .unwrap()
    }

    const STEP: StepId = StepId {
        episode: 3,
        step: 10,
    };
    const NOW: i64 = 1_700_000_000_000;

    #[test]
    fn request_within_all_limits_is_applied_unchanged() {
        let cur = res(4, 1000, 1024);
        let req = res(6, 1200, 1280);
        let d = guards().decide(&spec(), &GuardState::default(), cur, STEP, req, NOW);
        assert_eq!(d.outcome, Outcome::Applied);
        assert_eq!(d.applied, req);
        assert_eq!(d.recommended, req);
        assert!(d.clamped.is_empty());
        assert_eq!(d.reason, None);
        assert!(d.changes(&cur));
        assert!(!d.changes(&req));
    }

    /// A request is never written above its limit: with `RequestsOnly` the workload's limits
    /// stay, so a request above one is lowered to it and reported; with `RequestsAndLimits`
    /// (limits scale with the requests) or no limit at all, nothing is lowered.
    #[test]
    fn requests_stay_within_the_limits_the_policy_keeps() {
        let cur = res(4, 1000, 1024);
        let req = res(4, 1400, 1500);
        let workload = ContainerResources {
            cpu_request_millicores: Some(1000),
            cpu_limit_millicores: Some(1200),
            memory_request_bytes: Some(1024 * MIB),
            memory_limit_bytes: Some(2048 * MIB),
        };
        let mut only = spec();
        only.limits.controlled_values = aware_shared::spec::ControlledValues::RequestsOnly;
        let d = guards().decide_within(
            &only,
            &GuardState::default(),
            cur,
            STEP,
            req,
            NOW,
            &workload,
        );
        assert_eq!(d.outcome, Outcome::Applied);
        assert_eq!(d.applied, res(4, 1200, 1500));
        assert_eq!(d.recommended, d.applied);
        assert_eq!(d.clamped, vec!["cpu"]);
        let reason = d.reason.unwrap();
        assert!(
            reason.contains("cpu: request 1400m lowered to the limit 1200m"),
            "{reason}"
        );
        // No CPU limit kept (removed by the policy): nothing to stay under.
        let mut unlimited = only.clone();
        unlimited.limits.cpu_limit = aware_shared::spec::CpuLimit::Unset;
        let d = guards().decide_within(
            &unlimited,
            &GuardState::default(),
            cur,
            STEP,
            req,
            NOW,
            &workload,
        );
        assert_eq!(d.applied, req);
        assert!(d.clamped.is_empty());
        // RequestsAndLimits: the limits follow the requests.
        let d = guards().decide_within(
            &spec(),
            &GuardState::default(),
            cur,
            STEP,
            req,
            NOW,
            &workload,
        );
        assert_eq!(d.applied, req);
        assert_eq!(d.reason, None);
        // Recommend-only: the recommendation is lowered, nothing applied.
        only.update_mode = UpdateMode::Off;
        let d = guards().decide_within(
            &only,
            &GuardState::default(),
            cur,
            STEP,
            req,
            NOW,
            &workload,
        );
        assert_eq!(d.outcome, Outcome::RecommendOnly);
        assert_eq!(d.applied, cur);
        assert_eq!(d.recommended, res(4, 1200, 1500));
        // A bound clamp and the limit on the same dimension: listed once.
        let d = guards().decide_within(
            &only,
            &GuardState::default(),
            res(4, 2000, 1024),
            STEP,
            res(4, 2900, 1024),
            NOW,
            &ContainerResources {
                cpu_limit_millicores: Some(1500),
                ..workload
            },
        );
        assert_eq!(d.recommended.cpu_millicores, 1500);
        assert_eq!(d.clamped, vec!["cpu"]);
    }

    #[test]
    fn bounds_clamp_each_dimension_and_are_reported() {
        // Current at the edges so the step limit allows reaching beyond the bounds.
        let cur = res(19, 2000, 3000);
        let req = res(30, 2900, 4000);
        let d = guards().decide(&spec(), &GuardState::default(), cur, STEP, req, NOW);
        assert_eq!(d.outcome, Outcome::Applied);
        assert_eq!(d.applied, res(20, 2048, 3072));
        assert_eq!(d.clamped, vec!["replicas", "cpu", "memory"]);
        let reason = d.reason.unwrap();
        assert!(
            reason.contains("replicas: 30 clamped to the max bound 20"),
            "{reason}"
        );
        assert!(reason.contains("cpu: 2900m clamped to the max bound 2048m"));
    }

    #[test]
    fn zero_and_absurd_requests_end_at_a_bound() {
        let cur = res(1, 128, 256);
        let zero = Resources {
            replicas: 0,
            cpu_millicores: 0,
            memory_bytes: 0,
        };
        let d = guards().decide(&spec(), &GuardState::default(), cur, STEP, zero, NOW);
        assert_eq!(d.applied, res(1, 128, 256));
        assert_eq!(d.clamped, vec!["replicas", "cpu", "memory"]);

        let absurd = Resources {
            replicas: u32::MAX,
            cpu_millicores: u32::MAX,
            memory_bytes: u64::MAX,
        };
        let top = res(20, 2048, 3072);
        let d = guards().decide(&spec(), &GuardState::default(), top, STEP, absurd, NOW);
        assert_eq!(d.applied, top);
        assert_eq!(d.clamped, vec!["replicas", "cpu", "memory"]);
    }

    #[test]
    fn replicas_up_limit_is_max_of_four_and_double() {
        let g = guards();
        let s = GuardState::default();
        // From 2: max(4, 2) = +4 → 6.
        let d = g.decide(&spec(), &s, res(2, 500, 512), STEP, res(20, 500, 512), NOW);
        assert_eq!(d.applied.replicas, 6);
        assert_eq!(d.clamped, vec!["replicas"]);
        assert!(d.reason.unwrap().contains("at most 6 from 2"));
        // From 8: max(4, 8) = +8 → 16.
        let d = g.decide(&spec(), &s, res(8, 500, 512), STEP, res(20, 500, 512), NOW);
        assert_eq!(d.applied.replicas, 16);
    }

    #[test]
    fn replicas_down_limit_is_half() {
        let g = guards();
        let s = GuardState::default();
        let d = g.decide(&spec(), &s, res(10, 500, 512), STEP, res(1, 500, 512), NOW);
        assert_eq!(d.applied.replicas, 5);
        assert_eq!(d.clamped, vec!["replicas"]);
        // From 3: floor(1.5) = 1 (min 1) → 2.
        let d = g.decide(&spec(), &s, res(3, 500, 512), STEP, res(1, 500, 512), NOW);
        assert_eq!(d.applied.replicas, 2);
    }

    #[test]
    fn cpu_and_memory_move_at_most_half_per_step() {
        let g = guards();
        let s = GuardState::default();
        let cur = res(2, 1000, 1024);
        let d = g.decide(&spec(), &s, cur, STEP, res(2, 2048, 3072), NOW);
        assert_eq!(d.applied, res(2, 1500, 1536));
        assert_eq!(d.clamped, vec!["cpu", "memory"]);
        let d = g.decide(&spec(), &s, cur, STEP, res(2, 128, 256), NOW);
        assert_eq!(d.applied, res(2, 500, 512));
        // Small values move by the absolute minimum: 128 m + max(100, 64) = 228 m.
        let d = g.decide(&spec(), &s, res(2, 128, 256), STEP, res(2, 1000, 256), NOW);
        assert_eq!(d.applied.cpu_millicores, 228);
    }

    #[test]
    fn bounds_win_over_step_limit_when_current_is_outside_them() {
        let g = guards();
        let cur = res(100, 8000, 10_000);
        let d = g.decide(
            &spec(),
            &GuardState::default(),
            cur,
            STEP,
            res(90, 7000, 9000),
            NOW,
        );
        assert_eq!(d.applied, res(20, 2048, 3072));
        assert_eq!(d.clamped, vec!["replicas", "cpu", "memory"]);
        let reason = d.reason.unwrap();
        assert!(
            reason.contains("replicas: 90 clamped to the max bound 20"),
            "{reason}"
        );
    }

    #[test]
    fn unknown_vertical_value_has_no_step_limit() {
        let cur = Resources {
            replicas: 2,
            cpu_millicores: 0,
            memory_bytes: 0,
        };
        let d = guards().decide(
            &spec(),
            &GuardState::default(),
            cur,
            STEP,
            res(2, 1500, 2048),
            NOW,
        );
        assert_eq!(d.applied, res(2, 1500, 2048));
        assert!(d.clamped.is_empty());
    }

    #[test]
    fn vertical_cooldown_holds_cpu_and_memory_but_not_replicas() {
        let g = cooled();
        let cur = res(2, 1000, 1024);
        let mut s = GuardState::default();
        s.record(
            StepId {
                episode: 3,
                step: 9,
            },
            res(2, 900, 1024),
            cur,
            NOW - 30_000,
        );
        let req = res(3, 1200, 1200);
        let d = g.decide(&spec(), &s, cur, STEP, req, NOW);
        assert_eq!(d.outcome, Outcome::Applied);
        assert_eq!(d.applied, res(3, 1000, 1024));
        assert_eq!(d.clamped, vec!["cpu", "memory"]);
        let reason = d.reason.unwrap();
        assert!(reason.contains("cpu: cooldown"), "{reason}");
        assert!(reason.contains("30000 ms left of 60000 ms"), "{reason}");
        assert!(reason.contains("memory: cooldown"), "{reason}");

        // After the cooldown the change passes.
        let d = g.decide(&spec(), &s, cur, STEP, req, NOW + 30_000);
        assert_eq!(d.applied, req);
        assert!(d.clamped.is_empty());

        // The default has no vertical cooldown (in-place resize restarts nothing).
        let d = guards().decide(&spec(), &s, cur, STEP, req, NOW);
        assert_eq!(d.applied, req);
        assert!(d.clamped.is_empty());
    }

    #[test]
    fn vertical_changes_below_the_minimum_change_keep_the_value_in_force() {
        let cfg = GuardrailConfig {
            cpu_min_change_ratio: 0.1,
            memory_min_change_ratio: 0.05,
            cpu_cooldown_ms: 0,
            memory_cooldown_ms: 0,
            ..GuardrailConfig::default()
        };
        let g = Guardrails::new(cfg).unwrap();
        let cur = res(2, 1000, 1000);
        let s = GuardState::default();
        // CPU +9.9% and memory −4.9%: both held; replicas always move.
        let d = g.decide(&spec(), &s, cur, STEP, res(3, 1099, 951), NOW);
        assert_eq!(d.outcome, Outcome::Applied);
        assert_eq!(d.applied, res(3, 1000, 1000));
        assert_eq!(d.clamped, vec!["cpu", "memory"]);
        let reason = d.reason.unwrap();
        assert!(
            reason.contains(
                "cpu: below the minimum change, kept 1000m instead of 1099m (9.9% < 10.0%)"
            ),
            "{reason}"
        );
        assert!(
            reason.contains("memory: below the minimum change"),
            "{reason}"
        );
        // At the threshold the change applies: CPU +10%, memory −5%.
        let d = g.decide(&spec(), &s, cur, STEP, res(2, 1100, 950), NOW);
        assert_eq!(d.applied, res(2, 1100, 950));
        assert!(d.clamped.is_empty(), "{:?}", d.reason);
        // A value in force outside the bounds is corrected however small the move.
        let mut tight = spec();
        tight.bounds.max_cpu_millicores = 990;
        let d = g.decide(&tight, &s, cur, STEP, res(2, 995, 1000), NOW);
        assert_eq!(d.applied.cpu_millicores, 990);
        // The default applies every change.
        let d = guards().decide(&spec(), &s, cur, STEP, res(2, 1001, 1000), NOW);
        assert_eq!(d.applied, res(2, 1001, 1000));
        // Out of range is refused, naming the key.
        for bad in [1.0, -0.1, f64::NAN] {
            let err = Guardrails::new(GuardrailConfig {
                memory_min_change_ratio: bad,
                ..GuardrailConfig::default()
            })
            .unwrap_err();
            assert!(
                err.to_string()
                    .contains("guardrails.memory_min_change_ratio"),
                "{err}"
            );
        }
    }

    #[test]
    fn separate_vertical_cooldowns_when_not_shared() {
        let cfg = GuardrailConfig {
            shared_vertical_cooldown: false,
            cpu_cooldown_ms: 60_000,
            memory_cooldown_ms: 60_000,
            ..GuardrailConfig::default()
        };
        let g = Guardrails::new(cfg).unwrap();
        let cur = res(2, 1000, 1024);
        let mut s = GuardState::default();
        s.record(
            StepId {
                episode: 3,
                step: 9,
            },
            res(2, 900, 1024),
            cur,
            NOW - 1000,
        );
        let d = g.decide(&spec(), &s, cur, STEP, res(2, 1200, 1200), NOW);
        assert_eq!(d.applied, res(2, 1000, 1200));
        assert_eq!(d.clamped, vec!["cpu"]);
    }

    #[test]
    fn replica_cooldown_when_configured() {
        let cfg = GuardrailConfig {
            replicas_cooldown_ms: 10_000,
            ..GuardrailConfig::default()
        };
        let g = Guardrails::new(cfg).unwrap();
        let cur = res(4, 1000, 1024);
        let mut s = GuardState::default();
        s.record(
            StepId {
                episode: 3,
                step: 9,
            },
            res(3, 1000, 1024),
            cur,
            NOW - 5000,
        );
        let d = g.decide(&spec(), &s, cur, STEP, res(6, 1000, 1024), NOW);
        assert_eq!(d.applied.replicas, 4);
        assert_eq!(d.clamped, vec!["replicas"]);
        let d = g.decide(&spec(), &s, cur, STEP, res(6, 1000, 1024), NOW + 5000);
        assert_eq!(d.applied.replicas, 6);
    }

    #[test]
    fn clock_going_backwards_ends_the_cooldown() {
        let g = cooled();
        let cur = res(2, 1000, 1024);
        let mut s = GuardState::default();
        s.record(
            StepId {
                episode: 3,
                step: 9,
            },
            res(2, 900, 1024),
            cur,
            NOW,
        );
        let d = g.decide(&spec(), &s, cur, STEP, res(2, 1200, 1024), NOW - 1);
        assert_eq!(d.applied.cpu_millicores, 1200);
    }

    #[test]
    fn recommend_only_applies_nothing_and_reports_the_recommendation() {
        let mut sp = spec();
        sp.update_mode = UpdateMode::Off;
        let cur = res(2, 1000, 1024);
        let d = guards().decide(
            &sp,
            &GuardState::default(),
            cur,
            STEP,
            res(50, 1200, 1024),
            NOW,
        );
        assert_eq!(d.outcome, Outcome::RecommendOnly);
        assert_eq!(d.applied, cur);
        assert_eq!(d.recommended, res(6, 1200, 1024));
        assert_eq!(d.clamped, vec!["replicas"]);
        assert!(!d.changes(&cur));
        let reason = d.reason.unwrap();
        assert!(
            reason.starts_with("recommend-only (update mode Off)"),
            "{reason}"
        );
        assert!(reason.contains("replicas: step limit"), "{reason}");
    }

    #[test]
    fn stale_and_duplicate_steps_are_rejected() {
        let g = guards();
        let cur = res(2, 1000, 1024);
        let mut s = GuardState::default();
        s.record(STEP, res(1, 1000, 1024), cur, NOW);
        for (step, what) in [
            (
                StepId {
                    episode: 3,
                    step: 9,
                },
                "stale action: episode 3 step 9 is older than the last applied episode 3 step 10",
            ),
            (
                StepId {
                    episode: 2,
                    step: 99,
                },
                "stale action",
            ),
            (
                STEP,
                "duplicate action: episode 3 step 10 was already applied",
            ),
        ] {
            let d = g.decide(&spec(), &s, cur, step, res(3, 1000, 1024), NOW + 1);
            assert_eq!(d.outcome, Outcome::Rejected, "{step}");
            assert_eq!(d.applied, cur);
            assert!(d.reason.unwrap().starts_with(what));
        }
        // The next step of the episode and the first of the next episode pass.
        for step in [
            StepId {
                episode: 3,
                step: 11,
            },
            StepId {
                episode: 4,
                step: 0,
            },
        ] {
            let d = g.decide(&spec(), &s, cur, step, res(3, 1000, 1024), NOW + 1);
            assert_eq!(d.outcome, Outcome::Applied, "{step}");
            assert_eq!(d.applied.replicas, 3);
        }
    }

    #[test]
    fn stale_check_precedes_recommend_only() {
        let mut sp = spec();
        sp.update_mode = UpdateMode::Off;
        let mut s = GuardState::default();
        s.record(STEP, res(2, 1000, 1024), res(2, 1000, 1024), NOW);
        let d = guards().decide(
            &sp,
            &s,
            res(2, 1000, 1024),
            StepId {
                episode: 1,
                step: 0,
            },
            res(3, 1000, 1024),
            NOW,
        );
        assert_eq!(d.outcome, Outcome::Rejected);
    }

    #[test]
    fn invalid_bounds_are_rejected_not_panicking() {
        let mut sp = spec();
        sp.bounds.min_replicas = 10;
        sp.bounds.max_replicas = 2;
        let cur = res(2, 1000, 1024);
        let d = guards().decide(
            &sp,
            &GuardState::default(),
            cur,
            STEP,
            res(3, 1000, 1024),
            NOW,
        );
        assert_eq!(d.outcome, Outcome::Rejected);
        assert_eq!(d.applied, cur);
        assert!(d
            .reason
            .unwrap()
            .contains("invalid bounds for the target: min_replicas: 10 above max_replicas 2"));
    }

    #[test]
    fn record_keeps_the_latest_step_and_changed_dimensions_only() {
        let mut s = GuardState::default();
        s.record(STEP, res(2, 1000, 1024), res(3, 1000, 1024), NOW);
        assert_eq!(s.last_applied, Some(STEP));
        assert_eq!(s.last_change_ms, [Some(NOW), None, None]);
        let older = StepId {
            episode: 1,
            step: 0,
        };
        s.record(older, res(3, 1000, 1024), res(3, 1000, 2048), NOW + 5);
        assert_eq!(s.last_applied, Some(STEP));
        assert_eq!(s.last_change_ms, [Some(NOW), None, Some(NOW + 5)]);
    }

    /// Bounds above the actuator's ceilings (a forged or careless registration) are lowered to
    /// them: the request is clamped to the ceiling, never beyond; a minimum above a ceiling
    /// comes down with it. A zero ceiling is refused naming its key.
    #[test]
    fn bounds_are_capped_by_the_ceilings() {
        let cfg = GuardrailConfig {
            max_replicas: 50,
            max_cpu_millicores: 4000,
            max_memory_bytes: 8192 * MIB,
            ..GuardrailConfig::default()
        };
        let g = Guardrails::new(cfg).unwrap();
        let mut wide = spec();
        wide.bounds = Bounds {
            min_replicas: 1,
            max_replicas: 10_000,
            min_cpu_millicores: 100,
            max_cpu_millicores: 1_000_000,
            min_memory_bytes: MIB,
            max_memory_bytes: u64::MAX,
        };
        let cur = res(40, 3000, 6000);
        let d = g.decide(
            &wide,
            &GuardState::default(),
            cur,
            STEP,
            res(10_000, 1_000_000, 1 << 40),
            NOW,
        );
        assert_eq!(d.outcome, Outcome::Applied);
        assert_eq!(d.applied, res(50, 4000, 8192));
        assert_eq!(d.clamped, vec!["replicas", "cpu", "memory"]);
        assert!(d
            .reason
            .unwrap()
            .contains("replicas: 80 clamped to the max bound 50"),);
        // A minimum above the ceiling comes down with it.
        wide.bounds.min_replicas = 200;
        let d = g.decide(
            &wide,
            &GuardState::default(),
            cur,
            STEP,
            res(1, 3000, 6000),
            NOW,
        );
        assert_eq!(d.applied.replicas, 50);
        // Bounds within the ceilings are untouched.
        let b = Bounds::default();
        assert_eq!(g.config().capped(&b), b);
        // The defaults: 1000 replicas, 64 cores, 256 GiB.
        let d = GuardrailConfig::default();
        assert_eq!(
            (d.max_replicas, d.max_cpu_millicores, d.max_memory_bytes),
            (1000, 64_000, 256 << 30)
        );
        for (bad, key) in [
            (
                GuardrailConfig {
                    max_replicas: 0,
                    ..GuardrailConfig::default()
                },
                "guardrails.max_replicas",
            ),
            (
                GuardrailConfig {
                    max_memory_bytes: 0,
                    ..GuardrailConfig::default()
                },
                "guardrails.max_memory_bytes",
            ),
        ] {
            let e = Guardrails::new(bad).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn config_validation_and_deserialization() {
        assert!(GuardrailConfig::default().validate().is_ok());
        let bad = GuardrailConfig {
            cpu_up_ratio: f64::NAN,
            ..GuardrailConfig::default()
        };
        assert!(matches!(
            Guardrails::new(bad),
            Err(GuardrailConfigError::InvalidRatio {
                dimension: Dimension::Cpu,
                direction: "up",
                ..
            })
        ));
        let bad = GuardrailConfig {
            replicas_up_ratio: -1.0,
            ..GuardrailConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = GuardrailConfig {
            memory_down_ratio: 1.5,
            ..GuardrailConfig::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "guardrails.memory_down_ratio is 1.5: a decrease cannot exceed 1 (100 %)"
        );

        // A partial configuration keeps the defaults of the other fields.
        let cfg: GuardrailConfig = serde_json::from_value(serde_json::json!({
            "replicas_up_ratio": 2.0,
            "cpu_cooldown_ms": 1000
        }))
        .unwrap();
        let expected = GuardrailConfig {
            replicas_up_ratio: 2.0,
            cpu_cooldown_ms: 1000,
            ..GuardrailConfig::default()
        };
        assert_eq!(cfg, expected);
        assert!(serde_json::from_value::<GuardrailConfig>(serde_json::json!({"typo": 1})).is_err());
    }

    fn arb_resources() -> impl Strategy<Value = Resources> {
        (
            prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>(), 0u32..64],
            prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>(), 0u32..4096],
            prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>(), 0u64..(8 << 30)],
        )
            .prop_map(|(replicas, cpu_millicores, memory_bytes)| Resources {
                replicas,
                cpu_millicores,
                memory_bytes,
            })
    }

    fn in_bounds(b: &Bounds) -> impl Strategy<Value = Resources> {
        (
            b.min_replicas..=b.max_replicas,
            b.min_cpu_millicores..=b.max_cpu_millicores,
            b.min_memory_bytes..=b.max_memory_bytes,
        )
            .prop_map(|(replicas, cpu_millicores, memory_bytes)| Resources {
                replicas,
                cpu_millicores,
                memory_bytes,
            })
    }

    /// The allowed window of `d` around `cur` under the default config.
    fn window(d: Dimension, cur: &Resources) -> (u64, u64) {
        let (up, down) = GuardrailConfig::default().limits(d);
        let c = d.get(cur);
        (
            c.saturating_sub(down.allowance(c, false)),
            c.saturating_add(up.allowance(c, true)),
        )
    }

    proptest! {
        #[test]
        fn applied_is_within_bounds_and_step_of_current(
            cur in in_bounds(&Bounds::default()),
            req in arb_resources(),
        ) {
            let b = Bounds::default();
            let d = guards().decide(&spec(), &GuardState::default(), cur, STEP, req, NOW);
            prop_assert_eq!(d.outcome, Outcome::Applied);
            let a = d.applied;
            prop_assert!((b.min_replicas..=b.max_replicas).contains(&a.replicas));
            prop_assert!((b.min_cpu_millicores..=b.max_cpu_millicores).contains(&a.cpu_millicores));
            prop_assert!((b.min_memory_bytes..=b.max_memory_bytes).contains(&a.memory_bytes));
            // Relative step: replicas at most double (+4) / halve, CPU and memory ±50 % (or the
            // absolute minimum step).
            prop_assert!(a.replicas <= (cur.replicas * 2).max(cur.replicas + 4));
            prop_assert!(a.replicas >= cur.replicas.div_ceil(2).min(cur.replicas.saturating_sub(1)).max(b.min_replicas));
            prop_assert!(u64::from(a.cpu_millicores) <= (u64::from(cur.cpu_millicores) * 3).div_ceil(2).max(u64::from(cur.cpu_millicores) + 100));
            prop_assert!(u64::from(a.cpu_millicores) * 2 >= u64::from(cur.cpu_millicores).min(2 * u64::from(cur.cpu_millicores).saturating_sub(100)));
            prop_assert!(a.memory_bytes <= (cur.memory_bytes * 3).div_ceil(2).max(cur.memory_bytes + 128 * MIB));
            prop_assert!(a.memory_bytes * 2 >= cur.memory_bytes.min(2 * cur.memory_bytes.saturating_sub(128 * MIB)));
            // Every dimension that differs from the request is reported.
            for dim in Dimension::ALL {
                let changed = dim.get(&a) != dim.get(&req);
                prop_assert_eq!(changed, d.clamped.contains(&dim.as_str().to_string()), "{}", dim);
            }
        }

        #[test]
        fn bounds_always_hold_and_step_holds_when_reachable(
            cur in arb_resources(),
            req in arb_resources(),
            lo in (1u32..30, 1u32..3000, 1u64..(4 << 30)),
            span in (0u32..30, 0u32..3000, 0u64..(4 << 30)),
        ) {
            let mut sp = spec();
            sp.bounds = Bounds {
                min_replicas: lo.0,
                max_replicas: lo.0 + span.0,
                min_cpu_millicores: lo.1,
                max_cpu_millicores: lo.1 + span.1,
                min_memory_bytes: lo.2,
                max_memory_bytes: lo.2 + span.2,
            };
            let d = guards().decide(&sp, &GuardState::default(), cur, STEP, req, NOW);
            for dim in Dimension::ALL {
                let (blo, bhi) = dim.bounds(&sp.bounds);
                let v = dim.get(&d.applied);
                prop_assert!(blo <= v && v <= bhi, "{} {} not in [{}, {}]", dim, v, blo, bhi);
                let unknown = dim != Dimension::Replicas && dim.get(&cur) == 0;
                let (wlo, whi) = window(dim, &cur);
                if !unknown && wlo <= bhi && blo <= whi {
                    prop_assert!(wlo <= v && v <= whi, "{} {} not in step window [{}, {}]", dim, v, wlo, whi);
                }
            }
        }
    }
}
