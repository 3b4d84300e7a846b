//! A service binary run as its own process by a benchmark, so that its CPU time and resident
//! memory can be read from `/proc`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aware_shared::probe::wait_ready;

use super::{fail, BenchError};

/// A child process, killed and reaped when dropped.
pub struct Child(pub std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The service binary `name` next to the running executable.
pub fn sibling_bin(name: &str) -> Result<PathBuf, BenchError> {
    let exe = std::env::current_exe().map_err(|source| BenchError::Io {
        path: "current executable".into(),
        source,
    })?;
    let bin = exe.with_file_name(name);
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(fail(format!(
            "{} not found: build it with `cargo build --release --bins`",
            bin.display()
        )))
    }
}

/// The service binary `name` in `dir` when given (a test's build directory), else next to the
/// running executable ([`sibling_bin`]).
pub fn service_bin(dir: Option<&Path>, name: &str) -> Result<PathBuf, BenchError> {
    match dir {
        Some(dir) => Ok(dir.join(name)),
        None => sibling_bin(name),
    }
}

/// Starts `bin` on the NATS server at `url` with its HTTP endpoint on a free loopback port and
/// `env`, and waits until it announces that endpoint and is ready (at most `ready_within`).
pub async fn start_service(
    bin: &Path,
    url: &str,
    env: &[(&str, String)],
    ready_within: Duration,
) -> Result<(Child, SocketAddr), BenchError> {
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["--bus", url, "--http-listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = Child(cmd.spawn().map_err(|source| BenchError::Io {
        path: bin.display().to_string(),
        source,
    })?);
    let name = bin.display().to_string();
    let stdout = child
        .0
        .stdout
        .take()
        .ok_or_else(|| fail(format!("{name}: no stdout")))?;
    let addr = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| {
                l.rsplit("http://")
                    .next()
                    .filter(|_| l.contains("listening on"))
                    .and_then(|a| a.trim().parse::<SocketAddr>().ok())
            })
    })
    .await
    .map_err(fail)?
    .ok_or_else(|| fail(format!("{name} did not announce its address")))?;
    let ready = tokio::task::spawn_blocking(move || wait_ready(addr, ready_within))
        .await
        .map_err(fail)?;
    if !ready {
        return Err(fail(format!("{name} never became ready")));
    }
    Ok((child, addr))
}

/// Resident memory of process `pid`, bytes.
pub fn rss_bytes(pid: u32) -> Result<u64, BenchError> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|source| BenchError::Io {
        path: path.clone(),
        source,
    })?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| fail(format!("{path}: no VmRSS")))
}

/// User + system CPU seconds of process `pid` so far.
pub fn cpu_seconds(pid: u32) -> Result<f64, BenchError> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).map_err(|source| BenchError::Io {
        path: path.clone(),
        source,
    })?;
    // The fields after the command name (which may hold spaces) start at field 3; utime and
    // stime are fields 14 and 15, in clock ticks of USER_HZ, 100 on Linux.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| fail(format!("{path}: no command name")))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| -> Result<f64, BenchError> {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| fail(format!("{path}: field {}", i + 3)))
    };
    Ok((tick(11)? + tick(12)?) / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_processs_cpu_and_memory() {
        let me = std::process::id();
        let c = cpu_seconds(me).unwrap();
        assert!(c >= 0.0 && c.is_finite());
        assert!(rss_bytes(me).unwrap() > 0);
        assert!(sibling_bin("no-such-service-binary")
            .unwrap_err()
            .to_string()
            .contains("not found"));
    }
}
