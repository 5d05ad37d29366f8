//! Tensor-parallel layers (Megatron's split) over a [`tessera::dist::Communicator`]: the
//! weights split across the ranks of a group, the activations whole on every rank.
//!
//! A column-parallel linear layer needs nothing of its own — each rank runs [`gemm`] with its
//! rows of W (its slice of the output features). A row-parallel one ([`row_parallel_linear`])
//! takes the input features split the same way (as a column-parallel layer leaves them) and
//! sums the ranks' products with an all-reduce. [`tp_swiglu`] is a Llama block's SwiGLU MLP
//! so split: gate and up column-parallel, down row-parallel, one all-reduce in all.
//!
//! The GEMMs run on `device`'s stream and the all-reduce on the communicator's; where that is a
//! stream of its own ([`Communicator::with_stream`]), one micro-batch's all-reduce overlaps the
//! next one's GEMMs (the output is ordered between the two streams by cudarc's events).

use crate::gemm::{gemm, Activation, GemmElement};
use tessera::dist::{Communicator, ReduceOp};
use tessera::{Device, Error, Result, Tensor};

fn arg(kernel: &'static str, name: &str, expected: String, found: String) -> Error {
    Error::Argument { kernel, arg: name.into(), expected, found }
}

fn dims2<T: GemmElement>(kernel: &'static str, name: &str, t: &Tensor<T>) -> Result<[usize; 2]> {
    match *t.shape() {
        [a, b] => Ok([a, b]),
        _ => Err(arg(kernel, name, "a 2-D tensor".into(), format!("shape {:?}", t.shape()))),
    }
}

/// `y = Σ_ranks x_shard·w_shardᵀ` over the group: each rank holds the input features it was
/// given (`x_shard` `[M, K/world]`, as a column-parallel layer leaves them) and the matching
/// columns of W (`w_shard` `[N, K/world]`); `y` `[M, N]` ends the same on every rank.
///
/// # Errors
/// [`Error::Argument`] naming the tensor whose shape does not fit; the GEMM's and the
/// collective's own errors.
pub fn row_parallel_linear<T: GemmElement>(
    device: &Device, comm: &Communicator, x_shard: &Tensor<T>, w_shard: &Tensor<T>, y: &mut Tensor<T>,
) -> Result<()> {
    const K: &str = "row_parallel_linear";
    let ([m, k], [n, kw], ys) = (dims2(K, "x_shard", x_shard)?, dims2(K, "w_shard", w_shard)?, dims2(K, "y", y)?);
    if kw != k {
        return Err(arg(K, "w_shard", format!("{k} columns (x_shard's features)"), format!("{kw}")));
    }
    if ys != [m, n] {
        return Err(arg(K, "y", format!("[{m}, {n}]"), format!("{ys:?}")));
    }
    gemm(x_shard, w_shard).run(device, y)?;
    comm.all_reduce_in_place(y, ReduceOp::Sum)
}

/// A Llama block's SwiGLU MLP, `y = (silu(x·W_gᵀ) ⊙ x·W_uᵀ)·W_dᵀ`, split across the group:
/// each rank holds the same rows of W_g and W_u (`[F/world, H]`: its slice of the intermediate
/// features) and those columns of W_d (`w_down` `[H, F/world]`). Per rank: `up = x·W_uᵀ`, the
/// gated GEMM `silu(x·W_gᵀ) ⊙ up` (SiLU and the product in its epilogue), its part of
/// `h·W_dᵀ`; then one all-reduce of `y` `[M, H]`.
///
/// # Errors
/// [`Error::Argument`] naming the tensor whose shape does not fit; the GEMMs' and the
/// collective's own errors.
pub fn tp_swiglu<T: GemmElement>(
    device: &Device, comm: &Communicator, x: &Tensor<T>, w_gate: &Tensor<T>, w_up: &Tensor<T>, w_down: &Tensor<T>, y: &mut Tensor<T>,
) -> Result<()> {
    const K: &str = "tp_swiglu";
    let [m, h] = dims2(K, "x", x)?;
    let ([f, hg], [fu, hu], [hd, fd]) = (dims2(K, "w_gate", w_gate)?, dims2(K, "w_up", w_up)?, dims2(K, "w_down", w_down)?);
    if hg != h || [fu, hu] != [f, h] {
        let (name, found) = if hg != h { ("w_gate", [f, hg]) } else { ("w_up", [fu, hu]) };
        return Err(arg(K, name, format!("[F/world, {h}] (x's width), the same for w_gate and w_up"), format!("{found:?}")));
    }
    if [hd, fd] != [h, f] {
        return Err(arg(K, "w_down", format!("[{h}, {f}] (x's width, w_gate's rows)"), format!("{:?}", [hd, fd])));
    }
    let mut up = Tensor::<T>::scratch(device, &[m, f])?;
    gemm(x, w_up).run(device, &mut up)?;
    let mut gated = Tensor::<T>::scratch(device, &[m, f])?;
    gemm(x, w_gate).activation(Activation::Silu).gate(&up).run(device, &mut gated)?;
    row_parallel_linear(device, comm, &gated, w_down, y)
}
