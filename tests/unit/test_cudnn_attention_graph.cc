// fused_attention's cuDNN path (runtime/cuda/cudnn_attention_graph.cc) as far
// as a machine without a GPU can take it: each graph mixtrain describes to
// cuDNN's frontend (the SDPA node, its tensors' dims, strides and ids, the
// masks, the statistics' type, the deterministic backward) passes the
// frontend's validation for sm_80 (A100) and sm_90 (H100, H200), which needs
// no handle and no GPU when told the target; and a shape cuDNN cannot take is
// refused there with a message. Whether cuDNN then has an
// engine for the graph, and what it computes, only a GPU can tell:
// test_cuda_fused_attention checks that against the CPU twin.
//
// Runs in CUDA builds with the frontend's headers (scripts/setup.sh installs
// them where nvcc is); elsewhere it exits 77, which CTest reports as skipped.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>

#ifdef MIX_HAVE_CUDA
#include "runtime/cuda/cudnn_attention_graph.h"
#endif

#ifdef MIX_HAVE_CUDA

using mix::DType;
using mix::cuda::AttentionGraphShape;
using mix::cuda::validate_attention_graph;

namespace {

void require_frontend() {
  if (mix::cuda::attention_graph_built()) return;
  std::cerr << "skipped: " << mix::cuda::attention_graph_description() << "\n";
  std::exit(77);
}

std::string describe(const AttentionGraphShape& s) {
  return std::string(s.backward ? "backward" : "forward") + (s.dtype == DType::bf16 ? " bf16" : " f16") + " batch " +
         std::to_string(s.batch) + " heads " + std::to_string(s.heads) + " T " + std::to_string(s.t_q) + " S " +
         std::to_string(s.t_k) + " d " + std::to_string(s.d) + (s.causal ? " causal" : "") +
         (s.packed         ? " packed"
          : s.tokens_first ? " tokens first"
                           : "");
}

}  // namespace

TEST_CASE("cuDNN attention graphs: the models' shapes pass the frontend's validation", "[attention][cudnn]") {
  require_frontend();
  // GPT-2 124M (batch 8 x 12 heads, context 1024, head_dim 64) and the
  // Transformer-base (32 x 8 heads, context 256) as the models feed them
  // (packed QKV, tokens first), GPT-2 tokens first and heads first, head_dim
  // 128, a causal problem with fewer queries than keys (bottom-right aligned),
  // a non-causal one and odd lengths.
  const AttentionGraphShape shapes[] = {
      {false, DType::f16, 8, 12, 1024, 1024, 64, true, 0.125f, true, true},
      {false, DType::f16, 32, 8, 256, 256, 64, true, 0.125f, true, true},
      {false, DType::f16, 8, 12, 1024, 1024, 64, true, 0.125f, true},
      {false, DType::f16, 8, 12, 1024, 1024, 64, true, 0.125f, false},
      {false, DType::f16, 4, 1, 100, 100, 128, true, 0.0883883f, false},
      {false, DType::f16, 2, 2, 20, 45, 64, true, 0.125f, true},
      {false, DType::f16, 6, 1, 33, 33, 32, false, 0.1767767f, false},
  };
  for (const AttentionGraphShape& base : shapes) {
    for (DType dt : {DType::f16, DType::bf16}) {
      for (bool backward : {false, true}) {
        for (int sm : {80, 90}) {
          AttentionGraphShape s = base;
          s.dtype = dt;
          s.backward = backward;
          INFO(describe(s) << " on sm_" << sm);
          const std::string why = validate_attention_graph(s, sm);
          INFO(why);
          CHECK(why.empty());
        }
      }
    }
  }
}

TEST_CASE("cuDNN attention graphs: what cuDNN cannot take is refused by the validation", "[attention][cudnn]") {
  require_frontend();
  // cuDNN's SDPA needs head_dim a multiple of 8, and its forward a GPU of
  // sm_80 or later (attention_graph_applies() sends it neither); the frontend
  // says so before any GPU is involved (its backward's validation has no
  // architecture check), so the validation above is not one that passes
  // everything, and it does take the target it is given.
  const AttentionGraphShape odd_dim_forward{false, DType::f16, 2, 1, 64, 64, 12, true, 0.2886751f};
  AttentionGraphShape odd_dim_backward = odd_dim_forward;
  odd_dim_backward.backward = true;
  const AttentionGraphShape forward{false, DType::f16, 2, 1, 64, 64, 64, true, 0.125f};
  for (const auto& [s, sm] :
       {std::pair{odd_dim_forward, 90}, std::pair{odd_dim_backward, 90}, std::pair{forward, 75}}) {
    INFO(describe(s) << " on sm_" << sm);
    const std::string why = validate_attention_graph(s, sm);
    INFO(why);
    CHECK_FALSE(why.empty());
  }
}

#else  // a build without CUDA

TEST_CASE("cuDNN attention graphs: built without CUDA", "[attention][cudnn]") {
  std::cerr << "skipped: built without CUDA\n";
  std::exit(77);
}

#endif
