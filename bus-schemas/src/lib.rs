//! The AWARE bus contract (docs/design.md §2): message types, subjects, the MessagePack codec, generated
//! JSON Schemas and golden fixtures.
//!
//! External tools need none of this crate: messages are MessagePack maps with the field names
//! documented here and in `bus-schemas/schemas/*.schema.json`.

pub mod codec;
pub mod generated;
mod messages;
pub mod subject;

pub use codec::{decode, decode_any, decode_event, encode, encode_event, DecodeError, EncodeError};
pub use messages::*;

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use proptest::prelude::*;

    use crate::generated::{fixture_file, json_schema, samples, schema_file};
    use crate::*;

    fn crate_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn every_sample_round_trips() {
        let samples = samples();
        assert_eq!(samples.len(), EventKind::ALL.len());
        for ev in samples {
            let bytes = encode_event(&ev).unwrap();
            assert_eq!(decode_any(&bytes).unwrap(), ev);
            assert_eq!(decode_event(ev.kind(), &bytes).unwrap(), ev);
        }
    }

    #[test]
    fn golden_fixtures_match_committed_bytes() {
        for ev in samples() {
            let path = crate_dir().join("fixtures").join(fixture_file(ev.kind()));
            let committed = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (run `aware schemas --write bus-schemas`)",
                    path.display()
                )
            });
            let encoded = encode_event(&ev).unwrap();
            assert_eq!(
                encoded,
                committed,
                "encoding of {} changed: this breaks the wire contract; bump the schema version or \
                 regenerate deliberately with `aware schemas --write bus-schemas`",
                ev.kind()
            );
            assert_eq!(decode_any(&committed).unwrap(), ev);
        }
    }

    #[test]
    fn committed_json_schemas_are_fresh() {
        for kind in EventKind::ALL {
            let path = crate_dir().join("schemas").join(schema_file(kind));
            let committed = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(
                committed,
                json_schema(kind),
                "{} is stale: run `aware schemas --write bus-schemas`",
                path.display()
            );
        }
    }

    #[test]
    fn json_schema_names_the_header_fields() {
        for kind in EventKind::ALL {
            let v: serde_json::Value = serde_json::from_str(&json_schema(kind)).unwrap();
            let required: Vec<&str> = v["required"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap())
                .collect();
            for f in ["schema", "target", "episode", "step", "ts_ms"] {
                assert!(required.contains(&f), "{kind}: {f} not required");
            }
            assert_eq!(
                v["properties"]["schema"]["const"],
                format!("{}/1", kind.as_str())
            );
        }
    }

    /// `spec.container` joined `target/1` without a version bump. Both directions hold: a
    /// registration encoded before it existed (the committed fixture of that time) decodes with
    /// no container, and one carrying it decodes with a reader that does not know the field
    /// (the `RegisteredSpec` of that time, mirrored here) — and a registration without a
    /// container still encodes byte for byte as it did then.
    #[test]
    fn the_container_field_is_compatible_both_ways() {
        let old =
            std::fs::read(crate_dir().join("fixtures/compat/target-before-container.msgpack"))
                .unwrap();
        let Event::Registration(read) = decode_any(&old).unwrap() else {
            panic!("not a registration")
        };
        let spec = read.spec.clone().unwrap();
        assert_eq!(spec.container, None);
        assert_eq!(
            encode(&read).unwrap(),
            old,
            "an absent container must encode as before"
        );

        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct OldSpec {
            min_replicas: u32,
            max_replicas: u32,
            min_cpu_millicores: u32,
            max_cpu_millicores: u32,
            min_memory_bytes: u64,
            max_memory_bytes: u64,
            slo_latency_p99_ms: Option<f64>,
            slo_throughput_rps: Option<f64>,
            alpha: f64,
            recommend_only: bool,
            lifecycle: Option<RegisteredLifecycle>,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct OldRegistration {
            schema: String,
            target: Target,
            episode: u64,
            step: u32,
            ts_ms: i64,
            generation: u64,
            source: String,
            spec: Option<OldSpec>,
        }
        let new = Registration {
            spec: Some(RegisteredSpec {
                container: Some("sidecar".to_string()),
                ..spec
            }),
            ..read
        };
        let bytes = encode(&new).unwrap();
        assert_ne!(bytes, old);
        let by_old: OldRegistration = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(by_old.schema, "target/1");
        assert_eq!(
            by_old.spec.unwrap().max_replicas,
            new.spec.as_ref().unwrap().max_replicas
        );
        let Event::Registration(back) = decode_any(&bytes).unwrap() else {
            panic!("not a registration")
        };
        assert_eq!(back.spec.unwrap().container.as_deref(), Some("sidecar"));
    }

    /// `spec.limits` joined `target/1` without a version bump, as `container` did: a
    /// registration encoded before it existed (the committed fixture of that time) decodes with
    /// no policy (the default) and encodes byte for byte as then, and one carrying it decodes with
    /// a reader that does not know the field (the `RegisteredSpec` of that time, mirrored here).
    #[test]
    fn the_limits_field_is_compatible_both_ways() {
        let old = std::fs::read(crate_dir().join("fixtures/compat/target-before-limits.msgpack"))
            .unwrap();
        let Event::Registration(read) = decode_any(&old).unwrap() else {
            panic!("not a registration")
        };
        let spec = read.spec.clone().unwrap();
        assert_eq!(spec.limits, None);
        assert_eq!(spec.container.as_deref(), Some("app"));
        assert_eq!(
            encode(&read).unwrap(),
            old,
            "an absent limits policy must encode as before"
        );

        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct OldSpec {
            min_replicas: u32,
            max_replicas: u32,
            min_cpu_millicores: u32,
            max_cpu_millicores: u32,
            min_memory_bytes: u64,
            max_memory_bytes: u64,
            slo_latency_p99_ms: Option<f64>,
            slo_throughput_rps: Option<f64>,
            alpha: f64,
            recommend_only: bool,
            lifecycle: Option<RegisteredLifecycle>,
            container: Option<String>,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct OldRegistration {
            schema: String,
            target: Target,
            episode: u64,
            step: u32,
            ts_ms: i64,
            generation: u64,
            source: String,
            spec: Option<OldSpec>,
        }
        let policy = LimitsPolicy {
            controlled_values: ControlledValues::RequestsOnly,
            cpu_limit: CpuLimit::Unset,
        };
        let new = Registration {
            spec: Some(RegisteredSpec {
                limits: Some(policy),
                ..spec
            }),
            ..read
        };
        let bytes = encode(&new).unwrap();
        assert_ne!(bytes, old);
        let by_old: OldRegistration = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(by_old.schema, "target/1");
        assert_eq!(by_old.spec.unwrap().container.as_deref(), Some("app"));
        let Event::Registration(back) = decode_any(&bytes).unwrap() else {
            panic!("not a registration")
        };
        assert_eq!(back.spec.unwrap().limits, Some(policy));
        // The policy's enums travel as their names.
        let value = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let text = value.to_string();
        assert!(
            text.contains("\"RequestsOnly\"") && text.contains("\"Unset\""),
            "{text}"
        );
    }

    /// `spec.slo_objective` joined `target/1` without a version bump, as `limits` did: a
    /// registration encoded before it existed (the committed fixture of that time) decodes with
    /// no objective (the default) and encodes byte for byte as then, and one carrying it decodes
    /// with a reader that does not know the field (the `RegisteredSpec` of that time, mirrored
    /// here).
    #[test]
    fn the_slo_objective_field_is_compatible_both_ways() {
        let old =
            std::fs::read(crate_dir().join("fixtures/compat/target-before-slo-objective.msgpack"))
                .unwrap();
        let Event::Registration(read) = decode_any(&old).unwrap() else {
            panic!("not a registration")
        };
        let spec = read.spec.clone().unwrap();
        assert_eq!(spec.slo_objective, None);
        assert!(spec.limits.is_some());
        assert_eq!(
            encode(&read).unwrap(),
            old,
            "an absent objective must encode as before"
        );

        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct OldSpec {
            min_replicas: u32,
            max_replicas: u32,
            min_cpu_millicores: u32,
            max_cpu_millicores: u32,
            min_memory_bytes: u64,
            max_memory_bytes: u64,
            slo_latency_p99_ms: Option<f64>,
            slo_throughput_rps: Option<f64>,
            alpha: f64,
            recommend_only: bool,
            lifecycle: Option<RegisteredLifecycle>,
            container: Option<String>,
            limits: Option<LimitsPolicy>,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct OldRegistration {
            schema: String,
            target: Target,
            episode: u64,
            step: u32,
            ts_ms: i64,
            generation: u64,
            source: String,
            spec: Option<OldSpec>,
        }
        let new = Registration {
            spec: Some(RegisteredSpec {
                slo_objective: Some(0.999),
                ..spec
            }),
            ..read
        };
        let bytes = encode(&new).unwrap();
        assert_ne!(bytes, old);
        let by_old: OldRegistration = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(by_old.schema, "target/1");
        assert_eq!(
            by_old.spec.unwrap().slo_latency_p99_ms,
            new.spec.as_ref().unwrap().slo_latency_p99_ms
        );
        let Event::Registration(back) = decode_any(&bytes).unwrap() else {
            panic!("not a registration")
        };
        assert_eq!(back.spec.unwrap().slo_objective, Some(0.999));
    }

    /// `spec.fallback_hpa_target_cpu_utilization` joined `target/1` without a version bump, as
    /// `slo_objective` did: a registration encoded before it existed (the committed fixture of
    /// that time) decodes with no override (the recommender's own HPA target) and encodes byte
    /// for byte as then, and one carrying it decodes with a reader that does not know the field
    /// (the `RegisteredSpec` of that time, mirrored here).
    #[test]
    fn the_fallback_hpa_target_field_is_compatible_both_ways() {
        let old = std::fs::read(
            crate_dir().join("fixtures/compat/target-before-fallback-hpa-target.msgpack"),
        )
        .unwrap();
        let Event::Registration(read) = decode_any(&old).unwrap() else {
            panic!("not a registration")
        };
        let spec = read.spec.clone().unwrap();
        assert_eq!(spec.fallback_hpa_target_cpu_utilization, None);
        assert_eq!(spec.slo_objective, Some(0.995));
        assert_eq!(
            encode(&read).unwrap(),
            old,
            "an absent override must encode as before"
        );

        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct OldSpec {
            min_replicas: u32,
            max_replicas: u32,
            min_cpu_millicores: u32,
            max_cpu_millicores: u32,
            min_memory_bytes: u64,
            max_memory_bytes: u64,
            slo_latency_p99_ms: Option<f64>,
            slo_throughput_rps: Option<f64>,
            alpha: f64,
            recommend_only: bool,
            lifecycle: Option<RegisteredLifecycle>,
            container: Option<String>,
            limits: Option<LimitsPolicy>,
            slo_objective: Option<f64>,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct OldRegistration {
            schema: String,
            target: Target,
            episode: u64,
            step: u32,
            ts_ms: i64,
            generation: u64,
            source: String,
            spec: Option<OldSpec>,
        }
        let new = Registration {
            spec: Some(RegisteredSpec {
                fallback_hpa_target_cpu_utilization: Some(0.35),
                ..spec
            }),
            ..read
        };
        let bytes = encode(&new).unwrap();
        assert_ne!(bytes, old);
        let by_old: OldRegistration = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(by_old.schema, "target/1");
        assert_eq!(by_old.spec.unwrap().slo_objective, Some(0.995));
        let Event::Registration(back) = decode_any(&bytes).unwrap() else {
            panic!("not a registration")
        };
        assert_eq!(
            back.spec.unwrap().fallback_hpa_target_cpu_utilization,
            Some(0.35)
        );
    }

    /// `metrics.spec_replicas` joined `obs/1` without a version bump: an observation encoded
    /// before it existed decodes with none and encodes byte for byte as then, and one carrying
    /// it decodes with a reader that does not know the field (the `RawMetrics` of that time).
    #[test]
    fn the_spec_replicas_field_is_compatible_both_ways() {
        let old =
            std::fs::read(crate_dir().join("fixtures/compat/obs-before-spec-replicas.msgpack"))
                .unwrap();
        let Event::Obs(read) = decode_any(&old).unwrap() else {
            panic!("not an obs")
        };
        assert_eq!(read.metrics.spec_replicas, None);
        assert_eq!(read.metrics.pending_replicas, None);
        assert_eq!(read.metrics.replicas_in_force(), read.metrics.replicas);
        assert_eq!(
            encode(&read).unwrap(),
            old,
            "an absent spec_replicas must encode as before"
        );

        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct OldMetrics {
            replicas: u32,
            ready_replicas: u32,
            cpu_limit_cores: f64,
            memory_limit_bytes: f64,
            cpu_usage_cores: f64,
            memory_working_set_bytes: f64,
            cpu_util: f64,
            memory_util: f64,
            io_util: f64,
            network_util: f64,
            request_rate_rps: f64,
            throughput_rps: f64,
            latency_p50_ms: Option<f64>,
            latency_p99_ms: Option<f64>,
            oom_kills: u32,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct OldObs {
            schema: String,
            target: Target,
            episode: u64,
            step: u32,
            ts_ms: i64,
            state: Vec<f32>,
            metrics: OldMetrics,
            reward: Option<f64>,
            slo_violation: bool,
            complete: bool,
            missing: Vec<String>,
        }
        let mut new = read.clone();
        new.metrics.spec_replicas = Some(read.metrics.replicas + 2);
        let bytes = encode(&new).unwrap();
        assert_ne!(bytes, old);
        let by_old: OldObs = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(by_old.schema, "obs/1");
        assert_eq!(by_old.metrics.replicas, read.metrics.replicas);
        assert_eq!(by_old.metrics.oom_kills, read.metrics.oom_kills);
        let Event::Obs(back) = decode_any(&bytes).unwrap() else {
            panic!("not an obs")
        };
        assert_eq!(back.metrics.spec_replicas, Some(read.metrics.replicas + 2));
        assert_eq!(back.metrics.replicas_in_force(), read.metrics.replicas + 2);
    }

    /// `requested_cores_mean` and `requested_gib_mean` joined `episode/1` without a version
    /// bump: an episode encoded before them (the committed golden fixture of that time) decodes
    /// with none and encodes byte for byte as then, and one carrying them decodes with a reader
    /// that does not know them (the `Episode` of that time, mirrored here).
    #[test]
    fn the_requested_means_are_compatible_both_ways() {
        let old =
            std::fs::read(crate_dir().join("fixtures/compat/episode-before-requested.msgpack"))
                .unwrap();
        let Event::Episode(read) = decode_any(&old).unwrap() else {
            panic!("not an episode")
        };
        assert_eq!(read.requested_cores_mean, None);
        assert_eq!(read.requested_gib_mean, None);
        assert_eq!(
            encode(&read).unwrap(),
            old,
            "absent means must encode as before"
        );

        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct OldEpisode {
            schema: String,
            target: Target,
            episode: u64,
            step: u32,
            ts_ms: i64,
            steps: u32,
            total_reward: f64,
            mean_reward: f64,
            slo_violations: u32,
            cpu_util_mean: f64,
            memory_util_mean: f64,
            rl_steps: u32,
            fallback_steps: u32,
            stage: Stage,
            policy_estimate: Option<f64>,
            exploring_steps: Option<u32>,
        }
        let new = Episode {
            requested_cores_mean: Some(3.25),
            requested_gib_mean: Some(6.5),
            ..read.clone()
        };
        let bytes = encode(&new).unwrap();
        assert_ne!(bytes, old);
        let by_old: OldEpisode = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(by_old.schema, "episode/1");
        assert_eq!(by_old.slo_violations, read.slo_violations);
        assert_eq!(by_old.exploring_steps, read.exploring_steps);
        let Event::Episode(back) = decode_any(&bytes).unwrap() else {
            panic!("not an episode")
        };
        assert_eq!(back.requested_cores_mean, Some(3.25));
        assert_eq!(back.requested_gib_mean, Some(6.5));
    }

    /// `slo_unreachable` joined `action/1` without a version bump: an action encoded before it
    /// existed (the committed golden fixture of that time) decodes with none and encodes byte for
    /// byte as then, and one carrying it decodes with a reader that does not know the field (the
    /// `Action` of that time, mirrored here).
    #[test]
    fn the_slo_unreachable_field_is_compatible_both_ways() {
        let old = std::fs::read(
            crate_dir().join("fixtures/compat/action-before-slo-unreachable.msgpack"),
        )
        .unwrap();
        let Event::Action(read) = decode_any(&old).unwrap() else {
            panic!("not an action")
        };
        assert_eq!(read.slo_unreachable, None);
        assert!(
            !read.slo_judged,
            "an action from before says nothing on reachability"
        );
        assert_eq!(
            encode(&read).unwrap(),
            old,
            "an absent slo_unreachable must encode as before"
        );

        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct OldAction {
            schema: String,
            target: Target,
            episode: u64,
            step: u32,
            ts_ms: i64,
            source: DecisionSource,
            stage: Stage,
            raw: Vec<f32>,
            current: Resources,
            desired: Resources,
            model_version: Option<u64>,
            exploration: bool,
            fallback_reason: Option<String>,
        }
        let needed = Resources {
            replicas: read.desired.replicas * 3,
            ..read.desired
        };
        let new = Action {
            slo_unreachable: Some(needed),
            slo_judged: true,
            ..read.clone()
        };
        let bytes = encode(&new).unwrap();
        assert_ne!(bytes, old);
        let by_old: OldAction = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(by_old.schema, "action/1");
        assert_eq!(by_old.desired, read.desired);
        assert_eq!(by_old.current, read.current);
        let Event::Action(back) = decode_any(&bytes).unwrap() else {
            panic!("not an action")
        };
        assert_eq!(back.slo_unreachable, Some(needed));
        assert!(back.slo_judged);
        assert_eq!(back, new);
        // Judged reachable: only the flag travels.
        let reachable = Action {
            slo_judged: true,
            ..read.clone()
        };
        let bytes = encode(&reachable).unwrap();
        let by_old: OldAction = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(by_old.desired, read.desired);
        let Event::Action(back) = decode_any(&bytes).unwrap() else {
            panic!("not an action")
        };
        assert_eq!((back.slo_unreachable, back.slo_judged), (None, true));
    }

    #[test]
    fn wire_format_is_a_named_map_readable_without_our_types() {
        for ev in samples() {
            let bytes = encode_event(&ev).unwrap();
            let value = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
            let map = value.as_map().expect("top level is a map");
            let keys: Vec<&str> = map.iter().map(|(k, _)| k.as_str().unwrap()).collect();
            for f in ["schema", "target", "episode", "step", "ts_ms"] {
                assert!(keys.contains(&f), "{}: {f} missing in {keys:?}", ev.kind());
            }
            let schema = map
                .iter()
                .find(|(k, _)| k.as_str() == Some("schema"))
                .unwrap()
                .1
                .as_str()
                .unwrap();
            assert_eq!(schema, format!("{}/1", ev.kind()));
        }
    }

    #[test]
    fn enums_are_encoded_as_strings() {
        let ev = samples()
            .into_iter()
            .find(|e| e.kind() == EventKind::Action)
            .unwrap();
        let bytes = encode_event(&ev).unwrap();
        let value = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let get = |k: &str| {
            value
                .as_map()
                .unwrap()
                .iter()
                .find(|(key, _)| key.as_str() == Some(k))
                .unwrap()
                .1
                .clone()
        };
        assert_eq!(get("source").as_str(), Some("rl"));
        assert_eq!(get("stage").as_str(), Some("online"));
    }

    #[test]
    fn nan_in_a_state_survives_the_codec() {
        let Event::Obs(mut obs) = samples().remove(0) else {
            panic!("first sample is obs")
        };
        obs.state[0] = f32::NAN;
        let back: Obs = decode(&encode(&obs).unwrap()).unwrap();
        assert!(back.state[0].is_nan());
    }

    fn with_schema(ev: &Event, schema: &str) -> Vec<u8> {
        let bytes = encode_event(ev).unwrap();
        let mut value = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        if let rmpv::Value::Map(entries) = &mut value {
            for (k, v) in entries.iter_mut() {
                if k.as_str() == Some("schema") {
                    *v = rmpv::Value::from(schema);
                }
            }
        }
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &value).unwrap();
        out
    }

    #[test]
    fn typed_errors_for_bad_input() {
        let obs = samples().remove(0);
        assert_eq!(decode_any(&[]), Err(DecodeError::Empty));
        assert_eq!(
            decode_any(&[0x93, 1, 2, 3]),
            Err(DecodeError::NotAMap(0x93))
        );
        assert!(matches!(
            decode_any(&with_schema(&obs, "obs/2")),
            Err(DecodeError::UnsupportedVersion { .. })
        ));
        assert!(matches!(
            decode_any(&with_schema(&obs, "weather/1")),
            Err(DecodeError::UnknownKind(_))
        ));
        assert!(matches!(
            decode::<Action>(&encode_event(&obs).unwrap()),
            Err(DecodeError::WrongSchema {
                expected: "action/1",
                ..
            })
        ));
        // A map without a schema field.
        let no_schema = rmp_serde::to_vec_named(&Target::new("a", "b")).unwrap();
        assert!(matches!(
            decode_any(&no_schema),
            Err(DecodeError::NoSchema(_))
        ));
        // Trailing bytes.
        let mut trailing = encode_event(&obs).unwrap();
        trailing.push(0xc0);
        assert_eq!(decode_any(&trailing), Err(DecodeError::TrailingBytes(1)));
        // A right schema with a field of the wrong type.
        let Event::Obs(o) = &obs else { unreachable!() };
        let mut value = rmpv::decode::read_value(&mut &encode(o).unwrap()[..]).unwrap();
        if let rmpv::Value::Map(entries) = &mut value {
            for (k, v) in entries.iter_mut() {
                if k.as_str() == Some("step") {
                    *v = rmpv::Value::from("forty-two");
                }
            }
        }
        let mut wrong = Vec::new();
        rmpv::encode::write_value(&mut wrong, &value).unwrap();
        let err = decode_any(&wrong).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Malformed {
                    kind: EventKind::Obs,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn every_truncation_of_every_message_is_an_error() {
        for ev in samples() {
            let bytes = encode_event(&ev).unwrap();
            for len in 0..bytes.len() {
                assert!(
                    decode_any(&bytes[..len]).is_err(),
                    "{} truncated to {len} bytes decoded",
                    ev.kind()
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_any(&bytes);
            for kind in EventKind::ALL {
                let _ = decode_event(kind, &bytes);
            }
        }

        #[test]
        fn mutated_messages_never_panic(
            idx in 0usize..8,
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        ) {
            let ev = &samples()[idx];
            let mut bytes = encode_event(ev).unwrap();
            for (at, byte) in flips {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            if let Ok(decoded) = decode_any(&bytes) {
                // Whatever decodes re-encodes and decodes to itself.
                let again = encode_event(&decoded).unwrap();
                let back = decode_any(&again).unwrap();
                prop_assert_eq!(back.kind(), decoded.kind());
            }
        }

        #[test]
        fn obs_round_trips(
            episode in any::<u64>(),
            step in any::<u32>(),
            state in proptest::collection::vec(-10.0f32..10.0, 0..80),
            reward in proptest::option::of(-100.0f64..100.0),
            ns in "[a-z][a-z0-9-]{0,20}",
        ) {
            let Event::Obs(mut obs) = samples().remove(0) else { unreachable!() };
            obs.episode = episode;
            obs.step = step;
            obs.state = state;
            obs.reward = reward;
            obs.target.namespace = ns;
            let back: Obs = decode(&encode(&obs).unwrap()).unwrap();
            prop_assert_eq!(back, obs);
        }
    }

    #[test]
    fn retraining_is_online_entered_from_serving_until_it_leaves_online() {
        let l = |stage, previous| Lifecycle {
            schema: Schema::new(),
            target: Target::new("ns", "app"),
            episode: 3,
            step: 0,
            ts_ms: 0,
            stage,
            previous,
            reason: String::new(),
            reward_mean: None,
            reward_std: None,
            window: 0,
            rollback_to: None,
        };
        use Stage::*;
        // Entered from SERVING: retraining, whatever came before.
        assert!(l(Online, Some(Serving)).retraining(false));
        assert!(l(Online, Some(Serving)).retraining(true));
        // Entered from OFFLINE (bootstrapped) or at start: first learning.
        assert!(!l(Online, Some(Offline)).retraining(true));
        assert!(!l(Online, Some(Initialized)).retraining(true));
        assert!(!l(Online, None).retraining(true));
        // Staying ONLINE keeps the answer.
        assert!(l(Online, Some(Online)).retraining(true));
        assert!(!l(Online, Some(Online)).retraining(false));
        // Leaving ONLINE ends it.
        for stage in [Serving, Offline, Initialized] {
            assert!(!l(stage, Some(Online)).retraining(true), "{stage:?}");
        }
    }
}
