//! `aware bench <name>`: benchmarks that write JSON (and plots where a person would look).

pub mod adapt;
pub mod bootstrap;
pub mod bus;
pub mod chart;
pub mod control_loop;
pub mod embed;
pub mod serve;
pub mod serve_bus;
pub mod store;

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Bus(#[from] aware_shared::bus::BusError),
    #[error(transparent)]
    Harness(#[from] aware_shared::testkit::HarnessError),
    #[error(transparent)]
    Service(#[from] aware_shared::service::ServiceError),
    #[error("{0}")]
    Failed(String),
    #[error("writing {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A simulator or model error as a bench failure.
pub(crate) fn fail(e: impl std::fmt::Display) -> BenchError {
    BenchError::Failed(e.to_string())
}

/// The only observation of a one-target simulator step.
pub(crate) fn first(
    v: Vec<aware_loadgen::env::Observation>,
) -> Result<aware_loadgen::env::Observation, BenchError> {
    v.into_iter()
        .next()
        .ok_or_else(|| fail("simulator returned no observation"))
}

/// The six services on an embedded bus, paced the bus's own way: a subscriber to `obs` sleeps
/// `pace` after every round of the apps' observations, and the bus's back-pressure (small
/// buffers) reaches the lock-step collector within a few steps, so the trainer keeps up.
pub(crate) struct PacedServices {
    all: aware_shared::bus::Subscription,
    pacer: tokio::task::JoinHandle<()>,
    running: aware_shared::launcher::Running,
    shutdown: tokio_util::sync::CancellationToken,
    deadline: tokio::time::Instant,
}

impl PacedServices {
    /// Starts the services on `bus` (built with small buffers) with `cfg`; events are read
    /// until `timeout` from now.
    pub(crate) async fn start(
        bus: aware_shared::bus::Bus,
        cfg: aware_shared::config::AppConfig,
        apps: usize,
        pace: std::time::Duration,
        timeout: std::time::Duration,
    ) -> Result<Self, BenchError> {
        let all = bus.subscribe(aware_bus_schemas::subject::ALL).await?;
        let mut obs = bus.subscribe("aware.v1.obs.>").await?;
        let apps = apps.max(1);
        let pacer = tokio::spawn(async move {
            let mut n = 0usize;
            while obs.next().await.is_some() {
                n += 1;
                if n.is_multiple_of(apps) {
                    tokio::time::sleep(pace).await;
                }
            }
        });
        let shutdown = tokio_util::sync::CancellationToken::new();
        let running = aware_shared::launcher::start_on(
            bus,
            std::sync::Arc::new(cfg),
            &crate::SERVICES,
            shutdown.clone(),
        )
        .await?;
        Ok(PacedServices {
            all,
            pacer,
            running,
            shutdown,
            deadline: tokio::time::Instant::now() + timeout,
        })
    }

    /// The next event on the bus; `None` at the deadline or when the bus closes (messages that
    /// do not decode are skipped).
    pub(crate) async fn next_event(&mut self) -> Option<aware_bus_schemas::Event> {
        loop {
            let m = tokio::time::timeout_at(self.deadline, self.all.next())
                .await
                .ok()??;
            let Ok(p) = aware_bus_schemas::subject::parse(&m.subject) else {
                continue;
            };
            if let Ok(ev) = aware_bus_schemas::decode_event(p.kind, &m.payload) {
                return Some(ev);
            }
        }
    }

    /// The sum of a counter over every service's registry.
    pub(crate) fn counter(&self, name: &str) -> f64 {
        self.running
            .contexts
            .iter()
            .flat_map(|c| c.metrics.registry().gather())
            .filter(|f| f.name() == name)
            .flat_map(|f| {
                f.get_metric()
                    .iter()
                    .map(|m| m.get_counter().get_value())
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    /// Shuts the services down and waits for them.
    pub(crate) async fn stop(self) -> Result<(), BenchError> {
        self.shutdown.cancel();
        self.pacer.abort();
        drop(self.all);
        self.running.join().await?;
        Ok(())
    }
}

/// Writes a pretty JSON report to `dir/name`.
pub fn write_json(dir: &Path, name: &str, value: &serde_json::Value) -> Result<String, BenchError> {
    let path = dir.join(name);
    let io = |source| BenchError::Io {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    std::fs::write(&path, text + "\n").map_err(io)?;
    Ok(path.display().to_string())
}

/// Median of a non-empty sample (NaN for an empty one).
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(super::median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(super::median(&[]).is_nan());
    }
}
