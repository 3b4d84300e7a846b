//! Leader election on a `coordination.k8s.io/v1` Lease, so that two controller replicas never
//! reconcile at once and a standby takes over when the leader dies.
//!
//! The decision is pure ([`decide`], [`Observation`]): given the Lease record last read, when this
//! candidate first saw that record, the time now and its own identity, it creates, acquires,
//! renews or waits. As in client-go, expiry is judged by how long the record has stayed unchanged
//! as observed locally (monotonic clock), never by comparing the holder's `renewTime` with the
//! local wall clock, so clock skew between nodes cannot hand the lease to two holders.
//!
//! [`Elector`] is the thin async loop around it: it reads the Lease and writes it with the read
//! `resourceVersion` (create when absent), so a 409 Conflict means another candidate won the race.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// When leader election is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// On when the controller runs in a cluster (`KUBERNETES_SERVICE_HOST` set), off otherwise.
    Auto,
    On,
    Off,
}

/// The `[controller.leader_election]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaderElectionConfig {
    pub mode: Mode,
    /// Name of the Lease.
    pub lease_name: String,
    /// Namespace of the Lease; unset: the `POD_NAMESPACE` environment variable.
    pub lease_namespace: Option<String>,
    /// This candidate's identity in the Lease; unset: `POD_NAME`, else hostname and pid.
    pub identity: Option<String>,
    /// How long a record must stay unchanged before a standby takes the lease.
    pub lease_duration_ms: u64,
    /// The leader gives up (and the process exits) when it could not renew for this long.
    pub renew_deadline_ms: u64,
    /// Interval between attempts to acquire or renew.
    pub retry_period_ms: u64,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            mode: Mode::Auto,
            lease_name: "aware-controller".into(),
            lease_namespace: None,
            identity: None,
            lease_duration_ms: 10_000,
            renew_deadline_ms: 7_000,
            retry_period_ms: 2_000,
        }
    }
}

impl LeaderElectionConfig {
    /// `(key, reason)` of the first bad value (keys below `controller.leader_election`).
    pub fn problem(&self) -> Option<(&'static str, &'static str)> {
        if self.lease_name.is_empty() {
            return Some(("lease_name", "must not be empty"));
        }
        if self.lease_namespace.as_deref() == Some("") {
            return Some(("lease_namespace", "must not be empty when set"));
        }
        if self.identity.as_deref() == Some("") {
            return Some(("identity", "must not be empty when set"));
        }
        if self.retry_period_ms == 0 {
            return Some(("retry_period_ms", "must be at least 1"));
        }
        if self.renew_deadline_ms <= self.retry_period_ms {
            return Some(("renew_deadline_ms", "must exceed retry_period_ms"));
        }
        if self.lease_duration_ms <= self.renew_deadline_ms {
            return Some((
                "lease_duration_ms",
                "must exceed renew_deadline_ms (a leader must give up before a standby may take over)",
            ));
        }
        if self.lease_duration_ms < 1000 {
            return Some((
                "lease_duration_ms",
                "must be at least 1000 (the Lease stores whole seconds)",
            ));
        }
        None
    }

    /// Whether election runs, `Auto` resolved by whether the process runs in a cluster.
    pub fn enabled(&self) -> bool {
        match self.mode {
            Mode::On => true,
            Mode::Off => false,
            Mode::Auto => std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
        }
    }

    /// The Lease's namespace: the setting, else `POD_NAMESPACE`.
    pub fn namespace(&self) -> Option<String> {
        self.lease_namespace.clone().or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|s| !s.is_empty())
        })
    }

    /// This candidate's identity: the setting, else `POD_NAME`, else hostname and pid.
    pub fn identity(&self) -> String {
        if let Some(id) = &self.identity {
            return id.clone();
        }
        if let Some(pod) = std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()) {
            return pod;
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "unknown".into());
        format!("{host}_{}", std::process::id())
    }

    pub fn lease_duration(&self) -> Duration {
        Duration::from_millis(self.lease_duration_ms)
    }
    pub fn renew_deadline(&self) -> Duration {
        Duration::from_millis(self.renew_deadline_ms)
    }
    pub fn retry_period(&self) -> Duration {
        Duration::from_millis(self.retry_period_ms)
    }
}

/// What a candidate does after reading the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No Lease exists: create it with this candidate as holder.
    Create,
    /// Take over a released or expired lease.
    Acquire,
    /// This candidate holds the lease: renew it.
    Renew,
    /// Another candidate holds a live lease; it expires (as observed here) after this long.
    Wait(Duration),
}

/// The Lease record as last read and when this candidate first saw it in that state.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub record: LeaseSpec,
    pub since: Instant,
}

/// Folds a read into the last observation: the observation time moves only when the record
/// changed (a renewal by the holder changes `renewTime`), so an unchanged record ages.
pub fn observe(
    last: Option<Observation>,
    read: Option<&LeaseSpec>,
    now: Instant,
) -> Option<Observation> {
    let read = read?;
    match last {
        Some(o) if &o.record == read => Some(o),
        _ => Some(Observation {
            record: read.clone(),
            since: now,
        }),
    }
}

/// The decision for candidate `me`: `observed` is `None` when no Lease exists; the record's own
/// `leaseDurationSeconds` wins over `default_duration` (the holder states how long it may be
/// silent).
pub fn decide(
    observed: Option<&Observation>,
    now: Instant,
    me: &str,
    default_duration: Duration,
) -> Decision {
    let Some(o) = observed else {
        return Decision::Create;
    };
    let holder = o.record.holder_identity.as_deref().unwrap_or("");
    if holder.is_empty() {
        return Decision::Acquire;
    }
    if holder == me {
        return Decision::Renew;
    }
    let duration = o
        .record
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(default_duration, Duration::from_secs);
    let age = now.saturating_duration_since(o.since);
    if age >= duration {
        Decision::Acquire
    } else {
        Decision::Wait(duration - age)
    }
}

/// The record a candidate writes for `decision` over `previous` (the record read).
pub fn next_record(
    decision: &Decision,
    previous: Option<&LeaseSpec>,
    me: &str,
    duration: Duration,
    wall_now: k8s_openapi::jiff::Timestamp,
) -> Option<LeaseSpec> {
    let seconds = i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let now = Some(MicroTime(wall_now));
    match decision {
        Decision::Create => Some(LeaseSpec {
            holder_identity: Some(me.into()),
            lease_duration_seconds: Some(seconds),
            acquire_time: now.clone(),
            renew_time: now,
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
        Decision::Acquire => {
            let prev = previous.cloned().unwrap_or_default();
            let transitions = prev.lease_transitions.unwrap_or(0);
            // As client-go: a transition whenever the previous holder is not this candidate.
            let changed = prev.holder_identity.as_deref() != Some(me);
            Some(LeaseSpec {
                holder_identity: Some(me.into()),
                lease_duration_seconds: Some(seconds),
                acquire_time: now.clone(),
                renew_time: now,
                lease_transitions: Some(if changed {
                    transitions.saturating_add(1)
                } else {
                    transitions
                }),
                ..prev
            })
        }
        Decision::Renew => {
            let prev = previous.cloned().unwrap_or_default();
            Some(LeaseSpec {
                lease_duration_seconds: Some(seconds),
                renew_time: now,
                ..prev
            })
        }
        Decision::Wait(_) => None,
    }
}

/// The record a leader writes to give the lease up at once (client-go's release: no holder, a
/// one-second duration).
pub fn released(previous: &LeaseSpec, wall_now: k8s_openapi::jiff::Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(MicroTime(wall_now)),
        ..previous.clone()
    }
}

#[derive(Debug, Error)]
pub enum LeaderError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("lost the lease {namespace}/{name}: not renewed within {deadline_ms} ms")]
    Lost {
        namespace: String,
        name: String,
        deadline_ms: u64,
    },
}

/// The async candidate: reads and writes one Lease.
pub struct Elector {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    config: LeaderElectionConfig,
    observed: Option<Observation>,
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl Elector {
    pub fn new(
        client: Client,
        namespace: String,
        identity: String,
        config: LeaderElectionConfig,
    ) -> Self {
        Elector {
            api: Api::namespaced(client, &namespace),
            namespace,
            name: config.lease_name.clone(),
            identity,
            config,
            observed: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One round: read, decide, write. `Ok(true)`: this candidate holds the lease now.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, LeaderError> {
        let read = self.api.get_opt(&self.name).await?;
        let now = Instant::now();
        let spec = read.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        self.observed = observe(self.observed.take(), spec.as_ref(), now);
        let decision = decide(
            self.observed.as_ref(),
            now,
            &self.identity,
            self.config.lease_duration(),
        );
        let Some(record) = next_record(
            &decision,
            spec.as_ref(),
            &self.identity,
            self.config.lease_duration(),
            k8s_openapi::jiff::Timestamp::now(),
        ) else {
            return Ok(false);
        };
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version: read
                    .as_ref()
                    .and_then(|l| l.metadata.resource_version.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(record.clone()),
        };
        let written = match decision {
            Decision::Create => self.api.create(&PostParams::default(), &lease).await,
            _ => {
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(_) => {
                if decision == Decision::Acquire || decision == Decision::Create {
                    tracing::info!(lease = %self.name, namespace = %self.namespace, identity = %self.identity, "acquired the lease");
                }
                self.observed = Some(Observation {
                    record,
                    since: Instant::now(),
                });
                Ok(true)
            }
            // Another candidate wrote first (create: it exists; replace: stale resourceVersion).
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Tries every retry period until this candidate leads; `false` when `shutdown` came first.
    pub async fn acquire(&mut self, shutdown: &CancellationToken) -> bool {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return true,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "leader election: reading or writing the lease failed; retrying")
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep(self.config.retry_period()) => {}
            }
        }
    }

    /// Renews every retry period for as long as it can; returns the error once no renewal
    /// succeeded within the renew deadline (or another candidate took the lease). Runs until
    /// dropped otherwise.
    pub async fn hold(&mut self) -> LeaderError {
        let mut last_renewal = Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period()).await;
            let left = self
                .config
                .renew_deadline()
                .saturating_sub(last_renewal.elapsed());
            let outcome = tokio::time::timeout(left, self.try_acquire_or_renew()).await;
            match outcome {
                Ok(Ok(true)) => last_renewal = Instant::now(),
                Ok(Ok(false)) => {
                    tracing::warn!(lease = %self.name, "another candidate holds the lease");
                    return self.lost();
                }
                Ok(Err(e)) => {
                    tracing::warn!(lease = %self.name, error = %e, "renewing the lease failed")
                }
                Err(_) => {}
            }
            if last_renewal.elapsed() >= self.config.renew_deadline() {
                return self.lost();
            }
        }
    }

    fn lost(&self) -> LeaderError {
        LeaderError::Lost {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            deadline_ms: self.config.renew_deadline_ms,
        }
    }

    /// Gives the lease up if this candidate still holds it, so a standby acquires it at its next
    /// attempt instead of waiting for expiry.
    pub async fn release(&mut self) -> Result<(), LeaderError> {
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        let mut out = lease;
        out.spec = Some(released(&spec, k8s_openapi::jiff::Timestamp::now()));
        self.api
            .replace(&self.name, &PostParams::default(), &out)
            .await?;
        tracing::info!(lease = %self.name, namespace = %self.namespace, identity = %self.identity, "released the lease");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(10);

    fn held_by(who: &str, secs: Option<i32>, renew_s: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(who.into()),
            lease_duration_seconds: secs,
            renew_time: Some(MicroTime(
                k8s_openapi::jiff::Timestamp::from_second(renew_s).unwrap(),
            )),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn no_lease_is_created() {
        assert_eq!(decide(None, Instant::now(), "a", D), Decision::Create);
    }

    #[test]
    fn own_lease_is_renewed_and_a_released_one_acquired() {
        let t0 = Instant::now();
        let o = observe(None, Some(&held_by("a", Some(10), 100)), t0).unwrap();
        assert_eq!(decide(Some(&o), t0, "a", D), Decision::Renew);
        let mut free = held_by("a", Some(1), 100);
        free.holder_identity = None;
        let o = observe(None, Some(&free), t0).unwrap();
        assert_eq!(decide(Some(&o), t0, "b", D), Decision::Acquire);
        free.holder_identity = Some(String::new());
        let o = observe(None, Some(&free), t0).unwrap();
        assert_eq!(decide(Some(&o), t0, "b", D), Decision::Acquire);
    }

    #[test]
    fn a_live_lease_of_another_waits_until_unchanged_for_its_duration() {
        let t0 = Instant::now();
        let rec = held_by("a", Some(10), 100);
        let o = observe(None, Some(&rec), t0);
        let o = observe(o, Some(&rec), t0 + Duration::from_secs(4)).unwrap();
        assert_eq!(
            o.since, t0,
            "an unchanged record keeps its first observation time"
        );
        assert_eq!(
            decide(Some(&o), t0 + Duration::from_secs(4), "b", D),
            Decision::Wait(Duration::from_secs(6))
        );
        assert_eq!(
            decide(Some(&o), t0 + Duration::from_secs(10), "b", D),
            Decision::Acquire
        );
    }

    #[test]
    fn a_renewal_restarts_the_expiry_whatever_the_renew_time_says() {
        let t0 = Instant::now();
        // renewTime far in the past by the local clock: not what expiry is judged by.
        let o = observe(None, Some(&held_by("a", Some(10), 1)), t0);
        let t1 = t0 + Duration::from_secs(8);
        let o = observe(o, Some(&held_by("a", Some(10), 2)), t1).unwrap();
        assert_eq!(o.since, t1);
        assert_eq!(
            decide(Some(&o), t0 + Duration::from_secs(12), "b", D),
            Decision::Wait(Duration::from_secs(6))
        );
        assert_eq!(
            decide(Some(&o), t1 + Duration::from_secs(10), "b", D),
            Decision::Acquire
        );
    }

    #[test]
    fn the_records_duration_wins_over_the_local_default() {
        let t0 = Instant::now();
        let o = observe(None, Some(&held_by("a", Some(30), 1)), t0).unwrap();
        assert_eq!(
            decide(Some(&o), t0 + Duration::from_secs(15), "b", D),
            Decision::Wait(Duration::from_secs(15))
        );
        let o = observe(None, Some(&held_by("a", None, 1)), t0).unwrap();
        assert_eq!(
            decide(Some(&o), t0 + Duration::from_secs(10), "b", D),
            Decision::Acquire
        );
    }

    #[test]
    fn written_records_carry_holder_times_and_transitions() {
        let now = k8s_openapi::jiff::Timestamp::from_second(1000).unwrap();
        let c = next_record(&Decision::Create, None, "a", D, now).unwrap();
        assert_eq!(c.holder_identity.as_deref(), Some("a"));
        assert_eq!(c.lease_duration_seconds, Some(10));
        assert_eq!(c.lease_transitions, Some(0));
        assert_eq!(c.acquire_time, Some(MicroTime(now)));
        let later = k8s_openapi::jiff::Timestamp::from_second(1002).unwrap();
        let r = next_record(&Decision::Renew, Some(&c), "a", D, later).unwrap();
        assert_eq!(
            r.acquire_time,
            Some(MicroTime(now)),
            "renewal keeps the acquire time"
        );
        assert_eq!(r.renew_time, Some(MicroTime(later)));
        assert_eq!(r.lease_transitions, Some(0));
        let b = next_record(&Decision::Acquire, Some(&r), "b", D, later).unwrap();
        assert_eq!(b.holder_identity.as_deref(), Some("b"));
        assert_eq!(b.lease_transitions, Some(1));
        let rel = released(&b, later);
        assert_eq!(rel.holder_identity, None);
        assert_eq!(rel.lease_duration_seconds, Some(1));
        let again = next_record(&Decision::Acquire, Some(&rel), "b", D, later).unwrap();
        assert_eq!(again.lease_transitions, Some(2));
        assert_eq!(
            next_record(&Decision::Wait(D), Some(&r), "b", D, later),
            None
        );
    }

    #[test]
    fn settings_are_validated() {
        let ok = LeaderElectionConfig::default();
        assert_eq!(ok.problem(), None);
        let bad = LeaderElectionConfig {
            renew_deadline_ms: 10_000,
            ..ok.clone()
        };
        assert_eq!(bad.problem().map(|p| p.0), Some("lease_duration_ms"));
        let bad = LeaderElectionConfig {
            retry_period_ms: 7_000,
            ..ok.clone()
        };
        assert_eq!(bad.problem().map(|p| p.0), Some("renew_deadline_ms"));
        let bad = LeaderElectionConfig {
            lease_name: String::new(),
            ..ok.clone()
        };
        assert_eq!(bad.problem().map(|p| p.0), Some("lease_name"));
        let on = LeaderElectionConfig {
            mode: Mode::On,
            identity: Some("me".into()),
            ..ok
        };
        assert!(on.enabled());
        assert_eq!(on.identity(), "me");
    }
}
