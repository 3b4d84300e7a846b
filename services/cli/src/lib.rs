//! The `aware` command's library: the service registry, `watch`, the benchmarks.

pub mod bench;
pub mod config_check;
pub mod demo;
pub mod nats_config;
pub mod train_meta;
pub mod watch;

use aware_shared::launcher::ServiceEntry;

/// Every service, in the order `aware run all` starts them.
pub const SERVICES: [ServiceEntry; 6] = [
    aware_lifecycle_monitor::ENTRY,
    aware_meta_learner_trainer::ENTRY,
    aware_trajectory_recorder::ENTRY,
    aware_actuator::ENTRY,
    aware_recommender::ENTRY,
    aware_metrics_collector::ENTRY,
];

/// Services `aware run` starts only by name: the Kubernetes controller needs an API server, so
/// `all` (which runs anywhere) leaves it out.
pub const BY_NAME_ONLY: [ServiceEntry; 1] = [aware_controller::ENTRY];

/// The services named on the command line (`all` or one service name).
pub fn select_services(name: &str) -> Option<Vec<ServiceEntry>> {
    if name == "all" {
        return Some(SERVICES.to_vec());
    }
    SERVICES
        .iter()
        .chain(BY_NAME_ONLY.iter())
        .find(|e| e.name == name)
        .map(|e| vec![*e])
}

/// Names accepted by `aware run`.
pub fn service_names() -> Vec<&'static str> {
    std::iter::once("all")
        .chain(SERVICES.iter().chain(BY_NAME_ONLY.iter()).map(|e| e.name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_all_or_one() {
        assert_eq!(select_services("all").unwrap().len(), 6);
        assert_eq!(
            select_services("recommender").unwrap()[0].name,
            "recommender"
        );
        assert_eq!(select_services("controller").unwrap()[0].name, "controller");
        assert!(select_services("all")
            .unwrap()
            .iter()
            .all(|e| e.name != "controller"));
        assert!(select_services("nope").is_none());
        assert_eq!(service_names().len(), 8);
    }
}
