//! The bridge between the simulated workloads and a real control plane: the simulator plays the
//! performance of each Deployment with the allocation the API server holds for it.
//!
//! [`DeploymentBridge`] watches the Deployments of the simulator's targets (same namespace and
//! name) on the API server and, whenever one changes and after every simulated step, submits
//! what the server holds — `spec.replicas` and the managed container's requests — to the
//! simulator as that target's allocation for its next step. The simulator never learns an
//! allocation from the bus: what the actuator decided reaches the simulated pods only through
//! the Deployment objects it wrote. Every version of each Deployment the watch delivered is kept
//! (resourceVersion, generation, allocation, when it arrived), so a test can compare the
//! actuator's decisions with what the server held.
//!
//! The allocation is the container's requests (a missing request is its limit, as Kubernetes
//! reads it): the simulator's allocation, like the actuator's `Resources`, is the per-replica CPU
//! and memory request. The limits, which the actuator scales with the requests, are recorded
//! too; the simulator derives its own from the requests by its limits policy (by default equal
//! to them), so a template whose limits are above its requests runs at its requests there.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use aware_bus_schemas::Resources;
use aware_loadgen::env::TargetAction;
use aware_loadgen::wallclock::SimHandle;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::Api;
use kube::runtime::watcher;

/// Why the bridge cannot start or read a Deployment.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("simulator: {0}")]
    Sim(#[from] aware_loadgen::error::SimError),
    #[error("deployment {target}: {why}")]
    Unreadable { target: String, why: String },
    #[error("the bridge's state lock was poisoned")]
    Poisoned,
}

/// One version of a Deployment as the watch delivered it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// When the watch delivered it.
    pub at: Instant,
    pub resource_version: Option<String>,
    pub generation: Option<i64>,
    /// `spec.replicas` and the managed container's requests.
    pub allocation: Resources,
    /// The managed container's limits.
    pub limits: ContainerLimits,
}

/// A container's limits (CPU millicores, memory bytes), each `None` when unset.
pub type ContainerLimits = (Option<u32>, Option<u64>);

/// `spec.replicas` (1 when unset, the API's default) with the requests, and the limits, of
/// container `container` of a Deployment's pod template. A request missing is its limit.
pub fn allocation_of(
    d: &Deployment,
    container: &str,
) -> Result<(Resources, ContainerLimits), BridgeError> {
    let target = format!(
        "{}/{}",
        d.metadata.namespace.as_deref().unwrap_or_default(),
        d.metadata.name.as_deref().unwrap_or_default()
    );
    let bad = |why: String| BridgeError::Unreadable {
        target: target.clone(),
        why,
    };
    let spec = d.spec.as_ref().ok_or_else(|| bad("no spec".into()))?;
    let replicas = u32::try_from(spec.replicas.unwrap_or(1))
        .map_err(|_| bad(format!("replicas {:?}", spec.replicas)))?;
    let c = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == container))
        .ok_or_else(|| bad(format!("no container `{container}` in the pod template")))?;
    let r = c.resources.clone().unwrap_or_default();
    // A quantity of `key` (`cpu` in millicores, `memory` in bytes); `what` names it in errors.
    let parse = |key: &str, q: Option<&Quantity>, what: &str| -> Result<Option<u64>, BridgeError> {
        let Some(q) = q else { return Ok(None) };
        let v = if key == "cpu" {
            aware_shared::quantity::parse_cpu_millicores(&q.0).map(u64::from)
        } else {
            aware_shared::quantity::parse_memory_bytes(&q.0)
        };
        v.map(Some)
            .map_err(|e| bad(format!("{key}{what} `{}`: {e}", q.0)))
    };
    let limit = |key: &str| parse(key, r.limits.as_ref().and_then(|m| m.get(key)), " limit");
    let one = |key: &str| {
        let q = r
            .requests
            .as_ref()
            .and_then(|m| m.get(key))
            .or_else(|| r.limits.as_ref().and_then(|m| m.get(key)));
        parse(key, q, "")
    };
    let (Some(cpu), Some(memory_bytes)) = (one("cpu")?, one("memory")?) else {
        return Err(bad(format!(
            "container `{container}` has no CPU or memory request or limit"
        )));
    };
    Ok((
        Resources {
            replicas,
            cpu_millicores: u32::try_from(cpu).unwrap_or(u32::MAX),
            memory_bytes,
        },
        (
            limit("cpu")?.map(|c| u32::try_from(c).unwrap_or(u32::MAX)),
            limit("memory")?,
        ),
    ))
}

#[derive(Debug, Default)]
struct State {
    /// Every version delivered, per `namespace/name`.
    history: BTreeMap<String, Vec<Reading>>,
    /// Allocations submitted to the simulator.
    submitted: u64,
    /// Watch and read errors (the watcher retries with backoff).
    errors: Vec<String>,
}

/// Feeds the simulator the allocations the API server holds (see the module documentation).
/// Stops when dropped.
pub struct DeploymentBridge {
    state: Arc<Mutex<State>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn lock(state: &Mutex<State>) -> Result<MutexGuard<'_, State>, BridgeError> {
    state.lock().map_err(|_| BridgeError::Poisoned)
}

/// Submits the newest allocation read of every target whose simulated allocation differs.
fn sync(sim: &SimHandle, state: &Mutex<State>) -> Result<(), BridgeError> {
    let latest: Vec<(String, Resources)> = lock(state)?
        .history
        .iter()
        .filter_map(|(k, v)| v.last().map(|r| (k.clone(), r.allocation)))
        .collect();
    let mut submitted = 0;
    for (target, alloc) in latest {
        if sim.observe(&target)?.allocation != alloc {
            let step = sim.step_index()?;
            sim.submit(&target, step, TargetAction::Desired(alloc))?;
            submitted += 1;
        }
    }
    lock(state)?.submitted += submitted;
    Ok(())
}

impl DeploymentBridge {
    /// Watches, with `client`, the Deployment of every target of `sim` (container `container`
    /// managed) and keeps the simulator's allocations equal to them.
    pub fn start(
        client: kube::Client,
        sim: SimHandle,
        container: &str,
    ) -> Result<Self, BridgeError> {
        let state = Arc::new(Mutex::new(State::default()));
        let refs = sim.target_refs()?;
        let mut by_ns: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in &refs {
            by_ns
                .entry(r.namespace.clone())
                .or_default()
                .push(r.name.clone());
        }
        let mut tasks = Vec::new();
        for (ns, names) in by_ns {
            let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
            let (state, sim, container) = (state.clone(), sim.clone(), container.to_string());
            tasks.push(tokio::spawn(async move {
                let mut events = watcher(api, watcher::Config::default()).boxed();
                while let Some(ev) = events.next().await {
                    let d = match ev {
                        Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) => d,
                        Ok(_) => continue,
                        Err(e) => {
                            if let Ok(mut s) = lock(&state) {
                                s.errors.push(format!("watch {ns}: {e}"));
                            }
                            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                            continue;
                        }
                    };
                    let name = d.metadata.name.clone().unwrap_or_default();
                    if !names.contains(&name) {
                        continue;
                    }
                    let read = allocation_of(&d, &container).map(|(allocation, limits)| Reading {
                        at: Instant::now(),
                        resource_version: d.metadata.resource_version.clone(),
                        generation: d.metadata.generation,
                        allocation,
                        limits,
                    });
                    let result = lock(&state).map(|mut s| match read {
                        Ok(r) => {
                            let h = s.history.entry(format!("{ns}/{name}")).or_default();
                            // A relist delivers the version it already has again.
                            if h.last().map(|l| &l.resource_version) != Some(&r.resource_version) {
                                h.push(r);
                            }
                        }
                        Err(e) => s.errors.push(e.to_string()),
                    });
                    if let Err(e) = result.and_then(|()| sync(&sim, &state)) {
                        if let Ok(mut s) = lock(&state) {
                            s.errors.push(e.to_string());
                        }
                    }
                }
            }));
        }
        // After every simulated step: a submission the step consumed before the allocation
        // changed, or one refused, is made again.
        let (st, sim2) = (state.clone(), sim.clone());
        let mut steps = sim.subscribe();
        tasks.push(tokio::spawn(async move {
            while steps.changed().await.is_ok() {
                if let Err(e) = sync(&sim2, &st) {
                    if let Ok(mut s) = lock(&st) {
                        s.errors.push(e.to_string());
                    }
                }
            }
        }));
        Ok(DeploymentBridge { state, tasks })
    }

    /// Every version of `namespace/name` the watch delivered, oldest first.
    pub fn history(&self, target: &str) -> Result<Vec<Reading>, BridgeError> {
        Ok(lock(&self.state)?
            .history
            .get(target)
            .cloned()
            .unwrap_or_default())
    }

    /// How many allocations were submitted to the simulator.
    pub fn submitted(&self) -> Result<u64, BridgeError> {
        Ok(lock(&self.state)?.submitted)
    }

    /// The errors met so far (watch errors are retried).
    pub fn errors(&self) -> Result<Vec<String>, BridgeError> {
        Ok(lock(&self.state)?.errors.clone())
    }
}

impl Drop for DeploymentBridge {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(replicas: Option<i32>, resources: serde_json::Value) -> Deployment {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "web", "namespace": "shop" },
            "spec": {
                "replicas": replicas,
                "selector": { "matchLabels": { "app": "web" } },
                "template": { "spec": { "containers": [
                    { "name": "sidecar", "image": "s", "resources": {
                        "limits": { "cpu": "50m", "memory": "16Mi" } } },
                    { "name": "app", "image": "a", "resources": resources }
                ] } }
            }
        }))
        .unwrap()
    }

    #[test]
    fn reads_replicas_and_the_named_containers_requests_and_limits() {
        let d = deployment(
            Some(3),
            serde_json::json!({
                "limits": { "cpu": "1500m", "memory": "1Gi" },
                "requests": { "cpu": "0.75", "memory": "512Mi" }
            }),
        );
        let (a, limits) = allocation_of(&d, "app").unwrap();
        assert_eq!(
            a,
            Resources {
                replicas: 3,
                cpu_millicores: 750,
                memory_bytes: 512 << 20
            }
        );
        assert_eq!(limits, (Some(1500), Some(1 << 30)));
        // Unset replicas: the API's default of 1; no requests: the limits are the requests.
        let d = deployment(
            None,
            serde_json::json!({ "limits": { "cpu": "2", "memory": "256Mi" } }),
        );
        let (a, limits) = allocation_of(&d, "app").unwrap();
        assert_eq!((a.replicas, a.cpu_millicores), (1, 2000));
        assert_eq!(limits, (Some(2000), Some(256 << 20)));
        // Requests without limits.
        let d = deployment(
            Some(2),
            serde_json::json!({ "requests": { "cpu": "1", "memory": "1Gi" } }),
        );
        let (a, limits) = allocation_of(&d, "app").unwrap();
        assert_eq!((a.cpu_millicores, a.memory_bytes), (1000, 1 << 30));
        assert_eq!(limits, (None, None));
    }

    #[test]
    fn a_container_without_resources_or_a_missing_one_is_an_error() {
        let d = deployment(Some(1), serde_json::json!({ "requests": { "cpu": "1" } }));
        let e = allocation_of(&d, "app").unwrap_err().to_string();
        assert!(
            e.contains("shop/web") && e.contains("no CPU or memory request or limit"),
            "{e}"
        );
        let e = allocation_of(&d, "main").unwrap_err().to_string();
        assert!(e.contains("no container `main`"), "{e}");
        let d = deployment(
            Some(1),
            serde_json::json!({ "limits": { "cpu": "lots", "memory": "1Gi" } }),
        );
        let e = allocation_of(&d, "app").unwrap_err().to_string();
        assert!(e.contains("cpu `lots`"), "{e}");
    }
}
