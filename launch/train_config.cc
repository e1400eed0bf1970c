#include "launch/train_config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "launch/cli_checks.h"
#include "launch/cli_help.h"
#include "launch/stop_signals.h"
#include "launch/train_program.h"
#include "models/model.h"
#include "runtime/ir/op_registry.h"

namespace mix::launch {

using Mode = amp::LossScalerConfig::Mode;

collective::GradReduce TrainConfig::effective_grad_reduce() const {
  return grad_reduce.value_or(default_grad_reduce(precision));
}

amp::LossScalerConfig TrainConfig::loss_scaler_config() const {
  amp::LossScalerConfig s = amp::scaler_config(loss_scaling, loss_scaling_preset);
  if (init_loss_scaling) s.init_loss_scaling = static_cast<float>(*init_loss_scaling);
  if (incr_every_n_steps) s.incr_every_n_steps = static_cast<int>(*incr_every_n_steps);
  if (decr_every_n_nan_or_inf) s.decr_every_n_nan_or_inf = static_cast<int>(*decr_every_n_nan_or_inf);
  if (incr_ratio) s.incr_ratio = static_cast<float>(*incr_ratio);
  if (decr_ratio) s.decr_ratio = static_cast<float>(*decr_ratio);
  if (min_loss_scaling) s.min_loss_scaling = static_cast<float>(*min_loss_scaling);
  s.on_min_scale = on_min_scale;
  return s;
}

std::string TrainConfig::ignored_scaler_flags() const {
  const bool amp = amp::is_mixed(precision);
  const bool scaled = amp && loss_scaling != Mode::none;
  const bool dynamic = scaled && loss_scaling == Mode::dynamic;
  std::string ignored;
  auto note = [&](bool given, bool applies, const char* flag) {
    if (given && !applies) ignored += (ignored.empty() ? "" : ", ") + std::string(flag);
  };
  note(loss_scaling_given, amp, "--loss-scaling");
  note(loss_scaling_preset_given, dynamic, "--loss-scaling-preset");
  note(init_loss_scaling.has_value(), scaled, "--init-loss-scaling");
  note(incr_every_n_steps.has_value(), dynamic, "--incr-every-n-steps");
  note(decr_every_n_nan_or_inf.has_value(), dynamic, "--decr-every-n-nan-or-inf");
  note(incr_ratio.has_value(), dynamic, "--incr-ratio");
  note(decr_ratio.has_value(), dynamic, "--decr-ratio");
  note(min_loss_scaling.has_value(), dynamic, "--min-loss-scaling");
  // Under static and none an overflowing step at a scale at or below the
  // minimum still counts towards "stuck", so only FP32 ignores this one.
  note(on_min_scale_given, amp, "--on-min-scale");
  return ignored;
}

std::vector<std::string> TrainConfig::doubtful_values(int world) const {
  std::vector<std::string> out;
  // FP32 keeps 24 bits: an update smaller than |w| x 2^-24 leaves w as it
  // was. Weights start near 1/sqrt(fan_in) (2^-6 for 4096 inputs), and an
  // update is the lr times a gradient element, or AdamW's normalised step,
  // rarely above 1; so below 2^-30 the updates of typical weights are rounded
  // away. Only a warning: large gradients, or small weights, still move.
  if (lr < kSmallestUsefulLr) {
    std::ostringstream m;
    m << "--lr " << lr << " is below " << kSmallestUsefulLr
      << ": an update of lr x gradient smaller than 2^-24 of a weight is rounded away in FP32, so unless the "
         "gradients are far above 1 the weights will not change; raise --lr";
    out.push_back(m.str());
  }
  // Pre-dividing by the world size already keeps the sum within the largest
  // value any one rank sent; dividing by more only pushes small gradients
  // towards underflow (and F/world > 1 multiplies them back after the sum).
  if (grad_predivide > world) {
    std::ostringstream m;
    m << "--grad-predivide " << grad_predivide << " is above the world size " << world
      << ": dividing by the world size already keeps the sum from overflowing, and more only pushes small "
         "gradients into underflow before the sum; use a factor from 1 to "
      << world << " (0: the world size)";
    out.push_back(m.str());
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> TrainConfig::fingerprint_fields() const {
  auto num = [](auto v) {
    std::ostringstream o;
    o << v;
    return o.str();
  };
  auto opt = [&](auto& v) { return v ? num(*v) : std::string("default"); };
  auto list = [&](auto& v) {
    std::string s;
    for (auto& x : v) {
      if (!s.empty()) s += ',';
      s += num(x);
    }
    return s;
  };
  auto name = [](auto value, const auto& table) { return std::string(name_of(value, table)); };
  return {{"model", model},
          {"hidden", list(hidden)},
          {"image-size", opt(image_size)},
          {"width", opt(width)},
          {"blocks", list(blocks)},
          {"data-format", is_resnet() ? (resnet_channels_last() ? "nhwc" : "nchw") : "-"},
          {"fuse-add-relu", fuse_add_relu ? "on" : "off"},
          {"fuse-bn-relu", fuse_bn_relu ? "on" : "off"},
          {"fuse-matmul-bias", fuse_matmul_bias ? "on" : "off"},
          {"fold-grad-sums", fold_grad_sums ? "on" : "off"},
          {"fuse-add-layer-norm", fuse_add_layer_norm ? "on" : "off"},
          {"recompute-softmax", recompute_softmax ? "on" : "off"},
          {"layers", is_language_model() ? num(layers) : "-"},
          {"d-model", is_language_model() ? num(d_model) : "-"},
          {"heads", is_language_model() ? num(heads) : "-"},
          {"context", is_language_model() ? num(context) : "-"},
          {"vocab", is_language_model() ? num(vocab) : "-"},
          {"vocab-multiple", is_language_model() ? num(vocab_multiple) : "-"},
          {"tie-weights", tie_weights ? "on" : "off"},
          {"dropout", num(dropout)},
          {"fused-attention", !is_language_model() ? "-"
                              : !fused_attention   ? "off"
                              : dropout > 0        ? "off (--dropout)"
                                                   : "on"},
          {"data", name(data, kDataSetNames)},
          {"token-dtype", token_dtype ? name(*token_dtype, data::kTokenDTypeNames) : "-"},
          {"device", name(device, kDeviceKindNames)},
          {"allow-tf32", allow_tf32 ? "on" : "off"},
          {"cudnn-bn-persistent", cudnn_bn_persistent ? "on" : "off"},
          {"cudnn-benchmark", cudnn_benchmark ? "on" : "off"},
          {"cudnn-graph-conv", cudnn_graph_conv ? "on" : "off"},
          {"cublas-1x1-conv", cublas_1x1_conv ? "on" : "off"},
          {"attention-tensor-cores", attention_tensor_cores ? "on" : "off"},
          {"cudnn-attention", cudnn_attention ? "on" : "off"},
          {"cuda-graph", cuda_graph ? "on" : "off"},
          {"precision", name(precision, amp::kPrecisionNames)},
          {"grad-reduce", name(effective_grad_reduce(), collective::kGradReduceNames)},
          {"grad-predivide", num(grad_predivide)},
          {"batch-size", num(batch_size)},
          {"grad-accum-steps", num(grad_accum_steps)},
          {"steps", num(steps)},
          {"epochs", num(epochs)},
          {"lr", num(lr)},
          {"lr-schedule", name(lr_schedule, optim::kScheduleNames)},
          {"warmup-steps", num(warmup_steps)},
          {"optimizer", name(optimizer.kind, optim::kOptimizerNames)},
          {"momentum", num(optimizer.momentum)},
          {"weight-decay", num(optimizer.effective_weight_decay())},
          {"no-decay-1d", optimizer.no_decay_1d ? "on" : "off"},
          {"clip-grad-norm", opt(clip_grad_norm)},
          {"clip-grad-value", opt(clip_grad_value)},
          {"skip-loss-zscore", opt(skip_loss_zscore)},
          {"skip-grad-norm-zscore", opt(skip_grad_norm_zscore)},
          {"loss-scaling", name(loss_scaling, amp::kLossScalingNames)},
          {"loss-scaling-preset", name(loss_scaling_preset, amp::kScalerPresetNames)},
          {"init-loss-scaling", opt(init_loss_scaling)},
          {"incr-every-n-steps", opt(incr_every_n_steps)},
          {"decr-every-n-nan-or-inf", opt(decr_every_n_nan_or_inf)},
          {"incr-ratio", opt(incr_ratio)},
          {"decr-ratio", opt(decr_ratio)},
          {"min-loss-scaling", opt(min_loss_scaling)},
          {"on-min-scale", name(on_min_scale, amp::kOnMinScaleNames)},
          {"bucket-mb", num(bucket_mb)},
          {"overlap", overlap ? "true" : "false"},
          {"elide-single-rank-sync", elide_single_rank_sync ? "on" : "off"},
          {"synthetic-size", data == DataSet::synthetic ? opt(synthetic_size) : "-"},
          {"synthetic-features", data == DataSet::synthetic ? num(synthetic_features) : "-"},
          {"synthetic-classes", data == DataSet::synthetic ? num(synthetic_classes) : "-"},
          {"augment", is_image_data() ? name(augment, kAugmentNames) : "-"},
          {"crop-scale", is_image_data() ? list(crop_scale) : "-"},
          {"hflip", is_image_data() ? (hflip ? "true" : "false") : "-"},
          {"mean", is_image_data() ? list(mean) : "-"},
          {"std", is_image_data() ? list(stddev) : "-"},
          {"skip-bad-images", skip_bad_images ? "on" : "off"},
          {"shard-order", data == DataSet::image_shards ? name(shard_order, kShardOrderNames) : "-"},
          {"shuffle-buffer",
           data == DataSet::image_shards && shard_order == ShardOrder::stream ? num(shuffle_buffer) : "-"},
          {"inject-overflow", inject_overflow},
          {"fold-casts", fold_casts ? "on" : "off"},
          {"fuse-param-casts", fuse_param_casts ? "on" : "off"},
          {"amp-white-list", list(amp_white_list)},
          {"amp-black-list", list(amp_black_list)},
          {"seed", num(seed)},
          {"shuffle", shuffle ? "true" : "false"},
          {"check-every", num(check_every)},
          // Flags that decide which collectives run (a checkpoint's closing
          // barrier, evaluation's reductions, the benchmark's steps, a
          // printout instead of training): given to some ranks only, they
          // would leave the others waiting. Paths may differ between nodes.
          {"save", save.empty() ? "not given" : "given"},
          {"save-every", num(save_every)},
          {"resume", resume.empty()  ? "not given"
                     : resume_auto() ? "auto"
                                     : "given"},
          {"keep-checkpoints", num(keep_checkpoints)},
          {"collective-timeout", num(collective_timeout)},
          {"init-from", init_from.empty() ? "not given" : "given"},
          {"eval", eval ? "true" : "false"},
          {"eval-every", num(eval_every)},
          {"eval-batches", num(eval_batches)},
          {"eval-batch-size", num(effective_eval_batch_size())},
          {"benchmark", benchmark ? "on" : "off"},
          {"benchmark-warmup", num(benchmark_warmup)},
          {"print-program", print_program ? "on" : "off"}};
}

bool parse_inject_overflow(const std::string& text, InjectOverflowSpec& out) {
  std::vector<std::string> parts;
  std::string part;
  std::stringstream ss(text);
  while (std::getline(ss, part, ':')) parts.push_back(part);
  if (parts.empty() || parts.size() > 3) return false;
  try {
    size_t used = 0;
    const size_t dot = parts[0].find('.');
    const std::string step = parts[0].substr(0, dot);
    out.step = std::stoll(step, &used);
    if (used != step.size() || out.step < 1) return false;
    if (dot != std::string::npos) {
      const std::string micro = parts[0].substr(dot + 1);
      out.micro = std::stoll(micro, &used);
      if (used != micro.size() || out.micro < 1) return false;
    }
    if (parts.size() > 1 && !parts[1].empty()) {
      out.rank = std::stoi(parts[1], &used);
      if (used != parts[1].size() || out.rank < 0) return false;
    }
    if (parts.size() > 2) out.param = parts[2];
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

namespace {

// The environment variables mixtrain reads, for --help's footer.
constexpr const char* kEnvironmentHelp =
    "Environment:\n"
    "  MIX_LOG_LEVEL=LEVEL           trace, debug, info, warn or error [default: info on rank 0, warn elsewhere]\n"
    "  MIX_LOG_ALL_RANKS=1           every rank logs at info\n"
    "  MIX_LOG_COLOR=0|1             colour the log or not [default: only a single process on a terminal]\n"
    "  MIX_PROFILE_OPS=1|host        time every op and print the totals by op type: on a GPU, its device time (1)\n"
    "                                or the host's time to queue it (host)\n"
    "  MIX_NCCL_TIMEOUT_S=S          the older name of --collective-timeout (its default when set)\n"
    "  MIX_TEST_DIVERGE=STEP:RANK    testing aid: nudge RANK's first parameter after STEP (--check-every catches it)\n"
    "  MIX_TEST_LOSS_SPIKE=STEP      testing aid: inputs times 1000 at STEP (--skip-loss-zscore catches it)\n"
    "\n"
    "Run one process per device: mixrun -n 2 -- mixtrain ..., or mpirun -np 2 mixtrain ...\n"
    "docs/flags.md describes every flag; docs/design.md the training step.\n";

}  // namespace

std::optional<int> parse_train_config(int argc, char** argv, TrainConfig& c) {
  CLI::App app{"mixtrain: data-parallel mixed-precision training, one process per device", "mixtrain"};
  app.formatter(help_formatter());
  app.footer(kEnvironmentHelp);
  app.set_version_flag("--version", [] { return version_text("mixtrain"); }, "print the version, the commit and "
                                                                               "the libraries of this build, and exit");
  // A flag given twice takes its last value (scripts append overrides); list
  // flags below opt back into taking every value.
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::vector<std::string> model_names;
  for (const auto& m : models::model_names()) model_names.push_back(m);

  app.option_defaults()->group("Model");
  app.add_option("--model", c.model, "model to train")->check(one_of(model_names))->type_name([&] {
    std::string s;
    for (const auto& m : model_names) s += (s.empty() ? "" : "|") + m;
    return s;
  }());
  // A comma-separated list: every value given, in order.
  const auto add_list = [&app](const char* flag, auto& target, const char* help) {
    return app.add_option(flag, target, help)->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  };
  add_list("--hidden", c.hidden, "mlp: hidden layer sizes, comma separated")->check(kPositiveInt);
  app.add_option("--image-size", c.image_size, "ResNets: height and width of synthetic, image-folder or image-shards images")
      ->check(kPositiveInt)
      ->default_str("224; 32 for resnet-small");
  app.add_option("--width", c.width, "ResNets: channels of the stem and first stage")
      ->check(kPositiveInt)
      ->default_str("64; 16 for resnet-small");
  add_list("--blocks", c.blocks, "ResNets: blocks per stage, comma separated")
      ->check(kPositiveInt)
      ->default_str("the model's: 2,2,2 for resnet-small");
  add_choice(app, "--data-format", c.data_format, kDataFormatNames,
             "ResNets: activation layout, channels first (nchw) or last (nhwc); auto: nhwc for amp on cuda, else "
             "nchw");
  // The language models' sizes: each flag's default for --model transformer, then for gpt2.
  const auto add_size = [&app](const char* flag, int64_t& target, const char* help, const char* defaults) {
    return app.add_option(flag, target, help)->check(kPositiveInt)->default_str(defaults);
  };
  add_size("--layers", c.layers, "transformer: blocks", "4; 12 for gpt2");
  add_size("--d-model", c.d_model, "transformer: width of the residual stream", "128; 768 for gpt2");
  add_size("--heads", c.heads, "transformer: attention heads (must divide --d-model)", "4; 12 for gpt2");
  add_size("--context", c.context, "transformer: tokens per sequence", "128; 1024 for gpt2");
  add_size("--vocab", c.vocab, "transformer: vocabulary (256 or more for byte-level text)", "256; 50257 for gpt2")
      ->check(CLI::Range(2, 1 << 24));
  add_size("--vocab-multiple", c.vocab_multiple,
           "transformer: pad the vocabulary (wte's rows, the logits) to a multiple of this for the GEMMs; the "
           "padding is masked, so results are the unpadded model's",
           "1; 64 for gpt2");
  app.add_flag("--tie-weights", c.tie_weights,
               "transformer: the output layer reuses the token embedding (gpt2: always)");
  app.add_option("--dropout", c.dropout, "transformer: dropout probability (0: none)")->check(number_in(0.0, 0.99));
  app.add_flag("!--no-fused-attention", c.fused_attention,
               "transformer: attention as matmul, causal softmax and matmul, storing the [tokens, tokens] "
               "probabilities (the reference), instead of one fused_attention op; --dropout above 0 implies it");

  app.option_defaults()->group("Data");
  std::optional<DataSet> data;  // the model's default data set unless given
  add_choice(app, "--data", data, kDataSetNames, "data set", "fortunes for the transformer, else fashion-mnist");
  app.add_option("--data-dir", c.data_dir, "directory of the data set")
      ->default_str("/usr/share/datasets/fashion-mnist; /usr/share/games/fortunes; token-shards: none");
  add_choice(app, "--token-dtype", c.token_dtype, data::kTokenDTypeNames,
             "token-shards: the token width of headerless files (nanoGPT's train.bin, val.bin); llm.c's headers "
             "give their own",
             "uint16");
  app.add_option("--data-file", c.data_file,
                 "your own data: a safetensors file with `inputs` F32 [N, ...] and `labels` I64 [N] (implies --data "
                 "safetensors)");
  app.add_option("--shuffle", c.shuffle, "shuffle each epoch (seeded by --seed and the epoch)")->default_str("true");
  app.add_option("--synthetic-size", c.synthetic_size, "examples in the synthetic training set")
      ->check(kPositiveInt)
      ->default_str("8192; 512 images; 1024 sequences");
  app.add_option("--synthetic-features", c.synthetic_features, "mlp: features per synthetic example")
      ->check(kPositiveInt);
  app.add_option("--synthetic-classes", c.synthetic_classes, "classes of the synthetic task")
      ->check(CLI::Range(2, 1000000));
  // --data image-folder and image-shards (runtime/data/image_folder.h, image_shards.h)
  add_choice(app, "--augment", c.augment, kAugmentNames,
             "images training: imagenet (RandomResizedCrop and a horizontal flip), or none (evaluation's resize "
             "and centre crop)");
  add_list("--crop-scale", c.crop_scale, "images: RandomResizedCrop's range of the area fraction, MIN,MAX")
      ->default_str("0.08,1");
  app.add_option("--hflip", c.hflip, "images: flip training images left-right with probability 0.5")
      ->default_str("true");
  add_list("--mean", c.mean, "images: per-channel mean subtracted from [0, 1] pixels, R,G,B")
      ->default_str("0.485,0.456,0.406 (ImageNet's)");
  add_list("--std", c.stddev, "images: per-channel standard deviation the pixels are divided by, R,G,B")
      ->default_str("0.229,0.224,0.225 (ImageNet's)");
  app.add_option("--data-workers", c.data_workers, "images: threads per rank decoding a batch's images")
      ->check(CLI::Range(1, 1024))
      ->default_str("the host's cores divided among its ranks");
  app.add_flag("--skip-bad-images", c.skip_bad_images,
               "images: replace an unreadable image by the next good one, with a warning, instead of stopping");
  app.add_option("--prefetch", c.prefetch,
                 "training batches gathered ahead of the step, one after another on a background thread (each "
                 "batch's images on --data-workers threads)")
      ->check(CLI::Range(1, 64));
  add_choice(app, "--shard-order", c.shard_order, kShardOrderNames,
             "image-shards training: stream (each rank its own shards, read in order through a shuffle buffer) or "
             "global (one permutation of all examples over the ranks, as image-folder)");
  app.add_option("--shuffle-buffer", c.shuffle_buffer,
                 "image-shards, --shard-order stream: examples in the shuffle buffer (under 2: no shuffle)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));

  app.option_defaults()->group("Precision and AMP");
  add_choice(app, "--precision", c.precision, amp::kPrecisionNames,
             "fp32; amp: the white-list ops in FP16, FP32 master weights, dynamic loss scaling; bf16: the same "
             "lists in BF16, no loss scaling unless --loss-scaling asks for it");
  add_list("--amp-white-list", c.amp_white_list,
           "amp: ops to run in FP16 besides the white list's (conv2d, matmul, mul, fused_attention), comma separated")
      ->default_str("");
  add_list("--amp-black-list", c.amp_black_list,
           "amp: ops to keep in FP32 besides the black list's (softmax, mean, lookup_table, ...), comma separated")
      ->default_str("");
  app.add_flag("!--no-fold-casts", c.fold_casts,
               "amp: keep the casts that Paddle's lists make around softmax, softmax_with_cross_entropy, residual "
               "adds, layer_norm and image_normalize; by default those ops read or write the FP16 values directly "
               "(the same results)");

  app.option_defaults()->group("Loss scaling (amp, bf16)");
  add_choice(app, "--loss-scaling", c.loss_scaling, amp::kLossScalingNames,
             "dynamic (grows and shrinks with overflows), static (--init-loss-scaling, fixed) or none (scale 1); "
             "every mode skips a step whose gradients overflowed")
      ->default_str("dynamic; none under bf16");
  CLI::Option* preset = add_choice(app, "--loss-scaling-preset", c.loss_scaling_preset, amp::kScalerPresetNames,
                                   "defaults of the dynamic scaler: paddle (32768, x2 every 1000 good steps, x0.8 "
                                   "every 2 overflows) or pytorch (65536, x2 every 2000, x0.5 every overflow)");
  // The scaler's settings: each overrides the preset's value.
  const auto add_override = [&app](const char* flag, auto& target, const char* help, const CLI::Validator& check) {
    return app.add_option(flag, target, help)->check(check)->default_str("the preset's");
  };
  add_override("--init-loss-scaling", c.init_loss_scaling, "initial (or static) loss scale", kPositive);
  add_override("--incr-every-n-steps", c.incr_every_n_steps, "finite steps before the scale grows", kPositiveInt);
  add_override("--decr-every-n-nan-or-inf", c.decr_every_n_nan_or_inf, "overflow steps before the scale shrinks",
               kPositiveInt);
  add_override("--incr-ratio", c.incr_ratio, "growth factor of the scale", number_in(1.0, 1e6));
  add_override("--decr-ratio", c.decr_ratio, "shrink factor of the scale", number_in(1e-6, 1.0));
  app.add_option("--min-loss-scaling", c.min_loss_scaling, "smallest loss scale")->check(kPositive)->default_str("1");
  add_choice(app, "--on-min-scale", c.on_min_scale, amp::kOnMinScaleNames,
             "after 100 skipped steps in a row at the smallest scale: stop with an error, or continue skipping");

  app.option_defaults()->group("Data parallelism");
  add_choice(app, "--grad-reduce", c.grad_reduce, collective::kGradReduceNames,
             "dtype of the gradient all-reduce: fp16 or bf16 (the low-precision gradients, before their cast to "
             "FP32: half the bytes; under amp and bf16 respectively) or fp32",
             "fp16 under amp, fp32 under fp32 and bf16");
  app.add_option("--grad-predivide", c.grad_predivide,
                 "multiply gradients by 1/F before the sum and F/world after (0: F = world size, all before)")
      ->check(kNonNegative);
  app.add_option("--bucket-mb", c.bucket_mb, "largest gradient bucket in MB")->check(kPositive);
  app.add_flag("!--no-overlap", c.overlap,
               "all-reduce the gradient buckets after backward, one at a time, instead of starting each as soon as "
               "backward has written it (for comparison)");
  app.add_flag("!--no-elide-single-rank-sync", c.elide_single_rank_sync,
               "one rank: keep the gradient all-reduce ops, which pack, sum over one rank and unpack each bucket, "
               "instead of taking them out (the same values; to time a sync on one rank)");
  app.add_option("--collective-timeout", c.collective_timeout,
                 "seconds a collective waits for the other ranks before the job is aborted, naming the ranks it "
                 "waited for (also NCCL's watchdog; MIX_NCCL_TIMEOUT_S is an older name for it)")
      ->check(number_in(1, 1e9))
      ->type_name("S");
  app.add_option("--check-every", c.check_every,
                 "steps between the ranks' consistency checks of the masters and the scaler (0: at the end only)")
      ->check(kNonNegativeInt);

  app.option_defaults()->group("Optimizer and schedule");
  app.add_option("--batch-size", c.batch_size, "examples per rank per micro-batch (per step without accumulation)")
      ->check(kPositiveInt);
  app.add_option("--grad-accum-steps", c.grad_accum_steps,
                 "micro-batches per optimizer step: each loss counts 1/K, the gradients are summed in FP32 and "
                 "all-reduced once, during the last micro-batch's backward (global batch: batch-size x K x ranks)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--steps", c.steps, "optimizer steps to run, overriding --epochs (0 with --save: write the initial "
                                     "model and stop)")
      ->check(kNonNegativeInt)
      ->default_str("all the steps of --epochs");
  app.add_option("--epochs", c.epochs, "passes over the training set")->check(kPositiveInt);
  app.add_option("--lr", c.lr, "peak learning rate")->check(kPositive);
  add_choice(app, "--lr-schedule", c.lr_schedule, optim::kScheduleNames,
             "constant; cosine (half a cosine to 0 after the warm-up); onecycle (torch's OneCycleLR: cosine up from "
             "lr/25 over the warm-up or 30% of the steps, then down)");
  app.add_option("--warmup-steps", c.warmup_steps, "linear warm-up steps")->check(kNonNegativeInt);
  add_choice(app, "--optimizer", c.optimizer.kind, optim::kOptimizerNames,
             "sgd, momentum (torch.optim.SGD with momentum) or adamw (torch.optim.AdamW: betas 0.9, 0.999, eps 1e-8)");
  app.add_option("--momentum", c.optimizer.momentum, "momentum of --optimizer momentum")->check(number_in(0.0, 1.0));
  app.add_option("--weight-decay", c.optimizer.weight_decay, "weight decay, decoupled for adamw")
      ->check(kNonNegative)
      ->default_str("0; 0.01 for adamw, as torch.optim.AdamW");
  // A positive bound that turns a step feature on; unset: off.
  const auto add_off_by_default = [&app](const char* flag, std::optional<double>& target, const char* help) {
    app.add_option(flag, target, help)->check(kPositive)->default_str("off");
  };
  add_off_by_default("--clip-grad-norm", c.clip_grad_norm,
                     "scale the gradients so that their global L2 norm is at most C, after the all-reduce and the "
                     "unscale, as torch.nn.utils.clip_grad_norm_; a non-finite norm skips the step");
  add_off_by_default("--clip-grad-value", c.clip_grad_value,
                     "clamp every gradient element to [-V, V], after the unscale, as torch.nn.utils.clip_grad_value_");
  add_off_by_default("--skip-loss-zscore", c.skip_loss_zscore,
                     "skip an update whose loss (the ranks' mean) is more than Z standard deviations above the mean "
                     "of the last 128 steps, as llm.c does; every rank decides alike");
  add_off_by_default("--skip-grad-norm-zscore", c.skip_grad_norm_zscore,
                     "the same for grad_norm: skip an update whose gradient norm is more than Z standard deviations "
                     "above the last 128 steps' mean");
  app.add_flag("--no-decay-1d", c.optimizer.no_decay_1d,
               "no weight decay on 1-D parameters (biases, norm scales and shifts), as timm and nanoGPT do");
  app.add_option("--seed", c.seed, "seed of initialisation, shuffles, dropout and synthetic data")
      ->check(unsigned_check());

  app.option_defaults()->group("Checkpoints, metrics and evaluation");
  app.add_option("--metrics", c.metrics, "JSON Lines metrics file, one line a step and a summary (rank 0)");
  app.add_option("--save", c.save, "checkpoint (safetensors) written at the end, and every --save-every steps");
  app.add_option("--save-every", c.save_every,
                 "steps between checkpoints to --save during training, each replacing the last (0: at the end only)")
      ->check(kNonNegativeInt);
  app.add_option("--resume", c.resume,
                 "checkpoint to resume from: parameters, optimizer, scaler, step and data position; auto: the newest "
                 "complete checkpoint of --save (and its --keep-checkpoints history), or a fresh start when there is "
                 "none")
      ->type_name("FILE|auto");
  app.add_option("--keep-checkpoints", c.keep_checkpoints,
                 "checkpoints to keep: --save holds the newest, the N - 1 before it stay beside it as "
                 "STEM.stepK.EXT")
      ->check(kPositiveInt);
  std::string stop_signals = "TERM,INT,USR1";
  app.add_option("--stop-signals", stop_signals,
                 "signals that stop training at the next step: every rank agrees, --save is written, and the exit "
                 "status is 75 (a second SIGINT ends at once); none: the signals' default actions")
      ->type_name("SIG,...|none")
      ->default_str(stop_signals)
      ->check(CLI::Validator(
          [](std::string& value) {
            try {
              parse_stop_signals(value);
              return std::string();
            } catch (const std::invalid_argument& e) {
              return std::string(e.what());
            }
          },
          ""));
  app.add_option("--init-from", c.init_from,
                 "safetensors parameters to start from, by PyTorch state_dict names (e.g. a torch model's)");
  app.add_option("--eval", c.eval, "evaluate on the test set")->default_str("true");
  app.add_option("--eval-every", c.eval_every, "steps between evaluations (0: at the end of each epoch)")
      ->check(kNonNegativeInt);
  app.add_option("--eval-batches", c.eval_batches,
                 "at most this many batches of --eval-batch-size per rank and evaluation (0: the whole test split)")
      ->check(kNonNegativeInt);
  app.add_option("--eval-batch-size", c.eval_batch_size,
                 "test examples per rank in an evaluation batch (the same accuracy at any size, the loss up to "
                 "FP32 rounding)")
      ->check(kPositiveInt)
      ->default_str("1000; transformer: --batch-size, at least 16");
  app.add_option("--log-every", c.log_every, "steps between progress lines (0: about every 2 s)")
      ->check(kNonNegativeInt);
  app.add_flag("--print-program", c.print_program,
               "print the passes that built the training program, the program and its gradient buckets, and exit");
  app.add_flag("--benchmark", c.benchmark, "time steps after a warm-up; print samples/s and peak memory");
  app.add_option("--benchmark-warmup", c.benchmark_warmup, "untimed warm-up steps of --benchmark")
      ->check(kNonNegativeInt);

  app.option_defaults()->group("Devices");
  add_choice(app, "--device", c.device, kDeviceKindNames, "where to train: the CPU, or one GPU per rank");
  app.add_flag("--allow-tf32", c.allow_tf32, "let FP32 GEMMs and convolutions on GPUs use TF32 tensor cores");
  app.add_flag("--cudnn-bn-persistent", c.cudnn_bn_persistent,
               "train batch_norm on GPUs with cuDNN's SPATIAL_PERSISTENT kernels (channels last: the batch norms "
               "without a fused relu)");
  app.add_flag("--cudnn-benchmark", c.cudnn_benchmark,
               "time the legacy cuDNN calls' convolution algorithms on the first step and keep the fastest per shape, "
               "as PyTorch's cudnn.benchmark (implies --no-cudnn-graph-conv)");
  CLI::Option* graph_conv = app.add_flag(
      "--cudnn-graph-conv,!--no-cudnn-graph-conv", c.cudnn_graph_conv,
      "convolutions on GPUs through cuDNN's graph API, an execution plan built once per shape (on by default), or "
      "through the legacy calls, which cost the host far more per call (docs/gpu.md)");
  app.add_flag("--cublas-1x1-conv", c.cublas_1x1_conv,
               "on GPUs, run each 1x1, unpadded, ungrouped channels-last convolution as one cuBLAS GEMM per pass "
               "instead of a cuDNN call");
  app.add_flag("!--no-attention-tensor-cores", c.attention_tensor_cores,
               "on GPUs, run fused_attention on its FP32 kernels, whose rounding points are the CPU twin's, instead "
               "of its tensor-core kernels (FP16/BF16, head_dim 32, 64, 96 or 128), which round the probabilities "
               "and dS to 16 bits before their products (cuDNN's attention engines, tensor-core ones, are off too)");
  app.add_flag("!--no-cudnn-attention", c.cudnn_attention,
               "on GPUs, run fused_attention on mixtrain's own kernels only, instead of trying cuDNN's scaled "
               "dot-product attention (flash-attention engines; FP16/BF16, head_dim a multiple of 8 up to 256) first");
  app.add_flag("--cuda-graph", c.cuda_graph,
               "on GPUs, record the training step once as a CUDA graph (its second step) and replay it: one launch a "
               "step (MIX_PROFILE_OPS runs, and the CPU, run op by op)");

  app.option_defaults()->group("Whole-step passes (each on by default; the same values but where one says)");
  app.add_flag("!--store-softmax", c.recompute_softmax,
               "softmax_with_cross_entropy stores its softmax for the gradient, as Paddle does, instead of the "
               "gradient recomputing it from the logits");
  app.add_flag("!--no-fuse-add-relu", c.fuse_add_relu,
               "keep each elementwise_add + relu, and each gradient sum + relu_grad, as two ops");
  app.add_flag("!--no-fuse-bn-relu", c.fuse_bn_relu,
               "keep each batch_norm + relu, and each relu_grad + batch_norm_grad, as two ops");
  app.add_flag("!--no-fuse-matmul-bias", c.fuse_matmul_bias,
               "keep each linear layer's matmul and bias add as two ops, instead of the bias added in the GEMM's "
               "epilogue (the same values in FP32; in FP16 and BF16 the fused op rounds once, not twice)");
  app.add_flag("!--no-fold-grad-sums", c.fold_grad_sums,
               "keep each sum of a gradient's two parts as its own op, instead of layer_norm_grad or "
               "lookup_table_grad adding the other part as it writes its own (the same values)");
  app.add_flag("!--no-fuse-add-layer-norm", c.fuse_add_layer_norm,
               "keep each residual elementwise_add and the layer_norm reading its output as two ops, instead of one "
               "op that normalises the sum as it writes it (the same values)");
  app.add_flag("!--no-fuse-param-casts", c.fuse_param_casts,
               "amp: keep one cast op per weight for its FP16 copy instead of one fused_cast op for all");

  app.option_defaults()->group("Testing aids");
  app.add_option("--inject-overflow", c.inject_overflow,
                 "STEP[:RANK[:PARAM]]: make that rank's gradients (or PARAM's) non-finite after the all-reduce at "
                 "that step; STEP.MICRO[:RANK]: that micro-batch's (1 to --grad-accum-steps), before it");

  if (auto stop = parse_command_line(app, argc, argv)) return stop;
  c.stop_signals = parse_stop_signals(stop_signals);
  auto bad = [](const std::string& msg) {
    std::cerr << "mixtrain: " << msg << "\n";
    return 2;
  };
  using amp::Precision;
  const auto name = [](auto value, const auto& table) { return std::string(name_of(value, table)); };
  const auto given = [&app](const char* flag) { return app.get_option(flag)->count() > 0; };
  // MIX_NCCL_TIMEOUT_S, the NCCL watchdog's older setting, is the flag's default when set.
  if (const char* env = std::getenv("MIX_NCCL_TIMEOUT_S"); env && *env && !given("--collective-timeout")) {
    double seconds = 0;
    if (!parse_number(env, /*integer=*/false, seconds) || seconds < 1)
      return bad(std::string("MIX_NCCL_TIMEOUT_S='") + env + "' is not a number of seconds >= 1 (--collective-timeout "
                 "is its newer name)");
    c.collective_timeout = std::min(seconds, 1e9);
  }
  // --model gpt2 (or transformer) sets every model flag not given.
  if (c.is_language_model()) {
    const models::TransformerConfig model_preset = models::transformer_preset(c.transformer_preset());
    if (!given("--layers")) c.layers = model_preset.layers;
    if (!given("--d-model")) c.d_model = model_preset.d_model;
    if (!given("--heads")) c.heads = model_preset.heads;
    if (!given("--context")) c.context = model_preset.context;
    if (!given("--vocab")) c.vocab = model_preset.vocab;
    if (!given("--vocab-multiple")) c.vocab_multiple = model_preset.vocab_multiple;
    c.tie_weights = c.tie_weights || model_preset.tie_weights;
  }
  const std::string data_name = data ? name(*data, kDataSetNames) : "";
  if (!c.data_file.empty() && data && *data != DataSet::safetensors)
    return bad("--data-file gives the data, but --data " + data_name + " asks for another data set: drop one of them");
  c.data = data ? *data : c.is_language_model() ? DataSet::fortunes : DataSet::fashion_mnist;
  if (!c.data_file.empty()) c.data = DataSet::safetensors;  // --data-file alone says where the data is
  if (c.data == DataSet::image_folder && c.data_dir.empty())
    return bad("--data image-folder needs --data-dir DIR, a folder with train/<class>/*.jpg and val/<class>/*.jpg");
  if (c.data == DataSet::image_shards && c.data_dir.empty())
    return bad("--data image-shards needs --data-dir DIR, a folder with train-*.tar and val-*.tar shards");
  if (c.data == DataSet::token_shards && c.data_dir.empty())
    return bad("--data token-shards needs --data-dir DIR: a directory of llm.c's *_train_*.bin and *_val_*.bin "
               "shards or nanoGPT's train.bin and val.bin");
  if (c.data != DataSet::token_shards && c.token_dtype)
    return bad("--token-dtype is for --data token-shards; the data here is " + name(c.data, kDataSetNames) + "'s");
  if (c.data_dir.empty())
    c.data_dir = c.data == DataSet::fortunes ? "/usr/share/games/fortunes" : "/usr/share/datasets/fashion-mnist";
  const std::string data_set = name(c.data, kDataSetNames);
  const bool tokens = c.data == DataSet::fortunes || c.data == DataSet::token_shards;
  if (c.is_language_model() && !tokens && c.data != DataSet::synthetic)
    return bad("--model transformer trains on --data fortunes, token-shards or synthetic (tokens), not --data " +
               data_set);
  if (!c.is_language_model() && tokens)
    return bad("--data " + data_set + " is text for --model transformer; --model " + c.model +
               " needs images or features");
  if (c.is_language_model() && c.d_model % c.heads != 0)
    return bad("--heads " + std::to_string(c.heads) + " must divide --d-model " + std::to_string(c.d_model));
  if (c.is_language_model() && c.data == DataSet::fortunes && c.vocab < 256)
    return bad("--vocab " + std::to_string(c.vocab) + " is too small for byte-level text: use 256 or more");
  if (c.data == DataSet::safetensors && c.data_file.empty()) return bad("--data safetensors needs --data-file FILE");
  if (const std::string why = grad_reduce_conflict(c.precision, c.effective_grad_reduce()); !why.empty())
    return bad(why);
  // The largest FP16 value is 65504 and its smallest subnormal 2^-24: divided
  // by more than 65504 x 2^24, every FP16 gradient goes into the sum as 0 (or,
  // at best, its one smallest value), and the run trains nothing.
  if (c.effective_grad_reduce() == collective::GradReduce::fp16 && c.grad_predivide > kLargestFp16Predivide) {
    std::ostringstream m;
    m << "--grad-predivide " << c.grad_predivide << " leaves nothing of the FP16 gradient all-reduce: divided by more "
      << "than " << kLargestFp16Predivide
      << " (FP16's largest value over its smallest), every FP16 gradient underflows to 0; use a factor from 1 to "
         "the world size (0: the world size)";
    return bad(m.str());
  }
  if (!amp::is_mixed(c.precision) && !c.inject_overflow.empty())
    return bad("--inject-overflow needs --precision amp or bf16 (only their steps check for overflow)");
  InjectOverflowSpec inject;
  if (!c.inject_overflow.empty() && !parse_inject_overflow(c.inject_overflow, inject))
    return bad("--inject-overflow '" + c.inject_overflow +
               "': expected STEP[:RANK[:PARAM]] or STEP.MICRO[:RANK] with STEP >= 1, e.g. 5, 5:1, 5:1:fc1.weight or "
               "5.2:1 (micro-batch 2 of step 5, with --grad-accum-steps)");
  if (inject.micro > c.grad_accum_steps)
    return bad("--inject-overflow " + c.inject_overflow + ": step " + std::to_string(inject.step) + " has " +
               std::to_string(c.grad_accum_steps) + " micro-batch(es) (--grad-accum-steps), so there is no micro-batch " +
               std::to_string(inject.micro));
  if (inject.micro > 0 && !inject.param.empty())
    return bad("--inject-overflow " + c.inject_overflow +
               ": an overflow in a micro-batch reaches every parameter (it goes into the loss gradient): drop :" +
               inject.param);
  if (!c.resume.empty() && !c.init_from.empty()) return bad("--resume and --init-from are exclusive: use one");
  if (c.model == "mlp" && c.hidden.empty()) return bad("--hidden needs at least one size for --model mlp");
  if (!c.is_resnet() && (c.image_size || c.width || !c.blocks.empty()))
    return bad("--image-size, --width and --blocks are for the ResNet models (--model " + c.model + ")");
  // Flags of another model, optimizer or data set would do nothing here,
  // silently (a --dropout on the MLP, a --momentum under adamw).
  for (const char* flag : {"--layers", "--d-model", "--heads", "--context", "--vocab", "--vocab-multiple",
                           "--tie-weights", "--dropout", "--no-fused-attention"})
    if (!c.is_language_model() && given(flag))
      return bad(std::string(flag) + " is for --model transformer; --model " + c.model + " has no such setting");
  if (c.model != "mlp" && given("--hidden"))
    return bad("--hidden sets the MLP's layers; --model " + c.model + " has none (drop it, or use --model mlp)");
  if (c.optimizer.kind != optim::OptimizerKind::momentum && given("--momentum"))
    return bad("--momentum is for --optimizer momentum; --optimizer " + name(c.optimizer.kind, optim::kOptimizerNames) +
               (c.optimizer.kind == optim::OptimizerKind::sgd
                    ? " is plain SGD (for SGD with momentum, as torch.optim.SGD(momentum=...), use --optimizer "
                      "momentum)"
                    : " has its own betas"));
  for (const char* flag : {"--synthetic-size", "--synthetic-features", "--synthetic-classes"})
    if (c.data != DataSet::synthetic && given(flag))
      return bad(std::string(flag) + " is for --data synthetic; the data here is " + data_set + "'s");
  if ((c.is_resnet() || c.is_language_model()) && given("--synthetic-features"))
    return bad("--synthetic-features sets the MLP's flat examples; --model " + c.model + " takes " +
               (c.is_resnet() ? "images (--image-size)" : "tokens (--context)"));
  if (c.is_language_model() && given("--synthetic-classes"))
    return bad("--synthetic-classes is for classifiers; --model transformer predicts tokens (--vocab)");
  if (c.steps == 0 && !c.inject_overflow.empty())
    return bad("--inject-overflow " + c.inject_overflow + ": --steps 0 trains nothing to overflow");
  if (!c.is_resnet() && c.data_format != DataFormat::auto_)
    return bad("--data-format is for the ResNet models (--model " + c.model + " has no image layout)");
  if (c.image_size && c.data != DataSet::synthetic && !c.is_image_data())
    return bad("--image-size sets the size of synthetic, image-folder or image-shards images; with --data " +
               data_set +
               " the images have the data set's size");
  if (c.is_image_data() && !c.is_resnet())
    return bad("--data " + data_set + " gives [3, H, W] images for the ResNet models, not --model " + c.model);
  for (const char* flag :
       {"--augment", "--crop-scale", "--hflip", "--mean", "--std", "--data-workers", "--skip-bad-images"})
    if (!c.is_image_data() && given(flag))
      return bad(std::string(flag) + " is for --data image-folder or image-shards; the data here is " + data_set +
                 "'s");
  for (const char* flag : {"--shard-order", "--shuffle-buffer"})
    if (c.data != DataSet::image_shards && given(flag))
      return bad(std::string(flag) + " is for --data image-shards; the data here is " + data_set + "'s");
  if (c.shard_order == ShardOrder::global && given("--shuffle-buffer"))
    return bad("--shuffle-buffer is --shard-order stream's; --shard-order global shuffles all examples at once");
  if (c.crop_scale.size() != 2 || !(c.crop_scale[0] > 0 && c.crop_scale[0] <= c.crop_scale[1] && c.crop_scale[1] <= 1))
    return bad("--crop-scale takes MIN,MAX with 0 < MIN <= MAX <= 1 (fractions of the image's area)");
  if (c.mean.size() != 3 || c.stddev.size() != 3)
    return bad("--mean and --std take three values, R,G,B");
  for (double v : c.stddev)
    if (!(v > 0)) return bad("--std values must be above 0 (the pixels are divided by them)");
  if (c.augment == Augment::none && (given("--crop-scale") || given("--hflip")))
    return bad("--crop-scale and --hflip are the imagenet augmentation's; --augment none has no random crop or flip");
  if (c.is_resnet() && c.image_size) {
    const int64_t min_size = models::resnet_min_image_size(models::resnet_preset(c.model));
    if (*c.image_size < min_size)
      return bad("--image-size " + std::to_string(*c.image_size) + " is too small for --model " + c.model +
                 ": it needs at least " + std::to_string(min_size));
  }
  if (c.clip_grad_norm && c.clip_grad_value)
    return bad("--clip-grad-norm and --clip-grad-value are two ways to clip the gradients: use one");
  if (c.cuda_graph && (c.skip_loss_zscore || c.skip_grad_norm_zscore))
    return bad("--cuda-graph records the step whole, and --skip-loss-zscore and --skip-grad-norm-zscore decide on "
               "the host between its two parts: use one of them");
  if (c.cuda_graph && c.grad_accum_steps > 1)
    return bad("--cuda-graph records one program a step, and --grad-accum-steps " +
               std::to_string(c.grad_accum_steps) +
               " runs two (the micro-batches', then the step's): use one of them (recording both is not built yet)");
  // --cudnn-benchmark times the legacy calls' algorithms; the graph API's
  // plans come from cuDNN's heuristics and would make the flag do nothing.
  if (c.cudnn_benchmark) {
    if (graph_conv->count() > 0 && c.cudnn_graph_conv)
      return bad(
          "--cudnn-benchmark times the legacy cuDNN calls' algorithms, which --cudnn-graph-conv does not "
          "use: drop one of them");
    c.cudnn_graph_conv = false;
  }
  c.loss_scaling_given = given("--loss-scaling");
  // BF16 has FP32's exponent range: no scale unless asked for (a NaN step is still skipped).
  if (c.precision == Precision::bf16 && !c.loss_scaling_given) c.loss_scaling = Mode::none;
  c.loss_scaling_preset_given = preset->count() > 0;
  c.on_min_scale_given = given("--on-min-scale");
  // In FP32 the preset is one more scaler flag that does nothing (a warning,
  // as for the others); under AMP it would be read as the static scale's.
  const std::string scaling = name(c.loss_scaling, amp::kLossScalingNames);
  if (preset->count() > 0 && amp::is_mixed(c.precision) && c.loss_scaling != Mode::dynamic)
    return bad("--loss-scaling-preset sets the defaults of the dynamic scaler; --loss-scaling " + scaling +
               (c.loss_scaling == Mode::static_scale ? " takes its fixed scale from --init-loss-scaling"
                                                     : " has no scale to set"));
  if (amp::is_mixed(c.precision) && c.loss_scaling == Mode::dynamic) {
    const amp::LossScalerConfig s = c.loss_scaler_config();
    if (s.min_loss_scaling > s.init_loss_scaling) {
      std::ostringstream m;
      m << "--min-loss-scaling " << s.min_loss_scaling << " is above the initial loss scale " << s.init_loss_scaling
        << (c.init_loss_scaling ? " (--init-loss-scaling)"
                                : " (the " + name(c.loss_scaling_preset, amp::kScalerPresetNames) + " preset's)")
        << ": lower it, or raise --init-loss-scaling";
      return bad(m.str());
    }
  }
  if (c.resume_auto() && c.save.empty())
    return bad("--resume auto looks for checkpoints where --save writes them: add --save FILE");
  if (c.keep_checkpoints > 1 && c.save.empty())
    return bad("--keep-checkpoints " + std::to_string(c.keep_checkpoints) + " keeps checkpoints of --save: add --save FILE");
  if (c.save_every > 0 && c.save.empty())
    return bad("--save-every " + std::to_string(c.save_every) + " needs --save FILE to write the checkpoints to");
  if (c.steps == 0 && c.save.empty() && !c.print_program)
    return bad("--steps 0 trains nothing: add --save FILE to write the initial parameters");
  for (auto& w : c.amp_white_list)
    for (auto& b : c.amp_black_list)
      if (w == b)
        return bad("op '" + w + "' is in both --amp-white-list and --amp-black-list; put it in one of them");
  // A misspelt op would move nothing, silently.
  for (const auto* list : {&c.amp_white_list, &c.amp_black_list})
    for (const std::string& op : *list)
      if (!OpRegistry::instance().has(op))
        return bad(std::string(list == &c.amp_white_list ? "--amp-white-list" : "--amp-black-list") +
                   ": mixtrain has no op '" + op +
                   "'; --print-program lists the ops of a model (by type, e.g. softmax, matmul, relu)");
  return std::nullopt;
}

}  // namespace mix::launch
