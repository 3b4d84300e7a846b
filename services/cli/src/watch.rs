//! `aware watch`: prints every bus event as one JSON line.

use std::io::Write;

use aware_bus_schemas::{self as schemas, subject};
use aware_shared::bus::{Bus, BusError, Message};

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
}

/// One output line for a received message: `{"subject", "event"}` or `{"subject", "error"}`.
pub fn line(msg: &Message) -> serde_json::Value {
    let decoded = subject::parse(&msg.subject)
        .map_err(|e| e.to_string())
        .and_then(|p| schemas::decode_event(p.kind, &msg.payload).map_err(|e| e.to_string()));
    match decoded {
        Ok(ev) => {
            serde_json::json!({ "subject": &*msg.subject, "event": schemas::codec::to_json(&ev) })
        }
        Err(e) => {
            serde_json::json!({ "subject": &*msg.subject, "error": e, "bytes": msg.payload.len() })
        }
    }
}

/// Prints events on `pattern` until the bus closes, `limit` events were printed, or `stop`.
pub async fn watch(
    bus: &Bus,
    pattern: &str,
    out: &mut impl Write,
    limit: Option<usize>,
    stop: tokio_util::sync::CancellationToken,
) -> Result<usize, WatchError> {
    let mut sub = bus.subscribe(pattern).await?;
    // Once the server has the subscription, say so (on stderr: stdout carries only events).
    bus.flush().await?;
    tracing::info!(subject = pattern, "watching");
    let mut n = 0;
    while limit.is_none_or(|l| n < l) {
        let msg = tokio::select! {
            _ = stop.cancelled() => break,
            m = sub.next() => match m { Some(m) => m, None => break },
        };
        writeln!(out, "{}", line(&msg))?;
        out.flush()?;
        n += 1;
    }
    Ok(n)
}
