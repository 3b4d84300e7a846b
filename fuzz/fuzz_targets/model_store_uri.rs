//! The model store's reader (`aware_shared::model_store`): a `model` message names the weights by
//! URI, size and SHA-256, and a consumer resolves the URI to a key (`key_of_uri`) and reads and
//! verifies the object (`get_verified`). The input is the URI; the store is a local directory
//! holding one object.
//!
//! Invariants: a URI resolves only to a valid key inside the store's root; `get_verified` returns
//! only the stored object, and only for a URI naming it; the version in a model key
//! (`version_of_key`) reads back the version it was built with.
#![no_main]

use std::path::Component;
use std::sync::OnceLock;

use aware_bus_schemas::Target;
use aware_shared::model_store::{
    get_verified, model_key, sha256_hex, validate_key, version_of_key, LocalDirStore, ModelStore,
};
use libfuzzer_sys::fuzz_target;

const OBJECT: &[u8] = b"AWAREMDL checkpoint bytes";

fn store() -> &'static (LocalDirStore, String) {
    static STORE: OnceLock<(LocalDirStore, String)> = OnceLock::new();
    STORE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("aware-fuzz-store-{}", std::process::id()));
        let store = match LocalDirStore::open(&dir) {
            Ok(s) => s,
            Err(e) => panic!("cannot open a store in {}: {e}", dir.display()),
        };
        let key = model_key(&Target::new("ns", "app"), "base_learner", 7);
        if let Err(e) = store.put(&key, OBJECT) {
            panic!("cannot store {key}: {e}");
        }
        (store, key)
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(uri) = std::str::from_utf8(data) else {
        return;
    };
    let (store, stored_key) = store();
    if let Ok(key) = store.key_of_uri(uri) {
        assert!(
            validate_key(&key).is_ok(),
            "`{uri}` resolves to invalid key `{key}`"
        );
        let path = key
            .split('/')
            .fold(store.root().to_path_buf(), |p, s| p.join(s));
        assert!(
            path.starts_with(store.root()) && path.components().all(|c| c != Component::ParentDir),
            "`{uri}` resolves outside the store: {}",
            path.display()
        );
    }
    let sha = sha256_hex(OBJECT);
    if let Ok(bytes) = get_verified(store, uri, &sha, OBJECT.len() as u64) {
        assert_eq!(bytes, OBJECT);
        assert_eq!(store.key_of_uri(uri).ok().as_ref(), Some(stored_key));
    }
    if let Some(version) = version_of_key(uri) {
        let key = model_key(&Target::new("ns", "app"), "base_learner", version);
        assert_eq!(version_of_key(&key), Some(version));
    }
});
