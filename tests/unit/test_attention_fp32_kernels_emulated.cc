// fused_attention's FP32 CUDA kernels (runtime/ops/cuda/
// fused_attention_kernels.cuh), their very source, run on the CPU
// (tests/unit/cuda_emulation.h), against the double reference of
// test_cuda_fused_attention.cc within the bounds it sets for them. It runs
// everywhere, GPU or not, so a change to the kernels' tiling, masking, causal
// ranges or online softmax is checked on every build; the GPU itself is
// checked by test_cuda_fused_attention where one is lent. Outputs start as
// NaN, so a value never written shows.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/core/tensor.h"
#include "runtime/kernels/softmax_row.h"
#include "tests/unit/attention_reference.h"

// The emulation, then the kernels (cuda_emulation.h defines CUDA's keywords as macros).
#include "tests/unit/cuda_emulation.h"

// They reduce with row_group.cuh's warp_reduce, the GPU build's own.
#include "runtime/ops/cuda/fused_attention_kernels.cuh"

namespace mix::cuda {
namespace {
float* dynamic_shared_floats() { return reinterpret_cast<float*>(emulated::g_shared); }
}  // namespace
}  // namespace mix::cuda

// ---- the test ------------------------------------------------------------------------------

using namespace mix;
using namespace mix::testing;
using mix::testing::attention::Inputs;
using mix::testing::attention::Problem;
namespace kernels = mix::cuda;

namespace {

// Out, LSE and the three gradients of one problem from the emulated kernels,
// launched as fused_attention.cu launches them; the backward takes their own
// Out (through delta) and LSE, as a training step does.
template <typename T, int kChunks>
std::map<std::string, Tensor> run_kernels(const Problem& pb, DType dt, const Inputs& in) {
  const Tensor q = to_dtype(in.q, dt), k = to_dtype(in.k, dt), v = to_dtype(in.v, dt), dout = to_dtype(in.r, dt);
  const int64_t groups = pb.groups(), d = pb.d;
  const attention_rules::AttentionDims a{groups, pb.t, pb.s, d, pb.causal, static_cast<float>(pb.scale())};
  const T unwritten = from_float<T>(NAN);
  std::vector<T> out(static_cast<size_t>(groups * pb.t * d), unwritten), dq(out.size(), unwritten),
      dk(static_cast<size_t>(groups * pb.s * d), unwritten), dv(dk.size(), unwritten);
  std::vector<float> lse(static_cast<size_t>(groups * pb.t), NAN), delta(lse.size(), NAN);
  const auto tiles = [](int64_t rows) {
    return static_cast<unsigned>((rows + kernels::kBlockRows - 1) / kernels::kBlockRows);
  };
  // Each launch gets the dynamic shared memory fused_attention.cu gives it, and no more.
  const auto shared_bytes = [](int64_t floats) { return static_cast<size_t>(floats) * sizeof(float); };
  const T *qd = q.data<T>(), *kd = k.data<T>(), *vd = v.data<T>(), *dod = dout.data<T>();
  emulated::run_grid(
      static_cast<unsigned>(groups), tiles(pb.t),
      [&] { kernels::attention_forward<T, kChunks>(qd, kd, vd, out.data(), lse.data(), a); }, kernels::kThreads,
      shared_bytes(kernels::forward_shared_floats(d)));
  const int64_t rows = groups * pb.t;
  emulated::run_grid(
      static_cast<unsigned>(std::max<int64_t>((rows + kernels::kWarps - 1) / kernels::kWarps, 1)), 1,
      [&] { kernels::attention_delta<T>(out.data(), dod, delta.data(), rows, d); }, kernels::kThreads, 0);
  emulated::run_grid(
      static_cast<unsigned>(groups), tiles(pb.s),
      [&] {
        kernels::attention_grad_kv<T, kChunks>(qd, kd, vd, dod, lse.data(), delta.data(), dk.data(), dv.data(), a);
      },
      kernels::kThreads, shared_bytes(kernels::grad_kv_shared_floats(d)));
  emulated::run_grid(
      static_cast<unsigned>(groups), tiles(pb.t),
      [&] { kernels::attention_grad_q<T, kChunks>(qd, kd, vd, dod, lse.data(), delta.data(), dq.data(), a); },
      kernels::kThreads, shared_bytes(kernels::grad_q_shared_floats(d)));
  return attention::results_as_tensors(pb, dt, out, lse, dq, dk, dv);
}

// Through the kernels' own dispatch on the head dim (with_head_chunks).
template <typename T>
std::map<std::string, Tensor> run_for_head_dim(const Problem& pb, DType dt, const Inputs& in) {
  std::map<std::string, Tensor> got;
  kernels::with_head_chunks(pb.d, [&](auto chunks) { got = run_kernels<T, decltype(chunks)::value>(pb, dt, in); });
  return got;
}

}  // namespace

TEST_CASE("fused_attention's FP32 CUDA kernels, emulated on the CPU, against the double reference",
          "[fused_attention]") {
  // Several query and key tiles with partial last ones, causal and not,
  // fewer queries than keys, one token, one to eight values per lane.
  const std::vector<Problem> problems = {
      {{2, 3}, 1, 1, 8, true},      {{2, 1}, 7, 7, 32, false},  {{1, 2}, 33, 33, 64, true},
      {{1, 1}, 33, 33, 100, false}, {{1, 2}, 20, 45, 64, true}, {{1, 1}, 40, 40, 256, true},
  };
  uint64_t seed = 1300;
  for (const Problem& pb : problems) {
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      INFO(pb.describe() << ", " << dtype_name(dt));
      const Inputs in = attention::make_inputs(pb, dt, seed += 10);
      const attention::Reference ref = attention::reference_attention(pb, in);
      const auto got = dt == DType::f32   ? run_for_head_dim<float>(pb, dt, in)
                       : dt == DType::f16 ? run_for_head_dim<half_t>(pb, dt, in)
                                          : run_for_head_dim<bf16_t>(pb, dt, in);
      // test_cuda_fused_attention.cc's bounds for the FP32 kernels.
      const double u = attention::half_ulp(dt), fp32_err = pb.f32_err();
      const double grad_scaled = dt == DType::f32 ? fp32_err : 4 * u;
      attention::expect_near(got.at("out"), ref.out, fp32_err, u, "out");
      attention::expect_near(got.at("lse"), ref.lse, fp32_err, fp32_err, "lse");
      attention::expect_near(got.at("dq"), ref.dq, grad_scaled, u, "dq");
      attention::expect_near(got.at("dk"), ref.dk, grad_scaled, u, "dk");
      attention::expect_near(got.at("dv"), ref.dv, dt == DType::f32 ? fp32_err : u, u, "dv");
    }
  }
}
