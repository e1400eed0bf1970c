#pragma once
// Elementwise math written once for host and device (MIX_HD). CPU kernels run
// these in plain loops (cpu_loops.h); CUDA launchers run the same functors in
// grid-stride loops, so the GPU's arithmetic is tested on the CPU too.
//
// Functors compute in float; storage conversion (rounding to FP16/BF16 on
// store) is the loop's job, exactly where a GPU kernel rounds.
#include <cmath>
#include <cstdint>

#include "runtime/core/half.h"

namespace mix::fn {

MIX_HD bool is_finite(float x) {
#ifdef __CUDA_ARCH__
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// ---- images -------------------------------------------------------------------
/// torchvision's ToTensor then Normalize of one 8-bit pixel value of channel
/// c: (v / 255 - mean) / std, the same float operations in the same order, so
/// the result is torchvision's to the bit. The host's normalisation and the
/// image_normalize op (CPU and CUDA) all run it, so their values are equal to
/// the bit too: there is no multiply for nvcc to contract into an FMA, and the
/// device's divisions and subtraction are spelled as IEEE round-to-nearest
/// (__fdiv_rn, __fsub_rn), so no fast-math flag can make them approximate.
struct NormalizePixel {
  float mean, stddev;
  MIX_HD float operator()(uint8_t v) const {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(__fsub_rn(__fdiv_rn(static_cast<float>(v), 255.0f), mean), stddev);
#else
    return (static_cast<float>(v) / 255.0f - mean) / stddev;
#endif
  }
};

// ---- activations: forward f(x), backward g(x or y, dy) ------------------------
/// max(x, 0) that lets a NaN through, as PyTorch's relu: a NaN activation
/// (an FP16 overflow met by inf - inf) must reach the loss and the overflow
/// check, not be zeroed here and trained on silently.
struct ReluFwd {
  MIX_HD float operator()(float x) const { return x <= 0.f ? 0.f : x; }
};
/// Reads the forward output (y > 0 exactly where x > 0). A NaN output passes
/// dy on, as PyTorch's threshold_backward: the gradient is as undefined as y.
struct ReluBwd {
  MIX_HD float operator()(float y, float dy) const { return y <= 0.f ? 0.f : dy; }
};

/// Exact GELU, x * Phi(x), as PyTorch's default and Paddle's approximate=false.
struct GeluFwd {
  MIX_HD float operator()(float x) const { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
};
/// Reads the forward input: d/dx [x Phi(x)] = Phi(x) + x phi(x).
struct GeluBwd {
  MIX_HD float operator()(float x, float dy) const {
    const float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
    return dy * (cdf + x * pdf);
  }
};

struct TanhFwd {
  MIX_HD float operator()(float x) const { return tanhf(x); }
};
/// Reads the forward output: 1 - tanh^2.
struct TanhBwd {
  MIX_HD float operator()(float y, float dy) const { return dy * (1.f - y * y); }
};

/// Paddle's scale op: scale * x + bias (bias_after_scale) or scale * (x + bias).
struct Scale {
  float scale, bias;
  bool bias_after_scale;
  MIX_HD float operator()(float x) const { return bias_after_scale ? scale * x + bias : scale * (x + bias); }
};

struct Identity {
  MIX_HD float operator()(float x) const { return x; }
};

struct Add {
  MIX_HD float operator()(float a, float b) const { return a + b; }
};
struct Mul {
  MIX_HD float operator()(float a, float b) const { return a * b; }
};
/// fused_add_relu: relu(a + b), rounded once on store. The same bits as
/// elementwise_add then relu, which round the sum before the relu: rounding
/// to FP16/BF16 keeps a value's sign, turns nothing positive into a negative
/// and 0 into 0, so relu and the rounding commute (NaN stays NaN either way).
struct AddRelu {
  MIX_HD float operator()(float a, float b) const { return ReluFwd{}(Add{}(a, b)); }
};
/// The first operand: the summand of elementwise_add's bias gradient, dY = sum(dOut).
struct TakeFirst {
  MIX_HD float operator()(float a, float) const { return a; }
};

// ---- gradient parts ----------------------------------------------------------------
/// A gradient op's own part of a gradient plus the gradient's other part, for
/// an op that takes that part as input Accumulate (runtime/passes/fold_grad_sums.h):
/// its own part rounded to T as the op alone would store it, then the FP32 sum
/// of the two rounded to T as `sum` adds them: the bits of the op followed by
/// `sum` (an FP32 sum of two values does not depend on their order). Spelled
/// __fadd_rn on the device so that no multiply before it is contracted into it.
template <typename T>
MIX_HD T add_grad_part(float own, float other) {
#ifdef __CUDA_ARCH__
  return from_float<T>(__fadd_rn(to_float(from_float<T>(own)), other));
#else
  return from_float<T>(to_float(from_float<T>(own)) + other);
#endif
}

// ---- mean ------------------------------------------------------------------------
/// The mean from a sum taken in double: one rounding, to float, at the end.
MIX_HD float mean_from_sum(double sum, int64_t n) { return static_cast<float>(sum / static_cast<double>(n)); }
/// mean_grad's dX[i] = dOut / numel, the quotient formed in double and rounded
/// once, so numel beyond 2^24 loses nothing extra.
MIX_HD float mean_grad_value(float dout, int64_t n) {
  return static_cast<float>(static_cast<double>(dout) / static_cast<double>(n));
}

// ---- batch_norm (per channel; statistics in FP32, activations in any dtype) -------
/// 1 / sqrt(var + eps): the saved inverse standard deviation (Paddle's SavedVariance).
MIX_HD float bn_inv_std(float var, float eps) { return 1.f / sqrtf(var + eps); }
/// A channel's batch mean and biased variance (what normalises) from the
/// sums of its m values less `shift`: sum (x - shift) and sum (x - shift)^2,
/// in double. The CPU sums in double with shift 0; the GPU sums each thread's
/// values in FP32 first, so it shifts by one of the channel's values, keeping
/// the squares' sum from cancelling against the mean's square.
struct BnBatchStats {
  double mean, var;
};
MIX_HD BnBatchStats bn_batch_stats(double sum, double sum_sq, double shift, int64_t m) {
  const double shifted_mean = sum / static_cast<double>(m);
  const double var = sum_sq / static_cast<double>(m) - shifted_mean * shifted_mean;
  return {shift + shifted_mean, 0.0 < var ? var : 0.0};
}
/// The unbiased variance the running statistics take, as PyTorch's.
MIX_HD double bn_unbiased_var(double var, int64_t m) {
  return var * static_cast<double>(m) / static_cast<double>(m - 1);
}
/// Forward: y = (x - mean) * (inv_std * scale) + bias.
struct BnNormalize {
  float mean, scale_inv_std, bias;
  MIX_HD float operator()(float x) const { return (x - mean) * scale_inv_std + bias; }
};
/// batch_norm with fuse_with_relu: relu(normalize(x)), rounded once on store.
/// The bits of batch_norm then relu, which round before the relu: relu and
/// the rounding commute (see AddRelu).
struct BnNormalizeAct {
  BnNormalize norm;
  bool relu;
  MIX_HD float operator()(float x) const {
    const float v = norm(x);
    return relu ? ReluFwd{}(v) : v;
  }
};
/// batch_norm with fuse_with_relu and a residual z: relu(round_T(normalize(x))
/// + z), rounded once more on store. The bits of batch_norm (which rounds its
/// output to T) then fused_add_relu (fn::AddRelu). T is X's storage type.
template <typename T>
struct BnAddRelu {
  BnNormalize norm;
  MIX_HD float operator()(float x, float z) const { return AddRelu{}(round_as<T>(norm(x)), z); }
};
/// fuse_with_relu's backward takes relu's gradient before batch_norm's, with
/// relu's mask recomputed from X instead of read from Y: the forward stored
/// y = round_T(relu(v)) with v = norm(x), and y <= 0 exactly where
/// round_T(v) <= 0 (a NaN is neither), so relu_grad's `y <= 0 ? 0 : dy` is
/// `round_T(v) <= 0 ? 0 : dy`. The rounding matters: a tiny positive v that
/// FP16 flushes to 0 was stored as 0. `norm` must be the forward's functor
/// with the forward's statistics (SavedMean, SavedVariance, Scale, Bias), so
/// v has the forward's bits. T is X's storage type.
template <typename T>
struct BnReluGradFromX {
  BnNormalize norm;
  MIX_HD float operator()(float x, float dy) const { return ReluBwd{}(round_as<T>(norm(x)), dy); }
};
/// Backward of the training-mode forward, from the channel's means over its M
/// values of dy and dy * xhat: dx = scale inv_std (dy - mean(dy) - xhat mean(dy xhat)).
struct BnBackward {
  float mean, inv_std, scale_inv_std, mean_dy, mean_dy_xhat;
  MIX_HD float operator()(float x, float dy) const {
    const float xhat = (x - mean) * inv_std;
    return scale_inv_std * (dy - mean_dy - xhat * mean_dy_xhat);
  }
};
/// Running statistics, Paddle's momentum convention (PyTorch's momentum is 1 - this):
/// running = momentum * running + (1 - momentum) * batch.
MIX_HD float bn_running_update(float running, float batch, float momentum) {
  return momentum * running + (1.f - momentum) * batch;
}

// ---- gradient clipping (runtime/optim/clip_grad.h) ----------------------------
/// torch.nn.utils.clip_grad_norm_'s coefficient, in FP32 as torch computes it:
/// min(1, max_norm / (norm + 1e-6)).
MIX_HD float clip_coefficient(float norm, float max_norm) {
  const float c = max_norm / (norm + 1e-6f);
  return c < 1.f ? c : 1.f;
}
/// clamp(x, -v, v), as torch.nn.utils.clip_grad_value_; a NaN stays NaN.
struct ClipByValue {
  float v;
  MIX_HD float operator()(float x) const { return x > v ? v : x < -v ? -v : x; }
};

// ---- AMP ------------------------------------------------------------------------
/// check_finite_and_unscale: out = g / scale (as g * (1/scale)); `found` is set
/// for any non-finite input. The loop ORs the flags.
struct UnscaleCheck {
  float inv_scale;
  MIX_HD float operator()(float g, bool& found) const {
    if (!is_finite(g)) found = true;
    return g * inv_scale;
  }
};
/// The unscale functor for a loss scale (the reciprocal taken once, in float).
MIX_HD UnscaleCheck unscale_check_for(float scale) { return UnscaleCheck{1.f / scale}; }
/// The scaler keeps the scale >= min_loss_scaling > 0: anything else is a bug
/// upstream, and would turn every gradient into inf/NaN silently.
MIX_HD bool valid_loss_scale(float scale) { return is_finite(scale) && scale > 0.f; }

// ---- optimizer updates on FP32 masters (PyTorch semantics) ------------------------
/// SGD: g' = g + wd * p; p -= lr * g'.
struct SgdUpdate {
  float lr, weight_decay;
  MIX_HD void operator()(float& p, float g) const { p -= lr * (g + weight_decay * p); }
};

/// PyTorch SGD with momentum (dampening 0): g' = g + wd * p; buf = mu * buf + g'
/// (buf starts at zero, so the first step gives buf = g'); p -= lr * buf, or with
/// Nesterov p -= lr * (g' + mu * buf).
struct MomentumUpdate {
  float lr, mu, weight_decay;
  bool nesterov;
  MIX_HD void operator()(float& p, float& buf, float g) const {
    const float gd = g + weight_decay * p;
    buf = mu * buf + gd;
    p -= lr * (nesterov ? gd + mu * buf : buf);
  }
};

/// torch.optim.AdamW: p *= 1 - lr*wd; m, v moments; step size lr / (1 - b1^t);
/// denominator sqrt(v) / sqrt(1 - b2^t) + eps. Bias corrections come in
/// precomputed in double (adamw_update_for_step) so every device uses the same values.
/// (1 - beta) comes in computed in double, as PyTorch does in Python: 1 - 0.999f
/// in float would be off by 1e-5 relative.
struct AdamWUpdate {
  float lr, beta1, beta2, eps, weight_decay;
  float one_minus_beta1, one_minus_beta2;
  float step_size;          // lr / (1 - beta1^t)
  float inv_sqrt_bias2;     // 1 / sqrt(1 - beta2^t)
  MIX_HD void operator()(float& p, float& m, float& v, float g) const {
    p *= 1.f - lr * weight_decay;
    m = beta1 * m + one_minus_beta1 * g;
    v = beta2 * v + one_minus_beta2 * g * g;
#ifdef __CUDA_ARCH__
    const float denom = sqrtf(v) * inv_sqrt_bias2 + eps;
#else
    const float denom = std::sqrt(v) * inv_sqrt_bias2 + eps;
#endif
    p -= step_size * m / denom;
  }
};

/// The AdamW update of step t (t >= 1, the count of applied steps): bias
/// corrections 1 - beta^t and (1 - beta) in double, as PyTorch computes them in
/// Python, rounded to float once. The CPU kernel calls this on the host; the
/// CUDA kernel calls it on the device with t read from device memory (double
/// pow there is within 2 ulp of the host's, so the float results agree).
MIX_HD AdamWUpdate adamw_update_for_step(float lr, double beta1, double beta2, float eps, float weight_decay,
                                         int64_t t) {
#ifdef __CUDA_ARCH__
  const double bias1 = 1.0 - pow(beta1, static_cast<double>(t));
  const double bias2 = 1.0 - pow(beta2, static_cast<double>(t));
  const double inv_sqrt_bias2 = 1.0 / sqrt(bias2);
#else
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  const double inv_sqrt_bias2 = 1.0 / std::sqrt(bias2);
#endif
  return AdamWUpdate{lr,
                     static_cast<float>(beta1),
                     static_cast<float>(beta2),
                     eps,
                     weight_decay,
                     static_cast<float>(1.0 - beta1),
                     static_cast<float>(1.0 - beta2),
                     static_cast<float>(lr / bias1),
                     static_cast<float>(inv_sqrt_bias2)};
}

}  // namespace mix::fn
