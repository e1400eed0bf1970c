#include "launch/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "amp/loss_scaler.h"
#include "collective/consistency.h"
#include "collective/grad_allreduce_pass.h"
#include "collective/overflow_mask.h"
#include "launch/checkpoint_state.h"
#include "launch/cli_checks.h"
#include "launch/evaluation.h"
#include "launch/metrics.h"
#include "launch/outlier_detector.h"
#include "launch/step_runner.h"
#include "launch/stop_signals.h"
#include "launch/train_program.h"
#include "launch/worker_main.h"
#include "models/model.h"
#include "runtime/core/check.h"
#include "runtime/core/device_backend.h"
#include "runtime/core/hash.h"
#include "runtime/core/log.h"
#include "runtime/data/batch_feeder.h"
#include "runtime/data/dataset.h"
#include "runtime/data/image_folder.h"
#include "runtime/data/image_shards.h"
#include "runtime/data/shard_stream_sampler.h"
#include "runtime/exec/executor.h"
#include "runtime/exec/init.h"
#include "runtime/exec/step_graph.h"
#include "runtime/io/checkpoint.h"
#include "runtime/io/checkpoint_files.h"
#include "runtime/io/safetensors.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/optim/lr_schedule.h"

namespace mix::launch {

namespace {

using Clock = std::chrono::steady_clock;
using collective::Communicator;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string format_eta(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(t / 3600),
                static_cast<long long>((t / 60) % 60), static_cast<long long>(t % 60));
  return buf;
}

data::TrainTest load_data(const TrainConfig& c) {
  if (c.data == DataSet::fashion_mnist) return data::load_fashion_mnist(c.data_dir);
  if (c.data == DataSet::safetensors) return data::load_safetensors_dataset(c.data_file);
  if (c.data == DataSet::fortunes) return data::load_byte_text(c.data_dir, c.context);
  if (c.data == DataSet::token_shards) return data::load_token_shards(c.data_dir, c.context, c.vocab, c.token_dtype);
  if (c.is_image_data()) {
    data::ImageFolderOptions o;
    o.transform.size = c.image_size ? *c.image_size : (c.model == "resnet-small" ? 32 : 224);
    o.transform.augment = c.augment == Augment::imagenet;
    o.transform.crop_scale = {c.crop_scale[0], c.crop_scale[1]};
    o.transform.hflip = c.hflip;
    // --mean and --std are the model's (pixel_input): the readers hand over 8-bit pixels.
    o.workers = static_cast<int>(c.data_workers.value_or(data::default_data_workers()));
    o.skip_bad_images = c.skip_bad_images;
    o.seed = c.seed;
    return c.data == DataSet::image_folder ? data::load_image_folder(c.data_dir, o)
                                           : data::load_image_shards(c.data_dir, o);
  }
  if (c.is_language_model()) {
    const int64_t n = c.synthetic_size.value_or(1024);
    return data::make_synthetic_tokens(n, std::max<int64_t>(n / 8, 1), c.context, c.vocab, c.seed);
  }
  if (c.is_resnet()) {
    // Images for the ResNets: 3 x 224 x 224 (32 x 32 for resnet-small) unless --image-size says otherwise.
    const int64_t size = c.image_size ? *c.image_size : (c.model == "resnet-small" ? 32 : 224);
    const int64_t n = c.synthetic_size.value_or(512);
    return data::make_synthetic_images(n, std::max<int64_t>(n / 8, 1), 3, size, c.synthetic_classes, c.seed);
  }
  const int64_t n = c.synthetic_size.value_or(8192);
  return data::make_synthetic(n, std::max<int64_t>(n / 8, 1), c.synthetic_features, c.synthetic_classes, c.seed);
}

// The model --model names, shaped for the data: the MLP takes flat features; a
// ResNet takes [C, H, W] images (flat square images such as Fashion-MNIST's 784
// pixels are read as one channel), or the image readers' u8 [H, W, C] pixels,
// which it normalises itself with --mean and --std.
models::Model build_model(const TrainConfig& c, const data::Dataset& train) {
  const Shape example = train.example_shape();
  const int64_t features = shape_numel(example);
  const int64_t classes = std::max<int64_t>(train.num_classes, 2);
  if (c.is_language_model()) {
    models::TransformerConfig tc;
    tc.layers = c.layers;
    tc.d_model = c.d_model;
    tc.heads = c.heads;
    tc.context = c.context;
    tc.vocab = c.vocab;
    tc.vocab_multiple = c.vocab_multiple;
    tc.tie_weights = c.tie_weights;
    tc.dropout = c.dropout;
    tc.seed = c.seed;
    tc.fused_attention = c.fused_attention;
    MIX_CHECK(train.num_classes <= c.vocab, "the data has " << train.num_classes << " token values but --vocab is "
                                                            << c.vocab << "; raise --vocab");
    return models::build_transformer(tc, c.model);
  }
  if (!c.is_resnet()) {
    models::MlpConfig mc;
    mc.in_features = features;
    mc.hidden = c.model == "linear" ? std::vector<int64_t>{} : c.hidden;
    mc.num_classes = classes;
    return models::build_mlp(mc, c.model);
  }
  models::ResNetConfig rc = models::resnet_preset(c.model);
  if (train.input_dtype() == DType::u8) {
    MIX_CHECK(example.size() == 3 && example[0] == example[1],
              "--model " << c.model << " needs square 8-bit images [H, H, C], but the data's examples are "
                         << shape_str(example));
    rc.image_size = example[0];
    rc.in_channels = example[2];
    models::PixelInput pixels;
    for (double m : c.mean) pixels.mean.push_back(static_cast<float>(m));
    for (double s : c.stddev) pixels.stddev.push_back(static_cast<float>(s));
    rc.pixel_input = std::move(pixels);
  } else if (example.size() == 3 && example[1] == example[2]) {
    rc.in_channels = example[0];
    rc.image_size = example[1];
  } else {
    const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(features))));
    MIX_CHECK(example.size() == 1 && side * side == features,
              "--model " << c.model << " needs square images, [C, H, H] or H*H pixels per example, but the data's "
                         << "examples are " << shape_str(example));
    rc.in_channels = 1;
    rc.image_size = side;
  }
  if (c.width) rc.width = *c.width;
  if (!c.blocks.empty()) rc.blocks = c.blocks;
  rc.num_classes = classes;
  rc.channels_last = c.resnet_channels_last();
  return models::build_resnet(rc, c.model);
}

// Model buffers (batch_norm's running statistics): not trained, but every rank
// must hold the same values for evaluation, checkpoints and the consistency check.
std::vector<std::string> buffer_names(const Program& p) {
  std::vector<std::string> names;
  for (const VarDesc& v : p.vars())
    if (v.is_buffer) names.push_back(v.name);
  return names;
}

// NaN or inf in the inputs would look like an overflow every step; stop with the place instead.
void check_finite_data(const data::Dataset& ds, const std::string& where) {
  // Tokens have nothing to check; a source's examples are read a batch at a time.
  if (!ds.in_memory() || ds.inputs.dtype() != DType::f32) return;
  const float* x = ds.inputs.data<float>();
  for (int64_t i = 0; i < ds.inputs.numel(); ++i)
    if (!std::isfinite(x[i])) {
      const int64_t per = std::max<int64_t>(1, ds.inputs.numel() / std::max<int64_t>(1, ds.size()));
      MIX_FAIL(where << " contains a non-finite value (" << x[i] << ") in example " << i / per
                     << "; clean the data (mixtrain does not train on NaN or inf inputs)");
    }
}

// The output layer has a row for every value up to the largest label, so one
// stray large label makes a huge layer that trains without complaint. Say so
// when most of those classes have no example.
void warn_sparse_labels(const data::TrainTest& d, const std::string& path) {
  std::set<int64_t> seen;
  for (const data::Dataset* ds : {&d.train, &d.test}) {
    const int64_t* v = ds->labels.data<int64_t>();
    for (int64_t i = 0; i < ds->labels.numel(); ++i) seen.insert(v[i]);
  }
  const int64_t classes = d.train.num_classes;
  if (static_cast<int64_t>(seen.size()) * 2 < classes)
    spdlog::warn(
        "{}: the largest label is {}, so the model has {} output classes, but only {} label values occur; "
        "if the labels are not class indices 0..K-1, renumber them",
        path, classes - 1, classes, seen.size());
}

std::optional<amp::InjectOverflow> inject_from(const TrainConfig& c) {
  InjectOverflowSpec spec;
  if (c.inject_overflow.empty() || !parse_inject_overflow(c.inject_overflow, spec)) return std::nullopt;
  return amp::InjectOverflow{spec.step, spec.rank, spec.param, spec.micro - 1};
}

// The bytes of a data set's tensors.
size_t held_bytes(const data::Dataset& d) {
  return (d.inputs.defined() ? d.inputs.bytes() : 0) + (d.labels.defined() ? d.labels.bytes() : 0);
}

// The training program the flags describe, for `world` ranks.
TrainProgramOptions train_program_options(const TrainConfig& c, const models::Model& model, int world) {
  TrainProgramOptions o;
  o.precision = c.precision;
  o.amp.custom_white = c.amp_white_list;
  o.amp.custom_black = c.amp_black_list;
  o.amp.scaler = c.loss_scaler_config();
  o.amp.fold_casts = c.fold_casts;
  o.amp.inject = inject_from(c);
  o.grad_reduce = c.grad_reduce;
  collective::GradSyncOptions sync;
  sync.world_size = world;
  sync.predivide = c.grad_predivide;
  sync.bucket_bytes = static_cast<size_t>(c.bucket_mb * 1024 * 1024);
  sync.overlap = c.overlap;
  o.grad_sync = sync;
  o.optimizer = c.optimizer;
  o.passes.recompute_softmax = c.recompute_softmax;
  o.passes.fuse_add_relu = c.fuse_add_relu;
  o.passes.fuse_param_casts = c.fuse_param_casts;
  o.passes.fuse_bn_relu = c.fuse_bn_relu;
  o.passes.fuse_matmul_bias = c.fuse_matmul_bias;
  o.passes.fold_grad_sums = c.fold_grad_sums;
  o.passes.fuse_add_layer_norm = c.fuse_add_layer_norm;
  o.passes.elide_single_rank_sync = c.elide_single_rank_sync;
  // Evaluation reads the logits after a step's forward pass.
  o.grad_accum_steps = c.grad_accum_steps;
  o.clip_grad_norm = c.clip_grad_norm;
  o.clip_grad_value = c.clip_grad_value;
  o.outlier_skips = c.skip_loss_zscore || c.skip_grad_norm_zscore;
  o.read_back = {model.logits};
  return o;
}

// What the whole-step rewrites did (rank 0): they change how the step runs,
// not its values, and each has a flag that turns it off.
void log_step_rewrites(const TrainProgram& train) {
  for (const PassRun& pass : train.passes)
    if (!pass.whole_step_flag.empty() && pass.changed)
      spdlog::info("{}: {} ({} turns it off)", pass.name, pass.result, pass.whole_step_flag);
}

// --init-from: the parameters (and buffers) `path` holds, by PyTorch
// state_dict names; tensors the model lacks are counted and ignored, buffers
// the file lacks keep their initial values. `log`: say so (rank 0).
void load_init_from(const std::string& path, const Program& program, Scope& scope, bool log) {
  int ignored = 0;
  std::vector<std::string> missing_buffers;
  const int n = io::load_parameters(path, program, scope, &ignored, &missing_buffers);
  if (log) {
    spdlog::info("loaded {} tensors from {} ({} other tensors ignored)", n, path, ignored);
    if (!missing_buffers.empty())
      spdlog::warn("{} has no {} (and {} more buffers): they keep their initial values", path, missing_buffers[0],
                   missing_buffers.size() - 1);
  }
}

// MIX_PROFILE_OPS: the time `op_seconds` holds for each op type over `steps`
// timed steps, largest first, with each type's calls a step and time a call.
// `what`: what the times measure.
void log_op_profile(const std::map<std::string, double>& op_seconds, const Program& program, int64_t steps,
                    const char* what) {
  std::vector<std::pair<double, std::string>> by_time;
  double total = 0;
  for (auto& [type, secs] : op_seconds) {
    by_time.emplace_back(secs, type);
    total += secs;
  }
  std::sort(by_time.rbegin(), by_time.rend());
  spdlog::info("op time by type over {} steps ({:.3f} s in ops, {}):", steps, total, what);
  // Every op of the program runs once a step: its type's count, and the time per call.
  std::map<std::string, int64_t> per_step;
  for (const OpDesc& op : program.ops()) ++per_step[op.type];
  for (auto& [secs, type] : by_time) {
    const double ms = 1e3 * secs / static_cast<double>(std::max<int64_t>(steps, 1));
    const int64_t calls = std::max<int64_t>(per_step[type], 1);
    spdlog::info("  {:<36} {:8.3f} ms/step {:5.1f}%  {:4} a step, {:8.1f} us each", type, ms, 100 * secs / total, calls,
                 1e3 * ms / static_cast<double>(calls));
  }
}

// --cuda-graph: the step recorded once (the first to repeat the batch shape
// of the step before it, normally the second) and replayed after. None, and
// every step op by op, where the step or the device cannot be recorded
// (StepGraph::why_not); `log`: say why (rank 0).
std::unique_ptr<StepGraph> make_step_graph(const Program& program, const Executor& step_exec,
                                           const models::Model& model, const ExecEnv& env, bool log) {
  std::string why = StepGraph::why_not(program, env);
  std::unique_ptr<DeviceGraph> recording;
  if (why.empty()) recording = require_device_backend(env.device.kind).make_graph(env.device.index);
  if (why.empty() && !recording) why = "this device's backend cannot record";
  if (!why.empty()) {
    if (log) spdlog::warn("--cuda-graph: {}; every step runs op by op", why);
    return nullptr;
  }
  return std::make_unique<StepGraph>(
      program, step_exec, std::vector<std::string>{model.input, model.label},
      std::vector<std::string>{model.loss, amp::ScalerVars::found_inf, amp::ScalerVars::overflow_ranks,
                               optim::kGradNorm},
      std::move(recording));
}

// Which examples each rank trains on: image shards streamed per rank
// (--shard-order stream), else one permutation split over the ranks.
std::unique_ptr<data::RankSampler> make_sampler(const TrainConfig& c, const data::Dataset& train, int rank, int world) {
  if (c.data == DataSet::image_shards && c.shard_order == ShardOrder::stream)
    return std::make_unique<data::ShardStreamSampler>(train.shard_sizes, rank, world, c.shuffle, c.seed,
                                                      c.shuffle_buffer);
  return std::make_unique<data::DistributedSampler>(train.size(), rank, world, c.shuffle, c.seed);
}

// The GPU flags (TF32, cuDNN's choices, 1x1 convolutions on cuBLAS) as the backend takes them.
DeviceOptions device_options(const TrainConfig& c) {
  DeviceOptions options;
  options.allow_tf32 = c.allow_tf32;
  options.batch_norm_persistent = c.cudnn_bn_persistent;
  options.cudnn_benchmark = c.cudnn_benchmark;
  options.cudnn_graph_conv = c.cudnn_graph_conv;
  options.cublas_1x1_conv = c.cublas_1x1_conv;
  options.attention_tensor_cores = c.attention_tensor_cores;
  options.attention_cudnn = c.cudnn_attention;
  return options;
}

// The metrics' last line: "summary": true and the run's totals (with `amp`,
// the final loss scale in `scope`).
nlohmann::json summary_line(const TrainConfig& c, const models::Model& model, const StepTotals& t, int64_t steps_run,
                            size_t peak, const MemoryPlan& plan, int world, const Scope& scope, bool amp,
                            const std::optional<EvalResult>& eval) {
  nlohmann::json summary = {{"summary", true},
                            {"steps", steps_run},
                            {"micro_batches", steps_run * c.grad_accum_steps},
                            {"outlier_skips", t.outlier_skips},
                            {"skipped_steps", t.skipped},
                            {"samples_per_s", t.mean_rate()},
                            {"samples_per_s_overall", t.overall_rate()},
                            {"peak_bytes", peak},
                            {"step_ms", t.step_ms()},
                            {"host_queue_ms", t.host_queue_ms()},
                            {"planned_peak_temporary_bytes", plan.peak_temporary_bytes},
                            {"persistent_bytes", plan.persistent_bytes},
                            {"world_size", world},
                            {"precision", amp::to_string(c.precision)},
                            {"grad_reduce", collective::to_string(c.effective_grad_reduce())}};
  if (model.tokens_per_example > 0) {
    summary["tokens_per_s"] = t.mean_rate() * static_cast<double>(model.tokens_per_example);
    summary["tokens_per_s_overall"] = t.overall_rate() * static_cast<double>(model.tokens_per_example);
  }
  if (amp) summary["final_loss_scale"] = amp::read_scaler_state(scope).scale;
  if (eval) {
    summary["eval_accuracy"] = eval->accuracy;
    summary["val_loss"] = eval->loss;
  }
  return summary;
}

// --benchmark's result on standard output (rank 0). `show_queue`: also the
// host's time to queue a step against the step's, and what sets the pace.
void print_benchmark(const TrainConfig& c, const models::Model& model, const StepTotals& t, int world, size_t peak,
                     bool show_queue) {
  const bool tokens = model.tokens_per_example > 0;
  std::cout << "benchmark: " << c.model << " " << amp::to_string(c.precision) << " batch " << c.batch_size << " x " << world
            << " ranks: "
            << (tokens ? t.overall_rate() * static_cast<double>(model.tokens_per_example) : t.overall_rate())
            << (tokens          ? " tokens/s"
                : c.is_resnet() ? " images/s"
                                : " samples/s")
            << " over " << t.steps << " timed steps (step time only), peak " << peak << " bytes" << std::endl;
  if (show_queue && t.steps > 0)
    std::cout << "benchmark: the host took " << t.host_queue_ms() << " ms to queue a " << t.step_ms()
              << " ms step: " << pace_verdict(t.host_queue_ms(), t.step_ms()) << std::endl;
}

// --inject-overflow's rank and parameter, which only the job and the model can check.
void check_inject_overflow(const TrainConfig& c, const Program& program, int world) {
  const std::optional<amp::InjectOverflow> inject = inject_from(c);
  if (!inject) return;
  if (inject->rank >= world)
    throw UsageError("--inject-overflow " + c.inject_overflow + ": there is no rank " + std::to_string(inject->rank) +
                     " in a job of " + std::to_string(world) + " rank(s); give a rank from 0 to " +
                     std::to_string(world - 1) + ", or none for every rank");
  const std::vector<std::string>& params = program.parameters();
  if (!inject->param.empty() && std::find(params.begin(), params.end(), inject->param) == params.end())
    throw UsageError("--inject-overflow " + c.inject_overflow + ": the model has no parameter '" + inject->param +
                     "' (`mixtrain --steps 0 --save FILE` writes a file with every name)");
}

// Names in --amp-white-list and --amp-black-list that move nothing: all of
// them in FP32 training, and under AMP those of ops this model's forward
// program lacks. amp::rewrite classifies forward ops only, so a gradient op
// (relu_grad follows relu) or one a later pass makes (fused_add_relu) is never
// looked up. A warning, not an error: a script may give several models one list.
void warn_unused_amp_lists(const TrainConfig& c, const Program& program) {
  if (c.amp_white_list.empty() && c.amp_black_list.empty()) return;
  if (!amp::is_mixed(c.precision)) {
    spdlog::warn("--amp-white-list, --amp-black-list: FP32 training has no AMP lists, so they do nothing");
    return;
  }
  std::set<std::string> forward_types;
  for (const OpDesc& op : program.ops())
    if (op.role == OpRole::forward) forward_types.insert(op.type);
  std::string unused;
  for (const std::string& op : c.amp_white_list)
    if (!forward_types.count(op)) unused += (unused.empty() ? "--amp-white-list " : ", --amp-white-list ") + op;
  for (const std::string& op : c.amp_black_list)
    if (!forward_types.count(op)) unused += (unused.empty() ? "--amp-black-list " : ", --amp-black-list ") + op;
  if (!unused.empty())
    spdlog::warn(
        "{}: the forward program of --model {} has no such op, so {} nothing; the AMP lists classify "
        "forward ops (--print-program lists them)",
        unused, c.model, unused.find(',') == std::string::npos ? "it moves" : "they move");
}

// Hash of the parameters' names, shapes and dtypes: equal models, equal hash.
std::string model_signature(const Program& p) {
  uint64_t h = fnv1a("model");
  for (auto& name : p.parameters()) {
    const VarDesc& v = p.var(name);
    h = fnv1a(name + ":" + shape_str(v.shape) + ":" + std::string(dtype_name(v.dtype)), h);
  }
  std::ostringstream o;
  o << p.parameters().size() << " parameters, hash " << std::hex << h;
  return o.str();
}

// Hash of the bytes of every FP32 master and model buffer, for the periodic consistency check.
std::string masters_hash(const Program& p, const Scope& scope) {
  uint64_t h = fnv1a("masters");
  std::vector<std::string> names = p.parameters();
  for (auto& b : buffer_names(p)) names.push_back(b);
  for (auto& name : names) {
    const Tensor t = scope.get(name).to(cpu_device());
    h = fnv1a(t.raw(), t.bytes(), h);
  }
  std::ostringstream o;
  o << std::hex << h;
  return o.str();
}

float read_f32(const Scope& s, const char* name) { return s.get(name).item_float(0); }

// Writes a one-element FP32 variable wherever it lives (host or device).
void write_f32(Tensor& t, float value) {
  if (t.device().kind == DeviceKind::cpu) {
    t.data<float>()[0] = value;
  } else {
    t.copy_from(Tensor::from_floats({1}, {value}));
  }
}

// Testing aid, as --inject-overflow is one: MIX_TEST_DIVERGE=STEP:RANK makes
// RANK's first parameter one float larger in its first element after STEP, as
// a silent fault on one rank would (a bad kernel, a flipped bit). No flag can
// make ranks diverge after the startup fingerprint, so without it nothing
// could show --check-every catching a divergence
// (tests/e2e/test_multirank_consistency.py).
std::optional<InjectOverflowSpec> divergence_from_env() {
  const char* env = std::getenv("MIX_TEST_DIVERGE");
  if (!env || !*env) return std::nullopt;
  InjectOverflowSpec at;
  if (!parse_inject_overflow(env, at) || at.rank < 0 || !at.param.empty() || at.micro != 0)
    throw UsageError(std::string("MIX_TEST_DIVERGE='") + env + "': expected STEP:RANK, e.g. 3:1");
  return at;
}

// Testing aid, as MIX_TEST_DIVERGE is one: MIX_TEST_LOSS_SPIKE=STEP multiplies
// every rank's inputs by 1000 at that step, a corrupt batch the outlier skips
// (--skip-loss-zscore) must catch (tests/e2e/test_outlier_skip.py).
std::optional<int64_t> loss_spike_from_env() {
  const char* env = std::getenv("MIX_TEST_LOSS_SPIKE");
  if (!env || !*env) return std::nullopt;
  double step = 0;
  if (!parse_number(env, /*integer=*/true, step) || step < 1)
    throw UsageError(std::string("MIX_TEST_LOSS_SPIKE='") + env + "': expected a step >= 1, e.g. 140");
  return static_cast<int64_t>(step);
}

// Multiplies the FP32 tensor `name` by `factor`, wherever it lives.
void scale_tensor(Scope& scope, const std::string& name, float factor) {
  Tensor& t = scope.get(name);
  MIX_CHECK(t.dtype() == DType::f32, "MIX_TEST_LOSS_SPIKE scales FP32 inputs; " << name << " is "
                                                                                << dtype_name(t.dtype()));
  Tensor host = t.to(cpu_device()).clone();
  float* v = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) v[i] *= factor;
  scope.set(name, t.device().kind == DeviceKind::cpu ? host : host.to(t.device()));
}

void nudge_first_parameter(const Program& program, Scope& scope) {
  Tensor& t = scope.get(program.parameters().front());
  const bool on_host = t.device().kind == DeviceKind::cpu;
  Tensor host = on_host ? t : t.to(cpu_device());
  float* first = host.data<float>();
  *first = std::nextafter(*first, std::numeric_limits<float>::infinity());
  if (!on_host) t.copy_from(host);
}

// Rank 0 prints the rank -> host -> device table, one line a rank.
void log_rank_table(Communicator& comm, const std::string& device) {
  char host[64] = {0};
  gethostname(host, sizeof(host) - 1);
  // The local rank (this rank's index among the ranks of its host) is what
  // picks a host's GPU; printing it shows that each host's ranks count from 0.
  std::string line = std::string(host) + " local " + std::to_string(comm.local_rank()) + " " + device;
  line.resize(96, '\0');
  std::vector<char> all(96 * static_cast<size_t>(comm.world_size()));
  comm.all_gather(line.data(), all.data(), 96);
  if (comm.rank() != 0) return;
  spdlog::info("{} rank(s), backend {}:", comm.world_size(), comm.backend_name());
  // Each host's ranks, in one line: when a host dies, mpirun names the node
  // only ("Remote daemon ... on node X"); this line names its ranks.
  std::vector<std::pair<std::string, std::string>> ranks_of_host;
  for (int r = 0; r < comm.world_size(); ++r) {
    const std::string entry(&all[static_cast<size_t>(r) * 96]);
    spdlog::info("  rank {} -> {}", r, entry.c_str());
    const std::string host_name = entry.substr(0, entry.find(' '));
    auto it = std::find_if(ranks_of_host.begin(), ranks_of_host.end(),
                           [&](const auto& h) { return h.first == host_name; });
    if (it == ranks_of_host.end()) it = ranks_of_host.insert(ranks_of_host.end(), {host_name, ""});
    it->second += (it->second.empty() ? "" : ", ") + std::to_string(r);
  }
  std::string hosts;
  for (const auto& [name, ranks] : ranks_of_host) hosts += (hosts.empty() ? "" : "; ") + name + ": rank(s) " + ranks;
  spdlog::info("ranks by host: {}", hosts);
}

// Where a skipped step's overflow came from, decoded from the mask that
// c_allreduce_found_inf all-reduced (the same on every rank).
struct OverflowReport {
  std::vector<std::string> params;                     // parameters whose gradients overflowed, bucket order
  std::vector<int> ranks;                              // ranks whose local flag was raised
  std::vector<std::vector<int>> ranks_of_param;        // per entry of params

  // " in fc1.weight (rank 1), fc2.bias (ranks 0, 1)", or "" when no parameter is named.
  std::string describe() const {
    if (params.empty()) return ranks.empty() ? "" : " on rank(s) " + join(ranks);
    constexpr size_t kShown = 8;
    std::string s = " in ";
    for (size_t i = 0; i < params.size() && i < kShown; ++i) {
      s += (i ? ", " : "") + params[i] + " (rank" + (ranks_of_param[i].size() > 1 ? "s " : " ") +
           join(ranks_of_param[i]) + ")";
    }
    if (params.size() > kShown) s += " and " + std::to_string(params.size() - kShown) + " more parameters";
    return s;
  }

  static std::string join(const std::vector<int>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s;
  }
};

// The parameter of each row of the provenance mask (after row 0), in order:
// the `params` attribute of the program's c_allreduce_found_inf; empty when
// the program has none (FP32 training). Read once, before the first step.
std::vector<std::string> overflow_mask_params(const Program& p) {
  for (const OpDesc& op : p.ops())
    if (op.type == "c_allreduce_found_inf") return op.attr<std::vector<std::string>>("params", {});
  return {};
}

OverflowReport read_overflow_report(const std::vector<std::string>& params, const Scope& scope) {
  OverflowReport r;
  if (!scope.has(amp::ScalerVars::overflow_ranks)) return r;
  const Tensor mask = scope.get(amp::ScalerVars::overflow_ranks).to(cpu_device());
  const int64_t words = mask.dim(1);
  const int world = static_cast<int>(words * 32);
  const int32_t* m = mask.data<int32_t>();
  for (int rank = 0; rank < world; ++rank)
    if (collective::has_rank(m, rank)) r.ranks.push_back(rank);
  for (size_t j = 0; j < params.size() && static_cast<int64_t>(j + 1) < mask.dim(0); ++j) {
    std::vector<int> ranks;
    for (int rank = 0; rank < world; ++rank)
      if (collective::has_rank(m + static_cast<int64_t>(j + 1) * words, rank)) ranks.push_back(rank);
    if (ranks.empty()) continue;
    r.params.push_back(params[j]);
    r.ranks_of_param.push_back(std::move(ranks));
  }
  return r;
}

// --resume auto: the newest complete checkpoint of --save (and its
// --keep-checkpoints history), chosen by rank 0 and sent to every rank so all
// load the same file; "" when there is none (a fresh start).
std::string choose_auto_resume(const std::string& save, Communicator& comm) {
  std::string chosen;
  if (comm.rank() == 0) {
    std::vector<std::string> skipped;
    const std::optional<io::CheckpointFile> newest = io::newest_complete_checkpoint(save, &skipped);
    for (const std::string& why : skipped) spdlog::warn("--resume auto: passing over {}", why);
    if (newest) {
      chosen = newest->path;
      spdlog::info("--resume auto: {} is the newest complete checkpoint (step {})", chosen, newest->step);
    } else {
      spdlog::info("--resume auto: no complete checkpoint of {} yet; starting from the beginning", save);
    }
  }
  uint64_t size = chosen.size();
  comm.broadcast(&size, sizeof size, 0);
  chosen.resize(size);
  comm.broadcast(chosen.data(), size, 0);
  return chosen;
}

// The log line of a run stopped by a signal (rank 0). `own`: the signal this
// rank received (0: none, another rank did); `ranks`: how many ranks received one.
std::string stop_report(const TrainConfig& c, int own, int ranks, int world, int64_t step, int64_t total_steps) {
  std::string s = own ? "stopped by " + signal_name(own) + " (received by " + std::to_string(ranks) + " of " +
                            std::to_string(world) + " ranks)"
                      : "stopped by a stop signal that " + std::to_string(ranks) + " of " + std::to_string(world) +
                            " ranks received";
  s += " at step " + std::to_string(step) + " of " + std::to_string(total_steps);
  if (c.save.empty())
    return s + "; nothing was saved (no --save): give --save FILE --resume auto to keep a stopped run's progress";
  return s + "; saved " + c.save + "; resume with the same command and --resume auto (or --resume " + c.save + ")";
}

}  // namespace

int run_training(const TrainConfig& c, Communicator& comm, const StopSignals& stop_signals) {
  const int rank = comm.rank(), world = comm.world_size();
  // One timeout for every collective: the MPI waits keep it, and NCCL's
  // watchdog reads it from the variable it always read (created below).
  comm.set_timeout(c.collective_timeout);
  setenv("MIX_NCCL_TIMEOUT_S", fmt::format("{}", c.collective_timeout).c_str(), /*overwrite=*/1);
  // On GPUs every rank drives the GPU of its local rank; gradients travel over
  // the device communicator (NCCL), everything else over the host one.
  const bool on_gpu = c.device == DeviceKind::cuda;
  Device device = cpu_device();
  std::unique_ptr<Communicator> device_comm;
  // Ranks that disagree on --device would call different collectives below (GPU
  // binding, NCCL init) and hang or crash there: compare that field first.
  collective::check_same_on_all_ranks(comm, "startup fingerprint", {{"device", std::string(to_string(c.device))}});
  if (on_gpu) {
    const int gpu = collective::bind_device(comm);
    device = Device{DeviceKind::cuda, gpu};
    require_device_backend(DeviceKind::cuda).set_options(device_options(c));
    device_comm = collective::make_device_communicator(comm, gpu);
  }
  Communicator& grad_comm = device_comm ? *device_comm : comm;
  log_rank_table(comm, device.str());
  // Input batches are gathered into page-locked host memory where the device
  // has it (a GPU), so their host->device copies are DMA with no staging copy.
  Allocator* batch_memory = on_gpu ? require_device_backend(device.kind).pinned_host_allocator(device.index) : nullptr;

  // ---- data and model ------------------------------------------------------------
  data::TrainTest data = load_data(c);
  const std::string data_name = c.data == DataSet::safetensors ? c.data_file : std::string(to_string(c.data));
  check_finite_data(data.train, data_name + (c.data == DataSet::safetensors ? "" : " training set"));
  if (data.test.size() > 0) check_finite_data(data.test, data_name + (c.data == DataSet::safetensors ? "" : " test set"));
  if (rank == 0 && c.data == DataSet::safetensors) warn_sparse_labels(data, c.data_file);
  models::Model model = build_model(c, data.train);
  Program& program = model.program;
  check_inject_overflow(c, program, world);
  if (rank == 0) warn_unused_amp_lists(c, program);
  const std::vector<std::string> buffers = buffer_names(program);

  // ---- the training program (launch/train_program.cc) ----------------------------------
  const bool use_amp = amp::is_mixed(c.precision);  // amp or bf16: a scaler, a finite check
  if (const std::string ignored = c.ignored_scaler_flags(); rank == 0 && !ignored.empty())
    spdlog::warn("{}: {} has no {}, so {} nothing", ignored,
                 use_amp ? "--loss-scaling " + std::string(amp::mode_name(c.loss_scaling)) : "FP32 training",
                 use_amp && c.loss_scaling == amp::LossScalerConfig::Mode::static_scale ? "dynamic scaler"
                                                                                        : "loss scale",
                 ignored.find(',') == std::string::npos ? "it does" : "they do");
  if (rank == 0)
    for (const std::string& doubt : c.doubtful_values(world)) spdlog::warn("{}", doubt);
  const TrainProgram train = build_train_program(program, model.loss, train_program_options(c, model, world));
  if (rank == 0) log_step_rewrites(train);

  // Before any collective whose sizes depend on the model (and before a
  // printout that ends this rank): every rank must agree.
  collective::Fields fields = c.fingerprint_fields();
  fields.emplace_back("parameters", model_signature(program));
  fields.emplace_back("world", std::to_string(world));
  collective::check_same_on_all_ranks(comm, "startup fingerprint", fields);

  if (c.print_program) {
    if (rank == 0)
      std::cout << train.describe_passes() << program.str() << collective::describe_grad_sync(program) << std::flush;
    return 0;
  }
  // A checkpoint path that cannot be written is found now, not after training.
  if (rank == 0 && !c.save.empty()) io::check_writable(c.save);

  // ---- state: initialise on every rank, then rank 0's values win --------------------
  Scope scope;
  initialize_persistables(program, scope, c.seed);
  int64_t start_step = 0;
  if (!c.init_from.empty()) load_init_from(c.init_from, program, scope, /*log=*/rank == 0);
  const std::string resume_path = c.resume_auto() ? choose_auto_resume(c.save, comm) : c.resume;
  if (!resume_path.empty())
    start_step =
        resume_from_checkpoint(resume_path, c, program, scope, world, data.train.size(), use_amp, /*log=*/rank == 0);
  for (const VarDesc& v : program.vars())
    if (v.persistable) {
      Tensor& t = scope.get(v.name);
      comm.broadcast(t.raw(), t.bytes(), 0);
      if (on_gpu) scope.set(v.name, t.to(device));
    }

  if (c.steps == 0) {
    if (rank == 0) {
      io::save_checkpoint_keeping(c.save, program, scope,
                                  {{"step", "0"}, {"model", c.model}, {"seed", std::to_string(c.seed)}}, 0,
                                  c.keep_checkpoints);
      spdlog::info("wrote the initial parameters to {}", c.save);
    }
    comm.barrier();
    return 0;
  }

  // ---- schedule -------------------------------------------------------------------
  const int64_t batch = c.batch_size;
  // K micro-batches of `batch` make an optimizer step; steps count optimizer
  // steps. An epoch's micro-batches that do not fill a last window of K are
  // left out of it (as a loader with drop_last leaves a short batch out).
  const int64_t K = c.grad_accum_steps;
  const std::unique_ptr<data::RankSampler> sampler = make_sampler(c, data.train, rank, world);
  const int64_t micro_batches_per_epoch = (sampler->per_rank() + batch - 1) / batch;
  MIX_CHECK(micro_batches_per_epoch > 0, "the training set is empty");
  const int64_t steps_per_epoch = micro_batches_per_epoch / K;
  if (steps_per_epoch == 0)
    throw UsageError("--grad-accum-steps " + std::to_string(K) + " asks for more micro-batches than an epoch has (" +
                     std::to_string(micro_batches_per_epoch) + " of " + std::to_string(batch) +
                     " examples a rank): lower it, or --batch-size");
  // A rank's share smaller than a batch gives one short batch an epoch, as
  // PyTorch's DataLoader (drop_last=False) does without a word: a warning, not
  // an error, since a tiny set is a fair smoke test, but the batch is not the
  // one asked for (the learning rate and batch norm's statistics assume it).
  const int64_t true_batch = std::min(batch, sampler->per_rank());
  if (rank == 0 && true_batch < batch)
    spdlog::warn("the training set has {} examples, {} a rank after the split over {} rank(s){}, fewer than "
                 "--batch-size {}: every step trains on one batch of {} a rank; use more data, or --batch-size {} "
                 "to ask for what happens",
                 data.train.size(), sampler->per_rank(), world,
                 sampler->per_rank() * world > data.train.size() ? " (padded with repeats to an equal share)" : "",
                 batch, true_batch, true_batch);
  if (rank == 0 && micro_batches_per_epoch % K != 0)
    spdlog::warn("an epoch has {} micro-batches a rank, not a multiple of --grad-accum-steps {}: the last {} of each "
                 "epoch are left out",
                 micro_batches_per_epoch, K, micro_batches_per_epoch % K);
  const int64_t timed_steps = c.benchmark ? (c.steps > 0 ? c.steps : 50) : 0;
  const int64_t total_steps = c.benchmark ? c.benchmark_warmup + timed_steps
                                          : (c.steps > 0 ? c.steps : c.epochs * steps_per_epoch);
  if (start_step > total_steps)
    throw UsageError("--resume " + resume_path + " is at step " + std::to_string(start_step) +
                     ", past the end of this run (step " + std::to_string(total_steps) +
                     "): --steps and --epochs count from the start of training, not from "
                     "the checkpoint; ask for more than " +
                     std::to_string(start_step) + " steps");
  if (const std::optional<amp::InjectOverflow> inject = inject_from(c);
      inject && (inject->step > total_steps || inject->step <= start_step))
    throw UsageError("--inject-overflow " + c.inject_overflow + ": this run trains steps " +
                     std::to_string(start_step + 1) + " to " + std::to_string(total_steps) + ", so step " +
                     std::to_string(inject->step) + " would never overflow; give a step in that range");
  optim::LrSchedule lr{c.lr_schedule, c.lr, c.warmup_steps, total_steps};
  // Every rank must run the same number of steps from the same place, or one
  // would wait forever in a collective the others never reach.
  collective::check_same_on_all_ranks(comm, "run plan",
                                      {{"training examples", std::to_string(data.train.size())},
                                       {"test examples", std::to_string(data.test.size())},
                                       {"steps per epoch", std::to_string(steps_per_epoch)},
                                       {"total steps", std::to_string(total_steps)},
                                       {"start step", std::to_string(start_step)},
                                       {"benchmark", c.benchmark ? "on" : "off"}});

  // With outlier skips the step runs in two parts, the update after the host's
  // decision (launch/outlier_detector.h); the first keeps what the update reads.
  const bool two_parts = train.update_from > 0;
  const Program first_part =
      two_parts ? TrainProgram::part(program, 0, train.update_from) : Program{};
  std::set<std::string> step_keep = {model.loss, amp::ScalerVars::found_inf, amp::ScalerVars::overflow_ranks,
                                     optim::kGradNorm};
  std::unique_ptr<Executor> update_exec;
  std::optional<Program> update_part;
  if (two_parts) {
    update_part = TrainProgram::part(program, train.update_from, program.ops().size());
    for (const OpDesc& op : update_part->ops())
      for (const std::string& in : op.all_inputs()) step_keep.insert(in);
    update_exec = std::make_unique<Executor>(*update_part, std::set<std::string>{});
  }
  Executor step_exec(two_parts ? first_part : program, step_keep);
  OutlierDetector loss_outliers, grad_norm_outliers;
  // The K - 1 micro-batches before a step's last: forward, backward, gradients accumulated.
  std::unique_ptr<Executor> micro_exec;
  if (train.micro_batch_program)
    micro_exec = std::make_unique<Executor>(*train.micro_batch_program, std::set<std::string>{model.loss});
  const std::vector<std::string> overflow_params = overflow_mask_params(program);
  const TestSetEvaluation evaluation(program, model, data.test, comm, c.effective_eval_batch_size(), c.eval_batches,
                                     batch_memory);
  ExecEnv env;
  env.comm = &grad_comm;
  env.device = device;
  env.rank = rank;  // dropout masks differ between ranks (each rank's examples are its own)
  // Started gradient all-reduces advance between backward's ops.
  env.progress = [&grad_comm] { grad_comm.progress(); };
  // MIX_PROFILE_OPS=1: time every op and print the totals by op type at the end
  // (on a GPU by events on its compute stream: the device's time per op).
  // MIX_PROFILE_OPS=host: on a GPU, the host's time to queue each op instead
  // (its kernel call's wall time), to find what sets the pace when the host
  // does (the benchmark's "host took ... to queue" line).
  std::map<std::string, double> op_seconds;
  const std::string profile_env = std::getenv("MIX_PROFILE_OPS") ? std::getenv("MIX_PROFILE_OPS") : "";
  std::unique_ptr<OpTimer> op_timer;  // on a GPU: each op's time on the device, not its launch time on the host
  if (profile_env == "1" || profile_env == "host") {
    env.op_seconds = &op_seconds;
    if (device.kind != DeviceKind::cpu && profile_env == "1")
      op_timer = require_device_backend(device.kind).make_op_timer(device.index);
    env.op_timer = op_timer.get();
  } else if (!profile_env.empty()) {
    spdlog::warn("MIX_PROFILE_OPS={} is neither 1 (device time per op) nor host (host time per op): no op profile",
                 profile_env);
  }
  std::unique_ptr<StepGraph> step_graph;
  if (c.cuda_graph) step_graph = make_step_graph(program, step_exec, model, env, /*log=*/rank == 0);
  // The gradient bytes a replayed step sends: those counted while recording
  // it (a replay runs the recorded collectives without calling the communicator).
  uint64_t recorded_grad_bytes = 0;
  MetricsWriter metrics(rank == 0 ? c.metrics : "");
  if (rank == 0)
    spdlog::info("training {} ({}{}), {} steps of {} examples ({} ranks x {}{}), precision {}, gradient all-reduce in {}",
                 c.model, model_signature(program),
                 c.is_resnet() ? (c.resnet_channels_last() ? ", NHWC activations" : ", NCHW activations") : "",
                 total_steps - start_step, world * true_batch * K, world, true_batch,
                 K > 1 ? " x " + std::to_string(K) + " micro-batches" : std::string(), amp::to_string(c.precision),
                 collective::to_string(c.effective_grad_reduce()));

  const std::optional<InjectOverflowSpec> diverge = divergence_from_env();
  const std::optional<int64_t> loss_spike = loss_spike_from_env();
  auto consistency_check = [&](int64_t step) {
    collective::Fields f = {{"step", std::to_string(step)}, {"fp32 masters and buffers", masters_hash(program, scope)}};
    if (use_amp) {
      const amp::LossScalerState s = amp::read_scaler_state(scope);
      f.emplace_back("loss scale", loss_scale_text(s.scale));
      f.emplace_back("good steps", std::to_string(s.good_steps));
      f.emplace_back("bad steps", std::to_string(s.bad_steps));
      f.emplace_back("skipped steps", std::to_string(s.skipped_steps));
    }
    collective::check_same_on_all_ranks(comm, "step " + std::to_string(step) + " consistency check", f);
  };

  // ---- the loop -----------------------------------------------------------------------
  // Micro-batch g of the run (step g / K, its micro-batch g % K): this rank's
  // share of its epoch's order, from the micro-batch's place in the epoch.
  std::shared_ptr<const std::vector<int64_t>> order;
  int64_t order_epoch = -1;
  auto batch_of = [&](int64_t g) {
    const int64_t step = g / K;
    const int64_t epoch = step / steps_per_epoch;
    if (epoch != order_epoch) {
      order = std::make_shared<const std::vector<int64_t>>(sampler->indices(epoch));
      order_epoch = epoch;
    }
    const int64_t begin = ((step % steps_per_epoch) * K + g % K) * batch;
    return data::BatchRequest{order, begin, std::min<int64_t>(batch, static_cast<int64_t>(order->size()) - begin),
                              epoch};
  };
  // The next micro-batch is gathered (and, on a GPU, uploaded) while this one runs.
  data::BatchFeeder feeder(data.train, device, batch_memory, batch_of, start_step * K, total_steps * K,
                           static_cast<int>(c.prefetch));
  StepTotals totals;
  std::optional<EvalResult> last_eval;
  // --save after `steps_done` steps (rank 0): the parameters, optimizer and
  // scaler state, and what check_resume_continues compares.
  auto save_checkpoint_after = [&](int64_t steps_done) {
    io::save_checkpoint_keeping(
        c.save, program, scope,
        checkpoint_metadata(c, world, data.train.size(), steps_done, steps_per_epoch, scope, use_amp), steps_done,
        c.keep_checkpoints);
    spdlog::info("saved checkpoint {} at step {}", c.save, steps_done);
  };
  // On the CPU the host allocator also holds the data set, all run, and
  // held the loaders' temporaries; peak_bytes is training's, as a GPU's
  // device allocator never sees either: the peak window starts here and the
  // data set's bytes are left out of it below.
  const size_t data_set_bytes = device.kind == DeviceKind::cpu ? held_bytes(data.train) + held_bytes(data.test) : 0;
  if (device.kind == DeviceKind::cpu) allocator_for(device).reset_peak();
  auto t_start = Clock::now(), t_last_log = Clock::now();
  // A stop signal ends the loop early: the step it ended after, and what stopped it.
  int64_t steps_done = total_steps;
  int stop_signal = 0, stop_ranks = 0;
  for (int64_t step = start_step; step < total_steps; ++step) {
    const int64_t epoch = step / steps_per_epoch, in_epoch = step % steps_per_epoch;
    const double rate = lr.at(step);
    write_f32(scope.get(optim::kLearningRate), static_cast<float>(rate));
    env.step = step + 1;
    comm.set_step(step + 1);
    // Each micro-batch is already on the device when next() returns it (the
    // GPU waits for its upload, the host does not); the scope shares it,
    // which the feeder leaves alone until its next call.
    int64_t n = 0;
    auto feed_next = [&](int64_t micro_batch) {
      const data::Batch& examples = feeder.next();
      n += examples.inputs.dim(0);
      feed_batch(scope, model, examples);
      if (loss_spike == step + 1) scale_tensor(scope, model.input, 1000.f);
      env.micro_batch = micro_batch;
    };
    feed_next(0);

    const uint64_t bytes_before = grad_comm.bytes().grad_allreduce_bytes;
    const auto t0 = Clock::now();
    // The micro-batches before the last (--grad-accum-steps): forward and
    // backward, their gradients added to the accumulators; their losses summed.
    float earlier_losses = 0;
    for (int64_t m = 0; m + 1 < K; ++m) {
      micro_exec->run(scope, env);
      earlier_losses += read_f32(scope, model.loss.c_str());
      feed_next(m + 1);
    }
    // A refused recording falls back to op-by-op steps with one rank and
    // stops the job with several (launch/step_runner.h says why).
    const StepRun run = run_training_step(step_graph, step_exec, scope, env, world);
    const StepGraph::Ran ran = run.ran;
    const double queue_secs = seconds_since(t0) - run.refused_recording_seconds;
    if (ran == StepGraph::Ran::recorded && rank == 0)
      spdlog::info("step {} recorded as a CUDA graph in {:.1f} ms; later steps replay it", step + 1, 1e3 * queue_secs);
    // Each rank updated its running statistics from its own batch (per-rank
    // batch_norm, PyTorch DDP's default); rank 0's win, as DDP's broadcast_buffers does.
    // (Alone, rank 0 has them already: on a GPU the broadcast would be ~160
    // NCCL calls a step for nothing.)
    if (world > 1) {
      std::vector<collective::ByteSpan> buffer_spans;
      for (const std::string& b : buffers) {
        const Tensor& t = scope.get(b);
        buffer_spans.push_back({t.raw(), t.bytes()});
      }
      grad_comm.broadcast_many(buffer_spans, 0);
    }
    // On a GPU the step's kernels and collectives may still be queued. Wait for
    // them here, under the NCCL watchdog: an FP32 step has no blocking
    // collective, and the loss read below would otherwise wait forever on an
    // all-reduce a dead peer never joins. It also makes step_ms the step's real
    // time rather than the time to queue it. (No-op on the CPU.)
    grad_comm.synchronize();
    double secs = seconds_since(t0) - run.refused_recording_seconds;
    // The CUDA scaler op leaves its "stuck at the minimum" error to the host,
    // here; the CPU op has raised it already.
    if (use_amp) amp::check_loss_scale_not_stuck(program, scope);
    uint64_t grad_bytes = grad_comm.bytes().grad_allreduce_bytes - bytes_before - run.refused_recording_bytes;
    if (ran == StepGraph::Ran::recorded) recorded_grad_bytes = grad_bytes;
    if (ran == StepGraph::Ran::replayed) grad_bytes = recorded_grad_bytes;

    // The step's device-to-host copies, all after it: the loss, the flag, the
    // scale and (above) the scaler's count of skips at the minimum.
    // The step's loss: the mean of its micro-batches', then of the ranks'.
    // With it, how many ranks received a stop signal: every rank learns it
    // from the all-reduce the loss makes anyway, and all stop after the same step.
    float loss_and_stops[2] = {(earlier_losses + read_f32(scope, model.loss.c_str())) / static_cast<float>(K),
                               stop_signals.received() ? 1.f : 0.f};
    env.micro_batch = 0;
    comm.all_reduce(loss_and_stops, 2, DType::f32, collective::ReduceOp::sum);
    // As ReduceOp::avg computes it: the sum times 1/world.
    const float loss_avg = loss_and_stops[0] * (1.0f / static_cast<float>(world));
    const int ranks_stopping = static_cast<int>(loss_and_stops[1]);
    // An overflow (AMP), or a non-finite gradient norm under --clip-grad-norm: the step was skipped.
    const bool found_inf = !train.found_inf.empty() && scope.get(train.found_inf).item_float() != 0.f;
    // The gradients' L2 norm before any clipping (the same on every rank); null in JSON when not finite.
    const float grad_norm = read_f32(scope, optim::kGradNorm);
    // Outlier skips: the host judges the step's loss and norm (the same on
    // every rank), then runs the update, which skips when told to.
    double loss_z = std::nan(""), grad_norm_z = std::nan("");
    bool outlier = false;
    if (two_parts) {
      const auto t_update = Clock::now();
      if (c.skip_loss_zscore) loss_z = loss_outliers.observe(loss_avg);
      if (c.skip_grad_norm_zscore) grad_norm_z = grad_norm_outliers.observe(grad_norm);
      outlier = (c.skip_loss_zscore && loss_z > *c.skip_loss_zscore) ||
                (c.skip_grad_norm_zscore && grad_norm_z > *c.skip_grad_norm_zscore);
      Tensor flag = Tensor::empty({1}, DType::i32);
      flag.data<int32_t>()[0] = outlier ? 1 : 0;
      scope.set(kOutlierSkip, flag.to(device));
      update_exec->run(scope, env);
      grad_comm.synchronize();
      secs += seconds_since(t_update);
      totals.outlier_skips += outlier;
      if (outlier && rank == 0)
        spdlog::warn("step {}: {}: update skipped", step + 1,
                     std::isfinite(loss_z) && loss_z > c.skip_loss_zscore.value_or(INFINITY)
                         ? fmt::format("loss {:.4f} is {:.1f} standard deviations above the last {} steps' mean",
                                       loss_avg, loss_z, kOutlierWindow)
                         : fmt::format("grad_norm {:.4g} is {:.1f} standard deviations above the last {} steps' mean",
                                       grad_norm, grad_norm_z, kOutlierWindow));
    }
    totals.skipped += found_inf;
    const float scale = use_amp ? read_f32(scope, amp::ScalerVars::scale) : 1.f;
    const double samples_per_s = static_cast<double>(n * world) / std::max(secs, 1e-9);
    const double tokens_per_s = samples_per_s * static_cast<double>(model.tokens_per_example);
    const bool timed = !c.benchmark || step >= c.benchmark_warmup;
    // The op profile, like the speed, leaves out the warm-up (first-step
    // costs: cuDNN's choices, lazy module loading, allocator growth).
    if (!timed) op_seconds.clear();
    if (timed) totals.add_timed(secs, queue_secs, n * world, samples_per_s);
    const OverflowReport overflow = found_inf ? read_overflow_report(overflow_params, scope) : OverflowReport{};
    if (found_inf && rank == 0)
      spdlog::warn("step {}: gradients overflowed (inf/NaN){}; step skipped{}", step + 1, overflow.describe(),
                   use_amp ? fmt::format(", loss scale now {}", scale) : std::string(" (--clip-grad-norm)"));
    if (!std::isfinite(loss_avg) && !use_amp)
      MIX_FAIL("step " << step + 1 << ": the loss is " << loss_avg
                       << " in FP32 training; lower --lr or check the data");

    nlohmann::json line = {{"step", step + 1},
                           {"epoch", epoch},
                           {"loss", loss_avg},
                           {"loss_scale", scale},
                           {"found_inf", found_inf},
                           {"skipped", found_inf || outlier},
                           {"lr", rate},
                           {"grad_norm", grad_norm},
                           {"grad_bytes", grad_bytes},
                           {"step_ms", secs * 1e3},
                           {"samples_per_s", samples_per_s}};
    if (model.tokens_per_example > 0) line["tokens_per_s"] = tokens_per_s;
    if (two_parts) {
      line["outlier"] = outlier;
      if (std::isfinite(loss_z)) line["loss_z"] = loss_z;
      if (std::isfinite(grad_norm_z)) line["grad_norm_z"] = grad_norm_z;
    }
    if (found_inf) {
      line["overflow_params"] = overflow.params;
      line["overflow_ranks"] = overflow.ranks;
    }
    metrics.write(line);

    const bool last = step + 1 == total_steps;
    // A stop signal: this step is the run's last (the checkpoint below), with
    // no evaluation, which could outlast the scheduler's grace period.
    const bool stopping = ranks_stopping > 0 && !last;
    const bool log_now = c.log_every > 0 ? (step + 1) % c.log_every == 0 : seconds_since(t_last_log) >= 2.0;
    if (rank == 0 && (log_now || last)) {
      t_last_log = Clock::now();
      const double elapsed = seconds_since(t_start);
      const double eta = elapsed / static_cast<double>(step + 1 - start_step) * static_cast<double>(total_steps - step - 1);
      if (model.tokens_per_example > 0)
        spdlog::info("step {}/{} loss {:.4f} scale {} {:.0f} tokens/s ETA {}", step + 1, total_steps, loss_avg, scale,
                     tokens_per_s, format_eta(eta));
      else
        spdlog::info("step {}/{} loss {:.4f} scale {} {:.0f} samples/s ETA {}", step + 1, total_steps, loss_avg,
                     scale, samples_per_s, format_eta(eta));
    }
    if (diverge && diverge->step == step + 1 && diverge->rank == rank) nudge_first_parameter(program, scope);
    if ((c.check_every > 0 && (step + 1) % c.check_every == 0) || last || stopping) consistency_check(step + 1);

    const bool eval_now = c.eval_every > 0 ? (step + 1) % c.eval_every == 0 || last
                                           : in_epoch + 1 == steps_per_epoch || last;
    if (c.eval && !c.benchmark && eval_now && !stopping && data.test.size() > 0) {
      last_eval = evaluation.run(scope, env);
      if (rank == 0) {
        if (model.tokens_per_example > 0)
          spdlog::info("step {} validation loss {:.4f} nats/token, next-token accuracy {:.2f}% ({} sequences)",
                       step + 1, last_eval->loss, 100 * last_eval->accuracy, last_eval->examples);
        else
          spdlog::info("epoch {} test accuracy {:.2f}% ({} examples), test loss {:.4f}", epoch,
                       100 * last_eval->accuracy, last_eval->examples, last_eval->loss);
        metrics.write({{"step", step + 1},
                       {"epoch", epoch},
                       {"eval_accuracy", last_eval->accuracy},
                       {"val_loss", last_eval->loss}});
      }
    }
    // Each replaces the last, whole or not at all (a temporary file renamed);
    // the last step's is written after the summary, below.
    if (rank == 0 && c.save_every > 0 && (step + 1) % c.save_every == 0 && !last && !stopping)
      save_checkpoint_after(step + 1);
    if (stopping) {
      steps_done = step + 1;
      stop_signal = stop_signals.received();
      stop_ranks = ranks_stopping;
      break;
    }
  }

  const size_t peak_with_data = allocator_for(device).peak_bytes();
  const size_t peak = peak_with_data > data_set_bytes ? peak_with_data - data_set_bytes : 0;
  nlohmann::json summary =
      summary_line(c, model, totals, steps_done - start_step, peak, step_exec.plan(batch), world, scope, use_amp, last_eval);
  if (stop_ranks > 0) summary["stopped_by"] = stop_signal ? signal_name(stop_signal) : "a stop signal on another rank";
  if (c.skip_bad_images) {
    // Every rank's count, so the summary (written by rank 0) tells of bad
    // files whichever rank met them; the warnings name the files.
    int64_t replaced = 0;
    for (const data::Dataset* ds : {&data.train, &data.test})
      if (ds->source) replaced += ds->source->replaced_reads();
    comm.all_reduce(&replaced, 1, DType::i64, collective::ReduceOp::sum);
    summary["bad_image_reads_replaced"] = replaced;
    if (replaced > 0 && rank == 0)
      spdlog::warn("{} read(s) of bad images on {} rank(s) were replaced by the next good image (--skip-bad-images); "
                   "the warnings above name the files",
                   replaced, world);
  }
  metrics.write(summary);
  if (env.op_seconds && rank == 0)
    log_op_profile(op_seconds, program, totals.steps,
                   op_timer ? "on the device: from the end of the op before to the end of this one, so an op the "
                              "host was slow to queue counts the GPU's wait for it too"
                   : device.kind == DeviceKind::cpu ? "wall time on the host"
                                                    : "wall time on the host to queue each op");
  if (rank == 0) {
    // On the CPU the kernels run as they are queued, so the host's queue time
    // is the step's; the op profiler's timer waits for the GPU inside the step.
    if (c.benchmark) print_benchmark(c, model, totals, world, peak, device.kind != DeviceKind::cpu && !op_timer);
    if (last_eval && model.tokens_per_example > 0)
      spdlog::info("final validation loss {:.4f} nats/token", last_eval->loss);
    else if (last_eval)
      spdlog::info("final test accuracy {:.2f}%", 100 * last_eval->accuracy);
    if (!c.metrics.empty()) spdlog::info("metrics written to {}", c.metrics);
  }
  if (!c.save.empty()) {
    if (rank == 0) save_checkpoint_after(steps_done);
    comm.barrier();
  }
  if (stop_ranks > 0) {
    if (rank == 0) spdlog::warn("{}", stop_report(c, stop_signal, stop_ranks, world, steps_done, total_steps));
    return kStoppedExitCode;
  }
  return 0;
}

}  // namespace mix::launch
