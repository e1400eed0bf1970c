#pragma once
// mixtrain's command line, parsed with CLI11 into a TrainConfig: typed once,
// where the flags are read (enums, not strings), with every rule between
// flags checked there.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "amp/loss_scaler.h"
#include "amp/precision.h"
#include "models/model.h"
#include "collective/grad_allreduce_pass.h"
#include "runtime/core/device.h"
#include "runtime/core/enum_names.h"
#include "runtime/data/token_shards.h"
#include "runtime/optim/lr_schedule.h"
#include "runtime/optim/optimizer.h"

namespace mix::launch {

/// Activation layout of the ResNets (--data-format).
enum class DataFormat { auto_, nchw, nhwc };
inline constexpr NamedValue<DataFormat> kDataFormatNames[] = {
    {DataFormat::auto_, "auto"}, {DataFormat::nchw, "nchw"}, {DataFormat::nhwc, "nhwc"}};

/// The data sets mixtrain reads (--data).
enum class DataSet { fashion_mnist, fortunes, synthetic, safetensors, image_folder, image_shards, token_shards };
inline constexpr NamedValue<DataSet> kDataSetNames[] = {{DataSet::fashion_mnist, "fashion-mnist"},
                                                        {DataSet::fortunes, "fortunes"},
                                                        {DataSet::synthetic, "synthetic"},
                                                        {DataSet::safetensors, "safetensors"},
                                                        {DataSet::image_folder, "image-folder"},
                                                        {DataSet::image_shards, "image-shards"},
                                                        {DataSet::token_shards, "token-shards"}};
inline std::string_view to_string(DataSet d) { return name_of(d, kDataSetNames); }

/// Training augmentation of --data image-folder (--augment): torchvision's
/// ImageNet recipe, or none (evaluation's resize and centre crop).
enum class Augment { imagenet, none };
inline constexpr NamedValue<Augment> kAugmentNames[] = {{Augment::imagenet, "imagenet"}, {Augment::none, "none"}};
/// How --data image-shards' training examples reach the ranks (--shard-order):
/// stream: each rank its own shards, read front to back through a shuffle
/// buffer (WebDataset's way, runtime/data/shard_stream_sampler.h); global:
/// one permutation of all examples split over the ranks (DistributedSampler,
/// as image-folder), which gives the folder's batches bit for bit.
enum class ShardOrder { stream, global };
inline constexpr NamedValue<ShardOrder> kShardOrderNames[] = {{ShardOrder::stream, "stream"},
                                                              {ShardOrder::global, "global"}};

struct TrainConfig {
  // model
  std::string model = "mlp";
  std::vector<int64_t> hidden = {256, 128};
  // ResNets: overrides of the preset (models::resnet_preset); image size of synthetic data
  std::optional<int64_t> image_size;
  std::optional<int64_t> width;
  std::vector<int64_t> blocks;
  /// Activation layout of the ResNets: nchw, nhwc (channels last), or auto:
  /// nhwc for AMP and BF16 on CUDA, where cuDNN's tensor cores read it directly;
  /// nchw otherwise (the CPU, and FP32, which has no tensor cores without TF32).
  DataFormat data_format = DataFormat::auto_;
  bool resnet_channels_last() const {
    return data_format == DataFormat::nhwc ||
           (data_format == DataFormat::auto_ && device == DeviceKind::cuda && amp::is_mixed(precision));
  }
  bool is_resnet() const { return model.rfind("resnet", 0) == 0; }
  /// Fuse residual adds with their relu, forward and backward (runtime/passes/fuse_add_relu.h; --no-fuse-add-relu: off).
  bool fuse_add_relu = true;
  /// Fuse batch norms with the relu after them, forward and backward (runtime/passes/fuse_bn_relu.h; --no-fuse-bn-relu: off).
  bool fuse_bn_relu = true;
  /// Fuse each linear layer's matmul and bias add (runtime/passes/fuse_matmul_bias.h; --no-fuse-matmul-bias: off).
  bool fuse_matmul_bias = true;
  /// Fold gradient sums into the op writing the last part (runtime/passes/fold_grad_sums.h; --no-fold-grad-sums: off).
  bool fold_grad_sums = true;
  /// Fuse residual adds with their layer_norm (runtime/passes/fuse_add_layer_norm.h; --no-fuse-add-layer-norm: off).
  bool fuse_add_layer_norm = true;
  /// One rank: no gradient all-reduce ops (collective/elide_single_rank_sync.h; --no-elide-single-rank-sync: off).
  bool elide_single_rank_sync = true;
  /// softmax_with_cross_entropy's grad recomputes the softmax (runtime/passes/recompute_softmax.h; --store-softmax: off).
  bool recompute_softmax = true;
  // the Transformer language model (models::TransformerConfig); --model gpt2
  // starts from models::transformer_preset(gpt2) instead, for every flag not given
  int64_t layers = 4;
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t context = 128;
  int64_t vocab = 256;
  int64_t vocab_multiple = 1;  // the vocabulary padded to a multiple of this for the GEMMs, the padding masked
  bool tie_weights = false;
  double dropout = 0.0;
  /// Attention as one fused_attention op (models::TransformerConfig::fused_attention; --no-fused-attention: off).
  bool fused_attention = true;
  bool is_language_model() const { return model == "transformer" || model == "gpt2"; }
  /// The configuration --model names before the flags given on the command line.
  models::TransformerPreset transformer_preset() const {
    return model == "gpt2" ? models::TransformerPreset::gpt2 : models::TransformerPreset::transformer;
  }
  /// JPEGs read from disk (an image folder or tar shards), decoded and transformed a batch at a time.
  bool is_image_data() const { return data == DataSet::image_folder || data == DataSet::image_shards; }
  bool resume_auto() const { return resume == "auto"; }
  // data; parse_train_config fills in the model's default data set (fortunes
  // text for the Transformer, Fashion-MNIST otherwise) and its directory
  DataSet data = DataSet::fashion_mnist;
  std::string data_dir;
  std::string data_file;
  /// --data token-shards: the width of a headerless file's tokens (unset: uint16);
  /// an llm.c header's version decides for its shard, and must agree when this is set.
  std::optional<data::TokenDType> token_dtype;
  bool shuffle = true;
  std::optional<int64_t> synthetic_size;  // default 8192 examples, 512 images
  int64_t synthetic_features = 784;
  int64_t synthetic_classes = 10;
  // --data image-folder (runtime/data/image_folder.h): transforms and decoding
  Augment augment = Augment::imagenet;
  std::vector<double> crop_scale = {0.08, 1.0};  // RandomResizedCrop's area fraction, MIN,MAX
  bool hflip = true;
  std::vector<double> mean = {0.485, 0.456, 0.406};  // ImageNet's, per channel of [0, 1] pixels
  std::vector<double> stddev = {0.229, 0.224, 0.225};
  std::optional<int64_t> data_workers;  // unset: the host's cores shared among its ranks
  bool skip_bad_images = false;
  int64_t prefetch = 2;  // training batches gathered ahead of the step (a bounded queue)
  ShardOrder shard_order = ShardOrder::stream;  // --data image-shards
  int64_t shuffle_buffer = 2000;                // examples in --shard-order stream's shuffle buffer
  // device and precision
  DeviceKind device = DeviceKind::cpu;
  bool allow_tf32 = false;
  bool cudnn_bn_persistent = false;  // training batch_norm on cuDNN's persistent kernels
  bool cudnn_benchmark = false;      // time cuDNN's convolution algorithms once per shape
  bool cudnn_graph_conv = true;  // convolutions on cuDNN's graph API with cached plans (off under --cudnn-benchmark)
  bool cublas_1x1_conv = false;      // pointwise channels-last convolutions as cuBLAS GEMMs (runtime/ops/conv_gemm.h)
  bool attention_tensor_cores = true;  // fused_attention's tensor-core kernels (runtime/ops/cuda/fused_attention_tensor_cores.cuh)
  bool cudnn_attention = true;  // fused_attention on cuDNN's SDPA first (runtime/cuda/cudnn_attention_graph.h)
  bool cuda_graph = false;           // GPU training steps recorded once and replayed (runtime/exec/step_graph.h)
  amp::Precision precision = amp::Precision::amp;
  std::optional<collective::GradReduce> grad_reduce;  // unset: fp16 under AMP, fp32 otherwise
  double grad_predivide = 0;
  double bucket_mb = 25;
  /// Start each gradient bucket's all-reduce during backward (--no-overlap: after it, one at a time).
  bool overlap = true;
  // schedule
  int64_t batch_size = 64;
  int64_t grad_accum_steps = 1;  // micro-batches of batch_size per optimizer step
  int64_t steps = -1;  // -1: run --epochs
  int64_t epochs = 1;
  double lr = 0.05;
  optim::Schedule lr_schedule = optim::Schedule::constant;
  int64_t warmup_steps = 0;
  /// --optimizer, --momentum, --weight-decay (unset: 0, and 0.01 for adamw,
  /// torch.optim.AdamW's), --no-decay-1d (no weight decay on biases and norm
  /// scales and shifts).
  optim::OptimizerOptions optimizer;
  std::optional<double> clip_grad_norm;   // torch.nn.utils.clip_grad_norm_'s max_norm
  std::optional<double> clip_grad_value;  // torch.nn.utils.clip_grad_value_'s clip_value
  std::optional<double> skip_loss_zscore;       // skip an update whose loss is this many SDs above the mean
  std::optional<double> skip_grad_norm_zscore;  // the same for grad_norm (launch/outlier_detector.h)
  // loss scaling
  amp::LossScalerConfig::Mode loss_scaling = amp::LossScalerConfig::Mode::dynamic;
  amp::ScalerPreset loss_scaling_preset = amp::ScalerPreset::paddle;
  std::optional<double> init_loss_scaling;
  std::optional<int64_t> incr_every_n_steps;
  std::optional<int64_t> decr_every_n_nan_or_inf;
  std::optional<double> incr_ratio;
  std::optional<double> decr_ratio;
  std::optional<double> min_loss_scaling;
  amp::LossScalerConfig::OnMinScale on_min_scale = amp::LossScalerConfig::OnMinScale::error;
  // Whether these flags with defaults were given: a flag that does nothing is
  // warned about only when the user wrote it (ignored_scaler_flags).
  bool loss_scaling_given = false, loss_scaling_preset_given = false, on_min_scale_given = false;
  bool fold_casts = true;        // the three folds of amp/fold_casts.h (--no-fold-casts: off)
  bool fuse_param_casts = true;  // amp::fuse_param_casts (amp/fuse_param_casts.h; --no-fuse-param-casts: off)
  std::vector<std::string> amp_white_list;
  std::vector<std::string> amp_black_list;
  // run control
  uint64_t seed = 1;
  std::string metrics;
  std::string save;
  int64_t save_every = 0;  // steps between checkpoints to --save during training; 0: at the end only
  std::string resume;  // a checkpoint, or "auto": the newest complete one of --save (io/checkpoint_files.h)
  int64_t keep_checkpoints = 1;  // --save and the N - 1 before it (STEM.step<N><EXT>)
  std::string init_from;
  /// Signals that stop training at the next step, with a checkpoint (launch/stop_signals.h).
  std::vector<int> stop_signals;
  /// Seconds a collective may wait for its peers before the job is aborted,
  /// naming them (collective/collective_watchdog.h); the NCCL watchdog's too.
  double collective_timeout = 600;
  bool print_program = false;
  int64_t check_every = 100;
  std::string inject_overflow;  // STEP[.MICRO][:RANK[:PARAM]], checked by parse_inject_overflow
  bool benchmark = false;
  int64_t benchmark_warmup = 10;
  int64_t log_every = 0;  // 0: a progress line about every 2 s
  bool eval = true;
  int64_t eval_every = 0;  // steps between evaluations; 0: at the end of each epoch
  int64_t eval_batches = 0;  // 0: the whole test split; else at most this many batches per rank and evaluation
  /// Examples per rank in an evaluation batch (--eval-batch-size); unset: effective_eval_batch_size's default.
  std::optional<int64_t> eval_batch_size;
  /// --eval-batch-size, or 1000 (the test batch of PyTorch's MNIST example:
  /// evaluation keeps no activations for backward, so it takes more than a
  /// training batch), or for the Transformer --batch-size but at least 16
  /// sequences (its logits are [batch, context, vocab]).
  int64_t effective_eval_batch_size() const {
    return eval_batch_size.value_or(is_language_model() ? std::max<int64_t>(batch_size, 16) : 1000);
  }

  /// The fields every rank must agree on, as (name, value) text, for the startup fingerprint.
  std::vector<std::pair<std::string, std::string>> fingerprint_fields() const;
  /// --grad-reduce, or the precision's default (launch/train_program.h).
  collective::GradReduce effective_grad_reduce() const;
  /// The loss scaler the flags ask for: the preset (or --loss-scaling static/none) with the flags' overrides.
  amp::LossScalerConfig loss_scaler_config() const;
  /// The loss-scaler flags given that do nothing here (any under fp32, the
  /// scale's under --loss-scaling none, the dynamic scaler's under static),
  /// comma separated;
  /// empty when none. A warning, not an error: scripts pass one set of flags
  /// to an AMP and an FP32 run to compare them.
  std::string ignored_scaler_flags() const;
  /// Warnings, one a line, about values that are allowed but may not do what
  /// was meant in a job of `world` ranks: an --lr so small that its updates
  /// may all be rounded away in FP32, a --grad-predivide above the world size.
  /// Values that cannot work are refused by parse_train_config instead.
  std::vector<std::string> doubtful_values(int world) const;
};

/// Below this peak --lr, the updates of typical weights are rounded away in
/// FP32 (TrainConfig::doubtful_values says why).
inline constexpr double kSmallestUsefulLr = 1.0 / (int64_t{1} << 30);
/// Above this --grad-predivide, an FP16 gradient all-reduce receives only
/// zeros (parse_train_config says why).
inline constexpr double kLargestFp16Predivide = 65504.0 * (int64_t{1} << 24);

/// Splits --inject-overflow STEP[.MICRO][:RANK[:PARAM]]; false when it does not parse.
struct InjectOverflowSpec {
  int64_t step = 0;
  int64_t micro = 0;  // 1-based micro-batch of the step (--grad-accum-steps); 0: after the all-reduce
  int rank = -1;
  std::string param;
};
bool parse_inject_overflow(const std::string& text, InjectOverflowSpec& out);

/// Parses argv. Returns the exit code to use when the program should stop now
/// (0 after --help, 2 after a bad flag or value, with the message printed).
std::optional<int> parse_train_config(int argc, char** argv, TrainConfig& out);

}  // namespace mix::launch
