//! `aware nats-config`: the nats-server `authorization` block giving each AWARE identity its own
//! user and subject permissions (the table of `aware_shared::bus::permissions`), with passwords
//! read by nats-server from the environment or with NKeys generated here.

use std::path::Path;

use aware_shared::bus::permissions::{server_authorization, Identity, Names, UserAuth};
use aware_shared::config::AppConfig;
use aware_shared::model_store::ModelStoreConfig;

#[derive(Debug, thiserror::Error)]
pub enum NatsConfigError {
    #[error(transparent)]
    Config(#[from] aware_shared::config::ConfigError),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("generating an NKey: {0}")]
    NKey(String),
}

/// The stream and bucket names of `cfg` (the capture's partitions of `bus.jetstream.stream`,
/// `model_store.bucket`).
pub fn names(cfg: &AppConfig) -> Result<Names, NatsConfigError> {
    let store: ModelStoreConfig = cfg.section("model_store")?;
    Ok(Names {
        streams: cfg.bus.jetstream.capture_streams(),
        state_bucket: cfg.bus.jetstream.state_bucket.clone(),
        bucket: store.bucket,
    })
}

/// The configuration with passwords from `$AWARE_NATS_PASSWORD_<IDENTITY>`.
pub fn with_passwords(cfg: &AppConfig) -> Result<String, NatsConfigError> {
    let users: Vec<_> = Identity::ALL
        .into_iter()
        .map(|id| (id, UserAuth::PasswordFromEnv))
        .collect();
    Ok(server_authorization(&names(cfg)?, &users))
}

/// The configuration with a new NKey pair per identity, each seed written to
/// `dir/<identity>.nk` (readable by its owner only).
pub fn with_nkeys(cfg: &AppConfig, dir: &Path) -> Result<String, NatsConfigError> {
    let write_err = |path: &Path, source| NatsConfigError::Write {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| write_err(dir, e))?;
    let mut users = Vec::new();
    for id in Identity::ALL {
        let pair = nkeys::KeyPair::new_user();
        let seed = pair
            .seed()
            .map_err(|e| NatsConfigError::NKey(e.to_string()))?;
        let path = dir.join(format!("{}.nk", id.name()));
        write_private(&path, &seed).map_err(|e| write_err(&path, e))?;
        users.push((id, UserAuth::NKey(pair.public_key())));
    }
    Ok(server_authorization(&names(cfg)?, &users))
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts.open(path)?.write_all(format!("{text}\n").as_bytes())
}

/// What each service sets to connect as its identity (printed after the configuration).
pub fn client_settings() -> String {
    let mut out = String::from("# Each service connects as its identity with:\n");
    for id in Identity::ALL {
        out.push_str(&format!(
            "#   {:<17} AWARE_BUS__AUTH__USER={} AWARE_BUS__AUTH__PASSWORD_FILE=… (or AWARE_BUS__AUTH__NKEY_SEED_FILE={}.nk) AWARE_BUS__INBOX_PREFIX={}\n",
            id.name(),
            id.name(),
            id.name(),
            id.inbox_prefix()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charts_authorization_is_the_generated_one() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../helm/aware/files/nats-authorization.conf");
        let chart = std::fs::read_to_string(&path).unwrap();
        let generated = with_passwords(&AppConfig::default()).unwrap();
        assert_eq!(
            chart, generated,
            "regenerate it: `aware nats-config > helm/aware/files/nats-authorization.conf`"
        );
    }

    #[test]
    fn nkeys_are_generated_with_private_seeds() {
        let dir = tempfile::tempdir().unwrap();
        let conf = with_nkeys(&AppConfig::default(), dir.path()).unwrap();
        for id in Identity::ALL {
            let seed =
                std::fs::read_to_string(dir.path().join(format!("{}.nk", id.name()))).unwrap();
            let pair = nkeys::KeyPair::from_seed(seed.trim()).unwrap();
            assert!(conf.contains(&format!("nkey: {}", pair.public_key())));
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(dir.path().join(format!("{}.nk", id.name())))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o077, 0, "{mode:o}");
            }
        }
    }
}
