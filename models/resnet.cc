// ResNet-18/34/50 with torchvision's structure and state_dict names
// (conv1, bn1, layer{1..4}.{i}.conv{1,2,3}, .bn{1,2,3}, .downsample.{0,1}, fc),
// so a torchvision state_dict saved as safetensors loads with --init-from; and
// the small-input variant for 28x28 / 32x32 images: a 3x3 stride-1 stem, no
// max-pool, a configurable base width and number of stages.
//
// Bottleneck blocks put the stride on the 3x3 conv (torchvision's "v1.5").
// Initialisation as torchvision: convs kaiming-normal with fan_out (std
// sqrt(2 / (out kh kw))), batch_norm weight 1 and bias 0, fc PyTorch's Linear default.
//
// Channels last (ResNetConfig::channels_last) changes only the activations'
// layout: the ops are the same, with their layout attrs set to NHWC, after one
// transpose2 of an f32 NCHW input; the global average pool gives [N, 1, 1, C],
// which flattens to the same [N, C] as channels first.
//
// A pixel input (ResNetConfig::pixel_input) is the image readers' u8 NHWC
// batch: the first op, image_normalize, normalises it into the activations'
// layout (channels first or last) on the model's device, so the batch crosses
// to a GPU as bytes and needs no transpose2.
#include <cmath>

#include "models/model.h"
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix::models {

namespace {

// Declares an untrained model buffer (batch_norm's running statistics).
void add_buffer(Program& p, const std::string& name, const Shape& shape, DType dtype, VarInit init) {
  VarDesc v;
  v.name = name;
  v.shape = shape;
  v.dtype = dtype;
  v.persistable = true;
  v.stop_gradient = true;
  v.is_buffer = true;
  v.init = init;
  p.add_var(v);
}

class ResNetBuilder {
 public:
  ResNetBuilder(Program& p, bool channels_last) : p_(p), format_(channels_last ? "NHWC" : "NCHW") {}

  // The layout attr of conv2d and pool2d (batch_norm's is data_layout).
  std::pair<std::string, Attr> data_format() const { return {"data_format", format_}; }

  std::string conv(const std::string& name, const std::string& x, int64_t in, int64_t out, int64_t k, int64_t stride,
                   int64_t pad) {
    const std::string w = name + ".weight";
    VarDesc v;
    v.name = w;
    v.shape = {out, in, k, k};
    v.persistable = v.is_parameter = true;
    v.init = {VarInit::Kind::normal, std::sqrt(2.0 / static_cast<double>(out * k * k))};
    p_.add_var(v);
    const std::string y = p_.unique_name(name + ".out");
    p_.append_op(make_op("conv2d", {{"Input", {x}}, {"Filter", {w}}}, {{"Output", {y}}},
                         {{"strides", std::vector<int64_t>{stride, stride}},
                          {"paddings", std::vector<int64_t>{pad, pad}},
                          {"dilations", std::vector<int64_t>{1, 1}},
                          {"groups", int64_t{1}},
                          data_format()}));
    return y;
  }

  // nn.BatchNorm2d(c) with PyTorch's defaults (momentum 0.1, eps 1e-5).
  std::string batch_norm(const std::string& name, const std::string& x, int64_t c) {
    add_parameter(p_, name + ".weight", {c}, {VarInit::Kind::constant, 1.0});
    add_parameter(p_, name + ".bias", {c}, {VarInit::Kind::zeros, 0.0});
    add_buffer(p_, name + ".running_mean", {c}, DType::f32, {VarInit::Kind::zeros, 0.0});
    add_buffer(p_, name + ".running_var", {c}, DType::f32, {VarInit::Kind::constant, 1.0});
    add_buffer(p_, name + ".num_batches_tracked", {}, DType::i64, {VarInit::Kind::zeros, 0.0});
    const std::string y = p_.unique_name(name + ".out");
    p_.append_op(make_op("batch_norm",
                         {{"X", {x}},
                          {"Scale", {name + ".weight"}},
                          {"Bias", {name + ".bias"}},
                          {"Mean", {name + ".running_mean"}},
                          {"Variance", {name + ".running_var"}},
                          {"NumBatchesTracked", {name + ".num_batches_tracked"}}},
                         {{"Y", {y}},
                          {"MeanOut", {name + ".running_mean"}},
                          {"VarianceOut", {name + ".running_var"}},
                          {"SavedMean", {p_.unique_name(name + ".saved_mean")}},
                          {"SavedVariance", {p_.unique_name(name + ".saved_inv_std")}},
                          {"NumBatchesTrackedOut", {name + ".num_batches_tracked"}}},
                         {{"momentum", 0.9}, {"epsilon", 1e-5}, {"data_layout", format_}}));
    return y;
  }

  std::string relu(const std::string& x) {
    const std::string y = p_.unique_name(x + ".relu");
    p_.append_op(make_op("relu", {{"X", {x}}}, {{"Out", {y}}}));
    return y;
  }

  std::string add(const std::string& a, const std::string& b, const std::string& name) {
    const std::string y = p_.unique_name(name + ".add");
    p_.append_op(make_op("elementwise_add", {{"X", {a}}, {"Y", {b}}}, {{"Out", {y}}}, {{"axis", int64_t{-1}}}));
    return y;
  }

  // torchvision BasicBlock: 3x3 (stride) -> bn -> relu -> 3x3 -> bn, plus the shortcut, -> relu.
  std::string basic_block(const std::string& name, const std::string& x, int64_t in, int64_t width, int64_t stride) {
    std::string h = relu(batch_norm(name + ".bn1", conv(name + ".conv1", x, in, width, 3, stride, 1), width));
    h = batch_norm(name + ".bn2", conv(name + ".conv2", h, width, width, 3, 1, 1), width);
    return relu(add(h, shortcut(name, x, in, width, stride), name));
  }

  // torchvision Bottleneck: 1x1 -> 3x3 (stride) -> 1x1 (4 x width), each with bn; relu between.
  std::string bottleneck(const std::string& name, const std::string& x, int64_t in, int64_t width, int64_t stride) {
    const int64_t out = width * 4;
    std::string h = relu(batch_norm(name + ".bn1", conv(name + ".conv1", x, in, width, 1, 1, 0), width));
    h = relu(batch_norm(name + ".bn2", conv(name + ".conv2", h, width, width, 3, stride, 1), width));
    h = batch_norm(name + ".bn3", conv(name + ".conv3", h, width, out, 1, 1, 0), out);
    return relu(add(h, shortcut(name, x, in, out, stride), name));
  }

 private:
  // Identity, or a strided 1x1 conv + bn (`downsample`) where the shape changes.
  std::string shortcut(const std::string& name, const std::string& x, int64_t in, int64_t out, int64_t stride) {
    if (stride == 1 && in == out) return x;
    return batch_norm(name + ".downsample.1", conv(name + ".downsample.0", x, in, out, 1, stride, 0), out);
  }

  Program& p_;
  std::string format_;  // "NCHW" or "NHWC"
};

}  // namespace

ResNetConfig resnet_preset(const std::string& name) {
  ResNetConfig c;
  if (name == "resnet18") {
    c.blocks = {2, 2, 2, 2};
  } else if (name == "resnet34") {
    c.blocks = {3, 4, 6, 3};
  } else if (name == "resnet50") {
    c.blocks = {3, 4, 6, 3};
    c.bottleneck = true;
  } else if (name == "resnet-small") {
    c.small_input = true;
    c.width = 16;
    c.blocks = {2, 2, 2};
    c.image_size = 28;
    c.in_channels = 1;
    c.num_classes = 10;
  } else {
    MIX_FAIL("no ResNet named '" << name << "' (resnet18, resnet34, resnet50, resnet-small)");
  }
  return c;
}

int64_t resnet_min_image_size(const ResNetConfig& c) { return c.small_input ? 4 : 32; }

Model build_resnet(const ResNetConfig& c, const std::string& name) {
  MIX_CHECK(c.in_channels > 0 && c.num_classes > 1 && c.width > 0 && !c.blocks.empty(),
            "ResNet needs input channels, at least two classes, a positive width and at least one stage");
  const int64_t min_size = resnet_min_image_size(c);
  MIX_CHECK(c.image_size >= min_size, name << " needs images of at least " << min_size << "x" << min_size
                                           << " pixels, got " << c.image_size << " (--image-size)");
  Model m;
  m.name = name;
  if (c.pixel_input) {
    MIX_CHECK(static_cast<int64_t>(c.pixel_input->mean.size()) == c.in_channels &&
                  static_cast<int64_t>(c.pixel_input->stddev.size()) == c.in_channels,
              name << ": the pixel input's mean and std need one value per channel (" << c.in_channels << "), got "
                   << c.pixel_input->mean.size() << " and " << c.pixel_input->stddev.size());
    m.example_shape = {c.image_size, c.image_size, c.in_channels};
    m.input_dtype = DType::u8;
  } else {
    m.example_shape = {c.in_channels, c.image_size, c.image_size};
  }
  m.num_classes = c.num_classes;
  Program& p = m.program;
  VarDesc x;
  x.name = m.input;
  x.shape = {-1};
  x.shape.insert(x.shape.end(), m.example_shape.begin(), m.example_shape.end());
  x.dtype = m.input_dtype;
  x.stop_gradient = true;
  p.add_var(x);
  VarDesc label;
  label.name = m.label;
  label.shape = {-1, 1};
  label.dtype = DType::i64;
  label.stop_gradient = true;
  p.add_var(label);

  ResNetBuilder b(p, c.channels_last);
  std::string image = m.input;
  if (c.pixel_input) {
    image = p.unique_name("input.normalized");
    const std::vector<double> mean(c.pixel_input->mean.begin(), c.pixel_input->mean.end());
    const std::vector<double> stddev(c.pixel_input->stddev.begin(), c.pixel_input->stddev.end());
    p.append_op(make_op("image_normalize", {{"X", {m.input}}}, {{"Out", {image}}},
                        {{"mean", mean}, {"std", stddev}, b.data_format()}));
  } else if (c.channels_last) {
    image = p.unique_name("input.nhwc");
    p.append_op(
        make_op("transpose2", {{"X", {m.input}}}, {{"Out", {image}}}, {{"axis", std::vector<int64_t>{0, 2, 3, 1}}}));
  }
  std::string h;
  if (c.small_input) {
    h = b.relu(b.batch_norm("bn1", b.conv("conv1", image, c.in_channels, c.width, 3, 1, 1), c.width));
  } else {
    h = b.relu(b.batch_norm("bn1", b.conv("conv1", image, c.in_channels, c.width, 7, 2, 3), c.width));
    const std::string pooled = p.unique_name("maxpool.out");
    p.append_op(make_op("pool2d", {{"X", {h}}}, {{"Out", {pooled}}},
                        {{"pooling_type", std::string("max")},
                         {"ksize", std::vector<int64_t>{3, 3}},
                         {"strides", std::vector<int64_t>{2, 2}},
                         {"paddings", std::vector<int64_t>{1, 1}},
                         b.data_format()}));
    h = pooled;
  }
  int64_t channels = c.width;
  for (size_t stage = 0; stage < c.blocks.size(); ++stage) {
    MIX_CHECK(c.blocks[stage] > 0, "every ResNet stage needs at least one block (--blocks)");
    const int64_t width = c.width << stage;
    for (int64_t i = 0; i < c.blocks[stage]; ++i) {
      const std::string block = "layer" + std::to_string(stage + 1) + "." + std::to_string(i);
      const int64_t stride = (i == 0 && stage > 0) ? 2 : 1;
      h = c.bottleneck ? b.bottleneck(block, h, channels, width, stride) : b.basic_block(block, h, channels, width, stride);
      channels = c.bottleneck ? width * 4 : width;
    }
  }
  const std::string gap = p.unique_name("avgpool.out");
  p.append_op(make_op("pool2d", {{"X", {h}}}, {{"Out", {gap}}},
                      {{"pooling_type", std::string("avg")}, {"global_pooling", true}, b.data_format()}));
  const std::string flat = p.unique_name("flatten.out");
  p.append_op(make_op("flatten", {{"X", {gap}}}, {{"Out", {flat}}}, {{"axis", int64_t{1}}}));
  linear(p, "fc", flat, channels, c.num_classes, m.logits);
  cross_entropy_loss(p, m.logits, m.label, m.loss);
  return m;
}

}  // namespace mix::models
