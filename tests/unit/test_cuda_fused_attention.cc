// [cuda] fused_attention's CUDA kernels (runtime/ops/cuda/fused_attention.cu)
// against its CPU twin (runtime/ops/fused_attention.cc), in f32, f16 and
// bf16, causal or not, with head dims that fill one to eight values per lane
// (8, 32, 64, 100, 128, 256; 256 needs more than the default 48 KiB of
// shared memory), token counts of 1, 7, 33 and 100 (several query and key
// tiles, partial last tiles) and fewer queries than keys.
//
// The forward runs on both devices from the same inputs. The grad op runs on
// both from the same inputs too, Out and LSE included (the CPU forward's), so
// a difference in the forward does not reach the gradients' comparison.
//
// How close: the twins round at the same points (FP32 inside, the dtype on
// store) but sum in different orders (the GPU's online softmax over key
// tiles, per-lane dot products and FMAs, against SGEMM blocks on the CPU),
// and CUDA's expf and logf are not glibc's. So each twin is compared with one
// reference computed in double from the same inputs
// (tests/unit/attention_reference.h), within the bound of its FP32 sums
// (Problem::f32_err, relative to the size of the terms) plus the half ulp of
// its one rounding on store; the gradients also read the stored Out, a few
// half ulps of the terms. The CPU twin must meet the same bounds (its FP32
// part with a wide margin; an FP16 or BF16 Out comes close to its half ulp,
// which is the rounding itself), and the two are then compared with each
// other within the sum of both. Without a GPU (or in a build without CUDA)
// the test exits 77, which CTest reports as skipped.
#include <catch2/catch.hpp>

#include "tests/unit/require_gpu.h"

#include <map>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "tests/unit/attention_reference.h"
#include "tests/unit/cuda_compare.h"

using namespace mix;
using namespace mix::testing;
using mix::testing::attention::Inputs;
using mix::testing::attention::Problem;

namespace {

// Each result within its bound of the double reference: `scaled` of the
// tensor's terms (at least 1 here) plus `rel` of itself.
void expect_both_near(const std::map<std::string, Tensor>& gpu, const std::map<std::string, Tensor>& cpu,
                      const std::string& name, const std::vector<double>& ref, double scaled, double rel) {
  attention::expect_near(gpu.at(name), ref, scaled, rel, "gpu " + name + " vs double");
  attention::expect_near(cpu.at(name), ref, scaled, rel, "cpu " + name + " vs double");
  attention::expect_near(gpu.at(name), attention::doubles_of(cpu.at(name)), 2 * scaled, 2 * rel,
                         "gpu " + name + " vs cpu");
}

}  // namespace

TEST_CASE("cuda fused_attention: forward and gradients against the CPU twin", "[cuda][fused_attention]") {
  require_gpu();
  const std::vector<Problem> problems = {
      {{2, 3}, 1, 1, 8, true},       {{2, 3}, 7, 7, 32, false},    {{2, 3}, 7, 7, 32, true},
      {{1, 2}, 33, 33, 64, true},    {{1, 2}, 33, 33, 100, false}, {{2, 2}, 100, 100, 64, true},
      {{1, 2}, 100, 100, 128, true}, {{1, 1}, 33, 33, 256, true},  {{2, 2}, 20, 45, 64, true},
      {{2, 2}, 20, 45, 64, false},
  };
  uint64_t seed = 500;
  for (const Problem& pb : problems) {
    for (DType dt : kFloatTypes) {
      INFO(pb.describe() << ", " << dname(dt));
      const Inputs in = attention::make_inputs(pb, dt, seed += 10);
      const attention::Reference ref = attention::reference_attention(pb, in);
      const double u = attention::half_ulp(dt), fp32_err = pb.f32_err();

      OneOp fwd;
      fwd.op = make_op("fused_attention", {{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}},
                       {{"Out", {"out"}}, {"LSE", {"lse"}}}, {{"scale", pb.scale()}, {"causal", pb.causal}});
      fwd.feeds = {{"q", to_dtype(in.q, dt)}, {"k", to_dtype(in.k, dt)}, {"v", to_dtype(in.v, dt)}};
      const Both f = run_both(fwd, {"out", "lse"});
      REQUIRE(f.gpu.at("out").dtype() == dt);
      REQUIRE(f.gpu.at("lse").dtype() == DType::f32);
      expect_both_near(f.gpu, f.cpu, "out", ref.out, fp32_err, u);
      expect_both_near(f.gpu, f.cpu, "lse", ref.lse, fp32_err, fp32_err);

      OneOp grad;
      grad.op = make_op(
          "fused_attention_grad",
          {{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}, {"Out", {"out"}}, {"LSE", {"lse"}}, {"Out@GRAD", {"dout"}}},
          {{"Q@GRAD", {"dq"}}, {"K@GRAD", {"dk"}}, {"V@GRAD", {"dv"}}}, {{"scale", pb.scale()}, {"causal", pb.causal}});
      grad.feeds = fwd.feeds;
      grad.feeds.emplace_back("out", f.cpu.at("out"));
      grad.feeds.emplace_back("lse", f.cpu.at("lse"));
      grad.feeds.emplace_back("dout", to_dtype(in.r, dt));
      const Both g = run_both(grad, {"dq", "dk", "dv"});
      // As in test_fused_attention.cc: dQ and dK read the stored Out through
      // delta, a few half ulps of the terms; dV only its own rounding.
      const double grad_scaled = dt == DType::f32 ? fp32_err : 4 * u;
      expect_both_near(g.gpu, g.cpu, "dq", ref.dq, grad_scaled, u);
      expect_both_near(g.gpu, g.cpu, "dk", ref.dk, grad_scaled, u);
      expect_both_near(g.gpu, g.cpu, "dv", ref.dv, dt == DType::f32 ? fp32_err : u, u);
    }
  }
}

TEST_CASE("cuda fused_attention: only the wanted gradients are written", "[cuda][fused_attention]") {
  require_gpu();
  // dV alone (the dK/dV kernel writes dK to scratch), and dQ alone.
  const Problem pb{{2}, 9, 9, 16, true};
  const Inputs in = attention::make_inputs(pb, DType::f32, 3);
  OneOp fwd;
  fwd.op = make_op("fused_attention", {{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}}, {{"Out", {"out"}}, {"LSE", {"lse"}}},
                   {{"causal", true}});
  fwd.feeds = {{"q", in.q}, {"k", in.k}, {"v", in.v}};
  const Both f = run_both(fwd, {"out", "lse"});
  const attention::Reference ref = attention::reference_attention(pb, in);
  for (const char* slot : {"V@GRAD", "Q@GRAD"}) {
    INFO(slot);
    OneOp grad;
    grad.op =
        make_op("fused_attention_grad",
                {{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}, {"Out", {"out"}}, {"LSE", {"lse"}}, {"Out@GRAD", {"dout"}}},
                {{slot, {"d"}}}, {{"causal", true}});
    grad.feeds = fwd.feeds;
    grad.feeds.emplace_back("out", f.cpu.at("out"));
    grad.feeds.emplace_back("lse", f.cpu.at("lse"));
    grad.feeds.emplace_back("dout", in.r);
    const Both g = run_both(grad, {"d"});
    expect_both_near(g.gpu, g.cpu, "d", std::string(slot) == "V@GRAD" ? ref.dv : ref.dq, pb.f32_err(), 0x1p-24);
  }
}
