// [cuda] fused_attention's CUDA kernels (runtime/ops/cuda/fused_attention.cu,
// the FP32 kernels; fused_attention_tensor_cores.cu, the FP16/BF16 ones)
// against its CPU twin (runtime/ops/fused_attention.cc), in f32, f16 and bf16,
// causal or not, with head dims that fill one to eight values per lane of the
// FP32 kernels (8, 32, 64, 96, 100, 128, 256; 256 needs more than the default
// 48 KiB of shared memory), token counts of 1, 7, 33, 64, 100 and 130 (several
// query and key tiles, partial last tiles) and fewer queries than keys, in
// every way of feeding it: Q, K and V heads first or tokens first, and one
// packed QKV (the Transformer's; T = S), which cuDNN reads through strides and
// the own kernels through copies. Each
// case and layout runs on the FP32 kernels (cuda::tensor_core_attention()
// off) and with the tensor-core kernels allowed (f16 and bf16 at head_dim 32,
// 64, 96 and 128 take them); a subset (cudnn_case) runs with cuDNN's SDPA
// allowed too (runtime/cuda/cudnn_attention_graph.h: f16 and bf16 at
// head_dim a multiple of 8), where the build has it. cuDNN must have run
// head_dim 64 and 128 with T = S, the models' problems, and may leave others
// to the own kernels (a warning then names the shape and cuDNN's reason).
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
// other within the sum of both. The tensor-core kernels round two more
// things, each P term of Out and dV and each dS term of dQ and dK, to the
// dtype: their allowance grows by that (tensor_core_allowance), and so does
// cuDNN's, whose engines round at the same points. Without a
// GPU (or in a build without CUDA) the test exits 77, which CTest reports as
// skipped.
#include <catch2/catch.hpp>

#include "tests/unit/require_gpu.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"
#include "tests/unit/attention_reference.h"
#include "tests/unit/cuda_compare.h"

#ifdef MIX_HAVE_CUDA
#include "runtime/cuda/context.h"
#include "runtime/cuda/cudnn_attention_graph.h"
#endif

using namespace mix;
using namespace mix::testing;
using mix::testing::attention::Inputs;
using mix::testing::attention::Problem;

namespace {

// Each result within its bound of the double reference: `scaled` of the
// tensor's terms (at least 1 here) plus `rel` of itself, the GPU's with
// `gpu_extra` more (absolute).
void expect_both_near(const std::map<std::string, Tensor>& gpu, const std::map<std::string, Tensor>& cpu,
                      const std::string& name, const std::vector<double>& ref, double scaled, double rel,
                      double gpu_extra = 0.0) {
  attention::expect_near(gpu.at(name), ref, scaled, rel, "gpu " + name + " vs double", gpu_extra);
  attention::expect_near(cpu.at(name), ref, scaled, rel, "cpu " + name + " vs double");
  attention::expect_near(gpu.at(name), attention::doubles_of(cpu.at(name)), 2 * scaled, 2 * rel,
                         "gpu " + name + " vs cpu", gpu_extra);
}

// The kernels a run allows: only the FP32 ones, the tensor-core ones too,
// or cuDNN's SDPA first (the default).
enum class Allowed { fp32, tensor_cores, cudnn };

const char* allowed_name(Allowed a) {
  return a == Allowed::fp32           ? "FP32 kernels"
         : a == Allowed::tensor_cores ? "tensor-core kernels allowed"
                                      : "cuDNN allowed";
}

// Whether the case runs on the tensor-core kernels when they are allowed
// (their rule, fused_attention_tensor_cores.cuh; the test checks below that
// they did run, as their results differ from the FP32 kernels').
bool tensor_core_shape(const Problem& pb, DType dt) {
  return on_real_gpu() && dt != DType::f32 && (pb.d == 32 || pb.d == 64 || pb.d == 96 || pb.d == 128);
}

// Whether cuDNN's SDPA takes the case when allowed (attention_graph_applies'
// rule, the GPU's compute capability aside: sm_80 on).
bool cudnn_shape([[maybe_unused]] const Problem& pb, [[maybe_unused]] DType dt) {
#ifdef MIX_HAVE_CUDA
  return on_real_gpu() && mix::cuda::attention_graph_built() && dt != DType::f32 && pb.d % 8 == 0 && pb.d <= 256;
#else
  return false;
#endif
}

// How the op is fed: Q, K, V heads first or tokens first, or one packed QKV
// [B, T, 3, H, D] (the Transformer's; T = S only).
enum class Feed { heads_first, tokens_first, packed };

const char* feed_name(Feed f) {
  return f == Feed::heads_first ? "layout bhtd" : f == Feed::tokens_first ? "layout bthd" : "packed QKV";
}

// cuDNN builds a plan per shape and pass, which can take it seconds (its
// attention engines may be compiled at run time), and a GPU lend is short:
// cuDNN runs a subset of the cases that covers its variants (head_dim 32, 64,
// 96 and 128; causal with T = S, causal bottom-right aligned with T < S, and
// not causal; every way of feeding it), each in f16 and bf16.
bool cudnn_case(const Problem& pb, Feed feed) {
  if (pb.d == 64 && pb.t == 33 && pb.s == 33) return true;  // every feed
  if (feed == Feed::heads_first) return pb.d == 128;
  if (feed == Feed::packed) return pb.d == 96 || (pb.d == 32 && !pb.causal);
  return (pb.d == 32 && !pb.causal) || (pb.causal && pb.t < pb.s && pb.d == 64);
}

uint64_t cudnn_runs() {
#ifdef MIX_HAVE_CUDA
  return mix::cuda::attention_graph_runs();
#else
  return 0;
#endif
}

bool differs(const Tensor& a, const Tensor& b) { return a.to_floats() != b.to_floats(); }

// Sets which kernels fused_attention may run (cuda::set_tensor_core_attention,
// cuda::set_cudnn_attention) for the life of a scope, then back to the
// default: all of them.
struct KernelsAllowed {
  explicit KernelsAllowed(Allowed a) { set(a != Allowed::fp32, a == Allowed::cudnn); }
  ~KernelsAllowed() { set(true, true); }
  static void set([[maybe_unused]] bool tensor_cores, [[maybe_unused]] bool cudnn) {
#ifdef MIX_HAVE_CUDA
    mix::cuda::set_tensor_core_attention(tensor_cores);
    mix::cuda::set_cudnn_attention(cudnn);
#endif
  }
};

}  // namespace

TEST_CASE("cuda fused_attention: forward and gradients against the CPU twin", "[cuda][fused_attention]") {
  require_gpu();
  const std::vector<Problem> problems = {
      {{2, 3}, 1, 1, 8, true},       {{2, 3}, 7, 7, 32, false},    {{2, 3}, 7, 7, 32, true},
      {{1, 2}, 33, 33, 64, true},    {{1, 2}, 33, 33, 100, false}, {{2, 2}, 100, 100, 64, true},
      {{1, 2}, 100, 100, 128, true}, {{1, 1}, 33, 33, 256, true},  {{2, 2}, 20, 45, 64, true},
      {{2, 2}, 20, 45, 64, false},   {{1, 3}, 130, 130, 96, true}, {{1, 2}, 64, 64, 64, false},
  };
  uint64_t seed = 500;
  for (const Problem& pb : problems) {
    for (DType dt : kFloatTypes) {
      INFO(pb.describe() << ", " << dname(dt));
      const Inputs in = attention::make_inputs(pb, dt, seed += 10);
      const attention::Reference ref = attention::reference_attention(pb, in);
      const double u = attention::half_ulp(dt), fp32_err = pb.f32_err();
      for (Feed feed : {Feed::heads_first, Feed::tokens_first, Feed::packed}) {
        if (feed == Feed::packed && pb.t != pb.s) continue;  // Q, K and V share their tokens
        const bool tokens_first = feed != Feed::heads_first, packed = feed == Feed::packed;
        INFO(feed_name(feed));
        auto fed = [&](const Tensor& t) { return tokens_first ? attention::swap_tokens_and_heads(t) : t; };
        // The results heads first, as the reference has them (LSE is heads first in both layouts).
        auto heads_first = [&](Both b, std::initializer_list<const char*> names) {
          if (tokens_first)
            for (const char* n : names) {
              b.cpu[n] = attention::swap_tokens_and_heads(b.cpu.at(n));
              b.gpu[n] = attention::swap_tokens_and_heads(b.gpu.at(n));
            }
          return b;
        };
        std::map<std::string, Tensor> fp32_kernels;  // the FP32 kernels' Out and dV, to tell the others ran
        for (Allowed allowed : {Allowed::fp32, Allowed::tensor_cores, Allowed::cudnn}) {
          if (allowed == Allowed::cudnn && !cudnn_case(pb, feed)) continue;
          const KernelsAllowed choice(allowed);
          INFO(allowed_name(allowed));
          const bool cudnn_expected = allowed == Allowed::cudnn && cudnn_shape(pb, dt);
          const bool rounds_p = allowed != Allowed::fp32 && (tensor_core_shape(pb, dt) || cudnn_expected);
          auto allowance = [&](double terms_magnitude, int64_t terms, double other_factor) {
            return rounds_p ? attention::tensor_core_allowance(dt, terms_magnitude, terms, other_factor) : 0.0;
          };
          const uint64_t cudnn_before = cudnn_runs();

          OneOp fwd;
          const std::string layout = tokens_first ? "bthd" : "bhtd";
          const std::map<std::string, std::vector<std::string>> qkv_slots =
              packed ? std::map<std::string, std::vector<std::string>>{{"QKV", {"qkv"}}}
                     : std::map<std::string, std::vector<std::string>>{{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}};
          fwd.op = make_op("fused_attention", qkv_slots, {{"Out", {"out"}}, {"LSE", {"lse"}}},
                           {{"scale", pb.scale()}, {"causal", pb.causal}, {"layout", layout}});
          if (packed)
            fwd.feeds = {{"qkv", attention::pack_qkv(to_dtype(in.q, dt), to_dtype(in.k, dt), to_dtype(in.v, dt))}};
          else
            fwd.feeds = {
                {"q", fed(to_dtype(in.q, dt))}, {"k", fed(to_dtype(in.k, dt))}, {"v", fed(to_dtype(in.v, dt))}};
          const Both f_as_run = run_both(fwd, {"out", "lse"});
          const Both f = heads_first(f_as_run, {"out"});
          REQUIRE(f.gpu.at("out").dtype() == dt);
          REQUIRE(f.gpu.at("lse").dtype() == DType::f32);
          expect_both_near(f.gpu, f.cpu, "out", ref.out, fp32_err, u, allowance(ref.out_terms, pb.s, 1.0));
          // LSE comes from the FP32 scores and sums on either kernel.
          expect_both_near(f.gpu, f.cpu, "lse", ref.lse, fp32_err, fp32_err);

          OneOp grad;
          std::map<std::string, std::vector<std::string>> grad_ins = qkv_slots;
          grad_ins.insert({{"Out", {"out"}}, {"LSE", {"lse"}}, {"Out@GRAD", {"dout"}}});
          grad.op = make_op("fused_attention_grad", grad_ins,
                            packed ? std::map<std::string, std::vector<std::string>>{{"QKV@GRAD", {"dqkv"}}}
                                   : std::map<std::string, std::vector<std::string>>{{"Q@GRAD", {"dq"}},
                                                                                     {"K@GRAD", {"dk"}},
                                                                                     {"V@GRAD", {"dv"}}},
                            {{"scale", pb.scale()}, {"causal", pb.causal}, {"layout", layout}});
          grad.feeds = fwd.feeds;
          grad.feeds.emplace_back("out", f_as_run.cpu.at("out"));
          grad.feeds.emplace_back("lse", f_as_run.cpu.at("lse"));
          grad.feeds.emplace_back("dout", fed(to_dtype(in.r, dt)));
          Both g;
          if (packed) {
            // dQ, dK and dV are the parts of QKV@GRAD, heads first.
            const Both dqkv = run_both(grad, {"dqkv"});
            const char* names[3] = {"dq", "dk", "dv"};
            for (int64_t part = 0; part < 3; ++part) {
              g.cpu[names[part]] = attention::unpack_qkv(dqkv.cpu.at("dqkv"), part);
              g.gpu[names[part]] = attention::unpack_qkv(dqkv.gpu.at("dqkv"), part);
            }
          } else {
            g = heads_first(run_both(grad, {"dq", "dk", "dv"}), {"dq", "dk", "dv"});
          }
          // As in test_fused_attention.cc: dQ and dK read the stored Out through
          // delta, a few half ulps of the terms; dV only its own rounding.
          const double grad_scaled = dt == DType::f32 ? fp32_err : 4 * u;
          expect_both_near(g.gpu, g.cpu, "dq", ref.dq, grad_scaled, u, allowance(ref.dq_terms, pb.s, 2 * pb.scale()));
          expect_both_near(g.gpu, g.cpu, "dk", ref.dk, grad_scaled, u, allowance(ref.dk_terms, pb.t, 2 * pb.scale()));
          expect_both_near(g.gpu, g.cpu, "dv", ref.dv, dt == DType::f32 ? fp32_err : u, u,
                           allowance(ref.dv_terms, pb.t, 1.0));

          const uint64_t cudnn_passes = cudnn_runs() - cudnn_before;
          if (allowed == Allowed::fp32) {
            fp32_kernels = {{"out", f.gpu.at("out")}, {"dv", g.gpu.at("dv")}};
          } else if (allowed == Allowed::tensor_cores && tensor_core_shape(pb, dt)) {
            // Rounding P to 16 bits changes some bits of Out or dV: the tensor-core kernels did run.
            CHECK((differs(f.gpu.at("out"), fp32_kernels.at("out")) || differs(g.gpu.at("dv"), fp32_kernels.at("dv"))));
          }
          if (!cudnn_expected) {
            CHECK(cudnn_passes == 0);
          } else if (pb.t == pb.s && (pb.d == 64 || pb.d == 128)) {
            CHECK(cudnn_passes == 2);  // forward and backward on cuDNN
          } else if (cudnn_passes != 2) {
            WARN("cuDNN ran " << cudnn_passes << " of the 2 passes of " << pb.describe() << ", " << dname(dt)
                              << "; the own kernels ran the rest (the log above says why)");
          }
        }
      }
    }
  }
}

TEST_CASE("cuda fused_attention: only the wanted gradients are written", "[cuda][fused_attention]") {
  require_gpu();
  // dV alone (the dK/dV kernels write dK to scratch), and dQ alone, on the
  // FP32 kernels (f32, head_dim 16), and in f16 (head_dim 32) on the
  // tensor-core ones and then with cuDNN allowed (its pass writes all three,
  // the unwanted ones to scratch).
  struct Run {
    Problem pb;
    DType dt;
    Allowed allowed;
  };
  for (const auto& [pb, dt, allowed] : {Run{{{2}, 9, 9, 16, true}, DType::f32, Allowed::fp32},
                                        Run{{{2}, 9, 9, 32, true}, DType::f16, Allowed::tensor_cores},
                                        Run{{{2}, 9, 9, 32, true}, DType::f16, Allowed::cudnn}}) {
    INFO(pb.describe() << ", " << dname(dt) << ", " << allowed_name(allowed));
    const KernelsAllowed choice(allowed);
    const Inputs in = attention::make_inputs(pb, dt, 3);
    const attention::Reference ref = attention::reference_attention(pb, in);
    const double u = dt == DType::f32 ? 0x1p-24 : attention::half_ulp(dt);
    OneOp fwd;
    fwd.op = make_op("fused_attention", {{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}},
                     {{"Out", {"out"}}, {"LSE", {"lse"}}}, {{"causal", true}});
    fwd.feeds = {{"q", to_dtype(in.q, dt)}, {"k", to_dtype(in.k, dt)}, {"v", to_dtype(in.v, dt)}};
    const Both f = run_both(fwd, {"out", "lse"});
    for (const char* slot : {"V@GRAD", "Q@GRAD"}) {
      INFO(slot);
      const bool dv = std::string(slot) == "V@GRAD";
      OneOp grad;
      grad.op = make_op(
          "fused_attention_grad",
          {{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}, {"Out", {"out"}}, {"LSE", {"lse"}}, {"Out@GRAD", {"dout"}}},
          {{slot, {"d"}}}, {{"causal", true}});
      grad.feeds = fwd.feeds;
      grad.feeds.emplace_back("out", f.cpu.at("out"));
      grad.feeds.emplace_back("lse", f.cpu.at("lse"));
      grad.feeds.emplace_back("dout", to_dtype(in.r, dt));
      const Both g = run_both(grad, {"d"});
      // The bounds of the test above: f32 on the FP32 kernels, f16 on the tensor-core ones (or cuDNN's).
      const double scaled = dt == DType::f32 ? pb.f32_err() : dv ? u : 4 * u;
      const double extra = dt == DType::f32 ? 0.0
                           : dv             ? attention::tensor_core_allowance(dt, ref.dv_terms, pb.t, 1.0)
                                            : attention::tensor_core_allowance(dt, ref.dq_terms, pb.s, 2 * pb.scale());
      expect_both_near(g.gpu, g.cpu, "d", dv ? ref.dv : ref.dq, scaled, u, extra);
    }
  }
}

TEST_CASE("cuda fused_attention: the backward gives the same bits when run again", "[cuda][fused_attention]") {
  require_gpu();
  // Steps are reproducible bit for bit (docs/design.md): the own kernels
  // use no atomics, and cuDNN is asked for its deterministic algorithm
  // (cudnn_attention_graph.cc). Each backward runs twice on the same inputs.
  const Problem pb{{1, 2}, 33, 33, 64, true};
  for (DType dt : {DType::f16, DType::bf16}) {
    for (Allowed allowed : {Allowed::tensor_cores, Allowed::cudnn}) {
      INFO(pb.describe() << ", " << dname(dt) << ", " << allowed_name(allowed));
      const KernelsAllowed choice(allowed);
      const Inputs in = attention::make_inputs(pb, dt, 77);
      OneOp fwd;
      fwd.op = make_op("fused_attention", {{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}},
                       {{"Out", {"out"}}, {"LSE", {"lse"}}}, {{"causal", true}});
      fwd.feeds = {{"q", to_dtype(in.q, dt)}, {"k", to_dtype(in.k, dt)}, {"v", to_dtype(in.v, dt)}};
      const Both f = run_both(fwd, {"out", "lse"});
      OneOp grad;
      grad.op = make_op(
          "fused_attention_grad",
          {{"Q", {"q"}}, {"K", {"k"}}, {"V", {"v"}}, {"Out", {"out"}}, {"LSE", {"lse"}}, {"Out@GRAD", {"dout"}}},
          {{"Q@GRAD", {"dq"}}, {"K@GRAD", {"dk"}}, {"V@GRAD", {"dv"}}}, {{"causal", true}});
      grad.feeds = fwd.feeds;
      grad.feeds.emplace_back("out", f.cpu.at("out"));
      grad.feeds.emplace_back("lse", f.cpu.at("lse"));
      grad.feeds.emplace_back("dout", to_dtype(in.r, dt));
      const uint64_t cudnn_before = cudnn_runs();
      const Both first = run_both(grad, {"dq", "dk", "dv"});
      const Both again = run_both(grad, {"dq", "dk", "dv"});
      if (allowed == Allowed::cudnn && cudnn_shape(pb, dt)) CHECK(cudnn_runs() - cudnn_before == 2);
      for (const char* name : {"dq", "dk", "dv"})
        expect_identical(again.gpu.at(name), first.gpu.at(name), std::string(name) + " run again");
    }
  }
}
