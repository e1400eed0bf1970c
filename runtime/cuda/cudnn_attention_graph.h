#pragma once
// fused_attention through cuDNN's scaled dot-product attention: the SDPA
// node of cuDNN's frontend (NVIDIA's header-only C++ API over the graph
// backend that the convolutions use), which cuDNN runs on its
// flash-attention engines. The op's launchers (runtime/ops/cuda/fused_attention.cu)
// try it first and run mixtrain's own kernels where it does not apply or
// cuDNN has no plan.
//
// Why cuDNN first: its engines are NVIDIA's own for each GPU generation
// (Hopper's among them), what llm.c and PyTorch's cuDNN backend of
// scaled_dot_product_attention run; mixtrain's own kernels stay as the
// fallback and as the paths that are checked on the CPU, by emulation.
//
// The plans: one graph per shape and pass (forward: Out and LSE from Q, K, V;
// backward: dQ, dK and dV from Q, K, V, Out, dOut and LSE), built on first
// use with cuDNN's heuristics and cached, as the convolutions' plans. The
// backward asks for cuDNN's deterministic algorithm (mixtrain's backward
// passes are deterministic): where cuDNN has none, that shape runs the own
// kernels, warned once. The masks are the op's: causal is bottom-right
// aligned (query i sees keys up to i + S - T, the same as top-left when
// T = S). LSE is the natural-log sum of exp(scale * q.k) over the keys a
// query sees, as cuDNN's softmax stats, so either side's forward serves
// either side's backward.
//
// Rounding points: cuDNN's engines round P (and the backward's dS) to the
// input dtype before their products, as the tensor-core kernels do
// (runtime/ops/cuda/fused_attention_tensor_cores.cu); the [cuda] test holds
// both to the same bound against the CPU twin.
//
// Without the frontend's headers at build time (CMake says so) this path is
// left out and attention_graph_applies() is always false.
#include <cudnn.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "runtime/core/device.h"
#include "runtime/core/dtype.h"

namespace mix::cuda {

/// One pass of fused_attention as cuDNN sees it: batch x heads independent
/// problems of t_q queries against t_k keys of head_dim d. Q, Out, dOut and
/// dQ are [batch, heads, t_q, d] (K, V, dK, dV with t_k), or with
/// tokens_first [batch, t_q, heads, d], dense either way; with packed (tokens
/// first, t_q = t_k) Q, K and V, and dQ, dK and dV, are the three parts of one
/// [batch, t_q, 3, heads, d] tensor each (rows 3 * heads * d apart, the
/// parts heads * d). LSE is [batch, heads, t_q], FP32.
struct AttentionGraphShape {
  bool backward = false;
  DType dtype = DType::f16;
  int64_t batch = 0, heads = 1, t_q = 0, t_k = 0, d = 0;
  bool causal = false;
  float scale = 1.f;
  bool tokens_first = false;
  bool packed = false;
};

/// Whether the SDPA path was compiled in (the frontend's headers found).
bool attention_graph_built();

/// Whether cuDNN's SDPA is tried for `shape`: compiled in,
/// cuda::cudnn_attention() and cuda::tensor_core_attention() on, FP16 or BF16,
/// head_dim a multiple of 8 up to 256, 16-byte aligned `tensors`, sm_80 or
/// later, and every dim in cuDNN's int32 range. cuDNN may still find no plan
/// (the run_* functions then return false).
bool attention_graph_applies(const AttentionGraphShape& shape, std::initializer_list<const void*> tensors);

/// Out and LSE from Q, K and V on `handle`'s stream. False when cuDNN has no
/// plan for the shape (warned once per shape): the caller runs its own kernels.
bool run_attention_graph_forward(cudnnHandle_t handle, Device device, const AttentionGraphShape& shape, const void* q,
                                 const void* k, const void* v, void* out, float* lse);

/// dQ, dK and dV (all three written) from Q, K, V, Out, dOut and LSE. False as
/// above.
bool run_attention_graph_backward(cudnnHandle_t handle, Device device, const AttentionGraphShape& shape, const void* q,
                                  const void* k, const void* v, const void* out, const void* dout, const float* lse,
                                  void* dq, void* dk, void* dv);

/// Passes run on cuDNN (true returned) in this process: tests tell by it that
/// cuDNN ran, not the own kernels, which compute nearly the same.
uint64_t attention_graph_runs();

/// For tests: describes `shape`'s graph to the frontend and runs its
/// validation as for a GPU of compute capability `target_sm` (90: sm_90),
/// which needs no handle and no GPU (cuDNN's own checks of the graph, when
/// plans are built, do). "" when valid, else the frontend's message (without
/// the frontend: why the path is not built).
std::string validate_attention_graph(const AttentionGraphShape& shape, int target_sm);

/// "cuDNN frontend X.Y.Z" or why the path is not compiled in, for logs.
std::string attention_graph_description();

}  // namespace mix::cuda
