//! Reading a service's (or the API server's) Prometheus `/metrics` exposition.

use std::net::SocketAddr;

use super::{fail, BenchError};

/// Parses a Prometheus text exposition.
pub fn parse(text: &str) -> Result<prometheus_parse::Scrape, BenchError> {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .map_err(|e| fail(format!("unparsable metrics: {e}")))
}

/// The `/metrics` of the HTTP endpoint at `addr`, parsed.
pub fn get(addr: SocketAddr) -> Result<prometheus_parse::Scrape, BenchError> {
    let (code, text) = aware_shared::probe::http_get(addr, "/metrics")
        .map_err(|e| fail(format!("scrape {addr}: {e}")))?;
    if code != 200 {
        return Err(fail(format!("scrape {addr}: HTTP {code}")));
    }
    parse(&text)
}

/// The value of a counter, gauge or untyped sample.
fn value(x: &prometheus_parse::Sample) -> Option<f64> {
    match x.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => Some(v),
        _ => None,
    }
}

/// Sum of the counter/gauge samples named `name` whose labels satisfy `keep`.
pub fn sum(
    s: &prometheus_parse::Scrape,
    name: &str,
    keep: impl Fn(&prometheus_parse::Labels) -> bool,
) -> f64 {
    s.samples
        .iter()
        .filter(|x| x.metric == name && keep(&x.labels))
        .filter_map(value)
        .sum()
}

/// The counter/gauge samples named `name`, by the value of their label `label`.
pub fn by_label(s: &prometheus_parse::Scrape, name: &str, label: &str) -> Vec<(String, f64)> {
    s.samples
        .iter()
        .filter(|x| x.metric == name)
        .filter_map(|x| Some((x.labels.get(label)?.to_string(), value(x)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_splits_samples_by_label() {
        let s = parse(
            "# TYPE aware_state_restored_targets gauge\n\
             aware_state_restored_targets{event=\"model\",service=\"r\"} 3\n\
             aware_state_restored_targets{event=\"target\",service=\"r\"} 5\n\
             aware_other 7\n",
        )
        .unwrap();
        assert_eq!(sum(&s, "aware_state_restored_targets", |_| true), 8.0);
        assert_eq!(
            sum(&s, "aware_state_restored_targets", |l| l.get("event")
                == Some("model")),
            3.0
        );
        let mut by = by_label(&s, "aware_state_restored_targets", "event");
        by.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            by,
            [("model".to_string(), 3.0), ("target".to_string(), 5.0)]
        );
        assert!(by_label(&s, "aware_other", "event").is_empty());
        assert_eq!(sum(&s, "aware_missing", |_| true), 0.0);
    }
}
