//! `aware demo`, the main job, run as a user runs it: the binary, its stdout, the files it writes.

use std::path::Path;
use std::time::Duration;

use aware_tests::Proc;
use serde_json::Value;

const EPISODES: usize = 10;

/// Runs `aware demo --out OUT --pace-ms 40 ARGS…` to a successful exit; its stdout and report.
/// 40 ms per step: time for the trainer of a debug build.
fn demo(out: &Path, args: &[&str]) -> (String, Value) {
    let mut argv = vec!["demo", "--out", out.to_str().unwrap(), "--pace-ms", "40"];
    argv.extend_from_slice(args);
    let mut p = Proc::spawn("aware", &argv, &[]);
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
    let stdout = p.drain_lines().join("\n");
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
        }
    }

    let plots = report["plots"].as_array().unwrap();
    assert_eq!(plots.len(), 5);
    for (plot, must) in [
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

/// By default the demo bootstraps from a meta-learner it trains once into OUT/meta and reuses
/// while its options match: the trainer then publishes every app's workload embedding.
#[test]
fn the_demo_meta_trains_once_and_reuses_its_meta_learner() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo-out");
    let meta = out.join("meta");
    let (stdout, report) = demo(&out, &["--episodes", "6", "--meta-iterations", "2"]);
    assert!(
        stdout.contains("meta-learner: training it once"),
        "{stdout}"
    );
    assert!(meta.join("base.ckpt").is_file() && meta.join("meta.ckpt").is_file());
    assert_eq!(report["complete"], true, "{report}");
    assert_eq!(report["meta_dir"], meta.display().to_string());
    for (name, a) in report["apps"].as_object().unwrap() {
        assert!(
            a["embeddings"].as_u64().unwrap() > 0,
            "{name}: no embedding published: {a}"
        );
    }
    let written = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    let trained_at = written(&meta.join("base.ckpt"));

    // Again with the same options: reused, not trained again.
    let (stdout, report) = demo(&out, &["--episodes", "1", "--meta-iterations", "2"]);
    assert!(stdout.contains("meta-learner: reusing"), "{stdout}");
    assert!(!stdout.contains("training it once"), "{stdout}");
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
            !out.join("meta").exists(),
            "{args:?}: meta-trained before refusing"
        );
    }
}
