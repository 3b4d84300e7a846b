//! Checkpoint format (little endian):
//!
//! ```text
//! magic    8 bytes  "AWAREMDL"
//! version  u32      FORMAT_VERSION
//! hlen     u32      header length
//! header   hlen     JSON: config, train steps, Adam step counts, ε, OU state, normalizer scalars
//! blocks   u32 count, then per block: u64 n, n × (f32 | f64)
//!          actor, actor_target, critic, critic_target params (w0 b0 w1 b1 ...),
//!          actor Adam m, v; critic Adam m, v (same order) — f32;
//!          normalizer mean, M2 — f64
//! checksum u64      FNV-1a 64 of every preceding byte
//! ```
//!
//! Loading verifies size, checksum, magic and version before decoding, then checks every block
//! against the sizes the header's config implies: a corrupt, truncated or mismatched file is a
//! [`ModelError`], never a panic.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::config::DdpgConfig;
use crate::ddpg::Ddpg;
use crate::error::ModelError;
use crate::ACTION_DIM;

/// Magic bytes at the start of every checkpoint.
pub const MAGIC: [u8; 8] = *b"AWAREMDL";
/// Format version written and read by this build.
pub const FORMAT_VERSION: u32 = 1;
/// Largest checkpoint accepted (a 16×8192-wide net is far below this).
pub const MAX_CHECKPOINT_BYTES: u64 = 4 << 30;

#[derive(Serialize, Deserialize)]
struct Header {
    config: DdpgConfig,
    train_steps: u64,
    actor_adam_t: i32,
    critic_adam_t: i32,
    epsilon: f32,
    ou: [f32; ACTION_DIM],
    normalizer_count: u64,
    normalizer_frozen: bool,
    /// What the learner training the agent keeps with it ([`Ddpg::set_learner_state`]); absent
    /// in checkpoints written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    learner: Option<serde_json::Value>,
}

pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

pub(crate) fn put_f32s(out: &mut Vec<u8>, xs: &[f32]) {
    out.extend_from_slice(&(xs.len() as u64).to_le_bytes());
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

pub(crate) fn put_f64s(out: &mut Vec<u8>, xs: &[f64]) {
    out.extend_from_slice(&(xs.len() as u64).to_le_bytes());
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Index of the next tensor block (for error messages).
    block: usize,
}

/// Writes the container both checkpoint formats share: magic, format version, length-prefixed
/// JSON header, block count, the f32 blocks then the f64 blocks (each length-prefixed), and the
/// FNV-1a checksum of everything before it.
pub(crate) fn encode<H: Serialize>(
    magic: &[u8],
    version: u32,
    header: &H,
    f32_blocks: &[Vec<f32>],
    f64_blocks: &[&[f64]],
) -> Result<Vec<u8>, ModelError> {
    let header = serde_json::to_vec(header).map_err(|e| ModelError::Header(e.to_string()))?;
    let mut out = Vec::new();
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&((f32_blocks.len() + f64_blocks.len()) as u32).to_le_bytes());
    for b in f32_blocks {
        put_f32s(&mut out, b);
    }
    for b in f64_blocks {
        put_f64s(&mut out, b);
    }
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// Opens [`encode`]'s container: checks magic, size, format version and checksum, decodes the
/// header and checks the block count against `expected_blocks(&header)`; returns the header and
/// a cursor at the first block. Errors, never panics.
pub(crate) fn decode<'a, H: serde::de::DeserializeOwned>(
    buf: &'a [u8],
    magic: &[u8],
    version: u32,
    expected_blocks: impl FnOnce(&H) -> Result<usize, ModelError>,
) -> Result<(H, Cursor<'a>), ModelError> {
    if buf.len() < magic.len() {
        return Err(ModelError::Truncated("magic"));
    }
    if buf[..magic.len()] != *magic {
        return Err(ModelError::BadMagic);
    }
    if buf.len() < magic.len() + 4 + 4 + 8 {
        return Err(ModelError::Truncated("header"));
    }
    let (body, sum) = buf.split_at(buf.len() - 8);
    let mut c = Cursor {
        buf: body,
        pos: 0,
        block: 0,
    };
    c.take(magic.len(), "magic")?;
    let found = c.u32("version")?;
    if found != version {
        return Err(ModelError::UnsupportedVersion {
            found,
            supported: version,
        });
    }
    let mut sb = [0u8; 8];
    sb.copy_from_slice(sum);
    if fnv1a(body) != u64::from_le_bytes(sb) {
        return Err(ModelError::Checksum);
    }
    let hlen = c.u32("header length")? as usize;
    let header: H = serde_json::from_slice(c.take(hlen, "header")?)
        .map_err(|e| ModelError::Header(e.to_string()))?;
    let expected = expected_blocks(&header)?;
    let blocks = c.u32("block count")? as usize;
    if blocks != expected {
        return Err(ModelError::ShapeMismatch {
            index: 0,
            expected,
            found: blocks,
        });
    }
    Ok((header, c))
}

impl<'a> Cursor<'a> {
    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ModelError> {
        let end = self.pos.checked_add(n).ok_or(ModelError::Truncated(what))?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(ModelError::Truncated(what))?;
        self.pos = end;
        Ok(s)
    }
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, ModelError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(b))
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, ModelError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(b))
    }
    fn next_block(&mut self) -> usize {
        self.block += 1;
        self.block - 1
    }

    /// The next blocks, one per size (the parameter blocks of one network).
    pub(crate) fn f32_blocks(&mut self, sizes: &[usize]) -> Result<Vec<Vec<f32>>, ModelError> {
        sizes.iter().map(|&n| self.f32s(n)).collect()
    }

    /// Ends the read: every byte before the checksum was consumed.
    pub(crate) fn finish(&self) -> Result<(), ModelError> {
        if self.pos != self.buf.len() {
            return Err(ModelError::TrailingBytes(self.buf.len() - self.pos));
        }
        Ok(())
    }

    fn block_len(
        &mut self,
        index: usize,
        expected: usize,
        width: usize,
    ) -> Result<usize, ModelError> {
        let n = self.u64("tensor block length")?;
        if n != expected as u64 {
            return Err(ModelError::ShapeMismatch {
                index,
                expected,
                found: usize::try_from(n).unwrap_or(usize::MAX),
            });
        }
        if (self.buf.len() - self.pos) / width < expected {
            return Err(ModelError::Truncated("tensor block"));
        }
        Ok(expected)
    }
    /// The next f32 block, which must hold `expected` values.
    pub(crate) fn f32s(&mut self, expected: usize) -> Result<Vec<f32>, ModelError> {
        let index = self.next_block();
        let n = self.block_len(index, expected, 4)?;
        let raw = self.take(n * 4, "tensor block")?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    /// The next f64 block, which must hold `expected` values.
    pub(crate) fn f64s(&mut self, expected: usize) -> Result<Vec<f64>, ModelError> {
        let index = self.next_block();
        let n = self.block_len(index, expected, 8)?;
        let raw = self.take(n * 8, "tensor block")?;
        Ok(raw
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect())
    }
}

impl Ddpg {
    /// Serializes the agent: weights of all four nets, both Adam states, the normalizer, the
    /// exploration state, the config and the format version.
    pub fn save<W: Write>(&self, mut w: W) -> Result<(), ModelError> {
        let bytes = self.to_bytes()?;
        w.write_all(&bytes)?;
        w.flush()?;
        Ok(())
    }

    /// The checkpoint as bytes (see [`Ddpg::save`]).
    pub fn to_bytes(&self) -> Result<Vec<u8>, ModelError> {
        // Adam's moment store allocates zeros for parameters not yet updated; work on copies so
        // saving stays `&self`.
        let mut aopt = self.actor_opt.clone();
        let mut copt = self.critic_opt.clone();
        let (am, av) = aopt.export(&self.policy.actor)?;
        let (cm, cv) = copt.export(&self.critic)?;
        let header = Header {
            config: self.policy.cfg.clone(),
            train_steps: self.policy.steps,
            actor_adam_t: self.actor_opt.t,
            critic_adam_t: self.critic_opt.t,
            epsilon: self.policy.noise.epsilon,
            ou: self.policy.noise.ou,
            normalizer_count: self.policy.normalizer.count,
            normalizer_frozen: self.policy.normalizer.frozen,
            learner: self.learner_state.clone(),
        };
        let f32_blocks: Vec<Vec<f32>> = [
            self.policy.actor.export(),
            self.actor_target.export(),
            self.critic.export(),
            self.critic_target.export(),
            am,
            av,
            cm,
            cv,
        ]
        .into_iter()
        .flatten()
        .collect();
        encode(
            &MAGIC,
            FORMAT_VERSION,
            &header,
            &f32_blocks,
            &[&self.policy.normalizer.mean, &self.policy.normalizer.m2],
        )
    }

    /// Reads a checkpoint written by [`Ddpg::save`].
    pub fn load<R: Read>(r: R) -> Result<Self, ModelError> {
        let mut buf = Vec::new();
        r.take(MAX_CHECKPOINT_BYTES + 1).read_to_end(&mut buf)?;
        if buf.len() as u64 > MAX_CHECKPOINT_BYTES {
            return Err(ModelError::TooLarge(MAX_CHECKPOINT_BYTES));
        }
        Self::from_bytes(&buf)
    }

    /// Decodes a checkpoint from bytes (see [`Ddpg::load`]).
    pub fn from_bytes(buf: &[u8]) -> Result<Self, ModelError> {
        let mut built = None;
        let (header, mut c) = decode(buf, &MAGIC, FORMAT_VERSION, |h: &Header| {
            let agent = Ddpg::new(h.config.clone())?;
            let n = 4 * agent.policy.actor.param_sizes().len()
                + 4 * agent.critic.param_sizes().len()
                + 2;
            built = Some(agent);
            Ok(n)
        })?;
        let Some(mut agent) = built else {
            return Err(ModelError::Header("no configuration".into()));
        };
        let actor_sizes = agent.policy.actor.param_sizes();
        let critic_sizes = agent.critic.param_sizes();
        let actor = c.f32_blocks(&actor_sizes)?;
        let actor_target = c.f32_blocks(&actor_sizes)?;
        let critic = c.f32_blocks(&critic_sizes)?;
        let critic_target = c.f32_blocks(&critic_sizes)?;
        let am = c.f32_blocks(&actor_sizes)?;
        let av = c.f32_blocks(&actor_sizes)?;
        let cm = c.f32_blocks(&critic_sizes)?;
        let cv = c.f32_blocks(&critic_sizes)?;
        let d = agent.policy.cfg.state_dim;
        let mean = c.f64s(d)?;
        let m2 = c.f64s(d)?;
        c.finish()?;
        agent.policy.actor.import(&actor)?;
        agent.actor_target.import(&actor_target)?;
        agent.critic.import(&critic)?;
        agent.critic_target.import(&critic_target)?;
        agent
            .actor_opt
            .import(&agent.policy.actor, header.actor_adam_t, &am, &av)?;
        agent
            .critic_opt
            .import(&agent.critic, header.critic_adam_t, &cm, &cv)?;
        agent.policy.normalizer.mean = mean;
        agent.policy.normalizer.m2 = m2;
        agent.policy.normalizer.count = header.normalizer_count;
        agent.policy.normalizer.frozen = header.normalizer_frozen;
        agent.policy.noise.epsilon = header.epsilon;
        agent.policy.noise.ou = header.ou;
        agent.policy.steps = header.train_steps;
        agent.learner_state = header.learner;
        Ok(agent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Batch, DdpgConfig, Transition};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn trained() -> Ddpg {
        let mut agent = Ddpg::new(DdpgConfig {
            seed: 11,
            ..DdpgConfig::with_hidden(4, &[8, 8])
        })
        .unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut b = Batch::with_capacity(4, 32);
        for _ in 0..32 {
            let s: Vec<f32> = (0..4).map(|_| rng.random_range(-2.0..2.0)).collect();
            agent.observe(&s).unwrap();
            b.push(&Transition {
                next_state: s.iter().map(|x| x * 0.5).collect(),
                state: s,
                action: [0.1, -0.2, 0.3],
                reward: rng.random_range(0.0..1.0),
                done: false,
            })
            .unwrap();
        }
        for _ in 0..5 {
            agent.train_step(&b).unwrap();
        }
        agent
    }

    #[test]
    fn round_trip_gives_identical_actions_and_training() {
        let mut a = trained();
        let bytes = a.to_bytes().unwrap();
        let mut b = Ddpg::load(&bytes[..]).unwrap();
        let states = [[0.1, 0.2, -0.3, 1.0], [1.5, -1.0, 0.0, 0.2]];
        for s in &states {
            assert_eq!(a.act(s).unwrap(), b.act(s).unwrap());
            let act = [0.5, 0.0, -0.5];
            assert_eq!(a.q_value(s, &act).unwrap(), b.q_value(s, &act).unwrap());
        }
        assert_eq!(b.train_steps(), 5);
        assert_eq!(b.normalizer(), a.normalizer());
        assert_eq!(b.config(), a.config());
        // Optimizer state and targets survived: one more identical step stays identical.
        let batch = Batch::from_transitions(
            4,
            &[Transition {
                state: vec![0.3, 0.1, -0.1, 0.0],
                action: [0.2, 0.2, 0.2],
                reward: 1.0,
                next_state: vec![0.0; 4],
                done: false,
            }],
        )
        .unwrap();
        let sa = a.train_step(&batch).unwrap();
        let sb = b.train_step(&batch).unwrap();
        assert_eq!(sa, sb);
        assert_eq!(a.act(&states[0]).unwrap(), b.act(&states[0]).unwrap());
        // Saving is deterministic.
        assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap());
        assert_eq!(b.learner_state(), None);
    }

    /// The learner's state travels with the checkpoint; a checkpoint without it (as written
    /// before it existed) still loads, with none.
    #[test]
    fn the_learner_state_round_trips_and_is_optional() {
        let mut a = trained();
        let without = a.to_bytes().unwrap();
        a.set_learner_state(Some(
            serde_json::json!({"lambda": 2.5, "through_episode": 7}),
        ));
        let with = a.to_bytes().unwrap();
        assert_ne!(with, without);
        let b = Ddpg::from_bytes(&with).unwrap();
        assert_eq!(b.learner_state(), a.learner_state());
        assert_eq!(Ddpg::from_bytes(&without).unwrap().learner_state(), None);
    }

    #[test]
    fn truncated_corrupt_and_foreign_checkpoints_are_errors() {
        let bytes = trained().to_bytes().unwrap();
        for cut in [0, 4, 8, 12, 20, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                Ddpg::from_bytes(&bytes[..cut]).is_err(),
                "truncated at {cut} loaded"
            );
        }
        assert!(matches!(
            Ddpg::from_bytes(&bytes[..bytes.len() / 2]),
            Err(ModelError::Checksum)
        ));
        let mut flipped = bytes.clone();
        let mid = flipped.len() - 100;
        flipped[mid] ^= 0x40;
        assert!(matches!(
            Ddpg::from_bytes(&flipped),
            Err(ModelError::Checksum)
        ));
        let mut magic = bytes.clone();
        magic[0] = b'X';
        assert!(matches!(
            Ddpg::from_bytes(&magic),
            Err(ModelError::BadMagic)
        ));
        let mut version = bytes.clone();
        version[8] = 99;
        assert!(matches!(
            Ddpg::from_bytes(&version),
            Err(ModelError::UnsupportedVersion { found: 99, .. })
        ));
        assert!(matches!(
            Ddpg::load(&b"hello, world"[..]),
            Err(ModelError::BadMagic)
        ));
        assert!(matches!(
            Ddpg::load(&b"AWARE"[..]),
            Err(ModelError::Truncated(_))
        ));
    }

    /// Re-signs a modified body so only the structural checks can reject it.
    fn resign(mut body: Vec<u8>) -> Vec<u8> {
        let s = fnv1a(&body);
        body.extend_from_slice(&s.to_le_bytes());
        body
    }

    #[test]
    fn mismatched_config_and_sizes_are_errors() {
        let bytes = trained().to_bytes().unwrap();
        let body = &bytes[..bytes.len() - 8];
        let hlen = u32::from_le_bytes([body[12], body[13], body[14], body[15]]) as usize;
        let header = std::str::from_utf8(&body[16..16 + hlen]).unwrap();
        // Header claims wider hidden layers than the blocks hold.
        let wider = header.replacen("\"actor_hidden\":[8,8]", "\"actor_hidden\":[9,8]", 1);
        assert_ne!(wider, header);
        let mut b = body[..12].to_vec();
        b.extend_from_slice(&(wider.len() as u32).to_le_bytes());
        b.extend_from_slice(wider.as_bytes());
        b.extend_from_slice(&body[16 + hlen..]);
        assert!(matches!(
            Ddpg::from_bytes(&resign(b)),
            Err(ModelError::ShapeMismatch { .. })
        ));
        // Invalid config in the header.
        let bad = header.replacen("\"gamma\":0.99", "\"gamma\":7.0", 1);
        assert_ne!(bad, header);
        let mut b = body[..12].to_vec();
        b.extend_from_slice(&(bad.len() as u32).to_le_bytes());
        b.extend_from_slice(bad.as_bytes());
        b.extend_from_slice(&body[16 + hlen..]);
        assert!(matches!(
            Ddpg::from_bytes(&resign(b)),
            Err(ModelError::InvalidConfig(_))
        ));
        // Garbage header, trailing bytes, and a block cut short but re-signed.
        let mut b = body.to_vec();
        b[16] = b'!';
        assert!(matches!(
            Ddpg::from_bytes(&resign(b)),
            Err(ModelError::Header(_))
        ));
        let mut b = body.to_vec();
        b.extend_from_slice(&[0, 0, 0]);
        assert!(matches!(
            Ddpg::from_bytes(&resign(b)),
            Err(ModelError::TrailingBytes(3))
        ));
        let b = body[..body.len() - 4].to_vec();
        assert!(matches!(
            Ddpg::from_bytes(&resign(b)),
            Err(ModelError::Truncated(_))
        ));
    }
}
