//! Per-service identities on NATS and the subjects each may publish and subscribe to: the one
//! table the server configuration of `aware nats-config` (and the Helm chart) is generated from.
//!
//! Each service publishes only the events it owns (the controller alone `target`, the lifecycle
//! monitor alone `lifecycle`, the trainer alone `model` and `embedding`, …) and subscribes only to
//! what it consumes, plus the JetStream API subjects it needs: every service reads the capture
//! stream (the newest state of a target at start-up, the recorder's replay) and may create it when
//! missing, only the recorder may change its settings, nobody may delete or purge it or delete a
//! message of it; only the trainer writes and deletes objects of the model store, the recommender
//! reads them. Replies arrive on the identity's own inbox prefix (`bus.inbox_prefix`), which no
//! other identity may subscribe to; nobody may publish to an inbox.

use aware_bus_schemas::{subject, EventKind};

/// An identity on the bus: one per service, and `watch` (read-only, `aware watch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Identity {
    Collector,
    Recommender,
    Actuator,
    Recorder,
    Trainer,
    LifecycleMonitor,
    Controller,
    Watch,
}

/// What an identity may do with the capture stream (`bus.jetstream.stream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Capture {
    /// Nothing (it subscribes to live subjects only).
    None,
    /// Read it (ordered consumers) and create it when missing.
    Read,
    /// Read, create, and update its settings.
    Own,
}

/// What an identity may do with the model store's object store bucket (`model_store.bucket`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Models {
    None,
    /// Read objects (and create the bucket when missing).
    Read,
    /// Read, write and delete objects.
    Write,
}

/// One row of the table.
struct Row {
    id: Identity,
    name: &'static str,
    /// The service (`ServiceEntry::name`) that runs as this identity.
    service: Option<&'static str>,
    publishes: &'static [EventKind],
    subscribes: &'static [EventKind],
    capture: Capture,
    models: Models,
}

use EventKind as K;

/// The table. `subscribes` is each service's `CONSUMES` plus the kinds it subscribes to outside
/// its actors (the collector's and the recorder's `target`, the controller's status inputs).
const TABLE: [Row; 8] = [
    Row {
        id: Identity::Collector,
        name: "collector",
        service: Some("metrics-collector"),
        publishes: &[K::Obs],
        subscribes: &[K::Applied, K::Target],
        capture: Capture::Read,
        models: Models::None,
    },
    Row {
        id: Identity::Recommender,
        name: "recommender",
        service: Some("recommender"),
        publishes: &[K::Action],
        subscribes: &[K::Obs, K::Lifecycle, K::Embedding, K::Model, K::Target],
        capture: Capture::Read,
        models: Models::Read,
    },
    Row {
        id: Identity::Actuator,
        name: "actuator",
        service: Some("actuator"),
        publishes: &[K::Applied],
        subscribes: &[K::Action, K::Obs, K::Target],
        capture: Capture::Read,
        models: Models::None,
    },
    Row {
        id: Identity::Recorder,
        name: "recorder",
        service: Some("trajectory-recorder"),
        publishes: &[K::Episode],
        subscribes: &[K::Obs, K::Action, K::Applied, K::Target],
        capture: Capture::Own,
        models: Models::None,
    },
    Row {
        id: Identity::Trainer,
        name: "trainer",
        service: Some("meta-learner-trainer"),
        publishes: &[K::Model, K::Embedding],
        subscribes: &[K::Lifecycle, K::Episode, K::Target],
        capture: Capture::Read,
        models: Models::Write,
    },
    Row {
        id: Identity::LifecycleMonitor,
        name: "lifecycle-monitor",
        service: Some("lifecycle-monitor"),
        publishes: &[K::Lifecycle],
        subscribes: &[K::Episode, K::Model, K::Obs, K::Target],
        capture: Capture::Read,
        // A model promotes only once its checkpoint loads and verifies.
        models: Models::Read,
    },
    Row {
        id: Identity::Controller,
        name: "controller",
        service: Some("controller"),
        publishes: &[K::Target],
        subscribes: &[K::Lifecycle, K::Action, K::Applied],
        capture: Capture::Read,
        models: Models::None,
    },
    Row {
        id: Identity::Watch,
        name: "watch",
        service: None,
        publishes: &[],
        subscribes: &[
            K::Obs,
            K::Action,
            K::Applied,
            K::Episode,
            K::Lifecycle,
            K::Embedding,
            K::Model,
            K::Target,
        ],
        capture: Capture::None,
        models: Models::None,
    },
];

/// The names the permissions depend on: the capture's streams (one per partition), the state
/// bucket, the model store bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub streams: Vec<String>,
    pub state_bucket: String,
    pub bucket: String,
}

/// The subjects one identity may publish and subscribe to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
}

impl Identity {
    pub const ALL: [Identity; 8] = [
        Identity::Collector,
        Identity::Recommender,
        Identity::Actuator,
        Identity::Recorder,
        Identity::Trainer,
        Identity::LifecycleMonitor,
        Identity::Controller,
        Identity::Watch,
    ];

    fn row(self) -> &'static Row {
        // Every identity has its row (checked by a test); the first is a safe fallback.
        TABLE.iter().find(|r| r.id == self).unwrap_or(&TABLE[0])
    }

    /// The user name on the server (`collector`, `lifecycle-monitor`, …).
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// The identity named `name`.
    pub fn from_name(name: &str) -> Option<Identity> {
        TABLE.iter().find(|r| r.name == name).map(|r| r.id)
    }

    /// The identity a service runs as (by its `ServiceEntry::name`).
    pub fn of_service(service: &str) -> Option<Identity> {
        TABLE
            .iter()
            .find(|r| r.service == Some(service))
            .map(|r| r.id)
    }

    /// The event kinds it publishes.
    pub fn publishes(self) -> &'static [EventKind] {
        self.row().publishes
    }

    /// The event kinds it subscribes to.
    pub fn subscribes(self) -> &'static [EventKind] {
        self.row().subscribes
    }

    /// Its reply inbox prefix (`bus.inbox_prefix`): `_INBOX_collector`, `_INBOX_lifecycle_monitor`.
    pub fn inbox_prefix(self) -> String {
        format!("_INBOX_{}", self.name().replace('-', "_"))
    }

    /// The environment variable holding its password in the generated server configuration.
    pub fn password_variable(self) -> String {
        format!(
            "AWARE_NATS_PASSWORD_{}",
            self.name().replace('-', "_").to_uppercase()
        )
    }

    /// What it may publish and subscribe to.
    pub fn permissions(self, names: &Names) -> Permissions {
        let row = self.row();
        let mut publish: Vec<String> = row
            .publishes
            .iter()
            .map(|k| subject::kind_filter(*k))
            .collect();
        let mut subscribe: Vec<String> = row
            .subscribes
            .iter()
            .map(|k| subject::kind_filter(*k))
            .collect();
        if self == Identity::Watch {
            subscribe = vec![subject::ALL.to_string()];
        }
        subscribe.push(format!("{}.>", self.inbox_prefix()));
        let api = "$JS.API";
        let read_stream = |s: &str, out: &mut Vec<String>| {
            out.extend([
                format!("{api}.STREAM.INFO.{s}"),
                format!("{api}.CONSUMER.CREATE.{s}"),
                format!("{api}.CONSUMER.CREATE.{s}.>"),
                format!("{api}.CONSUMER.INFO.{s}.*"),
                format!("{api}.CONSUMER.DELETE.{s}.*"),
                format!("{api}.CONSUMER.MSG.NEXT.{s}.*"),
            ]);
        };
        match row.capture {
            Capture::None => {}
            Capture::Read | Capture::Own => {
                // The state bucket goes with the capture: read by all, created by any, set by
                // the owner, and each state kind written only by its publisher.
                let state = format!("KV_{}", names.state_bucket);
                for s in names.streams.iter().chain([&state]) {
                    read_stream(s, &mut publish);
                    publish.push(format!("{api}.STREAM.CREATE.{s}"));
                    if row.capture == Capture::Own {
                        publish.push(format!("{api}.STREAM.UPDATE.{s}"));
                    }
                }
                // Its keys in both layouts: a forgotten target's key from a release before the
                // slot token is purged too (ADR 0021).
                publish.extend(row.publishes.iter().filter(|k| k.is_state()).flat_map(|k| {
                    [subject::kind_filter(*k), subject::unslotted_kind_filter(*k)]
                        .map(|f| format!("$KV.{}.{f}", names.state_bucket))
                }));
            }
        }
        let objects = format!("OBJ_{}", names.bucket);
        let bucket = &names.bucket;
        match row.models {
            Models::None => {}
            Models::Read | Models::Write => {
                read_stream(&objects, &mut publish);
                publish.extend([
                    format!("{api}.STREAM.CREATE.{objects}"),
                    format!("{api}.STREAM.MSG.GET.{objects}"),
                    format!("{api}.DIRECT.GET.{objects}"),
                    format!("{api}.DIRECT.GET.{objects}.>"),
                    // Flow control of the ordered push consumer reading an object's chunks.
                    format!("$JS.FC.{objects}.>"),
                ]);
                if row.models == Models::Write {
                    publish.extend([
                        format!("$O.{bucket}.C.>"),
                        format!("$O.{bucket}.M.>"),
                        format!("{api}.STREAM.PURGE.{objects}"),
                    ]);
                }
            }
        }
        Permissions { publish, subscribe }
    }
}

/// How the generated configuration gives each identity its credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserAuth {
    /// A password read by nats-server from the environment variable
    /// [`Identity::password_variable`] (`$AWARE_NATS_PASSWORD_COLLECTOR`).
    PasswordFromEnv,
    /// An NKey public key (`U…`); the service holds the seed (`bus.auth.nkey_seed_file`).
    NKey(String),
}

/// `s` as a quoted string of the NATS configuration format.
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn list(items: &[String]) -> String {
    items
        .iter()
        .map(|s| quoted(s))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `authorization { users = [...] }` block of nats-server's configuration: one user per
/// identity of `users` with its permissions.
pub fn server_authorization(names: &Names, users: &[(Identity, UserAuth)]) -> String {
    let mut out = String::from(
        "# Generated by `aware nats-config` from shared/src/bus/permissions.rs: one user per AWARE\n\
         # identity, each allowed to publish only the events it owns and to subscribe only to what\n\
         # it consumes (everything else is refused by the server).\n\
         authorization {\n  users = [\n",
    );
    for (id, auth) in users {
        let p = id.permissions(names);
        let credential = match auth {
            UserAuth::PasswordFromEnv => format!(
                "user: {}, password: ${}",
                quoted(id.name()),
                id.password_variable()
            ),
            UserAuth::NKey(public) => format!("nkey: {public}"),
        };
        // An empty allow list would allow everything: nothing to publish is a deny of all.
        let publish = if p.publish.is_empty() {
            "deny: [\">\"]".to_string()
        } else {
            format!("allow: [{}]", list(&p.publish))
        };
        out.push_str(&format!(
            "    {{\n      {credential}\n      permissions: {{\n        publish: {{ {publish} }}\n        subscribe: {{ allow: [{}] }}\n      }}\n    }}\n",
            list(&p.subscribe)
        ));
    }
    out.push_str("  ]\n}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names {
            streams: vec!["AWARE".into()],
            state_bucket: "AWARE_STATE".into(),
            bucket: "models".into(),
        }
    }

    #[test]
    fn every_event_kind_has_exactly_one_publisher() {
        for kind in EventKind::ALL {
            let publishers: Vec<_> = Identity::ALL
                .into_iter()
                .filter(|id| id.publishes().contains(&kind))
                .collect();
            assert_eq!(publishers.len(), 1, "{kind}: {publishers:?}");
        }
        for id in Identity::ALL {
            assert_eq!(id.row().id, id);
            assert_eq!(Identity::from_name(id.name()), Some(id));
        }
    }

    #[test]
    fn nobody_may_delete_or_purge_the_stream_and_only_the_trainer_writes_models() {
        for id in Identity::ALL {
            let p = id.permissions(&names());
            for s in &p.publish {
                assert!(
                    !s.contains("STREAM.DELETE")
                        && !s.contains("MSG.DELETE")
                        && !s.contains(".PURGE.AWARE")
                        && !s.starts_with("_INBOX")
                        && s != ">",
                    "{id:?} may publish {s}"
                );
                if s.starts_with("$O.") || s.contains("PURGE") {
                    assert_eq!(id, Identity::Trainer, "{s}");
                }
                if s.contains("STREAM.UPDATE") {
                    assert_eq!(id, Identity::Recorder, "{s}");
                }
            }
            assert!(p
                .subscribe
                .iter()
                .all(|s| !s.starts_with("_INBOX") || s.starts_with(&id.inbox_prefix())));
        }
        assert!(Identity::Watch.permissions(&names()).publish.is_empty());
    }

    /// With the capture in partitions, every identity that reads it may read each partition's
    /// stream, and only the recorder may change one.
    #[test]
    fn every_partition_of_the_capture_is_readable_and_only_the_recorder_updates_it() {
        let names = Names {
            streams: (0..4).map(|k| format!("AWARE_{k}")).collect(),
            ..names()
        };
        for id in Identity::ALL {
            let p = id.permissions(&names);
            for k in 0..4 {
                let read = format!("$JS.API.CONSUMER.CREATE.AWARE_{k}.>");
                let update = format!("$JS.API.STREAM.UPDATE.AWARE_{k}");
                let reads = id.row().capture != Capture::None;
                assert_eq!(p.publish.contains(&read), reads, "{id:?} {read}");
                assert_eq!(
                    p.publish.contains(&update),
                    id == Identity::Recorder,
                    "{id:?} {update}"
                );
            }
            assert!(
                !p.publish.iter().any(|s| s.ends_with(".AWARE")),
                "{id:?}: no single stream"
            );
        }
    }

    /// Each state kind's key in the state bucket is written only by the kind's publisher; every
    /// identity that reads the capture reads the bucket too.
    #[test]
    fn only_a_state_kinds_publisher_writes_its_keys() {
        for id in Identity::ALL {
            let p = id.permissions(&names());
            let keys: Vec<&String> = p.publish.iter().filter(|s| s.starts_with("$KV.")).collect();
            let expected: Vec<String> = id
                .publishes()
                .iter()
                .filter(|k| k.is_state())
                .flat_map(|k| {
                    [
                        format!("$KV.AWARE_STATE.aware.v1.{k}.*.*.*"),
                        format!("$KV.AWARE_STATE.aware.v1.{k}.*.*"),
                    ]
                })
                .collect();
            assert_eq!(
                keys.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                expected.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                "{id:?}"
            );
            if id != Identity::Watch {
                assert!(
                    p.publish
                        .contains(&"$JS.API.CONSUMER.CREATE.KV_AWARE_STATE.>".to_string()),
                    "{id:?}"
                );
            }
        }
        assert_eq!(
            Identity::LifecycleMonitor
                .permissions(&names())
                .publish
                .iter()
                .filter(|s| s.starts_with("$KV."))
                .collect::<Vec<_>>(),
            [
                "$KV.AWARE_STATE.aware.v1.lifecycle.*.*.*",
                "$KV.AWARE_STATE.aware.v1.lifecycle.*.*"
            ]
        );
    }

    #[test]
    fn the_generated_configuration_names_every_user_once() {
        let users: Vec<_> = Identity::ALL
            .into_iter()
            .map(|id| (id, UserAuth::PasswordFromEnv))
            .collect();
        let conf = server_authorization(&names(), &users);
        for id in Identity::ALL {
            assert_eq!(
                conf.matches(&format!("user: \"{}\",", id.name())).count(),
                1,
                "{conf}"
            );
            assert!(conf.contains(&format!("${}", id.password_variable())));
        }
        assert!(
            conf.contains(
                r#"publish: { allow: ["aware.v1.target.*.*.*", "$JS.API.STREAM.INFO.AWARE""#
            ),
            "{conf}"
        );
    }
}
