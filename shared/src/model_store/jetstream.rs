//! The model store on a NATS JetStream object store bucket (`model_store.backend = "jetstream"`).
//!
//! One object per key in bucket `model_store.bucket` (created if missing); the announced uri is
//! `nats-object://<bucket>/<key>`. The server chunks large objects (128 KiB) and records their
//! SHA-256, which the client checks on every read; [`super::get_verified`] then checks the size and
//! SHA-256 the `model` message announced, as for the local store.
//!
//! [`JetStreamStore::open`] returns at once and connects in the background (a service subscribes
//! to the bus without waiting for the bucket). [`ModelStore`] is synchronous, so the store owns a small tokio runtime (one worker thread) with
//! its own NATS connection, and every call runs there while the caller's thread waits for the
//! result. The connection never depends on the caller's runtime: a caller that blocks its own
//! thread (an actix arbiter, a current-thread runtime) cannot starve it. Callers still keep these
//! calls off async threads (`spawn_blocking`), as for any blocking I/O.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, object_store, stream::StorageType};
use tokio::io::AsyncReadExt;

use super::{
    sha256_hex, validate_key, ModelStore, ModelStoreConfig, ModelStoreError, StoredObject,
};
use crate::bus::{redact_url, NatsBus};
use crate::config::{BusConfig, StorageKind};

/// Scheme of the uris this backend announces.
pub const URI_SCHEME: &str = "nats-object://";

/// A tokio runtime that is shut down without waiting, so dropping it is allowed anywhere
/// (dropping a plain `Runtime` inside an async context panics).
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl OwnRuntime {
    fn handle(&self) -> Option<&tokio::runtime::Handle> {
        self.0.as_ref().map(|rt| rt.handle())
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The model store in a JetStream object store bucket.
pub struct JetStreamStore {
    bucket: String,
    timeout: Duration,
    opener: Arc<Opener>,
    // Dropped last: the connection and the bucket handle live on this runtime.
    rt: Arc<OwnRuntime>,
}

/// Connects and opens the bucket once, on first need (retried by the next call after a failure).
struct Opener {
    bus: BusConfig,
    cfg: ModelStoreConfig,
    objects: tokio::sync::OnceCell<object_store::ObjectStore>,
}

impl Opener {
    async fn objects(&self) -> Result<object_store::ObjectStore, ModelStoreError> {
        self.objects
            .get_or_try_init(|| async {
                let nats = NatsBus::connect(&self.bus, "aware-model-store")
                    .await
                    .map_err(|e| nats_err(&self.cfg.bucket, "connect to", &redact_url(&self.bus.url), e))?;
                let objects = open_bucket(nats.client().clone(), &self.cfg).await?;
                tracing::info!(bucket = %self.cfg.bucket, url = %redact_url(&self.bus.url), "model store: JetStream object store opened");
                Ok(objects)
            })
            .await
            .cloned()
    }
}

impl std::fmt::Debug for JetStreamStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamStore")
            .field("bucket", &self.bucket)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn nats_err(
    bucket: &str,
    op: &'static str,
    what: &str,
    reason: impl std::fmt::Display,
) -> ModelStoreError {
    ModelStoreError::Nats {
        op,
        what: format!("{what} (bucket `{bucket}`)"),
        reason: reason.to_string(),
    }
}

impl JetStreamStore {
    /// The store on the NATS server at `url` (with the connection settings of `bus`), bucket
    /// `cfg.bucket` (created with `cfg`'s limits when it does not exist). Returns at once: the
    /// connection and the bucket are opened in the background, so a service opening the store
    /// subscribes to the bus without delay; calls wait for them (within `timeout_ms`), and a
    /// failure is returned by the calls (and logged) until an attempt succeeds.
    pub fn open(
        url: &str,
        bus: &BusConfig,
        cfg: &ModelStoreConfig,
    ) -> Result<Self, ModelStoreError> {
        cfg.validate()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("aware-model-store")
            .enable_all()
            .build()
            .map_err(|e| nats_err(&cfg.bucket, "start", "the runtime", e))?;
        let mut bus = bus.clone();
        bus.url = url.to_string();
        // The bus declares its own stream; this connection only serves the bucket.
        bus.jetstream.enabled = false;
        let opener = Arc::new(Opener {
            bus,
            cfg: cfg.clone(),
            objects: tokio::sync::OnceCell::new(),
        });
        let early = opener.clone();
        rt.spawn(async move {
            if let Err(e) = early.objects().await {
                tracing::error!(error = %e, "model store: cannot open the JetStream object store yet; every call retries");
            }
        });
        Ok(JetStreamStore {
            bucket: cfg.bucket.clone(),
            timeout: Duration::from_millis(cfg.timeout_ms),
            opener,
            rt: Arc::new(OwnRuntime(Some(rt))),
        })
    }

    /// As [`open`](Self::open), then waits until the bucket is open.
    pub async fn connect(
        url: &str,
        bus: &BusConfig,
        cfg: &ModelStoreConfig,
    ) -> Result<Self, ModelStoreError> {
        let store = Self::open(url, bus, cfg)?;
        store.ready().await?;
        Ok(store)
    }

    /// Waits until the connection and the bucket are open (or the attempt failed).
    pub async fn ready(&self) -> Result<(), ModelStoreError> {
        let Some(handle) = self.rt.handle() else {
            return Err(nats_err(
                &self.bucket,
                "open",
                "the bucket",
                "the runtime stopped",
            ));
        };
        let opener = self.opener.clone();
        handle
            .spawn(async move { opener.objects().await.map(|_| ()) })
            .await
            .map_err(|e| nats_err(&self.bucket, "open", "the bucket", e))?
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The uri announced for `key`.
    pub fn uri_of(&self, key: &str) -> String {
        format!("{URI_SCHEME}{}/{key}", self.bucket)
    }

    /// Runs `fut` on the store's runtime (bounded by the configured timeout) and waits for it.
    fn block_on<T, F>(&self, op: &'static str, what: &str, fut: F) -> Result<T, ModelStoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, ModelStoreError>> + Send + 'static,
    {
        let Some(handle) = self.rt.handle() else {
            return Err(nats_err(&self.bucket, op, what, "the runtime stopped"));
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let timeout = self.timeout;
        let what_owned = format!("{what} (bucket `{}`)", self.bucket);
        handle.spawn(async move {
            let res = match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r,
                Err(_) => Err(ModelStoreError::Timeout {
                    op,
                    what: what_owned,
                    ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                }),
            };
            // The caller may have gone (nothing to do then).
            let _ = tx.send(res);
        });
        rx.recv()
            .unwrap_or_else(|_| Err(nats_err(&self.bucket, op, what, "the runtime stopped")))
    }
}

/// Gets the bucket, or creates it; a concurrent creator (trainer and recommender starting
/// together) is fine: the second `get` sees the bucket.
async fn open_bucket(
    client: async_nats::Client,
    cfg: &ModelStoreConfig,
) -> Result<object_store::ObjectStore, ModelStoreError> {
    let js = jetstream::new(client);
    if let Ok(store) = js.get_object_store(&cfg.bucket).await {
        return Ok(store);
    }
    let create = js
        .create_object_store(object_store::Config {
            bucket: cfg.bucket.clone(),
            description: Some("AWARE model store (versioned checkpoints)".to_string()),
            max_bytes: cfg.max_bytes,
            storage: match cfg.storage {
                StorageKind::File => StorageType::File,
                StorageKind::Memory => StorageType::Memory,
            },
            num_replicas: cfg.replicas,
            ..Default::default()
        })
        .await;
    match create {
        Ok(store) => {
            tracing::info!(bucket = %cfg.bucket, "model store: bucket created");
            Ok(store)
        }
        Err(e) => js
            .get_object_store(&cfg.bucket)
            .await
            .map_err(|_| nats_err(&cfg.bucket, "create", "the bucket", e)),
    }
}

impl ModelStore for JetStreamStore {
    fn backend(&self) -> &'static str {
        "jetstream"
    }

    fn put(&self, key: &str, bytes: &[u8]) -> Result<StoredObject, ModelStoreError> {
        validate_key(key)?;
        let sha256 = sha256_hex(bytes);
        let size_bytes = bytes.len() as u64;
        let (opener, owned, name) = (self.opener.clone(), bytes.to_vec(), key.to_string());
        let bucket = self.bucket.clone();
        let info = self.block_on("put", key, async move {
            let store = opener.objects().await?;
            let mut reader: &[u8] = &owned;
            store
                .put(name.as_str(), &mut reader)
                .await
                .map_err(|e| nats_err(&bucket, "put", &name, e))
        })?;
        if info.size as u64 != size_bytes {
            return Err(ModelStoreError::Size {
                key: key.to_string(),
                expected: size_bytes,
                found: info.size as u64,
            });
        }
        Ok(StoredObject {
            key: key.to_string(),
            uri: self.uri_of(key),
            sha256,
            size_bytes,
        })
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, ModelStoreError> {
        validate_key(key)?;
        let (opener, name, bucket) = (self.opener.clone(), key.to_string(), self.bucket.clone());
        self.block_on("get", key, async move {
            let store = opener.objects().await?;
            let mut object = match store.get(name.as_str()).await {
                Ok(o) => o,
                Err(e) if e.kind() == object_store::GetErrorKind::NotFound => {
                    return Err(ModelStoreError::NotFound { key: name });
                }
                Err(e) => return Err(nats_err(&bucket, "get", &name, e)),
            };
            let size = object.info().size;
            let mut out = Vec::with_capacity(size);
            // The client checks the chunks against the digest recorded at `put`.
            object
                .read_to_end(&mut out)
                .await
                .map_err(|e| nats_err(&bucket, "read", &name, e))?;
            if out.len() != size {
                return Err(ModelStoreError::Size {
                    key: name,
                    expected: size as u64,
                    found: out.len() as u64,
                });
            }
            Ok(out)
        })
    }

    fn key_of_uri(&self, uri: &str) -> Result<String, ModelStoreError> {
        let foreign = || ModelStoreError::ForeignUri {
            uri: uri.to_string(),
            root: format!("{URI_SCHEME}{}", self.bucket),
        };
        let rest = uri.strip_prefix(URI_SCHEME).ok_or_else(foreign)?;
        let (bucket, key) = rest.split_once('/').ok_or_else(foreign)?;
        if bucket != self.bucket {
            return Err(foreign());
        }
        validate_key(key)?;
        Ok(key.to_string())
    }

    fn delete(&self, key: &str) -> Result<(), ModelStoreError> {
        validate_key(key)?;
        let (opener, name, bucket) = (self.opener.clone(), key.to_string(), self.bucket.clone());
        self.block_on("delete", key, async move {
            let store = opener.objects().await?;
            match store.delete(name.as_str()).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == object_store::DeleteErrorKind::NotFound => Ok(()),
                Err(e) => Err(nats_err(&bucket, "delete", &name, e)),
            }
        })
    }

    fn keys(&self, prefix: &str) -> Result<Vec<String>, ModelStoreError> {
        let (opener, bucket) = (self.opener.clone(), self.bucket.clone());
        let prefix = prefix.to_string();
        self.block_on("list", "the bucket", async move {
            let store = opener.objects().await?;
            use futures::StreamExt;
            let mut list = store
                .list()
                .await
                .map_err(|e| nats_err(&bucket, "list", "the bucket", e))?;
            let mut out = Vec::new();
            while let Some(info) = list.next().await {
                let info = info.map_err(|e| nats_err(&bucket, "list", "the bucket", e))?;
                if info.name.starts_with(&prefix) && validate_key(&info.name).is_ok() {
                    out.push(info.name);
                }
            }
            out.sort();
            out.dedup();
            Ok(out)
        })
    }
}
