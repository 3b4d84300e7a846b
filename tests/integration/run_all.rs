//! `aware run all --bus nats://…` and the service binaries as separate processes against a real
//! nats-server: what they publish is read with a schema-agnostic MessagePack reader (rmpv), what
//! they consume is written the same way, as a tool in another language would.

use std::time::Duration;

use aware_tests::{
    bin_path, http_get, metric, msgpack_field, msgpack_keys, parse_metrics, wait_ready, NatsServer,
    Proc,
};
use futures::StreamExt;
use rmpv::Value;

const HEADER: [&str; 5] = ["schema", "target", "episode", "step", "ts_ms"];

/// An `episode/1` message built field by field, without the project's types.
fn foreign_episode(
    ns: &str,
    name: &str,
    n: u64,
    stage: &str,
    mean: f64,
    estimate: Option<f64>,
) -> Vec<u8> {
    let kv = |k: &str, v: Value| (Value::from(k), v);
    // An ONLINE episode is a noise-free evaluation episode of the policy (the only kind that
    // decides ONLINE → SERVING with the default `lifecycle_monitor.online_noise_free_only`);
    // the others are the fallback's.
    let rl_steps = if stage == "online" { 100u32 } else { 0 };
    let mut map = vec![
        kv("schema", Value::from("episode/1")),
        kv(
            "target",
            Value::Map(vec![
                kv("namespace", Value::from(ns)),
                kv("name", Value::from(name)),
            ]),
        ),
        kv("episode", Value::from(n)),
        kv("step", Value::from(99u32)),
        kv("ts_ms", Value::from(1_767_225_600_000i64)),
        kv("steps", Value::from(100u32)),
        kv("total_reward", Value::from(mean * 100.0)),
        kv("mean_reward", Value::from(mean)),
        kv("slo_violations", Value::from(0u32)),
        kv("cpu_util_mean", Value::from(0.6)),
        kv("memory_util_mean", Value::from(0.5)),
        kv("rl_steps", Value::from(rl_steps)),
        kv("fallback_steps", Value::from(100 - rl_steps)),
        kv("stage", Value::from(stage)),
        kv("policy_estimate", estimate.map_or(Value::Nil, Value::from)),
    ];
    if rl_steps > 0 {
        map.push(kv("exploring_steps", Value::from(0u32)));
    }
    let map = Value::Map(map);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &map).unwrap();
    out
}

async fn next_on(sub: &mut async_nats::Subscriber, prefix: &str) -> async_nats::Message {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .unwrap_or_else(|_| panic!("no message on {prefix} within 10 s"))
            .unwrap();
        if m.subject.as_str().starts_with(prefix) {
            return m;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_over_nats_speaks_plain_messagepack() {
    let server = NatsServer::start().unwrap();
    let client = async_nats::connect(server.url()).await.unwrap();
    let mut all = client.subscribe("aware.v1.>").await.unwrap();
    client.flush().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("aware.toml");
    std::fs::write(
        &config,
        format!(
            "[trajectory_store]\nsqlite_path = \"{}\"\n\
         [lifecycle]\nwindow = 2\nt_online = 1.0\nt_serving = 1.3\nt_var = 0.15\n\
         [[targets]]\nnamespace = \"shop\"\nname = \"cart\"\n\
         [[targets]]\nnamespace = \"shop\"\nname = \"api.v2\"\n",
            dir.path().join("t.db").display()
        ),
    )
    .unwrap();
    let url = server.url();
    let mut proc = Proc::spawn(
        "aware",
        &[
            "run",
            "all",
            "--bus",
            &url,
            "--http-listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ],
        &[("RUST_LOG", "info")],
    );
    let addr = proc.http_addr();
    wait_ready(addr);

    // The two configured targets are announced OFFLINE; every documented field is there.
    let mut announced = Vec::new();
    for _ in 0..2 {
        let m = next_on(&mut all, "aware.v1.lifecycle.").await;
        let keys = msgpack_keys(&m.payload);
        for f in HEADER.iter().chain(&[
            "stage",
            "previous",
            "reason",
            "reward_mean",
            "reward_std",
            "window",
        ]) {
            assert!(
                keys.iter().any(|k| k == f),
                "lifecycle lacks `{f}`: {keys:?}"
            );
        }
        assert_eq!(
            msgpack_field(&m.payload, "schema").unwrap().as_str(),
            Some("lifecycle/1")
        );
        assert_eq!(
            msgpack_field(&m.payload, "stage").unwrap().as_str(),
            Some("offline")
        );
        let target = msgpack_field(&m.payload, "target").unwrap();
        let name = target
            .as_map()
            .unwrap()
            .iter()
            .find(|(k, _)| k.as_str() == Some("name"))
            .unwrap()
            .1
            .clone();
        announced.push((m.subject.to_string(), name.as_str().unwrap().to_string()));
    }
    announced.sort();
    assert_eq!(
        announced,
        vec![
            (
                "aware.v1.lifecycle.184.shop.cart".to_string(),
                "cart".to_string()
            ),
            (
                "aware.v1.lifecycle.24.shop.api_v2".to_string(),
                "api.v2".to_string()
            ),
        ]
    );

    // A foreign tool publishes episodes; the monitor takes `cart` ONLINE (Algorithm 1).
    for n in 1..=2 {
        client
            .publish(
                "aware.v1.episode.184.shop.cart",
                foreign_episode("shop", "cart", n, "offline", 0.5, Some(1.2)).into(),
            )
            .await
            .unwrap();
    }
    client.flush().await.unwrap();
    let m = next_on(&mut all, "aware.v1.lifecycle.184.shop.cart").await;
    assert_eq!(
        msgpack_field(&m.payload, "stage").unwrap().as_str(),
        Some("online")
    );
    assert_eq!(
        msgpack_field(&m.payload, "episode").unwrap().as_u64(),
        Some(2)
    );

    // `aware watch` prints the next transition (ONLINE → SERVING) as a JSON line.
    let watch = Proc::spawn(
        "aware",
        &[
            "watch",
            "aware.v1.lifecycle.>",
            "--bus",
            &url,
            "--limit",
            "1",
        ],
        &[("RUST_LOG", "info")],
    );
    // Wait until `aware watch` has subscribed (it logs `watching` once the server has it).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !watch.stderr().contains("watching") {
        assert!(
            std::time::Instant::now() < deadline,
            "watch never subscribed: {}",
            watch.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for n in 3..=4 {
        client
            .publish(
                "aware.v1.episode.184.shop.cart",
                foreign_episode("shop", "cart", n, "online", 1.5, None).into(),
            )
            .await
            .unwrap();
    }
    client.flush().await.unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let l = watch.wait_line("\"subject\"", Duration::from_secs(10));
        (l, watch.stderr())
    })
    .await
    .unwrap();
    let (line, werr) = line;
    let line = line.unwrap_or_else(|| panic!("watch printed nothing; stderr: {werr}"));
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["subject"], "aware.v1.lifecycle.184.shop.cart");
    assert_eq!(v["event"]["stage"], "serving");
    assert_eq!(v["event"]["previous"], "online");
    assert_eq!(v["event"]["target"]["namespace"], "shop");

    // Counters in /metrics.
    let (_, text) = http_get(addr, "/metrics").unwrap();
    let scrape = parse_metrics(&text);
    let lm = |event| [("service", "lifecycle-monitor"), ("event", event)];
    assert_eq!(
        metric(&scrape, "aware_messages_in_total", &lm("episode")),
        Some(4.0)
    );
    assert_eq!(
        metric(&scrape, "aware_messages_out_total", &lm("lifecycle")),
        Some(4.0)
    );

    // SIGTERM: clean exit.
    let status = proc
        .terminate(Duration::from_secs(15))
        .expect("exits after SIGTERM");
    assert!(
        status.success(),
        "exit {status:?}; stderr:\n{}",
        proc.stderr()
    );
    assert!(!proc.stderr().contains("panicked"), "{}", proc.stderr());
}

#[test]
fn every_service_binary_runs_on_its_own() {
    let server = NatsServer::start().unwrap();
    let url = server.url();
    let names = [
        "aware-metrics-collector",
        "aware-recommender",
        "aware-actuator",
        "aware-trajectory-recorder",
        "aware-meta-learner-trainer",
        "aware-lifecycle-monitor",
    ];
    let data = tempfile::tempdir().unwrap();
    let db = data.path().join("t.db").display().to_string();
    let mut procs: Vec<Proc> = names
        .iter()
        .map(|n| {
            let args = ["--bus", url.as_str(), "--http-listen", "127.0.0.1:0"];
            let args: Vec<&str> = if *n == "aware-recommender" {
                args.iter().copied().chain(["--shard", "0/2"]).collect()
            } else {
                args.to_vec()
            };
            Proc::spawn(
                n,
                &args,
                &[("AWARE_TRAJECTORY_STORE__SQLITE_PATH", db.as_str())],
            )
        })
        .collect();
    for (p, n) in procs.iter().zip(names) {
        let addr = p.http_addr();
        wait_ready(addr);
        let (code, body) = http_get(addr, "/healthz").unwrap();
        assert_eq!((code, body.trim()), (200, "ok"), "{n}");
        let (code, text) = http_get(addr, "/metrics").unwrap();
        assert_eq!(code, 200);
        let service = n.trim_start_matches("aware-");
        let scrape = parse_metrics(&text);
        assert!(
            metric(
                &scrape,
                "aware_decode_errors_total",
                &[("service", service), ("event", "obs")]
            )
            .is_some(),
            "{n}: {text}"
        );
    }
    for (p, n) in procs.iter_mut().zip(names) {
        let status = p
            .terminate(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{n} ignored SIGTERM"));
        assert!(status.success(), "{n}: {status:?}\n{}", p.stderr());
    }
}

/// The NATS server goes away, then the process is told to stop: the six services stop taking
/// messages, their final flush gives up after `bus.flush_timeout_ms` (the client would otherwise
/// wait for a reconnection for ever), and the process exits 0, saying what it could not flush.
#[test]
fn a_process_whose_nats_server_is_gone_still_stops_on_sigterm() {
    let server = NatsServer::start().unwrap();
    let url = server.url();
    let data = tempfile::tempdir().unwrap();
    let db = data.path().join("t.db").display().to_string();
    let models = data.path().join("models").display().to_string();
    let mut p = Proc::spawn(
        "aware",
        &["run", "all", "--bus", &url, "--http-listen", "127.0.0.1:0"],
        &[
            ("AWARE_TRAJECTORY_STORE__SQLITE_PATH", db.as_str()),
            ("AWARE_MODEL_STORE__DIR", models.as_str()),
            ("AWARE_BUS__FLUSH_TIMEOUT_MS", "1000"),
            ("RUST_LOG", "info"),
        ],
    );
    let addr = p.http_addr();
    wait_ready(addr);
    drop(server);
    // Not ready once the client has noticed.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while matches!(http_get(addr, "/readyz"), Ok((200, _))) {
        assert!(
            std::time::Instant::now() < deadline,
            "still ready without a server"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = p
        .terminate(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("did not stop without its NATS server:\n{}", p.stderr()));
    assert!(status.success(), "{status:?}\n{}", p.stderr());
    assert!(
        p.stderr().contains("bus.flush_timeout_ms (1000 ms)"),
        "{}",
        p.stderr()
    );
}

#[test]
fn invalid_configuration_fails_start_up_naming_the_key() {
    let mut p = Proc::spawn(
        "aware",
        &["run", "all", "--http-listen", "127.0.0.1:0"],
        &[("AWARE_BUS__CHANNEL_CAPACITY", "lots")],
    );
    let status = p.child.wait().unwrap();
    assert!(!status.success());
    assert!(
        p.stderr().contains("bus.channel_capacity"),
        "{}",
        p.stderr()
    );

    let mut p = Proc::spawn("aware", &["run", "all", "--shard", "2/2"], &[]);
    assert!(!p.child.wait().unwrap().success());
    assert!(p.stderr().contains("shard.index"), "{}", p.stderr());

    let mut p = Proc::spawn("aware", &["run", "nonsense"], &[]);
    assert!(!p.child.wait().unwrap().success());
    assert!(p.stderr().contains("lifecycle-monitor"), "{}", p.stderr());
    assert!(bin_path("aware").is_file());
}

/// A service that fails at start-up after the first has started (the recorder, third, with a
/// store it cannot open: its directory is a file, which even root cannot create in) stops the
/// whole process with an error naming the service and the key; `run all` used to wait on the
/// first service for ever, without a word, `/readyz` 503. At start it says it has nothing to
/// manage (no collector source on the embedded bus) and how to change that.
#[test]
fn run_all_exits_non_zero_on_a_later_services_start_up_failure() {
    let data = tempfile::tempdir().unwrap();
    let not_a_dir = data.path().join("file");
    std::fs::write(&not_a_dir, "x").unwrap();
    let db = not_a_dir.join("t.db").display().to_string();
    let models = data.path().join("models").display().to_string();
    let mut p = Proc::spawn(
        "aware",
        &["run", "all", "--http-listen", "127.0.0.1:0"],
        &[
            ("AWARE_TRAJECTORY_STORE__SQLITE_PATH", db.as_str()),
            ("AWARE_MODEL_STORE__DIR", models.as_str()),
        ],
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running 30 s after a failed start-up:\n{}",
            p.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = p.stderr();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("trajectory-recorder") && err.contains("trajectory_store.sqlite_path"),
        "{err}"
    );
    assert!(
        err.contains("nothing to manage") && err.contains("collector.source"),
        "{err}"
    );
}

#[test]
fn a_service_logs_a_variable_that_sets_nothing_at_start_up() {
    let mut p = Proc::spawn(
        "aware",
        &["run", "lifecycle-monitor", "--http-listen", "127.0.0.1:0"],
        &[("AWARE_LIFECYCLE_MONITOR_PROBATION_EPISODES", "2")],
    );
    let _ = p.http_addr();
    let status = p.terminate(Duration::from_secs(10)).unwrap();
    assert!(status.success(), "{}", p.stderr());
    assert!(
        p.stderr()
            .contains("`lifecycle_monitor_probation_episodes` sets nothing")
            && p.stderr()
                .contains("AWARE_LIFECYCLE_MONITOR__PROBATION_EPISODES"),
        "{}",
        p.stderr()
    );
}

#[test]
fn aware_config_prints_every_section_and_refuses_what_a_service_would() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("aware.toml");
    let run = |text: &str, env: &[(&str, &str)]| {
        std::fs::write(&file, text).unwrap();
        let out = std::process::Command::new(bin_path("aware"))
            .args([
                "config",
                "--config",
                file.to_str().unwrap(),
                "--shard",
                "1/4",
            ])
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // File, environment and flags layered; every service's section in full.
    let (ok, out, err) = run("[trainer]\nseed = 7\n", &[("AWARE_RECORDER__BATCH", "64")]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for section in aware_shared::config::SERVICE_SECTIONS {
        assert!(v[section].is_object(), "{section} missing: {out}");
    }
    assert_eq!(v["trainer"]["seed"], 7);
    assert_eq!(v["trainer"]["gradient_steps"], 200);
    assert_eq!(v["recorder"]["batch"], 64);
    assert_eq!(v["shard"]["index"], 1);
    assert!(!err.contains("warning"), "{err}");
    // `_` where `__` nests: nothing set, the output says so and what was meant.
    let (ok, out, err) = run("", &[("AWARE_BUS_URL", "nats://x:4222")]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["bus"]["url"], "embedded");
    assert!(
        err.contains("warning: `bus_url` sets nothing") && err.contains("AWARE_BUS__URL"),
        "{err}"
    );
    // What the trainer would refuse at its start-up, refused here, naming the section and key.
    let (ok, _, err) = run("[trainer]\ngradient_step = 10\n", &[]);
    assert!(!ok);
    assert!(
        err.contains("trainer") && err.contains("gradient_step"),
        "{err}"
    );
    // A misspelt section and a misspelt core key, refused by every command.
    let (ok, _, err) = run("[lifecycle-monitor]\nwindow = 3\n", &[]);
    assert!(!ok);
    assert!(err.contains("lifecycle-monitor"), "{err}");
    let (ok, _, err) = run("[bus]\nurll = \"nats://x:4222\"\n", &[]);
    assert!(!ok);
    assert!(err.contains("urll"), "{err}");
}
