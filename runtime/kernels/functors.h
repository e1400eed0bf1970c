#pragma once
// Elementwise math written once for host and device (MIX_HD). CPU kernels run
// these in plain loops (cpu_loops.h); CUDA launchers run the same functors in
// grid-stride loops, so the GPU's arithmetic is tested on the CPU too.
//
// Functors compute in float; storage conversion (rounding to FP16/BF16 on
// store) is the loop's job, exactly where a GPU kernel rounds.
#include <cmath>

#include "runtime/half.h"

namespace mix::fn {

MIX_HD bool is_finite(float x) {
#ifdef __CUDA_ARCH__
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// ---- activations: forward f(x), backward g(x or y, dy) ------------------------
struct ReluFwd {
  MIX_HD float operator()(float x) const { return x > 0.f ? x : 0.f; }
};
/// Reads the forward output (y > 0 exactly where x > 0).
struct ReluBwd {
  MIX_HD float operator()(float y, float dy) const { return y > 0.f ? dy : 0.f; }
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
/// precomputed (in double on the host) so every device uses the same values.
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

}  // namespace mix::fn
