//! The checkpoint readers (`aware_shared_model`): the DDPG agent's (`Ddpg::from_bytes`, which
//! `Policy::from_bytes` wraps: trainer and recommenders) and the meta-learner's
//! (`MetaLearner::from_bytes`). The first byte picks the reader and whether the input is taken
//! as a whole file or as a body that gets a valid FNV-1a checksum appended (as a writer would):
//! without that the fuzzer would rarely get past the checksum to the header and the blocks.
//!
//! Invariant: a checkpoint that loads saves to bytes that load, and load → save is a fixed point.
#![no_main]

use aware_shared_model::{Ddpg, MetaLearner};
use libfuzzer_sys::fuzz_target;

/// The checkpoint trailer: FNV-1a 64 of every preceding byte (the format's definition).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn check_fixed_point<T>(
    what: &str,
    first: &T,
    save: impl Fn(&T) -> Result<Vec<u8>, aware_shared_model::ModelError>,
    load: impl Fn(&[u8]) -> Result<T, aware_shared_model::ModelError>,
) {
    let bytes = match save(first) {
        Ok(b) => b,
        Err(e) => panic!("a loaded {what} checkpoint does not save: {e}"),
    };
    let second = match load(&bytes) {
        Ok(x) => x,
        Err(e) => panic!("a re-saved {what} checkpoint does not load: {e}"),
    };
    match save(&second) {
        Ok(again) => assert!(
            again == bytes,
            "{what} checkpoint: load → save is not a fixed point"
        ),
        Err(e) => panic!("a twice-loaded {what} checkpoint does not save: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let file = if selector & 1 == 1 {
        let mut signed = body.to_vec();
        signed.extend_from_slice(&fnv1a(body).to_le_bytes());
        signed
    } else {
        body.to_vec()
    };
    if selector & 2 == 0 {
        if let Ok(agent) = Ddpg::from_bytes(&file) {
            check_fixed_point("DDPG", &agent, Ddpg::to_bytes, Ddpg::from_bytes);
        }
    } else if let Ok(meta) = MetaLearner::from_bytes(&file) {
        check_fixed_point(
            "meta-learner",
            &meta,
            MetaLearner::to_bytes,
            MetaLearner::from_bytes,
        );
    }
});
