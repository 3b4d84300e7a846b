//! TL+'s extra state features (paper §5.2: "the predicted load for the next time step (temporal
//! feature) and a table mapping from resource allocation to performance (spatial feature)").
//!
//! Both are computed from what the agent observes after each step — the offered load, the
//! allocation that was in force, the SLO preservation and the reward of that step — never from
//! the simulator's hidden next-step load.
//!
//! - **Load forecast** (the paper used ARIMA): a damped additive-trend ETS model (Holt's linear
//!   method with damping, `AAdN`; Grafana's `augurs-ets`) fitted on the last [`HISTORY`] offered
//!   loads of the episode at every step, forecasting one step ahead. ETS rather than ARIMA
//!   because `augurs` (a maintained Rust forecasting library) ships ETS, not ARIMA; a fixed
//!   model form rather than AutoETS's search because it is fitted at every control step (one
//!   Nelder–Mead fit, not six) and a damped trend is what a one-step forecast of a ramp or a
//!   diurnal curve needs. Before [`MIN_FIT`] points, or when a fit fails, the forecast is the last
//!   value. Expressed as two O(1) features: `forecast / current − 1` (clamped to ±1) and the CPU
//!   utilization the current allocation would see at the forecast load
//!   (`cpu_util × forecast / current`, clamped to [0, 2]).
//! - **Resource → performance table**: per (total CPU cores, memory per replica, offered load)
//!   cell — half-octave bins of each — the running mean SLO preservation and reward observed.
//!   Looked up at the current allocation and the forecast load level: the mean SLO preservation
//!   there (the load level's mean if the cell was never seen), whether it was seen, and the
//!   distance in bins (÷ 4, clamped to ±1) from the current allocation to the best allocation
//!   (highest mean reward) seen at that load level. The table is recorded online per app and
//!   survives episodes; the load history restarts with every episode (a new trace).

use std::collections::{HashMap, VecDeque};

use augurs_core::Predict;
use augurs_ets::model::{ErrorComponent, ModelType, SeasonalComponent, TrendComponent, Unfit};
use aware_loadgen::app::MIB;
use aware_loadgen::Observation;

/// Extra state features of TL+.
pub const EXTRA_DIM: usize = 6;
/// Names of the extra features, in vector order (after the simulator's nine).
pub const EXTRA_NAMES: [&str; EXTRA_DIM] = [
    "forecast_load_change",
    "forecast_cpu_util",
    "table_slo_preservation",
    "table_known",
    "table_best_cpu_delta",
    "table_best_memory_delta",
];
/// Offered-load points the forecaster fits on.
pub const HISTORY: usize = 24;
/// Fewer points than this: the forecast is the last value (an ETS fit with a trend needs > 8).
pub const MIN_FIT: usize = 10;
/// Nelder–Mead iterations per fit.
const MAX_ITERATIONS: usize = 300;

/// One-step-ahead load forecast from the recent offered loads (ETS `AAdN`).
#[derive(Debug, Clone, Default)]
pub struct LoadForecaster {
    history: VecDeque<f64>,
    forecast: Option<f64>,
    fits: u64,
    failed_fits: u64,
}

impl LoadForecaster {
    /// Forgets the history (a new trace starts).
    pub fn reset(&mut self) {
        self.history.clear();
        self.forecast = None;
    }

    /// Adds the offered load of the step just observed and refits.
    pub fn push(&mut self, offered: f64) {
        let v = if offered.is_finite() {
            offered.max(0.0)
        } else {
            self.history.back().copied().unwrap_or(0.0)
        };
        self.history.push_back(v);
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
        self.forecast = self.fit();
    }

    fn fit(&mut self) -> Option<f64> {
        if self.history.len() < MIN_FIT {
            return None;
        }
        let y: Vec<f64> = self.history.iter().copied().collect();
        let lo = y.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = y.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if hi - lo < 1e-9 {
            return Some(hi);
        }
        self.fits += 1;
        let model = Unfit::new(ModelType {
            error: ErrorComponent::Additive,
            trend: TrendComponent::Additive,
            season: SeasonalComponent::None,
        })
        .damped(true)
        .max_iterations(MAX_ITERATIONS)
        .fit(&y);
        let point = model
            .ok()
            .and_then(|m| m.predict(1, None).ok())
            .and_then(|f| f.point.first().copied())
            .filter(|p| p.is_finite());
        match point {
            // A forecast far outside what was seen is a bad fit, not information.
            Some(p) => Some(p.clamp(0.0, 2.0 * hi)),
            None => {
                self.failed_fits += 1;
                None
            }
        }
    }

    /// The next step's forecast load (the last value while too short or after a failed fit;
    /// 0 with no history).
    pub fn forecast(&self) -> f64 {
        self.forecast
            .or_else(|| self.history.back().copied())
            .unwrap_or(0.0)
    }

    /// The last observed load.
    pub fn last(&self) -> f64 {
        self.history.back().copied().unwrap_or(0.0)
    }

    /// (fits attempted, fits that failed).
    pub fn fit_counts(&self) -> (u64, u64) {
        (self.fits, self.failed_fits)
    }
}

/// Half-octave bin of a positive quantity (values below `floor` share the lowest bin).
fn bin(x: f64, floor: f64) -> i32 {
    let v = if x.is_finite() { x.max(floor) } else { floor };
    (2.0 * v.log2()).round() as i32
}

/// A table cell: running means of what was observed there.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cell {
    pub count: u64,
    pub slo_preservation: f64,
    pub reward: f64,
}

/// (total CPU cores bin, memory per replica bin) of an allocation.
pub type AllocKey = (i32, i32);

/// The resource → performance table: per load bin, per allocation bin, running means.
#[derive(Debug, Clone, Default)]
pub struct PerfTable {
    cells: HashMap<i32, HashMap<AllocKey, Cell>>,
}

impl PerfTable {
    /// The allocation bins of `replicas` replicas with `cpu_millicores` and `memory_bytes` each.
    pub fn alloc_key(replicas: u32, cpu_millicores: u32, memory_bytes: u64) -> AllocKey {
        let cores = f64::from(replicas) * f64::from(cpu_millicores) / 1000.0;
        let mib = memory_bytes as f64 / MIB as f64;
        (bin(cores, 1.0 / 64.0), bin(mib, 1.0))
    }

    /// The load bin of an offered load (requests/s).
    pub fn load_bin(rps: f64) -> i32 {
        bin(rps, 0.05)
    }

    /// Records one observed step.
    pub fn record(&mut self, alloc: AllocKey, rps: f64, slo_preservation: f64, reward: f64) {
        if !slo_preservation.is_finite() || !reward.is_finite() {
            return;
        }
        let c = self
            .cells
            .entry(Self::load_bin(rps))
            .or_default()
            .entry(alloc)
            .or_default();
        c.count += 1;
        let n = c.count as f64;
        c.slo_preservation += (slo_preservation - c.slo_preservation) / n;
        c.reward += (reward - c.reward) / n;
    }

    /// The cell of `alloc` at load `rps`.
    pub fn get(&self, alloc: AllocKey, rps: f64) -> Option<Cell> {
        self.cells
            .get(&Self::load_bin(rps))
            .and_then(|m| m.get(&alloc))
            .copied()
    }

    /// Mean SLO preservation over every cell of the load level (weighted by count).
    pub fn load_level_slo(&self, rps: f64) -> Option<f64> {
        let m = self.cells.get(&Self::load_bin(rps))?;
        let n: u64 = m.values().map(|c| c.count).sum();
        (n > 0).then(|| {
            m.values()
                .map(|c| c.slo_preservation * c.count as f64)
                .sum::<f64>()
                / n as f64
        })
    }

    /// The allocation with the highest mean reward seen at load `rps` (ties: the smaller one).
    pub fn best(&self, rps: f64) -> Option<(AllocKey, Cell)> {
        self.cells
            .get(&Self::load_bin(rps))?
            .iter()
            .max_by(|a, b| a.1.reward.total_cmp(&b.1.reward).then(b.0.cmp(a.0)))
            .map(|(k, c)| (*k, *c))
    }

    /// Cells recorded.
    pub fn len(&self) -> usize {
        self.cells.values().map(HashMap::len).sum()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// TL+'s feature state for one app: the forecaster and the table.
#[derive(Debug, Clone, Default)]
pub struct TlPlusFeatures {
    pub forecaster: LoadForecaster,
    pub table: PerfTable,
}

impl TlPlusFeatures {
    /// A new episode (trace) starts: the load history restarts, the table stays.
    pub fn reset_episode(&mut self) {
        self.forecaster.reset();
    }

    /// Folds in what the step just observed (`obs`: the metrics of the step, the allocation in
    /// force during it, its reward).
    pub fn observe(&mut self, obs: &Observation) {
        let a = obs.allocation;
        let m = &obs.metrics;
        self.table.record(
            PerfTable::alloc_key(a.replicas, a.cpu_millicores, a.memory_bytes),
            m.offered_rps,
            m.slo_preservation,
            obs.reward,
        );
        self.forecaster.push(m.offered_rps);
    }

    /// The extra features for the decision after `obs` (call [`Self::observe`] with it first).
    /// Always finite.
    pub fn features(&self, obs: &Observation) -> [f32; EXTRA_DIM] {
        let m = &obs.metrics;
        let current = if m.offered_rps.is_finite() {
            m.offered_rps.max(0.0)
        } else {
            self.forecaster.last()
        };
        let fc = self.forecaster.forecast();
        let ratio = fc / current.max(0.05);
        let change = if current < 0.05 && fc < 0.05 {
            0.0
        } else {
            (ratio - 1.0).clamp(-1.0, 1.0)
        };
        let util = if m.cpu_util.is_finite() {
            m.cpu_util
        } else {
            0.0
        };
        let fc_util = (util * ratio.min(40.0)).clamp(0.0, 2.0);
        let a = obs.allocation;
        let here = PerfTable::alloc_key(a.replicas, a.cpu_millicores, a.memory_bytes);
        let cell = self.table.get(here, fc);
        let sp = cell
            .map(|c| c.slo_preservation)
            .or_else(|| self.table.load_level_slo(fc))
            .unwrap_or(0.5);
        let (dc, dm) = self.table.best(fc).map_or((0.0, 0.0), |((c, mm), _)| {
            (
                (f64::from(c - here.0) / 4.0).clamp(-1.0, 1.0),
                (f64::from(mm - here.1) / 4.0).clamp(-1.0, 1.0),
            )
        });
        let out = [
            change,
            fc_util,
            sp.clamp(0.0, 1.0),
            if cell.is_some() { 1.0 } else { 0.0 },
            dc,
            dm,
        ];
        out.map(|v| if v.is_finite() { v as f32 } else { 0.0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mean absolute one-step error of the forecaster and of the last value over `ys`.
    fn errors(ys: &[f64]) -> (f64, f64) {
        let mut f = LoadForecaster::default();
        let (mut ef, mut el, mut n) = (0.0, 0.0, 0);
        for w in ys.windows(2) {
            f.push(w[0]);
            if f.history.len() >= MIN_FIT {
                ef += (f.forecast() - w[1]).abs();
                el += (f.last() - w[1]).abs();
                n += 1;
            }
        }
        (ef / n as f64, el / n as f64)
    }

    #[test]
    fn forecast_tracks_a_ramp_better_than_the_last_value() {
        let ys: Vec<f64> = (0..60).map(|t| 20.0 + 3.0 * f64::from(t)).collect();
        let (ets, last) = errors(&ys);
        assert!(ets < 0.3 * last, "ets {ets} vs last value {last}");
        let f = {
            let mut f = LoadForecaster::default();
            ys.iter().for_each(|&y| f.push(y));
            f
        };
        assert!(f.fit_counts().0 > 0 && f.fit_counts().1 == 0);
    }

    #[test]
    fn forecast_tracks_a_diurnal_curve_better_than_the_last_value() {
        let ys: Vec<f64> = (0..120)
            .map(|t| 100.0 + 60.0 * (f64::from(t) * std::f64::consts::TAU / 80.0).sin())
            .collect();
        let (ets, last) = errors(&ys);
        assert!(ets < 0.6 * last, "ets {ets} vs last value {last}");
    }

    #[test]
    fn forecast_falls_back_to_the_last_value_and_never_leaves_the_range() {
        let mut f = LoadForecaster::default();
        assert_eq!(f.forecast(), 0.0);
        f.push(5.0);
        assert_eq!(f.forecast(), 5.0);
        f.push(f64::NAN);
        assert_eq!(f.forecast(), 5.0);
        for _ in 0..30 {
            f.push(7.0);
        }
        assert_eq!(f.forecast(), 7.0);
        f.reset();
        assert_eq!(f.forecast(), 0.0);
        // A spike does not make the forecast explode or go negative.
        for t in 0..30 {
            f.push(if t % 7 == 0 { 1000.0 } else { 0.0 });
            let p = f.forecast();
            assert!(p.is_finite() && (0.0..=2000.0).contains(&p), "{p}");
        }
    }

    #[test]
    fn table_records_means_and_finds_the_best_allocation_per_load_level() {
        let mut t = PerfTable::default();
        assert!(t.is_empty() && t.best(10.0).is_none());
        let small = PerfTable::alloc_key(1, 500, 512 * MIB);
        let big = PerfTable::alloc_key(4, 1000, 512 * MIB);
        assert_ne!(small, big);
        assert!(big.0 > small.0 && big.1 == small.1);
        t.record(small, 10.0, 0.4, 1.0);
        t.record(small, 10.5, 0.6, 1.2);
        t.record(big, 10.0, 1.0, 1.5);
        t.record(big, 100.0, 0.2, 0.3);
        t.record(small, 10.0, f64::NAN, 1.0); // ignored
        let c = t.get(small, 10.2).unwrap();
        assert_eq!(c.count, 2);
        assert!((c.slo_preservation - 0.5).abs() < 1e-12 && (c.reward - 1.1).abs() < 1e-12);
        assert_eq!(t.best(10.0).unwrap().0, big);
        assert_eq!(t.best(100.0).unwrap().0, big);
        assert!(t.get(small, 100.0).is_none());
        assert!((t.load_level_slo(10.0).unwrap() - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn features_use_the_table_and_forecast_and_are_never_nan() {
        let app = aware_loadgen::app::generate_apps(
            1,
            1001,
            &aware_loadgen::app::GeneratorOptions::default(),
        )
        .remove(0);
        let mut env =
            aware_loadgen::SimEnv::new(vec![app], aware_loadgen::SimConfig::default()).unwrap();
        env.reset(3).unwrap();
        let mut f = TlPlusFeatures::default();
        let mut obs = env
            .step(&[aware_loadgen::TargetAction::Hold])
            .unwrap()
            .remove(0);
        f.observe(&obs);
        let x = f.features(&obs);
        assert_eq!(x[3], 1.0, "the current allocation was just recorded");
        for _ in 0..20 {
            obs = env
                .step(&[aware_loadgen::TargetAction::Hold])
                .unwrap()
                .remove(0);
            f.observe(&obs);
            assert!(f.features(&obs).iter().all(|v| v.is_finite()));
        }
        // Garbage metrics still give finite features.
        let mut bad = obs.clone();
        bad.metrics.offered_rps = f64::NAN;
        bad.metrics.cpu_util = f64::INFINITY;
        bad.metrics.slo_preservation = f64::NAN;
        bad.reward = f64::NAN;
        f.observe(&bad);
        assert!(f.features(&bad).iter().all(|v| v.is_finite()));
        // Features after a reset: the table is kept.
        f.reset_episode();
        assert!(!f.table.is_empty());
    }
}
