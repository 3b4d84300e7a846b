//! The instability scenarios of paper §2.3: payload changes of six segment families and load
//! changes H→L and L→H, injectable into a target at a given step.
//!
//! The paper names seven scenarios but Fig. 3 plots eight columns (six payload changes plus the
//! two directions of the load change); all eight are here.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::app::AppSpec;
use crate::cluster::TargetSim;
use crate::error::SimError;
use crate::segments::PayloadFamily;

/// Load multiplier applied by [`Scenario::LoadHighToLow`]. The paper splits the Azure traces into
/// days above and below 10^5 requests; the low half carries roughly a third of the high half's
/// rate.
pub const LOAD_HIGH_TO_LOW_FACTOR: f64 = 0.3;
/// Load multiplier applied by [`Scenario::LoadLowToHigh`].
pub const LOAD_LOW_TO_HIGH_FACTOR: f64 = 3.0;

/// An instability scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// File/object size [128, 256, 384] KiB → [512, 768, 1024] KiB (I/O, compression).
    FileSize,
    /// Table size 1024 → 10240 items (key-value/database).
    TableSize,
    /// Float operations 10^8 → 2·10^8.
    FloatOps,
    /// Image dimension 40×40 → 160×160.
    ImageDimension,
    /// JSON size [250 B, 500 B, 1 KiB] → [2, 3, 5] KiB.
    JsonSize,
    /// Matrix dimension 50 → 150 (ML serving).
    MatrixDimension,
    /// Load from high to low (×0.3).
    LoadHighToLow,
    /// Load from low to high (×3).
    LoadLowToHigh,
}

impl Scenario {
    /// All scenarios.
    pub const ALL: [Scenario; 8] = [
        Scenario::FileSize,
        Scenario::TableSize,
        Scenario::FloatOps,
        Scenario::ImageDimension,
        Scenario::JsonSize,
        Scenario::MatrixDimension,
        Scenario::LoadHighToLow,
        Scenario::LoadLowToHigh,
    ];

    /// The payload family a payload scenario changes.
    pub fn family(self) -> Option<PayloadFamily> {
        match self {
            Scenario::FileSize => Some(PayloadFamily::FileSize),
            Scenario::TableSize => Some(PayloadFamily::TableSize),
            Scenario::FloatOps => Some(PayloadFamily::FloatOps),
            Scenario::ImageDimension => Some(PayloadFamily::ImageDimension),
            Scenario::JsonSize => Some(PayloadFamily::JsonSize),
            Scenario::MatrixDimension => Some(PayloadFamily::MatrixDimension),
            Scenario::LoadHighToLow | Scenario::LoadLowToHigh => None,
        }
    }

    /// Whether the scenario changes anything for this target.
    pub fn applies_to(self, target: &TargetSim) -> bool {
        self.applies_to_app(target.app())
    }

    /// Whether the scenario changes anything for this app.
    pub fn applies_to_app(self, app: &AppSpec) -> bool {
        match self.family() {
            Some(f) => app.segments.iter().any(|s| s.kind.family() == f),
            None => true,
        }
    }

    /// Inject into a target now. Returns the number of segments changed (payload scenarios) or
    /// 1 (load scenarios). Payloads are drawn from the "after" set with `seed`.
    pub fn inject(self, target: &mut TargetSim, seed: u64) -> Result<usize, SimError> {
        match self.family() {
            Some(fam) => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let mut app = target.app().clone();
                let after = fam.after();
                let mut changed = 0;
                for s in app.segments.iter_mut().filter(|s| s.kind.family() == fam) {
                    s.payload = after[rng.random_range(0..after.len())];
                    changed += 1;
                }
                if changed > 0 {
                    target.set_app(app)?;
                }
                Ok(changed)
            }
            None => {
                let f = if self == Scenario::LoadHighToLow {
                    LOAD_HIGH_TO_LOW_FACTOR
                } else {
                    LOAD_LOW_TO_HIGH_FACTOR
                };
                target.set_load_multiplier(target.load_multiplier() * f);
                Ok(1)
            }
        }
    }
}

/// A scheduled injection: at the start of `step`, inject `scenario` into `target` (app name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injection {
    /// App name.
    pub target: String,
    /// Step at whose start the scenario takes effect.
    pub step: u64,
    /// The scenario.
    pub scenario: Scenario,
}

/// A reproducible series of random applicable scenarios per app, as in the paper's A/B tests
/// (§5.3: "a series of the seven random instability scenarios"): for each app, `count`
/// injections at steps `first_step`, `first_step + every`, … drawn from the scenarios that
/// change something for that app.
pub fn random_injections(
    apps: &[AppSpec],
    seed: u64,
    first_step: u64,
    every: u64,
    count: usize,
) -> Vec<Injection> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(apps.len() * count);
    for app in apps {
        let pool: Vec<Scenario> = Scenario::ALL
            .iter()
            .copied()
            .filter(|s| s.applies_to_app(app))
            .collect();
        for k in 0..count {
            let scenario = pool[rng.random_range(0..pool.len())];
            out.push(Injection {
                target: app.name.clone(),
                step: first_step + every * k as u64,
                scenario,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{
        generate_apps, Allocation, Bounds, GeneratorOptions, SegmentSpec, Slo, VerticalMode, MIB,
    };
    use crate::cluster::{AppModel, NodeShare};
    use crate::load::{LoadModel, LoadPattern, LoadSpec};
    use crate::segments::SegmentKind;
    use std::sync::Arc;

    fn target(kind: SegmentKind) -> TargetSim {
        let app = AppSpec {
            name: "s".into(),
            namespace: "sim".into(),
            segments: vec![SegmentSpec {
                kind,
                payload: kind.default_payload(),
            }],
            slo: Slo::default(),
            alpha: 0.5,
            bounds: Bounds::default(),
            initial: Allocation {
                replicas: 2,
                cpu_millicores: 1000,
                memory_bytes: 1024 * MIB,
            },
            vertical: VerticalMode::InPlace,
            timeout_s: 30.0,
            load: LoadSpec::constant(10.0),
        };
        TargetSim::new(
            Arc::new(app),
            Arc::new(LoadModel::Pattern(LoadPattern::Constant { rps: 10.0 })),
            10.0,
            1,
            0,
            NodeShare::default(),
        )
        .unwrap()
    }

    #[test]
    fn every_payload_scenario_increases_demand_of_its_family() {
        for sc in Scenario::ALL.iter().filter(|s| s.family().is_some()) {
            let fam = sc.family().unwrap();
            for kind in SegmentKind::ALL.iter().filter(|k| k.family() == fam) {
                let mut t = target(*kind);
                assert!(sc.applies_to(&t));
                let before = *t.model();
                assert_eq!(sc.inject(&mut t, 3).unwrap(), 1);
                let after: AppModel = *t.model();
                assert!(
                    after.cpu_seconds + after.wait_seconds
                        > before.cpu_seconds + before.wait_seconds,
                    "{sc:?} on {}",
                    kind.name()
                );
                assert!(fam.after().contains(&t.app().segments[0].payload));
            }
            // a segment of another family is untouched
            let other = if fam == PayloadFamily::FloatOps {
                SegmentKind::Sleep
            } else {
                SegmentKind::FloatOps
            };
            let mut t = target(other);
            assert!(!sc.applies_to(&t));
            assert_eq!(sc.inject(&mut t, 3).unwrap(), 0);
        }
    }

    #[test]
    fn load_scenarios_scale_the_load() {
        let mut t = target(SegmentKind::Sleep);
        Scenario::LoadLowToHigh.inject(&mut t, 0).unwrap();
        assert_eq!(t.load_multiplier(), LOAD_LOW_TO_HIGH_FACTOR);
        Scenario::LoadHighToLow.inject(&mut t, 0).unwrap();
        assert!(
            (t.load_multiplier() - LOAD_LOW_TO_HIGH_FACTOR * LOAD_HIGH_TO_LOW_FACTOR).abs() < 1e-12
        );
        let (a, _) = t.arrivals_for_step();
        assert!(a > 0.0);
    }

    #[test]
    fn random_injections_are_applicable_and_reproducible() {
        let apps = generate_apps(10, 2, &GeneratorOptions::default());
        let a = random_injections(&apps, 9, 20, 30, 7);
        assert_eq!(a, random_injections(&apps, 9, 20, 30, 7));
        assert_eq!(a.len(), 70);
        for inj in &a {
            let app = apps.iter().find(|x| x.name == inj.target).unwrap();
            assert!(inj.scenario.applies_to_app(app));
            assert!(inj.step >= 20 && (inj.step - 20) % 30 == 0);
        }
    }
}
