//! The service runtime: context (bus, config, metrics, readiness, shutdown), typed publishing,
//! decoded intake of bus events, and signal handling.

use std::sync::Arc;
use std::time::Duration;

use aware_bus_schemas::{self as schemas, subject, BusMessage, Event, EventKind};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::bus::{Bus, BusError};
use crate::config::AppConfig;
use crate::telemetry::{Readiness, ServiceMetrics, TelemetryError};

/// Why the current state could not be read from the JetStream capture (the read is retried;
/// the service is not ready meanwhile).
#[derive(Debug, thiserror::Error)]
#[error("cannot {step}{}: {source}", stream.as_ref().map(|s| format!(" of the JetStream stream `{s}`")).unwrap_or_default())]
pub struct CaptureError {
    step: &'static str,
    stream: Option<String>,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl CaptureError {
    fn in_stream<E: std::error::Error + Send + Sync + 'static>(
        step: &'static str,
        stream: &str,
        e: E,
    ) -> Self {
        CaptureError {
            step,
            stream: Some(stream.to_string()),
            source: Box::new(e),
        }
    }
}

/// How long one step of the start-up state read may make no progress.
const STATE_READ_IDLE: Duration = Duration::from_secs(10);
/// The backoff between failed start-up state reads, from the first to the longest.
const STATE_READ_RETRY_MIN: Duration = Duration::from_secs(1);
const STATE_READ_RETRY_MAX: Duration = Duration::from_secs(30);

/// `f`, or an error once it made no progress for [`STATE_READ_IDLE`].
async fn idle<F: std::future::Future>(f: F) -> Result<F::Output, tokio::time::error::Elapsed> {
    tokio::time::timeout(STATE_READ_IDLE, f).await
}

fn capture<E: std::error::Error + Send + Sync + 'static>(
    step: &'static str,
) -> impl FnOnce(E) -> CaptureError {
    move |e| CaptureError {
        step,
        stream: None,
        source: Box::new(e),
    }
}

/// Why a service stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Encode(#[from] schemas::EncodeError),
    #[error(transparent)]
    Subject(#[from] subject::SubjectError),
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A task of the service (its writer, its publisher, the service itself under
    /// `aware run all`) panicked or was cancelled.
    #[error("{task} task: {source}")]
    Task {
        task: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    /// Something the service opens or runs on failed (a store, a client, a file, the
    /// simulator), named by `what` (the setting or the step).
    #[error("{what}: {source}")]
    Resource {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// One service of several in a process failed (`aware run all`): which one.
    #[error("{service}: {source}")]
    Failed {
        service: &'static str,
        #[source]
        source: Box<ServiceError>,
    },
}

impl ServiceError {
    /// A failure of `what` (a setting, a resource or a step of the service), keeping its cause.
    pub fn resource(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ServiceError::Resource {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// Everything a running service needs; cheap to clone.
#[derive(Clone)]
pub struct ServiceContext {
    pub name: &'static str,
    pub bus: Bus,
    pub config: Arc<AppConfig>,
    pub metrics: ServiceMetrics,
    pub ready: Readiness,
    pub shutdown: CancellationToken,
    /// The process's actor arbiters ([`crate::arbiters`]), set by the launcher; without them
    /// (a context made outside the launcher) every actor runs on the service's own thread.
    pub arbiters: Option<crate::arbiters::ArbiterPool>,
}

impl ServiceContext {
    pub fn new(
        name: &'static str,
        bus: Bus,
        config: Arc<AppConfig>,
        shutdown: CancellationToken,
    ) -> Result<Self, ServiceError> {
        Ok(ServiceContext {
            name,
            bus,
            config,
            metrics: ServiceMetrics::new(name)?,
            ready: Readiness::default(),
            shutdown,
            arbiters: None,
        })
    }

    /// Reports this instance's shard: `aware_shards{shard="<index>"}` = the count (ADR 0021).
    pub fn report_shard(&self) -> Result<(), TelemetryError> {
        let shard = self.config.shard;
        self.metrics
            .gauge_vec(
                "shards",
                "Shards the targets are split into (shard.count), labelled by this instance's shard (shard.index)",
                &["shard"],
            )?
            .with_label_values(&[&shard.index.to_string()])
            .set(i64::from(shard.count));
        Ok(())
    }

    /// The same context, its actors spread over `arbiters` ([`crate::agents::TargetActors::spread`]).
    pub fn with_arbiters(mut self, arbiters: Option<crate::arbiters::ArbiterPool>) -> Self {
        self.arbiters = arbiters;
        self
    }

    /// Encodes and publishes a message on its subject, counting it (or the failure).
    pub async fn publish<M: BusMessage>(&self, msg: &M) -> Result<(), ServiceError> {
        let kind = M::KIND.as_str();
        let res = async {
            let subject = subject::subject(M::KIND, msg.target())?;
            let payload = schemas::encode(msg)?;
            self.bus.publish(&subject, Bytes::from(payload)).await?;
            Ok::<_, ServiceError>(())
        }
        .await;
        match &res {
            Ok(()) => self.metrics.messages_out.with_label_values(&[kind]).inc(),
            Err(e) => {
                self.metrics.publish_errors.with_label_values(&[kind]).inc();
                tracing::error!(service = self.name, event = kind, target = %msg.target(), error = %e, "publish failed");
            }
        }
        res
    }

    /// Publishes any event.
    pub async fn publish_event(&self, ev: &Event) -> Result<(), ServiceError> {
        match ev {
            Event::Obs(m) => self.publish(m).await,
            Event::Action(m) => self.publish(m).await,
            Event::Applied(m) => self.publish(m).await,
            Event::Episode(m) => self.publish(m).await,
            Event::Lifecycle(m) => self.publish(m).await,
            Event::Embedding(m) => self.publish(m).await,
            Event::Model(m) => self.publish(m).await,
            Event::Registration(m) => self.publish(m).await,
        }
    }

    /// Subscribes to `kinds` for every target of this instance's shard (`shard`, all targets with
    /// one shard) and yields decoded events. Malformed messages are counted
    /// (`decode_errors_total`) and dropped with a warning; they never end the intake.
    ///
    /// For the kinds that carry a target's current state ([`EventKind::is_state`]: `lifecycle`,
    /// `model`, `embedding`, `target`) on NATS with the JetStream capture on, or on the embedded
    /// bus (which retains them), the newest message of every target comes first, then the live ones: a service that starts (or
    /// restarts) after a target's last stage change, model or registration still learns it. The
    /// live subscription is opened before the snapshot is read and its messages wait until the
    /// snapshot is delivered, so nothing is missed and nothing older overtakes something newer
    /// (a message can arrive twice; every consumer of these kinds is idempotent).
    pub async fn subscribe_events(
        &self,
        kinds: &[EventKind],
    ) -> Result<mpsc::Receiver<Event>, ServiceError> {
        self.subscribe_events_of(kinds, self.config.shard).await
    }

    /// [`Self::subscribe_events`] for the targets of `shard` (`ShardConfig::default()`: every
    /// target, for a service that serves the whole cluster, like the controller).
    pub async fn subscribe_events_of(
        &self,
        kinds: &[EventKind],
        shard: crate::config::ShardConfig,
    ) -> Result<mpsc::Receiver<Event>, ServiceError> {
        let (tx, rx) = mpsc::channel(self.config.bus.channel_capacity);
        for &kind in kinds {
            // One subscription per slot of this shard: the server drops the other shards'
            // messages (subject::slot, ADR 0021).
            let mut subs = Vec::new();
            for filter in shard.filters(kind) {
                let sub = self.bus.subscribe(&filter).await?;
                self.count_slow_consumer(&sub, kind);
                subs.push(sub.into_stream());
            }
            let mut live = futures::stream::select_all(subs);
            let snapshot = if kind.is_state() {
                self.last_per_target(kind, shard).await.unwrap_or_default()
            } else {
                Vec::new()
            };
            let tx = tx.clone();
            let ctx = self.clone();
            tokio::spawn(async move {
                use futures::StreamExt;
                for (subj, payload) in snapshot {
                    let Some(ev) = ctx.decode(kind, &subj, &payload) else {
                        continue;
                    };
                    if tx.send(ev).await.is_err() {
                        return;
                    }
                }
                loop {
                    let msg = tokio::select! {
                        _ = ctx.shutdown.cancelled() => break,
                        m = live.next() => match m { Some(m) => m, None => break },
                    };
                    let Some(ev) = ctx.decode(kind, &msg.subject, &msg.payload) else {
                        continue;
                    };
                    if tx.send(ev).await.is_err() {
                        break;
                    }
                }
            });
        }
        Ok(rx)
    }

    /// Counts the messages the NATS client drops on `sub` (a full buffer: this service is a
    /// slow consumer) in `bus_slow_consumer_drops_total{event}`.
    fn count_slow_consumer(&self, sub: &crate::bus::Subscription, kind: EventKind) {
        if let (crate::bus::Subscription::Nats(s), Bus::Nats(b)) = (sub, &self.bus) {
            match crate::slow_consumers::sid_of(s) {
                Some(sid) => b.slow_consumers().attribute(
                    sid,
                    self.metrics
                        .slow_consumer_drops
                        .with_label_values(&[kind.as_str()]),
                ),
                None => {
                    tracing::warn!(service = self.name, event = kind.as_str(), "cannot tell this subscription's id: its slow-consumer drops are not counted for the service")
                }
            }
        }
    }

    /// The newest captured event of `kind` for every target (see [`Self::subscribe_events`]):
    /// what a restarted service reads to restore state before it takes messages. On NATS this
    /// is the JetStream capture (empty with the capture off); on the embedded bus, the newest
    /// message of each state subject published on it so far. A failed read is retried until it
    /// succeeds, the service not ready meanwhile; empty when the service shuts down first. Only
    /// the targets of this instance's shard.
    pub async fn current_state(&self, kind: EventKind) -> Vec<Event> {
        self.last_per_target(kind, self.config.shard)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(subj, payload)| self.decode(kind, &subj, &payload))
            .collect()
    }

    /// One read of the current state of `kind` for every target, whatever the shard (as
    /// [`Self::current_state`]), without its retries and without touching readiness: for a
    /// periodic task that tries again later.
    pub async fn read_state_once(&self, kind: EventKind) -> Result<Vec<Event>, CaptureError> {
        Ok(self
            .read_last_per_target(kind)
            .await?
            .into_iter()
            .filter_map(|(subj, payload)| self.decode(kind, &subj, &payload))
            .collect())
    }

    /// The newest captured message of `kind` for every target (subject, payload), in stream
    /// order (the embedded bus: its retained messages); empty with the capture off. A read that
    /// fails is retried, with a backoff from 1 s to 30 s, until it succeeds or the service
    /// shuts down (`None`): meanwhile the service is not ready (`/readyz` says why, key
    /// `state:<kind>`), `aware_state_unread{event}` is 1 and each failure counts in
    /// `aware_state_read_failures_total{event}`; once read, `aware_state_restored_targets{event}`
    /// says how many targets it found and `aware_state_read_seconds{event}` how long it took.
    /// A service that starts without its targets' stages, models or registrations would act on
    /// defaults it has no right to. Only the subjects of `shard`'s targets, chosen by subject
    /// before anything is decoded (a subject that does not parse is kept, for the decoding to
    /// count and drop).
    async fn last_per_target(
        &self,
        kind: EventKind,
        shard: crate::config::ShardConfig,
    ) -> Option<Vec<(String, Bytes)>> {
        let key = format!("state:{kind}");
        let started = std::time::Instant::now();
        let mut delay = STATE_READ_RETRY_MIN;
        let mut failures = 0u32;
        loop {
            match self.read_last_per_target(kind).await {
                Ok(out) => {
                    if failures > 0 {
                        tracing::info!(
                            service = self.name,
                            event = kind.as_str(),
                            targets = out.len(),
                            failures,
                            "current state read after failures"
                        );
                        self.ready.unblock(&key);
                    }
                    self.metrics
                        .state_unread
                        .with_label_values(&[kind.as_str()])
                        .set(0);
                    let out: Vec<(String, Bytes)> = out
                        .into_iter()
                        .filter(|(s, _)| subject::parse(s).map_or(true, |p| shard.owns(&p.target)))
                        .collect();
                    let label = [kind.as_str()];
                    self.metrics
                        .state_restored
                        .with_label_values(&label)
                        .set(i64::try_from(out.len()).unwrap_or(i64::MAX));
                    self.metrics
                        .state_read_seconds
                        .with_label_values(&label)
                        .set(started.elapsed().as_secs_f64());
                    return Some(out);
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    self.metrics
                        .state_read_failures
                        .with_label_values(&[kind.as_str()])
                        .inc();
                    self.metrics
                        .state_unread
                        .with_label_values(&[kind.as_str()])
                        .set(1);
                    let reason = format!(
                        "cannot read the current {kind} state ({e}); retrying in {} s",
                        delay.as_secs()
                    );
                    tracing::warn!(service = self.name, event = kind.as_str(), error = %e, retry_in_s = delay.as_secs(), "cannot read the current state; not ready until it is read");
                    self.ready.block(key.clone(), reason);
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(STATE_READ_RETRY_MAX);
                }
            }
        }
    }

    /// One read of [`Self::last_per_target`]. On NATS each step must make progress within
    /// [`STATE_READ_IDLE`]; a long read that keeps receiving messages is never cut short.
    async fn read_last_per_target(
        &self,
        kind: EventKind,
    ) -> Result<Vec<(String, Bytes)>, CaptureError> {
        if let Some(retained) = self.bus.retained(&subject::kind_filter(kind)) {
            return retained
                .map(|ms| {
                    ms.into_iter()
                        .map(|m| (m.subject.to_string(), m.payload))
                        .collect()
                })
                .map_err(capture("read the embedded bus's retained state"));
        }
        let Bus::Nats(nats) = &self.bus else {
            return Ok(Vec::new());
        };
        let js_cfg = &self.config.bus.jetstream;
        if !js_cfg.enabled {
            return Ok(Vec::new());
        }
        let js = async_nats::jetstream::new(nats.client().clone());
        let filter = subject::kind_filter(kind);
        // What to read of the capture: the one stream's subjects of the kind; or, in
        // partitions, each partition holding a slot of this shard, whole: a partition's stream
        // takes a filter within one of its slots or spanning all of them, and one consumer per
        // slot would scan the stream once per slot. What is not of the kind (or of another
        // shard, which the caller drops) is dropped before decoding.
        let streams: Vec<String> = js_cfg
            .partitions_of(&self.config.shard)
            .into_iter()
            .map(|k| js_cfg.partition_stream(k))
            .collect();
        let read_filter = if js_cfg.partitions > 1 {
            subject::ALL
        } else {
            filter.as_str()
        };
        let read_capture = || async {
            let mut out = Vec::new();
            for stream in &streams {
                let read = read_last_per_subject(&js, stream, read_filter).await?;
                // The kind's token (`aware.v1.<kind>.…`): what the one stream's filter selects.
                // A subject that does not parse goes on to be counted where it is decoded.
                out.extend(
                    read.into_iter()
                        .filter(|(s, _)| s.split('.').nth(2) == Some(kind.as_str())),
                );
            }
            Ok::<_, CaptureError>(out)
        };
        if !kind.is_state() {
            return read_capture().await;
        }
        // The state bucket holds the newest message of every state subject whatever its age.
        let bucket = &js_cfg.state_bucket;
        let kv_stream = format!("KV_{bucket}");
        let prefix = crate::bus::state_key_subject(bucket, "");
        let kept = read_last_per_subject(&js, &kv_stream, &format!("{prefix}{filter}")).await?;
        let mut kept: Vec<(String, Bytes)> = kept
            .into_iter()
            .filter_map(|(s, p)| Some((s.strip_prefix(&prefix)?.to_string(), p)))
            .collect();
        // Keys a release before the slot token wrote (`aware.v1.<kind>.<ns>.<name>`, ADR 0021)
        // stand for their targets until a newer message or a purge replaces them: an upgrade
        // keeps every stage, model and registration.
        let unslotted = subject::unslotted_kind_filter(kind);
        let old = read_last_per_subject(&js, &kv_stream, &format!("{prefix}{unslotted}")).await?;
        if !old.is_empty() {
            let known: std::collections::HashSet<String> =
                kept.iter().map(|(s, _)| s.clone()).collect();
            let before = kept.len();
            kept.extend(old.into_iter().filter_map(|(s, p)| {
                let parsed = subject::parse_unslotted(s.strip_prefix(&prefix)?).ok()?;
                let s = subject::subject(kind, &parsed.target).ok()?;
                (!known.contains(&s)).then_some((s, p))
            }));
            tracing::info!(service = self.name, event = kind.as_str(), targets = kept.len() - before, bucket = %bucket, "current state of targets taken from keys of the layout before the slot token");
        }
        // The capture fills in subjects the bucket lacks: state published before the bucket
        // existed. Every publish since writes both, so a capture whose oldest message is not
        // older than the bucket has nothing to add and is not read (while the capture still
        // holds every target's state, that read would be as long as the bucket's).
        // A purged key (a forgotten target, `Bus::forget_state`) holds an empty marker: known,
        // so the capture does not bring its state back, and not delivered.
        let forgotten = |(_, p): &(String, Bytes)| p.is_empty();
        let mut predates = false;
        for stream in &streams {
            predates = predates || capture_predates(&js, stream, &kv_stream).await?;
        }
        if !predates {
            return Ok(kept.into_iter().filter(|m| !forgotten(m)).collect());
        }
        let captured = read_capture().await?;
        let known: std::collections::HashSet<&str> = kept.iter().map(|(s, _)| s.as_str()).collect();
        let mut out: Vec<(String, Bytes)> = captured
            .into_iter()
            .filter(|(s, _)| !known.contains(s.as_str()))
            .collect();
        if !out.is_empty() {
            tracing::info!(service = self.name, event = kind.as_str(), targets = out.len(), bucket = %bucket, "current state of targets missing from the state bucket taken from the capture");
        }
        out.extend(kept.into_iter().filter(|m| !forgotten(m)));
        Ok(out)
    }

    /// Like [`Self::subscribe_events`], but on NATS reads the JetStream capture in stream order
    /// and yields each event with its stream sequence, so a consumer that persists how far it
    /// got resumes without losing anything. Each partition of the capture holding a slot of
    /// this shard ([`crate::config::JetStreamConfig::partitions_of`]) is read from its own
    /// `start` sequence (absent or 0: from the oldest message kept); an event's partition is its
    /// target's ([`crate::config::JetStreamConfig::partition_of`]). On the embedded bus (nothing
    /// to replay) it is a live subscription and sequences are `None`.
    ///
    /// A stream that was recreated (a server restarted without its JetStream storage) numbers
    /// its messages from 1 again: at start, a start sequence past its last message, and while
    /// reading, a new creation time (checked every [`REPLAY_RESET_CHECK`]), yield
    /// [`Replayed::Reset`] for its partition and its reading starts over from its first message.
    pub async fn subscribe_replay(
        &self,
        kinds: &[EventKind],
        start: &std::collections::BTreeMap<u32, u64>,
    ) -> Result<mpsc::Receiver<Replayed>, ServiceError> {
        let (tx, rx) = mpsc::channel(self.config.bus.channel_capacity);
        let nats = match &self.bus {
            Bus::InProc(_) => {
                let mut live = self.subscribe_events(kinds).await?;
                tokio::spawn(async move {
                    while let Some(ev) = live.recv().await {
                        if tx.send(Replayed::Event(Box::new(ev), None)).await.is_err() {
                            break;
                        }
                    }
                });
                return Ok(rx);
            }
            Bus::Nats(n) => n.clone(),
        };
        let js = async_nats::jetstream::new(nats.client().clone());
        let js_cfg = &self.config.bus.jetstream;
        for partition in js_cfg.partitions_of(&self.config.shard) {
            let stream_name = js_cfg.partition_stream(partition);
            let start_seq = start.get(&partition).copied().unwrap_or(0);
            let mut reader = ReplayReader::open(&js, &stream_name, start_seq).await?;
            if let Some(reason) = reader.reset.take() {
                tracing::warn!(service = self.name, stream = %stream_name, %reason, "replaying the stream from its first message");
                let _ = tx.send(Replayed::Reset { partition, reason }).await;
            }
            tokio::spawn(self.clone().replay_partition(
                js.clone(),
                stream_name,
                partition,
                reader,
                start_seq,
                kinds.to_vec(),
                tx.clone(),
            ));
        }
        Ok(rx)
    }

    /// Reads one partition of a replay ([`Self::subscribe_replay`]) until shutdown or until
    /// the receiver is dropped.
    #[allow(clippy::too_many_arguments)]
    async fn replay_partition(
        self,
        js: async_nats::jetstream::Context,
        stream_name: String,
        partition: u32,
        mut reader: ReplayReader,
        start_seq: u64,
        kinds: Vec<EventKind>,
        tx: mpsc::Sender<Replayed>,
    ) {
        use futures::StreamExt;
        let ctx = self;
        let shard = ctx.config.shard;
        let mut check = tokio::time::interval(REPLAY_RESET_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The next stream sequence wanted, and whether a message came since the last check.
        let mut wanted = start_seq.max(1);
        // Without a resume point the replay takes whatever the stream keeps, from its oldest.
        let mut from_oldest = start_seq == 0;
        let mut received = false;
        let read = ctx.metrics.replay_read.with_label_values(&[&stream_name]);
        let discarded = ctx
            .metrics
            .replay_discarded
            .with_label_values(&[&stream_name]);
        let span = ctx.metrics.capture_span.with_label_values(&[&stream_name]);
        loop {
            let next = tokio::select! {
                _ = ctx.shutdown.cancelled() => break,
                m = reader.messages.next() => m,
                _ = check.tick() => {
                    let idle = !std::mem::take(&mut received);
                    let checked = reader.check(&js, &stream_name, wanted, idle).await;
                    if let Some(s) = reader.span_secs() {
                        span.set(s);
                    }
                    match checked {
                        Checked::Unchanged => {}
                        Checked::Recreated(reason) => {
                            tracing::warn!(service = ctx.name, stream = %stream_name, %reason, "replaying the stream from its first message");
                            wanted = 1;
                            from_oldest = false;
                            if tx.send(Replayed::Reset { partition, reason }).await.is_err() {
                                break;
                            }
                        }
                        Checked::Reopened => {
                            tracing::warn!(service = ctx.name, stream = %stream_name, from_seq = wanted, "replay consumer stalled with messages waiting (lost by a server restart?): reading again from the next one");
                        }
                    }
                    continue;
                }
            };
            let m = match next {
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    tracing::warn!(service = ctx.name, stream = %stream_name, error = %e, "replay consumer error; it is read again if it stalls");
                    continue;
                }
                None => break,
            };
            received = true;
            read.inc();
            if let Ok(info) = m.info() {
                let got = info.stream_sequence;
                if std::mem::take(&mut from_oldest) {
                    wanted = wanted.max(got);
                }
                // Past the next one wanted: the stream may have discarded what lies between
                // (limits), or the consumer skipped it (seen once on a replicated stream
                // whose leader had just changed). Skipped, it is read again from there.
                if got > wanted {
                    if reader.skipped(&js, &stream_name, wanted).await {
                        tracing::warn!(service = ctx.name, stream = %stream_name, from_seq = wanted, got, "replay consumer skipped messages the stream holds: reading again from the first one skipped");
                        continue;
                    }
                    discarded.inc_by(got - wanted);
                    tracing::error!(service = ctx.name, stream = %stream_name, from_seq = wanted, got, "the stream discarded messages before this replay read them (bus.jetstream.max_bytes or max_age_secs too small for the replay's lag): what they carried is not recorded");
                }
                wanted = got + 1;
            }
            let Ok(parsed) = subject::parse(m.subject.as_str()) else {
                continue;
            };
            // A partition holds every shard's messages of its slots: this instance's only,
            // before decoding.
            if !kinds.contains(&parsed.kind) || !shard.owns(&parsed.target) {
                continue;
            }
            let seq = m.info().ok().map(|i| i.stream_sequence);
            let Some(ev) = ctx.decode(parsed.kind, m.subject.as_str(), &m.payload) else {
                continue;
            };
            if tx.send(Replayed::Event(Box::new(ev), seq)).await.is_err() {
                break;
            }
        }
    }

    /// Decodes one received message, counting it as received or as a decode error.
    pub fn decode(&self, kind: EventKind, subj: &str, payload: &[u8]) -> Option<Event> {
        let label = kind.as_str();
        let fail = |reason: String| {
            self.metrics.decode_errors.with_label_values(&[label]).inc();
            tracing::warn!(service = self.name, subject = subj, bytes = payload.len(), %reason, "dropping malformed message");
            None
        };
        let parsed = match subject::parse(subj) {
            Ok(p) => p,
            Err(e) => return fail(e.to_string()),
        };
        match schemas::decode_event(kind, payload) {
            Ok(ev) if ev.target() == &parsed.target => {
                self.metrics.messages_in.with_label_values(&[label]).inc();
                Some(ev)
            }
            Ok(ev) => fail(format!(
                "message for {} published on the subject of {}",
                ev.target(),
                parsed.target
            )),
            Err(e) => fail(e.to_string()),
        }
    }
}

/// Cancels `token` on SIGINT or SIGTERM.
///
/// The handlers are installed before this returns, not when the spawned task is first polled:
/// a signal that arrives right after start-up (a rollout, a test stopping the process as soon
/// as it listens) shuts down cleanly instead of killing the process with the default action.
pub fn cancel_on_signal(token: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let handlers = signal(SignalKind::interrupt())
            .and_then(|int| Ok((int, signal(SignalKind::terminate())?)));
        match handlers {
            Ok((mut int, mut term)) => {
                tokio::spawn(async move {
                    tokio::select! {
                        _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
                        _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
                    }
                    token.cancel();
                });
            }
            Err(e) => tracing::error!(error = %e, "cannot listen for SIGINT and SIGTERM"),
        }
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        match tokio::signal::ctrl_c().await {
            Ok(()) => {
                tracing::info!("SIGINT received, shutting down");
                token.cancel();
            }
            Err(e) => tracing::error!(error = %e, "cannot listen for SIGINT"),
        }
    });
}

/// What [`ServiceContext::subscribe_replay`] yields.
#[derive(Debug)]
pub enum Replayed {
    /// An event, with its stream sequence on NATS.
    Event(Box<Event>, Option<u64>),
    /// A partition's stream was recreated: its sequences that follow start again from 1, and
    /// any sequence of it kept from before means nothing in it (why, for the log).
    Reset { partition: u32, reason: String },
}

/// How often the replay checks whether its stream was recreated.
pub const REPLAY_RESET_CHECK: Duration = Duration::from_secs(2);

/// The ordered consumer of a replay and the creation time of the stream it reads.
struct ReplayReader {
    messages: async_nats::jetstream::consumer::pull::Ordered,
    /// The stream's creation time, as the server reports it.
    created: String,
    /// Set when opening found `start_seq` past the stream's end.
    reset: Option<String>,
    /// The stream's oldest message's time (Unix ns), as last read; None while it is empty.
    oldest_ns: Option<i128>,
}

impl ReplayReader {
    async fn open(
        js: &async_nats::jetstream::Context,
        stream_name: &str,
        start_seq: u64,
    ) -> Result<Self, ServiceError> {
        let js_err = |e: String| {
            ServiceError::Bus(BusError::JetStream {
                stream: stream_name.to_string(),
                reason: e,
            })
        };
        let stream = js
            .get_stream(stream_name)
            .await
            .map_err(|e| js_err(e.to_string()))?;
        let info = stream.cached_info();
        let last = info.state.last_sequence;
        let reset = (start_seq > last.saturating_add(1)).then(|| {
            format!(
                "the resume point {start_seq} is past the stream's last message {last}: the \
                 stream was recreated (its server lost its JetStream storage?)"
            )
        });
        let deliver_policy = if start_seq > 0 && reset.is_none() {
            async_nats::jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start_seq,
            }
        } else {
            async_nats::jetstream::consumer::DeliverPolicy::All
        };
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                // Every message the stream holds: a partition's stream takes no filter
                // spanning its slots.
                filter_subject: String::new(),
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|e| js_err(e.to_string()))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| js_err(e.to_string()))?;
        Ok(ReplayReader {
            messages,
            created: info.created.to_string(),
            reset,
            oldest_ns: (info.state.messages > 0)
                .then(|| info.state.first_timestamp.unix_timestamp_nanos()),
        })
    }

    /// The time span the stream holds, seconds: now minus its oldest message, as last read.
    fn span_secs(&self) -> Option<f64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_nanos();
        let now = i128::try_from(now).ok()?;
        Some(((now - self.oldest_ns?) as f64 / 1e9).max(0.0))
    }

    /// The periodic check of a replay. When the stream now has another creation time, reopens
    /// the reading at its first message and says why. When the reader was `idle` since the last
    /// check although the stream holds sequence `wanted` or later, its consumer is gone (an
    /// ordered consumer lives in the server's memory: a server restarted with its storage kept
    /// has the messages but not the consumer, and the client notices only much later, if at all):
    /// reopens the reading at `wanted`, so nothing is skipped or read twice. Unchanged while the
    /// stream cannot be read (the server away: checked again at the next tick).
    async fn check(
        &mut self,
        js: &async_nats::jetstream::Context,
        stream_name: &str,
        wanted: u64,
        idle: bool,
    ) -> Checked {
        // `get_stream` already asks for the stream's info: one request per check.
        let Ok(stream) = js.get_stream(stream_name).await else {
            return Checked::Unchanged;
        };
        let info = stream.cached_info();
        self.oldest_ns =
            (info.state.messages > 0).then(|| info.state.first_timestamp.unix_timestamp_nanos());
        let created = info.created.to_string();
        if created != self.created {
            let Ok(reopened) = ReplayReader::open(js, stream_name, 0).await else {
                return Checked::Unchanged;
            };
            let reason = format!(
                "the stream was recreated at {created} (created {} before): its server lost its \
                 JetStream storage?",
                self.created
            );
            *self = reopened;
            return Checked::Recreated(reason);
        }
        if idle && info.state.last_sequence >= wanted {
            if let Ok(reopened) = ReplayReader::open(js, stream_name, wanted).await {
                *self = reopened;
                return Checked::Reopened;
            }
        }
        Checked::Unchanged
    }

    /// Whether the stream holds sequence `wanted`, which the reader passed over; if so the
    /// reading is reopened there. False when it is gone (discarded by the stream's limits) or
    /// the stream cannot be asked: the reading goes on.
    async fn skipped(
        &mut self,
        js: &async_nats::jetstream::Context,
        stream_name: &str,
        wanted: u64,
    ) -> bool {
        let Ok(stream) = js.get_stream(stream_name).await else {
            return false;
        };
        if stream.get_raw_message(wanted).await.is_err() {
            return false;
        }
        match ReplayReader::open(js, stream_name, wanted).await {
            Ok(reopened) => {
                *self = reopened;
                true
            }
            Err(_) => false,
        }
    }
}

/// What [`ReplayReader::check`] found.
enum Checked {
    Unchanged,
    /// Read again from the new stream's first message, for this reason.
    Recreated(String),
    /// Read again from the next sequence wanted: the consumer had stalled.
    Reopened,
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// Set to run [`signal_child`] as the child of
    /// [`a_signal_right_after_start_up_cancels_instead_of_killing`].
    const SIGNAL_CHILD_ENV: &str = "AWARE_TEST_SIGNAL_CHILD";

    /// Installs the handlers and, before yielding once, has `kill` send this process SIGTERM,
    /// then waits for the token. Run alone in its own process: it changes how the process
    /// answers SIGTERM for good.
    #[test]
    #[ignore = "child process of a_signal_right_after_start_up_cancels_instead_of_killing"]
    fn signal_child() {
        assert!(std::env::var_os(SIGNAL_CHILD_ENV).is_some());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let token = CancellationToken::new();
            cancel_on_signal(token.clone());
            let sent = std::process::Command::new("kill")
                .args(["-TERM", &std::process::id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success());
            tokio::time::timeout(Duration::from_secs(10), token.cancelled())
                .await
                .expect("SIGTERM cancels the token");
        });
        println!("signal child: cancelled");
    }

    #[test]
    fn a_signal_right_after_start_up_cancels_instead_of_killing() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "service::tests::signal_child",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(SIGNAL_CHILD_ENV, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("signal child: cancelled"),
            "{:?}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A reading that passed over a message the stream holds is reopened there; one that passed
    /// over a deleted message (the stream's limits) goes on.
    #[test]
    fn a_replay_that_skipped_a_stored_message_reads_it_again() {
        use futures::StreamExt;
        let server = crate::testkit::NatsServer::start().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let client = async_nats::connect(server.url()).await.unwrap();
            let js = async_nats::jetstream::new(client);
            let stream = js
                .create_stream(async_nats::jetstream::stream::Config {
                    name: "replay".into(),
                    subjects: vec![subject::ALL.to_string()],
                    ..Default::default()
                })
                .await
                .unwrap();
            for i in 1..=5u8 {
                js.publish("aware.v1.obs.ns.app", vec![i].into())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
            stream.delete_message(3).await.unwrap();
            let mut reader = ReplayReader::open(&js, "replay", 4).await.unwrap();
            assert!(!reader.skipped(&js, "replay", 3).await, "3 is deleted");
            assert!(reader.skipped(&js, "replay", 2).await, "2 is stored");
            let first = reader.messages.next().await.unwrap().unwrap();
            assert_eq!(first.info().unwrap().stream_sequence, 2);
            assert_eq!(&first.payload[..], &[2]);
        });
    }
}

/// Whether the stream `capture` holds a message older than the stream `kv` was created (both
/// by the server's clock).
async fn capture_predates(
    js: &async_nats::jetstream::Context,
    capture: &str,
    kv: &str,
) -> Result<bool, CaptureError> {
    let info = |name: &str| {
        let name = name.to_string();
        async move {
            let stream = idle(js.get_stream(&name))
                .await
                .map_err(|e| CaptureError::in_stream("get the stream", &name, e))?
                .map_err(|e| CaptureError::in_stream("get the stream", &name, e))?;
            Ok::<_, CaptureError>(stream.cached_info().clone())
        }
    };
    let (c, k) = (info(capture).await?, info(kv).await?);
    Ok(c.state.messages > 0 && c.state.first_timestamp < k.created)
}

/// The newest message of every subject matching `filter` in the stream `stream_name`, in
/// stream order (a JetStream ordered consumer delivering the last message per subject).
/// Each step must make progress within 10 s; a long read that keeps receiving messages is
/// never cut short.
pub async fn read_last_per_subject(
    js: &async_nats::jetstream::Context,
    stream_name: &str,
    filter: &str,
) -> Result<Vec<(String, Bytes)>, CaptureError> {
    use futures::StreamExt;
    let stream = idle(js.get_stream(stream_name))
        .await
        .map_err(|e| CaptureError::in_stream("get the stream", stream_name, e))?
        .map_err(|e| CaptureError::in_stream("get the stream", stream_name, e))?;
    let mut consumer = idle(stream.create_consumer(
        async_nats::jetstream::consumer::pull::OrderedConfig {
            filter_subject: filter.to_string(),
            deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::LastPerSubject,
            ..Default::default()
        },
    ))
    .await
    .map_err(|e| CaptureError::in_stream("create a consumer", stream_name, e))?
    .map_err(|e| CaptureError::in_stream("create a consumer", stream_name, e))?;
    let pending = idle(consumer.info())
        .await
        .map_err(|e| CaptureError::in_stream("read the consumer's info", stream_name, e))?
        .map_err(|e| CaptureError::in_stream("read the consumer's info", stream_name, e))?
        .num_pending;
    let mut out = Vec::new();
    if pending == 0 {
        return Ok(out);
    }
    let mut messages = idle(consumer.messages())
        .await
        .map_err(|e| CaptureError::in_stream("read the messages", stream_name, e))?
        .map_err(|e| CaptureError::in_stream("read the messages", stream_name, e))?;
    loop {
        let m = idle(messages.next())
            .await
            .map_err(|e| CaptureError::in_stream("read a message", stream_name, e))?;
        let Some(m) = m else {
            break;
        };
        let m = m.map_err(|e| CaptureError::in_stream("read a message", stream_name, e))?;
        let remaining = m.info().map(|i| i.pending).unwrap_or(0);
        out.push((m.subject.to_string(), m.payload.clone()));
        if remaining == 0 {
            break;
        }
    }
    if !out.is_empty() {
        tracing::info!(
            stream = stream_name,
            filter,
            messages = out.len(),
            "current state read from JetStream"
        );
    }
    Ok(out)
}
