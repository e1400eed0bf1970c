#pragma once
// fused_attention's math, written once for host and device (MIX_HD): the steps
// both twins take for one query row against its keys, in FP32, whatever the
// storage type of Q, K, V (runtime/ops/fused_attention.cc states the rounding
// points; runtime/ops/cuda/fused_attention.cu runs the same steps in tiles).
//
// For a query row q_i against keys k_j and values v_j, j < n (its visible keys):
//   s_ij  = scale * (q_i . k_j)                    attention_score
//   lse_i = log sum_j exp(s_ij)                    = max + log(sum exp(s - max)), attention_log_sum_exp
//   p_ij  = exp(s_ij - lse_i)                      attention_prob (what the backward recomputes)
//   o_i   = sum_j exp(s_ij - max) v_j / sum_exp    attention_output (the forward's normalisation)
// and backward, from dO and the stored O and LSE:
//   delta_i = dO_i . O_i                           (= sum_j p_ij dp_ij)
//   dp_ij   = dO_i . v_j
//   ds_ij   = p_ij (dp_ij - delta_i)               fn::SoftmaxGradElem, softmax's own gradient step
//   dV_j += p_ij dO_i,  dQ_i += scale ds_ij k_j,  dK_j += scale ds_ij q_i
#include <cmath>
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/kernels/softmax_row.h"

namespace mix::fn {

/// The keys query `query` of t_q attends to among t_k: all of them, or with
/// causal the prefix softmax's causal mask keeps (causal_valid_cols: the last
/// query sees every key, and with t_k > t_q the first t_k - t_q keys are seen
/// by all, as with a cache of earlier positions).
MIX_HD int64_t attention_visible_keys(int64_t query, int64_t t_q, int64_t t_k, bool causal) {
  return causal ? causal_valid_cols(query, t_q, t_k) : t_k;
}

/// One attention logit from the FP32 dot product of a query and a key.
MIX_HD float attention_score(float dot, float scale) { return dot * scale; }

/// The row's log-sum-exp, the statistic the forward saves for the backward,
/// from its max and sum(exp(s - max)) (at least 1, so the log is finite).
MIX_HD float attention_log_sum_exp(float max, float sum_exp) { return max + logf(sum_exp); }

/// A probability recomputed from its logit and the row's log-sum-exp.
MIX_HD float attention_prob(float score, float lse) { return expf(score - lse); }

/// One output value from its sum of exp(s - max)-weighted values and the
/// row's sum(exp(s - max)): normalised once, after the sum over keys.
MIX_HD float attention_output(float weighted_sum, float sum_exp) { return weighted_sum / sum_exp; }

/// The factor that carries a running sum of exp(s - old_max) over to a larger
/// max (online softmax, the CUDA kernels' key tiles): exp(old_max - new_max),
/// and 0 while nothing has been summed (old_max still -inf).
MIX_HD float attention_rescale(float old_max, float new_max) {
  return old_max == -INFINITY ? 0.f : expf(old_max - new_max);
}

}  // namespace mix::fn
