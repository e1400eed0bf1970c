#pragma once
// Models build forward programs. Every model's forward program takes the feeds
// `x` ([batch, ...example_shape] of input_dtype: f32 features or images, u8
// pixels for a ResNet fed by the image readers, i64 tokens for the language
// model) and `label` (i64 [batch, ...label_shape]: [batch, 1] class indices,
// or [batch, context] next tokens) and ends with `logits` and a scalar FP32
// `loss` (mean cross-entropy over every label).
// Parameters are FP32 masters named and laid out as in PyTorch (`fc1.weight`
// [out, in], `fc1.bias` [out]).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/ir/program.h"

namespace mix::models {

struct Model {
  std::string name;
  Program program;
  std::string input = "x";
  std::string label = "label";
  std::string logits = "logits";
  std::string loss = "loss";
  Shape example_shape;  // one input example, e.g. [784]
  DType input_dtype = DType::f32;
  Shape label_shape = {1};  // the labels of one example
  int64_t num_classes = 0;  // classes, or the vocabulary of a language model
  int64_t tokens_per_example = 0;  // language models: tokens per sequence (metrics report tokens/s)
};

/// An nn.Sequential-style MLP: fc1 -> relu -> fc2 -> relu -> ... -> fc{L+1}.
/// With no hidden layers it is multinomial logistic regression (--model linear).
struct MlpConfig {
  int64_t in_features = 784;
  std::vector<int64_t> hidden = {256, 128};
  int64_t num_classes = 10;
};
Model build_mlp(const MlpConfig& c, const std::string& name = "mlp");

/// A ResNet input of 8-bit pixels, [N, H, W, C] as the image readers give
/// them (--data image-folder, image-shards), that the model normalises itself:
/// its first op is image_normalize with these per-channel constants
/// (torchvision's Normalize on [0, 1] pixels), writing the activations' layout.
struct PixelInput {
  std::vector<float> mean, stddev;  // one per channel
};

/// ResNets (models/resnet.cc): torchvision's ResNet-18/34/50 (7x7 stride-2 stem,
/// 3x3 max-pool, four stages) and a small-input variant for 28x28 / 32x32 images
/// (3x3 stride-1 stem, no max-pool). Stage s has width << s channels (x4 for
/// bottlenecks); stages after the first start with a stride-2 block.
struct ResNetConfig {
  std::vector<int64_t> blocks;  // blocks per stage
  bool bottleneck = false;      // ResNet-50's 1x1-3x3-1x1 blocks, else basic 3x3-3x3 blocks
  bool small_input = false;
  int64_t width = 64;           // channels of the stem and the first stage
  int64_t in_channels = 3;
  int64_t image_size = 224;
  int64_t num_classes = 1000;
  /// Activations channels last (NHWC) from the stem on: an f32 NCHW input
  /// batch is permuted once by a transpose2 op (a pixel input is normalised
  /// straight into NHWC), and conv2d, batch_norm and pool2d carry
  /// data_format / data_layout NHWC. Parameters and buffers, and so
  /// checkpoints, are the same in both layouts.
  bool channels_last = false;
  /// Unset: the input batch is f32 [N, C, H, W], normalised by the data set
  /// (synthetic, Fashion-MNIST, safetensors). Set: it is u8 [N, H, W, C]
  /// pixels, normalised on the model's device by its first op.
  std::optional<PixelInput> pixel_input;
};
/// The configuration of resnet18, resnet34, resnet50 or resnet-small (widths
/// 16/32/64, two basic blocks per stage, 1x28x28 input); throws for other names.
ResNetConfig resnet_preset(const std::string& name);
/// The smallest image side `c` takes: one pixel per unit of the network's
/// total stride (32 with the ImageNet stem, 4 for the small-input variant).
int64_t resnet_min_image_size(const ResNetConfig& c);
Model build_resnet(const ResNetConfig& c, const std::string& name);

/// A GPT-style decoder-only language model (models/transformer.cc): nanoGPT's
/// structure and parameter names, pre-norm blocks, causal self-attention.
struct TransformerConfig {
  int64_t layers = 4;
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t context = 128;  // tokens per sequence
  int64_t vocab = 256;    // bytes, for byte-level text
  /// The rows of wte (and lm_head) and the logits' columns are padded to a
  /// multiple of this, for the GEMMs' tiles (GPT-2: 50,257 -> 50,304). The
  /// padding is masked: its rows start zero and its logits take no
  /// probability, so loss, gradients and predictions are the unpadded model's.
  int64_t vocab_multiple = 1;
  bool tie_weights = false;  // the output layer reuses transformer.wte.weight (no lm_head.weight)
  double dropout = 0.0;  // after the embeddings, the attention probabilities and each residual branch
  uint64_t seed = 1;     // dropout masks: (seed, step, rank, op)
  /// Attention as one fused_attention op (runtime/ops/fused_attention.cc), which
  /// never stores the [tokens, tokens] probabilities; false (--no-fused-attention):
  /// matmul, causal softmax, dropout, matmul, the reference.
  bool fused_attention = true;
  /// Whether the blocks use fused_attention: asked for, and no dropout, which
  /// the fused op does not apply to its probabilities.
  bool uses_fused_attention() const { return fused_attention && dropout == 0; }
  /// The vocabulary rounded up to a multiple of vocab_multiple: wte's rows, the logits' columns.
  int64_t padded_vocab() const { return (vocab + vocab_multiple - 1) / vocab_multiple * vocab_multiple; }
};

/// The language models --model names: one builder, two starting configurations.
enum class TransformerPreset {
  transformer,  // the small default above
  gpt2,         // GPT-2 small (124M): 12 x 768, 12 heads, context 1024, vocabulary 50,257 padded to 50,304, tied
};
TransformerConfig transformer_preset(TransformerPreset preset);
Model build_transformer(const TransformerConfig& c, const std::string& name = "transformer");

/// Names --model accepts.
std::vector<std::string> model_names();

// ---- building blocks shared by models ------------------------------------------
/// Declares a trainable FP32 parameter initialised U(-bound, bound).
std::string add_parameter(Program& p, const std::string& name, const Shape& shape, double bound);
/// Declares a trainable FP32 parameter with any initialisation.
std::string add_parameter(Program& p, const std::string& name, const Shape& shape, VarInit init);
/// nn.Linear: Out = X W^T + b, W [out, in], b [out], PyTorch's default init U(-1/sqrt(in), 1/sqrt(in)).
/// The output is named `out_name` when given, else `<prefix>.out`.
std::string linear(Program& p, const std::string& prefix, const std::string& x, int64_t in, int64_t out,
                   const std::string& out_name = "");
/// Mean softmax cross-entropy of `logits` against `label`, into the scalar `loss`.
/// `valid_classes` > 0: only the first that many columns of `logits` are
/// classes, the rest padding that takes no probability and gets no gradient.
void cross_entropy_loss(Program& p, const std::string& logits, const std::string& label, const std::string& loss,
                        int64_t valid_classes = 0);

}  // namespace mix::models
