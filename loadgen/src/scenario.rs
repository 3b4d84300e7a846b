//! The instability scenarios of paper §2.3: payload changes of six segment families and load
//! changes H→L and L→H, injectable into a target at a given step.
//!
//! The paper names seven scenarios but Fig. 3 plots eight columns (six payload changes plus the
//! two directions of the load change); all eight are here.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

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
        match self.family() {
            Some(f) => target.app().segments.iter().any(|s| s.kind.family() == f),
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
