//! The model store (DESIGN §5): versioned weights by key, each with its SHA-256.
//!
//! The trainer writes a checkpoint with [`ModelStore::put`] and announces the returned
//! [`StoredObject`] (uri, sha256, size) in a `model` message; a recommender resolves the uri with
//! [`ModelStore::key_of_uri`] and reads it back with [`get_verified`], which refuses bytes whose
//! size or SHA-256 differ from the announcement (a torn or tampered file never reaches a policy).
//!
//! [`LocalDirStore`] (the default) keeps one file per key under a root directory. A write goes to
//! a temporary file in the destination directory, is fsynced, renamed over the key's path and the
//! directory is fsynced: a reader sees either the whole previous object or the whole new one, and
//! a crash leaves at most a stray `.tmp` file.
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

/// What a `put` stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    pub key: String,
    /// Location to announce (`file:///…`).
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
}

/// A store of model bytes by key. Synchronous (file or blocking I/O); async callers use
/// `spawn_blocking` for large objects.
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

/// The `[model_store]` configuration section (shared by the trainer and the recommender).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelStoreConfig {
    /// Root directory of the local model store.
    pub dir: PathBuf,
}

impl Default for ModelStoreConfig {
    fn default() -> Self {
        ModelStoreConfig {
            dir: PathBuf::from("aware-data/models"),
        }
    }
}

/// Opens the configured model store.
pub fn open_model_store(cfg: &ModelStoreConfig) -> Result<Arc<dyn ModelStore>, ModelStoreError> {
    Ok(Arc::new(LocalDirStore::open(&cfg.dir)?))
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
