//! A process's pool of actix arbiters (threads, each with its own event loop) on which the
//! per-target actors run, so that one process uses every core (`actors.arbiters`).
//!
//! A target always lands on the same arbiter (a stable hash of its key, mixed so that it is
//! independent of the shard a target belongs to): its actor is one mailbox on one thread, so its
//! messages are handled in the order they were sent, whatever the other arbiters do. The pool is
//! shared by every service of a process ([`crate::launcher`]) and stopped when they have all
//! ended ([`ArbiterPool::stop`]); dropping the last handle stops the arbiters too.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_rt::{Arbiter, ArbiterHandle};
use aware_bus_schemas::Target;

/// Errors starting the pool.
#[derive(Debug, thiserror::Error)]
pub enum ArbiterError {
    #[error("the arbiters need a running actix system on this thread")]
    NoSystem,
    #[error("starting arbiter thread {index}: {source}")]
    Start {
        index: usize,
        #[source]
        source: std::io::Error,
    },
}

/// Handle on a pool of arbiters; clones share the pool.
#[derive(Clone)]
pub struct ArbiterPool {
    inner: Arc<Inner>,
}

struct Inner {
    handles: Vec<ArbiterHandle>,
    /// The threads, taken by [`ArbiterPool::stop`] to join them.
    threads: Mutex<Vec<Arbiter>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Asks each event loop to end (a message, never blocks); `stop` also joins the threads.
        for h in &self.handles {
            h.stop();
        }
    }
}

impl std::fmt::Debug for ArbiterPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArbiterPool")
            .field("arbiters", &self.len())
            .finish()
    }
}

/// The number of arbiters `actors.arbiters` asks for: the value itself, or with 0 one per core
/// the process may use (available parallelism; 1 when unknown).
pub fn arbiters_for(setting: usize) -> usize {
    if setting > 0 {
        setting
    } else {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    }
}

/// The arbiter of `target` among `n`: FNV-1a of its key ([`crate::config::stable_hash`], the
/// shard hash) through the SplitMix64 finalizer, so that the targets of one shard (equal hash
/// modulo the shard count) still spread over every arbiter.
pub fn arbiter_index(target: &Target, n: usize) -> usize {
    let mut z = crate::config::stable_hash(&target.key());
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    // `n` is at least 1 and fits in u64; the remainder is below `n`.
    usize::try_from(z % n.max(1) as u64).unwrap_or(0)
}

impl ArbiterPool {
    /// Starts `n` arbiters (at least one) in the actix system of the current thread.
    pub fn start(n: usize) -> Result<Self, ArbiterError> {
        if actix_rt::System::try_current().is_none() {
            return Err(ArbiterError::NoSystem);
        }
        let mut threads = Vec::with_capacity(n.max(1));
        for index in 0..n.max(1) {
            match Arbiter::try_new() {
                Ok(a) => threads.push(a),
                Err(source) => {
                    for a in &threads {
                        a.stop();
                    }
                    return Err(ArbiterError::Start { index, source });
                }
            }
        }
        tracing::debug!(arbiters = threads.len(), "actor arbiters started");
        Ok(ArbiterPool {
            inner: Arc::new(Inner {
                handles: threads.iter().map(Arbiter::handle).collect(),
                threads: Mutex::new(threads),
            }),
        })
    }

    /// The number of arbiters.
    pub fn len(&self) -> usize {
        self.inner.handles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.handles.is_empty()
    }

    /// How many arbiters still run their event loop.
    pub fn alive(&self) -> usize {
        self.inner.handles.iter().filter(|h| h.alive()).count()
    }

    /// The arbiter `target`'s actor runs on: always the same one for a target.
    pub fn arbiter_of(&self, target: &Target) -> &ArbiterHandle {
        &self.inner.handles[arbiter_index(target, self.inner.handles.len())]
    }

    /// Stops every arbiter (their actors are dropped with their event loops) and waits up to
    /// `timeout` for the threads to end, on the blocking pool; whether they all ended. A thread
    /// still running then (a blocking task it spawned that has not finished) is left to the
    /// process's exit and logged. Later calls only stop (the threads are joined once).
    pub async fn stop(&self, timeout: Duration) -> bool {
        for h in &self.inner.handles {
            h.stop();
        }
        let threads = match self.inner.threads.lock() {
            Ok(mut t) => std::mem::take(&mut *t),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        if threads.is_empty() {
            return true;
        }
        let n = threads.len();
        let join = tokio::task::spawn_blocking(move || {
            threads
                .into_iter()
                .map(Arbiter::join)
                .filter(Result::is_err)
                .count()
        });
        match tokio::time::timeout(timeout, join).await {
            Ok(Ok(0)) => {
                tracing::debug!(arbiters = n, "actor arbiters stopped");
                true
            }
            Ok(Ok(panicked)) => {
                tracing::error!(arbiters = n, panicked, "actor arbiter threads panicked");
                true
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "joining the actor arbiters failed");
                false
            }
            Err(_) => {
                tracing::warn!(
                    arbiters = n,
                    timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                    "actor arbiters still running at the shutdown timeout (a blocking task in flight): left to the process's exit"
                );
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The assignment depends on the target's key only, and spreads the targets of one shard
    /// over every arbiter even when the shard count and the arbiter count are equal.
    #[test]
    fn targets_of_one_shard_spread_over_every_arbiter_and_always_the_same_one() {
        let shard = crate::config::ShardConfig { index: 0, count: 2 };
        let mine: Vec<Target> = (0..2_000)
            .map(|i| Target::new("ns", format!("app-{i}")))
            .filter(|t| shard.owns(t))
            .collect();
        assert!(mine.len() > 800);
        for n in [2usize, 3, 8] {
            let mut per = vec![0usize; n];
            for t in &mine {
                let i = arbiter_index(t, n);
                assert_eq!(
                    i,
                    arbiter_index(&Target::new(t.namespace.clone(), t.name.clone()), n)
                );
                per[i] += 1;
            }
            let even = mine.len() / n;
            assert!(
                per.iter().all(|c| *c > even * 3 / 4 && *c < even * 5 / 4),
                "{n} arbiters: {per:?}"
            );
        }
        assert_eq!(arbiter_index(&mine[0], 1), 0);
        assert_eq!(arbiter_index(&mine[0], 0), 0, "no arbiter count: the first");
    }

    #[test]
    fn zero_arbiters_means_one_per_core() {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        assert_eq!(arbiters_for(0), cores);
        assert_eq!(arbiters_for(3), 3);
    }

    #[test]
    fn the_pool_needs_an_actix_system() {
        assert!(matches!(ArbiterPool::start(2), Err(ArbiterError::NoSystem)));
    }
}
