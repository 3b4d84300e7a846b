//! `aware bench kube` at a tiny scale: every phase runs against the real control plane and its
//! report is complete and consistent with what was asked.

use aware_bench::kube::{run, summary, KubeBenchOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_kube_at_twenty_targets_reports_every_phase() {
    let out = tempfile::tempdir().unwrap();
    let opts = KubeBenchOptions {
        out: out.path().to_path_buf(),
        targets: 20,
        duration_s: 20,
        act_rounds: 2,
        interval_s: 4.0,
        resync_seconds: 5,
        register_timeout_s: 120,
        create_concurrency: 8,
    };
    let r = run(&opts).await.unwrap();
    let text = summary(&r).join("\n");
    eprintln!("{text}");

    let g = &r.registration;
    assert_eq!(g.registered, 20, "{text}");
    assert_eq!(
        g.status_registered, 20,
        "every object's Registered condition: {text}"
    );
    let all = g.all_registered_s.expect("every target registered");
    assert!(all > 0.0 && all < 120.0, "{text}");
    assert!(g.after_last_create_s.is_some(), "{text}");
    assert!(
        g.create_to_registration_p50_ms > 0.0
            && g.create_to_registration_p50_ms <= g.create_to_registration_p99_ms
            && g.create_to_registration_p99_ms <= g.create_to_registration_max_ms,
        "{text}"
    );
    assert!(
        g.reconciles >= 20.0,
        "a reconcile per object at least: {text}"
    );
    let (p50, p99) = (g.reconcile_p50_ms.unwrap(), g.reconcile_p99_ms.unwrap());
    assert!(p50 > 0.0 && p50 <= p99, "{text}");
    // The finalizer and the first status: at least one PATCH per object.
    assert!(g.controller_writes_per_target >= 1.0, "{text}");
    assert!(
        g.api.by_call.contains_key("POST awareautoscalers 201"),
        "the bench's creates are counted by the API server: {:?}",
        g.api.by_call
    );

    let s = r.steady.as_ref().expect("steady state measured");
    assert!(s.window_s >= 20.0, "{text}");
    // Every object is resynced every 5 s: about 12 reconciles per target per minute, each
    // reading its Deployment.
    assert!(
        (6.0..=24.0).contains(&s.reconciles_per_target_per_min),
        "{text}"
    );
    assert!(
        s.requests_per_target_per_min >= s.reconciles_per_target_per_min,
        "{text}"
    );
    assert!(s.reconcile_p99_ms.is_some(), "{text}");

    let a = r.acting.as_ref().expect("acting measured");
    assert_eq!(a.actions, 40, "{text}");
    assert_eq!(a.applied, 40, "every action applied: {text}");
    assert_eq!(a.unanswered, 0, "{text}");
    assert_eq!(
        a.deployments_as_decided, 20,
        "replicas of the last round (1): {text}"
    );
    assert!(
        a.decision_to_api_p50_ms > 0.0 && a.decision_to_api_p50_ms <= a.decision_to_api_p99_ms,
        "{text}"
    );
    // Each action changes the replicas: one scale PATCH each.
    assert!(
        (a.actuator_writes_per_target_per_interval - 1.0).abs() < 1e-9,
        "{text}"
    );
    assert!(a.status_writes_per_target_per_interval > 0.0, "{text}");

    let m = &r.memory;
    assert!(
        m.controller_rss_idle_bytes > 0
            && m.controller_rss_peak_bytes >= m.controller_rss_idle_bytes,
        "{text}"
    );
    assert!(
        m.actuator_rss_end_bytes > 0 && m.apiserver_rss_end_bytes > 0 && m.etcd_rss_end_bytes > 0,
        "{text}"
    );
    assert_eq!(
        r.targets.acting_writes_under_one_per_interval,
        Some(false),
        "a scale and a status write per action: {text}"
    );
    assert!(r.targets.decision_to_api_p99_under_1s.is_some(), "{text}");

    let json = serde_json::to_value(&r).unwrap();
    for key in [
        "registration",
        "steady",
        "acting",
        "memory",
        "api_total",
        "targets",
    ] {
        assert!(!json[key].is_null(), "{key} missing in {json:#}");
    }
}
