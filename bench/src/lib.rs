//! `aware bench <name>`: benchmarks that write JSON (and plots where a person would look).
//! The `aware` command hands `aware bench …` to this crate; what the benches share with the
//! demo and `aware train-meta` lives in `aware-harness`.

pub mod adapt;
pub mod bootstrap;
pub mod bus;
pub mod cli;
pub mod cluster;
pub mod control_loop;
pub mod cost;
pub mod embed;
pub mod kube;
pub mod observer;
pub mod process;
pub mod scale;
pub mod scrape;
pub mod serve;
pub mod serve_bus;
pub mod state;
pub mod store;
pub mod store_compare;
pub mod trainer;

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Bus(#[from] aware_shared::bus::BusError),
    #[error(transparent)]
    Config(#[from] aware_shared::config::ConfigError),
    #[error(transparent)]
    Kube(#[from] aware_kube_testkit::KubeError),
    #[error("Kubernetes API: {0}")]
    KubeApi(#[from] ::kube::Error),
    #[error(transparent)]
    Harness(#[from] aware_shared::testkit::HarnessError),
    #[error(transparent)]
    Service(#[from] aware_shared::service::ServiceError),
    #[error(transparent)]
    Services(#[from] aware_harness::ServicesError),
    #[error(transparent)]
    Telemetry(#[from] aware_shared::telemetry::TelemetryError),
    #[error("report as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
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

/// The contract's sample message of `kind`, to fill in.
pub(crate) fn sample(
    kind: aware_bus_schemas::EventKind,
) -> Result<aware_bus_schemas::Event, BenchError> {
    aware_bus_schemas::generated::samples()
        .into_iter()
        .find(|e| e.kind() == kind)
        .ok_or_else(|| fail(format!("no {} sample", kind.as_str())))
}

/// A scratch directory for one run of benchmark `name`, its own even when runs of this process
/// overlap (the tests run benchmarks side by side): `aware-bench-<name>-<pid>-<n>` in the
/// temporary directory.
pub fn scratch_dir(name: &str) -> std::path::PathBuf {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("aware-bench-{name}-{}-{n}", std::process::id()))
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
