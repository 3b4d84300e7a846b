//! The configuration loader (`aware_shared::config::load`), fed a configuration file as the
//! services read it: the first byte picks the format (TOML, YAML or JSON, by file extension as
//! `--config` does), the rest is the file. The environment is empty (not the process's).
//!
//! Invariants: a loaded configuration passes its own validation; written back as a JSON file it
//! loads to the same configuration (the effective configuration is a configuration file).
#![no_main]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use aware_shared::config::{load, AppConfig, ConfigSources};
use libfuzzer_sys::fuzz_target;

fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("aware-fuzz-config-{}", std::process::id()));
        if let Err(e) = std::fs::create_dir_all(&d) {
            panic!("cannot create {}: {e}", d.display());
        }
        d
    })
}

fn load_file(name: &str, text: &[u8]) -> Result<AppConfig, String> {
    let path = dir().join(name);
    if let Err(e) = std::fs::write(&path, text) {
        panic!("cannot write {}: {e}", path.display());
    }
    load(&ConfigSources {
        file: Some(path),
        env: Some(HashMap::new()),
        overrides: Vec::new(),
    })
    .map_err(|e| e.to_string())
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, text)) = data.split_first() else {
        return;
    };
    let ext = ["toml", "yaml", "json"][usize::from(selector) % 3];
    let Ok(cfg) = load_file(&format!("config.{ext}"), text) else {
        return;
    };
    if let Err(e) = cfg.validate() {
        panic!("a loaded configuration fails its own validation: {e}");
    }
    let _ = cfg.unused_keys();
    let json = match serde_json::to_vec(&cfg) {
        Ok(j) => j,
        Err(e) => panic!("a loaded configuration does not serialize: {e}"),
    };
    match load_file("effective.json", &json) {
        Ok(again) => assert_eq!(
            again, cfg,
            "the effective configuration reloads differently"
        ),
        Err(e) => panic!(
            "the effective configuration does not load: {e}\n{}",
            String::from_utf8_lossy(&json)
        ),
    }
});
