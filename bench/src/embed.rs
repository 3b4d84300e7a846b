//! `aware bench embed` (paper §3.2, Fig. 6): embeddings of apps with known, different resource
//! sensitivities and load patterns, their cosine similarities and a 2-D PCA projection (SVG).
//!
//! Twelve hand-made apps: three resource classes — CPU-bound (matrix multiply), memory-heavy
//! (image resize of large images) and I/O (object-store reads) — × two load patterns (diurnal,
//! bursty) × two variants each (payload ±10%, other load phase and seed; the "twins"). Every app
//! runs `episodes` episodes of the fallback rule (the same policy for every app, so differences
//! come from the workload, not from the policy); the top-M by reward form its bundle, which the
//! meta-learner embeds. Similarity is reported by relation: twins (same class and pattern), same
//! class only, same pattern only, and neither.
//!
//! The meta-learner comes from `--meta DIR` (an `aware train-meta` output) or, without it, from
//! a short meta-training run into `<out>/embed-meta`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use aware_loadgen::app::{AppSpec, SegmentSpec, MIB};
use aware_loadgen::load::{LoadPattern, LoadSpec};
use aware_loadgen::{Allocation, Bounds, SegmentKind, Slo, VerticalMode};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use aware_harness::train_meta::{
    self, bundle_of, keep_top, run_episode, Driver, MetaObjective, TrainMetaOptions,
};

use super::BenchError;

impl From<train_meta::TrainMetaError> for BenchError {
    fn from(e: train_meta::TrainMetaError) -> Self {
        BenchError::Failed(e.to_string())
    }
}

impl From<aware_shared_model::ModelError> for BenchError {
    fn from(e: aware_shared_model::ModelError) -> Self {
        BenchError::Failed(e.to_string())
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct EmbedBenchOptions {
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// A trained meta-learner (`meta.ckpt`, `base.ckpt`); None: a short meta-training first.
    #[arg(
        long,
        help = "An `aware train-meta` output directory (default: a short meta-training first)"
    )]
    pub meta: Option<PathBuf>,
    /// Fallback episodes per app (the bundle is the top-M of them).
    #[arg(long, default_value_t = EmbedBenchOptions::default().episodes, help = "Fallback episodes per app (the bundle is their top-M)")]
    pub episodes: usize,
    #[arg(long, default_value_t = EmbedBenchOptions::default().steps_per_episode)]
    pub steps_per_episode: usize,
    #[arg(long, default_value_t = EmbedBenchOptions::default().seed)]
    pub seed: u64,
    /// The short meta-training used without `meta`.
    #[arg(skip = EmbedBenchOptions::default().train)]
    pub train: TrainMetaOptions,
}

impl Default for EmbedBenchOptions {
    fn default() -> Self {
        EmbedBenchOptions {
            out: PathBuf::from("bench-out"),
            meta: None,
            episodes: 8,
            steps_per_episode: 50,
            seed: 7,
            train: TrainMetaOptions {
                apps: 20,
                iterations: 60,
                progress_every: 0,
                // The paper's reward, which this benchmark measures in.
                objective: MetaObjective::Weighted,
                ..TrainMetaOptions::default()
            },
        }
    }
}

/// Resource class of a bench app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Cpu,
    Memory,
    Io,
}

/// Load pattern of a bench app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    Diurnal,
    Bursty,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchApp {
    pub name: String,
    pub class: Class,
    pub pattern: Pattern,
    pub segment: String,
    pub payload: f64,
    /// Mean per-step reward of the bundle's episodes.
    pub bundle_reward: f64,
    pub embedding: Vec<f32>,
    /// First two principal components.
    pub pca: [f64; 2],
}

/// Mean cosine similarity over pairs of one relation.
#[derive(Debug, Clone, Serialize)]
pub struct RelationSimilarity {
    pub relation: String,
    pub pairs: usize,
    pub mean_cosine: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct EmbedReport {
    pub meta_source: String,
    pub episodes: usize,
    pub steps_per_episode: usize,
    pub apps: Vec<BenchApp>,
    /// `cosine[i][j]` between apps i and j (order of `apps`).
    pub cosine: Vec<Vec<f64>>,
    /// Cosine similarity after subtracting the mean embedding of the bench apps (the raw
    /// embeddings share a large common component, so raw similarities differ only slightly).
    pub centered_cosine: Vec<Vec<f64>>,
    /// Mean raw cosine similarity per relation (twin, same_class, same_pattern, different).
    pub relations: Vec<RelationSimilarity>,
    /// The same on centered embeddings.
    pub centered_relations: Vec<RelationSimilarity>,
    /// Share of the variance the two components explain.
    pub pca_explained: [f64; 2],
    /// Fraction of apps whose nearest neighbour (centered cosine) is its twin.
    pub twin_nearest_fraction: f64,
    /// Fraction of apps whose nearest neighbour (centered cosine) has the same load pattern.
    pub pattern_nearest_fraction: f64,
    /// Fraction of apps whose nearest neighbour (centered cosine) has the same resource class.
    pub class_nearest_fraction: f64,
    pub wall_seconds: f64,
}

/// The twelve bench apps: (class, pattern, variant).
pub fn bench_apps() -> Vec<(AppSpec, Class, Pattern)> {
    let mut out = Vec::new();
    for class in [Class::Cpu, Class::Memory, Class::Io] {
        for pattern in [Pattern::Diurnal, Pattern::Bursty] {
            for variant in 0..2u32 {
                let scale = if variant == 0 { 0.95 } else { 1.05 };
                let (kind, payload) = match class {
                    Class::Cpu => (SegmentKind::MatrixMultiply, 60.0 * scale),
                    Class::Memory => (SegmentKind::ImageResize, 160.0 * scale),
                    Class::Io => (SegmentKind::ObjectStoreRead, 1024.0 * scale),
                };
                let cost = kind.cost(payload);
                let cpu = cost.cpu_seconds.max(1e-4);
                let mean = (10.0 / cpu * 0.4).max(1.0);
                let p = match pattern {
                    Pattern::Diurnal => LoadPattern::Diurnal {
                        mean_rps: mean,
                        amplitude: 0.6,
                        period_s: 2000.0 + 200.0 * f64::from(variant),
                        phase_s: 300.0 * f64::from(variant),
                    },
                    Pattern::Bursty => LoadPattern::Bursty {
                        base_rps: mean * 0.6,
                        burst_rps: mean * 2.5,
                        burst_probability: 0.25,
                        window_s: 60.0 + 30.0 * f64::from(variant),
                    },
                };
                let name = format!(
                    "{}-{}-{}",
                    match class {
                        Class::Cpu => "cpu-matmul",
                        Class::Memory => "mem-imgresize",
                        Class::Io => "io-objstore",
                    },
                    match pattern {
                        Pattern::Diurnal => "diurnal",
                        Pattern::Bursty => "bursty",
                    },
                    variant
                );
                let base_ms = (cost.cpu_seconds + cost.wait_seconds) * 1000.0;
                let app = AppSpec {
                    name,
                    namespace: "bench".into(),
                    segments: vec![SegmentSpec { kind, payload }],
                    slo: Slo {
                        latency_p99_ms: Some((base_ms * 5.0).max(20.0).round()),
                        throughput_rps: None,
                        objective: None,
                    },
                    alpha: 0.5,
                    bounds: Bounds::default(),
                    initial: Allocation {
                        replicas: ((mean * cpu / 0.7).ceil() as u32).clamp(1, 20),
                        cpu_millicores: 1000,
                        memory_bytes: 1024 * MIB,
                    },
                    vertical: VerticalMode::InPlace,
                    timeout_s: 30.0,
                    load: LoadSpec {
                        pattern: p,
                        poisson: true,
                    },
                };
                out.push((app, class, pattern));
            }
        }
    }
    out
}

/// Cosine similarity (0 if either vector is zero).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

/// 2-D PCA of the rows: (coordinates, explained variance share of each component), by power
/// iteration with deflation on the covariance matrix.
pub fn pca2(rows: &[Vec<f32>]) -> (Vec<[f64; 2]>, [f64; 2]) {
    let n = rows.len();
    let d = rows.first().map_or(0, Vec::len);
    if n == 0 || d == 0 {
        return (vec![[0.0; 2]; n], [0.0; 2]);
    }
    let mut mean = vec![0.0f64; d];
    for r in rows {
        for (m, x) in mean.iter_mut().zip(r) {
            *m += f64::from(*x) / n as f64;
        }
    }
    let x: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .zip(&mean)
                .map(|(v, m)| f64::from(*v) - m)
                .collect()
        })
        .collect();
    let mut cov = vec![vec![0.0f64; d]; d];
    for r in &x {
        for i in 0..d {
            for j in 0..d {
                cov[i][j] += r[i] * r[j] / n as f64;
            }
        }
    }
    let total: f64 = (0..d).map(|i| cov[i][i]).sum();
    let mut comps: Vec<Vec<f64>> = Vec::new();
    let mut explained = [0.0; 2];
    for (k, share) in explained.iter_mut().enumerate() {
        let mut v: Vec<f64> = (0..d)
            .map(|i| 1.0 + ((i * 31 + k * 17) % 7) as f64)
            .collect();
        let mut lambda = 0.0;
        for _ in 0..500 {
            let mut w: Vec<f64> = (0..d)
                .map(|i| (0..d).map(|j| cov[i][j] * v[j]).sum())
                .collect();
            for c in &comps {
                let p: f64 = w.iter().zip(c).map(|(a, b)| a * b).sum();
                for (wi, ci) in w.iter_mut().zip(c) {
                    *wi -= p * ci;
                }
            }
            let norm = w.iter().map(|a| a * a).sum::<f64>().sqrt();
            if norm < 1e-15 {
                break;
            }
            lambda = norm;
            v = w.into_iter().map(|a| a / norm).collect();
        }
        *share = if total > 0.0 { lambda / total } else { 0.0 };
        comps.push(v);
    }
    let coords = x
        .iter()
        .map(|r| {
            let p = |c: &Vec<f64>| r.iter().zip(c).map(|(a, b)| a * b).sum::<f64>();
            [p(&comps[0]), p(&comps[1])]
        })
        .collect();
    (coords, explained)
}

fn class_color(c: Class) -> &'static str {
    match c {
        Class::Cpu => "#d62728",
        Class::Memory => "#1f77b4",
        Class::Io => "#2ca02c",
    }
}

/// The PCA scatter as SVG: colour = resource class, marker = load pattern (circle diurnal,
/// square bursty), labelled.
pub fn pca_svg(apps: &[BenchApp], explained: [f64; 2]) -> String {
    let (w, h, pad) = (780.0, 520.0, 60.0);
    // Plot area, then room for the labels of the right-most points, then the legend.
    let plot_w = w - 2.0 * pad - 280.0;
    let xs: Vec<f64> = apps.iter().map(|a| a.pca[0]).collect();
    let ys: Vec<f64> = apps.iter().map(|a| a.pca[1]).collect();
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if lo.is_finite() && hi > lo {
            (lo, hi)
        } else {
            (-1.0, 1.0)
        }
    };
    let ((x0, x1), (y0, y1)) = (range(&xs), range(&ys));
    let px = |x: f64| pad + (x - x0) / (x1 - x0) * plot_w;
    let py = |y: f64| h - pad - (y - y0) / (y1 - y0) * (h - 2.0 * pad);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<text x="{pad}" y="24" font-size="14">Workload embeddings, PCA (PC1 {:.0}%, PC2 {:.0}% of variance)</text>"#,
        100.0 * explained[0],
        100.0 * explained[1]
    );
    let _ = write!(
        s,
        r##"<rect x="{pad}" y="{pad}" width="{plot_w}" height="{}" fill="none" stroke="#999"/>"##,
        h - 2.0 * pad
    );
    for a in apps {
        let (x, y) = (px(a.pca[0]), py(a.pca[1]));
        let c = class_color(a.class);
        match a.pattern {
            Pattern::Diurnal => {
                let _ = write!(s, r#"<circle cx="{x:.1}" cy="{y:.1}" r="6" fill="{c}"/>"#);
            }
            Pattern::Bursty => {
                let _ = write!(
                    s,
                    r#"<rect x="{:.1}" y="{:.1}" width="11" height="11" fill="{c}"/>"#,
                    x - 5.5,
                    y - 5.5
                );
            }
        }
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 8.0,
            y - 6.0,
            a.name
        );
    }
    let lx = w - 130.0;
    for (i, (label, c)) in [
        ("CPU (matmul)", Class::Cpu),
        ("memory (resize)", Class::Memory),
        ("I/O (object store)", Class::Io),
    ]
    .into_iter()
    .enumerate()
    {
        let y = pad + 10.0 + 18.0 * i as f64;
        let _ = write!(
            s,
            r#"<circle cx="{lx}" cy="{y}" r="5" fill="{}"/><text x="{}" y="{}">{label}</text>"#,
            class_color(c),
            lx + 10.0,
            y + 4.0
        );
    }
    let y = pad + 70.0;
    let _ = write!(
        s,
        r##"<circle cx="{lx}" cy="{y}" r="5" fill="#555"/><text x="{}" y="{}">diurnal</text><rect x="{}" y="{}" width="10" height="10" fill="#555"/><text x="{}" y="{}">bursty</text>"##,
        lx + 10.0,
        y + 4.0,
        lx - 5.0,
        y + 13.0,
        lx + 10.0,
        y + 22.0
    );
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">PC1</text><text x="18" y="{}" transform="rotate(-90 18 {})" text-anchor="middle">PC2</text></svg>"#,
        pad + plot_w / 2.0,
        h - 20.0,
        h / 2.0,
        h / 2.0
    );
    s
}

fn relation(a: (Class, Pattern), b: (Class, Pattern)) -> &'static str {
    match (a.0 == b.0, a.1 == b.1) {
        (true, true) => "twin",
        (true, false) => "same_class",
        (false, true) => "same_pattern",
        (false, false) => "different",
    }
}

/// Runs the bench; writes `embed.json` and `embed-pca.svg` into `opts.out`.
pub fn run(opts: &EmbedBenchOptions) -> Result<EmbedReport, BenchError> {
    let start = std::time::Instant::now();
    let (agent, source) = match &opts.meta {
        Some(dir) => (train_meta::load_agent(dir)?, dir.display().to_string()),
        None => {
            let dir = opts.out.join("embed-meta");
            let t = TrainMetaOptions {
                out: dir.clone(),
                ..opts.train.clone()
            };
            tracing::info!(
                iterations = t.iterations,
                apps = t.apps,
                "short meta-training"
            );
            train_meta::run(&t)?;
            (
                train_meta::load_agent(&dir)?,
                format!(
                    "short meta-training: {} apps, {} iterations ({})",
                    t.apps,
                    t.iterations,
                    dir.display()
                ),
            )
        }
    };
    let m = agent.meta().config().bundle_size;
    let specs = bench_apps();
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut apps = Vec::new();
    for (i, (spec, class, pattern)) in specs.iter().enumerate() {
        let mut store = Vec::new();
        for k in 0..opts.episodes {
            let seed = opts.seed ^ ((i as u64) << 16) ^ k as u64;
            let ep = run_episode(
                spec,
                opts.steps_per_episode,
                seed,
                Driver::Fallback,
                &mut rng,
            )?;
            keep_top(&mut store, ep, m);
        }
        let bundle = bundle_of(&store, m)?;
        let embedding = agent.embed(&bundle)?;
        let seg = spec.segments.first();
        apps.push(BenchApp {
            name: spec.name.clone(),
            class: *class,
            pattern: *pattern,
            segment: seg.map_or(String::new(), |s| s.kind.name().to_string()),
            payload: seg.map_or(0.0, |s| s.payload),
            bundle_reward: store.iter().map(|e| e.reward).sum::<f64>() / store.len().max(1) as f64,
            embedding,
            pca: [0.0; 2],
        });
    }
    let n = apps.len();
    let key = |i: usize| (apps[i].class, apps[i].pattern);
    let matrix = |v: &[Vec<f32>]| -> Vec<Vec<f64>> {
        (0..n)
            .map(|i| (0..n).map(|j| cosine(&v[i], &v[j])).collect())
            .collect()
    };
    let raw: Vec<Vec<f32>> = apps.iter().map(|a| a.embedding.clone()).collect();
    let dim = raw.first().map_or(0, Vec::len);
    let mean: Vec<f32> = (0..dim)
        .map(|k| raw.iter().map(|e| e[k]).sum::<f32>() / n.max(1) as f32)
        .collect();
    let centered: Vec<Vec<f32>> = raw
        .iter()
        .map(|e| e.iter().zip(&mean).map(|(x, m)| x - m).collect())
        .collect();
    let cos = matrix(&raw);
    let ccos = matrix(&centered);
    let relations_of = |c: &[Vec<f64>]| -> Vec<RelationSimilarity> {
        ["twin", "same_class", "same_pattern", "different"]
            .iter()
            .map(|r| {
                let v: Vec<f64> = (0..n)
                    .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
                    .filter(|&(i, j)| relation(key(i), key(j)) == *r)
                    .map(|(i, j)| c[i][j])
                    .collect();
                RelationSimilarity {
                    relation: r.to_string(),
                    pairs: v.len(),
                    mean_cosine: v.iter().sum::<f64>() / v.len().max(1) as f64,
                }
            })
            .collect()
    };
    let relations = relations_of(&cos);
    let centered_relations = relations_of(&ccos);
    let nearest = |i: usize| {
        (0..n)
            .filter(|&j| j != i)
            .max_by(|&a, &b| ccos[i][a].total_cmp(&ccos[i][b]))
    };
    let share = |pred: &dyn Fn(usize, usize) -> bool| {
        (0..n)
            .filter(|&i| nearest(i).is_some_and(|j| pred(i, j)))
            .count() as f64
            / n.max(1) as f64
    };
    let twin_nearest = share(&|i, j| key(i) == key(j));
    let pattern_nearest = share(&|i, j| key(i).1 == key(j).1);
    let class_nearest = share(&|i, j| key(i).0 == key(j).0);
    let emb: Vec<Vec<f32>> = apps.iter().map(|a| a.embedding.clone()).collect();
    let (coords, explained) = pca2(&emb);
    for (a, c) in apps.iter_mut().zip(coords) {
        a.pca = c;
    }
    let report = EmbedReport {
        meta_source: source,
        episodes: opts.episodes,
        steps_per_episode: opts.steps_per_episode,
        cosine: cos,
        centered_cosine: ccos,
        relations,
        centered_relations,
        pca_explained: explained,
        twin_nearest_fraction: twin_nearest,
        pattern_nearest_fraction: pattern_nearest,
        class_nearest_fraction: class_nearest,
        apps,
        wall_seconds: start.elapsed().as_secs_f64(),
    };
    let svg = pca_svg(&report.apps, explained);
    write_text(&opts.out, "embed-pca.svg", &svg)?;
    let value = serde_json::to_value(&report).map_err(|e| BenchError::Failed(e.to_string()))?;
    super::write_json(&opts.out, "embed.json", &value)?;
    Ok(report)
}

fn write_text(dir: &Path, name: &str, text: &str) -> Result<(), BenchError> {
    let path = dir.join(name);
    let io = |source| BenchError::Io {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(&path, text).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aware_shared_model::MetaConfig;

    #[test]
    fn pca_and_cosine_on_known_points() {
        assert!((cosine(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0, 0.0], &[0.0, 3.0]).abs() < 1e-12);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        // Points on a line in 3-D: one component explains everything.
        let rows: Vec<Vec<f32>> = (0..5)
            .map(|i| vec![i as f32, 2.0 * i as f32, 1.0])
            .collect();
        let (c, e) = pca2(&rows);
        assert!((e[0] - 1.0).abs() < 1e-6 && e[1].abs() < 1e-6, "{e:?}");
        let d01 = (c[1][0] - c[0][0]).abs();
        assert!((d01 - 5f64.sqrt()).abs() < 1e-6);
    }

    #[test]
    fn bench_apps_are_valid_and_distinct() {
        let apps = bench_apps();
        assert_eq!(apps.len(), 12);
        for (a, _, _) in &apps {
            a.validate().unwrap();
        }
        let mut names: Vec<&str> = apps.iter().map(|(a, _, _)| a.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 12);
    }

    /// After a short meta-training, twins (same resource class and load pattern) are closer than
    /// apps that differ in both, and the outputs are written.
    #[test]
    fn similar_apps_are_closer_than_dissimilar_ones() {
        let out = std::env::temp_dir().join(format!("aware-bench-embed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let opts = EmbedBenchOptions {
            out: out.clone(),
            episodes: 3,
            steps_per_episode: 20,
            train: TrainMetaOptions {
                apps: 6,
                iterations: 6,
                steps_per_episode: 20,
                apps_per_iteration: 2,
                updates_per_iteration: 1,
                batch: 16,
                meta: MetaConfig {
                    hidden: 16,
                    fc_hidden: 16,
                    embed_dim: 16,
                    bundle_size: 3,
                    ..MetaConfig::default()
                },
                base_hidden: vec![16, 16],
                progress_every: 0,
                // The paper's reward, which this benchmark measures in.
                objective: MetaObjective::Weighted,
                ..TrainMetaOptions::default()
            },
            ..EmbedBenchOptions::default()
        };
        let r = run(&opts).unwrap();
        let get = |rel: &[RelationSimilarity], name: &str| {
            rel.iter()
                .find(|x| x.relation == name)
                .map(|x| x.mean_cosine)
                .unwrap()
        };
        for rel in [&r.relations, &r.centered_relations] {
            assert!(
                get(rel, "twin") > get(rel, "different"),
                "twin {} vs different {}",
                get(rel, "twin"),
                get(rel, "different")
            );
        }
        let c = &r.centered_relations;
        assert!(get(c, "twin") > get(c, "same_class").min(get(c, "same_pattern")));
        // Sharing one characteristic is closer than sharing none.
        assert!(get(c, "same_class").max(get(c, "same_pattern")) > get(c, "different"));
        assert!(
            r.twin_nearest_fraction + r.class_nearest_fraction > 0.5,
            "{r:?}"
        );
        assert!(out.join("embed.json").exists() && out.join("embed-pca.svg").exists());
        let svg = std::fs::read_to_string(out.join("embed-pca.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<circle").count(), 6 + 4);
        let _ = std::fs::remove_dir_all(&out);
    }
}
