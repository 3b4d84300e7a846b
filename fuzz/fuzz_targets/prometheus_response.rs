//! The Prometheus HTTP API response parser of the metrics collector
//! (`aware_metrics_collector::prometheus::parse_response`, used on every `/api/v1/query` answer).
//! The first two bytes are the HTTP status, the rest the body.
//!
//! Invariant: the samples of a parsed response, written back as an instant-vector response,
//! parse to the same samples (labels, times and values bit for bit, infinities included; NaN
//! values of either sign stay NaN).
#![no_main]

use aware_metrics_collector::prometheus::{parse_response, Sample};
use libfuzzer_sys::fuzz_target;

/// A sample as sorted labels, time bits and value bits.
type SampleBits<'a> = (Vec<(&'a String, &'a String)>, u64, u64);

fn bits(samples: &[Sample]) -> Vec<SampleBits<'_>> {
    samples
        .iter()
        .map(|s| {
            let mut labels: Vec<_> = s.labels.iter().collect();
            labels.sort();
            // One NaN is as good as another (`-NaN` reads as a NaN with its sign bit set).
            let value = if s.value.is_nan() { f64::NAN } else { s.value };
            (labels, s.time_s.to_bits(), value.to_bits())
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let [hi, lo, body @ ..] = data else {
        return;
    };
    let status = u16::from_be_bytes([*hi, *lo]);
    let Ok(samples) = parse_response("up", status, body) else {
        return;
    };
    let result: Vec<serde_json::Value> = samples
        .iter()
        .map(|s| {
            serde_json::json!({
                "metric": s.labels,
                "value": [s.time_s, s.value.to_string()],
            })
        })
        .collect();
    let rendered = serde_json::json!({
        "status": "success",
        "data": { "resultType": "vector", "result": result },
    });
    let bytes = match serde_json::to_vec(&rendered) {
        Ok(b) => b,
        Err(e) => panic!("samples do not render: {e}"),
    };
    match parse_response("up", 200, &bytes) {
        Ok(again) => assert_eq!(
            bits(&again),
            bits(&samples),
            "samples differ after a round trip"
        ),
        Err(e) => panic!(
            "rendered samples do not parse: {e}\n{}",
            String::from_utf8_lossy(&bytes)
        ),
    }
});
