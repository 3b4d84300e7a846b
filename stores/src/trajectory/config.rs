//! The trajectory store's settings and [`open_store`].
//!
//! The settings are the `[trajectory_store]` section (`backend`, `sqlite_path`, `questdb_url`,
//! …), read by the recorder, which writes the store, and by the trainer, which reads it.
//! Functions that report a key take the section's name, so errors name the key as the user
//! wrote it (`trajectory_store.sqlite_path`).

use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{QuestDbConfig, QuestDbStore, SqliteConfig, SqliteStore, StoreError, TrajectoryStore};

/// The trajectory store's settings: the `[trajectory_store]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite` (embedded, default) or `questdb`.
    pub backend: StoreKind,
    /// SQLite database file of the embedded store.
    pub sqlite_path: PathBuf,
    /// QuestDB HTTP base URL (`store = "questdb"`), e.g. `http://questdb:9000`.
    pub questdb_url: String,
    /// Prefix of the QuestDB tables.
    pub questdb_table_prefix: String,
    /// Retention: transitions kept per target, the newest whole episodes (0: keep everything).
    /// The `sqlite` store only; with `questdb` it must be 0 (bound QuestDB's tables with a TTL).
    pub keep_transitions: u64,
    /// How long a deregistered target's data is kept (its `AwareAutoscaler` deleted and not
    /// created again) before it is deleted from the store, in seconds (0: never). The `sqlite`
    /// store only; with `questdb` it must be 0.
    pub forget_after_secs: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: StoreKind::Sqlite,
            sqlite_path: PathBuf::from("aware-data/trajectories.db"),
            questdb_url: "http://127.0.0.1:9000".to_string(),
            questdb_table_prefix: "aware_".to_string(),
            keep_transitions: 1_000_000,
            forget_after_secs: 7 * 24 * 3600,
        }
    }
}

/// Which trajectory store backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    #[default]
    Sqlite,
    Questdb,
}

/// A setting the configured backend cannot honour ([`StoreConfig::validate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {key}: {reason}")]
pub struct InvalidSetting {
    /// `section.key`.
    pub key: String,
    pub reason: String,
}

/// Errors of [`open_store`]; each names the key (`section.key`).
#[derive(Debug, thiserror::Error)]
pub enum StoreConfigError {
    /// The directory of the SQLite file cannot be created.
    #[error("{key} {}: {source}", dir.display())]
    CreateDir {
        key: String,
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The configured backend refused to open.
    #[error("{key}: {source}")]
    Open {
        key: String,
        #[source]
        source: Box<StoreError>,
    },
}

impl StoreConfig {
    /// Refuses settings the configured backend cannot honour; `section` prefixes the keys named.
    pub fn validate(&self, section: &str) -> Result<(), InvalidSetting> {
        if self.forget_after_secs > 0 && self.backend == StoreKind::Questdb {
            return Err(InvalidSetting {
                key: format!("{section}.forget_after_secs"),
                reason: "the questdb store cannot delete one target's rows: set it to 0 (the \
                         tables' TTL bounds a deleted target's rows)"
                    .into(),
            });
        }
        if self.keep_transitions > 0 && self.backend == StoreKind::Questdb {
            return Err(InvalidSetting {
                key: format!("{section}.keep_transitions"),
                reason: "the questdb store cannot delete rows per target (QuestDB drops whole \
                         time partitions): set it to 0 and bound the tables with `ALTER TABLE … \
                         SET TTL`"
                    .into(),
            });
        }
        Ok(())
    }

    /// How long a deregistered target's data is kept: `None` keeps it for ever.
    pub fn forget_after(&self) -> Option<Duration> {
        (self.forget_after_secs > 0).then(|| Duration::from_secs(self.forget_after_secs))
    }

    /// The retention in force: `None` keeps everything.
    pub fn keep(&self) -> Option<NonZeroU64> {
        NonZeroU64::new(self.keep_transitions)
    }
}

/// Opens the configured store, creating the directory of `sqlite_path` first (with either
/// backend); `section` prefixes the keys named in errors.
pub fn open_store(
    cfg: &StoreConfig,
    section: &str,
) -> Result<Arc<dyn TrajectoryStore>, StoreConfigError> {
    let key = |name: &str| format!("{section}.{name}");
    // With either backend: the recorder's resume point is kept next to the SQLite file by default.
    create_parent(&cfg.sqlite_path).map_err(|(dir, source)| StoreConfigError::CreateDir {
        key: key("sqlite_path"),
        dir,
        source,
    })?;
    match cfg.backend {
        StoreKind::Sqlite => {
            let store =
                SqliteStore::open(&SqliteConfig::new(&cfg.sqlite_path)).map_err(|source| {
                    StoreConfigError::Open {
                        key: key("sqlite_path"),
                        source: Box::new(source),
                    }
                })?;
            Ok(Arc::new(store))
        }
        StoreKind::Questdb => {
            let mut q = QuestDbConfig::new(cfg.questdb_url.clone());
            q.table_prefix = cfg.questdb_table_prefix.clone();
            let store = QuestDbStore::open(q).map_err(|source| StoreConfigError::Open {
                key: key("questdb_url"),
                source: Box::new(source),
            })?;
            Ok(Arc::new(store))
        }
    }
}

fn create_parent(path: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => {
            std::fs::create_dir_all(dir).map_err(|e| (dir.to_path_buf(), e))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_store_creates_the_directory_and_errors_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StoreConfig {
            sqlite_path: dir.path().join("a/b/t.db"),
            ..Default::default()
        };
        let store = open_store(&cfg, "trajectory_store").unwrap();
        assert_eq!(store.backend(), "sqlite");
        assert!(dir.path().join("a/b/t.db").exists());

        std::fs::write(dir.path().join("f"), b"").unwrap();
        let cfg = StoreConfig {
            sqlite_path: dir.path().join("f/t.db"),
            ..Default::default()
        };
        let Err(e) = open_store(&cfg, "trajectory_store") else {
            panic!("a file stands where the directory should be")
        };
        assert!(matches!(e, StoreConfigError::CreateDir { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with("trajectory_store.sqlite_path "),
            "{e}"
        );

        let cfg = StoreConfig {
            backend: StoreKind::Questdb,
            questdb_url: "https://q:9000".into(),
            sqlite_path: dir.path().join("t.db"),
            ..Default::default()
        };
        let Err(e) = open_store(&cfg, "trajectory_store") else {
            panic!("QuestDB is read without TLS")
        };
        assert!(
            matches!(&e, StoreConfigError::Open { key, source } if key == "trajectory_store.questdb_url" && matches!(**source, StoreError::QuestDbConfig { .. })),
            "{e:?}"
        );
    }

    #[test]
    fn questdb_refuses_retention_and_forgetting() {
        let ok = StoreConfig::default();
        ok.validate("trajectory_store").unwrap();
        assert_eq!(ok.keep(), NonZeroU64::new(1_000_000));
        assert_eq!(ok.forget_after(), Some(Duration::from_secs(7 * 24 * 3600)));
        let q = |keep_transitions, forget_after_secs| StoreConfig {
            backend: StoreKind::Questdb,
            keep_transitions,
            forget_after_secs,
            ..Default::default()
        };
        q(0, 0).validate("trajectory_store").unwrap();
        assert_eq!(
            q(0, 60).validate("trajectory_store").unwrap_err().key,
            "trajectory_store.forget_after_secs"
        );
        let e = q(10, 0).validate("s").unwrap_err();
        assert_eq!(e.key, "s.keep_transitions");
        assert!(e.reason.contains("TTL"), "{e}");
        assert_eq!(q(0, 0).keep(), None);
        assert_eq!(q(0, 0).forget_after(), None);
    }
}
