//! Load: synthetic arrival-rate patterns and real traces, with time and rate scaling.
//!
//! A load is a deterministic mean arrival rate λ(t) (requests/s at simulated time t) plus,
//! optionally, Poisson noise on the number of arrivals in each control step. Traces come in two
//! formats:
//!
//! * per-second counts, `period,count` (e.g. `worldcup98-rate.csv`): one row per second, in order;
//!   the `period` column is kept only for error messages;
//! * per-request timestamps, `TIMESTAMP,...` (the Azure LLM inference traces): one row per
//!   request, `YYYY-MM-DD HH:MM:SS[.fraction]` or plain seconds, non-decreasing; binned into
//!   per-second counts from the first timestamp.
//!
//! [`TraceScaling`] maps a trace onto an app: `time_scale` trace seconds pass per simulated second
//! (e.g. 60 replays a minute of trace per simulated second), `offset_s` skips into the trace, and
//! [`RateScale`] multiplies the rates (by a factor, to a mean or peak rate, or to a fraction of
//! the app's capacity at its largest allocation). Traces wrap around at their end.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Poisson, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::error::SimError;

/// A synthetic or trace-driven arrival-rate pattern (serializable).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum LoadPattern {
    /// λ(t) = rps.
    Constant {
        /// Requests per second.
        rps: f64,
    },
    /// λ(t) = mean·(1 + amplitude·sin(2π(t + phase)/period)).
    Diurnal {
        /// Mean requests per second.
        mean_rps: f64,
        /// Relative amplitude in [0, 1].
        amplitude: f64,
        /// Period in simulated seconds (86400 for a day; shorter to compress a day).
        period_s: f64,
        /// Phase shift in seconds.
        #[serde(default)]
        phase_s: f64,
    },
    /// Base rate with bursts: each window of `window_s` seconds is a burst window with
    /// probability `burst_probability` (decided by the seed), where the rate is `burst_rps`.
    Bursty {
        /// Rate outside bursts.
        base_rps: f64,
        /// Rate during bursts.
        burst_rps: f64,
        /// Probability that a window is a burst.
        burst_probability: f64,
        /// Window length, seconds.
        window_s: f64,
    },
    /// Alternates `on_s` seconds at `on_rps` and `off_s` seconds at `off_rps`.
    OnOff {
        /// Rate while on.
        on_rps: f64,
        /// Rate while off.
        off_rps: f64,
        /// Length of the on phase, seconds.
        on_s: f64,
        /// Length of the off phase, seconds.
        off_s: f64,
    },
    /// A real trace read from a file.
    Trace {
        /// Path of the trace file.
        path: PathBuf,
        /// File format.
        format: TraceFormat,
        /// Time and rate scaling.
        #[serde(default)]
        scaling: TraceScaling,
    },
}

/// A load: a pattern plus Poisson noise on the per-step arrivals (default on).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSpec {
    /// The rate pattern.
    pub pattern: LoadPattern,
    /// Draw the arrivals of each step from a Poisson distribution around λ·Δt.
    #[serde(default = "default_true")]
    pub poisson: bool,
}

fn default_true() -> bool {
    true
}

impl LoadSpec {
    /// Constant load with Poisson noise.
    pub fn constant(rps: f64) -> Self {
        LoadSpec {
            pattern: LoadPattern::Constant { rps },
            poisson: true,
        }
    }
}

/// Trace file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    /// `period,count`, one row per second.
    RateCsv,
    /// `TIMESTAMP,...`, one row per request.
    TimestampsCsv,
}

/// How trace rates are scaled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(
    deny_unknown_fields,
    tag = "kind",
    content = "value",
    rename_all = "snake_case"
)]
pub enum RateScale {
    /// Multiply every rate by this factor.
    Factor(f64),
    /// Scale so the trace's mean rate is this many requests/s.
    MeanRps(f64),
    /// Scale so the trace's peak (99.5th percentile of per-second rates) is this many requests/s.
    PeakRps(f64),
    /// Scale so the trace's peak is this fraction of the app's capacity at its largest
    /// allocation (max replicas × max CPU).
    PeakOfCapacity(f64),
}

/// Time and rate scaling of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceScaling {
    /// Trace seconds per simulated second.
    pub time_scale: f64,
    /// Start offset into the trace, trace seconds.
    #[serde(default)]
    pub offset_s: f64,
    /// Rate scaling.
    pub rate: RateScale,
}

impl Default for TraceScaling {
    fn default() -> Self {
        TraceScaling {
            time_scale: 1.0,
            offset_s: 0.0,
            rate: RateScale::PeakOfCapacity(0.7),
        }
    }
}

/// A trace as per-second request counts, with prefix sums for O(1) window means.
#[derive(Debug, Clone, PartialEq)]
pub struct RateTrace {
    /// Where it came from.
    pub source: String,
    /// Requests in each second.
    pub rates: Vec<f64>,
    prefix: Vec<f64>,
}

impl RateTrace {
    /// Build from per-second counts. Errors if empty or a value is negative/non-finite.
    pub fn from_rates(source: impl Into<String>, rates: Vec<f64>) -> Result<Self, SimError> {
        let source = source.into();
        if rates.is_empty() {
            return Err(SimError::Trace {
                path: source,
                reason: "no data rows".into(),
            });
        }
        if let Some(i) = rates.iter().position(|r| !r.is_finite() || *r < 0.0) {
            return Err(SimError::Trace {
                path: source,
                reason: format!("rate at second {i} is negative or not finite"),
            });
        }
        let mut prefix = Vec::with_capacity(rates.len() + 1);
        let mut acc = 0.0;
        prefix.push(0.0);
        for r in &rates {
            acc += r;
            prefix.push(acc);
        }
        Ok(RateTrace {
            source,
            rates,
            prefix,
        })
    }

    /// Length in seconds.
    pub fn duration_s(&self) -> f64 {
        self.rates.len() as f64
    }

    /// Mean rate.
    pub fn mean(&self) -> f64 {
        self.prefix[self.rates.len()] / self.duration_s()
    }

    /// Robust peak: the 99.5th percentile of per-second rates.
    pub fn peak(&self) -> f64 {
        let mut v = self.rates.clone();
        v.sort_by(f64::total_cmp);
        let idx = ((v.len() as f64 - 1.0) * 0.995).round() as usize;
        v[idx.min(v.len() - 1)]
    }

    /// Cumulative requests from 0 to `t` seconds (t may exceed the length: the trace wraps).
    fn cumulative(&self, t: f64) -> f64 {
        let len = self.duration_s();
        let total = self.prefix[self.rates.len()];
        let laps = (t / len).floor();
        let rem = t - laps * len;
        let i = (rem.floor() as usize).min(self.rates.len() - 1);
        let frac = rem - i as f64;
        laps * total + self.prefix[i] + frac * self.rates[i]
    }

    /// Mean rate over trace time [t0, t1) (wrapping at the end).
    pub fn window_mean(&self, t0: f64, t1: f64) -> f64 {
        let t0 = t0.max(0.0);
        if t1 <= t0 {
            let i = (t0 % self.duration_s()).floor() as usize;
            return self.rates[i.min(self.rates.len() - 1)];
        }
        (self.cumulative(t1) - self.cumulative(t0)) / (t1 - t0)
    }
}

/// Load a `period,count` trace (one row per second).
pub fn load_rate_csv(path: &Path) -> Result<RateTrace, SimError> {
    let f = std::fs::File::open(path).map_err(|e| SimError::io(path, e))?;
    parse_rate_csv(&path.display().to_string(), std::io::BufReader::new(f))
}

/// Parse a `period,count` trace from a reader; `name` is used in errors.
pub fn parse_rate_csv(name: &str, reader: impl BufRead) -> Result<RateTrace, SimError> {
    let mut rates = Vec::new();
    for (idx, line) in reader.lines().enumerate() {
        let lineno = idx + 1;
        let line = line.map_err(|e| SimError::TraceRow {
            path: name.into(),
            line: lineno,
            reason: format!("unreadable: {e}"),
        })?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if lineno == 1
            && fields
                .first()
                .is_some_and(|f| f.eq_ignore_ascii_case("period"))
        {
            continue;
        }
        if fields.len() != 2 {
            return Err(SimError::TraceRow {
                path: name.into(),
                line: lineno,
                reason: format!("expected 2 fields `period,count`, got {}", fields.len()),
            });
        }
        let count: f64 = fields[1].parse().map_err(|_| SimError::TraceRow {
            path: name.into(),
            line: lineno,
            reason: format!("count `{}` is not a number", fields[1]),
        })?;
        if !count.is_finite() || count < 0.0 {
            return Err(SimError::TraceRow {
                path: name.into(),
                line: lineno,
                reason: format!("count `{}` must be a finite number ≥ 0", fields[1]),
            });
        }
        rates.push(count);
    }
    RateTrace::from_rates(name, rates)
}

/// Load a per-request timestamp trace (`TIMESTAMP,...`) and bin it into per-second counts.
pub fn load_timestamps_csv(path: &Path) -> Result<RateTrace, SimError> {
    let f = std::fs::File::open(path).map_err(|e| SimError::io(path, e))?;
    parse_timestamps_csv(&path.display().to_string(), std::io::BufReader::new(f))
}

/// Parse a per-request timestamp trace from a reader; `name` is used in errors.
pub fn parse_timestamps_csv(name: &str, reader: impl BufRead) -> Result<RateTrace, SimError> {
    let mut times = Vec::new();
    let mut last = f64::NEG_INFINITY;
    for (idx, line) in reader.lines().enumerate() {
        let lineno = idx + 1;
        let line = line.map_err(|e| SimError::TraceRow {
            path: name.into(),
            line: lineno,
            reason: format!("unreadable: {e}"),
        })?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let first = line.split(',').next().unwrap_or("").trim();
        if lineno == 1 && first.eq_ignore_ascii_case("timestamp") {
            continue;
        }
        let t = parse_timestamp(first).ok_or_else(|| SimError::TraceRow {
            path: name.into(),
            line: lineno,
            reason: format!(
                "timestamp `{first}` is neither `YYYY-MM-DD HH:MM:SS[.frac]` nor seconds"
            ),
        })?;
        if t < last {
            return Err(SimError::TraceRow {
                path: name.into(),
                line: lineno,
                reason: format!("timestamp `{first}` goes back in time"),
            });
        }
        last = t;
        times.push(t);
    }
    let Some(&t0) = times.first() else {
        return Err(SimError::Trace {
            path: name.into(),
            reason: "no data rows".into(),
        });
    };
    let n = ((last - t0).floor() as usize) + 1;
    let mut rates = vec![0.0; n];
    for t in times {
        let i = ((t - t0).floor() as usize).min(n - 1);
        rates[i] += 1.0;
    }
    RateTrace::from_rates(name, rates)
}

/// Parse `YYYY-MM-DD HH:MM:SS[.frac]` (UTC) or plain seconds into seconds since the epoch.
pub fn parse_timestamp(s: &str) -> Option<f64> {
    if let Ok(v) = s.parse::<f64>() {
        return v.is_finite().then_some(v);
    }
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let m: i64 = d.next()?.parse().ok()?;
    let day: i64 = d.next()?.parse().ok()?;
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let mut t = time.trim_end_matches('Z').split(':');
    let hh: i64 = t.next()?.parse().ok()?;
    let mm: i64 = t.next()?.parse().ok()?;
    let ss: f64 = t.next()?.parse().ok()?;
    if t.next().is_some()
        || !(0..24).contains(&hh)
        || !(0..60).contains(&mm)
        || !(0.0..61.0).contains(&ss)
    {
        return None;
    }
    // days from civil (Howard Hinnant's algorithm)
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hh * 3600 + mm * 60) as f64 + ss)
}

/// A load ready to sample: pattern resolved (trace loaded, scaling fixed).
#[derive(Debug, Clone)]
pub enum LoadModel {
    /// Closed-form pattern.
    Pattern(LoadPattern),
    /// Trace with resolved scaling: rate(t) = factor · trace.window_mean(offset + t·time_scale).
    Trace {
        /// The trace.
        trace: Arc<RateTrace>,
        /// Trace seconds per simulated second.
        time_scale: f64,
        /// Offset into the trace (trace seconds).
        offset_s: f64,
        /// Rate multiplier.
        factor: f64,
    },
}

impl LoadModel {
    /// Resolve a spec; `capacity_rps` is the app's capacity at its largest allocation (for
    /// [`RateScale::PeakOfCapacity`]).
    pub fn resolve(spec: &LoadPattern, capacity_rps: f64) -> Result<Self, SimError> {
        match spec {
            LoadPattern::Trace {
                path,
                format,
                scaling,
            } => {
                let trace = match format {
                    TraceFormat::RateCsv => load_rate_csv(path)?,
                    TraceFormat::TimestampsCsv => load_timestamps_csv(path)?,
                };
                Self::from_trace(Arc::new(trace), scaling, capacity_rps)
            }
            other => {
                validate_pattern(other)?;
                Ok(LoadModel::Pattern(other.clone()))
            }
        }
    }

    /// Build from an already loaded trace.
    pub fn from_trace(
        trace: Arc<RateTrace>,
        scaling: &TraceScaling,
        capacity_rps: f64,
    ) -> Result<Self, SimError> {
        if !(scaling.time_scale.is_finite() && scaling.time_scale > 0.0) {
            return Err(SimError::Config(format!(
                "trace {}: time_scale must be > 0, got {}",
                trace.source, scaling.time_scale
            )));
        }
        if !(scaling.offset_s.is_finite() && scaling.offset_s >= 0.0) {
            return Err(SimError::Config(format!(
                "trace {}: offset_s must be ≥ 0, got {}",
                trace.source, scaling.offset_s
            )));
        }
        // rates are averaged over windows of `time_scale` trace seconds per simulated second,
        // so the mean is preserved and peaks are smoothed; we scale on the raw per-second stats.
        let (target, base) = match scaling.rate {
            RateScale::Factor(f) => (f, 1.0),
            RateScale::MeanRps(r) => (r, trace.mean()),
            RateScale::PeakRps(r) => (r, trace.peak()),
            RateScale::PeakOfCapacity(frac) => (frac * capacity_rps, trace.peak()),
        };
        if !(target.is_finite() && target >= 0.0) {
            return Err(SimError::Config(format!(
                "trace {}: rate scaling target must be ≥ 0, got {target}",
                trace.source
            )));
        }
        let factor = if base > 0.0 { target / base } else { 0.0 };
        Ok(LoadModel::Trace {
            trace,
            time_scale: scaling.time_scale,
            offset_s: scaling.offset_s,
            factor,
        })
    }

    /// Mean rate over simulated time [t, t+dt), before noise. `seed` drives bursty windows.
    pub fn mean_rate(&self, t: f64, dt: f64, seed: u64) -> f64 {
        match self {
            LoadModel::Pattern(p) => pattern_mean_rate(p, t, dt, seed),
            LoadModel::Trace {
                trace,
                time_scale,
                offset_s,
                factor,
            } => {
                let t0 = offset_s + t * time_scale;
                let t1 = offset_s + (t + dt) * time_scale;
                factor * trace.window_mean(t0, t1)
            }
        }
    }
}

fn validate_pattern(p: &LoadPattern) -> Result<(), SimError> {
    let ok = |v: f64| v.is_finite() && v >= 0.0;
    let pos = |v: f64| v.is_finite() && v > 0.0;
    let good = match p {
        LoadPattern::Constant { rps } => ok(*rps),
        LoadPattern::Diurnal {
            mean_rps,
            amplitude,
            period_s,
            phase_s,
        } => {
            ok(*mean_rps)
                && (0.0..=1.0).contains(amplitude)
                && pos(*period_s)
                && phase_s.is_finite()
        }
        LoadPattern::Bursty {
            base_rps,
            burst_rps,
            burst_probability,
            window_s,
        } => {
            ok(*base_rps)
                && ok(*burst_rps)
                && (0.0..=1.0).contains(burst_probability)
                && pos(*window_s)
        }
        LoadPattern::OnOff {
            on_rps,
            off_rps,
            on_s,
            off_s,
        } => ok(*on_rps) && ok(*off_rps) && pos(*on_s) && ok(*off_s),
        LoadPattern::Trace { .. } => true,
    };
    if good {
        Ok(())
    } else {
        Err(SimError::Config(format!("invalid load pattern {p:?}")))
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn pattern_rate_at(p: &LoadPattern, t: f64, seed: u64) -> f64 {
    match p {
        LoadPattern::Constant { rps } => *rps,
        LoadPattern::Diurnal {
            mean_rps,
            amplitude,
            period_s,
            phase_s,
        } => {
            mean_rps * (1.0 + amplitude * (std::f64::consts::TAU * (t + phase_s) / period_s).sin())
        }
        LoadPattern::Bursty {
            base_rps,
            burst_rps,
            burst_probability,
            window_s,
        } => {
            let w = (t / window_s).floor().max(0.0) as u64;
            let u = (splitmix(seed ^ splitmix(w)) >> 11) as f64 / (1u64 << 53) as f64;
            if u < *burst_probability {
                *burst_rps
            } else {
                *base_rps
            }
        }
        LoadPattern::OnOff {
            on_rps,
            off_rps,
            on_s,
            off_s,
        } => {
            let cycle = on_s + off_s;
            if t.rem_euclid(cycle) < *on_s {
                *on_rps
            } else {
                *off_rps
            }
        }
        LoadPattern::Trace { .. } => 0.0,
    }
}

fn pattern_mean_rate(p: &LoadPattern, t: f64, dt: f64, seed: u64) -> f64 {
    match p {
        LoadPattern::Constant { rps } => *rps,
        LoadPattern::Diurnal {
            mean_rps,
            amplitude,
            period_s,
            phase_s,
        } if dt > 0.0 => {
            // exact integral of the sine over the window
            let w = std::f64::consts::TAU / period_s;
            let integral =
                dt - amplitude / w * ((w * (t + dt + phase_s)).cos() - (w * (t + phase_s)).cos());
            mean_rps * integral / dt
        }
        _ if dt > 0.0 => {
            // piecewise-constant patterns: average 8 sub-samples (exact for aligned windows)
            let n = 8;
            let mut acc = 0.0;
            for k in 0..n {
                acc += pattern_rate_at(p, t + dt * (k as f64 + 0.5) / n as f64, seed);
            }
            acc / n as f64
        }
        _ => pattern_rate_at(p, t, seed),
    }
}

/// Number of arrivals in a step given the mean rate; Poisson when `poisson` (normal
/// approximation above 1000 expected arrivals, for speed).
pub fn sample_arrivals(rate: f64, dt: f64, poisson: bool, rng: &mut ChaCha8Rng) -> f64 {
    let mean = (rate * dt).max(0.0);
    if !poisson || mean <= 0.0 {
        return mean;
    }
    if mean > 1000.0 {
        let z: f64 = rng.sample(StandardNormal);
        (mean + z * mean.sqrt()).round().max(0.0)
    } else {
        match Poisson::new(mean) {
            Ok(d) => d.sample(rng),
            Err(_) => mean,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn rate_csv_parses_and_rejects_naming_line() {
        let ok = "period,count\n1998-06-25 22:00:01,116\n1998-06-25 22:00:02,281\n";
        let t = parse_rate_csv("x", ok.as_bytes()).unwrap();
        assert_eq!(t.rates, vec![116.0, 281.0]);
        let bad = "period,count\n1998-06-25 22:00:01,116\n1998-06-25 22:00:02,abc\n";
        let e = parse_rate_csv("x.csv", bad.as_bytes()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("x.csv:3"), "{msg}");
        assert!(matches!(e, SimError::TraceRow { line: 3, .. }));
        let bad2 = "period,count\n1,2,3\n";
        assert!(matches!(
            parse_rate_csv("x", bad2.as_bytes()),
            Err(SimError::TraceRow { line: 2, .. })
        ));
        let neg = "period,count\na,1\nb,-4\n";
        assert!(matches!(
            parse_rate_csv("x", neg.as_bytes()),
            Err(SimError::TraceRow { line: 3, .. })
        ));
        assert!(matches!(
            parse_rate_csv("x", "period,count\n".as_bytes()),
            Err(SimError::Trace { .. })
        ));
    }

    #[test]
    fn timestamps_parse_bin_and_reject() {
        let ok = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                  2023-11-16 18:17:03.9799600,4808,10\n\
                  2023-11-16 18:17:04.0319600,3180,8\n\
                  2023-11-16 18:17:04.5,110,27\n\
                  2023-11-16 18:17:06.0,1,1\n";
        let t = parse_timestamps_csv("x", ok.as_bytes()).unwrap();
        assert_eq!(t.rates.iter().sum::<f64>(), 4.0);
        assert_eq!(t.rates.len(), 3);
        let bad = "TIMESTAMP,a,b\n2023-11-16 18:17:03.9,1,1\n2023-13-16 18:17:04,1,1\n";
        let e = parse_timestamps_csv("y.csv", bad.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("y.csv:3"), "{e}");
        let back = "TIMESTAMP,a,b\n2023-11-16 18:17:05,1,1\n2023-11-16 18:17:04,1,1\n";
        assert!(matches!(
            parse_timestamps_csv("z", back.as_bytes()),
            Err(SimError::TraceRow { line: 3, .. })
        ));
    }

    #[test]
    fn timestamp_epoch() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Some(0.0));
        assert_eq!(
            parse_timestamp("2000-03-01 00:00:01.5"),
            Some(951_868_801.5)
        );
        assert_eq!(parse_timestamp("nonsense"), None);
    }

    #[test]
    fn window_mean_wraps_and_scales() {
        let t = RateTrace::from_rates("x", vec![10.0, 20.0, 30.0, 40.0]).unwrap();
        assert!((t.window_mean(0.0, 4.0) - 25.0).abs() < 1e-9);
        assert!((t.window_mean(4.0, 8.0) - 25.0).abs() < 1e-9);
        assert!((t.window_mean(1.0, 2.0) - 20.0).abs() < 1e-9);
        assert!((t.window_mean(0.5, 1.5) - 15.0).abs() < 1e-9);
        let m = LoadModel::from_trace(
            Arc::new(t),
            &TraceScaling {
                time_scale: 2.0,
                offset_s: 0.0,
                rate: RateScale::MeanRps(50.0),
            },
            0.0,
        )
        .unwrap();
        // sim [0,2) = trace [0,4) → mean 25 → scaled ×2
        assert!((m.mean_rate(0.0, 2.0, 0) - 50.0).abs() < 1e-9);
    }

    /// A negative or NaN offset was silently read as 0: it is refused, naming the key.
    #[test]
    fn a_negative_trace_offset_is_refused() {
        let t = Arc::new(RateTrace::from_rates("x", vec![10.0, 20.0]).unwrap());
        for offset_s in [-5.0, f64::NAN] {
            let scaling = TraceScaling {
                offset_s,
                ..TraceScaling::default()
            };
            let err = LoadModel::from_trace(t.clone(), &scaling, 100.0)
                .unwrap_err()
                .to_string();
            assert!(err.contains("offset_s"), "{err}");
        }
    }

    #[test]
    fn patterns_behave() {
        let d = LoadPattern::Diurnal {
            mean_rps: 100.0,
            amplitude: 0.5,
            period_s: 100.0,
            phase_s: 0.0,
        };
        let m = LoadModel::resolve(&d, 0.0).unwrap();
        assert!((m.mean_rate(0.0, 100.0, 1) - 100.0).abs() < 1e-6);
        assert!(m.mean_rate(20.0, 10.0, 1) > 140.0);
        let oo = LoadPattern::OnOff {
            on_rps: 10.0,
            off_rps: 0.0,
            on_s: 30.0,
            off_s: 30.0,
        };
        let m = LoadModel::resolve(&oo, 0.0).unwrap();
        assert_eq!(m.mean_rate(0.0, 15.0, 0), 10.0);
        assert_eq!(m.mean_rate(30.0, 15.0, 0), 0.0);
        let b = LoadPattern::Bursty {
            base_rps: 1.0,
            burst_rps: 100.0,
            burst_probability: 0.3,
            window_s: 10.0,
        };
        let m = LoadModel::resolve(&b, 0.0).unwrap();
        let bursts = (0..1000)
            .filter(|w| m.mean_rate(*w as f64 * 10.0, 10.0, 7) > 50.0)
            .count();
        assert!((200..400).contains(&bursts), "{bursts}");
        assert!(LoadModel::resolve(&LoadPattern::Constant { rps: -1.0 }, 0.0).is_err());
    }

    #[test]
    fn poisson_mean_close() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let n = 2000;
        let s: f64 = (0..n)
            .map(|_| sample_arrivals(5.0, 2.0, true, &mut rng))
            .sum();
        assert!((s / n as f64 - 10.0).abs() < 0.5);
        assert_eq!(sample_arrivals(5.0, 2.0, false, &mut rng), 10.0);
    }
}

#[cfg(test)]
mod excerpt_tests {
    use super::*;

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name)
    }

    #[test]
    fn worldcup_excerpt_loads() {
        let t = load_rate_csv(&testdata("worldcup98-rate-excerpt.csv")).unwrap();
        assert_eq!(t.rates.len(), 600);
        assert_eq!(t.rates[0], 116.0);
        assert!(t.mean() > 100.0 && t.peak() >= t.mean());
    }

    #[test]
    fn azure_excerpts_load() {
        for f in [
            "azure-llm-2023-conv-excerpt.csv",
            "azure-llm-2023-code-excerpt.csv",
        ] {
            let t = load_timestamps_csv(&testdata(f)).unwrap();
            assert_eq!(t.rates.iter().sum::<f64>(), 500.0, "{f}");
            assert!(t.duration_s() > 10.0);
        }
    }

    #[test]
    fn trace_scaled_to_capacity() {
        let pattern = LoadPattern::Trace {
            path: testdata("worldcup98-rate-excerpt.csv"),
            format: TraceFormat::RateCsv,
            scaling: TraceScaling {
                time_scale: 10.0,
                offset_s: 0.0,
                rate: RateScale::PeakOfCapacity(0.5),
            },
        };
        let m = LoadModel::resolve(&pattern, 1000.0).unwrap();
        // simulated 60 s cover the 600 trace seconds: its mean, scaled so the peak is 500 rps
        let LoadModel::Trace { trace, factor, .. } = &m else {
            panic!("not a trace")
        };
        assert!((trace.peak() * factor - 500.0).abs() < 1e-9);
        let mean = m.mean_rate(0.0, 60.0, 0);
        assert!((mean - trace.mean() * factor).abs() < 1e-6);
        assert!(mean < 500.0);
        let missing = LoadPattern::Trace {
            path: testdata("nope.csv"),
            format: TraceFormat::RateCsv,
            scaling: TraceScaling::default(),
        };
        assert!(matches!(
            LoadModel::resolve(&missing, 1.0),
            Err(SimError::Io { .. })
        ));
    }

    #[test]
    fn malformed_file_names_path_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.csv");
        std::fs::write(
            &p,
            "period,count\n1998-06-25 22:00:01,116\n1998-06-25 22:00:02\n",
        )
        .unwrap();
        let e = load_rate_csv(&p).unwrap_err().to_string();
        assert!(e.contains("bad.csv:3"), "{e}");
        assert!(e.contains("expected 2 fields"), "{e}");
    }
}
