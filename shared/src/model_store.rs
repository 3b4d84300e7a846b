//! The model store (docs/design.md §5): versioned weights by key, each with its SHA-256.
//!
//! The trainer writes a checkpoint with [`ModelStore::put`] and announces the returned
//! [`StoredObject`] (uri, sha256, size) in a `model` message; a recommender resolves the uri with
//! [`ModelStore::key_of_uri`] and reads it back with [`get_verified`], which refuses bytes whose
//! size or SHA-256 differ from the announcement (a torn or tampered file never reaches a policy).
//!
//! Two backends, chosen by `model_store.backend` ([`open_model_store`]):
//!
//! - [`LocalDirStore`] (`local`, the default) keeps one file per key under a root directory. A
//!   write goes to a temporary file in the destination directory, is fsynced, renamed over the
//!   key's path and the directory is fsynced: a reader sees either the whole previous object or
//!   the whole new one, and a crash leaves at most a stray `.tmp` file. Uris are `file:///…`.
//! - [`JetStreamStore`] (`jetstream`) keeps one object per key in a NATS JetStream object store
//!   bucket (chunked, SHA-256 recorded by the server); uris are `nats-object://<bucket>/<key>`.
//!   It needs the NATS bus.
//!
//! Keys are `/`-separated segments of `[A-Za-z0-9._-]`, no segment empty, `.` or `..`, so a key
//! can never name a path outside the root. [`model_key`] builds the key of a target's model
//! version with a zero-padded version, so keys sort in version order.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use aware_bus_schemas::Target;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::bus::Bus;
use crate::config::{BusConfig, StorageKind};

mod jetstream;

pub use jetstream::{JetStreamStore, URI_SCHEME as NATS_OBJECT_SCHEME};

/// What a `put` stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    pub key: String,
    /// Location to announce (`file:///…` or `nats-object://<bucket>/<key>`).
    pub uri: String,
    /// Lower-case hex SHA-256 of the bytes.
    pub sha256: String,
    pub size_bytes: u64,
}

/// Errors of the model store; each names the key, uri or path concerned.
#[derive(Debug, thiserror::Error)]
pub enum ModelStoreError {
    #[error("invalid model key `{key}`: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error("uri `{uri}` does not belong to the model store at {root}")]
    ForeignUri { uri: String, root: String },
    #[error("model store: cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("model {key} not found in the model store")]
    NotFound { key: String },
    #[error("model {key}: {found} bytes, announced {expected}")]
    Size {
        key: String,
        expected: u64,
        found: u64,
    },
    #[error("model {key}: sha256 {found} does not match the announced {expected}")]
    Checksum {
        key: String,
        expected: String,
        found: String,
    },
    #[error("configuration key `model_store.{key}`: {reason}")]
    Config { key: &'static str, reason: String },
    /// `what` names the object (or the bucket, or the server) and the bucket.
    #[error("model store: cannot {op} {what} on NATS: {reason}")]
    Nats {
        op: &'static str,
        what: String,
        reason: String,
    },
    #[error("model store: {op} {what} on NATS timed out after {ms} ms")]
    Timeout {
        op: &'static str,
        what: String,
        ms: u64,
    },
}

/// A store of model bytes by key. Synchronous: every call may block on file or network I/O, so
/// async code (tokio tasks, actix actors) calls it through `spawn_blocking`.
pub trait ModelStore: Send + Sync {
    /// Short backend name for logs.
    fn backend(&self) -> &'static str;
    /// Stores `bytes` under `key` atomically (replacing any previous object).
    fn put(&self, key: &str, bytes: &[u8]) -> Result<StoredObject, ModelStoreError>;
    /// The bytes stored under `key`.
    fn get(&self, key: &str) -> Result<Vec<u8>, ModelStoreError>;
    /// The key a uri returned by `put` refers to.
    fn key_of_uri(&self, uri: &str) -> Result<String, ModelStoreError>;
    /// Every key starting with `prefix`, sorted.
    fn keys(&self, prefix: &str) -> Result<Vec<String>, ModelStoreError>;
    /// Removes the object under `key` (retention); a key that holds nothing is not an error.
    fn delete(&self, key: &str) -> Result<(), ModelStoreError>;
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in digest {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Reads the object a `model` message announces and checks its size and SHA-256.
pub fn get_verified(
    store: &dyn ModelStore,
    uri: &str,
    sha256: &str,
    size_bytes: u64,
) -> Result<Vec<u8>, ModelStoreError> {
    let key = store.key_of_uri(uri)?;
    let bytes = store.get(&key)?;
    let found = bytes.len() as u64;
    if found != size_bytes {
        return Err(ModelStoreError::Size {
            key,
            expected: size_bytes,
            found,
        });
    }
    let digest = sha256_hex(&bytes);
    if !digest.eq_ignore_ascii_case(sha256) {
        return Err(ModelStoreError::Checksum {
            key,
            expected: sha256.to_string(),
            found: digest,
        });
    }
    Ok(bytes)
}

/// Key of version `version` of a target's model of kind `kind` (`base_learner`, …):
/// `<namespace>/<name>/<kind>/v<version, 20 digits>.ckpt`.
pub fn model_key(target: &Target, kind: &str, version: u64) -> String {
    format!("{}/{kind}/v{version:020}.ckpt", model_prefix(target))
}

/// Prefix of every model key of `target`.
pub fn model_prefix(target: &Target) -> String {
    format!("{}/{}", target.namespace, target.name)
}

/// The version encoded in a key built by [`model_key`].
pub fn version_of_key(key: &str) -> Option<u64> {
    let file = key.rsplit('/').next()?;
    file.strip_prefix('v')?.strip_suffix(".ckpt")?.parse().ok()
}

/// Checks a key (see the module documentation).
pub fn validate_key(key: &str) -> Result<(), ModelStoreError> {
    let bad = |reason| {
        Err(ModelStoreError::InvalidKey {
            key: key.to_string(),
            reason,
        })
    };
    if key.is_empty() {
        return bad("empty");
    }
    for seg in key.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return bad("empty, `.` or `..` segment");
        }
        if !seg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return bad("characters outside [A-Za-z0-9._-]");
        }
        if seg.starts_with('.') {
            return bad("segment starting with `.` (reserved for temporary files)");
        }
    }
    Ok(())
}

/// Where the model store keeps its objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelStoreBackend {
    /// A local directory (`dir`); on several hosts it must be shared.
    #[default]
    Local,
    /// A JetStream object store bucket (`bucket`) on the NATS bus.
    Jetstream,
}

/// The `[model_store]` configuration section (shared by the trainer and the recommender).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelStoreConfig {
    /// `local` or `jetstream`.
    pub backend: ModelStoreBackend,
    /// Root directory of the local model store (`local`).
    pub dir: PathBuf,
    /// Object store bucket (`jetstream`): `[A-Za-z0-9_-]+`, created if missing.
    pub bucket: String,
    /// Size limit of a bucket created by us, bytes (-1: unlimited).
    pub max_bytes: i64,
    /// Replicas of a bucket created by us (1–5).
    pub replicas: usize,
    /// Storage of a bucket created by us: `file` or `memory`.
    pub storage: StorageKind,
    /// Limit on one put, get or listing on NATS, milliseconds.
    pub timeout_ms: u64,
}

impl Default for ModelStoreConfig {
    fn default() -> Self {
        ModelStoreConfig {
            backend: ModelStoreBackend::Local,
            dir: PathBuf::from("aware-data/models"),
            bucket: "aware-models".to_string(),
            max_bytes: -1,
            replicas: 1,
            storage: StorageKind::File,
            timeout_ms: 30_000,
        }
    }
}

impl ModelStoreConfig {
    /// Checks values the types alone cannot; errors name the key.
    pub fn validate(&self) -> Result<(), ModelStoreError> {
        let bad = |key, reason: String| Err(ModelStoreError::Config { key, reason });
        match self.backend {
            ModelStoreBackend::Local => {
                if self.dir.as_os_str().is_empty() {
                    return bad("dir", "empty path".into());
                }
            }
            ModelStoreBackend::Jetstream => {
                if self.bucket.is_empty()
                    || !self
                        .bucket
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
                {
                    return bad(
                        "bucket",
                        format!(
                            "`{}` is not a bucket name (one or more of [A-Za-z0-9_-])",
                            self.bucket
                        ),
                    );
                }
                if self.max_bytes != -1 && self.max_bytes <= 0 {
                    return bad(
                        "max_bytes",
                        format!("{} (must be positive, or -1: unlimited)", self.max_bytes),
                    );
                }
                if !(1..=5).contains(&self.replicas) {
                    return bad("replicas", format!("{} (must be 1–5)", self.replicas));
                }
                if self.timeout_ms == 0 {
                    return bad("timeout_ms", "0 (must be positive)".into());
                }
            }
        }
        Ok(())
    }
}

/// Opens the configured model store. `jetstream` uses the NATS server of `bus` (its own
/// connection, with `bus_cfg`'s reconnect settings, opened in the background: see
/// [`JetStreamStore::open`]); on the in-process bus it is a configuration error.
pub async fn open_model_store(
    cfg: &ModelStoreConfig,
    bus: &Bus,
    bus_cfg: &BusConfig,
) -> Result<Arc<dyn ModelStore>, ModelStoreError> {
    cfg.validate()?;
    match cfg.backend {
        ModelStoreBackend::Local => {
            let store = LocalDirStore::open(&cfg.dir)?;
            tracing::info!(dir = %store.root().display(), "model store: local directory");
            Ok(Arc::new(store))
        }
        ModelStoreBackend::Jetstream => match bus {
            Bus::Nats(nats) => {
                tracing::info!(bucket = %cfg.bucket, url = %nats.redacted_url(), "model store: JetStream object store (opening in the background)");
                Ok(Arc::new(JetStreamStore::open(nats.url(), bus_cfg, cfg)?))
            }
            Bus::InProc(_) => Err(ModelStoreError::Config {
                key: "backend",
                reason: "`jetstream` needs the NATS bus (`bus.url` = nats://…), but this process \
                         runs on the embedded in-process bus; use `local` or a NATS URL"
                    .to_string(),
            }),
        },
    }
}

/// One file per key under a root directory.
#[derive(Debug)]
pub struct LocalDirStore {
    root: PathBuf,
    tmp_seq: AtomicU64,
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ModelStoreError {
    let path = path.display().to_string();
    move |source| ModelStoreError::Io { op, path, source }
}

impl LocalDirStore {
    /// Opens (creating it if needed) the store rooted at `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, ModelStoreError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
        let root = dir.canonicalize().map_err(io_err("resolve", dir))?;
        Ok(LocalDirStore {
            root,
            tmp_seq: AtomicU64::new(0),
        })
    }

    /// The (canonical) root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path_of(&self, key: &str) -> Result<PathBuf, ModelStoreError> {
        validate_key(key)?;
        Ok(key.split('/').fold(self.root.clone(), |p, s| p.join(s)))
    }
}

impl ModelStore for LocalDirStore {
    fn backend(&self) -> &'static str {
        "local"
    }

    fn put(&self, key: &str, bytes: &[u8]) -> Result<StoredObject, ModelStoreError> {
        let path = self.path_of(key)?;
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
        let file_name = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(
            ".{file_name}.tmp-{}-{}",
            std::process::id(),
            self.tmp_seq.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> Result<(), ModelStoreError> {
            let mut f = std::fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
            f.write_all(bytes).map_err(io_err("write", &tmp))?;
            f.sync_all().map_err(io_err("fsync", &tmp))?;
            drop(f);
            std::fs::rename(&tmp, &path).map_err(io_err("rename into", &path))?;
            std::fs::File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err("fsync", &dir))
        };
        if let Err(e) = write() {
            // Best effort: the temporary file is garbage either way.
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(StoredObject {
            key: key.to_string(),
            uri: format!("file://{}", path.display()),
            sha256: sha256_hex(bytes),
            size_bytes: bytes.len() as u64,
        })
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, ModelStoreError> {
        let path = self.path_of(key)?;
        match std::fs::read(&path) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ModelStoreError::NotFound {
                key: key.to_string(),
            }),
            Err(e) => Err(io_err("read", &path)(e)),
        }
    }

    fn key_of_uri(&self, uri: &str) -> Result<String, ModelStoreError> {
        let foreign = || ModelStoreError::ForeignUri {
            uri: uri.to_string(),
            root: self.root.display().to_string(),
        };
        let path = uri.strip_prefix("file://").ok_or_else(foreign)?;
        let rel = Path::new(path)
            .strip_prefix(&self.root)
            .map_err(|_| foreign())?;
        let key = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        validate_key(&key)?;
        Ok(key)
    }

    fn keys(&self, prefix: &str) -> Result<Vec<String>, ModelStoreError> {
        let mut out = Vec::new();
        let mut stack = vec![(self.root.clone(), String::new())];
        while let Some((dir, rel)) = stack.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("list", &dir)(e)),
            };
            for entry in entries {
                let entry = entry.map_err(io_err("list", &dir))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    continue;
                }
                let key = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                let ft = entry.file_type().map_err(io_err("stat", &entry.path()))?;
                if ft.is_dir() {
                    // Only descend where the prefix can still match.
                    if prefix.starts_with(&key) || key.starts_with(prefix) {
                        stack.push((entry.path(), key));
                    }
                } else if key.starts_with(prefix) && validate_key(&key).is_ok() {
                    out.push(key);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), ModelStoreError> {
        let path = self.path_of(key)?;
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("remove", &path)(e)),
        }
        let dir = path.parent().unwrap_or(&self.root);
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsync", dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The behaviour every backend shares; `store` must be empty.
    pub(crate) fn conformance(store: &dyn ModelStore) {
        let t = Target::new("shop", "cart.v2");
        // Keys with `/` (the shape `model_key` builds).
        let key = model_key(&t, "base_learner", 7);
        assert_eq!(store.keys("").unwrap(), Vec::<String>::new());
        // Put, get, announce, verify.
        let obj = store.put(&key, b"weights-1").unwrap();
        assert_eq!(obj.key, key);
        assert_eq!(obj.size_bytes, 9);
        assert_eq!(obj.sha256, sha256_hex(b"weights-1"));
        assert_eq!(store.key_of_uri(&obj.uri).unwrap(), key);
        assert_eq!(store.get(&key).unwrap(), b"weights-1");
        let back = get_verified(store, &obj.uri, &obj.sha256, obj.size_bytes).unwrap();
        assert_eq!(back, b"weights-1");
        // Overwrite: the new bytes, and the old announcement no longer verifies.
        let obj2 = store.put(&key, b"weights-two").unwrap();
        assert_eq!(obj2.uri, obj.uri);
        assert_ne!(obj2.sha256, obj.sha256);
        assert_eq!(store.get(&key).unwrap(), b"weights-two");
        assert!(matches!(
            get_verified(store, &obj.uri, &obj.sha256, obj.size_bytes),
            Err(ModelStoreError::Size { .. })
        ));
        // Same size, other bytes: the announced digest is wrong.
        let obj3 = store.put(&key, b"weights-TWO").unwrap();
        assert!(matches!(
            get_verified(store, &obj3.uri, &obj2.sha256, obj3.size_bytes),
            Err(ModelStoreError::Checksum { .. })
        ));
        // Corrupt announcement: bytes put, verified against a wrong digest.
        let wrong = sha256_hex(b"something else");
        match get_verified(store, &obj3.uri, &wrong, obj3.size_bytes) {
            Err(ModelStoreError::Checksum {
                key: k,
                expected,
                found,
            }) => {
                assert_eq!(k, key);
                assert_eq!(expected, wrong);
                assert_eq!(found, obj3.sha256);
            }
            other => panic!("expected a checksum error, got {other:?}"),
        }
        // Missing keys.
        let missing = model_key(&t, "base_learner", 99);
        assert!(matches!(
            store.get(&missing),
            Err(ModelStoreError::NotFound { key: k }) if k == missing
        ));
        let missing_uri = obj.uri.replace(&key, &missing);
        assert!(matches!(
            get_verified(store, &missing_uri, &obj.sha256, 9),
            Err(ModelStoreError::NotFound { .. })
        ));
        // A large object (several chunks on NATS).
        let big: Vec<u8> = (0..(3 << 20) + 17u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let big_key = "big/nested/deeper/model.ckpt";
        let big_obj = store.put(big_key, &big).unwrap();
        assert_eq!(big_obj.size_bytes, big.len() as u64);
        let back = get_verified(store, &big_obj.uri, &big_obj.sha256, big_obj.size_bytes).unwrap();
        assert!(back == big, "large object differs after a round trip");
        // An empty object.
        let empty = store.put("empty/e.ckpt", b"").unwrap();
        assert_eq!(
            get_verified(store, &empty.uri, &sha256_hex(b""), 0).unwrap(),
            b""
        );
        // Listing by prefix, in version order.
        store.put(&model_key(&t, "base_learner", 12), b"x").unwrap();
        store
            .put(
                &model_key(&Target::new("shop", "other"), "base_learner", 1),
                b"y",
            )
            .unwrap();
        let keys = store.keys(&model_prefix(&t)).unwrap();
        assert_eq!(
            keys.iter().map(|k| version_of_key(k)).collect::<Vec<_>>(),
            vec![Some(7), Some(12)]
        );
        assert_eq!(store.keys("big/").unwrap(), vec![big_key.to_string()]);
        assert_eq!(store.keys("").unwrap().len(), 5);
        // Delete: gone from get and keys, the other versions kept; deleting again, or a key
        // never written, is not an error.
        let gone = model_key(&t, "base_learner", 12);
        store.delete(&gone).unwrap();
        assert!(matches!(
            store.get(&gone),
            Err(ModelStoreError::NotFound { .. })
        ));
        assert_eq!(
            store
                .keys(&model_prefix(&t))
                .unwrap()
                .iter()
                .map(|k| version_of_key(k))
                .collect::<Vec<_>>(),
            vec![Some(7)]
        );
        store.delete(&gone).unwrap();
        store.delete(&missing).unwrap();
        assert_eq!(store.get(&key).unwrap(), b"weights-TWO");
        // Written again after a delete.
        store.put(&gone, b"again").unwrap();
        assert_eq!(store.get(&gone).unwrap(), b"again");
        assert_eq!(store.keys("").unwrap().len(), 5);
        // Invalid keys, both ways.
        for bad in [
            "",
            "../x",
            "a//b",
            "a/./b",
            "/abs",
            "a/b c",
            "a/.hidden",
            "a/b/",
        ] {
            assert!(
                matches!(
                    store.put(bad, b"x"),
                    Err(ModelStoreError::InvalidKey { .. })
                ),
                "put {bad:?}"
            );
            assert!(
                matches!(store.get(bad), Err(ModelStoreError::InvalidKey { .. })),
                "get {bad:?}"
            );
            assert!(
                matches!(store.delete(bad), Err(ModelStoreError::InvalidKey { .. })),
                "delete {bad:?}"
            );
        }
        // Uris of other stores.
        for uri in [
            "file:///somewhere/else/x.ckpt",
            "nats-object://some-other-bucket/x.ckpt",
            "s3://b/x.ckpt",
        ] {
            assert!(
                matches!(
                    store.key_of_uri(uri),
                    Err(ModelStoreError::ForeignUri { .. })
                ),
                "{uri}"
            );
        }
    }

    #[test]
    fn local_dir_store_conformance() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::open(dir.path().join("models")).unwrap();
        assert_eq!(store.backend(), "local");
        conformance(&store);
    }

    #[test]
    fn config_defaults_parsing_and_validation() {
        let d = ModelStoreConfig::default();
        assert_eq!(d.backend, ModelStoreBackend::Local);
        assert_eq!(d.bucket, "aware-models");
        d.validate().unwrap();
        let c: ModelStoreConfig = serde_json::from_value(serde_json::json!({
            "backend": "jetstream", "bucket": "models_2", "max_bytes": 1048576,
            "replicas": 3, "storage": "memory"
        }))
        .unwrap();
        assert_eq!(c.backend, ModelStoreBackend::Jetstream);
        assert_eq!(c.storage, StorageKind::Memory);
        c.validate().unwrap();
        // Unknown keys and values are refused.
        assert!(serde_json::from_value::<ModelStoreConfig>(
            serde_json::json!({"bucket_name": "x"})
        )
        .is_err());
        assert!(
            serde_json::from_value::<ModelStoreConfig>(serde_json::json!({"backend": "s3"}))
                .is_err()
        );
        let js = |patch: serde_json::Value| {
            let mut v = serde_json::json!({"backend": "jetstream"});
            for (k, x) in patch.as_object().unwrap() {
                v[k] = x.clone();
            }
            serde_json::from_value::<ModelStoreConfig>(v)
                .unwrap()
                .validate()
        };
        for (patch, key) in [
            (serde_json::json!({"bucket": ""}), "bucket"),
            (serde_json::json!({"bucket": "a.b"}), "bucket"),
            (serde_json::json!({"bucket": "a/b"}), "bucket"),
            (serde_json::json!({"max_bytes": 0}), "max_bytes"),
            (serde_json::json!({"max_bytes": -2}), "max_bytes"),
            (serde_json::json!({"replicas": 0}), "replicas"),
            (serde_json::json!({"replicas": 6}), "replicas"),
            (serde_json::json!({"timeout_ms": 0}), "timeout_ms"),
        ] {
            match js(patch.clone()) {
                Err(e @ ModelStoreError::Config { key: k, .. }) => {
                    assert_eq!(k, key, "{patch}");
                    assert!(e.to_string().contains(&format!("model_store.{key}")), "{e}");
                }
                other => panic!("{patch}: expected a config error, got {other:?}"),
            }
        }
        // Bucket settings do not matter to the local backend.
        let local: ModelStoreConfig =
            serde_json::from_value(serde_json::json!({"bucket": "a.b"})).unwrap();
        local.validate().unwrap();
    }

    #[test]
    fn jetstream_on_the_in_process_bus_is_a_config_error() {
        let cfg = ModelStoreConfig {
            backend: ModelStoreBackend::Jetstream,
            ..Default::default()
        };
        let bus = Bus::in_process(16);
        let err = futures::executor::block_on(open_model_store(&cfg, &bus, &BusConfig::default()))
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(err, ModelStoreError::Config { key: "backend", .. }),
            "{err}"
        );
        assert!(err.to_string().contains("model_store.backend"), "{err}");
        assert!(err.to_string().contains("in-process bus"), "{err}");
    }

    #[test]
    fn open_model_store_local() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ModelStoreConfig {
            dir: dir.path().join("m"),
            ..Default::default()
        };
        let store = futures::executor::block_on(open_model_store(
            &cfg,
            &Bus::in_process(16),
            &BusConfig::default(),
        ))
        .unwrap();
        assert_eq!(store.backend(), "local");
        assert!(store
            .put("a/b.ckpt", b"x")
            .unwrap()
            .uri
            .starts_with("file:///"));
    }

    /// Against a real `nats-server` (JetStream).
    mod jetstream {
        use super::*;
        use crate::testkit::NatsServer;

        fn js_cfg(bucket: &str) -> ModelStoreConfig {
            ModelStoreConfig {
                backend: ModelStoreBackend::Jetstream,
                bucket: bucket.to_string(),
                ..Default::default()
            }
        }

        fn connect(server: &NatsServer, bucket: &str) -> JetStreamStore {
            futures::executor::block_on(JetStreamStore::connect(
                &server.url(),
                &BusConfig::default(),
                &js_cfg(bucket),
            ))
            .unwrap()
        }

        #[test]
        fn jetstream_store_conformance() {
            let server = NatsServer::start().unwrap();
            let store = connect(&server, "aware-models");
            assert_eq!(store.backend(), "jetstream");
            conformance(&store);
            let obj = store.put("shop/cart/base_learner/v1.ckpt", b"w").unwrap();
            assert_eq!(
                obj.uri,
                "nats-object://aware-models/shop/cart/base_learner/v1.ckpt"
            );
        }

        #[test]
        fn bucket_is_created_once_and_shared() {
            let server = NatsServer::start().unwrap();
            // Writer and reader open the same (missing) bucket; objects persist across handles.
            let writer = connect(&server, "shared_models");
            let reader = connect(&server, "shared_models");
            let obj = writer.put("a/b/v1.ckpt", b"hello").unwrap();
            assert_eq!(
                get_verified(&reader, &obj.uri, &obj.sha256, obj.size_bytes).unwrap(),
                b"hello"
            );
            drop(writer);
            let again = connect(&server, "shared_models");
            assert_eq!(again.keys("a/").unwrap(), vec!["a/b/v1.ckpt".to_string()]);
            // Another bucket on the same server is another store.
            let other = connect(&server, "other");
            assert!(matches!(
                other.key_of_uri(&obj.uri),
                Err(ModelStoreError::ForeignUri { .. })
            ));
            assert!(matches!(
                other.get("a/b/v1.ckpt"),
                Err(ModelStoreError::NotFound { .. })
            ));
        }

        /// `open_model_store` on a NATS bus, then the synchronous calls from the thread of the
        /// current-thread runtime that drives the bus: the store's own connection and runtime
        /// keep working (no deadlock), and dropping it there does not panic.
        #[tokio::test(flavor = "current_thread")]
        async fn open_on_the_nats_bus_and_call_from_an_async_thread() {
            let server = NatsServer::start().unwrap();
            let mut bus_cfg = BusConfig {
                url: server.url(),
                ..Default::default()
            };
            bus_cfg.jetstream.enabled = false;
            let bus = Bus::connect(&bus_cfg, "test").await.unwrap();
            let cfg = ModelStoreConfig {
                storage: StorageKind::Memory,
                ..js_cfg("aware-models")
            };
            let store = open_model_store(&cfg, &bus, &bus_cfg).await.unwrap();
            assert_eq!(store.backend(), "jetstream");
            let obj = store.put("x/y.ckpt", b"abc").unwrap();
            assert_eq!(
                get_verified(store.as_ref(), &obj.uri, &obj.sha256, 3).unwrap(),
                b"abc"
            );
            drop(store);
        }

        /// `open` returns at once; calls fail (naming the server) until it is reachable, then
        /// work without reopening the store.
        #[test]
        fn open_is_lazy_and_retries_until_the_server_is_up() {
            let port = crate::testkit::free_port().unwrap();
            let url = format!("nats://127.0.0.1:{port}");
            let bus = BusConfig {
                connect_timeout_ms: 300,
                ..Default::default()
            };
            let t0 = std::time::Instant::now();
            let store = JetStreamStore::open(&url, &bus, &js_cfg("aware-models")).unwrap();
            assert!(t0.elapsed() < std::time::Duration::from_millis(250));
            let err = store.put("a/b.ckpt", b"x").unwrap_err();
            assert!(err.to_string().contains(&url), "{err}");
            let dir = tempfile::tempdir().unwrap();
            let _server = NatsServer::start_on(port, dir.path().join("js")).unwrap();
            let obj = store.put("a/b.ckpt", b"x").unwrap();
            assert_eq!(
                get_verified(&store, &obj.uri, &obj.sha256, 1).unwrap(),
                b"x"
            );
        }

        #[test]
        fn unreachable_server_fails_with_the_url() {
            let port = crate::testkit::free_port().unwrap();
            let url = format!("nats://127.0.0.1:{port}");
            let bus = BusConfig {
                connect_timeout_ms: 300,
                ..Default::default()
            };
            let err = futures::executor::block_on(JetStreamStore::connect(
                &url,
                &bus,
                &js_cfg("aware-models"),
            ))
            .unwrap_err();
            assert!(err.to_string().contains(&url), "{err}");
        }
    }

    #[test]
    fn sha256_of_known_input() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn round_trip_and_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::open(dir.path().join("models")).unwrap();
        let t = Target::new("shop", "cart.v2");
        let key = model_key(&t, "base_learner", 7);
        assert_eq!(key, "shop/cart.v2/base_learner/v00000000000000000007.ckpt");
        assert_eq!(version_of_key(&key), Some(7));
        let obj = store.put(&key, b"weights-1").unwrap();
        assert_eq!(obj.size_bytes, 9);
        assert_eq!(obj.sha256, sha256_hex(b"weights-1"));
        assert!(obj.uri.starts_with("file:///"), "{}", obj.uri);
        assert_eq!(store.key_of_uri(&obj.uri).unwrap(), key);
        let back = get_verified(&store, &obj.uri, &obj.sha256, obj.size_bytes).unwrap();
        assert_eq!(back, b"weights-1");
        // Overwrite is atomic and leaves no temporary file behind.
        let obj2 = store.put(&key, b"weights-two").unwrap();
        assert_eq!(store.get(&key).unwrap(), b"weights-two");
        assert_ne!(obj.sha256, obj2.sha256);
        let files: Vec<_> = std::fs::read_dir(store.root().join("shop/cart.v2/base_learner"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        // Listing by prefix, in version order.
        store.put(&model_key(&t, "base_learner", 12), b"x").unwrap();
        store
            .put(
                &model_key(&Target::new("shop", "other"), "base_learner", 1),
                b"y",
            )
            .unwrap();
        let keys = store.keys(&model_prefix(&t)).unwrap();
        assert_eq!(
            keys.iter().map(|k| version_of_key(k)).collect::<Vec<_>>(),
            vec![Some(7), Some(12)]
        );
        assert_eq!(store.keys("").unwrap().len(), 3);
    }

    #[test]
    fn corrupt_or_truncated_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::open(dir.path()).unwrap();
        let obj = store.put("a/b.ckpt", b"0123456789").unwrap();
        let path = store.root().join("a/b.ckpt");
        // Same size, one byte flipped.
        std::fs::write(&path, b"0123456788").unwrap();
        assert!(matches!(
            get_verified(&store, &obj.uri, &obj.sha256, obj.size_bytes),
            Err(ModelStoreError::Checksum { .. })
        ));
        // Truncated.
        std::fs::write(&path, b"01234").unwrap();
        assert!(matches!(
            get_verified(&store, &obj.uri, &obj.sha256, obj.size_bytes),
            Err(ModelStoreError::Size {
                expected: 10,
                found: 5,
                ..
            })
        ));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            get_verified(&store, &obj.uri, &obj.sha256, obj.size_bytes),
            Err(ModelStoreError::NotFound { .. })
        ));
    }

    #[test]
    fn keys_and_uris_cannot_escape_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::open(dir.path().join("m")).unwrap();
        for key in ["", "../x", "a//b", "a/./b", "/abs", "a/b c", "a/.hidden"] {
            assert!(
                matches!(
                    store.put(key, b"x"),
                    Err(ModelStoreError::InvalidKey { .. })
                ),
                "{key:?}"
            );
        }
        let outside = format!("file://{}/x.ckpt", dir.path().display());
        assert!(matches!(
            store.key_of_uri(&outside),
            Err(ModelStoreError::ForeignUri { .. })
        ));
        assert!(matches!(
            store.key_of_uri("nats-object://bucket/x"),
            Err(ModelStoreError::ForeignUri { .. })
        ));
    }
}
