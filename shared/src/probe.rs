//! Plain HTTP/1.1 GETs against the services' own endpoints (`/metrics`, `/readyz`), for tests,
//! benchmarks and tools, and reading a value out of a Prometheus text exposition.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// GET `path` from `addr`; returns (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Waits until `/readyz` answers 200.
pub fn wait_ready(addr: SocketAddr, timeout: Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if let Ok((200, _)) = http_get(addr, "/readyz") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The cumulative buckets `(le, count)` of histogram `name` in a text exposition.
pub fn histogram_buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    let mut out: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count = l.rsplit(' ').next()?.parse().ok()?;
            Some((le, count))
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// Quantile `q` of cumulative buckets, interpolating linearly inside the bucket (as PromQL's
/// `histogram_quantile`). `None` without observations.
pub fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let width = count - prev.1;
            let frac = if width > 0.0 {
                (rank - prev.1) / width
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * frac);
        }
        prev = (le, count);
    }
    Some(prev.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_interpolate_like_promql() {
        let text = "x_bucket{le=\"0.001\"} 50\nx_bucket{le=\"0.002\"} 90\nx_bucket{le=\"+Inf\"} 100\nx_sum 1\n";
        let b = histogram_buckets(text, "x");
        assert_eq!(b.len(), 3);
        assert!((bucket_quantile(&b, 0.5).unwrap() - 0.001).abs() < 1e-12);
        assert!((bucket_quantile(&b, 0.7).unwrap() - 0.0015).abs() < 1e-12);
        // Above the last finite bucket: its upper bound.
        assert_eq!(bucket_quantile(&b, 0.99), Some(0.002));
        assert_eq!(bucket_quantile(&[], 0.5), None);
    }
}
