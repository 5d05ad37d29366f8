//! Tessera's kernel library, written in the Tessera DSL. Each kernel is a `#[kernel]`
//! function (its module holds the reflection and the raw launcher) with a safe host function
//! beside it that checks shapes and picks the grid.
//!
//! | host function | what it computes |
//! |---|---|
//! | [`axpy`] | `y ← a·x + y` over a 2-D f32 tensor |
//! | [`row_sum`], [`row_max`], [`row_mean`], [`col_sum`], [`col_max`], [`col_mean`] | per-row and per-column sum, maximum and mean of a 2-D f32 tensor |
//! | [`softmax`], [`softmax_with`], [`softmax_backward`] | numerically stable softmax of each row (bf16/f16/f32), optional scale and causal mask, and its backward pass |
//! | [`gemm`], [`gemm_tn`] | `C = act(alpha·A·Bᵀ + beta·C_in + bias) + residual`, bf16/f16, B N×K or K×N, batches: TMA + wgmma on Hopper, cp.async + mma.sync on sm_80 and later; one triangle of C only on request (SYRK) |
//! | [`gemm_fp8`] | `C = act((A ∘ scale_a)·(B ∘ scale_b)ᵀ + bias)`, A e4m3/e5m2, B e4m3, C bf16/f16/f32 or e4m3/e5m2 with an output scale and the amax ([`Fp8GemmBuilder::run_fp8`]), scales per tensor, per row or per 1×128 / 128×128 block, sums promoted to f32 every 128 of K (the default) (Hopper) |
//! | [`gemm_grouped`], [`gemm_fp8_grouped`] | mixture-of-experts grouped GEMM, one launch over the experts, their row counts on the device (cumulative ends): bf16/f16 (B `[E, N, K]` or `[E, K, N]`) and fp8 with tensor or row scales (Hopper) |
//! | [`gemm_bsr`] | block-sparse × dense, A in block-CSR with 128×128 or 64×64 blocks ([`Bsr`]), each tile's K loop over its row's nonzero blocks only (Hopper) |
//! | [`bias_gelu`] | `y = gelu(x + bias)`, the unfused epilogue |
//! | [`rms_norm`] | `y = x / sqrt(mean(x²) + eps) · weight` per row, bf16/f16/f32, f32 statistics |
//! | [`rope`], [`rope_in_place`], [`rope_backward`] | rotary position embedding of query/key heads, half-split or interleaved, `[b, s, h, d]` or `[b, h, s, d]`, angles computed or from [`rope_cache`] |
//! | [`Norm`] | fused RMSNorm/LayerNorm: Philox dropout, residual add returning the new residual, weight, bias, scale and shift; forward and backward (`dx`, `dweight`, `dbias`) |
//! | [`attention`], [`attention_with_lse`], [`attention_varlen`] | FlashAttention forward: bf16/f16, `[b, s, h, d]` or `[b, h, s, d]` or sequences packed end to end, causal or not, grouped-query heads, different query and key lengths, the log-sum-exp for a backward pass (Hopper) |
//! | [`layer_norm`] | `y = (x − mean) / sqrt(var + eps) · weight + bias` per row, bf16/f16/f32, f32 statistics |
//! | [`LinearAttention`] | causal linear attention, chunked, with a scalar decay a step and β (RetNet, simple GLA), per-channel gates (GLA) and a feature map on q and k: forward, backward, decode step (Hopper) |
//! | [`Conv1d`] | depthwise 1-D convolution along the last axis (`full`, `same`, `causal`; PyTorch's `conv1d` weights too), with a bias, a skip term `D·x`, SiLU and a gate fused; forward and backward (`dx`, `dk`, and the terms'); a direct path, cuFFT's (forward, GPU) and a tensor-core FFT in the language ([`fft`]; forward, Hopper, bf16/f16, `L + Lk − 1 ≤ 131072`); on the transform paths the filters' spectrum made once and reused ([`ConvSpectrum`]) |
//! | [`Ssd`] | Mamba-2's state-space duality on the linear attention's kernels: forward and backward (Hopper) |
//! | [`ring::ring_attention`] | context-parallel (ring) attention forward and backward ([`ring::ring_attention_backward`]) over a [`tessera::dist::Communicator`]: the sequence split across the group (zig-zag for causal), key/value blocks passed round the ring, each step's output merged by its log-sum-exp |
//! | [`tp::tp_swiglu`], [`tp::row_parallel_linear`] | tensor-parallel layers over a [`tessera::dist::Communicator`]: a SwiGLU MLP with its weights split across the group (gate and up by rows, down by columns), one all-reduce |
//! | [`quantize_fp8`], [`dequantize_fp8`] | `y = x · scale` to fp8 ([`tessera::F8E4M3`], [`tessera::F8E5M2`]; round to nearest even, saturating, as the GPU's `cvt`) and back (sm_89 and later) |
#![warn(missing_docs)]

mod attention;
mod conv;
mod elementwise;
pub mod fft;
mod fp8;
mod gemm;
mod linear_attention;
mod norm;
mod norm_fused;
pub mod prelude;
mod reduce;
pub mod ring;
mod rope;
mod scan;
mod selective_scan;
mod softmax;
mod ssd;
pub mod tp;

pub use attention::{
    attention, attention_backward, attention_dropout_keep, attention_variants, attention_varlen, attention_varlen_backward,
    attention_with_lse, check_cu_seqlens, Attention, AttentionElement, AttentionGrads, AttentionKernel, AttentionLayout,
    ATTENTION_KERNEL_PARAMS,
};
pub use conv::{Conv1d, Conv1dGrads, ConvElement, ConvMode, ConvPath, ConvSpectrum, TensorCoreConv, CONV_TENSOR_CORE_MAX};
pub use elementwise::axpy;
pub use fp8::{dequantize_fp8, quantize_fp8, Fp8Element, Fp8Source};
pub use gemm::{
    bias_gelu, gemm, gemm_bsr, gemm_bsr_variants, gemm_fp8, gemm_fp8_grouped, gemm_fp8_grouped_variants, gemm_fp8_variants, gemm_grouped,
    gemm_grouped_variants, gemm_tn, gemm_triangle_variants, gemm_variants, Activation, BLayout, Bias, Bsr, BsrGemmBuilder, Fp8Gemm,
    Fp8GemmBuilder, Fp8GroupedGemm, Fp8GroupedGemmBuilder, Fp8GroupedScaling, Fp8QuantizedGemm, Fp8Scaling, GemmBuilder, GemmElement,
    GroupedGemmBuilder, Triangle, BSR_BLOCK, BSR_BLOCKS, GROUPED_GEMM_MAX_EXPERTS,
};
pub use linear_attention::{FeatureMap, LinearAttention, LinearAttentionElement, LinearAttentionGrads};
pub use norm::{layer_norm, rms_norm, NormElement, NormPath, NORM_WIDE_MAX, ROW_IN_REGISTERS, ROW_PER_BLOCK_MAX};
pub use norm_fused::{Dropout, FusedSpecs, Norm, NormGrads, NormKind, FUSED_BACKWARD_ROW_IN_REGISTERS, FUSED_ROW_IN_REGISTERS};
pub use reduce::{col_max, col_mean, col_sum, row_max, row_mean, row_sum};
pub use rope::{
    rope, rope_backward, rope_backward_in_place, rope_cache, rope_in_place, HeadLayout, Positions, Rope, RopeElement, RopeStyle,
};
pub use scan::{cumprod, cumprod_backward, cumsum, cumsum_backward, logcumsumexp, logcumsumexp_backward, ScanElement};
pub use selective_scan::{SavedScan, SelectiveScan, SelectiveScanElement, SelectiveScanGrads};
pub use softmax::{softmax, softmax_backward, softmax_with, SoftmaxElement, SoftmaxOptions, SOFTMAX_ROW_MAX};
pub use ssd::{Ssd, SsdElement, SsdGrads};

/// The library's generated kernel modules, one per `#[kernel]` and dtype (`gemm_tn_bf16`,
/// `softmax_rows4_f16`, …): each holds its reflection and PTX (`SPEC`, `VARIANTS`) and its raw,
/// checked launcher (`launch`, `launch_variant`). The functions and builders at the crate root
/// pick among them and launch them; these are for tools and for launching one variant by hand.
pub mod kernels {
    pub use crate::attention::{
        attention_bwd_dkv_bf16, attention_bwd_dkv_f16, attention_bwd_dkv_mods_bf16, attention_bwd_dkv_mods_f16,
        attention_bwd_dkv_wide_bf16, attention_bwd_dkv_wide_f16, attention_bwd_dkv_wide_mods_bf16, attention_bwd_dkv_wide_mods_f16,
        attention_bwd_dot_bf16, attention_bwd_dot_f16, attention_bwd_dq_bf16, attention_bwd_dq_f16, attention_bwd_dq_mods_bf16,
        attention_bwd_dq_mods_f16, attention_bwd_dq_out_bf16, attention_bwd_dq_out_f16, attention_combine_bf16, attention_combine_f16,
        flash_attention_bf16, flash_attention_f16, flash_attention_mods_bf16, flash_attention_mods_f16, flash_attention_varlen_bf16,
        flash_attention_varlen_f16, flash_attention_varlen_mods_bf16, flash_attention_varlen_mods_f16,
    };
    pub use crate::conv::{
        conv1d_direct_bf16, conv1d_direct_f16, conv1d_direct_f32, conv1d_direct_grads_bf16, conv1d_direct_grads_f16,
        conv1d_direct_grads_f32, conv1d_short_bf16, conv1d_short_f16, conv1d_short_f32, conv1d_short_grads_bf16, conv1d_short_grads_f16,
        conv1d_short_grads_f32, conv_copy_rows_bf16, conv_copy_rows_f16, conv_fft_filter, conv_fft_finish_bf16, conv_fft_finish_f16,
        conv_fft_finish_f32, conv_fft_pad_bf16, conv_fft_pad_f16, conv_fft_pad_f32, conv_fft_product, conv_fft_tc_bf16,
        conv_fft_tc_combine_bf16, conv_fft_tc_combine_f16, conv_fft_tc_f16, conv_fft_tc_filter, conv_fft_tc_long_bf16,
        conv_fft_tc_long_f16, conv_fft_tc_long_filter, conv_fft_wrap,
    };
    pub use crate::elementwise::{axpy_f32, to_f32_bf16, to_f32_f16};
    pub use crate::fp8::{
        dequantize_f8e4m3_bf16, dequantize_f8e4m3_f16, dequantize_f8e4m3_f32, dequantize_f8e5m2_bf16, dequantize_f8e5m2_f16,
        dequantize_f8e5m2_f32, quantize_bf16_f8e4m3, quantize_bf16_f8e5m2, quantize_f16_f8e4m3, quantize_f16_f8e5m2, quantize_f32_f8e4m3,
        quantize_f32_f8e5m2,
    };
    pub use crate::gemm::{
        bias_gelu_bf16, gemm_bsr64_bf16, gemm_bsr64_f16, gemm_bsr_bf16, gemm_bsr_f16, gemm_fp8_f32_f8e4m3, gemm_fp8_f32_f8e5m2,
        gemm_fp8_f8e4m3_bf16, gemm_fp8_f8e4m3_f16, gemm_fp8_f8e5m2_bf16, gemm_fp8_f8e5m2_f16, gemm_fp8_grouped_f8e4m3_bf16,
        gemm_fp8_grouped_f8e4m3_f16, gemm_fp8_grouped_f8e5m2_bf16, gemm_fp8_grouped_f8e5m2_f16, gemm_fp8_grouped_promoted_f8e4m3_bf16,
        gemm_fp8_grouped_promoted_f8e4m3_f16, gemm_fp8_grouped_promoted_f8e5m2_bf16, gemm_fp8_grouped_promoted_f8e5m2_f16,
        gemm_fp8_promoted_f32_f8e4m3, gemm_fp8_promoted_f32_f8e5m2, gemm_fp8_promoted_f8e4m3_bf16, gemm_fp8_promoted_f8e4m3_f16,
        gemm_fp8_promoted_f8e5m2_bf16, gemm_fp8_promoted_f8e5m2_f16, gemm_fp8_promoted_q_f8e4m3_f8e4m3, gemm_fp8_promoted_q_f8e4m3_f8e5m2,
        gemm_fp8_promoted_q_f8e5m2_f8e4m3, gemm_fp8_promoted_q_f8e5m2_f8e5m2, gemm_fp8_q_f8e4m3_f8e4m3, gemm_fp8_q_f8e4m3_f8e5m2,
        gemm_fp8_q_f8e5m2_f8e4m3, gemm_fp8_q_f8e5m2_f8e5m2, gemm_grouped_bf16, gemm_grouped_f16, gemm_grouped_nn_bf16, gemm_grouped_nn_f16,
        gemm_nn_bf16, gemm_nn_f16, gemm_nn_full_bf16, gemm_nn_full_f16, gemm_small_m_bf16, gemm_small_m_f16, gemm_tn_bf16, gemm_tn_f16,
        gemm_tn_full_bf16, gemm_tn_full_f16, gemm_tn_triangle_bf16, gemm_tn_triangle_f16, pad_copy_bf16, pad_copy_f16,
    };
    pub use crate::linear_attention::{
        cast_from_f32_bf16, cast_from_f32_f16, chunk_decay_sums, feature_map_rows_bf16, feature_map_rows_f16, gla_finish_bf16,
        gla_finish_f16, gla_prepare_bf16, gla_prepare_f16, linear_attention_bwd_dkv_bf16, linear_attention_bwd_dkv_f16,
        linear_attention_bwd_dkv_v64_bf16, linear_attention_bwd_dkv_v64_f16, linear_attention_bwd_dq_bf16, linear_attention_bwd_dq_f16,
        linear_attention_bwd_dq_v64_bf16, linear_attention_bwd_dq_v64_f16, linear_attention_fwd_bf16, linear_attention_fwd_f16,
        linear_attention_fwd_v64_bf16, linear_attention_fwd_v64_f16, linear_attention_step_bf16, linear_attention_step_f16,
    };
    pub use crate::norm::{
        layer_norm_bf16, layer_norm_f16, layer_norm_f32, layer_norm_row_bf16, layer_norm_row_f16, layer_norm_row_f32,
        layer_norm_rows2_bf16, layer_norm_rows2_f16, layer_norm_rows2_f32, layer_norm_rows4_bf16, layer_norm_rows4_f16,
        layer_norm_rows4_f32, layer_norm_wide_bf16, layer_norm_wide_f16, layer_norm_wide_f32, rms_norm_bf16, rms_norm_f16, rms_norm_f32,
        rms_norm_row_bf16, rms_norm_row_f16, rms_norm_row_f32, rms_norm_rows2_bf16, rms_norm_rows2_f16, rms_norm_rows2_f32,
        rms_norm_rows4_bf16, rms_norm_rows4_f16, rms_norm_rows4_f32, rms_norm_wide_bf16, rms_norm_wide_f16, rms_norm_wide_f32,
    };
    pub use crate::norm_fused::{
        norm_backward_halves_bf16, norm_backward_halves_f16, norm_backward_halves_f32, norm_backward_row_bf16, norm_backward_row_f16,
        norm_backward_row_f32, norm_backward_rows4_bf16, norm_backward_rows4_f16, norm_backward_rows4_f32, norm_backward_rows_bf16,
        norm_backward_rows_f16, norm_backward_rows_f32, norm_backward_staged_bf16, norm_backward_staged_f16, norm_backward_staged_f32,
        norm_backward_wide_bf16, norm_backward_wide_f16, norm_backward_wide_f32, norm_fused_row_bf16, norm_fused_row_f16,
        norm_fused_row_f32, norm_fused_rows4_bf16, norm_fused_rows4_f16, norm_fused_rows4_f32, norm_fused_wide_bf16, norm_fused_wide_f16,
        norm_fused_wide_f32, sum_partials_bf16, sum_partials_f16, sum_partials_f32,
    };
    pub use crate::reduce::{col_max_f32, col_sum_f32, row_max_f32, row_sum_f32, scale_f32};
    pub use crate::ring::{
        attention_merge_bf16, attention_merge_f16, attention_merge_finish_bf16, attention_merge_finish_f16, ring_accumulate_bf16,
        ring_accumulate_f16, ring_cast_bf16, ring_cast_f16, ring_copy_rows_bf16, ring_copy_rows_f16, ring_copy_rows_f32,
    };
    pub use crate::rope::{rope_half_bf16, rope_half_f16, rope_half_f32, rope_pairs_bf16, rope_pairs_f16, rope_pairs_f32};
    pub use crate::scan::{
        cumprod_backward_bf16, cumprod_backward_f16, cumprod_backward_f32, cumprod_bf16, cumprod_f16, cumprod_f32, cumsum_bf16, cumsum_f16,
        cumsum_f32, cumsum_reverse_bf16, cumsum_reverse_f16, cumsum_reverse_f32, logcumsumexp_backward_bf16, logcumsumexp_backward_f16,
        logcumsumexp_backward_f32, logcumsumexp_bf16, logcumsumexp_f16, logcumsumexp_f32,
    };
    pub use crate::selective_scan::{
        selective_scan_bwd_bf16, selective_scan_bwd_f32, selective_scan_bwd_rows_bf16, selective_scan_bwd_rows_f32,
        selective_scan_fwd_bf16, selective_scan_fwd_f32, selective_scan_fwd_rows_bf16, selective_scan_fwd_rows_f32,
        selective_scan_seg_carry, selective_scan_step_bf16, selective_scan_step_f32,
    };
    pub use crate::softmax::{
        softmax_backward_bf16, softmax_backward_f16, softmax_backward_f32, softmax_backward_row_bf16, softmax_backward_row_f16,
        softmax_backward_row_f32, softmax_backward_rows4_bf16, softmax_backward_rows4_f16, softmax_backward_rows4_f32, softmax_bf16,
        softmax_f16, softmax_f32, softmax_row_bf16, softmax_row_f16, softmax_row_f32, softmax_rows4_bf16, softmax_rows4_f16,
        softmax_rows4_f32,
    };
    pub use crate::ssd::{ssd_steps_backward_bf16, ssd_steps_backward_f16, ssd_steps_bf16, ssd_steps_f16};
}

use kernels::*;

/// Every kernel of the library, for tools that check them all (ptxas, dumps).
pub fn all_kernels() -> Vec<&'static tessera::KernelSpec> {
    [
        axpy_f32::VARIANTS,
        attention_merge_bf16::VARIANTS,
        attention_merge_f16::VARIANTS,
        attention_merge_finish_bf16::VARIANTS,
        attention_merge_finish_f16::VARIANTS,
        ring_copy_rows_bf16::VARIANTS,
        ring_copy_rows_f16::VARIANTS,
        ring_copy_rows_f32::VARIANTS,
        ring_accumulate_bf16::VARIANTS,
        ring_accumulate_f16::VARIANTS,
        ring_cast_bf16::VARIANTS,
        ring_cast_f16::VARIANTS,
        row_sum_f32::VARIANTS,
        row_max_f32::VARIANTS,
        col_sum_f32::VARIANTS,
        col_max_f32::VARIANTS,
        scale_f32::VARIANTS,
        cumsum_bf16::VARIANTS,
        cumsum_f16::VARIANTS,
        cumsum_f32::VARIANTS,
        cumsum_reverse_bf16::VARIANTS,
        cumsum_reverse_f16::VARIANTS,
        cumsum_reverse_f32::VARIANTS,
        cumprod_bf16::VARIANTS,
        cumprod_f16::VARIANTS,
        cumprod_f32::VARIANTS,
        logcumsumexp_bf16::VARIANTS,
        logcumsumexp_f16::VARIANTS,
        logcumsumexp_f32::VARIANTS,
        cumprod_backward_bf16::VARIANTS,
        cumprod_backward_f16::VARIANTS,
        cumprod_backward_f32::VARIANTS,
        logcumsumexp_backward_bf16::VARIANTS,
        logcumsumexp_backward_f16::VARIANTS,
        logcumsumexp_backward_f32::VARIANTS,
        selective_scan_fwd_bf16::VARIANTS,
        selective_scan_fwd_f32::VARIANTS,
        selective_scan_fwd_rows_bf16::VARIANTS,
        selective_scan_fwd_rows_f32::VARIANTS,
        selective_scan_seg_carry::VARIANTS,
        selective_scan_bwd_rows_bf16::VARIANTS,
        selective_scan_bwd_rows_f32::VARIANTS,
        selective_scan_step_bf16::VARIANTS,
        selective_scan_step_f32::VARIANTS,
        selective_scan_bwd_bf16::VARIANTS,
        selective_scan_bwd_f32::VARIANTS,
        to_f32_bf16::VARIANTS,
        conv1d_direct_bf16::VARIANTS,
        conv1d_direct_f16::VARIANTS,
        conv1d_direct_f32::VARIANTS,
        conv1d_direct_grads_bf16::VARIANTS,
        conv1d_direct_grads_f16::VARIANTS,
        conv1d_direct_grads_f32::VARIANTS,
        conv1d_short_bf16::VARIANTS,
        conv1d_short_f16::VARIANTS,
        conv1d_short_f32::VARIANTS,
        conv1d_short_grads_bf16::VARIANTS,
        conv1d_short_grads_f16::VARIANTS,
        conv1d_short_grads_f32::VARIANTS,
        conv_fft_pad_bf16::VARIANTS,
        conv_fft_pad_f16::VARIANTS,
        conv_fft_pad_f32::VARIANTS,
        conv_fft_filter::VARIANTS,
        conv_fft_product::VARIANTS,
        conv_fft_tc_filter::VARIANTS,
        conv_copy_rows_bf16::VARIANTS,
        conv_copy_rows_f16::VARIANTS,
        conv_fft_wrap::VARIANTS,
        conv_fft_tc_bf16::VARIANTS,
        conv_fft_tc_f16::VARIANTS,
        conv_fft_tc_long_filter::VARIANTS,
        conv_fft_tc_long_bf16::VARIANTS,
        conv_fft_tc_long_f16::VARIANTS,
        conv_fft_tc_combine_bf16::VARIANTS,
        conv_fft_tc_combine_f16::VARIANTS,
        conv_fft_finish_bf16::VARIANTS,
        conv_fft_finish_f16::VARIANTS,
        conv_fft_finish_f32::VARIANTS,
        to_f32_f16::VARIANTS,
        attention_bwd_dot_bf16::VARIANTS,
        attention_bwd_dot_f16::VARIANTS,
        attention_bwd_dq_bf16::VARIANTS,
        attention_bwd_dq_f16::VARIANTS,
        attention_bwd_dkv_bf16::VARIANTS,
        attention_bwd_dkv_f16::VARIANTS,
        attention_bwd_dq_out_bf16::VARIANTS,
        attention_bwd_dq_out_f16::VARIANTS,
        attention_bwd_dq_mods_bf16::VARIANTS,
        attention_bwd_dq_mods_f16::VARIANTS,
        attention_bwd_dkv_mods_bf16::VARIANTS,
        attention_bwd_dkv_mods_f16::VARIANTS,
        attention_bwd_dkv_wide_bf16::VARIANTS,
        attention_bwd_dkv_wide_f16::VARIANTS,
        attention_bwd_dkv_wide_mods_bf16::VARIANTS,
        attention_bwd_dkv_wide_mods_f16::VARIANTS,
        linear_attention_fwd_bf16::VARIANTS,
        linear_attention_fwd_f16::VARIANTS,
        linear_attention_fwd_v64_bf16::VARIANTS,
        linear_attention_fwd_v64_f16::VARIANTS,
        linear_attention_bwd_dq_bf16::VARIANTS,
        linear_attention_bwd_dq_f16::VARIANTS,
        linear_attention_bwd_dq_v64_bf16::VARIANTS,
        linear_attention_bwd_dq_v64_f16::VARIANTS,
        linear_attention_bwd_dkv_bf16::VARIANTS,
        linear_attention_bwd_dkv_f16::VARIANTS,
        linear_attention_bwd_dkv_v64_bf16::VARIANTS,
        linear_attention_bwd_dkv_v64_f16::VARIANTS,
        linear_attention_step_bf16::VARIANTS,
        linear_attention_step_f16::VARIANTS,
        chunk_decay_sums::VARIANTS,
        cast_from_f32_bf16::VARIANTS,
        cast_from_f32_f16::VARIANTS,
        feature_map_rows_bf16::VARIANTS,
        feature_map_rows_f16::VARIANTS,
        gla_prepare_bf16::VARIANTS,
        gla_prepare_f16::VARIANTS,
        gla_finish_bf16::VARIANTS,
        gla_finish_f16::VARIANTS,
        ssd_steps_bf16::VARIANTS,
        ssd_steps_f16::VARIANTS,
        ssd_steps_backward_bf16::VARIANTS,
        ssd_steps_backward_f16::VARIANTS,
        softmax_bf16::VARIANTS,
        softmax_f16::VARIANTS,
        softmax_f32::VARIANTS,
        softmax_row_bf16::VARIANTS,
        softmax_row_f16::VARIANTS,
        softmax_row_f32::VARIANTS,
        softmax_rows4_bf16::VARIANTS,
        softmax_rows4_f16::VARIANTS,
        softmax_rows4_f32::VARIANTS,
        softmax_backward_bf16::VARIANTS,
        softmax_backward_f16::VARIANTS,
        softmax_backward_f32::VARIANTS,
        softmax_backward_row_bf16::VARIANTS,
        softmax_backward_row_f16::VARIANTS,
        softmax_backward_row_f32::VARIANTS,
        softmax_backward_rows4_bf16::VARIANTS,
        softmax_backward_rows4_f16::VARIANTS,
        softmax_backward_rows4_f32::VARIANTS,
        gemm_tn_bf16::VARIANTS,
        gemm_tn_f16::VARIANTS,
        gemm_nn_bf16::VARIANTS,
        gemm_nn_f16::VARIANTS,
        gemm_tn_full_bf16::VARIANTS,
        gemm_tn_full_f16::VARIANTS,
        gemm_nn_full_bf16::VARIANTS,
        gemm_nn_full_f16::VARIANTS,
        gemm_small_m_bf16::VARIANTS,
        gemm_small_m_f16::VARIANTS,
        gemm_tn_triangle_bf16::VARIANTS,
        gemm_tn_triangle_f16::VARIANTS,
        gemm_grouped_bf16::VARIANTS,
        gemm_grouped_f16::VARIANTS,
        gemm_grouped_nn_bf16::VARIANTS,
        gemm_grouped_nn_f16::VARIANTS,
        gemm_bsr_bf16::VARIANTS,
        gemm_bsr_f16::VARIANTS,
        gemm_bsr64_bf16::VARIANTS,
        gemm_bsr64_f16::VARIANTS,
        gemm_fp8_grouped_f8e4m3_bf16::VARIANTS,
        gemm_fp8_grouped_f8e4m3_f16::VARIANTS,
        gemm_fp8_grouped_f8e5m2_bf16::VARIANTS,
        gemm_fp8_grouped_f8e5m2_f16::VARIANTS,
        gemm_fp8_grouped_promoted_f8e4m3_bf16::VARIANTS,
        gemm_fp8_grouped_promoted_f8e4m3_f16::VARIANTS,
        gemm_fp8_grouped_promoted_f8e5m2_bf16::VARIANTS,
        gemm_fp8_grouped_promoted_f8e5m2_f16::VARIANTS,
        gemm_fp8_f8e4m3_bf16::VARIANTS,
        gemm_fp8_f8e4m3_f16::VARIANTS,
        gemm_fp8_f8e5m2_bf16::VARIANTS,
        gemm_fp8_f8e5m2_f16::VARIANTS,
        gemm_fp8_promoted_f8e4m3_bf16::VARIANTS,
        gemm_fp8_promoted_f8e4m3_f16::VARIANTS,
        gemm_fp8_promoted_f8e5m2_bf16::VARIANTS,
        gemm_fp8_promoted_f8e5m2_f16::VARIANTS,
        gemm_fp8_f32_f8e4m3::VARIANTS,
        gemm_fp8_f32_f8e5m2::VARIANTS,
        gemm_fp8_promoted_f32_f8e4m3::VARIANTS,
        gemm_fp8_promoted_f32_f8e5m2::VARIANTS,
        gemm_fp8_q_f8e4m3_f8e4m3::VARIANTS,
        gemm_fp8_q_f8e4m3_f8e5m2::VARIANTS,
        gemm_fp8_q_f8e5m2_f8e4m3::VARIANTS,
        gemm_fp8_q_f8e5m2_f8e5m2::VARIANTS,
        gemm_fp8_promoted_q_f8e4m3_f8e4m3::VARIANTS,
        gemm_fp8_promoted_q_f8e4m3_f8e5m2::VARIANTS,
        gemm_fp8_promoted_q_f8e5m2_f8e4m3::VARIANTS,
        gemm_fp8_promoted_q_f8e5m2_f8e5m2::VARIANTS,
        pad_copy_bf16::VARIANTS,
        pad_copy_f16::VARIANTS,
        bias_gelu_bf16::VARIANTS,
        rms_norm_bf16::VARIANTS,
        rms_norm_f16::VARIANTS,
        rms_norm_f32::VARIANTS,
        rms_norm_wide_bf16::VARIANTS,
        rms_norm_wide_f16::VARIANTS,
        rms_norm_wide_f32::VARIANTS,
        layer_norm_wide_bf16::VARIANTS,
        layer_norm_wide_f16::VARIANTS,
        layer_norm_wide_f32::VARIANTS,
        layer_norm_bf16::VARIANTS,
        layer_norm_f16::VARIANTS,
        layer_norm_f32::VARIANTS,
        rms_norm_row_bf16::VARIANTS,
        rms_norm_row_f16::VARIANTS,
        rms_norm_row_f32::VARIANTS,
        layer_norm_row_bf16::VARIANTS,
        layer_norm_row_f16::VARIANTS,
        layer_norm_row_f32::VARIANTS,
        rms_norm_rows4_bf16::VARIANTS,
        rms_norm_rows4_f16::VARIANTS,
        rms_norm_rows4_f32::VARIANTS,
        layer_norm_rows4_bf16::VARIANTS,
        layer_norm_rows4_f16::VARIANTS,
        layer_norm_rows4_f32::VARIANTS,
        rms_norm_rows2_bf16::VARIANTS,
        rms_norm_rows2_f16::VARIANTS,
        rms_norm_rows2_f32::VARIANTS,
        layer_norm_rows2_bf16::VARIANTS,
        layer_norm_rows2_f16::VARIANTS,
        layer_norm_rows2_f32::VARIANTS,
        norm_fused_rows4_bf16::VARIANTS,
        norm_fused_rows4_f16::VARIANTS,
        norm_fused_rows4_f32::VARIANTS,
        norm_fused_row_bf16::VARIANTS,
        norm_fused_row_f16::VARIANTS,
        norm_fused_row_f32::VARIANTS,
        norm_fused_wide_bf16::VARIANTS,
        norm_fused_wide_f16::VARIANTS,
        norm_fused_wide_f32::VARIANTS,
        norm_backward_row_bf16::VARIANTS,
        norm_backward_row_f16::VARIANTS,
        norm_backward_row_f32::VARIANTS,
        norm_backward_rows_bf16::VARIANTS,
        norm_backward_rows_f16::VARIANTS,
        norm_backward_rows_f32::VARIANTS,
        norm_backward_rows4_bf16::VARIANTS,
        norm_backward_rows4_f16::VARIANTS,
        norm_backward_rows4_f32::VARIANTS,
        norm_backward_halves_bf16::VARIANTS,
        norm_backward_halves_f16::VARIANTS,
        norm_backward_halves_f32::VARIANTS,
        norm_backward_staged_bf16::VARIANTS,
        norm_backward_staged_f16::VARIANTS,
        norm_backward_staged_f32::VARIANTS,
        norm_backward_wide_bf16::VARIANTS,
        norm_backward_wide_f16::VARIANTS,
        norm_backward_wide_f32::VARIANTS,
        sum_partials_bf16::VARIANTS,
        sum_partials_f16::VARIANTS,
        sum_partials_f32::VARIANTS,
        rope_half_bf16::VARIANTS,
        rope_half_f16::VARIANTS,
        rope_half_f32::VARIANTS,
        rope_pairs_bf16::VARIANTS,
        rope_pairs_f16::VARIANTS,
        rope_pairs_f32::VARIANTS,
        flash_attention_bf16::VARIANTS,
        flash_attention_f16::VARIANTS,
        flash_attention_varlen_bf16::VARIANTS,
        flash_attention_mods_bf16::VARIANTS,
        flash_attention_mods_f16::VARIANTS,
        flash_attention_varlen_f16::VARIANTS,
        flash_attention_varlen_mods_bf16::VARIANTS,
        flash_attention_varlen_mods_f16::VARIANTS,
        attention_combine_bf16::VARIANTS,
        attention_combine_f16::VARIANTS,
        quantize_bf16_f8e4m3::VARIANTS,
        quantize_bf16_f8e5m2::VARIANTS,
        quantize_f16_f8e4m3::VARIANTS,
        quantize_f16_f8e5m2::VARIANTS,
        quantize_f32_f8e4m3::VARIANTS,
        quantize_f32_f8e5m2::VARIANTS,
        dequantize_f8e4m3_bf16::VARIANTS,
        dequantize_f8e4m3_f16::VARIANTS,
        dequantize_f8e4m3_f32::VARIANTS,
        dequantize_f8e5m2_bf16::VARIANTS,
        dequantize_f8e5m2_f16::VARIANTS,
        dequantize_f8e5m2_f32::VARIANTS,
    ]
    .concat()
}

/// The variant of a `tune(..)` kernel whose `knob` is `value`, or an [`tessera::Error::Argument`]
/// of `kernel` naming `arg`, what was `expected` and the value found as `found`.
pub(crate) fn knob_variant(
    variants: &[&tessera::KernelSpec], knob: &str, value: usize, kernel: &'static str, arg: &str, expected: &str, found: String,
) -> tessera::Result<usize> {
    variants.iter().position(|v| v.knob(knob) == Some(value as i64)).ok_or_else(|| tessera::Error::Argument {
        kernel,
        arg: arg.into(),
        expected: expected.into(),
        found,
    })
}
/// Checks that `t` is a 2-D tensor, naming the argument otherwise.
pub(crate) fn check_2d<T: tessera::Element>(kernel: &'static str, arg: &str, t: &tessera::Tensor<T>) -> tessera::Result<(usize, usize)> {
    match *t.shape() {
        [m, n] => Ok((m, n)),
        _ => Err(tessera::Error::Argument {
            kernel,
            arg: arg.into(),
            expected: "a 2-D tensor".into(),
            found: format!("shape {:?}", t.shape()),
        }),
    }
}

/// Rows to normalize hold at least one element: a mean, a variance or a softmax over none is
/// undefined (an empty batch, no rows at all, is nothing to do and fine).
pub(crate) fn check_row_width<T: tessera::Element>(
    kernel: &'static str, arg: &str, t: &tessera::Tensor<T>, n: usize,
) -> tessera::Result<()> {
    if n > 0 {
        return Ok(());
    }
    Err(tessera::Error::Argument {
        kernel,
        arg: arg.into(),
        expected: "rows of at least one element (a mean or a softmax over none is undefined)".into(),
        found: format!("shape {:?}", t.shape()),
    })
}

/// Checks that `got` has the shape `want`, naming the argument otherwise.
pub(crate) fn check_shape<T: tessera::Element>(
    kernel: &'static str, arg: &str, t: &tessera::Tensor<T>, want: &[usize],
) -> tessera::Result<()> {
    if t.shape() == want {
        Ok(())
    } else {
        Err(tessera::Error::Argument {
            kernel,
            arg: arg.into(),
            expected: format!("shape {want:?}"),
            found: format!("shape {:?}", t.shape()),
        })
    }
}
