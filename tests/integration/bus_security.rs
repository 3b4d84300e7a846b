//! Bus security against a real nats-server: credentials from the URL and from `bus.auth`
//! (user and password, token, NKey seed, creds file), TLS with a configured CA and a client
//! certificate (`bus.tls.*`), wrong credentials refused with a clear error, and secrets never
//! printed (`aware config`, errors).

use std::path::{Path, PathBuf};
use std::time::Duration;

use aware_shared::bus::Bus;
use aware_shared::config::BusConfig;
use aware_tests::{bin_path, NatsServer};
use bytes::Bytes;

/// A bus configuration for `url`, without the capture stream (these servers' accounts need none).
fn cfg(url: &str) -> BusConfig {
    let mut c = BusConfig {
        url: url.to_string(),
        connect_timeout_ms: 3_000,
        ..BusConfig::default()
    };
    c.jetstream.enabled = false;
    c
}

/// Connects with `c` and checks a message goes round through the server.
async fn round_trip(c: &BusConfig) -> Result<(), String> {
    let bus = Bus::connect(c, "security-test")
        .await
        .map_err(|e| e.to_string())?;
    let mut sub = bus
        .subscribe("aware.v1.obs.ns.app")
        .await
        .map_err(|e| e.to_string())?;
    bus.flush().await.map_err(|e| e.to_string())?;
    bus.publish("aware.v1.obs.ns.app", Bytes::from_static(b"hello"))
        .await
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(5), sub.next()).await {
        Ok(Some(m)) if &m.payload[..] == b"hello" => Ok(()),
        other => Err(format!("no round trip: {other:?}")),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_authenticate_from_the_url_and_from_settings() {
    // A password that must be percent-encoded in a URL.
    let server = NatsServer::start_with_config(
        "authorization {\n  user: ann\n  password: \"p@ss:w0rd/007\"\n}\n",
        &[],
    )
    .unwrap();
    let port = server.port();
    let encoded = "p%40ss%3Aw0rd%2F007";
    round_trip(&cfg(&format!("nats://ann:{encoded}@127.0.0.1:{port}")))
        .await
        .unwrap();
    // Each URL of a list carries them; the first server is down, the second answers.
    let dead = aware_tests::free_port().unwrap();
    round_trip(&cfg(&format!(
        "nats://ann:{encoded}@127.0.0.1:{dead},nats://ann:{encoded}@127.0.0.1:{port}"
    )))
    .await
    .unwrap();
    // From settings, and from a mounted file (with the newline `echo` leaves).
    let mut c = cfg(&server.url());
    c.auth.user = "ann".into();
    c.auth.password = "p@ss:w0rd/007".into();
    round_trip(&c).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    c.auth.password = String::new();
    c.auth.password_file = write(dir.path(), "password", "p@ss:w0rd/007\n");
    round_trip(&c).await.unwrap();
    // No credentials, or wrong ones: refused at once, the error saying why and showing no secret.
    let started = std::time::Instant::now();
    let err = round_trip(&cfg(&format!("nats://ann:wrong-secret@127.0.0.1:{port}")))
        .await
        .unwrap_err();
    assert!(
        err.contains("refused the credentials") && err.contains("user and password"),
        "{err}"
    );
    assert!(err.contains("ann:***@"), "{err}");
    assert!(!err.contains("wrong-secret"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2), "retried: {err}");
    let err = round_trip(&cfg(&server.url())).await.unwrap_err();
    assert!(err.contains("authorization violation"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_authenticates_from_the_url_and_from_settings() {
    let server =
        NatsServer::start_with_config("authorization {\n  token: \"s3cr3t-t0ken\"\n}\n", &[])
            .unwrap();
    round_trip(&cfg(&format!(
        "nats://s3cr3t-t0ken@127.0.0.1:{}",
        server.port()
    )))
    .await
    .unwrap();
    let mut c = cfg(&server.url());
    c.auth.token = "s3cr3t-t0ken".into();
    round_trip(&c).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    c.auth.token = String::new();
    c.auth.token_file = write(dir.path(), "token", "s3cr3t-t0ken\n");
    round_trip(&c).await.unwrap();
    c.auth.token_file = write(dir.path(), "token", "other");
    let err = round_trip(&c).await.unwrap_err();
    assert!(err.contains("refused the credentials (token)"), "{err}");
    c.auth.token_file = dir.path().join("absent").display().to_string();
    let err = round_trip(&c).await.unwrap_err();
    assert!(
        err.contains("bus.auth.token_file") && err.contains("absent"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nkey_seed_file_authenticates() {
    let user = nkeys::KeyPair::new_user();
    let server = NatsServer::start_with_config(
        &format!(
            "authorization {{\n  users = [ {{ nkey: {} }} ]\n}}\n",
            user.public_key()
        ),
        &[],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(&server.url());
    c.auth.nkey_seed_file = write(dir.path(), "seed", &format!("{}\n", user.seed().unwrap()));
    round_trip(&c).await.unwrap();
    // Another key: refused. Not a seed: named, the content not shown.
    c.auth.nkey_seed_file = write(
        dir.path(),
        "other",
        &nkeys::KeyPair::new_user().seed().unwrap(),
    );
    let err = round_trip(&c).await.unwrap_err();
    assert!(err.contains("refused the credentials (NKey seed)"), "{err}");
    c.auth.nkey_seed_file = write(dir.path(), "bad", "not-a-seed-hunter2");
    let err = round_trip(&c).await.unwrap_err();
    assert!(
        err.contains("bus.auth.nkey_seed_file") && !err.contains("hunter2"),
        "{err}"
    );
}

/// A JWT of the NATS decentralized auth (`ed25519-nkey`), signed by `issuer`.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = b64.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let iat = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "jti": format!("{subject}{iat}").chars().rev().take(20).collect::<String>(),
        "iat": iat,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let body = b64.encode(claims.to_string());
    let signed = format!("{header}.{body}");
    let sig = b64.encode(issuer.sign(signed.as_bytes()).unwrap());
    format!("{signed}.{sig}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creds_file_authenticates() {
    // An operator, an account and a user of that account, as `nsc` would make them.
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let op_jwt = jwt(
        &operator,
        &operator.public_key(),
        "op",
        serde_json::json!({"type": "operator", "version": 2}),
    );
    let unlimited = serde_json::json!({"subs": -1, "data": -1, "payload": -1, "imports": -1,
        "exports": -1, "wildcards": true, "conn": -1, "leaf": -1});
    let acc_jwt = jwt(
        &operator,
        &account.public_key(),
        "aware",
        serde_json::json!({"type": "account", "version": 2, "limits": unlimited}),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "collector",
        serde_json::json!({"type": "user", "version": 2, "pub": {}, "sub": {},
            "subs": -1, "data": -1, "payload": -1}),
    );
    // JetStream (the harness starts every server with it) needs a system account.
    let system = nkeys::KeyPair::new_account();
    let sys_jwt = jwt(
        &operator,
        &system.public_key(),
        "SYS",
        serde_json::json!({"type": "account", "version": 2, "limits": unlimited}),
    );
    let server = NatsServer::start_with_config(
        &format!(
            "operator: \"{op_jwt}\"\nsystem_account: {sys}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {acc}: \"{acc_jwt}\"\n  {sys}: \"{sys_jwt}\"\n}}\n",
            acc = account.public_key(),
            sys = system.public_key(),
        ),
        &[],
    )
    .unwrap();
    let creds = format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
        user.seed().unwrap()
    );
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(&server.url());
    c.auth.creds_file = write(dir.path(), "collector.creds", &creds);
    round_trip(&c).await.unwrap();
    // Without credentials the operator-mode server refuses.
    assert!(round_trip(&cfg(&server.url())).await.is_err());
    c.auth.creds_file = write(dir.path(), "junk.creds", "junk");
    let err = round_trip(&c).await.unwrap_err();
    assert!(err.contains("bus.auth.creds_file"), "{err}");
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files in `dir`:
/// (ca, server cert, server key, client cert, client key).
fn certificates(dir: &Path) -> [PathBuf; 5] {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "aware test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(DnType::CommonName, "aware test");
        p.extended_key_usages = vec![usage];
        let cert = p.signed_by(&key, &ca_cert, &ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(
        vec!["127.0.0.1".into(), "localhost".into()],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) = leaf(
        vec!["collector".into()],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let files = [
        ("ca.pem", ca_cert.pem()),
        ("server.pem", server_cert),
        ("server-key.pem", server_key),
        ("client.pem", client_cert),
        ("client-key.pem", client_key),
    ];
    files.map(|(name, text)| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_configured_ca_and_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let [ca, cert, key, client_cert, client_key] = certificates(dir.path());
    // The server demands TLS and verifies client certificates against the CA.
    let server = NatsServer::start_with_config(
        &format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n  timeout: 3\n}}\n",
            cert.display(),
            key.display(),
            ca.display()
        ),
        &[],
    )
    .unwrap();
    let mut c = cfg(&server.url());
    c.tls.required = true;
    c.tls.ca_file = ca.display().to_string();
    c.tls.cert_file = client_cert.display().to_string();
    c.tls.key_file = client_key.display().to_string();
    round_trip(&c).await.unwrap();
    // The same through a tls:// URL.
    let mut via_scheme = c.clone();
    via_scheme.tls.required = false;
    via_scheme.url = format!("tls://127.0.0.1:{}", server.port());
    round_trip(&via_scheme).await.unwrap();
    // Without the client certificate: the server refuses.
    let mut no_cert = c.clone();
    no_cert.tls.cert_file = String::new();
    no_cert.tls.key_file = String::new();
    assert!(round_trip(&no_cert).await.is_err());
    // Without the CA: the system trust store does not know it.
    let mut no_ca = c.clone();
    no_ca.tls.ca_file = String::new();
    assert!(round_trip(&no_ca).await.is_err());
    // A CA file that is not there: named.
    let mut missing = c.clone();
    missing.tls.ca_file = dir.path().join("nope.pem").display().to_string();
    let err = round_trip(&missing).await.unwrap_err();
    assert!(
        err.contains("bus.tls.ca_file") && err.contains("nope.pem"),
        "{err}"
    );
}

#[test]
fn aware_config_never_shows_a_secret() {
    let out = std::process::Command::new(bin_path("aware"))
        .arg("config")
        .env(
            "AWARE_BUS__URL",
            "nats://ann:hunter2@nats1:4222,nats://ann:hunter2@nats2:4222",
        )
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        v["bus"]["url"],
        "nats://ann:***@nats1:4222,nats://ann:***@nats2:4222"
    );
    let out = std::process::Command::new(bin_path("aware"))
        .arg("config")
        .env("AWARE_BUS__URL", "nats://nats:4222")
        .env("AWARE_BUS__AUTH__USER", "ann")
        .env("AWARE_BUS__AUTH__PASSWORD", "hunter3")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["bus"]["auth"]["user"], "ann");
    assert_eq!(v["bus"]["auth"]["password"], "***");
    assert!(!stdout.contains("hunter"), "{stdout}");
    // A refused configuration does not show it either.
    let out = std::process::Command::new(bin_path("aware"))
        .arg("config")
        .env("AWARE_BUS__URL", "nats://ann:hunter4@nats:4222")
        .env("AWARE_BUS__AUTH__TOKEN", "hunter5")
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success());
    assert!(
        all.contains("bus.auth.token") && !all.contains("hunter"),
        "{all}"
    );
}
