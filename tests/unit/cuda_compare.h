#pragma once
// What the [cuda] op tests (test_cuda_ops.cc, test_cuda_conv_ops.cc,
// test_cuda_transformer_ops.cc) share: an op run as a one-op Program through
// the Executor on the CPU and on cuda:0 with the same inputs (copied with
// Tensor::to), and the comparisons of the two results.
//
// How close the two must be follows from how each kernel computes (each test
// states the reason at each comparison):
//  - expect_identical: the same functor on the same inputs in the same
//    sequence of rounded operations (selects, single adds or multiplies,
//    conversions, copies): bit for bit, integers byte for byte. NaN must meet
//    NaN (GPUs and x86 make NaNs with different payloads).
//  - expect_within, against one reference computed in double from the same
//    (already rounded) inputs: where the twins add in another order
//    (reductions), each of them is compared with that reference, within the
//    error bound of its own order of additions; a bound on CPU - GPU alone
//    would be the CPU's (n-1)·u, too loose to notice a lost term.
//  - expect_close_to_cpu, for functors that round differently on the two
//    devices (a multiply feeding an add that nvcc contracts into an FMA, libm
//    functions): each twin within f32_err of the exact FP32 computation, so
//    they differ by up to twice that.
// Outputs rounded to FP16/BF16 add half an ulp of that type against a reference
// (store_rel / store_abs: store_err), and one ulp between two computed results.
//
// MIX_CUDA_OPS_VERBOSE=1 prints how close each expect_within came to its bound
// (how the bounds were calibrated), after the name of the running test case.
//
// Header-only (each tests/unit/test_*.cc is its own executable).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"
#include "tests/unit/gpu_stand_in.h"
#include "tests/unit/gradcheck.h"

namespace mix::testing {

/// base + i ("x3"), for the variables of a test program. It appends rather
/// than write `"x" + std::to_string(i)`, on which GCC 12 warns falsely (-Wrestrict).
inline std::string numbered(const char* base, size_t i) { return std::string(base).append(std::to_string(i)); }

/// cuda:0, or the CPU where it stands in for the GPU (require_gpu.h).
inline const Device kGpu = gpu_or_stand_in();
inline constexpr DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};

/// FP32 unit roundoff: one rounding moves a value by at most kU·|value|.
inline constexpr double kU = 0x1p-24;

/// Half an ulp of dtype t, relative: the error of rounding an exact value on store.
inline double store_rel(DType t) { return t == DType::f16 ? 0x1p-11 : t == DType::bf16 ? 0x1p-8 : 0x1p-24; }
/// Half the smallest subnormal of t: the same bound where the value is subnormal.
inline double store_abs(DType t) { return t == DType::f16 ? 0x1p-25 : t == DType::bf16 ? 0x1p-134 : 0x1p-150; }
/// The rounding of the stored result, against an exact reference.
inline double store_err(DType t, double ref) { return store_rel(t) * std::fabs(ref) + store_abs(t); }

inline std::string dname(DType t) { return std::string(dtype_name(t)); }

// ---- tensors ----------------------------------------------------------------------------

/// Uniform values in [lo, hi) stored in dtype t.
inline Tensor random_tensor(const Shape& s, DType t, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  return to_dtype(uniform_tensor(s, seed, lo, hi), t);
}

inline Tensor floats(const Shape& s, const std::vector<float>& v, DType t) {
  return to_dtype(Tensor::from_floats(s, v), t);
}

/// x_f32 stored in dtype t, with zeros of both signs, infinities, a NaN, values
/// that underflow or overflow FP16 and a subnormal at fixed places.
inline Tensor with_specials(const Tensor& x_f32, DType t) {
  std::vector<float> v = x_f32.to_floats();
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.f, -0.f, inf, -inf, std::nanf(""), 1e-30f, -1e-30f, 6e-8f, 65504.f, -70000.f};
  for (size_t k = 0; k < std::size(specials) && k < v.size(); ++k) v[k * 7 % v.size()] = specials[k];
  return floats(x_f32.shape(), v, t);
}

/// Every element as double (floating dtypes).
inline std::vector<double> doubles(const Tensor& t) {
  const std::vector<float> f = t.to_floats();
  return {f.begin(), f.end()};
}

// ---- one op on a device -------------------------------------------------------------------

struct OneOp {
  OpDesc op;
  std::vector<std::pair<std::string, Tensor>> feeds;  // variable -> host value
  int64_t step = 0;                                   // ExecEnv::step
  int rank = 0;                                       // ExecEnv::rank
  bool training = true;                               // ExecEnv::training
};

/// Runs `ops` in order, as one program, on `device` over fresh copies of the
/// feeds, with `env` (its device set here); returns `results` on the host.
inline std::map<std::string, Tensor> run_ops_on(const std::vector<OpDesc>& ops,
                                                const std::vector<std::pair<std::string, Tensor>>& feeds, Device device,
                                                ExecEnv env, const std::vector<std::string>& results) {
  Program p;
  for (auto& [name, t] : feeds) p.add_var(var_desc(name, t.shape(), t.dtype()));
  std::set<std::string> keep;
  for (const OpDesc& op : ops) {
    p.append_op(op);
    for (auto& n : op.all_inputs()) keep.insert(n);
    for (auto& n : op.all_outputs()) keep.insert(n);
  }
  Scope scope;
  for (auto& [name, t] : feeds) scope.set(name, device == cpu_device() ? t.clone() : t.to(device));
  env.device = device;
  Executor(p, keep).run(scope, env);
  std::map<std::string, Tensor> out;
  for (auto& name : results) {
    const Tensor& t = scope.get(name);
    // The kernels really ran where they were asked to: their outputs live there.
    if (t.numel() > 0) CHECK(t.device() == device);
    out[name] = t.to(cpu_device());
  }
  return out;
}

/// Runs the op on `device` over fresh copies of the feeds; returns `results` on the host.
inline std::map<std::string, Tensor> run_on(const OneOp& c, Device device, const std::vector<std::string>& results) {
  ExecEnv env;
  env.step = c.step;
  env.rank = c.rank;
  env.training = c.training;
  return run_ops_on({c.op}, c.feeds, device, env, results);
}

struct Both {
  std::map<std::string, Tensor> cpu, gpu;
};
inline Both run_both(const OneOp& c, const std::vector<std::string>& results) {
  return {run_on(c, cpu_device(), results), run_on(c, kGpu, results)};
}

// ---- comparisons --------------------------------------------------------------------------

/// Byte for byte, except that any NaN matches any NaN in float dtypes (GPUs and
/// x86 make NaNs with different payloads).
inline void expect_identical(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  INFO(what);
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  if (!is_floating(cpu.dtype())) {
    CHECK(std::memcmp(gpu.raw(), cpu.raw(), cpu.bytes()) == 0);
    return;
  }
  const size_t es = dtype_size(cpu.dtype());
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const bool both_nan = std::isnan(cpu.item_float(i)) && std::isnan(gpu.item_float(i));
    const auto* a = static_cast<const unsigned char*>(gpu.raw()) + static_cast<size_t>(i) * es;
    const auto* b = static_cast<const unsigned char*>(cpu.raw()) + static_cast<size_t>(i) * es;
    if (!both_nan && std::memcmp(a, b, es) != 0) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  INFO(bad << " of " << cpu.numel() << " elements differ; first at [" << first << "]: gpu "
           << (first >= 0 ? gpu.item_float(first) : 0.f) << ", cpu " << (first >= 0 ? cpu.item_float(first) : 0.f));
  CHECK(bad == 0);
}

/// The terms of a GPU row sum over n values for an error bound (sequential
/// adds per thread plus tree levels, runtime/ops/cuda/row_group.cuh): by a
/// block, ceil(n / 256) per thread then 8 levels; by a warp, ceil(n / 32) per
/// lane then 5.
inline int64_t gpu_block_row_terms(int64_t n) { return (n + 255) / 256 + 8; }
inline int64_t gpu_warp_row_terms(int64_t n) { return (n + 31) / 32 + 5; }
/// The row kernels (softmax, softmax_grad, layer_norm, layer_norm_grad) give
/// rows of up to 1024 columns a warp each, longer ones a block (RowGroup in
/// runtime/ops/cuda/row_group.cuh); n of the row's cols are summed.
inline int64_t gpu_row_terms(int64_t n, int64_t cols) {
  return cols <= 1024 ? gpu_warp_row_terms(n) : gpu_block_row_terms(n);
}

/// |got[i] - ref[i]| <= allowed(i); a NaN reference needs a NaN, an infinite one the same infinity.
inline void expect_within(const Tensor& got_t, const std::vector<double>& ref,
                          const std::function<double(int64_t)>& allowed, const std::string& what) {
  INFO(what);
  const std::vector<double> got = doubles(got_t);
  REQUIRE(got.size() == ref.size());
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0.0;
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
    const double g = got[static_cast<size_t>(i)], r = ref[static_cast<size_t>(i)];
    bool ok;
    double ratio = 0.0;
    if (std::isnan(r) || std::isinf(r)) {
      ok = std::isnan(r) ? std::isnan(g) : g == r;
      ratio = ok ? 0.0 : 1e300;
    } else {
      const double err = std::fabs(g - r), lim = allowed(i);
      ok = err <= lim;  // NaN fails
      ratio = ok && err == 0.0 ? 0.0 : std::isnan(err) || lim == 0.0 ? 1e300 : err / lim;
    }
    if (!ok) ++bad;
    if (ratio > worst_ratio || worst < 0) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (std::getenv("MIX_CUDA_OPS_VERBOSE"))  // how close to its bound each comparison came (calibration)
    std::printf("[%s] %-70s err/allowed %.3g\n", Catch::getResultCapture().getCurrentTestName().c_str(), what.c_str(),
                worst_ratio);
  INFO(bad << " of " << got.size() << " elements outside the bound; worst at [" << worst << "]: got "
           << (worst >= 0 ? got[static_cast<size_t>(worst)] : 0.0) << ", expected "
           << (worst >= 0 ? ref[static_cast<size_t>(worst)] : 0.0) << ", allowed "
           << (worst >= 0 ? allowed(worst) : 0.0) << " (err/allowed " << worst_ratio << ")");
  CHECK(bad == 0);
}

/// Two computed results (CPU and GPU): each within `f32_err(i)` of the exact
/// FP32 computation, so they differ by up to twice that, plus one ulp of the
/// storage type each may have rounded to differently.
inline void expect_close_to_cpu(const Tensor& gpu, const Tensor& cpu, const std::function<double(int64_t)>& f32_err,
                                const std::string& what) {
  const std::vector<double> ref = doubles(cpu);
  const DType t = cpu.dtype();
  expect_within(
      gpu, ref, [&](int64_t i) { return 2.0 * f32_err(i) + 2.0 * store_err(t, ref[static_cast<size_t>(i)]); }, what);
}

}  // namespace mix::testing
