//! The meta-learner's tensor code: a stacked bidirectional GRU over a batch of episodes and the
//! fully connected head. Like `net.rs`, this is dfdx code kept inside the model crate.
//!
//! Parameters live in [`Mlp`] "parameter bags" so the Adam, gradient clipping, export/import and
//! checkpoint code of `net.rs` works on them unchanged.
//!
//! GRU parameter order (`Mlp::layers`), for layer `l` and direction `d` (0 forward, 1 backward),
//! `k = 2·(2l + d)`: `layers[k] = (W_x: in_l × 3H, b_x: 3H)`, `layers[k + 1] = (U_h: H × 3H,
//! b_h: 3H)`, gate columns `r | z | n` (PyTorch's order); `in_0` is the step-vector width,
//! `in_l = 2H` above (the concatenated outputs of both directions of the layer below).
//!
//! One step (PyTorch's GRU): `r = σ(x W_r + b_r + h U_r + c_r)`, `z = σ(x W_z + b_z + h U_z +
//! c_z)`, `n = tanh(x W_n + b_n + r ⊙ (h U_n + c_n))`, `h' = n + z ⊙ (h − n)`.

use dfdx::prelude::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::net::{Dense, Dev, Mat, Mlp, OutAct};

/// No gradient tape (inference).
pub(crate) type NoTape = NoneTape;
/// A gradient tape (training).
pub(crate) type Taped = OwnedTape<f32, Dev>;

/// The tapes the encoder runs with ([`NoTape`] or [`Taped`]).
pub(crate) trait AnyTape: Tape<f32, Dev> + Merge<NoneTape> {}
impl<T: Tape<f32, Dev> + Merge<NoneTape>> AnyTape for T {}

/// Uniform `U(±bound)` dense layer.
fn dense(dev: &Dev, fan_in: usize, fan_out: usize, bound: f32, rng: &mut ChaCha8Rng) -> Dense {
    let mut u =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-bound..=bound)).collect() };
    Dense {
        w: dev.tensor_from_vec(u(fan_in * fan_out), (fan_in, fan_out)),
        b: dev.tensor_from_vec(u(fan_out), (fan_out,)),
    }
}

/// GRU parameters, PyTorch initialisation `U(±1/√H)`.
pub(crate) fn new_gru(
    dev: &Dev,
    input_dim: usize,
    hidden: usize,
    layers: usize,
    rng: &mut ChaCha8Rng,
) -> Mlp {
    let bound = 1.0 / (hidden.max(1) as f32).sqrt();
    let mut out = Vec::with_capacity(4 * layers);
    for l in 0..layers {
        let fan_in = if l == 0 { input_dim } else { 2 * hidden };
        for _dir in 0..2 {
            out.push(dense(dev, fan_in, 3 * hidden, bound, rng));
            out.push(dense(dev, hidden, 3 * hidden, bound, rng));
        }
    }
    Mlp {
        layers: out,
        out: OutAct::Identity,
    }
}

/// FC head `sizes[0] → … → sizes[last]`, ReLU between layers, identity at the end (the caller
/// applies the output activation); weights `U(±1/√fan_in)` (no DDPG-style tiny last layer: the
/// embedding must not start near zero), biases 0 (a random bias can switch every ReLU unit of a
/// narrow layer off for all inputs, and the embedding would then be constant).
pub(crate) fn new_head(dev: &Dev, sizes: &[usize], rng: &mut ChaCha8Rng) -> Mlp {
    let layers = sizes
        .windows(2)
        .map(|io| {
            let mut l = dense(dev, io[0], io[1], 1.0 / (io[0].max(1) as f32).sqrt(), rng);
            l.b = dev.zeros_like(&(io[1],));
            l
        })
        .collect();
    Mlp {
        layers,
        out: OutAct::Identity,
    }
}

/// `x W + b` for a batch of rows.
fn affine<T: AnyTape>(x: Mat<T>, l: &Dense) -> Mat<T> {
    let rows = x.shape().0;
    let cols = l.w.shape().1;
    x.matmul(l.w.clone()) + l.b.clone().broadcast_like::<_, Axis<0>>(&(rows, cols))
}

/// Columns `g·H .. (g+1)·H` of a `(B, 3H)` projection.
fn gate<T: Tape<f32, Dev>>(x: Mat<T>, g: usize, hidden: usize) -> Mat<T> {
    x.slice((.., g * hidden..(g + 1) * hidden))
}

/// One GRU step. `h` carries (part of) the history's tape; the result carries this step's.
fn step<T: AnyTape>(x: Mat<T>, h: Mat<T>, wx: &Dense, uh: &Dense, hidden: usize) -> Mat<T> {
    let h_keep = h.with_empty_tape();
    let xp = affine(x, wx);
    let hp = affine(h, uh);
    let (xp_z, xp_n) = (xp.with_empty_tape(), xp.with_empty_tape());
    let (hp_z, hp_n) = (hp.with_empty_tape(), hp.with_empty_tape());
    let r = (gate(xp, 0, hidden) + gate(hp, 0, hidden)).sigmoid();
    let z = (gate(xp_z, 1, hidden) + gate(hp_z, 1, hidden)).sigmoid();
    let n = (gate(xp_n, 2, hidden) + r * gate(hp_n, 2, hidden)).tanh();
    let n_keep = n.with_empty_tape();
    n + z * (h_keep - n_keep)
}

/// Shape of one encoder pass.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeqShape {
    /// Time steps.
    pub(crate) t: usize,
    /// Sequences in the batch.
    pub(crate) b: usize,
    /// Step-vector width.
    pub(crate) input: usize,
    /// Hidden width H.
    pub(crate) hidden: usize,
    /// Stacked layers.
    pub(crate) layers: usize,
}

/// Runs the stacked bidirectional GRU over `x` (host data, time-major: row `t·B + b` is step `t`
/// of sequence `b`), every sequence from a zero hidden state, and returns the final states of
/// the top layer, `(B, 2H)` = `[h_fwd(T−1) | h_bwd(0)]`.
///
/// Tapes: with `T = OwnedTape` every step's operations are recorded (backpropagation through
/// time); the per-step outputs of a lower layer carry their step's operations into the layer
/// above, the recurrent copies are empty, so every operation reaches the loss exactly once.
pub(crate) fn encode<T: AnyTape>(dev: &Dev, gru: &Mlp, x: &[f32], s: SeqShape) -> Mat<T> {
    let SeqShape {
        t: steps,
        b,
        input,
        hidden,
        layers,
    } = s;
    let zeros = || -> Mat<T> { dev.zeros_like(&(b, hidden)).retaped::<T>() };
    // Inputs of the current layer, one (B, in) tensor per step.
    let mut inputs: Vec<Mat<T>> = (0..steps)
        .map(|t| {
            let row = x
                .get(t * b * input..(t + 1) * b * input)
                .map(<[f32]>::to_vec)
                .unwrap_or_else(|| vec![0.0; b * input]);
            dev.tensor_from_vec(row, (b, input)).retaped::<T>()
        })
        .collect();
    let mut last = None;
    for l in 0..layers {
        let top = l + 1 == layers;
        let p = |d: usize, k: usize| &gru.layers[2 * (2 * l + d) + k];
        let (wf, uf, wb, ub) = (p(0, 0), p(0, 1), p(1, 0), p(1, 1));
        // Backward direction first (it consumes copies of the inputs), then forward (it
        // consumes the inputs and their tapes).
        let mut out_b: Vec<Option<Mat<T>>> = (0..steps).map(|_| None).collect();
        let mut h = zeros();
        for t in (0..steps).rev() {
            let xt = inputs[t].with_empty_tape();
            let hn = step(xt, h, wb, ub, hidden);
            if top {
                h = hn;
            } else {
                h = hn.with_empty_tape();
                out_b[t] = Some(hn);
            }
        }
        let h_bwd = h;
        let mut out_f = Vec::with_capacity(steps);
        let mut h = zeros();
        for xt in inputs.drain(..) {
            let hn = step(xt, h, wf, uf, hidden);
            if top {
                h = hn;
            } else {
                h = hn.with_empty_tape();
                out_f.push(hn);
            }
        }
        let h_fwd = h;
        if top {
            last = Some((h_fwd, h_bwd));
        } else {
            // h_fwd / h_bwd are empty copies of the last outputs: dropping them loses nothing.
            inputs = out_f
                .into_iter()
                .zip(out_b)
                .map(|(f, bk)| match bk {
                    Some(bk) => (f, bk).concat_along(Axis::<1>),
                    None => (f, zeros()).concat_along(Axis::<1>),
                })
                .collect();
        }
    }
    match last {
        Some((f, bk)) => (f, bk).concat_along(Axis::<1>),
        None => dev.zeros_like(&(b, 2 * hidden)).retaped::<T>(),
    }
}

/// Mean over groups of `m` consecutive rows: `(K·M, C)` → `(K, C)`.
pub(crate) fn group_mean<T: Tape<f32, Dev>>(x: Mat<T>, k: usize, m: usize) -> Mat<T> {
    let c = x.shape().1;
    x.reshape_like(&(k, m, c)).mean::<_, Axis<1>>()
}

/// Rows of `x` picked by `idx` (`(K, C)` → `(N, C)`), with gradients.
pub(crate) fn pick_rows<T: Tape<f32, Dev>>(dev: &Dev, x: Mat<T>, idx: &[usize]) -> Mat<T> {
    let n = idx.len();
    let i: Tensor<(usize,), usize, Dev> = dev.tensor_from_vec(idx.to_vec(), (n,));
    x.gather(i)
}

/// ReLU.
pub(crate) fn relu<T: Tape<f32, Dev>>(x: Mat<T>) -> Mat<T> {
    x.relu()
}

/// tanh.
pub(crate) fn tanh<T: Tape<f32, Dev>>(x: Mat<T>) -> Mat<T> {
    x.tanh()
}

/// A tape-carrying copy of an untaped matrix (so it can be concatenated with taped ones).
pub(crate) fn with_tape(x: Mat) -> Mat<OwnedTape<f32, Dev>> {
    x.retaped::<OwnedTape<f32, Dev>>()
}

/// `[a | b]` along columns, both carrying tapes.
pub(crate) fn concat_taped<T: AnyTape>(a: Mat<T>, b: Mat<T>) -> Mat<T> {
    (a, b).concat_along(Axis::<1>)
}

/// Σ x ⊙ w: backpropagating it gives every parameter behind `x` the gradient of a loss whose
/// gradient with respect to `x` is `w`.
pub(crate) fn weighted_sum(x: Mat<Taped>, w: Mat) -> crate::net::Loss {
    (x * w).sum()
}

/// The gradient `grads` holds for `x` (zeros if none reached it).
pub(crate) fn grad_of(
    grads: &mut crate::net::Grads,
    x: &Mat,
) -> Result<Vec<f32>, crate::error::ModelError> {
    Ok(grads
        .get_or_alloc_mut(x)
        .map_err(crate::error::backend)?
        .to_vec())
}
