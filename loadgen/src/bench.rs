//! `aware bench sim`: simulated target-steps per second on one core, and p99 latency over a
//! replicas × CPU grid for three segments (JSON + SVG heatmaps, like paper Fig. 6, upper).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::app::{
    generate_apps, Allocation, AppSpec, Bounds, GeneratorOptions, SegmentSpec, Slo, VerticalMode,
    MIB,
};
use crate::cluster::{NodeShare, TargetSim};
use crate::env::{SimConfig, SimEnv, TargetAction};
use crate::error::SimError;
use crate::load::{LoadModel, LoadPattern, LoadSpec};
use crate::segments::SegmentKind;

/// Options of `aware bench sim`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimBenchOptions {
    /// Directory for `bench-sim.json` and the SVG heatmaps (created if missing).
    pub out_dir: PathBuf,
    /// Timed runs; the figure is their median.
    pub runs: usize,
    /// Targets (generated apps) per run.
    pub targets: usize,
    /// Steps per run.
    pub steps: u64,
    /// Seed.
    pub seed: u64,
    /// Segments of the latency grids.
    pub grid_segments: Vec<SegmentKind>,
    /// Load of the grids as a fraction of the capacity of 10 replicas × 1 core.
    pub grid_load_fraction: f64,
    /// Steps simulated per grid cell (p99 is averaged over all but the first).
    pub grid_steps: u64,
}

impl Default for SimBenchOptions {
    fn default() -> Self {
        SimBenchOptions {
            out_dir: PathBuf::from("bench-out"),
            runs: 5,
            targets: 64,
            steps: 2000,
            seed: 42,
            grid_segments: vec![
                SegmentKind::MatrixMultiply,
                SegmentKind::ImageResize,
                SegmentKind::JsonToYaml,
            ],
            grid_load_fraction: 0.5,
            grid_steps: 6,
        }
    }
}

/// p99 latency over a replicas × CPU grid for one segment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyGrid {
    /// Segment.
    pub segment: SegmentKind,
    /// Payload used.
    pub payload: f64,
    /// Offered load, requests/s.
    pub load_rps: f64,
    /// Replica axis (rows).
    pub replicas: Vec<u32>,
    /// CPU axis (columns), millicores.
    pub cpu_millicores: Vec<u32>,
    /// p99 latency in ms, `p99_ms[row][col]`.
    pub p99_ms: Vec<Vec<f64>>,
    /// Path of the heatmap.
    pub svg: PathBuf,
}

/// Result of `aware bench sim`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimBenchReport {
    /// Median simulated target-steps per second (one core).
    pub target_steps_per_sec_median: f64,
    /// Every run's figure.
    pub target_steps_per_sec_runs: Vec<f64>,
    /// Median target-steps/s through [`SimEnv::step`], which also builds every target's
    /// [`crate::env::Observation`] (state vector, metrics, clamp report) — the training path.
    pub observed_target_steps_per_sec_median: f64,
    /// Goal of the issue.
    pub target_steps_per_sec_goal: f64,
    /// Whether the median meets the goal.
    pub meets_goal: bool,
    /// Whether this was built with optimizations (debug builds are far slower).
    pub optimized_build: bool,
    /// Targets per run.
    pub targets: usize,
    /// Steps per run.
    pub steps: u64,
    /// Latency grids.
    pub grids: Vec<LatencyGrid>,
    /// Path of the JSON report.
    pub json: PathBuf,
}

const GOAL: f64 = 200_000.0;

/// Run the benchmark and write `bench-sim.json` and one `bench-sim-p99-<segment>.svg` per grid
/// segment into `opts.out_dir`.
pub fn bench_sim(opts: &SimBenchOptions) -> Result<SimBenchReport, SimError> {
    if opts.runs == 0 || opts.targets == 0 || opts.steps == 0 {
        return Err(SimError::Config(
            "bench sim needs runs, targets and steps > 0".into(),
        ));
    }
    std::fs::create_dir_all(&opts.out_dir).map_err(|e| SimError::io(&opts.out_dir, e))?;
    let mut runs = Vec::with_capacity(opts.runs);
    let mut observed = Vec::with_capacity(opts.runs);
    for run in 0..opts.runs {
        runs.push(throughput_run(opts, run as u64, false)?);
        observed.push(throughput_run(opts, run as u64, true)?);
    }
    let median = median_of(&runs);
    let observed_median = median_of(&observed);
    let mut grids = Vec::new();
    for &seg in &opts.grid_segments {
        let mut g = latency_grid(seg, opts)?;
        let svg = opts
            .out_dir
            .join(format!("bench-sim-p99-{}.svg", seg.name()));
        std::fs::write(&svg, heatmap_svg(&g)).map_err(|e| SimError::io(&svg, e))?;
        g.svg = svg;
        grids.push(g);
    }
    let json = opts.out_dir.join("bench-sim.json");
    let report = SimBenchReport {
        target_steps_per_sec_median: median,
        target_steps_per_sec_runs: runs,
        observed_target_steps_per_sec_median: observed_median,
        target_steps_per_sec_goal: GOAL,
        meets_goal: median >= GOAL,
        optimized_build: !cfg!(debug_assertions),
        targets: opts.targets,
        steps: opts.steps,
        grids,
        json: json.clone(),
    };
    let text = serde_json::to_string_pretty(&report).map_err(|source| SimError::Json {
        path: json.display().to_string(),
        source,
    })?;
    std::fs::write(&json, text).map_err(|e| SimError::io(&json, e))?;
    Ok(report)
}

fn median_of(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// One timed run: `targets` generated apps stepped `steps` times with a cycle of mixed actions
/// (raw, concrete, hold), single-threaded; `observed` steps through [`SimEnv::step`].
fn throughput_run(opts: &SimBenchOptions, run: u64, observed: bool) -> Result<f64, SimError> {
    let apps = generate_apps(
        opts.targets,
        opts.seed.wrapping_add(run),
        &GeneratorOptions::default(),
    );
    let mut env = SimEnv::new(
        apps,
        SimConfig {
            seed: opts.seed.wrapping_add(run),
            ..SimConfig::default()
        },
    )?;
    let n = env.len();
    let cycle: Vec<Vec<TargetAction>> = (0..16u32)
        .map(|k| {
            (0..n as u32)
                .map(|i| {
                    let x = ((k * 37 + i * 11) % 200) as f32 / 100.0 - 1.0;
                    match (k + i) % 4 {
                        0 => TargetAction::Raw([x, x * 0.5, -x * 0.3]),
                        1 => TargetAction::Desired(Allocation {
                            replicas: 1 + (k + i) % 12,
                            cpu_millicores: 256 + ((k * 131 + i) % 1700),
                            memory_bytes: (512 + u64::from((k * 97 + i) % 2000)) * MIB,
                        }),
                        _ => TargetAction::Hold,
                    }
                })
                .collect()
        })
        .collect();
    let mut rewards = Vec::with_capacity(n);
    let mut checksum = 0.0;
    let start = Instant::now();
    for s in 0..opts.steps {
        let actions = &cycle[(s % 16) as usize];
        if observed {
            checksum += env.step(actions)?.iter().map(|o| o.reward).sum::<f64>();
        } else {
            env.step_rewards(actions, &mut rewards)?;
            checksum += rewards.iter().sum::<f64>();
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    if !checksum.is_finite() {
        return Err(SimError::Config("non-finite reward in benchmark".into()));
    }
    Ok((opts.steps as f64 * n as f64) / secs)
}

/// p99 over replicas 1..=20 × CPU 128..=2048 (step 128) for a single-segment app at a constant
/// load (no Poisson noise; demand noise on), memory at the maximum.
pub fn latency_grid(seg: SegmentKind, opts: &SimBenchOptions) -> Result<LatencyGrid, SimError> {
    let payload = seg.default_payload();
    let bounds = Bounds::default();
    let app = AppSpec {
        name: format!("grid-{}", seg.name()),
        namespace: "bench".into(),
        segments: vec![SegmentSpec { kind: seg, payload }],
        slo: Slo::default(),
        alpha: 0.5,
        bounds,
        initial: bounds.max_allocation(),
        vertical: VerticalMode::InPlace,
        timeout_s: 30.0,
        load: LoadSpec {
            pattern: LoadPattern::Constant { rps: 0.0 },
            poisson: false,
        },
    };
    let cpu = seg.cost(payload).cpu_seconds;
    let load_rps = opts.grid_load_fraction * 10.0 / cpu;
    let app = Arc::new(app);
    let load = Arc::new(LoadModel::Pattern(LoadPattern::Constant { rps: load_rps }));
    let replicas: Vec<u32> = (bounds.min_replicas..=bounds.max_replicas).collect();
    let cpus: Vec<u32> = (1..=16).map(|k| k * 128).collect();
    let mut p99 = Vec::with_capacity(replicas.len());
    for &r in &replicas {
        let mut row = Vec::with_capacity(cpus.len());
        for &c in &cpus {
            let mut t = TargetSim::new(
                app.clone(),
                load.clone(),
                10.0,
                opts.seed,
                0,
                NodeShare::default(),
            )?;
            t.apply(Allocation {
                replicas: r,
                cpu_millicores: c,
                memory_bytes: bounds.max_memory_bytes,
            });
            let mut acc = 0.0;
            let mut k = 0.0;
            for s in 0..opts.grid_steps.max(2) {
                let m = t.advance();
                if s > 0 {
                    acc += m.p99_ms;
                    k += 1.0;
                }
            }
            row.push(acc / k);
        }
        p99.push(row);
    }
    Ok(LatencyGrid {
        segment: seg,
        payload,
        load_rps,
        replicas,
        cpu_millicores: cpus,
        p99_ms: p99,
        svg: PathBuf::new(),
    })
}

fn color(t: f64) -> String {
    // green (low) → yellow → red (high)
    let t = t.clamp(0.0, 1.0);
    let (r, g, b) = if t < 0.5 {
        let u = t / 0.5;
        (
            26.0 + u * (254.0 - 26.0),
            152.0 + u * (224.0 - 152.0),
            80.0 + u * (139.0 - 80.0),
        )
    } else {
        let u = (t - 0.5) / 0.5;
        (
            254.0 - u * (254.0 - 215.0),
            224.0 - u * (224.0 - 48.0),
            139.0 - u * (139.0 - 39.0),
        )
    };
    format!("#{:02x}{:02x}{:02x}", r as u8, g as u8, b as u8)
}

/// Render a grid as an SVG heatmap (log color scale, replicas on y, CPU on x).
pub fn heatmap_svg(g: &LatencyGrid) -> String {
    let (cw, ch) = (34.0, 20.0);
    let (left, top) = (70.0, 50.0);
    let cols = g.cpu_millicores.len() as f64;
    let rows = g.replicas.len() as f64;
    let width = left + cols * cw + 120.0;
    let height = top + rows * ch + 60.0;
    let vals = g
        .p99_ms
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite() && *v > 0.0);
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for v in vals {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        lo = 1.0;
        hi = 1.0;
    }
    let (llo, lhi) = (lo.ln(), hi.ln().max(lo.ln() + 1e-9));
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<text x="{left}" y="20" font-size="14">p99 latency (ms), {} (payload {}), {:.0} req/s</text>"#,
        g.segment.name(),
        g.payload,
        g.load_rps
    );
    for (ri, &r) in g.replicas.iter().enumerate() {
        let y = top + (rows - 1.0 - ri as f64) * ch;
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{r}</text>"#,
            left - 6.0,
            y + ch * 0.7
        );
        for (ci, &c) in g.cpu_millicores.iter().enumerate() {
            let v = g.p99_ms[ri][ci];
            let t = (v.max(lo).ln() - llo) / (lhi - llo);
            let x = left + ci as f64 * cw;
            let _ = write!(
                s,
                r#"<rect x="{x}" y="{y}" width="{cw}" height="{ch}" fill="{}"><title>{r} replicas, {c}m: {v:.1} ms</title></rect>"#,
                color(t)
            );
        }
    }
    for (ci, &c) in g.cpu_millicores.iter().enumerate() {
        if ci % 2 == 1 {
            let x = left + ci as f64 * cw + cw / 2.0;
            let _ = write!(
                s,
                r#"<text x="{x}" y="{}" text-anchor="middle">{c}</text>"#,
                top + rows * ch + 15.0
            );
        }
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">CPU limit per replica (millicores)</text>"#,
        left + cols * cw / 2.0,
        top + rows * ch + 35.0
    );
    let _ = write!(
        s,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">replicas</text>"#,
        top + rows * ch / 2.0,
        top + rows * ch / 2.0
    );
    // legend
    let lx = left + cols * cw + 30.0;
    for k in 0..10 {
        let t = 1.0 - k as f64 / 9.0;
        let _ = write!(
            s,
            r#"<rect x="{lx}" y="{}" width="20" height="{}" fill="{}"/>"#,
            top + k as f64 * rows * ch / 10.0,
            rows * ch / 10.0,
            color(t)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}">{hi:.0} ms</text><text x="{}" y="{}">{lo:.1} ms</text></svg>"#,
        lx + 24.0,
        top + 10.0,
        lx + 24.0,
        top + rows * ch
    );
    s
}

/// Read a report written by [`bench_sim`].
pub fn read_report(path: &Path) -> Result<SimBenchReport, SimError> {
    let text = std::fs::read_to_string(path).map_err(|e| SimError::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| SimError::Json {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_writes_json_and_svgs() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SimBenchOptions {
            out_dir: dir.path().to_path_buf(),
            runs: 3,
            targets: 4,
            steps: 50,
            grid_steps: 3,
            ..SimBenchOptions::default()
        };
        let rep = bench_sim(&opts).unwrap();
        assert_eq!(rep.target_steps_per_sec_runs.len(), 3);
        assert!(rep.target_steps_per_sec_median > 0.0);
        assert_eq!(rep.grids.len(), 3);
        for g in &rep.grids {
            assert_eq!(g.p99_ms.len(), 20);
            assert!(g.p99_ms.iter().all(|r| r.len() == 16));
            // more replicas and more CPU never hurt (Fig. 6 shape): corners ordered
            assert!(g.p99_ms[0][0] >= g.p99_ms[19][15]);
            let svg = std::fs::read_to_string(&g.svg).unwrap();
            assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
            assert_eq!(svg.matches("<rect").count(), 20 * 16 + 10);
        }
        let back = read_report(&rep.json).unwrap();
        assert_eq!(back.grids.len(), rep.grids.len());
        assert_eq!(back.target_steps_per_sec_runs.len(), 3);
        assert!(bench_sim(&SimBenchOptions { runs: 0, ..opts }).is_err());
    }
}
