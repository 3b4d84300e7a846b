//! Transitions, minibatches and the replay buffer.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{check_dim, check_finite, ModelError};
use crate::ACTION_DIM;

/// One environment step: (s_t, a_t, r_{t+1}, s_{t+1}, done). States are raw (not normalized);
/// actions are the raw actions in [-1, 1]^3 that were applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// State s_t.
    pub state: Vec<f32>,
    /// Action a_t.
    pub action: [f32; ACTION_DIM],
    /// Reward r_{t+1}.
    pub reward: f32,
    /// State s_{t+1}.
    pub next_state: Vec<f32>,
    /// Whether s_{t+1} is terminal (no bootstrapping from it).
    pub done: bool,
}

/// A minibatch in row-major flat arrays (row i of `states` is `states[i*state_dim..]`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Batch {
    /// State width.
    pub state_dim: usize,
    /// `len × state_dim` states.
    pub states: Vec<f32>,
    /// `len × 3` actions.
    pub actions: Vec<f32>,
    /// `len` rewards.
    pub rewards: Vec<f32>,
    /// `len × state_dim` next states.
    pub next_states: Vec<f32>,
    /// `len` terminal flags as 1.0 (terminal) or 0.0.
    pub dones: Vec<f32>,
}

impl Batch {
    /// An empty batch for states of width `state_dim`.
    pub fn with_capacity(state_dim: usize, n: usize) -> Self {
        Self {
            state_dim,
            states: Vec::with_capacity(n * state_dim),
            actions: Vec::with_capacity(n * ACTION_DIM),
            rewards: Vec::with_capacity(n),
            next_states: Vec::with_capacity(n * state_dim),
            dones: Vec::with_capacity(n),
        }
    }

    /// Builds a batch from transitions (checks dimensions and finiteness).
    pub fn from_transitions(state_dim: usize, ts: &[Transition]) -> Result<Self, ModelError> {
        let mut b = Self::with_capacity(state_dim, ts.len());
        for t in ts {
            b.push(t)?;
        }
        Ok(b)
    }

    /// Appends one transition (checks dimensions and finiteness).
    pub fn push(&mut self, t: &Transition) -> Result<(), ModelError> {
        validate(self.state_dim, t)?;
        self.states.extend_from_slice(&t.state);
        self.actions.extend_from_slice(&t.action);
        self.rewards.push(t.reward);
        self.next_states.extend_from_slice(&t.next_state);
        self.dones.push(if t.done { 1.0 } else { 0.0 });
        Ok(())
    }

    /// The same transitions with `suffix` appended to every state and next state (e.g. a
    /// workload embedding: the rows a `state ‖ embedding` policy trains on).
    pub fn with_suffix(&self, suffix: &[f32]) -> Batch {
        let d = self.state_dim;
        let widen = |xs: &[f32]| -> Vec<f32> {
            xs.chunks(d.max(1))
                .flat_map(|row| row.iter().chain(suffix))
                .copied()
                .collect()
        };
        Batch {
            state_dim: d + suffix.len(),
            states: widen(&self.states),
            actions: self.actions.clone(),
            rewards: self.rewards.clone(),
            next_states: widen(&self.next_states),
            dones: self.dones.clone(),
        }
    }

    /// Appends `other`'s transitions (same state width).
    pub fn extend(&mut self, other: &Batch) -> Result<(), ModelError> {
        check_dim("batch state_dim", self.state_dim, other.state_dim)?;
        self.states.extend_from_slice(&other.states);
        self.actions.extend_from_slice(&other.actions);
        self.rewards.extend_from_slice(&other.rewards);
        self.next_states.extend_from_slice(&other.next_states);
        self.dones.extend_from_slice(&other.dones);
        Ok(())
    }

    /// Number of transitions.
    pub fn len(&self) -> usize {
        self.rewards.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.rewards.is_empty()
    }

    /// Checks that every array is consistent with `len()` and finite.
    pub(crate) fn validate(&self) -> Result<(), ModelError> {
        let n = self.len();
        check_dim("batch states", n * self.state_dim, self.states.len())?;
        check_dim(
            "batch next_states",
            n * self.state_dim,
            self.next_states.len(),
        )?;
        check_dim("batch actions", n * ACTION_DIM, self.actions.len())?;
        check_dim("batch dones", n, self.dones.len())?;
        check_finite("batch states", &self.states)?;
        check_finite("batch next_states", &self.next_states)?;
        check_finite("batch actions", &self.actions)?;
        check_finite("batch rewards", &self.rewards)?;
        check_finite("batch dones", &self.dones)
    }
}

fn validate(state_dim: usize, t: &Transition) -> Result<(), ModelError> {
    check_dim("transition state", state_dim, t.state.len())?;
    check_dim("transition next_state", state_dim, t.next_state.len())?;
    check_finite("transition state", &t.state)?;
    check_finite("transition next_state", &t.next_state)?;
    check_finite("transition action", &t.action)?;
    check_finite("transition reward", &[t.reward])
}

/// A fixed-capacity FIFO replay buffer (the oldest transition is evicted when full) with
/// uniform sampling with replacement from its own seeded RNG, so a seed reproduces the batches.
///
/// Storage is flat and grows with use, so a 10^6 capacity costs memory only when filled.
#[derive(Debug, Clone)]
pub struct ReplayBuffer {
    capacity: usize,
    state_dim: usize,
    next: usize,
    len: usize,
    states: Vec<f32>,
    actions: Vec<f32>,
    rewards: Vec<f32>,
    next_states: Vec<f32>,
    dones: Vec<f32>,
    rng: ChaCha8Rng,
}

impl ReplayBuffer {
    /// Paper Table 2: 10^6.
    pub const DEFAULT_CAPACITY: usize = 1_000_000;

    /// An empty buffer.
    pub fn new(capacity: usize, state_dim: usize, seed: u64) -> Result<Self, ModelError> {
        if capacity == 0 {
            return Err(ModelError::InvalidConfig(
                "replay capacity must be > 0".into(),
            ));
        }
        Ok(Self {
            capacity,
            state_dim,
            next: 0,
            len: 0,
            states: Vec::new(),
            actions: Vec::new(),
            rewards: Vec::new(),
            next_states: Vec::new(),
            dones: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    /// Maximum number of transitions held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Transitions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// State width.
    pub fn state_dim(&self) -> usize {
        self.state_dim
    }

    /// Adds a transition, evicting the oldest when full. Refuses non-finite values and wrong
    /// dimensions (nothing is stored then).
    pub fn push(&mut self, t: Transition) -> Result<(), ModelError> {
        validate(self.state_dim, &t)?;
        let d = self.state_dim;
        let i = self.next;
        if self.len < self.capacity {
            self.states.extend_from_slice(&t.state);
            self.actions.extend_from_slice(&t.action);
            self.rewards.push(t.reward);
            self.next_states.extend_from_slice(&t.next_state);
            self.dones.push(if t.done { 1.0 } else { 0.0 });
            self.len += 1;
        } else {
            self.states[i * d..(i + 1) * d].copy_from_slice(&t.state);
            self.actions[i * ACTION_DIM..(i + 1) * ACTION_DIM].copy_from_slice(&t.action);
            self.rewards[i] = t.reward;
            self.next_states[i * d..(i + 1) * d].copy_from_slice(&t.next_state);
            self.dones[i] = if t.done { 1.0 } else { 0.0 };
        }
        self.next = (i + 1) % self.capacity;
        Ok(())
    }

    /// The transition at storage slot `i` (slots are reused in FIFO order once full).
    pub fn get(&self, i: usize) -> Option<Transition> {
        if i >= self.len {
            return None;
        }
        let d = self.state_dim;
        let mut action = [0.0; ACTION_DIM];
        action.copy_from_slice(&self.actions[i * ACTION_DIM..(i + 1) * ACTION_DIM]);
        Some(Transition {
            state: self.states[i * d..(i + 1) * d].to_vec(),
            action,
            reward: self.rewards[i],
            next_state: self.next_states[i * d..(i + 1) * d].to_vec(),
            done: self.dones[i] > 0.5,
        })
    }

    /// Samples `n` transitions uniformly with replacement.
    pub fn sample(&mut self, n: usize) -> Result<Batch, ModelError> {
        let mut b = Batch::with_capacity(self.state_dim, n);
        self.sample_into(n, &mut b)?;
        Ok(b)
    }

    /// Samples `n` transitions into `out` (reusing its allocations).
    pub fn sample_into(&mut self, n: usize, out: &mut Batch) -> Result<(), ModelError> {
        self.sample_recent_into(n, 0, 0.0, out)
    }

    /// Samples `n` transitions with replacement, each drawn with probability `fraction` from
    /// the newest `recent` transitions and otherwise uniformly from the whole buffer (the
    /// recency-mixed replay retraining uses after a workload change, so new-regime data is not
    /// drowned by the old regime's). `recent` 0 or `fraction` 0: uniform.
    pub fn sample_recent(
        &mut self,
        n: usize,
        recent: usize,
        fraction: f32,
    ) -> Result<Batch, ModelError> {
        let mut b = Batch::with_capacity(self.state_dim, n);
        self.sample_recent_into(n, recent, fraction, &mut b)?;
        Ok(b)
    }

    /// [`ReplayBuffer::sample_recent`] into `out` (reusing its allocations).
    pub fn sample_recent_into(
        &mut self,
        n: usize,
        recent: usize,
        fraction: f32,
        out: &mut Batch,
    ) -> Result<(), ModelError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(ModelError::InvalidConfig(format!(
                "recent fraction {fraction} is not in [0, 1]"
            )));
        }
        if self.len == 0 || n == 0 {
            return Err(ModelError::NotEnoughSamples {
                len: self.len,
                need: n.max(1),
            });
        }
        let d = self.state_dim;
        out.state_dim = d;
        out.states.clear();
        out.actions.clear();
        out.rewards.clear();
        out.next_states.clear();
        out.dones.clear();
        let recent = recent.min(self.len);
        for _ in 0..n {
            let i = if recent > 0 && fraction > 0.0 && self.rng.random::<f32>() < fraction {
                // The k-th newest transition sits k slots before `next` (FIFO ring).
                let k = self.rng.random_range(0..recent);
                (self.next + self.capacity - 1 - k) % self.capacity
            } else {
                self.rng.random_range(0..self.len)
            };
            out.states
                .extend_from_slice(&self.states[i * d..(i + 1) * d]);
            out.actions
                .extend_from_slice(&self.actions[i * ACTION_DIM..(i + 1) * ACTION_DIM]);
            out.rewards.push(self.rewards[i]);
            out.next_states
                .extend_from_slice(&self.next_states[i * d..(i + 1) * d]);
            out.dones.push(self.dones[i]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(x: f32) -> Transition {
        Transition {
            state: vec![x, -x],
            action: [x / 100.0, 0.0, -x / 100.0],
            reward: x,
            next_state: vec![x + 1.0, -x - 1.0],
            done: (x as i64) % 2 == 0,
        }
    }

    #[test]
    fn a_suffix_is_appended_to_every_row_and_batches_extend() {
        let b = Batch::from_transitions(2, &[t(0.0), t(10.0)]).unwrap();
        let w = b.with_suffix(&[7.0, 8.0, 9.0]);
        assert_eq!(w.state_dim, 5);
        assert_eq!(
            w.states,
            [0.0, -0.0, 7.0, 8.0, 9.0, 10.0, -10.0, 7.0, 8.0, 9.0]
        );
        assert_eq!(w.next_states[5..], [11.0, -11.0, 7.0, 8.0, 9.0]);
        assert_eq!(
            (&w.actions, &w.rewards, &w.dones),
            (&b.actions, &b.rewards, &b.dones)
        );
        w.validate().unwrap();
        let mut both = w.clone();
        both.extend(&w).unwrap();
        assert_eq!(both.len(), 4);
        both.validate().unwrap();
        assert_eq!(both.states[10..], w.states[..]);
        assert!(both.extend(&b).is_err(), "state widths differ");
        assert_eq!(both.len(), 4);
    }

    #[test]
    fn capacity_and_fifo_eviction() {
        let mut b = ReplayBuffer::new(3, 2, 1).unwrap();
        for x in 0..5 {
            b.push(t(x as f32)).unwrap();
        }
        assert_eq!(b.len(), 3);
        assert_eq!(b.capacity(), 3);
        // 0 and 1 were evicted; slots hold 3, 4, 2 (slot 0 and 1 overwritten).
        let mut rewards: Vec<f32> = (0..3).map(|i| b.get(i).unwrap().reward).collect();
        assert_eq!(rewards, vec![3.0, 4.0, 2.0]);
        assert_eq!(b.get(1).unwrap(), t(4.0));
        assert!(b.get(3).is_none());
        // Every sample comes from the retained transitions.
        let batch = b.sample(200).unwrap();
        rewards = batch.rewards.clone();
        assert!(rewards.iter().all(|r| [2.0, 3.0, 4.0].contains(r)));
        for r in [2.0, 3.0, 4.0] {
            assert!(rewards.contains(&r), "uniform sampling never drew {r}");
        }
        // Rows stay aligned.
        for i in 0..batch.len() {
            let r = batch.rewards[i];
            assert_eq!(batch.states[2 * i], r);
            assert_eq!(batch.next_states[2 * i], r + 1.0);
            assert_eq!(batch.actions[3 * i], r / 100.0);
            assert_eq!(batch.dones[i], if (r as i64) % 2 == 0 { 1.0 } else { 0.0 });
        }
    }

    #[test]
    fn seeded_sampling_is_reproducible() {
        let fill = |seed| {
            let mut b = ReplayBuffer::new(100, 2, seed).unwrap();
            for x in 0..100 {
                b.push(t(x as f32)).unwrap();
            }
            b
        };
        let (mut a, mut b, mut c) = (fill(7), fill(7), fill(8));
        let (ba, bb, bc) = (
            a.sample(64).unwrap(),
            b.sample(64).unwrap(),
            c.sample(64).unwrap(),
        );
        assert_eq!(ba, bb);
        assert_ne!(ba.rewards, bc.rewards);
        assert_ne!(ba.rewards, a.sample(64).unwrap().rewards);
    }

    #[test]
    fn refuses_bad_transitions_and_empty_sampling() {
        let mut b = ReplayBuffer::new(10, 2, 1).unwrap();
        assert!(matches!(
            b.sample(4),
            Err(ModelError::NotEnoughSamples { len: 0, .. })
        ));
        let mut bad = t(1.0);
        bad.reward = f32::NAN;
        assert!(matches!(b.push(bad), Err(ModelError::NonFinite { .. })));
        let mut bad = t(1.0);
        bad.state = vec![1.0];
        assert!(matches!(b.push(bad), Err(ModelError::Dimension { .. })));
        assert!(b.is_empty());
        assert!(ReplayBuffer::new(0, 2, 1).is_err());
    }

    #[test]
    fn recent_sampling_draws_the_newest_transitions_across_the_ring() {
        // Capacity 10 after 25 pushes: slots hold 15..=24, the newest three are 22, 23, 24.
        let mut b = ReplayBuffer::new(10, 2, 3).unwrap();
        for x in 0..25 {
            b.push(t(x as f32)).unwrap();
        }
        let only_recent = b.sample_recent(2_000, 3, 1.0).unwrap();
        assert!(only_recent
            .rewards
            .iter()
            .all(|r| [22.0, 23.0, 24.0].contains(r)));
        for r in [22.0, 23.0, 24.0] {
            assert!(only_recent.rewards.contains(&r), "{r} never drawn");
        }
        // Half recent: the newest three (30% of the buffer under uniform draws) come up about
        // 0.5 + 0.5 × 0.3 = 65% of the time; everything else in the buffer still appears.
        let mixed = b.sample_recent(20_000, 3, 0.5).unwrap();
        let share = mixed.rewards.iter().filter(|r| **r >= 22.0).count() as f64 / 20_000.0;
        assert!((share - 0.65).abs() < 0.02, "recent share {share}");
        assert!(mixed.rewards.contains(&15.0));
        assert!(mixed.rewards.iter().all(|r| (15.0..=24.0).contains(r)));
        // Not yet full: the newest are the last pushed, not the end of the storage.
        let mut c = ReplayBuffer::new(100, 2, 4).unwrap();
        for x in 0..5 {
            c.push(t(x as f32)).unwrap();
        }
        let r = c.sample_recent(500, 2, 1.0).unwrap();
        assert!(r.rewards.iter().all(|x| *x == 3.0 || *x == 4.0));
        // `recent` larger than the buffer is the whole buffer; fraction outside [0, 1] refused.
        assert_eq!(c.sample_recent(8, 1_000, 1.0).unwrap().len(), 8);
        assert!(matches!(
            c.sample_recent(8, 2, 1.5),
            Err(ModelError::InvalidConfig(_))
        ));
        assert!(c.sample_recent(8, 2, f32::NAN).is_err());
    }
}
