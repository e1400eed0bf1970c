#include "launch/train_config.h"

#include <CLI/CLI.hpp>
#include <iostream>
#include <sstream>

#include "launch/cli_checks.h"
#include "models/model.h"
#include "runtime/ir/op_registry.h"

namespace mix::launch {

std::string TrainConfig::effective_grad_reduce() const {
  if (!grad_reduce.empty()) return grad_reduce;
  return precision == "amp" ? "fp16" : "fp32";
}

amp::LossScalerConfig TrainConfig::loss_scaler_config() const {
  amp::LossScalerConfig s = amp::preset(loss_scaling == "dynamic" ? loss_scaling_preset : loss_scaling);
  if (init_loss_scaling) s.init_loss_scaling = static_cast<float>(*init_loss_scaling);
  if (incr_every_n_steps) s.incr_every_n_steps = static_cast<int>(*incr_every_n_steps);
  if (decr_every_n_nan_or_inf) s.decr_every_n_nan_or_inf = static_cast<int>(*decr_every_n_nan_or_inf);
  if (incr_ratio) s.incr_ratio = static_cast<float>(*incr_ratio);
  if (decr_ratio) s.decr_ratio = static_cast<float>(*decr_ratio);
  if (min_loss_scaling) s.min_loss_scaling = static_cast<float>(*min_loss_scaling);
  s.on_min_scale = on_min_scale == "continue" ? amp::LossScalerConfig::OnMinScale::continue_
                                              : amp::LossScalerConfig::OnMinScale::error;
  return s;
}

std::string TrainConfig::ignored_scaler_flags() const {
  const bool scaled = precision == "amp" && loss_scaling != "none";
  const bool dynamic = scaled && loss_scaling == "dynamic";
  std::string ignored;
  auto note = [&](bool given, bool applies, const char* flag) {
    if (given && !applies) ignored += (ignored.empty() ? "" : ", ") + std::string(flag);
  };
  note(loss_scaling_given, precision == "amp", "--loss-scaling");
  note(loss_scaling_preset_given, dynamic, "--loss-scaling-preset");
  note(init_loss_scaling.has_value(), scaled, "--init-loss-scaling");
  note(incr_every_n_steps.has_value(), dynamic, "--incr-every-n-steps");
  note(decr_every_n_nan_or_inf.has_value(), dynamic, "--decr-every-n-nan-or-inf");
  note(incr_ratio.has_value(), dynamic, "--incr-ratio");
  note(decr_ratio.has_value(), dynamic, "--decr-ratio");
  note(min_loss_scaling.has_value(), dynamic, "--min-loss-scaling");
  // Under static and none an overflowing step at a scale at or below the
  // minimum still counts towards "stuck", so only FP32 ignores this one.
  note(on_min_scale_given, precision == "amp", "--on-min-scale");
  return ignored;
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
    for (auto& x : v) s += (s.empty() ? "" : ",") + num(x);
    return s;
  };
  return {{"model", model},
          {"hidden", list(hidden)},
          {"image-size", opt(image_size)},
          {"width", opt(width)},
          {"blocks", list(blocks)},
          {"data-format", is_resnet() ? (resnet_channels_last() ? "nhwc" : "nchw") : "-"},
          {"fuse-add-relu", fuse_add_relu ? "on" : "off"},
          {"fuse-bn-relu", fuse_bn_relu ? "on" : "off"},
          {"recompute-softmax", recompute_softmax ? "on" : "off"},
          {"layers", is_language_model() ? num(layers) : "-"},
          {"d-model", is_language_model() ? num(d_model) : "-"},
          {"heads", is_language_model() ? num(heads) : "-"},
          {"context", is_language_model() ? num(context) : "-"},
          {"vocab", is_language_model() ? num(vocab) : "-"},
          {"tie-weights", tie_weights ? "on" : "off"},
          {"dropout", num(dropout)},
          {"data", data},
          {"device", device},
          {"allow-tf32", allow_tf32 ? "on" : "off"},
          {"cudnn-bn-persistent", cudnn_bn_persistent ? "on" : "off"},
          {"cudnn-benchmark", cudnn_benchmark ? "on" : "off"},
          {"cudnn-graph-conv", cudnn_graph_conv ? "on" : "off"},
          {"cublas-1x1-conv", cublas_1x1_conv ? "on" : "off"},
          {"cuda-graph", cuda_graph ? "on" : "off"},
          {"precision", precision},
          {"grad-reduce", effective_grad_reduce()},
          {"grad-predivide", num(grad_predivide)},
          {"batch-size", num(batch_size)},
          {"steps", num(steps)},
          {"epochs", num(epochs)},
          {"lr", num(lr)},
          {"lr-schedule", lr_schedule},
          {"warmup-steps", num(warmup_steps)},
          {"optimizer", optimizer},
          {"momentum", num(momentum)},
          {"weight-decay", num(effective_weight_decay())},
          {"no-decay-1d", no_decay_1d ? "on" : "off"},
          {"loss-scaling", loss_scaling},
          {"loss-scaling-preset", loss_scaling_preset},
          {"init-loss-scaling", opt(init_loss_scaling)},
          {"incr-every-n-steps", opt(incr_every_n_steps)},
          {"decr-every-n-nan-or-inf", opt(decr_every_n_nan_or_inf)},
          {"incr-ratio", opt(incr_ratio)},
          {"decr-ratio", opt(decr_ratio)},
          {"min-loss-scaling", opt(min_loss_scaling)},
          {"on-min-scale", on_min_scale},
          {"bucket-mb", num(bucket_mb)},
          {"overlap", overlap ? "true" : "false"},
          {"synthetic-size", data == "synthetic" ? opt(synthetic_size) : "-"},
          {"synthetic-features", data == "synthetic" ? num(synthetic_features) : "-"},
          {"synthetic-classes", data == "synthetic" ? num(synthetic_classes) : "-"},
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
          {"resume", resume.empty() ? "not given" : "given"},
          {"init-from", init_from.empty() ? "not given" : "given"},
          {"eval", eval ? "true" : "false"},
          {"eval-every", num(eval_every)},
          {"eval-batches", num(eval_batches)},
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
    out.step = std::stoll(parts[0], &used);
    if (used != parts[0].size() || out.step < 1) return false;
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

std::optional<int> parse_train_config(int argc, char** argv, TrainConfig& c) {
  CLI::App app{"mixtrain: data-parallel mixed-precision training (run one process per device, e.g. under mixrun)"};
  // A flag given twice takes its last value (scripts append overrides); list
  // flags below opt back into taking every value.
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  auto models = models::model_names();

  app.add_option("--model", c.model, "model to train")->check(CLI::IsMember(models));
  app.add_option("--hidden", c.hidden, "MLP hidden layer sizes, comma separated")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(kPositiveInt);
  app.add_option("--image-size", c.image_size, "ResNets: height and width of synthetic images (224; 32 for resnet-small)")
      ->check(kPositiveInt);
  app.add_option("--width", c.width, "ResNets: channels of the stem and first stage (64; 16 for resnet-small)")
      ->check(kPositiveInt);
  app.add_option("--blocks", c.blocks, "ResNets: blocks per stage, comma separated (resnet-small: 2,2,2)")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->check(kPositiveInt);
  app.add_option("--data-format", c.data_format,
                 "ResNets: activation layout, nchw, nhwc (channels last) or auto (nhwc for amp on cuda, else nchw)")
      ->check(CLI::IsMember({"auto", "nchw", "nhwc"}));
  app.add_flag("!--no-fuse-add-relu", c.fuse_add_relu,
               "keep each elementwise_add + relu, and each gradient sum + relu_grad, as two ops (by default a "
               "residual block's add and relu run as one op forward and one backward: the same results, less "
               "memory traffic)");
  app.add_flag("!--no-fuse-bn-relu", c.fuse_bn_relu,
               "keep each batch_norm + relu, and each relu_grad + batch_norm_grad, as two ops (by default a batch "
               "norm followed by a relu runs as one op forward and one backward: the same results, less memory "
               "traffic)");
  app.add_flag("!--store-softmax", c.recompute_softmax,
               "softmax_with_cross_entropy stores its softmax for the gradient, as Paddle does (by default the "
               "gradient recomputes it from the logits: the same results, less memory and memory traffic)");
  app.add_option("--layers", c.layers, "transformer: blocks")->check(kPositiveInt);
  app.add_option("--d-model", c.d_model, "transformer: width of the residual stream")->check(kPositiveInt);
  app.add_option("--heads", c.heads, "transformer: attention heads (must divide --d-model)")->check(kPositiveInt);
  app.add_option("--context", c.context, "transformer: tokens per sequence")->check(kPositiveInt);
  app.add_option("--vocab", c.vocab, "transformer: vocabulary (256 for byte-level text)")->check(CLI::Range(2, 1 << 24));
  app.add_flag("--tie-weights", c.tie_weights, "transformer: the output layer reuses the token embedding");
  app.add_option("--dropout", c.dropout, "transformer: dropout probability (0: none)")->check(number_in(0.0, 0.99));
  app.add_option("--data", c.data, "data set (default: fortunes for the transformer, else fashion-mnist)")
      ->check(CLI::IsMember({"fashion-mnist", "fortunes", "synthetic", "safetensors"}));
  app.add_option("--data-dir", c.data_dir,
                 "directory of the data set (/usr/share/datasets/fashion-mnist, /usr/share/games/fortunes)");
  app.add_option("--data-file", c.data_file, "safetensors file with `inputs` F32 [N,...] and `labels` I64 [N]");
  app.add_option("--shuffle", c.shuffle, "shuffle each epoch (seeded by seed and epoch)");
  app.add_option("--synthetic-size", c.synthetic_size, "examples in the synthetic training set")->check(kPositiveInt);
  app.add_option("--synthetic-features", c.synthetic_features, "features per synthetic example")->check(kPositiveInt);
  app.add_option("--synthetic-classes", c.synthetic_classes, "classes of the synthetic task")->check(CLI::Range(2, 1000000));
  app.add_option("--device", c.device, "device")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--allow-tf32", c.allow_tf32, "let FP32 GEMMs on GPUs use TF32 tensor cores (off: true FP32)");
  app.add_flag("--cudnn-bn-persistent", c.cudnn_bn_persistent,
               "train batch_norm on GPUs with cuDNN's SPATIAL_PERSISTENT kernels (channels last: the batch norms "
               "without a fused relu; off: SPATIAL channels first, mixtrain's kernels channels last)");
  app.add_flag(
      "--cudnn-benchmark", c.cudnn_benchmark,
      "time the legacy cuDNN calls' convolution algorithms on the first step and keep the fastest per shape, as "
      "PyTorch's cudnn.benchmark (implies --no-cudnn-graph-conv; off: cuDNN's heuristic choice, the same in every "
      "run)");
  auto* graph_conv = app.add_flag(
      "--cudnn-graph-conv,!--no-cudnn-graph-conv", c.cudnn_graph_conv,
      "on GPUs, run convolutions through cuDNN's graph API, an execution plan built once per shape (the "
      "default), or with --no-cudnn-graph-conv through the legacy calls, which cost the host ~270 us each on an "
      "H200: ResNet-50 AMP at batch 64 ran 1.8x and 2.9x faster on the graph API in two runs");
  app.add_flag("--cublas-1x1-conv", c.cublas_1x1_conv,
               "on GPUs, run each 1x1, unpadded, ungrouped channels-last convolution (36 of ResNet-50's 53; a "
               "strided one on a copy of the pixels it samples) as one cuBLAS GEMM per pass instead of a cuDNN "
               "call, which costs the host far more");
  app.add_flag("--cuda-graph", c.cuda_graph,
               "on GPUs, record the training step once as a CUDA graph (its second step) and replay it, one launch a "
               "step instead of one call per kernel (MIX_PROFILE_OPS runs, and the CPU, run op by op; so does a single "
               "process whose recording CUDA refused, after saying why)");
  app.add_option("--precision", c.precision, "fp32, or amp (FP16 where safe, dynamic loss scaling)")
      ->check(CLI::IsMember({"fp32", "amp"}));
  app.add_option("--grad-reduce", c.grad_reduce,
                 "dtype of the gradient all-reduce: fp16 (before the cast to FP32; default under amp) or fp32")
      ->check(CLI::IsMember({"fp16", "fp32"}));
  app.add_option("--grad-predivide", c.grad_predivide,
                 "multiply gradients by 1/F before the sum and F/world after (0: F = world size)")
      ->check(kNonNegative);
  app.add_option("--bucket-mb", c.bucket_mb, "largest gradient bucket in MB")->check(kPositive);
  app.add_flag("!--no-overlap", c.overlap,
               "all-reduce gradient buckets after backward, one at a time, instead of starting each as soon as "
               "backward has written it (for comparison)");
  app.add_option("--batch-size", c.batch_size, "examples per rank per step")->check(kPositiveInt);
  app.add_option("--steps", c.steps,
                 "optimizer steps to run (overrides --epochs; 0 with --save writes the initial model)")
      ->check(kNonNegativeInt)
      ->default_str("");  // unset (-1 inside: --epochs decides), not a value to give
  app.add_option("--epochs", c.epochs, "passes over the training set")->check(kPositiveInt);
  app.add_option("--lr", c.lr, "peak learning rate")->check(kPositive);
  app.add_option("--lr-schedule", c.lr_schedule,
                 "learning-rate schedule: constant, cosine (half a cosine to 0 after the warm-up) or onecycle "
                 "(torch's OneCycleLR: cosine up from lr/25 over the warm-up or 30% of the steps, then down)")
      ->check(CLI::IsMember({"constant", "cosine", "onecycle"}));
  app.add_option("--warmup-steps", c.warmup_steps, "linear warm-up steps")->check(kNonNegativeInt);
  app.add_option("--optimizer", c.optimizer, "optimizer")->check(CLI::IsMember({"sgd", "momentum", "adamw"}));
  app.add_option("--momentum", c.momentum, "momentum of --optimizer momentum")->check(number_in(0.0, 1.0));
  app.add_option("--weight-decay", c.weight_decay, "weight decay, decoupled for adamw (0; 0.01 for adamw, as torch.optim.AdamW)")->check(kNonNegative);
  app.add_flag("--no-decay-1d", c.no_decay_1d,
               "no weight decay on 1-D parameters (biases, batch_norm and layer_norm scales and shifts), as timm "
               "and nanoGPT do; weight matrices, filters and embeddings are still decayed");
  app.add_option("--loss-scaling", c.loss_scaling, "loss scaling under amp")
      ->check(CLI::IsMember({"dynamic", "static", "none"}));
  CLI::Option* preset = app.add_option("--loss-scaling-preset", c.loss_scaling_preset, "defaults of the dynamic scaler")
                            ->check(CLI::IsMember({"paddle", "pytorch"}));
  app.add_option("--init-loss-scaling", c.init_loss_scaling, "initial (or static) loss scale")->check(kPositive);
  app.add_option("--incr-every-n-steps", c.incr_every_n_steps, "finite steps before the scale grows")
      ->check(kPositiveInt);
  app.add_option("--decr-every-n-nan-or-inf", c.decr_every_n_nan_or_inf, "overflow steps before the scale shrinks")
      ->check(kPositiveInt);
  app.add_option("--incr-ratio", c.incr_ratio, "growth factor of the scale")->check(number_in(1.0, 1e6));
  app.add_option("--decr-ratio", c.decr_ratio, "shrink factor of the scale")->check(number_in(1e-6, 1.0));
  app.add_option("--min-loss-scaling", c.min_loss_scaling, "smallest loss scale")->check(kPositive);
  app.add_option("--on-min-scale", c.on_min_scale, "what to do after many skipped steps at the minimum scale")
      ->check(CLI::IsMember({"error", "continue"}));
  app.add_flag("!--no-fold-casts", c.fold_casts,
               "amp: keep the FP32 casts amp::rewrite puts before softmax and softmax_with_cross_entropy, and "
               "autodiff before softmax_grad, as Paddle does (by default those ops read the FP16 values directly: "
               "the same results, less memory traffic)");
  app.add_flag("!--no-fuse-param-casts", c.fuse_param_casts,
               "amp: keep one cast op per weight for its FP16 copy, as amp::rewrite makes them (by default the "
               "casts of all weights run as one fused_cast op: the same results, one GPU launch instead of one "
               "per weight)");
  app.add_option("--amp-white-list", c.amp_white_list, "ops to run in FP16, comma separated")->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--amp-black-list", c.amp_black_list, "ops to keep in FP32, comma separated")->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--seed", c.seed, "seed of initialisation, shuffles and synthetic data")->check(unsigned_check());
  app.add_option("--metrics", c.metrics, "JSON Lines metrics file (written by rank 0)");
  app.add_option("--save", c.save, "checkpoint (safetensors) written at the end, and every --save-every steps");
  app.add_option("--save-every", c.save_every,
                 "steps between checkpoints written to --save during training, each replacing the last "
                 "(0: at the end only)")
      ->check(kNonNegativeInt);
  app.add_option("--resume", c.resume, "checkpoint to resume from (parameters, optimizer, scaler, step)");
  app.add_option("--init-from", c.init_from, "safetensors parameters (e.g. a PyTorch state_dict) to start from");
  app.add_flag("--print-program", c.print_program, "print the final training program and exit");
  app.add_option("--check-every", c.check_every, "steps between cross-rank consistency checks (0: only at the end)")
      ->check(kNonNegativeInt);
  app.add_option("--inject-overflow", c.inject_overflow,
                 "testing aid: STEP[:RANK[:PARAM]] makes that rank's gradients non-finite at that step");
  app.add_flag("--benchmark", c.benchmark, "time steps after a warm-up; print samples/s and peak memory");
  app.add_option("--benchmark-warmup", c.benchmark_warmup, "untimed warm-up steps of --benchmark")
      ->check(kNonNegativeInt);
  app.add_option("--log-every", c.log_every, "steps between progress lines (0: about every 2 s)")
      ->check(kNonNegativeInt);
  app.add_option("--eval", c.eval, "evaluate on the test set at the end of each epoch");
  app.add_option("--eval-every", c.eval_every, "steps between evaluations (0: at the end of each epoch)")
      ->check(kNonNegativeInt);
  app.add_option("--eval-batches", c.eval_batches, "batches per evaluation (0: the whole test split)")
      ->check(kNonNegativeInt);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "mixtrain: " << e.what() << "\n(run mixtrain --help for the flags)\n";
    return 2;
  }
  auto bad = [](const std::string& msg) {
    std::cerr << "mixtrain: " << msg << "\n";
    return 2;
  };
  if (!c.data_file.empty() && !c.data.empty() && c.data != "safetensors")
    return bad("--data-file gives the data, but --data " + c.data + " asks for another data set: drop one of them");
  if (c.data.empty()) c.data = c.is_language_model() ? "fortunes" : "fashion-mnist";
  if (!c.data_file.empty()) c.data = "safetensors";  // --data-file alone says where the data is
  if (c.data_dir.empty())
    c.data_dir = c.data == "fortunes" ? "/usr/share/games/fortunes" : "/usr/share/datasets/fashion-mnist";
  if (c.is_language_model() && c.data != "fortunes" && c.data != "synthetic")
    return bad("--model transformer trains on --data fortunes or --data synthetic (tokens), not --data " + c.data);
  if (!c.is_language_model() && c.data == "fortunes")
    return bad("--data fortunes is text for --model transformer; --model " + c.model + " needs images or features");
  if (c.is_language_model() && c.d_model % c.heads != 0)
    return bad("--heads " + std::to_string(c.heads) + " must divide --d-model " + std::to_string(c.d_model));
  if (c.is_language_model() && c.data == "fortunes" && c.vocab < 256)
    return bad("--vocab " + std::to_string(c.vocab) + " is too small for byte-level text: use 256 or more");
  if (c.data == "safetensors" && c.data_file.empty()) return bad("--data safetensors needs --data-file FILE");
  if (c.precision == "fp32" && c.grad_reduce == "fp16")
    return bad("--grad-reduce fp16 needs --precision amp (FP32 training has no FP16 gradients to reduce)");
  if (c.precision == "fp32" && !c.inject_overflow.empty())
    return bad("--inject-overflow needs --precision amp (only AMP steps check for overflow)");
  InjectOverflowSpec inject;
  if (!c.inject_overflow.empty() && !parse_inject_overflow(c.inject_overflow, inject))
    return bad("--inject-overflow '" + c.inject_overflow +
               "': expected STEP[:RANK[:PARAM]] with STEP >= 1, e.g. 5, 5:1 or 5:1:fc1.weight");
  if (!c.resume.empty() && !c.init_from.empty()) return bad("--resume and --init-from are exclusive: use one");
  if (c.model == "mlp" && c.hidden.empty()) return bad("--hidden needs at least one size for --model mlp");
  if (!c.is_resnet() && (c.image_size || c.width || !c.blocks.empty()))
    return bad("--image-size, --width and --blocks are for the ResNet models (--model " + c.model + ")");
  // Flags of another model, optimizer or data set would do nothing here,
  // silently (a --dropout on the MLP, a --momentum under adamw).
  const auto given = [&app](const char* flag) { return app.get_option(flag)->count() > 0; };
  for (const char* flag : {"--layers", "--d-model", "--heads", "--context", "--vocab", "--tie-weights", "--dropout"})
    if (!c.is_language_model() && given(flag))
      return bad(std::string(flag) + " is for --model transformer; --model " + c.model + " has no such setting");
  if (c.model != "mlp" && given("--hidden"))
    return bad("--hidden sets the MLP's layers; --model " + c.model + " has none (drop it, or use --model mlp)");
  if (c.optimizer != "momentum" && given("--momentum"))
    return bad("--momentum is for --optimizer momentum; --optimizer " + c.optimizer +
               (c.optimizer == "sgd" ? " is plain SGD (for SGD with momentum, as torch.optim.SGD(momentum=...), use "
                                       "--optimizer momentum)"
                                     : " has its own betas"));
  for (const char* flag : {"--synthetic-size", "--synthetic-features", "--synthetic-classes"})
    if (c.data != "synthetic" && given(flag))
      return bad(std::string(flag) + " is for --data synthetic; the data here is " + c.data + "'s");
  if ((c.is_resnet() || c.is_language_model()) && given("--synthetic-features"))
    return bad("--synthetic-features sets the MLP's flat examples; --model " + c.model + " takes " +
               (c.is_resnet() ? "images (--image-size)" : "tokens (--context)"));
  if (c.is_language_model() && given("--synthetic-classes"))
    return bad("--synthetic-classes is for classifiers; --model transformer predicts tokens (--vocab)");
  if (c.steps == 0 && !c.inject_overflow.empty())
    return bad("--inject-overflow " + c.inject_overflow + ": --steps 0 trains nothing to overflow");
  if (!c.is_resnet() && c.data_format != "auto")
    return bad("--data-format is for the ResNet models (--model " + c.model + " has no image layout)");
  if (c.image_size && c.data != "synthetic")
    return bad("--image-size sets the size of synthetic images; with --data " + c.data +
               " the images have the data set's size");
  if (c.is_resnet() && c.image_size) {
    const int64_t min_size = models::resnet_min_image_size(models::resnet_preset(c.model));
    if (*c.image_size < min_size)
      return bad("--image-size " + std::to_string(*c.image_size) + " is too small for --model " + c.model +
                 ": it needs at least " + std::to_string(min_size));
  }
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
  c.loss_scaling_preset_given = preset->count() > 0;
  c.on_min_scale_given = given("--on-min-scale");
  // In FP32 the preset is one more scaler flag that does nothing (a warning,
  // as for the others); under AMP it would be read as the static scale's.
  if (preset->count() > 0 && c.precision == "amp" && c.loss_scaling != "dynamic")
    return bad(
        "--loss-scaling-preset sets the defaults of the dynamic scaler; --loss-scaling " + c.loss_scaling +
        (c.loss_scaling == "static" ? " takes its fixed scale from --init-loss-scaling" : " has no scale to set"));
  if (c.precision == "amp" && c.loss_scaling == "dynamic") {
    const amp::LossScalerConfig s = c.loss_scaler_config();
    if (s.min_loss_scaling > s.init_loss_scaling) {
      std::ostringstream m;
      m << "--min-loss-scaling " << s.min_loss_scaling << " is above the initial loss scale " << s.init_loss_scaling
        << (c.init_loss_scaling ? " (--init-loss-scaling)" : " (the " + c.loss_scaling_preset + " preset's)")
        << ": lower it, or raise --init-loss-scaling";
      return bad(m.str());
    }
  }
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
