//! The only module that touches dfdx: runtime-sized MLPs, an Adam whose moments can be saved,
//! gradient clipping and soft updates.

use dfdx::prelude::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::error::{backend, ModelError};

pub(crate) type Dev = Cpu;
pub(crate) type Mat<T = NoneTape> = Tensor<(usize, usize), f32, Dev, T>;
type Row = Tensor<(usize,), f32, Dev>;
pub(crate) type Grads = Gradients<f32, Dev>;
/// A scalar loss carrying its gradient tape.
/// A matrix carrying a gradient tape.
pub(crate) type Traced = Mat<OwnedTape<f32, Dev>>;
pub(crate) type Loss = Tensor<Rank0, f32, Dev, OwnedTape<f32, Dev>>;
/// Adam first and second moments per parameter.
pub(crate) type Moments = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// Output non-linearity of the last layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutAct {
    Tanh,
    Identity,
}

#[derive(Debug, Clone)]
pub(crate) struct Dense {
    pub(crate) w: Mat,
    pub(crate) b: Row,
}

/// Fully connected net: `sizes[0]` inputs, ReLU hidden layers, `out` after the last layer.
#[derive(Debug, Clone)]
pub(crate) struct Mlp {
    pub(crate) layers: Vec<Dense>,
    pub(crate) out: OutAct,
}

impl Mlp {
    /// DDPG initialisation (Lillicrap et al.): hidden layers U(±1/√fan_in), last layer U(±3e-3).
    pub(crate) fn new(dev: &Dev, sizes: &[usize], out: OutAct, rng: &mut ChaCha8Rng) -> Self {
        let n = sizes.len().saturating_sub(1);
        let layers = sizes
            .windows(2)
            .enumerate()
            .map(|(i, io)| {
                let (fan_in, fan_out) = (io[0], io[1]);
                let bound = if i + 1 == n {
                    3e-3
                } else {
                    1.0 / (fan_in.max(1) as f32).sqrt()
                };
                let mut u = |len: usize| -> Vec<f32> {
                    (0..len).map(|_| rng.random_range(-bound..=bound)).collect()
                };
                Dense {
                    w: dev.tensor_from_vec(u(fan_in * fan_out), (fan_in, fan_out)),
                    b: dev.tensor_from_vec(u(fan_out), (fan_out,)),
                }
            })
            .collect();
        Self { layers, out }
    }

    pub(crate) fn forward<T: Tape<f32, Dev> + Merge<NoneTape>>(&self, x: Mat<T>) -> Mat<T> {
        let z = self.forward_pre(x);
        match self.out {
            OutAct::Tanh => z.tanh(),
            OutAct::Identity => z,
        }
    }

    /// The output layer's input to its activation (the pre-activation).
    pub(crate) fn forward_pre<T: Tape<f32, Dev> + Merge<NoneTape>>(&self, x: Mat<T>) -> Mat<T> {
        self.forward_pre_by(x, dense)
    }

    /// [`Mlp::forward_pre`] with each layer computed by `layer` (the tests compare [`dense`]
    /// with dfdx's broadcast add through it).
    fn forward_pre_by<T: Tape<f32, Dev> + Merge<NoneTape>>(
        &self,
        x: Mat<T>,
        layer: impl Fn(Mat<T>, &Dense) -> Mat<T>,
    ) -> Mat<T> {
        let mut h = x;
        let last = self.layers.len().saturating_sub(1);
        for (i, l) in self.layers.iter().enumerate() {
            let z = layer(h, l);
            h = if i < last { z.relu() } else { z };
        }
        h
    }

    /// Parameter sizes in a fixed order (w0, b0, w1, b1, ...).
    pub(crate) fn param_sizes(&self) -> Vec<usize> {
        self.layers
            .iter()
            .flat_map(|l| [l.w.shape().num_elements(), l.b.shape().num_elements()])
            .collect()
    }

    /// Parameters as host vectors, in `param_sizes` order.
    pub(crate) fn export(&self) -> Vec<Vec<f32>> {
        self.layers
            .iter()
            .flat_map(|l| [l.w.as_vec(), l.b.as_vec()])
            .collect()
    }

    /// Overwrites the parameters; `values` must match `param_sizes` (checked by the caller).
    pub(crate) fn import(&mut self, values: &[Vec<f32>]) -> Result<(), ModelError> {
        let sizes = self.param_sizes();
        if values.len() != sizes.len() {
            return Err(ModelError::ShapeMismatch {
                index: 0,
                expected: sizes.len(),
                found: values.len(),
            });
        }
        for (i, (v, s)) in values.iter().zip(&sizes).enumerate() {
            if v.len() != *s {
                return Err(ModelError::ShapeMismatch {
                    index: i,
                    expected: *s,
                    found: v.len(),
                });
            }
        }
        for (l, pair) in self.layers.iter_mut().zip(values.chunks(2)) {
            if let [w, b] = pair {
                l.w.copy_from(w);
                l.b.copy_from(b);
            }
        }
        Ok(())
    }

    /// target ← (1−τ)·target + τ·online, parameter by parameter.
    pub(crate) fn soft_update_from(&mut self, online: &Mlp, tau: f32) {
        for (t, o) in self.layers.iter_mut().zip(&online.layers) {
            t.w = t.w.clone() * (1.0 - tau) + o.w.clone() * tau;
            t.b = t.b.clone() * (1.0 - tau) + o.b.clone() * tau;
        }
    }

    /// Global L2 norm of this net's gradients in `grads`; if `max_norm` is set and exceeded,
    /// scales them down to it. Returns the norm before clipping.
    pub(crate) fn clip_grad_norm(
        &self,
        grads: &mut Grads,
        max_norm: Option<f32>,
    ) -> Result<f32, ModelError> {
        let mut sq = 0.0f64;
        for l in &self.layers {
            sq += grads
                .get_or_alloc_mut(&l.w)
                .map_err(backend)?
                .iter()
                .map(|g| f64::from(*g) * f64::from(*g))
                .sum::<f64>();
            sq += grads
                .get_or_alloc_mut(&l.b)
                .map_err(backend)?
                .iter()
                .map(|g| f64::from(*g) * f64::from(*g))
                .sum::<f64>();
        }
        let norm = sq.sqrt() as f32;
        if !norm.is_finite() {
            return Err(ModelError::NonFinite { what: "gradients" });
        }
        if let Some(max) = max_norm {
            if norm > max {
                let scale = max / norm;
                for l in &self.layers {
                    for g in grads.get_or_alloc_mut(&l.w).map_err(backend)?.iter_mut() {
                        *g *= scale;
                    }
                    for g in grads.get_or_alloc_mut(&l.b).map_err(backend)?.iter_mut() {
                        *g *= scale;
                    }
                }
            }
        }
        Ok(norm)
    }
}

/// Adam over one [`Mlp`]. Uses dfdx's Adam kernel, but keeps the moments itself so they can be
/// checkpointed (dfdx 0.13's `optim::Adam` keeps them private).
#[derive(Debug, Clone)]
pub(crate) struct Adam {
    cfg: AdamConfig,
    pub(crate) t: i32,
    m: Grads,
    v: Grads,
}

impl Adam {
    pub(crate) fn new(lr: f64) -> Self {
        Self {
            cfg: AdamConfig {
                lr,
                ..Default::default()
            },
            t: 0,
            m: Gradients::leaky(),
            v: Gradients::leaky(),
        }
    }

    /// One Adam step on `net` with `grads`.
    pub(crate) fn step(&mut self, net: &mut Mlp, grads: &mut Grads) -> Result<(), ModelError> {
        self.t = self.t.saturating_add(1);
        for l in net.layers.iter_mut() {
            let g = grads.get_or_alloc_mut(&l.w).map_err(backend)?;
            let m = self.m.get_or_alloc_mut(&l.w).map_err(backend)?;
            let v = self.v.get_or_alloc_mut(&l.w).map_err(backend)?;
            self.cfg
                .try_update(self.t, &mut l.w, m, v, g)
                .map_err(backend)?;
            let g = grads.get_or_alloc_mut(&l.b).map_err(backend)?;
            let m = self.m.get_or_alloc_mut(&l.b).map_err(backend)?;
            let v = self.v.get_or_alloc_mut(&l.b).map_err(backend)?;
            self.cfg
                .try_update(self.t, &mut l.b, m, v, g)
                .map_err(backend)?;
        }
        Ok(())
    }

    /// First and second moments for `net`'s parameters, in `param_sizes` order.
    pub(crate) fn export(&mut self, net: &Mlp) -> Result<Moments, ModelError> {
        let mut m1 = Vec::new();
        let mut m2 = Vec::new();
        for l in &net.layers {
            m1.push(self.m.get_or_alloc_mut(&l.w).map_err(backend)?.to_vec());
            m1.push(self.m.get_or_alloc_mut(&l.b).map_err(backend)?.to_vec());
            m2.push(self.v.get_or_alloc_mut(&l.w).map_err(backend)?.to_vec());
            m2.push(self.v.get_or_alloc_mut(&l.b).map_err(backend)?.to_vec());
        }
        Ok((m1, m2))
    }

    /// Restores moments exported by [`Adam::export`] (sizes checked by the caller).
    pub(crate) fn import(
        &mut self,
        net: &Mlp,
        t: i32,
        m1: &[Vec<f32>],
        m2: &[Vec<f32>],
    ) -> Result<(), ModelError> {
        self.t = t;
        let mut i = 0;
        for l in &net.layers {
            for (src, dst) in [(m1, &mut self.m), (m2, &mut self.v)] {
                let w = src.get(i).ok_or(ModelError::Truncated("optimizer state"))?;
                let b = src
                    .get(i + 1)
                    .ok_or(ModelError::Truncated("optimizer state"))?;
                let dw = dst.get_or_alloc_mut(&l.w).map_err(backend)?;
                if dw.len() != w.len() {
                    return Err(ModelError::ShapeMismatch {
                        index: i,
                        expected: dw.len(),
                        found: w.len(),
                    });
                }
                dw.copy_from_slice(w);
                let db = dst.get_or_alloc_mut(&l.b).map_err(backend)?;
                if db.len() != b.len() {
                    return Err(ModelError::ShapeMismatch {
                        index: i + 1,
                        expected: db.len(),
                        found: b.len(),
                    });
                }
                db.copy_from_slice(b);
            }
            i += 2;
        }
        Ok(())
    }
}

/// `h·w + b`, `b` added to every row: the values of dfdx's broadcast add, and its gradients
/// accumulated in the same order, so training is bit for bit the same. dfdx walks a broadcast
/// operand element by element through a strided index, forward and backward, and copies a
/// tensor to the host the same way; at the default widths those walks were about a quarter of
/// a training step. Here both passes run over contiguous rows: the product is a new, contiguous
/// tensor (dfdx's matmul allocates its output) and a layer's bias has one value per column.
fn dense<T: Tape<f32, Dev> + Merge<NoneTape>>(h: Mat<T>, l: &Dense) -> Mat<T> {
    let z = h.matmul(l.w.clone());
    let (rows, cols) = *z.shape();
    if l.b.shape().0 != cols {
        // Not a layer's shapes: dfdx's add, which checks them.
        return add_by_broadcast(z, &l.b);
    }
    let (z, mut tape) = z.split_tape();
    let mut bias = vec![0.0; cols];
    l.b.copy_into(&mut bias);
    let mut values = vec![0.0; rows * cols];
    z.copy_into(&mut values);
    for row in values.chunks_exact_mut(cols) {
        for (v, b) in row.iter_mut().zip(&bias) {
            *v += *b;
        }
    }
    let out = z.device().tensor_from_vec(values, (rows, cols));
    let (z_g, b_g, out_g) = (z.ghost(), l.b.ghost(), out.ghost());
    tape.add_backward_op(move |grads| {
        grads.try_alloc_for(&z_g)?;
        grads.try_alloc_for(&b_g)?;
        let go: Vec<f32> = grads.get_or_alloc_mut(&out_g)?.to_vec();
        for (g, o) in grads.get_or_alloc_mut(&z_g)?.iter_mut().zip(&go) {
            *g += *o;
        }
        let gb = grads.get_or_alloc_mut(&b_g)?;
        for row in go.chunks_exact(cols) {
            for (g, o) in gb.iter_mut().zip(row) {
                *g += *o;
            }
        }
        Ok(())
    });
    out.put_tape(tape)
}

/// `z + b`, `b` broadcast over the rows by dfdx's kernel.
fn add_by_broadcast<T: Tape<f32, Dev> + Merge<NoneTape>>(z: Mat<T>, b: &Row) -> Mat<T> {
    let shape = *z.shape();
    z + b.clone().broadcast_like::<_, Axis<0>>(&shape)
}

/// A `(rows, cols)` tensor from row-major host data.
pub(crate) fn mat(dev: &Dev, data: Vec<f32>, rows: usize, cols: usize) -> Mat {
    dev.tensor_from_vec(data, (rows, cols))
}

/// Concatenates `[a, s]` along columns, tape from `a`.
pub(crate) fn concat_cols<T: Tape<f32, Dev> + Merge<NoneTape>>(a: Mat<T>, s: Mat) -> Mat<T> {
    (a, s).concat_along(Axis::<1>)
}

/// Mean squared error and its value.
pub(crate) fn mse(
    pred: Mat<OwnedTape<f32, Dev>>,
    target: Mat,
) -> Tensor<Rank0, f32, Dev, OwnedTape<f32, Dev>> {
    dfdx::losses::mse_loss(pred, target)
}

/// −mean(q).
pub(crate) fn neg_mean(
    q: Mat<OwnedTape<f32, Dev>>,
) -> Tensor<Rank0, f32, Dev, OwnedTape<f32, Dev>> {
    q.negate().mean()
}

/// Starts a gradient tape at `x`.
pub(crate) fn traced(x: Mat) -> Mat<OwnedTape<f32, Dev>> {
    x.traced(Gradients::leaky())
}

/// Backpropagates a scalar loss.
pub(crate) fn backward(loss: Tensor<Rank0, f32, Dev, OwnedTape<f32, Dev>>) -> Grads {
    loss.backward()
}

/// The scalar value of a loss.
pub(crate) fn scalar<T: Tape<f32, Dev>>(loss: &Tensor<Rank0, f32, Dev, T>) -> f32 {
    loss.array()
}

/// Host copy of a tensor.
pub(crate) fn host<T: Tape<f32, Dev>>(x: &Mat<T>) -> Vec<f32> {
    x.as_vec()
}

/// The behaviour-regularised actor loss of TD3+BC (Fujimoto & Gu 2021):
/// `−q_scale·mean(Q(s, a)) + bc_weight·mean((a − behaviour)²)` where `a = μ(s)` carries the
/// actor's tape, `critic` scores `[a, s]`, and `q_scale` (λ / mean|Q|) is a detached constant.
/// Returns the loss and the values of its two terms (mean Q, BC mean squared error).
pub(crate) fn bc_actor_loss(
    a: Mat<OwnedTape<f32, Dev>>,
    s: Mat,
    critic: &Mlp,
    behaviour: Mat,
    q_scale: f32,
    bc_weight: f32,
) -> (Loss, f32, f32) {
    // The same actor output feeds both terms; gradients of both accumulate on its tape.
    let a_bc = a.with_empty_tape();
    let q = critic.forward(concat_cols(a, s));
    let mean_q = q.as_vec().iter().sum::<f32>() / q.shape().0.max(1) as f32;
    let bc = dfdx::losses::mse_loss(a_bc, behaviour);
    let bc_v = bc.array();
    let loss = q.negate().mean() * q_scale + bc * bc_weight;
    (loss, mean_q, bc_v)
}

/// `(tanh(pre), pre)`: the actor's output and a copy of its pre-activation sharing the tape.
pub(crate) fn tanh_and_pre(pre: Traced) -> (Traced, Traced) {
    let copy = pre.with_empty_tape();
    (pre.tanh(), copy)
}

/// `loss + weight·mean(pre²)` where `pre` is a copy of the actor's pre-activation sharing its
/// tape (the gradients of both terms accumulate); `loss` unchanged for weight 0.
pub(crate) fn with_preactivation_penalty(
    loss: Loss,
    pre: Mat<OwnedTape<f32, Dev>>,
    weight: f32,
) -> Loss {
    if weight > 0.0 {
        loss + pre.square().mean() * weight
    } else {
        loss
    }
}

/// A copy of `x` without its tape (no gradients flow through it).
pub(crate) fn detached<T: Tape<f32, Dev>>(x: &Mat<T>) -> Mat {
    x.retaped::<NoneTape>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// A layer as dfdx's broadcast add computes it: the reference for [`dense`].
    fn dense_by_broadcast<T: Tape<f32, Dev> + Merge<NoneTape>>(h: Mat<T>, l: &Dense) -> Mat<T> {
        add_by_broadcast(h.matmul(l.w.clone()), &l.b)
    }

    /// The layers' outputs and every gradient (weights, biases, input) are bit for bit those
    /// of dfdx's broadcast add, so the faster layer changes no trained network.
    #[test]
    fn dense_layers_compute_exactly_what_the_broadcast_add_computes() {
        let dev = Dev::default();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let net = Mlp::new(&dev, &[12, 64, 64, 3], OutAct::Tanh, &mut rng);
        let (rows, cols) = (64, 12);
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-2.0..2.0))
            .collect();
        let target: Vec<f32> = (0..rows * 3).map(|_| rng.random_range(-1.0..1.0)).collect();
        let x = mat(&dev, data, rows, cols);
        let run = |out: Traced| {
            let values = out.as_vec();
            let loss = mse(out, mat(&dev, target.clone(), rows, 3));
            let grads = backward(loss);
            let mut all = vec![values, grads.get(&x).as_vec()];
            for l in &net.layers {
                all.push(grads.get(&l.w).as_vec());
                all.push(grads.get(&l.b).as_vec());
            }
            all
        };
        let fast = run(net.forward(traced(x.clone())));
        let reference = run(net
            .forward_pre_by(traced(x.clone()), dense_by_broadcast)
            .tanh());
        assert_eq!(fast.len(), reference.len());
        for (i, (f, r)) in fast.iter().zip(&reference).enumerate() {
            assert!(f.iter().any(|v| *v != 0.0), "part {i} is all zeros");
            let fb: Vec<u32> = f.iter().map(|v| v.to_bits()).collect();
            let rb: Vec<u32> = r.iter().map(|v| v.to_bits()).collect();
            assert_eq!(fb, rb, "part {i} differs");
        }
        // Without a tape (target networks, acting): the same values.
        let untraced = net.forward(x.clone()).as_vec();
        assert_eq!(untraced, fast[0]);
    }
}
