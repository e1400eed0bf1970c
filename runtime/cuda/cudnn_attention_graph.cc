#include "runtime/cuda/cudnn_attention_graph.h"

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "runtime/core/check.h"
#include "runtime/core/library_versions.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cudnn_util.h"

#if MIX_HAVE_CUDNN_FRONTEND
// The frontend's JSON serialisation is not used; leaving it out keeps its own
// copy of nlohmann-json out of this file.
#define CUDNN_FRONTEND_SKIP_JSON_LIB 1
#include <cudnn_frontend.h>
#endif

namespace mix::cuda {
namespace {

std::atomic<uint64_t> g_runs{0};  // passes run on cuDNN: attention_graph_runs()

bool compute_capability_8_or_more() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major >= 8;
}

}  // namespace

bool attention_graph_applies(const AttentionGraphShape& s, std::initializer_list<const void*> tensors) {
  if (!attention_graph_built() || !cudnn_attention() || !tensor_core_attention()) return false;
  if (s.dtype != DType::f16 && s.dtype != DType::bf16) return false;
  if (s.d % 8 != 0 || s.d > 256) return false;
  // cuDNN's dims and strides are int64, but its kernels index in int32.
  constexpr int64_t kInt32 = INT32_MAX;
  const int64_t per_batch = s.heads * std::max(s.t_q, s.t_k) * s.d * (s.packed ? 3 : 1);
  if (s.batch * s.heads > kInt32 || per_batch > kInt32 || s.batch * per_batch > kInt32) return false;
  for (const void* p : tensors)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  static const bool capable = compute_capability_8_or_more();
  return capable;
}

uint64_t attention_graph_runs() { return g_runs.load(std::memory_order_relaxed); }

#if MIX_HAVE_CUDNN_FRONTEND

namespace {

namespace fe = cudnn_frontend;
using fe::graph::Graph;

[[maybe_unused]] const bool registered =
    register_library_version("cuDNN frontend", std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
                                                   std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
                                                   std::to_string(CUDNN_FRONTEND_PATCH_VERSION));
using fe::graph::Tensor_attributes;

// The tensors' ids in a graph's variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kOut, kLse, kDOut, kDQ, kDK, kDV };

fe::DataType_t fe_type(DType t) { return t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF; }

// cuDNN's attention tensors have dims [batch, heads, tokens, head_dim] and
// any strides: dense heads first, or dense tokens first ([batch, tokens,
// heads, head_dim] in memory). The statistics are [batch, heads, tokens, 1],
// heads first always.
std::vector<int64_t> data_dims(const AttentionGraphShape& s, int64_t tokens) { return {s.batch, s.heads, tokens, s.d}; }
std::vector<int64_t> data_strides(const AttentionGraphShape& s, int64_t tokens) {
  const int64_t h = s.heads, d = s.d;
  if (s.tokens_first) return {tokens * h * d, d, h * d, 1};
  return {h * tokens * d, tokens * d, d, 1};
}
// Q, K and V (and their gradients): packed, a row of the [batch, tokens, 3,
// heads, head_dim] tensor holds all three.
std::vector<int64_t> qkv_strides(const AttentionGraphShape& s, int64_t tokens) {
  if (!s.packed) return data_strides(s, tokens);
  const int64_t h = s.heads, d = s.d;
  return {tokens * 3 * h * d, d, 3 * h * d, 1};
}
std::vector<int64_t> stats_dims(const AttentionGraphShape& s) { return {s.batch, s.heads, s.t_q, 1}; }
std::vector<int64_t> stats_strides(const AttentionGraphShape& s) { return {s.heads * s.t_q, s.t_q, 1, 1}; }

// A built graph, its workspace, or why cuDNN gave none.
struct Entry {
  std::shared_ptr<Graph> graph;
  int64_t workspace = 0;
  bool usable = false;
  std::string why;
};

template <typename Attributes>
void set_mask(const AttentionGraphShape& s, Attributes& a) {
  if (!s.causal) return;
  if (s.t_q == s.t_k)
    a.set_causal_mask(true);
  else
    a.set_causal_mask_bottom_right(true);
}

// `s`'s graph, as described to the frontend (nothing built yet); for a GPU of
// compute capability `target_sm` when above 0, else the current device's.
// (Each node takes the graph's settings when added, so the target comes first.)
std::shared_ptr<Graph> describe_graph(const AttentionGraphShape& s, int target_sm = 0) {
  auto g = std::make_shared<Graph>();
  if (target_sm > 0) g->set_sm_version(target_sm);
  g->set_io_data_type(fe_type(s.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto input = [&](const char* name, Uid uid, int64_t tokens, bool part_of_qkv) {
    return g->tensor(Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim(data_dims(s, tokens))
                         .set_stride(part_of_qkv ? qkv_strides(s, tokens) : data_strides(s, tokens)));
  };
  auto q = input("Q", kQ, s.t_q, true), k = input("K", kK, s.t_k, true), v = input("V", kV, s.t_k, true);
  if (!s.backward) {
    auto attributes =
        fe::graph::SDPA_attributes().set_name("fused_attention").set_generate_stats(true).set_attn_scale(s.scale);
    set_mask(s, attributes);
    auto [out, lse] = g->sdpa(q, k, v, attributes);
    out->set_output(true).set_uid(kOut).set_dim(data_dims(s, s.t_q)).set_stride(data_strides(s, s.t_q));
    lse->set_output(true)
        .set_uid(kLse)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dims(s))
        .set_stride(stats_strides(s));
  } else {
    auto out = input("Out", kOut, s.t_q, false), dout = input("dOut", kDOut, s.t_q, false);
    auto lse = g->tensor(Tensor_attributes()
                             .set_name("LSE")
                             .set_uid(kLse)
                             .set_data_type(fe::DataType_t::FLOAT)
                             .set_dim(stats_dims(s))
                             .set_stride(stats_strides(s)));
    auto attributes = fe::graph::SDPA_backward_attributes()
                          .set_name("fused_attention_grad")
                          .set_attn_scale(s.scale)
                          .set_deterministic_algorithm(true);
    set_mask(s, attributes);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, out, dout, lse, attributes);
    dq->set_output(true).set_uid(kDQ).set_dim(data_dims(s, s.t_q)).set_stride(qkv_strides(s, s.t_q));
    dk->set_output(true).set_uid(kDK).set_dim(data_dims(s, s.t_k)).set_stride(qkv_strides(s, s.t_k));
    dv->set_output(true).set_uid(kDV).set_dim(data_dims(s, s.t_k)).set_stride(qkv_strides(s, s.t_k));
  }
  return g;
}

// Builds `s`'s graph into `e`: on failure e.usable stays false and e.why says where.
void build(cudnnHandle_t handle, const AttentionGraphShape& s, Entry& e) {
  std::shared_ptr<Graph> g = describe_graph(s);
  auto step = [&](const char* what, fe::error_t err) {
    if (err.is_good()) return true;
    e.why = std::string(what) + ": " + err.get_message();
    return false;
  };
  if (!step("validate", g->validate())) return;
  if (!step("build_operation_graph", g->build_operation_graph(handle))) return;
  if (!step("create_execution_plans", g->create_execution_plans({fe::HeurMode_t::A}))) return;
  if (!step("check_support", g->check_support(handle))) return;
  if (!step("build_plans", g->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE))) return;
  int64_t bytes = 0;
  if (!step("get_workspace_size", g->get_workspace_size(bytes))) return;
  e.graph = std::move(g);
  e.workspace = bytes;
  e.usable = true;
}

std::string describe(const AttentionGraphShape& s) {
  return std::string(s.backward ? "backward" : "forward") + " pass of " + std::string(dtype_name(s.dtype)) +
         " attention, batch " + std::to_string(s.batch) + " x " + std::to_string(s.heads) + " heads of " +
         std::to_string(s.t_q) + " queries and " + std::to_string(s.t_k) + " keys, head_dim " + std::to_string(s.d) +
         (s.packed         ? ", packed"
          : s.tokens_first ? ", tokens first"
                           : "") +
         (s.causal ? ", causal" : "");
}

using Key =
    std::tuple<bool, int, int64_t, int64_t, int64_t, int64_t, int64_t, bool, uint32_t, bool, bool, int, uintptr_t>;

Key key_of(const AttentionGraphShape& s, Device device, cudnnHandle_t handle) {
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &s.scale, sizeof scale_bits);
  return {s.backward,
          static_cast<int>(s.dtype),
          s.batch,
          s.heads,
          s.t_q,
          s.t_k,
          s.d,
          s.causal,
          scale_bits,
          s.tokens_first,
          s.packed,
          device.index,
          reinterpret_cast<uintptr_t>(handle)};
}

std::mutex g_mu;
// Never destroyed (as the convolutions' plans): graphs handed back to cuDNN
// from a static destructor could outlive the library's own state.
std::map<Key, std::shared_ptr<Entry>>& g_graphs = *new std::map<Key, std::shared_ptr<Entry>>;

// The cached graph of `s`, built (and, when cuDNN has none, warned) on first use.
std::shared_ptr<Entry> graph_for(cudnnHandle_t handle, Device device, const AttentionGraphShape& s) {
  const Key key = key_of(s, device, handle);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (auto it = g_graphs.find(key); it != g_graphs.end()) return it->second;
  }
  auto e = std::make_shared<Entry>();
  try {
    build(handle, s, *e);
  } catch (const std::exception& ex) {  // the frontend throws on some misuse; treat it as no plan
    e->usable = false;
    e->why = ex.what();
  }
  discard_cudnn_last_error();  // engines ruled out are not errors for a later check to report
  if (e->usable)
    spdlog::info("fused_attention: cuDNN SDPA plan built for the {} ({} bytes of workspace)", describe(s),
                 e->workspace);
  else
    log_warning("fused_attention: cuDNN has no plan for the " + describe(s) + " (" + e->why +
                "); running mixtrain's own kernels for it");
  std::lock_guard<std::mutex> lock(g_mu);
  return g_graphs.emplace(key, e).first->second;
}

// Runs `e` with `pack`; false (and, unless a CUDA graph is recording, the
// shape marked unusable from now on, warned) when cuDNN refuses.
bool execute(cudnnHandle_t handle, Device device, const AttentionGraphShape& s, Entry& e,
             std::unordered_map<int64_t, void*>& pack) {
  Tensor ws;
  try {
    ws = device_workspace(static_cast<size_t>(e.workspace), device);
  } catch (const OutOfMemoryError&) {
    return false;  // this call on the own kernels, which need no workspace; the next tries again
  }
  const fe::error_t err = e.graph->execute(handle, pack, e.workspace > 0 ? ws.raw() : nullptr);
  if (err.is_good()) {
    g_runs.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  discard_cudnn_last_error();
  if (cudnn_stream_capturing(handle)) return false;  // the graph stays for the op-by-op steps that follow
  fe::error_t copy = err;
  log_warning("fused_attention: cuDNN refused to run its plan for the " + describe(s) + " (" + copy.get_message() +
              "); running mixtrain's own kernels for it");
  std::lock_guard<std::mutex> lock(g_mu);
  e.usable = false;
  return false;
}

void* mutable_ptr(const void* p) { return const_cast<void*>(p); }  // cuDNN's variant pack takes void*

}  // namespace

bool attention_graph_built() { return true; }

std::string validate_attention_graph(const AttentionGraphShape& shape, int target_sm) {
  try {
    // The target given, instead of asking the device, which a machine without a GPU has not.
    fe::error_t err = describe_graph(shape, target_sm)->validate();
    return err.is_good() ? std::string() : "validate: " + err.get_message();
  } catch (const std::exception& ex) {
    return std::string("describing the graph: ") + ex.what();
  }
}

std::string attention_graph_description() {
  return "cuDNN frontend " + std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
         std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." + std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
}

bool run_attention_graph_forward(cudnnHandle_t handle, Device device, const AttentionGraphShape& shape, const void* q,
                                 const void* k, const void* v, void* out, float* lse) {
  MIX_CHECK(!shape.backward, "run_attention_graph_forward: given a backward shape");
  std::shared_ptr<Entry> e = graph_for(handle, device, shape);
  if (!e->usable) return false;
  std::unordered_map<int64_t, void*> pack = {
      {kQ, mutable_ptr(q)}, {kK, mutable_ptr(k)}, {kV, mutable_ptr(v)}, {kOut, out}, {kLse, lse}};
  return execute(handle, device, shape, *e, pack);
}

bool run_attention_graph_backward(cudnnHandle_t handle, Device device, const AttentionGraphShape& shape, const void* q,
                                  const void* k, const void* v, const void* out, const void* dout, const float* lse,
                                  void* dq, void* dk, void* dv) {
  MIX_CHECK(shape.backward, "run_attention_graph_backward: given a forward shape");
  std::shared_ptr<Entry> e = graph_for(handle, device, shape);
  if (!e->usable) return false;
  std::unordered_map<int64_t, void*> pack = {{kQ, mutable_ptr(q)},
                                             {kK, mutable_ptr(k)},
                                             {kV, mutable_ptr(v)},
                                             {kOut, mutable_ptr(out)},
                                             {kDOut, mutable_ptr(dout)},
                                             {kLse, mutable_ptr(lse)},
                                             {kDQ, dq},
                                             {kDK, dk},
                                             {kDV, dv}};
  return execute(handle, device, shape, *e, pack);
}

#else  // built without the cuDNN frontend's headers

bool attention_graph_built() { return false; }

std::string validate_attention_graph(const AttentionGraphShape&, int) { return attention_graph_description(); }

std::string attention_graph_description() {
  return "not built: the cuDNN frontend's headers were not found (scripts/setup.sh installs them)";
}

bool run_attention_graph_forward(cudnnHandle_t, Device, const AttentionGraphShape&, const void*, const void*,
                                 const void*, void*, float*) {
  return false;
}

bool run_attention_graph_backward(cudnnHandle_t, Device, const AttentionGraphShape&, const void*, const void*,
                                  const void*, const void*, const void*, const float*, void*, void*, void*) {
  return false;
}

#endif

}  // namespace mix::cuda
