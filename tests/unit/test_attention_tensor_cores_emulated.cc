// fused_attention's tensor-core kernels (runtime/ops/cuda/
// fused_attention_tensor_cores_kernels.cuh), their very source, run on the
// CPU (tests/unit/cuda_emulation.h), against the double reference of
// test_cuda_fused_attention.cc within the same bounds. It runs everywhere, GPU
// or not, so a change to the kernels' tiling, masking, causal ranges or
// softmax steps is checked on every build; the GPU itself is checked by
// test_cuda_fused_attention where one is lent. Outputs start as NaN, so a
// value never written shows.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/core/tensor.h"
#include "tests/unit/attention_reference.h"

// The emulation, then the kernels (cuda_emulation.h defines CUDA's keywords as macros).
#include "tests/unit/cuda_emulation.h"

#include "runtime/ops/cuda/fused_attention_tensor_cores_kernels.cuh"

namespace mix::cuda::attention_tensor_cores {
namespace {
unsigned char* dynamic_shared() { return emulated::g_shared; }
}  // namespace
}  // namespace mix::cuda::attention_tensor_cores

// ---- the test ------------------------------------------------------------------------------

using namespace mix;
using namespace mix::testing;
using mix::testing::attention::Inputs;
using mix::testing::attention::Problem;
namespace kernels = mix::cuda::attention_tensor_cores;

namespace {

const uint16_t* bits_of(const Tensor& t) { return static_cast<const uint16_t*>(t.raw()); }

// Out, LSE and the three gradients of one problem from the emulated kernels;
// the backward takes their own Out (through delta) and LSE, as a training step does.
template <typename T, int kD>
std::map<std::string, Tensor> run_kernels(const Problem& pb, DType dt, const Inputs& in) {
  const Tensor q = to_dtype(in.q, dt), k = to_dtype(in.k, dt), v = to_dtype(in.v, dt), dout = to_dtype(in.r, dt);
  const int64_t groups = pb.groups();
  const attention_rules::AttentionDims a{groups, pb.t, pb.s, pb.d, pb.causal, static_cast<float>(pb.scale())};
  const T unwritten = from_float<T>(NAN);
  std::vector<T> out(static_cast<size_t>(groups * pb.t * pb.d), unwritten), dq(out.size(), unwritten),
      dk(static_cast<size_t>(groups * pb.s * pb.d), unwritten), dv(dk.size(), unwritten);
  std::vector<float> lse(static_cast<size_t>(groups * pb.t), NAN);
  const auto tiles = [](int64_t rows) { return static_cast<unsigned>((rows + kernels::kRows - 1) / kernels::kRows); };
  // Each launch gets the dynamic shared memory fused_attention_tensor_cores.cu gives it, and no more.
  emulated::run_grid(
      static_cast<unsigned>(groups), tiles(pb.t),
      [&] { kernels::forward_kernel<T, kD>(bits_of(q), bits_of(k), bits_of(v), out.data(), lse.data(), a); },
      kernels::kThreads, kernels::ForwardShared<kD>::bytes());
  // delta = dO . O over each row in FP32, as fused_attention.cu's attention_delta.
  std::vector<float> delta(lse.size());
  const std::vector<float> dout_f = dout.to_floats();
  for (size_t row = 0; row < delta.size(); ++row) {
    float sum = 0.f;
    for (int64_t c = 0; c < pb.d; ++c) {
      const size_t e = row * static_cast<size_t>(pb.d) + static_cast<size_t>(c);
      sum += dout_f[e] * to_float(out[e]);
    }
    delta[row] = sum;
  }
  emulated::run_grid(
      static_cast<unsigned>(groups), tiles(pb.s),
      [&] {
        kernels::grad_kv_kernel<T, kD>(bits_of(q), bits_of(k), bits_of(v), bits_of(dout), lse.data(), delta.data(),
                                       dk.data(), dv.data(), a);
      },
      kernels::kThreads, kernels::GradKvShared<kD>::bytes());
  emulated::run_grid(
      static_cast<unsigned>(groups), tiles(pb.t),
      [&] {
        kernels::grad_q_kernel<T, kD>(bits_of(q), bits_of(k), bits_of(v), bits_of(dout), lse.data(), delta.data(),
                                      dq.data(), a);
      },
      kernels::kThreads, kernels::GradQShared<kD>::bytes());
  return attention::results_as_tensors(pb, dt, out, lse, dq, dk, dv);
}

// Through the kernels' own dispatch on the head dim (with_head_dim).
template <typename T>
std::map<std::string, Tensor> run_for_head_dim(const Problem& pb, DType dt, const Inputs& in) {
  std::map<std::string, Tensor> got;
  REQUIRE(kernels::with_head_dim(pb.d, [&](auto dim) { got = run_kernels<T, decltype(dim)::value>(pb, dt, in); }));
  return got;
}

}  // namespace

TEST_CASE("fused_attention's tensor-core kernels, emulated on the CPU, against the double reference",
          "[fused_attention][tensor_cores]") {
  // Several query and key tiles with partial last ones, causal and not,
  // fewer queries than keys, one token, each head dim the kernels take.
  const std::vector<Problem> problems = {
      {{2, 3}, 7, 7, 32, true},    {{1, 2}, 100, 100, 64, true}, {{1, 2}, 20, 45, 64, true},
      {{1, 2}, 20, 45, 64, false}, {{1, 1}, 130, 130, 96, true}, {{1, 1}, 64, 64, 128, false},
      {{1, 1}, 1, 1, 32, true},
  };
  uint64_t seed = 900;
  for (const Problem& pb : problems) {
    for (DType dt : {DType::f16, DType::bf16}) {
      INFO(pb.describe() << ", " << dtype_name(dt));
      const Inputs in = attention::make_inputs(pb, dt, seed += 10);
      const attention::Reference ref = attention::reference_attention(pb, in);
      const auto got = dt == DType::f16 ? run_for_head_dim<half_t>(pb, dt, in) : run_for_head_dim<bf16_t>(pb, dt, in);
      // test_cuda_fused_attention.cc's bounds for the tensor-core kernels.
      const double u = attention::half_ulp(dt), fp32_err = pb.f32_err(), scale = pb.scale();
      attention::expect_near(got.at("out"), ref.out, fp32_err, u, "out",
                             attention::tensor_core_allowance(dt, ref.out_terms, pb.s, 1.0));
      attention::expect_near(got.at("lse"), ref.lse, fp32_err, fp32_err, "lse");
      attention::expect_near(got.at("dq"), ref.dq, 4 * u, u, "dq",
                             attention::tensor_core_allowance(dt, ref.dq_terms, pb.s, 2 * scale));
      attention::expect_near(got.at("dk"), ref.dk, 4 * u, u, "dk",
                             attention::tensor_core_allowance(dt, ref.dk_terms, pb.t, 2 * scale));
      attention::expect_near(got.at("dv"), ref.dv, u, u, "dv",
                             attention::tensor_core_allowance(dt, ref.dv_terms, pb.t, 1.0));
    }
  }
}
