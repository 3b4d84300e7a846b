//! The bus contract read from another language: the messages a real run puts on a real
//! nats-server, taken off it by a plain NATS client as raw bytes, decoded by Python's `msgpack`
//! and checked against the published JSON Schemas (`tests/validate_wire.py`), without any of our
//! code on the reading side. The golden fixtures pass the same check, and a broken message fails
//! it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aware_bus_schemas::{decode_any, DecisionSource, Event, EventKind};
use aware_shared::bus::Bus;
use aware_tests::NatsServer;
use futures::StreamExt;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Python of the virtualenv `tests/validate-manifests.sh` installs (with `msgpack` and
/// `jsonschema`); the README's test command runs it before the tests.
fn python() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
    let p = cache.join("aware-rs/venv/bin/python");
    assert!(
        p.is_file(),
        "{} missing: run `bash tests/validate-manifests.sh` (the README's test command does) to install the Python tools",
        p.display()
    );
    p
}

/// Runs `tests/validate_wire.py` on `files`: (passed, its report).
fn validate(files: &[PathBuf]) -> (bool, String) {
    let out = std::process::Command::new(python())
        .arg(repo().join("tests/validate_wire.py"))
        .arg(repo().join("bus-schemas/schemas"))
        .args(files)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Registrations encoded before a compatible field was added (`bus-schemas/fixtures/compat/`)
/// still match the published schemas.
#[test]
fn the_compatibility_fixtures_read_in_python_match_the_schemas() {
    let dir = repo().join("bus-schemas/fixtures/compat");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixture in {}", dir.display());
    let (ok, report) = validate(&files);
    assert!(ok, "{report}");
    assert!(report.contains("failed: 0"), "{report}");
}

#[test]
fn the_golden_fixtures_read_in_python_match_the_schemas_and_a_broken_message_does_not() {
    let fixtures: Vec<PathBuf> = EventKind::ALL
        .iter()
        .map(|k| repo().join(format!("bus-schemas/fixtures/{}.msgpack", k.as_str())))
        .collect();
    let (ok, report) = validate(&fixtures);
    assert!(ok, "{report}");
    for kind in EventKind::ALL {
        assert!(report.contains(&format!("{} 1", kind.as_str())), "{report}");
    }
    // The obs fixture with `step` as a string and `target` left out: both reported.
    let bytes = std::fs::read(&fixtures[0]).unwrap();
    let rmpv::Value::Map(fields) = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap() else {
        panic!("not a map")
    };
    let broken: Vec<(rmpv::Value, rmpv::Value)> = fields
        .into_iter()
        .filter(|(k, _)| k.as_str() != Some("target"))
        .map(|(k, v)| match k.as_str() {
            Some("step") => (k, rmpv::Value::from("seven")),
            _ => (k, v),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir
        .path()
        .join(format!("{}-broken.msgpack", EventKind::ALL[0].as_str()));
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &rmpv::Value::Map(broken)).unwrap();
    std::fs::write(&path, out).unwrap();
    let (ok, report) = validate(&[path]);
    assert!(!ok, "{report}");
    assert!(
        report.contains("'target' is a required property") && report.contains("step"),
        "{report}"
    );
}

#[actix_rt::test]
async fn a_real_runs_messages_on_nats_read_in_python_match_the_schemas() {
    let server = NatsServer::start().unwrap();
    // A plain NATS client, listening before anything is published.
    let client = async_nats::connect(server.url()).await.unwrap();
    let mut wire = client.subscribe("aware.v1.>").await.unwrap();
    client.flush().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = crate::bootstrap_loop::base_config(dir.path(), 2);
    cfg.bus.url = server.url();
    // Offline training soon and a low bar to go ONLINE, so `model` messages and RL actions (with
    // their raw action, model version and exploration) are on the wire too.
    cfg.lifecycle.t_online = 0.5;
    cfg.sections
        .insert("trainer".into(), crate::bootstrap_loop::quick_trainer());
    let bus = Bus::connect(&cfg.bus, "wire-schemas").await.unwrap();
    let (_episodes, running, shutdown) =
        crate::start_services(bus, cfg, "aware.v1.episode.*.*.*").await;

    // Up to 25 messages of every kind seen, and up to 25 RL actions.
    let mut kept: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    let required = ["obs", "action", "applied", "episode", "lifecycle", "model"];
    let enough = |kept: &BTreeMap<String, Vec<Vec<u8>>>| {
        required
            .iter()
            .all(|k| kept.get(*k).is_some_and(|v| v.len() >= 3))
            && kept.get("action_rl").is_some_and(|v| v.len() >= 3)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while !enough(&kept) {
        let msg = tokio::time::timeout_at(deadline, wire.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "90 s without every kind: {:?}",
                    kept.iter().map(|(k, v)| (k, v.len())).collect::<Vec<_>>()
                )
            })
            .unwrap();
        let kind = msg.subject.split('.').nth(2).unwrap().to_string();
        let rl = matches!(
            decode_any(&msg.payload),
            Ok(Event::Action(a)) if a.source == DecisionSource::Rl
        );
        let key = if rl { "action_rl".to_string() } else { kind };
        let v = kept.entry(key).or_default();
        if v.len() < 25 {
            v.push(msg.payload.to_vec());
        }
    }
    shutdown.cancel();
    running.join().await.unwrap();

    let mut files = Vec::new();
    for (key, payloads) in &kept {
        // RL actions are `action` messages: the file name carries the subject's kind.
        let kind = key.trim_end_matches("_rl");
        for (i, p) in payloads.iter().enumerate() {
            let path = dir.path().join(format!("{kind}-{key}{i}.msgpack"));
            std::fs::write(&path, p).unwrap();
            files.push(path);
        }
    }
    let (ok, report) = validate(&files);
    assert!(ok, "{report}");
    for kind in required {
        assert!(report.contains(&format!("{kind} ")), "{kind}: {report}");
    }
    assert!(report.contains("failed: 0"), "{report}");
    println!("{report}");
}
