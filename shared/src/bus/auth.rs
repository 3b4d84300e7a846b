//! Credentials and TLS of a NATS connection, from the URL (`nats://user:password@host`,
//! `nats://token@host`, each URL of a comma-separated list) or from `bus.auth` / `bus.tls`.
//!
//! async-nats does not read credentials from a URL, so they are taken out of it here and given to
//! the client as options; the server list it connects to carries none. Secrets never appear in a
//! `Debug` output, a log line or an error: [`Secret`] prints `***`, and errors name the key and
//! file, never the content.

use std::path::PathBuf;

use async_nats::ServerAddr;

use crate::config::{BusAuthConfig, BusTlsConfig, MASK};

/// A secret value; its `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret itself, for the client only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(MASK)
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(MASK)
    }
}

/// How a connection authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    None,
    UserPassword {
        user: String,
        password: Secret,
    },
    Token(Secret),
    /// An NKey seed (`SU…`): the client signs the server's nonce with it.
    NKeySeed(Secret),
    /// The content of a creds file (a user JWT and its NKey seed).
    Creds(Secret),
}

impl Credentials {
    /// Where these credentials came from, for errors (`bus.url`, `bus.auth.token_file`, …).
    fn describe(&self) -> &'static str {
        match self {
            Credentials::None => "none",
            Credentials::UserPassword { .. } => "user and password",
            Credentials::Token(_) => "token",
            Credentials::NKeySeed(_) => "NKey seed",
            Credentials::Creds(_) => "creds file",
        }
    }
}

/// Credential and TLS errors; they name the key (and the file), never a secret.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("`bus.url`: `{url}` is not a valid NATS URL: {reason}")]
    Url { url: String, reason: String },
    #[error("`bus.url`: the URLs of the list carry different credentials; give them once (in `bus.auth` or in every URL alike)")]
    UrlsDisagree,
    #[error("`bus.url` carries credentials and `{key}` is set too: set them in one place")]
    UrlAndSettings { key: &'static str },
    #[error("`{key}`: cannot read {path}: {reason}")]
    File {
        key: &'static str,
        path: String,
        reason: String,
    },
    #[error("`{key}`: {path} {reason}")]
    Content {
        key: &'static str,
        path: String,
        reason: String,
    },
}

/// The server addresses of `url` (a comma-separated list), with the credentials some of them carry
/// taken out (each URL's own, which must agree). Checks they do not contradict `auth`.
pub fn servers_and_url_credentials(
    url: &str,
    auth: &BusAuthConfig,
) -> Result<(Vec<ServerAddr>, Credentials), AuthError> {
    let mut servers = Vec::new();
    let mut creds: Option<Credentials> = None;
    for one in url.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = |reason: String| AuthError::Url {
            url: super::redact_url(one),
            reason,
        };
        let mut parsed = url::Url::parse(one).map_err(|e| bad(e.to_string()))?;
        let user = percent_decode(parsed.username());
        let password = parsed.password().map(percent_decode);
        let this = match (user.is_empty(), password) {
            (true, None) => None,
            (false, None) => Some(Credentials::Token(Secret::new(user))),
            (_, Some(p)) => Some(Credentials::UserPassword {
                user,
                password: Secret::new(p),
            }),
        };
        if let Some(this) = this {
            match &creds {
                Some(c) if *c != this => return Err(AuthError::UrlsDisagree),
                _ => creds = Some(this),
            }
            parsed
                .set_username("")
                .and_then(|()| parsed.set_password(None))
                .map_err(|()| bad("cannot take the credentials out".into()))?;
        }
        servers.push(ServerAddr::from_url(parsed).map_err(|e| bad(e.to_string()))?);
    }
    if servers.is_empty() {
        return Err(AuthError::Url {
            url: url.to_string(),
            reason: "no server".into(),
        });
    }
    if creds.is_some() {
        if let Some(key) = auth.keys_set().first() {
            return Err(AuthError::UrlAndSettings { key });
        }
    }
    Ok((servers, creds.unwrap_or(Credentials::None)))
}

/// `%XX` escapes decoded (userinfo of a URL); invalid escapes are kept as written.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(b) = hex {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads the secret file of `key`, trimmed.
fn read_secret(key: &'static str, path: &str) -> Result<Secret, AuthError> {
    let text = std::fs::read_to_string(path).map_err(|e| AuthError::File {
        key,
        path: path.to_string(),
        reason: e.to_string(),
    })?;
    let text = text.trim();
    if text.is_empty() {
        return Err(AuthError::Content {
            key,
            path: path.to_string(),
            reason: "is empty".into(),
        });
    }
    Ok(Secret::new(text))
}

/// The credentials of `bus.auth` (files read now), or those of the URL.
pub fn credentials(url_creds: Credentials, auth: &BusAuthConfig) -> Result<Credentials, AuthError> {
    if url_creds != Credentials::None {
        return Ok(url_creds);
    }
    if !auth.user.is_empty() {
        let password = if auth.password.is_empty() {
            read_secret("bus.auth.password_file", &auth.password_file)?
        } else {
            Secret::new(auth.password.clone())
        };
        return Ok(Credentials::UserPassword {
            user: auth.user.clone(),
            password,
        });
    }
    if !auth.token.is_empty() {
        return Ok(Credentials::Token(Secret::new(auth.token.clone())));
    }
    if !auth.token_file.is_empty() {
        return Ok(Credentials::Token(read_secret(
            "bus.auth.token_file",
            &auth.token_file,
        )?));
    }
    if !auth.nkey_seed_file.is_empty() {
        let key = "bus.auth.nkey_seed_file";
        let seed = read_secret(key, &auth.nkey_seed_file)?;
        nkeys::KeyPair::from_seed(seed.expose()).map_err(|_| AuthError::Content {
            key,
            path: auth.nkey_seed_file.clone(),
            reason: "does not hold an NKey seed (`S…`, as `nk -gen user` writes)".into(),
        })?;
        return Ok(Credentials::NKeySeed(seed));
    }
    if !auth.creds_file.is_empty() {
        let key = "bus.auth.creds_file";
        // Kept whole: the client's parser needs the line ends around the decorated blocks.
        let creds = read_secret(key, &auth.creds_file)
            .map(|trimmed| Secret::new(format!("{}\n", trimmed.expose())))?;
        // Parsed as the client will, so a bad file is named now rather than at each attempt.
        async_nats::ConnectOptions::with_credentials(creds.expose())
            .map(drop)
            .map_err(|_| AuthError::Content {
                key,
                path: auth.creds_file.clone(),
                reason: "is not a NATS creds file (a user JWT and an NKey seed)".into(),
            })?;
        return Ok(Credentials::Creds(creds));
    }
    Ok(Credentials::None)
}

/// Everything a connection needs besides the plain settings: servers without credentials, the
/// credentials, and TLS files (checked to be readable).
#[derive(Debug, Clone)]
pub struct Resolved {
    pub servers: Vec<ServerAddr>,
    pub credentials: Credentials,
    tls: BusTlsConfig,
}

/// Resolves `url`, `auth` and `tls`: reads the secret files and checks the TLS files exist.
pub fn resolve(url: &str, auth: &BusAuthConfig, tls: &BusTlsConfig) -> Result<Resolved, AuthError> {
    let (servers, from_url) = servers_and_url_credentials(url, auth)?;
    let credentials = credentials(from_url, auth)?;
    for (key, path) in [
        ("bus.tls.ca_file", &tls.ca_file),
        ("bus.tls.cert_file", &tls.cert_file),
        ("bus.tls.key_file", &tls.key_file),
    ] {
        if !path.is_empty() {
            std::fs::metadata(path)
                .and_then(|_| std::fs::File::open(path).map(drop))
                .map_err(|e| AuthError::File {
                    key,
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
        }
    }
    Ok(Resolved {
        servers,
        credentials,
        tls: tls.clone(),
    })
}

impl Resolved {
    /// What the credentials are (`user and password`, `token`, …), for logs and errors.
    pub fn method(&self) -> &'static str {
        self.credentials.describe()
    }

    /// `opts` with these credentials and TLS settings.
    pub fn apply(
        &self,
        opts: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, AuthError> {
        let mut opts = match &self.credentials {
            Credentials::None => opts,
            Credentials::UserPassword { user, password } => {
                opts.user_and_password(user.clone(), password.expose().to_string())
            }
            Credentials::Token(t) => opts.token(t.expose().to_string()),
            Credentials::NKeySeed(s) => opts.nkey(s.expose().to_string()),
            Credentials::Creds(c) => {
                opts.credentials(c.expose())
                    .map_err(|_| AuthError::Content {
                        key: "bus.auth.creds_file",
                        path: String::new(),
                        reason: "is not a NATS creds file".into(),
                    })?
            }
        };
        if !self.tls.ca_file.is_empty() {
            opts = opts.add_root_certificates(PathBuf::from(&self.tls.ca_file));
        }
        if !self.tls.cert_file.is_empty() {
            opts = opts.add_client_certificate(
                PathBuf::from(&self.tls.cert_file),
                PathBuf::from(&self.tls.key_file),
            );
        }
        if self.tls.required {
            opts = opts.require_tls(true);
        }
        Ok(opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_credentials_are_taken_out_of_every_url() {
        let auth = BusAuthConfig::default();
        let (servers, creds) =
            servers_and_url_credentials("nats://ann:p%40ss%3Aw@n1:4222,nats://n2:4223", &auth)
                .unwrap();
        assert_eq!(
            creds,
            Credentials::UserPassword {
                user: "ann".into(),
                password: Secret::new("p@ss:w")
            }
        );
        let hosts: Vec<_> = servers
            .iter()
            .map(|s| (s.host().to_string(), s.port(), s.has_user_pass()))
            .collect();
        assert_eq!(
            hosts,
            [
                ("n1".to_string(), 4222, false),
                ("n2".to_string(), 4223, false)
            ]
        );
        let (_, creds) = servers_and_url_credentials("nats://t0k@n1:4222", &auth).unwrap();
        assert_eq!(creds, Credentials::Token(Secret::new("t0k")));
        assert!(matches!(
            servers_and_url_credentials("nats://a:b@n1,nats://a:c@n2", &auth),
            Err(AuthError::UrlsDisagree)
        ));
        let with_user = BusAuthConfig {
            user: "x".into(),
            password: "y".into(),
            ..Default::default()
        };
        let err = servers_and_url_credentials("nats://a:b@n1", &with_user)
            .unwrap_err()
            .to_string();
        assert!(err.contains("bus.auth.user"), "{err}");
        assert!(!err.contains(":b@"), "{err}");
    }

    #[test]
    fn secrets_print_masked() {
        let c = Credentials::UserPassword {
            user: "ann".into(),
            password: Secret::new("hunter2"),
        };
        let shown = format!("{c:?} {}", Secret::new("hunter2"));
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("ann"), "{shown}");
    }

    #[test]
    fn percent_escapes_decode() {
        assert_eq!(percent_decode("a%2Fb%zz%4"), "a/b%zz%4");
    }
}
