//! Flags shared by every binary; they are the last configuration layer.

use std::path::PathBuf;

use crate::config::{ConfigError, ConfigSources, ShardConfig};

#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// Configuration file (TOML, YAML or JSON).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Bus: `embedded` or a NATS URL (`nats://host:4222`).
    #[arg(long, value_name = "URL")]
    pub bus: Option<String>,
    /// Address of /metrics, /healthz, /readyz.
    #[arg(long, value_name = "ADDR")]
    pub http_listen: Option<String>,
    /// Shard of the targets this instance owns, `i/N`.
    #[arg(long, value_name = "i/N")]
    pub shard: Option<String>,
    /// Log format: text or json.
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
}

impl ConfigArgs {
    /// Configuration sources with these flags as overrides; the environment is the process's.
    pub fn sources(&self) -> Result<ConfigSources, ConfigError> {
        let mut overrides = Vec::new();
        if let Some(b) = &self.bus {
            overrides.push(("bus.url".to_string(), b.clone()));
        }
        if let Some(h) = &self.http_listen {
            overrides.push(("http.listen".to_string(), h.clone()));
        }
        if let Some(s) = &self.shard {
            let s = ShardConfig::parse(s)?;
            overrides.push(("shard.index".to_string(), s.index.to_string()));
            overrides.push(("shard.count".to_string(), s.count.to_string()));
        }
        if let Some(f) = &self.log_format {
            overrides.push(("log.format".to_string(), f.clone()));
        }
        Ok(ConfigSources {
            file: self.config.clone(),
            env: None,
            overrides,
        })
    }
}
