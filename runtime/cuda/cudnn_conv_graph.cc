#include "runtime/cuda/cudnn_conv_graph.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cudnn_util.h"

namespace mix::cuda {
namespace {

// cuDNN 9.19 deprecates naming the handle on the operation graph and the plan
// (newer releases also take a device-properties descriptor), but every 9.x
// still takes it, and NVIDIA's own frontend still sets it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr cudnnBackendAttributeName_t kGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

// A backend descriptor, destroyed with its owner.
class BackendDescriptor {
 public:
  BackendDescriptor() = default;
  explicit BackendDescriptor(cudnnBackendDescriptorType_t type) { status_ = cudnnBackendCreateDescriptor(type, &d_); }
  BackendDescriptor(const BackendDescriptor&) = delete;
  BackendDescriptor& operator=(const BackendDescriptor&) = delete;
  BackendDescriptor(BackendDescriptor&& o) noexcept : d_(std::exchange(o.d_, nullptr)), status_(o.status_) {}
  BackendDescriptor& operator=(BackendDescriptor&& o) noexcept {
    std::swap(d_, o.d_);
    std::swap(status_, o.status_);
    return *this;
  }
  ~BackendDescriptor() {
    if (d_) MIX_CUDNN_CHECK_NOTHROW(cudnnBackendDestroyDescriptor(d_));
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnStatus_t created() const { return status_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  cudnnStatus_t status_ = CUDNN_STATUS_SUCCESS;
};

// The first failing cuDNN call of a plan's construction: what, and its status.
struct Failure {
  const char* what;
  cudnnStatus_t status;
};

// Evaluates a cuDNN call; on failure returns a Failure from the enclosing function.
#define MIX_GRAPH_TRY(what, stmt)                                       \
  do {                                                                  \
    const cudnnStatus_t mix_graph_status_ = (stmt);                     \
    if (mix_graph_status_ != CUDNN_STATUS_SUCCESS)                      \
      return Failure{what, mix_graph_status_};                          \
  } while (0)

template <typename T>
cudnnStatus_t set_attr(const BackendDescriptor& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                       int64_t count, const T* values) {
  return cudnnBackendSetAttribute(d.get(), name, type, count, const_cast<T*>(values));
}
cudnnStatus_t set_desc(const BackendDescriptor& d, cudnnBackendAttributeName_t name, const BackendDescriptor& value) {
  cudnnBackendDescriptor_t v = value.get();
  return cudnnBackendSetAttribute(d.get(), name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

// The tensors' unique ids in the graph and in every call's variant pack.
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;

// Strides of a 4-d tensor whose dims are named [a, b, c, d] (NCHW order):
// row-major, or with b innermost (channels last).
std::array<int64_t, 4> strides_of(const std::array<int64_t, 4>& dims, bool channels_last) {
  const int64_t b = dims[1], h = dims[2], w = dims[3];
  if (channels_last) return {h * w * b, 1, w * b, b};
  return {b * h * w, h * w, w, 1};
}

std::optional<Failure> make_tensor(BackendDescriptor& t, int64_t uid, cudnnDataType_t dtype,
                                   const std::array<int64_t, 4>& dims, bool channels_last, int64_t alignment) {
  t = BackendDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  MIX_GRAPH_TRY("creating a tensor descriptor", t.created());
  const std::array<int64_t, 4> strides = strides_of(dims, channels_last);
  MIX_GRAPH_TRY("a tensor's data type", set_attr(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype));
  MIX_GRAPH_TRY("a tensor's dims", set_attr(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data()));
  MIX_GRAPH_TRY("a tensor's strides", set_attr(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data()));
  MIX_GRAPH_TRY("a tensor's id", set_attr(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
  MIX_GRAPH_TRY("a tensor's alignment",
                set_attr(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment));
  MIX_GRAPH_TRY("finalizing a tensor", cudnnBackendFinalize(t.get()));
  return std::nullopt;
}

// A shape's plan and what it was built from (cuDNN's plan refers to the
// engine configuration; the rest is kept with it so nothing it may read goes away).
struct Entry {
  std::vector<BackendDescriptor> keep;  // tensors, convolution, operation, graph, heuristics, configurations
  struct Ranked {
    const BackendDescriptor* config;
    bool deterministic;
  };
  std::vector<Ranked> ranked;  // the configurations that pass the notes, in order
  BackendDescriptor plan;
  size_t chosen = 0;  // index into `ranked` of the plan's configuration
  int64_t workspace = 0;
  bool deterministic = true;        // the chosen engine's notes
  std::atomic<bool> usable{false};  // false: the legacy API runs this shape
};

// What an engine configuration's notes say of it.
struct EngineNotes {
  bool allowed = false;           // its numerical notes keep to conv2d.cu's rules
  bool deterministic = true;      // no NONDETERMINISTIC note
  bool runtime_compiled = false;  // its kernel is compiled when the plan is built
};

// Whether runtime compilation builds the engine's kernel (its behavior notes;
// none readable counts as precompiled).
bool runtime_compiled(const BackendDescriptor& engine) {
  std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> notes{};
  int64_t count = 0;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               static_cast<int64_t>(notes.size()), &count, notes.data()) != CUDNN_STATUS_SUCCESS)
    return false;
  for (int64_t i = 0; i < std::min<int64_t>(count, static_cast<int64_t>(notes.size())); ++i)
    if (notes[static_cast<size_t>(i)] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) return true;
  return false;
}

// Reads the notes of `config`'s engine (not allowed when they cannot be read).
EngineNotes engine_notes(const BackendDescriptor& config, const ConvGraphShape& s) {
  EngineNotes r;
  BackendDescriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  if (engine.created() != CUDNN_STATUS_SUCCESS) return r;
  cudnnBackendDescriptor_t e = engine.get();
  int64_t got = 0;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got,
                               &e) != CUDNN_STATUS_SUCCESS)
    return r;
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  int64_t count = 0;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               static_cast<int64_t>(notes.size()), &count, notes.data()) != CUDNN_STATUS_SUCCESS)
    return r;
  for (int64_t i = 0; i < std::min<int64_t>(count, static_cast<int64_t>(notes.size())); ++i) {
    switch (notes[static_cast<size_t>(i)]) {
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:          // rounds the inputs to a narrower type first
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:  // sums in less than FP32
        return r;
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:  // FP32 data on tensor cores is TF32
        if (s.dtype == DType::f32 && !s.allow_tf32) return r;
        break;
      case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
        r.deterministic = false;
        break;
      default: break;
    }
  }
  r.allowed = true;
  r.runtime_compiled = runtime_compiled(engine);
  return r;
}

// The graph of one convolution pass and cuDNN's ranked configurations for it.
std::optional<Failure> build_graph(cudnnHandle_t handle, const ConvGraphShape& s, int64_t alignment, Entry& e) {
  const cudnnDataType_t dtype = cudnn_dtype(s.dtype, "conv2d");
  e.keep.reserve(16);
  BackendDescriptor x, w, y;
  if (auto f = make_tensor(x, kUidX, dtype, {s.dims.n, s.dims.c, s.dims.h, s.dims.w}, s.dims.channels_last, alignment))
    return f;
  if (auto f = make_tensor(w, kUidW, dtype, {s.dims.oc, s.dims.c_per_group(), s.dims.kh, s.dims.kw},
                           s.dims.channels_last, alignment))
    return f;
  if (auto f =
          make_tensor(y, kUidY, dtype, {s.dims.n, s.dims.oc, s.dims.oh, s.dims.ow}, s.dims.channels_last, alignment))
    return f;

  BackendDescriptor conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  MIX_GRAPH_TRY("creating the convolution descriptor", conv.created());
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;  // FP32 sums for every data type, as the legacy path
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const std::array<int64_t, 2> dilations{s.dims.dil_h, s.dims.dil_w}, strides{s.dims.stride_h, s.dims.stride_w},
      pads{s.dims.pad_h, s.dims.pad_w};
  MIX_GRAPH_TRY("the compute type", set_attr(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute));
  MIX_GRAPH_TRY("the mode", set_attr(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
  MIX_GRAPH_TRY("the spatial dims", set_attr(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial));
  MIX_GRAPH_TRY("the dilations", set_attr(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilations.data()));
  MIX_GRAPH_TRY("the strides", set_attr(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, strides.data()));
  MIX_GRAPH_TRY("the paddings", set_attr(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads.data()));
  MIX_GRAPH_TRY("the paddings", set_attr(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads.data()));
  MIX_GRAPH_TRY("finalizing the convolution", cudnnBackendFinalize(conv.get()));

  // The operation: which tensor plays which part in each pass.
  struct Slots {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  };
  Slots k{};
  switch (s.pass) {
    case ConvPass::forward:
      k = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
      break;
    case ConvPass::backward_data:
      k = {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
      break;
    case ConvPass::backward_filter:
      k = {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
      break;
  }
  BackendDescriptor op(k.type);
  MIX_GRAPH_TRY("creating the operation", op.created());
  const float alpha = 1.f, beta = 0.f;
  MIX_GRAPH_TRY("the operation's input", set_desc(op, k.x, x));
  MIX_GRAPH_TRY("the operation's filter", set_desc(op, k.w, w));
  MIX_GRAPH_TRY("the operation's output", set_desc(op, k.y, y));
  MIX_GRAPH_TRY("the operation's convolution", set_desc(op, k.conv, conv));
  MIX_GRAPH_TRY("alpha", set_attr(op, k.alpha, CUDNN_TYPE_FLOAT, 1, &alpha));
  MIX_GRAPH_TRY("beta", set_attr(op, k.beta, CUDNN_TYPE_FLOAT, 1, &beta));
  MIX_GRAPH_TRY("finalizing the operation", cudnnBackendFinalize(op.get()));

  BackendDescriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  MIX_GRAPH_TRY("creating the operation graph", graph.created());
  MIX_GRAPH_TRY("the graph's operation", set_desc(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, op));
  MIX_GRAPH_TRY("the graph's handle", set_attr(graph, kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle));
  MIX_GRAPH_TRY("finalizing the operation graph", cudnnBackendFinalize(graph.get()));

  cudnnBackendDescriptor_t graph_raw = graph.get();  // stays valid: the descriptor moves into e.keep
  for (BackendDescriptor* d : {&x, &w, &y, &conv, &op, &graph}) e.keep.push_back(std::move(*d));
  // Mode A's ranking, then the fallback list's (engines that run most shapes:
  // strict FP32 may find none in mode A once the tensor-core ones are dropped).
  // Only mode A's failure ends the build.
  std::vector<BackendDescriptor> configs;
  auto query = [&](cudnnBackendHeurMode_t heur_mode) -> std::optional<Failure> {
    BackendDescriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    MIX_GRAPH_TRY("creating the heuristics", heuristics.created());
    MIX_GRAPH_TRY("the heuristics' graph",
                  cudnnBackendSetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph_raw));
    MIX_GRAPH_TRY("the heuristics' mode",
                  set_attr(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &heur_mode));
    MIX_GRAPH_TRY("finalizing the heuristics", cudnnBackendFinalize(heuristics.get()));
    int64_t count = 0;
    MIX_GRAPH_TRY("counting the heuristics' results",
                  cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    std::vector<BackendDescriptor> mode_configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      mode_configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      MIX_GRAPH_TRY("creating an engine configuration", mode_configs.back().created());
      raw.push_back(mode_configs.back().get());
    }
    int64_t got = 0;
    if (count > 0)
      MIX_GRAPH_TRY("reading the heuristics' results",
                    cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()));
    mode_configs.resize(static_cast<size_t>(std::min(got, count)));
    for (BackendDescriptor& c : mode_configs) configs.push_back(std::move(c));
    e.keep.push_back(std::move(heuristics));
    return std::nullopt;
  };
  if (auto f = query(CUDNN_HEUR_MODE_A)) return f;
  (void)query(CUDNN_HEUR_MODE_FALLBACK);

  const size_t first_config = e.keep.size();
  for (BackendDescriptor& c : configs) e.keep.push_back(std::move(c));
  // Deterministic engines (no atomic adds) come first; within each kind,
  // precompiled engines come before runtime-compiled ones, whose plans have
  // been reported to take a second or more each to build (NVRTC): ResNet-50
  // has ~60 shapes and passes. A backward pass takes deterministic engines
  // only: with none, the legacy calls run it and choose as conv2d.cu does (a
  // deterministic algorithm first), so the graph path never makes a step
  // less repeatable than the legacy calls would.
  std::array<std::vector<Entry::Ranked>, 4> tiers;  // index: 2 * nondeterministic + runtime compiled
  for (size_t i = first_config; i < e.keep.size(); ++i) {
    const EngineNotes n = engine_notes(e.keep[i], s);
    if (!n.allowed) continue;
    if (!n.deterministic && s.pass != ConvPass::forward) continue;
    tiers[(n.deterministic ? 0 : 2) + (n.runtime_compiled ? 1 : 0)].push_back({&e.keep[i], n.deterministic});
  }
  for (const auto& tier : tiers) e.ranked.insert(e.ranked.end(), tier.begin(), tier.end());
  return std::nullopt;
}

// The plan of configuration `config` and its workspace, or the failure.
std::optional<Failure> build_plan(cudnnHandle_t handle, const BackendDescriptor& config, BackendDescriptor& plan,
                                  int64_t* workspace) {
  plan = BackendDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  MIX_GRAPH_TRY("creating a plan", plan.created());
  MIX_GRAPH_TRY("the plan's handle", set_attr(plan, kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle));
  MIX_GRAPH_TRY("the plan's configuration", set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config));
  MIX_GRAPH_TRY("finalizing a plan", cudnnBackendFinalize(plan.get()));
  int64_t got = 0;
  MIX_GRAPH_TRY("the plan's workspace", cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                                 CUDNN_TYPE_INT64, 1, &got, workspace));
  return std::nullopt;
}

// Runs `plan` with the three tensors and a workspace.
cudnnStatus_t execute(cudnnHandle_t handle, const BackendDescriptor& plan, void* x, void* w, void* y, void* workspace) {
  BackendDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  if (pack.created() != CUDNN_STATUS_SUCCESS) return pack.created();
  const std::array<int64_t, 3> uids{kUidX, kUidW, kUidY};
  std::array<void*, 3> pointers{x, w, y};
  cudnnStatus_t st = set_attr(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids.data());
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3,
                                  pointers.data());
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(pack.get());
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(handle, plan.get(), pack.get());
  return st;
}

// The largest power of two (at most 16) that divides every address: cuDNN
// may pick vectorised engines for the alignment a plan was built with.
int64_t alignment_of(std::initializer_list<const void*> pointers) {
  int64_t a = 16;
  for (const void* p : pointers)
    while (a > 1 && reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}

using Key = std::array<int64_t, 24>;

Key key_of(const ConvGraphShape& s, int device, int64_t alignment, cudnnHandle_t handle) {
  // clang-format off
  return {device, static_cast<int64_t>(s.pass), static_cast<int64_t>(s.dtype), s.allow_tf32 ? 1 : 0,
          s.dims.n, s.dims.c, s.dims.h, s.dims.w, s.dims.oc, s.dims.kh, s.dims.kw, s.dims.oh, s.dims.ow, s.dims.groups,
          s.dims.stride_h, s.dims.stride_w, s.dims.pad_h, s.dims.pad_w, s.dims.dil_h, s.dims.dil_w,
          s.dims.channels_last ? 1 : 0, alignment, static_cast<int64_t>(reinterpret_cast<uintptr_t>(handle)), 0};
  // clang-format on
}

std::mutex g_mu;
// Never destroyed (as conv2d.cu's algorithm cache): plans handed back to
// cuDNN from a static destructor could outlive the libraries' own state.
std::map<Key, std::shared_ptr<Entry>>& g_plans = *new std::map<Key, std::shared_ptr<Entry>>;
std::atomic<uint64_t> g_runs{0};  // passes run on the graph API: conv_graph_runs()

std::string describe(const ConvGraphShape& s) {
  return std::string(conv_pass_name(s.pass)) + " pass of " + conv_shape_text(s.dtype, s.dims);
}

// Chooses `e`'s plan: the first ranked configuration that builds, within
// the limit, whose workspace the device can give now (`ws` holds it).
// `*short_of_memory`: whether a configuration that built was skipped only
// because the device could not give its workspace at this moment.
bool choose_plan(cudnnHandle_t handle, Device device, Entry& e, size_t limit, Tensor& ws, std::string& why,
                 bool* short_of_memory) {
  *short_of_memory = false;
  for (size_t i = 0; i < e.ranked.size(); ++i) {
    BackendDescriptor plan;
    int64_t bytes = 0;
    if (auto f = build_plan(handle, *e.ranked[i].config, plan, &bytes)) {
      why = std::string(f->what) + ": " + cudnn_status_text(f->status);
      continue;
    }
    if (bytes < 0 || static_cast<size_t>(bytes) > limit) continue;
    try {
      ws = device_workspace(static_cast<size_t>(bytes), device);
    } catch (const OutOfMemoryError& oom) {
      why = oom.what();
      *short_of_memory = true;
      continue;
    }
    e.plan = std::move(plan);
    e.chosen = i;
    e.workspace = bytes;
    e.deterministic = e.ranked[i].deterministic;
    e.usable = true;
    return true;
  }
  return false;
}

}  // namespace

uint64_t conv_graph_runs() { return g_runs.load(std::memory_order_relaxed); }

bool run_conv_graph(cudnnHandle_t handle, Device device, const ConvGraphShape& shape, void* x, void* w, void* y,
                    size_t workspace_limit) {
  const int64_t alignment = alignment_of({x, w, y});
  const Key key = key_of(shape, device.index, alignment, handle);
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (auto it = g_plans.find(key); it != g_plans.end()) e = it->second;
  }
  Tensor ws;
  if (e && !e->usable) return false;  // no plan for this shape: the legacy API, warned when found
  const bool cached = e != nullptr;
  if (e) {
    try {
      ws = device_workspace(static_cast<size_t>(e->workspace), device);
    } catch (const OutOfMemoryError&) {
      e.reset();  // its workspace does not fit now: choose again, for this call
    }
  }
  if (!e) {
    auto fresh = std::make_shared<Entry>();
    std::string why = shape.pass == ConvPass::forward
                          ? "no engine configuration that keeps conv2d's numerics"
                          : "no deterministic engine configuration that keeps conv2d's numerics";
    bool short_of_memory = false;
    if (auto f = build_graph(handle, shape, alignment, *fresh))
      why = std::string(f->what) + ": " + cudnn_status_text(f->status);
    else
      choose_plan(handle, device, *fresh, workspace_limit, ws, why, &short_of_memory);  // sets usable
    discard_cudnn_last_error();  // configurations ruled out are not errors for a later check to report
    if (!fresh->usable && (short_of_memory || cached)) {
      // A plan exists but its workspace does not fit at this moment: the
      // legacy API (which can choose an algorithm with less) runs this call,
      // and the next call looks again. A cached plan stays cached, also when
      // choosing again found nothing else.
      return false;
    }
    if (!fresh->usable)
      log_warning("conv2d: cuDNN's graph API has no plan for the " + describe(shape) + " (" + why +
                  "); running the legacy API for it");
    else if (!fresh->deterministic)  // the forward pass only (above)
      log_warning("conv2d: cuDNN's graph API has no deterministic engine for the " + describe(shape) +
                  " that fits; running a nondeterministic one (the last bits may differ from run to run; ranks "
                  "still agree)");
    std::lock_guard<std::mutex> lock(g_mu);
    g_plans[key] = fresh;
    e = fresh;
    if (!e->usable) return false;
  }
  const cudnnStatus_t st = execute(handle, e->plan, x, w, y, e->workspace > 0 ? ws.raw() : nullptr);
  if (st == CUDNN_STATUS_SUCCESS) {
    g_runs.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  discard_cudnn_last_error();
  // Refused while a CUDA graph records the step: the legacy call fails too,
  // the recording is given up, and the op-by-op steps that follow may well
  // run this plan: it stays.
  if (cudnn_stream_capturing(handle)) return false;
  // Refused when run: the legacy API from now on for this shape (its own
  // checks then report a real error). An engine of several kernels may have
  // written part of the output; the legacy call overwrites it all (beta 0).
  log_warning("conv2d: cuDNN's graph API refused to run its plan for the " + describe(shape) + " (" +
              cudnn_status_text(st) + "); running the legacy API for it");
  e->usable = false;
  return false;
}

}  // namespace mix::cuda
