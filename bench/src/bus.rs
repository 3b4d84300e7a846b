//! `aware bench bus`: messages/s and publish→receive latency for obs-sized messages, on the
//! in-process bus and on NATS over loopback (a real `nats-server`).
//!
//! Throughput: one publisher and one subscriber; rate = messages received / (time of the last
//! receive − time of the first publish); the median of several runs is reported. Latency: the
//! publisher paces messages at a fixed rate; each payload (the encoded sample `obs`, same size as a
//! real one) carries its send time in its first 8 bytes; the subscriber records receive − send in
//! an HDR histogram.

use std::time::{Duration, Instant};

use aware_bus_schemas::{encode_event, EventKind};
use aware_shared::bus::Bus;
use aware_shared::config::BusConfig;
use bytes::Bytes;
use serde::Serialize;

use super::{median, BenchError};

const SUBJECT: &str = "aware.v1.obs.225.bench.app";

#[derive(Debug, Clone, clap::Args)]
pub struct BusBenchOptions {
    /// Messages per throughput run.
    #[arg(long, default_value_t = BusBenchOptions::default().messages)]
    pub messages: usize,
    /// Throughput runs per transport (the median is reported).
    #[arg(long, default_value_t = BusBenchOptions::default().runs, help = "Throughput runs (median reported)")]
    pub runs: usize,
    /// Publish rate of the latency run, messages/s.
    #[arg(long, default_value_t = BusBenchOptions::default().rate, help = "Rate of the latency run, messages/s")]
    pub rate: u64,
    /// Duration of the latency run.
    #[arg(long, default_value_t = BusBenchOptions::default().latency_secs, help = "Duration of the latency run, seconds")]
    pub latency_secs: f64,
    /// NATS server to use; when `None` a `nats-server` is started on a free port.
    #[arg(
        long = "nats",
        value_name = "NATS",
        help = "Use this NATS server instead of starting `nats-server` on a free port"
    )]
    pub nats_url: Option<String>,
    /// Skip the NATS part.
    #[arg(long, help = "Only the in-process bus")]
    pub skip_nats: bool,
}

impl Default for BusBenchOptions {
    fn default() -> Self {
        BusBenchOptions {
            messages: 500_000,
            runs: 5,
            rate: 10_000,
            latency_secs: 3.0,
            nats_url: None,
            skip_nats: false,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TransportResult {
    pub transport: String,
    pub payload_bytes: usize,
    pub messages_per_run: usize,
    pub throughput_runs_msgs_per_s: Vec<f64>,
    pub throughput_median_msgs_per_s: f64,
    pub lost_in_throughput_runs: usize,
    pub latency_rate_msgs_per_s: u64,
    pub latency_messages: u64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    pub latency_max_us: f64,
    pub lost_in_latency_run: u64,
}

fn obs_payload() -> Result<Bytes, BenchError> {
    let obs = super::sample(EventKind::Obs)?;
    let bytes = encode_event(&obs).map_err(|e| BenchError::Failed(e.to_string()))?;
    Ok(Bytes::from(bytes))
}

async fn throughput(bus: &Bus, n: usize, payload: &Bytes) -> Result<(f64, usize), BenchError> {
    let mut sub = bus.subscribe(SUBJECT).await?;
    bus.flush().await?;
    let receiver = tokio::spawn(async move {
        let mut count = 0usize;
        let mut last = Instant::now();
        while count < n {
            match tokio::time::timeout(Duration::from_secs(3), sub.next()).await {
                Ok(Some(_)) => {
                    count += 1;
                    last = Instant::now();
                }
                _ => break,
            }
        }
        (count, last)
    });
    let t0 = Instant::now();
    for _ in 0..n {
        bus.publish(SUBJECT, payload.clone()).await?;
    }
    bus.flush().await?;
    let (count, last) = receiver
        .await
        .map_err(|e| BenchError::Failed(format!("receiver: {e}")))?;
    let secs = last.duration_since(t0).as_secs_f64().max(1e-9);
    Ok((count as f64 / secs, n - count))
}

struct Latency {
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    received: u64,
    sent: u64,
}

async fn latency(bus: &Bus, rate: u64, secs: f64, payload: &Bytes) -> Result<Latency, BenchError> {
    let total = ((rate as f64) * secs).round().max(1.0) as u64;
    let base = Instant::now();
    let mut sub = bus.subscribe(SUBJECT).await?;
    bus.flush().await?;
    let receiver = tokio::spawn(async move {
        let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
            .map_err(|e| e.to_string())?;
        let mut received = 0u64;
        while received < total {
            match tokio::time::timeout(Duration::from_secs(3), sub.next()).await {
                Ok(Some(m)) => {
                    let now = u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    let mut ts = [0u8; 8];
                    ts.copy_from_slice(&m.payload[..8]);
                    let sent = u64::from_le_bytes(ts);
                    hist.saturating_record(now.saturating_sub(sent).max(1));
                    received += 1;
                }
                _ => break,
            }
        }
        Ok::<_, String>((hist, received))
    });
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let start = tokio::time::Instant::now();
    let mut buf = payload.to_vec();
    for i in 0..total {
        let due = start + interval.mul_f64(i as f64);
        if due > tokio::time::Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        let now = u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        buf[..8].copy_from_slice(&now.to_le_bytes());
        bus.publish(SUBJECT, Bytes::copy_from_slice(&buf)).await?;
    }
    bus.flush().await?;
    let (hist, received) = receiver
        .await
        .map_err(|e| BenchError::Failed(format!("receiver: {e}")))?
        .map_err(BenchError::Failed)?;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(Latency {
        p50_us: us(0.5),
        p99_us: us(0.99),
        max_us: hist.max() as f64 / 1000.0,
        received,
        sent: total,
    })
}

async fn bench_transport(
    name: &str,
    bus: &Bus,
    opts: &BusBenchOptions,
) -> Result<TransportResult, BenchError> {
    let payload = obs_payload()?;
    let mut runs = Vec::new();
    let mut lost = 0;
    // One warm-up run, not reported.
    throughput(bus, opts.messages / 10 + 1, &payload).await?;
    for _ in 0..opts.runs.max(1) {
        let (rate, l) = throughput(bus, opts.messages, &payload).await?;
        runs.push(rate);
        lost += l;
    }
    let lat = latency(bus, opts.rate.max(1), opts.latency_secs, &payload).await?;
    Ok(TransportResult {
        transport: name.to_string(),
        payload_bytes: payload.len(),
        messages_per_run: opts.messages,
        throughput_median_msgs_per_s: median(&runs),
        throughput_runs_msgs_per_s: runs,
        lost_in_throughput_runs: lost,
        latency_rate_msgs_per_s: opts.rate,
        latency_messages: lat.sent,
        latency_p50_us: lat.p50_us,
        latency_p99_us: lat.p99_us,
        latency_max_us: lat.max_us,
        lost_in_latency_run: lat.sent - lat.received,
    })
}

/// Runs the benchmark on the in-process bus and (unless skipped) on NATS.
pub async fn run(opts: &BusBenchOptions) -> Result<Vec<TransportResult>, BenchError> {
    let mut results = Vec::new();
    let cfg = BusConfig {
        channel_capacity: 65_536,
        ..BusConfig::default()
    };
    let inproc = Bus::in_process(cfg.channel_capacity);
    results.push(bench_transport("in-process", &inproc, opts).await?);
    if !opts.skip_nats {
        let (_server, url) = match &opts.nats_url {
            Some(u) => (None, u.clone()),
            None => {
                let s = aware_shared::testkit::NatsServer::start()?;
                let u = s.url();
                (Some(s), u)
            }
        };
        let nats_cfg = BusConfig {
            url,
            channel_capacity: opts.messages.max(65_536),
            ..cfg
        };
        let mut nats_cfg = nats_cfg;
        // The bench measures the core transport; the JetStream capture is benchmarked apart.
        nats_cfg.jetstream.enabled = false;
        let bus = Bus::connect(&nats_cfg, "aware-bench-bus").await?;
        results.push(bench_transport("nats-loopback", &bus, opts).await?);
    }
    Ok(results)
}
