//! `aware demo`, the main job, run as a user runs it: the binary, its stdout, the files it writes.

use std::path::Path;
use std::time::Duration;

use aware_tests::Proc;
use serde_json::Value;

const EPISODES: usize = 10;

/// Runs `aware demo --out OUT --pace-ms 40 ARGS…` to a successful exit; its stdout and report.
/// 40 ms per step: time for the trainer of a debug build.
fn demo(out: &Path, args: &[&str]) -> (String, Value) {
    finish(spawn_demo(out, args), out, Vec::new())
}

fn spawn_demo(out: &Path, args: &[&str]) -> Proc {
    let mut argv = vec!["demo", "--out", out.to_str().unwrap(), "--pace-ms", "40"];
    argv.extend_from_slice(args);
    Proc::spawn("aware", &argv, &[])
}

/// Waits for the demo's successful exit; its stdout (after `read`, the lines already read) and
/// report.
fn finish(mut p: Proc, out: &Path, read: Vec<String>) -> (String, Value) {
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(s) = p.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "demo still running after 600 s:\n{}",
            p.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = read
        .into_iter()
        .chain(p.drain_lines())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(status.success(), "{status:?}\n{stdout}\n{}", p.stderr());
    let report =
        serde_json::from_str(&std::fs::read_to_string(out.join("demo-summary.json")).unwrap())
            .unwrap();
    (stdout, report)
}

/// The demo takes its apps through the lifecycle (OFFLINE behind HPA/VPA, then ONLINE on the
/// trained policy), starts from empty stores every time, and writes its summary and plots.
/// Without pacing the lock-step simulation ended before the trainer's first round and every app
/// stayed OFFLINE; an earlier run's stores were resumed.
#[test]
fn the_demo_takes_apps_from_the_fallback_to_the_policy_and_writes_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo-out");
    // What an earlier run left: it must not be resumed.
    let stale = out.join("data").join("stale-from-an-earlier-run");
    std::fs::create_dir_all(&stale).unwrap();
    let episodes = EPISODES.to_string();
    let (stdout, report) = demo(
        &out,
        &[
            "--episodes",
            &episodes,
            "--steps-per-episode",
            "50",
            "--print-every",
            "100",
            "--no-meta",
        ],
    );
    assert!(!stale.exists(), "the earlier run's stores were kept");
    assert!(out.join("data").join("trajectories.db").is_file());

    assert_eq!(report["complete"], true, "{report}");
    assert_eq!(report["meta_dir"], Value::Null);
    assert_eq!(report["meta_source"], "off");
    let apps = report["apps"].as_object().unwrap();
    assert_eq!(apps.len(), 6, "three generated and three hand-written apps");
    let mut promoted = Vec::new();
    for (name, a) in apps {
        let eps = a["episodes"].as_array().unwrap();
        assert_eq!(eps.len(), EPISODES, "{name}");
        // A fresh start: episode 0 first, driven by the fallback while the policy trains.
        assert_eq!(eps[0]["episode"], 0, "{name}");
        assert_eq!(eps[0]["stage"], "offline", "{name}");
        assert_eq!(eps[0]["rl_steps"], 0, "{name}");
        assert!(eps[0]["mean_reward"].as_f64().unwrap().is_finite());
        assert_eq!(a["stage_changes"][0]["to"], "offline", "{name}");
        let online = a["stage_changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["from"] == "offline" && c["to"] == "online");
        if online {
            // Promoted: the policy then decided, and its episodes say so.
            assert!(a["actions_rl"].as_u64().unwrap() > 0, "{name}: {a}");
            assert!(
                eps.iter()
                    .any(|e| e["stage"] == "online" && e["rl_steps"].as_u64().unwrap() > 0),
                "{name}: {a}"
            );
            promoted.push(name.clone());
        }
        assert!(
            a["models"].as_u64().unwrap() > 0,
            "{name}: no model trained"
        );
        assert_eq!(a["embeddings"], 0, "{name}: --no-meta published embeddings");
    }
    assert!(
        promoted.len() >= 3,
        "only {promoted:?} went ONLINE within {EPISODES} episodes\n{stdout}"
    );
    assert!(
        stdout.contains("offline → online: model estimate"),
        "{stdout}"
    );
    assert!(
        stdout.contains("AWARE against HPA/VPA alone on the same apps and traces"),
        "{stdout}"
    );

    // The baseline: HPA/VPA throughout on the same apps and traces. Until an app's policy first
    // decides, both runs are the same fallback on the same load: the same rewards, exactly.
    let baseline = report["baseline"].as_object().unwrap();
    assert_eq!(baseline.len(), 6);
    for (name, a) in apps {
        let b = &baseline[name];
        let b_eps = b["episodes"].as_array().unwrap();
        assert_eq!(b_eps.len(), EPISODES, "{name}");
        assert!(b_eps.iter().all(|e| e["rl_steps"] == 0), "{name}: {b}");
        assert_eq!(b["actions_rl"], 0, "{name}");
        let same: Vec<_> = a["episodes"]
            .as_array()
            .unwrap()
            .iter()
            .take_while(|e| e["rl_steps"] == 0)
            .collect();
        assert!(!same.is_empty(), "{name}");
        for (e, be) in same.iter().zip(b_eps) {
            assert_eq!(e["episode"], be["episode"], "{name}");
            let (x, y) = (
                e["mean_reward"].as_f64().unwrap(),
                be["mean_reward"].as_f64().unwrap(),
            );
            assert!(
                (x - y).abs() < 1e-9,
                "{name} episode {}: {x} vs {y}",
                e["episode"]
            );
            assert_eq!(e["slo_violations"], be["slo_violations"], "{name}");
            let cores = |e: &Value| e["requested_cores_mean"].as_f64().unwrap();
            assert!((cores(e) - cores(be)).abs() < 1e-9, "{name}: {e} vs {be}");
        }
    }

    // The summary leads with SLO attainment and cost; both runs count the same intervals (every
    // step of the episodes summarised but the warm-up's), 10 simulated seconds each.
    for says in [
        "SLO attainment",
        "objective 99%",
        "core-hours: AWARE",
        "apps meeting the SLO objective (99%)",
    ] {
        assert!(stdout.contains(says), "{says}:\n{stdout}");
    }
    let summary = &report["summary"];
    assert_eq!(summary["slo_objective"], 0.99);
    assert_eq!(summary["step_seconds"], 10.0);
    let intervals = (EPISODES * 50 - 1) as u64;
    let rows = summary["apps"].as_array().unwrap();
    assert_eq!(rows.len(), 6);
    let mut with_slo = 0;
    for c in rows {
        let name = c["app"].as_str().unwrap();
        let suffix = format!("/{name}");
        let (key, a) = apps.iter().find(|(k, _)| k.ends_with(&suffix)).unwrap();
        for (run, totals) in [("aware", a), ("hpa_vpa", &baseline[key.as_str()])] {
            let f = &c[run];
            assert_eq!(f["intervals"], intervals, "{name} {run}");
            let n = totals["observations"].as_f64().unwrap();
            let cores = totals["requested_cores_sum"].as_f64().unwrap();
            assert!(cores > 0.0, "{name} {run}");
            let near = |x: &Value, y: f64| (x.as_f64().unwrap() - y).abs() < 1e-9;
            assert!(
                near(&f["core_hours"], cores * 10.0 / 3600.0),
                "{name} {run}: {f}"
            );
            assert!(
                near(&f["requested_cores_mean"], cores / n),
                "{name} {run}: {f}"
            );
            let gib = totals["requested_gib_sum"].as_f64().unwrap();
            assert!(
                near(&f["gib_hours"], gib * 10.0 / 3600.0),
                "{name} {run}: {f}"
            );
            if a["slo_p99_ms"].is_null() && a["slo_throughput_rps"].is_null() {
                assert!(f["slo_attainment"].is_null(), "{name}: no SLO");
            } else {
                let viol = totals["slo_violations"].as_f64().unwrap();
                assert!(
                    near(&f["slo_attainment"], 1.0 - viol / n),
                    "{name} {run}: {f}"
                );
            }
        }
        if !c["aware"]["slo_attainment"].is_null() {
            with_slo += 1;
        }
        assert!(c["core_hours_change"].is_f64(), "{name}: {c}");
    }
    assert_eq!(summary["apps_with_slo"], with_slo);

    let plots = report["plots"].as_array().unwrap();
    assert_eq!(plots.len(), 6);
    for (plot, must) in [
        ("demo-vs-hpa-vpa-cost.svg", "requested cores"),
        ("demo-reward.svg", "thumbnails"),
        ("demo-slo.svg", "worldcup-web"),
        ("demo-stages.svg", "serving"),
        ("demo-vs-hpa-vpa-reward.svg", "HPA/VPA alone"),
        ("demo-vs-hpa-vpa-slo.svg", "AWARE"),
    ] {
        let svg = std::fs::read_to_string(out.join(plot)).unwrap();
        assert!(svg.starts_with("<svg"), "{plot}");
        assert!(svg.contains(must), "{plot} lacks {must}");
        assert!(svg.contains("<polyline"), "{plot}");
    }
}

/// By default the demo bootstraps from the meta-learner shipped in the binary, at once: the
/// trainer then publishes every app's workload embedding. Another training is meta-trained once
/// into OUT/meta and reused while its options (and this build) match.
#[test]
fn the_demo_bootstraps_from_the_shipped_meta_learner_or_trains_its_own_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo-out");
    let shipped = out.join("meta-default");
    let meta = out.join("meta");
    let p = spawn_demo(&out, &["--episodes", "6"]);
    // A stale default would make the demo meta-train for minutes: fail at once instead.
    let said = p
        .wait_line("meta-learner:", Duration::from_secs(120))
        .unwrap_or_else(|| panic!("no meta-learner line; stderr:\n{}", p.stderr()));
    assert!(
        said.contains("meta-learner: the shipped default (models/meta-default"),
        "the shipped meta-learner is stale for this build: regenerate it with `aware train-meta --write-default` (see harness default_meta's tests)\n{said}"
    );
    let (stdout, report) = finish(p, &out, vec![said]);
    assert!(!stdout.contains("training it once"), "{stdout}");
    assert!(!meta.exists(), "trained although the default was shipped");
    assert!(shipped.join("base.ckpt").is_file() && shipped.join("manifest.json").is_file());
    assert_eq!(report["complete"], true, "{report}");
    assert_eq!(report["meta_source"], "shipped");
    assert_eq!(report["meta_dir"], shipped.display().to_string());
    for (name, a) in report["apps"].as_object().unwrap() {
        assert!(
            a["embeddings"].as_u64().unwrap() > 0,
            "{name}: no embedding published: {a}"
        );
    }

    // Another training than the shipped one: trained once into OUT/meta.
    let (stdout, report) = demo(&out, &["--episodes", "1", "--meta-iterations", "2"]);
    assert!(
        stdout.contains("meta-learner: training it once"),
        "{stdout}"
    );
    assert!(!stdout.contains("warning"), "{stdout}");
    assert!(meta.join("base.ckpt").is_file() && meta.join("meta.ckpt").is_file());
    assert!(meta.join("manifest.json").is_file());
    assert_eq!(report["meta_source"], "trained");
    assert_eq!(report["meta_dir"], meta.display().to_string());
    let written = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    let trained_at = written(&meta.join("base.ckpt"));

    // Again with the same options: reused, not trained again.
    let (stdout, report) = demo(&out, &["--episodes", "1", "--meta-iterations", "2"]);
    assert!(stdout.contains("meta-learner: reusing"), "{stdout}");
    assert!(!stdout.contains("training it once"), "{stdout}");
    assert_eq!(report["meta_source"], "reused");
    assert_eq!(report["meta_dir"], meta.display().to_string());
    assert_eq!(trained_at, written(&meta.join("base.ckpt")));

    // Other options: trained again.
    let (stdout, _) = demo(&out, &["--episodes", "1", "--meta-iterations", "3"]);
    assert!(
        stdout.contains("meta-learner: training it once"),
        "{stdout}"
    );
}

/// Settings the services would refuse stop the demo at once, naming them (before: a
/// `--steps-per-episode 0` demo waited for episodes that never came, and a `--meta` directory
/// without a meta-learner ran without meta-learning under a header saying otherwise).
#[test]
fn the_demo_refuses_bad_settings_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo-out");
    let missing = dir.path().join("no-meta-here");
    for (args, says) in [
        (
            vec!["--steps-per-episode", "0"],
            "learning.steps_per_episode".to_string(),
        ),
        (
            vec!["--set", "lifecycle_monitor.probation_margn=0.2"],
            "probation_margn".to_string(),
        ),
        (
            vec!["--set", "trainer.bc_alpha=-1"],
            "trainer.bc_alpha".to_string(),
        ),
        (
            vec!["--meta", missing.to_str().unwrap()],
            format!("--meta {}: no base.ckpt", missing.display()),
        ),
    ] {
        let mut argv = vec!["demo", "--out", out.to_str().unwrap()];
        argv.extend(args.iter().copied());
        let mut p = Proc::spawn("aware", &argv, &[]);
        let status = p.child.wait().unwrap();
        assert!(!status.success(), "{args:?}");
        assert!(p.stderr().contains(&says), "{args:?}: {}", p.stderr());
        assert!(
            !out.join("meta").exists() && !out.join("meta-default").exists(),
            "{args:?}: meta-trained or wrote the shipped meta-learner before refusing"
        );
    }
}
